// The rules of access requests, as pure functions of what they read: whether a new request may be made (what the
// clusters' policies allow, what the caller may write), and what a decision (approval, denial, withdrawal) does to a
// request's status. The local APIs (api.ts) feed them what they read from the API and write what they answer.
import {
  DEFAULT_MAX_DURATION_SECONDS,
  MAX_DURATION_SECONDS,
  MAX_PENDING_PER_USER,
  MAX_REQUESTS_PER_USER,
  PENDING_LIFETIME_SECONDS,
  reasonProblem,
  type AccessDecision,
  type AccessPolicy,
  type AccessRequest,
  type AccessRequestStatus,
  type AccessReview,
} from '../../apis/access.ts';
import { isDNSSubdomain } from '../../apis/names.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Refusal } from '../../lib/kube/status.ts';

/** The longest list of clusters or groups a request may name (the CRD's maxItems). */
export const MAX_NAMES = 16;
/** The longest group name a request may ask for. */
const MAX_GROUP_LENGTH = 256;
/** The prefix of a request's generated name. */
export const GENERATED_NAME_PREFIX = 'access-';
const MIN_DURATION_SECONDS = 60;
const DEFAULT_APPROVALS = 1;

/** What a cluster's name in a request stands for: its policy, or why it cannot be asked for. */
export type PolicyAnswer = { policy: AccessPolicy } | { problem: string };

/** What the checks of a new request read. */
export interface NewRequestContext {
  /** The access group's apiVersion (access.concierge.<suffix>/v1alpha1). */
  apiVersion: string;
  /** The caller, as Sealion authenticated them. */
  user: UserInfo;
  /** The policy of a cluster a request names (the hub's by its name, a Cluster's), or why there is none. */
  policyOf: (cluster: string) => PolicyAnswer;
  /** The caller's requests pending now (this replica's view, and its creates under way). */
  pending: number;
  /** The caller's requests the hub holds now, in any phase (the same view). */
  held: number;
  now: number;
}

/** Whether a rule's answer is a refusal (a Status to answer with) rather than what it made. */
export const isRefusal = (answer: object): answer is Refusal =>
  typeof (answer as { status?: unknown }).status === 'number';

const refusal = (status: number, message: string, retryAfterSeconds?: number): Refusal => ({
  status,
  message,
  ...(retryAfterSeconds === undefined ? {} : { retryAfterSeconds }),
});

const isObject = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** A list of 1..MAX_NAMES distinct strings, each passing `valid`; or why not. */
function namesOf(
  field: string,
  value: unknown,
  valid: (name: string) => boolean,
  what: string,
): string[] | string {
  if (!Array.isArray(value) || value.length === 0) return `${field} must list at least one ${what}`;
  if (value.length > MAX_NAMES) return `${field} may list at most ${MAX_NAMES} ${what}s`;
  const names: string[] = [];
  for (const name of value) {
    if (typeof name !== 'string' || !valid(name))
      return `${field} must hold ${what} names; ${JSON.stringify(String(name)).slice(0, 80)} is not one`;
    if (!names.includes(name)) names.push(name);
  }
  return names;
}

const isGroupName = (name: string): boolean =>
  name.length > 0 && name.length <= MAX_GROUP_LENGTH && reasonProblem(name) === undefined;

