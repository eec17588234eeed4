// The proxy against a capturing upstream: exactly which headers reach the API server, which never do, what the
// log says (and never says), the metrics, and the Status answers for upstream failures.
import { AUTHENTICATOR_URI_PREFIX } from '../../apis/install.ts';
import { HOP_FIELDS } from '../../lib/http2/hop-by-hop.test.ts';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { request } from 'node:https';
import {
  connect as http2Connect,
  constants,
  createSecureServer,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type Http2SecureServer,
  type ServerHttp2Session,
} from 'node:http2';
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { connect as tlsConnect, type TLSSocket } from 'node:tls';
import { connect as netConnect } from 'node:net';
import { X509Certificate } from 'node:crypto';
import { apiGroups } from '../../apis/groups.ts';
import { eventually } from '../../dev/eventually.ts';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { AuthResult, TokenAuthenticator } from '../../lib/authn/types.ts';
import type { AccessQuestion, Reviewer } from '../../lib/kube/kube.ts';
import { newLogger } from '../../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import {
  CERTIFICATE_EXPIRED,
  CERTIFICATE_UNBOUND,
  CERTIFICATE_UNTRUSTED,
  newRequestAuthenticator,
} from './authenticate.ts';
import { newClientCertSigner } from './credentials.ts';
import { newHubRoute } from './hub-route.ts';
import { newClusterRouter } from './route.ts';
import { newProxyMetrics, type ProxyMetrics } from './metrics.ts';
import { newProxyServer, type ProxyServer } from './server.ts';
import { STREAM_WINDOW_BYTES } from '../../lib/http2/pool.ts';
import { UNAUTHORIZED } from '../../lib/kube/status.ts';
import { MAX_ANONYMOUS_IN_FLIGHT, newProxyHandler } from './handler.ts';
import { SSH_DOOR_OFF } from './hub-apis.ts';
import type { SSHDoor } from '../../apis/identity.ts';
import { HUB_REVIEW_LIMITS } from './decide.ts';

/**
 * Short deadlines for the tests of what a stranger can hold; the defaults are tens of seconds. Short, but not so short
 * that a client doing everything right misses them on two busy cores (a TLS handshake there can take hundreds of ms).
 */
const BODY_TIMEOUT_MS = 1_000;
const LIMITS = {
  handshakeTimeoutMs: 1_000,
  headersTimeoutMs: 1_000,
  requestTimeoutMs: 2_000,
  idleTimeoutMs: 1_000,
  maxConnections: 8,
};

const TOKENS: Record<string, AuthResult> = {
  'alice-token': {
    ok: true,
    authenticator: 'test',
    user: { username: 'alice', groups: ['dev'], extra: { 'example.com/scopes': ['read'] } },
  },
  // U+0173 (ų) has the low byte of `s`: a header written as Latin-1 would make this group system:masters.
  'unicode-token': {
    ok: true,
    authenticator: 'test',
    user: { username: 'José 東京', groups: ['\u0173ystem:masters'], extra: { team: ['café'] } },
  },
};
/** Identities an authenticator may return that cannot reach the API server as they are: each is refused. */
const UNSENDABLE: string[] = [];
const unsendable = (what: string, user: { username: string; groups: string[] }): void => {
  TOKENS[`unsendable-${what.replace(/ /g, '-')}`] = {
    ok: true,
    authenticator: 'test',
    user: { ...user, extra: {} },
  };
  UNSENDABLE.push(what);
};
unsendable('a leading space', { username: ' alice', groups: [] });
unsendable('a trailing tab', { username: 'alice\t', groups: [] });
unsendable('a newline in a group', { username: 'alice', groups: ['dev\nsystem:masters'] });
unsendable('a NUL', { username: 'alice\u0000root', groups: [] });
unsendable('an empty group', { username: 'alice', groups: [''] });
unsendable('a lone surrogate', { username: 'alice\ud800', groups: [] });
unsendable('a 64 KiB username', { username: 'a'.repeat(64 * 1024), groups: [] });
const staticTokens: TokenAuthenticator = {
  authenticate: (token) => Promise.resolve(TOKENS[token] ?? { ok: false, reason: 'unknown static token' }),
};
/** alice may impersonate bob and the group ops (the legacy verb); nothing else. */
const reviewer: Reviewer = {
  tokenReview: () => Promise.resolve({ authenticated: false }),
  allowed: async (q: AccessQuestion) => {
    reviews.running++;
    reviews.most = Math.max(reviews.most, reviews.running);
    try {
      await reviews.gate;
      return (
        q.user === 'alice' &&
        q.verb === 'impersonate' &&
        ((q.resource === 'users' && q.name === 'bob') || (q.resource === 'groups' && q.name === 'ops'))
      );
    } finally {
      reviews.running--;
    }
  },
};
/** The API server's reviews in flight now and at most, and what holds them (a test's gate). */
const reviews = { running: 0, most: 0, gate: Promise.resolve() };

// The API server speaks HTTP/2, as kube-apiserver does.
let upstream: Http2SecureServer;
const upstreamSessions = new Set<ServerHttp2Session>();
function dropUpstreamConnections(): void {
  for (const session of upstreamSessions) session.destroy();
  upstreamSessions.clear();
}
/** hang: never answer; hold: answer 200 and send nothing more, as a watch with no events. */
let upstreamMode: 'ok' | 'hang' | 'hold' = 'ok';
/** The last request body sent to /upload: bytes seen, and whether it ended as a whole body does (END_STREAM). */
let upload: { bytes: number; ended: boolean } | undefined;
/** Upstream requests that closed before their answer was complete. */
let upstreamCancelled = 0;
/**
 * How long a short request may make no progress here. Short enough for the 504 test, long enough that a paused
 * reader (the flow-control test) is not cut on a loaded machine between the stall being seen and the resume.
 */
const SHORT_REQUEST_TIMEOUT_MS = 5_000;

/** Bytes of /large the API server has handed to its connection so far. */
let largeSent = 0;
const LARGE_CHUNK = 4 << 10;
const LARGE_BYTES = 16 << 20;
/** Chunk `index` of /large: a pattern that shows any chunk lost, repeated or moved. */
const largeChunk = (index: number): Buffer =>
  Buffer.alloc(LARGE_CHUNK, `${index.toString(36).padStart(6, '0')}|`);
const seen: IncomingHttpHeaders[] = [];
const SELF_REVIEWS = '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews';
/** What the forwarding identity asked of the API server about itself. */
const selfReviews: Record<string, unknown>[] = [];
/** Verbs the forwarding identity's policy does not allow (`impersonate-on:user-info:create`, say). */
const policyRefuses = new Set<string>();
/** Each request's header fields as sent, repeated fields separate. */
const seenRaw: string[][] = [];
const valuesOf = (raw: string[], name: string): string[] =>
  raw.flatMap((v, i) => (i % 2 === 0 && v.toLowerCase() === name ? [raw[i + 1]!] : []));
