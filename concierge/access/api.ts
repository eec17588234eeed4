// The AccessRequest APIs Sealion answers itself at the hub's URLs (local APIs, proxy/local-apis.ts), for people it
// authenticated: create (POST accessrequests), a reviewer's decision (POST accessrequests/<name>/approval), the
// requester's withdrawal (POST accessrequests/<name>/withdrawal) and the caller's own requests (GET
// selfaccessrequests). Sealion writes every AccessRequest with its own credentials; every other verb on them (get,
// list, watch, delete) goes on to the hub's API server as the user, whose RBAC decides.
import {
  ACCESS_REQUESTS,
  APPROVAL_SUBRESOURCE,
  APPROVE_VERB,
  MAX_REQUESTS_PER_USER,
  WITHDRAWAL_SUBRESOURCE,
  type AccessRequest,
  type AccessRequestStatus,
} from '../../apis/access.ts';
import { VERSION, type ApiGroups } from '../../apis/groups.ts';
import { isDNSSubdomain } from '../../apis/names.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Clock } from '../../lib/clock.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import type { Logger } from '../../lib/log.ts';
import { send, writeStatus, type Refusal } from '../../lib/kube/status.ts';
import type { LocalAPI } from '../proxy/local-apis.ts';
import { BodyError, readJSON } from '../proxy/login-apis.ts';
import { AccessWriteError, type AccessRequestClient } from './client.ts';
import type { AccessChange, AccessNotifier } from './notify.ts';
import {
  isRefusal,
  newAccessRequest,
  readDecision,
  reviewed,
  withdrawn,
  type PolicyAnswer,
} from './policy.ts';
import type { AccessStore } from './store.ts';

/** The resource that lists the caller's own requests. */
export const SELF_ACCESS_REQUESTS = 'selfaccessrequests';
/** How often a decision is tried again when the request changed under it (409) before the caller is told to retry. */
export const CONFLICT_RETRIES = 5;
/** The prefix of service accounts' usernames: access requests are for people. */
const SERVICE_ACCOUNT_PREFIX = 'system:serviceaccount:';

export interface AccessAPIDeps {
  groups: ApiGroups;
  store: AccessStore;
  client: AccessRequestClient;
  /** The hub's authorizer: a SubjectAccessReview for verb `approve` on the request. */
  reviewer: Reviewer;
  /** The policy of a cluster a request names (policyLookup), or why it cannot be asked for. */
  policyOf: (cluster: string) => PolicyAnswer;
  /** The uids of the clusters a request names, recorded at its approval (clusterUIDsOf). */
  clusterUIDs: (clusters: readonly string[]) => Record<string, string>;
  notify: AccessNotifier;
  clock: Clock;
  log: Logger;
  /** How long a body may take to arrive. Default: login-apis.ts's. */
  bodyTimeoutMs?: number;
}

/**
 * The calls one user may have under way at once (creates and decisions: each a SubjectAccessReview or writes to the
 * hub under the concierge's identity); more are refused (429), so one user cannot flood the hub in its name.
 */
export const MAX_CALLS_IN_FLIGHT_PER_USER = 4;

/** The local API entries: POST on the collection and on a request's subresources, GET on selfaccessrequests. */
export function accessAPIs(deps: AccessAPIDeps): LocalAPI[] {
  const prefix = `/apis/${deps.groups.access}/${VERSION}`;
  const collection = `${prefix}/${ACCESS_REQUESTS}`;
  const creating = new Map<string, number>();
  const bounded = perUserBound(MAX_CALLS_IN_FLIGHT_PER_USER);
  return [
    {
      paths: [collection],
      who: 'authenticated',
      hubOnly: true,
      methods: ['POST'],
      serve: (req, res, _path, user) =>
        asPerson(res, user!, () => bounded(res, user!, () => create(deps, creating, req, res, user!))),
    },
    {
      paths: [`${collection}/*`],
      who: 'authenticated',
      hubOnly: true,
      methods: ['POST'],
      serve: (req, res, path, user) =>
        asPerson(res, user!, () =>
          bounded(res, user!, () => decide(deps, req, res, path.slice(collection.length + 1), user!)),
        ),
    },
    {
      paths: [`${prefix}/${SELF_ACCESS_REQUESTS}`],
      who: 'authenticated',
      hubOnly: true,
      methods: ['GET'],
      serve: (_req, res, _path, user) => asPerson(res, user!, () => listOwn(deps, res, user!)),
    },
  ];
}

