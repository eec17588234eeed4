// The pipeline's decide stage: where a request goes (a Target: its cluster, the route there, and how to ask that
// cluster's API server) and how it is forwarded (a ForwardPlan: cleaned headers with the Impersonate-* headers
// decided), or the Status that refuses it. Every authorization question about a cluster is asked of that cluster.
import type { OutgoingHttpHeaders } from 'node:http';
import { groupSuffixOf, type ApiGroups } from '../../apis/groups.ts';
import { workloadAudience, type ClusterSpec } from '../../apis/tunnel.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import type { Logger } from '../../lib/log.ts';
import type { Request } from '../../lib/http2/request.ts';
import { newFairSemaphore, type FairLimits } from '../../lib/fair-semaphore.ts';
import {
  FORWARDED_AS,
  forwardedAs,
  forwardingRefusal,
  MalformedImpersonationError,
  requestedImpersonation,
  type Ask,
  type ForwardedAs,
  type RequestedImpersonation,
} from '../../lib/kube/impersonation.ts';
import { newReviewCache, ReviewUnavailable, type ReviewCache } from '../../lib/kube/review-cache.ts';
import { NO_GRANTS, type AccessGrants } from '../access/grants.ts';
import { askThrough } from './access-reviews.ts';
import type { Identity } from './authenticate.ts';
import { decideImpersonation } from './decide-impersonation.ts';
import { forgedExtra, newGranting } from './forwarded-user.ts';
import type { Refusal, RequestContext } from './exchange.ts';
import { cleanHeaders, impersonationHeaders, usernameOnlyHeaders } from './impersonate.ts';
import { requestAttributes, type RequestAttributes } from '../../lib/kube/request-info.ts';
import type { ClusterRouter, Route } from './route.ts';
import type { ForwardPlan } from './transport.ts';
import {
  mappedWorkload,
  originalUserInfo,
  reservedNameRefusal,
  serviceAccountTokenRefusal,
  WORKLOAD_ON_HUB,
  workloadPrefix,
} from './workload.ts';

/** Where a request goes, and whom its authorization questions are asked of. */
export interface Target {
  /** The cluster's name, or '' for the hub's own API server. */
  cluster: string;
  route: Route;
  /** Asks the cluster about a user (SubjectAccessReview). */
  ask: Ask;
  /** Asks the cluster whether the forwarding identity itself may do something (SelfSubjectAccessReview). */
  askSelf: Ask;
  /**
   * Whom the request comes from on the cluster when that is not the authenticated user: a hub workload's mapped
   * identity (workload.ts). Absent: the authenticated user.
   */
  actingAs?: UserInfo;
  /**
   * The cluster's workloads' usernamePrefix, when it takes them: a name or group behind it is a hub workload's
   * alone, so nobody may be impersonated under it (workload.ts reservedNameRefusal).
   */
  reservedPrefix?: string;
  /**
   * A user's identity there when Sealion adds to it (forwarded-user.ts): their active grants' groups on the cluster,
   * the reason and access-request extras. Absent: the authenticated user as it is (or the workload's `actingAs`).
   */
  forwarded?: UserInfo;
  /** The names of the access requests whose grants the request uses there; absent when none. */
  grants?: readonly string[];
  /** The cluster requires a reason for every request and the user has none: plan() refuses all but discovery. */
  reasonMissing?: true;
}

/**
 * The hub's reviews in flight and waiting: 64 at once for all users, 16 for one, and up to 1,024 waiting (256 for
 * one) at most 10 s. A decision asks a handful; one user with many requests in flight waits their turn, and a flood
 * is refused with 503 and Retry-After instead of piling reviews onto the API server.
 */
export const HUB_REVIEW_LIMITS: FairLimits = {
  capacity: 64,
  perKey: 16,
  maxQueued: 1024,
  maxQueuedPerKey: 256,
  maxWaitMs: 10_000,
};

/** What a refusal that mends by itself (a cluster that could not be asked) tells clients to wait. */
const RETRY_AFTER_SECONDS = 1;

/**
 * Where the answers about the forwarding identity itself are kept: per cluster, and per user, since each is asked
 * with the user's share of a tunnel (one user over their share must not fail another's request).
 */