let upstreamCA: CertificateAuthority;
let proxyCA: CertificateAuthority;
let server: ProxyServer;
let port: number;
let metrics: ProxyMetrics;
let logText = '';
let switchedOn = true;
let ready = true;
/** What the SSH door publishes now (hub-apis.ts); undefined: it is off. */
let sshDoor: SSHDoor['status'] | undefined;
let handler: ReturnType<typeof newProxyHandler>;
/** The authenticators the proxy asks: a static webhook, and whatever a test loads besides. */
let cache: AuthenticatorCache;

function call(
  path: string,
  headers: Record<string, string> = {},
  send: { method: string; body: string } = { method: 'GET', body: '' },
): Promise<{ status: number; body: string }> {
  return new Promise((done, fail) => {
    const { method } = send;
    const req = request({ host: '127.0.0.1', port, path, method, ca: proxyCA.certPem, headers }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => done({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', fail);
    req.end(send.body || undefined);
  });
}

beforeAll(async () => {
  upstreamCA = await newCA('upstream');
  const upstreamCert = await issueCert(upstreamCA, {
    commonName: 'api',
    hosts: ['127.0.0.1'],
    usage: 'server',
  });
  upstream = createSecureServer({ cert: upstreamCert.certPem, key: upstreamCert.keyPem }, (req, res) => {
    if (req.url === SELF_REVIEWS) {
      // The forwarding identity's policy: everything, but the verbs a test takes away.
      let text = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (text += c));
      req.on('end', () => {
        const review = JSON.parse(text) as { spec: Record<string, { verb?: string } | undefined> };
        const verb = review.spec['resourceAttributes']?.verb ?? review.spec['nonResourceAttributes']?.verb;
        selfReviews.push(review.spec);
        const allowed = !policyRefuses.has(verb ?? '');
        res
          .writeHead(201, { 'content-type': 'application/json' })
          .end(JSON.stringify({ ...review, status: { allowed } }));
      });
      return;
    }
    seen.push(req.headers);
    seenRaw.push(req.rawHeaders);
    res.on('close', () => {
      if (!res.writableEnded) upstreamCancelled++;
    });
    if (req.url === '/echo') {
      // The request body back, as it arrived.
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => res.writeHead(200).end(Buffer.concat(chunks)));
      return;
    }
    if (req.url === '/upload') {
      // Records how the request body arrived: whole (its end), or cut off.
      upload = { bytes: 0, ended: false };
      const current = upload;
      req.on('data', (c: Buffer) => (current.bytes += c.length));
      req.on('end', () => {
        // Node ends a reset stream's body too, but only after it has taken the reset code: a body ended with
        // END_STREAM has none yet.
        current.ended = req.stream.rstCode === undefined;
        if (current.ended) res.writeHead(201).end();
      });
      return;
    }
    if (req.url === '/large') {
      // A large answer in 4 KiB chunks, as the API server writes, sent only as fast as the proxy takes it.
      largeSent = 0;
      res.writeHead(200, { 'content-type': 'application/json' });
      let index = 0;
      const pump = (): void => {
        while (index < LARGE_BYTES / LARGE_CHUNK) {
          const ok = res.write(largeChunk(index++));
          largeSent += LARGE_CHUNK;
          if (!ok) return void res.once('drain', pump);
        }
        res.end();
      };
      pump();
      return;
    }
    if (req.url === '/partial') {
      // Half an answer, then the API server's side of the stream fails.
      res.writeHead(200, { 'content-type': 'application/json' });
      res.write('{"kind":"NamespaceList","items":[');
      setTimeout(() => res.stream.close(constants.NGHTTP2_INTERNAL_ERROR), 50);
      return;
    }
    if (upstreamMode === 'hang') return;
    if (upstreamMode === 'hold') return void res.writeHead(200, { 'content-type': 'application/json' });
    res.writeHead(200, { 'content-type': 'application/json' }).end('{"kind":"NamespaceList","items":[]}');
  });
  upstream.on('session', (session: ServerHttp2Session) => {
    upstreamSessions.add(session);
    session.once('close', () => upstreamSessions.delete(session));
  });
  await new Promise<void>((done) => upstream.listen(0, '127.0.0.1', done));

  proxyCA = await newCA('proxy-ca');
  const serving = await issueCert(proxyCA, {
    commonName: 'proxy-serving',
    hosts: ['127.0.0.1'],
    usage: 'server',
  });
  cache = new AuthenticatorCache();
  cache.set('WebhookAuthenticator', 'static', staticTokens);
  metrics = newProxyMetrics();
  const log = newLogger({
    level: 'info',
    destination: new Writable({
      write(chunk: Buffer, _enc, next) {
        logText += chunk.toString();
        next();
      },
    }),
  });
  const hub = newHubRoute({
    url: new URL(`https://127.0.0.1:${(upstream.address() as AddressInfo).port}`),
    credentials: { caPem: upstreamCA.certPem, token: () => 'forwarding-identity-token' },
    shortRequestTimeoutMs: SHORT_REQUEST_TIMEOUT_MS,
  });
  handler = newProxyHandler({
    groups: apiGroups(),
    authenticator: newRequestAuthenticator(cache, reviewer, () => server.trustedClientCAs()),
    cache,
    reviewer,
    router: newClusterRouter(hub),
    signer: newClientCertSigner(() => undefined),
    metrics,
    log,
    ready: () => ready,
    serving: () => switchedOn,
    bodyTimeoutMs: BODY_TIMEOUT_MS,
    sshDoor: () => sshDoor,
  });
  server = newProxyServer(
    { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [] },
    handler.request,
    handler.upgrade,
  );
  port = await server.listen(0, '127.0.0.1');
});

afterEach(() => {
  seen.length = 0;
  seenRaw.length = 0;
  upstreamMode = 'ok';
});

afterAll(async () => {
  await server.close();
  dropUpstreamConnections();
  await new Promise((done) => upstream.close(done));
});

describe('what reaches the API server', () => {
  it('replaces the caller’s credentials and forwarding headers with the proxy’s impersonation', async () => {
    const answer = await call('/api/v1/namespaces', {
      authorization: 'Bearer alice-token',
      'x-forwarded-for': '6.6.6.6',
      'x-forwarded-proto': 'http',
      'x-remote-user': 'system:admin',
      'x-remote-group': 'system:masters',
      forwarded: 'for=6.6.6.6',
      'proxy-authorization': 'Basic eDp5',
      accept: 'application/json',
    });
    expect(answer.status).toBe(200);
    expect(seen).toHaveLength(1);
    const headers = seen[0]!;
    expect(headers['authorization']).toBe('Bearer forwarding-identity-token');
    expect(headers['impersonate-user']).toBe('alice');
    // Separate header fields, one group each: a joined value would be one group with a comma in its name.
    expect(valuesOf(seenRaw[0]!, 'impersonate-group')).toEqual(['dev', 'system:authenticated']);
    expect(headers['impersonate-extra-example.com%2fscopes']).toBe('read');
    expect(headers['accept']).toBe('application/json');
    for (const name of [
      'x-forwarded-for',
      'x-forwarded-proto',
      'x-remote-user',
      'x-remote-group',
      'forwarded',
      'proxy-authorization',
    ]) {
      expect(headers[name]).toBeUndefined();
    }
    expect(JSON.stringify(headers)).not.toContain('alice-token');
  });

  it('sends on no field that belongs to the caller’s connection, nor any its Connection field names', async () => {
    const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token', ...HOP_FIELDS });
    expect(answer.status).toBe(200);
    const sent = Object.keys(seen.at(-1)!).filter((name) => !name.startsWith(':'));
    expect(sent.filter((name) => name in HOP_FIELDS)).toEqual([]);
  });

  it('forwards a plain request that names a protocol to upgrade to without asking for the upgrade', async () => {
    // Without `Connection: upgrade` this is an ordinary request; its Upgrade header has no meaning on HTTP/2.
    const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token', upgrade: 'h2c' });
    expect(answer.status).toBe(200);
    expect(seen.at(-1)!['upgrade']).toBeUndefined();
  });

  it('drops impersonation headers the caller may not send, refusing the request', async () => {
    const answer = await call('/api/v1/namespaces', {
      authorization: 'Bearer alice-token',
      'impersonate-user': 'root',
    });
    expect(answer.status).toBe(403);
    expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 403, reason: 'Forbidden' });
    // As the API server answers: the first mode that applies (user-info) refuses first, on the request itself.
    expect((JSON.parse(answer.body) as { message: string }).message).toBe(
      'namespaces is forbidden: User "alice" cannot impersonate-on:user-info:list resource "namespaces" in API group "" at the cluster scope',
    );
    expect(seen).toHaveLength(0);
  });

  it('refuses what the forwarding policy does not allow, saying so, and asks once for many requests', async () => {
    policyRefuses.add('impersonate-on:user-info:create').add('impersonate');
    try {
      const created = await call(
        '/api/v1/namespaces/team/configmaps',
        { authorization: 'Bearer alice-token' },
        { method: 'POST', body: '{}' },
      );
      expect(created.status).toBe(403);
      expect(JSON.parse(created.body)).toMatchObject({
        kind: 'Status',
        reason: 'Forbidden',
        message: expect.stringContaining(
          "this cluster's policy for Sealion refuses this request: Sealion may not create configmaps there for users",
        ) as unknown,
      });
      expect(seen.filter((h) => h[':method'] === 'POST')).toHaveLength(0);
    } finally {
      policyRefuses.clear();
    }
    const before = selfReviews.length;
    for (let i = 0; i < 5; i++)
      expect(
        (await call('/api/v1/namespaces/other/configmaps', { authorization: 'Bearer alice-token' })).status,
      ).toBe(200);
    expect(selfReviews.length - before).toBeLessThanOrEqual(1);
  });

  it('asks the API server a bounded number of reviews at once for one user, however many requests they send', async () => {
    let open = (): void => {};
    reviews.gate = new Promise((done) => (open = done));
    reviews.most = 0;
    try {
      const answers = Array.from({ length: 40 }, (_, i) =>
        call('/api/v1/namespaces', { authorization: 'Bearer alice-token', 'impersonate-user': `many-${i}` }),
      );
      await eventually(() => expect(reviews.running).toBe(HUB_REVIEW_LIMITS.perKey));
      open();
      expect((await Promise.all(answers)).map((a) => a.status)).toEqual(Array(40).fill(403));
      expect(reviews.most).toBe(HUB_REVIEW_LIMITS.perKey);
    } finally {
      open();
      reviews.gate = Promise.resolve();
    }
  });

  it('forwards allowed nested impersonation with the original user as an extra', async () => {
    const answer = await call('/api/v1/namespaces', {
      authorization: 'Bearer alice-token',
      'impersonate-user': 'bob',
      'impersonate-group': 'ops',
    });
    expect(answer.status).toBe(200);
    const headers = seen[0]!;
    expect(headers['impersonate-user']).toBe('bob');
    expect(valuesOf(seenRaw[0]!, 'impersonate-group')).toEqual(['ops', 'system:authenticated']);
    const original =
      headers['impersonate-extra-impersonation-proxy.concierge.sealion.dev%2foriginal-user-info'];
    expect(JSON.parse(original as string)).toEqual({
      username: 'alice',
      groups: ['dev'],
      extra: { 'example.com/scopes': ['read'] },
    });
    expect(headers['authorization']).toBe('Bearer forwarding-identity-token');
  });

  it('answers 503 and forwards nothing while switched off, but keeps answering health checks', async () => {
    switchedOn = false;
    try {
      const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token' });
      expect(answer.status).toBe(503);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 503 });
      expect((await call('/healthz')).status).toBe(200);
      expect((await call('/readyz')).status).toBe(200);
      expect(seen).toHaveLength(0);
    } finally {
      switchedOn = true;
    }
  });

  it('sends names as UTF-8 bytes, so no character turns into another on the way', async () => {
    const answer = await call('/api/v1/namespaces', { authorization: 'Bearer unicode-token' });
    expect(answer.status).toBe(200);
    // Node hands header values over one byte per character; the API server reads the bytes as UTF-8.
    const utf8 = (value: string): string => Buffer.from(value, 'latin1').toString('utf8');
    expect(valuesOf(seenRaw[0]!, 'impersonate-user').map(utf8)).toEqual(['José 東京']);
    expect(valuesOf(seenRaw[0]!, 'impersonate-group').map(utf8)).toEqual([
      '\u0173ystem:masters',
      'system:authenticated',
    ]);
    expect(valuesOf(seenRaw[0]!, 'impersonate-extra-team').map(utf8)).toEqual(['café']);
  });

  it.each(UNSENDABLE)('refuses an identity with %s with the one 401, forwarding nothing', async (what) => {
    const answer = await call('/api/v1/namespaces', {
      authorization: `Bearer unsendable-${what.replace(/ /g, '-')}`,
    });
    expect(answer.status).toBe(401);
    expect(JSON.parse(answer.body)).toMatchObject({ code: 401, message: UNAUTHORIZED });
    expect(seen).toHaveLength(0);
  });

  it('answers 400 to impersonation headers it cannot read, forwarding nothing', async () => {
    const malformed: Record<string, string>[] = [
      // Bytes that are not UTF-8.
      { 'impersonate-user': '\u00ff\u00fe' },
      // Groups without a user, as the API server refuses them.
      { 'impersonate-group': 'ops' },
    ];
    for (const headers of malformed) {
      const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token', ...headers });
      expect(answer.status).toBe(400);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 400 });
    }
    expect(seen).toHaveLength(0);
  });

  it('refuses an empty segment in a resource path, which the API server would read as a list of a subresource', async () => {
    // `pods//exec?fieldSelector=metadata.name=x` is a list of pods/exec to the API server, served as an exec into x.
    const answer = await call(
      '/api/v1/namespaces/team/pods//exec?fieldSelector=metadata.name%3Dx&command=sh',
      {
        authorization: 'Bearer alice-token',
      },
    );
    expect(answer.status).toBe(400);
    expect(seen).toHaveLength(0);
  });

  it('decides odd extra keys as the API server does: kept as sent, then asked about', async () => {
    const odd: Record<string, string>[] = [
      { 'impersonate-user': 'bob', 'impersonate-extra-%zz': 'x' },
      { 'impersonate-user': 'bob', 'impersonate-extra-': 'x' },
    ];
    for (const headers of odd) {
      const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token', ...headers });
      expect(answer.status).toBe(403);
    }
    expect(seen).toHaveLength(0);
  });

  it('forwards nothing for an unauthenticated caller', async () => {
    const answer = await call('/api/v1/namespaces', {
      authorization: 'Bearer nobody',
      'impersonate-user': 'bob',
    });
    expect(answer.status).toBe(401);
    expect(seen).toHaveLength(0);
  });
});

