// access.concierge.<suffix>/v1alpha1: AccessRequest, a user's request for named groups on named clusters for a
// while, with a reason. Sealion writes every one (the requester is whoever it authenticated; reviewers approve by the
// hub's RBAC); while one is approved and unexpired, the requester's requests to those clusters carry the groups, and
// each cluster's RBAC, and its grant to its agent, decide what they may do. Also here: the per-cluster access policy,
// and the extras a forwarded request carries its reason and grant in.
import type { ObjectMeta } from './meta.ts';

/** Who asked: the user Sealion authenticated, never a value the caller wrote. */
export interface AccessRequester {
  /** @maxLength 1024 */
  username: string;
  /** @maxLength 1024 */
  uid?: string;
  /**
   * The groups the requester had when asking.
   * @maxItems 256
   */
  groups?: string[];
}

/**
 * A request for groups on clusters, for a while. Created through Sealion (`sealion request create`, or a POST of the
 * object to the proxy), which fills in spec.requester from whoever it authenticated; spec never changes afterwards.
 */
export interface AccessRequestSpec {
  /**
   * The clusters the groups are asked for: Cluster names, and the hub by its name in the concierge config
   * (accessRequests.hubName, default `hub`).
   * @minItems 1
   * @maxItems 16
   * @validation self == oldSelf :: spec.clusters is immutable
   */
  clusters: string[];
  /**
   * The groups asked for; each must be one the policy of every cluster named lists.
   * @minItems 1
   * @maxItems 16
   * @validation self == oldSelf :: spec.groups is immutable
   */
  groups: string[];
  /**
   * How long the grant lasts once approved, in seconds; at most the smallest maxDurationSeconds of the clusters named.
   * @asType integer
   * @minimum 60
   * @maximum 604800
   * @validation self == oldSelf :: spec.durationSeconds is immutable
   */
  durationSeconds: number;
  /**
   * Why: an incident, a ticket. Printable characters only. Required when a cluster named requires a reason.
   * @maxLength 512
   * @validation self == oldSelf :: spec.reason is immutable
   */
  reason?: string;
  /**
   * Set by Sealion from the authenticated user; what a caller writes here is ignored.
   * @validation self == oldSelf :: spec.requester is immutable
   */
  requester: AccessRequester;
}

export type AccessRequestPhase = 'Pending' | 'Approved' | 'Denied' | 'Withdrawn' | 'Expired';
export type AccessDecision = 'Approved' | 'Denied' | 'Withdrawn';

/** One decision on a request: who, what, why, when. */
export interface AccessReview {
  /**
   * Who decided, as Sealion authenticated them.
   * @maxLength 1024
   */
  user: string;
  decision: AccessDecision;
  /** @maxLength 512 */
  reason?: string;
  /** @format date-time */
  time: string;
}

/** Written by Sealion only. */
export interface AccessRequestStatus {
  /** Pending until enough approvals (Approved) or one denial (Denied); Withdrawn by the requester; Expired at its end. */
  phase?: AccessRequestPhase;
  /**
   * Approvals the clusters' policies require (the largest of them).
   * @asType integer
   * @minimum 1
   * @maximum 16
   */
  approvalsRequired?: number;
  /**
   * Every decision, in order.
   * @maxItems 32
   */
  reviews?: AccessReview[];
  /**
   * When enough approvals were in.
   * @format date-time
   */
  approvedAt?: string;
  /**
   * When the grant ends (approvedAt + durationSeconds); for a pending request, when it lapses undecided.
   * @format date-time
   */
  expiresAt?: string;
  /**
   * The uid of each Cluster named, as it was at approval (the hub: ''): a grant applies only to the Cluster approved,
   * never to one deleted and made again under its name.
   * @maxProperties 16
   */
  clusterUIDs?: Record<string, string>;
  /**
   * Who holds the grant, for `kubectl get -o wide` (spec.requester.username).
   * @maxLength 1024
   */
  requester?: string;
  /** @maxLength 1024 */
  message?: string;
}

export interface AccessRequest {
  apiVersion: string;
  kind: 'AccessRequest';
  metadata: ObjectMeta;
  spec: AccessRequestSpec;
  status?: AccessRequestStatus;
}

