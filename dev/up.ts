// `npm start`: a real local cluster with the concierge in front of it, a local OIDC issuer,
// a demo user with RBAC, and kubeconfigs under .sealion/. Runs until Ctrl-C, then removes everything it started.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import { REPO_ROOT } from './build.ts';
import { startCluster, type Cluster } from './cluster.ts';
import { newKubeClients } from '../lib/kube.ts';
import { applyJWTAuthenticator } from './concierge.ts';
import { eventually } from './eventually.ts';
import { startLocalLoadBalancer, type LocalLoadBalancer } from './local-lb.ts';
import { startOIDCIssuer, type TestIssuer } from './oidc-issuer.ts';
import { buildImage, DEMO_IMAGE, ensureDemoImage } from './image.ts';
import { stopOnSignal } from './processes.ts';
import { addCluster } from '../cli/cluster.ts';
import { getKubeconfig } from '../cli/get-kubeconfig.ts';
import { DEFAULT_OIDC_CLIENT_ID } from '../cli/login.ts';
import { agentSettingsManifests, CONCIERGE_NAME, DEFAULT_INSTALL } from '../manifests/install.ts';

const DEMO_USER = 'demo@sealion.dev';
const DEMO_GROUP = 'demo-developers';
const DEMO_NAMESPACE = 'demo';
/** The demo token lives as long as a working day; the exec plugin trades it for short-lived certificates. */
const DEMO_TOKEN_SECONDS = 12 * 3600;
/** The second cluster: reached only through its agent, which dials out to the concierge. */
const EDGE = 'edge';
/** The demo pod's loop: something for `logs -f` to follow. */
const DEMO_SCRIPT = 'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 5; done';

/** Runs kubectl commands on a cluster, failing loudly. */
async function kubectlAll(cluster: Cluster, commands: string[][]): Promise<void> {
  for (const args of commands) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
}

/** What `npm start` has started so far. */
interface Running {
  cluster?: Cluster;
  edge?: Cluster;
  issuer?: TestIssuer;
  lb?: LocalLoadBalancer;
}

async function devUp(): Promise<void> {
  const log = (line: string): void => console.error(`[dev] ${line}`);
  // Filled in as they start, so that Ctrl-C at any moment, or a failure, stops what exists.
  const running: Running = {};
  const stopAll = async (): Promise<void> => {
    await running.lb?.stop();
    await running.issuer?.stop();
    await Promise.all([running.cluster?.stop(), running.edge?.stop()]);
  };
  const signals = stopOnSignal(stopAll, log);

  try {
    await start(running, log);
  } catch (err) {
    // Interrupted during start-up: the signal's stop stops everything and exits. Otherwise nothing half-started
    // may keep running, nor keep this process alive after the error is printed.
    if (!signals.claim()) return;
    log('start-up failed; stopping what was started');
    await stopAll().catch((stopErr: unknown) => console.error(stopErr));
    throw err;
  }
}

/**
 * The marks an EKS node carries, which the hub's kubelet registers its node with: `mode: auto` (the default)
 * judges from them that the API server is out of reach and switches the impersonation proxy on.
 */
const MANAGED_NODE = {
  providerID: 'aws:///us-west-2a/i-0a5e41102d0c0ffee',
  labels: { 'eks.amazonaws.com/nodegroup': 'sealion-dev', 'eks.amazonaws.com/capacityType': 'ON_DEMAND' },
};
const DEMO_POD = 'demo';
/** How long the installed pods may take to come up (the image is on the node already). */
const INSTALL_TIMEOUT = '120s';

