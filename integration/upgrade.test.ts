// A rolling upgrade under a team's load, on real nodes: the image of this tree installed (a hub with two concierge
// replicas, edge with its agent), then the concierge and then the agent moved to the next release (the same tree
// built with the next version and the tunnel protocol's minor one up: dev/image.ts's nextRelease) and back, while the
// demo user works through Sealion on both clusters (harness/team-load.ts). Once with Helm (`helm upgrade`, `helm
// rollback`), once with kustomize (the image set in the admin's kustomization, `kubectl apply -k`). Each phase's cost
// is printed as one table and held to the targets: no failed request, no event a watch missed, no session hung, no
// second a cluster was unreachable while another replica lived. Then the same load while one replica's process is
// SIGKILLed through containerd, which no drain sees coming: what must hold even then is held.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { stringify } from 'yaml';
import { AGENT_NAME, CONCIERGE_NAME, CONFIG_KEY, CONFIG_MAP_NAME, TUNNEL_SERVICE } from '../apis/install.ts';
import { REPO_ROOT } from '../dev/build.ts';
import type { Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { buildNextImage, nextRelease, type BuiltImage } from '../dev/image.ts';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_POD,
  DEMO_USER,
  EDGE,
  enableSsh,
  INSTALL_WITH,
  runHelm,
  shutdownPatch,
  startInstalledSealion,
  stopInstalled,
  type InstallWith,
  type InstalledSealion,
  type Running,
} from '../dev/installed.ts';
import { opensshOptions, runOpenSSH } from '../dev/openssh.ts';
import { SEALION_VERSION } from '../lib/version.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { demoTarget } from './harness/pod-commands.ts';
import { BLOB_BYTES, BLOB_PATH, countsTable, TeamLoad, type PhaseCount } from './harness/team-load.ts';

let running: Running;
let installed: InstalledSealion;
let next: BuiltImage;
let dir: string;
let kubeconfigs: { hub: string; edge: string };
/** The demo user's ssh into a shell of the hub's demo pod, through the SSH door. */
let sshShell: string[];
/** The concierge's configuration as the admin left it after installing: their kustomization carries it. */
let adminConfig: string;
const namespace = DEFAULT_INSTALL.namespace;
const agentNamespace = DEFAULT_INSTALL.agentNamespace;
/** Watches on each cluster: 20 in all. */
const WATCHES_PER_CLUSTER = 10;
/**
 * The concierge's drain here, set at install so that the replicas an upgrade stops have it, and kept by every upgrade
 * and rollback. The delay: the local load balancer picks a backend from the EndpointSlices for each connection, and
 * they drop a terminating pod within a second or two, so the install's 15 s (a cloud load balancer's health checks)
 * would only lengthen each rollout. The grace: the load's sessions (exec, port-forward, logs, SSH) never end by
 * themselves, so a replica that holds one waits out all of it before it closes them with the message the table
 * counts; the install's 30 s would add 27 s to each rollout, whose last old replica is one such.
 */
const SHUTDOWN = { delaySeconds: 3, graceSeconds: 3 };
/** How long a rollout may take: a new pod, its readiness, the old one's end, for each replica. */
const ROLLOUT_TIMEOUT_MS = 300_000;

const started = Date.now();
/** Progress with the seconds since the file began, on standard error (where the time goes). */
const log = (line: string): void =>
  void process.stderr.write(`[upgrade ${(Date.now() - started) / 1000}s] ${line}\n`);

/** Installs the old image `using` a way, with the next release loaded on both nodes, and the demo user's ways in. */
async function install(using: InstallWith): Promise<void> {
  running = {};
  dir = mkdtempSync(join(tmpdir(), 'sealion-upgrade-'));
  next = await buildNextImage(log);
  installed = await startInstalledSealion(running, log, {
    using,
    shutdown: SHUTDOWN,
  });
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
  sshShell = await openSshDoor(using);
  // The admin's kustomization holds their configuration as it is now, the door's included.
  adminConfig = await kubectlOk(installed.hub, [
    'get',
    'configmap',
    CONFIG_MAP_NAME,
    '-n',
    namespace,
    '-o',
    `jsonpath={.data.${CONFIG_KEY.replace('.', '\\.')}}`,
  ]);
  log(`installed with ${using}, the next release loaded on both nodes`);
}

/**
 * Turns the hub's SSH door on for certificates of a CA of the test's, and returns the demo user's `ssh` into a shell
 * of the hub's demo pod once it works.
 */
