// Forwarding to a cluster through its agent's tunnel (lib/tunnel/tunnel.ts): a plain request as an HTTP/2 request, an
// upgrade as HTTP/1.1 on a CONNECT stream, to the agent's local proxy, which adds the agent's own credential. The
// hub's forwarding credential never goes into a tunnel: the agent sees the impersonation headers and nothing else of
// the hub's.
//
// A tunnel is shared by everyone who reaches its cluster, so each request (plain or upgrade) first takes a place
// from the tunnel's fair semaphore, keyed by the authenticated user: at most maxRequestsPerUser at once per user,
// maxConcurrentStreams in all, and the rest wait, served user by user in turn. A request that makes no progress for progressTimeoutSeconds (an answer or an upgraded connection's data the client does not
// read, a body that stopped arriving) is cut, so that nobody holds a place by reading slowly.
import { systemClock, type Clock } from '../../lib/clock.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import { request, type OutgoingHttpHeaders } from 'node:http';
import { constants } from 'node:http2';
import type { Socket } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import { DEFAULT_MAX_STREAMS, type TunnelClient } from '../../lib/tunnel/tunnel.ts';
import { endToEnd } from '../../lib/http2/hop-by-hop.ts';
import { callOverHttp2, CallFailed, forwardOverHttp2, hasBody } from '../../lib/http2/forward.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import {
  OWN_CALL_MAX_BYTES,
  OWN_CALL_TIMEOUT_MS,
  SHORT_REQUEST_TIMEOUT_MS,
  type Forwarder,
  type ForwardPlan,
} from '../proxy/forward.ts';
import { rawStatusResponse, statusBody, writeStatus } from '../../lib/kube/status.ts';
import { forwardUpgrade, originForm } from '../../lib/http2/upgrade.ts';
import { KEY_LIMIT, newFairSemaphore, type FairLimits, type FairRefusal } from './fair-semaphore.ts';

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

export interface TunnelForwarderOptions {
  /** Default: the defaults of an empty Cluster spec. */
  limits?: TunnelLimits;
  /** Timers for the queue's deadline and the progress deadline. Default: the system's. */
  clock?: Clock;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). Default: nowhere. */
  budget?: MemoryBudget;
}

export interface TunnelForwarder extends Forwarder {
  /** Takes a Cluster's edited limits at once, without reconnecting; requests in flight keep their places. */
  configure(limits: TunnelLimits): void;
}

const TUNNEL_HOST = 'cluster.tunnel';

/** The Status for a request the fair queue turned away: 429 when the user's own share is used up, 503 otherwise. */
function refusalStatus(
  cluster: string,
  why: FairRefusal,
  limits: TunnelLimits,
): { code: number; message: string } {
  const waited = why.waited ? ` and waited ${limits.maxWaitMs / 1000} s` : '';
  if (why.code === KEY_LIMIT)
    return {
      code: 429,
      message: `cluster ${cluster}: you already have as many requests in flight and waiting for its tunnel as one user may (${limits.perKey} of each)${waited}; retry later`,
    };
  if (why.code === 'SEALION_FAIR_CLOSED')
    return { code: 503, message: `cluster ${cluster}: its agent's tunnel closed; retry later` };
  return {
    code: 503,
    message: `cluster ${cluster}: the tunnel carries as many requests as it may${waited || ' and its queue is full'}; retry later`,
  };
}

function failure(cluster: string, err: Error & { code?: string }): { code: number; message: string } {
  if (err.code === 'SEALION_TUNNEL_BUSY')
    return {
      code: 503,
      message: `cluster ${cluster}: the tunnel carries as many streams as it may; retry later`,
    };
  if (err.code === 'SEALION_UPSTREAM_TIMEOUT')
    return { code: 504, message: `cluster ${cluster}: the API server did not answer in time` };
  return { code: 502, message: `cluster ${cluster}: the agent's tunnel failed: ${err.code ?? err.message}` };
}

/**
 * The request's headers for the agent: never a credential, nor what belongs to one hop (lib/http2/hop-by-hop.ts); an
 * upgrade's go on HTTP/1.1 and name the tunnel as their host.
 */
function upstreamHeaders(plan: ForwardPlan): OutgoingHttpHeaders {
  return endToEnd(plan.headers, isAuthorization);
}

