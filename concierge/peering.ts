// Proxy peering: any replica serves any cluster. An agent's tunnel lands on one replica (or a few); a request for
// that cluster that reaches another replica is authenticated and its impersonation decided where it landed, then
// sent over a peer link to a replica that holds the tunnel, which forwards it into the tunnel as its own (its fair
// queue, its limits). The holder never sends a peer's request on to a third replica: a stale route ends in a Status.
//
// A peer link is one mutual-TLS connection per pair of replicas, dialed on demand and reused, carrying every request
// between them on one HTTP/2 session: lib/tunnel/tunnel.ts's multiplexer, the same one agents' tunnels run on (plain
// requests as HTTP/2 requests, upgrades as HTTP/1.1 on CONNECT streams, per-stream flow control, pings from the
// listening end). Its certificates come from a peer CA of its own, kept in a Secret: the peer port refuses, at the
// handshake, any certificate the peer CA did not issue (users' and agents' among them), and then any that does not
// name a replica. Where a replica is reached is a fact it publishes on its Lease (cluster-status.ts), next to the
// tunnels it holds.
import {
  createServer as createHttpServer,
  request,
  type IncomingMessage,
  type OutgoingHttpHeaders,
} from 'node:http';
import type { IncomingHttpHeaders, ServerHttp2Stream } from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import {
  connect as tlsConnect,
  createServer as createTlsServer,
  type PeerCertificate,
  type TLSSocket,
} from 'node:tls';
import { Counter, Gauge, type Registry } from 'prom-client';
import { ensureSecretCA } from '../lib/pki/ca-secret.ts';
import { CallFailed } from '../lib/http2/forward.ts';
import { endToEnd, hopByHop } from '../lib/http2/hop-by-hop.ts';
import { fieldsOf, serveStream, type Request, type Response } from '../lib/http2/request.ts';
import type { KubeClients } from '../lib/kube/kube.ts';
import { systemClock, type Clock } from '../lib/clock.ts';
import type { Logger } from '../lib/log.ts';
import type { MemoryBudget } from '../lib/http2/memory-budget.ts';
import { certificateURIs, issueCert } from '../lib/pki/pki.ts';
import { newTunnelClient, serveTunnel, type TunnelClient, type TunnelServer } from '../lib/tunnel/tunnel.ts';
import { newRequestContext, refuse, type Exchange, type Refusal } from './proxy/exchange.ts';
import { clusterRoute, OWN_CALL_MAX_BYTES, OWN_CALL_TIMEOUT_MS, type Route } from './proxy/route.ts';
import {
  callOver,
  SHORT_REQUEST_TIMEOUT_MS,
  transport,
  type ForwardPlan,
  type Hop,
} from './proxy/transport.ts';
import type { RemoteHolder } from './tunnel/cluster-status.ts';
import { PEER_CA_SECRET, PEER_URI_PREFIX } from '../apis/install.ts';

/**
 * Streams one peer link carries at once. Every request between two replicas shares their link, so this is what the
 * busier of them may send the other: 10,000 watches and more (Teleport's peer links stop at 1,000 per connection).
 */
export const PEER_MAX_STREAMS = 65_536;
/**
 * Streams one user may hold on one peer link, requests and upgrades alike. The holder bounds what a user holds of
 * each cluster's tunnel (a quarter of it, 250 streams by default), but one link carries every cluster the other
 * replica holds: without a bound of its own, one user with requests for many clusters could fill it for everyone.
 */
export const PEER_USER_STREAMS = 1000;
/** How long a dial (TCP and TLS) to a peer may take before the next holder is tried. */
const DIAL_TIMEOUT_MS = 5_000;
/** How long a failed dial is remembered: the next dial to that peer waits this long. */
const DIAL_RETRY_MS = 1_000;
/** A replica's handshake takes milliseconds; a connection that has not finished one by then is closed. */
const HANDSHAKE_TIMEOUT_MS = 3_000;
/** Peer links open at once towards this replica: one per other replica, with room for restarts. */
const MAX_PEER_CONNECTIONS = 1024;
/**
 * Peer certificates live a week and are issued again every day (a replica's own, in memory), by the controller
 * controllers/peer-certificate.ts, which calls reissue().
 */
