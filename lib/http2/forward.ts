// One request relayed to an HTTP/2 upstream, and its answer back. Every hop that carries a plain request runs this:
// the hub to its API server, the hub through a tunnel to an agent, and the agent to its cluster's API server. So an
// upstream that answers before it has read the whole body (the API server refusing a write, or a body over its
// limit) means the same at each hop: it sends its whole answer, then resets the stream with NO_ERROR to ask for no
// more of the body (RFC 9113, section 8.1). The answer is relayed, the rest of the body goes nowhere, and the next
// hop towards the client is told to stop sending too.
import type { IncomingMessage } from 'node:http';
import {
  constants,
  type ClientHttp2Stream,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
} from 'node:http2';
import { systemClock, type Clock } from '../clock.ts';
import { H2Response, type Request, type Response } from './request.ts';
import { endToEnd } from './hop-by-hop.ts';
import { answerHeadTooLarge, HeadersTooLarge } from './header-block.ts';
import { relay, type RelayOptions } from './memory-budget.ts';

/**
 * How long an HTTP/1.1 client may go on sending a body nobody reads once the upstream has answered. HTTP/1.1 can stop
 * a body only by closing the connection, and closing it while the client still sends can make the client's system
 * drop the answer unread; so the rest is read and dropped for this long (enough for megabytes at any usable speed),
 * which keeps the connection for the next request, and the connection closes after that.
 */
export const DISCARD_BODY_MS = 5_000;

export class UpstreamTimeout extends Error {
  readonly code = 'SEALION_UPSTREAM_TIMEOUT';
}

/** Whether the caller sent a request body (possibly empty) that must be streamed on. */
export function hasBody(req: Request): boolean {
  if ('stream' in req) return !req.stream.endAfterHeaders;
  const length = req.headers['content-length'];
  return (length !== undefined && length !== '0') || req.headers['transfer-encoding'] !== undefined;
}

export interface Http2ForwardOptions {
  /** Opens the upstream stream, with its end already sent when there is no body; may throw. */
  open(headers: OutgoingHttpHeaders, endStream: boolean): ClientHttp2Stream;
  /** Answers the client when there is no answer to relay, or cuts an answer already started short. */
  fail(err: Error & { code?: string }): void;
  /** The stream may be idle this long before it is cancelled and UpstreamTimeout failed. Default: no limit. */
  idleTimeoutMs?: number;
  /** Sends the answer's head at once, before any of its body (a watch with no events yet). */
  flushHeaders?: boolean;
  /** How the answer's body is relayed: whom its unread bytes are charged to, and how long it may stall. */
  relay?: RelayOptions;
  /**
   * Told the answer's status and head once the head is written to the client; may return an observer of the answer's
   * body, which sees each chunk as it is relayed (and never holds it up).
   */
  onAnswer?(status: number, headers: IncomingHttpHeaders): AnswerObserver | undefined;
  /** Times how long an HTTP/1.1 client's unread body is drained (DISCARD_BODY_MS). Default: systemClock. */
  clock?: Clock;
}

/** Sees an answer's body go by. */
export interface AnswerObserver {
  data(chunk: Buffer): void;
  end(): void;
}

/**
 * Sends `req` upstream with `headers` (pseudo-headers included) and relays the answer into `res`. Returns the
 * upstream stream, or nothing when it could not be opened (`fail` has answered then). The stream is cancelled when
 * the response closes first.
 */
export function forwardOverHttp2(
  req: Request,
  res: Response,
  headers: OutgoingHttpHeaders,
  opts: Http2ForwardOptions,
): ClientHttp2Stream | undefined {
  const body = hasBody(req);
  let stream: ClientHttp2Stream;
  try {
    stream = opts.open(headers, !body);
  } catch (err) {
    opts.fail(err as Error);
    return undefined;
  }
  let answered = false;
  /** A failure of the upstream, unless the client has had another answer meanwhile (a deadline's). */
  const failed = (err: Error): void => {
    if (answered ? !res.writableFinished : !res.headersSent) opts.fail(err);
  };
  stream.on('response', (answer) => {
    const status = Number(answer[':status']);
    // Not from a conforming upstream; never handed to writeHead, which throws on it.
    if (!(status >= 200 && status <= 599)) {
      stream.close(constants.NGHTTP2_CANCEL);
      return opts.fail(new Error(`the upstream answered with status ${answer[':status']}`));
    }
    // What belongs to the upstream's hop stays there (lib/http2/hop-by-hop.ts).
    const head = endToEnd(answer);
    // A head Node would not send on would close the client's connection (header-block.ts): no API server sends one.
    if (answerHeadTooLarge(head)) {
      stream.close(constants.NGHTTP2_CANCEL);
      return opts.fail(new Error('the upstream answered with a head too large to relay'));
    }
    answered = true;
    res.writeHead(status, head);
    // An HTTP/2 response sends its head in writeHead already; an HTTP/1.1 one waits for the first body chunk.
    if (opts.flushHeaders && 'flushHeaders' in res) res.flushHeaders();
    const observer = opts.onAnswer?.(status, answer);
    if (observer) {
      stream.on('data', (chunk: Buffer) => observer.data(chunk));
      stream.once('end', () => observer.end());
    }
    relay(stream, res, opts.relay);
  });
  stream.on('error', failed);
  // Closed while the body was still going up: the upstream answered early (NO_ERROR) or the stream broke (an error,
  // relayed above). Either way nothing takes the rest of the body. 'aborted' comes at once, before the pipe writes
  // into the closed stream again, but only while the stream's end is not written; 'close' comes after the answer.
  // Without a body (every GET, every watch) there is nothing to stop, and no listener for it.
  const stopSending = body ? bodyStopper(req, res, stream, opts.clock ?? systemClock) : undefined;
  if (stopSending) stream.on('aborted', stopSending);
  stream.on('close', () => {
    if (!answered) failed(new Error(`the upstream closed the stream (HTTP/2 code ${stream.rstCode})`));
    stopSending?.();
  });
  if (opts.idleTimeoutMs !== undefined) {
    stream.setTimeout(opts.idleTimeoutMs, () => {
      opts.fail(new UpstreamTimeout('the upstream did not answer in time'));
      stream.close(constants.NGHTTP2_CANCEL);
    });
  }
  res.on('close', () => {
    if (!stream.closed) stream.close(constants.NGHTTP2_CANCEL);
  });
  if (body) req.pipe(stream);
  return stream;
}

