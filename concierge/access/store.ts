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
  /** A Cluster's uid by name (metadata.uid); undefined: there is none. */
  clusterUID: (name: string) => string | undefined;
  /** The access settings in effect (the config's accessRequests). */
  settings: () => AccessSettings;
  clock: Clock;
  log: Logger;
}

export interface AccessStore extends AccessGrants {
  /** The requests `username` made and the hub still holds, newest first. */
  requestsOf(username: string): AccessRequest[];
  /** How many of `username`'s requests are pending now. */
  pendingOf(username: string): number;
  /** Stops the timers and the calls. Idempotent. */
  close(): void;
}

/** A timer longer than this is armed in steps: setTimeout takes at most 2^31-1 ms. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/**
 * What a grant on one cluster is checked against now: the cluster's name in requests, its current policy, and its
 * Cluster's uid ('' for the hub).
 */
interface Target {
  named: string;
  policy: AccessPolicy;
  uid: string;
}

/**
 * How far ahead of this replica's clock an approval may be dated: the replica that wrote it may run ahead by a few
 * seconds. A status dated further ahead was not written by an approval, and grants nothing.
 */
const APPROVAL_SKEW_MS = 60_000;
/** expiresAt is written to the second (rfc3339), so it may lie up to a second past approvedAt + durationSeconds. */
const ROUNDING_MS = 1000;

/**
 * Whether an Approved status holds up by itself, whoever wrote it: at least the approvals required (the larger of
 * the status's and the cluster's current policy's) by distinct reviewers, none of them the requester, and a grant no
 * longer than asked from an approval not in the future. A status written other than by the approval rules (an
 * admin's edit, a replica's bug) grants nothing.
 */
function approvedAsRequired(request: AccessRequest, policy: AccessPolicy, now: number): boolean {
  const status = request.status!;
  const requester = request.spec.requester.username;
  const approvals = (status.reviews ?? []).filter((r) => r.decision === 'Approved');
  if (approvals.some((r) => r.user === requester)) return false;
  const required = Math.max(1, status.approvalsRequired ?? 1, policy.approvals ?? 1);
  if (new Set(approvals.map((r) => r.user)).size < required) return false;
  const approvedAt = timeOf(status.approvedAt);
  const expiresAt = timeOf(status.expiresAt);
  return (
    approvedAt <= now + APPROVAL_SKEW_MS &&
    expiresAt <= approvedAt + request.spec.durationSeconds * 1000 + ROUNDING_MS
  );
}

/**
 * The grant an approved, unexpired request gives on `target` at `now`, if any: only the groups the cluster's current
 * policy still lists, only on the Cluster it was approved for (by uid).
 */
function grantOf(request: AccessRequest, target: Target, now: number): Grant | undefined {
  const status = request.status;
  if (status?.phase !== 'Approved') return undefined;
  const expiresAt = timeOf(status.expiresAt);
  if (!(now < expiresAt)) return undefined;
  if (!request.spec.clusters.includes(target.named)) return undefined;
  const uids = status.clusterUIDs ?? {};
  if (!Object.hasOwn(uids, target.named) || uids[target.named] !== target.uid) return undefined;
  if (!approvedAsRequired(request, target.policy, now)) return undefined;
  const allowed = target.policy.groups ?? [];
  const groups = request.spec.groups.filter((g) => allowed.includes(g));
  if (groups.length === 0) return undefined;
  return {
    name: request.metadata.name ?? '',
    groups,
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
      // Denied after its approval: a reviewer revoked it.
      return status.approvedAt ? 'was revoked' : 'was denied';
    case 'Withdrawn':
      return 'was withdrawn';
    case 'Expired':
      return 'expired';
    default:
      return 'ended';
  }
}

/** Grants' ends, told once each: a timer at each active grant's expiresAt, and a look at each change of a request. */
interface GrantEnds {
  /** Looks at one request again (by name): arms its timer while it is an active grant, tells its end once over. */
  look(name: string): void;
  onEnded(ended: (name: string, why: string) => void): () => void;
  close(): void;
}

function newGrantEnds(requests: Informer<AccessRequest>, clock: Clock, log: Logger): GrantEnds {
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

  return {
    look,
    onEnded(ended) {
      listeners.add(ended);
      return () => void listeners.delete(ended);
    },
    close() {
      closed = true;
      for (const { timer } of live.values()) clock.clearTimeout(timer);
      live.clear();
      listeners.clear();
    },
  };
}

