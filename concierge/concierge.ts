// The concierge's composition root: from its options (main.ts turns flags and environment into them; tests, the
// development environment and the benchmarks write them directly) it builds the clients, informers, controllers,
// the impersonation proxy, the agents' tunnel listener and the metrics listener, and starts and stops them in order.
import { PEER_ADDRESS_ANNOTATION, REPLICA_VERSION_ANNOTATION } from '../apis/install.ts';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { apiGroups, Kind, Resource, VERSION } from '../apis/groups.ts';
import type { Cluster, ClusterStatus } from '../apis/tunnel.ts';
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
  type KubeconfigSource,
} from '../lib/kube/kube.ts';
import { newLifecycle } from '../lib/lifecycle.ts';
import type { Logger } from '../lib/log.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { startLeaderElection, type LeaderElection } from '../lib/controller/leader.ts';
import { newControllerManager } from '../lib/controller/manager.ts';
import type { ServingMaterial } from '../controllers/impersonation-proxy.ts';
import { TUNNEL_HOSTS, TUNNEL_HOSTS_KEY } from '../controllers/tunnel-hosts.ts';
import { conciergeControllers, newAuthenticators, type ConciergeControllerOptions } from './controllers.ts';
import { newRequestAuthenticator } from './proxy/authenticate.ts';
import { newClientCertSigner } from './proxy/credentials.ts';
import { newDirectAPIHandler } from './direct/handler.ts';
import { newClusterCertSigner } from './direct/signer.ts';
import type { RequestHeaderConfig } from '../lib/kube/request-header.ts';
import type { DirectServingMaterial } from '../controllers/direct-login.ts';
import { rawStatusResponse } from '../lib/kube/status.ts';
import { newClusterCertificateIssuer } from '../lib/kube/cluster-certificates.ts';
import { newHubRoute } from './proxy/hub-route.ts';
import { newClusterRouter } from './proxy/route.ts';
import { newProxyHandler } from './proxy/handler.ts';
import { kubeReachReads, newReacher, SELF_REVIEW_PATH } from '../lib/reach/dialer.ts';
import { startAudit, type AuditOptions } from './audit/setup.ts';
import type { Auditor } from './audit/audit.ts';
import { newRecordings, sharedRecordings, type RecordingOptions } from './recording/session.ts';
import { newRecordingUploader, type RecordingUploader } from './recording/upload.ts';
import { newWebhookClient } from './audit/sinks.ts';
import { newMemoryBudget, CONCIERGE_UNREAD_BYTES, USER_UNREAD_BYTES } from '../lib/http2/memory-budget.ts';
import { collectDefaultMetrics } from 'prom-client';
import { newProxyMetrics, unreadBytesGauge, type ProxyMetrics } from './proxy/metrics.ts';
import { newProxyServer, type ProxyServer, type ProxyTLS } from './proxy/server.ts';
import { watchTLSFiles, type TLSFiles } from './tls-files.ts';
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
import { newInProcessDoor } from './ssh/in-process.ts';
import { newSshServer, type SshServer, type SshServerOptions, type SshSettings } from './ssh/server.ts';
import { BINDING_SELECTORS, newKeyBindings, type BindingSecret } from './ssh/bindings.ts';
import type { SshMaterial } from '../controllers/ssh-door.ts';
import { SEALION_VERSION } from '../lib/version.ts';

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
  /** Whether operational log lines name users; audit events always do. Default: true. */
  logUsernames?: boolean;
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
}

/** The Lease that picks the replica whose controllers write. */
export const LEADER_LEASE = 'sealion-concierge-controllers';

/** Serving material the controllers handed over, compared to skip reloading what did not change. */
function materialKey(m: ServingMaterial): string {
  return [m.certPem, m.keyPem, m.signer.certPem, m.signer.keyPem, ...m.clientCAPems].join('\0');
}

export function newConcierge(opts: ConciergeOptions): Concierge {
  return newLifecycle('concierge', opts.log, (onStop) => start(opts, onStop));
}

