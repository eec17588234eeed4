// The reverse tunnel's multiplexer, both ends: HTTP/2 (node:http2, a well-tested multiplexer with per-stream flow
// control, a stream limit and PING) over the one connection the agent dialed: its TLS socket itself after an HTTP
// Upgrade to TUNNEL_UPGRADE, or a WebSocket stream where only WebSockets pass (lib/tunnel/dial.ts). The concierge is
// the HTTP/2 client. A plain request (watches included) is one HTTP/2 request, headers and body as the client's,
// which the agent relays to its API server as one HTTP/2 request again: nothing is parsed or written as HTTP/1.1 on
// the way. An upgrade (exec, port-forward) goes on a CONNECT stream, one byte stream to the agent's local proxy,
// which speaks HTTP/1.1 on it. A slow reader on one stream stops only that stream's window; every stream's buffered
// bytes are bounded by its window.
import { Agent as HttpAgent, type AgentOptions } from 'node:http';
import {
  connect,
  constants,
  performServerHandshake,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type Http2Session,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
  type ServerHttp2Stream,
  type Settings,
} from 'node:http2';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { systemClock, type Clock } from '../clock.ts';
import { FIELDS_AS_SENT } from '../http2/hop-by-hop.ts';
import { UNCOUNTED_SESSION_MEMORY_MB } from '../http2/pool.ts';
import { FORWARDED_HEADER_LIMITS, headersTooLarge } from '../http2/header-block.ts';
import { sizeWindows, STREAM_WINDOW_BYTES } from '../http2/window.ts';
import { CURRENT_PROTOCOL, formatProtocol } from './protocol.ts';

/** The HTTP Upgrade token of the direct transport: the tunnel's HTTP/2 runs on the upgraded TLS socket. */
export const TUNNEL_UPGRADE = 'sealion-tunnel-h2';
/**
 * The major of the tunnel protocol this build speaks, as TUNNEL_PROTOCOL_HEADER carries it in the agent's upgrade:
 * hubs of 2.0 serve an agent only when it says exactly `2` there. An agent that sends none speaks version 1
 * (HTTP/1.1 on CONNECT streams for every request), which the concierge no longer serves.
 */
export const TUNNEL_PROTOCOL = String(CURRENT_PROTOCOL.major);
export const TUNNEL_PROTOCOL_HEADER = 'x-sealion-tunnel-protocol';
/**
 * The whole version, major.minor (protocol.ts: the version and the skew policy), from 2.1 on: in the agent's upgrade
 * beside TUNNEL_PROTOCOL_HEADER, and in every answer of the hub's to it.
 */
export const TUNNEL_VERSION = formatProtocol(CURRENT_PROTOCOL);
export const TUNNEL_VERSION_HEADER = 'x-sealion-tunnel-protocol-version';
/**
 * Resolves once every write already made on `socket` has completed. Node's HTTP/2 takes over a native socket's
 * writes when a session starts on it, and aborts the process if a write made before (the Upgrade's request or
 * answer) completes after that.
 */
export function writesDone(socket: Duplex): Promise<void> {
  if (socket.writableLength === 0) return Promise.resolve();
  // Callbacks run in order: this one runs once every write before it has completed.
  return new Promise((done) => socket.write(Buffer.alloc(0), () => done()));
}

/**
 * The connection's window, shared by all streams (each stream's starts at lib/http2/window.ts STREAM_WINDOW_BYTES and
 * grows with what the tunnel carries).
 */
export const CONNECTION_WINDOW_BYTES = 16 * 1024 * 1024;
/** Default limit of concurrent streams per tunnel (a Cluster's spec.maxConcurrentStreams overrides it). */
export const DEFAULT_MAX_STREAMS = 1000;
/**
 * What the agent's end allows: twice the CRD's maximum for a Cluster's spec.maxConcurrentStreams (100,000). The
 * concierge enforces the tunnel's limit itself (TunnelBusyError), so this only has to stay clear of it: Node's
 * HTTP/2 server counts a stream the peer has just reset until its next event-loop turn, and refuses a new stream
 * over its limit with ENHANCE_YOUR_CALM, which fails the request. With the same limit at both ends, a stream
 * opened in place of one just closed would be refused whenever the tunnel is full.
 */
