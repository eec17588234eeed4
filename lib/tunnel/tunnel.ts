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
import { FIELDS_AS_SENT } from '../http2/hop-by-hop.ts';
import { STREAM_WINDOW_BYTES, UNCOUNTED_SESSION_MEMORY_MB } from '../http2/pool.ts';

/** The HTTP Upgrade token of the direct transport: the tunnel's HTTP/2 runs on the upgraded TLS socket. */
export const TUNNEL_UPGRADE = 'sealion-tunnel-h2';
/**
 * What an agent sends in TUNNEL_PROTOCOL_HEADER when it dials: the version of what runs inside the tunnel. Version 2
 * carries plain requests as HTTP/2 requests; agents that send none speak version 1 (HTTP/1.1 on CONNECT streams
 * for every request), which the concierge no longer serves.
 */
export const TUNNEL_PROTOCOL = '2';
export const TUNNEL_PROTOCOL_HEADER = 'x-sealion-tunnel-protocol';
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

/** The connection's window, shared by all streams (each stream's is lib/http2/pool.ts STREAM_WINDOW_BYTES). */
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

/**
 * Pings the peer every PING_INTERVAL_MS; a late or failed answer ends the tunnel through `kill` (which destroys
 * the WebSocket stream: see close() below for why never the session itself).
 */
function keepAlive(session: Http2Session, kill: (err: Error) => void): NodeJS.Timeout {
  const timer = setInterval(() => {
    if (session.closed || session.destroyed) return clearInterval(timer);
    const deadline = setTimeout(() => kill(new Error('tunnel ping timed out')), PING_TIMEOUT_MS);
    const sent = session.ping((err) => {
      clearTimeout(deadline);
      if (err) kill(err);
    });
    if (!sent) clearTimeout(deadline);
  }, PING_INTERVAL_MS);
  timer.unref();
  return timer;
}

/** Ends the tunnel through `kill` once the peer has sent no ping for `limitMs`. */
function watchPings(session: Http2Session, limitMs: number, kill: (err: Error) => void): NodeJS.Timeout {
  let heard = Date.now();
  session.on('ping', () => void (heard = Date.now()));
  const timer = setInterval(() => {
    if (session.closed || session.destroyed) return clearInterval(timer);
    if (Date.now() - heard > limitMs) kill(new Error(`no ping from the agent for ${limitMs / 1000} s`));
  }, limitMs / 2);
  timer.unref();
  return timer;
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
  close(): void;
}

