// Sealion installed as a user installs it, for `npm start` and the end-to-end tests: its image built and loaded
// into two clusters' real nodes, then the README's Install section run word for word: config/concierge on the hub
// (whose node carries EKS's marks, so `mode: auto` turns the proxy on), the first authenticator, the tunnel
// published through the local load balancer, and the first agent on `edge` with `sealion cluster add
// --agent-manifests` and config/agent. A demo user logs in with tokens from a local OIDC issuer and may work with
// the demo pod on both clusters.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import { getKubeconfig } from '../cli/get-kubeconfig.ts';
import { DEFAULT_OIDC_CLIENT_ID } from '../cli/exec-credential.ts';
import { newKubeClients } from '../lib/kube/kube.ts';
import { conciergeManifests, DEFAULT_INSTALL, sessionAuditorRole } from '../manifests/install.ts';
import { CONCIERGE_NAME, CONFIG_KEY, CONFIG_MAP_NAME } from '../apis/install.ts';
import { parse as parseYAML, stringify as toYAML } from 'yaml';
import { ensureHelm, REPO_ROOT } from './build.ts';
import { startCluster, type Cluster } from './cluster.ts';
import { eventually } from './eventually.ts';
import { buildImage, DEMO_IMAGE, ensureDemoImage, type BuiltImage } from './image.ts';
import { startLocalLoadBalancer, type LocalLoadBalancer } from './local-lb.ts';
import { startOIDCIssuer, type TestIssuer } from './oidc-issuer.ts';
import { dieWithParent } from './processes.ts';

export const DEMO_USER = 'demo@sealion.dev';
export const DEMO_GROUP = 'demo-developers';
export const DEMO_NAMESPACE = 'demo';
export const DEMO_POD = 'demo';
/** The second cluster: reached only through its agent, which dials out to the concierge. */
export const EDGE = 'edge';
/** The demo pod's loop: something for `logs -f` to follow. */
const DEMO_SCRIPT = 'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 5; done';

/** The JWTAuthenticator the README's Install section creates. */
const AUTHENTICATOR = 'my-oidc';
/** How long the Install section may take (it waits for pods, the authenticator and the agent, 120 s each at most). */
const INSTALL_SECTION_TIMEOUT_MS = 420_000;

/** How the Install section installs: its first `sh` block (kustomize) or its second (Helm). */
export type InstallWith = 'kustomize' | 'helm';
export const INSTALL_WITH: readonly InstallWith[] = ['kustomize', 'helm'];

/** The README's Install section: its `sh` block for kustomize or for Helm. */
export function installSection(using: InstallWith = 'kustomize'): string {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('\n## Install\n'));
  const blocks = [...section.slice(0, section.indexOf('\n## ', 1)).matchAll(/```sh\n([\s\S]*?)\n```/g)];
  const block = blocks[INSTALL_WITH.indexOf(using)]?.[1];
  if (!block) throw new Error(`README.md's Install section has no sh block for ${using}`);
  return block;
}

