// The concierge's composition root: from its options (main.ts turns flags and environment into them; tests, the
// development environment and the benchmarks write them directly) it builds the clients, informers, controllers,
// the impersonation proxy, the agents' tunnel listener and the metrics listener, and starts and stops them in order.
import {
  DEFAULT_SSH_HUB_NAME,
  PEER_ADDRESS_ANNOTATION,
  REPLICA_PROTOCOL_ANNOTATION,
  REPLICA_VERSION_ANNOTATION,
} from '../apis/install.ts';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { apiGroups, Kind, Resource, VERSION } from '../apis/groups.ts';
import { workloadAudience, type Cluster, type ClusterStatus } from '../apis/tunnel.ts';
import {
  BOOTSTRAP_SECRET_SELECTORS,
  newBootstrapTokenStore,
  type BootstrapSecret,
} from '../lib/kube/bootstrap.ts';
import { systemClock, type Clock } from '../lib/clock.ts';
import {
  newKubeClients,
  newObjectWriter,
  newRawReader,
  newKubeInformers,
  newLeaseClient,
  newStatusApplier,
  newReviewer,
  readClusterCustomObject,
  type KubeClients,
  type KubeconfigSource,
  type KubeInformers,
  type Reviewer,
} from '../lib/kube/kube.ts';
import type { Informer } from '../lib/kube/informer.ts';
import { newLifecycle, type OnDrain, type OnStop } from '../lib/lifecycle.ts';
import {
  DEFAULT_SHUTDOWN_DELAY_SECONDS,
  DEFAULT_SHUTDOWN_GRACE_SECONDS,
  drainSequence,
  newSessionRegistry,
  type DrainSettings,
  type SessionRegistry,
} from './drain.ts';
import { newListenerSwitch, type ListenerSwitch } from '../lib/listener-switch.ts';
import type { Controller, ControllerEntry } from '../lib/controller/controller.ts';
import type { Logger } from '../lib/log.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { startLeaderElection, type LeaderElection } from '../lib/controller/leader.ts';
import { newControllerManager, type ControllerManager } from '../lib/controller/manager.ts';
import { periodic } from '../lib/controller/periodic.ts';
import type { ServingMaterial } from '../controllers/impersonation-proxy.ts';
import { TUNNEL_HOSTS, TUNNEL_HOSTS_KEY } from '../controllers/tunnel-hosts.ts';
import {
  conciergeControllers,
  newAuthenticators,
  type Authenticators,
  type ConciergeControllerOptions,
} from './controllers.ts';
import { newRequestAuthenticator } from './proxy/authenticate.ts';
import { newClientCertSigner } from './proxy/credentials.ts';
import { newDirectAPIHandler } from './direct/handler.ts';
import { newClusterCertSigner } from './direct/signer.ts';
import type { RequestHeaderConfig } from '../lib/kube/request-header.ts';
import type { DirectServingMaterial } from '../controllers/direct-login.ts';
import { rawStatusResponse } from '../lib/kube/status.ts';
import {
  newClusterCertificateIssuer,
  type ClusterCertificateIssuer,
} from '../lib/kube/cluster-certificates.ts';
import { newHubRoute, type HubRoute, type Upstream } from './proxy/hub-route.ts';
import { newClusterRouter } from './proxy/route.ts';
import { newProxyHandler } from './proxy/handler.ts';
import type { AccessGrants } from './access/grants.ts';
import { kubeReachReads, newReacher, SELF_REVIEW_PATH } from '../lib/reach/dialer.ts';
import { startAudit, type AuditOptions, type RunningAudit } from './audit/setup.ts';
import {
  newRecordings,
  sharedRecordings,
  type RecordingOptions,
  type Recordings,
} from './recording/session.ts';
import { newRecordingUploader, type RecordingUploader } from './recording/upload.ts';
import { newWebhookClient } from './audit/sinks.ts';
import {
  newMemoryBudget,
  CONCIERGE_UNREAD_BYTES,
  USER_UNREAD_BYTES,
  type MemoryBudget,
} from '../lib/http2/memory-budget.ts';
import { collectDefaultMetrics } from 'prom-client';
import { newProxyMetrics, unreadBytesGauge, type ProxyMetrics } from './proxy/metrics.ts';
import { newProxyServer, type ProxyServer, type ProxyTLS } from './proxy/server.ts';
import { loadTLSFiles, type TLSFiles } from './tls-files.ts';
import { PEER_CERT_RENEW_MS, startPeering, type Peering } from './peering/peering.ts';
import {
  newClusterStatus,
  REPLICA_LEASE_LABEL,
  replicaLeaseName,
  type ClusterStatusPublisher,
} from './tunnel/cluster-status.ts';
import { handshakeSweep, startTunnelListener, type TunnelListener } from './tunnel/listener.ts';
import type { RateLimitOptions } from './tunnel/rate-limit.ts';

/** How often strangers may ask the tunnel listener to register an agent. */
export type RegistrationLimits = RateLimitOptions;
import { forwardingUpstream, type ForwardingIdentity } from './upstream.ts';
import { newInProcessDoor, type InProcessDoor } from './ssh/in-process.ts';
import { newSshServer, type SshServer, type SshServerOptions, type SshSettings } from './ssh/server.ts';
import { BINDING_SELECTORS, BINDING_SWEEP_MS, newKeyBindings, type BindingSecret } from './ssh/bindings.ts';
import type { SshMaterial } from '../controllers/ssh-door.ts';
import type { SSHDoor } from '../apis/identity.ts';
import { SEALION_VERSION } from '../lib/version.ts';
import { CURRENT_PROTOCOL, formatProtocol } from '../lib/tunnel/protocol.ts';
import { DEFAULT_ACCESS_HUB_NAME } from '../apis/access.ts';
import { newAccessParts, type AccessParts } from './access/parts.ts';
import type { AccessSettings } from './access/store.ts';

