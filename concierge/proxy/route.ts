// Where a request goes once it is decided: the ClusterRouter picks a Route for the cluster it is for (the hub's own
// API server, the tunnel this replica holds to the cluster's agent, or a peer replica that holds one), and the
// route admits it (its fair share of a tunnel, its place on a peer link) and hands it to the transport.
import type { Clock } from '../../lib/clock.ts';
import type { CallAnswer } from '../../lib/http2/forward.ts';
import type { FairRefusal, FairSemaphore } from '../../lib/fair-semaphore.ts';
import { gone, refuse, whenClosed, type Exchange, type Refusal, type RouteKind } from './exchange.ts';
import type { ForwardPlan, OwnCall } from './transport.ts';

export type { OwnCall };

export interface Route {
  readonly kind: RouteKind;
  /** Admits the exchange and sends it on to the cluster; resolves once it is on its way, or refused. */
  forward(exchange: Exchange, plan: ForwardPlan): Promise<void>;
  /**
   * Sends one small request of the concierge's own to the cluster, as the forwarding identity itself (no
   * impersonation): the questions about that cluster that only it may answer.
   */
  call(request: OwnCall): Promise<CallAnswer>;
}

/** How long a cluster has to answer one of the concierge's own calls (a SubjectAccessReview takes milliseconds). */
export const OWN_CALL_TIMEOUT_MS = 10_000;
/** The largest answer to one of the concierge's own calls: a SubjectAccessReview's is well under a kilobyte. */
export const OWN_CALL_MAX_BYTES = 64 * 1024;

/** The route to each cluster. */
export interface ClusterRouter {
  /** The route to `cluster` ('' for the hub's own API server), or undefined when nothing reaches it now. */
  route(cluster: string): Route | undefined;
}

/**
 * The hub's own API server for '', and for a cluster the first of `reach` that reaches it: a replica's own tunnel
 * comes before a peer's.
 */
export function newClusterRouter(
  hub: Route,
  ...reach: ((cluster: string) => Route | undefined)[]
): ClusterRouter {
  return {
    route(cluster) {
      if (!cluster) return hub;
      for (const through of reach) {
        const route = through(cluster);
        if (route) return route;
      }
      return undefined;
    },
  };
}

/**
 * How long after its agent was last connected a request for a cluster with no route waits for one. An agent whose
 * tunnel a draining replica asks to move dials another within 1 to 3 s, and its other tunnel may be moving at the same
 * moment (a rolling upgrade drains the replicas one after the other, and an address that picks a replica at random
 * may land the first dial on the replica that holds the other tunnel). A request in such a gap is served once a
 * tunnel is back; a cluster gone longer is refused at once, as before.
 */
export const AGENT_RETURN_MS = 10_000;
/** How often the clusters that requests wait for are looked up again. */
const RETURN_CHECK_MS = 100;
/**
 * Requests one user may have waiting at once, and all users together; past these a request is refused at once, as
 * it was before requests waited. They are a tunnel's default queue, per user and in all (tunnelLimits): a waiting
 * request holds what a queued one does (its stream, and the part of its body its window lets in).
 */
export const MAX_WAITING_PER_USER = 250;
export const MAX_WAITING = 1_000;

/** A request waiting for its cluster's route. */
interface Waiter {
  exchange: Exchange;
  user: string;
  /**
   * Looks left before it gives up, and the monotonic time (performance.now) it gives up at: whichever comes first.
   * Neither moves with a step of the wall clock, and the second holds when a busy event loop makes the looks late.
   */
  looksLeft: number;
  latest: number;
  done: () => void;
}

export interface RouteWaitOptions {
  router: ClusterRouter;
  /**
   * When this process last saw the cluster's agent connected; undefined when it never did, or when no wait can bring
   * a route (a replica this one cannot reach holds the tunnel).
   */
  lastConnected: (cluster: string) => number | undefined;
  clock: Clock;
}

export interface RouteWaits {
  /**
   * Resolves once `cluster` has a route; or at once, or later, when waiting can no longer bring one: AGENT_RETURN_MS
   * have passed since its agent was last seen connected (or it never was), the client has gone, or the user or all
   * users have as many requests waiting as they may. The caller routes as usual then, and a request still without a
   * route is refused. One timer looks up each cluster that has waiters, whatever their number.
   */
  until(cluster: string, user: string, exchange: Exchange): Promise<void>;
  /** How many requests wait now. */
  waiting(): number;
}

