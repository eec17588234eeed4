// The fuzzer's input families: each an arbitrary (what fast-check generates and shrinks), how one case is sent and
// judged, and a positive control: a well-formed, authenticated request that must succeed, so that a target which
// refuses or resets everything fails the family instead of passing it. Credentials appear in cases as symbols
// ('token', 'cert', 'fresh'), resolved only when sent, so a printed counterexample never carries a working credential.
import { AUTHENTICATOR_URI_PREFIX } from '../../apis/install.ts';
import { createHmac } from 'node:crypto';
import { constants, type OutgoingHttpHeaders } from 'node:http2';
import fc from 'fast-check';
import WebSocket, { createWebSocketStream } from 'ws';
import {
  serveTunnel,
  TUNNEL_PROTOCOL,
  TUNNEL_PROTOCOL_HEADER,
  type TunnelServer,
} from '../../lib/tunnel/tunnel.ts';

import { BINDING_URI_PREFIX } from '../../apis/agent-binding.ts';
import { deleteBootstrapTokens } from '../../lib/kube/bootstrap.ts';
import { buildCSR, csrRecipe, issuedProblem, type CSRRecipe, type KeyCache } from './csr.ts';
import {
  answerKind,
  describeAnswer,
  expectClean,
  expectRegistration,
  FindingError,
  judgeImpersonation,
  madeByApiServer,
  TUNNEL_401_BODIES,
  type JudgeOptions,
} from './oracle.ts';
import {
  AGENT_CLUSTER_PREFIX,
  agentCluster,
  FORGED_PEERS,
  FUZZ_AUDIENCE,
  FUZZ_GROUP,
  FUZZ_USER,
  PEER_NAMES,
  type ForgedPeer,
  type PeerName,
} from './target.ts';
import { H2Client, rawExchange, TLSSessions, type Answer } from './wire.ts';
import { sshFamily } from './ssh.ts';
import type { Family, LaneContext } from './family.ts';

/**
 * The lane's TLS sessions to resume, one per listener and client certificate: a session resumed carries the
 * certificate it was made with, so a case without one must never resume a session made with one.
 */
function sessionsFor(ctx: LaneContext, key: string): TLSSessions {
  const existing = ctx.state[`tls ${key}`];
  if (existing instanceof TLSSessions) return existing;
  const made = new TLSSessions();
  ctx.state[`tls ${key}`] = made;
  return made;
}

/** Counts the answer by its kind, then judges it. */
function check(ctx: LaneContext, answer: Answer, opts?: JudgeOptions): void {
  ctx.count(answerKind(answer));
  expectClean(answer, opts);
}

type Response = Extract<Answer, { kind: 'response' }>;

/** Throws unless a control's answer has the status it must, and passes `ok`. */
function expectSuccess(
  what: string,
  answer: Answer,
  status: number,
  ok: (response: Response) => boolean = () => true,
): void {
  if (answer.kind === 'response' && answer.status === status && ok(answer)) return;
  throw new FindingError({
    kind: 'control-failed',
    message: `${what}: wanted ${status}, got ${describeAnswer(answer)}`,
  });
}

/** A GET of the namespaces as the fuzz user, over HTTP/2, with its token or its client certificate. */
async function getNamespaces(ctx: LaneContext, as: 'token' | 'cert'): Promise<Answer> {
  return (as === 'cert' ? ctx.h2Cert : ctx.h2).request(
    {
      headers: {
        ':method': 'GET',
        ':path': '/api/v1/namespaces',
        ...(as === 'token' ? { authorization: `Bearer ${ctx.target.token}` } : {}),
      },
    },
    ctx.deadlineMs,
  );
}

// ---------- building blocks ----------

const LOGIN = '/apis/login.concierge.sealion.dev/v1alpha1';
const TCR_PATH = `${LOGIN}/tokencredentialrequests`;
const WHOAMI_PATH = '/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests';
const AUTHENTICATOR_GROUP = 'authentication.concierge.sealion.dev';

/** Bytes as a latin1 string, so that every byte value survives serialisation. */
const bytes = (maxLength: number): fc.Arbitrary<string> =>
  fc.uint8Array({ maxLength }).map((b) => Buffer.from(b).toString('latin1'));
/** Any Unicode text, as its UTF-8 bytes in a latin1 string. */
const utf8 = (maxLength: number): fc.Arbitrary<string> =>
  fc.string({ unit: 'grapheme', maxLength }).map((s) => Buffer.from(s, 'utf8').toString('latin1'));
const tchar = fc.stringMatching(/^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,16}$/);
const controls = fc
  .array(
    fc.constantFrom('\0', '\r', '\n', '\t', '\x01', '\x1b', '\x7f', '\x80', '\xff', ' ', 'a', ':', ','),
    {
      maxLength: 12,
    },
  )
  .map((c) => c.join(''));
/** Long enough to cross the proxy's 32 KiB header limit now and then. */
const huge = fc.integer({ min: 1_000, max: 40_000 }).map((n) => 'a'.repeat(n));

const PATHS = [
  '/',
  '/api',
  '/api/v1',
  '/api/v1/namespaces',
  '/api/v1/namespaces/default',
  '/api/v1/namespaces/default/pods',
  '/api/v1/namespaces/default/configmaps/x',
  '/api/v1/namespaces?watch=true&timeoutSeconds=1',
  '/api/v1/namespaces/default/pods/x/exec?command=sh&stdin=true',
  '/api/v1/namespaces/default/pods/x/proxy/',
  '/apis',
  '/apis/authentication.concierge.sealion.dev/v1alpha1/jwtauthenticators',
  '/version',
  '/healthz',
  '/readyz',
  '/livez',
  '/metrics',
  LOGIN,
  TCR_PATH,
  WHOAMI_PATH,
];
const knownPath = fc.constantFrom(...PATHS);
const notAnAgent = (name: string): boolean => !name.startsWith(AGENT_CLUSTER_PREFIX);
const clusterName = fc
  .oneof(fc.constantFrom('edge', '', '..', '%2e%2e', 'a%2Fb', 'EDGE', 'x'.repeat(300)), tchar, bytes(12))
  .filter(notAnAgent);
const percentJunk = fc
  .array(
    fc.oneof(
      fc.constantFrom(
        '%',
        '%z',
        '%zz',
        '%0',
        '%00',
        '%2f',
        '%2F',
        '%2e%2e',
        '%c0%af',
        '%ff',
        '%25',
        '..',
        '.',
        '',
      ),
      tchar,
    ),
    { maxLength: 6 },
  )
  .map((parts) => `/${parts.join('/')}`);
const target = fc.oneof(
  { weight: 5, arbitrary: knownPath },
  { weight: 2, arbitrary: fc.tuple(clusterName, knownPath).map(([c, p]) => `/clusters/${c}${p}`) },
  { weight: 2, arbitrary: fc.tuple(knownPath, percentJunk).map(([p, j]) => `${p.replace(/\?.*/, '')}${j}`) },
  {
    weight: 1,
    arbitrary: fc.constantFrom('*', 'http://127.0.0.1/api', 'https://x/api/v1', '//api', 'api', ''),
  },
  { weight: 1, arbitrary: fc.tuple(knownPath, controls).map(([p, c]) => `${p}${c}`) },
  { weight: 1, arbitrary: bytes(40) },
  { weight: 1, arbitrary: fc.integer({ min: 100, max: 40_000 }).map((n) => `/api/${'a'.repeat(n)}`) },
);

const HEADER_NAMES = [
  'Host',
  'Authorization',
  'Impersonate-User',
  'Impersonate-Group',
  'Impersonate-Uid',
  'Impersonate-Extra-scopes',
  'Impersonate-Extra-%41b',
  'Impersonate-Extra-',
  'X-Remote-User',
  'X-Remote-Group',
  'X-Remote-Extra-foo',
  'X-Forwarded-For',
  'X-Forwarded-Proto',
  'Content-Length',
  'Transfer-Encoding',
  'Connection',
  'Upgrade',
  'Expect',
  'Content-Type',
  'Accept',
  'Accept-Encoding',
  'Sec-WebSocket-Key',
  'Sec-WebSocket-Version',
  'Sec-WebSocket-Protocol',
  'X-Stream-Protocol-Version',
  'TE',
  'Trailer',
  'Proxy-Connection',
  'Keep-Alive',
  'Cookie',
];
/** A name in odd casing: header names are case-insensitive, and filters must treat them so. */
const recased = (name: string): fc.Arbitrary<string> =>
  fc
    .array(fc.boolean(), { minLength: name.length, maxLength: name.length })
    .map((flips) => [...name].map((c, i) => (flips[i] ? c.toUpperCase() : c.toLowerCase())).join(''));
const headerName = fc.oneof(
  {
    weight: 6,
    arbitrary: fc.constantFrom(...HEADER_NAMES).chain((n) => fc.oneof(fc.constant(n), recased(n))),
  },
  { weight: 2, arbitrary: tchar },
  { weight: 1, arbitrary: bytes(10) },
  { weight: 1, arbitrary: fc.constantFrom(' Host', 'Host ', 'Ho st', ':authority', '', 'Authorization\0') },
);
const VALUES = [
  'chunked',
  'chunked, chunked',
  'gzip, chunked',
  'identity',
  '0',
  '-1',
  '+5',
  '5',
  '99999999999999999999',
  ' 0',
  '0x10',
  'upgrade',
  'keep-alive, Upgrade',
  'close',
  'websocket',
  'h2c',
  'SPDY/3.1',
  '100-continue',
  'Bearer',
  'Bearer ',
  'Basic dXNlcjpwYXNz',
  'system:masters',
  'system:admin',
  'system:serviceaccount:kube-system:default',
  'application/json',
  'application/vnd.kubernetes.protobuf',
  '*/*',
  'v4.channel.k8s.io',
  'dGhlIHNhbXBsZSBub25jZQ==',
  '13',
];
const headerValue = fc.oneof(
  { weight: 5, arbitrary: fc.constantFrom(...VALUES) },
  { weight: 2, arbitrary: tchar },
  { weight: 2, arbitrary: controls },
  { weight: 2, arbitrary: utf8(20) },
  { weight: 1, arbitrary: bytes(20) },
  // obs-fold: a value continued on the next line
  { weight: 1, arbitrary: fc.tuple(tchar, tchar).map(([a, b]) => `${a}\r\n ${b}`) },
  { weight: 1, arbitrary: huge },
);