const AGENT_STREAM_LIMIT = 200_000;
/**
 * The agent pings this often, and gives up on a tunnel whose ping is not answered within PING_TIMEOUT_MS. The
 * concierge does not ping: it gives up on a tunnel it has heard no ping on for SILENCE_LIMIT_MS. One ping per tunnel
 * instead of one from each end halves what 10,000 idle tunnels cost the concierge, and its side does no timer work
 * per ping.
 */
export const PING_INTERVAL_MS = 15_000;
const PING_TIMEOUT_MS = 10_000;
/** Two intervals: a ping delayed by a busy agent is not a dead one. */
export const SILENCE_LIMIT_MS = 2 * PING_INTERVAL_MS;
/**
 * The data of the GOAWAY a hub replica sends to ask an agent to move its tunnel to another replica (TunnelClient's
 * goAway). Any GOAWAY with NO_ERROR means that; the data only says why in the agent's log.
 */
export const MOVE_REASON = 'replica draining';
/** How long an agent has to read the GOAWAY that asks it to move before an idle tunnel closes (goAway). */
const GOAWAY_READ_MS = 1_000;
/**
 * The data of the GOAWAY an agent sends when it stops (TunnelServer's leave): the hub opens no new stream on the
 * tunnel and sends new requests by another tunnel, while the streams in flight finish.
 */
export const LEAVE_REASON = 'agent stopping';

type WriteCallback = (err?: Error | null) => void;

/**
 * Gives a tunnel stream the TCP-only socket methods that HTTP servers, agents and proxies call on their sockets
 * (setNoDelay, setKeepAlive, ref, unref; on a stream inside HTTP/2 they mean nothing: no-ops), and hands Node's
 * HTTP/2 core every write as a Buffer.
 *
 * Why the Buffers: the session runs over a JavaScript stream (the WebSocket), and Node's HTTP/2 core, given a
 * string to write (Node's HTTP client and server write every request and response head as one), copies it into
 * memory it frees once the write is reported done, which over a JavaScript transport can be before the transport has
 * sent it. The peer then received the head with its first 16 bytes replaced by the allocator's bookkeeping: the
 * agent answered a parse error, so a create refused by RBAC reached kubectl as ECONNRESET in about half the tries,
 * and the bytes sent were whatever that memory held. A Buffer's memory is the Buffer's own and lives as long as the
 * stream holds the chunk.
 */
function asSocket<T extends Duplex>(stream: T): T {
  const socket = stream as unknown as Record<string, unknown>;
  for (const method of ['setNoDelay', 'setKeepAlive', 'ref', 'unref'])
    if (typeof socket[method] !== 'function') socket[method] = () => stream;
  const write = socket['_write'] as (chunk: unknown, encoding: BufferEncoding, done: WriteCallback) => void;
  const writev = socket['_writev'] as
    ((chunks: { chunk: unknown; encoding: BufferEncoding }[], done: WriteCallback) => void) | undefined;
  const asBuffer = (chunk: unknown, encoding: BufferEncoding): unknown =>
    typeof chunk === 'string' ? Buffer.from(chunk, encoding) : chunk;
  socket['_write'] = function (this: T, chunk: unknown, encoding: BufferEncoding, done: WriteCallback) {
    write.call(this, asBuffer(chunk, encoding), 'buffer' as BufferEncoding, done);
  };
  if (writev)
    socket['_writev'] = function (
      this: T,
      chunks: { chunk: unknown; encoding: BufferEncoding }[],
      done: WriteCallback,
    ) {
      const buffers = chunks.map(({ chunk, encoding }) => ({
        chunk: asBuffer(chunk, encoding),
        encoding: 'buffer' as BufferEncoding,
      }));
      writev.call(this, buffers, done);
    };
  return stream;
}

/**
 * Makes destroying a stream reset it with CANCEL, and calls `gone` at once. Destroyed without an error, an HTTP/2
 * stream resets with NO_ERROR, which the agent's end takes as the end of what it reads, not of the stream: its HTTP
 * server, which stops reading while a response waits for this end to take it (a stalled reader's), would never
 * learn that the request is gone, and its request to the API server would stay open.
 */
function cancelOnDestroy(
  stream: ClientHttp2Stream,
  gone: () => void,
  closing: () => boolean,
): ClientHttp2Stream {
  const destroy = stream.destroy.bind(stream);
  stream.destroy = (err?: Error) => {
    // Not while the whole tunnel closes: its WebSocket goes next, and a reset written then could race its shutdown
    // (see close() below); the agent learns of every stream's end from the tunnel's.
    if (!closing() && !stream.closed && !stream.destroyed) stream.close(constants.NGHTTP2_CANCEL);
    gone();
    return destroy(err);
  };
  return stream;
}