export function newRouteWaits(opts: RouteWaitOptions): RouteWaits {
  const { router, lastConnected, clock } = opts;
  const waiting = new Map<string, Set<Waiter>>();
  const perUser = new Map<string, number>();
  let count = 0;
  let ticking = false;
  const release = (waiters: Set<Waiter>, waiter: Waiter): void => {
    waiters.delete(waiter);
    count--;
    const left = perUser.get(waiter.user)! - 1;
    if (left === 0) perUser.delete(waiter.user);
    else perUser.set(waiter.user, left);
    waiter.done();
  };
  /**
   * How long a request for `cluster` may wait from now, in ms: 0 when it is routed or past help. A lookup that throws
   * counts as past help: the request is routed (and refused) as before.
   */
  const waitLeft = (cluster: string): number => {
    try {
      if (router.route(cluster)) return 0;
      const seen = lastConnected(cluster);
      const now = clock.now();
      return seen === undefined ? 0 : Math.max(0, Math.min(seen, now) + AGENT_RETURN_MS - now);
    } catch {
      return 0;
    }
  };
  const tick = (): void => {
    const now = performance.now();
    for (const [cluster, waiters] of waiting) {
      const ended = waitLeft(cluster) === 0;
      for (const waiter of waiters)
        if (ended || --waiter.looksLeft <= 0 || now >= waiter.latest || gone(waiter.exchange))
          release(waiters, waiter);
      if (waiters.size === 0) waiting.delete(cluster);
    }
    ticking = waiting.size > 0;
    if (ticking) clock.setTimeout(tick, RETURN_CHECK_MS);
  };
  return {
    until(cluster, user, exchange) {
      if (count >= MAX_WAITING || (perUser.get(user) ?? 0) >= MAX_WAITING_PER_USER) return Promise.resolve();
      const left = waitLeft(cluster);
      if (left === 0) return Promise.resolve();
      return new Promise<void>((done) => {
        let waiters = waiting.get(cluster);
        if (!waiters) waiting.set(cluster, (waiters = new Set()));
        const looksLeft = Math.ceil(left / RETURN_CHECK_MS);
        waiters.add({ exchange, user, looksLeft, latest: performance.now() + left, done });
        count++;
        perUser.set(user, (perUser.get(user) ?? 0) + 1);
        if (!ticking) {
          ticking = true;
          clock.setTimeout(tick, RETURN_CHECK_MS);
        }
      });
    },
    waiting: () => count,
  };
}

const CLUSTERS_PREFIX = '/clusters/';

/** `/clusters/<name>/<rest>` → the cluster and the URL on it; undefined for the hub's own URLs. */
export function clusterRoute(url: string): { cluster: string; url: string } | undefined {
  if (!url.startsWith(CLUSTERS_PREFIX)) return undefined;
  const end = url.slice(CLUSTERS_PREFIX.length).search(/[/?]/);
  const cluster =
    end < 0
      ? url.slice(CLUSTERS_PREFIX.length)
      : url.slice(CLUSTERS_PREFIX.length, CLUSTERS_PREFIX.length + end);
  if (!cluster) return undefined;
  const rest = end < 0 ? '' : url.slice(CLUSTERS_PREFIX.length + end);
  return { cluster, url: rest.startsWith('/') ? rest : `/${rest}` };
}

/**
 * Waits for the user's turn in `semaphore`. Resolves with the place's release; or with undefined when the semaphore
 * refused (the exchange is answered with `refusal(why)`) or the client left while it waited (it leaves the queue).
 */
export function admitFairly(
  semaphore: FairSemaphore,
  exchange: Exchange,
  user: string,
  refusal: (why: FairRefusal) => Refusal,
): Promise<(() => void) | undefined> {
  if (gone(exchange)) return Promise.resolve(undefined);
  return new Promise((done) => {
    let settled = false;
    /** Stops watching for the client leaving: a request admitted or refused no longer waits. */
    let stopWatching = (): void => {};
    const cancel = semaphore.acquire(
      user,
      (release) => {
        settled = true;
        stopWatching();
        done(release);
      },
      (why) => {
        settled = true;
        stopWatching();
        refuse(exchange, refusal(why));
        done(undefined);
      },
    );
    if (!settled)
      stopWatching = whenClosed(exchange, () => {
        if (settled) return;
        settled = true;
        cancel();
        done(undefined);
      });
  });
}
