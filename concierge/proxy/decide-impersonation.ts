// A caller's own Impersonate-* headers, decided as the API server decides them (k8s.io/apiserver's impersonation
// filter at the pinned release, with constrained impersonation, KEP-5284, on as 1.36 has it by default). Five modes,
// tried in this order, the first that allows wins:
//
// - associated-node: a service account acting as the node its pod runs on;
// - arbitrary-node, serviceaccount: any node, any service account, named by username alone;
// - user-info: any other user, with groups, uid and extra (never system:masters, an empty group, or a malformed extra);
// - legacy: the `impersonate` verb, with none of those limits.
//
// A constrained mode needs `impersonate-on:<mode>:<verb>` on what the request does, then `impersonate:<mode>` on each
// part of the identity (in API group authentication.k8s.io); legacy needs `impersonate` on each part. When no mode
// allows, the answer is the first refusal in that order. Every question is a SubjectAccessReview the caller passes
// in (`ask`), so the cluster the request is for answers them: this module only knows the rules.
import type { AccessQuestion } from '../../lib/kube/access-review.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import {
  extraProblem,
  MASTERS,
  nodeOf,
  serviceAccountOf,
  type Ask,
  type RequestedImpersonation,
} from '../../lib/kube/impersonation.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';

export type ImpersonationMode =
  'associated-node' | 'arbitrary-node' | 'serviceaccount' | 'user-info' | 'legacy';

/** The order the API server tries the modes in. */
export const IMPERSONATION_MODES: readonly ImpersonationMode[] = [
  'associated-node',
  'arbitrary-node',
  'serviceaccount',
  'user-info',
  'legacy',
];

/** Whom the request acts as once allowed, and the mode that allowed it. */
export interface ImpersonatedIdentity {
  user: UserInfo;
  mode: ImpersonationMode;
  /**
   * The identity is a service account or a node named by username alone, with the groups the API server gives such
   * a name itself: it is forwarded as Impersonate-User only, which the constrained service-account and node modes
   * require of whoever forwards it.
   */
  usernameOnly: boolean;
}

export type ImpersonationDecision =
  { allowed: true; identity: ImpersonatedIdentity } | { allowed: false; status: number; message: string };

const AUTHENTICATION_GROUP = 'authentication.k8s.io';
const AUTHENTICATED = 'system:authenticated';
const UNAUTHENTICATED = 'system:unauthenticated';
const ANONYMOUS = 'system:anonymous';
const NODES_GROUP = 'system:nodes';
const NODE_NAME_EXTRA = 'authentication.kubernetes.io/node-name';
const ASSOCIATED_NODE_KEYS_EXTRA = 'authentication.kubernetes.io/associated-node-keys';
/** As many groups or extra values as this are first tried with one wildcard question (constrained modes only). */
const MANY_CHECKS = 4;

/** The groups every service account of `namespace` is in. */
const serviceAccountGroups = (namespace: string): string[] => [
  'system:serviceaccounts',
  `system:serviceaccounts:${namespace}`,
];

const onlyUsername = (w: RequestedImpersonation): boolean =>
  !w.uid && w.groups.length === 0 && Object.keys(w.extra).length === 0;

/** The API server's Forbidden message for a question it refused (ForbiddenStatusError, then NewForbidden). */
export function forbiddenMessage(q: AccessQuestion, reason = ''): string {
  let msg = `User ${JSON.stringify(q.user)} cannot ${q.verb}`;
  if (q.path === undefined) {
    const resource = q.subresource ? `${q.resource ?? ''}/${q.subresource}` : (q.resource ?? '');
    msg += ` resource ${JSON.stringify(resource)} in API group ${JSON.stringify(q.group ?? '')}`;
    msg += q.namespace ? ` in the namespace ${JSON.stringify(q.namespace)}` : ' at the cluster scope';
  } else msg += ` path ${JSON.stringify(q.path)}`;
  if (reason) msg += `: ${reason}`;
  const group = q.path === undefined ? (q.group ?? '') : '';
  const resource = q.path === undefined ? (q.resource ?? '') : '';
  const qualified = group ? `${resource}.${group}` : resource;
  if (!qualified) return `forbidden: ${msg}`;
  return q.name
    ? `${qualified} ${JSON.stringify(q.name)} is forbidden: ${msg}`
    : `${qualified} is forbidden: ${msg}`;
}

/**
 * One step of a mode: a refusal found without asking, or questions that must all be allowed (or, when `wildcard`
 * is given and allowed, none of them need be).
 */
type Step =
  { refuse: AccessQuestion; reason: string } | { each: AccessQuestion[]; wildcard?: AccessQuestion };

interface ModePlan {
  steps: Step[];
  user: UserInfo;
  usernameOnly: boolean;
}

