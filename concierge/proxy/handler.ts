// The request pipeline, one for plain requests and upgrades alike: route (health, the anonymous
// TokenCredentialRequest, which cluster) → authenticate → WhoAmIRequest → decide (header hygiene and the
// impersonation plan, asked of the cluster the request is for) → the ClusterRouter's route (the hub's API server,
// this replica's tunnel, a peer) → the transport, where plain requests and upgrades part. One request context
// carries what the stages learn; one log line and one set of metrics per request, never a token.
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { ApiGroups } from '../../apis/groups.ts';
import { VERSION } from '../../apis/groups.ts';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { AccessQuestion, Reviewer } from '../../lib/kube/kube.ts';
import { flatLineLogger, type Logger } from '../../lib/log.ts';
import type { RequestAuthenticator, Identity } from './authenticate.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import type { ClientCertSigner } from './credentials.ts';
import { handleTokenCredentialRequest, handleWhoAmI, serveResourceList } from './login-apis.ts';
import { newFairSemaphore, type FairLimits } from '../tunnel/fair-semaphore.ts';
import { askThrough, newReviewCache, ReviewUnavailable, type ReviewCache } from './access-reviews.ts';
import { decideImpersonation, forwardedAs, type Ask, type ForwardedAs } from './decide-impersonation.ts';
import { newRequestContext, refuse, type Exchange, type Refusal, type RequestContext } from './exchange.ts';
import { clusterRoute, type ClusterRouter, type Route } from './route.ts';
import type { ForwardPlan } from './transport.ts';
import {
  AUTHENTICATED_GROUP,
  cleanHeaders,
  impersonationHeaders,
  MalformedImpersonationError,
  requestedImpersonation,
  usernameOnlyHeaders,
  type RequestedImpersonation,
} from './impersonate.ts';
import type { ProxyMetrics } from './metrics.ts';
import { requestAttributes, requestInfo, type RequestAttributes } from './request-info.ts';
import { send, UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';

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
}

/** Where a request goes, and whom its authorization questions are asked of. */
interface Target {
  /** The cluster's name, or '' for the hub's own API server. */
  cluster: string;
  route: Route;
  /** Asks the cluster about a user (SubjectAccessReview). */
  ask: Ask;
  /** Asks the cluster whether the forwarding identity itself may do something (SelfSubjectAccessReview). */
  askSelf: Ask;
}

/** The constrained mode an identity is forwarded in, and what the forwarding policy calls such identities. */
const FORWARDED_AS: Record<ForwardedAs, { mode?: string; legacy: string; kind: string }> = {
  user: { mode: 'user-info', legacy: 'users', kind: 'users' },
  serviceaccount: { mode: 'serviceaccount', legacy: 'serviceaccounts', kind: 'service accounts' },
  node: { mode: 'arbitrary-node', legacy: 'users', kind: 'nodes' },
  legacy: {
    legacy: 'users',
    kind: 'this identity (only the legacy impersonate verb can carry it: system:masters or an empty group, an extra key that is not a lower-case domain-prefixed path, a service account with groups, or a node without its group)',
  },
};

/** A question about the forwarding identity alone (the subject of a self review is the sender). */
const NOBODY = { user: '', groups: [], extra: {} };