const PEER_CERT_VALIDITY_MS = 7 * 24 * 3600 * 1000;
export const PEER_CERT_RENEW_MS = 24 * 3600 * 1000;
const ALPN = 'sealion-peer/1';

/**
 * What the passing refusals of a peer hop ask clients to wait before trying again (client-go does, up to ten times):
 * a route that just went stale, or a holder that just died, is mended within seconds.
 */
const RETRY_AFTER_SECONDS = 1;
/** The request's authenticated user and kind, as the replica it landed on decided them. */
const USER_HEADER = 'x-sealion-peer-user';
const LONG_RUNNING_HEADER = 'x-sealion-peer-long-running';
/**
 * Never sent to a peer nor taken from one as a request's own, beside what belongs to one hop (lib/http2/hop-by-hop.ts):
 * credentials, and the peer hop's own fields.
 */
const peerOnly = (name: string): boolean => name === 'authorization' || name.startsWith('x-sealion-peer-');

export interface PeeringOptions {
  clients: KubeClients;
  namespace: string;
  identity: string;
  /** Where the peer listener listens. */
  host: string;
  port: number;
  /** The host (an address, or a name in the certificate) other replicas dial; the listener's port is added. */
  advertise: string;
  /** The route through a tunnel this replica holds, if it holds `cluster`'s. */
  local(cluster: string): Route | undefined;
  /** The other replicas holding `cluster`'s tunnel, in the order to try them. */
  holders(cluster: string): RemoteHolder[];
  /** Whether `address` (an IP) is one a replica publishes: the only sources the peer port takes connections from. */
  knownSource(address: string): boolean;
  registry: Registry;
  log: Logger;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). */
  budget?: MemoryBudget;
  /** Times the dials, the links' certificate expiry and the memory of failed dials. Default: systemClock. */
  clock?: Clock;
}

export interface Peering {
  /** host:port other replicas reach this one at, for its Lease. */
  address: string;
  /** The route through a peer that holds `cluster`'s tunnel, or undefined when no live replica does. */
  route(cluster: string): Route | undefined;
  /** When this replica's peer certificate was issued (ms since the epoch). */
  issuedAt(): number;
  /** Issues this replica a new peer certificate, served and dialed with from now on. */
  reissue(): Promise<void>;
  stop(): Promise<void>;
}

interface PeerMetrics {
  hops: Counter<'direction' | 'outcome'>;
  dials: Counter<'outcome'>;
  links: Gauge<'direction'>;
  streams: Gauge;
}

function peerMetrics(registry: Registry, outgoing: () => Iterable<TunnelClient>): PeerMetrics {
  return {
    hops: new Counter({
      name: 'sealion_peer_requests_total',
      help: 'Requests sent to (out) or taken from (in) a peer replica, by outcome: forwarded, or the reason they were not.',
      labelNames: ['direction', 'outcome'],
      registers: [registry],
    }),
    dials: new Counter({
      name: 'sealion_peer_dials_total',
      help: 'Peer links dialed, by outcome (ok, failed).',
      labelNames: ['outcome'],
      registers: [registry],
    }),
    links: new Gauge({
      name: 'sealion_peer_links',
      help: 'Peer links open, by direction (out: dialed by this replica; in: dialed by a peer).',
      labelNames: ['direction'],
      registers: [registry],
    }),
    streams: new Gauge({
      name: 'sealion_peer_link_streams',
      help: 'Streams open on the peer links this replica dialed.',
      registers: [registry],
      collect() {
        let open = 0;
        for (const link of outgoing()) open += link.active();
        this.set(open);
      },
    }),
  };
}

/** The plan's headers for the peer, with the facts the holder needs to forward the request as the user's. */
function peerHeaders(plan: ForwardPlan): OutgoingHttpHeaders {
  const headers = endToEnd(plan.headers, peerOnly);
  headers[USER_HEADER] = encodeURIComponent(plan.user);
  headers[LONG_RUNNING_HEADER] = plan.longRunning ? '1' : '0';
  return headers;
}