describe('reach connections as HTTP/2 extended CONNECT streams', () => {
  const REACH_PATH =
    '/apis/reach.concierge.sealion.dev/v1alpha1/namespaces/default/services/web/connect?port=80';

  /** One extended CONNECT on `session`: its status and the message of the Status it was answered with. */
  function connectStream(
    session: ClientHttp2Session,
    path: string,
    token?: string,
  ): Promise<{ status: number; message: string }> {
    return new Promise((done, fail) => {
      const stream = session.request(
        {
          ':method': 'CONNECT',
          ':protocol': 'tcp',
          ':scheme': 'https',
          ':path': path,
          ':authority': 'proxy',
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        { endStream: false },
      );
      let status = 0;
      let text = '';
      stream.once('response', (h) => (status = Number(h[':status'])));
      stream.on('data', (c: Buffer) => (text += c.toString()));
      stream.once('end', () => done({ status, message: (JSON.parse(text) as { message: string }).message }));
      stream.once('error', fail);
    });
  }

  it('runs each stream through the pipeline as a reach request: authenticated, malformed ones refused, each answered in HTTP/2', async () => {
    const session = http2Connect(`https://127.0.0.1:${port}`, { ca: proxyCA.certPem });
    try {
      const [anonymous, notReach, decided] = await Promise.all([
        connectStream(session, REACH_PATH),
        connectStream(session, '/api/v1/namespaces/default/pods/p/exec?command=sh', 'alice-token'),
        connectStream(session, REACH_PATH, 'alice-token'),
      ]);
      expect(anonymous).toEqual({ status: 401, message: UNAUTHORIZED });
      expect(notReach.status).toBe(400);
      expect(notReach.message).toMatch(/extended CONNECT carries only reach connections/);
      // Authenticated and decided, then the route's answer: this hub route dials no reach connections.
      expect(decided).toEqual({ status: 503, message: 'this concierge does not dial reach connections' });
      expect(seen).toHaveLength(0);
    } finally {
      // Closed gracefully and waited for: the tests after this one count the listener's connections.
      await new Promise<void>((done) => session.close(() => done()));
    }
  });

  it("widens a session's stream windows to the budget's once a reach connection was authenticated on it, never a stranger's", async () => {
    const stranger = http2Connect(`https://127.0.0.1:${port}`, { ca: proxyCA.certPem });
    const user = http2Connect(`https://127.0.0.1:${port}`, { ca: proxyCA.certPem });
    try {
      await Promise.all([
        connectStream(stranger, REACH_PATH),
        connectStream(user, REACH_PATH, 'alice-token'),
      ]);
      // The SETTINGS frame goes before the stream's answer: each client has it once its answer is in.
      expect(stranger.remoteSettings.initialWindowSize).toBe(65535);
      expect(user.remoteSettings.initialWindowSize).toBe(STREAM_WINDOW_BYTES);
      // And the connection's window (a WINDOW_UPDATE, sent with the SETTINGS): 32 MiB, less what the client has sent.
      expect(user.state.remoteWindowSize).toBeGreaterThan(16 << 20);
      expect(stranger.state.remoteWindowSize).toBeLessThanOrEqual(65535);
    } finally {
      await Promise.all([stranger, user].map((s) => new Promise<void>((done) => s.close(() => done()))));
    }
  });
});

describe('HTTP/2 clients, as kubectl connects', () => {
  let session: ClientHttp2Session;
  beforeAll(() => {
    session = http2Connect(`https://127.0.0.1:${port}`, { ca: proxyCA.certPem });
  });
  afterAll(() => session.close());

  /** One request on the shared connection: status, the response headers and the body. */
  function call2(
    headers: OutgoingHttpHeaders,
    body?: string,
  ): Promise<{ status: number; headers: IncomingHttpHeaders; body: string; continued: boolean }> {
    return new Promise((done, fail) => {
      const stream = session.request(headers, { endStream: body === undefined });
      let continued = false;
      let answer: IncomingHttpHeaders = {};
      let text = '';
      stream.on('continue', () => {
        continued = true;
        stream.end(body);
      });
      stream.on('response', (h) => (answer = h));
      stream.setEncoding('utf8');
      stream.on('data', (c: string) => (text += c));
      stream.on('end', () =>
        done({ status: Number(answer[':status']), headers: answer, body: text, continued }),
      );
      stream.on('error', fail);
      if (body !== undefined && headers['expect'] === undefined) stream.end(body);
    });
  }

  it('forwards with the proxy’s impersonation, the group fields kept apart', async () => {
    const answer = await call2({
      ':path': '/api/v1/namespaces',
      authorization: 'Bearer alice-token',
      'impersonate-user': 'bob',
      'impersonate-group': 'ops',
    });
    expect(answer.status).toBe(200);
    expect(answer.body).toContain('NamespaceList');
    const raw = seenRaw.at(-1)!;
    expect(valuesOf(raw, 'impersonate-user')).toEqual(['bob']);
    expect(valuesOf(raw, 'impersonate-group')).toEqual(['ops', 'system:authenticated']);
    expect(valuesOf(raw, 'authorization')).toEqual(['Bearer forwarding-identity-token']);
  });

  it('streams a request body to the API server and its answer back', async () => {
    const body = JSON.stringify({ kind: 'ConfigMap', data: { k: 'v'.repeat(100_000) } });
    const answer = await call2(
      { ':method': 'POST', ':path': '/echo', authorization: 'Bearer alice-token' },
      body,
    );
    expect(answer.status).toBe(200);
    expect(answer.body).toBe(body);
  });

  it('answers 100 Continue to a client that waits for it before its body', async () => {
    const answer = await call2(
      { ':method': 'POST', ':path': '/echo', authorization: 'Bearer alice-token', expect: '100-continue' },
      'payload',
    );
    expect(answer.continued).toBe(true);
    expect(answer.body).toBe('payload');
  });

  it('reads a request of 500 fields, as its HTTP/1.1 listener and the API server do (Node’s default stops at 128)', async () => {
    const fields = Object.fromEntries(Array.from({ length: 500 }, (_, i) => [`x-field-${i}`, 'v']));
    const answer = await call2(
      {
        ':method': 'POST',
        ':path': `/apis/${apiGroups().identity}/v1alpha1/whoamirequests`,
        authorization: 'Bearer alice-token',
        'content-type': 'application/json',
        ...fields,
      },
      JSON.stringify({ kind: 'WhoAmIRequest', apiVersion: `${apiGroups().identity}/v1alpha1` }),
    );
    expect(answer.status).toBe(201);
    expect(JSON.parse(answer.body)).toMatchObject({
      status: { kubernetesUserInfo: { user: { username: 'alice' } } },
    });
  });

  it('answers HEAD with headers only', async () => {
    const answer = await call2({
      ':method': 'HEAD',
      ':path': '/api/v1/namespaces',
      authorization: 'Bearer alice-token',
    });
    expect(answer.status).toBe(200);
    expect(answer.headers['content-type']).toBe('application/json');
    expect(answer.body).toBe('');
  });

  it('answers 401 with a Status, and 400 for a path the API server could not route', async () => {
    const unauthorized = await call2({ ':path': '/api/v1/namespaces', authorization: 'Bearer wrong' });
    expect(unauthorized.status).toBe(401);
    expect(JSON.parse(unauthorized.body)).toMatchObject({
      kind: 'Status',
      code: 401,
      message: 'Unauthorized',
    });
    const malformed = await call2({ ':path': '/api/%zz', authorization: 'Bearer alice-token' });
    expect(malformed.status).toBe(400);
    expect(JSON.parse(malformed.body)).toMatchObject({ kind: 'Status', code: 400 });
  });

  it('resets the client’s stream when the API server’s answer breaks off, so a short body is never taken as whole', async () => {
    const stream = session.request({ ':path': '/partial', authorization: 'Bearer alice-token' });
    let status = 0;
    stream.on('response', (h) => (status = Number(h[':status'])));
    stream.resume();
    let failed = false;
    stream.on('error', () => (failed = true));
    await new Promise((done) => stream.once('close', done));
    expect(status).toBe(200);
    // A response that ended whole closes with NO_ERROR and no error event.
    expect(stream.rstCode).toBe(constants.NGHTTP2_INTERNAL_ERROR);
    expect(failed).toBe(true);
  });

  it('holds the API server back while the client does not read, then passes every byte in order', async () => {
    const stream = session.request({ ':path': '/large', authorization: 'Bearer alice-token' });
    stream.pause();
    await eventually(() => expect(largeSent).toBeGreaterThan(0));
    // Nothing reads: once the flow-control windows and buffers between here and the API server are full, the API
    // server's writes stop, far short of the whole answer.
    let before = -1;
    await eventually(() => {
      const now = largeSent;
      const still = now === before;
      before = now;
      expect(still).toBe(true);
    });
    expect(largeSent).toBeLessThan(LARGE_BYTES / 4);
    const received: Buffer[] = [];
    stream.on('data', (c: Buffer) => received.push(c));
    stream.resume();
    await new Promise((done, fail) => stream.once('end', done).once('error', fail));
    const body = Buffer.concat(received);
    expect(body.length).toBe(LARGE_BYTES);
    for (let i = 0; i < LARGE_BYTES / LARGE_CHUNK; i++) {
      const chunk = body.subarray(i * LARGE_CHUNK, (i + 1) * LARGE_CHUNK);
      if (!chunk.equals(largeChunk(i))) throw new Error(`chunk ${i} of the answer arrived wrong`);
    }
  }, 30_000);

  it('never completes a request body the client gave up on halfway', async () => {
    upload = undefined;
    const cancelledBefore = upstreamCancelled;
    const stream = session.request({
      ':method': 'POST',
      ':path': '/upload',
      authorization: 'Bearer alice-token',
    });
    stream.on('error', () => {});
    stream.write('{"kind":"ConfigMap","data":{"k":"');
    await eventually(() => expect(upload?.bytes).toBeGreaterThan(0));
    // A reset with no END_STREAM before it, as Go clients cancel (Node's close(code) would end the body first).
    stream.destroy(new Error('the client gives up'));
    // Either way the API server's request ends: cancelled, or (wrongly) with its body complete.
    await eventually(() => expect(upstreamCancelled > cancelledBefore || upload!.ended).toBe(true));
    // The API server must not have been handed the first half as if it were the whole body.
    expect(upload!.ended).toBe(false);
  });

  it('carries 300 watches on one connection, and replaces cancelled ones at once', async () => {
    upstreamMode = 'hold';
    const cancelledBefore = upstreamCancelled;
    const watch = (): Promise<{ status: number; stream: ClientHttp2Stream }> =>
      new Promise((done, fail) => {
        const stream = session.request({
          ':path': '/api/v1/namespaces?watch=true',
          authorization: 'Bearer alice-token',
        });
        stream.once('response', (h) => done({ status: Number(h[':status']), stream }));
        stream.once('error', fail);
      });
    // More than Go's default of 250 streams per connection, as an informer-heavy client holds.
    const watches = await Promise.all(Array.from({ length: 300 }, watch));
    expect(watches.every((w) => w.status === 200)).toBe(true);
    // Cancelled and replaced in one go, as client-go replaces a watch that expired.
    for (const w of watches.slice(0, 50)) w.stream.close(constants.NGHTTP2_CANCEL);
    const replacements = await Promise.all(Array.from({ length: 50 }, watch));
    expect(replacements.every((w) => w.status === 200)).toBe(true);
    for (const w of [...watches, ...replacements]) w.stream.close(constants.NGHTTP2_CANCEL);
    // Every watch's API server request ends with it.
    await eventually(() => expect(upstreamCancelled).toBe(cancelledBefore + 350));
  });

  it('cancels the API server request when the client resets its stream, and keeps serving', async () => {
    upstreamMode = 'hang';
    const cancelledBefore = upstreamCancelled;
    const seenBefore = seen.length;
    const stream = session.request({ ':path': '/api/v1/namespaces', authorization: 'Bearer alice-token' });
    stream.on('error', () => {});
    await eventually(() => expect(seen.length).toBe(seenBefore + 1));
    stream.close(constants.NGHTTP2_CANCEL);
    await eventually(() => expect(upstreamCancelled).toBe(cancelledBefore + 1));
    upstreamMode = 'ok';
    expect((await call2({ ':path': '/api/v1/namespaces', authorization: 'Bearer alice-token' })).status).toBe(
      200,
    );
  });
});

describe('failures and observability', () => {
  it('answers 504 with a Status when the API server does not answer a short request in time', async () => {
    upstreamMode = 'hang';
    const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token' });
    expect(answer.status).toBe(504);
    expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 504 });
  });

  it('does not time out a watch', async () => {
    upstreamMode = 'hang';
    const pending = call('/api/v1/namespaces?watch=true', { authorization: 'Bearer alice-token' });
    const outcome = await Promise.race([
      pending.then(() => 'answered'),
      new Promise((r) => setTimeout(() => r('still open'), 2 * SHORT_REQUEST_TIMEOUT_MS)),
    ]);
    expect(outcome).toBe('still open');
    dropUpstreamConnections();
    await pending.catch(() => undefined);
    // The API server went away before answering: a 502, logged once the response is closed.
    await eventually(() => expect(logText).toMatch(/"verb":"watch".*"code":502|"code":502.*"verb":"watch"/));
  });

  it('logs one line per request with its id, user, decision, route, verb, path, code, bytes and duration, and never a token', async () => {
    logText = '';
    await call('/api/v1/namespaces/default/pods?labelSelector=a', { authorization: 'Bearer alice-token' });
    await call('/api/v1/namespaces', { authorization: 'Bearer not-a-valid-token-secret' });
    const lines = logText
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>);
    const requests = lines.filter((l) => l['msg'] === 'request');
    expect(requests).toHaveLength(2);
    expect(requests[0]).toMatchObject({
      user: 'alice',
      verb: 'get',
      path: '/api/v1/namespaces/default/pods',
      code: 200,
      route: 'local',
      decision: 'user-info',
    });
    expect(typeof requests[0]!['ms']).toBe('number');
    expect(requests[0]!['bytes']).toBeGreaterThan(0);
    expect(requests[1]).toMatchObject({ user: 'anonymous', code: 401 });
    expect(requests[1]).not.toHaveProperty('route');
    expect(requests[0]!['id']).toMatch(/^[0-9a-f-]{36}$/);
    expect(requests[1]!['id']).not.toBe(requests[0]!['id']);
    expect(logText).not.toContain('alice-token');
    expect(logText).not.toContain('not-a-valid-token-secret');
    expect(logText).not.toContain('forwarding-identity-token');
  });

  it('logs no line for a health check answered 200, which the kubelet asks every 2 s, but one for a 503', async () => {
    logText = '';
    const before = await metrics.registry.getSingleMetricAsString('sealion_proxy_requests_total');
    const count = (text: string): number =>
      Number(/sealion_proxy_requests_total\{verb="get",code="200"\} (\d+)/.exec(text)?.[1] ?? 0);
    for (const path of ['/healthz', '/livez', '/readyz']) expect((await call(path)).status).toBe(200);
    ready = false;
    try {
      expect((await call('/readyz')).status).toBe(503);
    } finally {
      ready = true;
    }
    await eventually(() => expect(logText).toContain('"code":503'));
    const requests = logText
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, unknown>)
      .filter((l) => l['msg'] === 'request');
    expect(requests).toEqual([expect.objectContaining({ path: '/readyz', code: 503, user: 'anonymous' })]);
    // Counted all the same.
    const after = await metrics.registry.getSingleMetricAsString('sealion_proxy_requests_total');
    expect(count(after) - count(before)).toBe(3);
  });

  it('counts requests, latency and upstream errors', async () => {
    const text = await metrics.registry.metrics();
    expect(text).toMatch(/sealion_proxy_requests_total\{verb="get",code="200"\} \d+/);
    expect(text).toMatch(/sealion_proxy_upstream_errors_total\{code="504"\} 1/);
    expect(text).toMatch(/sealion_proxy_request_duration_seconds_count\{verb="get"\} \d+/);
    expect(text).toContain('sealion_proxy_inflight_requests');
  });

  it('answers 502 with a Status when the API server is gone', async () => {
    const upstreamPort = (upstream.address() as AddressInfo).port;
    // The forwarding policy's review is asked of the API server and its answer kept 10 s: asked now, while the API
    // server is there, so that the request below reaches the forwarder however long the tests before it took.
    expect((await call('/api/v1/namespaces', { authorization: 'Bearer alice-token' })).status).toBe(200);
    dropUpstreamConnections();
    await new Promise((done) => upstream.close(done));
    try {
      const answer = await call('/api/v1/namespaces', { authorization: 'Bearer alice-token' });
      expect(answer.status).toBe(502);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 502, reason: 'BadGateway' });
    } finally {
      // Back where the forwarder looks for it, for the tests after this one, whatever this one found.
      await new Promise<void>((done) => upstream.listen(upstreamPort, '127.0.0.1', done));
    }
  });
});

