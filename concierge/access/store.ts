// The grants the pipeline asks about (grants.ts), read from this replica's informer on AccessRequests: a grant is
// active while its request is Approved and the clock is before its expiresAt, whatever the expiry controller has
// written yet. A grant's end is told within a second: a timer at each approved request's expiresAt, and the
// informer's update (Denied, Withdrawn, Expired) or delete of it.
import type { AccessPolicy, AccessRequest } from '../../apis/access.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import type { Clock } from '../../lib/clock.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import type { Logger } from '../../lib/log.ts';
import type { AccessGrants, Grant } from './grants.ts';
import { isPending, timeOf, type PolicyAnswer } from './policy.ts';

/** What the store reads besides the requests: the access settings in effect, and the Clusters' policies. */
export interface AccessSettings {
  /** What access requests call the hub. */
  hubName: string;
  /** The hub's own policy. */
  hub: AccessPolicy;
}

export interface AccessStoreOptions {
  requests: Informer<AccessRequest>;
  /** A Cluster's spec by name; undefined: there is none. */
  clusterSpec: (name: string) => ClusterSpec | undefined;
  /** The access settings in effect (the config's accessRequests). */
  settings: () => AccessSettings;
  clock: Clock;
  log: Logger;
}

export interface AccessStore extends AccessGrants {
  /** The requests `username` made, newest first. */
  requestsOf(username: string): AccessRequest[];
  /** How many of `username`'s requests are pending now. */
  pendingOf(username: string): number;
  /** Stops the timers and the calls. Idempotent. */
  close(): void;
}

/** A timer longer than this is armed in steps: setTimeout takes at most 2^31-1 ms. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The grant an approved, unexpired request gives on `cluster` (its name as requests write it) at `now`, if any. */
function grantOf(request: AccessRequest, cluster: string, now: number): Grant | undefined {
  const status = request.status;
  if (status?.phase !== 'Approved') return undefined;
  const expiresAt = timeOf(status.expiresAt);
  if (!(now < expiresAt)) return undefined;
  if (!request.spec.clusters.includes(cluster)) return undefined;
  return {
    name: request.metadata.name ?? '',
    groups: request.spec.groups,
    ...(request.spec.reason ? { reason: request.spec.reason } : {}),
    expiresAt,
  };
}

/** Why a grant that was active ended, for its sessions' message; undefined while it lasts. */
function endOf(request: AccessRequest | undefined, now: number): string | undefined {
  if (!request) return 'was deleted';
  const status = request.status;
  switch (status?.phase) {
    case 'Approved':
      return now < timeOf(status.expiresAt) ? undefined : 'expired';
    case 'Denied':
      return 'was denied';
    case 'Withdrawn':
      return 'was withdrawn';
    case 'Expired':
      return 'expired';
    default:
      return 'ended';
  }
}

