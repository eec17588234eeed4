// The concierge process without its command line: authenticator controllers, the impersonation proxy, its
// metrics listener. main.ts builds the clients and credentials and calls startConcierge; tests call it directly.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { apiGroups, Resource, VERSION } from '../apis/groups.ts';
import type { Cluster, ClusterStatus } from '../apis/tunnel.ts';
import type { Informer } from '../lib/informer.ts';
import type { KubeClients } from '../lib/kube.ts';
import {
  newClusterStatusWriter,
  readClusterCustomObject,
  newCustomResourceInformer,
  newLeaseClient,
  newReviewer,
} from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../lib/pki.ts';
import { startLeaderElection } from '../controllers/lib/leader.ts';
import type { ServingMaterial } from '../controllers/impersonation-proxy.ts';
import { startProxyControllers, type ProxyControllers } from './controllers.ts';
import { startTunnelListener, type TunnelListener } from './tunnel/listener.ts';
import { startAuthenticators } from './authenticators.ts';
import { newRequestAuthenticator } from './proxy/authenticate.ts';
import { newClientCertSigner } from './proxy/credentials.ts';
import { newForwarder, type Upstream } from './proxy/forward.ts';
import { newProxyHandler } from './proxy/handler.ts';
import { newProxyMetrics } from './proxy/metrics.ts';
import { newProxyServer, type ProxyTLS } from './proxy/server.ts';

export interface ConciergeOptions {
  /** Clients for watches and reviews (the concierge's own identity). */
  clients: KubeClients;
  /** Where requests go and with which identity (one that may only impersonate). */
  upstream: Upstream;
  groupSuffix: string;
  /** The proxy's listener. */
  host: string;
  port: number;
  /**
   * Fixed serving certificate and client CAs: the proxy always serves with them. Without them, `control` must be
   * given, and the controllers decide whether the proxy serves and with which certificates.
   */
  tls?: ProxyTLS;
  /** Signs TokenCredentialRequest certificates; its CA must be among tls.clientCAPems. */
  signer?: CertificateAuthority;
  /** Run the controllers that manage the proxy (config, Service, certificates, strategies), leader-elected. */
  control?: {
    /** The concierge's namespace: its ConfigMap, Lease, the proxy's Service and Secrets. */
    namespace: string;
    configMap: string;
    /** This replica's name in the Lease (the pod name). */
    identity: string;
  };
  /** The agents' tunnel listener. Default: none (no agent-backed clusters). */
  tunnel?: {
    host: string;
    port: number;
    /** Names and addresses agents dial, for the listener's certificate. */
    hosts: string[];
    /** Where the tunnel CA and bootstrap tokens live. */
    namespace: string;
    /** This replica's name in the Clusters' status. */
    replica: string;
  };
  /** Plain-HTTP listener for /metrics. Default: none. */
  metrics?: { host: string; port: number };
  log: Logger;
}

export interface Concierge {
  port: number;
  /** The tunnel listener's port and CA, when it runs. */
  tunnel?: { port: number; caPem: string };
  metricsPort?: number;
  /** Swap the serving certificate, trusted client CAs and signer without a restart. */
  updateTLS(tls: ProxyTLS, signer?: CertificateAuthority): void;
  stop(): Promise<void>;
}

/** The Lease that picks the replica whose controllers write. */
export const LEADER_LEASE = 'sealion-concierge-controllers';

/** Serving material the controllers handed over, compared to skip reloading what did not change. */
function materialKey(m: ServingMaterial): string {
  return [m.certPem, m.keyPem, m.signer.certPem, m.signer.keyPem, ...m.clientCAPems].join('\0');
}

