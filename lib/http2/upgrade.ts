// Forwards an HTTP/1.1 upgrade (exec, attach, port-forward; SPDY or WebSocket) and splices the client's connection
// to the upstream one once the upstream switches protocols. http-proxy-middleware's upgrade path (httpxy) passes
// only WebSocket upgrades sent with GET and drops every other: SPDY's upgrade is a POST, which kubectl sends for
// exec, attach and port-forward when WebSockets are off, and older clients always do.
//
// The splice is lib/streams/join.ts: two relays (memory-budget.ts), one each way, so that what a side leaves unread is
// charged to the user's memory budget as an unread answer is (through a tunnel or a peer link the upstream is an
// HTTP/2 stream, which holds a stream window for a client that stops reading), with the close rules every join has.
import type { ClientRequest, IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import type { ServerHttp2Stream } from 'node:http2';
import { finished, type Duplex } from 'node:stream';
import { systemClock, type Clock } from '../clock.ts';
import { join } from '../streams/join.ts';
import type { Account } from './memory-budget.ts';

/**
 * How long the last bytes Sealion writes to a connection it ends (a refusal's Status) may take to leave before the
 * connection is cut: a Status is a few hundred bytes, which a client that reads at all takes at once.
 */
export const LAST_WRITE_MS = 5_000;

/**
 * Writes `last` and closes the connection once it is written, whether or not the client ends its side: one that
 * never does would otherwise hold the connection, and whatever place it took on the way, for good. Any Duplex: a
 * TCP or TLS socket, a CONNECT stream of a peer link or a tunnel (HTTP/2, where closing a stream whose request the
 * peer has not ended resets it with NO_ERROR after the answer), or the in-process door's stream pair. `net.Socket`'s
 * destroySoon does the same, on sockets only; a client that reads nothing is cut after LAST_WRITE_MS.
 */
export function endAndClose(socket: Duplex, last: string | Buffer, clock: Clock = systemClock): void {
  if (socket.destroyed) return;
  // Ended already (a client's half-close on a connection that does not allow half-open ones): nothing can be written.
  if (!socket.writable) return void socket.destroy();
  const timer = clock.setTimeout(() => socket.destroy(), LAST_WRITE_MS);
  // Written, failed or closed: whichever comes first ends it, and the error (if any) goes no further than here.
  finished(socket, { readable: false }, () => {
    clock.clearTimeout(timer);
    socket.destroy();
  });
  socket.end(last);
}

/**
 * The streams of the proxy's HTTP/2 server that came as an extended CONNECT (RFC 8441: `sealion port-forward`'s
 * connections, each a stream of one session): such a connection is answered in HTTP/2 (a 200 HEADERS frame once the
 * target is connected, or the refusal's status and Status body), where every other carrier of an upgrade (a TLS
 * socket, a peer link's or a tunnel's CONNECT stream, the in-process door's stream pair) takes an HTTP/1.1 head. A
 * WeakSet rather than a flag on the stream: nothing else may read or set it, and it goes with the stream.
 */
const extendedConnects = new WeakSet<Duplex>();

/** Marks `stream` as an extended CONNECT, answered in HTTP/2 by answerSwitched and answerRefused. */
export function answersInHttp2(stream: ServerHttp2Stream): void {
  extendedConnects.add(stream);
}

/** Whether `socket` is an extended CONNECT's stream, answered in HTTP/2 (answersInHttp2). */
export const answeredInHttp2 = (socket: Duplex): boolean => extendedConnects.has(socket);

/**
 * Tells the client its upgrade is through: `http1Head` (a 101 and its fields) on an HTTP/1.1 carrier, a 200 without
 * END_STREAM on an extended CONNECT. The bytes that follow are the connection's either way.
 */
export function answerSwitched(socket: Duplex, http1Head: string): void {
  if (socket.destroyed) return;
  if (!answeredInHttp2(socket)) return void socket.write(http1Head);
  const stream = socket as ServerHttp2Stream;
  if (!stream.headersSent) stream.respond({ ':status': 200 });
}

/**
 * Answers an upgrade with a refusal and closes the connection once it is written (endAndClose): on an HTTP/1.1
 * carrier `http1Answer()`, the whole answer as bytes; on an extended CONNECT `status` and `fields` in the stream's
 * HEADERS frame (HTTP/2 has no connection fields: the caller leaves them out), then `body` with END_STREAM.
 */
export function answerRefused(
  socket: Duplex,
  status: number,
  fields: OutgoingHttpHeaders,
  body: Buffer,
  http1Answer: () => string | Buffer,
): void {
  if (!answeredInHttp2(socket)) return endAndClose(socket, http1Answer());
  if (socket.destroyed) return;
  const stream = socket as ServerHttp2Stream;
  // Answered already (a 200, then a failure): nothing but the stream's reset can tell the client now.
  if (stream.headersSent) return void stream.destroy(new Error('reach connection failed'));
  stream.respond({ ...fields, ':status': status, 'content-length': body.length });
  endAndClose(stream, body);
}

/** An answer that refuses the upgrade is relayed whole; more than this of its body is cut. */
const MAX_REFUSAL_BODY = 256 * 1024;
/** Headers that describe the upstream connection's framing, not the answer; the relayed answer sets its own. */
const FRAMING = /^(?:content-length|transfer-encoding|connection|keep-alive)$/i;
/** Connection-specific fields, which an HTTP/2 answer must not carry (RFC 9113 section 8.2.2). */
const HTTP2_FORBIDDEN = /^(?:upgrade|proxy-connection|te)$/i;

export interface UpgradeForwardOptions {
  /** Sends the request upstream: its method and path, the headers the caller chose, through the caller's agent. */
  send(): ClientRequest;
  /** Answers the client when the upstream failed before it answered (nothing has been written to the client). */
  fail(err: Error): void;
  /** Told the upstream's status: 101 when it switched protocols, else the refusal it relays. */
  answered?(status: number): void;
  /**
   * Asked once the upstream has switched protocols, before the client is told: an observer of the bytes both ways
   * (which never holds them up), or an Error to refuse the upgrade with instead (`fail` answers it; the upstream
   * connection is closed). Default: nothing observes.
   */
  tap?(res: IncomingMessage): UpgradeTap | Error | undefined;
  /**
   * Told the upstream connection once the upstream has switched protocols and the splice begins (after `tap`), for a
   * caller that may have to end the session itself (a draining replica). Default: nobody is told.
   */
  spliced?(upstream: Duplex, res: IncomingMessage): void;
  /** Where the bytes a side leaves unread are charged, both ways (memory-budget.ts). Default: nowhere. */
  account?: Account;
  /**
   * Cuts the connection when the client has taken nothing of what the upstream sent for `ms`. An idle connection (an
   * exec shell nobody types in) has nothing pending and is never cut. Default: no deadline.
   */
  deadline?: { ms: number; clock: Clock };
}

/** Sees the bytes of a spliced connection go by, in each direction, in order. */
export interface UpgradeTap {
  fromClient(chunk: Buffer): void;
  fromServer(chunk: Buffer): void;
  /** Both sides are gone. */
  end(): void;
}

/**
 * The request target as the upstream must read it: a path. A target in absolute form (`https://host/clusters/x`)
 * stays a path that starts with `/https:`, so the upstream can never read another path out of it than the one the
 * proxy judged.
 */
export function originForm(url: string | undefined): string {
  if (!url) return '/';
  return url.startsWith('/') ? url : `/${url}`;
}

function statusHead(res: IncomingMessage, drop?: RegExp, extra: string[] = []): string {
  const lines = [`HTTP/1.1 ${res.statusCode ?? 502} ${res.statusMessage ?? ''}`];
  for (let i = 0; i + 1 < res.rawHeaders.length; i += 2) {
    if (!drop?.test(res.rawHeaders[i]!)) lines.push(`${res.rawHeaders[i]}: ${res.rawHeaders[i + 1]}`);
  }
  return `${[...lines, ...extra].join('\r\n')}\r\n\r\n`;
}

/** An upstream answer's fields as an HTTP/2 answer may carry them: no framing or connection fields, names lower-case. */
function answerFields(res: IncomingMessage): OutgoingHttpHeaders {
  const fields: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(res.headers))
    if (value !== undefined && !FRAMING.test(name) && !HTTP2_FORBIDDEN.test(name)) fields[name] = value;
  return fields;
}

