// The agent's composition root: flags (with defaults from its ConfigMap), the clients of its own cluster, the
// credential Secret, and the identity its local proxy forwards with. Nothing else in agent/ reads process.env.
import { readFileSync } from 'node:fs';
import { AGENT_POLICY_KEY } from '../apis/tunnel.ts';
import {
  clusterAccess,
  loadKubeConfig,
  newKubeClients,
  newRawReader,
  apiStatusCode,
  selfAllowed,
  type KubeClients,
} from '../lib/kube/kube.ts';
import { newLogger, type Logger } from '../lib/log.ts';
import { handleProcessErrors } from '../lib/process-errors.ts';
import type { Running } from '../lib/lifecycle.ts';
import { SEALION_VERSION } from '../lib/version.ts';
import { newAgent } from './agent.ts';
import { kubeReachReads } from '../lib/reach/dialer.ts';
import type { AgentForwarding, TransportChoice } from '../lib/tunnel/dial.ts';
import { newSecretCredentialStore } from './credentials.ts';
import { healthAddress, serveHealth } from './health.ts';
import type { LocalUpstream } from './local-proxy.ts';

export interface AgentFlags {
  cluster: string;
  /** The hub's tunnel listener, https://host:port. */
  hub: string;
  caBundleData: string;
  caPin: string;
  /** Kubeconfig of this cluster (the agent's identity); empty: in-cluster. */
  kubeconfig: string;
  namespace: string;
  credentialsSecret: string;
  /** ConfigMap with clusterName, hubURL, caBundle, caPin: defaults for the flags above. */
  configMap: string;
  tokenEnv: string;
  tunnelTransport: TransportChoice;
  /** Tunnels to hold, each to another hub replica; default: the agent's. */
  tunnels?: number;
  /** Where /healthz and /readyz listen, host:port (health.ts); empty: not served. */
  healthListen?: string;
  /** Seconds a drain (SIGTERM) lets the tunnels' streams in flight end; default: the agent's. */
  shutdownGrace?: number;
  logLevel: string;
}

const SERVICE_ACCOUNT_TOKEN = '/var/run/secrets/kubernetes.io/serviceaccount/token';
/** Projected service-account tokens rotate; re-reading the file this often picks a new one up in time. */
const TOKEN_REREAD_MS = 60_000;

const VERSION = SEALION_VERSION;

/**
 * Which impersonation the agent holds on its cluster: constrained (impersonate:user-info, as its policies grant it),
 * legacy (the `impersonate` verb, for clusters older than Kubernetes 1.36), or none. Asked of the cluster itself; a
 * cluster that cannot answer yet leaves it unknown to the hub (`none`), and forwarding says why request by request.
 */
export async function detectImpersonation(
  clients: KubeClients,
  log: Logger,
): Promise<AgentForwarding['impersonation']> {
  try {
    const authn = 'authentication.k8s.io';
    if (await selfAllowed(clients, { verb: 'impersonate:user-info', group: authn, resource: 'users' }))
      return 'constrained';
    if (await selfAllowed(clients, { verb: 'impersonate', group: '', resource: 'users' })) return 'legacy';
  } catch (err) {
    log.warn({ err: (err as Error).message }, 'could not ask this cluster what the agent may impersonate');
  }
  return 'none';
}

export async function runAgent(flags: AgentFlags): Promise<Running> {
  const log = newLogger({ level: flags.logLevel, buffered: true });
  // Errors nothing handled are this process's to log (lib/process-errors.ts says what it does with each).
  handleProcessErrors({ log });
  const source = flags.kubeconfig ? { path: flags.kubeconfig } : { inCluster: true as const };
  const config = loadKubeConfig(source);
  const clients = newKubeClients(source);
  // Checked before anything starts: a flag that does not parse fails the start, not the first probe.
  const health = flags.healthListen ? healthAddress(flags.healthListen) : undefined;
  const namespace = flags.namespace || process.env['POD_NAMESPACE'] || '';
  if (!namespace) throw new Error('the agent needs a namespace: pass --namespace or set POD_NAMESPACE');

  let defaults: Record<string, string> = {};
  if (flags.configMap) {
    try {
      defaults =
        (await clients.core.readNamespacedConfigMap({ name: flags.configMap, namespace })).data ?? {};
    } catch (err) {
      if (apiStatusCode(err) !== 404) throw err;
    }
  }
  const cluster = flags.cluster || defaults['clusterName'] || '';
  const hub = flags.hub || defaults['hubURL'] || '';
  const caBundle = flags.caBundleData || defaults['caBundle'] || '';
  const pin = flags.caPin || defaults['caPin'] || '';
  if (!cluster || !hub) throw new Error('the agent needs --cluster and --hub (or its ConfigMap)');
  if (!caBundle && !pin) throw new Error('the agent needs --ca-bundle-data or --ca-pin to trust the hub');

  const forwarding = {
    policy: defaults[AGENT_POLICY_KEY] || 'unknown',
    impersonation: await detectImpersonation(clients, log),
  };
  const access = clusterAccess(config);
  // The reach connections' reads, as the agent, over connections kept open.
  const reader = newRawReader(config);
  let token = access.token;
  let tokenRead = 0;
  const upstream: LocalUpstream = {
    url: access.server,
    ...(access.caPem ? { caPem: access.caPem } : {}),
    ...(access.certPem ? { certPem: access.certPem, keyPem: access.keyPem } : {}),
    token: () => {
      if (flags.kubeconfig) return token;
      if (Date.now() - tokenRead > TOKEN_REREAD_MS) {
        token = readFileSync(SERVICE_ACCOUNT_TOKEN, 'utf8').trim();
        tokenRead = Date.now();
      }
      return token;
    },
    reach: { reads: kubeReachReads(reader), log: log.child({ component: 'reach' }) },
  };
  const agent = newAgent({
    cluster,
    hub: new URL(hub),
    trust: caBundle ? { caPem: Buffer.from(caBundle, 'base64').toString('utf8') } : { pin },
    bootstrapToken: () => process.env[flags.tokenEnv],
    store: newSecretCredentialStore(clients, namespace, flags.credentialsSecret),
    upstream,
    version: VERSION,
    forwarding,
    transport: flags.tunnelTransport,
    ...(flags.tunnels ? { tunnels: flags.tunnels } : {}),
    ...(flags.shutdownGrace === undefined ? {} : { drainMs: flags.shutdownGrace * 1000 }),
    log,
  });
  await agent.start();
  const probes = health
    ? await serveHealth({
        ...health,
        ready: () => agent.connected(),
        log: log.child({ component: 'health' }),
      })
    : undefined;
  // The log is buffered: what the drain and the stop wrote is written out before the exit.
  const flushed = (): Promise<void> => new Promise((done) => log.flush(() => done()));
  const end = async (how: () => Promise<void>): Promise<void> => {
    await how();
    await probes?.close();
    reader.close();
    await flushed();
  };
  return { drain: () => end(() => agent.drain()), stop: () => end(() => agent.stop()) };
}
