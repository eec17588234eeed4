// The holder's end of the peer links: the peer port. Each link a replica dials here is an HTTP/2 session whose
// requests go into this replica's tunnels, as the user's, as the replica they landed on decided them. The port takes
// connections only from the addresses replicas publish, and at the handshake only the peer CA's certificates that
// name a replica; a link does not outlive its certificate.
import { createServer as createHttpServer, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import type { ServerHttp2Stream } from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { createServer as createTlsServer, type TLSSocket } from 'node:tls';
import type { Clock } from '../../lib/clock.ts';
import { serveStream, type Request, type Response } from '../../lib/http2/request.ts';
import type { Logger } from '../../lib/log.ts';
import { serveTunnel, type TunnelServer } from '../../lib/tunnel/tunnel.ts';
import { newRequestContext, refuse, type Exchange } from '../proxy/exchange.ts';
import { send, writeStatus } from '../../lib/kube/status.ts';
import type { Recordings } from '../recording/session.ts';
import { RECORDINGS_PATH } from './link.ts';
import { relay } from '../../lib/http2/memory-budget.ts';
import { clusterRoute, type Route } from '../proxy/route.ts';
import { CLIENT_SIGALGS } from '../proxy/server.ts';
import {
  ALPN,
  HANDSHAKE_TIMEOUT_MS,
  MAX_PEER_CONNECTIONS,
  planFrom,
  replicaOf,
  RETRY_AFTER_SECONDS,
  type PeerCredentials,
  type PeerMetrics,
} from './link.ts';

/**
 * The audit ID the replica a request landed on gave it (only a replica can send here), kept so this hop's lines and
 * the target cluster's audit events name the same request.
 */
function auditIdOf(headers: IncomingHttpHeaders): string | undefined {
  const id = headers['audit-id'];
  return typeof id === 'string' && id !== '' ? id : undefined;
}

export interface PeerPortOptions {
  host: string;
  port: number;
  /** This replica's name, in the Status of a request for a tunnel it no longer holds. */
  identity: string;
  credentials: PeerCredentials;
  /** The route through a tunnel this replica holds, if it holds `cluster`'s. */
  local(cluster: string): Route | undefined;
  /** Whether `address` (an IP) is one a replica publishes: the only sources the peer port takes connections from. */
  knownSource(address: string): boolean;
  /** This replica's recorded sessions, which the other replicas list and read for their users. */
  recordings?: Recordings;
  metrics: PeerMetrics;
  clock: Clock;
  log: Logger;
}

export interface PeerPort {
  port: number;
  /** Serves the credentials' current certificate to the next handshakes. */
  reloadCredentials(): void;
  stop(): Promise<void>;
}

export async function servePeerPort(opts: PeerPortOptions): Promise<PeerPort> {
  const { credentials, metrics, clock, log, identity } = opts;
  let stopped = false;
  const served = new Set<TunnelServer>();
  const upgrades = createHttpServer((_req, res) => {
    res.writeHead(400).end();
  });
  upgrades.on('clientError', (_err, socket: Duplex) => socket.destroy());
  upgrades.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) =>
    servePeer({ kind: 'upgrade', req, socket, head, context: newRequestContext(auditIdOf(req.headers)) }),
  );
  const notHeld = (cluster: string): string =>
    `cluster ${cluster} is not connected: its agent's tunnel is no longer on replica ${identity}; retry`;
  /**
   * Serves a peer's exchange. A bug in serving one (a throw, a rejection) costs that exchange a 500, never the process:
   * these run from event listeners, where a throw would be uncaught.
   */
  const servePeer = (exchange: Exchange): void => {
    servePeerExchange(exchange).catch((err: unknown) => {
      log.error({ err: (err as Error).message }, "a peer's request failed inside this replica");
      refuse(exchange, { status: 500, message: 'internal error in the peer hop' });
    });
  };
  /**
   * A peer's request, for a tunnel this replica holds: forwarded into it as the user's, as the peer decided it. Its
   * refusals are any signed-in user's to provoke (an upgrade that lands elsewhere while the tunnel moves, or with the
   * user's fair share full), and an upgrade's connection here is the link's CONNECT stream, not a socket.
   */
  const servePeerExchange = async (exchange: Exchange): Promise<void> => {
    const { req } = exchange;
    const target = req.url ? clusterRoute(req.url) : undefined;
    if (!target || (exchange.kind === 'plain' && req.method === 'CONNECT'))
      return refuse(exchange, { status: 404, message: 'not a cluster route' });
    req.url = target.url;
    const route = opts.local(target.cluster);
    if (!route) {
      metrics.hops.inc({ direction: 'in', outcome: 'not-held' });
      return refuse(exchange, {
        status: 503,
        message: notHeld(target.cluster),
        retryAfterSeconds: RETRY_AFTER_SECONDS,
      });
    }
    metrics.hops.inc({ direction: 'in', outcome: 'forwarded' });
    const plan = planFrom(req.rawHeaders, req.headers);
    exchange.context.user = plan.user;
    exchange.context.cluster = target.cluster;
    return route.forward(exchange, plan);
  };
  const servePeerRequest = (req: Request, res: Response): void => {
    if (req.url?.startsWith(RECORDINGS_PATH) && req.method === 'GET') return serveRecordings(req.url, res);
    servePeer({ kind: 'plain', req, res, context: newRequestContext(auditIdOf(req.headers)) });
  };
  /** A peer asks for this replica's recordings, for a user the peer has authorized: the list, or one recording. */
  const serveRecordings = (url: string, res: Response): void => {
    const recordings = opts.recordings;
    if (!recordings) return writeStatus(res, 404, 'this replica records no sessions');
    const id = url.slice(RECORDINGS_PATH.length).replace(/^\//, '');
    if (!id) {
      recordings.list().then(
        (list) => send(res, 200, 'application/json', JSON.stringify(list)),
        (err: unknown) => {
          log.warn({ err: (err as Error).message }, 'the recordings could not be listed');
          writeStatus(res, 500, 'the recordings could not be listed');
        },
      );
      return;
    }
    const content = recordings.read(id);
    if (!content) return writeStatus(res, 404, 'no such recording');
    res.writeHead(200, { 'content-type': 'application/x-asciicast' });
    content.on('error', () => res.destroy());
    // A peer that resets the stream while the file is read: the file closes too.
    res.on('close', () => content.destroy());
    relay(content, res);
  };

  const server = createTlsServer({
    ...credentials.own(),
    ca: credentials.caPem,
    requestCert: true,
    rejectUnauthorized: true,
    minVersion: 'TLSv1.3',
    // Replicas' keys are P-256: no other kind of signature is checked, whoever dials from a replica's address
    // (CLIENT_SIGALGS).
    sigalgs: CLIENT_SIGALGS,
    ALPNProtocols: [ALPN],
    handshakeTimeout: HANDSHAKE_TIMEOUT_MS,
  });
  server.maxConnections = MAX_PEER_CONNECTIONS;
  // Only replicas dial this port, from the addresses they publish: anyone else on the network is closed before a
  // handshake, so nobody can fill the port's connections with handshakes that never finish.
  server.on('connection', (socket: Socket) => {
    const from = socket.remoteAddress?.replace(/^::ffff:/, '') ?? '';
    if (stopped || !opts.knownSource(from)) socket.destroy();
  });
  server.on('tlsClientError', (err) => log.debug({ err: err.message }, 'peer handshake failed'));
  server.on('secureConnection', (socket: TLSSocket) => {
    socket.on('error', () => socket.destroy());
    const peer = replicaOf(socket.getPeerX509Certificate());
    if (!peer || socket.alpnProtocol !== ALPN) {
      log.warn({ remote: socket.remoteAddress }, 'peer connection refused: not a replica certificate');
      return void socket.destroy();
    }
    socket.setNoDelay(true);
    if (stopped) return void socket.destroy();
    metrics.links.inc({ direction: 'in' });
    // TLS checked the peer's certificate once: the link does not outlive it (the peer dials again with its next,
    // which it has a day before: certificates live a week and are issued daily).
    const left = Date.parse(socket.getPeerX509Certificate()?.validTo ?? '') - clock.now();
    const expiry = clock.setTimeout(() => socket.destroy(), Number.isFinite(left) ? Math.max(0, left) : 0);
    const session = serveTunnel(socket, {
      connect: (stream) => void upgrades.emit('connection', stream),
      request: (stream: ServerHttp2Stream, headers, rawHeaders) =>
        serveStream(stream, headers, rawHeaders, servePeerRequest),
    });
    served.add(session);
    void session.closed.then(() => {
      clock.clearTimeout(expiry);
      served.delete(session);
      metrics.links.dec({ direction: 'in' });
    });
  });
  await new Promise<void>((done, fail) => {
    server.once('error', fail);
    server.listen(opts.port, opts.host, () => {
      server.off('error', fail);
      done();
    });
  });
  const port = (server.address() as AddressInfo).port;
  log.info({ host: opts.host, port }, 'peer listener listening');
  return {
    port,
    reloadCredentials() {
      server.setSecureContext({
        ...credentials.own(),
        ca: credentials.caPem,
        minVersion: 'TLSv1.3',
        sigalgs: CLIENT_SIGALGS,
      });
    },
    async stop() {
      stopped = true;
      for (const session of served) session.close();
      upgrades.closeAllConnections();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
}