export class TunnelBusyError extends Error {
  readonly code = 'SEALION_TUNNEL_BUSY';
}
export class TunnelClosedError extends Error {
  readonly code = 'SEALION_TUNNEL_CLOSED';
}

function settings(maxStreams: number): Settings {
  return { initialWindowSize: STREAM_WINDOW_BYTES, maxConcurrentStreams: maxStreams, enablePush: false };
}

/** Runs `tick` every `everyMs` on `clock` until `tick` returns false or the returned stop is called. */
function every(clock: Clock, everyMs: number, tick: () => boolean): () => void {
  let timer: unknown;
  const run = (): void => {
    timer = undefined;
    if (!tick()) return;
    timer = clock.setTimeout(run, everyMs);
  };
  timer = clock.setTimeout(run, everyMs);
  return () => clock.clearTimeout(timer);
}

const gone = (session: Http2Session): boolean => session.closed || session.destroyed;

/**
 * Pings the peer every PING_INTERVAL_MS; a late or failed answer ends the tunnel through `kill` (which destroys
 * the WebSocket stream: see close() below for why never the session itself). Returns its stop.
 */
function keepAlive(session: Http2Session, kill: (err: Error) => void, clock: Clock): () => void {
  return every(clock, PING_INTERVAL_MS, () => {
    if (gone(session)) return false;
    // Keeps the process alive while it runs, as the plain timer it replaces did.
    const deadline = clock.setTimeout(() => kill(new Error('tunnel ping timed out')), PING_TIMEOUT_MS, {
      keepAlive: true,
    });
    const sent = session.ping((err) => {
      clock.clearTimeout(deadline);
      if (err) kill(err);
    });
    if (!sent) clock.clearTimeout(deadline);
    return true;
  });
}

/** Ends the tunnel through `kill` once the peer has sent no ping for `limitMs`. Returns its stop. */
function watchPings(
  session: Http2Session,
  limitMs: number,
  kill: (err: Error) => void,
  clock: Clock,
): () => void {
  let heard = clock.now();
  session.on('ping', () => void (heard = clock.now()));
  return every(clock, limitMs / 2, () => {
    if (gone(session)) return false;
    if (clock.now() - heard > limitMs) kill(new Error(`no ping from the agent for ${limitMs / 1000} s`));
    return true;
  });
}

export interface TunnelClient {
  /**
   * Sends a plain request to the agent, `headers` with their pseudo-headers, and its end at once when `endStream`.
   * Throws TunnelBusyError at the stream limit and TunnelClosedError once the tunnel is gone. Closing the stream
   * frees its place at once.
   */
  request(headers: OutgoingHttpHeaders, endStream: boolean): ClientHttp2Stream;
  /** A byte stream to the agent's local proxy. Rejects with TunnelBusyError at the stream limit. */
  open(): Promise<Duplex>;
  /** An http.Agent whose connections are tunnel streams (kept alive and reused, like sockets). */
  agent: HttpAgent;
  /** Streams open now. */
  active(): number;
  /** Changes the stream limit; streams open beyond a lowered one are left to finish. */
  setMaxStreams(limit: number): void;
  /** Resolves when the tunnel is gone (closed by either side, or its keepalive failed). */
  closed: Promise<void>;
  /**
   * Asks the agent to move: an HTTP/2 GOAWAY with NO_ERROR (MOVE_REASON). This end opens no new stream on the tunnel
   * from then on (TunnelClosedError), the streams in flight end as they would have, and this end then closes the
   * tunnel. An agent of 2.1 dials another replica on the GOAWAY; one of 2.0, which knows
   * nothing of it, on the close, as after any closed tunnel.
   */
  goAway(): void;
  /**
   * Resolves when the agent said it is leaving (a GOAWAY from its end, TunnelServer's leave): this end has opened no
   * new stream since, and closes the tunnel once the streams in flight end. Never rejects.
   */
  leaving: Promise<void>;
  /**
   * Takes the tunnel out of service without asking the agent to move (another tunnel of the same cluster took its
   * place here): no new stream, the streams in flight end as they would have, and the tunnel closes once none is
   * open. Its agent learns of it by the close, as after any close.
   */
  retire(): void;
  close(): void;
}