/** Starts the parts in order; `onStop` collects how to stop each one as soon as it runs. */
async function start(
  opts: ConciergeOptions,
  onStop: (step: () => unknown) => void,
): Promise<ConciergeEndpoints> {
  const { log, namespace } = opts;
  const clock = opts.clock ?? systemClock;
  const groups = apiGroups(opts.groupSuffix);
  if (!opts.tlsFiles && !namespace) throw new Error('the controllers need the concierge namespace');
  if (opts.tunnel && !namespace)
    throw new Error('the tunnel listener needs the concierge namespace for its CA');
  const clients = newKubeClients(opts.kubeconfig);
  const forwarding = await forwardingUpstream(clients, opts.forwardAs, namespace, clock, log);
  onStop(() => forwarding.stop());

  let election: LeaderElection | undefined;
  if (!opts.tlsFiles) {
    election = startLeaderElection({
      leases: newLeaseClient(clients, namespace, LEADER_LEASE),
      identity: opts.identity,
      clock,
      log: log.child({ component: 'leader-election' }),
    });
    const elected = election;
    onStop(() => elected.stop());
  }
  // The process's informers, each made once and shared by all who read its collection; stopped after everyone who
  // reads them (stops run in reverse order).
  const informers = newKubeInformers(clients, log);
  onStop(() => informers.stop());
  const authenticators = newAuthenticators(informers, opts.groupSuffix);
  onStop(() => authenticators.cache.close());

  // Declared before the listener starts: a request for /clusters/<name>/… that comes while the rest starts gets
  // the handler's 503 (not connected), not a ReferenceError.
  let tunnels: TunnelListener | undefined;
  let peering: Peering | undefined;
  let signer: CertificateAuthority | undefined;
  let serving = false;
  const reviewer = newReviewer(clients);
  const metrics = newProxyMetrics();
  // One budget for every answer and upgraded connection this replica relays: from its API server, its tunnels, its
  // peers and the reach connections it dials.
  const budget = newMemoryBudget(
    { perUserBytes: USER_UNREAD_BYTES, totalBytes: CONCIERGE_UNREAD_BYTES },
    () => metrics.unreadCuts.inc(),
  );
  unreadBytesGauge(metrics.registry, () => budget.held());
  const hub = newHubRoute(forwarding.upstream, budget);
  onStop(() => hub.close());
  // Stopped after the listeners (stops run in reverse order), so the last requests' events are written.
  const audit = opts.audit
    ? await startAudit(opts.audit, opts.identity, metrics.registry, log.child({ component: 'audit' }))
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
        ...(uploader ? { uploader } : {}),
      })
    : undefined;
  // The hub's reach connections: objects read as the concierge, reviews sent as the forwarding identity (whose
  // impersonation the API server checks).
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
  });
  onStop(() => reacher.close());
  // SSH sessions enter the pipeline through this door, each request as the identity its session signed in as.
  const door = newInProcessDoor();
  onStop(() => door.close());
  const handler = newProxyHandler({
    groups,
    signedIn: (req) => door.signedIn(req),
    // The server is made below; the handler asks it for trusted CAs only when requests arrive, as the file
    // watcher's callback below updates it only after the first poll.
    authenticator: newRequestAuthenticator(authenticators.cache, reviewer, () => server.trustedClientCAs()),
    cache: authenticators.cache,
    reviewer,
    // The hub's own API server; a cluster through the replica's own tunnel, else a peer's.
    router: newClusterRouter(
      hub,
      (name) => tunnels?.route(name),
      (name) => peering?.route(name),
    ),
    signer: newClientCertSigner(() => signer),
    reacher,
    metrics,
    log: log.child({ component: 'proxy' }),
    ready: () => true,
    serving: () => serving,
    ...(audit ? { auditor: audit.auditor } : {}),
    ...(recordings
      ? { recordings, recordingStore: sharedRecordings(recordings, opts.identity, () => peering) }
      : {}),
    ...(opts.logUsernames === undefined ? {} : { logUsernames: opts.logUsernames }),
  });

  door.serve(handler.request, handler.upgrade);

  let initialTLS: ProxyTLS;
  if (opts.tlsFiles) {
    const files = await watchTLSFiles(
      opts.tlsFiles,
      (next) => {
        server.updateTLS(next.tls);
        signer = next.signer;
      },
      clock,
      log,
    );
    onStop(() => files.stop());
    initialTLS = files.initial.tls;
    signer = files.initial.signer;
    serving = true;
    log.warn('serving fixed TLS files: the controllers do not manage the impersonation proxy');
  } else {
    // Until the controllers hand over certificates the listener serves health checks with a throwaway one.
    initialTLS = await placeholderTLS();
  }
  const server = newProxyServer(initialTLS, handler.request, handler.upgrade, (err) =>
    log.debug({ err: err.message }, 'TLS handshake failed'),
  );
  const direct =
    opts.aggregatedApi && election
      ? await directAPI(
          opts,
          opts.aggregatedApi,
          clients,
          reviewer,
          authenticators.cache,
          groups,
          log,
          audit?.auditor,
        )
      : undefined;
  if (direct) onStop(() => direct.server.close());
  // The controllers (concierge/controllers.ts), registered with one manager once the parts they drive run, and
  // started before the proxy takes a request (the authenticators' cache is filled first). It stops after the tunnel
  // parts below, whose Cluster status facts its controllers withdraw.
  const manager = newControllerManager({
    ...(election ? { election } : {}),
    clock,
    registry: metrics.registry,
    log: log.child({ component: 'controllers' }),
  });
  onStop(() => manager.stop());
  const controlled: Partial<ConciergeControllerOptions> = {};
  const ssh =
    election && opts.ssh
      ? sshDoor(opts.ssh, {
          door,
          cache: authenticators.cache,
          bindings: newKeyBindings({
            namespace,
            secrets: informers.core<BindingSecret>('secrets', namespace, BINDING_SELECTORS),
            writes: newObjectWriter(clients, 'sealion-ssh'),
          }),
          groupSuffix: opts.groupSuffix,
          clusterNames: opts.tunnel
            ? () =>
                informers
                  .customResource<Cluster>({
                    group: groups.tunnel,
                    version: VERSION,
                    plural: Resource.Cluster,
                  })
                  .list()
                  .map((c) => c.metadata.name ?? '')
                  .filter(Boolean)
            : () => [],
          log: log.child({ component: 'ssh' }),
        })
      : undefined;
  if (election)
    controlled.proxy = {
      ...(ssh ? { ssh } : {}),
      namespace,
      configMap: opts.configMap,
      serve: servingSwitch(
        server,
        (on) => (serving = on),
        (next) => (signer = next),
        log,
      ),
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

  // The tunnel's parts that its controllers drive (the peer listener, the Cluster status facts) come before the
  // manager starts; the agents' listener after the proxy listens, so that a request for a cluster that comes while it
  // starts gets a Status.
  const clusterResource = { group: groups.tunnel, version: VERSION, plural: Resource.Cluster };
  let publisher: ClusterStatusPublisher | undefined;
  if (opts.tunnel) {
    const informer = informers.customResource<Cluster>(clusterResource);
    await informer.synced();
    const leases = informers.leases(namespace, REPLICA_LEASE_LABEL);
    const [labelKey, labelValue] = REPLICA_LEASE_LABEL.split('=') as [string, string];
    // The replicas holding a cluster's tunnel, known once the status publisher (which reads the Leases) runs.
    let routes: Pick<ClusterStatusPublisher, 'holders' | 'knownSource' | 'replicas'> = {
      holders: () => [],
      knownSource: () => false,
      replicas: () => [],
    };
    if (opts.peer) {
      const started = await startPeering({
        clients,
        namespace,
        identity: opts.identity,
        ...opts.peer,
        local: (name) => tunnels?.route(name),
        holders: (name) => routes.holders(name),
        knownSource: (ip) => routes.knownSource(ip),
        replicas: () => routes.replicas(),
        ...(recordings ? { recordings } : {}),
        registry: metrics.registry,
        log: log.child({ component: 'peering' }),
        budget,
        clock,
      });
      peering = started;
      onStop(() => started.stop());
      controlled.peerCertificate = {
        issuedAt: () => started.issuedAt(),
        reissue: () => started.reissue(),
        renewAfterMs: PEER_CERT_RENEW_MS,
      };
    }
    publisher = newClusterStatus({
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
          ...(peering ? { [PEER_ADDRESS_ANNOTATION]: peering.address } : {}),
        },
      ),
      status: newStatusApplier<ClusterStatus>(clients, clusterResource, Kind.Cluster),
      identity: opts.identity,
      version: SEALION_VERSION,
      held: (name) => tunnels?.held(name),
      manager,
      clock,
      log: log.child({ component: 'cluster-status' }),
    });
    routes = publisher;
    controlled.clusterStatus = publisher;
    manager.run(handshakeSweep(() => tunnels));
    if (opts.tunnel.service)
      controlled.tunnelHosts = {
        namespace,
        service: opts.tunnel.service,
        configured: opts.tunnel.hosts,
        listener: () => tunnels,
      };
  }

  manager.add(
    ...(await conciergeControllers({
      ...controlled,
      manager,
      clients,
      informers,
      groupSuffix: opts.groupSuffix,
      ...(namespace ? { namespace } : {}),
      authenticators,
      clock,
      log,
    })),
  );
  await manager.start();
  // Stopped before the controllers (stops run in reverse order), which could otherwise start it again.
  if (ssh) onStop(() => ssh.close());
  // Should a later part fail to start: this replica's Lease goes (withdrawing twice is withdrawing once).
  const facts = publisher;
  if (facts) onStop(() => facts.withdraw());
  const port = await server.listen(opts.proxy.port, opts.proxy.host);
  onStop(() => server.close());
  log.info({ host: opts.proxy.host, port }, 'impersonation proxy listening');
  const aggregatedApiPort = direct
    ? await direct.server.listen(opts.aggregatedApi!.port, opts.aggregatedApi!.host)
    : undefined;
  if (aggregatedApiPort !== undefined)
    log.info({ host: opts.aggregatedApi!.host, port: aggregatedApiPort }, 'aggregated APIs listening');

  if (opts.tunnel && publisher) {
    const status = publisher;
    // The unredeemed bootstrap tokens, and only those: registration reads them here rather than asking the API server
    // once per attempt, which anyone could make.
    const tokens = informers.core<BootstrapSecret>('secrets', namespace, BOOTSTRAP_SECRET_SELECTORS);
    await tokens.synced();
    const listener = await startTunnelListener({
      clients,
      namespace,
      bootstrapTokens: newBootstrapTokenStore(clients, namespace, tokens),
      host: opts.tunnel.host,
      port: opts.tunnel.port,
      hosts: opts.tunnel.hosts,
      clusters: informers.customResource<Cluster>(clusterResource),
      readCluster: (name) => readClusterCustomObject<Cluster>(clients, clusterResource, name),
      onTunnelChange: (name) => status.changed(name),
      identity: opts.identity,
      log: log.child({ component: 'tunnel' }),
      budget,
      clock,
      ...(audit ? { auditor: audit.auditor } : {}),
      ...(opts.tunnel.registrationLimits ? { registrationLimits: opts.tunnel.registrationLimits } : {}),
    });
    tunnels = listener;
    // On stop, this replica's routes go first (its entries and Lease, which peers route by), then its tunnels: a peer
    // that still sends a request meanwhile finds the tunnel here, and the agents move to other replicas after.
    onStop(async () => {
      await status.withdraw();
      await listener.stop();
    });
    // The listener runs: its hosts follow the tunnel's Service from now on.
    manager.enqueue(TUNNEL_HOSTS, TUNNEL_HOSTS_KEY);
  }

  let metricsPort: number | undefined;
  if (opts.metrics) {
    const metricsServer = await serveMetrics(metrics, opts.metrics);
    onStop(() => closeServer(metricsServer));
    metricsPort = (metricsServer.address() as AddressInfo).port;
  }
  return {
    port,
    ...(aggregatedApiPort === undefined ? {} : { aggregatedApiPort }),
    ...(tunnels ? { tunnel: { port: tunnels.port, caPem: tunnels.caPem } } : {}),
    ...(metricsPort === undefined ? {} : { metricsPort }),
    ...(ssh ? { sshPort: ssh.port } : {}),
  };
}