/** What a request does, in words: `create pods/exec` or `get /version`. */
function doing(attributes: RequestAttributes): string {
  if (!attributes.resourceRequest) return `${attributes.verb} ${attributes.path}`;
  const { verb, group, resource, subresource } = attributes;
  return `${verb} ${resource}${subresource ? `/${subresource}` : ''}${group ? ` in API group ${group}` : ''}`;
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
  upgrade: (req: IncomingMessage, socket: Socket, head: Buffer) => void;
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

/**
 * Where the answers about the forwarding identity itself are kept: per cluster, and per user, since each is asked
 * with the user's share of a tunnel (one user over their share must not fail another's request).
 */
const selfScope = (cluster: string, user: string): string => JSON.stringify([cluster, 'self', user]);

/** The caller, as the extra that records who really asked for an impersonation. */
function originalUser(caller: UserInfo): string {
  return JSON.stringify({
    username: caller.username,
    ...(caller.uid ? { uid: caller.uid } : {}),
    groups: caller.groups,
    extra: caller.extra,
  });
}

export function newProxyHandler(deps: ProxyDeps): ProxyHandler {
  const { groups, log, metrics } = deps;
  const requestLog = flatLineLogger(log);
  const loginPrefix = `/apis/${groups.login}/${VERSION}`;
  const identityPrefix = `/apis/${groups.identity}/${VERSION}`;
  /** TokenCredentialRequests being served now (MAX_ANONYMOUS_IN_FLIGHT). */
  let anonymousInFlight = 0;
  // A domain-prefixed key, as constrained impersonation requires of every extra it passes on.
  const originalUserKey = `impersonation-proxy.concierge.${groups.login.replace(/^login\.concierge\./, '')}/original-user-info`;

  const reviews = deps.reviews ?? newReviewCache();
  // The hub's own questions, asked of its API server with the concierge's identity: each user's in turn, a bounded
  // number at once (HUB_REVIEW_LIMITS), as a tunnel's fair queue bounds those asked of another cluster.
  const hubReviews = newFairSemaphore(HUB_REVIEW_LIMITS);
  const askHub = (user: string): Ask =>
    reviews.asking(
      '',
      (question) =>
        new Promise<boolean>((done, fail) => {
          hubReviews.acquire(
            user,
            (release) => {
              deps.reviewer.allowed(question).then(
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

  /**
   * Whether the cluster lets the forwarding identity act for this kind of identity on this request: its forwarding
   * policy (the RBAC its admin gave the agent, or the hub's impersonator) is enforced by its API server anyway, and
   * asking first turns that refusal into one that says so, instead of naming the forwarding identity. Asked broadly
   * first (any namespace, any name), which a built-in policy always answers, so one answer serves many requests;
   * then for this object; then for the legacy verb, which clusters before Kubernetes 1.36 know only.
   */
  async function forwardingRefusal(
    target: Target,
    attributes: RequestAttributes,
    as: ForwardedAs,
  ): Promise<Refusal | undefined> {
    const { mode, legacy, kind } = FORWARDED_AS[as];
    const verb = `impersonate-on:${mode ?? 'legacy'}:${attributes.verb}`;
    const exact: AccessQuestion = attributes.resourceRequest
      ? {
          ...NOBODY,
          verb,
          group: attributes.group,
          version: attributes.version,
          resource: attributes.resource,
          ...(attributes.subresource ? { subresource: attributes.subresource } : {}),
          ...(attributes.namespace ? { namespace: attributes.namespace } : {}),
          ...(attributes.name ? { name: attributes.name } : {}),
        }
      : { ...NOBODY, verb, path: attributes.path };
    const broad: AccessQuestion = { ...exact };
    delete broad.namespace;
    delete broad.name;
    if (mode !== undefined) {
      if (await target.askSelf(broad)) return undefined;
      if ((exact.namespace !== undefined || exact.name !== undefined) && (await target.askSelf(exact)))
        return undefined;
    }
    if (await target.askSelf({ ...NOBODY, verb: 'impersonate', group: '', resource: legacy }))
      return undefined;
    const where = target.cluster ? `cluster ${target.cluster}'s` : "this cluster's";
    return {
      status: 403,
      message: `${where} policy for Sealion refuses this request: Sealion may not ${doing(attributes)} there for ${kind}; the cluster's admin chose what Sealion may do there`,
    };
  }

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
    if (identity.kind === 'serviceaccount') {
      // The API server authenticates (and authorizes any impersonation of) its own service accounts.
      const headers = cleanHeaders(req.headers, true);
      headers['authorization'] = `Bearer ${identity.token}`;
      context.decision = 'passthrough';
      return { headers, longRunning, passthrough: true, user: identity.user.username };
    }
    let impersonation = impersonationHeaders(identity.user);
    let as = forwardedAs(identity.user, false);
    let requested: RequestedImpersonation | undefined;
    try {
      requested = requestedImpersonation(req.rawHeaders);
    } catch (err) {
      if (!(err instanceof MalformedImpersonationError)) throw err;
      return { status: 400, message: `malformed impersonation headers: ${err.message}` };
    }
    const attributes = requestAttributes(req.method ?? 'GET', req.url ?? '/');
    try {
      if (requested) {
        const decision = await decideImpersonation(identity.user, requested, attributes, target.ask);
        if (!decision.allowed) return { status: decision.status, message: decision.message };
        const { user, usernameOnly } = decision.identity;
        const problem = identityProblem(user);
        if (problem) return { status: 400, message: `cannot impersonate this identity: ${problem}` };
        as = forwardedAs(user, usernameOnly);
        context.impersonated = user.username;
        if (usernameOnly) impersonation = usernameOnlyHeaders(user.username);
        else {
          const original = { [originalUserKey]: [originalUser(identity.user)] };
          impersonation = impersonationHeaders({ ...user, extra: { ...user.extra, ...original } });
        }
      }
      const refused = await forwardingRefusal(target, attributes, as);
      if (refused) return refused;
    } catch (err) {
      if (!(err instanceof ReviewUnavailable)) throw err;
      log.warn({ err: err.message, cluster: target.cluster }, 'a request could not be decided');
      return {
        status: err.status,
        // A remote cluster's refusals start with its name, as every other Status about it does.
        message:
          err.status === 503
            ? `${target.cluster ? `cluster ${target.cluster}: ` : ''}the request could not be decided: ${err.message}; retry`
            : err.message,
        retryAfterSeconds: RETRY_AFTER_SECONDS,
      };
    }
    context.decision = FORWARDED_AS[as].mode ?? 'legacy';
    const headers = { ...cleanHeaders(req.headers), ...impersonation };
    return { headers, longRunning, passthrough: false, user: identity.user.username };
  }

  /** Counts the request in flight; the returned function, called once it is over, logs it and records its metrics. */
  function observe(exchange: Exchange, verb: string, longRunning: boolean, path: string): () => void {
    const { context } = exchange;
    metrics.inflight.inc();
    let done = false;
    return () => {
      if (done) return;
      done = true;
      metrics.inflight.dec();
      const code = exchange.kind === 'plain' ? exchange.res.statusCode : (context.status ?? 0);
      const seconds = Number(process.hrtime.bigint() - context.started) / 1e9;
      metrics.requests.inc({ verb, code: String(code) });
      if (!longRunning) metrics.duration.observe({ verb }, seconds);
      if (code === 502 || code === 504) metrics.upstreamErrors.inc({ code: String(code) });
      requestLog.info(
        {
          id: context.id,
          user: context.user || 'anonymous',
          ...(context.impersonated === undefined ? {} : { as: context.impersonated }),
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
    const identity = await deps.authenticator.authenticate(req);
    if (identity.kind !== 'user') return identity;
    const problem = identityProblem(identity.user);
    return problem ? { kind: 'anonymous', reason: `${identity.via}: ${problem}` } : identity;
  }

  /**
   * Where a request goes and who decides about it: the hub's own API server, or for `/clusters/<name>/…` that
   * cluster, reached through its agent; or the Status that says why it cannot go.
   */
  function targetOf(cluster: string, identity: Exclude<Identity, { kind: 'anonymous' }>): Target | Refusal {
    const user = identity.user.username;
    // A service-account token of this cluster means nothing to another one.
    if (cluster && identity.kind === 'serviceaccount')
      return {
        status: 403,
        message: `service-account tokens of this cluster cannot be used for cluster ${cluster}`,
      };
    const route = deps.router.route(cluster);
    if (!route)
      return {
        status: 503,
        message: `cluster ${cluster} is not connected: its agent holds no tunnel to any concierge replica`,
      };
    if (!cluster)
      return {
        cluster,
        route,
        ask: askHub(user),
        askSelf: reviews.asking(selfScope('', user), askThrough('', route, user, true)),
      };
    return {
      cluster,
      route,
      ask: reviews.asking(cluster, askThrough(cluster, route, user)),
      askSelf: reviews.asking(`${cluster}\nself`, askThrough(cluster, route, user, true)),
    };
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
      serveResourceList(res, groups.login, 'tokencredentialrequests', 'TokenCredentialRequest', [
        'create',
        'list',
      ]);
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

  /** The WhoAmIRequest API: who the proxy takes the caller for. Returns false for every other path. */
  async function serveIdentity(
    req: Request,
    res: Response,
    path: string,
    identity: Exclude<Identity, { kind: 'anonymous' }>,
  ): Promise<boolean> {
    if (path === identityPrefix || path === `${identityPrefix}/`) {
      serveResourceList(res, groups.identity, 'whoamirequests', 'WhoAmIRequest', ['create']);
      return true;
    }
    if (!path.startsWith(`${identityPrefix}/`)) return false;
    const user =
      identity.kind === 'user' && !identity.user.groups.includes(AUTHENTICATED_GROUP)
        ? { ...identity.user, groups: [...identity.user.groups, AUTHENTICATED_GROUP] }
        : identity.user;
    await handleWhoAmI(req, res, path.slice(identityPrefix.length), groups, user);
    return true;
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
    if (exchange.kind === 'plain') exchange.res.once('close', finish);
    else exchange.socket.once('close', finish);
    if (!isWellFormedPath(path)) return refuse(exchange, { status: 400, message: 'malformed request path' });
    if (exchange.kind === 'plain') {
      if (await serveAnonymous(exchange.req, exchange.res, path)) return;
    } else if (!deps.serving()) return refuse(exchange, { status: 503, message: NOT_SERVING });

    const identity = await authenticate(req);
    if (identity.kind === 'anonymous') {
      log.info({ id: context.id, reason: identity.reason, path }, 'authentication failed');
      return refuse(exchange, { status: 401, message: UNAUTHORIZED });
    }
    context.user = identity.user.username;
    if (exchange.kind === 'plain' && (await serveIdentity(exchange.req, exchange.res, path, identity)))
      return;

    const target = targetOf(context.cluster, identity);
    if ('status' in target) return refuse(exchange, target);
    const plan = await forwardingPlan(req, identity, upgrade || info.longRunning, target, context);
    if ('status' in plan) return refuse(exchange, plan);
    context.route = target.route.kind;
    await target.route.forward(exchange, plan);
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