export interface ConciergeOptions {
  /** The concierge's own identity: watches, reviews, status writes (in a cluster, its pods' service account). */
  kubeconfig: KubeconfigSource;
  /** Who requests are forwarded as: an identity that may only impersonate. */
  forwardAs: ForwardingIdentity;
  groupSuffix: string;
  /** The concierge's namespace: its ConfigMap, Leases, the proxy's Service and Secrets, the tunnel CA. */
  namespace: string;
  /** This replica's name (the pod name): in Leases and in the Clusters' status. */
  identity: string;
  /** The impersonation proxy's listener. */
  proxy: { host: string; port: number };
  /**
   * Serve these files (reloaded when they change) instead of what the controllers manage. Without them the
   * controllers decide, from the ConfigMap `configMap`, whether the proxy serves and with which certificates.
   */
  tlsFiles?: TLSFiles;
  configMap: string;
  /**
   * The agents' tunnel listener; `hosts` are the names and addresses agents dial (its certificate's SANs). The
   * addresses a load balancer gives the Service `service` in the concierge's namespace are added as they come.
   */
  tunnel?: {
    host: string;
    port: number;
    hosts: string[];
    service?: string;
    /** How often strangers may ask to register. Default: DEFAULT_REGISTRATION_LIMITS. */
    registrationLimits?: RegistrationLimits;
  };
  /**
   * The peer listener (concierge/peering/), with the tunnel listener only: where it listens, and the host other
   * replicas dial it at (the pod's address).
   */
  peer?: { host: string; port: number; advertise: string };
  /**
   * The aggregated APIs' listener (concierge/direct/): TokenCredentialRequest and WhoAmIRequest served through the
   * cluster's own API server, which reaches it through the Service `service` (port `servicePort`, default 443) in
   * the namespace. With the controllers only. Default: none.
   */
  aggregatedApi?: { host: string; port: number; service: string; servicePort?: number };
  /** Plain-HTTP listener for /metrics. */
  metrics?: { host: string; port: number };
  /**
   * Where the SSH door (concierge/ssh/) listens when the config turns it on; with the controllers only. Default: no
   * door.
   */
  ssh?: { host: string; port: number };
  /** Audit events for every request served (concierge/audit/). Default: none. */
  audit?: AuditOptions;
  /**
   * Where exec and attach sessions are recorded (concierge/recording/), and the kubeconfig-format file of a receiver
   * finished recordings are also sent to. Default: not recorded.
   */
  recording?: Omit<RecordingOptions, 'log' | 'clock' | 'uploader'> & { webhookConfigFile?: string };
  /**
   * A kubeconfig-format file naming a receiver each access request's change is POSTed to (`{type, object}`); it never
   * slows a request. Default: none.
   */
  accessWebhookConfigFile?: string;
  /** Whether operational log lines name users; audit events always do. Default: true. */
  logUsernames?: boolean;
  /**
   * How drain() goes (concierge/drain.ts): how long it serves on after readiness turns off, and how long long
   * sessions may go on after that. Default: DEFAULT_SHUTDOWN_DELAY_SECONDS and DEFAULT_SHUTDOWN_GRACE_SECONDS.
   */
  drain?: DrainSettings;
  /**
   * The approved access requests the proxy applies (their groups, reason and end: concierge/access/grants.ts), and
   * which clusters require a reason, in place of the replica's own. Default: the replica's own, read from its
   * AccessRequest informer and the access policies (concierge/access/store.ts).
   */
  grants?: AccessGrants;
  log: Logger;
  clock?: Clock;
}

/** Where a started concierge listens. */
export interface ConciergeEndpoints {
  port: number;
  /** The aggregated APIs' listener's port, when it runs. */
  aggregatedApiPort?: number;
  /** The tunnel listener's port and CA, when it runs. */
  tunnel?: { port: number; caPem: string };
  metricsPort?: number;
  /**
   * Where the SSH door listens now, with the `ssh` option: undefined until the controllers hand it a host key (the
   * config turns it on), and after they take it back. On port 0 this is how to learn which one it got.
   */
  sshPort?: () => number | undefined;
}

export interface Concierge {
  /** Starts everything; on a failure, stops what had started and rejects. */
  start(): Promise<ConciergeEndpoints>;
  /** Stops what has started, in the reverse order; safe at any time, and more than once. */
  stop(): Promise<void>;
  /**
   * Drains (concierge/drain.ts: readiness off, the delay, no new connections, the tunnels handed over, requests
   * finished, watches ended, sessions closed with a message after the grace), then stops. A stop meanwhile cuts it.
   */
  drain(): Promise<void>;
}

/** The Lease that picks the replica whose controllers write. */
export const LEADER_LEASE = 'sealion-concierge-controllers';

/** Serving material the controllers handed over, compared to skip reloading what did not change. */
function materialKey(m: ServingMaterial): string {
  return [m.certPem, m.keyPem, m.signer.certPem, m.signer.keyPem, ...m.clientCAPems].join('\0');
}

export function newConcierge(opts: ConciergeOptions): Concierge {
  return newLifecycle('concierge', opts.log, (onStop, onDrain) => start(opts, onStop, onDrain));
}

