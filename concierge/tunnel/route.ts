// The route to a cluster through its agent's tunnel (lib/tunnel/tunnel.ts): a plain request as an HTTP/2 request, an
// upgrade as HTTP/1.1 on a CONNECT stream, to the agent's local proxy, which adds the agent's own credential. The
// hub's forwarding credential never goes into a tunnel: the agent sees the impersonation headers and nothing else of
// the hub's.
//
// A tunnel is shared by everyone who reaches its cluster, so each request (plain or upgrade) first takes a place
// from the tunnel's fair semaphore, keyed by the authenticated user: at most maxRequestsPerUser at once per user,
// maxConcurrentStreams in all, and the rest wait, served user by user in turn. A request that makes no progress for
// progressTimeoutSeconds is cut (the transport's progress deadline), so that nobody holds a place by reading slowly.
import { request } from 'node:http';
import { systemClock, type Clock } from '../../lib/clock.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import { DEFAULT_MAX_STREAMS, type TunnelClient } from '../../lib/tunnel/tunnel.ts';
import { endToEnd } from '../../lib/http2/hop-by-hop.ts';
import { CallFailed } from '../../lib/http2/forward.ts';
import type { Refusal } from '../proxy/exchange.ts';
import { admitFairly, OWN_CALL_MAX_BYTES, OWN_CALL_TIMEOUT_MS, type Route } from '../proxy/route.ts';
import { callOver, SHORT_REQUEST_TIMEOUT_MS, transport, type Hop } from '../proxy/transport.ts';
import { KEY_LIMIT, newFairSemaphore, type FairLimits, type FairRefusal } from '../../lib/fair-semaphore.ts';

/** One user's default share of a tunnel: a quarter, so that it takes three others to fill a tunnel. */
const DEFAULT_USER_SHARE = 1 / 4;
/** Requests waiting for a tunnel, all users: a waiting request costs little more than its open connection. */
export const DEFAULT_MAX_QUEUED = 1000;
/** As the API server's priority and fairness queues wait at most a quarter of its 60 s request timeout. */
export const DEFAULT_QUEUE_TIMEOUT_SECONDS = 15;
/**
 * How long a request may make no progress before it is cut. Long enough for any healthy pause of a reading client
 * (a collection, a slow link, a laptop changing networks); short enough that reading slowly cannot hold a place.
 */
export const DEFAULT_PROGRESS_TIMEOUT_SECONDS = 60;
/**
 * What the refusals tell clients to wait before trying again. client-go honours Retry-After on 429 and 503 and
 * tries again up to ten times, so a short wait spreads its retries over the queue's timeout.
 */
const RETRY_AFTER_SECONDS = 1;

/** The fair queue's limits of one tunnel, and how long a request may make no progress. */
export interface TunnelLimits extends FairLimits {
  progressTimeoutMs: number;
}

/** A spec field, or its default when it is missing or out of bounds (the CRD's schema has the same bounds). */
function field(value: number | undefined, min: number, max: number, fallback: number): number {
  return value !== undefined && Number.isInteger(value) && value >= min && value <= max ? value : fallback;
}

/** A Cluster's tunnel limits, its spec's fields with their defaults. A user may queue as many as it may run. */
export function tunnelLimits(spec: ClusterSpec): TunnelLimits {
  const capacity = field(spec.maxConcurrentStreams, 1, 100_000, DEFAULT_MAX_STREAMS);
  const perKey = field(
    spec.maxRequestsPerUser,
    1,
    100_000,
    Math.max(1, Math.ceil(capacity * DEFAULT_USER_SHARE)),
  );
  return {
    capacity,
    perKey,
    maxQueued: field(spec.maxQueuedRequests, 0, 100_000, DEFAULT_MAX_QUEUED),
    maxQueuedPerKey: perKey,
    maxWaitMs: field(spec.queueTimeoutSeconds, 1, 60, DEFAULT_QUEUE_TIMEOUT_SECONDS) * 1000,
    progressTimeoutMs: field(spec.progressTimeoutSeconds, 1, 3600, DEFAULT_PROGRESS_TIMEOUT_SECONDS) * 1000,
  };
}

export interface TunnelRouteOptions {
  /** Default: the defaults of an empty Cluster spec. */
  limits?: TunnelLimits;
  /** Timers for the queue's deadline and the progress deadline. Default: the system's. */
  clock?: Clock;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). Default: nowhere. */
  budget?: MemoryBudget;
}

