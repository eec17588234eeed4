// A user's identity as forwarded to one cluster: the authenticated user, plus the groups of the access requests
// approved for them there, plus two extras that the cluster's own audit log shows: why they work
// (`sealion.dev/reason`: their credential's reason, else the newest grant's) and under which access requests
// (`sealion.dev/access-request`). Only Sealion sets those two keys: an authenticator's extras under them are dropped
// first, so no identity provider claim can pass for an approved request. What the groups may do is the cluster's RBAC.
import { ACCESS_REQUEST_EXTRA, REASON_EXTRA } from '../../apis/access.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Grant } from '../access/grants.ts';

/**
 * Whether an extra key is one Sealion alone sets. Matched without regard to case: `Sealion.dev/Reason` is another key
 * to the API server, but one an auditor reading the log would take for the same.
 */
export function isReservedExtra(key: string): boolean {
  const lower = key.toLowerCase();
  return lower === REASON_EXTRA || lower === ACCESS_REQUEST_EXTRA;
}

/** The forwarded user, or why it cannot be sent (a grant's group or a reason HTTP headers cannot carry as it is). */
export type Forwarded = { user: UserInfo } | { problem: string };

/**
 * Users built, per authenticated user object, up to this many each (the oldest goes first). The authenticators hand
 * out one user object per credential (cached token answers, a connection's certificate), and impersonate.ts keeps
 * their Impersonate-* headers by object: returning the same built object for the same grants keeps those headers
 * built once, instead of once per request. A user has a handful of grants and reasons at most; the bound only stops
 * a user whose grants change without end from growing the entry.
 */
const MAX_KEPT_PER_USER = 8;

/**
 * `user` as forwarded with `reason` (undefined: none) and `grants` (the active ones on the cluster): the user itself
 * when there is nothing to add or drop, else a new object, the same one for the same inputs while it is kept.
 */
export type ForwardedUsers = (
  user: UserInfo,
  reason: string | undefined,
  grants: readonly Grant[],
) => Forwarded;

export function newForwardedUsers(): ForwardedUsers {
  // Weak: an entry goes with its authenticated user object, which goes when its credential's cache entry does.
  const kept = new WeakMap<UserInfo, Map<string, Forwarded>>();
  return (user, reason, grants) => {
    if (reason === undefined && grants.length === 0 && !Object.keys(user.extra).some(isReservedExtra))
      return { user };
    const key = JSON.stringify([reason ?? null, grants.map((g) => [g.name, g.groups])]);
    let mine = kept.get(user);
    const known = mine?.get(key);
    if (known) return known;
    const built = build(user, reason, grants);
    if (!mine) kept.set(user, (mine = new Map<string, Forwarded>()));
    if (mine.size >= MAX_KEPT_PER_USER) mine.delete(mine.keys().next().value!);
    mine.set(key, built);
    return built;
  };
}

function build(user: UserInfo, reason: string | undefined, grants: readonly Grant[]): Forwarded {
  const extra = Object.fromEntries(Object.entries(user.extra).filter(([key]) => !isReservedExtra(key)));
  if (reason !== undefined) extra[REASON_EXTRA] = [reason];
  if (grants.length > 0) extra[ACCESS_REQUEST_EXTRA] = grants.map((g) => g.name);
  const groups = [...new Set([...user.groups, ...grants.flatMap((g) => g.groups)])];
  const forwarded: UserInfo = { ...user, groups, extra };
  const problem = identityProblem(forwarded);
  return problem ? { problem } : { user: forwarded };
}

/** The reason a request carries: the credential's, else the first grant's that has one (grants come newest first). */
export function reasonOf(own: string | undefined, grants: readonly Grant[]): string | undefined {
  return own ?? grants.find((g) => g.reason)?.reason;
}