/** What every step of the start shares: the options, the process's clients and clock, and where stops go. */
interface Base {
  opts: ConciergeOptions;
  log: Logger;
  clock: Clock;
  groups: ReturnType<typeof apiGroups>;
  clients: KubeClients;
  /** Collects how to stop each part as soon as it runs; stops run in the reverse order. */
  onStop: OnStop;
}

/**
 * What the proxy's handler reaches only when requests come, set by the parts made after it: declared before the
 * listener starts, so that a request for /clusters/<name>/… that comes while the rest starts gets the handler's 503
 * (not connected), not a ReferenceError.
 */
interface Late {
  /** How signed-in users reach the SSH door, while it serves (the proxy's SSHDoor answer). */
  sshDoor?: SSHDoor['status'];
  tunnels?: TunnelListener;
  peering?: Peering;
  /** The Clusters, once the tunnel parts (which watch them) run. */
  clusters?: Informer<Cluster>;
  /** The tunnels' holders as the Clusters' status says them, once the tunnel parts run. */
  status?: ClusterStatusPublisher;
  signer?: CertificateAuthority;
  serving: boolean;
  /** The name the hub's own cluster goes by (the config's `ssh.hubName`), once the controllers read the config. */
  hubName: string;
  /** The config's accessRequests in effect, once the controllers read the config. */
  access: AccessSettings;
}

/** The parts the proxy's pipeline, the other listeners and the controllers share. */
interface Shared {
  /** The process's informers, each made once and shared by all who read its collection. */
  informers: KubeInformers;
  authenticators: Authenticators;
  reviewer: Reviewer;
  metrics: ProxyMetrics;
  /**
   * One budget for every answer and upgraded connection this replica relays: from its API server, its tunnels, its
   * peers and the reach connections it dials.
   */
  budget: MemoryBudget;
  audit?: RunningAudit | undefined;
  recordings?: Recordings | undefined;
  /** What the proxy forwards while it lasts, for the drain; its readiness too. */
  sessions: SessionRegistry;
}

/**
 * Starts the parts in order; `onStop` collects how to stop each one as soon as it runs, `onDrain` the drain
 * sequence.
 */
async function start(opts: ConciergeOptions, onStop: OnStop, onDrain: OnDrain): Promise<ConciergeEndpoints> {
  checkOptions(opts);
  const clock = opts.clock ?? systemClock;
  const clients = newKubeClients(opts.kubeconfig);
  const base: Base = { opts, log: opts.log, clock, groups: apiGroups(opts.groupSuffix), clients, onStop };
  // The first forwarding token is in hand before anything forwards; its renewals are a controller's, below.
  const forwarding = await forwardingUpstream(clients, opts.forwardAs, opts.namespace, clock, opts.log);
  const election = opts.tlsFiles ? undefined : startElection(base);
  const late: Late = { serving: false, hubName: DEFAULT_SSH_HUB_NAME, access: NO_ACCESS_SETTINGS };
  const shared = await sharedParts(base, late);
  const access = await accessParts(base, shared, late);
  const proxy = await impersonationProxy(base, shared, forwarding.upstream, late, access);
  const direct =
    opts.aggregatedApi && election ? await directAPI(base, shared, opts.aggregatedApi) : undefined;
  // The controllers (concierge/controllers.ts), registered with one manager once the parts they drive run, and
  // started before the proxy takes a request (the authenticators' cache is filled first). It stops after the tunnel
  // parts below, whose Cluster status facts its controllers withdraw.
  const manager = newControllerManager({
    ...(election ? { election } : {}),
    clock,
    registry: shared.metrics.registry,
    log: opts.log.child({ component: 'controllers' }),
  });
  onStop(() => manager.stop());
  const ssh = election && opts.ssh ? sshDoor(base, shared, proxy.door, opts.ssh, late) : undefined;
  const tunnelParts = opts.tunnel ? await tunnelStatus(base, shared, late, manager) : undefined;
  await startControllers(base, shared, manager, {
    ...(tunnelParts?.controlled ?? {}),
    ...(election ? { proxy: proxyControlled(base, proxy.server, late, ssh, direct) } : {}),
    periodic: [
      ...(forwarding.renewal ? [forwarding.renewal] : []),
      ...(proxy.tlsPoll ? [proxy.tlsPoll] : []),
    ],
    leaderPeriodic: [...(ssh ? [ssh.sweep] : []), access.expiry((writer) => manager.leaderOnly(writer))],
  });
  // Stopped before the controllers (stops run in reverse order), which could otherwise start it again.
  if (ssh) onStop(() => ssh.close());
  // Should a later part fail to start: this replica's Lease goes (withdrawing twice is withdrawing once).
  if (tunnelParts) onStop(() => tunnelParts.publisher.withdraw());
  const ports = await listenForClients(base, proxy.server, direct?.server);
  if (tunnelParts) await agentsListener(base, shared, late, tunnelParts.publisher, manager);
  const metricsPort = opts.metrics ? await serveMetrics(base, shared.metrics, opts.metrics) : undefined;
  onDrain((signal) =>
    drain(
      base,
      shared,
      [proxy.server, direct?.server, ssh],
      () => late.tunnels?.handOver() ?? Promise.resolve(0),
      signal,
    ),
  );
  return {
    ...ports,
    ...(late.tunnels ? { tunnel: { port: late.tunnels.port, caPem: late.tunnels.caPem } } : {}),
    ...(metricsPort === undefined ? {} : { metricsPort }),
    ...(ssh ? { sshPort: ssh.port } : {}),
  };
}

