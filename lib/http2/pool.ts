// HTTP/2 connections to the API server, shared by many requests. A connection takes new requests until it holds
// as many streams as the API server allows (its SETTINGS_MAX_CONCURRENT_STREAMS); only then does another one
// open, so a thousand idle watches cost a handful of TLS connections instead of a thousand. A connection that
// carries streams but stops answering pings is dropped, so its watches fail fast and their clients re-watch,
// instead of hanging on a dead socket.
//
// Node's http2 client is used directly: undici's HTTP/2 client joins repeated request headers into one
// comma-separated value, which would turn two Impersonate-Group headers into one group with a comma in its name.
import {
  connect,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type OutgoingHttpHeaders,
  type SecureClientSessionOptions,
  type Settings,
} from 'node:http2';
import { isIP } from 'node:net';
import { systemClock, type Clock } from '../clock.ts';
import { headersTooLarge } from './header-block.ts';
import { FIELDS_AS_SENT } from './hop-by-hop.ts';
import { sizeWindows, STREAM_WINDOW_BYTES } from './window.ts';

export { STREAM_WINDOW_BYTES } from './window.ts';

/**
 * Node's limit on what one HTTP/2 session may hold (in MB), set far out of reach on the tunnel's sessions and on the
 * HTTP/2 pools. Node counts a chunk still queued on a stream the peer resets (an upstream that answers before it has
 * read a body) against this limit for good, though it frees the chunk itself: at the default of 10 MB, a session
 * refused every new stream with ENHANCE_YOUR_CALM after a few hundred such answers. What these sessions really
 * hold is bounded by flow control and by the pipes that feed them.
 */
export const UNCOUNTED_SESSION_MEMORY_MB = 1e9;

/** Streams assumed allowed before the server's SETTINGS arrive, and the most we use on one connection. */
const DEFAULT_STREAM_LIMIT = 100;
const MAX_STREAM_LIMIT = 1000;
/**
 * The connection's window on every connection to the API server: room for many streams at once, each at up to
 * lib/http2/window.ts MAX_STREAM_WINDOW_BYTES. Each stream's window starts at STREAM_WINDOW_BYTES and grows with what
 * the path carries (lib/http2/window.ts).
 */
const CONNECTION_WINDOW_BYTES = 32 << 20;
/** A connection with no streams closes after this long. */
const IDLE_CLOSE_MS = 30_000;
/** A busy connection is pinged this often, and dropped if a ping is not answered in PING_TIMEOUT_MS. */
const PING_INTERVAL_MS = 30_000;
const PING_TIMEOUT_MS = 15_000;

interface Connection {
  session: ClientHttp2Session;
  active: number;
  usable: boolean;
  /** The server's stream limit; assumed until its SETTINGS arrive (before them Node reports "unlimited"). */
  limit: number;
  /** Listens for the end of each of its streams: one function per connection, not one per stream. */
  streamClosed: () => void;
}

export interface H2Pool {
  /** Opens a stream on a connection with room for it (opening a connection if none has). */
  request(headers: OutgoingHttpHeaders, endStream: boolean): ClientHttp2Stream;
  close(): void;
}

export interface H2PoolOptions {
  /** Times the pings of busy connections and their deadlines. Default: systemClock. */
  clock?: Clock;
}

export function newH2Pool(
  origin: string,
  options: SecureClientSessionOptions,
  { clock = systemClock }: H2PoolOptions = {},
): H2Pool {
  const connections = new Set<Connection>();
  // The name the server's certificate is checked against, unless the origin is an address (TLS sends no address as
  // a server name).
  const host = new URL(origin).hostname.replace(/^\[|\]$/g, '');
  if (options.servername === undefined && !isIP(host)) options = { ...options, servername: host };

  function open(): Connection {
    const session = connect(origin, {
      ...FIELDS_AS_SENT,
      ...options,
      settings: { initialWindowSize: STREAM_WINDOW_BYTES },
      maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB,
    });
    session.once('connect', () => session.setLocalWindowSize(CONNECTION_WINDOW_BYTES));
    sizeWindows(session, { clock });
    const c: Connection = {
      session,
      active: 0,
      usable: true,
      limit: DEFAULT_STREAM_LIMIT,
      streamClosed: () => {
        c.active--;
        if (c.active === 0) c.session.unref();
      },
    };
    connections.add(c);
    // Streams beyond the limit would be queued inside the HTTP/2 library, behind watches that may never end.
    session.on('remoteSettings', (settings: Settings) => {
      c.limit = Math.min(settings.maxConcurrentStreams ?? DEFAULT_STREAM_LIMIT, MAX_STREAM_LIMIT);
    });
    const retire = (): void => {
      c.usable = false;
      connections.delete(c);
    };
    session.once('close', retire);
    session.once('goaway', retire);
    // Errors reach the streams on it; the session itself only needs to leave the pool.
    session.on('error', retire);
    session.setTimeout(IDLE_CLOSE_MS, () => {
      if (c.active === 0) {
        retire();
        session.close();
      }
    });
    pingWhileBusy(c, retire, clock);
    session.unref();
    return c;
  }

  return {
    request(headers, endStream) {
      // A block Node would not send closes the connection, which every user's requests share (header-block.ts).
      const tooLarge = headersTooLarge(headers);
      if (tooLarge) throw tooLarge;
      let chosen: Connection | undefined;
      for (const c of connections) {
        if (c.usable && !c.session.destroyed && c.active < c.limit) {
          chosen = c;
          break;
        }
      }
      const c = chosen ?? open();
      const stream = c.session.request(headers, { endStream });
      c.active++;
      if (c.active === 1) c.session.ref();
      stream.on('close', c.streamClosed);
      return stream;
    },
    close() {
      for (const c of connections) c.session.destroy();
      connections.clear();
    },
  };
}

/**
 * Pings `c` every PING_INTERVAL_MS while it carries streams, and drops it (`retire`, then destroyed) when a ping goes
 * unanswered for PING_TIMEOUT_MS. The interval's timer keeps no process alive, as an idle session does not; a
 * ping's deadline does, as the streams waiting on it do.
 */
function pingWhileBusy(c: Connection, retire: () => void, clock: Clock): void {
  const { session } = c;
  let pinger: unknown;
  const pingLater = (): void => void (pinger = clock.setTimeout(pingIfBusy, PING_INTERVAL_MS));
  const pingIfBusy = (): void => {
    pingLater();
    if (c.active === 0 || session.destroyed) return;
    const deadline = clock.setTimeout(
      () => {
        retire();
        session.destroy(new Error('the API server stopped answering HTTP/2 pings'));
      },
      PING_TIMEOUT_MS,
      { keepAlive: true },
    );
    session.ping((err) => {
      clock.clearTimeout(deadline);
      if (err && !session.destroyed) {
        retire();
        session.destroy(err);
      }
    });
  };
  pingLater();
  session.once('close', () => clock.clearTimeout(pinger));
}