/**
 * Stops sending the rest of the body once (stopBody), unless it has all gone. Made apart from forwardOverHttp2's
 * listeners, which would otherwise keep the request (its headers, raw and parsed) for as long as the answer lasts.
 */
function bodyStopper(req: Request, res: Response, upstream: ClientHttp2Stream, clock: Clock): () => void {
  let stopped = false;
  return () => {
    if (stopped || requestEnded(req)) return;
    stopped = true;
    stopBody(req, res, upstream, clock);
  };
}

const requestEnded = (req: Request): boolean => ('stream' in req ? req.stream.readableEnded : req.complete);

/**
 * Stops sending the rest of a request's body upstream: over HTTP/2 the client is told to stop once its whole answer
 * is on the way (stopping sooner would cut the answer short); over HTTP/1.1 the rest is read and dropped (see
 * DISCARD_BODY_MS).
 */
function stopBody(req: Request, res: Response, upstream: ClientHttp2Stream, clock: Clock): void {
  req.unpipe(upstream);
  if (!(res instanceof H2Response)) return discardRest(req as IncomingMessage, clock);
  // The relay ends the response at the answer's 'end', which comes before this listener's.
  const refuse = (): void => void setImmediate(() => res.refuseRestOfRequest());
  if (upstream.readableEnded) refuse();
  else upstream.once('end', refuse);
}

/** Reads and drops what is left of an HTTP/1.1 request's body, for DISCARD_BODY_MS at most. */
function discardRest(req: IncomingMessage, clock: Clock): void {
  // Kept alive, as the connection it drains is.
  const timer = clock.setTimeout(() => req.socket.destroy(), DISCARD_BODY_MS, { keepAlive: true });
  const stop = (): void => clock.clearTimeout(timer);
  req.once('end', stop);
  req.once('close', stop);
  req.resume();
}

/** One small request's answer (callOverHttp2). */
export interface CallAnswer {
  status: number;
  body: Buffer;
}

export class CallFailed extends Error {
  readonly code = 'SEALION_CALL_FAILED';
  /** The status to answer the request the call served with, when the call was refused for a reason of its own. */
  readonly status: number | undefined;

  constructor(message: string, status?: number) {
    super(message);
    this.status = status;
  }
}

/** The bounds of one call (callOverHttp2). */
export interface CallLimits {
  timeoutMs: number;
  maxBytes: number;
  /** Times `timeoutMs`. Default: systemClock. */
  clock?: Clock;
}

/**
 * Sends one small request of the process's own (a SubjectAccessReview, say) on a stream `open` gives, and reads its
 * whole answer. Bounded both ways: the answer may be at most `maxBytes`, and all of it must come within `timeoutMs`.
 */
export function callOverHttp2(
  open: (headers: OutgoingHttpHeaders, endStream: boolean) => ClientHttp2Stream,
  headers: OutgoingHttpHeaders,
  body: Buffer | undefined,
  opts: CallLimits,
): Promise<CallAnswer> {
  const clock = opts.clock ?? systemClock;
  return new Promise((done, fail) => {
    let stream: ClientHttp2Stream;
    try {
      stream = open(body ? { ...headers, 'content-length': body.length } : headers, !body);
    } catch (err) {
      // A block too large to send (lib/http2/header-block.ts) answers the request the call serves with 431.
      if (err instanceof HeadersTooLarge) return fail(new CallFailed(err.message, err.status));
      return fail(err instanceof Error ? err : new CallFailed(String(err)));
    }
    let status = 0;
    let size = 0;
    const chunks: Buffer[] = [];
    // Kept alive: a caller awaits the answer.
    const timer = clock.setTimeout(
      () => {
        stream.close(constants.NGHTTP2_CANCEL);
        fail(new CallFailed(`no answer within ${opts.timeoutMs} ms`));
      },
      opts.timeoutMs,
      { keepAlive: true },
    );
    const settle = (err?: Error): void => {
      clock.clearTimeout(timer);
      if (err) fail(err);
      else done({ status, body: Buffer.concat(chunks) });
    };
    stream.on('response', (answer) => (status = Number(answer[':status'])));
    stream.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size <= opts.maxBytes) return void chunks.push(chunk);
      stream.close(constants.NGHTTP2_CANCEL);
      settle(new CallFailed(`the answer is over ${opts.maxBytes} bytes`));
    });
    stream.on('end', () => settle(status ? undefined : new CallFailed('the stream ended without an answer')));
    stream.on('error', (err: Error) => settle(err));
    stream.on('close', () => settle(new CallFailed(`the stream closed (HTTP/2 code ${stream.rstCode})`)));
    if (body) stream.end(body);
  });
}