/**
 * The drain (concierge/drain.ts) over this replica's parts: `listeners` stop taking connections (the tunnel and peer
 * listeners stay: the handover is what ends their part).
 */
async function drain(
  { opts, clock, log }: Base,
  { sessions }: Shared,
  listeners: ({ stopAccepting(): void } | undefined)[],
  handOver: () => Promise<number>,
  signal: AbortSignal,
): Promise<void> {
  await drainSequence(
    {
      settings: opts.drain ?? {
        delayMs: DEFAULT_SHUTDOWN_DELAY_SECONDS * 1000,
        graceMs: DEFAULT_SHUTDOWN_GRACE_SECONDS * 1000,
      },
      registry: sessions,
      stopAccepting: () => {
        for (const listener of listeners) listener?.stopAccepting();
        return Promise.resolve();
      },
      handOver,
      clock,
      log,
    },
    signal,
  );
}

function checkOptions(opts: ConciergeOptions): void {
  if (!opts.tlsFiles && !opts.namespace) throw new Error('the controllers need the concierge namespace');
  if (opts.tunnel && !opts.namespace)
    throw new Error('the tunnel listener needs the concierge namespace for its CA');
}

/** The election of the replica whose controllers write (not held with fixed TLS files: nothing is written then). */
function startElection({ opts, clients, clock, log, onStop }: Base): LeaderElection {
  const election = startLeaderElection({
    leases: newLeaseClient(clients, opts.namespace, LEADER_LEASE),
    identity: opts.identity,
    clock,
    log: log.child({ component: 'leader-election' }),
  });
  onStop(() => election.stop());
  return election;
}

/** The informers, the authenticators, the reviewer, the metrics and memory budget, audit and recordings. */
async function sharedParts(base: Base, late: Late): Promise<Shared> {
  const { clients, clock, log, onStop } = base;
  // Stopped after everyone who reads them (stops run in reverse order).
  const informers = newKubeInformers(clients, log, clock);
  onStop(() => informers.stop());
  const authenticators = newAuthenticators(informers, base.opts.groupSuffix);
  onStop(() => authenticators.cache.close());
  const metrics = newProxyMetrics();
  const budget = newMemoryBudget(
    { perUserBytes: USER_UNREAD_BYTES, totalBytes: CONCIERGE_UNREAD_BYTES },
    () => metrics.unreadCuts.inc(),
  );
  unreadBytesGauge(metrics.registry, () => budget.held());
  return {
    informers,
    authenticators,
    reviewer: newReviewer(clients),
    metrics,
    budget,
    ...(await auditAndRecordings(base, metrics, () => late.hubName)),
    sessions: newSessionRegistry(),
  };
}

/** No access requests for the hub until the controllers read the config. */
const NO_ACCESS_SETTINGS: AccessSettings = { hubName: DEFAULT_ACCESS_HUB_NAME, hub: {} };

/**
 * Access requests (concierge/access/): the grants every replica reads from its informer, the local APIs, word of
 * changes to the audit and the access webhook; the leader's expiry controller is added with the controllers.
 */
async function accessParts({ opts, clients, groups, clock, log, onStop }: Base, shared: Shared, late: Late) {
  const parts = await newAccessParts({
    clients,
    informers: shared.informers,
    groups,
    reviewer: shared.reviewer,
    clusterSpec: (name) => late.clusters?.get(name)?.spec,
    clusterUID: (name) => late.clusters?.get(name)?.metadata.uid,
    settings: () => late.access,
    replica: opts.identity,
    ...(shared.audit ? { auditor: shared.audit.auditor } : {}),
    ...(opts.accessWebhookConfigFile ? { webhookConfigFile: opts.accessWebhookConfigFile } : {}),
    clock,
    log,
  });
  onStop(() => parts.close());
  return parts;
}

/** Audit events and session recordings, with the options that ask for them. */
async function auditAndRecordings(
  { opts, clock, log, onStop }: Base,
  metrics: ProxyMetrics,
  hubName: () => string,
): Promise<Pick<Shared, 'audit' | 'recordings'>> {
  // Stopped after the listeners (stops run in reverse order), so the last requests' events are written.
  const audit = opts.audit
    ? await startAudit(opts.audit, opts.identity, metrics.registry, log.child({ component: 'audit' }), clock)
    : undefined;
  if (audit) onStop(() => audit.close());
  let uploader: RecordingUploader | undefined;
  if (opts.recording?.webhookConfigFile) {
    const sending = newRecordingUploader(
      await newWebhookClient({ kubeconfigPath: opts.recording.webhookConfigFile }, 'recording webhook'),
      log.child({ component: 'recording' }),
    );
    uploader = sending;
    onStop(() => sending.close());
  }
  const recordings = opts.recording
    ? newRecordings({
        ...opts.recording,
        clock,
        log: log.child({ component: 'recording' }),
        hubName,
        ...(uploader ? { uploader } : {}),
      })
    : undefined;
  return { audit, recordings };
}

/**
 * The route to the hub's own API server as the forwarding identity, and the reach connections the hub dials: objects
 * read as the concierge, reviews sent as the forwarding identity (whose impersonation the API server checks).
 */