export async function startConcierge(opts: ConciergeOptions): Promise<Concierge> {
  const log = opts.log;
  const groups = apiGroups(opts.groupSuffix);
  const control = opts.control;
  if (!opts.tls && !control)
    throw new Error('startConcierge: give tls, or control to let the controllers serve');
  const election = control
    ? startLeaderElection({
        leases: newLeaseClient(opts.clients, control.namespace, LEADER_LEASE),
        identity: control.identity,
        log: log.child({ component: 'leader-election' }),
      })
    : undefined;
  const isLeader = election ? () => election.isLeader() : () => true;
  const authenticators = await startAuthenticators(
    opts.clients,
    opts.groupSuffix,
    log.child({ component: 'authenticators' }),
    isLeader,
  );
  const reviewer = newReviewer(opts.clients);
  // Declared before the listener starts: a request for /clusters/<name>/… that comes while the rest starts gets
  // the handler's 503 (not connected), not a ReferenceError.
  let tunnels: TunnelListener | undefined;
  let clusterInformer: Informer<Cluster> | undefined;
  let signer = opts.signer;
  let serving = Boolean(opts.tls);
  const metrics = newProxyMetrics();
  const forwarder = newForwarder(opts.upstream);
  const handler = newProxyHandler({
    groups,
    // The server is made below; the handler asks it for trusted CAs only when requests arrive.
    authenticator: newRequestAuthenticator(authenticators.cache, reviewer, () => server.trustedClientCAs()),
    cache: authenticators.cache,
    reviewer,
    forwarder,
    signer: newClientCertSigner(() => signer),
    metrics,
    log: log.child({ component: 'proxy' }),
    ready: () => true,
    serving: () => serving,
    clusters: (name) => tunnels?.forwarder(name),
  });
  // Until the controllers hand over certificates the listener serves health checks with a throwaway one.
  const server = newProxyServer(
    opts.tls ?? (await placeholderTLS()),
    handler.request,
    handler.upgrade,
    (err) => log.debug({ err: err.message }, 'TLS handshake failed'),
  );
  const port = await server.listen(opts.port, opts.host);
  log.info({ host: opts.host, port }, 'impersonation proxy listening');

  let controllers: ProxyControllers | undefined;
  if (control) {
    /** The material the controllers last asked for ('' for off), and the one the listener has. */
    let wanted = '';
    let applied = '';
    let loading = Promise.resolve();
    const switchTo = (on: boolean): void => {
      if (on !== serving)
        log.info(on ? 'impersonation proxy switched on' : 'impersonation proxy switched off');
      serving = on;
    };
    const serve = (material: ServingMaterial | undefined): void => {
      const key = material ? materialKey(material) : '';
      if (key === wanted) return;
      wanted = key;
      if (!material) return switchTo(false);
      if (key === applied) return switchTo(true);
      loading = loading.then(async () => {
        if (wanted !== key) return;
        try {
          const nextSigner = await loadCA(material.signer.certPem, material.signer.keyPem);
          server.updateTLS({
            certPem: material.certPem,
            keyPem: material.keyPem,
            clientCAPems: material.clientCAPems,
          });
          signer = nextSigner;
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
    controllers = await startProxyControllers({
      clients: opts.clients,
      groupSuffix: opts.groupSuffix,
      namespace: control.namespace,
      configMap: control.configMap,
      authenticators,
      isLeader,
      serve,
      log: log.child({ component: 'controllers' }),
    });
    election!.onChange((leading) => {
      if (!leading) return;
      authenticators.resync();
      controllers!.resync();
    });
  }

  if (opts.tunnel) {
    const tunnelGroup = apiGroups(opts.groupSuffix).tunnel;
    const clusterResource = { group: tunnelGroup, version: VERSION, plural: Resource.Cluster };
    clusterInformer = newCustomResourceInformer<Cluster>(opts.clients, clusterResource, log);
    await clusterInformer.synced();
    tunnels = await startTunnelListener({
      clients: opts.clients,
      namespace: opts.tunnel.namespace,
      host: opts.tunnel.host,
      port: opts.tunnel.port,
      hosts: opts.tunnel.hosts,
      clusters: clusterInformer,
      readCluster: (name) => readClusterCustomObject<Cluster>(opts.clients, clusterResource, name),
      status: newClusterStatusWriter<ClusterStatus>(opts.clients, clusterResource),
      replica: opts.tunnel.replica,
      log: log.child({ component: 'tunnel' }),
    });
  }

  let metricsServer: Server | undefined;
  let metricsPort: number | undefined;
  if (opts.metrics) {
    metricsServer = createServer((req, res) => {
      if (req.url !== '/metrics') return void res.writeHead(404).end();
      metrics.registry.metrics().then(
        (text) => res.writeHead(200, { 'content-type': metrics.registry.contentType }).end(text),
        () => res.writeHead(500).end(),
      );
    });
    await new Promise<void>((done) => metricsServer!.listen(opts.metrics!.port, opts.metrics!.host, done));
    metricsPort = (metricsServer.address() as AddressInfo).port;
  }

  return {
    port,
    ...(tunnels ? { tunnel: { port: tunnels.port, caPem: tunnels.caPem } } : {}),
    ...(metricsPort === undefined ? {} : { metricsPort }),
    updateTLS(tls, nextSigner) {
      server.updateTLS(tls);
      if (nextSigner) signer = nextSigner;
      log.info('TLS material reloaded');
    },
    async stop() {
      await tunnels?.stop();
      await clusterInformer?.stop();
      await controllers?.stop();
      await election?.stop();
      await server.close();
      forwarder.close();
      metricsServer?.closeAllConnections();
      await new Promise<void>((done) => (metricsServer ? metricsServer.close(() => done()) : done()));
      await authenticators.stop();
    },
  };
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