/** The body's fields a request is made of, read as hostile input; or a 400/422 saying which field is wrong. */
function readBody(
  body: unknown,
  apiVersion: string,
):
  | { name?: string; clusters: string[]; groups: string[]; durationSeconds: number; reason?: string }
  | Refusal {
  if (!isObject(body)) return refusal(400, 'the body must be an AccessRequest object');
  if (body['apiVersion'] !== undefined && body['apiVersion'] !== apiVersion)
    return refusal(400, `apiVersion must be ${apiVersion}`);
  if (body['kind'] !== undefined && body['kind'] !== 'AccessRequest')
    return refusal(400, 'kind must be AccessRequest');
  const metadata = body['metadata'] ?? {};
  if (!isObject(metadata)) return refusal(400, 'metadata must be an object');
  const name = metadata['name'];
  if (name !== undefined && (typeof name !== 'string' || !isDNSSubdomain(name)))
    return refusal(422, 'metadata.name must be a DNS subdomain (lower-case letters, digits, - and .)');
  const spec = body['spec'];
  if (!isObject(spec)) return refusal(422, 'spec is required: clusters, groups, durationSeconds, reason');
  const clusters = namesOf('spec.clusters', spec['clusters'], isDNSSubdomain, 'cluster');
  if (typeof clusters === 'string') return refusal(422, clusters);
  const groups = namesOf('spec.groups', spec['groups'], isGroupName, 'group');
  if (typeof groups === 'string') return refusal(422, groups);
  const duration = spec['durationSeconds'];
  if (
    typeof duration !== 'number' ||
    !Number.isInteger(duration) ||
    duration < MIN_DURATION_SECONDS ||
    duration > MAX_DURATION_SECONDS
  )
    return refusal(
      422,
      `spec.durationSeconds must be a whole number of seconds from ${MIN_DURATION_SECONDS} to ${MAX_DURATION_SECONDS}`,
    );
  const reason = spec['reason'];
  if (reason !== undefined) {
    const problem = reasonProblem(reason);
    if (problem) return refusal(422, `spec.reason ${problem}`);
  }
  return {
    ...(name === undefined ? {} : { name }),
    clusters,
    groups,
    durationSeconds: duration,
    ...(reason === undefined ? {} : { reason: reason as string }),
  };
}

/** What the clusters' policies together allow: every one's groups, the smallest duration, the most approvals. */
function combinedPolicy(
  clusters: readonly string[],
  policyOf: NewRequestContext['policyOf'],
): { policies: { cluster: string; policy: AccessPolicy }[] } | Refusal {
  const policies: { cluster: string; policy: AccessPolicy }[] = [];
  for (const cluster of clusters) {
    const answer = policyOf(cluster);
    if ('problem' in answer) return refusal(422, answer.problem);
    policies.push({ cluster, policy: answer.policy });
  }
  return { policies };
}

/**
 * The AccessRequest to create for `body`, or the refusal to answer with. The requester is the caller, whatever the
 * body says; its status is Pending until PENDING_LIFETIME_SECONDS from now.
 */
export function newAccessRequest(body: unknown, ctx: NewRequestContext): AccessRequest | Refusal {
  const read = readBody(body, ctx.apiVersion);
  if (isRefusal(read)) return read;
  const combined = combinedPolicy(read.clusters, ctx.policyOf);
  if (isRefusal(combined)) return combined;
  const { policies } = combined;
  for (const { cluster, policy } of policies) {
    const allowed = policy.groups ?? [];
    if (allowed.length === 0)
      return refusal(403, `cluster ${cluster} takes no access requests (its access policy lists no groups)`);
    const missing = read.groups.filter((g) => !allowed.includes(g));
    if (missing.length > 0)
      return refusal(
        403,
        `cluster ${cluster}'s access policy does not list ${missing.map((g) => JSON.stringify(g)).join(', ')}; ` +
          `it lists ${allowed.map((g) => JSON.stringify(g)).join(', ')}`,
      );
  }
  const longest = Math.min(
    ...policies.map(({ policy }) => policy.maxDurationSeconds ?? DEFAULT_MAX_DURATION_SECONDS),
  );
  if (read.durationSeconds > longest)
    return refusal(
      403,
      `spec.durationSeconds ${read.durationSeconds} is over the longest grant the clusters allow, ${longest}; ask for less`,
    );
  const needReason = policies.filter(({ policy }) => policy.requireReason).map(({ cluster }) => cluster);
  if (needReason.length > 0 && read.reason === undefined)
    return refusal(422, `spec.reason is required: cluster ${needReason.join(', ')} requires a reason`);
  if (ctx.pending >= MAX_PENDING_PER_USER)
    return refusal(
      429,
      `you have ${ctx.pending} access requests pending, the most one user may have; withdraw one or wait for a decision`,
      PENDING_RETRY_SECONDS,
    );
  if (ctx.held >= MAX_REQUESTS_PER_USER)
    return refusal(
      429,
      `you hold ${ctx.held} access requests, the most one user may; withdraw one, or wait a day for ended ones to be deleted`,
      PENDING_RETRY_SECONDS,
    );
  const approvals = Math.max(...policies.map(({ policy }) => policy.approvals ?? DEFAULT_APPROVALS));
  const { user } = ctx;
  return {
    apiVersion: ctx.apiVersion,
    kind: 'AccessRequest',
    metadata: read.name
      ? { name: read.name }
      : ({ generateName: GENERATED_NAME_PREFIX } as { name?: string }),
    spec: {
      clusters: read.clusters,
      groups: read.groups,
      durationSeconds: read.durationSeconds,
      ...(read.reason === undefined ? {} : { reason: read.reason }),
      requester: {
        username: user.username,
        ...(user.uid ? { uid: user.uid } : {}),
        ...(user.groups.length > 0 ? { groups: user.groups.slice(0, 256) } : {}),
      },
    },
    status: {
      phase: 'Pending',
      approvalsRequired: approvals,
      reviews: [],
      expiresAt: rfc3339(ctx.now + PENDING_LIFETIME_SECONDS * 1000),
      requester: user.username,
    },
  };
}