// ---------- raw HTTP/1.1 over TLS ----------

type Auth = 'none' | 'token' | 'cert' | 'garbage';
const auth = fc.constantFrom<Auth>('none', 'token', 'token', 'cert', 'garbage');

/** Ways to make a message's length ambiguous; the body that follows is the case's own. */
const FRAMING_ATTACKS = {
  'two equal lengths': (n) => [`Content-Length: ${n}`, `Content-Length: ${n}`],
  'two lengths': (n) => [`Content-Length: ${n}`, `Content-Length: ${n + 1}`],
  'a length list': (n) => [`Content-Length: ${n}, ${n}`],
  'length and chunked': (n) => [`Content-Length: ${n}`, 'Transfer-Encoding: chunked'],
  'chunked twice': () => ['Transfer-Encoding: chunked', 'Transfer-Encoding: chunked'],
  'chunked not last': () => ['Transfer-Encoding: chunked, identity'],
  'chunked folded': () => ['Transfer-Encoding:\r\n chunked'],
  'signed length': (n) => [`Content-Length: +${n}`],
  'length with space before colon': (n) => [`Content-Length : ${n}`],
  'chunked with tab': () => ['Transfer-Encoding:\tchunked'],
} satisfies Record<string, (length: number) => string[]>;
type FramingAttack = keyof typeof FRAMING_ATTACKS;

export interface RawCase {
  method: string;
  target: string;
  version: string;
  auth: Auth;
  headers: Array<[string, string]>;
  framing: 'none' | 'length' | 'chunked' | 'as-is' | FramingAttack;
  body: string;
  /** Where the bytes are cut into separate writes. */
  cuts: number[];
}

export const rawCase: fc.Arbitrary<RawCase> = fc.record({
  method: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS') },
    { weight: 1, arbitrary: fc.constantFrom('CONNECT', 'TRACE', 'PRI', 'get', 'PROPFIND', '') },
    { weight: 1, arbitrary: fc.oneof(tchar, bytes(8)) },
  ),
  target,
  version: fc.oneof(
    { weight: 8, arbitrary: fc.constant('HTTP/1.1') },
    {
      weight: 1,
      arbitrary: fc.constantFrom('HTTP/1.0', 'HTTP/2.0', 'HTTP/0.9', 'HTTP/1.1 ', 'http/1.1', 'HTTP/1', ''),
    },
  ),
  auth,
  headers: fc.array(fc.tuple(headerName, headerValue), { maxLength: 8 }),
  framing: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom('none', 'length', 'chunked') },
    { weight: 1, arbitrary: fc.constant('as-is' as const) },
    {
      weight: 2,
      arbitrary: fc.constantFrom(...(Object.keys(FRAMING_ATTACKS) as Array<FramingAttack>)),
    },
  ),
  body: fc.oneof(bytes(200), fc.constantFrom('{}', '{"kind":"TokenCredentialRequest"}', '0\r\n\r\n')),
  cuts: fc.array(fc.nat(), { maxLength: 3 }),
});

function chunked(body: Buffer): Buffer {
  return body.length === 0
    ? Buffer.from('0\r\n\r\n')
    : Buffer.concat([Buffer.from(`${body.length.toString(16)}\r\n`), body, Buffer.from('\r\n0\r\n\r\n')]);
}

/** The request's bytes, credentials filled in. */
export function rawBytes(c: RawCase, token: string): Buffer {
  const body = Buffer.from(c.body, 'latin1');
  const lines = [`${c.method} ${c.target} ${c.version}`, 'Host: 127.0.0.1'];
  if (c.auth === 'token') lines.push(`Authorization: Bearer ${token}`);
  if (c.auth === 'garbage') lines.push('Authorization: Bearer not-a-token');
  for (const [name, value] of c.headers) lines.push(`${name}: ${value}`);
  let payload: Buffer = Buffer.alloc(0);
  if (c.framing === 'length') {
    lines.push(`Content-Length: ${body.length}`);
    payload = body;
  } else if (c.framing === 'chunked') {
    lines.push('Transfer-Encoding: chunked');
    payload = chunked(body);
  } else if (c.framing === 'as-is') {
    payload = body;
  } else if (c.framing !== 'none') {
    lines.push(...FRAMING_ATTACKS[c.framing](body.length));
    payload = body;
  }
  return Buffer.concat([Buffer.from(`${lines.join('\r\n')}\r\n\r\n`, 'latin1'), payload]);
}

function cut(buf: Buffer, cuts: number[]): Buffer[] {
  const at = [...new Set(cuts.map((c) => (buf.length ? c % buf.length : 0)))].sort((a, b) => a - b);
  const pieces: Buffer[] = [];
  let from = 0;
  for (const point of at) {
    if (point > from) pieces.push(buf.subarray(from, point));
    from = Math.max(from, point);
  }
  pieces.push(buf.subarray(from));
  return pieces;
}

export const rawFamily: Family<RawCase> = {
  name: 'raw HTTP/1.1',
  weight: 30,
  arbitrary: rawCase,
  async run(c, ctx) {
    const answer = await rawExchange({
      port: ctx.target.proxyPort,
      ca: ctx.target.proxyCA,
      ...(c.auth === 'cert' ? { cert: ctx.target.userCert } : {}),
      sessions: sessionsFor(ctx, `proxy ${c.auth === 'cert'}`),
      pieces: cut(rawBytes(c, ctx.target.token), c.cuts),
      deadlineMs: ctx.deadlineMs,
      head: c.method === 'HEAD',
    });
    check(ctx, answer, { head: c.method === 'HEAD' });
  },
  async control(ctx) {
    const request = `GET /api/v1/namespaces HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ${ctx.target.token}\r\n\r\n`;
    const answer = await rawExchange({
      port: ctx.target.proxyPort,
      ca: ctx.target.proxyCA,
      sessions: sessionsFor(ctx, 'proxy false'),
      pieces: [Buffer.from(request)],
      deadlineMs: ctx.deadlineMs,
    });
    expectSuccess('GET /api/v1/namespaces over HTTP/1.1 with the fuzz token', answer, 200);
  },
};

// ---------- HTTP/2 ----------

export interface H2Case {
  method: string;
  path: string;
  /** Pseudo-headers beyond :method and :path (or instead of the usual :scheme and :authority). */
  pseudo: Array<[string, string]>;
  auth: Auth;
  headers: Array<[string, string[]]>;
  body?: string;
  /** A content-length that matches the body, or not. */
  length: 'none' | 'exact' | 'wrong';
}

const h2Name = fc.oneof(
  {
    weight: 6,
    arbitrary: fc
      .constantFrom(
        'authorization',
        'impersonate-user',
        'impersonate-group',
        'impersonate-uid',
        'impersonate-extra-scopes',
        'impersonate-extra-a%2Fb',
        'x-remote-user',
        'x-remote-group',
        'x-remote-extra-x',
        'x-forwarded-for',
        'content-type',
        'accept',
        'cookie',
        'te',
        'upgrade',
      )
      .chain((n) => fc.oneof(fc.constant(n), recased(n))),
  },
  { weight: 2, arbitrary: tchar.map((n) => n.toLowerCase()) },
  { weight: 1, arbitrary: bytes(8) },
);

