// The holder's end of the peer links: the peer port. Each link a replica dials here is an HTTP/2 session whose
// requests go into this replica's tunnels, as the user's, as the replica they landed on decided them. The port takes
// connections only from the addresses replicas publish, and at the handshake only the peer CA's certificates that
// name a replica; a link does not outlive its certificate. A replica's recordings are the port's one local API
// (proxy/local-apis.ts), which the other replicas read for their users.
import { createServer as createHttpServer, type IncomingHttpHeaders, type IncomingMessage } from 'node:http';
import type { ServerHttp2Stream } from 'node:http2';
import type { Socket } from 'node:net';
import { listenOn } from '../../lib/listen.ts';
import type { Duplex } from 'node:stream';
import { createServer as createTlsServer, type TLSSocket } from 'node:tls';
import type { Clock } from '../../lib/clock.ts';
import { FORWARDED_HTTP1_LIMITS } from '../../lib/http2/header-block.ts';
import { serveStream, type Request, type Response } from '../../lib/http2/request.ts';
import type { Logger } from '../../lib/log.ts';
import { serveTunnel, type TunnelServer } from '../../lib/tunnel/tunnel.ts';
import { newRequestContext, refuse, type Exchange } from '../proxy/exchange.ts';
import { localAPIs, type LocalAPI } from '../proxy/local-apis.ts';
import { send, writeStatus } from '../../lib/kube/status.ts';
import type { Recordings } from '../recording/session.ts';
import { parseFilterQuery } from '../recording/listing.ts';
import { relay } from '../../lib/http2/memory-budget.ts';
import { clusterRoute, type Route } from '../proxy/route.ts';
import { CLIENT_SIGALGS } from '../proxy/server.ts';
import {
  ALPN,
  HANDSHAKE_TIMEOUT_MS,
  RECORDINGS_PATH,
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

/** The peer port's own APIs (proxy/local-apis.ts), for a replica the handshake checked: this replica's recordings. */
function peerAPIs(recordings: Recordings | undefined, log: Logger): LocalAPI[] {
  return [
    {
      paths: [RECORDINGS_PATH, `${RECORDINGS_PATH}/*`],
      who: 'replica',
      serve(req, res, path) {
        if (req.method !== 'GET') return writeStatus(res, 404, NOT_A_CLUSTER_ROUTE);
        if (!recordings) return writeStatus(res, 404, 'this replica records no sessions');
        const id = path.slice(RECORDINGS_PATH.length + 1);
        return id ? readRecording(recordings, id, res) : listRecordings(recordings, req.url ?? '', log, res);
      },
    },
  ];
}

/**
 * A peer asks for this replica's recordings, for a user the peer has authorized: the list, filtered and cut as its
 * query says. A peer that sends no query is older than filtered lists, and gets every recording as a plain array.
 */
function listRecordings(recordings: Recordings, url: string, log: Logger, res: Response): void {
  const at = url.indexOf('?');
  const filter = at < 0 ? {} : parseFilterQuery(new URLSearchParams(url.slice(at + 1)));
  if ('problem' in filter) return writeStatus(res, 400, filter.problem);
  recordings.list(filter).then(
    (page) => send(res, 200, 'application/json', JSON.stringify(at < 0 ? page.items : page)),
    (err: unknown) => {
      log.warn({ err: (err as Error).message }, 'the recordings could not be listed');
      writeStatus(res, 500, 'the recordings could not be listed');
    },
  );
}

/** One recording, streamed to the peer. */
function readRecording(recordings: Recordings, id: string, res: Response): void {
  const content = recordings.read(id);
  if (!content) return writeStatus(res, 404, 'no such recording');
  res.writeHead(200, { 'content-type': 'application/x-asciicast' });
  content.on('error', () => res.destroy());
  // A peer that resets the stream while the file is read: the file closes too.
  res.on('close', () => content.destroy());
  relay(content, res);
}

const NOT_A_CLUSTER_ROUTE = 'not a cluster route';

/**
 * What the peer port serves on each link: its own APIs, and a peer's requests and upgrades for a tunnel this replica
 * holds, forwarded into it as the user's, as the peer decided them. Their refusals are any signed-in user's to provoke
 * (an upgrade that lands elsewhere while the tunnel moves, or with the user's fair share full), and an upgrade's
 * connection here is the link's CONNECT stream, not a socket. A bug in serving one (a throw, a rejection) costs that
 * exchange a 500, never the process: these run from event listeners, where a throw would be uncaught.
 */
function peerExchanges(opts: PeerPortOptions): {
  request: (req: Request, res: Response) => void;
  upgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
} {
  const { metrics, log, identity } = opts;
  const apis = localAPIs(peerAPIs(opts.recordings, log));
  const forward = async (exchange: Exchange): Promise<void> => {
    const { req } = exchange;
    const target = req.url ? clusterRoute(req.url) : undefined;
    if (!target) return refuse(exchange, { status: 404, message: NOT_A_CLUSTER_ROUTE });
    req.url = target.url;
    const route = opts.local(target.cluster);
    if (!route) {
      metrics.hops.inc({ direction: 'in', outcome: 'not-held' });
      return refuse(exchange, {
        status: 503,
        message: `cluster ${target.cluster} is not connected: its agent's tunnel is no longer on replica ${identity}; retry`,
        retryAfterSeconds: RETRY_AFTER_SECONDS,
      });
    }
    metrics.hops.inc({ direction: 'in', outcome: 'forwarded' });
    const plan = planFrom(req.rawHeaders, req.headers);
    exchange.context.user = plan.user;
    exchange.context.cluster = target.cluster;
    return route.forward(exchange, plan);
  };
  const serve = (exchange: Exchange): void => {
    forward(exchange).catch((err: unknown) => {
      log.error({ err: (err as Error).message }, "a peer's request failed inside this replica");
      refuse(exchange, { status: 500, message: 'internal error in the peer hop' });
    });
  };
  return {
    request(req, res) {
      const url = req.url ?? '/';
      const q = url.indexOf('?');
      const path = q === -1 ? url : url.slice(0, q);
      const api = apis.find(path, req.method ?? 'GET');
      if (api) return void api.serve(req, res, path, undefined);
      // A CONNECT is an upgrade's stream (the link's connect handler), never a request to forward.
      if (req.method === 'CONNECT') return writeStatus(res, 404, NOT_A_CLUSTER_ROUTE);
      serve({ kind: 'plain', req, res, context: newRequestContext(auditIdOf(req.headers)) });
    },
    upgrade(req, socket, head) {
      serve({ kind: 'upgrade', req, socket, head, context: newRequestContext(auditIdOf(req.headers)) });
    },
  };
}

export async function servePeerPort(opts: PeerPortOptions): Promise<PeerPort> {
  const { credentials, log } = opts;
  const state = { stopped: false, served: new Set<TunnelServer>() };
  const exchanges = peerExchanges(opts);
  const upgrades = createHttpServer({ maxHeaderSize: FORWARDED_HTTP1_LIMITS.maxHeaderSize }, (_req, res) => {
    res.writeHead(400).end();
  });
  upgrades.maxHeadersCount = FORWARDED_HTTP1_LIMITS.maxHeadersCount;
  upgrades.on('clientError', (_err, socket: Duplex) => socket.destroy());
  upgrades.on('upgrade', exchanges.upgrade);

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
    if (state.stopped || !opts.knownSource(from)) socket.destroy();
  });
  server.on('tlsClientError', (err) => log.debug({ err: err.message }, 'peer handshake failed'));
  server.on('secureConnection', (socket: TLSSocket) =>
    serveLink(opts, state, socket, (stream) => void upgrades.emit('connection', stream), exchanges.request),
  );
  const port = await listenOn(server, opts.port, opts.host);
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
      state.stopped = true;
      for (const session of state.served) session.close();
      upgrades.closeAllConnections();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
}