const selfScope = (cluster: string, user: string): string => JSON.stringify([cluster, 'self', user]);

export interface DeciderDeps {
  groups: ApiGroups;
  reviewer: Reviewer;
  router: ClusterRouter;
  /** Authorization answers, per cluster. Default: a cache of its own (access-reviews.ts). */
  reviews?: ReviewCache;
  /** A Cluster's spec by name, for whether it takes hub workloads. Default: none is known (none takes them). */
  clusterSpec?: (name: string) => ClusterSpec | undefined;
  /**
   * The approved access requests, and which clusters require a reason (concierge/access). Default: NO_GRANTS (nobody
   * holds a grant, no cluster requires a reason).
   */
  grants?: AccessGrants;
  log: Logger;
}

/** A user who passed authentication. */
export type Authenticated = Exclude<Identity, { kind: 'anonymous' }>;

/**
 * The refusal of a request for a cluster nothing reaches now, found after every other check that needs no answer
 * from the cluster (its own checks, and the impersonation and reviews of the plan, come once it is reachable).
 */
export interface Unrouted extends Refusal {
  unrouted: true;
}

export interface Decider {
  /** Where a request for `cluster` ('' for the hub) goes and who decides about it, or why it cannot go. */
  target(cluster: string, identity: Authenticated): Target | Refusal | Unrouted;
  /**
   * A user's identity as it is forwarded to `cluster` ('' for the hub), grants and reason included; the user as it is
   * when nothing is added. What the local APIs (WhoAmIRequest) answer with.
   */
  forwardedUser(cluster: string, identity: Extract<Identity, { kind: 'user' }>): UserInfo;
  /** How the request is forwarded, as the target cluster decides; what was decided goes into `context`. */
  plan(
    req: Request,
    identity: Authenticated,
    longRunning: boolean,
    target: Target,
    context: RequestContext,
  ): Promise<ForwardPlan | Refusal>;
}

/**
 * The hub's own questions, asked of its API server with the concierge's identity: each user's in turn, a bounded
 * number at once (HUB_REVIEW_LIMITS), as a tunnel's fair queue bounds those asked of another cluster.
 */
function hubAsker(reviewer: Reviewer, reviews: ReviewCache): (user: string) => Ask {
  const hubReviews = newFairSemaphore(HUB_REVIEW_LIMITS);
  return (user) =>
    reviews.asking(
      '',
      (question) =>
        new Promise<boolean>((done, fail) => {
          hubReviews.acquire(
            user,
            (release) => {
              reviewer.allowed(question).then(
                (allowed) => {
                  release();
                  done(allowed);
                },
                (err: unknown) => {
                  release();
                  fail(
                    new ReviewUnavailable(
                      `the API server could not be asked: ${(err as Error).message}`,
                      err,
                    ),
                  );
                },
              );
            },
            (why) => fail(new ReviewUnavailable(`the API server could not be asked: ${why.message}`, why)),
          );
        }),
    );
}

/** A service account's own token, forwarded as it came: the API server authenticates it, and decides its impersonation. */
function passthroughPlan(
  req: Request,
  identity: Extract<Identity, { kind: 'serviceaccount' }>,
  longRunning: boolean,
  context: RequestContext,
): ForwardPlan {
  const headers = cleanHeaders(req.headers, true);
  headers['authorization'] = `Bearer ${identity.token}`;
  headers['audit-id'] = context.id;
  context.decision = 'passthrough';
  return { headers, longRunning, passthrough: true, user: identity.user.username };
}

/** The refusal of a request its cluster could not be asked about; a remote cluster's name starts it. */
function undecided(err: ReviewUnavailable, cluster: string): Refusal {
  return {
    status: err.status,
    message:
      err.status === 503
        ? `${cluster ? `cluster ${cluster}: ` : ''}the request could not be decided: ${err.message}; retry`
        : err.message,
    retryAfterSeconds: RETRY_AFTER_SECONDS,
  };
}

/**
 * Whom a caller who asked to impersonate someone is forwarded as, once the target cluster allowed it
 * (decide-impersonation.ts), with `original` (who really asked) among the extras; or why not.
 */