export const h2Case: fc.Arbitrary<H2Case> = fc.record(
  {
    method: fc.oneof(
      { weight: 6, arbitrary: fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS') },
      { weight: 1, arbitrary: fc.oneof(fc.constantFrom('CONNECT', 'get', ''), tchar) },
    ),
    path: target,
    pseudo: fc.array(
      fc.tuple(
        fc.constantFrom(':scheme', ':authority', ':protocol', ':status', ':foo'),
        fc.oneof(fc.constantFrom('https', 'http', 'websocket', '127.0.0.1', ''), utf8(10)),
      ),
      { maxLength: 2 },
    ),
    auth,
    headers: fc.array(fc.tuple(h2Name, fc.array(headerValue, { minLength: 1, maxLength: 3 })), {
      maxLength: 6,
    }),
    body: bytes(300),
    length: fc.constantFrom('none', 'exact', 'wrong'),
  },
  { requiredKeys: ['method', 'path', 'pseudo', 'auth', 'headers', 'length'] },
);

export function h2Headers(c: H2Case, token: string): Record<string, string | string[]> {
  const headers: Record<string, string | string[]> = { ':method': c.method, ':path': c.path };
  for (const [name, value] of c.pseudo) headers[name] = value;
  for (const [name, values] of c.headers) {
    const existing = headers[name];
    headers[name] = existing === undefined ? values : [...[existing].flat(), ...values];
  }
  if (c.auth === 'token') headers['authorization'] = `Bearer ${token}`;
  if (c.auth === 'garbage') headers['authorization'] = 'Bearer not-a-token';
  if (c.body !== undefined && c.length !== 'none') {
    const n = Buffer.byteLength(c.body, 'latin1');
    headers['content-length'] = String(c.length === 'exact' ? n : n + 7);
  }
  return headers;
}

/** The lane's HTTP/2 session to the API server itself, as the fuzz user (the cluster CA's certificate). */
function apiServerClient(ctx: LaneContext): H2Client {
  const existing = ctx.state['api server'];
  if (existing instanceof H2Client) return existing;
  const { url, ca, userCert } = ctx.target.apiServer;
  const made = new H2Client(url, ca, userCert);
  ctx.state['api server'] = made;
  return made;
}

/**
 * When a case of the fuzz user asked to impersonate and the API server answered it through the proxy, the same
 * method, path and Impersonate-* fields go to the API server directly, from the same user: if it refuses that
 * impersonation, the proxy must have refused it too (judgeImpersonation). Asked only then, so a run where the proxy
 * refuses every impersonation itself asks nothing. A direct request the API server does not answer (it resets a field
 * it will not read) leaves the case undecided, counted as such.
 */
async function expectImpersonationDecided(c: H2Case, answer: Answer, ctx: LaneContext): Promise<void> {
  if (c.auth !== 'token' && c.auth !== 'cert') return;
  if (answer.kind !== 'response' || !madeByApiServer(answer.headers)) return;
  const impersonation = Object.entries(h2Headers(c, ctx.target.token)).filter(([name]) =>
    name.toLowerCase().startsWith('impersonate-'),
  );
  if (impersonation.length === 0) return;
  const direct = await apiServerClient(ctx).request(
    { headers: { ':method': c.method, ':path': c.path, ...Object.fromEntries(impersonation) } },
    ctx.deadlineMs,
  );
  ctx.count(
    direct.kind === 'response' && madeByApiServer(direct.headers)
      ? `impersonation asked of the API server: ${answerKind(direct)}`
      : 'impersonation asked of the API server: undecided',
  );
  const finding = judgeImpersonation(answer, direct);
  if (finding) throw new FindingError(finding);
}

export const h2Family: Family<H2Case> = {
  name: 'HTTP/2',
  weight: 25,
  arbitrary: h2Case,
  async run(c, ctx) {
    const client = c.auth === 'cert' ? ctx.h2Cert : ctx.h2;
    const answer = await client.request(
      {
        headers: h2Headers(c, ctx.target.token),
        ...(c.body === undefined ? {} : { body: Buffer.from(c.body, 'latin1') }),
      },
      ctx.deadlineMs,
    );
    check(ctx, answer, { head: c.method === 'HEAD' });
    await expectImpersonationDecided(c, answer, ctx);
  },
  closeLane(ctx) {
    const direct = ctx.state['api server'];
    if (direct instanceof H2Client) direct.close();
    return Promise.resolve();
  },
  async control(ctx) {
    expectSuccess(
      'GET /api/v1/namespaces over HTTP/2 with the fuzz token',
      await getNamespaces(ctx, 'token'),
      200,
    );
    expectSuccess(
      'GET /api/v1/namespaces over HTTP/2 with the fuzz client certificate',
      await getNamespaces(ctx, 'cert'),
      200,
    );
  },
};

// ---------- bearer tokens ----------

type Segment = 0 | 1 | 2;
export type TokenCase =
  | { kind: 'random'; value: string }
  | { kind: 'jwt-shaped'; parts: [string, string, string] }
  | { kind: 'bit flip'; segment: Segment; index: number; bit: number }
  | { kind: 'char swap'; index: number; char: string }
  | { kind: 'alg swap'; alg: unknown; keepSignature: boolean }
  | { kind: 'hmac with the public key' }
  | { kind: 'kid change'; kid: unknown }
  | { kind: 'claims swapped'; claims: Record<string, unknown> }
  | {
      kind: 'reshaped';
      shape: 'two parts' | 'four parts' | 'trailing dot' | 'spaces' | 'padding' | 'doubled';
    }
  | {
      kind: 'signed';
      claims: Record<string, unknown>;
      expiresIn: number;
      audience?: string | string[];
      issuer?: string;
    }
  | { kind: 'oversized'; size: number; signed: boolean };

export interface TokenFuzzCase {
  token: TokenCase;
  /** How the token is carried. */
  scheme: 'Bearer ' | 'bearer ' | 'Bearer  ' | 'Bearer\t' | '' | 'Basic ' | 'Bearer x ';
  path: string;
}

const b64 = (value: unknown): string => Buffer.from(JSON.stringify(value)).toString('base64url');
const oddValue = fc.oneof(
  fc.constantFrom(
    null,
    true,
    0,
    -1,
    1e308,
    '',
    ' ',
    'system:masters',
    'system:anonymous',
    '\u0000',
    '\u202e',
  ),
  fc.string(),
  fc.integer(),
  fc.array(fc.string(), { maxLength: 3 }),
  fc.dictionary(fc.string({ maxLength: 5 }), fc.string({ maxLength: 5 }), { maxKeys: 2 }),
);
const claims = fc.record(
  {
    username: oddValue,
    groups: fc.oneof(oddValue, fc.array(oddValue, { maxLength: 4 })),
    sub: oddValue,
    email: oddValue,
    extra: oddValue,
  },
  { requiredKeys: [] },
);

export const tokenCase: fc.Arbitrary<TokenFuzzCase> = fc.record({
  token: fc.oneof(
    fc.record({
      kind: fc.constant('random' as const),
      value: fc.oneof(tchar, utf8(40), bytes(40), controls),
    }),
    fc.record({
      kind: fc.constant('jwt-shaped' as const),
      parts: fc.tuple(
        fc.oneof(fc.constant(b64({ alg: 'ES256', typ: 'JWT' })), fc.base64String({ maxLength: 40 })),
        fc.oneof(
          fc.json().map((j) => Buffer.from(j).toString('base64url')),
          fc.base64String({ maxLength: 40 }),
        ),
        fc.base64String({ maxLength: 90 }),
      ),
    }),
    fc.record({
      kind: fc.constant('bit flip' as const),
      segment: fc.constantFrom<Segment>(0, 1, 2),
      index: fc.nat(),
      bit: fc.integer({ min: 0, max: 7 }),
    }),
    fc.record({
      kind: fc.constant('char swap' as const),
      index: fc.nat(),
      char: fc.constantFrom(...'AQgw_-0z.=+/ '.split('')),
    }),
    fc.record({
      kind: fc.constant('alg swap' as const),
      alg: fc.constantFrom('none', 'None', 'HS256', 'RS256', 'ES384', 'EdDSA', 'es256', '', null, 7),
      keepSignature: fc.boolean(),
    }),
    fc.constant({ kind: 'hmac with the public key' as const }),
    fc.record({
      kind: fc.constant('kid change' as const),
      kid: fc.constantFrom('', 'key-2', '../../../../dev/null', 0, null, ['key-1'], 'key-1\u0000'),
    }),
    fc.record({ kind: fc.constant('claims swapped' as const), claims }),
    fc.record({
      kind: fc.constant('reshaped' as const),
      shape: fc.constantFrom('two parts', 'four parts', 'trailing dot', 'spaces', 'padding', 'doubled'),
    }),
    fc.record(
      {
        kind: fc.constant('signed' as const),
        claims,
        expiresIn: fc.oneof(fc.constant(300), fc.integer({ min: -10_000_000, max: 10_000_000 })),
        audience: fc.oneof(
          fc.constant(FUZZ_AUDIENCE),
          fc.constantFrom('other', ''),
          fc.array(fc.constantFrom(FUZZ_AUDIENCE, 'other'), { maxLength: 3 }),
        ),
        issuer: fc.constantFrom('https://127.0.0.1/elsewhere', ''),
      },
      { requiredKeys: ['kind', 'claims', 'expiresIn'] },
    ),
    fc.record({
      kind: fc.constant('oversized' as const),
      size: fc.integer({ min: 4_000, max: 40_000 }),
      signed: fc.boolean(),
    }),
  ),
  scheme: fc.constantFrom(
    'Bearer ',
    'Bearer ',
    'Bearer ',
    'bearer ',
    'Bearer  ',
    'Bearer\t',
    '',
    'Basic ',
    'Bearer x ',
  ),
  path: fc.constantFrom('/api/v1/namespaces/default', '/api/v1/namespaces', '/version', '/apis'),
});

/** A token from the case, and whether the proxy must refuse it (a forgery, or claims no JWT may carry). */
async function makeToken(t: TokenCase, ctx: LaneContext): Promise<{ token: string; mustRefuse: boolean }> {
  const valid = ctx.target.token;
  const [h, p, s] = valid.split('.') as [string, string, string];
  const segments = [h, p, s];
  switch (t.kind) {
    case 'random':
      return { token: t.value, mustRefuse: true };
    case 'jwt-shaped':
      return { token: t.parts.join('.'), mustRefuse: true };
    case 'bit flip': {
      const decoded = Buffer.from(segments[t.segment]!, 'base64url');
      if (decoded.length === 0) return { token: valid, mustRefuse: false };
      decoded[t.index % decoded.length]! ^= 1 << t.bit;
      segments[t.segment] = decoded.toString('base64url');
      return { token: segments.join('.'), mustRefuse: true };
    }
    case 'char swap': {
      const i = t.index % valid.length;
      const token = valid.slice(0, i) + t.char + valid.slice(i + 1);
      // A changed character can leave the decoded bytes as they were (the unused low bits of a segment's last
      // character): such a token is the valid one, and may be accepted.
      const same = (a: string, b: string): boolean => {
        const x = a.split('.');
        const y = b.split('.');
        return (
          x.length === 3 &&
          y.length === 3 &&
          /^[A-Za-z0-9_-]*$/.test(a.replace(/\./g, '')) &&
          x.every((seg, k) => Buffer.from(seg, 'base64url').equals(Buffer.from(y[k]!, 'base64url')))
        );
      };
      return { token, mustRefuse: !same(token, valid) };
    }
    case 'alg swap': {
      const header = JSON.parse(Buffer.from(h, 'base64url').toString()) as Record<string, unknown>;
      return {
        token: `${b64({ ...header, alg: t.alg })}.${p}.${t.keepSignature ? s : ''}`,
        mustRefuse: true,
      };
    }
    case 'hmac with the public key': {
      const header = b64({ alg: 'HS256', typ: 'JWT', kid: ctx.target.issuer.currentJWK().kid });
      const secret = JSON.stringify(ctx.target.issuer.currentJWK());
      const mac = createHmac('sha256', secret).update(`${header}.${p}`).digest('base64url');
      return { token: `${header}.${p}.${mac}`, mustRefuse: true };
    }
    case 'kid change': {
      const header = JSON.parse(Buffer.from(h, 'base64url').toString()) as Record<string, unknown>;
      return { token: `${b64({ ...header, kid: t.kid })}.${p}.${s}`, mustRefuse: true };
    }
    case 'claims swapped': {
      const payload = JSON.parse(Buffer.from(p, 'base64url').toString()) as Record<string, unknown>;
      return { token: `${h}.${b64({ ...payload, ...t.claims })}.${s}`, mustRefuse: true };
    }
    case 'reshaped': {
      const token = {
        'two parts': `${h}.${p}`,
        'four parts': `${valid}.${s}`,
        'trailing dot': `${valid}.`,
        spaces: `${h}. ${p}.${s}`,
        padding: `${h}=.${p}.${s}`,
        doubled: `${valid} ${valid}`,
      }[t.shape];
      return { token, mustRefuse: true };
    }
    case 'signed': {
      const token = await ctx.target.issuer.mint(t.claims, {
        expiresIn: t.expiresIn,
        ...(t.audience === undefined ? {} : { audience: t.audience }),
        ...(t.issuer === undefined ? {} : { issuer: t.issuer }),
      });
      const username = t.claims['username'];
      const audiences = [t.audience ?? FUZZ_AUDIENCE].flat();
      const mustRefuse =
        typeof username !== 'string' ||
        username === '' ||
        t.expiresIn < -300 ||
        !audiences.includes(FUZZ_AUDIENCE) ||
        t.issuer !== undefined;
      return { token, mustRefuse };
    }
    case 'oversized': {
      if (!t.signed) return { token: 'a'.repeat(t.size), mustRefuse: true };
      return {
        token: await ctx.target.issuer.mint(
          { username: 'big', padding: 'p'.repeat(t.size) },
          { expiresIn: 300 },
        ),
        mustRefuse: false,
      };
    }
  }
}

export const tokenFamily: Family<TokenFuzzCase> = {
  name: 'bearer tokens',
  weight: 20,
  arbitrary: tokenCase,
  async run(c, ctx) {
    const { token, mustRefuse } = await makeToken(c.token, ctx);
    const answer = await ctx.h2.request(
      { headers: { ':method': 'GET', ':path': c.path, authorization: `${c.scheme}${token}` } },
      ctx.deadlineMs,
    );
    check(ctx, answer);
    // Anything but a refusal means the proxy took the token for someone's.
    if (mustRefuse && answer.kind === 'response' && answer.status !== 401 && answer.status !== 431)
      throw new FindingError({
        kind: 'accepted-forgery',
        message: `a token that must be refused got ${answer.status}: ${answer.body.slice(0, 200)}`,
      });
  },
  async control(ctx) {
    const answer = await ctx.h2.request(
      {
        headers: {
          ':method': 'GET',
          ':path': '/api/v1/namespaces/default',
          authorization: `Bearer ${ctx.target.token}`,
        },
      },
      ctx.deadlineMs,
    );
    expectSuccess('GET /api/v1/namespaces/default with the valid token', answer, 200);
  },
};

// ---------- TokenCredentialRequest bodies ----------

export interface TCRCase {
  method: string;
  path: string;
  contentType?: string;
  body:
    | {
        kind: 'object';
        fields: Record<string, unknown>;
        token: 'valid' | 'other' | 'absent';
        otherToken: unknown;
      }
    | { kind: 'text'; text: string };
}

const tcrFields = fc.record(
  {
    apiVersion: fc.oneof(
      fc.constant('login.concierge.sealion.dev/v1alpha1'),
      fc.constantFrom('v1', 'login.concierge.pinniped.dev/v1alpha1', ''),
      oddValue,
    ),
    kind: fc.oneof(fc.constant('TokenCredentialRequest'), oddValue),
    metadata: fc.oneof(fc.constant({}), fc.record({ name: oddValue, namespace: oddValue }), oddValue),
    authenticator: fc.oneof(
      fc.constant({ apiGroup: AUTHENTICATOR_GROUP, kind: 'JWTAuthenticator', name: 'fuzz' }),
      fc.record(
        {
          apiGroup: fc.oneof(fc.constant(AUTHENTICATOR_GROUP), oddValue),
          kind: fc.oneof(
            fc.constantFrom('JWTAuthenticator', 'WebhookAuthenticator', 'jwtauthenticator'),
            oddValue,
          ),
          name: fc.oneof(fc.constantFrom('fuzz', 'FUZZ', 'fuzz ', '../fuzz', ''), oddValue),
        },
        { requiredKeys: [] },
      ),
      oddValue,
    ),
    extra: fc.dictionary(fc.constantFrom('__proto__', 'constructor', 'status', 'spec', 'x'), fc.jsonValue(), {
      maxKeys: 2,
    }),
  },
  { requiredKeys: [] },
);

export const tcrCase: fc.Arbitrary<TCRCase> = fc.record(
  {
    method: fc.oneof(
      { weight: 8, arbitrary: fc.constant('POST') },
      fc.constantFrom('GET', 'PUT', 'DELETE', 'PATCH'),
    ),
    path: fc.oneof(
      { weight: 8, arbitrary: fc.constant(TCR_PATH) },
      fc.constantFrom(
        `${TCR_PATH}/x`,
        `${TCR_PATH}?dryRun=All`,
        `${LOGIN}/`,
        `${LOGIN}/other`,
        `${TCR_PATH}/%zz`,
      ),
    ),
    contentType: fc.constantFrom(
      'application/json',
      'application/json',
      'application/yaml',
      'application/vnd.kubernetes.protobuf',
      'text/plain',
      'application/json; charset=utf-16',
    ),
    body: fc.oneof(
      {
        weight: 6,
        arbitrary: fc.record({
          kind: fc.constant('object' as const),
          fields: tcrFields,
          token: fc.constantFrom('valid', 'other', 'absent'),
          otherToken: oddValue,
        }),
      },
      {
        weight: 3,
        arbitrary: fc.record({
          kind: fc.constant('text' as const),
          text: fc.oneof(
            fc.json(),
            bytes(200),
            utf8(100),
            fc.integer({ min: 1, max: 20_000 }).map((n) => '['.repeat(n)),
            fc.integer({ min: 1, max: 100 }).map((n) => `{"spec":{"token":"${'t'.repeat(n * 1000)}"}}`),
            fc.constantFrom(
              '',
              '{',
              'null',
              '[]',
              '"x"',
              '{"spec":null}',
              '{"spec":{"token":null}}',
              '{"spec":{"token":1}}',
              '{"spec":"x","spec":{"token":"y"}}',
              '{"__proto__":{"spec":{"token":"y"}}}',
            ),
          ),
        }),
      },
    ),
  },
  { requiredKeys: ['method', 'path', 'body'] },
);

/** A TokenCredentialRequest of the fuzz user's valid token to the fuzz authenticator, with this CSR if any. */
function sendTCR(ctx: LaneContext, csr?: unknown): Promise<Answer> {
  const body = {
    apiVersion: 'login.concierge.sealion.dev/v1alpha1',
    kind: 'TokenCredentialRequest',
    spec: {
      token: ctx.target.token,
      authenticator: { apiGroup: AUTHENTICATOR_GROUP, kind: 'JWTAuthenticator', name: 'fuzz' },
      ...(csr === undefined ? {} : { certificateSigningRequest: csr }),
    },
  };
  return ctx.h2.request(
    {
      headers: { ':method': 'POST', ':path': TCR_PATH, 'content-type': 'application/json' },
      body: Buffer.from(JSON.stringify(body)),
    },
    ctx.deadlineMs,
  );
}

interface TCRCredential {
  clientCertificateData?: unknown;
  clientKeyData?: unknown;
}

/** The credential a TokenCredentialRequest's answer carries, if it is one that issued. */
function tcrCredential(answer: Answer): TCRCredential | undefined {
  if (answer.kind !== 'response' || answer.status !== 201) return undefined;
  try {
    const parsed = JSON.parse(answer.body) as { status?: { credential?: TCRCredential } };
    return parsed.status?.credential;
  } catch {
    return undefined;
  }
}

function tcrBody(c: TCRCase, token: string): string {
  if (c.body.kind === 'text') return c.body.text;
  const { fields, token: which, otherToken } = c.body;
  const spec: Record<string, unknown> = {};
  if (which === 'valid') spec['token'] = token;
  if (which === 'other') spec['token'] = otherToken;
  if ('authenticator' in fields) spec['authenticator'] = fields['authenticator'];
  const top: Record<string, unknown> = { ...fields };
  delete top['authenticator'];
  delete top['extra'];
  return JSON.stringify({ ...top, spec, ...(fields.extra ?? {}) });
}

export const tcrFamily: Family<TCRCase> = {
  name: 'TokenCredentialRequest',
  weight: 15,
  arbitrary: tcrCase,
  async run(c, ctx) {
    const body = tcrBody(c, ctx.target.token);
    const answer = await ctx.h2.request(
      {
        headers: {
          ':method': c.method,
          ':path': c.path,
          ...(c.contentType ? { 'content-type': c.contentType } : {}),
        },
        body: Buffer.from(body, 'latin1'),
      },
      ctx.deadlineMs,
    );
    check(ctx, answer, { head: c.method === 'HEAD' });
    const issued = answer.kind === 'response' && answer.body.includes('clientCertificateData');
    if (issued && !(c.body.kind === 'object' && c.body.token === 'valid'))
      throw new FindingError({
        kind: 'accepted-forgery',
        message: `a certificate for a request without the valid token: ${answer.body.slice(0, 200)}`,
      });
  },
  async control(ctx) {
    const answer = await sendTCR(ctx);
    expectSuccess(
      'a TokenCredentialRequest with the valid token',
      answer,
      201,
      () => typeof tcrCredential(answer)?.clientCertificateData === 'string',
    );
  },
};

// ---------- the tunnel listener ----------

export type TunnelCase =
  | {
      mode: 'stranger';
      /** What the TLS client presents: nothing, or the proxy user's certificate (another CA's). */
      cert: 'none' | 'foreign';
      request: RawCase;
      /** WebSocket frames or anything else, after the request. */
      trailer: string;
    }
  | { mode: 'agent garbage'; settingsFirst: boolean; frames: Array<H2Frame | { raw: string }> }
  | {
      mode: 'agent answers';
      answer: AgentAnswer;
      /**
       * What the agent answers the access reviews the hub asks its cluster before it forwards (whether the cluster's
       * policy lets Sealion act for the user): allowed, or the case's answer, for the hub's own parser of them.
       */
      reviews: 'allowed' | 'the answer';
    };

export interface H2Frame {
  type: number;
  flags: number;
  stream: number;
  payload: string;
  /** A length field that lies about the payload. */
  lie?: number;
}

export interface AgentAnswer {
  status: string;
  reason: string;
  headers: Array<[string, string]>;
  body: string;
  /** How the agent's stream ends after the answer. */
  end: 'end' | 'destroy' | 'stay';
}

const tunnelTarget = fc.oneof(
  fc.constantFrom(
    '/connect',
    '/connect',
    '/register',
    '/renew',
    '/',
    '/connect?x=1',
    '/Connect',
    '//connect',
  ),
  target,
);
const wsHeaders: Array<[string, string]> = [
  ['Connection', 'Upgrade'],
  ['Upgrade', 'websocket'],
  ['Sec-WebSocket-Version', '13'],
  ['Sec-WebSocket-Key', 'dGhlIHNhbXBsZSBub25jZQ=='],
];
const registerBody = fc
  .record(
    {
      cluster: fc.oneof(fc.constantFrom('fuzz-agent-0', 'edge', ''), oddValue),
      token: oddValue,
      csr: oddValue,
    },
    { requiredKeys: [] },
  )
  .map((b) => JSON.stringify(b));

const h2Frame: fc.Arbitrary<H2Frame> = fc.record(
  {
    type: fc.oneof(
      { weight: 5, arbitrary: fc.integer({ min: 0, max: 9 }) },
      fc.integer({ min: 0, max: 255 }),
    ),
    flags: fc.integer({ min: 0, max: 255 }),
    stream: fc.oneof(fc.constantFrom(0, 1, 2, 3, 0x7fffffff), fc.nat()),
    payload: bytes(64),
    lie: fc.integer({ min: 0, max: 0xffffff }),
  },
  { requiredKeys: ['type', 'flags', 'stream', 'payload'] },
);

function frameBytes(f: H2Frame): Buffer {
  const payload = Buffer.from(f.payload, 'latin1');
  const head = Buffer.alloc(9);
  head.writeUIntBE(f.lie ?? payload.length, 0, 3);
  head[3] = f.type;
  head[4] = f.flags;
  head.writeUInt32BE(f.stream >>> 0, 5);
  return Buffer.concat([head, payload]);
}

const agentAnswer: fc.Arbitrary<AgentAnswer> = fc.record({
  status: fc.oneof(
    { weight: 4, arbitrary: fc.constantFrom('200', '404', '500', '101', '204', '304', '100', '103') },
    { weight: 2, arbitrary: fc.constantFrom('000', '099', '600', '999', '1000', '20', 'abc', '') },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: 999 }).map(String) },
  ),
  reason: fc.oneof(fc.constant('OK'), tchar, utf8(10)),
  headers: fc.array(
    fc.tuple(
      fc.oneof(
        fc.constantFrom(
          'Content-Type',
          'Content-Length',
          'Transfer-Encoding',
          'Connection',
          'Upgrade',
          'Set-Cookie',
          'Location',
          'Audit-Id',
          'WWW-Authenticate',
          ':status',
          'Keep-Alive',
          'TE',
        ),
        tchar,
      ),
      headerValue,
    ),
    { maxLength: 6 },
  ),
  body: fc.oneof(bytes(200), fc.constant('{"kind":"Status","code":500}')),
  end: fc.constantFrom('end', 'end', 'destroy', 'stay'),
});

