// The end of a reach connection: inside the cluster it is for (the concierge for the hub, the agent for every other
// cluster), where the cluster's own API server decides and the connection is dialed.
//
// - Decided here, by this cluster: a SelfSubjectAccessReview sent with the request's Impersonate-* headers, so the
//   API server answers for the user Sealion forwards as, and refuses at once if the forwarding identity may not act
//   as that user (the constrained impersonation its admin granted). The agent also asks whether the cluster's
//   forwarding policy lets it act for that kind of identity on this object at all (decide.ts forwardingRefusal), as
//   the hub did: a hub that skipped it gets no further.
// - Dialed here: only an address of the object named, read from this cluster's API server: a pod's own address, or
//   for a Service one of its ready endpoints, each checked against the pod it names. Never an address a user wrote:
//   a Service's ClusterIP would let kube-proxy pick an endpoint a hand-made EndpointSlice names (the API server's, a
//   node's, anything), an ExternalName any host. Pods on their node's network, loopback, link-local and multicast
//   addresses, and the API server's own addresses are refused.
// - Bounded: connections at once, per user and in all; the time to connect; an idle connection is closed.
import { createHash } from 'node:crypto';
import type { IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import { BlockList, connect as netConnect, isIP, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { CallAnswer } from '../http2/forward.ts';
import type { MemoryBudget } from '../http2/memory-budget.ts';
import { fieldsOf } from '../http2/request.ts';
import { answerSwitched } from '../http2/upgrade.ts';
import { selfSubjectAccessReview, reviewAllowed, type AccessQuestion } from '../kube/access-review.ts';
import {
  forwardedAs,
  forwardingRefusal,
  MalformedImpersonationError,
  NOBODY,
  requestedImpersonation,
} from '../kube/impersonation.ts';
import type { RawReader } from '../kube/kube.ts';
import { newReviewCache, ReviewUnavailable } from '../kube/review-cache.ts';
import { refuseConnection, statusMessageOf, type Refusal } from '../kube/status.ts';
import type { Logger } from '../log.ts';
import { systemClock, type Clock } from '../clock.ts';
import { join } from '../streams/join.ts';
import { describeTarget, parseReach, reachAttributes, REACH_UPGRADE, type ReachTarget } from './target.ts';

/** This cluster's objects a reach connection reads, as the dialer itself; each read throws a Refused when it fails. */
export interface ReachReads {
  pod(namespace: string, name: string): Promise<PodObject>;
  service(namespace: string, name: string): Promise<ServiceObject>;
  /** The EndpointSlices of a Service. */
  endpointSlices(namespace: string, service: string): Promise<EndpointSliceObject[]>;
}

/** Sends a SelfSubjectAccessReview to this cluster's API server as the forwarding identity, with `headers` added. */
export type ReachReview = (body: Buffer, headers: OutgoingHttpHeaders) => Promise<CallAnswer>;

export interface ReachLimits {
  /** Connections open at once, all users together. */
  total: number;
  /** Connections one user holds at once. */
  perUser: number;
  /** A connection with no byte either way for this long is closed. */
  idleMs: number;
  /** How long a dial may take. */
  connectMs: number;
}

/**
 * 2,048 connections at once (half of what the concierge's listener takes, so reach cannot starve kubectl), 512 for one
 * user (a browser behind a forward opens dozens); an hour without a byte
 * closes one (the kubelet's streaming idle timeout is four); ten seconds to connect.
 */
export const DEFAULT_REACH_LIMITS: ReachLimits = {
  total: 2048,
  perUser: 512,
  idleMs: 60 * 60_000,
  connectMs: 10_000,
};

/** What one connection carried, when it ends. */
export interface ReachFacts {
  user: string;
  target: string;
  /** The address dialed: `ip:port`. */
  endpoint: string;
  /** Bytes from the client to the target, and back. */
  sent: number;
  received: number;
  ms: number;
}

export interface ReacherDeps {
  reads: ReachReads;
  review: ReachReview;
  /**
   * Ask the forwarding policy too (decide.ts forwardingRefusal): the agent does, since the hub's answer is not this
   * cluster's; the hub's concierge asked it already in its decide stage.
   */
  checkPolicy: boolean;
  log: Logger;
  limits?: Partial<ReachLimits>;
  /** Opens a TCP connection (tests). Default: net.connect. */
  connect?: (host: string, port: number) => Socket;
  /** Told what each connection carried once it ends. */
  ended?: (facts: ReachFacts) => void;
  /** Times kept reads, dials and idle connections. Default: the system's. */
  clock?: Clock;
  /**
   * Where the bytes a side leaves unread are charged, per user (lib/http2/memory-budget.ts): at the agent, the client's
   * side is a tunnel stream, which holds a stream window for a target that does not read. Default: nowhere.
   */
  budget?: MemoryBudget;
}

/** One reach upgrade, as whoever dials reads it. */
export interface ReachRequest {
  /** Path and query. */
  url: string;
  /** The Upgrade header's value. */
  upgrade: string;
  /** The Impersonate-* fields that name whom it is for, as name/value pairs in order (repeated ones kept apart). */
  rawImpersonation: string[];
  /**
   * Whose connections these count as, for the per-user bound: the user who authenticated (where that is known, the
   * concierge), not whom they act as, so `--as` does not multiply a share. Default: the impersonated user (the agent,
   * behind the hub's fair share per authenticated user).
   */
  holder?: string;
}

/** What is known of a reach connection while it lasts, for its request's log line and audit event. */
export interface ReachTally {
  /** 101 once connected, or the status of the Status it was refused with. */
  status?: number;
  /** The message of the Status it was refused with. */
  message?: string;
  sent: number;
  received: number;
  /** The address dialed, once connected: `ip:port`. */
  endpoint?: string;
  /** Told when the target accepted and the 101 was sent. */
  connected?: () => void;
}

/** The reach request an upgrade to this process carries: the Impersonate-* headers it was sent with. */
export function reachRequestOf(req: IncomingMessage): ReachRequest {
  const rawImpersonation: string[] = [];
  for (let i = 0; i + 1 < req.rawHeaders.length; i += 2)
    if (req.rawHeaders[i]!.toLowerCase().startsWith('impersonate-'))
      rawImpersonation.push(req.rawHeaders[i]!, req.rawHeaders[i + 1]!);
  return { url: req.url ?? '/', upgrade: String(req.headers['upgrade'] ?? ''), rawImpersonation };
}

export interface Reacher {
  /** Serves one reach upgrade on `socket`, keeping `tally` up to date. */
  serve(request: ReachRequest, socket: Duplex, head: Buffer, tally?: ReachTally): void;
  /** Connections open now. */
  open(): number;
  /** Closes every connection. */
  close(): void;
}

export const SELF_REVIEW_PATH = '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews';

/**
 * How long one read of a pod, a Service or its EndpointSlices serves further connections: a burst of connections to
 * one object (a browser's, a pool's) costs its reads once, not per connection. Kept short, as kube-proxy's own view
 * of endpoints lags: a pod that went away is dialed for at most this long, and fails to connect.
 */
const READ_TTL_MS = 1_000;
/** Objects whose reads are kept: the targets of a burst, not a cluster's worth. */
const MAX_KEPT_READS = 1_000;

/** `reads`, each answer (or refusal) kept READ_TTL_MS, and reads under way shared. */
function keptReads(reads: ReachReads, clock: Clock): ReachReads {
  const kept = new Map<string, { at: number; answer: Promise<unknown> }>();
  const keep = <T>(key: string, read: () => Promise<T>): Promise<T> => {
    const now = clock.now();
    const found = kept.get(key);
    if (found && now - found.at < READ_TTL_MS) return found.answer as Promise<T>;
    if (kept.size >= MAX_KEPT_READS)
      for (const [k, v] of kept) if (now - v.at >= READ_TTL_MS || kept.size >= MAX_KEPT_READS) kept.delete(k);
    const answer = read();
    kept.set(key, { at: now, answer });
    // A read that could not be made is not kept: the next connection asks again.
    answer.catch((err: unknown) => {
      if (!(err instanceof Refused) || err.refusal.status >= 500) kept.delete(key);
    });
    return answer;
  };
  return {
    pod: (namespace, name) =>
      keep(JSON.stringify(['pod', namespace, name]), () => reads.pod(namespace, name)),
    service: (namespace, name) =>
      keep(JSON.stringify(['service', namespace, name]), () => reads.service(namespace, name)),
    endpointSlices: (namespace, service) =>
      keep(JSON.stringify(['slices', namespace, service]), () => reads.endpointSlices(namespace, service)),
  };
}

/** How long the API server's own addresses are kept before they are read again. */
const APISERVER_ADDRESSES_TTL_MS = 30_000;
/** Endpoints tried for one connection to a Service before it fails. */
const MAX_ENDPOINT_TRIES = 3;

/**
 * Addresses never dialed: this host, link-local and the clouds' metadata services, unspecified, multicast, broadcast;
 * and the IPv6 forms that carry an IPv4 address another way (mapped in hex, compatible, NAT64, 6to4), which a pod's
 * address never takes, so that no IPv4 address is reached under a form the checks above would not recognise.
 */
const NEVER_V4 = new BlockList();
for (const [net, prefix] of [
  ['0.0.0.0', 8],
  ['127.0.0.0', 8],
  ['169.254.0.0', 16],
  ['100.100.100.200', 32],
  ['224.0.0.0', 4],
  ['255.255.255.255', 32],
] as const)
  NEVER_V4.addSubnet(net, prefix, 'ipv4');
// Apart: a BlockList matches IPv4 addresses against IPv6 rules for the forms that carry them.
const NEVER_V6 = new BlockList();
for (const [net, prefix] of [
  ['::', 96],
  ['::1', 128],
  ['::ffff:0:0', 96],
  ['64:ff9b::', 96],
  ['2002::', 16],
  ['fe80::', 10],
  ['fd00:ec2::254', 128],
  ['ff00::', 8],
] as const)
  NEVER_V6.addSubnet(net, prefix, 'ipv6');

/** Whether `ip` is one of `addresses`, compared as addresses (any spelling of an IPv6 one), not as text. */
function isOneOf(ip: string, addresses: Iterable<string | undefined>): boolean {
  const plainIP = plainAddress(ip);
  if (isIP(plainIP) === 4) {
    // Dotted decimal has one spelling (isIP takes no other, no leading zeros): among IPv4 addresses alone, text
    // compares as the BlockList would, without its cost (a native address object per entry; every connection asks
    // three times). An IPv6 entry, which may carry an IPv4 address another way, takes the BlockList.
    let allV4 = true;
    for (const a of addresses) {
      const plain = a && plainAddress(a);
      if (plain === plainIP) return true;
      if (plain && isIP(plain) !== 4) allV4 = false;
    }
    if (allV4) return false;
  }
  const list = new BlockList();
  for (const a of addresses) {
    const plain = a && plainAddress(a);
    const family = plain ? isIP(plain) : 0;
    if (family) list.addAddress(plain!, family === 4 ? 'ipv4' : 'ipv6');
  }
  const plain = plainAddress(ip);
  const family = isIP(plain);
  return family !== 0 && list.check(plain, family === 4 ? 'ipv4' : 'ipv6');
}

/** An address as the dial sees it: an IPv4-mapped IPv6 address is its IPv4 one. */
function plainAddress(ip: string): string {
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(ip);
  return mapped ? mapped[1]! : ip.toLowerCase();
}

/** Why `ip` is never dialed; undefined when it may be. */
export function addressProblem(ip: string): string | undefined {
  const plain = plainAddress(ip);
  const family = isIP(plain);
  if (family === 0) return `"${ip.slice(0, 64)}" is not an IP address`;
  if (family === 4 ? NEVER_V4.check(plain, 'ipv4') : NEVER_V6.check(plain, 'ipv6'))
    return `${plain} is a loopback, link-local, metadata, unspecified, multicast or IPv4-in-IPv6 address`;
  return undefined;
}

/** Impersonate-* fields as headers to send on (repeated fields kept apart, in order). */
function impersonationOf(rawHeaders: string[]): Record<string, string | string[]> {
  return fieldsOf(rawHeaders, (name) => !name.startsWith('impersonate-'));
}

interface Endpoint {
  ip: string;
  port: number;
  /** The pod the address must belong to (a Service's endpoint): checked before it is dialed. */
  pod?: { name: string; uid?: string };
}

export interface PodObject {
  metadata?: { uid?: string };
  spec?: {
    hostNetwork?: boolean;
    containers?: { ports?: { name?: string; containerPort?: number; protocol?: string }[] }[];
  };
  status?: {
    phase?: string;
    podIPs?: { ip?: string }[];
    podIP?: string;
    hostIPs?: { ip?: string }[];
    hostIP?: string;
  };
}

export interface ServiceObject {
  spec?: {
    type?: string;
    clusterIPs?: string[];
    ports?: { name?: string; port?: number; protocol?: string }[];
  };
}

export interface EndpointSliceObject {
  addressType?: string;
  ports?: { name?: string; port?: number; protocol?: string }[] | null;
  endpoints?: {
    addresses?: string[];
    conditions?: { ready?: boolean };
    targetRef?: { kind?: string; name?: string; uid?: string };
  }[];
}

/** Why a reach connection is refused: its Status. */
export class Refused extends Error {
  readonly refusal: Refusal;

  constructor(refusal: Refusal) {
    super(refusal.message);
    this.refusal = refusal;
  }
}

export const refused = (status: number, message: string, retryAfterSeconds?: number): Refused =>
  new Refused({ status, message, ...(retryAfterSeconds === undefined ? {} : { retryAfterSeconds }) });

/**
 * Reads as `reader`'s identity (kept-alive HTTP/2 connections: a connection's reads are three calls); each failure is
 * the Status the connection is refused with (not found, not allowed, or unavailable: retry).
 */
export function kubeReachReads(reader: RawReader): ReachReads {
  const read = async <T>(path: string, what: string): Promise<T> => {
    let answer: { status: number; body: Buffer };
    try {
      answer = await reader.get(path);
    } catch (err) {
      throw refused(503, `${what} could not be read: ${(err as Error).message.slice(0, 200)}`, 1);
    }
    if (answer.status === 404) throw refused(404, `${what} not found`);
    if (answer.status === 403)
      throw refused(403, `${what} could not be read: Sealion may not read it in this cluster`);
    if (answer.status !== 200) throw refused(503, `${what} could not be read: HTTP ${answer.status}`, 1);
    try {
      return JSON.parse(answer.body.toString('utf8')) as T;
    } catch {
      throw refused(503, `${what} could not be read: the answer is not JSON`, 1);
    }
  };
  const e = encodeURIComponent;
  return {
    pod: (namespace, name) => read(`/api/v1/namespaces/${e(namespace)}/pods/${e(name)}`, `pods "${name}"`),
    service: (namespace, name) =>
      read(`/api/v1/namespaces/${e(namespace)}/services/${e(name)}`, `services "${name}"`),
    endpointSlices: async (namespace, service) =>
      (
        await read<{ items?: EndpointSliceObject[] }>(
          `/apis/discovery.k8s.io/v1/namespaces/${e(namespace)}/endpointslices?labelSelector=${e(`kubernetes.io/service-name=${service}`)}`,
          `the endpoints of service ${namespace}/${service}`,
        )
      ).items ?? [],
  };
}

export function newReacher(deps: ReacherDeps): Reacher {
  const limits = { ...DEFAULT_REACH_LIMITS, ...deps.limits };
  const clock = deps.clock ?? systemClock;
  const reads = keptReads(deps.reads, clock);
  const authorize = newAuthorizer(deps);
  const dial = newDial({
    reads,
    apiserverAddresses: keptApiserverAddresses(reads, clock),
    connect: deps.connect ?? ((host, port) => netConnect({ host, port, allowHalfOpen: true })),
    clock,
    connectMs: limits.connectMs,
  });
  const places = newPlaces(limits);

  /** Authorized, an address found, dialed: the target's connection and where, or the refusal that ends it. */
  async function reach(
    asked: AskedReach,
    socket: Duplex,
  ): Promise<{ conn: Socket; endpoint: string } | undefined> {
    await authorize(asked.target, asked.request, asked.impersonation);
    let last: Refused | undefined;
    for (const endpoint of await endpointsOf(reads, asked.target)) {
      if (socket.destroyed) return undefined;
      try {
        return { conn: await dial(asked.target, endpoint), endpoint: `${endpoint.ip}:${endpoint.port}` };
      } catch (err) {
        if (!(err instanceof Refused)) throw err;
        last = err;
        // A refusal of the address itself is final; a dial that failed tries the next endpoint.
        if (![502, 503, 504].includes(err.refusal.status)) break;
      }
    }
    throw last ?? refused(503, `${describeTarget(asked.target)} could not be reached`, 1);
  }

  return {
    serve(request, socket, head, tally = { sent: 0, received: 0 }) {
      // A client gone while it was authenticated and decided would never close again.
      if (socket.destroyed) return;
      socket.on('error', () => socket.destroy());
      const refuse = (r: Refusal): void => {
        tally.status = r.status;
        tally.message = r.message;
        refuseConnection(socket, r);
      };
      const asked = askedReach(request);
      if ('status' in asked) return refuse(asked);
      const full = places.take(asked.user, socket);
      if (full) return refuse(full);
      const started = clock.now();
      reach(asked, socket)
        .then((reached) => {
          if (!reached) return;
          if (socket.destroyed) return void reached.conn.destroy();
          tally.status = 101;
          tally.endpoint = reached.endpoint;
          tally.connected?.();
          const about = { user: asked.user, target: describeTarget(asked.target), tally, started };
          spliceReach(socket, reached.conn, head, about, { ...deps, clock, idleMs: limits.idleMs });
        })
        .catch((err: unknown) => {
          if (err instanceof Refused) return refuse(err.refusal);
          deps.log.error({ err: (err as Error).message }, 'a reach connection failed');
          refuse({ status: 500, message: 'internal error while reaching the target' });
        });
    },
    open: () => places.open(),
    close: () => places.close(),
  };
}

/** A reach request as read: what it names, for whom, and whose share it takes. */
interface AskedReach {
  request: ReachRequest;
  target: ReachTarget;
  impersonation: Record<string, string | string[]>;
  /** Whose share of connections it takes. */
  user: string;
}

/** What a reach request asks for, or the refusal of a request that does not say it properly. */
function askedReach(request: ReachRequest): AskedReach | Refusal {
  const target = parseReach(request.url);
  if ('problem' in target) return { status: 400, message: target.problem };
  if (request.upgrade.toLowerCase() !== REACH_UPGRADE)
    return { status: 400, message: `a reach connection is an upgrade to ${REACH_UPGRADE}` };
  const impersonation = impersonationOf(request.rawImpersonation);
  const impersonated = impersonation['impersonate-user'];
  if (typeof impersonated !== 'string' || impersonated === '')
    return { status: 403, message: 'a reach connection must name the one user it is for' };
  return { request, target, impersonation, user: request.holder ?? impersonated };
}

/** The connections open, bounded per user and in all. */
interface Places {
  /** Counts `socket` as `user`'s until it closes; the refusal when there is no place for it. */
  take(user: string, socket: Duplex): Refusal | undefined;
  open(): number;
  /** Destroys every connection. */
  close(): void;
}

function newPlaces(limits: ReachLimits): Places {
  const perUser = new Map<string, number>();
  const live = new Set<Duplex>();
  return {
    take(user, socket) {
      if (live.size >= limits.total)
        return {
          status: 503,
          message: `${limits.total} reach connections are open here; retry later`,
          retryAfterSeconds: 1,
        };
      const held = perUser.get(user) ?? 0;
      if (held >= limits.perUser)
        return {
          status: 429,
          message: `you hold ${limits.perUser} reach connections here, the most one user may`,
          retryAfterSeconds: 1,
        };
      perUser.set(user, held + 1);
      live.add(socket);
      socket.once('close', () => {
        live.delete(socket);
        const n = (perUser.get(user) ?? 1) - 1;
        if (n > 0) perUser.set(user, n);
        else perUser.delete(user);
      });
      return undefined;
    },
    open: () => live.size,
    close() {
      for (const socket of live) socket.destroy();
    },
  };
}

/** The addresses of the API server itself: its Service's cluster IPs and its endpoints, read at most every 30 s. */
function keptApiserverAddresses(reads: ReachReads, clock: Clock): () => Promise<string[]> {
  let kept: { at: number; addresses: Promise<string[]> } | undefined;
  return () => {
    if (kept && clock.now() - kept.at < APISERVER_ADDRESSES_TTL_MS) return kept.addresses;
    const addresses = (async () => {
      const service = await reads.service('default', 'kubernetes');
      const slices = await reads.endpointSlices('default', 'kubernetes');
      const all = [...(service.spec?.clusterIPs ?? [])];
      for (const slice of slices)
        for (const endpoint of slice.endpoints ?? []) all.push(...(endpoint.addresses ?? []));
      return all;
    })();
    kept = { at: clock.now(), addresses };
    // A failure is not kept: the next connection asks again.
    addresses.catch(() => {
      if (kept?.addresses === addresses) kept = undefined;
    });
    return addresses;
  };
}

type Authorize = (
  target: ReachTarget,
  request: ReachRequest,
  impersonation: Record<string, string | string[]>,
) => Promise<void>;

/** Whether this cluster lets the user reach a target, asked as the request's impersonation; throws the refusal if not. */
function newAuthorizer(deps: Pick<ReacherDeps, 'review' | 'checkPolicy'>): Authorize {
  const reviews = newReviewCache();
  const askSelf = reviews.asking('self', (q) => selfReview(deps.review, q, {}));
  return async (target, request, impersonation) => {
    const attributes = reachAttributes(target);
    const scope = createHash('sha256').update(JSON.stringify(impersonation)).digest('base64');
    try {
      if (deps.checkPolicy) {
        const policy = await policyRefusal(request, attributes, askSelf);
        if (policy) throw new Refused(policy);
      }
      const question: AccessQuestion = { ...NOBODY, ...attributes };
      const allowed = await reviews.asking(scope, (q) => selfReview(deps.review, q, impersonation))(question);
      if (!allowed)
        throw refused(
          403,
          `${target.kind} "${attributes.name}" is forbidden: User "${String(impersonation['impersonate-user'])}" cannot create resource "${attributes.resource}/${attributes.subresource}" in API group "" in the namespace "${target.namespace}"`,
        );
    } catch (err) {
      if (err instanceof ReviewUnavailable) throw refused(err.status, err.message, 1);
      if (err instanceof MalformedImpersonationError)
        throw refused(400, `malformed impersonation headers: ${err.message}`);
      throw err;
    }
  };
}

/** Whether this cluster's forwarding policy lets the forwarding identity act for the request's user here at all. */
function policyRefusal(
  request: ReachRequest,
  attributes: ReturnType<typeof reachAttributes>,
  askSelf: (question: AccessQuestion) => Promise<boolean>,
): Promise<Refusal | undefined> {
  const requested = requestedImpersonation(request.rawImpersonation);
  const user = {
    username: requested?.user ?? '',
    groups: requested?.groups ?? [],
    extra: requested?.extra ?? {},
    ...(requested?.uid ? { uid: requested.uid } : {}),
  };
  const usernameOnly = user.groups.length === 0 && Object.keys(user.extra).length === 0 && !user.uid;
  return forwardingRefusal({ cluster: '', askSelf }, attributes, forwardedAs(user, usernameOnly));
}

/** A SelfSubjectAccessReview, sent with `headers`: the API server answers for whom they impersonate. */
async function selfReview(
  review: ReachReview,
  question: AccessQuestion,
  headers: OutgoingHttpHeaders,
): Promise<boolean> {
  let answer: CallAnswer;
  try {
    answer = await review(Buffer.from(JSON.stringify(selfSubjectAccessReview(question))), headers);
  } catch (err) {
    throw new ReviewUnavailable(`the API server could not be asked: ${(err as Error).message}`, err);
  }
  const message = (): string =>
    statusMessageOf(answer.body.toString('utf8'))?.slice(0, 300) ?? `HTTP ${answer.status}`;
  // The impersonation itself was refused: the forwarding identity may not act as this user here.
  if (answer.status === 403)
    throw refused(403, `this cluster's policy for Sealion refuses acting as this user: ${message()}`);
  if (answer.status !== 201 && answer.status !== 200)
    throw new ReviewUnavailable(`the API server answered a SelfSubjectAccessReview with ${message()}`);
  try {
    return reviewAllowed(JSON.parse(answer.body.toString('utf8')));
  } catch (err) {
    throw new ReviewUnavailable('the API server answered a SelfSubjectAccessReview with malformed JSON', err);
  }
}

/** A pod's container port by name, or the number given. */
function podPort(pod: PodObject, port: number | string): number {
  if (typeof port === 'number') return port;
  for (const container of pod.spec?.containers ?? [])
    for (const p of container.ports ?? [])
      if (p.name === port && (p.protocol ?? 'TCP') === 'TCP' && p.containerPort) return p.containerPort;
  throw refused(400, `the pod has no TCP container port named "${port}"`);
}

/** Why a pod's address must not be dialed: not its own, or its node's. */
function podAddressProblem(pod: PodObject, ip: string): string | undefined {
  if (pod.spec?.hostNetwork) return "it uses its node's network, and a node's addresses are never dialed";
  if (pod.status?.phase !== 'Running') return `it is ${pod.status?.phase ?? 'not running'}`;
  if (!isOneOf(ip, [...(pod.status?.podIPs ?? []).map((p) => p.ip), pod.status?.podIP]))
    return `${ip} is not its address`;
  if (isOneOf(ip, [...(pod.status?.hostIPs ?? []).map((p) => p.ip), pod.status?.hostIP]))
    return `${ip} is its node's address`;
  return undefined;
}

/** The addresses to try for `target`, in order. */
async function endpointsOf(reads: ReachReads, target: ReachTarget): Promise<Endpoint[]> {
  if (target.kind === 'pods') {
    const pod = await reads.pod(target.namespace, target.name);
    const ip = pod.status?.podIPs?.[0]?.ip ?? pod.status?.podIP;
    if (!ip) throw refused(503, `pod ${target.namespace}/${target.name} has no address yet`, 1);
    const problem = podAddressProblem(pod, ip);
    if (problem) throw refused(403, `pod ${target.namespace}/${target.name} cannot be reached: ${problem}`);
    return [{ ip, port: podPort(pod, target.port) }];
  }
  const service = await reads.service(target.namespace, target.name);
  if (service.spec?.type === 'ExternalName')
    throw refused(
      403,
      `service ${target.namespace}/${target.name} is an ExternalName, a host outside the cluster, which is never dialed`,
    );
  const port = (service.spec?.ports ?? []).find(
    (p) =>
      (p.protocol ?? 'TCP') === 'TCP' &&
      (typeof target.port === 'number' ? p.port === target.port : p.name === target.port),
  );
  if (!port) throw refused(404, `service ${target.namespace}/${target.name} has no TCP port ${target.port}`);
  const found = readyPodEndpoints(await reads.endpointSlices(target.namespace, target.name), port.name ?? '');
  if (found.length === 0)
    throw refused(
      503,
      `service ${target.namespace}/${target.name} has no ready pod behind port ${target.port}`,
      1,
    );
  // A connection per endpoint in turn, as kube-proxy spreads them: shuffled.
  for (let i = found.length - 1; i > 0; i--) {
    const j = Math.floor(Math.random() * (i + 1));
    [found[i], found[j]] = [found[j]!, found[i]!];
  }
  return found.slice(0, MAX_ENDPOINT_TRIES);
}

/** The endpoints of a Service's port named `portName` that are ready and a pod's, as kube-proxy reads them. */
function readyPodEndpoints(slices: EndpointSliceObject[], portName: string): Endpoint[] {
  const found: Endpoint[] = [];
  for (const slice of slices) {
    if (slice.addressType !== 'IPv4' && slice.addressType !== 'IPv6') continue;
    const slicePort = (slice.ports ?? []).find(
      (p) => (p.name ?? '') === portName && (p.protocol ?? 'TCP') === 'TCP',
    );
    if (!slicePort?.port) continue;
    for (const endpoint of slice.endpoints ?? []) {
      const ip = endpoint.addresses?.[0];
      // Ready unless it says otherwise, as kube-proxy reads it; and only a pod's, which is checked before a dial.
      if (
        !ip ||
        endpoint.conditions?.ready === false ||
        endpoint.targetRef?.kind !== 'Pod' ||
        !endpoint.targetRef.name
      )
        continue;
      const { name, uid } = endpoint.targetRef;
      found.push({ ip, port: slicePort.port, pod: { name, ...(uid ? { uid } : {}) } });
    }
  }
  return found;
}

interface DialDeps {
  reads: ReachReads;
  apiserverAddresses: () => Promise<string[]>;
  connect: (host: string, port: number) => Socket;
  clock: Clock;
  connectMs: number;
}

type Dial = (target: ReachTarget, endpoint: Endpoint) => Promise<Socket>;

/** Checks an endpoint and dials it: the connected socket, or why not. */
function newDial(deps: DialDeps): Dial {
  return async (target, endpoint) => {
    const problem = addressProblem(endpoint.ip);
    if (problem) throw refused(403, `${describeTarget(target)}: ${problem}`);
    if (isOneOf(endpoint.ip, await deps.apiserverAddresses()))
      throw refused(
        403,
        `${describeTarget(target)}: ${endpoint.ip} is the API server's address, which is never dialed`,
      );
    if (endpoint.pod) {
      const pod = await deps.reads.pod(target.namespace, endpoint.pod.name);
      if (endpoint.pod.uid && pod.metadata?.uid !== endpoint.pod.uid)
        throw refused(503, `${describeTarget(target)}: the endpoint's pod was replaced`, 1);
      const bad = podAddressProblem(pod, endpoint.ip);
      if (bad)
        throw refused(403, `${describeTarget(target)}: pod ${endpoint.pod.name} cannot be reached: ${bad}`);
    }
    return connectWithin(deps, `${describeTarget(target)}: ${endpoint.ip}:${endpoint.port}`, endpoint);
  };
}

/** Connects to `endpoint` within `connectMs`; the refusal (504 late, 502 failed) names it as `named`. */
function connectWithin(
  { connect, clock, connectMs }: DialDeps,
  named: string,
  endpoint: Endpoint,
): Promise<Socket> {
  return new Promise((done, fail) => {
    const conn = connect(endpoint.ip, endpoint.port);
    const timer = clock.setTimeout(() => {
      conn.destroy();
      fail(refused(504, `${named} did not accept within ${connectMs} ms`));
    }, connectMs);
    conn.once('connect', () => {
      clock.clearTimeout(timer);
      done(conn);
    });
    conn.once('error', (err: Error & { code?: string }) => {
      clock.clearTimeout(timer);
      fail(refused(502, `${named}: ${err.code ?? err.message}`));
    });
  });
}

/**
 * Joins the client's connection and the target's (lib/streams/join.ts): each side's end passed on as a half-close,
 * the bytes counted on the tally, what a side leaves unread charged to the user, an idle connection closed.
 */
function spliceReach(
  socket: Duplex,
  conn: Socket,
  head: Buffer,
  about: { user: string; target: string; tally: ReachTally; started: number },
  deps: Pick<ReacherDeps, 'budget' | 'ended'> & { clock: Clock; idleMs: number },
): void {
  const { tally, user } = about;
  tally.sent += head.length;
  conn.setNoDelay(true);
  // Half-closes pass through: the side that ends its writing still reads.
  (socket as Duplex & { allowHalfOpen: boolean }).allowHalfOpen = true;
  // A 101 on an HTTP/1.1 carrier; a 200 on an HTTP/2 extended CONNECT (lib/http2/upgrade.ts).
  answerSwitched(
    socket,
    `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${REACH_UPGRADE}\r\n\r\n`,
  );
  if (head.length > 0) conn.write(head);
  join(socket, conn, {
    ...(deps.budget ? { account: { budget: deps.budget, user } } : {}),
    idle: { ms: deps.idleMs, clock: deps.clock },
    counts: tally,
    closed: () =>
      deps.ended?.({
        user,
        target: about.target,
        endpoint: tally.endpoint ?? '',
        sent: tally.sent,
        received: tally.received,
        ms: deps.clock.now() - about.started,
      }),
  });
}
