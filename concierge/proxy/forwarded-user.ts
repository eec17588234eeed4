// A user's identity as forwarded to one cluster: the authenticated user, plus the groups of the access requests
// approved for them there, plus two extras that the cluster's own audit log shows: why they work
// (`sealion.dev/reason`: their credential's reason, else the newest grant's) and under which access requests
// (`sealion.dev/access-request`). Only Sealion sets those two keys: an authenticator's extras under them are dropped
// first, so no identity provider claim can pass for an approved request. What the groups may do is the cluster's RBAC.
import { ACCESS_REQUEST_EXTRA, REASON_EXTRA } from '../../apis/access.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';
import type { AccessGrants, Grant } from '../access/grants.ts';
import type { Refusal } from './exchange.ts';

/**
 * Whether an extra key is one Sealion alone sets. Matched without regard to case: `Sealion.dev/Reason` is another key
 * to the API server, but one an auditor reading the log would take for the same.
 */
export function isReservedExtra(key: string): boolean {
  const lower = key.toLowerCase();
  return lower === REASON_EXTRA || lower === ACCESS_REQUEST_EXTRA;
}

const EXTRA_HEADER = 'impersonate-extra-';

/**
 * The reserved extra a request asks to impersonate (an Impersonate-Extra-* header whose key, decoded as the API server
 * decodes it, is one of Sealion's), as Sealion spells it; undefined when it asks for none. Read from the raw headers,
 * whoever the caller is: a service account's impersonation goes to the API server as sent.
 */
export function forgedExtra(rawHeaders: readonly string[]): string | undefined {
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (!name.startsWith(EXTRA_HEADER)) continue;
    let key = name.slice(EXTRA_HEADER.length);
    try {
      key = decodeURIComponent(key);
    } catch {
      // Kept as sent, as the API server keeps a key it cannot decode.
    }
    if (isReservedExtra(key)) return key.toLowerCase();
  }
  return undefined;
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

/** What a user's target on a cluster gains from their grants and reason (decide.ts's Target fields). */
export interface Granted {
  /** The user as forwarded, when Sealion adds to it. */
  forwarded?: UserInfo;
  /** The access requests whose grants the request uses. */
  grants?: readonly string[];
  /** The cluster requires a reason and the user has none. */
  reasonMissing?: true;
}

/** Who is calling, as far as reasons go: a person (who can give one), or a hub workload or service account (who can't). */
type CallerKind = 'user' | 'workload' | 'serviceaccount';

/** The decide stage's questions about grants and reasons, answered from the access requests. */
export interface Granting {
  /**
   * What a user's identity on `cluster` ('' the hub) gains: their active grants there and a reason; or the refusal of
   * an identity that cannot be sent with them. A missing reason is noted, not refused: local APIs forward nothing.
   */
  granted(cluster: string, identity: { user: UserInfo; reason?: string }): Granted | Refusal;
  /** The user as forwarded to `cluster`, for the local APIs (no reason required: nothing is forwarded). */
  forwardedUser(cluster: string, identity: { user: UserInfo; reason?: string }): UserInfo;
  /** The refusal of a request without the reason its cluster requires, or undefined: it goes on. */
  reasonRefusal(
    target: { cluster: string; reasonMissing?: true },
    kind: CallerKind,
    attributes: RequestAttributes,
  ): Refusal | undefined;
}

/**
 * Discovery (what APIs the cluster serves, its version, its OpenAPI documents): answered without a reason where one is
 * required, since it shows no object and kubectl reads it before each command. Refused, kubectl would print only
 * "Forbidden: unknown" for its failed discovery; served, the command's own request gets the Status that says how to
 * give a reason, and kubectl prints that.
 */
const DISCOVERY = /^\/(?:api|apis|version|openapi)(?:\/|$)/;
const isDiscovery = (attributes: RequestAttributes): boolean =>
  !attributes.resourceRequest && attributes.verb === 'get' && DISCOVERY.test(attributes.path);

const where = (cluster: string): string => (cluster ? `cluster ${cluster}` : 'the hub');

export function newGranting(grants: AccessGrants): Granting {
  const forwardedUsers = newForwardedUsers();
  return {
    granted(cluster, identity) {
      const active = grants.active(identity.user.username, cluster);
      const reason = reasonOf(identity.reason, active);
      const forwarded = forwardedUsers(identity.user, reason, active);
      if ('problem' in forwarded)
        return {
          status: 403,
          message: `${cluster ? `cluster ${cluster}: ` : ''}your identity with its access requests and reason cannot be sent: ${forwarded.problem}`,
        };
      return {
        ...(forwarded.user === identity.user ? {} : { forwarded: forwarded.user }),
        ...(active.length > 0 ? { grants: active.map((g) => g.name) } : {}),
        ...(reason === undefined && grants.reasonRequired(cluster) ? { reasonMissing: true as const } : {}),
      };
    },
    forwardedUser(cluster, identity) {
      const active = grants.active(identity.user.username, cluster);
      const forwarded = forwardedUsers(identity.user, reasonOf(identity.reason, active), active);
      return 'user' in forwarded ? forwarded.user : identity.user;
    },
    reasonRefusal({ cluster, reasonMissing }, kind, attributes) {
      if (isDiscovery(attributes)) return undefined;
      if (reasonMissing)
        return {
          status: 403,
          message: `${where(cluster)} requires a reason for every request: run sealion login --reason "<why>" (or use an approved access request with a reason)`,
        };
      // A reason is a person's (their credential's, or their access request's): whoever else calls where one is
      // required is refused, whatever they may do there.
      if (kind !== 'user' && grants.reasonRequired(cluster))
        return {
          status: 403,
          message: `${where(cluster)} takes only requests with a reason, from people: ${kind === 'workload' ? 'a hub workload' : "a service account's token"} cannot carry one; sign in as yourself with sealion login --reason "<why>"`,
        };
      return undefined;
    },
  };
}