export interface TunnelRoute extends Route {
  /** Takes a Cluster's edited limits at once, without reconnecting; requests in flight keep their places. */
  configure(limits: TunnelLimits): void;
  close(): void;
}

const TUNNEL_HOST = 'cluster.tunnel';

/** The Status for a request the fair queue turned away: 429 when the user's own share is used up, 503 otherwise. */
function refusalStatus(cluster: string, why: FairRefusal, limits: TunnelLimits): Refusal {
  const waited = why.waited ? ` and waited ${limits.maxWaitMs / 1000} s` : '';
  const retryAfterSeconds = RETRY_AFTER_SECONDS;
  if (why.code === KEY_LIMIT)
    return {
      status: 429,
      message: `cluster ${cluster}: you already have as many requests in flight and waiting for its tunnel as one user may (${limits.perKey} of each)${waited}; retry later`,
      retryAfterSeconds,
    };
  if (why.code === 'SEALION_FAIR_CLOSED')
    return {
      status: 503,
      message: `cluster ${cluster}: its agent's tunnel closed; retry later`,
      retryAfterSeconds,
    };
  return {
    status: 503,
    message: `cluster ${cluster}: the tunnel carries as many requests as it may${waited || ' and its queue is full'}; retry later`,
    retryAfterSeconds,
  };
}

function failure(cluster: string, err: Error & { code?: string }): Refusal {
  if (err.code === 'SEALION_TUNNEL_BUSY')
    return {
      status: 503,
      message: `cluster ${cluster}: the tunnel carries as many streams as it may; retry later`,
    };
  if (err.code === 'SEALION_UPSTREAM_TIMEOUT')
    return { status: 504, message: `cluster ${cluster}: the API server did not answer in time` };
  return {
    status: 502,
    message: `cluster ${cluster}: the agent's tunnel failed: ${err.code ?? err.message}`,
  };
}

function isAuthorization(name: string): boolean {
  return name === 'authorization';
}

export function newTunnelRoute(
  cluster: string,
  tunnel: TunnelClient,
  opts: TunnelRouteOptions = {},
): TunnelRoute {
  let limits = opts.limits ?? tunnelLimits({});
  const clock = opts.clock ?? systemClock;
  const admission = newFairSemaphore(limits, clock);
  tunnel.setMaxStreams(limits.capacity);
  const hop: Hop = {
    // Never a credential, nor what belongs to one hop (lib/http2/hop-by-hop.ts).
    headers: (plan) => endToEnd(plan.headers, isAuthorization),
    pathPrefix: '',
    open: (headers, endStream) => tunnel.request(headers, endStream),
    send: (method, path, headers) =>
      request({ host: TUNNEL_HOST, method, path, headers, agent: tunnel.agent }),
    statusPrefix: `cluster ${cluster}: `,
    failure: (err) => failure(cluster, err),
    shortTimeoutMs: SHORT_REQUEST_TIMEOUT_MS,
    progressMs: limits.progressTimeoutMs,
    clock,
    ...(opts.budget ? { budget: opts.budget } : {}),
  };

  return {
    kind: 'tunnel',
    async forward(exchange, plan) {
      const release = await admitFairly(admission, exchange, plan.user, (why) =>
        refusalStatus(cluster, why, limits),
      );
      if (release) return transport(exchange, hop, plan, release);
    },
    call(own) {
      // A place in the fair queue, as the user's own requests take: asking on someone's behalf costs their share.
      return new Promise((done, fail) => {
        admission.acquire(
          own.user,
          (release) => {
            callOver(hop, own, { timeoutMs: OWN_CALL_TIMEOUT_MS, maxBytes: OWN_CALL_MAX_BYTES }).then(
              (answer) => {
                release();
                done(answer);
              },
              (err: Error) => {
                release();
                fail(err);
              },
            );
          },
          (why) => {
            // Refused by the fair queue as the user's own request would be: the same Status (429 for their share).
            const { status, message } = refusalStatus(cluster, why, limits);
            fail(new CallFailed(message, status));
          },
        );
      });
    },
    configure(next) {
      // Every status write to the Cluster comes back as an edit: only a changed spec is worth a pass over the queue.
      if ((Object.keys(next) as (keyof TunnelLimits)[]).every((k) => next[k] === limits[k])) return;
      limits = next;
      hop.progressMs = next.progressTimeoutMs;
      admission.configure(next);
      tunnel.setMaxStreams(next.capacity);
    },
    close() {
      admission.close();
      tunnel.close();
    },
  };
}