describe('the SSH door, as signed-in users read it', () => {
  const path = `/apis/${apiGroups().identity}/v1alpha1/sshdoor`;
  const published: SSHDoor['status'] = {
    endpoint: '10.0.0.7:2222',
    hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: 'ssh-ed25519 AAAA', fingerprint: 'SHA256:x' }],
    hubName: 'hub',
    deviceLogin: true,
  };
  afterEach(() => (sshDoor = undefined));

  it('tells anyone signed in where it listens and its host key, at any cluster’s URL, and strangers nothing', async () => {
    sshDoor = published;
    for (const at of [path, `/clusters/edge${path}`]) {
      const answer = await call(at, { authorization: 'Bearer alice-token' });
      expect(answer.status).toBe(200);
      expect(JSON.parse(answer.body)).toEqual({
        apiVersion: `${apiGroups().identity}/v1alpha1`,
        kind: 'SSHDoor',
        metadata: { name: 'sshdoor' },
        status: published,
      });
    }
    expect((await call(path)).status).toBe(401);
    // Answered by the proxy itself: nothing about the door reached the API server.
    expect(seen.filter((h) => String(h[':path'] ?? '').includes('sshdoor'))).toEqual([]);
  });

  it('says what to do while the door is off', async () => {
    const answer = await call(path, { authorization: 'Bearer alice-token' });
    expect(answer.status).toBe(404);
    expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 404, message: SSH_DOOR_OFF });
  });
});