/** The caller as SubjectAccessReviews name it: as the API server sees them, with system:authenticated. */
function subject(caller: UserInfo): Pick<AccessQuestion, 'user' | 'groups' | 'extra' | 'uid'> {
  return {
    user: caller.username,
    groups: caller.groups.includes(AUTHENTICATED) ? caller.groups : [...caller.groups, AUTHENTICATED],
    extra: caller.extra,
    ...(caller.uid ? { uid: caller.uid } : {}),
  };
}

/** What the request does, as a question with another verb. */
function onRequest(
  who: Pick<AccessQuestion, 'user' | 'groups' | 'extra' | 'uid'>,
  verb: string,
  attributes: RequestAttributes,
): AccessQuestion {
  if (!attributes.resourceRequest) return { ...who, verb, path: attributes.path };
  const { group, version, resource, subresource, namespace, name } = attributes;
  return {
    ...who,
    verb,
    group,
    version,
    resource,
    ...(subresource ? { subresource } : {}),
    ...(namespace ? { namespace } : {}),
    ...(name ? { name } : {}),
  };
}

/** The groups the API server ends with (ensureGroup): everybody but the anonymous is authenticated. */
function finalGroups(username: string, groups: string[]): string[] {
  const wanted = username === ANONYMOUS ? UNAUTHENTICATED : AUTHENTICATED;
  if (username !== ANONYMOUS && groups.includes(UNAUTHENTICATED)) return groups;
  return groups.includes(wanted) ? groups : [...groups, wanted];
}

/** The steps of one mode for this caller, identity and request; undefined when the mode does not apply. */
function planMode(
  mode: ImpersonationMode,
  caller: UserInfo,
  wanted: RequestedImpersonation & { user: string },
  attributes: RequestAttributes,
): ModePlan | undefined {
  const constrained = mode !== 'legacy';
  let who = subject(caller);
  const node = nodeOf(wanted.user);
  const sa = serviceAccountOf(wanted.user);
  switch (mode) {
    case 'associated-node': {
      const values = caller.extra[NODE_NAME_EXTRA];
      const associated =
        node !== undefined && serviceAccountOf(caller.username) && values?.length === 1 && values[0] === node;
      if (!onlyUsername(wanted) || !associated) return undefined;
      // The API server asks with the caller's extra reduced to its keys, and for every node at once (its cache
      // key): the answer must not depend on which node the pod runs on.
      who = { ...who, extra: { [ASSOCIATED_NODE_KEYS_EXTRA]: Object.keys(caller.extra).sort() } };
      break;
    }
    case 'arbitrary-node':
      if (!onlyUsername(wanted) || node === undefined) return undefined;
      break;
    case 'serviceaccount':
      if (!onlyUsername(wanted) || !sa) return undefined;
      break;
    case 'user-info':
      if (node !== undefined || sa) return undefined;
      break;
    case 'legacy':
      break;
  }
  const verb = constrained ? `impersonate:${mode}` : 'impersonate';
  const userGroup = constrained ? AUTHENTICATION_GROUP : '';
  const ask = (resource: string, name: string, more: Partial<AccessQuestion> = {}): AccessQuestion => ({
    ...who,
    verb,
    group: resource === 'uids' || resource === 'userextras' ? AUTHENTICATION_GROUP : userGroup,
    version: 'v1',
    resource,
    name: mode === 'associated-node' && verb === 'impersonate:associated-node' ? '*' : name,
    ...more,
  });
  const steps: Step[] = [];
  if (constrained)
    steps.push({ each: [onRequest(who, `impersonate-on:${mode}:${attributes.verb}`, attributes)] });

  let groups = wanted.groups;
  let usernameOnly = false;
  if (constrained && node !== undefined) {
    steps.push({ each: [ask('nodes', node)] });
    groups = [NODES_GROUP];
    usernameOnly = true;
  } else if (sa) {
    steps.push({ each: [ask('serviceaccounts', sa.name, { namespace: sa.namespace })] });
    if (wanted.groups.length === 0) {
      groups = serviceAccountGroups(sa.namespace);
      usernameOnly = !wanted.uid && Object.keys(wanted.extra).length === 0;
    }
  } else {
    steps.push({ each: [ask('users', wanted.user)] });
  }
  if (wanted.uid) steps.push({ each: [ask('uids', wanted.uid)] });
  if (wanted.groups.length > 0) {
    const groupQuestion = ask('groups', '');
    if (constrained && wanted.groups.includes(''))
      steps.push({ refuse: groupQuestion, reason: 'impersonating the empty string group is not allowed' });
    else if (constrained && wanted.groups.includes(MASTERS))
      steps.push({
        refuse: { ...groupQuestion, name: MASTERS },
        reason: 'impersonating the system:masters group is not allowed',
      });
    else
      steps.push({
        each: wanted.groups.map((g) => ask('groups', g)),
        ...(constrained && wanted.groups.length >= MANY_CHECKS ? { wildcard: ask('groups', '*') } : {}),
      });
  }
  const extraKeys = Object.keys(wanted.extra);
  if (extraKeys.length > 0) {
    const problem = constrained ? extraProblem(wanted.extra) : undefined;
    if (problem) steps.push({ refuse: ask('userextras', ''), reason: problem });
    else {
      const values = extraKeys.reduce((n, k) => n + wanted.extra[k]!.length, 0);
      steps.push({
        each: extraKeys.flatMap((key) =>
          wanted.extra[key]!.map((value) => ask('userextras', value, { subresource: key })),
        ),
        ...(constrained && (extraKeys.length >= MANY_CHECKS || values >= MANY_CHECKS)
          ? { wildcard: ask('userextras', '*', { subresource: '*' }) }
          : {}),
      });
    }
  }
  const user: UserInfo = {
    username: wanted.user,
    ...(wanted.uid ? { uid: wanted.uid } : {}),
    groups: finalGroups(wanted.user, groups),
    extra: wanted.extra,
  };
  return { steps, user, usernameOnly };
}

