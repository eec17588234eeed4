// The pipeline's last stage: an admitted request carried over one hop (the hub's API server, an agent's tunnel, a
// peer replica) and its answer relayed back. This is the one place where a plain request and an upgrade part: a
// plain request goes as an HTTP/2 request (lib/http2/forward.ts), an upgrade as HTTP/1.1 spliced through once the
// upstream switches protocols (lib/http2/upgrade.ts). What differs between hops is only what a Hop says.
//
// A hop with a progress deadline (a tunnel, shared by everyone who reaches its cluster) cuts a request that makes no
// progress for that long: an answer or an upgraded connection's data the client does not read, a body that stopped
// arriving. So nobody holds a place in it by reading or writing slowly.
import type { ClientRequest, IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import { constants, type ClientHttp2Stream, type IncomingHttpHeaders } from 'node:http2';
import type { Duplex, Readable } from 'node:stream';
import type { Clock } from '../../lib/clock.ts';
import {
  callOverHttp2,
  forwardOverHttp2,
  hasBody,
  type AnswerObserver,
  type CallAnswer,
} from '../../lib/http2/forward.ts';
import { HeadersTooLarge, upgradeHeadTooLarge } from '../../lib/http2/header-block.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import { endAndClose, forwardUpgrade, originForm, type UpgradeTap } from '../../lib/http2/upgrade.ts';
import type { Response } from '../../lib/http2/request.ts';
import { closingBytes, watchBoundary, webSocketBoundary, type Boundary } from './session-close.ts';
import { Unrecordable } from '../recording/session.ts';
import { ANNOTATIONS, type RequestAudit } from '../audit/audit.ts';
import type { ReachTally } from '../../lib/reach/dialer.ts';
import { protobufObjectMeta } from '../audit/protobuf-meta.ts';
import { refuse, type Exchange, type PlainExchange, type Refusal, type UpgradeExchange } from './exchange.ts';

/**
 * The API server ends its own short requests after 60 s; the proxy waits a little longer so the API server's
 * timeout, with its own Status, is what clients normally see.
 */
export const SHORT_REQUEST_TIMEOUT_MS = 65_000;

/** What the stages before the transport decided about a request. */
export interface ForwardPlan {
  /** The request's headers for the next hop: the caller's, cleaned, with the impersonation decided. */
  headers: OutgoingHttpHeaders;
  longRunning: boolean;
  /**
   * The request carries the caller's own token for the API server (a service account): it goes over connections
   * without the proxy's client certificate, which the API server would otherwise prefer over the token.
   */
  passthrough: boolean;
  /**
   * The authenticated user's name, before any nested impersonation: whose request this is, for limits kept per
   * user (a tunnel's fair share). Impersonating others does not give a caller more shares.
   */
  user: string;
}

/** One small request the concierge itself sends to a cluster: no impersonation, the forwarder's identity. */
export interface OwnCall {
  method: string;
  path: string;
  body: Buffer;
  /** Whose request it serves: it counts against that user's share of a tunnel, as their requests do. */
  user: string;
  /** Headers besides the forwarding identity's (a review sent as an impersonated user's). Default: none. */
  headers?: OutgoingHttpHeaders;
}

/** One hop a request can take. */
export interface Hop {
  /** The plan's headers as this hop must carry them (a new object, or the plan's own when nobody reads it again). */
  headers(plan: ForwardPlan): OutgoingHttpHeaders;
  /** Put before the request's path on this hop (a peer's `/clusters/<name>`). */
  pathPrefix: string;
  /** Opens an HTTP/2 stream for a plain request, its end sent already when there is no body; may throw. */
  open(headers: OutgoingHttpHeaders, endStream: boolean): ClientHttp2Stream;
  /** Sends an upgrade as HTTP/1.1 over this hop. */
  send(method: string, path: string, headers: OutgoingHttpHeaders): ClientRequest;
  /** What the Status messages about this hop start with: `cluster <name>: `, or nothing for the hub's own. */
  statusPrefix: string;
  /** The Status for a failure of this hop. */
  failure(err: Error & { code?: string }): Refusal;
  /** How long a short (not long-running) request may be idle before it fails with 504. */
  shortTimeoutMs: number;
  /** Cuts a request that makes no progress for this long; never when undefined. */
  progressMs?: number;
  /** The progress deadline's timers. */
  clock: Clock;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). */
  budget?: MemoryBudget;
}

