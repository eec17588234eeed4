// How fuzz cases reach the proxy: raw bytes over a TLS socket (HTTP/1.1, read back with a small parser of our own,
// since Node's would refuse the very answers we want to see) and HTTP/2 streams over a reused session. Every send
// has a deadline: an answer that never comes is a finding, not a stuck run.
import {
  connect as http2Connect,
  constants,
  type ClientHttp2Session,
  type ClientHttp2Stream,
} from 'node:http2';
import { connect as tlsConnect, type ConnectionOptions, type TLSSocket } from 'node:tls';

/** What came back for one request. */
export type Answer =
  | { kind: 'response'; status: number; headers: Record<string, string>; body: string }
  /** The connection (or HTTP/2 stream) was closed or reset before a response head arrived. */
  | { kind: 'closed'; detail: string }
  /** Neither an answer nor a close within the deadline. */
  | { kind: 'hang'; detail: string }
  /** The client library refused to send it (an HTTP/2 header Node will not encode): nothing reached the proxy. */
  | { kind: 'unsendable'; detail: string };

/** An HTTP/1.x response head and as much body as its framing says, from raw bytes; undefined while incomplete. */
export function parseResponse(
  buf: Buffer,
  closed: boolean,
  head = false,
): { status: number; headers: Record<string, string>; body: string; complete: boolean } | undefined {
  let start = 0;
  for (;;) {
    const end = buf.indexOf('\r\n\r\n', start);
    if (end < 0) return undefined;
    const lines = buf.subarray(start, end).toString('latin1').split('\r\n');
    const status = Number(/^HTTP\/\d\.\d (\d{3})/.exec(lines[0] ?? '')?.[1] ?? NaN);
    if (Number.isNaN(status)) return { status: 0, headers: {}, body: lines[0] ?? '', complete: true };
    const headers: Record<string, string> = {};
    for (const line of lines.slice(1)) {
      const colon = line.indexOf(':');
      if (colon > 0) {
        const name = line.slice(0, colon).trim().toLowerCase();
        const value = line.slice(colon + 1).trim();
        headers[name] = name in headers ? `${headers[name]}, ${value}` : value;
      }
    }
    const bodyStart = end + 4;
    // 100 Continue and other interim answers come before the real one.
    if (status >= 100 && status < 200 && status !== 101) {
      start = bodyStart;
      continue;
    }
    const rest = buf.subarray(bodyStart);
    if (head || status === 101 || status === 204 || status === 304)
      return { status, headers, body: '', complete: true };
    const length = headers['content-length'];
    if (length !== undefined && /^\d+$/.test(length)) {
      const n = Number(length);
      return { status, headers, body: rest.subarray(0, n).toString('utf8'), complete: rest.length >= n };
    }
    if (/chunked/i.test(headers['transfer-encoding'] ?? '')) {
      const complete = rest.includes('0\r\n\r\n');
      return { status, headers, body: dechunk(rest), complete };
    }
    return { status, headers, body: rest.toString('utf8'), complete: closed };
  }
}

function dechunk(buf: Buffer): string {
  const parts: Buffer[] = [];
  let at = 0;
  for (;;) {
    const eol = buf.indexOf('\r\n', at);
    if (eol < 0) break;
    const size = parseInt(buf.subarray(at, eol).toString('latin1'), 16);
    if (!(size > 0)) break;
    parts.push(buf.subarray(eol + 2, eol + 2 + size));
    at = eol + 2 + size + 2;
  }
  return Buffer.concat(parts).toString('utf8');
}

export interface RawOptions {
  port: number;
  ca: string;
  /** A client certificate to present. */
  cert?: { certPem: string; keyPem: string };
  /** The bytes to send, in these pieces (each its own write, so a parser sees them split). */
  pieces: Buffer[];
  /** How long to wait for an answer before half-closing, then as long again for the close. */
  deadlineMs: number;
  alpn?: string[];
  /** A HEAD request, whose answer has a head only. */
  head?: boolean;
  /** A TLS session to resume, saving the handshake's signatures (see TLSSessions). */
  sessions?: TLSSessions;
}

/**
 * The last TLS session a server gave us, to resume the next connection with: a handshake without certificate
 * signatures costs both ends a fraction of a full one, and the fuzzer opens a connection per case.
 */
export class TLSSessions {
  private session: Buffer | undefined;
  get(): Buffer | undefined {
    return this.session;
  }
  set(session: Buffer): void {
    this.session = session;
  }
}

