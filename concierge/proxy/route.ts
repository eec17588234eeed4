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
 * may land the first dial on the replica that holds the other tunnel); a replica that dies leaves its agents without
 * a tunnel until they dial again. A request in such a gap is served once a tunnel is back; a cluster gone longer is
 * refused at once, as before.
 */
export const AGENT_RETURN_MS = 10_000;
/** How often the clusters that requests wait for are looked up again. */
const RETURN_CHECK_MS = 100;

/** A request waiting for its cluster's route. */
interface Waiter {
  exchange: Exchange;
  deadline: number;
  done: () => void;
}

/**
 * The wait of requests for clusters without a route: `until` resolves once the cluster has one, the client has gone,
 * or AGENT_RETURN_MS have passed since this process last saw the cluster's agent connected (`lastConnected`; at once
 * when it never did, or when that was longer ago). The caller routes as usual then: a request still without a route
 * is refused as before. One timer looks up each cluster that has waiters, whatever their number.
 */
export function newRouteWaits(
  router: ClusterRouter,
  lastConnected: (cluster: string) => number | undefined,
  clock: Clock,
): { until(cluster: string, exchange: Exchange): Promise<void> } {
  const waiting = new Map<string, Set<Waiter>>();
  let ticking = false;
  const tick = (): void => {
    const now = clock.now();
    for (const [cluster, waiters] of waiting) {
      const routed = router.route(cluster) !== undefined;
      for (const waiter of waiters)
        if (routed || now >= waiter.deadline || gone(waiter.exchange)) {
          waiters.delete(waiter);
          waiter.done();
        }
      if (waiters.size === 0) waiting.delete(cluster);
    }
    ticking = waiting.size > 0;
    if (ticking) clock.setTimeout(tick, RETURN_CHECK_MS);
  };
  return {
    until(cluster, exchange) {
      if (router.route(cluster)) return Promise.resolve();
      const seen = lastConnected(cluster);
      if (seen === undefined) return Promise.resolve();
      const deadline = Math.min(seen, clock.now()) + AGENT_RETURN_MS;
      if (clock.now() >= deadline) return Promise.resolve();
      return new Promise<void>((done) => {
        let waiters = waiting.get(cluster);
        if (!waiters) waiting.set(cluster, (waiters = new Set()));
        waiters.add({ exchange, deadline, done });
        if (!ticking) {
          ticking = true;
          clock.setTimeout(tick, RETURN_CHECK_MS);
        }
      });
    },
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