async function impersonated(
  asker: UserInfo,
  requested: RequestedImpersonation,
  attributes: RequestAttributes,
  target: Target,
  original: Record<string, string[]>,
): Promise<{ user: UserInfo; as: ForwardedAs; impersonation: Readonly<OutgoingHttpHeaders> } | Refusal> {
  const decision = await decideImpersonation(asker, requested, attributes, target.ask);
  if (!decision.allowed) return { status: decision.status, message: decision.message };
  const { user, usernameOnly } = decision.identity;
  const problem = identityProblem(user);
  if (problem) return { status: 400, message: `cannot impersonate this identity: ${problem}` };
  // Nobody, a workload included, becomes a name only a hub workload has (its own needs no impersonation).
  const reserved =
    target.reservedPrefix && reservedNameRefusal(target.cluster, target.reservedPrefix, user, true);
  if (reserved) return reserved;
  return {
    user,
    as: forwardedAs(user, usernameOnly),
    impersonation: usernameOnly
      ? usernameOnlyHeaders(user.username)
      : impersonationHeaders({ ...user, extra: { ...user.extra, ...original } }),
  };
}

/** A workload's identity on `cluster` ('' : the hub, where it has none), or why it has none there. */
function workloadIdentity(
  cluster: string,
  hubUser: UserInfo,
  spec: ClusterSpec | undefined,
  originalUserKey: string,
): UserInfo | Refusal {
  if (!cluster) return { status: 403, message: WORKLOAD_ON_HUB };
  const prefix = workloadPrefix(cluster, spec);
  if (typeof prefix !== 'string') return prefix;
  const mapped = mappedWorkload(hubUser, prefix, originalUserKey);
  const problem = identityProblem(mapped);
  return problem
    ? {
        status: 403,
        message: `cluster ${cluster}: the workload's mapped identity cannot be sent: ${problem}`,
      }
    : mapped;
}