/** Runs `serve` for a person; a service account is refused, and whatever `serve` throws is answered with a 500. */
async function asPerson(res: Response, user: UserInfo, serve: () => Promise<void>): Promise<void> {
  if (user.username.startsWith(SERVICE_ACCOUNT_PREFIX))
    return writeStatus(
      res,
      403,
      'access requests are for people; a service account cannot make or decide one',
    );
  await serve();
}

/** Runs a user's call unless `most` of theirs are under way already; then answers 429. */
function perUserBound(most: number) {
  const inFlight = new Map<string, number>();
  return async (res: Response, user: UserInfo, serve: () => Promise<void>): Promise<void> => {
    const held = inFlight.get(user.username) ?? 0;
    if (held >= most)
      return writeStatus(
        res,
        429,
        `you have ${held} access request calls under way; wait for them to finish`,
        {
          retryAfterSeconds: 1,
        },
      );
    inFlight.set(user.username, held + 1);
    try {
      await serve();
    } finally {
      const left = (inFlight.get(user.username) ?? 1) - 1;
      if (left > 0) inFlight.set(user.username, left);
      else inFlight.delete(user.username);
    }
  };
}

const refuse = (res: Response, refusal: Refusal): void =>
  writeStatus(
    res,
    refusal.status,
    refusal.message,
    refusal.retryAfterSeconds === undefined ? undefined : { retryAfterSeconds: refusal.retryAfterSeconds },
  );

/** The body as JSON, or undefined once it has been answered with the reason it cannot be read. */
async function bodyOf(deps: AccessAPIDeps, req: Request, res: Response): Promise<unknown> {
  try {
    return await readJSON(req, deps.clock, deps.bodyTimeoutMs);
  } catch (err) {
    if (!(err instanceof BodyError)) throw err;
    writeStatus(res, err.status, err.message);
    return undefined;
  }
}

/** The answer for a write the API server refused; a 5xx or no answer is one to retry. */
function writeFailed(deps: AccessAPIDeps, res: Response, err: unknown, name: string): void {
  if (!(err instanceof AccessWriteError)) throw err;
  if (err.code === 409)
    return writeStatus(res, 409, `access request ${name} already exists; choose another name`);
  if (err.code === 404) return writeStatus(res, 404, `access request ${name} not found`);
  if (err.code === 422 || err.code === 400) return writeStatus(res, 422, err.message);
  deps.log.warn({ code: err.code, err: err.message, name }, 'access request write failed');
  writeStatus(res, 503, 'the hub could not store the access request; retry shortly', {
    retryAfterSeconds: 1,
  });
}

async function create(
  deps: AccessAPIDeps,
  creating: Map<string, number>,
  req: Request,
  res: Response,
  user: UserInfo,
): Promise<void> {
  const body = await bodyOf(deps, req, res);
  if (body === undefined) return;
  // Counted with this replica's creates under way, so a burst does not outrun the informer's view of the bound.
  const underWay = creating.get(user.username) ?? 0;
  const made = newAccessRequest(body, {
    apiVersion: `${deps.groups.access}/${VERSION}`,
    user,
    policyOf: deps.policyOf,
    pending: deps.store.pendingOf(user.username) + underWay,
    held: deps.store.requestsOf(user.username).length + underWay,
    now: deps.clock.now(),
  });
  if (isRefusal(made)) return refuse(res, made);
  const request = made;
  creating.set(user.username, underWay + 1);
  try {
    const created = await deps.client.create(request);
    const stored = await deps.client.replaceStatus(created, request.status!);
    deps.notify('created', stored, user);
    send(res, 201, 'application/json', JSON.stringify(stored));
  } catch (err) {
    writeFailed(deps, res, err, request.metadata.name ?? '');
  } finally {
    const left = (creating.get(user.username) ?? 1) - 1;
    if (left > 0) creating.set(user.username, left);
    else creating.delete(user.username);
  }
}

/** Whether the hub's RBAC lets `user` approve (or deny) the request `name`; undefined: it could not be asked. */
function mayApprove(deps: AccessAPIDeps, user: UserInfo, name: string): Promise<boolean | undefined> {
  return deps.reviewer
    .allowed({
      user: user.username,
      groups: [...user.groups],
      extra: user.extra,
      ...(user.uid ? { uid: user.uid } : {}),
      verb: APPROVE_VERB,
      group: deps.groups.access,
      version: VERSION,
      resource: ACCESS_REQUESTS,
      name,
    })
    .catch(() => undefined);
}