export interface TunnelClientOptions {
  /** The stream limit. Default: DEFAULT_MAX_STREAMS. */
  maxStreams?: number;
  /** How long the agent may send no ping before the tunnel is given up. Default: SILENCE_LIMIT_MS. */
  silenceLimitMs?: number;
  /** Times the watch on the agent's pings. Default: systemClock. */
  clock?: Clock;
}

/** An http.Agent whose connections are tunnel streams from `open` (kept alive and reused, like sockets). */
class StreamAgent extends HttpAgent {
  private readonly openStream: () => Promise<Duplex>;
  /** Set once the tunnel was asked to move: a stream done with is closed rather than kept for the next request. */
  moving = false;

  constructor(open: () => Promise<Duplex>) {
    super({ keepAlive: true, maxFreeSockets: 64 });
    this.openStream = open;
  }

  /** Closes the streams kept for reuse: a moving tunnel closes once no stream is open on it. */
  dropIdle(): void {
    this.moving = true;
    for (const sockets of Object.values(this.freeSockets))
      for (const socket of sockets ?? []) socket.destroy();
  }

  override createConnection(
    _options: AgentOptions,
    callback?: (err: Error | null, socket: Duplex) => void,
  ): Duplex | undefined {
    this.openStream().then(
      (stream) => callback?.(null, stream),
      (err: Error) => callback?.(err, undefined as unknown as Duplex),
    );
    return undefined;
  }

  // A stream has no TCP timeout to reset; the session's pings watch the connection.
  override keepSocketAlive(): boolean {
    return !this.moving;
  }
}

/**
 * The streams a tunnel has open, within its limit. A closed or destroyed stream leaves the count at once, not at its
 * 'close' a turn later, so that its place is free for the request that takes it over; the agent's end may hold it
 * a moment longer, which its higher limit allows. Only this end counts the limit (the agent's allows far more), so
 * a new limit takes effect at once.
 */
class StreamCount {
  active = 0;
  maxStreams: number;
  /** Set once the agent was asked to move (goAway): it takes no new stream. */
  moving = false;
  /** Called each time the count falls to zero. */
  onIdle: (() => void) | undefined;
  private readonly session: ClientHttp2Session;

  constructor(session: ClientHttp2Session, maxStreams: number) {
    this.session = session;
    this.maxStreams = maxStreams;
  }

  /** Opens a stream, counted until it closes; returns it and what takes it out of the count. */
  open(headers: OutgoingHttpHeaders, endStream: boolean): [ClientHttp2Stream, () => void] {
    // A block Node would not send closes the session, every user's tunnel (lib/http2/header-block.ts).
    const tooLarge = headersTooLarge(headers);
    if (tooLarge) throw tooLarge;
    if (gone(this.session)) throw new TunnelClosedError('the tunnel is closed');
    if (this.moving) throw new TunnelClosedError('the tunnel is moving to another replica');
    if (this.active >= this.maxStreams)
      throw new TunnelBusyError(`the tunnel already carries ${this.maxStreams} streams`);
    const stream = this.session.request(headers, { endStream });
    this.active++;
    let inCount = true;
    const uncount = (): void => {
      if (inCount && --this.active === 0) this.onIdle?.();
      inCount = false;
    };
    stream.once('close', uncount);
    return [stream, uncount];
  }

  /** A plain request's stream, which leaves the count as soon as it is closed. */
  request(headers: OutgoingHttpHeaders, endStream: boolean): ClientHttp2Stream {
    const [stream, uncount] = this.open(headers, endStream);
    const close = stream.close.bind(stream);
    stream.close = (code?: number, callback?: () => void) => {
      uncount();
      close(code, callback);
    };
    return stream;
  }

  /** A byte stream to the agent's local proxy, once the agent accepts it; `closing` as cancelOnDestroy's. */
  connect(closing: () => boolean): Promise<Duplex> {
    return new Promise((done, fail) => {
      let stream: ClientHttp2Stream;
      let uncount: () => void;
      try {
        [stream, uncount] = this.open({ ':method': 'CONNECT', ':authority': 'local-proxy' }, false);
      } catch (err) {
        return fail(err instanceof Error ? err : new Error(String(err)));
      }
      stream.once('response', (headers) => {
        if (headers[':status'] === 200) return done(asSocket(cancelOnDestroy(stream, uncount, closing)));
        stream.close(constants.NGHTTP2_CANCEL);
        fail(new Error(`the agent refused the stream (${headers[':status']})`));
      });
      stream.once('error', fail);
    });
  }
}

