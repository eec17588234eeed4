// The kubelet's streaming commands on a cluster reached only through its agent's tunnel: the agent runs as a pod
// there, installed from config/agent, and dials the hub's concierge pod through a load balancer. One concierge
// replica: the replica an agent dialed holds its tunnel, and requests for the cluster that reach another are refused.
import { afterAll, beforeAll } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_USER,
  EDGE,
  startInstalledSealion,
  stopInstalled,
  type Running,
} from '../dev/installed.ts';
import { podCommandCases, serveHttpInDemoPod, type PodTarget } from './harness/pod-commands.ts';

const running: Running = {};
let dir: string;
let target: PodTarget;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-pods-tunnel-'));
  const installed = await startInstalledSealion(running, () => {}, { replicas: 1 });
  const { edge, issuer } = installed;
  const token = await issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
  const viewer = await issuer.mint({ username: 'viewer@sealion.dev', groups: ['demo-viewers'] });
  const bound = await edge.kubectl([
    'create',
    'rolebinding',
    'viewers',
    '-n',
    DEMO_NAMESPACE,
    '--clusterrole=view',
    '--group=demo-viewers',
  ]);
  if (bound.code !== 0) throw new Error(bound.stderr);
  writeFileSync(join(dir, 'edge.kubeconfig'), await installed.kubeconfig(token, EDGE));
  writeFileSync(join(dir, 'viewer.kubeconfig'), await installed.kubeconfig(viewer, EDGE));
  target = {
    kubectl: edge.binaries.kubectl,
    kubeconfig: join(dir, 'edge.kubeconfig'),
    refusedKubeconfig: join(dir, 'viewer.kubeconfig'),
  };
  await serveHttpInDemoPod(target);
}, 300_000);

afterAll(async () => {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

podCommandCases(`${EDGE}'s tunnel`, () => target);