export function newAccessStore(opts: AccessStoreOptions): AccessStore {
  const { requests, clock, log } = opts;
  const listeners = new Set<(name: string, why: string) => void>();
  /** The approved requests seen active, each with its timer at expiresAt; an entry leaves when its end is told. */
  const live = new Map<string, { timer: unknown; expiresAt: number }>();
  let closed = false;

  const tell = (name: string, why: string): void => {
    for (const ended of [...listeners])
      try {
        ended(name, why);
      } catch (err) {
        log.error({ err: (err as Error).message, name }, 'a grant-end listener failed');
      }
  };

  /** Looks at one request again (by name): arms its timer while it is an active grant, tells its end once over. */
  const look = (name: string): void => {
    if (closed) return;
    const request = requests.get(name);
    const now = clock.now();
    const held = live.get(name);
    const why = endOf(request, now);
    if (why !== undefined) {
      if (!held) return;
      clock.clearTimeout(held.timer);
      live.delete(name);
      tell(name, why);
      return;
    }
    const expiresAt = timeOf(request!.status?.expiresAt);
    if (held?.expiresAt === expiresAt) return;
    if (held) clock.clearTimeout(held.timer);
    const timer = clock.setTimeout(
      () => {
        // Looked at afresh: a timer cut to MAX_TIMER_MS, or one a millisecond early, is armed again.
        const due = live.get(name);
        if (due) due.expiresAt = NaN;
        look(name);
      },
      Math.min(MAX_TIMER_MS, Math.max(0, expiresAt - now)),
    );
    live.set(name, { timer, expiresAt });
  };

  requests.onChange((request) => {
    const name = request.metadata?.name;
    if (name) look(name);
  });
  for (const request of requests.list()) if (request.metadata.name) look(request.metadata.name);

  /** The name requests give the cluster the pipeline calls `cluster` ('' for the hub); undefined when ambiguous. */
  const requestName = (cluster: string): string | undefined => {
    const { hubName } = opts.settings();
    if (cluster === '') return hubName;
    // A Cluster named like the hub cannot be told apart from it in a request: no grant names it.
    return cluster === hubName ? undefined : cluster;
  };

  return {
    active(username, cluster) {
      const named = requestName(cluster);
      if (named === undefined) return [];
      const now = clock.now();
      const grants: { grant: Grant; approvedAt: number }[] = [];
      for (const request of requests.list()) {
        if (request.spec?.requester?.username !== username) continue;
        const grant = grantOf(request, named, now);
        if (grant) grants.push({ grant, approvedAt: timeOf(request.status?.approvedAt) || 0 });
      }
      // The newest first, as the interface promises: its reason is the one a request without its own carries.
      if (grants.length > 1) grants.sort((a, b) => b.approvedAt - a.approvedAt);
      return grants.map((g) => g.grant);
    },
    reasonRequired(cluster) {
      if (cluster === '') return opts.settings().hub.requireReason === true;
      return opts.clusterSpec(cluster)?.access?.requireReason === true;
    },
    onEnded(ended) {
      listeners.add(ended);
      return () => void listeners.delete(ended);
    },
    requestsOf(username) {
      return requests
        .list()
        .filter((r) => r.spec?.requester?.username === username)
        .sort((a, b) => newestFirst(a, b));
    },
    pendingOf(username) {
      const now = clock.now();
      let pending = 0;
      for (const request of requests.list())
        if (request.spec?.requester?.username === username && isPending(request, now)) pending++;
      return pending;
    },
    close() {
      closed = true;
      for (const { timer } of live.values()) clock.clearTimeout(timer);
      live.clear();
      listeners.clear();
    },
  };
}

/** Newest first by creation time, then by name (the API server's times are to the second). */
function newestFirst(a: AccessRequest, b: AccessRequest): number {
  const at = timeOf(a.metadata.creationTimestamp);
  const bt = timeOf(b.metadata.creationTimestamp);
  if (at !== bt && !Number.isNaN(at) && !Number.isNaN(bt)) return bt - at;
  return (a.metadata.name ?? '').localeCompare(b.metadata.name ?? '');
}

/**
 * The policy of a cluster an access request names: the hub's (by the settings' hubName) from the config, a Cluster's
 * from its spec.access (none: it takes no requests); or why it cannot be asked for.
 */
export function policyLookup(
  settings: () => AccessSettings,
  clusterSpec: (name: string) => ClusterSpec | undefined,
): (cluster: string) => PolicyAnswer {
  return (cluster) => {
    const { hubName, hub } = settings();
    const spec = clusterSpec(cluster);
    if (cluster === hubName)
      return spec
        ? {
            problem: `${JSON.stringify(cluster)} names both the hub and a Cluster, so a request for it is ambiguous; an admin renames the Cluster or sets accessRequests.hubName in the concierge config`,
          }
        : { policy: hub };
    if (!spec)
      return {
        problem: `there is no cluster ${JSON.stringify(cluster)} (sealion clusters lists them; the hub is ${JSON.stringify(hubName)})`,
      };
    return { policy: spec.access ?? {} };
  };
}