/**
 * Carries an admitted exchange over `hop`; `release`, if given, gives back what admitting it took, once what it holds
 * on the hop is gone. Returns as soon as the exchange is on its way: nothing is kept for the caller while it lasts
 * (a watch may last hours).
 */
export function transport(exchange: Exchange, hop: Hop, plan: ForwardPlan, release?: () => void): void {
  // A client gone before its turn came (it left while it waited or was authenticated) would never close again.
  if (exchange.kind === 'plain' ? exchange.res.destroyed : exchange.socket.destroyed) return release?.();
  if (exchange.kind === 'plain') plain(exchange, hop, plan, release);
  else upgrade(exchange, hop, plan, release);
}

function plain(exchange: PlainExchange, hop: Hop, plan: ForwardPlan, release?: () => void): void {
  const { req, res, context } = exchange;
  const headers = hop.headers(plan);
  headers[':method'] = req.method ?? 'GET';
  headers[':path'] = hop.pathPrefix + originForm(req.url);
  const progressMs = hop.progressMs;
  const audited = context.audit && auditAnswer(context.audit, plan.longRunning);
  // A long-running answer (a watch, a followed log) can be ended by a draining replica.
  const ending = plan.longRunning ? answerEnding(res, () => stream) : undefined;
  if (ending) context.end = () => ending.end();
  const onAnswer = ending
    ? (status: number, answer: IncomingHttpHeaders): AnswerObserver =>
        both(audited?.(status, answer), ending.observe(answer))
    : audited;
  const stream = forwardOverHttp2(req, res, headers, {
    open: (h, endStream) => hop.open(h, endStream),
    fail: (err) =>
      refuse(
        exchange,
        err instanceof HeadersTooLarge
          ? { status: err.status, message: `${hop.statusPrefix}${err.message}` }
          : hop.failure(err),
      ),
    ...(plan.longRunning ? { flushHeaders: true } : { idleTimeoutMs: hop.shortTimeoutMs }),
    ...(onAnswer ? { onAnswer } : {}),
    // A client that leaves the answer unread holds its stream and memory on every hop: cut, as any broken answer
    // is, once it has read nothing for the progress timeout, or at once when the user's unread answers are over
    // their share of this process's memory.
    relay: {
      tally: context,
      ...(progressMs === undefined ? {} : { deadline: { ms: progressMs, clock: hop.clock } }),
      ...(hop.budget ? { account: { budget: hop.budget, user: plan.user } } : {}),
    },
  });
  // A create's or an update's body names its object, which the API server's events name at every level.
  if (
    context.audit &&
    (context.audit.keepsRequest || context.audit.namesObject) &&
    stream !== undefined &&
    hasBody(req)
  )
    keepBody('stream' in req ? req.stream : req, req.headers['content-type'], context.audit);
  const watchingBody = progressMs !== undefined && stream !== undefined && hasBody(req);
  if (!release && !watchingBody) return;
  let stopWatchingBody = (): void => {};
  let finished = false;
  const finish = (): void => {
    if (finished) return;
    finished = true;
    stopWatchingBody();
    release?.();
  };
  res.on('close', finish);
  if (watchingBody) {
    const from: Readable = 'stream' in req ? req.stream : req;
    stopWatchingBody = watchBody(from, progressMs, hop.clock, () => {
      refuse(exchange, { status: 408, message: `${hop.statusPrefix}the request body stopped arriving` });
      // Closing the upstream stream frees its place at once (lib/tunnel/tunnel.ts). An HTTP/2 response that
      // ended before its request did closes only when the client ends or resets it.
      stream.close(constants.NGHTTP2_CANCEL);
      finish();
    });
  }
}