/** How long a caller over the pending bound is told to wait: a reviewer's decision takes minutes. */
const PENDING_RETRY_SECONDS = 60;

/** RFC 3339 in UTC to the second, as metav1.Time. */
export function rfc3339(ms: number): string {
  return new Date(Math.floor(ms / 1000) * 1000).toISOString().replace('.000Z', 'Z');
}

/** A time field as ms since the epoch; NaN when absent or unreadable. */
export const timeOf = (text: string | undefined): number => (text ? Date.parse(text) : NaN);

/** Whether a request counts against its requester's pending bound at `now`. */
export function isPending(request: AccessRequest, now: number): boolean {
  const phase = request.status?.phase ?? 'Pending';
  if (phase !== 'Pending') return false;
  const ends = timeOf(request.status?.expiresAt);
  return Number.isNaN(ends) || now < ends;
}

/** A decision as its POST body says it; or the 400/422 to answer with. */
export function readDecision(
  body: unknown,
  apiVersion: string,
  allowed: readonly AccessDecision[],
): { decision: AccessDecision; reason?: string } | Refusal {
  if (!isObject(body)) return refusal(400, 'the body must be an AccessRequestDecision object');
  if (body['apiVersion'] !== undefined && body['apiVersion'] !== apiVersion)
    return refusal(400, `apiVersion must be ${apiVersion}`);
  if (body['kind'] !== undefined && body['kind'] !== 'AccessRequestDecision')
    return refusal(400, 'kind must be AccessRequestDecision');
  const decision = body['decision'];
  if (typeof decision !== 'string' || !allowed.includes(decision as AccessDecision))
    return refusal(422, `decision must be ${allowed.join(' or ')}`);
  const reason = body['reason'];
  if (reason !== undefined) {
    const problem = reasonProblem(reason);
    if (problem) return refusal(422, `reason ${problem}`);
  }
  return {
    decision: decision as AccessDecision,
    ...(reason === undefined ? {} : { reason: reason as string }),
  };
}

/** Whether `user` is who made `request`. */
export const isRequester = (request: AccessRequest, user: string): boolean =>
  request.spec.requester.username === user;

/**
 * The status after a reviewer's decision (Approved or Denied), or the refusal. Only a pending, unlapsed request can be
 * decided; never by its requester; once per reviewer. Enough approvals make it Approved from now for its duration, on
 * the Clusters `clusterUIDs` names (their uids now, the hub's ''); one denial makes it Denied, and so does a denial of
 * an approved, unexpired one (revoked).
 */