function isAuthorization(name: string): boolean {
  return name === 'authorization';
}

/**
 * Calls `release` once `stream` (a tunnel stream, if there is one) is destroyed: until then it counts against the
 * tunnel's limit (lib/tunnel/tunnel.ts stops counting it at its destroy, which comes before its 'close').
 */
function releaseWhenGone(release: () => void, stream: Duplex | undefined): void {
  if (!stream || stream.destroyed) return release();
  stream.once('close', release);
}

/**
 * Watches a request body: `stalled` is called when no chunk arrived for `ms` before its end (the client stopped
 * sending, or the tunnel stopped taking it). One timer per body, checked and re-armed when it fires.
 */
function watchBody(body: Readable, ms: number, clock: Clock, stalled: () => void): () => void {
  let chunks = 0;
  let seen = -1;
  let timer: unknown;
  const check = (): void => {
    if (chunks === seen) return stalled();
    seen = chunks;
    timer = clock.setTimeout(check, ms);
  };
  const count = (): void => void chunks++;
  const stop = (): void => {
    clock.clearTimeout(timer);
    body.off('data', count);
  };
  body.on('data', count);
  body.once('end', stop);
  check();
  return stop;
}

/**
 * Cuts an upgraded connection whose client has not taken what the agent sent for `ms`: the proxy's pipe pauses the
 * tunnel stream while the client's socket is full, and the client's 'drain' lets it go on. An idle connection (an
 * exec shell nobody types in) has nothing pending and is never cut.
 */
function watchUpgrade(stream: Duplex, socket: Socket, ms: number, clock: Clock): void {
  let timer: unknown;
  const disarm = (): void => {
    clock.clearTimeout(timer);
    timer = undefined;
  };
  stream.on('pause', () => {
    if (timer !== undefined) return;
    timer = clock.setTimeout(() => {
      timer = undefined;
      // Paused for another reason (the upgrade's own setup): only a client that leaves data unread stalls.
      if (!socket.writableNeedDrain) return;
      socket.destroy();
      stream.destroy();
    }, ms);
  });
  socket.on('drain', disarm);
  socket.once('close', disarm);
}