/**
 * Every request's name by requester: what active() reads on each forwarded request, and requestsOf and pendingOf on
 * each create and selfaccessrequests, so that their cost is the user's own requests (at most MAX_REQUESTS_PER_USER
 * held), never every AccessRequest the hub holds. spec is immutable (the CRD's rules): a request stays its
 * requester's.
 */
interface RequesterIndex {
  /** Takes in one change of a request: added while the informer holds it, dropped once it does not. */
  change(request: AccessRequest): void;
  /** The user's requests the informer holds. */
  of(username: string): AccessRequest[];
  clear(): void;
}

function newRequesterIndex(requests: Informer<AccessRequest>): RequesterIndex {
  const byRequester = new Map<string, Set<string>>();
  return {
    change(request) {
      const name = request.metadata?.name;
      const requester = request.spec?.requester?.username;
      if (!name || requester === undefined) return;
      let names = byRequester.get(requester);
      if (requests.get(name)) {
        if (!names) byRequester.set(requester, (names = new Set()));
        names.add(name);
        return;
      }
      names?.delete(name);
      if (names?.size === 0) byRequester.delete(requester);
    },
    of(username) {
      const held: AccessRequest[] = [];
      for (const name of byRequester.get(username) ?? []) {
        const request = requests.get(name);
        if (request?.spec?.requester?.username === username) held.push(request);
      }
      return held;
    },
    clear: () => byRequester.clear(),
  };
}

export function newAccessStore(opts: AccessStoreOptions): AccessStore {
  const { requests, clock } = opts;
  const ends = newGrantEnds(requests, clock, opts.log);
  const index = newRequesterIndex(requests);
  let closed = false;

  requests.onChange((request) => {
    if (closed) return;
    index.change(request);
    const name = request.metadata?.name;
    if (name) ends.look(name);
  });
  for (const request of requests.list()) {
    index.change(request);
    if (request.metadata.name) ends.look(request.metadata.name);
  }

  /**
   * What a grant on the cluster the pipeline calls `cluster` ('' for the hub) is checked against now; undefined: it
   * grants nothing (a name both the hub and a Cluster go by, a Cluster without an access policy, or none).
   */
  const targetOf = (cluster: string): Target | undefined => {
    const { hubName, hub } = opts.settings();
    if (cluster === '')
      return opts.clusterSpec(hubName) ? undefined : { named: hubName, policy: hub, uid: '' };
    if (cluster === hubName) return undefined;
    const policy = opts.clusterSpec(cluster)?.access;
    const uid = opts.clusterUID(cluster);
    return policy && uid ? { named: cluster, policy, uid } : undefined;
  };

  return {
    active(username, cluster) {
      const mine = index.of(username);
      if (mine.length === 0) return [];
      const target = targetOf(cluster);
      if (target === undefined) return [];
      const now = clock.now();
      const grants: { grant: Grant; approvedAt: number }[] = [];
      for (const request of mine) {
        const grant = grantOf(request, target, now);
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
    onEnded: (ended) => ends.onEnded(ended),
    requestsOf(username) {
      return index.of(username).sort((a, b) => newestFirst(a, b));
    },
    pendingOf(username) {
      const now = clock.now();
      return index.of(username).filter((r) => isPending(r, now)).length;
    },
    close() {
      closed = true;
      ends.close();
      index.clear();
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

/**
 * The uid of each cluster a request names, as its approval records them: a Cluster's metadata.uid, the hub's ''. A
 * name that is no Cluster now (deleted meanwhile), or that both the hub and a Cluster go by, is left out: the grant
 * applies nowhere under it.
 */
export function clusterUIDsOf(
  settings: () => AccessSettings,
  clusterSpec: (name: string) => ClusterSpec | undefined,
  clusterUID: (name: string) => string | undefined,
): (clusters: readonly string[]) => Record<string, string> {
  return (clusters) => {
    const { hubName } = settings();
    const uids: Record<string, string> = {};
    for (const cluster of clusters) {
      if (cluster === hubName) {
        if (!clusterSpec(cluster)) uids[cluster] = '';
        continue;
      }
      const uid = clusterUID(cluster);
      if (uid) uids[cluster] = uid;
    }
    return uids;
  };
}
