// The kubelet's streaming commands on a cluster reached only through its agent's tunnel: the agent runs as a pod
// there, installed from config/agent, and dials the hub's concierge pods through a load balancer. Two concierge
// replicas, as installed: each kubectl lands on either, so the commands also cross the peer hop from the replica
// without the tunnel to the one that holds it.
import { afterAll, beforeAll } from '@jest/globals';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { EDGE, startInstalledSealion, stopInstalled, type Running } from '../dev/installed.ts';
import { demoTarget, podCommandCases, type PodTarget } from './harness/pod-commands.ts';

const running: Running = {};
let dir: string;
let target: PodTarget;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-pods-tunnel-'));
  const installed = await startInstalledSealion(running, () => {});
  target = await demoTarget(installed, dir, EDGE);
}, 300_000);

afterAll(async () => {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

podCommandCases(`${EDGE}'s tunnel`, () => target);
