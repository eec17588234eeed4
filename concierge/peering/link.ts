// What both ends of a peer link share: its limits, its protocol name, the fields a request carries across it, the
// replica a peer certificate names, and the metrics of both directions.
import type { OutgoingHttpHeaders } from 'node:http';
import type { IncomingHttpHeaders } from 'node:http2';
import { Counter, Gauge, type Registry } from 'prom-client';
import { PEER_URI_PREFIX } from '../../apis/install.ts';
import { endToEnd, hopByHop } from '../../lib/http2/hop-by-hop.ts';
import { fieldsOf } from '../../lib/http2/request.ts';
import { certificateURIs } from '../../lib/pki/pki.ts';
import type { TunnelClient } from '../../lib/tunnel/tunnel.ts';
import type { ForwardPlan } from '../proxy/transport.ts';

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
export const DIAL_TIMEOUT_MS = 5_000;
/** How long a failed dial is remembered: the next dial to that peer waits this long. */
export const DIAL_RETRY_MS = 1_000;
/** A replica's handshake takes milliseconds; a connection that has not finished one by then is closed. */
export const HANDSHAKE_TIMEOUT_MS = 3_000;
/** Peer links open at once towards this replica: one per other replica, with room for restarts. */
export const MAX_PEER_CONNECTIONS = 1024;
export const ALPN = 'sealion-peer/1';
/** Where a replica serves its recorded sessions to the other replicas (never a cluster route: those start /clusters/). */
export const RECORDINGS_PATH = '/recordings';

/**
 * What the passing refusals of a peer hop ask clients to wait before trying again (client-go does, up to ten times):
 * a route that just went stale, or a holder that just died, is mended within seconds.
 */
export const RETRY_AFTER_SECONDS = 1;
/** The request's authenticated user and kind, as the replica it landed on decided them. */
const USER_HEADER = 'x-sealion-peer-user';
const LONG_RUNNING_HEADER = 'x-sealion-peer-long-running';
/**
 * Never sent to a peer nor taken from one as a request's own, beside what belongs to one hop (lib/http2/hop-by-hop.ts):
 * credentials, and the peer hop's own fields.
 */
const peerOnly = (name: string): boolean => name === 'authorization' || name.startsWith('x-sealion-peer-');

/** The peer CA, and this replica's own certificate and key, which both ends of its links show. */
export interface PeerCredentials {
  caPem: string;
  own(): { cert: string; key: string };
}

export interface PeerMetrics {
  hops: Counter<'direction' | 'outcome'>;
  dials: Counter<'outcome'>;
  links: Gauge<'direction'>;
  streams: Gauge;
}

export function peerMetrics(registry: Registry, outgoing: () => Iterable<TunnelClient>): PeerMetrics {
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
export function peerHeaders(plan: ForwardPlan): OutgoingHttpHeaders {
  const headers = endToEnd(plan.headers, peerOnly);
  headers[USER_HEADER] = encodeURIComponent(plan.user);
  headers[LONG_RUNNING_HEADER] = plan.longRunning ? '1' : '0';
  return headers;
}

/** The plan a peer's request carries. Only a replica can have sent it (the peer port's TLS saw to that). */
export function planFrom(rawHeaders: string[], headers: IncomingHttpHeaders): ForwardPlan {
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
export function replicaOf(cert: { raw: Buffer } | undefined): string | undefined {
  if (!cert?.raw?.length) return undefined;
  const uris = certificateURIs(cert.raw).filter((u) => u.startsWith(PEER_URI_PREFIX));
  if (uris.length !== 1) return undefined;
  try {
    return decodeURIComponent(uris[0]!.slice(PEER_URI_PREFIX.length)) || undefined;
  } catch {
    return undefined;
  }
}

export function splitAddress(address: string): { host: string; port: number } {
  const i = address.lastIndexOf(':');
  return { host: address.slice(0, i).replace(/^\[|\]$/g, ''), port: Number(address.slice(i + 1)) };
}
