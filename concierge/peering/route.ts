// The dialing end of the peer links: a request for a cluster whose tunnel another replica holds goes over a link to
// that replica, dialed on first use and reused (one dial at a time per peer, a failed dial remembered for a moment),
// with a place for its user on the link (PEER_USER_STREAMS) and the holder's fair queue behind it.
import { request } from 'node:http';
import { constants } from 'node:http2';
import type { Readable } from 'node:stream';
import { connect as tlsConnect, type PeerCertificate } from 'node:tls';
import type { Clock } from '../../lib/clock.ts';
import { callOverHttp2, CallFailed, type CallAnswer } from '../../lib/http2/forward.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import type { Logger } from '../../lib/log.ts';
import { newTunnelClient, type TunnelClient } from '../../lib/tunnel/tunnel.ts';
import { asPlain, refuse, type Refusal } from '../proxy/exchange.ts';
import { OWN_CALL_MAX_BYTES, OWN_CALL_TIMEOUT_MS, type Route } from '../proxy/route.ts';
import { callOver, SHORT_REQUEST_TIMEOUT_MS, transport, type Hop } from '../proxy/transport.ts';
import type { RemoteHolder } from '../tunnel/cluster-status.ts';
import {
  ALPN,
  DIAL_RETRY_MS,
  DIAL_TIMEOUT_MS,
  PEER_MAX_STREAMS,
  PEER_USER_STREAMS,
  peerHeaders,
  replicaOf,
  RETRY_AFTER_SECONDS,
  splitAddress,
  type PeerCredentials,
  type PeerMetrics,
} from './link.ts';

export interface PeerRoutesOptions {
  credentials: PeerCredentials;
  metrics: PeerMetrics;
  clock: Clock;
  log: Logger;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). */
  budget?: MemoryBudget;
}

export interface PeerRoutes {
  /** The route to `cluster` through the first of `holders` that answers. */
  route(cluster: string, holders: RemoteHolder[]): Route;
  /** The links this replica dialed that are open. */
  links(): Iterable<TunnelClient>;
  /**
   * A GET of the replica's own (not a cluster's: its recordings) over the link to `holder`: the answer's status and
   * body, streamed. Rejects when the replica cannot be reached.
   */
  get(holder: RemoteHolder, path: string): Promise<{ status: number; body: Readable }>;
  /** The same for a small answer, read whole within `limits`. */
  call(
    holder: RemoteHolder,
    path: string,
    limits: { timeoutMs: number; maxBytes: number },
  ): Promise<CallAnswer>;
  stop(): void;
}

/** Streams each user holds on each outgoing link (PEER_USER_STREAMS). */
type LinkPlaces = WeakMap<TunnelClient, Map<string, number>>;

/** Takes a place on `link` for `user`; returns its release, or undefined when the user holds all they may. */
function takePlace(places: LinkPlaces, link: TunnelClient, user: string): (() => void) | undefined {
  let users = places.get(link);
  if (!users) places.set(link, (users = new Map<string, number>()));
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
}

const overShare = (cluster: string, holder: RemoteHolder): string =>
  `cluster ${cluster}: you already have as many requests in flight through replica ${holder.replica} as one user may (${PEER_USER_STREAMS}); retry later`;