async function openSshDoor(using: InstallWith): Promise<string[]> {
  const keys = join(dir, 'ssh');
  mkdirSync(keys);
  const keygen = async (args: string[]): Promise<void> => {
    const made = await runOpenSSH('ssh-keygen', ['-q', ...args]);
    if (made.code !== 0) throw new Error(`ssh-keygen: ${made.stderr}`);
  };
  await keygen(['-t', 'ed25519', '-N', '', '-C', 'upgrade-ca', '-f', join(keys, 'ca')]);
  await keygen(['-t', 'ed25519', '-N', '', '-C', 'demo', '-f', join(keys, 'demo')]);
  const groups = `extension:groups@sealion.dev=${DEMO_GROUP}`;
  await keygen([
    '-s',
    join(keys, 'ca'),
    '-I',
    'demo',
    '-n',
    DEMO_USER,
    '-V',
    '+4h',
    '-O',
    groups,
    join(keys, 'demo.pub'),
  ]);
  const door = await enableSsh(
    installed.hub,
    {
      login: { authenticator: 'my-oidc' },
      certificateAuthorities: [readFileSync(join(keys, 'ca.pub'), 'utf8').trim()],
    },
    using,
  );
  writeFileSync(join(keys, 'known_hosts'), door.knownHosts);
  const options = opensshOptions(join(keys, 'demo'), { knownHosts: join(keys, 'known_hosts'), quiet: false });
  const login = [
    ...options,
    '-T',
    '-o',
    'ConnectTimeout=20',
    '-p',
    String(door.port),
    '-l',
    DEMO_USER,
    door.host,
  ];
  const pod = `hub/${DEMO_NAMESPACE}/${DEMO_POD}`;
  await eventually(
    async () => {
      const tried = await runOpenSSH('ssh', [...login, pod, '--', 'true'], undefined, { timeoutMs: 30_000 });
      if (tried.code !== 0) throw new Error(`ssh: ${tried.code} ${tried.stderr}`);
    },
    120_000,
    1_000,
  );
  return ['ssh', ...login, pod, '--', 'sh'];
}

async function uninstall(): Promise<void> {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}