/** Runs kubectl and fails loudly, with what it said. */
async function kubectlOk(cluster: Cluster, args: string[], input?: string): Promise<string> {
  const result = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr.trim()}`);
  return result.stdout;
}

async function start(running: Running, log: (line: string) => void): Promise<void> {
  const started = Date.now();
  const image = await buildImage(log);
  const demoImage = await ensureDemoImage(log);
  log(`image ${image.name} (${image.digest.slice(0, 19)}…) built; starting two clusters, each with a node`);
  const images = [image.archive, demoImage];
  // Both clusters settle before anything else happens: one that lost a race must still be stopped on a failure.
  const clusters = await Promise.allSettled([
    startCluster({
      name: 'sealion-dev',
      log,
      node: { name: 'sealion-dev-node', ...MANAGED_NODE, images },
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

  // What an admin runs (the README's Install section): the manifests, with the tunnel published for agents.
  log('installing Sealion from config/concierge: two concierge pods');
  const namespace = DEFAULT_INSTALL.namespace;
  running.lb = await startLocalLoadBalancer({
    clients: newKubeClients({ path: cluster.kubeconfigPath }),
    reachableFromPods: true,
  });
  await kubectlOk(cluster, ['apply', '-k', join(REPO_ROOT, 'config/concierge')]);
  await kubectlOk(cluster, [
    'patch',
    'service',
    `${CONCIERGE_NAME}-tunnel`,
    '-n',
    namespace,
    '--type=merge',
    '-p',
    '{"spec":{"type":"LoadBalancer"}}',
  ]);
  // The issuer listens where the hub's pods reach the machine; the CLI's OIDC client ID is the audience, so
  // `sealion get kubeconfig` with OIDC login works here as it is.
  const issuer = (running.issuer = await startOIDCIssuer({
    audience: DEFAULT_OIDC_CLIENT_ID,
    login: { username: DEMO_USER, groups: [DEMO_GROUP] },
    host: cluster.node!.network.hostIp,
  }));
  await applyJWTAuthenticator(cluster, 'demo', issuer, DEFAULT_OIDC_CLIENT_ID);
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
  await kubectlAll(cluster, [
    ...readNamespaces,
    [
      'create',
      'rolebinding',
      'demo-developers-edit',
      '-n',
      DEMO_NAMESPACE,
      '--clusterrole=edit',
      `--group=${DEMO_GROUP}`,
    ],
    [
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
    ],
  ]);
  await kubectlAll(edge, readNamespaces);
  await kubectlOk(cluster, [
    'rollout',
    'status',
    `deployment/${CONCIERGE_NAME}`,
    '-n',
    namespace,
    `--timeout=${INSTALL_TIMEOUT}`,
  ]);

  // The first agent: registered on the hub, its settings applied on edge, then the agent manifests.
  log(`onboarding the agent-backed cluster ${EDGE}: its agent runs in a pod there and dials the hub`);
  const tunnelAddress = await eventually(() => {
    const ip = running.lb!.addressOf(namespace, `${CONCIERGE_NAME}-tunnel`);
    if (!ip) throw new Error('the tunnel Service has no load balancer address yet');
    return Promise.resolve(ip);
  }, 60_000);
  const hub = `https://${tunnelAddress}`;
  const added = await addCluster(EDGE, {
    kubeconfig: cluster.kubeconfigPath,
    namespace,
    groupSuffix: DEFAULT_GROUP_SUFFIX,
    hub,
    description: 'the local agent-backed demo cluster',
  });
  const settings = agentSettingsManifests({
    clusterName: EDGE,
    hubURL: hub,
    caPin: added.pin,
    bootstrapToken: added.token,
  });
  await kubectlOk(
    edge,
    ['apply', '-f', '-'],
    JSON.stringify({ apiVersion: 'v1', kind: 'List', items: settings }),
  );
  await kubectlOk(edge, ['apply', '-k', join(REPO_ROOT, 'config/agent')]);

  await eventually(async () => {
    const ready = await cluster.kubectl([
      'get',
      'jwtauthenticator.authentication.concierge.sealion.dev',
      'demo',
      '-o',
      'jsonpath={.status.phase}',
    ]);
    if (ready.stdout !== 'Ready') throw new Error(`JWTAuthenticator demo is ${ready.stdout || 'not ready'}`);
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
    const connected = await cluster.kubectl(['get', 'clusters', EDGE, '-o', 'jsonpath={.status.connected}']);
    if (connected.stdout.trim() !== 'true') throw new Error(`the ${EDGE} agent has no tunnel yet`);
    const demo = await cluster.kubectl([
      'get',
      'pod',
      DEMO_POD,
      '-n',
      DEMO_NAMESPACE,
      '-o',
      'jsonpath={.status.phase}',
    ]);
    if (demo.stdout !== 'Running') throw new Error(`the demo pod is ${demo.stdout || 'not there'}`);
  }, 120_000);

  const dir = join(REPO_ROOT, '.sealion');
  mkdirSync(dir, { recursive: true });
  const token = await issuer.mint(
    { username: DEMO_USER, groups: [DEMO_GROUP] },
    { expiresIn: DEMO_TOKEN_SECONDS },
  );
  // What a user of the cluster runs: the kubeconfig says where the proxy is and which CA to trust (from the
  // authenticator's status), and its exec plugin trades the demo token for 5-minute client certificates.
  const kubeconfigFor = (target: string): Promise<string> =>
    getKubeconfig(
      {
        kubeconfig: cluster.kubeconfigPath,
        groupSuffix: DEFAULT_GROUP_SUFFIX,
        authenticatorType: 'jwt',
        authenticatorName: 'demo',
        staticToken: token,
        staticTokenEnv: '',
        oidcIssuer: '',
        oidcClientId: '',
        oidcScopes: '',
        oidcCaBundleData: '',
        oidcSkipBrowser: false,
        exchangeCredential: true,
        timeout: '60',
        output: '',
        cluster: target,
      },
      log,
    );
  const kubeconfig = await kubeconfigFor('');
  writeFileSync(join(dir, 'demo.kubeconfig'), kubeconfig, { mode: 0o600 });
  writeFileSync(join(dir, `${EDGE}.kubeconfig`), await kubeconfigFor(EDGE), { mode: 0o600 });
  const edgeRel = `.sealion/${EDGE}.kubeconfig`;
  const endpoint = (parse(kubeconfig) as { clusters: { cluster: { server: string } }[] }).clusters[0]!.cluster
    .server;
  const rel = '.sealion/demo.kubeconfig';
  console.log(`
Sealion is up in ${((Date.now() - started) / 1000).toFixed(1)}s.
  API server:           ${cluster.url}
  impersonation proxy:  ${endpoint} (a LoadBalancer Service on the local load balancer)
  Sealion's pods:       installed from config/concierge (hub) and config/agent (${EDGE}), image ${image.name}
  demo user:            ${DEMO_USER} (group ${DEMO_GROUP}), an OIDC token from the local issuer, which the
                        kubeconfig's exec plugin (sealion login static) trades for client certificates

Try it, as the demo user through the proxy:
  kubectl --kubeconfig ${rel} get namespaces                    # allowed
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # allowed
  kubectl --kubeconfig ${rel} create namespace not-allowed      # Forbidden, from the cluster's RBAC
  kubectl --kubeconfig ${rel} auth whoami
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} exec -it ${DEMO_POD} -- sh       # a shell in a pod, through the proxy
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} logs -f ${DEMO_POD}
And on ${EDGE}, a second cluster the concierge never dials: its agent dialed out, and ${EDGE}'s RBAC decides:
  kubectl --kubeconfig ${edgeRel} get namespaces                    # allowed
  kubectl --kubeconfig ${edgeRel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # Forbidden, from ${EDGE}'s RBAC
Admin access (the PROXY ENDPOINT column is where the proxy is published; clusters shows the agent):
  kubectl --kubeconfig ${cluster.kubeconfigPath} get pods -A -o wide
  kubectl --kubeconfig ${cluster.kubeconfigPath} get jwtauthenticators
  kubectl --kubeconfig ${cluster.kubeconfigPath} get clusters
  kubectl --kubeconfig ${edge.kubeconfigPath} get pods -A -o wide
An OIDC login instead of the fixed demo token (open the URL it prints; the local issuer signs the demo user in):
  npx sealion get kubeconfig --kubeconfig ${cluster.kubeconfigPath} > .sealion/oidc.kubeconfig

Press Ctrl-C to stop; everything started here is removed.`);
}

try {
  await devUp();
} catch (err) {
  // Expected failures (a port taken, a build that failed) print one line, not a stack trace.
  console.error(`npm start: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