export const tunnelCase: fc.Arbitrary<TunnelCase> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record({
      mode: fc.constant('stranger' as const),
      cert: fc.constantFrom('none', 'foreign'),
      request: fc
        .tuple(rawCase, tunnelTarget, fc.boolean(), registerBody)
        .map(([r, t, ws, body]): RawCase => ({
          ...r,
          target: t,
          headers: ws ? [...wsHeaders, ...r.headers] : r.headers,
          ...(t === '/register' ? { body, framing: 'length', method: 'POST' } : {}),
        })),
      trailer: fc.oneof(fc.constant(''), bytes(100)),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      mode: fc.constant('agent garbage' as const),
      settingsFirst: fc.boolean(),
      frames: fc.array(fc.oneof(h2Frame, fc.record({ raw: bytes(100) })), { minLength: 1, maxLength: 5 }),
    }),
  },
  {
    weight: 3,
    arbitrary: fc.record({
      mode: fc.constant('agent answers' as const),
      answer: agentAnswer,
      reviews: fc.constantFrom(
        'allowed' as const,
        'allowed' as const,
        'allowed' as const,
        'the answer' as const,
      ),
    }),
  },
);

/** A WebSocket to the tunnel listener as lane's agent. */
async function dialAsAgent(ctx: LaneContext, role: 'answers' | 'garbage' | 'peer'): Promise<WebSocket> {
  const cert = await ctx.target.agentCert(ctx.lane, role);
  const ws = new WebSocket(`wss://127.0.0.1:${ctx.target.tunnelPort}/connect`, {
    ca: ctx.target.tunnelCA,
    cert: cert.certPem,
    key: cert.keyPem,
    headers: { 'x-sealion-agent-version': 'fuzz', [TUNNEL_PROTOCOL_HEADER]: TUNNEL_PROTOCOL },
  });
  await new Promise<void>((done, fail) => {
    ws.once('open', () => done());
    ws.once('error', fail);
    ws.once('unexpected-response', (_req, res) => fail(new Error(`tunnel refused: ${res.statusCode}`)));
  });
  return ws;
}

