// The request pipeline, one for plain requests and upgrades alike: route (health, the anonymous
// TokenCredentialRequest, which cluster) → authenticate → WhoAmIRequest → decide (header hygiene and the
// impersonation plan, asked of the cluster the request is for) → the ClusterRouter's route (the hub's API server,
// this replica's tunnel, a peer) → the transport, where plain requests and upgrades part. One request context
// carries what the stages learn; one log line and one set of metrics per request, never a token.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ApiGroups } from '../../apis/groups.ts';
import { groupSuffixOf, Resource, VERSION } from '../../apis/groups.ts';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { flatLineLogger, type Logger } from '../../lib/log.ts';
import type { RequestAuthenticator, Identity } from './authenticate.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import type { ClientCertSigner } from './credentials.ts';
import { handleTokenCredentialRequest, handleWhoAmI, serveResourceList } from './login-apis.ts';
import { discoveryDocuments } from '../direct/discovery.ts';
import type { ReviewCache } from '../../lib/kube/review-cache.ts';
import { newRequestContext, refuse, type Exchange, type Refusal, type UpgradeExchange } from './exchange.ts';
import { clusterRoute, type ClusterRouter } from './route.ts';
import { newDecider, type Authenticated } from './decide.ts';
import { authenticatedGroups } from './impersonate.ts';
import type { ProxyMetrics } from './metrics.ts';
import { requestAttributes, requestInfo, type RequestAttributes } from '../../lib/kube/request-info.ts';
import type { RecordingStore, Recordings } from '../recording/session.ts';
import { relay } from '../../lib/http2/memory-budget.ts';
import { ANNOTATIONS, preciseNow, type Auditor, type RequestFacts } from '../audit/audit.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { send, UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';
import type { Reacher } from '../../lib/reach/dialer.ts';
import { isReachPath, parseReach, reachAttributes, REACH_UPGRADE } from '../../lib/reach/target.ts';

export interface ProxyDeps {
  groups: ApiGroups;
  authenticator: RequestAuthenticator;
  cache: AuthenticatorCache;
  reviewer: Reviewer;
  /** The route to the hub's API server, and to each cluster through its agent's tunnel, here or on a peer. */
  router: ClusterRouter;
  signer: ClientCertSigner;
  metrics: ProxyMetrics;
  log: Logger;
  /** Whether the proxy should report ready (authenticators synced, TLS loaded). */
  ready: () => boolean;
  /** Whether the proxy is switched on; when off, everything but the health endpoints gets 503. */
  serving: () => boolean;
  /** How long a TokenCredentialRequest's body may take to arrive. Default: BODY_TIMEOUT_MS (login-apis.ts). */
  bodyTimeoutMs?: number;
  /** Authorization answers, per cluster. Default: a cache of its own (access-reviews.ts). */
  reviews?: ReviewCache;
  /** Audit events for the requests served. Default: none. */
  auditor?: Auditor;
  /** Where exec and attach sessions are recorded. Default: nowhere. */
  recordings?: Recordings;
  /** Every replica's recordings, for the SessionRecording API. Default: none (the API answers 404). */
  recordingStore?: RecordingStore;
  /**
   * Dials the reach connections for the hub's own cluster (`sealion port-forward` without `--cluster`); another
   * cluster's are its agent's to dial. Default: none (they are refused).
   */
  reacher?: Reacher;
  /**
   * Who a request made inside this process signed in as (an SSH session's, concierge/ssh/in-process.ts): such a
   * request skips authentication and goes through every other stage. Default: none is.
   */
  signedIn?: (req: Request) => Authenticated | undefined;
  /**
   * Whether the request log line names the user (and whom they impersonate). Audit events always do; an operator who
   * keeps personal data out of operational logs turns this off. Default: true.
   */
  logUsernames?: boolean;
}

/** The anonymous user, as the API server names the sender of an unauthenticated request. */
const ANONYMOUS: UserInfo = { username: 'system:anonymous', groups: ['system:unauthenticated'], extra: {} };

/** An exec or attach: a terminal session, which can be recorded. */
const isSession = (
  attributes: RequestAttributes,
): attributes is RequestAttributes & { resourceRequest: true } =>
  attributes.resourceRequest &&
  attributes.resource === 'pods' &&
  (attributes.subresource === 'exec' || attributes.subresource === 'attach');