function hubRoute({ clients, clock, log, onStop }: Base, upstream: Upstream, budget: MemoryBudget): HubRoute {
  // The hub's own reach connections are dialed by its route, with the reacher made below (which asks through it).
  const hub = newHubRoute(upstream, budget, () => reacher);
  onStop(() => hub.close());
  const reader = newRawReader(clients.config);
  onStop(() => reader.close());
  const reacher = newReacher({
    reads: kubeReachReads(reader),
    review: (body, headers) =>
      hub.call({
        method: 'POST',
        path: SELF_REVIEW_PATH,
        body,
        user: '',
        headers,
      }),
    // Asked already, in the handler's decide stage, of this same cluster.
    checkPolicy: false,
    log: log.child({ component: 'reach' }),
    budget,
    clock,
  });
  onStop(() => reacher.close());
  return hub;
}

/**
 * The impersonation proxy: its pipeline (the handler every door's requests go through, SSH sessions' by the
 * in-process door) and its listener (not listening yet), with the poll of fixed TLS files when they are given.
 */
async function impersonationProxy(
  base: Base,
  shared: Shared,
  upstream: Upstream,
  late: Late,
  access: AccessParts,
): Promise<{ server: ProxyServer; door: InProcessDoor; tlsPoll?: Controller }> {
  const { opts, groups, log, onStop } = base;
  const { authenticators, reviewer, metrics, audit, recordings } = shared;
  const hub = hubRoute(base, upstream, shared.budget);
  // SSH sessions enter the pipeline through this door, each request as the identity its session signed in as.
  const door = newInProcessDoor();
  onStop(() => door.close());
  const handler = newProxyHandler({
    groups,
    clock: base.clock,
    signedIn: (req) => door.signedIn(req),
    partOfRecording: (req) => door.signedIn(req)?.recordedAs,
    // The server is made below; the handler asks it for trusted CAs only when requests arrive, as the file
    // watcher's callback below updates it only after the first poll.
    authenticator: newRequestAuthenticator(authenticators.cache, reviewer, () => server.trustedClientCAs(), {
      workloadAudience: workloadAudience(opts.groupSuffix),
    }),
    // Which clusters take hub workloads, read from the same Cluster informer the tunnel parts keep.
    clusterSpec: (name) => late.clusters?.get(name)?.spec,
    cache: authenticators.cache,
    reviewer,
    // The hub's own API server; a cluster through the replica's own tunnel, else a peer's.
    router: newClusterRouter(
      hub,
      (name) => late.tunnels?.route(name),
      (name) => late.peering?.route(name),
    ),
    lastConnected: (name) => late.status?.lastConnected(name),
    signer: newClientCertSigner(() => late.signer),
    metrics,
    log: log.child({ component: 'proxy' }),
    // Ready until the drain begins: the Endpoints and load balancers then stop sending here.
    ready: () => !shared.sessions.draining(),
    sessions: shared.sessions,
    grants: opts.grants ?? access.store,
    serving: () => late.serving,
    ...(audit ? { auditor: audit.auditor } : {}),
    ...(recordings
      ? { recordings, recordingStore: sharedRecordings(recordings, opts.identity, () => late.peering) }
      : {}),
    ...(opts.logUsernames === undefined ? {} : { logUsernames: opts.logUsernames }),
    sshDoor: () => late.sshDoor,
    accessAPIs: access.apis,
  });

  onStop(() => handler.close());
  door.serve(handler.request, handler.upgrade);
  const tls = await proxyTLS(base, late, (next) => server.updateTLS(next));
  const server = newProxyServer(tls.initial, handler.request, handler.upgrade, (err) =>
    log.debug({ err: err.message }, 'TLS handshake failed'),
  );
  return { server, door, ...(tls.poll ? { tlsPoll: tls.poll } : {}) };
}

/**
 * What the proxy's listener serves at first: the fixed TLS files (serving at once, and polled for changes), or,
 * until the controllers hand over certificates, a throwaway one for health checks.
 */
async function proxyTLS(
  { opts, log }: Base,
  late: Late,
  update: (tls: ProxyTLS) => void,
): Promise<{ initial: ProxyTLS; poll?: Controller }> {
  if (!opts.tlsFiles) return { initial: await placeholderTLS() };
  const files = await loadTLSFiles(
    opts.tlsFiles,
    (next) => {
      update(next.tls);
      late.signer = next.signer;
    },
    log,
  );
  late.signer = files.initial.signer;
  late.serving = true;
  log.warn('serving fixed TLS files: the controllers do not manage the impersonation proxy');
  return { initial: files.initial.tls, poll: files.poll };
}

/** What the proxy's controllers drive: the proxy's listener, and the SSH door and the direct path when they run. */
function proxyControlled(
  { opts, log }: Base,
  server: ProxyServer,
  late: Late,
  ssh: SshDoor | undefined,
  direct: DirectAPI | undefined,
): NonNullable<ConciergeControllerOptions['proxy']> {
  const listener = proxySwitch(server, late, log);
  return {
    ...(ssh ? { ssh } : {}),
    namespace: opts.namespace,
    configMap: opts.configMap,
    serve: (material) => listener.serve(material),
    hubName: (name) => (late.hubName = name),
    accessRequests: (settings) => (late.access = settings),
    ...(direct
      ? {
          direct: {
            service: { name: direct.service, port: direct.servicePort },
            serve: direct.serve,
            issuer: direct.issuer,
          },
        }
      : {}),
  };
}

/**
 * The controllers' list, with the process's periodic work (the forwarding token, the TLS files; on the leader, the
 * sweep of ended SSH key bindings), then started.
 */