/**
 * A field every fake agent's answer carries (after the case's own), so that a case can tell an answer relayed from
 * the agent from one the proxy made.
 */
const AGENT_MARK = 'x-fuzz-agent';
/** A field the fuzzer puts on requests that cross to a fake agent, under which the agent keeps what it was sent. */
const CASE_MARK = 'x-fuzz-case';
/** What a healthy agent answers; the positive controls' and the peer family's agent's answer. */
const OK_ANSWER: AgentAnswer = {
  status: '200',
  reason: 'OK',
  headers: [['content-type', 'application/json']],
  body: '{"kind":"NamespaceList","apiVersion":"v1","items":[]}',
  end: 'end',
};

/** An access review's answer that allows: all the hub reads of one. */
const ALLOWED = JSON.stringify({
  apiVersion: 'authorization.k8s.io/v1',
  kind: 'SelfSubjectAccessReview',
  status: { allowed: true },
});

interface FakeAgent {
  ws: WebSocket;
  server: TunnelServer;
  /** What the next stream gets. */
  answer?: AgentAnswer;
  /** What the hub's access reviews get: allowed, or the answer above. */
  reviews: 'allowed' | 'the answer';
  /** The header names (or, for an upgrade, the request head) each marked request reached the agent with. */
  seen: Map<string, string[]>;
}

/**
 * A tunnel that answers every stream with the lane's current answer. Each stream's request head is read first,
 * so the answer follows a request as a real agent's would.
 */
