// Broken proxies the fuzzer must catch: a TLS front (HTTP/2 and HTTP/1.1) that forwards every request over HTTP/2 and
// relays the answer, breaking one thing on the way. In front of the concierge it takes the fuzzer's connections in the
// concierge's place; behind it, it takes the concierge's own requests in the API server's place. The concierge stays as
// installed, so no product code carries a switch for a mutation; the front's own forwarding is shown faithful by runs
// through it that mutate nothing and find nothing.
//
// What a TLS front cannot pass on is the client's certificate: a request that came with the fuzz user's certificate
// goes on with it (the front holds it, as the fuzzer does), any other certificate is dropped. The concierge reaches
// the API server with a bearer token, which passes through.
import {
  connect as http2Connect,
  constants,
  createSecureServer,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type Http2SecureServer,
  type Http2ServerRequest,
  type Http2ServerResponse,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
} from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { X509Certificate } from 'node:crypto';
import { statusBody } from '../../lib/kube/status.ts';
import { issueCert, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import type { Cluster } from '../../dev/cluster.ts';
import type { Credential, FuzzTarget } from './target.ts';

/**
 * What the front breaks:
 * - `none`: nothing (the control: the front alone must not make a finding);
 * - `own-5xx`: every answer of the API server's from 400 up becomes a 500 of the front's own, as a proxy that failed
 *   on an upstream error would answer (no Audit-Id: the API server did not make it);
 * - `forged-token`: a bearer token the concierge refuses (its 401) is replaced by the fuzz user's valid one and the
 *   request sent again, as a proxy that fell back to a cached credential would serve it;
 * - `drop-impersonation`: the client's own Impersonate-* fields are dropped on the way, so a request that asked to
 *   act as someone else is served as its caller;
 * - `drop-groups` (behind the concierge): the Impersonate-Group fields the concierge sends are dropped, so the API
 *   server decides for the user without the groups that grant what they may do.
 */
export type Mutation = 'none' | 'own-5xx' | 'forged-token' | 'drop-impersonation' | 'drop-groups';

/** A front in front of the concierge: the target as the fuzzer sees it through the front. */
export interface MutantFront {
  /** The concierge's process, the front's address and CA. */
  target: FuzzTarget;
  close(): Promise<void>;
}

/** A front listening, whose mutation a test may change between runs. */
export interface Front {
  url: string;
  port: number;
  mutation: Mutation;
  close(): Promise<void>;
}

/** Where a front forwards. */
interface FrontUpstream {
  url: string;
  ca: string;
  /** The certificate it shows for a client that showed this one. Default: none. */
  cert?: Credential;
  /** The valid token `forged-token` sends instead of a refused one. */
  token?: string;
}

/** Fields that belong to one connection (RFC 9113 §8.2.2), never forwarded; `te` only as `trailers`. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'transfer-encoding',
  'upgrade',
  'host',
  'http2-settings',
]);
/** A request body the front holds before forwarding it (the fuzz families send at most a few KiB). */
const MAX_BODY = 1 << 20;

type Request = Http2ServerRequest;
type Response = Http2ServerResponse;

/** An upstream answer's head, its body still to come on `stream`. */
interface Upstream {
  status: number;
  headers: IncomingHttpHeaders;
  stream: ClientHttp2Stream;
}

/** Whether `mutation` drops a request field named `name` (lower case). */
function dropped(mutation: Mutation, name: string): boolean {
  if (mutation === 'drop-impersonation') return name.startsWith('impersonate-');
  return mutation === 'drop-groups' && name === 'impersonate-group';
}

/** The request's fields as the front forwards them, repeated ones kept apart, pseudo-headers made anew. */
function forwardedHeaders(req: Request, mutation: Mutation): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = {
    ':method': req.method,
    ':path': req.url,
    ':scheme': 'https',
    ':authority': req.headers[':authority'] ?? req.headers.host ?? '127.0.0.1',
  };
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    const value = raw[i + 1]!;
    if (name.startsWith(':') || HOP_BY_HOP.has(name) || (name === 'te' && value !== 'trailers')) continue;
    if (dropped(mutation, name)) continue;
    const existing = headers[name];
    headers[name] = existing === undefined ? value : [...[existing].flat().map(String), value];
  }
  return headers;
}

async function readBody(req: Request): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new Error("request body past the front's limit");
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

/** Whether the client showed the certificate the front can show on its behalf. */
function showedCert(req: Request, fingerprint: string | undefined): boolean {
  if (fingerprint === undefined) return false;
  const socket = (req.httpVersion === '2.0' ? req.stream.session?.socket : req.socket) as
    TLSSocket | undefined;
  const peer = socket?.getPeerCertificate?.();
  return peer?.fingerprint256 === fingerprint;
}

/** Aborts the client's request as the upstream aborted it: a reset stream, or a closed HTTP/1.1 connection. */
function abort(req: Request, res: Response): void {
  if (req.httpVersion === '2.0') {
    if (!req.stream.closed) req.stream.close(constants.NGHTTP2_INTERNAL_ERROR);
  } else res.socket?.destroy();
}