const RECORDINGS_RESOURCE = Resource.SessionRecording;

/** A request through a node's proxy: to the kubelet's own API, where exec and attach are reached another way. */
const reachesKubelet = (attributes: RequestAttributes): boolean =>
  attributes.resourceRequest &&
  attributes.resource === 'nodes' &&
  (attributes.subresource === 'proxy' || attributes.verb === 'proxy');

const NOT_AUDITED = "the request could not be audited, and this proxy's audit is blocking; retry later";

/**
 * TokenCredentialRequests in flight at once. It is the one API anybody may call, and each holds a body of up to
 * MAX_BODY_BYTES and an authenticator's time: 64 of them pin about 4 MiB of bodies. A real login is answered in
 * milliseconds (a webhook's in at most its timeout), so even a burst of logins stays far below; more get 429 with
 * Retry-After, which client-go waits out and retries.
 */
export const MAX_ANONYMOUS_IN_FLIGHT = 64;

const NOT_SERVING =
  "the impersonation proxy is not running on this cluster; the authenticators' status says why";

export interface ProxyHandler {
  request: (req: Request, res: Response) => void;
  upgrade: (req: IncomingMessage, socket: Duplex, head: Buffer) => void;
}

function pathOf(url: string): string {
  const q = url.indexOf('?');
  return q === -1 ? url : url.slice(0, q);
}

/**
 * A path the API server could route: absolute, and every escape a valid one; and for the resource APIs, no empty
 * segment. The API server reads `pods//exec?fieldSelector=metadata.name=x` as a list of pods/exec, which it then
 * serves as an exec into x: what a forwarding policy allows for lists would reach into a pod. No client sends one.
 */
function isWellFormedPath(path: string): boolean {
  if (!path.startsWith('/')) return false;
  let decoded: string;
  try {
    decoded = decodeURIComponent(path);
  } catch {
    return false;
  }
  return !((decoded.startsWith('/api/') || decoded.startsWith('/apis/')) && decoded.includes('//'));
}