export function newDecider(deps: DeciderDeps): Decider {
  const { groups, log } = deps;
  // A domain-prefixed key, as constrained impersonation requires of every extra it passes on.
  const originalUserKey = `impersonation-proxy.concierge.${groups.login.replace(/^login\.concierge\./, '')}/original-user-info`;

  const audience = workloadAudience(groupSuffixOf(groups));
  const reviews = deps.reviews ?? newReviewCache();
  const askHub = hubAsker(deps.reviewer, reviews);
  const granting = newGranting(deps.grants ?? NO_GRANTS);

  /**
   * Impersonated user for this request, or a Status to answer with. The caller's own Impersonate-* headers are
   * decided by the cluster the request is for (`target.ask`), mode by mode as the API server decides them.
   */
  async function forwardingPlan(
    req: Request,
    identity: Exclude<Identity, { kind: 'anonymous' }>,
    longRunning: boolean,
    target: Target,
    context: RequestContext,
  ): Promise<ForwardPlan | Refusal> {
    // A reason is a person's (their credential's, or their access request's: target() refuses a user without one):
    // whoever else calls where one is required is refused, whatever they may do there. Asked here, where a request is
    // forwarded, and not in target(), which also answers the local APIs, which forward nothing.
    const attributes = context.attributes ?? requestAttributes(req.method ?? 'GET', req.url ?? '/');
    const reasonless = granting.reasonRefusal(target, identity.kind, attributes);
    if (reasonless) return reasonless;
    // Nobody sets the reason or the access requests of whom they impersonate, even where the cluster would let them:
    // the cluster's audit log would show a reason or a grant nobody gave.
    const forged = forgedExtra(req.rawHeaders);
    if (forged)
      return {
        status: 403,
        message: `the extra ${forged} is set by Sealion only: impersonate without it (sealion login --reason gives your own requests a reason)`,
      };
    if (identity.kind === 'serviceaccount') return passthroughPlan(req, identity, longRunning, context);
    // A workload acts as its mapped identity, and is from here on decided exactly as a user is; a user with grants or
    // a reason, as forwarded: every question about them names the grants' groups, so no answer kept for the user
    // without them (review-cache.ts keys answers by the whole question) is taken for one with them, nor the reverse.
    const caller = target.actingAs ?? target.forwarded ?? identity.user;
    // Asked about without the extra that records its hub account: that extra names the token's credential id, so
    // asking with it would make every token a question (and a cached answer) of its own, and RBAC reads no extra.
    const asker = target.actingAs ? { ...target.actingAs, extra: {} } : caller;
    if (target.grants) context.grants = target.grants;
    let impersonation = impersonationHeaders(caller);
    let as = forwardedAs(caller, false);
    if (target.actingAs) context.impersonated = target.actingAs;
    let requested: RequestedImpersonation | undefined;
    try {
      requested = requestedImpersonation(req.rawHeaders);
    } catch (err) {
      if (!(err instanceof MalformedImpersonationError)) throw err;
      return { status: 400, message: `malformed impersonation headers: ${err.message}` };
    }
    try {
      if (requested) {
        // Who really asked, as the hub authenticated them: for a workload its hub account (and pod), not its mapping;
        // for a user, as forwarded (their grants' groups, their reason), since that is who was allowed to ask.
        const original = { [originalUserKey]: [originalUserInfo(target.actingAs ? identity.user : caller)] };
        const decided = await impersonated(asker, requested, attributes, target, original);
        if ('status' in decided) return decided;
        ({ as, impersonation } = decided);
        context.impersonated = decided.user;
      }
      const refused = await forwardingRefusal(target, attributes, as);
      if (refused) return refused;
    } catch (err) {
      if (!(err instanceof ReviewUnavailable)) throw err;
      log.warn({ err: err.message, cluster: target.cluster }, 'a request could not be decided');
      return undecided(err, target.cluster);
    }
    context.decision = FORWARDED_AS[as].mode ?? 'legacy';
    const headers = { ...cleanHeaders(req.headers), ...impersonation, 'audit-id': context.id };
    return { headers, longRunning, passthrough: false, user: identity.user.username };
  }

  /**
   * Where a request goes and who decides about it: the hub's own API server, or for `/clusters/<name>/…` that
   * cluster, reached through its agent; or the Status that says why it cannot go.
   */
  function targetOf(
    cluster: string,
    identity: Exclude<Identity, { kind: 'anonymous' }>,
  ): Target | Refusal | Unrouted {
    // The fair shares' key: the authenticated name (a workload's hub service account), before any mapping.
    const user = identity.user.username;
    // A service-account token for this cluster's API server means nothing to another one.
    if (cluster && identity.kind === 'serviceaccount')
      return serviceAccountTokenRefusal(cluster, user, audience);
    let actingAs: UserInfo | undefined;
    const prefix = cluster ? workloadPrefix(cluster, deps.clusterSpec?.(cluster)) : undefined;
    const reservedPrefix = typeof prefix === 'string' ? prefix : undefined;
    if (identity.kind === 'workload') {
      const mapped = workloadIdentity(cluster, identity.user, deps.clusterSpec?.(cluster), originalUserKey);
      if ('status' in mapped) return mapped;
      actingAs = mapped;
    }
    const granted = identity.kind === 'user' ? granting.granted(cluster, identity) : undefined;
    if (granted && 'status' in granted) return granted;
    if (identity.kind !== 'workload' && reservedPrefix) {
      // Anyone else under the prefix (a grant's group too) would pass for a hub workload there, and get its grants.
      const refused = reservedNameRefusal(
        cluster,
        reservedPrefix,
        granted?.forwarded ?? identity.user,
        false,
      );
      if (refused) return refused;
    }
    const route = deps.router.route(cluster);
    if (!route)
      return {
        status: 503,
        message: `cluster ${cluster} is not connected: its agent holds no tunnel to any concierge replica`,
        unrouted: true,
      };
    if (!cluster)
      return {
        cluster,
        route,
        ask: askHub(user),
        askSelf: reviews.asking(selfScope('', user), askThrough('', route, user, true)),
        ...granted,
      };
    return {
      cluster,
      route,
      ask: reviews.asking(cluster, askThrough(cluster, route, user)),
      askSelf: reviews.asking(`${cluster}\nself`, askThrough(cluster, route, user, true)),
      ...(actingAs ? { actingAs } : {}),
      ...(reservedPrefix ? { reservedPrefix } : {}),
      ...granted,
    };
  }

  return {
    target: targetOf,
    plan: forwardingPlan,
    forwardedUser: (cluster, identity) => granting.forwardedUser(cluster, identity),
  };
}