/** The HTTP/2 client session over the agent's connection. */
function clientSession(duplex: Duplex, maxStreams: number): ClientHttp2Session {
  const session = connect('http://sealion-agent.tunnel', {
    ...FIELDS_AS_SENT,
    createConnection: () => duplex,
    settings: settings(maxStreams),
    maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB,
  });
  session.on('error', () => {}); // 'close' follows; callers learn through `closed` and failed opens
  session.once('connect', () => session.setLocalWindowSize(CONNECTION_WINDOW_BYTES));
  sizeWindows(session);
  return session;
}

/** The concierge's end: an HTTP/2 client over the agent's WebSocket stream. */
export function newTunnelClient(duplex: Duplex, opts: TunnelClientOptions = {}): TunnelClient {
  const clock = opts.clock ?? systemClock;
  /** Set by close(): streams destroyed from then on are not reset one by one. */
  let closing = false;
  const session = clientSession(duplex, opts.maxStreams ?? DEFAULT_MAX_STREAMS);
  const streams = new StreamCount(session, opts.maxStreams ?? DEFAULT_MAX_STREAMS);
  const stopWatch = watchPings(
    session,
    opts.silenceLimitMs ?? SILENCE_LIMIT_MS,
    (err) => duplex.destroy(err),
    clock,
  );
  const closed = new Promise<void>((done) =>
    session.once('close', () => {
      stopWatch();
      done();
    }),
  );
  const open = (): Promise<Duplex> => streams.connect(() => closing);
  // Made when an upgrade first needs it: most tunnels carry plain requests only, and an http.Agent costs an idle
  // tunnel about 1.3 KiB of heap, 13 MiB for 10,000 agents.
  let streamAgent: StreamAgent | undefined;
  const agentOf = (): StreamAgent => (streamAgent ??= new StreamAgent(open));
  // Abrupt on purpose, and through the WebSocket stream only: closing or destroying an HTTP/2 session that runs over
  // a JS stream can write after that stream began to shut down, which Node's JSStreamSocket asserts against (and
  // crashes the process). The session closes by itself once its stream is gone.
  const close = (): void => {
    closing = true;
    streamAgent?.destroy();
    duplex.destroy();
  };
  /** No new stream from now on; the tunnel closes once the streams in flight end. */
  const stopTaking = (): void => {
    streams.moving = true;
    streamAgent?.dropIdle();
  };
  const closeOnceIdle = (): void => {
    streams.onIdle = () => setImmediate(close);
    if (streams.active === 0) close();
  };
  const leaving = new Promise<void>((done) =>
    session.on('goaway', () => {
      if (!streams.moving) {
        stopTaking();
        closeOnceIdle();
      }
      done();
    }),
  );
  return {
    request: (headers, endStream) => streams.request(headers, endStream),
    open,
    get agent() {
      const made = agentOf();
      // A stream done with after the tunnel stopped taking new ones is closed, not kept (dropIdle).
      if (streams.moving) made.moving = true;
      return made;
    },
    active: () => streams.active,
    setMaxStreams(limit) {
      streams.maxStreams = limit;
    },
    closed,
    leaving,
    retire() {
      if (streams.moving || gone(session)) return;
      stopTaking();
      closeOnceIdle();
    },
    goAway() {
      if (streams.moving || gone(session)) return;
      stopTaking();
      // The agent's end opens no stream, so the last one it may have opened is 0.
      session.goaway(constants.NGHTTP2_NO_ERROR, 0, Buffer.from(MOVE_REASON));
      // This end closes the tunnel once no stream is open: Node's HTTP/2 on the agent's end closes its session on the
      // GOAWAY only when a later stream event finds it idle, which an idle tunnel never has (nor does it answer
      // pings then). Not before the agent has had time to read the GOAWAY (a ping's answer, or GOAWAY_READ_MS), so
      // that it knows it was asked to move; one that did not dials again as after any close, a moment later.
      let armed = false;
      const closeWhenIdle = (): void => {
        if (armed) return;
        armed = true;
        clock.clearTimeout(wait);
        closeOnceIdle();
      };
      const wait = clock.setTimeout(closeWhenIdle, GOAWAY_READ_MS);
      if (!session.ping(() => closeWhenIdle())) closeWhenIdle();
    },
    close,
  };
}

