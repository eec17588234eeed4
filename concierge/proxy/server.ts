// The proxy's listener: one TLS server (TLS 1.2+, AEAD ciphers only, no RSA client signatures unless its own key is
// RSA, ALPN h2 and http/1.1) handing each connection to an HTTP/2 or an HTTP/1.1 server by the negotiated protocol.
// HTTP/1.1 carries the upgrades (exec, attach, port-forward); HTTP/2 carries reach connections as extended CONNECT
// streams too (RFC 8441), so that `sealion port-forward` opens each of its connections as a stream of one session
// instead of a TLS connection of its own. Certificates and trusted client CAs are swapped live with updateTLS.
import { createServer as createHttp1Server, type IncomingMessage, type ServerResponse } from 'node:http';
import {
  createServer as createHttp2Server,
  type Http2Session,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from 'node:http2';
import type { Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { listenOn } from '../../lib/listen.ts';
import { createPrivateKey } from 'node:crypto';
import { createServer as createTLSServer, type TLSSocket } from 'node:tls';
import { FIELDS_AS_SENT } from '../../lib/http2/hop-by-hop.ts';
import { STREAM_WINDOW_BYTES } from '../../lib/http2/pool.ts';
import {
  isExtendedConnectRequest,
  serveConnect,
  serveStream,
  type H2Request,
  type H2Response,
} from '../../lib/http2/request.ts';
import { rawStatusResponse } from '../../lib/kube/status.ts';
import { certificateFingerprints } from '../../lib/pki/pem.ts';

/** TLS 1.2 suites with forward secrecy and AEAD; TLS 1.3 suites are all AEAD. */
export const CIPHERS = [
  'TLS_AES_128_GCM_SHA256',
  'TLS_AES_256_GCM_SHA384',
  'TLS_CHACHA20_POLY1305_SHA256',
  'ECDHE-ECDSA-AES128-GCM-SHA256',
  'ECDHE-RSA-AES128-GCM-SHA256',
  'ECDHE-ECDSA-AES256-GCM-SHA384',
  'ECDHE-RSA-AES256-GCM-SHA384',
  'ECDHE-ECDSA-CHACHA20-POLY1305',
  'ECDHE-RSA-CHACHA20-POLY1305',
].join(':');

/**
 * The one client signature Sealion's listeners take: ECDSA on P-256 with SHA-256. Every client certificate Sealion
 * issues (users', agents', replicas') has a P-256 key (lib/pki/pki.ts). Anyone may send a certificate, and OpenSSL
 * checks its CertificateVerify with the certificate's own key (a garbage signature costs the same check): with a
 * 16384-bit RSA key and a 64-bit exponent, the largest OpenSSL takes, a handshake costs the server about 6 times a
 * plain one's CPU. A signature algorithm the server did not list is refused before anything is verified. The one name
 * covers both versions (code 0x0403: TLS 1.3's P-256 with SHA-256, TLS 1.2's ECDSA with SHA-256 on a curve of the
 * handshake's groups). Node sets only `sigalgs`, which also lists what the server may sign with, so a listener's list
 * is this plus what its own key needs (`signatureAlgorithms`). OpenSSL's list for client signatures alone
 * (client_sigalgs) is out of reach: no Node option sets it, and an OpenSSL configuration file would set it for every
 * context of the process, its clients' with RSA keys too.
 */
export const CLIENT_SIGALGS = 'ecdsa_secp256r1_sha256';

/** What a serving key of each kind signs with, TLS 1.3's schemes first; TLS 1.2 clients may lack RSA-PSS. */
const OWN_SIGALGS: Record<string, readonly string[]> = {
  'ec:prime256v1': [],
  'ec:secp384r1': ['ecdsa_secp384r1_sha384'],
  'ec:secp521r1': ['ecdsa_secp521r1_sha512'],
  rsa: [
    'rsa_pss_rsae_sha256',
    'rsa_pss_rsae_sha384',
    'rsa_pss_rsae_sha512',
    'rsa_pkcs1_sha256',
    'rsa_pkcs1_sha384',
    'rsa_pkcs1_sha512',
  ],
  'rsa-pss': ['rsa_pss_pss_sha256', 'rsa_pss_pss_sha384', 'rsa_pss_pss_sha512'],
  ed25519: ['ed25519'],
  ed448: ['ed448'],
};

/**
 * The `sigalgs` of a listener serving with `keyPem`: `CLIENT_SIGALGS`, then what the key signs with. With an RSA key
 * (an admin's own certificate) clients may sign with RSA too: a listener cannot take RSA-PSS for itself and refuse it
 * to clients. Undefined (Node's defaults) for a key of no kind listed, which no handshake could use anyway.
 */
export function signatureAlgorithms(keyPem: string): string | undefined {
  const key = createPrivateKey(keyPem);
  const curve = key.asymmetricKeyDetails?.namedCurve;
  const own = OWN_SIGALGS[key.asymmetricKeyType === 'ec' ? `ec:${curve}` : (key.asymmetricKeyType ?? '')];
  return own ? [CLIENT_SIGALGS, ...own].join(':') : undefined;
}

/** Request headers beyond this are refused with 431 before any work is done. */
export const MAX_HEADER_BYTES = 32 * 1024;
/**
 * How long a stranger may hold the proxy's resources. Each bound has a default chosen against what real clients do,
 * and every one is an option so tests can run them short.
 */
export interface ServerLimits {
  /**
   * A TLS handshake not finished by then is dropped. Default: 10 s (a handshake takes milliseconds; Node's own
   * default of two minutes lets a slow client hold a connection that long for nothing).
   */
  handshakeTimeoutMs: number;
  /**
   * A client that has not sent complete request headers by then gets 408 and is cut off (slowloris). Default: 30 s.
   */
  headersTimeoutMs: number;
  /**
   * An HTTP/1.1 request whose body is still arriving after this long gets 408. Default: 5 min. Watches and
   * upgrades (exec, port-forward) are complete once their headers are in, so this bounds uploads only.
   */
  requestTimeoutMs: number;
  /**
   * A connection with no request in flight closes after this: HTTP/1.1 keep-alive, and HTTP/2 sessions with no open
   * stream (half-sent headers included). Default: 90 s, as the API server's own idle timeout. An HTTP/2 session
   * that carries a watch is never idle, however quiet the watch.
   */
  idleTimeoutMs: number;
  /**
   * Connections open at once; more are dropped at accept. Default: 4,096. Each costs tens of KiB of TLS and HTTP/2
   * state even when idle, so this is what bounds the memory strangers can pin before they authenticate. kubectl and
   * client-go multiplex over one HTTP/2 connection per process.
   */
  maxConnections: number;
}

/**
 * Concurrent streams one HTTP/2 client connection may carry: 1,000, what Kubernetes gives aggregated API servers,
 * whose clients multiplex many requests and watches on one connection (the API server's own default is Go's 250).
 * Node's server refuses a new stream with ENHANCE_YOUR_CALM, which clients do not retry, when the streams it holds
 * are at this limit, and it holds a stream the client has just reset or finished until its next event-loop turn.
 * So a client at the limit that replaces a finished stream at once can be refused; the higher limit keeps
 * informer-heavy clients (hundreds of watches on one connection, replaced as they expire) clear of that.
 */
const MAX_STREAMS_PER_CONNECTION = 1000;

/**
 * Sessions whose streams take STREAM_WINDOW_BYTES (widenStreamWindows). A WeakSet: it goes with the session, and
 * nothing else reads it.
 */
const widened = new WeakSet<Http2Session>();
/** The connection window of a widened session: 128 streams at their full window, as lib/http2/pool.ts takes. */
const SESSION_WINDOW_BYTES = 32 << 20;

/**
 * Gives every stream of `session`, open and to come, a receive window of STREAM_WINDOW_BYTES (256 KiB) instead of
 * Node's default 64 KiB (one SETTINGS frame; HTTP/2 moves every open stream's window by the difference), once its
 * client has authenticated a reach connection on it: a reach connection's upload is window-bound, 64 KiB a round
 * trip, where 256 KiB keeps a loopback or LAN hop at full speed. The memory budget charges a stalled stream that
 * window already (lib/http2/memory-budget.ts mostHeld), so what a user leaves unread stays within their share.
 *
 * Not for every session: Node returns the connection's window as soon as bytes arrive, whether a stream is read or
 * not, so the connection window bounds nothing, and what a client can make the server hold on streams nobody reads
 * yet (while they are authenticated) is MAX_STREAMS_PER_CONNECTION stream windows: 62.5 MiB per connection at 64 KiB,
 * 250 MiB at 256 KiB. A stranger, who never authenticated on the connection, keeps the smaller figure; only a client
 * that has shown who it is gets the larger one.
 */
export function widenStreamWindows(session: Http2Session | undefined): void {
  if (!session || session.closed || session.destroyed || widened.has(session)) return;
  widened.add(session);
  session.settings({ initialWindowSize: STREAM_WINDOW_BYTES });
  // The connection's window too (one WINDOW_UPDATE), or it would hold the session's uploads together to 64 KiB a round
  // trip. It bounds no memory (Node returns it as bytes arrive), so it costs nothing to raise.
  session.setLocalWindowSize(SESSION_WINDOW_BYTES);
}

export const DEFAULT_SERVER_LIMITS: Readonly<ServerLimits> = Object.freeze({
  handshakeTimeoutMs: 10_000,
  headersTimeoutMs: 30_000,
  requestTimeoutMs: 5 * 60_000,
  idleTimeoutMs: 90_000,
  maxConnections: 4096,
});

export interface ProxyTLS {
  certPem: string;
  keyPem: string;
  /** CAs whose client certificates identify users (the signer CAs, current and previous). */
  clientCAPems: string[];
  /**
   * Refuse, at the handshake, clients without a certificate from those CAs: for a listener only one party dials (the
   * aggregated APIs, which the API server's front proxy alone calls), so strangers cannot hold its connections. Fixed
   * when the server is made (updateTLS changes the CAs, not this). Default: false (certificates are optional, bearer
   * tokens are the other way in).
   */
  requireClientCertificate?: boolean;
  /**
   * Take client signatures of every kind, not `CLIENT_SIGALGS` alone: for client certificates from CAs Sealion does
   * not run, whose keys may be RSA (the API server's front proxy's, often RSA; `--client-ca-file`'s). Fixed when the
   * server is made, as above. Default: false.
   */
  anyClientKey?: boolean;
}

export type RequestHandler = (req: IncomingMessage | H2Request, res: ServerResponse | H2Response) => void;
/**
 * An upgrade: an HTTP/1.1 one on its socket, or an HTTP/2 extended CONNECT read as the upgrade it stands for (a POST
 * with `Upgrade:` its `:protocol`) on its stream (lib/http2/request.ts serveConnect).
 */
export type UpgradeHandler = (req: IncomingMessage | H2Request, socket: Duplex, head: Buffer) => void;

export interface ProxyServer {
  listen(port: number, host: string): Promise<number>;
  updateTLS(tls: ProxyTLS): void;
  /**
   * Fingerprints of the client CAs trusted now. A connection's certificate is verified at its handshake only; the
   * request path checks each request against these, so a CA taken out stops working on open connections too.
   */
  trustedClientCAs(): ReadonlySet<string>;
  /**
   * Stops taking connections, for a draining replica: the listener closes; idle HTTP/1.1 connections close and busy
   * ones close after their response; each HTTP/2 connection is sent GOAWAY, so its client opens no new stream here and
   * the streams under way go on. Idempotent; close() ends what is left.
   */
  stopAccepting(): void;
  close(): Promise<void>;
}

function secureOptions(tls: ProxyTLS, anyClientKey: boolean): object {
  const sigalgs = anyClientKey ? undefined : signatureAlgorithms(tls.keyPem);
  return {
    cert: tls.certPem,
    key: tls.keyPem,
    // Client certificates are optional (bearer tokens are the other way in) but verified when sent, unless required.
    requestCert: true,
    rejectUnauthorized: tls.requireClientCertificate === true,
    ...(tls.clientCAPems.length > 0 ? { ca: tls.clientCAPems } : {}),
    minVersion: 'TLSv1.2',
    ciphers: CIPHERS,
    honorCipherOrder: true,
    ...(sigalgs ? { sigalgs } : {}),
  };
}

/**
 * Closes an HTTP/2 session (GOAWAY, then the connection) once it has had no open stream for `idleMs`. Node's
 * session timeout counts frames, not streams: a quiet watch sends none, so the timeout alone would cut watches, and
 * a session that never opens a stream would live as long as its client liked.
 */
function closeWhenIdle(session: ServerHttp2Session, idleMs: number): void {
  let open = 0;
  // One listener for all the session's streams (a stream closes once): a closure per stream would stay with every
  // idle watch.
  const closed = (): void => {
    // A fired timer is not armed again by the quiet that follows: start the clock anew from the last stream's end.
    if (--open === 0 && !session.closed) session.setTimeout(idleMs);
  };
  session.on('stream', (stream: ServerHttp2Stream) => {
    open++;
    stream.on('close', closed);
  });
  // A lasting listener: the callback setTimeout takes is called once only.
  session.on('timeout', () => {
    if (open === 0) session.close();
  });
  session.setTimeout(idleMs);
}

export function newProxyServer(
  tls: ProxyTLS,
  onRequest: RequestHandler,
  onUpgrade: UpgradeHandler,
  onTLSError?: (err: Error) => void,
  limits: Partial<ServerLimits> = {},
): ProxyServer {
  const bounds: ServerLimits = { ...DEFAULT_SERVER_LIMITS, ...limits };
  const anyClientKey = tls.anyClientKey === true;
  /** Set once the server stops taking connections: HTTP/1.1 answers from then on close their connection. */
  let stopped = false;
  const sessions = new Set<ServerHttp2Session>();
  /** HTTP/1.1 responses under way that began before the server stopped taking connections. */
  const answering = new Set<ServerResponse>();
  const http1 = createHttp1Server(
    {
      maxHeaderSize: MAX_HEADER_BYTES,
      keepAliveTimeout: bounds.idleTimeoutMs,
      headersTimeout: bounds.headersTimeoutMs,
      requestTimeout: bounds.requestTimeoutMs,
      // How often Node looks for connections past those two deadlines.
      connectionsCheckingInterval: Math.min(1000, bounds.headersTimeoutMs / 2),
    },
    (req, res) => {
      // Node then answers with `Connection: close` and closes the connection once the response is sent.
      if (stopped) res.shouldKeepAlive = false;
      else {
        answering.add(res);
        res.once('close', () => answering.delete(res));
      }
      onRequest(req, res);
    },
  );
  // The connections come from the TLS server below (emit('connection')); this server never listen()s. Node starts
  // the checks behind headersTimeout and requestTimeout when a server starts listening, so without this event no
  // deadline would ever fire and a client could hold its request headers open forever.
  http1.emit('listening');
  http1.on('upgrade', onUpgrade);
  http1.on('clientError', (err: Error & { code?: string }, socket: Socket) => {
    // Malformed HTTP: answer with a Status when the socket still can, then drop it. Nothing reaches the handler.
    if (!socket.writable) return void socket.destroy();
    const [code, message] =
      err.code === 'HPE_HEADER_OVERFLOW'
        ? [431, `request headers over ${MAX_HEADER_BYTES} bytes`]
        : err.code === 'ERR_HTTP_REQUEST_TIMEOUT'
          ? [408, 'request headers not received in time']
          : [400, 'malformed HTTP request'];
    socket.end(rawStatusResponse(code, message));
  });
  // HTTP/2 on the core stream API, not the compatibility layer (exchange.ts says why).
  const http2 = createHttp2Server({
    ...FIELDS_AS_SENT,
    // As many fields as the list may hold (32 bytes each at the least, as HTTP/2 counts them): Node's default of 128
    // reset the stream of a client that sent more (its own Impersonate-Group fields, one per group), which the API
    // server and the proxy's HTTP/1.1 listener (2,000) serve.
    maxHeaderListPairs: MAX_HEADER_BYTES / 32,
    settings: {
      maxConcurrentStreams: MAX_STREAMS_PER_CONNECTION,
      maxHeaderListSize: MAX_HEADER_BYTES,
      // SETTINGS_ENABLE_CONNECT_PROTOCOL: clients may open extended CONNECT streams (reach connections). Without it,
      // nghttp2 resets a stream that names a :protocol.
      enableConnectProtocol: true,
    },
  });
  http2.on('stream', (stream, headers, _flags, rawHeaders: string[]) => {
    if (isExtendedConnectRequest(headers)) serveConnect(stream, headers, rawHeaders, onUpgrade);
    else serveStream(stream, headers, rawHeaders, onRequest);
  });
  http2.on('sessionError', () => {});
  http2.on('session', (session: ServerHttp2Session) => {
    closeWhenIdle(session, bounds.idleTimeoutMs);
    if (stopped) return void session.close();
    sessions.add(session);
    session.once('close', () => sessions.delete(session));
  });

  const server = createTLSServer(
    {
      ...secureOptions(tls, anyClientKey),
      ALPNProtocols: ['h2', 'http/1.1'],
      handshakeTimeout: bounds.handshakeTimeoutMs,
    },
    (socket: TLSSocket) => {
      // A connection's client certificate is read once (authenticate.ts); no renegotiation may swap it later.
      // HTTP/2 forbids renegotiation anyway, and Go's servers, the API server's included, never allow it.
      socket.disableRenegotiation();
      if (socket.alpnProtocol === 'h2') http2.emit('connection', socket);
      else http1.emit('connection', socket);
    },
  );
  // With a listener here Node leaves the failed socket open (a handshake timeout included): close it ourselves.
  server.on('tlsClientError', (err, socket) => {
    socket.destroy();
    onTLSError?.(err);
  });
  server.maxConnections = bounds.maxConnections;
  let trusted = certificateFingerprints(tls.clientCAPems);
  const sockets = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    // Small writes (a response's head, one watch event) must leave at once, not wait for Nagle's delayed ACK.
    socket.setNoDelay(true);
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });

  return {
    listen: (port, host) => listenOn(server, port, host),
    updateTLS(next) {
      // New handshakes use the new material; established connections keep theirs (but see trustedClientCAs).
      const nextTrusted = certificateFingerprints(next.clientCAPems);
      server.setSecureContext({ ...secureOptions(next, anyClientKey) });
      trusted = nextTrusted;
    },
    trustedClientCAs: () => trusted,
    stopAccepting() {
      if (stopped) return;
      stopped = true;
      if (server.listening) server.close();
      http1.closeIdleConnections();
      // A connection busy with a response closes once it is sent: before its head, by Node's `Connection: close`;
      // after it, as an idle connection once the response is finished.
      for (const res of answering) {
        if (!res.headersSent) res.shouldKeepAlive = false;
        else res.once('finish', () => setImmediate(() => http1.closeIdleConnections()));
      }
      answering.clear();
      // GOAWAY: the client opens its next streams elsewhere; the streams under way finish, then the session closes.
      for (const session of sessions) session.close();
    },
    close() {
      return new Promise((done) => {
        server.close(() => done());
        // Stops the deadline checks (see the 'listening' above); it has no listener of its own to close.
        http1.close();
        http1.closeAllConnections();
        for (const socket of sockets) socket.destroy();
      });
    },
  };
}