async function startControllers(
  { opts, clients, clock, log }: Base,
  { informers, authenticators }: Shared,
  manager: ControllerManager,
  controlled: Partial<ConciergeControllerOptions> & { periodic: Controller[]; leaderPeriodic: Controller[] },
): Promise<void> {
  const { periodic, leaderPeriodic, ...options } = controlled;
  manager.add(
    ...(await conciergeControllers({
      ...options,
      manager,
      clients,
      informers,
      groupSuffix: opts.groupSuffix,
      ...(opts.namespace ? { namespace: opts.namespace } : {}),
      authenticators,
      clock,
      log,
    })),
    ...periodic.map((controller): ControllerEntry => ({ controller, runs: 'every-replica' })),
    ...leaderPeriodic.map((controller): ControllerEntry => ({ controller, runs: 'leader' })),
  );
  await manager.start();
}

/** The proxy's listener and the aggregated APIs' (when they run) take requests from now on. */
async function listenForClients(
  { opts, log, onStop }: Base,
  server: ProxyServer,
  direct: ProxyServer | undefined,
): Promise<Pick<ConciergeEndpoints, 'port' | 'aggregatedApiPort'>> {
  const port = await server.listen(opts.proxy.port, opts.proxy.host);
  onStop(() => server.close());
  log.info({ host: opts.proxy.host, port }, 'impersonation proxy listening');
  if (!direct || !opts.aggregatedApi) return { port };
  const aggregatedApiPort = await direct.listen(opts.aggregatedApi.port, opts.aggregatedApi.host);
  log.info({ host: opts.aggregatedApi.host, port: aggregatedApiPort }, 'aggregated APIs listening');
  return { port, aggregatedApiPort };
}

/**
 * The tunnel's parts that its controllers drive, made before the manager starts: the peer listener (with the `peer`
 * option) and the Cluster status facts, which also say which replicas hold a cluster's tunnel.
 */
async function tunnelStatus(
  base: Base,
  shared: Shared,
  late: Late,
  manager: ControllerManager,
): Promise<{ publisher: ClusterStatusPublisher; controlled: Partial<ConciergeControllerOptions> }> {
  const { opts, clients, groups, clock, log } = base;
  const { namespace } = opts;
  const clusterResource = { group: groups.tunnel, version: VERSION, plural: Resource.Cluster };
  const informer = shared.informers.customResource<Cluster>(clusterResource);
  await informer.synced();
  late.clusters = informer;
  const leases = shared.informers.leases(namespace, REPLICA_LEASE_LABEL);
  const [labelKey, labelValue] = REPLICA_LEASE_LABEL.split('=') as [string, string];
  // The replicas holding a cluster's tunnel, known once the status publisher (which reads the Leases) runs.
  let routes: Pick<ClusterStatusPublisher, 'holders' | 'knownSource' | 'replicas'> = {
    holders: () => [],
    knownSource: () => false,
    replicas: () => [],
  };
  const peer = opts.peer ? await peerPort(base, shared, late, () => routes) : undefined;
  const publisher = newClusterStatus({
    clusters: informer,
    leases,
    deleteLease: (name) => newLeaseClient(clients, namespace, name).delete(),
    lease: newLeaseClient(
      clients,
      namespace,
      replicaLeaseName(opts.identity),
      { [labelKey]: labelValue },
      {
        [REPLICA_VERSION_ANNOTATION]: SEALION_VERSION,
        [REPLICA_PROTOCOL_ANNOTATION]: formatProtocol(CURRENT_PROTOCOL),
        ...(late.peering ? { [PEER_ADDRESS_ANNOTATION]: late.peering.address } : {}),
      },
    ),
    status: newStatusApplier<ClusterStatus>(clients, clusterResource, Kind.Cluster),
    identity: opts.identity,
    version: SEALION_VERSION,
    tunnelProtocol: formatProtocol(CURRENT_PROTOCOL),
    held: (name) => late.tunnels?.held(name),
    manager,
    clock,
    log: log.child({ component: 'cluster-status' }),
  });
  routes = publisher;
  late.status = publisher;
  // The agents' handshakes that wait too long, swept once a second once the listener (started last) exists.
  manager.run(handshakeSweep(() => late.tunnels));
  const service = opts.tunnel?.service;
  return {
    publisher,
    controlled: {
      clusterStatus: publisher,
      ...(peer ? { peerCertificate: peer } : {}),
      ...(service
        ? {
            tunnelHosts: {
              namespace,
              service,
              configured: opts.tunnel!.hosts,
              listener: () => late.tunnels,
            },
          }
        : {}),
    },
  };
}

/** The peer listener (concierge/peering/), and how the controllers keep its certificate fresh. */
async function peerPort(
  { opts, clients, clock, log, onStop }: Base,
  { metrics, budget, recordings }: Shared,
  late: Late,
  routes: () => Pick<ClusterStatusPublisher, 'holders' | 'knownSource' | 'replicas'>,
): Promise<NonNullable<ConciergeControllerOptions['peerCertificate']>> {
  const started = await startPeering({
    clients,
    namespace: opts.namespace,
    identity: opts.identity,
    ...opts.peer!,
    local: (name) => late.tunnels?.route(name),
    holders: (name) => routes().holders(name),
    knownSource: (ip) => routes().knownSource(ip),
    replicas: () => routes().replicas(),
    ...(recordings ? { recordings } : {}),
    registry: metrics.registry,
    log: log.child({ component: 'peering' }),
    budget,
    clock,
  });
  late.peering = started;
  onStop(() => started.stop());
  return {
    issuedAt: () => started.issuedAt(),
    reissue: () => started.reissue(),
    renewAfterMs: PEER_CERT_RENEW_MS,
  };
}

