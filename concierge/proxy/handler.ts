// The request path: health → TokenCredentialRequest (anonymous) → authenticate → WhoAmIRequest → header
// hygiene and impersonation → forward. One log line and one set of metrics per request, never a token.
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
import type { Forwarder, ForwardPlan } from './forward.ts';
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
import { rawStatusResponse, send, UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';

export interface ProxyDeps {
  groups: ApiGroups;
  authenticator: RequestAuthenticator;
  cache: AuthenticatorCache;
  reviewer: Reviewer;
  forwarder: Forwarder;
  signer: ClientCertSigner;
  metrics: ProxyMetrics;
  log: Logger;
  /** Whether the proxy should report ready (authenticators synced, TLS loaded). */
  ready: () => boolean;
  /** Whether the proxy is switched on; when off, everything but the health endpoints gets 503. */
  serving: () => boolean;
  /** How long a TokenCredentialRequest's body may take to arrive. Default: BODY_TIMEOUT_MS (login-apis.ts). */
  bodyTimeoutMs?: number;
  /** The forwarder for `/clusters/<name>/…`: through that cluster's agent tunnel, here or on a peer. */
  clusters?: (name: string) => Forwarder | undefined;
  /** Authorization answers, per cluster. Default: a cache of its own (access-reviews.ts). */
  reviews?: ReviewCache;
}

/** Where a request goes, and whom its authorization questions are asked of. */
interface Target {
  /** The cluster's name, or '' for the hub's own API server. */
  cluster: string;
  forwarder: Forwarder;
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

/** A Status to answer with instead of forwarding. */
interface Refusal {
  status: number;
  message: string;
  retryAfterSeconds?: number;
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

const CLUSTERS_PREFIX = '/clusters/';

/** `/clusters/<name>/<rest>` → the cluster and the URL on it; undefined for the hub's own URLs. */
export function clusterRoute(url: string): { cluster: string; url: string } | undefined {
  if (!url.startsWith(CLUSTERS_PREFIX)) return undefined;
  const end = url.slice(CLUSTERS_PREFIX.length).search(/[/?]/);
  const cluster =
    end < 0
      ? url.slice(CLUSTERS_PREFIX.length)
      : url.slice(CLUSTERS_PREFIX.length, CLUSTERS_PREFIX.length + end);
  if (!cluster) return undefined;
  const rest = end < 0 ? '' : url.slice(CLUSTERS_PREFIX.length + end);
  return { cluster, url: rest.startsWith('/') ? rest : `/${rest}` };
}

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

/** Answers with a refusal's Status, and Retry-After when it mends by itself. */
function refuseWith(res: Response, refusal: Refusal): void {
  writeStatus(
    res,
    refusal.status,
    refusal.message,
    refusal.retryAfterSeconds === undefined ? undefined : { retryAfterSeconds: refusal.retryAfterSeconds },
  );
}

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
    upgrade: boolean,
    target: Target,
  ): Promise<ForwardPlan | Refusal> {
    if (identity.kind === 'serviceaccount') {
      // The API server authenticates (and authorizes any impersonation of) its own service accounts.
      const headers = cleanHeaders(req.headers, true);
      headers['authorization'] = `Bearer ${identity.token}`;
      if (upgrade) Object.assign(headers, { connection: 'Upgrade', upgrade: req.headers['upgrade'] });
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
    const headers = { ...cleanHeaders(req.headers), ...impersonation };
    if (upgrade) Object.assign(headers, { connection: 'Upgrade', upgrade: req.headers['upgrade'] });
    return { headers, longRunning, passthrough: false, user: identity.user.username };
  }

  function observe(verb: string, longRunning: boolean, started: bigint, identity: () => string, url: string) {
    metrics.inflight.inc();
    let done = false;
    return (code: number): void => {
      if (done) return;
      done = true;
      metrics.inflight.dec();
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      metrics.requests.inc({ verb, code: String(code) });
      if (!longRunning) metrics.duration.observe({ verb }, seconds);
      if (code === 502 || code === 504) metrics.upstreamErrors.inc({ code: String(code) });
      requestLog.info(
        { user: identity(), verb, path: pathOf(url), code, ms: Math.round(seconds * 1e4) / 10 },
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
  function targetOf(
    routed: { cluster: string } | undefined,
    identity: Exclude<Identity, { kind: 'anonymous' }>,
  ): Target | Refusal {
    if (!routed)
      return {
        cluster: '',
        forwarder: deps.forwarder,
        ask: askHub(identity.user.username),
        askSelf: reviews.asking(
          selfScope('', identity.user.username),
          askThrough('', deps.forwarder, identity.user.username, true),
        ),
      };
    const { cluster } = routed;
    // A service-account token of this cluster means nothing to another one.
    if (identity.kind === 'serviceaccount')
      return {
        status: 403,
        message: `service-account tokens of this cluster cannot be used for cluster ${cluster}`,
      };
    const forwarder = deps.clusters?.(cluster);
    if (!forwarder)
      return {
        status: 503,
        message: `cluster ${cluster} is not connected: its agent holds no tunnel to any concierge replica`,
      };
    return {
      cluster,
      forwarder,
      ask: reviews.asking(cluster, askThrough(cluster, forwarder, identity.user.username)),
      askSelf: reviews.asking(
        `${cluster}\nself`,
        askThrough(cluster, forwarder, identity.user.username, true),
      ),
    };
  }

  async function serve(req: Request, res: Response): Promise<void> {
    const original = req.url ?? '/';
    const routed = clusterRoute(original);
    if (routed) req.url = routed.url;
    const url = req.url ?? '/';
    const path = pathOf(url);
    const method = req.method ?? 'GET';
    const info = requestInfo(method, url, false);
    const started = process.hrtime.bigint();
    let who = 'anonymous';
    const finish = observe(info.verb, info.longRunning, started, () => who, original);
    res.once('close', () => finish(res.statusCode));
    if (!isWellFormedPath(path)) return writeStatus(res, 400, 'malformed request path');

    if (path === '/healthz' || path === '/livez') {
      return send(res, 200, 'text/plain', 'ok');
    }
    if (path === '/readyz') {
      const ready = deps.ready();
      return send(res, ready ? 200 : 503, 'text/plain', ready ? 'ok' : 'not ready');
    }
    if (!deps.serving()) return writeStatus(res, 503, NOT_SERVING);
    if (path === loginPrefix || path === `${loginPrefix}/`)
      return serveResourceList(res, groups.login, 'tokencredentialrequests', 'TokenCredentialRequest', [
        'create',
        'list',
      ]);
    if (path.startsWith(`${loginPrefix}/`)) {
      // Anonymous by design: this is how a user without credentials gets some.
      if (anonymousInFlight >= MAX_ANONYMOUS_IN_FLIGHT)
        return writeStatus(res, 429, 'too many TokenCredentialRequests at once; retry shortly', {
          retryAfterSeconds: 1,
        });
      anonymousInFlight++;
      try {
        return await handleTokenCredentialRequest(req, res, path.slice(loginPrefix.length), {
          groups,
          cache: deps.cache,
          signer: deps.signer,
          log,
          ...(deps.bodyTimeoutMs === undefined ? {} : { bodyTimeoutMs: deps.bodyTimeoutMs }),
        });
      } finally {
        anonymousInFlight--;
      }
    }

    const identity = await authenticate(req);
    if (identity.kind === 'anonymous') {
      log.info({ reason: identity.reason, path }, 'authentication failed');
      return writeStatus(res, 401, UNAUTHORIZED);
    }
    who = identity.user.username;

    if (path === identityPrefix || path === `${identityPrefix}/`)
      return serveResourceList(res, groups.identity, 'whoamirequests', 'WhoAmIRequest', ['create']);
    if (path.startsWith(`${identityPrefix}/`)) {
      const user =
        identity.kind === 'user' && !identity.user.groups.includes(AUTHENTICATED_GROUP)
          ? { ...identity.user, groups: [...identity.user.groups, AUTHENTICATED_GROUP] }
          : identity.user;
      return handleWhoAmI(req, res, path.slice(identityPrefix.length), groups, user);
    }

    const target = targetOf(routed, identity);
    if ('status' in target) return refuseWith(res, target);
    const plan = await forwardingPlan(req, identity, info.longRunning, false, target);
    if ('status' in plan) return refuseWith(res, plan);
    await target.forwarder.web(req, res, plan);
  }

  async function serveUpgrade(req: IncomingMessage, socket: Socket, head: Buffer): Promise<void> {
    const original = req.url ?? '/';
    const routed = clusterRoute(original);
    if (routed) req.url = routed.url;
    const url = req.url ?? '/';
    const info = requestInfo(req.method ?? 'GET', url, true);
    let who = 'anonymous';
    const finish = observe(info.verb, true, process.hrtime.bigint(), () => who, original);
    const refuse = ({ status, message, retryAfterSeconds }: Refusal): void => {
      finish(status);
      socket.end(
        rawStatusResponse(
          status,
          message,
          retryAfterSeconds === undefined
            ? undefined
            : { details: { retryAfterSeconds }, headers: { 'retry-after': String(retryAfterSeconds) } },
        ),
      );
    };
    if (!deps.serving()) return refuse({ status: 503, message: NOT_SERVING });
    if (!isWellFormedPath(pathOf(url))) return refuse({ status: 400, message: 'malformed request path' });
    const identity = await authenticate(req);
    if (identity.kind === 'anonymous') {
      log.info({ reason: identity.reason, path: pathOf(url) }, 'authentication failed');
      return refuse({ status: 401, message: UNAUTHORIZED });
    }
    who = identity.user.username;
    const target = targetOf(routed, identity);
    if ('status' in target) return refuse(target);
    const plan = await forwardingPlan(req, identity, true, true, target);
    if ('status' in plan) return refuse(plan);
    socket.once('close', () => finish(101));
    target.forwarder.upgrade(req, socket, head, plan);
  }

  return {
    request(req, res) {
      serve(req, res).catch((err: unknown) => {
        log.error(
          { err: (err as Error).message, path: pathOf(req.url ?? '/') },
          'request failed inside the proxy',
        );
        writeStatus(res, 500, 'internal error in the impersonation proxy');
      });
    },
    upgrade(req, socket, head) {
      socket.on('error', () => socket.destroy());
      serveUpgrade(req, socket, head).catch((err: unknown) => {
        log.error({ err: (err as Error).message }, 'upgrade failed inside the proxy');
        socket.destroy();
      });
    },
  };
}