/**
 * The body a reviewer or the requester POSTs to `accessrequests/<name>/approval` (Approved, Denied: a reviewer, by
 * the hub's RBAC verb `approve` on the request) or `accessrequests/<name>/withdrawal` (Withdrawn: the requester).
 */
export interface AccessRequestDecision {
  apiVersion: string;
  kind: 'AccessRequestDecision';
  decision: AccessDecision;
  reason?: string;
}

/** Who may ask for what on one cluster: on its Cluster's spec.access, and for the hub in the concierge config. */
export interface AccessPolicy {
  /**
   * The groups a user may ask for on this cluster. Empty or absent: no access requests for it.
   * @maxItems 64
   */
  groups?: string[];
  /**
   * The longest grant, in seconds. Default: 3600.
   * @asType integer
   * @minimum 60
   * @maximum 604800
   */
  maxDurationSeconds?: number;
  /**
   * How many reviewers (none of them the requester) must approve. Default: 1.
   * @asType integer
   * @minimum 1
   * @maximum 16
   */
  approvals?: number;
  /**
   * Every request to this cluster must carry a reason (`sealion login --reason`, or that of a grant in use), and so
   * must every access request for it. Default: false.
   */
  requireReason?: boolean;
}

/** The RBAC verb on accessrequests (the hub's) that lets a user approve or deny one, as `approve` on signers does for CSRs. */
export const APPROVE_VERB = 'approve';
/** The resource, in RBAC rules and URLs. */
export const ACCESS_REQUESTS = 'accessrequests';
/** The subresources Sealion serves itself: a reviewer's decision, and the requester's withdrawal. */
export const APPROVAL_SUBRESOURCE = 'approval';
export const WITHDRAWAL_SUBRESOURCE = 'withdrawal';

/** The hub's name in access requests and its policy, unless the concierge config names it otherwise. */
export const DEFAULT_ACCESS_HUB_NAME = 'hub';
/** The default longest grant, and the longest any policy may allow (a week). */
export const DEFAULT_MAX_DURATION_SECONDS = 3600;
export const MAX_DURATION_SECONDS = 604_800;
/** How long a request may wait for its reviewers before it lapses (Expired). */
export const PENDING_LIFETIME_SECONDS = 86_400;
/**
 * Requests one user may hold at once, in any phase (ended ones are deleted a day after they end): more are refused
 * (429), so that no one user fills the hub's store and every replica's informer. What selfaccessrequests answers at most.
 */
export const MAX_REQUESTS_PER_USER = 50;
/** Requests one user may have pending at once; more are refused (429) until some are decided or lapse. */
export const MAX_PENDING_PER_USER = 10;
/** The longest reason, in characters. */
export const MAX_REASON_LENGTH = 512;

/**
 * The extras a forwarded request carries, so each cluster's own audit log shows why and under which grant: set by
 * Sealion only (an authenticator's own extras under these keys are dropped).
 */
export const REASON_EXTRA = 'sealion.dev/reason';
export const ACCESS_REQUEST_EXTRA = 'sealion.dev/access-request';

/**
 * Why `reason` cannot be used, or undefined: at most MAX_REASON_LENGTH characters, none of them a control character
 * (C0, DEL, C1) or a line or paragraph separator, and not only spaces. Said of the value, never echoing it.
 */
export function reasonProblem(reason: unknown): string | undefined {
  if (typeof reason !== 'string') return 'must be a string';
  if ([...reason].length > MAX_REASON_LENGTH) return `must be at most ${MAX_REASON_LENGTH} characters`;
  if (!reason.isWellFormed()) return 'must be well-formed Unicode text';
  // Control (Cc: C0, DEL, C1), format (Cf: bidi overrides and isolates, zero-width characters), private-use (Co),
  // unassigned (Cn) and line or paragraph separators: what would make a reviewer's table, a terminal or an audit log
  // show other text than the one stored.
  if (/[\p{Cc}\p{Cf}\p{Co}\p{Cn}\p{Zl}\p{Zp}]/u.test(reason))
    return 'must not contain control characters (a newline, a tab, an escape), format characters (a bidi override, a zero-width space) or unassigned ones';
  if (reason.trim() === '') return 'must not be empty';
  return undefined;
}