async function fakeAgent(ctx: LaneContext, role: 'answers' | 'peer' = 'answers'): Promise<FakeAgent> {
  const existing = ctx.state[`agent ${role}`] as FakeAgent | undefined;
  if (existing && existing.ws.readyState === WebSocket.OPEN) return existing;
  const ws = await dialAsAgent(ctx, role);
  const agent: FakeAgent = {
    ws,
    server: undefined as unknown as TunnelServer,
    seen: new Map(),
    reviews: 'allowed',
  };
  const remember = (id: unknown, names: string[]): void => {
    if (typeof id !== 'string') return;
    agent.seen.set(id, names);
    // Only the current case's is read; a few are kept in case answers cross.
    if (agent.seen.size > 16) agent.seen.delete(agent.seen.keys().next().value!);
  };
  agent.server = serveTunnel(createWebSocketStream(ws), {
    // A plain request: the answer as HTTP/2 headers, as far as Node lets them be sent (it refuses what no HTTP/2
    // peer may send, and then the stream is reset as a broken agent's would be).
    request(stream, requestHeaders, rawHeaders) {
      const answer = agent.answer;
      stream.on('error', () => {});
      remember(
        requestHeaders[CASE_MARK],
        rawHeaders.filter((_, i) => i % 2 === 0),
      );
      const review =
        requestHeaders[':method'] === 'POST' &&
        String(requestHeaders[':path']).startsWith('/apis/authorization.k8s.io/');
      if (review && agent.reviews === 'allowed') {
        stream.resume();
        stream.respond({ ':status': 201, 'content-type': 'application/json' });
        return void stream.end(ALLOWED);
      }
      if (!answer) return;
      try {
        const headers: OutgoingHttpHeaders = { ':status': Number(answer.status) };
        for (const [name, value] of answer.headers) headers[name.toLowerCase()] = value;
        headers[AGENT_MARK] = role;
        stream.respond(headers);
        stream.write(Buffer.from(answer.body, 'latin1'));
      } catch {
        return void stream.close(constants.NGHTTP2_PROTOCOL_ERROR);
      }
      if (answer.end === 'end') stream.end();
      if (answer.end === 'destroy') stream.destroy();
      else setTimeout(() => stream.destroy(), 100).unref();
    },
    // An upgrade: the answer as raw HTTP/1.1.
    connect(stream) {
      let head = '';
      const answer = agent.answer;
      stream.on('error', () => {});
      stream.on('data', (chunk: Buffer) => {
        if (head.includes('\r\n\r\n')) return;
        head += chunk.toString('latin1');
        if (!head.includes('\r\n\r\n') || !answer) return;
        const fields = head.slice(0, head.indexOf('\r\n\r\n')).split('\r\n').slice(1);
        const mark = fields.find((f) => f.toLowerCase().startsWith(`${CASE_MARK}:`));
        remember(
          mark?.slice(CASE_MARK.length + 1).trim(),
          fields.map((f) => f.slice(0, f.indexOf(':')).toLowerCase()),
        );
        const lines = [`HTTP/1.1 ${answer.status} ${answer.reason}`];
        for (const [name, value] of answer.headers) lines.push(`${name}: ${value}`);
        lines.push(`${AGENT_MARK}: ${role}`);
        stream.write(Buffer.from(`${lines.join('\r\n')}\r\n\r\n${answer.body}`, 'latin1'));
        if (answer.end === 'end') stream.end();
        if (answer.end === 'destroy') stream.destroy();
        // 'stay': left open a moment, as a stalled agent would be, then cut off.
        else setTimeout(() => stream.destroy(), 100).unref();
      });
    },
  });
  ctx.state[`agent ${role}`] = agent;
  // The concierge learns of a tunnel asynchronously; the first request may still find it not connected (503,
  // which the oracle allows).
  return agent;
}

const NOT_CONNECTED_YET = / is not connected: /;

/**
 * Sends until the answer is not the 503 of a cluster whose tunnel the concierge has not taken in yet: a control
 * that follows a fake agent's (re)connection must not fail for that moment.
 */
async function onceConnected(send: () => Promise<Answer>): Promise<Answer> {
  for (let attempt = 0; ; attempt++) {
    const answer = await send();
    if (
      attempt >= 50 ||
      answer.kind !== 'response' ||
      answer.status !== 503 ||
      !NOT_CONNECTED_YET.test(answer.body)
    )
      return answer;
    await new Promise((done) => setTimeout(done, 100));
  }
}

/** Whether an answer was relayed from a fake agent. */
const fromAgent = (answer: Answer): boolean => answer.kind === 'response' && AGENT_MARK in answer.headers;

export const tunnelFamily: Family<TunnelCase> = {
  name: 'tunnel',
  weight: 10,
  arbitrary: tunnelCase,
  async run(c, ctx) {
    if (c.mode === 'stranger') {
      const answer = await rawExchange({
        port: ctx.target.tunnelPort,
        ca: ctx.target.tunnelCA,
        ...(c.cert === 'foreign' ? { cert: ctx.target.userCert } : {}),
        sessions: sessionsFor(ctx, `tunnel ${c.cert}`),
        pieces: [rawBytes(c.request, 'not-a-bootstrap-token'), Buffer.from(c.trailer, 'latin1')],
        deadlineMs: ctx.deadlineMs,
        head: c.request.method === 'HEAD',
      });
      check(ctx, answer, { other401Bodies: TUNNEL_401_BODIES, head: c.request.method === 'HEAD' });
      if (answer.kind === 'response' && (answer.status === 101 || answer.status === 200))
        throw new FindingError({
          kind: 'accepted-forgery',
          message: `the tunnel listener let a stranger in: ${answer.status} ${answer.body.slice(0, 200)}`,
        });
      return;
    }
    if (c.mode === 'agent garbage') {
      const ws = await dialAsAgent(ctx, 'garbage');
      ctx.count('garbage tunnel');
      const closed = new Promise<void>((done) => ws.once('close', () => done()));
      ws.on('error', () => {});
      if (c.settingsFirst) ws.send(frameBytes({ type: 4, flags: 0, stream: 0, payload: '' }));
      for (const f of c.frames) ws.send('raw' in f ? Buffer.from(f.raw, 'latin1') : frameBytes(f));
      await Promise.race([closed, new Promise((done) => setTimeout(done, 50))]);
      ws.terminate();
      await closed;
      return;
    }
    const agent = await fakeAgent(ctx);
    agent.answer = c.answer;
    agent.reviews = c.reviews;
    const answer = await throughAgent(ctx);
    check(ctx, answer, {
      brokenAgent: agentCluster(ctx.lane, 'answers'),
      upstreamStatus: Number(c.answer.status),
    });
    if (fromAgent(answer)) ctx.count('from the agent');
  },
  async control(ctx) {
    const agent = await fakeAgent(ctx);
    agent.answer = OK_ANSWER;
    agent.reviews = 'allowed';
    const answer = await onceConnected(() => throughAgent(ctx));
    expectSuccess(
      `GET through the fake agent of ${agentCluster(ctx.lane, 'answers')}`,
      answer,
      200,
      fromAgent,
    );
  },
  reach: 'from the agent',
  closeLane(ctx) {
    closeAgents(ctx);
    return Promise.resolve();
  },
};

/** A GET of the namespaces through the lane's answering fake agent. */
function throughAgent(ctx: LaneContext): Promise<Answer> {
  return ctx.h2.request(
    {
      headers: {
        ':method': 'GET',
        ':path': `/clusters/${agentCluster(ctx.lane, 'answers')}/api/v1/namespaces`,
        authorization: `Bearer ${ctx.target.token}`,
      },
    },
    ctx.deadlineMs,
  );
}

function closeAgents(ctx: LaneContext): void {
  for (const role of ['answers', 'peer']) {
    const agent = ctx.state[`agent ${role}`] as FakeAgent | undefined;
    agent?.server.close();
    agent?.ws.terminate();
  }
}

// ---------- registration at the tunnel listener ----------

/** The registration body's limit at the listener (64 KiB), less a margin: a body within it is owed an answer. */
const REGISTRATION_OWED_BYTES = 60_000;
/** A cluster name no Cluster object has. */
const UNREGISTERED = 'fuzz-unregistered';

export interface RegisterCase {
  /** The lane's registration cluster, another registered one, one not registered, or not a name at all. */
  cluster: 'own' | 'another' | 'unregistered' | { odd: unknown };
  token:
    | { kind: 'fresh'; for: 'own' | 'another' }
    /** A real token's id with another secret. */
    | { kind: 'wrong secret'; secret: string }
    /** A real token, redeemed already. */
    | { kind: 'spent' }
    | { kind: 'shaped'; id: string; secret: string }
    | { kind: 'odd'; value: unknown };
  csr: CSRRecipe;
  /** More fields, before the three the listener reads (which win). */
  extra: Record<string, unknown>;
  /** The body as JSON of the above, text of its own, or the JSON padded to this many bytes. */
  body: { kind: 'json' } | { kind: 'text'; text: string } | { kind: 'padded'; size: number };
  contentType: string | null;
  chunked: boolean;
}

const tokenId = fc.oneof(
  fc.stringMatching(/^[a-z0-9]{8}$/),
  fc.constantFrom('', 'AAAAAAAA', '../../..', 'sealion-', '%00%00%00%00', '00000000'),
  fc.string({ maxLength: 12 }),
);

export const registerCase: fc.Arbitrary<RegisterCase> = fc.record({
  cluster: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom('own' as const, 'another' as const, 'unregistered' as const) },
    {
      weight: 1,
      arbitrary: fc.record({ odd: fc.oneof(oddValue, clusterName, fc.constant('fuzz-agent-r0 ')) }),
    },
  ),
  token: fc.oneof(
    {
      weight: 3,
      arbitrary: fc.record({
        kind: fc.constant('fresh' as const),
        for: fc.constantFrom('own' as const, 'another' as const),
      }),
    },
    fc.record({
      kind: fc.constant('wrong secret' as const),
      secret: fc.oneof(fc.string({ maxLength: 50 }), fc.constant('')),
    }),
    fc.constant({ kind: 'spent' as const }),
    fc.record({ kind: fc.constant('shaped' as const), id: tokenId, secret: fc.string({ maxLength: 50 }) }),
    fc.record({ kind: fc.constant('odd' as const), value: oddValue }),
  ),
  csr: csrRecipe,
  extra: fc.dictionary(
    fc.constantFrom('__proto__', 'constructor', 'apiVersion', 'kind', 'generation', 'uid', 'x'),
    fc.jsonValue({ maxDepth: 2 }),
    { maxKeys: 2 },
  ),
  body: fc.oneof(
    { weight: 8, arbitrary: fc.constant({ kind: 'json' as const }) },
    {
      weight: 1,
      arbitrary: fc.record({
        kind: fc.constant('text' as const),
        text: fc.oneof(
          bytes(200),
          fc.json(),
          fc.integer({ min: 1, max: 30_000 }).map((n) => '['.repeat(n)),
          fc.constantFrom('', 'null', '[]', '"x"', '{"cluster":"fuzz-agent-r0","cluster":{}}'),
        ),
      }),
    },
    {
      weight: 1,
      arbitrary: fc.record({
        kind: fc.constant('padded' as const),
        size: fc.integer({ min: 50_000, max: 80_000 }),
      }),
    },
  ),
  contentType: fc.option(
    fc.constantFrom('application/json', 'text/plain', 'application/x-www-form-urlencoded'),
  ),
  chunked: fc.boolean(),
});

