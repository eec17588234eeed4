// `npm start`: a real local cluster with the concierge in front of it, a local OIDC issuer,
// a demo user with RBAC, and kubeconfigs under .sealion/. Runs until Ctrl-C, then removes everything it started.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse } from 'yaml';
import { DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import { REPO_ROOT } from './build.ts';
import { startCluster, type Cluster } from './cluster.ts';
import { newKubeClients } from '../lib/kube.ts';
import { applyJWTAuthenticator, startControlledConcierge, type ControlledConcierge } from './concierge.ts';
import { eventually } from './eventually.ts';
import { startLocalLoadBalancer, type LocalLoadBalancer } from './local-lb.ts';
import { startOIDCIssuer, type TestIssuer } from './oidc-issuer.ts';
import { startAgent, type Agent } from '../agent/agent.ts';
import { newSecretCredentialStore } from '../agent/credentials.ts';
import { agentUpstream, prepareAgentCluster } from './agent.ts';
import { stopOnSignal } from './processes.ts';
import { silentLogger } from '../lib/log.ts';
import { addCluster } from '../cli/cluster.ts';
import { getKubeconfig } from '../cli/get-kubeconfig.ts';
import { DEFAULT_OIDC_CLIENT_ID } from '../cli/login.ts';
import { AGENT_NAME, CONCIERGE_NAME, CONFIG_MAP_NAME, DEFAULT_INSTALL } from '../manifests/install.ts';

const DEMO_USER = 'demo@sealion.dev';
const DEMO_GROUP = 'demo-developers';
const DEMO_NAMESPACE = 'demo';
/** The demo token lives as long as a working day; the exec plugin trades it for short-lived certificates. */
const DEMO_TOKEN_SECONDS = 12 * 3600;
/** The second cluster: reached only through its agent, which dials out to the concierge. */
const EDGE = 'edge';
const AGENT_NAMESPACE = DEFAULT_INSTALL.agentNamespace;

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
  proxy?: ControlledConcierge;
  lb?: LocalLoadBalancer;
  agent?: Agent;
}