describe('TLS material', () => {
  /** WhoAmIRequest on an open HTTP/2 connection: answered by the proxy itself, with the user it authenticated. */
  const whoAmIOn = (session: ClientHttp2Session): Promise<{ status: number; body: string }> =>
    new Promise((done, fail) => {
      const stream = session.request(
        {
          ':method': 'POST',
          ':path': `/apis/${apiGroups().identity}/v1alpha1/whoamirequests`,
          'content-type': 'application/json',
        },
        { endStream: false },
      );
      stream.end(JSON.stringify({ kind: 'WhoAmIRequest', apiVersion: `${apiGroups().identity}/v1alpha1` }));
      let status = 0;
      let body = '';
      stream.on('response', (h) => (status = Number(h[':status'])));
      stream.setEncoding('utf8');
      stream.on('data', (c: string) => (body += c));
      stream.on('end', () => done({ status, body }));
      stream.on('error', fail);
    });

  /**
   * Serves with a new certificate, trusting `clientCAPems` for client certificates, and opens an HTTP/2 connection
   * that presents `credential`. Returns the connection and the serving TLS material (for later updateTLS calls).
   */
  async function connectWithCertificate(
    clientCAPems: string[],
    credential: { certPem: string; keyPem: string },
  ): Promise<{ session: ClientHttp2Session; tls: { certPem: string; keyPem: string } }> {
    const servingCA = await newCA('proxy-ca-client-auth');
    const serving = await issueCert(servingCA, {
      commonName: 'proxy-serving',
      hosts: ['127.0.0.1'],
      usage: 'server',
    });
    const tls = { certPem: serving.certPem, keyPem: serving.keyPem };
    server.updateTLS({ ...tls, clientCAPems });
    const session = http2Connect(`https://127.0.0.1:${port}`, {
      ca: servingCA.certPem,
      cert: credential.certPem,
      key: credential.keyPem,
    });
    return { session, tls };
  }

  it('stops taking a client certificate once it expires, though the connection made with it stays open', async () => {
    const clientCA = await newCA('client-signer');
    // A short-lived credential, as TokenCredentialRequest hands out (for 5 minutes there).
    const credential = await issueCert(clientCA, {
      commonName: 'carol',
      organizations: ['devs'],
      usage: 'client',
      // Long enough for a connection and a first answer on two busy cores; the test waits the rest out.
      validityMs: 8_000,
    });
    const { session } = await connectWithCertificate([clientCA.certPem], credential);
    const whoAmI = (): Promise<{ status: number; body: string }> => whoAmIOn(session);
    try {
      const valid = await whoAmI();
      expect(valid.status).toBe(201);
      expect(JSON.parse(valid.body)).toMatchObject({
        status: {
          kubernetesUserInfo: { user: { username: 'carol', groups: ['devs', 'system:authenticated'] } },
        },
      });
      // The same connection, once the certificate is past its end: the uniform 401, the reason only in the log.
      const refused = await eventually(async () => {
        const answer = await whoAmI();
        expect(answer.status).toBe(401);
        return answer;
      }, 20_000);
      expect(JSON.parse(refused.body)).toMatchObject({ kind: 'Status', code: 401, message: UNAUTHORIZED });
      expect(logText).toContain(CERTIFICATE_EXPIRED);
    } finally {
      session.destroy();
    }
  }, 40_000);

  it('stops taking a client certificate once its signer CA is no longer trusted, on a connection made before', async () => {
    const oldSigner = await newCA('signer-being-replaced');
    const newSigner = await newCA('signer-replacing-it');
    const credential = await issueCert(oldSigner, { commonName: 'dave', usage: 'client' });
    const { session, tls } = await connectWithCertificate([oldSigner.certPem], credential);
    try {
      expect((await whoAmIOn(session)).status).toBe(201);
      // Both signers trusted, as during a rotation: still dave.
      server.updateTLS({ ...tls, clientCAPems: [newSigner.certPem, oldSigner.certPem] });
      expect((await whoAmIOn(session)).status).toBe(201);
      // The old signer taken out: the same connection gets the uniform 401, the reason only in the log.
      server.updateTLS({ ...tls, clientCAPems: [newSigner.certPem] });
      const refused = await whoAmIOn(session);
      expect(refused.status).toBe(401);
      expect(JSON.parse(refused.body)).toMatchObject({ kind: 'Status', code: 401, message: UNAUTHORIZED });
      expect(logText).toContain(CERTIFICATE_UNTRUSTED);
    } finally {
      session.destroy();
    }
  });

  it('takes a TokenCredentialRequest certificate while its authenticator trusts what it did, and stops once it trusts otherwise', async () => {
    const signer = await newCA('tcr-signer');
    const before = 'a'.repeat(43);
    const load = (trust: string): void =>
      cache.set('JWTAuthenticator', 'bound', staticTokens, {
        issuer: 'https://bound.example.com',
        binding: { uid: 'uid-bound', trust },
      });
    load(before);
    const issued = (await newClientCertSigner(() => signer).issue(
      { username: 'erin', groups: ['devs'], extra: {} },
      { lifetimeMs: 60_000, binding: { uid: 'uid-bound', trust: before } },
    ))!;
    const { session } = await connectWithCertificate([signer.certPem], {
      certPem: issued.certPem,
      keyPem: issued.keyPem,
    });
    try {
      expect((await whoAmIOn(session)).status).toBe(201);
      // Loaded again trusting the same (its certificates' lifetime edited, say): still erin.
      load(before);
      expect((await whoAmIOn(session)).status).toBe(201);
      // Edited to trust otherwise: the same connection gets the uniform 401, the reason only in the log.
      load('b'.repeat(43));
      const refused = await whoAmIOn(session);
      expect(refused.status).toBe(401);
      expect(JSON.parse(refused.body)).toMatchObject({ kind: 'Status', code: 401, message: UNAUTHORIZED });
      expect(logText).toContain(CERTIFICATE_UNBOUND);
    } finally {
      session.destroy();
      cache.delete('JWTAuthenticator', 'bound');
    }
  });

  it('refuses a certificate bound the way certificates were before bindings named the trust, its authenticator loaded', async () => {
    const signer = await newCA('tcr-signer');
    cache.set('JWTAuthenticator', 'bound', staticTokens, {
      issuer: 'https://bound.example.com',
      binding: { uid: 'uid-bound', trust: 'a'.repeat(43) },
    });
    const credential = await issueCert(signer, {
      commonName: 'frank',
      usage: 'client',
      uris: [`${AUTHENTICATOR_URI_PREFIX}uid-bound`],
    });
    const { session } = await connectWithCertificate([signer.certPem], credential);
    try {
      expect((await whoAmIOn(session)).status).toBe(401);
    } finally {
      session.destroy();
      cache.delete('JWTAuthenticator', 'bound');
    }
  });

  it('swaps the serving certificate without a restart', async () => {
    const fingerprintSeen = (): Promise<string> =>
      new Promise((done, fail) => {
        const socket = tlsConnect(
          { host: '127.0.0.1', port, servername: 'localhost', rejectUnauthorized: false },
          () => {
            done(socket.getPeerCertificate().fingerprint256);
            socket.end();
          },
        );
        socket.on('error', fail);
      });
    const before = await fingerprintSeen();
    const nextCA = await newCA('proxy-ca-2');
    const next = await issueCert(nextCA, {
      commonName: 'proxy-serving-2',
      hosts: ['127.0.0.1'],
      usage: 'server',
    });
    server.updateTLS({ certPem: next.certPem, keyPem: next.keyPem, clientCAPems: [] });
    const after = await fingerprintSeen();
    expect(after).not.toBe(before);
    expect(after).toBe(new X509Certificate(next.certPem).fingerprint256);
  });
});