/** `head` holds the bytes the client sent after its request's headers. */
export function forwardUpgrade(socket: Duplex, head: Buffer, opts: UpgradeForwardOptions): void {
  let upstreamReq: ClientRequest;
  try {
    upstreamReq = opts.send();
  } catch (err) {
    // A request Node will not send (a target with characters HTTP forbids): answered, never thrown at the caller,
    // which may be a timer or a queue with nobody to catch it.
    return opts.fail(err as Error);
  }
  let answered = false;
  const abandon = (): void => void upstreamReq.destroy();
  // The client left before the answer: nothing waits for the upstream any more.
  socket.once('close', abandon);
  socket.on('error', () => socket.destroy());

  upstreamReq.on('upgrade', (res: IncomingMessage, upstream: Duplex, upstreamHead: Buffer) => {
    answered = true;
    socket.off('close', abandon);
    const tap = opts.tap?.(res);
    if (tap instanceof Error) {
      upstream.destroy();
      if (!socket.destroyed) opts.fail(tap);
      return;
    }
    opts.answered?.(101);
    opts.spliced?.(upstream, res);
    splice(socket, head, upstream, upstreamHead, statusHead(res), tap, opts);
  });

  upstreamReq.on('response', (res: IncomingMessage) => {
    answered = true;
    opts.answered?.(res.statusCode ?? 502);
    // Not switched (a 403, a 400): the answer goes back whole, and the connection closes, since its framing was
    // the upstream connection's.
    const chunks: Buffer[] = [];
    let size = 0;
    res.on('data', (chunk: Buffer) => {
      if (size < MAX_REFUSAL_BODY) chunks.push(chunk.subarray(0, MAX_REFUSAL_BODY - size));
      size += chunk.length;
    });
    res.on('error', () => socket.destroy());
    res.on('end', () => {
      const body = Buffer.concat(chunks);
      const framing = [`Content-Length: ${body.length}`, 'Connection: close'];
      answerRefused(socket, res.statusCode ?? 502, answerFields(res), body, () =>
        Buffer.concat([Buffer.from(statusHead(res, FRAMING, framing)), body]),
      );
    });
  });

  upstreamReq.on('error', (err: Error) => {
    if (answered) return void socket.destroy();
    socket.off('close', abandon);
    if (!socket.destroyed) opts.fail(err);
  });
  try {
    upstreamReq.end();
  } catch (err) {
    // Node checks some headers only when it writes them (a Trailer on a request it does not send chunked): such a
    // request fails as one Node would not create does, instead of throwing out of the caller.
    socket.off('close', abandon);
    upstreamReq.destroy();
    if (!socket.destroyed) opts.fail(err as Error);
  }
}