export interface TunnelServer {
  closed: Promise<void>;
  /**
   * Resolves when the hub asked this tunnel to move (a GOAWAY with NO_ERROR, TunnelClient's goAway), with the reason
   * it gave; the tunnel then closes once its streams in flight end. Never rejects; stays pending if never asked.
   */
  moveRequested: Promise<string>;
  /**
   * Tells the hub this agent is leaving (a GOAWAY, LEAVE_REASON): it opens no new stream here and sends new requests
   * by another tunnel; the streams in flight go on, and the tunnel closes once none is open.
   */
  leave(): void;
  close(): void;
}

/** What the agent's end does with the tunnel's streams. */
export interface TunnelHandlers {
  /** A CONNECT stream, a byte stream to the local proxy. */
  connect(stream: Duplex): void;
  /** A plain request; `rawHeaders` keeps repeated fields apart. Default: refused with 405. */
  request?(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, rawHeaders: string[]): void;
}

/**
 * The agent's end: an HTTP/2 server over the tunnel's connection. `clock` times its pings (default: systemClock).
 */
export function serveTunnel(
  duplex: Duplex,
  handlers: TunnelHandlers,
  opts: { clock?: Clock } = {},
): TunnelServer {
  const session = performServerHandshake(duplex as unknown as Socket, {
    ...FIELDS_AS_SENT,
    maxHeaderListPairs: FORWARDED_HEADER_LIMITS.maxHeaderListPairs,
    settings: {
      ...settings(AGENT_STREAM_LIMIT),
      maxHeaderListSize: FORWARDED_HEADER_LIMITS.maxHeaderListSize,
    },
    maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB,
  });
  session.on('error', () => {});
  session.once('connect', () => session.setLocalWindowSize(CONNECTION_WINDOW_BYTES));
  const clock = opts.clock ?? systemClock;
  sizeWindows(session, { clock });
  const stopPings = keepAlive(session, (err) => duplex.destroy(err), clock);
  // Node's HTTP/2 closes the session by itself on such a GOAWAY, once the streams in flight end.
  const moveRequested = new Promise<string>((done) =>
    session.on('goaway', (code: number, _last: number, data?: Buffer) => {
      if (code === constants.NGHTTP2_NO_ERROR) done(printableReason(data));
    }),
  );
  /** Streams open now, for leave(): the tunnel closes once none is. */
  let open = 0;
  let onIdle: (() => void) | undefined;
  session.on('stream', (stream, headers, _flags, rawHeaders) => {
    open++;
    stream.once('close', () => {
      if (--open === 0) onIdle?.();
    });
    if (headers[':method'] !== 'CONNECT') {
      if (handlers.request) return handlers.request(stream, headers, rawHeaders);
      stream.respond({ ':status': 405 }, { endStream: true });
      return;
    }
    stream.respond({ ':status': 200 });
    stream.on('error', () => stream.destroy());
    handlers.connect(asSocket(stream));
  });
  const closed = new Promise<void>((done) =>
    session.once('close', () => {
      stopPings();
      done();
    }),
  );
  let leaving = false;
  return {
    closed,
    moveRequested,
    leave() {
      if (leaving || gone(session)) return;
      leaving = true;
      // The highest stream id there is, as RFC 9113 (6.8) has a graceful shutdown begin: a stream the hub opened
      // before it read this is still served. The hub opens none after it. This end closes the tunnel once no stream
      // is open, from when the hub answers with a GOAWAY of its own (Node's HTTP/2 does, a hub of 2.0 too: it comes
      // after every stream the hub opened) or GOAWAY_READ_MS has passed, whichever is first; not on a ping's answer,
      // which may overtake a stream the hub had queued.
      session.goaway(constants.NGHTTP2_NO_ERROR, 2 ** 31 - 1, Buffer.from(LEAVE_REASON));
      let armed = false;
      const closeWhenIdle = (): void => {
        if (armed) return;
        armed = true;
        clock.clearTimeout(wait);
        onIdle = () => setImmediate(() => duplex.destroy());
        if (open === 0) duplex.destroy();
      };
      const wait = clock.setTimeout(closeWhenIdle, GOAWAY_READ_MS);
      session.once('goaway', closeWhenIdle);
    },
    close() {
      duplex.destroy();
    },
  };
}

/** A GOAWAY's data as a log may show it: printable ASCII, short. */
const printableReason = (data: Buffer | undefined): string =>
  (data ?? Buffer.alloc(0))
    .toString('latin1')
    .replace(/[^\x20-\x7e]/g, '')
    .slice(0, 64);