/** The concierge's end: an HTTP/2 client over the agent's WebSocket stream. */
export function newTunnelClient(
  duplex: Duplex,
  opts: { maxStreams?: number; silenceLimitMs?: number } = {},
): TunnelClient {
  let maxStreams = opts.maxStreams ?? DEFAULT_MAX_STREAMS;
  /** Set by close(): streams destroyed from then on are not reset one by one. */
  let closing = false;
  const session: ClientHttp2Session = connect('http://sealion-agent.tunnel', {
    ...FIELDS_AS_SENT,
    createConnection: () => duplex,
    settings: settings(maxStreams),
    maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB,
  });
  session.on('error', () => {}); // 'close' follows; callers learn through `closed` and failed opens
  session.once('connect', () => session.setLocalWindowSize(CONNECTION_WINDOW_BYTES));
  const ping = watchPings(session, opts.silenceLimitMs ?? SILENCE_LIMIT_MS, (err) => duplex.destroy(err));
  let active = 0;
  const closed = new Promise<void>((done) =>
    session.once('close', () => {
      clearInterval(ping);
      done();
    }),
  );

  /**
   * Opens a stream, counted until it closes. A closed or destroyed stream leaves the count at once, not at its
   * 'close' a turn later, so that its place is free for the request that takes it over; the agent's end may hold it
   * a moment longer, which its higher limit allows.
   */
  const counted = (headers: OutgoingHttpHeaders, endStream: boolean): [ClientHttp2Stream, () => void] => {
    if (session.closed || session.destroyed) throw new TunnelClosedError('the tunnel is closed');
    if (active >= maxStreams) throw new TunnelBusyError(`the tunnel already carries ${maxStreams} streams`);
    const stream = session.request(headers, { endStream });
    active++;
    let inCount = true;
    const uncount = (): void => {
      if (inCount) active--;
      inCount = false;
    };
    stream.once('close', uncount);
    return [stream, uncount];
  };

  const request = (headers: OutgoingHttpHeaders, endStream: boolean): ClientHttp2Stream => {
    const [stream, uncount] = counted(headers, endStream);
    const close = stream.close.bind(stream);
    stream.close = (code?: number, callback?: () => void) => {
      uncount();
      close(code, callback);
    };
    return stream;
  };

  const open = (): Promise<Duplex> =>
    new Promise((done, fail) => {
      let stream: ClientHttp2Stream;
      let uncount: () => void;
      try {
        [stream, uncount] = counted({ ':method': 'CONNECT', ':authority': 'local-proxy' }, false);
      } catch (err) {
        return fail(err instanceof Error ? err : new Error(String(err)));
      }
      stream.once('response', (headers) => {
        if (headers[':status'] === 200)
          return done(asSocket(cancelOnDestroy(stream, uncount, () => closing)));
        stream.close(constants.NGHTTP2_CANCEL);
        fail(new Error(`the agent refused the stream (${headers[':status']})`));
      });
      stream.once('error', fail);
    });

  const agent = new (class extends HttpAgent {
    override createConnection(
      _options: AgentOptions,
      callback?: (err: Error | null, socket: Duplex) => void,
    ): Duplex | undefined {
      open().then(
        (stream) => callback?.(null, stream),
        (err: Error) => callback?.(err, undefined as unknown as Duplex),
      );
      return undefined;
    }

    // A stream has no TCP timeout to reset; the session's pings watch the connection.
    override keepSocketAlive(): boolean {
      return true;
    }
  })({ keepAlive: true, maxFreeSockets: 64 });

  return {
    request,
    open,
    agent,
    active: () => active,
    // Only this end counts the limit (the agent's allows far more), so a new value takes effect at once.
    setMaxStreams(limit) {
      maxStreams = limit;
    },
    closed,
    // Abrupt on purpose, and through the WebSocket stream only: closing or destroying an HTTP/2 session that runs
    // over a JS stream can write after that stream began to shut down, which Node's JSStreamSocket asserts against
    // (and crashes the process). The session closes by itself once its stream is gone.
    close() {
      closing = true;
      agent.destroy();
      duplex.destroy();
    },
  };
}

export interface TunnelServer {
  closed: Promise<void>;
  close(): void;
}

/** What the agent's end does with the tunnel's streams. */
export interface TunnelHandlers {
  /** A CONNECT stream, a byte stream to the local proxy. */
  connect(stream: Duplex): void;
  /** A plain request; `rawHeaders` keeps repeated fields apart. Default: refused with 405. */
  request?(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, rawHeaders: string[]): void;
}

/** The agent's end: an HTTP/2 server over the tunnel's connection. */
export function serveTunnel(duplex: Duplex, handlers: TunnelHandlers): TunnelServer {
  const session = performServerHandshake(duplex as unknown as Socket, {
    ...FIELDS_AS_SENT,
    settings: settings(AGENT_STREAM_LIMIT),
    maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB,
  });
  session.on('error', () => {});
  session.once('connect', () => session.setLocalWindowSize(CONNECTION_WINDOW_BYTES));
  const ping = keepAlive(session, (err) => duplex.destroy(err));
  session.on('stream', (stream, headers, _flags, rawHeaders) => {
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
      clearInterval(ping);
      done();
    }),
  );
  return {
    closed,
    close() {
      duplex.destroy();
    },
  };
}