/**
 * The agents' tunnel listener, after the proxy listens, so that a request for a cluster that comes while it starts
 * gets a Status.
 */
async function agentsListener(
  { opts, clients, groups, clock, log, onStop }: Base,
  { informers, budget, audit }: Shared,
  late: Late,
  status: ClusterStatusPublisher,
  manager: ControllerManager,
): Promise<void> {
  const { namespace } = opts;
  const tunnel = opts.tunnel!;
  const clusterResource = { group: groups.tunnel, version: VERSION, plural: Resource.Cluster };
  // The unredeemed bootstrap tokens, and only those: registration reads them here rather than asking the API server
  // once per attempt, which anyone could make.
  const tokens = informers.core<BootstrapSecret>('secrets', namespace, BOOTSTRAP_SECRET_SELECTORS);
  await tokens.synced();
  const listener = await startTunnelListener({
    clients,
    namespace,
    bootstrapTokens: newBootstrapTokenStore(clients, namespace, tokens),
    host: tunnel.host,
    port: tunnel.port,
    hosts: tunnel.hosts,
    clusters: informers.customResource<Cluster>(clusterResource),
    readCluster: (name) => readClusterCustomObject<Cluster>(clients, clusterResource, name),
    onTunnelChange: (name) => status.changed(name),
    onProtocolRefused: (name, problem) => status.refusedProtocol(name, problem),
    withdraw: () => status.withdraw(),
    identity: opts.identity,
    log: log.child({ component: 'tunnel' }),
    budget,
    clock,
    ...(audit ? { auditor: audit.auditor } : {}),
    ...(tunnel.registrationLimits ? { registrationLimits: tunnel.registrationLimits } : {}),
  });
  late.tunnels = listener;
  // On stop, this replica's routes go first (its entries and Lease, which peers route by), then its tunnels: a peer
  // that still sends a request meanwhile finds the tunnel here, and the agents move to other replicas after.
  onStop(async () => {
    await listener.handOver();
    await status.withdraw();
    await listener.stop();
  });
  // The listener runs: its hosts follow the tunnel's Service from now on.
  manager.enqueue(TUNNEL_HOSTS, TUNNEL_HOSTS_KEY);
}

/** The aggregated APIs' listener (not listening yet) and what the direct-login controllers hand it. */
interface DirectAPI {
  server: ProxyServer;
  service: string;
  servicePort: number;
  /** Its serving certificate and the front proxy's CA, whose request headers it believes; undefined: off. */
  serve: (material: DirectServingMaterial | undefined) => void;
  issuer: ClusterCertificateIssuer;
}

/**
 * The aggregated APIs' listener (not listening yet) and what the direct-login controllers hand it: its serving
 * certificate and the front proxy's CA, whose request headers it believes.
 */
async function directAPI(
  { opts, clients, groups, log, onStop }: Base,
  { reviewer, authenticators, audit }: Shared,
  at: NonNullable<ConciergeOptions['aggregatedApi']>,
): Promise<DirectAPI> {
  const cache = authenticators.cache;
  const auditor = audit?.auditor;
  const issuer = await ownCertificateIssuer(clients);
  let requestHeader: RequestHeaderConfig | undefined;
  let on = false;
  const handler = newDirectAPIHandler({
    groups,
    groupSuffix: opts.groupSuffix,
    requestHeader: () => (on ? requestHeader : undefined),
    trusted: () => server.trustedClientCAs(),
    login: {
      groups,
      cache,
      signer: newClusterCertSigner(
        () => (on ? issuer : undefined),
        () => (on ? requestHeader : undefined),
      ),
      log: log.child({ component: 'aggregated-api' }),
    },
    reviewer,
    ...(auditor ? { auditor } : {}),
    log: log.child({ component: 'aggregated-api' }),
  });
  const server = newProxyServer(
    // The front proxy's certificate is the cluster's, often with an RSA key.
    { ...(await placeholderTLS()), requireClientCertificate: true, anyClientKey: true },
    handler,
    (_req, socket) => socket.end(rawStatusResponse(404, 'the aggregated APIs serve no upgrades')),
    (err) => log.debug({ err: err.message }, 'aggregated API TLS handshake failed'),
  );
  onStop(() => server.close());
  const listener = newListenerSwitch<DirectServingMaterial>({
    name: 'aggregated APIs',
    identity: (m) => [m.certPem, m.keyPem, JSON.stringify(m.requestHeader)].join('\0'),
    load(m) {
      server.updateTLS({
        certPem: m.certPem,
        keyPem: m.keyPem,
        clientCAPems: [m.requestHeader.caPem],
        requireClientCertificate: true,
        anyClientKey: true,
      });
      requestHeader = m.requestHeader;
    },
    switched: (next) => (on = next),
    log,
  });
  return {
    server,
    service: at.service,
    servicePort: at.servicePort ?? 443,
    issuer,
    serve: (material) => listener.serve(material),
  };
}

/**
 * The issuer of the cluster's certificates, knowing who the API server records as the creator of this process's
 * CertificateSigningRequests, so that approval can check the request it approves is its own.
 */
async function ownCertificateIssuer(clients: KubeClients): Promise<ClusterCertificateIssuer> {
  const review = await clients.authentication.createSelfSubjectReview({
    body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
  });
  const me = review.status?.userInfo;
  if (!me?.username) throw new Error('the API server did not say who this concierge is (SelfSubjectReview)');
  return newClusterCertificateIssuer(clients, {
    self: { username: me.username, ...(me.uid ? { uid: me.uid } : {}) },
  });
}