/** One replica's link, once TLS checked its certificate: an HTTP/2 session, closed when the certificate expires. */
function serveLink(
  opts: PeerPortOptions,
  state: { stopped: boolean; served: Set<TunnelServer> },
  socket: TLSSocket,
  connect: (stream: Duplex) => void,
  request: (req: Request, res: Response) => void,
): void {
  const { metrics, clock, log } = opts;
  socket.on('error', () => socket.destroy());
  const peer = replicaOf(socket.getPeerX509Certificate());
  if (!peer || socket.alpnProtocol !== ALPN) {
    log.warn({ remote: socket.remoteAddress }, 'peer connection refused: not a replica certificate');
    return void socket.destroy();
  }
  socket.setNoDelay(true);
  if (state.stopped) return void socket.destroy();
  metrics.links.inc({ direction: 'in' });
  // TLS checked the peer's certificate once: the link does not outlive it (the peer dials again with its next,
  // which it has a day before: certificates live a week and are issued daily).
  const left = Date.parse(socket.getPeerX509Certificate()?.validTo ?? '') - clock.now();
  const expiry = clock.setTimeout(() => socket.destroy(), Number.isFinite(left) ? Math.max(0, left) : 0);
  const session = serveTunnel(socket, {
    connect,
    request: (stream: ServerHttp2Stream, headers, rawHeaders) =>
      serveStream(stream, headers, rawHeaders, request),
  });
  state.served.add(session);
  void session.closed.then(() => {
    clock.clearTimeout(expiry);
    state.served.delete(session);
    metrics.links.dec({ direction: 'in' });
  });
}