/**
 * Sends raw bytes over TLS and reads one HTTP/1.x answer. A request whose framing leaves the server waiting for
 * more (a body shorter than its Content-Length) is legitimately unanswered: after the deadline the client
 * half-closes, and from then on the server must answer or close within the deadline again; only then is it a hang.
 */
export function rawExchange(opts: RawOptions): Promise<Answer> {
  return new Promise((done) => {
    const tlsOptions: ConnectionOptions = {
      host: '127.0.0.1',
      port: opts.port,
      ca: opts.ca,
      ALPNProtocols: opts.alpn ?? ['http/1.1'],
      ...(opts.cert ? { cert: opts.cert.certPem, key: opts.cert.keyPem } : {}),
      ...(opts.sessions?.get() ? { session: opts.sessions.get() } : {}),
    };
    const socket: TLSSocket = tlsConnect(tlsOptions);
    socket.on('session', (session: Buffer) => opts.sessions?.set(session));
    const chunks: Buffer[] = [];
    let finished = false;
    let halfClosed = false;
    let timer: NodeJS.Timeout | undefined;
    const finish = (answer: Answer): void => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      socket.destroy();
      done(answer);
    };
    const check = (closed: boolean): void => {
      const parsed = parseResponse(Buffer.concat(chunks), closed, opts.head);
      if (parsed && (parsed.complete || closed))
        return finish({
          kind: 'response',
          status: parsed.status,
          headers: parsed.headers,
          body: parsed.body,
        });
      if (closed)
        finish({
          kind: 'closed',
          detail: chunks.length ? `closed mid-answer: ${Buffer.concat(chunks).length} bytes` : 'closed',
        });
    };
    const arm = (): void => {
      timer = setTimeout(() => {
        const parsed = parseResponse(Buffer.concat(chunks), false, opts.head);
        // A head came (a watch, a stream): answered, whatever the body does.
        if (parsed)
          return finish({
            kind: 'response',
            status: parsed.status,
            headers: parsed.headers,
            body: parsed.body,
          });
        if (!halfClosed) {
          halfClosed = true;
          socket.end();
          return arm();
        }
        finish({ kind: 'hang', detail: `no answer ${opts.deadlineMs} ms after the client half-closed` });
      }, opts.deadlineMs);
    };
    socket.on('secureConnect', () => {
      for (const piece of opts.pieces) socket.write(piece);
    });
    socket.on('data', (chunk: Buffer) => {
      chunks.push(chunk);
      check(false);
    });
    socket.on('error', () => {});
    socket.on('close', () => check(true));
    arm();
  });
}

export interface H2Request {
  headers: Record<string, string | string[]>;
  body?: Buffer;
}

/**
 * One HTTP/2 session to the proxy, opened again whenever a case (or the proxy) closed it. With `alpn`, the TLS
 * connection offers that protocol instead of h2 (a replica's peer link speaks HTTP/2 under its own name) and takes
 * the server's certificate from the CA alone, whatever name it carries.
 */
export class H2Client {
  private session: ClientHttp2Session | undefined;
  private readonly url: string;
  private readonly options: { ca: string; cert?: string; key?: string };
  private readonly alpn: string[] | undefined;

  constructor(url: string, ca: string, cert?: { certPem: string; keyPem: string }, alpn?: string[]) {
    this.url = url;
    this.options = { ca, ...(cert ? { cert: cert.certPem, key: cert.keyPem } : {}) };
    this.alpn = alpn;
  }

  private connect(): ClientHttp2Session {
    if (!this.alpn) return http2Connect(this.url, this.options);
    const { hostname, port } = new URL(this.url);
    const alpn = this.alpn;
    return http2Connect(this.url, {
      createConnection: () => {
        const socket = tlsConnect({
          host: hostname,
          port: Number(port),
          ...this.options,
          ALPNProtocols: alpn,
          checkServerIdentity: () => undefined,
        });
        socket.on('error', () => {});
        return socket;
      },
    });
  }

  private current(): ClientHttp2Session {
    if (!this.session || this.session.closed || this.session.destroyed) {
      const session = this.connect();
      session.on('error', () => {});
      // Never keep the fuzzer alive for an idle session.
      session.unref();
      this.session = session;
    }
    return this.session;
  }

  /**
   * A stream of `session` that nghttp2 would not send (a header it refuses) dooms the session: Node closes it a turn
   * later (GOAWAY), and the server refuses any stream opened on it meanwhile. The next request opens another.
   */
  private dropOnFrameError(stream: ClientHttp2Stream, session: ClientHttp2Session): void {
    stream.once('frameError', () => {
      if (this.session === session) this.session = undefined;
    });
  }