/** Starts a front to `upstream`, serving a certificate of `servingCA` for 127.0.0.1. */
async function startFront(
  upstream: FrontUpstream,
  servingCA: CertificateAuthority,
  mutation: Mutation,
): Promise<Front> {
  const serving = await issueCert(servingCA, { commonName: 'mutant', hosts: ['127.0.0.1'], usage: 'server' });
  const certFingerprint = upstream.cert && new X509Certificate(upstream.cert.certPem).fingerprint256;
  const sessions = new Map<boolean, ClientHttp2Session>();
  const upstreamSession = (withCert: boolean): ClientHttp2Session => {
    const existing = sessions.get(withCert);
    if (existing && !existing.closed && !existing.destroyed) return existing;
    const session = http2Connect(upstream.url, {
      ca: upstream.ca,
      ...(withCert && upstream.cert ? { cert: upstream.cert.certPem, key: upstream.cert.keyPem } : {}),
    });
    session.on('error', () => {});
    sessions.set(withCert, session);
    return session;
  };

  /** Sends one request upstream; settles at the answer's head, or rejects when the stream ends before one. */
  const send = (withCert: boolean, headers: OutgoingHttpHeaders, body: Buffer): Promise<Upstream> =>
    new Promise((resolve, reject) => {
      const stream = upstreamSession(withCert).request(headers, { endStream: body.length === 0 });
      stream.once('response', (h) => resolve({ status: Number(h[':status']), headers: h, stream }));
      stream.once('error', reject);
      stream.once('close', () => reject(new Error(`upstream stream closed (${stream.rstCode})`)));
      if (body.length > 0) stream.end(body);
    });

  const relay = (answer: Upstream, res: Response): void => {
    const headers: OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(answer.headers))
      if (!name.startsWith(':') && !HOP_BY_HOP.has(name) && value !== undefined) headers[name] = value;
    res.writeHead(answer.status, headers);
    answer.stream.on('error', () => res.destroy());
    answer.stream.pipe(res);
  };

  const serve = async (req: Request, res: Response): Promise<void> => {
    const mutation = front.mutation;
    const body = await readBody(req);
    const withCert = showedCert(req, certFingerprint);
    let headers = forwardedHeaders(req, mutation);
    let answer = await send(withCert, headers, body);
    res.once('close', () => answer.stream.close(constants.NGHTTP2_CANCEL));
    const madeByConcierge = !('audit-id' in answer.headers);
    if (
      mutation === 'forged-token' &&
      upstream.token &&
      answer.status === 401 &&
      madeByConcierge &&
      headers['authorization']
    ) {
      answer.stream.close(constants.NGHTTP2_CANCEL);
      headers = { ...headers, authorization: `Bearer ${upstream.token}` };
      answer = await send(withCert, headers, body);
    }
    if (mutation === 'own-5xx' && answer.status >= 400 && !madeByConcierge) {
      answer.stream.close(constants.NGHTTP2_CANCEL);
      const text = statusBody(500, 'internal error in the impersonation proxy');
      res.writeHead(500, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
      res.end(text);
      return;
    }
    relay(answer, res);
  };

  const server: Http2SecureServer = createSecureServer(
    {
      key: serving.keyPem,
      cert: serving.certPem,
      allowHTTP1: true,
      requestCert: true,
      rejectUnauthorized: false,
    },
    (req, res) => {
      // Whatever stopped the forwarding (a field Node will not send on, a reset upstream, a client gone), the client
      // gets what the upstream gave: no answer.
      serve(req, res).catch(() => abort(req, res));
    },
  );
  const sockets = new Set<Socket>();
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  server.on('sessionError', () => {});
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const port = (server.address() as AddressInfo).port;
  const front: Front = {
    url: `https://127.0.0.1:${port}`,
    port,
    mutation,
    async close() {
      for (const session of sessions.values()) session.destroy();
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
  return front;
}

/** Starts a front to `target`'s proxy that breaks what `mutation` says. */
export async function startMutantFront(target: FuzzTarget, mutation: Mutation): Promise<MutantFront> {
  const ca = await newCA('sealion fuzz mutant front');
  const front = await startFront(
    { url: target.concierge.url, ca: target.proxyCA, cert: target.userCert, token: target.token },
    ca,
    mutation,
  );
  return {
    target: {
      ...target,
      concierge: { ...target.concierge, url: front.url },
      proxyPort: front.port,
      proxyCA: ca.certPem,
    },
    close: () => front.close(),
  };
}

/**
 * Starts a front to `cluster`'s API server, with a serving certificate of the cluster's CA, so that a concierge
 * given the front's URL for the cluster's trusts it as it trusts the API server.
 */
export function startApiServerFront(
  cluster: Pick<Cluster, 'url' | 'ca'>,
  mutation: Mutation,
): Promise<Front> {
  return startFront({ url: cluster.url, ca: cluster.ca.certPem }, cluster.ca, mutation);
}