/** The lane's key pairs for requests (see KeyCache). */
function keysOf(ctx: LaneContext): KeyCache {
  const existing = ctx.state['keys'];
  if (existing instanceof Map) return existing as KeyCache;
  const made: KeyCache = new Map();
  ctx.state['keys'] = made;
  return made;
}

/** A POST /register of this body to the tunnel listener, as a stranger (no client certificate). */
function sendRegistration(
  ctx: LaneContext,
  body: Buffer,
  opts: { contentType?: string | null; chunked?: boolean } = {},
): Promise<Answer> {
  const lines = ['POST /register HTTP/1.1', 'Host: 127.0.0.1'];
  if (opts.contentType !== null) lines.push(`Content-Type: ${opts.contentType ?? 'application/json'}`);
  lines.push(opts.chunked ? 'Transfer-Encoding: chunked' : `Content-Length: ${body.length}`);
  return rawExchange({
    port: ctx.target.tunnelPort,
    ca: ctx.target.tunnelCA,
    sessions: sessionsFor(ctx, 'tunnel none'),
    pieces: [Buffer.from(`${lines.join('\r\n')}\r\n\r\n`), opts.chunked ? chunked(body) : body],
    deadlineMs: ctx.deadlineMs,
  });
}

/** Checks a registration's certificate: for the key that signed the request, bound to `cluster`, nothing more. */
async function expectAgentCertificate(
  ctx: LaneContext,
  answer: Response,
  cluster: string,
  spki: Buffer | undefined,
): Promise<void> {
  let certificate: unknown;
  try {
    certificate = (JSON.parse(answer.body) as { certificate?: unknown }).certificate;
  } catch {
    // left undefined: reported below
  }
  if (typeof certificate !== 'string')
    throw new FindingError({
      kind: 'wrong-answer',
      message: `a 200 to a registration without a certificate: ${answer.body.slice(0, 300)}`,
    });
  const problem = await issuedProblem(certificate, {
    ...(spki ? { spki } : {}),
    commonName: cluster,
    organizations: [],
    uriPrefix: BINDING_URI_PREFIX,
    binding: cluster,
    ca: ctx.target.tunnelCA,
  });
  if (problem) throw new FindingError(problem);
}

/**
 * Sends a valid registration for the lane's registration cluster (a fresh token, a valid CSR) and checks its
 * certificate. A 429 (registrations are rate-limited) is waited out a few times, as its Retry-After says; one that
 * persists leaves the control undecided rather than failed: the limit is a legitimate answer.
 */
async function registerValidly(ctx: LaneContext): Promise<'passed' | 'limited'> {
  const cluster = agentCluster(ctx.lane, 'register');
  for (let attempt = 0; ; attempt++) {
    const built = await buildCSR({ kind: 'valid', subject: [['CN', 'fuzz']], asks: [] }, keysOf(ctx));
    const token = await ctx.target.bootstrapToken(cluster);
    const answer = await sendRegistration(
      ctx,
      Buffer.from(JSON.stringify({ cluster, token, csr: built.csr })),
    );
    if (answer.kind === 'response' && answer.status === 429) {
      if (attempt >= 3) return 'limited';
      const wait = Math.min(10, Number(answer.headers['retry-after']) || 1);
      await new Promise((done) => setTimeout(done, wait * 1000));
      continue;
    }
    expectSuccess(`a registration of ${cluster} with a fresh bootstrap token and a valid CSR`, answer, 200);
    await expectAgentCertificate(ctx, answer as Response, cluster, built.spki);
    return 'passed';
  }
}

export const registerFamily: Family<RegisterCase> = {
  name: 'registration',
  weight: 5,
  arbitrary: registerCase,
  async run(c, ctx) {
    const names = { own: agentCluster(ctx.lane, 'register'), another: agentCluster(ctx.lane, 'peer') };
    const cluster =
      typeof c.cluster === 'object'
        ? c.cluster.odd
        : c.cluster === 'unregistered'
          ? UNREGISTERED
          : names[c.cluster];
    let token: unknown;
    switch (c.token.kind) {
      case 'fresh':
        token = await ctx.target.bootstrapToken(names[c.token.for]);
        break;
      case 'wrong secret':
        token = `${(await ctx.target.bootstrapToken(names.own)).split('.')[0]}.${c.token.secret}`;
        break;
      case 'spent': {
        // What a redemption leaves of a token: its Secret deleted. Made for the other cluster, whose tokens no other
        // case of the lane waits on.
        token = await ctx.target.bootstrapToken(names.another);
        await deleteBootstrapTokens(ctx.target.clients, ctx.target.tunnelNamespace, names.another);
        break;
      }
      case 'shaped':
        token = `${c.token.id}.${c.token.secret}`;
        break;
      case 'odd':
        token = c.token.value;
    }
    const built = await buildCSR(c.csr, keysOf(ctx));
    const json = JSON.stringify({ ...c.extra, cluster, token, csr: built.csr });
    const body =
      c.body.kind === 'text'
        ? Buffer.from(c.body.text, 'latin1')
        : c.body.kind === 'padded'
          ? Buffer.from(
              JSON.stringify({
                padding: 'p'.repeat(Math.max(0, c.body.size - json.length)),
                ...JSON.parse(json),
              }),
            )
          : Buffer.from(json);
    const answer = await sendRegistration(ctx, body, { contentType: c.contentType, chunked: c.chunked });
    ctx.count(answerKind(answer));
    const valid =
      c.body.kind !== 'text' &&
      c.token.kind === 'fresh' &&
      typeof c.cluster === 'string' &&
      c.cluster === c.token.for;
    expectRegistration(answer, {
      issue: valid ? built.issue : 'never',
      owed: body.length <= REGISTRATION_OWED_BYTES,
    });
    if (answer.kind === 'response' && answer.status === 200) {
      await expectAgentCertificate(ctx, answer, cluster as string, built.spki);
      ctx.count('registered');
    }
  },
  async control(ctx) {
    if ((await registerValidly(ctx)) === 'limited') return 'undecided';
  },
  reach: 'registered',
};

// ---------- certificate signing requests ----------

export interface CSRCase {
  /** Where the request goes: in a TokenCredentialRequest with the valid token, or a registration with a fresh one. */
  to: 'TokenCredentialRequest' | 'registration';
  csr: CSRRecipe;
}

export const csrCase: fc.Arbitrary<CSRCase> = fc.record({
  to: fc.constantFrom('TokenCredentialRequest', 'registration'),
  csr: csrRecipe,
});

/** Checks a TokenCredentialRequest's answer to a CSR: a certificate only for a valid one, for its key, for the user. */
async function expectUserCertificate(
  ctx: LaneContext,
  answer: Answer,
  csr: unknown,
  spki: Buffer | undefined,
  issue: 'must' | 'may' | 'never',
) {
  const credential = tcrCredential(answer);
  const certificate = credential?.clientCertificateData;
  if (typeof certificate !== 'string') {
    if (issue === 'must')
      throw new FindingError({
        kind: 'wrong-answer',
        message: `a valid CSR with the valid token got no certificate: ${describeAnswer(answer)}`,
      });
    return;
  }
  ctx.count('issued');
  // Without a CSR (an empty one is none) the concierge makes the key and hands it back.
  if (csr === '') return;
  if (credential?.clientKeyData)
    throw new FindingError({
      kind: 'wrong-answer',
      message: "a request with a CSR got a key of the concierge's making",
    });
  if (issue === 'never')
    throw new FindingError({
      kind: 'accepted-forgery',
      message: `a certificate for a CSR that must be refused: ${describeAnswer(answer)}`,
    });
  const problem = await issuedProblem(certificate, {
    ...(spki ? { spki } : {}),
    commonName: FUZZ_USER,
    organizations: [FUZZ_GROUP, 'system:authenticated'],
    uriPrefix: AUTHENTICATOR_URI_PREFIX,
    ca: ctx.target.concierge.signer.certPem,
  });
  if (problem) throw new FindingError(problem);
}

export const csrFamily: Family<CSRCase> = {
  name: 'CSR',
  weight: 5,
  arbitrary: csrCase,
  async run(c, ctx) {
    const built = await buildCSR(c.csr, keysOf(ctx));
    if (c.to === 'TokenCredentialRequest') {
      const answer = await sendTCR(ctx, built.csr);
      check(ctx, answer);
      await expectUserCertificate(ctx, answer, built.csr, built.spki, built.issue);
      return;
    }
    const cluster = agentCluster(ctx.lane, 'register');
    const token = await ctx.target.bootstrapToken(cluster);
    const body = Buffer.from(JSON.stringify({ cluster, token, csr: built.csr }));
    const answer = await sendRegistration(ctx, body);
    ctx.count(answerKind(answer));
    expectRegistration(answer, { issue: built.issue, owed: body.length <= REGISTRATION_OWED_BYTES });
    if (answer.kind === 'response' && answer.status === 200) {
      await expectAgentCertificate(ctx, answer, cluster, built.spki);
      ctx.count('issued');
    }
  },
  async control(ctx) {
    const built = await buildCSR({ kind: 'valid', subject: [['CN', 'fuzz']], asks: [] }, keysOf(ctx));
    const answer = await sendTCR(ctx, built.csr);
    expectSuccess(
      'a TokenCredentialRequest with the valid token and a valid CSR',
      answer,
      201,
      () => typeof tcrCredential(answer)?.clientCertificateData === 'string',
    );
    await expectUserCertificate(ctx, answer, built.csr, built.spki, 'must');
    await registerValidly(ctx);
  },
  reach: 'issued',
};

