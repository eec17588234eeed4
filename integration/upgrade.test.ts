// A rolling upgrade under a team's load, on real nodes: the image of this tree installed with Helm (a hub with two
// concierge replicas, edge with its agent), then `helm upgrade` of the concierge and of the agent to the next release
// (the same tree built with the next version and the tunnel protocol's minor one up: dev/image.ts's nextRelease), and
// `helm rollback` of both, while the demo user works through Sealion on both clusters (harness/team-load.ts). Each
// phase's cost is printed as one table and held to the targets: no failed request, no event a watch missed, no
// session hung, no second a cluster was unreachable while another replica lived. Then the same load while one
// replica's process is SIGKILLed through containerd, which no drain sees coming: what must hold even then is held.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { AGENT_NAME, CONCIERGE_NAME } from '../apis/install.ts';
import { ensureHelm, REPO_ROOT } from '../dev/build.ts';
import type { Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { buildNextImage, nextRelease, type BuiltImage } from '../dev/image.ts';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_POD,
  DEMO_USER,
  EDGE,
  startInstalledSealion,
  stopInstalled,
  type InstalledSealion,
  type Running,
} from '../dev/installed.ts';
import { dieWithParent } from '../dev/processes.ts';
import { SEALION_VERSION } from '../lib/version.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { demoTarget } from './harness/pod-commands.ts';
import { BLOB_BYTES, BLOB_PATH, countsTable, TeamLoad, type PhaseCount } from './harness/team-load.ts';

const running: Running = {};
let installed: InstalledSealion;
let next: BuiltImage;
let helm: string;
let dir: string;
let kubeconfigs: { hub: string; edge: string };
const namespace = DEFAULT_INSTALL.namespace;
const agentNamespace = DEFAULT_INSTALL.agentNamespace;
/** Watches on each cluster: 20 in all. */
const WATCHES_PER_CLUSTER = 10;
/** How long a rollout may take: a new pod, its readiness, the old one's end, for each replica. */
const ROLLOUT_TIMEOUT_MS = 300_000;

const started = Date.now();
/** Progress with the seconds since the file began, on standard error (where the time goes). */
const log = (line: string): void =>
  void process.stderr.write(`[upgrade ${(Date.now() - started) / 1000}s] ${line}\n`);

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-upgrade-'));
  helm = await ensureHelm(log);
  next = await buildNextImage(log);
  installed = await startInstalledSealion(running, log, { using: 'helm' });
  // The next release is loaded beside the first, as a registry would serve it: the nodes pull nothing.
  await Promise.all([
    installed.hub.node!.loadImage(next.archive),
    installed.edge.node!.loadImage(next.archive),
  ]);
  const target = await demoTarget(installed, dir);
  // A file for port-forward to move: the demo pod's httpd (started by demoTarget) serves /tmp/www.
  const blob = await installed.hub.kubectl([
    'exec',
    DEMO_POD,
    '-n',
    DEMO_NAMESPACE,
    '--',
    'sh',
    '-c',
    `head -c ${BLOB_BYTES} /dev/urandom > /tmp/www${BLOB_PATH}`,
  ]);
  if (blob.code !== 0) throw new Error(`writing the blob: ${blob.stderr}`);
  const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
  writeFileSync(join(dir, 'edge.kubeconfig'), await installed.kubeconfig(token, EDGE));
  kubeconfigs = { hub: target.kubeconfig, edge: join(dir, 'edge.kubeconfig') };
  log('installed, with the next release loaded on both nodes');
}, 900_000);