export function newTunnelForwarder(
  cluster: string,
  tunnel: TunnelClient,
  opts: TunnelForwarderOptions = {},
): TunnelForwarder {
  let limits = opts.limits ?? tunnelLimits({});
  const clock = opts.clock ?? systemClock;
  const admission = newFairSemaphore(limits, clock);
  tunnel.setMaxStreams(limits.capacity);

  const retryAfter = { 'retry-after': String(RETRY_AFTER_SECONDS) };
  const details = { retryAfterSeconds: RETRY_AFTER_SECONDS };

  /** Forwards a request that holds a place; `release` gives the place back once its tunnel stream is closed. */
  function forward(req: Request, res: Response, plan: ForwardPlan, release: () => void) {
    return new Promise<void>((done) => {
      const progressMs = limits.progressTimeoutMs;
      const headers = upstreamHeaders(plan);
      headers[':method'] = req.method ?? 'GET';
      headers[':path'] = req.url ?? '/';
      const stream = forwardOverHttp2(req, res, headers, {
        open: (h, endStream) => tunnel.request(h, endStream),
        fail(err) {
          if (res.headersSent) return void (res.destroyed || res.destroy());
          const { code, message } = failure(cluster, err);
          writeStatus(res, code, message);
        },
        ...(plan.longRunning ? { flushHeaders: true } : { idleTimeoutMs: SHORT_REQUEST_TIMEOUT_MS }),
        // A client that leaves the answer unread holds its place, its stream and memory on every hop: cut, as any
        // broken answer is, once it has read nothing for the progress timeout, or at once when the user's unread
        // answers are over their share of this process's memory.
        relay: {
          deadline: { ms: progressMs, clock },
          ...(opts.budget ? { account: { budget: opts.budget, user: plan.user } } : {}),
        },
      });
      let stopWatchingBody = (): void => {};
      let finished = false;
      const finish = (): void => {
        if (finished) return;
        finished = true;
        stopWatchingBody();
        // Closing a tunnel stream frees its place in the tunnel at once (lib/tunnel/tunnel.ts); one that has ended both ways
        // is closed already.
        stream?.close(constants.NGHTTP2_CANCEL);
        release();
        done();
      };
      res.once('close', finish);
      if (stream && hasBody(req)) {
        const from: Readable = 'stream' in req ? req.stream : req;
        stopWatchingBody = watchBody(from, progressMs, clock, () => {
          if (res.headersSent) res.destroy();
          else writeStatus(res, 408, `cluster ${cluster}: the request body stopped arriving`);
          // An HTTP/2 response that ended before its request did closes only when the client ends or resets it.
          finish();
        });
      }
    });
  }

  return {
    web(req, res, plan) {
      // A client gone before its turn (it reset the request while it was authenticated) would never close again:
      // a place taken for it would never come back.
      if (res.destroyed) return Promise.resolve();
      return new Promise<void>((done) => {
        let settled = false;
        const cancel = admission.acquire(
          plan.user,
          (release) => {
            settled = true;
            void forward(req, res, plan, release).then(done);
          },
          (why) => {
            settled = true;
            const { code, message } = refusalStatus(cluster, why, limits);
            if (res.headersSent) res.destroy();
            else {
              const text = statusBody(code, message, details);
              res.writeHead(code, {
                'content-type': 'application/json',
                'content-length': Buffer.byteLength(text),
                ...retryAfter,
              });
              res.end(text);
            }
            done();
          },
        );
        // A client that gives up while waiting leaves the queue.
        if (!settled)
          res.once('close', () => {
            if (settled) return;
            cancel();
            done();
          });
      });
    },
    upgrade(req, socket: Socket, head, plan) {
      const headers = {
        ...upstreamHeaders(plan),
        host: TUNNEL_HOST,
        connection: 'Upgrade',
        upgrade: plan.headers['upgrade'],
      };
      if (socket.destroyed) return;
      let settled = false;
      const cancel = admission.acquire(
        plan.user,
        (release) => {
          settled = true;
          let stream: Duplex | undefined;
          const progressMs = limits.progressTimeoutMs;
          socket.once('close', () => releaseWhenGone(release, stream));
          forwardUpgrade(socket, head, {
            send() {
              const sent = request({
                host: TUNNEL_HOST,
                method: req.method ?? 'GET',
                path: originForm(req.url),
                headers,
                agent: tunnel.agent,
              });
              // The tunnel stream it goes out on, watched for a client that stops reading.
              sent.once('socket', (s: Duplex) => {
                stream = s;
                watchUpgrade(s, socket, progressMs, clock);
              });
              return sent;
            },
            fail(err) {
              const { code, message } = failure(cluster, err);
              if (!socket.destroyed) socket.end(rawStatusResponse(code, message));
            },
          });
        },
        (why) => {
          settled = true;
          const { code, message } = refusalStatus(cluster, why, limits);
          if (!socket.destroyed)
            socket.end(rawStatusResponse(code, message, { details, headers: retryAfter }));
        },
      );
      if (!settled)
        socket.once('close', () => {
          if (!settled) cancel();
        });
    },
    call(own) {
      // A place in the fair queue, as the user's own requests take: asking on someone's behalf costs their share.
      return new Promise((done, fail) => {
        admission.acquire(
          own.user,
          (release) => {
            callOverHttp2(
              (h, endStream) => tunnel.request(h, endStream),
              {
                ':method': own.method,
                ':path': own.path,
                'content-type': 'application/json',
                accept: 'application/json',
              },
              own.body,
              { timeoutMs: OWN_CALL_TIMEOUT_MS, maxBytes: OWN_CALL_MAX_BYTES },
            ).then(
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
            const { code, message } = refusalStatus(cluster, why, limits);
            fail(new CallFailed(message, code));
          },
        );
      });
    },
    configure(next) {
      // Every status write to the Cluster comes back as an edit: only a changed spec is worth a pass over the queue.
      if ((Object.keys(next) as (keyof TunnelLimits)[]).every((k) => next[k] === limits[k])) return;
      limits = next;
      admission.configure(next);
      tunnel.setMaxStreams(next.capacity);
    },
    close() {
      admission.close();
      tunnel.close();
    },
  };
}