/** POST accessrequests/<name>/approval or …/withdrawal. */
async function decide(
  deps: AccessAPIDeps,
  req: Request,
  res: Response,
  rest: string,
  user: UserInfo,
): Promise<void> {
  const [encoded = '', subresource, ...more] = rest.split('/');
  let name: string;
  try {
    name = decodeURIComponent(encoded);
  } catch {
    return writeStatus(res, 400, 'malformed access request name');
  }
  if (more.length > 0 || (subresource !== APPROVAL_SUBRESOURCE && subresource !== WITHDRAWAL_SUBRESOURCE))
    return writeStatus(
      res,
      405,
      `access requests are created with POST ${ACCESS_REQUESTS}, decided with POST ${ACCESS_REQUESTS}/<name>/${APPROVAL_SUBRESOURCE} and withdrawn with POST ${ACCESS_REQUESTS}/<name>/${WITHDRAWAL_SUBRESOURCE}`,
    );
  // Checked before any use: `.` or `..` would change the URL the hub's client calls.
  if (!isDNSSubdomain(name))
    return writeStatus(res, 404, `access request ${JSON.stringify(name).slice(0, 80)} not found`);
  const approval = subresource === APPROVAL_SUBRESOURCE;
  const body = await bodyOf(deps, req, res);
  if (body === undefined) return;
  const decision = readDecision(
    body,
    `${deps.groups.access}/${VERSION}`,
    approval ? ['Approved', 'Denied'] : ['Withdrawn'],
  );
  if (isRefusal(decision)) return refuse(res, decision);
  if (approval) {
    const allowed = await mayApprove(deps, user, name);
    if (allowed === undefined)
      return writeStatus(res, 503, 'the hub could not be asked whether you may approve; retry', {
        retryAfterSeconds: 1,
      });
    if (!allowed)
      return writeStatus(
        res,
        403,
        `${ACCESS_REQUESTS}.${deps.groups.access} "${name}" is forbidden: User "${user.username}" cannot ${APPROVE_VERB} it (a reviewer holds the ClusterRole sealion-concierge-access-reviewer)`,
      );
  }
  const next = (request: AccessRequest, now: number): AccessRequestStatus | Refusal =>
    approval
      ? reviewed(request, user.username, decision, now, deps.clusterUIDs(request.spec.clusters))
      : withdrawn(request, user.username, decision.reason, now);
  await writeDecision(deps, res, name, user, next);
}

/** What a decision made of a request's status, as a change to tell. */
function changeOf(status: AccessRequestStatus): AccessChange | undefined {
  switch (status.phase) {
    case 'Approved':
      return 'approved';
    case 'Denied':
      return 'denied';
    case 'Withdrawn':
      return 'withdrawn';
    default:
      return undefined;
  }
}

/**
 * Reads the request from the API server, applies `next` and writes the status at the version read; a conflict (the
 * request changed meanwhile: another reviewer, the expiry) reads it again and decides afresh, CONFLICT_RETRIES times.
 */
async function writeDecision(
  deps: AccessAPIDeps,
  res: Response,
  name: string,
  user: UserInfo,
  next: (request: AccessRequest, now: number) => AccessRequestStatus | Refusal,
): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      const request = await deps.client.get(name);
      if (!request) return writeStatus(res, 404, `access request ${name} not found`);
      const status = next(request, deps.clock.now());
      if (isRefusal(status)) return refuse(res, status);
      const stored = await deps.client.replaceStatus(request, status);
      const change = changeOf(stored.status ?? {});
      if (change && request.status?.phase !== stored.status?.phase) deps.notify(change, stored, user);
      return send(res, 200, 'application/json', JSON.stringify(stored));
    } catch (err) {
      if (!(err instanceof AccessWriteError) || err.code !== 409 || attempt + 1 >= CONFLICT_RETRIES)
        return writeFailed(deps, res, err, name);
    }
  }
}

/** The caller's own requests, newest first, from this replica's informer: no RBAC needed to see one's own. */
function listOwn(deps: AccessAPIDeps, res: Response, user: UserInfo): Promise<void> {
  const apiVersion = `${deps.groups.access}/${VERSION}`;
  send(
    res,
    200,
    'application/json',
    JSON.stringify({
      apiVersion,
      kind: 'AccessRequestList',
      metadata: {},
      items: deps.store
        .requestsOf(user.username)
        .slice(0, MAX_REQUESTS_PER_USER)
        .map((r) => ({ ...r, apiVersion, kind: 'AccessRequest' })),
    }),
  );
  return Promise.resolve();
}
