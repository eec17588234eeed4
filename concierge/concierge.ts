// The concierge process without its command line: authenticator controllers, the impersonation proxy, its
// metrics listener. main.ts builds the clients and credentials and calls startConcierge; tests call it directly.
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { apiGroups } from '../apis/groups.ts';
import type { KubeClients } from '../lib/kube.ts';
import { newReviewer } from '../lib/kube.ts';
import type { Logger } from '../lib/log.ts';
import type { CertificateAuthority } from '../lib/pki.ts';
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
  /** Serving certificate and the CAs trusted for client certificates. */
  tls: ProxyTLS;
  /** Signs TokenCredentialRequest certificates; its CA must be among tls.clientCAPems. */
  signer?: CertificateAuthority;
  /** Plain-HTTP listener for /metrics. Default: none. */
  metrics?: { host: string; port: number };
  log: Logger;
}

export interface Concierge {
  port: number;
  metricsPort?: number;
  /** Swap the serving certificate, trusted client CAs and signer without a restart. */
  updateTLS(tls: ProxyTLS, signer?: CertificateAuthority): void;
  stop(): Promise<void>;
}

export async function startConcierge(opts: ConciergeOptions): Promise<Concierge> {
  const log = opts.log;
  const groups = apiGroups(opts.groupSuffix);
  const authenticators = await startAuthenticators(
    opts.clients,
    opts.groupSuffix,
    log.child({ component: 'authenticators' }),
  );
  const reviewer = newReviewer(opts.clients);
  let signer = opts.signer;
  const metrics = newProxyMetrics();
  const forwarder = newForwarder(opts.upstream);
  const handler = newProxyHandler({
    groups,
    authenticator: newRequestAuthenticator(authenticators.cache, reviewer),
    cache: authenticators.cache,
    reviewer,
    forwarder,
    signer: newClientCertSigner(() => signer),
    metrics,
    log: log.child({ component: 'proxy' }),
    ready: () => true,
  });
  const server = newProxyServer(opts.tls, handler.request, handler.upgrade, (err) =>
    log.debug({ err: err.message }, 'TLS handshake failed'),
  );
  const port = await server.listen(opts.port, opts.host);
  log.info({ host: opts.host, port }, 'impersonation proxy listening');

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
    ...(metricsPort === undefined ? {} : { metricsPort }),
    updateTLS(tls, nextSigner) {
      server.updateTLS(tls);
      if (nextSigner) signer = nextSigner;
      log.info('TLS material reloaded');
    },
    async stop() {
      await server.close();
      forwarder.close();
      metricsServer?.closeAllConnections();
      await new Promise<void>((done) => (metricsServer ? metricsServer.close(() => done()) : done()));
      await authenticators.stop();
    },
  };
}