export function reviewed(
  request: AccessRequest,
  reviewer: string,
  decision: { decision: AccessDecision; reason?: string },
  now: number,
  clusterUIDs: Record<string, string> = {},
): AccessRequestStatus | Refusal {
  const name = request.metadata.name ?? '';
  if (isRequester(request, reviewer))
    return refusal(
      403,
      decision.decision === 'Approved'
        ? 'you cannot approve your own request'
        : 'you cannot deny your own request; withdraw it instead (sealion request withdraw)',
    );
  const status = request.status ?? {};
  const phase = status.phase;
  if (phase === undefined)
    return refusal(409, `access request ${name} is still being created; retry in a moment`, 1);
  if (phase === 'Approved' && decision.decision === 'Denied')
    return revoked(request, reviewer, decision, now);
  if (phase !== 'Pending')
    return refusal(
      409,
      phase === 'Approved'
        ? `access request ${name} is Approved already; a reviewer may still deny it, which revokes the grant`
        : `access request ${name} is ${phase}; only a pending request can be decided`,
    );
  if (!isPending(request, now))
    return refusal(409, `access request ${name} lapsed undecided; the requester can ask again`);
  const reviews = status.reviews ?? [];
  if (reviews.some((r) => r.user === reviewer))
    return refusal(409, `you have already reviewed access request ${name}; one review per reviewer`);
  const review: AccessReview = {
    user: reviewer,
    decision: decision.decision,
    ...(decision.reason === undefined ? {} : { reason: decision.reason }),
    time: rfc3339(now),
  };
  const next: AccessRequestStatus = { ...status, reviews: [...reviews, review] };
  if (decision.decision === 'Denied') return { ...next, phase: 'Denied', message: `denied by ${reviewer}` };
  const approvals = next.reviews!.filter((r) => r.decision === 'Approved').length;
  if (approvals < (status.approvalsRequired ?? DEFAULT_APPROVALS))
    return { ...next, message: `${approvals} of ${status.approvalsRequired} approvals` };
  return {
    ...next,
    phase: 'Approved',
    approvedAt: rfc3339(now),
    clusterUIDs,
    expiresAt: rfc3339(now + request.spec.durationSeconds * 1000),
    message: `approved by ${next
      .reviews!.filter((r) => r.decision === 'Approved')
      .map((r) => r.user)
      .join(', ')}`,
  };
}

/**
 * The status after a reviewer denies an approved request: its grant ends now (Denied), the review saying who and why.
 * Any reviewer may, one who approved it too: an approval given by mistake is taken back the same way. An expired grant
 * has nothing left to revoke.
 */
function revoked(
  request: AccessRequest,
  reviewer: string,
  decision: { decision: AccessDecision; reason?: string },
  now: number,
): AccessRequestStatus | Refusal {
  const name = request.metadata.name ?? '';
  const status = request.status ?? {};
  if (!(now < timeOf(status.expiresAt)))
    return refusal(409, `access request ${name}'s grant is over; there is nothing to revoke`);
  const review: AccessReview = {
    user: reviewer,
    decision: 'Denied',
    ...(decision.reason === undefined ? {} : { reason: decision.reason }),
    time: rfc3339(now),
  };
  return {
    ...status,
    phase: 'Denied',
    reviews: [...(status.reviews ?? []), review],
    message: `revoked by ${reviewer}`,
  };
}

/** The status after the requester withdraws a pending or approved (unexpired) request, or the refusal. */
export function withdrawn(
  request: AccessRequest,
  user: string,
  reason: string | undefined,
  now: number,
): AccessRequestStatus | Refusal {
  const name = request.metadata.name ?? '';
  if (!isRequester(request, user))
    return refusal(403, `only the requester of access request ${name} may withdraw it`);
  const status = request.status ?? {};
  const phase = status.phase ?? 'Pending';
  const ends = timeOf(status.expiresAt);
  const live = (phase === 'Pending' || phase === 'Approved') && !(now >= ends);
  if (!live)
    return refusal(
      409,
      `access request ${name} is ${phase === 'Pending' || phase === 'Approved' ? 'over' : phase}; there is nothing to withdraw`,
    );
  const review: AccessReview = {
    user,
    decision: 'Withdrawn',
    ...(reason === undefined ? {} : { reason }),
    time: rfc3339(now),
  };
  return {
    ...status,
    phase: 'Withdrawn',
    reviews: [...(status.reviews ?? []), review],
    message: 'withdrawn by the requester',
  };
}

/** The status of a request whose grant or wait is over at `now` (phase Expired), or undefined when it is not over. */
export function expired(request: AccessRequest, now: number): AccessRequestStatus | undefined {
  const status = request.status;
  if (!status?.phase || (status.phase !== 'Pending' && status.phase !== 'Approved')) return undefined;
  const ends = timeOf(status.expiresAt);
  if (Number.isNaN(ends) || now < ends) return undefined;
  return {
    ...status,
    phase: 'Expired',
    message:
      status.phase === 'Approved' ? 'the grant ran its time' : 'no decision came before the request lapsed',
  };
}