// ---------- the peer link ----------

/** Stands for the cluster whose tunnel the lane's peer agent holds, in a generated path. */
const HELD = '{held}';
/** Fields a replica never passes on to an agent: hop-by-hop ones, credentials, and the peer link's own. */
const NEVER_TO_AGENT =
  /^(?:connection|keep-alive|proxy-connection|transfer-encoding|te|upgrade|host|authorization|x-sealion-peer-.*)$/;

const peerHeaderName = fc.oneof(
  {
    weight: 3,
    arbitrary: fc
      .constantFrom(
        'x-sealion-peer-user',
        'x-sealion-peer-long-running',
        'x-sealion-peer-other',
        'x-sealion-peer-',
      )
      .chain((n) => fc.oneof(fc.constant(n), recased(n))),
  },
  { weight: 3, arbitrary: h2Name },
);
const peerHeaderValue = fc.oneof(
  fc.constantFrom('1', '0', 'true', '', '%zz', '%00', '%E0%A4%A', 'system%3Amasters', 'system:masters', '%'),
  headerValue,
);
const peerPath = fc.oneof(
  { weight: 5, arbitrary: knownPath.map((p) => `/clusters/${HELD}${p}`) },
  {
    weight: 1,
    arbitrary: fc
      .tuple(knownPath, percentJunk)
      .map(([p, j]) => `/clusters/${HELD}${p.replace(/\?.*/, '')}${j}`),
  },
  { weight: 3, arbitrary: target },
);

export type PeerCase =
  | {
      mode: 'replica';
      as: PeerName;
      method: string;
      path: string;
      headers: Array<[string, string[]]>;
      body?: string;
      length: 'none' | 'exact' | 'wrong';
    }
  /** Raw HTTP/1.1 on a CONNECT stream, where a replica sends upgrades. */
  | { mode: 'replica upgrade'; as: PeerName; request: RawCase }
  /** A connection a replica never makes: an identity that is none, or a replica's on another protocol. */
  | { mode: 'stranger'; as: ForgedPeer | PeerName; alpn: 'peer' | 'h2' | 'http/1.1' | 'none' };

export const peerCase: fc.Arbitrary<PeerCase> = fc.oneof(
  {
    weight: 5,
    arbitrary: fc.record(
      {
        mode: fc.constant('replica' as const),
        as: fc.constantFrom(...PEER_NAMES),
        method: fc.oneof(
          {
            weight: 6,
            arbitrary: fc.constantFrom('GET', 'POST', 'PUT', 'PATCH', 'DELETE', 'HEAD', 'OPTIONS'),
          },
          { weight: 1, arbitrary: fc.oneof(fc.constantFrom('CONNECT', 'get', ''), tchar) },
        ),
        path: peerPath,
        headers: fc.array(
          fc.tuple(peerHeaderName, fc.array(peerHeaderValue, { minLength: 1, maxLength: 3 })),
          {
            maxLength: 6,
          },
        ),
        body: bytes(300),
        length: fc.constantFrom('none', 'exact', 'wrong'),
      },
      { requiredKeys: ['mode', 'as', 'method', 'path', 'headers', 'length'] },
    ),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      mode: fc.constant('replica upgrade' as const),
      as: fc.constantFrom(...PEER_NAMES),
      request: fc
        .tuple(
          rawCase,
          peerPath,
          fc.boolean(),
          fc.array(fc.tuple(peerHeaderName, peerHeaderValue), { maxLength: 4 }),
        )
        .map(([r, path, upgrade, peerHeaders]): RawCase => ({
          ...r,
          target: path,
          auth: 'none',
          headers: [...(upgrade ? wsHeaders : []), ...peerHeaders, ...r.headers],
        })),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.oneof(
      fc.record({
        mode: fc.constant('stranger' as const),
        as: fc.constantFrom(...FORGED_PEERS),
        alpn: fc.constantFrom('peer' as const, 'peer' as const, 'h2' as const, 'none' as const),
      }),
      fc.record({
        mode: fc.constant('stranger' as const),
        as: fc.constantFrom(...PEER_NAMES),
        alpn: fc.constantFrom('h2' as const, 'http/1.1' as const, 'none' as const),
      }),
    ),
  },
);

const PEER_ALPN = 'sealion-peer/1';
const ALPN_OFFERS = { peer: [PEER_ALPN], h2: ['h2'], 'http/1.1': ['http/1.1'], none: [] };

/** The lane's peer-link session as replica `as`. */
function peerSession(ctx: LaneContext, as: PeerName): H2Client {
  const key = `peer ${as}`;
  const existing = ctx.state[key];
  if (existing instanceof H2Client) return existing;
  const { peer } = ctx.target;
  const made = new H2Client(`https://127.0.0.1:${peer.port}`, peer.ca, peer.replicas[as], [PEER_ALPN]);
  ctx.state[key] = made;
  return made;
}

/**
 * The fields of an upgrade that its forwarder writes itself, for the HTTP/1.1 it sends into the tunnel (Node's client
 * frames the request of a method that may carry a body as chunked).
 */
const UPGRADE_OWN = /^(?:connection|upgrade|host|transfer-encoding)$/;

/** Throws when a marked request reached the peer agent with a field no replica may pass on. */
function expectNoLeak(agent: FakeAgent, id: string, upgrade = false): void {
  const leaked = (agent.seen.get(id) ?? []).filter(
    (name) => NEVER_TO_AGENT.test(name.toLowerCase()) && !(upgrade && UPGRADE_OWN.test(name.toLowerCase())),
  );
  if (leaked.length > 0)
    throw new FindingError({
      kind: 'leak',
      message: `a peer's request reached the agent with ${leaked.join(', ')}`,
    });
}

let peerCases = 0;

export const peerFamily: Family<PeerCase> = {
  name: 'peer link',
  weight: 5,
  arbitrary: peerCase,
  async run(c, ctx) {
    const held = agentCluster(ctx.lane, 'peer');
    if (c.mode === 'stranger') {
      const { peer } = ctx.target;
      const credential =
        c.as === 'none'
          ? undefined
          : (PEER_NAMES as readonly string[]).includes(c.as)
            ? peer.replicas[c.as as PeerName]
            : peer.forged[c.as as Exclude<ForgedPeer, 'none'>];
      const client = new H2Client(`https://127.0.0.1:${peer.port}`, peer.ca, credential, ALPN_OFFERS[c.alpn]);
      try {
        const answer = await client.request(
          { headers: { ':method': 'GET', ':path': `/clusters/${held}/api/v1/namespaces` } },
          ctx.deadlineMs,
        );
        ctx.count(answerKind(answer));
        if (answer.kind === 'hang') throw new FindingError({ kind: 'hang', message: answer.detail });
        if (answer.kind === 'response')
          throw new FindingError({
            kind: 'accepted-forgery',
            message: `the peer port answered ${c.as} (ALPN ${c.alpn}): ${describeAnswer(answer)}`,
          });
      } finally {
        client.close();
      }
      return;
    }
    const agent = await fakeAgent(ctx, 'peer');
    agent.answer = OK_ANSWER;
    const id = String(++peerCases);
    const session = peerSession(ctx, c.as);
    let answer: Answer;
    if (c.mode === 'replica upgrade') {
      const request: RawCase = {
        ...c.request,
        target: c.request.target.replace(HELD, held),
        headers: [[CASE_MARK, id], ...c.request.headers],
      };
      answer = await session.connectExchange(
        [rawBytes(request, '')],
        ctx.deadlineMs,
        request.method === 'HEAD',
      );
      check(ctx, answer, { peer: true, head: request.method === 'HEAD' });
    } else {
      const headers = h2Headers(
        {
          method: c.method,
          path: c.path.replace(HELD, held),
          pseudo: [],
          auth: 'none',
          headers: c.headers,
          length: c.length,
          ...(c.body === undefined ? {} : { body: c.body }),
        },
        '',
      );
      headers[CASE_MARK] = id;
      answer = await session.request(
        { headers, ...(c.body === undefined ? {} : { body: Buffer.from(c.body, 'latin1') }) },
        ctx.deadlineMs,
      );
      check(ctx, answer, { peer: true, head: c.method === 'HEAD' });
    }
    ctx.count(`${c.mode}: ${answerKind(answer)}`);
    if (fromAgent(answer)) {
      ctx.count('from the agent');
      expectNoLeak(agent, id, c.mode === 'replica upgrade');
    }
  },
  async control(ctx) {
    const agent = await fakeAgent(ctx, 'peer');
    agent.answer = OK_ANSWER;
    const id = String(++peerCases);
    const cluster = agentCluster(ctx.lane, 'peer');
    const answer = await onceConnected(() =>
      peerSession(ctx, 'fuzz-peer').request(
        {
          headers: {
            ':method': 'GET',
            ':path': `/clusters/${cluster}/api/v1/namespaces`,
            'x-sealion-peer-user': 'fuzzer%40example.com',
            [CASE_MARK]: id,
          },
        },
        ctx.deadlineMs,
      ),
    );
    expectSuccess(`GET over the peer link through the fake agent of ${cluster}`, answer, 200, fromAgent);
    expectNoLeak(agent, id);
  },
  reach: 'from the agent',
  closeLane(ctx) {
    closeAgents(ctx);
    for (const as of PEER_NAMES) (ctx.state[`peer ${as}`] as H2Client | undefined)?.close();
    return Promise.resolve();
  },
};

export const FAMILIES = [
  rawFamily,
  h2Family,
  tokenFamily,
  tcrFamily,
  tunnelFamily,
  registerFamily,
  csrFamily,
  peerFamily,
  sshFamily,
] as const;