/** A TLS connection to the replica `holder` names at its address, which must show that replica's peer certificate. */
function dialPeer(holder: RemoteHolder, credentials: PeerCredentials, clock: Clock): Promise<TunnelClient> {
  return new Promise((done, fail) => {
    const { host, port: peerPort } = splitAddress(holder.address);
    const socket = tlsConnect({
      host,
      port: peerPort,
      ...credentials.own(),
      ca: credentials.caPem,
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
}

/** The links this replica dials: one per peer, dialed on first use and reused, a failed dial remembered a moment. */
class PeerLinks {
  /** The link (or its dial) to each peer, by replica and address. */
  private readonly links = new Map<string, Promise<TunnelClient>>();
  /** The links that are up. */
  readonly open = new Set<TunnelClient>();
  private stopped = false;
  private readonly opts: PeerRoutesOptions;

  constructor(opts: PeerRoutesOptions) {
    this.opts = opts;
  }

  get stopping(): boolean {
    return this.stopped;
  }

  /** The link to `holder`, dialed now if there is none; one dial at a time per peer, shared by all who wait. */
  linkTo(holder: RemoteHolder): Promise<TunnelClient> {
    if (this.stopped) return Promise.reject(new Error('this replica is stopping'));
    const key = `${holder.replica}\0${holder.address}`;
    let link = this.links.get(key);
    if (!link) {
      link = dialPeer(holder, this.opts.credentials, this.opts.clock);
      this.links.set(key, link);
      const current = link;
      current.then(
        (client) => this.up(key, current, holder, client),
        (err: unknown) => this.failed(key, current, holder, err as Error),
      );
    }
    return link;
  }

  private up(key: string, current: Promise<TunnelClient>, holder: RemoteHolder, client: TunnelClient): void {
    const { metrics, log } = this.opts;
    metrics.dials.inc({ outcome: 'ok' });
    metrics.links.inc({ direction: 'out' });
    this.open.add(client);
    log.info({ peer: holder.replica, address: holder.address }, 'peer link up');
    void client.closed.then(() => {
      this.open.delete(client);
      metrics.links.dec({ direction: 'out' });
      if (this.links.get(key) === current) this.links.delete(key);
      log.info({ peer: holder.replica }, 'peer link down');
    });
  }

  private failed(key: string, current: Promise<TunnelClient>, holder: RemoteHolder, err: Error): void {
    this.opts.metrics.dials.inc({ outcome: 'failed' });
    // Requests in the next moment fail (or try the next holder) at once rather than dial again each: a replica that
    // just died would otherwise take a dial per request until its Lease lapses.
    this.opts.clock.setTimeout(() => {
      if (this.links.get(key) === current) this.links.delete(key);
    }, DIAL_RETRY_MS);
    this.opts.log.warn(
      { peer: holder.replica, address: holder.address, err: err.message },
      'peer dial failed',
    );
  }

  /** A link to the first holder that answers, or the Status to send when none does. */
  async firstLink(
    cluster: string,
    holders: RemoteHolder[],
  ): Promise<{ link: TunnelClient; holder: RemoteHolder } | { status: number; message: string }> {
    for (const holder of holders) {
      try {
        return { link: await this.linkTo(holder), holder };
      } catch {
        // The next holder, if there is one; the dial's failure is logged once, by linkTo.
      }
    }
    this.opts.metrics.hops.inc({ direction: 'out', outcome: 'unreachable' });
    return {
      status: 503,
      message: `cluster ${cluster}: the replica holding its tunnel (${holders.map((h) => h.replica).join(', ')}) cannot be reached; retry`,
    };
  }

  stop(): void {
    this.stopped = true;
    for (const link of this.links.values())
      void link.then(
        (l) => l.close(),
        () => {},
      );
    this.links.clear();
  }
}

/** The hop over the link to `holder`, for requests to `cluster`. */
function peerHop(opts: PeerRoutesOptions, cluster: string, link: TunnelClient, holder: RemoteHolder): Hop {
  return {
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
    clock: opts.clock,
    ...(opts.budget ? { budget: opts.budget } : {}),
  };
}

/** A place for `user` on a link to one of `holders`, or the Status to answer with. */
async function placeOnLink(
  links: PeerLinks,
  places: LinkPlaces,
  metrics: PeerMetrics,
  cluster: string,
  holders: RemoteHolder[],
  user: string,
): Promise<{ link: TunnelClient; holder: RemoteHolder; release: () => void } | Refusal> {
  if (links.stopping)
    return {
      status: 503,
      message: `cluster ${cluster}: this replica is stopping; retry`,
      retryAfterSeconds: RETRY_AFTER_SECONDS,
    };
  const found = await links.firstLink(cluster, holders);
  if ('status' in found) return { ...found, retryAfterSeconds: RETRY_AFTER_SECONDS };
  const release = takePlace(places, found.link, user);
  if (!release) {
    metrics.hops.inc({ direction: 'out', outcome: 'user-limit' });
    return { status: 429, message: overShare(cluster, found.holder), retryAfterSeconds: RETRY_AFTER_SECONDS };
  }
  metrics.hops.inc({ direction: 'out', outcome: 'forwarded' });
  return { ...found, release };
}

/** The route to `cluster` through the first of `holders` that answers. */
function peerRoute(
  opts: PeerRoutesOptions,
  links: PeerLinks,
  places: LinkPlaces,
  cluster: string,
  holders: RemoteHolder[],
): Route {
  const place = (user: string): ReturnType<typeof placeOnLink> =>
    placeOnLink(links, places, opts.metrics, cluster, holders, user);
  return {
    kind: 'peer',
    async forward(exchange, plan) {
      // A CONNECT stream between replicas carries HTTP/1.1 of the sender's own making only.
      if (asPlain(exchange)?.req.method === 'CONNECT')
        return refuse(exchange, { status: 405, message: 'CONNECT is not served' });
      const placed = await place(plan.user);
      if ('status' in placed) return refuse(exchange, placed);
      return transport(exchange, peerHop(opts, cluster, placed.link, placed.holder), plan, placed.release);
    },
    async call(own) {
      const placed = await place(own.user);
      if ('status' in placed) throw new CallFailed(placed.message, placed.status === 429 ? 429 : undefined);
      // The holder takes it as any request of this user's: into its tunnel, as the agent, with no impersonation.
      // Its own bound comes first; this hop only must not outlive it.
      return callOver(peerHop(opts, cluster, placed.link, placed.holder), own, {
        timeoutMs: OWN_CALL_TIMEOUT_MS + 5_000,
        maxBytes: OWN_CALL_MAX_BYTES,
      }).finally(placed.release);
    },
  };
}

/** A GET of `path` over `link`: the answer's status and its body, streamed; rejects when there is no answer. */
function getOver(
  link: TunnelClient,
  holder: RemoteHolder,
  path: string,
  clock: Clock,
): Promise<{ status: number; body: Readable }> {
  const stream = link.request({ ':method': 'GET', ':path': path }, true);
  return new Promise((done, fail) => {
    const timer = clock.setTimeout(() => stream.close(constants.NGHTTP2_CANCEL), OWN_CALL_TIMEOUT_MS);
    stream.once('response', (headers) => {
      clock.clearTimeout(timer);
      done({ status: Number(headers[':status']), body: stream });
    });
    stream.once('error', fail);
    stream.once('close', () => {
      clock.clearTimeout(timer);
      fail(new Error(`replica ${holder.replica} did not answer`));
    });
  });
}

export function newPeerRoutes(opts: PeerRoutesOptions): PeerRoutes {
  const links = new PeerLinks(opts);
  const places: LinkPlaces = new WeakMap();
  return {
    route: (cluster, holders) => peerRoute(opts, links, places, cluster, holders),
    links: () => links.open,
    async call(holder, path, limits) {
      const link = await links.linkTo(holder);
      return callOverHttp2(
        (h, endStream) => link.request(h, endStream),
        { ':method': 'GET', ':path': path },
        undefined,
        limits,
      );
    },
    async get(holder, path) {
      return getOver(await links.linkTo(holder), holder, path, opts.clock);
    },
    stop: () => links.stop(),
  };
}
