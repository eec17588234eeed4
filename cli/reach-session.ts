// `sealion port-forward`'s connections as streams of one HTTP/2 session: each local connection is an extended
// CONNECT (RFC 8441: `:method CONNECT`, `:protocol tcp`, the reach path) on one authenticated TLS connection to the
// server, answered 200 once the server is connected to the target, or with the refusal's status and Status body. A
// connection then costs a stream (a HEADERS frame each way) instead of a TLS handshake, while the server still
// authenticates, decides, counts and audits each stream as the request it is. The DATA frames carry the bytes both
// ways and END_STREAM each side's half-close.
//
// The session is opened with the kubeconfig's client certificate (if any), so a renewed certificate opens a new
// session, and the old one closes once its streams are done; a token goes with each stream, so a renewed token is
// used at once. A server that does not announce SETTINGS_ENABLE_CONNECT_PROTOCOL (one before reach over HTTP/2) is
// remembered, and its connections go as HTTP/1.1 upgrades (port-forward.ts openReach). A session that ends (the
// server restarts, a draining replica's GOAWAY, its idle timeout) ends its open streams; the next connection opens a
// new one.
import {
  connect,
  constants,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type IncomingHttpHeaders,
  type Settings,
} from 'node:http2';
import { isIP } from 'node:net';
import type { Duplex, Readable } from 'node:stream';
import { connect as tlsConnect } from 'node:tls';
import { STATUS_CODES } from 'node:http';
import { statusMessageOf } from '../lib/kube/status.ts';
import { REACH_UPGRADE } from '../lib/reach/target.ts';
import { printable } from './printable.ts';
import type { KubeconfigAccess } from './whoami.ts';

/** Why a connection could not be opened; `status` is the server's HTTP status when it answered. */
export class ReachError extends Error {
  readonly status: number | undefined;
  constructor(message: string, status?: number) {
    super(message);
    this.name = 'ReachError';
    this.status = status;
  }
}

/** A refusal in words: its status, and the message of the Status it carries (the server's text, made printable). */
export function refusal(status: number, body: string): ReachError {
  const said = statusMessageOf(body);
  const detail = said === undefined ? '' : `: ${printable(said)}`;
  if (status === 401)
    return new ReachError(`the server refused the credentials (401 Unauthorized)${detail}`, status);
  return new ReachError(
    `the server answered ${status} ${STATUS_CODES[status] ?? ''}`.trimEnd() + detail,
    status,
  );
}

/** The most of a refusal's body read for its Status: a message, not a whole object. */
const MAX_REFUSAL_BYTES = 64 * 1024;

/** One attempt to open a connection, decided once: by its answer (`settle`), a failure (`fail`), time or a cancel. */
export interface Attempt {
  readonly settled: boolean;
  /** The server answered yes: no timeout or cancel can fail the attempt any more. */
  settle(): void;
  /** Undoes the attempt and rejects with `err`, unless it was decided already. */
  fail(err: ReachError): void;
}

/**
 * An attempt that fails with `timedOut` after `timeoutMs` without a decision, and with "cancelled" when `signal`
 * aborts. `undo` ends what the attempt opened; `reject` is its promise's.
 */
export function newAttempt(
  timeoutMs: number,
  timedOut: string,
  signal: AbortSignal | undefined,
  undo: () => void,
  reject: (err: ReachError) => void,
): Attempt {
  let settled = false;
  const settle = (): void => {
    settled = true;
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  };
  const fail = (err: ReachError): void => {
    if (settled) return;
    settle();
    undo();
    reject(err);
  };
  const timer = setTimeout(() => fail(new ReachError(timedOut)), timeoutMs);
  const onAbort = (): void => fail(new ReachError('cancelled'));
  signal?.addEventListener('abort', onAbort, { once: true });
  return {
    get settled() {
      return settled;
    },
    settle,
    fail,
  };
}

/**
 * Reads a refusal's body, at most MAX_REFUSAL_BYTES of it, and fails `attempt` with the refusal in words once the
 * body ended or reached that.
 */
export function failWithRefusal(attempt: Attempt, status: number, body: Readable): void {
  const chunks: Buffer[] = [];
  let size = 0;
  const finish = (): void => attempt.fail(refusal(status, Buffer.concat(chunks).toString('utf8')));
  body.on('data', (chunk: Buffer) => {
    chunks.push(chunk);
    size += chunk.length;
    if (size >= MAX_REFUSAL_BYTES) finish();
  });
  body.once('end', finish);
  body.once('close', finish);
}