/** The plan a peer's request carries. Only a replica can have sent it (the peer port's TLS saw to that). */
function planFrom(rawHeaders: string[], headers: IncomingHttpHeaders): ForwardPlan {
  let user = '';
  try {
    user = decodeURIComponent(String(headers[USER_HEADER] ?? ''));
  } catch {
    // A malformed name counts as nobody's: it shares one fair-queue key with every other such request.
  }
  return {
    headers: fieldsOf(rawHeaders, hopByHop(headers, peerOnly)),
    longRunning: headers[LONG_RUNNING_HEADER] === '1',
    passthrough: false,
    user,
  };
}

/** The replica a verified peer certificate names, or undefined. */
function replicaOf(cert: { raw: Buffer } | undefined): string | undefined {
  if (!cert?.raw?.length) return undefined;
  const uris = certificateURIs(cert.raw).filter((u) => u.startsWith(PEER_URI_PREFIX));
  if (uris.length !== 1) return undefined;
  try {
    return decodeURIComponent(uris[0]!.slice(PEER_URI_PREFIX.length)) || undefined;
  } catch {
    return undefined;
  }
}

function splitAddress(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(':');
  return { host: address.slice(0, i).replace(/^\[|\]$/g, ''), port: Number(address.slice(i + 1)) };
}