/** The README's section on controllers on the hub: its sh block, and the Deployment (deployer.yaml) it applies. */
export function workloadsSection(): { script: string; deployment: string } {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('\n### Controllers on the hub reach the fleet\n');
  if (start < 0) throw new Error("README.md has no section 'Controllers on the hub reach the fleet'");
  const rest = readme.slice(start + 1);
  const section = rest.slice(0, rest.search(/\n##+ /));
  const script = /```sh\n([\s\S]*?)\n```/.exec(section)?.[1];
  const deployment = /```yaml\n([\s\S]*?\n)```/.exec(section)?.[1];
  if (!script || !deployment)
    throw new Error("README.md's section on controllers lacks its sh or yaml block");
  return { script, deployment };
}

/** The hub service account the README's section on controllers makes, and its namespace. */
export const WORKLOAD_NAMESPACE = 'gitops';
export const WORKLOAD_ACCOUNT = 'deployer';
/** The prefix the README's section gives edge's Cluster: the hub's workloads are hub:… there. */
export const WORKLOAD_PREFIX = 'hub:';

/** The concierge's drain, shorter than the install's: the install options shutdownDelaySeconds and shutdownGraceSeconds. */
export interface Shutdown {
  delaySeconds: number;
  graceSeconds: number;
}

/**
 * A strategic merge patch that gives the concierge's Deployment the drain `shutdown`: its flags and its termination
 * grace as install.ts renders them with it. For a kustomization over config/concierge.
 */
export function shutdownPatch(shutdown: Shutdown): Record<string, unknown> {
  const deployment = conciergeManifests({
    ...DEFAULT_INSTALL,
    concierge: { shutdownDelaySeconds: shutdown.delaySeconds, shutdownGraceSeconds: shutdown.graceSeconds },
  }).find((o) => o['kind'] === 'Deployment') as { metadata: object; spec: { template: { spec: PodSpec } } };
  const pod = deployment.spec.template.spec;
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: deployment.metadata,
    spec: {
      template: {
        spec: {
          terminationGracePeriodSeconds: pod.terminationGracePeriodSeconds,
          containers: pod.containers.map(({ name, args }) => ({ name, args })),
        },
      },
    },
  };
}
interface PodSpec {
  terminationGracePeriodSeconds: number;
  containers: { name: string; args: string[] }[];
}

/**
 * The Install section's text, with the concierge's drain set to `shutdown` where it is given: in the Helm block
 * values on the concierge's `helm install`, in the kustomize block a kustomization (written in `dir`) over
 * config/concierge with shutdownPatch. Everything else stays word for word; a block that no longer has the line
 * changed here fails loudly.
 */
function installScript(using: InstallWith, dir: string, shutdown?: Shutdown): string {
  const section = installSection(using);
  if (shutdown === undefined) return section;
  const values = `--set shutdownDelaySeconds=${shutdown.delaySeconds},shutdownGraceSeconds=${shutdown.graceSeconds}`;
  const [line, replacement] =
    using === 'helm'
      ? [
          'helm install sealion-concierge config/charts/sealion-concierge ',
          `helm install sealion-concierge config/charts/sealion-concierge ${values} `,
        ]
      : ['kubectl apply -k config/concierge\n', `kubectl apply -k ${shutdownKustomization(dir, shutdown)}\n`];
  if (section.split(line).length !== 2)
    throw new Error(
      `README.md's Install section (${using}) has not one "${line.trim()}" to set the drain on`,
    );
  return section.replace(line, () => replacement);
}

/** A kustomization in `dir`: config/concierge with the drain `shutdown`. Returns its folder. */
function shutdownKustomization(dir: string, shutdown: Shutdown): string {
  const folder = join(dir, 'concierge-shutdown');
  mkdirSync(folder, { recursive: true });
  writeFileSync(
    join(folder, 'kustomization.yaml'),
    toYAML({
      apiVersion: 'kustomize.config.k8s.io/v1beta1',
      kind: 'Kustomization',
      resources: [relative(folder, join(REPO_ROOT, 'config/concierge'))],
      patches: [{ patch: toYAML(shutdownPatch(shutdown)) }],
    }),
  );
  return folder;
}

/** Runs `script` (the Install section) with bash (-euo pipefail), in the repository, with `env` (its variables). */
function runInstallSection(script: string, env: Record<string, string | undefined>): Promise<void> {
  return new Promise((done, fail) => {
    const [command, args] = dieWithParent('bash', ['-euo', 'pipefail', '-c', script]);
    const child = spawn(command, args, {
      cwd: REPO_ROOT,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const keep = (chunk: Buffer): void => void (output = (output + chunk.toString('utf8')).slice(-8000));
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    const timer = setTimeout(() => child.kill('SIGKILL'), INSTALL_SECTION_TIMEOUT_MS);
    child.on('error', fail);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      if (code === 0) done();
      else fail(new Error(`the README's Install section failed (${code ?? signal}):\n${output}`));
    });
  });
}

/** Runs kubectl commands on a cluster, failing loudly. */
async function kubectlAll(cluster: Cluster, commands: string[][]): Promise<void> {
  for (const args of commands) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
}

/** What has been started so far: filled in as things start, so that a stop at any moment stops what exists. */
export interface Running {
  cluster?: Cluster;
  edge?: Cluster;
  issuer?: TestIssuer;
  lb?: LocalLoadBalancer;
}

export async function stopInstalled(running: Running): Promise<void> {
  await running.lb?.stop();
  await running.issuer?.stop();
  await Promise.all([running.cluster?.stop(), running.edge?.stop()]);
}

export interface InstalledSealion {
  hub: Cluster;
  edge: Cluster;
  issuer: TestIssuer;
  lb: LocalLoadBalancer;
  image: BuiltImage;
  /**
   * A kubeconfig (YAML) as `sealion get kubeconfig` writes it, for a user with this OIDC token: to the hub through
   * the proxy, or (cluster `edge`) through edge's tunnel; with `allClusters`, a context for each.
   */
  kubeconfig: (
    token: string,
    cluster?: string,
    allClusters?: boolean,
    mode?: 'direct' | 'proxy',
  ) => Promise<string>;
}

/**
 * The marks an EKS node carries, which the hub's kubelet registers its node with: `mode: auto` (the default)
 * judges from them that the API server is out of reach and switches the impersonation proxy on.
 */
const MANAGED_NODE = {
  providerID: 'aws:///us-west-2a/i-0a5e41102d0c0ffee',
  labels: { 'eks.amazonaws.com/nodegroup': 'sealion-dev', 'eks.amazonaws.com/capacityType': 'ON_DEMAND' },
};

/** Runs kubectl and fails loudly, with what it said. */
async function kubectlOk(cluster: Cluster, args: string[], input?: string): Promise<string> {
  const result = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr.trim()}`);
  return result.stdout;
}

/** How startInstalledSealion installs. */
export interface InstallChoices {
  /** Which of the Install section's blocks runs. Default: kustomize. */
  using?: InstallWith;
  /** Images loaded on the hub's node besides Sealion's and the demo pod's. */
  hubImages?: string[];
  /**
   * The concierge's drain, for tests that roll the concierge out: the local load balancer follows readiness within a
   * second, so the default delay's 15 s, meant for a cloud load balancer's health checks, would only make each
   * replica's drain longer, as would the grace's 30 s for sessions that a test's load holds open until they are
   * closed. Default: the install's.
   */
  shutdown?: Shutdown;
}

export async function startInstalledSealion(
  running: Running,
  log: (line: string) => void,
  { using = 'kustomize', hubImages = [], shutdown }: InstallChoices = {},
): Promise<InstalledSealion> {
  const helm = using === 'helm' ? await ensureHelm(log) : undefined;
  const image = await buildImage(log);
  const demoImage = await ensureDemoImage(log);
  log(`image ${image.name} (${image.digest.slice(0, 19)}…) built; starting two clusters, each with a node`);
  const images = [image.archive, demoImage];
  // Both clusters settle before anything else happens: one that lost a race must still be stopped on a failure.
  const clusters = await Promise.allSettled([
    startCluster({
      name: 'sealion-dev',
      log,
      node: { name: 'sealion-dev-node', ...MANAGED_NODE, images: [...images, ...hubImages] },
    }).then((c) => (running.cluster = c)),
    startCluster({ name: `sealion-${EDGE}`, log, node: { name: `sealion-${EDGE}-node`, images } }).then(
      (c) => (running.edge = c),
    ),
  ]);
  for (const c of clusters) if (c.status === 'rejected') throw c.reason;
  const [cluster, edge] = [running.cluster!, running.edge!];
  log(
    `the hub's node carries EKS's marks (${Object.keys(MANAGED_NODE.labels).join(', ')} and an aws:// provider ID), so mode: auto turns the proxy on`,
  );

  // The hub's LoadBalancer Services get addresses its pods, edge's agent and this machine reach; the issuer listens
  // where the hub's pods reach the machine. The CLI's OIDC client ID is the audience, so `sealion get kubeconfig`
  // with OIDC login works here as it is.
  running.lb = await startLocalLoadBalancer({
    clients: newKubeClients({ path: cluster.kubeconfigPath }),
    reachableFromPods: true,
  });
  const issuer = (running.issuer = await startOIDCIssuer({
    audience: DEFAULT_OIDC_CLIENT_ID,
    clientId: DEFAULT_OIDC_CLIENT_ID,
    login: { username: DEMO_USER, groups: [DEMO_GROUP] },
    host: cluster.node!.network.hostIp,
  }));

  // What an admin runs: the README's Install section, word for word.
  log(
    (using === 'helm'
      ? `installing Sealion as the README's Install section says, with Helm: the sealion-concierge chart on the hub, sealion-agent on ${EDGE}`
      : `installing Sealion as the README's Install section says: config/concierge on the hub, config/agent on ${EDGE}`) +
      (shutdown === undefined
        ? ''
        : `, the concierge's shutdown delay and grace set to ${shutdown.delaySeconds} s and ${shutdown.graceSeconds} s`),
  );
  await runInstallSection(installScript(using, cluster.dir, shutdown), {
    KUBECONFIG: cluster.kubeconfigPath,
    EDGE_KUBECONFIG: edge.kubeconfigPath,
    ISSUER_URL: issuer.url,
    ISSUER_CA_DATA: issuer.caData,
    PATH: [
      dirname(cluster.binaries.kubectl),
      ...(helm ? [dirname(helm)] : []),
      join(REPO_ROOT, 'node_modules/.bin'),
      process.env['PATH'],
    ].join(':'),
  });
  const namespace = DEFAULT_INSTALL.namespace;

  const demoPod = [
    'run',
    DEMO_POD,
    '-n',
    DEMO_NAMESPACE,
    `--image=${DEMO_IMAGE}`,
    '--command',
    '--',
    'sh',
    '-c',
    DEMO_SCRIPT,
  ];
  const readNamespaces: string[][] = [
    ['create', 'namespace', DEMO_NAMESPACE],
    ['create', 'clusterrole', 'namespace-reader', '--verb=get,list,watch', '--resource=namespaces'],
    [
      'create',
      'clusterrolebinding',
      'demo-developers-namespaces',
      '--clusterrole=namespace-reader',
      `--group=${DEMO_GROUP}`,
    ],
  ];
  // The demo user works with pods in demo (exec, attach, logs, port-forward, debug) on both clusters, and may
  // edit the rest of demo on the hub only.
  const podAccess: string[][] = [
    [
      'create',
      'role',
      'pod-access',
      '-n',
      DEMO_NAMESPACE,
      '--verb=get,list,watch,create,update,patch',
      '--resource=pods,pods/exec,pods/attach,pods/log,pods/portforward,pods/ephemeralcontainers',
    ],
    [
      'create',
      'rolebinding',
      'demo-developers-pods',
      '-n',
      DEMO_NAMESPACE,
      '--role=pod-access',
      `--group=${DEMO_GROUP}`,
    ],
    demoPod,
  ];
  await kubectlAll(cluster, [
    ...readNamespaces,
    // The demo user may read every replica's recorded sessions, as the README binds the install's role.
    [
      'create',
      'clusterrolebinding',
      'demo-session-auditors',
      `--clusterrole=${sessionAuditorRole(namespace)}`,
      `--group=${DEMO_GROUP}`,
    ],
    [
      'create',
      'rolebinding',
      'demo-developers-edit',
      '-n',
      DEMO_NAMESPACE,
      '--clusterrole=edit',
      `--group=${DEMO_GROUP}`,
    ],
    ...podAccess,
  ]);
  await kubectlAll(edge, [...readNamespaces, ...podAccess]);

  await eventually(async () => {
    const ready = await cluster.kubectl([
      'get',
      'jwtauthenticator.authentication.concierge.sealion.dev',
      AUTHENTICATOR,
      '-o',
      'jsonpath={.status.phase}',
    ]);
    if (ready.stdout !== 'Ready')
      throw new Error(`JWTAuthenticator ${AUTHENTICATOR} is ${ready.stdout || 'not ready'}`);
    // The aggregated edit role gets its rules from kube-controller-manager shortly after start.
    const allowed = await cluster.kubectl([
      'auth',
      'can-i',
      'create',
      'configmaps',
      '-n',
      DEMO_NAMESPACE,
      `--as=${DEMO_USER}`,
      `--as-group=${DEMO_GROUP}`,
    ]);
    if (allowed.stdout.trim() !== 'yes') throw new Error('demo RBAC not in effect yet');
    // Every replica holding the agent's tunnel is one that runs now (not one that was replaced).
    const holders = (
      await kubectlOk(cluster, ['get', 'clusters', EDGE, '-o', 'jsonpath={.status.tunnels[*].replica}'])
    )
      .split(/\s+/)
      .filter(Boolean);
    const pods = JSON.parse(
      await kubectlOk(cluster, ['get', 'pods', '-n', namespace, '-l', `app=${CONCIERGE_NAME}`, '-o', 'json']),
    ) as { items: { metadata: { name: string; deletionTimestamp?: string }; status: { phase?: string } }[] };
    const live = pods.items
      .filter((p) => !p.metadata.deletionTimestamp && p.status.phase === 'Running')
      .map((p) => p.metadata.name);
    if (holders.length === 0 || holders.some((h) => !live.includes(h)))
      throw new Error(
        `the ${EDGE} agent's tunnel is held by [${holders.join(', ')}], running: [${live.join(', ')}]`,
      );
    for (const [where, c] of [
      ['hub', cluster],
      [EDGE, edge],
    ] as const) {
      const phase = await c.kubectl([
        'get',
        'pod',
        DEMO_POD,
        '-n',
        DEMO_NAMESPACE,
        '-o',
        'jsonpath={.status.phase}',
      ]);
      if (phase.stdout !== 'Running')
        throw new Error(`${where}'s demo pod is ${phase.stdout || 'not there'}`);
    }
  }, 120_000);

  // What a user of the cluster runs: the kubeconfig says where the proxy is and which CA to trust (from the
  // authenticator's status), and its exec plugin trades the token for 5-minute client certificates. The token
  // waits in a 0600 file in the cluster's folder, which the kubeconfig names: never in the plugin's arguments.
  const kubeconfig = (
    token: string,
    target = '',
    allClusters = false,
    mode: 'direct' | 'proxy' = 'proxy',
  ): Promise<string> => {
    const tokenFile = join(
      cluster.dir,
      `token-${createHash('sha256').update(token).digest('hex').slice(0, 16)}`,
    );
    writeFileSync(tokenFile, token, { mode: 0o600 });
    return getKubeconfig(
      {
        kubeconfig: cluster.kubeconfigPath,
        groupSuffix: DEFAULT_GROUP_SUFFIX,
        authenticatorType: 'jwt',
        authenticatorName: AUTHENTICATOR,
        staticToken: '',
        staticTokenEnv: '',
        staticTokenFile: tokenFile,
        oidcIssuer: '',
        oidcClientId: '',
        oidcScopes: '',
        oidcCaBundleData: '',
        oidcSkipBrowser: false,
        oidcDevice: false,
        allClusters,
        exchangeCredential: true,
        timeout: '60',
        output: '',
        cluster: target,
        mode,
      },
      log,
    );
  };
  return { hub: cluster, edge, issuer, lb: running.lb, image, kubeconfig };
}