describe('what a stranger can hold', () => {
  /** The same proxy behind a listener with short deadlines and a small connection cap. */
  let limited: ProxyServer;
  let limitedPort: number;
  beforeAll(async () => {
    const serving = await issueCert(proxyCA, {
      commonName: 'limited',
      hosts: ['127.0.0.1'],
      usage: 'server',
    });
    limited = newProxyServer(
      { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [] },
      handler.request,
      handler.upgrade,
      undefined,
      LIMITS,
    );
    limitedPort = await limited.listen(0, '127.0.0.1');
  });
  afterAll(() => limited.close());

  /** A TLS connection speaking HTTP/1.1; resolves with everything the proxy sent once it closes the connection. */
  function http1Connection(send: (socket: TLSSocket) => void): Promise<string> {
    return new Promise((done, fail) => {
      const socket = tlsConnect({
        host: '127.0.0.1',
        port: limitedPort,
        ca: proxyCA.certPem,
        ALPNProtocols: ['http/1.1'],
      });
      let received = '';
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => (received += chunk));
      socket.once('secureConnect', () => send(socket));
      socket.once('close', () => done(received));
      socket.once('error', fail);
    });
  }

  const h2 = (): ClientHttp2Session => {
    const session = http2Connect(`https://127.0.0.1:${limitedPort}`, { ca: proxyCA.certPem });
    session.on('error', () => {});
    return session;
  };
  const closed = (session: ClientHttp2Session): Promise<void> =>
    new Promise((done) => (session.closed ? done() : session.once('close', () => done())));

  it('cuts off a client that never finishes its request headers, with 408', async () => {
    const received = await http1Connection((socket) =>
      socket.write('GET /api HTTP/1.1\r\nHost: x\r\nX-Slow: '),
    );
    expect(received).toMatch(/^HTTP\/1\.1 408 /);
  });

  it('cuts off a client that never finishes its TLS handshake', async () => {
    const socket = netConnect(limitedPort, '127.0.0.1');
    await new Promise<void>((done) => socket.once('close', () => done()));
    expect(socket.destroyed).toBe(true);
  });

  it('closes an HTTP/2 session that opens no stream', async () => {
    const session = h2();
    await closed(session);
    expect(session.closed).toBe(true);
  });

  it('keeps an HTTP/2 session open while a quiet watch runs on it, and closes it once the watch ends', async () => {
    upstreamMode = 'hold';
    const session = h2();
    const watch = session.request({ ':path': '/api/v1/pods?watch=1', authorization: 'Bearer alice-token' });
    await new Promise((done) => watch.once('response', done));
    // Several idle timeouts pass with no frame on the connection: the watch holds it.
    await new Promise((done) => setTimeout(done, LIMITS.idleTimeoutMs * 4));
    expect(session.closed).toBe(false);
    watch.close();
    await closed(session);
  });

  it('drops connections over the cap, and takes new ones once others close', async () => {
    const sessions = Array.from({ length: LIMITS.maxConnections }, () => {
      const s = h2();
      // A stream keeps each session busy so the idle timeout does not close it during the test.
      upstreamMode = 'hold';
      s.request({ ':path': '/api/v1/pods?watch=1', authorization: 'Bearer alice-token' }).on(
        'error',
        () => {},
      );
      return s;
    });
    await Promise.all(sessions.map((s) => new Promise((done) => s.once('connect', done))));
    const extra = h2();
    const refused = await new Promise<boolean>((done) => {
      extra.once('connect', () => done(false));
      extra.once('close', () => done(true));
    });
    expect(refused).toBe(true);
    for (const s of sessions) s.destroy();
    await eventually(async () => {
      const again = h2();
      const ok = await new Promise<boolean>((done) => {
        again.once('connect', () => done(true));
        again.once('close', () => done(false));
      });
      again.destroy();
      expect(ok).toBe(true);
    });
  });

  describe('TokenCredentialRequest, which anybody may call', () => {
    const TCR_PATH = '/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests';
    const post = (session: ClientHttp2Session): ClientHttp2Stream =>
      session.request({ ':method': 'POST', ':path': TCR_PATH, 'content-type': 'application/json' });
    const answer = (stream: ClientHttp2Stream): Promise<{ status: number; body: string; rstCode?: number }> =>
      new Promise((done) => {
        let status = 0;
        let body = '';
        stream.on('response', (h) => (status = Number(h[':status'])));
        stream.setEncoding('utf8');
        stream.on('data', (c: string) => (body += c));
        stream.on('error', () => {});
        stream.once('close', () => done({ status, body, rstCode: stream.rstCode }));
      });

    it('answers 408 to a body that does not arrive in time, and stops the client sending it', async () => {
      const session = h2();
      const stream = post(session);
      stream.write('{"apiVersion":');
      const got = await answer(stream);
      expect(got.status).toBe(408);
      expect(JSON.parse(got.body)).toMatchObject({ kind: 'Status', code: 408 });
      expect(got.rstCode).toBe(constants.NGHTTP2_NO_ERROR);
      session.destroy();
    });

    it('answers 413 to a body over the limit, declared or not', async () => {
      const session = h2();
      const big = Buffer.alloc(256 * 1024, 'a');
      const declared = session.request({
        ':method': 'POST',
        ':path': TCR_PATH,
        'content-length': String(big.length),
      });
      declared.end(big);
      expect((await answer(declared)).status).toBe(413);
      const streamed = post(session);
      streamed.write(big);
      expect((await answer(streamed)).status).toBe(413);
      session.destroy();
    });

    it(`answers 429 with Retry-After beyond ${MAX_ANONYMOUS_IN_FLIGHT} in flight`, async () => {
      const session = h2();
      const held = Array.from({ length: MAX_ANONYMOUS_IN_FLIGHT }, () => {
        const s = post(session);
        s.write('{');
        s.on('error', () => {});
        return s;
      });
      // Each held request is in the proxy once its first byte is.
      await eventually(async () => {
        const over = post(session);
        const headers = await new Promise<IncomingHttpHeaders>((done) => over.once('response', done));
        over.close();
        expect(headers[':status']).toBe(429);
        expect(headers['retry-after']).toBe('1');
      });
      for (const s of held) s.close();
      session.destroy();
    });

    it('lets go of the places of clients gone mid-body, over HTTP/2 and HTTP/1.1', async () => {
      // The requests the proxy is serving: the gauge counts each from its first moment to its last.
      const inFlight = async (): Promise<number> => (await metrics.inflight.get()).values[0]?.value ?? 0;
      // What earlier tests sent is over, so the gauge counts this test's requests alone.
      await eventually(async () => expect(await inFlight()).toBe(0));
      const session = h2();
      // The limited listener takes 8 connections: most go as HTTP/2 streams, a few over HTTP/1.1 connections.
      const gone = Array.from({ length: MAX_ANONYMOUS_IN_FLIGHT - 4 }, () => {
        const s = post(session);
        s.write('{');
        s.on('error', () => {});
        return s;
      });
      const sockets = Array.from({ length: 4 }, () => {
        const socket = tlsConnect({
          host: '127.0.0.1',
          port: limitedPort,
          ca: proxyCA.certPem,
          ALPNProtocols: ['http/1.1'],
        });
        socket.on('error', () => {});
        socket.write(
          `POST ${TCR_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{`,
        );
        return socket;
      });
      // Every one is in. With no audit to wait for, a request takes its place in the turn it arrives: all places are
      // taken, and one more is refused.
      await eventually(async () => expect(await inFlight()).toBe(MAX_ANONYMOUS_IN_FLIGHT));
      const over = post(session);
      over.end('{}');
      expect((await answer(over)).status).toBe(429);
      // Every client goes away mid-body, before its deadline (which a client that left never reaches).
      for (const s of gone) s.close(constants.NGHTTP2_CANCEL);
      for (const socket of sockets) socket.destroy();
      await eventually(async () => expect(await inFlight()).toBe(0));
      session.destroy();
      // A new connection: every place is free again, so as many new requests as there are places all get in, and
      // each waits for its body until the deadline (408), none refused. A place is given back once its request's
      // handler has ended, a moment after the request itself: a round with a refusal is tried again.
      await eventually(async () => {
        const fresh = h2();
        try {
          const again = Array.from({ length: MAX_ANONYMOUS_IN_FLIGHT }, () => {
            const s = post(fresh);
            s.write('{');
            return answer(s);
          });
          expect(new Set((await Promise.all(again)).map((a) => a.status))).toEqual(new Set([408]));
        } finally {
          fresh.destroy();
        }
      });
    }, 30_000);
  });

  it('answers 401 to a request whose body it will not read, and stops the client sending it', async () => {
    const session = h2();
    const stream = session.request({ ':method': 'POST', ':path': '/api/v1/namespaces/x/configmaps' });
    stream.write(Buffer.alloc(1024, 'a'));
    const status = await new Promise((done) => stream.once('response', (h) => done(h[':status'])));
    expect(status).toBe(401);
    await new Promise((done) => stream.once('close', done));
    expect(stream.rstCode).toBe(constants.NGHTTP2_NO_ERROR);
    session.destroy();
  });
});