/**
 * The window each stream (and, 32 times that, the session) takes from the server before it must be read: what one
 * connection can have in flight toward this process. The server's own stream window bounds the other way.
 */
const STREAM_WINDOW_BYTES = 1 << 20;
/**
 * How long a new session waits for the server's SETTINGS. A server that accepted the connection and then says nothing
 * would otherwise hold every local connection for as long as it keeps the TCP connection: past this the session is
 * closed, and the connection goes as an upgrade, which has its own deadline.
 */
export const SETTINGS_TIMEOUT_MS = 10_000;
const SESSION_WINDOW_BYTES = 32 << 20;

/** Fields that belong to one HTTP/1.1 connection and that an HTTP/2 request must not carry (RFC 9113 8.2.2). */
const CONNECTION_FIELDS = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'host',
  'te',
]);

/** What a stream's request or its session's opening may end in. */
export type Opened = { stream: Duplex } | { upgrade: true };

export interface ReachSessions {
  /**
   * Opens a stream for `path` (relative to `access.base`) with `access`'s credentials: the stream once the server
   * answered 200, `{ upgrade: true }` when this server takes no extended CONNECT (the caller opens an HTTP/1.1
   * upgrade instead); rejects with a ReachError on a refusal, a failure, `timeoutMs` without an answer, or `signal`.
   * `sending` (the local connection), when given, is piped into the stream as soon as it is opened (see openStream);
   * on a refusal it is unpiped, its bytes dropped with it.
   */
  open(
    access: KubeconfigAccess,
    path: string,
    timeoutMs: number,
    signal?: AbortSignal,
    sending?: Readable,
  ): Promise<Opened>;
  /** Closes every session and the streams on them. */
  close(): void;
}

/** A session and what it was opened with. */
interface Held {
  key: string;
  session: ClientHttp2Session;
  /** Resolves true once the server's SETTINGS allow extended CONNECT, false if not or if the session failed first. */
  ready: Promise<boolean>;
}

/** The sessions of one forward: the current one per server and client certificate. */
export function newReachSessions(settingsTimeoutMs = SETTINGS_TIMEOUT_MS): ReachSessions {
  let current: Held | undefined;
  const all = new Set<ClientHttp2Session>();
  /** Servers (by key) that announced no extended CONNECT: their connections are upgrades. */
  const upgradeOnly = new Set<string>();

  const sessionFor = (access: KubeconfigAccess): Held => {
    const key = sessionKey(access);
    if (current && current.key === key && !current.session.closed && !current.session.destroyed)
      return current;
    // Another certificate (renewed): the old session finishes its streams and closes.
    current?.session.close();
    const held = openSession(access, key, settingsTimeoutMs);
    all.add(held.session);
    held.session.once('close', () => {
      all.delete(held.session);
      if (current === held) current = undefined;
    });
    // A session told to go away takes no new stream: the next connection opens another.
    held.session.once('goaway', () => {
      if (current === held) current = undefined;
    });
    current = held;
    return held;
  };

  return {
    async open(access, path, timeoutMs, signal, sending) {
      const key = sessionKey(access);
      if (upgradeOnly.has(key)) return { upgrade: true };
      const held = sessionFor(access);
      if (!(await held.ready)) {
        // Announced no extended CONNECT: remembered. A session that failed before its SETTINGS (a server that does
        // not speak HTTP/2, a network error) is not: this connection goes as an upgrade, which reports its own error.
        if (held.session.remoteSettings?.enableConnectProtocol === false && !held.session.destroyed)
          upgradeOnly.add(key);
        return { upgrade: true };
      }
      if (signal?.aborted) throw new ReachError('cancelled');
      return { stream: await openStream(held.session, access, path, timeoutMs, signal, sending) };
    },
    close() {
      for (const session of all) session.destroy();
      all.clear();
      current = undefined;
    },
  };
}

const sessionKey = (access: KubeconfigAccess): string =>
  JSON.stringify([new URL(access.base).origin, access.caPem ?? '', access.clientCert?.certPem ?? '']);