export async function startPeering(opts: PeeringOptions): Promise<Peering> {
  const { log, identity } = opts;
  const clock = opts.clock ?? systemClock;
  const ca = await ensureSecretCA(opts.clients, opts.namespace, PEER_CA_SECRET, 'sealion peer CA');
  const issue = async (): Promise<{ cert: string; key: string }> => {
    const issued = await issueCert(ca, {
      commonName: 'sealion-peer',
      hosts: [opts.advertise],
      uris: [`${PEER_URI_PREFIX}${encodeURIComponent(identity)}`],
      usage: 'server+client',
      validityMs: PEER_CERT_VALIDITY_MS,
    });
    return { cert: issued.certPem, key: issued.keyPem };
  };
  let issuedAt = clock.now();
  let own = await issue();
  let stopped = false;
  const links = new Map<string, Promise<TunnelClient>>();
  const open = new Set<TunnelClient>();
  const metrics = peerMetrics(opts.registry, () => open);
  /** Streams each user holds on each outgoing link (PEER_USER_STREAMS). */
  const held = new WeakMap<TunnelClient, Map<string, number>>();
  /** Takes a place on `link` for `user`; returns its release, or undefined when the user holds all they may. */
  const takePlace = (link: TunnelClient, user: string): (() => void) | undefined => {
    let users = held.get(link);
    if (!users) held.set(link, (users = new Map<string, number>()));
    const count = users.get(user) ?? 0;
    if (count >= PEER_USER_STREAMS) return undefined;
    users.set(user, count + 1);
    let released = false;
    return () => {
      if (released) return;
      released = true;
      const left = users.get(user)! - 1;
      if (left === 0) users.delete(user);
      else users.set(user, left);
    };
  };
  const overShare = (cluster: string, holder: RemoteHolder): string =>
    `cluster ${cluster}: you already have as many requests in flight through replica ${holder.replica} as one user may (${PEER_USER_STREAMS}); retry later`;

  // The holder's side: each peer connection is an HTTP/2 session whose requests go into this replica's tunnels.
  const served = new Set<TunnelServer>();
  const upgrades = createHttpServer((_req, res) => {
    res.writeHead(400).end();
  });
  upgrades.on('clientError', (_err, socket: Duplex) => socket.destroy());
  upgrades.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) =>
    servePeerExchange({ kind: 'upgrade', req, socket: socket as Socket, head, context: newRequestContext() }),
  );
  const notHeld = (cluster: string): string =>
    `cluster ${cluster} is not connected: its agent's tunnel is no longer on replica ${identity}; retry`;
  /** A peer's request, for a tunnel this replica holds: forwarded into it as the user's, as the peer decided it. */
  const servePeerExchange = (exchange: Exchange): void => {
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
    void route.forward(exchange, plan);
  };
  const servePeerRequest = (req: Request, res: Response): void =>
    servePeerExchange({ kind: 'plain', req, res, context: newRequestContext() });

  const server = createTlsServer({
    ...own,
    ca: ca.certPem,
    requestCert: true,
    rejectUnauthorized: true,
    minVersion: 'TLSv1.3',
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
  const address = `${opts.advertise.includes(':') ? `[${opts.advertise}]` : opts.advertise}:${port}`;
  log.info({ host: opts.host, port, address }, 'peer listener listening');

  /** A TLS connection to the replica `replica` at `address`, which must show that replica's peer certificate. */
  const dial = (holder: RemoteHolder): Promise<TunnelClient> =>
    new Promise((done, fail) => {
      const { host, port: peerPort } = splitAddress(holder.address);
      const socket = tlsConnect({
        host,
        port: peerPort,
        ...own,
        ca: ca.certPem,
        minVersion: 'TLSv1.3',
        ALPNProtocols: [ALPN],
        // The peer CA issues nothing but replicas' certificates; the one that answers must be the replica we want.
        checkServerIdentity: (_host: string, cert: PeerCertificate) =>
          replicaOf(cert) === holder.replica
            ? undefined
            : new Error(`the peer at ${holder.address} is not replica ${holder.replica}`),
      });
      // The socket keeps the process alive while it dials; the timer need not.
      const timer = clock.setTimeout(
        () => socket.destroy(new Error(`no answer from ${holder.address} in ${DIAL_TIMEOUT_MS / 1000} s`)),
        DIAL_TIMEOUT_MS,
      );
      socket.once('error', (err: Error) => {
        clock.clearTimeout(timer);
        fail(err);
      });
      socket.once('secureConnect', () => {
        clock.clearTimeout(timer);
        socket.setNoDelay(true);
        socket.on('error', () => socket.destroy());
        done(newTunnelClient(socket, { maxStreams: PEER_MAX_STREAMS }));
      });
    });

  /** The link to `holder`, dialed now if there is none; one dial at a time per peer, shared by all who wait. */
  const linkTo = (holder: RemoteHolder): Promise<TunnelClient> => {
    if (stopped) return Promise.reject(new Error('this replica is stopping'));
    const key = `${holder.replica}\0${holder.address}`;
    let link = links.get(key);
    if (!link) {
      link = dial(holder);
      links.set(key, link);
      const current = link;
      current.then(
        (client) => {
          metrics.dials.inc({ outcome: 'ok' });
          metrics.links.inc({ direction: 'out' });
          open.add(client);
          log.info({ peer: holder.replica, address: holder.address }, 'peer link up');
          void client.closed.then(() => {
            open.delete(client);
            metrics.links.dec({ direction: 'out' });
            if (links.get(key) === current) links.delete(key);
            log.info({ peer: holder.replica }, 'peer link down');
          });
        },
        (err: unknown) => {
          metrics.dials.inc({ outcome: 'failed' });
          // Requests in the next moment fail (or try the next holder) at once rather than dial again each: a
          // replica that just died would otherwise take a dial per request until its Lease lapses.
          clock.setTimeout(() => {
            if (links.get(key) === current) links.delete(key);
          }, DIAL_RETRY_MS);
          log.warn(
            { peer: holder.replica, address: holder.address, err: (err as Error).message },
            'peer dial failed',
          );
        },
      );
    }
    return link;
  };

  /** A link to the first holder that answers, or the Status to send when none does. */
  const firstLink = async (
    cluster: string,
    holders: RemoteHolder[],
  ): Promise<{ link: TunnelClient; holder: RemoteHolder } | { status: number; message: string }> => {
    for (const holder of holders) {
      try {
        return { link: await linkTo(holder), holder };
      } catch {
        // The next holder, if there is one; the dial's failure is logged once, by linkTo.
      }
    }
    metrics.hops.inc({ direction: 'out', outcome: 'unreachable' });
    return {
      status: 503,
      message: `cluster ${cluster}: the replica holding its tunnel (${holders.map((h) => h.replica).join(', ')}) cannot be reached; retry`,
    };
  };

  /** The hop over the link to `holder`, for requests to `cluster`. */
  const peerHop = (cluster: string, link: TunnelClient, holder: RemoteHolder): Hop => ({
    headers: peerHeaders,
    pathPrefix: `/clusters/${cluster}`,
    open: (headers, endStream) => link.request(headers, endStream),
    send: (method, path, headers) => request({ host: 'peer', method, path, headers, agent: link.agent }),
    statusPrefix: `cluster ${cluster}: `,
    failure: (err) => ({
      status: 502,
      message: `cluster ${cluster}: the link to replica ${holder.replica}, which holds its tunnel, failed: ${err.code ?? err.message}`,
    }),
    // The holder bounds a short request's time and cuts stalled ones; this hop only must not outlive it.
    shortTimeoutMs: SHORT_REQUEST_TIMEOUT_MS + 5_000,
    clock,
    ...(opts.budget ? { budget: opts.budget } : {}),
  });

  /** A place for `user` on a link to one of `holders`, or the Status to answer with. */
  const placeOnLink = async (
    cluster: string,
    holders: RemoteHolder[],
    user: string,
  ): Promise<{ link: TunnelClient; holder: RemoteHolder; release: () => void } | Refusal> => {
    if (stopped)
      return {
        status: 503,
        message: `cluster ${cluster}: this replica is stopping; retry`,
        retryAfterSeconds: RETRY_AFTER_SECONDS,
      };
    const found = await firstLink(cluster, holders);
    if ('status' in found) return { ...found, retryAfterSeconds: RETRY_AFTER_SECONDS };
    const release = takePlace(found.link, user);
    if (!release) {
      metrics.hops.inc({ direction: 'out', outcome: 'user-limit' });
      return {
        status: 429,
        message: overShare(cluster, found.holder),
        retryAfterSeconds: RETRY_AFTER_SECONDS,
      };
    }
    metrics.hops.inc({ direction: 'out', outcome: 'forwarded' });
    return { ...found, release };
  };

  const peerRoute = (cluster: string, holders: RemoteHolder[]): Route => ({
    kind: 'peer',
    async forward(exchange, plan) {
      // A CONNECT stream between replicas carries HTTP/1.1 of the sender's own making only.
      if (exchange.kind === 'plain' && exchange.req.method === 'CONNECT')
        return refuse(exchange, { status: 405, message: 'CONNECT is not served' });
      const placed = await placeOnLink(cluster, holders, plan.user);
      if ('status' in placed) return refuse(exchange, placed);
      await transport(exchange, peerHop(cluster, placed.link, placed.holder), plan, placed.release);
    },
    async call(own) {
      const placed = await placeOnLink(cluster, holders, own.user);
      if ('status' in placed) throw new CallFailed(placed.message, placed.status === 429 ? 429 : undefined);
      // The holder takes it as any request of this user's: into its tunnel, as the agent, with no impersonation.
      // Its own bound comes first; this hop only must not outlive it.
      return callOver(peerHop(cluster, placed.link, placed.holder), own, {
        timeoutMs: OWN_CALL_TIMEOUT_MS + 5_000,
        maxBytes: OWN_CALL_MAX_BYTES,
      }).finally(placed.release);
    },
  });

  return {
    address,
    route(cluster) {
      if (stopped) return undefined;
      const holders = opts.holders(cluster);
      return holders.length > 0 ? peerRoute(cluster, holders) : undefined;
    },
    issuedAt: () => issuedAt,
    async reissue() {
      const at = clock.now();
      own = await issue();
      issuedAt = at;
      server.setSecureContext({ ...own, ca: ca.certPem, minVersion: 'TLSv1.3' });
    },
    async stop() {
      stopped = true;
      for (const link of links.values())
        void link.then(
          (l) => l.close(),
          () => {},
        );
      links.clear();
      for (const session of served) session.close();
      upgrades.closeAllConnections();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
}
