// The impersonation proxy's request pipeline, one for plain requests and upgrades alike, its stages in order:
//   observe (one log line and one set of metrics per request, observe.ts) → read the URL once (which cluster, the
//   verb, the authorization attributes) → audit start (audit-start.ts) → the anonymous local APIs (health, the
//   TokenCredentialRequest API: hub-apis.ts, local-apis.ts) → authenticate (authenticate.ts) → the authenticated
//   local APIs (WhoAmIRequest, SessionRecording) → decide (decide.ts: header hygiene and the impersonation plan,
//   asked of the cluster the request is for, with the user's access-request grants there; what relays under a grant
//   ends with it, grant-sessions.ts) → record (record.ts: exec and attach) → the cluster's Route (route.ts: the hub's
//   own API server, this replica's tunnel, a peer), whose transport (transport.ts) is where plain requests and
//   upgrades part. One request context (exchange.ts) carries what the stages learn; never a token.
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { ApiGroups } from '../../apis/groups.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';
import { H2Request, type Request, type Response } from '../../lib/http2/request.ts';
import { authenticatedGroups } from '../../lib/kube/authenticated.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { parseRequest, type ParsedRequest } from '../../lib/kube/request-info.ts';
import type { ReviewCache } from '../../lib/kube/review-cache.ts';
import { UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';
import type { Logger } from '../../lib/log.ts';
import {
  isReachPath,
  parseReach,
  reachAttributes,
  REACH_UPGRADE,
  type ReachTarget,
} from '../../lib/reach/target.ts';
import { NO_GRANTS, type AccessGrants } from '../access/grants.ts';
import { ANNOTATIONS, type Auditor, type RequestFacts } from '../audit/audit.ts';
import type { OperationsRecording, RecordingStore, Recordings } from '../recording/session.ts';
import { requestFacts, startAudit } from './audit-start.ts';
import type { Identity, RequestAuthenticator } from './authenticate.ts';
import type { ClientCertSigner } from './credentials.ts';
import { newDecider, type Authenticated, type Decider } from './decide.ts';
import {
  asPlain,
  asUpgrade,
  gone,
  newRequestContext,
  onClose,
  refuse,
  type Exchange,
  type Refusal,
} from './exchange.ts';
import type { SessionKind, Sessions } from '../drain.ts';
import type { SSHDoor } from '../../apis/identity.ts';
import { newGrantSessions, type GrantSessions } from './grant-sessions.ts';
import { hubAPIs } from './hub-apis.ts';
import { localAPIs, type LocalAPI } from './local-apis.ts';
import type { ProxyMetrics } from './metrics.ts';
import { newObserver } from './observe.ts';
import { newRecorder, type RecordStage } from './record.ts';
import { widenStreamWindows } from './server.ts';
import { clusterRoute, newRouteWaits, type ClusterRouter, type RouteWaits } from './route.ts';

export { MAX_ANONYMOUS_IN_FLIGHT } from './hub-apis.ts';

export interface ProxyDeps {
  groups: ApiGroups;
  authenticator: RequestAuthenticator;
  cache: AuthenticatorCache;
  reviewer: Reviewer;
  /** The route to the hub's API server, and to each cluster through its agent's tunnel, here or on a peer. */
  router: ClusterRouter;
  /**
   * When this process last saw a cluster's agent connected, if it did and a wait could bring a route (RouteWaitOptions
   * in route.ts): a request for a cluster without a route waits up to AGENT_RETURN_MS from then for one. Default:
   * none waits.
   */
  lastConnected?: (cluster: string) => number | undefined;
  signer: ClientCertSigner;
  metrics: ProxyMetrics;
  log: Logger;
  /** Whether the proxy should report ready (authenticators synced, TLS loaded). */
  ready: () => boolean;
  /** Whether the proxy is switched on; when off, everything but the health endpoints gets 503. */
  serving: () => boolean;
  /** How long a TokenCredentialRequest's body may take to arrive. Default: BODY_TIMEOUT_MS (login-apis.ts). */
  bodyTimeoutMs?: number;
  /** The deadlines of the local APIs' bodies, and a wait for a cluster between tunnels. Default: the system's. */
  clock?: Clock;
  /** Authorization answers, per cluster. Default: a cache of its own (access-reviews.ts). */
  reviews?: ReviewCache;
  /**
   * A Cluster's spec by name, which says whether it takes hub workloads and under what prefix (workload.ts). Default:
   * none is known, so no cluster takes them.
   */
  clusterSpec?: (name: string) => ClusterSpec | undefined;
  /** Audit events for the requests served. Default: none. */
  auditor?: Auditor;
  /** Where exec and attach sessions are recorded. Default: nowhere. */
  recordings?: Recordings;
  /** Every replica's recordings, for the SessionRecording API. Default: none (the API answers 404). */
  recordingStore?: RecordingStore;
  /** How to reach the SSH door, for signed-in users (hub-apis.ts). Default: the door is off. */
  sshDoor?: () => SSHDoor['status'] | undefined;
  /** The AccessRequest APIs (concierge/access/api.ts), at the hub's URLs. Default: none. */
  accessAPIs?: readonly LocalAPI[];
  /**
   * Who a request made inside this process signed in as (an SSH session's, concierge/ssh/in-process.ts): such a
   * request skips authentication and goes through every other stage. Default: none is.
   */
  signedIn?: (req: Request) => Authenticated | undefined;
  /**
   * The session recorded as a whole (an sftp session) that a request through the SSH door belongs to. Default: none.
   */
  partOfRecording?: (req: Request) => Pick<OperationsRecording, 'opened'> | undefined;
  /**
   * Whether the request log line names the user (and whom they impersonate). Audit events always do; an operator who
   * keeps personal data out of operational logs turns this off. Default: true.
   */
  logUsernames?: boolean;
  /**
   * Where what is forwarded is registered while it lasts, so that a draining replica can wait for it, end it or close
   * it with a message (concierge/drain.ts). Default: nowhere.
   */
  sessions?: Sessions;
  /**
   * The approved access requests (concierge/access): their groups and reason go with their requester's requests, and
   * what a grant's requests relay ends with it. Default: NO_GRANTS (none, and no cluster requires a reason).
   */
  grants?: AccessGrants;
}

/** The anonymous user, as the API server names the sender of an unauthenticated request. */
const ANONYMOUS: UserInfo = { username: 'system:anonymous', groups: ['system:unauthenticated'], extra: {} };

const NOT_AUDITED = "the request could not be audited, and this proxy's audit is blocking; retry later";

const NOT_SERVING: Refusal = {
  status: 503,
  message: "the impersonation proxy is not running on this cluster; the authenticators' status says why",
};

export interface ProxyHandler {
  request: (req: Request, res: Response) => void;
  /** An HTTP/1.1 upgrade, or an HTTP/2 extended CONNECT read as one (lib/http2/request.ts serveConnect). */
  upgrade: (req: IncomingMessage | H2Request, socket: Duplex, head: Buffer) => void;
  /** Stops following the grants' ends (what is relayed goes on). */
  close: () => void;
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

/** The request as read once, and when it is a reach connection, what it reaches. */
type ReadRequest = ParsedRequest & { reach?: ReachTarget | { problem: string } };

/**
 * Reads the request once: the cluster it is for (`/clusters/<name>/…`, its URL then the one on that cluster), its
 * verb, path and attributes. A reach connection is authorized as what reaching its object takes (reach/target.ts),
 * not as its path.
 */
function readRequest(exchange: Exchange): ReadRequest {
  const { req, context } = exchange;
  const routed = clusterRoute(req.url ?? '/');
  if (routed) {
    req.url = routed.url;
    context.cluster = routed.cluster;
  }
  const parsed: ReadRequest = parseRequest(
    req.method ?? 'GET',
    req.url ?? '/',
    asUpgrade(exchange) !== undefined,
  );
  if (isReachPath(parsed.path)) {
    const reach = parseReach(req.url ?? '/');
    parsed.reach = reach;
    if (!('problem' in reach)) parsed.attributes = reachAttributes(reach);
  }
  context.attributes = parsed.attributes;
  return parsed;
}

/**
 * Why the request cannot be served whoever sent it (a malformed path, a reach connection that is not one, an HTTP/2
 * extended CONNECT for anything but a reach connection: exec, attach and port-forward still upgrade HTTP/1.1, which
 * their transports and recordings read).
 */
function malformed(exchange: Exchange, { path, reach }: ReadRequest): string | undefined {
  if (!isWellFormedPath(path)) return 'malformed request path';
  if (!reach)
    return exchange.kind === 'upgrade' && exchange.req instanceof H2Request
      ? `an HTTP/2 extended CONNECT carries only reach connections (${REACH_UPGRADE})`
      : undefined;
  if ('problem' in reach) return reach.problem;
  const upgrade = asUpgrade(exchange);
  if (!upgrade || String(exchange.req.headers['upgrade']).toLowerCase() !== REACH_UPGRADE)
    return `a reach connection is an HTTP/1.1 upgrade or an HTTP/2 extended CONNECT to ${REACH_UPGRADE} (sealion port-forward)`;
  exchange.context.reach = { sent: 0, received: 0 };
  // A client that ends its side still reads the target's answer: the end passes on as a half-close.
  upgrade.socket.allowHalfOpen = true;
  return undefined;
}

/**
 * Who sent the request, or anonymous with the reason (for the log). An identity that cannot reach the API server
 * exactly as its authenticator gave it (identity.ts) is refused like any failed authentication.
 */
async function authenticate(deps: ProxyDeps, req: Request): Promise<Identity> {
  const identity = deps.signedIn?.(req) ?? (await deps.authenticator.authenticate(req));
  if (identity.kind !== 'user') return identity;
  const problem = identityProblem(identity.user);
  return problem ? { kind: 'anonymous', reason: `${identity.via}: ${problem}` } : identity;
}

/**
 * The caller as the API server of the cluster the request is for sees them (a user Sealion authenticates is in
 * system:authenticated too; a workload is its mapped identity there), or why a workload has no identity there.
 */
function asSeen(decider: Decider, cluster: string, identity: Authenticated): UserInfo | Refusal {
  if (identity.kind === 'serviceaccount') return identity.user;
  if (identity.kind === 'user') {
    // As forwarded there: with the user's grants' groups on that cluster and the reason and access-request extras.
    const forwarded = decider.forwardedUser(cluster, identity);
    return { ...forwarded, groups: authenticatedGroups(forwarded) };
  }
  const target = decider.target(cluster, identity);
  if ('status' in target) return target;
  const mapped = target.actingAs!;
  return { ...mapped, groups: authenticatedGroups(mapped) };
}

/** What the audit's authenticator annotation says of how the caller was authenticated. */
const authenticatedBy = (identity: Authenticated): string =>
  identity.kind === 'user' ? identity.via : identity.kind;

/** Sealion's facts for a request's audit event so far: the cluster it is for, and who authenticated the caller. */
function annotations(exchange: Exchange, identity?: Authenticated): Record<string, string> {
  const { cluster } = exchange.context;
  return {
    ...(cluster ? { [ANNOTATIONS.cluster]: cluster } : {}),
    ...(identity ? { [ANNOTATIONS.authenticator]: authenticatedBy(identity) } : {}),
  };
}

/** What a forwarded request's audit event says of how it was decided. */
function annotateDecision(exchange: Exchange): void {
  const { context } = exchange;
  const { audit, cluster } = context;
  if (!audit) return;
  const mode = context.decision ?? 'legacy';
  const dialer = cluster ? `cluster ${cluster}'s agent` : 'this concierge';
  const decider = cluster ? `cluster ${cluster}'s` : "the hub's";
  audit.annotate(ANNOTATIONS.route, context.route!);
  audit.annotate(ANNOTATIONS.decision, context.decision ?? 'forwarded');
  audit.annotate(
    ANNOTATIONS.reason,
    context.reach
      ? `a reach connection, dialed by ${dialer} once that cluster's API server allows it (impersonation in ${mode} mode)`
      : context.decision === 'passthrough'
        ? 'a service account of this cluster, forwarded with its own token; the API server decides'
        : `forwarded by impersonation (${mode} mode); ${decider} API server decides`,
  );
  if (context.impersonated) audit.impersonating(context.impersonated);
}

/** What kind of long session an upgrade is, as a draining replica counts it. */
function sessionKind(exchange: Exchange, parsed: ParsedRequest, viaDoor: boolean): SessionKind {
  if (viaDoor) return 'ssh';
  if (exchange.context.reach) return 'reach';
  const sub = parsed.attributes.resourceRequest ? parsed.attributes.subresource : '';
  return sub === 'exec' || sub === 'attach' ? sub : sub === 'portforward' ? 'port-forward' : 'stream';
}

/**
 * Registers what is about to be forwarded with `sessions`, until its client's side closes: a plain request, a watch
 * (ended cleanly by a drain), a long answer or an upgraded session (closed with a message when the drain's grace
 * ends). The transport sets how each is ended (context.end) once it relays.
 */
function register(sessions: Sessions, exchange: Exchange, parsed: ParsedRequest, viaDoor: boolean): void {
  const { context } = exchange;
  const end = (message: string): void => context.end?.(message);
  const done =
    exchange.kind === 'plain' && !parsed.longRunning
      ? sessions.request()
      : exchange.kind === 'plain' && parsed.verb === 'watch'
        ? sessions.watch(() => end(''))
        : sessions.session(
            exchange.kind === 'plain' ? 'stream' : sessionKind(exchange, parsed, viaDoor),
            end,
          );
  onClose(exchange, done);
  // A client that left while its request was authenticated and decided emitted its 'close' before this: it is done
  // now (done is once-only), or the drain would wait on it, and hold it, for ever.
  if (gone(exchange)) done();
}

/** An exchange held under its grants (holdUnderGrants). */
interface GrantHold {
  /** The message of the first of its grants that ended before it was relayed; undefined while none has. */
  ended(): string | undefined;
  /**
   * It is relayed now. Returns what to call once it is on its way (a grant that ended while it waited for its turn on
   * the hop, nothing relayed yet and context.end not set, ends it then), or undefined for a short request, which is
   * let go here: it ends by itself.
   */
  relaying(): (() => void) | undefined;
}

/**
 * Holds the exchange under the grants its target was decided with (target.grants), from that moment on: a grant that
 * ends while the request is decided or recorded (each an await) has it refused rather than relayed with the ended
 * grant's groups; one that ends later ends what it relays (a watch, a long answer, an upgraded session) with a message,
 * until its client's side closes.
 */
function holdUnderGrants(
  grantSessions: GrantSessions,
  exchange: Exchange,
  grants: readonly string[] | undefined,
  parsed: ParsedRequest,
): GrantHold | undefined {
  if (!grants) return undefined;
  const { context } = exchange;
  let relayed = false;
  let endedBefore: string | undefined;
  let endedEarly: string | undefined;
  const release = grantSessions.add(grants, (message) => {
    if (!relayed) endedBefore ??= message;
    else if (context.end) context.end(message);
    else endedEarly = message;
  });
  onClose(exchange, release);
  if (gone(exchange)) release();
  return {
    ended: () => endedBefore,
    relaying() {
      relayed = true;
      if (exchange.kind === 'plain' && !parsed.longRunning) {
        release();
        return undefined;
      }
      return () => {
        if (endedEarly !== undefined) context.end?.(endedEarly);
      };
    },
  };
}

/** Refuses a request as decided: its audit event says so and why. */
function refuseDecided(exchange: Exchange, refusal: Refusal): void {
  exchange.context.audit?.annotate(ANNOTATIONS.decision, 'refused');
  exchange.context.audit?.annotate(ANNOTATIONS.reason, refusal.message);
  refuse(exchange, refusal);
}

/** The refusal of a request whose grant ended before it was relayed; undefined while none has. */
function grantEnded(hold: GrantHold | undefined): Refusal | undefined {
  const message = hold?.ended();
  return message === undefined ? undefined : { status: 403, message };
}

/** decide → record → the cluster's route. */
async function forward(
  decider: Decider,
  routeWaits: RouteWaits | undefined,
  record: RecordStage,
  exchange: Exchange,
  identity: Authenticated,
  parsed: ParsedRequest,
  sessions: Sessions | undefined,
  grantSessions: GrantSessions,
  viaDoor: boolean,
): Promise<void> {
  const { req, context } = exchange;
  let target = decider.target(context.cluster, identity);
  // A cluster between tunnels (its agent moving to another replica) is waited for a moment, when nothing but its
  // route stood in the way.
  if ('unrouted' in target && routeWaits) {
    // A plain request in flight to the drain meanwhile: a replica that stops gives it the grace to end, with a Status.
    const waited = sessions?.request();
    await routeWaits.until(context.cluster, identity.user.username, exchange);
    waited?.();
    target = decider.target(context.cluster, identity);
  }
  if ('status' in target) return refuse(exchange, target);
  // Held from the moment its grants were read, before anything is awaited, so that no grant's end goes unheard.
  const hold = holdUnderGrants(grantSessions, exchange, target.grants, parsed);
  const plan = await decider.plan(req, identity, parsed.longRunning, target, context);
  if ('status' in plan) return refuseDecided(exchange, plan);
  const endedWhileDecided = grantEnded(hold);
  if (endedWhileDecided) return refuseDecided(exchange, endedWhileDecided);
  context.route = target.route.kind;
  annotateDecision(exchange);
  if (sessions) register(sessions, exchange, parsed, viaDoor);
  const recording = record(exchange, parsed.attributes, parsed.query);
  const refused = recording && (await recording);
  if (refused) return refuse(exchange, refused);
  const endedWhileRecorded = grantEnded(hold);
  if (endedWhileRecorded) return refuseDecided(exchange, endedWhileRecorded);
  const onItsWay = hold?.relaying();
  // Returned, not awaited: this stage's state (the identity, the target's review closures) goes as soon as the
  // request is on its way, rather than live as long as a watch does.
  const forwarding = target.route.forward(exchange, plan);
  return onItsWay ? forwarding.then(onItsWay) : forwarding;
}

/**
 * Begins the request's audit as `user` (undefined: nobody was authenticated), when there is an auditor. False when
 * it was refused for it; `refusal`: the message then, undefined for a request answered whatever the audit's state.
 */
function audited(
  auditor: Auditor | undefined,
  exchange: Exchange,
  facts: RequestFacts | undefined,
  user: UserInfo | undefined,
  identity?: Authenticated,
  refusal: string | undefined = NOT_AUDITED,
): boolean | Promise<boolean> {
  return (
    !auditor || !facts || startAudit(exchange, auditor, facts, user, annotations(exchange, identity), refusal)
  );
}

/** Refuses a request nobody was authenticated for; it is audited as such. */
async function refuseUnknown(
  auditor: Auditor | undefined,
  exchange: Exchange,
  facts: RequestFacts | undefined,
  refusal: Refusal,
): Promise<void> {
  await audited(auditor, exchange, facts, undefined);
  refuse(exchange, refusal);
}

/** An anonymous local API: audited as the anonymous user; only health while the proxy is switched off. */
async function serveAnonymous(
  deps: ProxyDeps,
  exchange: Exchange,
  api: LocalAPI,
  facts: RequestFacts | undefined,
  path: string,
): Promise<void> {
  const { req, res } = asPlain(exchange)!;
  const refusal = api.probe ? undefined : NOT_AUDITED;
  if (api.probe) exchange.context.probe = true;
  if (!(await audited(deps.auditor, exchange, facts, ANONYMOUS, undefined, refusal))) return;
  if (!api.probe && !deps.serving()) return refuse(exchange, NOT_SERVING);
  return api.serve(req, res, path, undefined);
}

export function newProxyHandler(deps: ProxyDeps): ProxyHandler {
  const { log, auditor } = deps;
  const observe = newObserver(deps.metrics, log, deps.logUsernames ?? true);
  const apis = localAPIs(hubAPIs({ ...deps, login: loginDeps(deps), recordingStore: deps.recordingStore }));
  const decider = newDecider(deps);
  const grantSessions = newGrantSessions(deps.grants ?? NO_GRANTS);
  const record = newRecorder(deps.recordings, log, (exchange) => deps.partOfRecording?.(exchange.req));
  const { lastConnected } = deps;
  const routeWaits =
    lastConnected && newRouteWaits({ router: deps.router, lastConnected, clock: deps.clock ?? systemClock });

  async function serve(exchange: Exchange): Promise<void> {
    const { req, context } = exchange;
    const original = req.url ?? '/';
    const parsed = readRequest(exchange);
    const { path } = parsed;
    observe(exchange, parsed.verb, parsed.longRunning, context.cluster ? pathOf(original) : path);
    const facts = auditor && requestFacts(req, context.id, original, parsed.attributes);
    const problem = malformed(exchange, parsed);
    if (problem) return refuseUnknown(auditor, exchange, facts, { status: 400, message: problem });
    const plain = asPlain(exchange);
    const api = plain && apis.find(path, plain.req.method ?? 'GET');
    if (api?.who === 'anonymous') return serveAnonymous(deps, exchange, api, facts, path);
    if (!deps.serving()) return refuseUnknown(auditor, exchange, facts, NOT_SERVING);
    const identity = await authenticate(deps, req);
    if (identity.kind === 'anonymous') {
      log.info({ id: context.id, reason: identity.reason, path }, 'authentication failed');
      return refuseUnknown(auditor, exchange, facts, { status: 401, message: UNAUTHORIZED });
    }
    context.user = identity.user.username;
    // A reach connection's client has shown who it is: its session's streams get the window uploads need.
    if (context.reach && req instanceof H2Request) widenStreamWindows(req.stream.session);
    if (!(await audited(auditor, exchange, facts, identity.user, identity))) return;
    // The hub's own APIs; a path for a cluster (/clusters/<name>/apis/…) is that cluster's to answer.
    if (plain && api?.who === 'authenticated' && !(api.hubOnly && context.cluster)) {
      const seen = asSeen(decider, context.cluster, identity);
      if ('status' in seen) return refuse(exchange, seen);
      return api.serve(plain.req, plain.res, path, seen);
    }
    const viaDoor = deps.signedIn?.(req) !== undefined;
    return forward(
      decider,
      routeWaits,
      record,
      exchange,
      identity,
      parsed,
      deps.sessions,
      grantSessions,
      viaDoor,
    );
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
    close: () => grantSessions.close(),
  };
}

/** What the TokenCredentialRequest and WhoAmIRequest APIs need of the proxy's dependencies. */
function loginDeps(deps: ProxyDeps) {
  return {
    groups: deps.groups,
    cache: deps.cache,
    signer: deps.signer,
    log: deps.log,
    ...(deps.bodyTimeoutMs === undefined ? {} : { bodyTimeoutMs: deps.bodyTimeoutMs }),
    ...(deps.clock ? { clock: deps.clock } : {}),
  };
}