function newLoad(): TeamLoad {
  return new TeamLoad({
    kubectl: installed.hub.binaries.kubectl,
    kubeconfigs,
    // The exec plugin's credentials and caches in the test's folder, shared by every kubectl of the load.
    env: { XDG_CONFIG_HOME: join(dir, 'config'), XDG_CACHE_HOME: join(dir, 'cache') },
    watchesPer: WATCHES_PER_CLUSTER,
    ssh: sshShell,
    log,
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

/** The pods of `app` once there are `count`, all ready and of one image, none terminating. */
async function steady(cluster: Cluster, ns: string, app: string, count: number): Promise<PodState[]> {
  return eventually(
    async () => {
      const pods = await podsOf(cluster, ns, app);
      const images = new Set(pods.map((p) => p.spec.containers[0]!.image));
      if (pods.length !== count || images.size !== 1 || !pods.every(isReady))
        throw new Error(
          `${app} is not steady: ${pods.map((p) => `${p.metadata.name} ready=${isReady(p)}`).join('; ')}`,
        );
      return pods;
    },
    ROLLOUT_TIMEOUT_MS,
    1_000,
  );
}

/** Runs kubectl as the cluster's admin; throws with what it said when it fails. */
async function kubectlOk(cluster: Cluster, args: string[]): Promise<string> {
  const result = await cluster.kubectl(args);
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  return result.stdout;
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

/** How an admin moves a part to an image: with Helm, or with the image in their kustomization. */
interface UpgradeWay {
  /** The phases' words: `helm upgrade`, `kustomize set image`. */
  upgrade: string;
  rollback: string;
  /** Moves the concierge (on the hub) or the agent (on edge) to `image`; `back` to the release installed first. */
  move(part: 'concierge' | 'agent', image: string, back: boolean): Promise<void>;
}

const WAYS: Record<InstallWith, UpgradeWay> = {
  helm: {
    upgrade: 'helm upgrade',
    rollback: 'helm rollback',
    async move(part, image, back) {
      const [cluster, release, ns] =
        part === 'concierge'
          ? [installed.hub, CONCIERGE_NAME, namespace]
          : [installed.edge, AGENT_NAME, agentNamespace];
      const chart = join(REPO_ROOT, 'config/charts', release);
      await runHelm(
        cluster,
        back
          ? ['rollback', release, '-n', ns]
          : ['upgrade', release, chart, '-n', ns, '--reuse-values', '--set', `image=${image}`],
      );
    },
  },
  kustomize: {
    upgrade: 'kustomize set image',
    rollback: 'kustomize set image back',
    async move(part, image) {
      const cluster = part === 'concierge' ? installed.hub : installed.edge;
      const applied = await cluster.kubectl(['apply', '-k', kustomization(part, image)]);
      if (applied.code !== 0) throw new Error(`kubectl apply -k: ${applied.stderr}`);
    },
  },
};

/**
 * The admin's kustomization for a part: config/<part>, what the admin changed on it (the install's drain;
 * after applying it, the README's Install section published the tunnel; the configuration, with the direct path and
 * the SSH door on), and the image as `kustomize edit set image` writes it.
 * Returns its folder.
 */
function kustomization(part: 'concierge' | 'agent', image: string): string {
  const folder = join(dir, `kustomize-${part}`);
  mkdirSync(folder, { recursive: true });
  const at = image.lastIndexOf(':');
  const patches =
    part === 'concierge'
      ? [
          {
            patch: stringify({
              apiVersion: 'v1',
              kind: 'Service',
              metadata: { name: TUNNEL_SERVICE, namespace },
              spec: { type: 'LoadBalancer' },
            }),
          },
          {
            patch: stringify({
              apiVersion: 'v1',
              kind: 'ConfigMap',
              metadata: { name: CONFIG_MAP_NAME, namespace },
              data: { [CONFIG_KEY]: adminConfig },
            }),
          },
          { patch: stringify(shutdownPatch(SHUTDOWN)) },
        ]
      : [];
  writeFileSync(
    join(folder, 'kustomization.yaml'),
    stringify({
      apiVersion: 'kustomize.config.k8s.io/v1beta1',
      kind: 'Kustomization',
      resources: [relative(folder, join(REPO_ROOT, 'config', part))],
      patches,
      images: [{ name: image.slice(0, at), newTag: image.slice(at + 1) }],
    }),
  );
  return folder;
}

const KILLED =
  'a replica SIGKILLed under the same load: no event is missed after the watches resume, no session hangs, and both clusters answer again';

describe.each(INSTALL_WITH)('a rolling upgrade under a team’s load, installed with %s', (using) => {
  beforeAll(() => install(using), 900_000);
  afterAll(() => uninstall(), 120_000);
  const way = WAYS[using];
  const version = nextRelease();

  // The whole round once, with Helm; kustomize's image change moves the concierge, the part whose drain it exercises:
  // the agent's rollout and a rollback are the same Deployment rollouts either way, and each concierge phase costs a
  // minute of the suite (the drain's delay and grace).
  const whole = using === 'helm';
  it(`${way.upgrade} of the concierge${whole ? `, then of the agent, and ${way.rollback} of both,` : ''} cost the team nothing`, async () => {
    const old = installed.image.name;
    const load = newLoad();
    let counts: PhaseCount[];
    try {
      await load.start();
      log('the load is under way');
      await phase(load, `${way.upgrade} concierge`, async () => {
        await way.move('concierge', next.name, false);
        await rolledOut(installed.hub, namespace, CONCIERGE_NAME, next.name, 2);
      });
      // The new replicas are the next release, and say so: its version, and its protocol one minor up.
      expect(await conciergeReports()).toMatchObject({
        version: version.version,
        tunnelProtocol: expect.stringMatching(new RegExp(`^2\\.${version.protocolMinor} `)) as unknown,
      });
      if (whole) {
        await phase(load, `${way.upgrade} agent`, async () => {
          await way.move('agent', next.name, false);
          await rolledOut(installed.edge, agentNamespace, AGENT_NAME, next.name, 1);
          await agentReports(version.version);
        });
        await phase(load, `${way.rollback} agent`, async () => {
          await way.move('agent', old, true);
          await rolledOut(installed.edge, agentNamespace, AGENT_NAME, old, 1);
          await agentReports(SEALION_VERSION);
        });
        await phase(load, `${way.rollback} concierge`, async () => {
          await way.move('concierge', old, true);
          await rolledOut(installed.hub, namespace, CONCIERGE_NAME, old, 2);
        });
        expect((await conciergeReports()).version).toBe(SEALION_VERSION);
      }
    } finally {
      counts = await stopAndCount(load, `a rolling upgrade with ${using}, drained`);
    }
    // The targets, for every phase of the upgrade and the rollback: another replica lived throughout (maxSurge 1,
    // maxUnavailable 0), so a cluster is never unreachable.
    expect(counts.map(target)).toEqual(counts.map((c) => ({ ...target(c), ...ZERO })));
  }, 1_800_000);

  // Once: a kill is no way of installing.
  if (using === 'helm') it(KILLED, killedReplica, 900_000);
});

async function killedReplica(): Promise<void> {
  const load = newLoad();
  let counts: PhaseCount[];
  try {
    await load.start();
    log('the load is under way');
    const [victim] = await steady(installed.hub, namespace, CONCIERGE_NAME, 2);
    await phase(load, 'SIGKILL a replica', async () => {
      const container = victim!.status.containerStatuses?.[0];
      if (!container?.containerID) throw new Error(`${victim!.metadata.name} runs no container`);
      log(`SIGKILL to ${victim!.metadata.name}'s concierge (${container.containerID})`);
      // Through containerd: `kubectl delete pod --grace-period=0 --force` is no SIGKILL, as the kubelet still stops
      // the container with SIGTERM and at least 2 s of grace (minimumGracePeriodInSeconds in its runtime manager).
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
  // (settled() in phase()) both clusters answer again. Failed requests and unreachable seconds are the table's, not
  // asserted: a process killed mid-request loses what it held.
  expect(counts.map((c) => ({ phase: c.phase, missed: c.missed, hung: c.hung }))).toEqual(
    counts.map((c) => ({ phase: c.phase, missed: 0, hung: 0 })),
  );
}

const ZERO = {
  failed: { hub: 0, edge: 0 },
  failures: [],
  missed: 0,
  hung: 0,
  unreachableSeconds: { hub: 0, edge: 0 },
};
/** A phase's figures the targets hold, with what its failed requests said (in the diff when one fails). */
const target = (c: PhaseCount) => ({
  phase: c.phase,
  failed: c.failed,
  failures: c.failures,
  missed: c.missed,
  hung: c.hung,
  unreachableSeconds: c.unreachableSeconds,
});