/** The SSH door as the controllers switch it. */
interface SshDoor {
  serve: (material: (SshMaterial & { settings: SshSettings }) | undefined) => void;
  /** Stops listening; the connections open go on (a drain). */
  stopAccepting: () => void;
  close: () => Promise<void>;
  /** Where it listens now; undefined while it does not. */
  port: () => number | undefined;
  /** The leader's sweep of the key bindings whose session ended (they hold refresh tokens). */
  sweep: Controller;
}

/**
 * The SSH door as the controllers switch it: listening with the host key they hand over (a new key, a new server),
 * closed when they hand nothing. Settings are read per connection, so edits apply without a restart.
 */
function sshDoor(
  { opts, groups, clients, log }: Base,
  { informers, authenticators, recordings }: Shared,
  door: InProcessDoor,
  at: { host: string; port: number },
  late: Late,
): SshDoor {
  const clusters = informers.customResource<Cluster>({
    group: groups.tunnel,
    version: VERSION,
    plural: Resource.Cluster,
  });
  const bindings = newKeyBindings({
    namespace: opts.namespace,
    secrets: informers.core<BindingSecret>('secrets', opts.namespace, BINDING_SELECTORS),
    writes: newObjectWriter(clients, 'sealion-ssh'),
  });
  const deps: Omit<SshServerOptions, 'hostKeys' | 'settings'> = {
    door,
    cache: authenticators.cache,
    bindings,
    groupSuffix: opts.groupSuffix,
    ...(recordings ? { recordings } : {}),
    clusterNames: opts.tunnel
      ? () =>
          clusters
            .list()
            .map((c) => c.metadata.name ?? '')
            .filter(Boolean)
      : () => [],
    log: log.child({ component: 'ssh' }),
  };
  let settings: SshSettings | undefined;
  let current: { server: SshServer; port: number } | undefined;
  const listener = newListenerSwitch<SshMaterial & { settings: SshSettings }>({
    name: 'ssh door',
    identity: (m) => m.hostKeys.join('\0'),
    async load(m) {
      const server = newSshServer({ ...deps, hostKeys: m.hostKeys, settings: () => settings! });
      const port = await server.listen(at.port, at.host);
      current = { server, port };
      deps.log.info({ host: at.host, port }, 'ssh door listening');
    },
    async unload() {
      const previous = current;
      current = undefined;
      await previous?.server.close();
    },
    log: deps.log,
  });
  return {
    serve(material) {
      if (material) settings = material.settings;
      // What signed-in users read of the door: published while it is configured on, whichever replica they ask.
      late.sshDoor = material
        ? {
            ...material.published,
            hubName: material.settings.hubName,
            deviceLogin: material.settings.login !== undefined,
          }
        : undefined;
      listener.serve(material);
    },
    stopAccepting: () => current?.server.stopAccepting(),
    close: () => listener.close(),
    port: () => current?.port,
    sweep: periodic(SSH_BINDING_SWEEP, BINDING_SWEEP_MS, async () => {
      const deleted = await bindings.sweep();
      if (deleted > 0) deps.log.info({ deleted }, 'ssh key bindings past their session deleted');
    }),
  };
}

/** The periodic controller that deletes the SSH key bindings whose session ended. */
const SSH_BINDING_SWEEP = 'ssh-binding-sweep';

/**
 * What the controllers ask the proxy to serve, applied to its listener (lib/listener-switch.ts): certificates are
 * loaded once per set, swapped in place, and a set that fails to load leaves the current one serving.
 */
function proxySwitch(server: ProxyServer, late: Late, log: Logger): ListenerSwitch<ServingMaterial> {
  return newListenerSwitch<ServingMaterial>({
    name: 'impersonation proxy',
    identity: materialKey,
    async load(material) {
      const signer = await loadCA(material.signer.certPem, material.signer.keyPem);
      server.updateTLS({
        certPem: material.certPem,
        keyPem: material.keyPem,
        clientCAPems: material.clientCAPems,
      });
      late.signer = signer;
    },
    switched: (on) => (late.serving = on),
    log,
  });
}

async function serveMetrics(
  { onStop }: Base,
  metrics: ProxyMetrics,
  at: { host: string; port: number },
): Promise<number> {
  // The process's own health beside the proxy's: heap, garbage collection, event-loop lag, file descriptors. Only
  // where /metrics is served, so that the many concierges a test process runs observe nothing they are not asked.
  collectDefaultMetrics({ register: metrics.registry });
  const server = createServer((req, res) => {
    if (req.url !== '/metrics') return void res.writeHead(404).end();
    metrics.registry.metrics().then(
      (text) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(text),
      () => res.writeHead(500).end(),
    );
  });
  await new Promise<void>((done) => server.listen(at.port, at.host, done));
  onStop(() => closeServer(server));
  return (server.address() as AddressInfo).port;
}

function closeServer(server: Server): Promise<void> {
  server.closeAllConnections();
  return new Promise((done) => server.close(() => done()));
}

/** A self-signed certificate nobody is meant to trust: the listener needs one before the real one arrives. */
async function placeholderTLS(): Promise<ProxyTLS> {
  const ca = await newCA('sealion placeholder (the impersonation proxy is not serving yet)');
  const cert = await issueCert(ca, {
    commonName: 'sealion-placeholder',
    hosts: ['localhost'],
    usage: 'server',
  });
  return { certPem: cert.certPem, keyPem: cert.keyPem, clientCAPems: [] };
}