function upgrade(exchange: UpgradeExchange, hop: Hop, plan: ForwardPlan, release?: () => void): void {
  const { req, socket, head, context } = exchange;
  const headers = hop.headers(plan);
  headers['connection'] = 'Upgrade';
  headers['upgrade'] = req.headers['upgrade'];
  /** The connection the upgrade goes out on: until it is gone, it holds its place on the hop. */
  let carrier: Duplex | undefined;
  if (release) socket.once('close', () => releaseWhenGone(release, carrier));
  const path = hop.pathPrefix + originForm(req.url);
  const tooLarge = upgradeHeadTooLarge(req.method ?? 'GET', path, headers);
  if (tooLarge)
    return refuse(exchange, { status: tooLarge.status, message: `${hop.statusPrefix}${tooLarge.message}` });
  const ending = sessionEnding(socket, hop.clock);
  context.end = (message) => ending.end(message);
  const tap = context.recording
    ? recordingTap(exchange)
    : context.reach
      ? () => countingTap(context.reach!)
      : undefined;
  forwardUpgrade(socket, head, {
    send() {
      const sent = hop.send(req.method ?? 'GET', path, headers);
      sent.once('socket', (s: Duplex) => void (carrier = s));
      return sent;
    },
    // What the agent sent and the client leaves unread holds a stream window on every hop, as an unread answer does:
    // charged to the user, and cut once the client has read nothing for the progress timeout.
    ...(hop.budget ? { account: { budget: hop.budget, user: plan.user } } : {}),
    ...(hop.progressMs === undefined ? {} : { deadline: { ms: hop.progressMs, clock: hop.clock } }),
    fail: (err) =>
      refuse(
        exchange,
        err instanceof Unrecordable
          ? { status: 403, message: `${err.message}, and sessions must be recorded here` }
          : hop.failure(err),
      ),
    tap(res) {
      const inner = tap?.(res);
      return inner instanceof Error ? inner : ending.tap(inner);
    },
    spliced: (upstream, res) => ending.spliced(upstream, res),
    answered(status) {
      context.status = status;
      if (status === 101) context.audit?.responseStarted(status);
    },
  });
}

/** Both observers of an answer's body, either of which may be missing. */
function both(a: AnswerObserver | undefined, b: AnswerObserver): AnswerObserver {
  if (!a) return b;
  return {
    data(chunk) {
      a.data(chunk);
      b.data(chunk);
    },
    end() {
      a.end();
      b.end();
    },
  };
}

/**
 * Ends a long-running answer for a draining replica: once what the upstream sent ends on an event's boundary (at
 * once, or after the chunk that completes the event), nothing more is relayed and the response is completed, as the
 * API server completes a watch at its timeout; the client resumes from the last resourceVersion it read. Closing the
 * response cancels the upstream stream (lib/http2/forward.ts). An answer not begun yet is left to the stop.
 */
function answerEnding(
  res: Response,
  upstream: () => ClientHttp2Stream | undefined,
): { observe(answer: IncomingHttpHeaders): AnswerObserver; end(): void } {
  let boundary: Boundary | undefined;
  let pending = false;
  const endNow = (): void => {
    const stream = upstream();
    // The relay's listener goes with the others: nothing after the boundary reaches the client.
    stream?.pause();
    stream?.removeAllListeners('data');
    if (!res.writableFinished && !res.destroyed) res.end();
  };
  return {
    observe(answer) {
      boundary = watchBoundary(answer['content-type']);
      const seen = boundary;
      return {
        data(chunk) {
          seen.feed(chunk);
          if (!pending || !seen.atBoundary()) return;
          pending = false;
          // This chunk is relayed by the listener after this one; the next must not be.
          upstream()?.pause();
          process.nextTick(endNow);
        },
        end() {},
      };
    },
    end() {
      if (boundary?.atBoundary()) endNow();
      else pending = true;
    },
  };
}

/**
 * Ends an upgraded session for a draining replica with a message its client shows (session-close.ts says how, by
 * protocol), once what the upstream sent ends on a WebSocket frame's boundary (any point, for a protocol that is not
 * WebSocket). Nothing more is relayed to the client; the last bytes are written and the connection closes after them
 * (the splice then closes the upstream). A session asked to end before it is upgraded ends once it is, after what
 * came with the upstream's answer: an access request's grant may end while its session waits for its turn on a hop.
 */