/** Where the SSH door answers, and the known_hosts line that pins its host key (from the CredentialIssuer's status). */
export interface SshDoor {
  host: string;
  port: number;
  knownHosts: string;
}

/**
 * Turns the hub's SSH door on with `ssh` (the config's ssh section, mode enabled added) as an admin would: by editing
 * the concierge's ConfigMap, or, for an install made `using` Helm, with `helm upgrade --reuse-values` (whose next
 * upgrade would otherwise put the chart's config back). Resolves once its status says where it is and which host key
 * it has.
 */
export async function enableSsh(
  cluster: Cluster,
  ssh: object,
  using: InstallWith = 'kustomize',
): Promise<SshDoor> {
  const ns = DEFAULT_INSTALL.namespace;
  if (using === 'helm') {
    const values = join(cluster.dir, 'ssh-values.yaml');
    writeFileSync(values, toYAML({ config: { ssh: { ...ssh, mode: 'enabled' } } }));
    await runHelm(cluster, [
      'upgrade',
      CONCIERGE_NAME,
      join(REPO_ROOT, 'config/charts', CONCIERGE_NAME),
      '-n',
      ns,
      '--reuse-values',
      '-f',
      values,
    ]);
    return sshDoorStatus(cluster);
  }
  const current = await kubectlOk(cluster, ['get', 'configmap', CONFIG_MAP_NAME, '-n', ns, '-o', 'json']);
  const text = (JSON.parse(current) as { data?: Record<string, string> }).data?.[CONFIG_KEY] ?? '';
  const config = (parseYAML(text) as Record<string, unknown> | null) ?? {};
  const patch = { data: { [CONFIG_KEY]: toYAML({ ...config, ssh: { ...ssh, mode: 'enabled' } }) } };
  await kubectlOk(cluster, [
    'patch',
    'configmap',
    CONFIG_MAP_NAME,
    '-n',
    ns,
    '--type=merge',
    '-p',
    JSON.stringify(patch),
  ]);
  return sshDoorStatus(cluster);
}

/** Runs Helm 4 on `cluster` as its admin; throws with what it said when it fails. */
export async function runHelm(cluster: Cluster, args: string[]): Promise<string> {
  const helm = await ensureHelm(() => {});
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

/** Where the hub's SSH door is and its host keys, once its status says so. */
function sshDoorStatus(cluster: Cluster): Promise<SshDoor> {
  return eventually(
    async () => {
      const got = await kubectlOk(cluster, [
        'get',
        'credentialissuer',
        CONFIG_MAP_NAME,
        '-o',
        'jsonpath={.status.ssh}',
      ]);
      const status = JSON.parse(got || '{}') as { endpoint?: string; hostKeys?: { publicKey: string }[] };
      if (!status.endpoint || !status.hostKeys?.length) throw new Error(`status.ssh is ${got || 'empty'}`);
      const [host, port] = status.endpoint.split(/:(?=[0-9]+$)/) as [string, string];
      const where = port === '22' ? host : `[${host}]:${port}`;
      return {
        host,
        port: Number(port),
        knownHosts: status.hostKeys.map((k) => `${where} ${k.publicKey}\n`).join(''),
      };
    },
    120_000,
    500,
  );
}