/**
 * The aggregated APIs' listener (not listening yet) and what the direct-login controllers hand it: its serving
 * certificate and the front proxy's CA, whose request headers it believes.
 */
async function directAPI(
  opts: ConciergeOptions,
  at: NonNullable<ConciergeOptions['aggregatedApi']>,
  clients: ReturnType<typeof newKubeClients>,
  reviewer: ReturnType<typeof newReviewer>,
  cache: Parameters<typeof newDirectAPIHandler>[0]['login']['cache'],
  groups: ReturnType<typeof apiGroups>,
  log: Logger,
  auditor: Auditor | undefined,
): Promise<{
  server: ProxyServer;
  service: string;
  servicePort: number;
  serve: (material: DirectServingMaterial | undefined) => void;
  issuer: ReturnType<typeof newClusterCertificateIssuer>;
}> {
  // Who the API server records as the creator of this process's CertificateSigningRequests, so that approval can
  // check the request it approves is its own.
  const review = await clients.authentication.createSelfSubjectReview({
    body: { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
  });
  const me = review.status?.userInfo;
  if (!me?.username) throw new Error('the API server did not say who this concierge is (SelfSubjectReview)');
  const issuer = newClusterCertificateIssuer(clients, {
    self: { username: me.username, ...(me.uid ? { uid: me.uid } : {}) },
  });
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
  let applied = '';
  return {
    server,
    service: at.service,
    servicePort: at.servicePort ?? 443,
    issuer,
    serve(material) {
      if (!material) {
        on = false;
        return;
      }
      const key = [material.certPem, material.keyPem, JSON.stringify(material.requestHeader)].join('\0');
      if (key !== applied) {
        server.updateTLS({
          certPem: material.certPem,
          keyPem: material.keyPem,
          clientCAPems: [material.requestHeader.caPem],
          requireClientCertificate: true,
          anyClientKey: true,
        });
        requestHeader = material.requestHeader;
        applied = key;
      }
      on = true;
    },
  };
}

/**
 * The SSH door as the controllers switch it: listening with the host key they hand over (a new key, a new server),
 * closed when they hand nothing. Settings are read per connection, so edits apply without a restart.
 */
function sshDoor(
  at: { host: string; port: number },
  deps: Omit<SshServerOptions, 'hostKeys' | 'settings'>,
): {
  serve: (material: (SshMaterial & { settings: SshSettings }) | undefined) => void;
  close: () => Promise<void>;
  /** Where it listens now; undefined while it does not. */
  port: () => number | undefined;
} {
  let settings: SshSettings | undefined;
  let current: { key: string; server: SshServer; port: number } | undefined;
  let wanted = '';
  let closed = false;
  let switching = Promise.resolve();
  const switchTo = (material: SshMaterial | undefined): Promise<void> =>
    (switching = switching.then(async () => {
      const key = material ? material.hostKeys.join('\0') : '';
      if (closed || key !== wanted || key === (current?.key ?? '')) return;
      const previous = current;
      current = undefined;
      await previous?.server.close();
      if (!material) return void deps.log.info('ssh door closed');
      try {
        const server = newSshServer({ ...deps, hostKeys: material.hostKeys, settings: () => settings! });
        const port = await server.listen(at.port, at.host);
        current = { key, server, port };
        deps.log.info({ host: at.host, port }, 'ssh door listening');
      } catch (err) {
        wanted = '';
        deps.log.error({ err: (err as Error).message }, 'the ssh door could not start');
      }
    })).catch((err: unknown) =>
      deps.log.error({ err: (err as Error).message }, 'the ssh door could not switch'),
    );
  return {
    serve(material) {
      if (closed) return;
      if (material) settings = material.settings;
      const key = material ? material.hostKeys.join('\0') : '';
      if (key === wanted) return;
      wanted = key;
      void switchTo(material);
    },
    async close() {
      closed = true;
      await switching;
      await current?.server.close();
      current = undefined;
    },
    port: () => current?.port,
  };
}

/**
 * What the controllers ask the proxy to serve, applied to the listener: certificates are loaded once per set, and
 * a set that fails to load leaves the current one serving.
 */
function servingSwitch(
  server: ProxyServer,
  setServing: (on: boolean) => void,
  setSigner: (signer: CertificateAuthority) => void,
  log: Logger,
): (material: ServingMaterial | undefined) => void {
  /** The material the controllers last asked for ('' for off), and the one the listener has. */
  let wanted = '';
  let applied = '';
  let on = false;
  let loading = Promise.resolve();
  const switchTo = (next: boolean): void => {
    if (next !== on) log.info(next ? 'impersonation proxy switched on' : 'impersonation proxy switched off');
    on = next;
    setServing(next);
  };
  return (material) => {
    const key = material ? materialKey(material) : '';
    if (key === wanted) return;
    wanted = key;
    if (!material) return switchTo(false);
    if (key === applied) return switchTo(true);
    loading = loading.then(async () => {
      if (wanted !== key) return;
      try {
        const signer = await loadCA(material.signer.certPem, material.signer.keyPem);
        server.updateTLS({
          certPem: material.certPem,
          keyPem: material.keyPem,
          clientCAPems: material.clientCAPems,
        });
        setSigner(signer);
        applied = key;
        if (wanted === key) switchTo(true);
      } catch (err) {
        wanted = '';
        log.error(
          { err: (err as Error).message },
          'loading the proxy certificates failed; keeping the current ones',
        );
      }
    });
  };
}

async function serveMetrics(metrics: ProxyMetrics, at: { host: string; port: number }): Promise<Server> {
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
  return server;
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