function sessionEnding(
  socket: Duplex,
  clock: Clock,
): {
  tap(inner: UpgradeTap | undefined): UpgradeTap;
  spliced(upstream: Duplex, res: IncomingMessage): void;
  end(message: string): void;
} {
  let upstream: Duplex | undefined;
  let last: ((message: string) => Buffer) | undefined;
  let boundary: Boundary | undefined;
  let pending: string | undefined;
  const endNow = (message: string): void => {
    if (!upstream || !last) return;
    upstream.pause();
    upstream.removeAllListeners('data');
    endAndClose(socket, last(message), clock);
  };
  return {
    tap(inner) {
      return {
        fromClient: (chunk) => inner?.fromClient(chunk),
        fromServer(chunk) {
          inner?.fromServer(chunk);
          boundary?.feed(chunk);
          if (pending === undefined || !boundary?.atBoundary()) return;
          const message = pending;
          pending = undefined;
          upstream?.pause();
          process.nextTick(() => endNow(message));
        },
        end: () => inner?.end(),
      };
    },
    spliced(from, res) {
      upstream = from;
      const upgrade = String(res.headers['upgrade'] ?? '');
      const protocol = String(res.headers['sec-websocket-protocol'] ?? '');
      if (upgrade.toLowerCase() === 'websocket') boundary = webSocketBoundary();
      last = (message) => closingBytes(upgrade, protocol, message);
      if (pending === undefined) return;
      // The splice writes (and taps) what came with the answer first; a frame that it left under way ends the session
      // at the frame's end, in the tap above.
      process.nextTick(() => {
        if (pending === undefined || (boundary && !boundary.atBoundary())) return;
        const message = pending;
        pending = undefined;
        endNow(message);
      });
    },
    end(message) {
      if (upstream && (!boundary || boundary.atBoundary())) endNow(message);
      else pending = message;
    },
  };
}

/** Counts a reach connection's bytes both ways, for its log line and audit event. */
function countingTap(tally: ReachTally): UpgradeTap {
  return {
    fromClient: (chunk) => void (tally.sent += chunk.length),
    fromServer: (chunk) => void (tally.received += chunk.length),
    end() {},
  };
}

/**
 * The tap that records an exec or attach: a session whose protocol cannot be recorded is refused where recording is
 * required, and goes on unrecorded (its audit event says why) where it is not.
 */
function recordingTap(exchange: UpgradeExchange): (res: IncomingMessage) => UpgradeTap | Error | undefined {
  const { context } = exchange;
  return (res) => {
    const recording = context.recording!;
    // Where recording is required, a session whose recording stops ends: the client's side closes, and the splice
    // closes the upstream's.
    const tap = recording.tap(res, () => exchange.socket.destroy());
    if (!(tap instanceof Unrecordable)) return tap;
    context.audit?.annotate(ANNOTATIONS.recording, `not recorded: ${tap.message}`);
    return recording.required ? tap : undefined;
  };
}

/** One small request of the concierge's own (OwnCall) over `hop`, as the hop's forwarding identity. */
export function callOver(
  hop: Hop,
  own: OwnCall,
  limits: { timeoutMs: number; maxBytes: number },
): Promise<CallAnswer> {
  const headers = hop.headers({
    headers: { ...own.headers },
    longRunning: false,
    passthrough: false,
    user: own.user,
  });
  headers[':method'] = own.method;
  headers[':path'] = hop.pathPrefix + own.path;
  headers['content-type'] = 'application/json';
  headers['accept'] = 'application/json';
  return callOverHttp2((h, endStream) => hop.open(h, endStream), headers, own.body, limits);
}

/**
 * The largest request body an audit event keeps (the API server takes up to 3 MiB): a bigger one is left out and
 * the event says so, rather than hold megabytes per request in memory until it completes.
 */
export const MAX_AUDITED_BODY = 256 * 1024;