afterAll(async () => {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

function newLoad(): TeamLoad {
  return new TeamLoad({
    kubectl: installed.hub.binaries.kubectl,
    kubeconfigs,
    // The exec plugin's credentials and caches in the test's folder, shared by every kubectl of the load.
    env: { XDG_CONFIG_HOME: join(dir, 'config'), XDG_CACHE_HOME: join(dir, 'cache') },
    watchesPer: WATCHES_PER_CLUSTER,
    log,
  });
}

/** Runs Helm on a cluster as its admin; throws with what it said when it fails. */
function helmOn(cluster: Cluster, args: string[]): Promise<string> {
  return new Promise((done, fail) => {
    const [command, argv] = dieWithParent(helm, ['--kubeconfig', cluster.kubeconfigPath, ...args]);
    const child = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
    child.on('error', fail);
    child.on('exit', (code) =>
      code === 0 ? done(output) : fail(new Error(`helm ${args.join(' ')} (${code}): ${output}`)),
    );
  });
}

interface PodState {
  metadata: { name: string; deletionTimestamp?: string };
  spec: { containers: { image: string }[] };
  status: { conditions?: { type: string; status: string }[]; containerStatuses?: PodContainer[] };
}
interface PodContainer {
  containerID?: string;
  restartCount: number;
  ready: boolean;
}

async function podsOf(cluster: Cluster, ns: string, app: string): Promise<PodState[]> {
  const listed = await cluster.kubectl(['get', 'pods', '-n', ns, '-l', `app=${app}`, '-o', 'json']);
  if (listed.code !== 0) throw new Error(listed.stderr);
  return (JSON.parse(listed.stdout) as { items: PodState[] }).items;
}

const isReady = (pod: PodState): boolean =>
  !pod.metadata.deletionTimestamp &&
  (pod.status.conditions ?? []).some((c) => c.type === 'Ready' && c.status === 'True');

/** Resolves once every pod of `app` runs `image`, ready, and no pod of another image is left, terminating or not. */
async function rolledOut(
  cluster: Cluster,
  ns: string,
  app: string,
  image: string,
  count: number,
): Promise<void> {
  await eventually(
    async () => {
      const pods = await podsOf(cluster, ns, app);
      const states = pods.map((p) => `${p.metadata.name} ${p.spec.containers[0]!.image} ready=${isReady(p)}`);
      if (pods.length !== count || !pods.every((p) => p.spec.containers[0]!.image === image && isReady(p)))
        throw new Error(`${app} is not rolled out to ${image}: ${states.join('; ')}`);
    },
    ROLLOUT_TIMEOUT_MS,
    1_000,
  );
}

/** What `sealion version --client` says inside the concierge's image as it runs now. */
async function conciergeReports(): Promise<{ version: string; tunnelProtocol: string }> {
  const said = await installed.hub.kubectl([
    'exec',
    '-n',
    namespace,
    `deployment/${CONCIERGE_NAME}`,
    '--',
    '/usr/local/bin/node',
    '/app/bin/sealion.js',
    'version',
    '--client',
    '-o',
    'json',
  ]);
  if (said.code !== 0) throw new Error(`sealion version in the concierge's pod: ${said.stderr}`);
  return (JSON.parse(said.stdout) as { clientVersion: { version: string; tunnelProtocol: string } })
    .clientVersion;
}

/** Resolves once edge's Cluster is connected with its agent reporting `version`. */
async function agentReports(version: string): Promise<void> {
  await eventually(
    async () => {
      const got = await installed.hub.kubectl([
        'get',
        'cluster',
        EDGE,
        '-o',
        'jsonpath={.status.connected} {.status.agentVersion}',
      ]);
      expect(got.stdout).toBe(`true ${version}`);
    },
    120_000,
    1_000,
  );
}

/** Runs a step of the upgrade as a phase of the load, then waits for the load to come through it. */
async function phase(load: TeamLoad, name: string, step: () => Promise<void>): Promise<void> {
  load.phase = name;
  log(`${name}: begins`);
  await step();
  const done = Date.now();
  log(`${name}: done; waiting for the load to come through it`);
  await load.settled(done);
  log(`${name}: the load came through it`);
}

/** Prints the table and returns the counts. */
async function stopAndCount(load: TeamLoad, title: string): Promise<PhaseCount[]> {
  await load.stop();
  const counts = load.counts();
  log(`${title}\n${countsTable(counts)}`);
  return counts;
}

describe('a rolling upgrade under a team’s load', () => {
  const old = (): string => installed.image.name;
  const chart = (name: string): string => join(REPO_ROOT, 'config/charts', name);
  const version = nextRelease();

  it('helm upgrade of the concierge, then of the agent, and helm rollback of both, cost the team nothing', async () => {
    const load = newLoad();
    let counts: PhaseCount[];
    try {
      await load.start();
      log('the load is under way');
      await phase(load, 'helm upgrade concierge', async () => {
        const set = ['--reuse-values', '--set', `image=${next.name}`];
        await helmOn(installed.hub, [
          'upgrade',
          CONCIERGE_NAME,
          chart('sealion-concierge'),
          '-n',
          namespace,
          ...set,
        ]);
        await rolledOut(installed.hub, namespace, CONCIERGE_NAME, next.name, 2);
      });
      // The new replicas are the next release, and say so: its version, and its protocol one minor up.
      expect(await conciergeReports()).toMatchObject({
        version: version.version,
        tunnelProtocol: expect.stringMatching(new RegExp(`^2\\.${version.protocolMinor} `)) as unknown,
      });
      await phase(load, 'helm upgrade agent', async () => {
        const set = ['--reuse-values', '--set', `image=${next.name}`];
        await helmOn(installed.edge, [
          'upgrade',
          AGENT_NAME,
          chart('sealion-agent'),
          '-n',
          agentNamespace,
          ...set,
        ]);
        await rolledOut(installed.edge, agentNamespace, AGENT_NAME, next.name, 1);
        await agentReports(version.version);
      });
      await phase(load, 'helm rollback agent', async () => {
        await helmOn(installed.edge, ['rollback', AGENT_NAME, '1', '-n', agentNamespace]);
        await rolledOut(installed.edge, agentNamespace, AGENT_NAME, old(), 1);
        await agentReports(SEALION_VERSION);
      });
      await phase(load, 'helm rollback concierge', async () => {
        await helmOn(installed.hub, ['rollback', CONCIERGE_NAME, '1', '-n', namespace]);
        await rolledOut(installed.hub, namespace, CONCIERGE_NAME, old(), 2);
      });
      expect((await conciergeReports()).version).toBe(SEALION_VERSION);
    } finally {
      counts = await stopAndCount(load, 'a rolling upgrade, drained');
    }
    // The targets, for every phase of the upgrade and the rollback: another replica lived throughout (maxSurge 1,
    // maxUnavailable 0), so a cluster is never unreachable.
    expect(counts.map(target)).toEqual(counts.map((c) => ({ ...target(c), ...ZERO })));
  }, 1_800_000);

  it('a replica SIGKILLed under the same load: no event is missed after the watches resume, no session hangs, and both clusters answer again', async () => {
    const load = newLoad();
    let counts: PhaseCount[];
    try {
      await load.start();
      log('the load is under way');
      await phase(load, 'SIGKILL a replica', async () => {
        const [victim] = await podsOf(installed.hub, namespace, CONCIERGE_NAME);
        const container = victim!.status.containerStatuses?.[0];
        if (!container?.containerID) throw new Error(`${victim!.metadata.name} runs no container`);
        log(`SIGKILL to ${victim!.metadata.name}'s concierge (${container.containerID})`);
        await installed.hub.node!.killContainer(container.containerID);
        // The kubelet starts it again in the same pod; the phase ends once it is ready.
        await eventually(
          async () => {
            const pod = (await podsOf(installed.hub, namespace, CONCIERGE_NAME)).find(
              (p) => p.metadata.name === victim!.metadata.name,
            );
            const now = pod?.status.containerStatuses?.[0];
            if (!pod || !now || now.restartCount <= container.restartCount || !isReady(pod))
              throw new Error(`${victim!.metadata.name} has not come back yet`);
          },
          ROLLOUT_TIMEOUT_MS,
          1_000,
        );
      });
    } finally {
      counts = await stopAndCount(load, 'a replica SIGKILLed');
    }
    // What must hold even without a drain: watches resume where they were, sessions end rather than hang, and
    // (settled() above) both clusters answer again. Failed requests and unreachable seconds are the table's, not
    // asserted: a process killed mid-request loses what it held.
    expect(counts.map((c) => ({ phase: c.phase, missed: c.missed, hung: c.hung }))).toEqual(
      counts.map((c) => ({ phase: c.phase, missed: 0, hung: 0 })),
    );
  }, 900_000);
});

const ZERO = { failed: { hub: 0, edge: 0 }, missed: 0, hung: 0, unreachableSeconds: { hub: 0, edge: 0 } };
const target = (c: PhaseCount) => ({
  phase: c.phase,
  failed: c.failed,
  missed: c.missed,
  hung: c.hung,
  unreachableSeconds: c.unreachableSeconds,
});
