// The fuzzer's input families: each an arbitrary (what fast-check generates and shrinks) and how one case is sent
// and judged. Credentials appear in cases as symbols ('token', 'cert'), resolved only when sent, so a printed
// counterexample never carries a working credential.
import { createHmac } from 'node:crypto';
import { constants, type OutgoingHttpHeaders } from 'node:http2';
import fc from 'fast-check';
import WebSocket, { createWebSocketStream } from 'ws';
import { serveTunnel, TUNNEL_PROTOCOL, TUNNEL_PROTOCOL_HEADER, type TunnelServer } from '../../lib/tunnel.ts';
import { expectClean, FindingError, TUNNEL_401_BODIES } from './oracle.ts';
import { AGENT_CLUSTER_PREFIX, agentCluster, FUZZ_AUDIENCE, type FuzzTarget } from './target.ts';
import { rawExchange, TLSSessions, type H2Client } from './wire.ts';

/** What one lane of one family holds while it runs its cases one after another. */
export interface LaneContext {
  target: FuzzTarget;
  lane: number;
  deadlineMs: number;
  /** HTTP/2 sessions: without a client certificate, and with the fuzz user's. */
  h2: H2Client;
  h2Cert: H2Client;
  /** State a family keeps per lane (the tunnel family's fake agent). */
  state: Record<string, unknown>;
}

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

export interface Family<T> {
  name: string;
  /** Share of the cases. */
  weight: number;
  arbitrary: fc.Arbitrary<T>;
  run(input: T, ctx: LaneContext): Promise<void>;
  /** Releases what a lane kept (sessions, tunnels). */
  closeLane?(ctx: LaneContext): Promise<void>;
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
    expectClean(answer, { head: c.method === 'HEAD' });
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
    expectClean(answer, { head: c.method === 'HEAD' });
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
    expectClean(answer);
    // Anything but a refusal means the proxy took the token for someone's.
    if (mustRefuse && answer.kind === 'response' && answer.status !== 401 && answer.status !== 431)
      throw new FindingError({
        kind: 'accepted-forgery',
        message: `a token that must be refused got ${answer.status}: ${answer.body.slice(0, 200)}`,
      });
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
    expectClean(answer, { head: c.method === 'HEAD' });
    const issued = answer.kind === 'response' && answer.body.includes('clientCertificateData');
    if (issued && !(c.body.kind === 'object' && c.body.token === 'valid'))
      throw new FindingError({
        kind: 'accepted-forgery',
        message: `a certificate for a request without the valid token: ${answer.body.slice(0, 200)}`,
      });
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
  | { mode: 'agent answers'; answer: AgentAnswer };

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
    arbitrary: fc.record({ mode: fc.constant('agent answers' as const), answer: agentAnswer }),
  },
);

/** A WebSocket to the tunnel listener as lane's agent. */
async function dialAsAgent(ctx: LaneContext, role: 'answers' | 'garbage'): Promise<WebSocket> {
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

interface FakeAgent {
  ws: WebSocket;
  server: TunnelServer;
  /** What the next stream gets. */
  answer?: AgentAnswer;
}

/**
 * A tunnel that answers every stream with the lane's current answer. Each stream's request head is read first,
 * so the answer follows a request as a real agent's would.
 */
async function fakeAgent(ctx: LaneContext): Promise<FakeAgent> {
  const existing = ctx.state['agent'] as FakeAgent | undefined;
  if (existing && existing.ws.readyState === WebSocket.OPEN) return existing;
  const ws = await dialAsAgent(ctx, 'answers');
  const agent: FakeAgent = { ws, server: undefined as unknown as TunnelServer };
  agent.server = serveTunnel(createWebSocketStream(ws), {
    // A plain request: the answer as HTTP/2 headers, as far as Node lets them be sent (it refuses what no HTTP/2
    // peer may send, and then the stream is reset as a broken agent's would be).
    request(stream) {
      const answer = agent.answer;
      stream.on('error', () => {});
      if (!answer) return;
      try {
        const headers: OutgoingHttpHeaders = { ':status': Number(answer.status) };
        for (const [name, value] of answer.headers) headers[name.toLowerCase()] = value;
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
        const lines = [`HTTP/1.1 ${answer.status} ${answer.reason}`];
        for (const [name, value] of answer.headers) lines.push(`${name}: ${value}`);
        stream.write(Buffer.from(`${lines.join('\r\n')}\r\n\r\n${answer.body}`, 'latin1'));
        if (answer.end === 'end') stream.end();
        if (answer.end === 'destroy') stream.destroy();
        // 'stay': left open a moment, as a stalled agent would be, then cut off.
        else setTimeout(() => stream.destroy(), 100).unref();
      });
    },
  });
  ctx.state['agent'] = agent;
  // The concierge learns of a tunnel asynchronously; the first request may still find it not connected (503,
  // which the oracle allows).
  return agent;
}

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
      expectClean(answer, { other401Bodies: TUNNEL_401_BODIES, head: c.request.method === 'HEAD' });
      if (answer.kind === 'response' && (answer.status === 101 || answer.status === 200))
        throw new FindingError({
          kind: 'accepted-forgery',
          message: `the tunnel listener let a stranger in: ${answer.status} ${answer.body.slice(0, 200)}`,
        });
      return;
    }
    if (c.mode === 'agent garbage') {
      const ws = await dialAsAgent(ctx, 'garbage');
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
    const cluster = agentCluster(ctx.lane, 'answers');
    const answer = await ctx.h2.request(
      {
        headers: {
          ':method': 'GET',
          ':path': `/clusters/${cluster}/api/v1/namespaces`,
          authorization: `Bearer ${ctx.target.token}`,
        },
      },
      ctx.deadlineMs,
    );
    expectClean(answer, { brokenAgent: cluster, upstreamStatus: Number(c.answer.status) });
  },
  closeLane(ctx) {
    const agent = ctx.state['agent'] as FakeAgent | undefined;
    agent?.server.close();
    agent?.ws.terminate();
    return Promise.resolve();
  },
};

export const FAMILIES = [rawFamily, h2Family, tokenFamily, tcrFamily, tunnelFamily] as const;