  request(req: H2Request, deadlineMs: number): Promise<Answer> {
    return new Promise((done) => {
      let stream;
      try {
        const session = this.current();
        stream = session.request(req.headers, { endStream: req.body === undefined });
        this.dropOnFrameError(stream, session);
      } catch (err) {
        return done({ kind: 'unsendable', detail: (err as Error & { code?: string }).code ?? String(err) });
      }
      let finished = false;
      let status = 0;
      let headers: Record<string, string> = {};
      const chunks: Buffer[] = [];
      const finish = (answer: Answer): void => {
        if (finished) return;
        finished = true;
        clearTimeout(timer);
        if (!stream.closed) stream.close(constants.NGHTTP2_CANCEL);
        done(answer);
      };
      const timer = setTimeout(
        () =>
          status
            ? finish({ kind: 'response', status, headers, body: Buffer.concat(chunks).toString('utf8') })
            : finish({ kind: 'hang', detail: `no response head within ${deadlineMs} ms` }),
        deadlineMs,
      );
      stream.on('response', (h) => {
        status = Number(h[':status']);
        headers = Object.fromEntries(
          Object.entries(h)
            .filter(([name]) => !name.startsWith(':'))
            .map(([name, value]) => [name, Array.isArray(value) ? value.join(', ') : String(value)]),
        );
      });
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.on('end', () =>
        finish(
          status
            ? { kind: 'response', status, headers, body: Buffer.concat(chunks).toString('utf8') }
            : { kind: 'closed', detail: 'stream ended without a response' },
        ),
      );
      stream.on('error', (err: Error & { code?: string }) => {
        // ERR_HTTP2_INVALID_HEADER_VALUE and friends are thrown here by some Node versions, before sending.
        if (!status && err.code?.startsWith('ERR_HTTP2_INVALID'))
          return finish({ kind: 'unsendable', detail: err.code });
        finish(
          status
            ? { kind: 'response', status, headers, body: Buffer.concat(chunks).toString('utf8') }
            : { kind: 'closed', detail: `stream error: ${err.code ?? err.message}` },
        );
      });
      stream.on('close', () =>
        finish(
          status
            ? { kind: 'response', status, headers, body: Buffer.concat(chunks).toString('utf8') }
            : { kind: 'closed', detail: `stream closed (${stream.rstCode})` },
        ),
      );
      if (req.body !== undefined) stream.end(req.body);
    });
  }

  /**
   * Opens a CONNECT stream (a byte stream, as a replica's peer link carries upgrades on) and sends raw HTTP/1.1 on
   * it, reading one answer back as rawExchange does. A refused CONNECT is the answer itself.
   */
  connectExchange(pieces: Buffer[], deadlineMs: number, head = false): Promise<Answer> {
    return new Promise((done) => {
      let stream;
      try {
        const session = this.current();
        stream = session.request({ ':method': 'CONNECT', ':authority': 'peer' }, { endStream: false });
        this.dropOnFrameError(stream, session);
      } catch (err) {
        return done({ kind: 'unsendable', detail: (err as Error & { code?: string }).code ?? String(err) });
      }
      const chunks: Buffer[] = [];
      let finished = false;
      const finish = (answer: Answer): void => {
        if (finished) return;
        finished = true;
        clearTimeout(timer);
        if (!stream.closed) stream.close(constants.NGHTTP2_CANCEL);
        done(answer);
      };
      const check = (closed: boolean): void => {
        const parsed = parseResponse(Buffer.concat(chunks), closed, head);
        if (parsed && (parsed.complete || closed))
          return finish({
            kind: 'response',
            status: parsed.status,
            headers: parsed.headers,
            body: parsed.body,
          });
        if (closed) finish({ kind: 'closed', detail: chunks.length ? 'closed mid-answer' : 'closed' });
      };
      const timer = setTimeout(() => {
        const parsed = parseResponse(Buffer.concat(chunks), false, head);
        finish(
          parsed
            ? { kind: 'response', status: parsed.status, headers: parsed.headers, body: parsed.body }
            : { kind: 'hang', detail: `no answer on the CONNECT stream within ${deadlineMs} ms` },
        );
      }, deadlineMs);
      stream.on('response', (h) => {
        const status = Number(h[':status']);
        if (status !== 200) return finish({ kind: 'response', status, headers: {}, body: '' });
        for (const piece of pieces) stream.write(piece);
      });
      stream.on('data', (chunk: Buffer) => {
        chunks.push(chunk);
        check(false);
      });
      stream.on('error', () => check(true));
      stream.on('end', () => check(true));
      stream.on('close', () => check(true));
    });
  }

  close(): void {
    this.session?.destroy();
    this.session = undefined;
  }
}