export function newProxyHandler(deps: ProxyDeps): ProxyHandler {
  const { groups, log, metrics } = deps;
  const requestLog = flatLineLogger(log);
  const loginPrefix = `/apis/${groups.login}/${VERSION}`;
  // TokenCredentialRequest's and WhoAmIRequest's resource lists, as the aggregated APIs serve them too.
  const kinds = discoveryDocuments(groupSuffixOf(groups));
  const identityPrefix = `/apis/${groups.identity}/${VERSION}`;
  const recordingsPrefix = `/apis/${groups.recordings}/${VERSION}`;
  const isHealthPath = (path: string): boolean =>
    path === '/healthz' || path === '/livez' || path === '/readyz';
  /** What is served before anyone is authenticated: health, and the TokenCredentialRequest API. */
  const isAnonymousPath = (path: string): boolean =>
    isHealthPath(path) || path === loginPrefix || path.startsWith(`${loginPrefix}/`);
  const decider = newDecider(deps);
  const { auditor } = deps;
  const logUsernames = deps.logUsernames ?? true;
  /**
   * Starts the exchange's audit once it is known who sent it (undefined: nobody). In blocking mode, resolves false
   * when its first event could not be written: the request has been refused then.
   */
  async function audited(
    exchange: Exchange,
    facts: RequestFacts | undefined,
    user: UserInfo | undefined,
    annotations?: Record<string, string>,
    mayRefuse = true,
  ): Promise<boolean> {
    if (!auditor || !facts) return true;
    const audit = auditor.begin(facts, user, annotations);
    if (!audit) return true;
    exchange.context.audit = audit;
    if (!mayRefuse) {
      void audit.received().catch(() => {});
      return true;
    }
    try {
      await audit.received();
      return true;
    } catch {
      refuse(exchange, { status: 503, message: NOT_AUDITED, retryAfterSeconds: 1 });
      return false;
    }
  }
  /** TokenCredentialRequests being served now (MAX_ANONYMOUS_IN_FLIGHT). */
  let anonymousInFlight = 0;
  /** Counts the request in flight; the returned function, called once it is over, logs it and records its metrics. */
  function observe(exchange: Exchange, verb: string, longRunning: boolean, path: string): () => void {
    const { context } = exchange;
    metrics.inflight.inc();
    let done = false;
    return () => {
      if (done) return;
      done = true;
      metrics.inflight.dec();
      const code =
        exchange.kind === 'plain' ? exchange.res.statusCode : (context.status ?? context.reach?.status ?? 0);
      if (context.reach) {
        const { reach } = context;
        context.bytes = reach.received;
        context.message ??= reach.message;
        context.audit?.annotate(ANNOTATIONS.bytes, `${reach.sent} sent, ${reach.received} received`);
        if (reach.endpoint) context.audit?.annotate(ANNOTATIONS.endpoint, reach.endpoint);
      }
      const seconds = Number(process.hrtime.bigint() - context.started) / 1e9;
      metrics.requests.inc({ verb, code: String(code) });
      if (!longRunning) metrics.duration.observe({ verb }, seconds);
      if (code === 502 || code === 504) metrics.upstreamErrors.inc({ code: String(code) });
      context.audit?.complete(code, context.message);
      requestLog.info(
        {
          id: context.id,
          ...(logUsernames
            ? {
                user: context.user || 'anonymous',
                ...(context.impersonated === undefined ? {} : { as: context.impersonated.username }),
              }
            : {}),
          ...(context.decision ? { decision: context.decision } : {}),
          verb,
          ...(context.cluster ? { cluster: context.cluster } : {}),
          ...(context.route ? { route: context.route } : {}),
          path,
          code,
          bytes: context.bytes,
          ms: Math.round(seconds * 1e4) / 10,
        },
        'request',
      );
    };
  }

  /**
   * Who sent the request, or anonymous with the reason (for the log). An identity that cannot reach the API server
   * exactly as its authenticator gave it (identity.ts) is refused like any failed authentication.
   */
  async function authenticate(req: Request): Promise<Identity> {
    const identity = deps.signedIn?.(req) ?? (await deps.authenticator.authenticate(req));
    if (identity.kind !== 'user') return identity;
    const problem = identityProblem(identity.user);
    return problem ? { kind: 'anonymous', reason: `${identity.via}: ${problem}` } : identity;
  }

  /**
   * What the proxy answers itself, before anyone is authenticated: health, and the anonymous TokenCredentialRequest
   * API. Returns false for everything else.
   */
  async function serveAnonymous(req: Request, res: Response, path: string): Promise<boolean> {
    if (path === '/healthz' || path === '/livez') {
      send(res, 200, 'text/plain', 'ok');
      return true;
    }
    if (path === '/readyz') {
      const ready = deps.ready();
      send(res, ready ? 200 : 503, 'text/plain', ready ? 'ok' : 'not ready');
      return true;
    }
    if (!deps.serving()) {
      writeStatus(res, 503, NOT_SERVING);
      return true;
    }
    if (path === loginPrefix || path === `${loginPrefix}/`) {
      send(res, 200, 'application/json', kinds.resourceList.get(groups.login)!);
      return true;
    }
    if (!path.startsWith(`${loginPrefix}/`)) return false;
    // Anonymous by design: this is how a user without credentials gets some.
    if (anonymousInFlight >= MAX_ANONYMOUS_IN_FLIGHT) {
      writeStatus(res, 429, 'too many TokenCredentialRequests at once; retry shortly', {
        retryAfterSeconds: 1,
      });
      return true;
    }
    anonymousInFlight++;
    try {
      await handleTokenCredentialRequest(req, res, path.slice(loginPrefix.length), {
        groups,
        cache: deps.cache,
        signer: deps.signer,
        log,
        ...(deps.bodyTimeoutMs === undefined ? {} : { bodyTimeoutMs: deps.bodyTimeoutMs }),
      });
    } finally {
      anonymousInFlight--;
    }
    return true;
  }

  /**
   * The SessionRecording API: the recorded sessions of every replica, listed and read by those the hub's RBAC lets
   * (verbs list and get on sessionrecordings in Sealion's recordings group). Returns false for every other path.
   */
  async function serveRecordings(
    req: Request,
    res: Response,
    path: string,
    identity: Authenticated,
  ): Promise<boolean> {
    if (path === recordingsPrefix || path === `${recordingsPrefix}/`) {
      serveResourceList(res, groups.recordings, RECORDINGS_RESOURCE, 'SessionRecording', ['get', 'list']);
      return true;
    }
    const collection = `${recordingsPrefix}/${RECORDINGS_RESOURCE}`;
    if (path !== collection && !path.startsWith(`${collection}/`)) return false;
    if (req.method !== 'GET') {
      writeStatus(res, 405, 'session recordings are only read');
      return true;
    }
    const store = deps.recordingStore;
    if (!store) {
      writeStatus(res, 404, 'this concierge records no sessions');
      return true;
    }
    let name: string;
    try {
      name = decodeURIComponent(path.slice(collection.length + 1));
    } catch {
      writeStatus(res, 400, 'malformed recording name');
      return true;
    }
    const user = identity.user;
    const allowed = await deps.reviewer
      .allowed({
        user: user.username,
        // As the API server would see the user: authenticated.
        groups: authenticatedGroups(user),
        extra: user.extra,
        ...(user.uid ? { uid: user.uid } : {}),
        verb: name ? 'get' : 'list',
        group: groups.recordings,
        version: VERSION,
        resource: RECORDINGS_RESOURCE,
        ...(name ? { name } : {}),
      })
      .catch(() => undefined);
    if (allowed === undefined) {
      writeStatus(res, 503, 'the API server could not be asked whether you may read recordings; retry', {
        retryAfterSeconds: 1,
      });
      return true;
    }
    if (!allowed) {
      writeStatus(
        res,
        403,
        `${RECORDINGS_RESOURCE}.${groups.recordings}${name ? ` "${name}"` : ''} is forbidden: User "${user.username}" cannot ${name ? 'get' : 'list'} it`,
      );
      return true;
    }
    if (!name) {
      const { found, unreachable } = await store.list();
      send(
        res,
        200,
        'application/json',
        JSON.stringify({
          apiVersion: `${groups.recordings}/${VERSION}`,
          kind: 'SessionRecordingList',
          metadata: unreachable.length > 0 ? { unreachableReplicas: unreachable } : {},
          items: found.map((r) => ({
            apiVersion: `${groups.recordings}/${VERSION}`,
            kind: 'SessionRecording',
            metadata: { name: r.id, creationTimestamp: r.modified },
            status: { replica: r.replica, bytes: r.bytes },
          })),
        }),
      );
      return true;
    }
    const content = await store.read(name);
    if (!content) {
      writeStatus(res, 404, `${RECORDINGS_RESOURCE}.${groups.recordings} "${name}" not found`);
      return true;
    }
    res.writeHead(200, { 'content-type': 'application/x-asciicast' });
    content.on('error', () => res.destroy());
    res.on('close', () => content.destroy());
    relay(content, res);
    return true;
  }

  /** The WhoAmIRequest API: who the proxy takes the caller for. Returns false for every other path. */
  async function serveIdentity(
    req: Request,
    res: Response,
    path: string,
    identity: Authenticated,
  ): Promise<boolean> {
    if (path === identityPrefix || path === `${identityPrefix}/`) {
      send(res, 200, 'application/json', kinds.resourceList.get(groups.identity)!);
      return true;
    }
    if (!path.startsWith(`${identityPrefix}/`)) return false;
    const user =
      identity.kind === 'user'
        ? { ...identity.user, groups: authenticatedGroups(identity.user) }
        : identity.user;
    await handleWhoAmI(req, res, path.slice(identityPrefix.length), groups, user);
    return true;
  }

  /**
   * Opens the recording of an exec or attach. Returns the refusal when it cannot be opened and sessions must be
   * recorded; otherwise the session goes on, and its audit event says whether it is recorded.
   */
  async function record(
    exchange: UpgradeExchange,
    attributes: RequestAttributes & { resourceRequest: true },
  ): Promise<Refusal | undefined> {
    const { context } = exchange;
    const recordings = deps.recordings!;
    try {
      context.recording = await recordings.open({
        auditID: context.id,
        user: context.user,
        cluster: context.cluster,
        namespace: attributes.namespace,
        pod: attributes.name,
        subresource: attributes.subresource,
        query: new URLSearchParams((exchange.req.url ?? '').split('?')[1] ?? ''),
      });
      context.audit?.annotate(ANNOTATIONS.recording, context.recording.id);
      const recording = context.recording;
      exchange.socket.once('close', () => void recording.close());
      return undefined;
    } catch (err) {
      log.warn({ id: context.id, err: (err as Error).message }, 'a session could not be recorded');
      context.audit?.annotate(ANNOTATIONS.recording, `not recorded: ${(err as Error).message}`);
      if (!recordings.required) return undefined;
      return {
        status: 503,
        message: 'this session cannot be recorded now, and sessions must be recorded here; retry later',
        retryAfterSeconds: 1,
      };
    }
  }

  /** The pipeline: route → authenticate → decide → a route → the transport. */
  async function serve(exchange: Exchange): Promise<void> {
    const { req, context } = exchange;
    const original = req.url ?? '/';
    const routed = clusterRoute(original);
    if (routed) {
      req.url = routed.url;
      context.cluster = routed.cluster;
    }
    const path = pathOf(req.url ?? '/');
    const upgrade = exchange.kind === 'upgrade';
    const info = requestInfo(req.method ?? 'GET', req.url ?? '/', upgrade);
    const finish = observe(exchange, info.verb, upgrade || info.longRunning, pathOf(original));
    if (exchange.kind === 'plain') exchange.res.on('close', finish);
    else exchange.socket.once('close', finish);
    // A reach connection is authorized as what reaching its object takes (reach/target.ts), not as its path.
    const reach = isReachPath(path) ? parseReach(req.url ?? '/') : undefined;
    const attributes =
      reach && !('problem' in reach)
        ? reachAttributes(reach)
        : requestAttributes(req.method ?? 'GET', req.url ?? '/');
    context.attributes = attributes;
    const facts: RequestFacts | undefined = auditor && {
      auditID: context.id,
      requestURI: original,
      attributes,
      ...(req.socket?.remoteAddress ? { sourceIP: req.socket.remoteAddress.replace(/^::ffff:/, '') } : {}),
      ...(typeof req.headers['user-agent'] === 'string' ? { userAgent: req.headers['user-agent'] } : {}),
      receivedMs: preciseNow(),
    };
    const where: Record<string, string> = context.cluster ? { [ANNOTATIONS.cluster]: context.cluster } : {};
    if (!isWellFormedPath(path)) {
      await audited(exchange, facts, undefined, where);
      return refuse(exchange, { status: 400, message: 'malformed request path' });
    }
    if (reach) {
      const problem =
        'problem' in reach
          ? reach.problem
          : exchange.kind === 'plain' || String(req.headers['upgrade']).toLowerCase() !== REACH_UPGRADE
            ? `a reach connection is an HTTP/1.1 upgrade to ${REACH_UPGRADE} (sealion port-forward)`
            : undefined;
      if (problem) {
        await audited(exchange, facts, undefined, where);
        return refuse(exchange, { status: 400, message: problem });
      }
      context.reach = { sent: 0, received: 0 };
      // A client that ends its side still reads the target's answer: the end passes on as a half-close.
      if (exchange.kind === 'upgrade') exchange.socket.allowHalfOpen = true;
    }
    if (exchange.kind === 'plain' && isAnonymousPath(path)) {
      // Health checks are answered whatever the audit's state: a blocked audit must not restart the pod.
      if (!(await audited(exchange, facts, ANONYMOUS, where, !isHealthPath(path)))) return;
      if (await serveAnonymous(exchange.req, exchange.res, path)) return;
    } else if (!deps.serving()) {
      await audited(exchange, facts, undefined, where);
      return refuse(exchange, { status: 503, message: NOT_SERVING });
    }

    const identity = await authenticate(req);
    if (identity.kind === 'anonymous') {
      log.info({ id: context.id, reason: identity.reason, path }, 'authentication failed');
      await audited(exchange, facts, undefined, where);
      return refuse(exchange, { status: 401, message: UNAUTHORIZED });
    }
    context.user = identity.user.username;
    if (
      !(await audited(exchange, facts, identity.user, {
        ...where,
        [ANNOTATIONS.authenticator]: identity.kind === 'user' ? identity.via : 'serviceaccount',
      }))
    )
      return;
    if (exchange.kind === 'plain' && (await serveIdentity(exchange.req, exchange.res, path, identity)))
      return;
    // The hub's own API: a path for a cluster (/clusters/<name>/apis/…) is that cluster's to answer.
    if (
      exchange.kind === 'plain' &&
      !context.cluster &&
      (await serveRecordings(exchange.req, exchange.res, path, identity))
    )
      return;

    const target = decider.target(context.cluster, identity);
    if ('status' in target) return refuse(exchange, target);
    const plan = await decider.plan(req, identity, upgrade || info.longRunning, target, context);
    const { audit } = context;
    if ('status' in plan) {
      audit?.annotate(ANNOTATIONS.decision, 'refused');
      audit?.annotate(ANNOTATIONS.reason, plan.message);
      return refuse(exchange, plan);
    }
    context.route = target.route.kind;
    if (audit) {
      audit.annotate(ANNOTATIONS.route, context.route);
      audit.annotate(ANNOTATIONS.decision, context.decision ?? 'forwarded');
      audit.annotate(
        ANNOTATIONS.reason,
        context.reach
          ? `a reach connection, dialed by ${context.cluster ? `cluster ${context.cluster}'s agent` : 'this concierge'} once that cluster's API server allows it (impersonation in ${context.decision ?? 'legacy'} mode)`
          : context.decision === 'passthrough'
            ? 'a service account of this cluster, forwarded with its own token; the API server decides'
            : `forwarded by impersonation (${context.decision ?? 'legacy'} mode); ${context.cluster ? `cluster ${context.cluster}'s` : "the hub's"} API server decides`,
      );
      if (context.impersonated) audit.impersonating(context.impersonated);
    }
    if (exchange.kind === 'upgrade' && deps.recordings?.required && reachesKubelet(attributes))
      return refuse(exchange, {
        status: 403,
        message:
          "sessions must be recorded here, and an upgrade through a node's proxy (the kubelet's own API) cannot be: use kubectl exec or attach",
      });
    if (exchange.kind === 'upgrade' && deps.recordings && isSession(attributes)) {
      const refused = await record(exchange, attributes);
      if (refused) return refuse(exchange, refused);
    }
    if (exchange.kind === 'upgrade' && context.reach && target.route.kind === 'local') {
      // The hub's own cluster: this process dials, as its agent does for another cluster.
      if (!deps.reacher)
        return refuse(exchange, { status: 503, message: 'this concierge does not dial reach connections' });
      if (plan.passthrough)
        return refuse(exchange, {
          status: 403,
          message:
            'reach connections are for the users Sealion authenticates; a service account of this cluster can use kubectl port-forward',
        });
      const rawImpersonation = Object.entries(plan.headers).flatMap(([name, value]) =>
        !name.startsWith('impersonate-') || value === undefined
          ? []
          : (Array.isArray(value) ? value : [String(value)]).flatMap((v) => [name, v]),
      );
      if (audit) context.reach.connected = () => audit.responseStarted(101);
      return deps.reacher.serve(
        { url: req.url ?? '/', upgrade: REACH_UPGRADE, rawImpersonation, holder: plan.user },
        exchange.socket,
        exchange.head,
        context.reach,
      );
    }
    // Returned, not awaited: this stage's state (the identity, the target's review closures) goes as soon as the
    // request is on its way, rather than live as long as a watch does.
    return target.route.forward(exchange, plan);
  }

  return {
    request(req, res) {
      serve({ kind: 'plain', req, res, context: newRequestContext() }).catch((err: unknown) => {
        log.error(
          { err: (err as Error).message, path: pathOf(req.url ?? '/') },
          'request failed inside the proxy',
        );
        writeStatus(res, 500, 'internal error in the impersonation proxy');
      });
    },
    upgrade(req, socket, head) {
      socket.on('error', () => socket.destroy());
      serve({ kind: 'upgrade', req, socket, head, context: newRequestContext() }).catch((err: unknown) => {
        log.error({ err: (err as Error).message }, 'upgrade failed inside the proxy');
        socket.destroy();
      });
    },
  };
}