async function devUp(): Promise<void> {
  const log = (line: string): void => console.error(`[dev] ${line}`);
  // Filled in as they start, so that Ctrl-C at any moment, or a failure, stops what exists.
  const running: Running = {};
  const stopAll = async (): Promise<void> => {
    await running.agent?.stop();
    await running.proxy?.stop();
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

async function start(running: Running, log: (line: string) => void): Promise<void> {
  const started = Date.now();
  // Both clusters settle before anything else happens: one that lost a race must still be stopped on a failure.
  const clusters = await Promise.allSettled([
    startCluster({ name: 'sealion-dev', log }).then((c) => (running.cluster = c)),
    startCluster({ name: `sealion-${EDGE}`, log, controllerManager: false }).then((c) => (running.edge = c)),
  ]);
  for (const c of clusters) if (c.status === 'rejected') throw c.reason;
  const [cluster, edge] = [running.cluster!, running.edge!];
  log('starting the concierge, the local load balancer and a local OIDC issuer');
  // The CLI's OIDC client ID is the audience, so `sealion get kubeconfig` with OIDC login works here as it is;
  // the local issuer logs the demo user in without asking.
  const issuer = (running.issuer = await startOIDCIssuer({
    audience: DEFAULT_OIDC_CLIENT_ID,
    login: { username: DEMO_USER, groups: [DEMO_GROUP] },
  }));
  const namespace = DEFAULT_INSTALL.namespace;
  const created = await cluster.kubectl(['create', 'namespace', namespace]);
  if (created.code !== 0) throw new Error(`creating namespace ${namespace}: ${created.stderr}`);
  const proxy = (running.proxy = await startControlledConcierge(cluster, {
    namespace,
    configMap: CONFIG_MAP_NAME,
    identity: 'dev',
    tunnelPort: 0,
  }));
  // A LoadBalancer Service, as on a cloud, when this process may listen on port 443 of a loopback address;
  // otherwise the proxy's own port, named in the config.
  const privileged = process.getuid?.() === 0;
  if (privileged) {
    running.lb = await startLocalLoadBalancer({
      clients: newKubeClients({ path: cluster.kubeconfigPath }),
      backend: (service) =>
        service.spec?.selector?.['app'] === CONCIERGE_NAME
          ? { host: '127.0.0.1', port: proxy.port }
          : undefined,
    });
  } else {
    log('not root: no local load balancer (it listens on port 443); the proxy is reached on its own port');
  }
  // The local cluster has no nodes to judge by, so the proxy is switched on explicitly.
  const config = privileged
    ? 'impersonationProxy:\n  mode: enabled\n'
    : `impersonationProxy:\n  mode: enabled\n  endpoint: "127.0.0.1:${proxy.port}"\n  service: {type: None}\n`;
  const configured = await cluster.kubectl([
    'create',
    'configmap',
    CONFIG_MAP_NAME,
    '-n',
    namespace,
    `--from-literal=config.yaml=${config}`,
  ]);
  if (configured.code !== 0) throw new Error(`creating the concierge ConfigMap: ${configured.stderr}`);
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
  ]);

  // The edge cluster lets the demo user read namespaces and nothing else; its agent registers and dials out.
  log(`onboarding the agent-backed cluster ${EDGE}`);
  await kubectlAll(edge, readNamespaces);
  const agentKubeconfig = await prepareAgentCluster(edge, AGENT_NAMESPACE);
  const tunnel = proxy.concierge.tunnel!;
  const hub = `https://127.0.0.1:${tunnel.port}`;
  const added = await addCluster(EDGE, {
    kubeconfig: cluster.kubeconfigPath,
    namespace,
    groupSuffix: DEFAULT_GROUP_SUFFIX,
    hub,
    description: 'the local agent-backed demo cluster',
  });
  running.agent = startAgent({
    cluster: EDGE,
    hub: new URL(hub),
    trust: { pin: added.pin },
    bootstrapToken: () => added.token,
    store: newSecretCredentialStore(
      newKubeClients({ path: agentKubeconfig }),
      AGENT_NAMESPACE,
      `${AGENT_NAME}-credentials`,
    ),
    upstream: agentUpstream(agentKubeconfig),
    version: 'dev',
    log: silentLogger(),
  });
  const agent = running.agent;

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
    if (!agent.connected()) throw new Error(`the ${EDGE} agent has no tunnel yet`);
  }, 60_000);

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
  impersonation proxy:  ${endpoint}${running.lb ? ' (a LoadBalancer Service on the local load balancer)' : ''}
  demo user:            ${DEMO_USER} (group ${DEMO_GROUP}), an OIDC token from the local issuer, which the
                        kubeconfig's exec plugin (sealion login static) trades for client certificates

Try it, as the demo user through the proxy:
  kubectl --kubeconfig ${rel} get namespaces                    # allowed
  kubectl --kubeconfig ${rel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # allowed
  kubectl --kubeconfig ${rel} create namespace not-allowed      # Forbidden, from the cluster's RBAC
  kubectl --kubeconfig ${rel} auth whoami
And on ${EDGE}, a second cluster the concierge never dials: its agent dialed out, and ${EDGE}'s RBAC decides:
  kubectl --kubeconfig ${edgeRel} get namespaces                    # allowed
  kubectl --kubeconfig ${edgeRel} -n ${DEMO_NAMESPACE} create configmap hello --from-literal=a=b   # Forbidden, from ${EDGE}'s RBAC
Admin access (the PROXY ENDPOINT column is where the proxy is published; clusters shows the agent):
  kubectl --kubeconfig ${cluster.kubeconfigPath} get jwtauthenticators
  kubectl --kubeconfig ${cluster.kubeconfigPath} get clusters
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