/**
 * Joins the client's connection and the upstream's once the upstream switched protocols: the client is told, each
 * side is given what the other sent with the request's or the answer's headers, and `tap` sees it all go by.
 */
function splice(
  socket: Duplex,
  head: Buffer,
  upstream: Duplex,
  upstreamHead: Buffer,
  switched: string,
  tap: UpgradeTap | undefined,
  opts: UpgradeForwardOptions,
): void {
  answerSwitched(socket, switched);
  if (tap) {
    // Listeners beside the relays': they see every chunk the relays move, and pause with them.
    if (upstreamHead.length > 0) tap.fromServer(upstreamHead);
    if (head.length > 0) tap.fromClient(head);
    upstream.on('data', (chunk: Buffer) => tap.fromServer(chunk));
    socket.on('data', (chunk: Buffer) => tap.fromClient(chunk));
  }
  if (upstreamHead.length > 0 && !socket.destroyed) socket.write(upstreamHead);
  if (head.length > 0) upstream.write(head);
  // A side that closes once both its ways ended is ended on the other, after what was relayed from it is written:
  // destroying at once would drop the last bytes, a WebSocket's close frame among them. A side cut short (destroyed by
  // a deadline, the budget or a recording that stopped; a stream its peer reset) cuts the other too.
  join(socket, upstream, {
    ...(opts.account ? { account: opts.account } : {}),
    ...(opts.deadline ? { deadline: opts.deadline } : {}),
    ...(tap ? { closed: () => tap.end() } : {}),
  });
}