/** Opens a session to `access`'s server; `ready` tells whether it takes extended CONNECT streams. */
function openSession(access: KubeconfigAccess, key: string, settingsTimeoutMs: number): Held {
  const url = new URL(access.base);
  const host = url.hostname.replace(/^\[|\]$/g, '');
  const session = connect(url.origin, {
    settings: { initialWindowSize: STREAM_WINDOW_BYTES, enablePush: false },
    // The TLS connection made here rather than by Node, to turn Nagle's algorithm off before anything is written (an
    // HTTP/2 session's socket may not be touched once it is the session's): a stream's HEADERS and one echoed byte
    // leave at once, not after the peer's delayed ACK.
    createConnection: () => {
      const socket = tlsConnect({
        host,
        port: Number(url.port || 443),
        ...(isIP(host) ? {} : { servername: host }),
        ALPNProtocols: ['h2'],
        minVersion: 'TLSv1.2',
        ...(access.caPem ? { ca: access.caPem } : {}),
        ...(access.clientCert ? { cert: access.clientCert.certPem, key: access.clientCert.keyPem } : {}),
      });
      socket.setNoDelay(true);
      return socket;
    },
  });
  // Errors end the session ('close'); each stream reports its own.
  session.on('error', () => {});
  session.once('connect', () => session.setLocalWindowSize(SESSION_WINDOW_BYTES));
  const ready = new Promise<boolean>((resolve) => {
    const deadline = setTimeout(() => session.destroy(), settingsTimeoutMs);
    session.once('remoteSettings', (settings: Settings) => {
      clearTimeout(deadline);
      resolve(settings.enableConnectProtocol === true);
    });
    session.once('close', () => {
      clearTimeout(deadline);
      resolve(false);
    });
  });
  return { key, session, ready };
}

/** The request's headers: the extended CONNECT's pseudo-headers and the credentials' fields, lower-case. */
function connectHeaders(access: KubeconfigAccess, path: string): Record<string, string> {
  const url = new URL(path, access.base);
  const headers: Record<string, string> = {
    ':method': 'CONNECT',
    ':protocol': REACH_UPGRADE,
    ':scheme': 'https',
    ':authority': url.host,
    ':path': url.pathname + url.search,
  };
  for (const [name, value] of Object.entries(access.headers)) {
    const lower = name.toLowerCase();
    if (!CONNECTION_FIELDS.has(lower)) headers[lower] = value;
  }
  return headers;
}

/**
 * One extended CONNECT stream on `session`: the stream once answered 200, else the ReachError. `sending` is piped into
 * the stream at once, before the answer, as a TCP client's first bytes follow its handshake without waiting: the
 * server reads nothing of a stream before it has connected to the target (its stream window holds them meanwhile), so
 * a connection whose client speaks first (an HTTP request, the bench's echo) costs one round trip to the server, not
 * two. Nothing is lost on a refusal that would not be anyway: the local connection is closed with it.
 */
function openStream(
  session: ClientHttp2Session,
  access: KubeconfigAccess,
  path: string,
  timeoutMs: number,
  signal: AbortSignal | undefined,
  sending: Readable | undefined,
): Promise<Duplex> {
  return new Promise((resolve, reject) => {
    let stream: ClientHttp2Stream;
    try {
      stream = session.request(connectHeaders(access, path), { endStream: false });
    } catch (err) {
      // The session went away between the check and the request (a GOAWAY, its close).
      return reject(new ReachError(`cannot reach ${new URL(access.base).host}: ${(err as Error).message}`));
    }
    sending?.pipe(stream);
    const attempt = newAttempt(
      timeoutMs,
      `the server did not answer within ${timeoutMs / 1000} s`,
      signal,
      () => {
        sending?.unpipe(stream);
        stream.close(constants.NGHTTP2_CANCEL);
      },
      reject,
    );
    stream.on('error', (err: Error) =>
      attempt.fail(new ReachError(`cannot reach ${new URL(access.base).host}: ${err.message}`)),
    );
    stream.once('close', () =>
      attempt.fail(
        new ReachError(`the server closed the stream (code ${stream.rstCode ?? 0}) before it answered`),
      ),
    );
    stream.once('response', (headers: IncomingHttpHeaders) => {
      const status = Number(headers[':status']);
      if (status !== 200) return failWithRefusal(attempt, status, stream);
      attempt.settle();
      resolve(stream);
    });
  });
}
