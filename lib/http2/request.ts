// One request and its response as the proxy's handlers see them, over HTTP/1.1 (Node's IncomingMessage and
// ServerResponse) or HTTP/2. HTTP/2 requests are served on Node's core stream API, wrapped in the few members the
// handlers use. Node's HTTP/2 compatibility layer would build a Readable and a response stream per request, hang
// a dozen listeners on the HTTP/2 stream and pass every body chunk through both: about a sixth of the proxy's
// own CPU per request in the benchmark.
import type { IncomingHttpHeaders, IncomingMessage, OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { constants, type ServerHttp2Stream } from 'node:http2';
import type { TLSSocket } from 'node:tls';
import { answersInHttp2 } from './upgrade.ts';

export class H2Request {
  /** The request target (the `:path` pseudo-header); the handler rewrites it for routed clusters. */
  url: string;
  readonly method: string;
  readonly stream: ServerHttp2Stream;
  readonly headers: IncomingHttpHeaders;
  /** Header names and values as sent, repeated fields kept apart. */
  readonly rawHeaders: string[];

  /** `method`: what the request is read as, when not its `:method` (an extended CONNECT's upgrade: serveConnect). */
  constructor(
    stream: ServerHttp2Stream,
    headers: IncomingHttpHeaders,
    rawHeaders: string[],
    method?: string,
  ) {
    this.stream = stream;
    this.headers = headers;
    this.rawHeaders = rawHeaders;
    this.url = (headers[':path'] as string | undefined) ?? '/';
    this.method = method ?? (headers[':method'] as string | undefined) ?? 'GET';
  }

  /** The connection's TLS socket (Node's stand-in for it, one per connection). */
  get socket(): TLSSocket | undefined {
    return this.stream.session?.socket as TLSSocket | undefined;
  }

  /** Streams the request body into `destination`. */
  pipe<T extends NodeJS.WritableStream>(destination: T): T {
    return this.stream.pipe(destination);
  }

  /** Stops streaming the request body into `destination`; what is left stays unread. */
  unpipe(destination: NodeJS.WritableStream): void {
    this.stream.unpipe(destination);
  }

  [Symbol.asyncIterator](): AsyncIterator<Buffer> {
    return (this.stream as AsyncIterable<Buffer>)[Symbol.asyncIterator]();
  }
}

export class H2Response {
  statusCode = 200;
  headersSent = false;

  readonly #stream: ServerHttp2Stream;

  constructor(stream: ServerHttp2Stream) {
    this.#stream = stream;
  }

  get destroyed(): boolean {
    return this.#stream.destroyed;
  }

  get writableFinished(): boolean {
    return this.#stream.writableFinished;
  }

  /** Bytes written and not yet sent (the client's window closed on them). */
  get writableLength(): number {
    return this.#stream.writableLength;
  }

  /**
   * Sends the response headers (HTTP/2 sends them at once: there is nothing to flush later). Takes `headers` over
   * (it gains `:status`), as every caller builds a fresh object for it.
   */
  writeHead(code: number, headers: OutgoingHttpHeaders = {}): this {
    this.statusCode = code;
    // A stream the client already reset takes no headers; its 'close' ends the request's bookkeeping.
    if (this.headersSent || this.#stream.destroyed || this.#stream.closed) return this;
    this.headersSent = true;
    headers[':status'] = code;
    this.#stream.respond(headers);
    return this;
  }

  write(chunk: Buffer): boolean {
    // A HEAD request or a 204/304 answer ends the stream with the headers: nothing more may be written.
    if (this.#stream.destroyed || this.#stream.writableEnded) return true;
    return this.#stream.write(chunk);
  }

  end(body?: string | Buffer): void {
    if (!this.headersSent) this.writeHead(this.statusCode);
    if (this.#stream.destroyed || this.#stream.writableEnded) return;
    if (body === undefined) this.#stream.end();
    else this.#stream.end(body);
  }

  /**
   * After a complete answer, tells a client still sending a request body that nothing reads to stop (RST_STREAM with
   * NO_ERROR, as RFC 9113 section 8.1 allows), so that such a body is neither buffered nor waited for.
   */
  refuseRestOfRequest(): void {
    const stream = this.#stream;
    // A body still flowing somewhere (piped to the API server or into a tunnel) is its consumer's to end.
    if (stream.destroyed || stream.endAfterHeaders || stream.readableEnded || stream.readableFlowing) return;
    stream.close(constants.NGHTTP2_NO_ERROR);
  }

  /**
   * Cuts the response short: the client sees the stream reset with INTERNAL_ERROR, so no client takes a truncated
   * body for a whole one. (A destroy without an error resets with NO_ERROR, and close(code) ends the writable side
   * first; a Node client saw a normal end after either.)
   */
  destroy(): void {
    this.#stream.destroy(new Error('response cut short'));
  }

  on(event: 'close' | 'drain', listener: () => void): this {
    this.#stream.on(event, listener);
    return this;
  }

  off(event: 'close' | 'drain', listener: () => void): this {
    this.#stream.off(event, listener);
    return this;
  }

  /**
   * A stream emits 'close' once only, so that listener is added with on(): once() would wrap it in a closure and a
   * record of its own, which an idle watch keeps for as long as it stays open.
   */
  once(event: 'close' | 'drain', listener: () => void): this {
    if (event === 'close') this.#stream.on(event, listener);
    else this.#stream.once(event, listener);
    return this;
  }
}

export type Request = IncomingMessage | H2Request;
export type Response = ServerResponse | H2Response;

/** One listener for every stream's errors, rather than a function of its own per request. */
const ignore = (): void => {};

/** Serves each stream of an HTTP/2 server as a request and its response. */
export function serveStream(
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  rawHeaders: string[],
  handle: (req: H2Request, res: H2Response) => void,
): void {
  // A stream the client resets errors; the reset already ended the request, so there is nothing to do but not crash.
  stream.on('error', ignore);
  // The body a client holds back for a 100 Continue (HTTP/1.1 habit, rare on HTTP/2) is wanted: ask for it.
  if (headers['expect'] === '100-continue') stream.additionalHeaders({ ':status': 100 });
  handle(new H2Request(stream, headers, rawHeaders), new H2Response(stream));
}

/** Whether a stream's request is an extended CONNECT (RFC 8441): a CONNECT that names the protocol it carries. */
export const isExtendedConnectRequest = (headers: IncomingHttpHeaders): boolean =>
  headers[':method'] === 'CONNECT' && typeof headers[':protocol'] === 'string';

/** No bytes came before the stream's DATA: an extended CONNECT has no head to pass on. */
const NO_HEAD = Buffer.alloc(0);

/**
 * Serves an extended CONNECT stream as the HTTP/1.1 upgrade it stands for: a POST to its `:path` with `Upgrade:` its
 * `:protocol`, the stream the upgraded connection (its DATA both ways, END_STREAM its half-close). The stream is
 * answered in HTTP/2 (lib/http2/upgrade.ts answersInHttp2). So every stage after the listener reads one kind of
 * upgrade whatever carried it; only the answer differs.
 */
export function serveConnect(
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  rawHeaders: string[],
  handle: (req: H2Request, socket: ServerHttp2Stream, head: Buffer) => void,
): void {
  stream.on('error', ignore);
  answersInHttp2(stream);
  const asUpgrade: IncomingHttpHeaders = {
    ...headers,
    connection: 'upgrade',
    upgrade: headers[':protocol'] as string,
  };
  handle(new H2Request(stream, asUpgrade, rawHeaders, 'POST'), stream, NO_HEAD);
}

/**
 * A request's header fields from its raw list, lower-cased, repeated fields kept apart (two Impersonate-Group fields
 * stay two groups, never one joined with a comma), leaving out pseudo-headers and the names `dropped` matches.
 */
export function fieldsOf(
  rawHeaders: string[],
  dropped: (name: string) => boolean,
): Record<string, string | string[]> {
  // No prototype: a field named constructor or __proto__ is a field like any other, not Object's.
  const headers = Object.create(null) as Record<string, string | string[]>;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name.charCodeAt(0) === 58 /* ':' */ || dropped(name)) continue;
    const value = rawHeaders[i + 1]!;
    const seen = headers[name];
    if (seen === undefined) headers[name] = value;
    else if (typeof seen === 'string') headers[name] = [seen, value];
    else seen.push(value);
  }
  return headers;
}