/**
 * What an answer tells its audit event: a long-running one's start (its body is a stream of events, never kept); a
 * short one's Status when it failed (its message and reason, as the API server's own event has them), and its
 * object when the policy keeps answers.
 */
function auditAnswer(
  audit: RequestAudit,
  longRunning: boolean,
): (status: number, headers: IncomingHttpHeaders) => AnswerObserver | undefined {
  return (status, headers) => {
    if (longRunning) {
      audit.responseStarted(status);
      return undefined;
    }
    if (!(audit.keepsResponse || status >= 300)) return undefined;
    if (!isJSON(headers['content-type']) || headers['content-encoding'] !== undefined) {
      if (audit.keepsResponse)
        audit.annotate(ANNOTATIONS.objects, 'the answer is not plain JSON (ask for JSON to have it kept)');
      return undefined;
    }
    const chunks: Buffer[] = [];
    let size = 0;
    return {
      data(chunk) {
        size += chunk.length;
        if (size <= MAX_AUDITED_BODY) chunks.push(chunk);
        else chunks.length = 0;
      },
      end() {
        if (size > MAX_AUDITED_BODY) {
          if (audit.keepsResponse)
            audit.annotate(ANNOTATIONS.objects, `response body over ${MAX_AUDITED_BODY} bytes, not kept`);
          return;
        }
        audit.answered(Buffer.concat(chunks).toString('utf8'));
      },
    };
  };
}

/** Kubernetes' protobuf encoding (the built-in kinds only). */
const PROTOBUF = 'application/vnd.kubernetes.protobuf';

/** JSON and the patch types that are JSON (merge, strategic merge, JSON patch); not YAML, protobuf or CBOR. */
const isJSON = (type: string | string[] | undefined): boolean =>
  typeof type === 'string' && /^application\/(?:[a-z-]+-patch\+)?json\b/.test(type);

/** Keeps a copy of the request body for its audit event, when it is JSON (an object, a patch). */
function keepBody(body: Readable, contentType: string | string[] | undefined, audit: RequestAudit): void {
  const protobuf = contentType === PROTOBUF;
  if (!isJSON(contentType)) {
    if (audit.keepsRequest) audit.annotate(ANNOTATIONS.objects, 'the request body is not JSON, not kept');
    // kubectl sends the built-in kinds as protobuf: their names are read from it, as the API server reads them.
    if (!protobuf || !audit.namesObject) return;
  }
  const chunks: Buffer[] = [];
  let size = 0;
  const take = (chunk: Buffer): void => {
    size += chunk.length;
    if (size <= MAX_AUDITED_BODY) chunks.push(chunk);
    else {
      chunks.length = 0;
      body.off('data', take);
      if (audit.keepsRequest)
        audit.annotate(ANNOTATIONS.objects, `request body over ${MAX_AUDITED_BODY} bytes, not kept`);
    }
  };
  body.on('data', take);
  body.once('end', () => {
    if (size > MAX_AUDITED_BODY) return;
    const bytes = Buffer.concat(chunks);
    if (!protobuf) return audit.requestBody(bytes.toString('utf8'));
    const names = protobufObjectMeta(bytes);
    if (names) audit.requestNames(names);
  });
}

/** Calls `release` once `carrier` (if there is one) is destroyed: until then it counts against its hop's limit. */
function releaseWhenGone(release: () => void, carrier: Duplex | undefined): void {
  if (!carrier || carrier.destroyed) return release();
  carrier.once('close', release);
}

/**
 * Watches a request body: `stalled` is called when no chunk arrived for `ms` before its end (the client stopped
 * sending, or the hop stopped taking it). One timer per body, checked and re-armed when it fires.
 */
function watchBody(body: Readable, ms: number, clock: Clock, stalled: () => void): () => void {
  let chunks = 0;
  let seen = -1;
  let timer: unknown;
  const check = (): void => {
    if (chunks === seen) return stalled();
    seen = chunks;
    timer = clock.setTimeout(check, ms);
  };
  const count = (): void => void chunks++;
  const stop = (): void => {
    clock.clearTimeout(timer);
    body.off('data', count);
  };
  body.on('data', count);
  body.once('end', stop);
  check();
  return stop;
}