/** Every question a plan asks, for asking them all at once. */
function questionsOf(plan: ModePlan): AccessQuestion[] {
  return plan.steps.flatMap((s) => ('refuse' in s ? [] : [...(s.wildcard ? [s.wildcard] : []), ...s.each]));
}

/** The plan's verdict from the answers: undefined when it allows, else the message of its first refusal. */
function verdict(plan: ModePlan, answers: Map<AccessQuestion, boolean>, caller: string): string | undefined {
  for (const step of plan.steps) {
    if ('refuse' in step) return forbiddenMessage({ ...step.refuse, user: caller }, step.reason);
    if (step.wildcard && answers.get(step.wildcard)) continue;
    const denied = step.each.find((q) => !answers.get(q));
    if (denied) return forbiddenMessage({ ...denied, user: caller });
  }
  return undefined;
}

/**
 * Questions asked at once for one decision. A usual one asks a handful (a user, a few groups, the request, in two
 * modes); asked together they cost one round trip to the cluster. A caller who names hundreds of groups or extras
 * gets the API server's own order instead, a step at a time with this many in flight, stopping at the first refusal:
 * so a caller with no rights costs a question or two however many groups they name.
 */
export const MAX_QUESTIONS_AT_ONCE = 64;

/** Asks `questions` this many at a time; undefined when all are allowed, else the first refused in order. */
async function firstRefused(questions: AccessQuestion[], ask: Ask): Promise<AccessQuestion | undefined> {
  for (let i = 0; i < questions.length; i += MAX_QUESTIONS_AT_ONCE / 2) {
    const chunk = questions.slice(i, i + MAX_QUESTIONS_AT_ONCE / 2);
    const answers = await Promise.all(chunk.map(ask));
    const refused = answers.indexOf(false);
    if (refused !== -1) return chunk[refused];
  }
  return undefined;
}

/** A plan's verdict asked step by step, as the API server asks: the message of its first refusal, or undefined. */
async function verdictInOrder(plan: ModePlan, ask: Ask, caller: string): Promise<string | undefined> {
  for (const step of plan.steps) {
    if ('refuse' in step) return forbiddenMessage({ ...step.refuse, user: caller }, step.reason);
    if (step.wildcard && (await ask(step.wildcard))) continue;
    const refused = await firstRefused(step.each, ask);
    if (refused) return forbiddenMessage({ ...refused, user: caller });
  }
  return undefined;
}

/**
 * Decides whether `caller` may act as `wanted` for a request with `attributes`. The answer is the API server's: the
 * modes in its order, the first that allows wins, else the first refusal. Questions are asked all at once when there
 * are few (reviews have no effects, so the answer is the same as asking in order and stopping at the first refusal),
 * else in order (MAX_QUESTIONS_AT_ONCE). A review that cannot be had rejects the promise.
 */
export async function decideImpersonation(
  caller: UserInfo,
  wanted: RequestedImpersonation,
  attributes: RequestAttributes,
  ask: Ask,
): Promise<ImpersonationDecision> {
  if (!wanted.user)
    return {
      allowed: false,
      status: 400,
      message: 'requested impersonation of groups, extra or a uid without impersonating a user name',
    };
  const named = { ...wanted, user: wanted.user };
  const plans = IMPERSONATION_MODES.map((mode) => [mode, planMode(mode, caller, named, attributes)] as const);
  const questions = plans.flatMap(([, plan]) => (plan ? questionsOf(plan) : []));
  const answers =
    questions.length <= MAX_QUESTIONS_AT_ONCE
      ? new Map(await Promise.all(questions.map(async (q) => [q, await ask(q)] as const)))
      : undefined;
  let first: string | undefined;
  for (const [mode, plan] of plans) {
    if (!plan) continue;
    const refusal = answers
      ? verdict(plan, answers, caller.username)
      : await verdictInOrder(plan, ask, caller.username);
    if (refusal === undefined)
      return { allowed: true, identity: { user: plan.user, mode, usernameOnly: plan.usernameOnly } };
    first ??= refusal;
  }
  return { allowed: false, status: 403, message: first ?? 'all impersonation modes failed' };
}
