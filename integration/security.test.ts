// The threat model, as tests: what a hostile caller sends the impersonation proxy and the tunnel listener, and the one
// answer each attack must get. Real API servers judge: a hub, where the concierge runs, and `edge`, reached only
// through its agent. What the API server saw is read back from its own SelfSubjectReview answer (or its own refusal,
// which names the user), never assumed. Every row names the attack and its expected answer.
import { TUNNEL_CA_SECRET } from '../apis/install.ts';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createHmac, createPublicKey } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { connect as http2Connect, type IncomingHttpHeaders as H2Headers } from 'node:http2';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect as tlsConnect } from 'node:tls';
import { WebSocket } from 'ws';
import { newAgent, type Agent, type AgentCredentials } from '../agent/agent.ts';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { newKubeClients, readSecretData, type KubeClients } from '../lib/kube/kube.ts';
import { newLogger } from '../lib/log.ts';
import { USER_UNREAD_BYTES } from '../lib/http2/memory-budget.ts';
import { issueCert, loadCA, newCA, newCSR, type CertificateAuthority } from '../lib/pki/pki.ts';
import { TUNNEL_PROTOCOL, TUNNEL_PROTOCOL_HEADER } from '../lib/tunnel/tunnel.ts';

import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { applyJWTAuthenticator, startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { postRegister, type RegisterAnswer } from '../dev/register.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';
import { startTokenWebhook, type TokenWebhook } from './harness/token-webhook.ts';

const GROUP = 'authentication.concierge.sealion.dev';
const TUNNEL_GROUP = 'tunnel.concierge.sealion.dev';
const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const EDGE = 'edge';
const AUDIENCE = 'sealion-security';
const USER = 'ada@example.com';
/** The group both clusters' RBAC lets read namespaces. */
const READERS = 'readers';
const AUTHENTICATED = 'system:authenticated';
const SSR_PATH = '/apis/authentication.k8s.io/v1/selfsubjectreviews';
const SSR_BODY = JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' });
const TCR_PATH = '/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests';
const JWT_REF = { apiGroup: GROUP, kind: 'JWTAuthenticator', name: 'corp' };
const WEBHOOK_REF = { apiGroup: GROUP, kind: 'WebhookAuthenticator', name: 'hooks' };
/** A hub service account's token for the hub's API server, on /clusters/edge: refused, naming what to use instead. */
const SA_TOKEN_ON_EDGE: Expected = {
  status: 403,
  reason: 'Forbidden',
  says: "a token of the hub's API server cannot be used for cluster edge; use a projected service-account token with audience workloads.concierge.sealion.dev (sealion cluster kubeconfig edge --service-account kube-system/robot)",
};
/** The proxy's request header limit (server.ts MAX_HEADER_BYTES). */
const HEADER_LIMIT = 32 * 1024;

let dir: string;
let hub: Cluster;
let edge: Cluster;
let hubClients: KubeClients;
let issuer: TestIssuer;
let webhook: TokenWebhook;
let concierge: LocalConcierge;
let tunnelPort: number;
let agent: Agent | undefined;
let agentCredentials: AgentCredentials | undefined;
let tunnelCA: CertificateAuthority;
/** The user's OIDC token: USER in READERS. */
let userToken = '';
/** A cluster-admin service account's token on the hub: what an attacker would love the API server to use. */
let rootToken = '';
/** A hub service account with no rights, whose token the proxy passes through unimpersonated. */
let robotToken = '';
/** A service-account token of the edge cluster. */
let edgeToken = '';
/** The proxy's answer to a request with no credentials: every failed authentication must get exactly this. */
let unauthorizedBody = '';
/** Every line the concierge and the agent logged. */
const logLines: string[] = [];
/** Every secret the suite handled: none may ever appear in a log line. */
const secrets = new Set<string>();

interface Answer {
  status: number;
  body: string;
  /** A further response on the same connection (raw HTTP/1.1 only): a pipelined or smuggled request was served. */
  next?: Answer;
}

interface Credential {
  certPem: string;
  keyPem: string;
}

const keep = <T extends string>(secret: T): T => {
  secrets.add(secret);
  return secret;
};
const bearer = (token: string): Record<string, string> => ({ authorization: `Bearer ${token}` });
const b64url = (value: object | string): string =>
  Buffer.from(typeof value === 'string' ? value : JSON.stringify(value)).toString('base64url');
const proxyPort = (): number => concierge.concierge.port;

/** One HTTP/1.1 request on a connection of its own. */
function https1(
  path: string,
  opts: { method?: string; headers?: Record<string, string>; body?: string | Buffer; cert?: Credential } = {},
): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = httpsRequest(
      {
        host: '127.0.0.1',
        port: proxyPort(),
        path,
        method: opts.method ?? (opts.body === undefined ? 'GET' : 'POST'),
        ca: concierge.servingCA.certPem,
        agent: false,
        headers: {
          ...(opts.body === undefined ? {} : { 'content-type': 'application/json' }),
          ...opts.headers,
        },
        ...(opts.cert ? { cert: opts.cert.certPem, key: opts.cert.keyPem } : {}),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          done({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString('utf8') }),
        );
      },
    );
    req.on('error', fail);
    req.end(opts.body);
  });
}

/** One HTTP/2 request on a session of its own. A stream the proxy resets answers status 0. */
function h2(
  path: string,
  opts: {
    method?: string;
    headers?: Record<string, string>;
    body?: string | Buffer;
    trailers?: Record<string, string>;
  } = {},
): Promise<Answer> {
  return new Promise((done, fail) => {
    const session = http2Connect(`https://127.0.0.1:${proxyPort()}`, { ca: concierge.servingCA.certPem });
    session.on('error', fail);
    const stream = session.request(
      {
        ':method': opts.method ?? (opts.body === undefined ? 'GET' : 'POST'),
        ':path': path,
        ...(opts.body === undefined ? {} : { 'content-type': 'application/json' }),
        ...opts.headers,
      },
      { endStream: opts.body === undefined && !opts.trailers, waitForTrailers: Boolean(opts.trailers) },
    );
    if (opts.trailers) stream.on('wantTrailers', () => stream.sendTrailers(opts.trailers!));
    let status = 0;
    const chunks: Buffer[] = [];
    stream.on('response', (h: H2Headers) => (status = Number(h[':status'])));
    stream.on('data', (c: Buffer) => chunks.push(c));
    const finish = (): void => {
      session.close();
      done({ status, body: Buffer.concat(chunks).toString('utf8') });
    };
    stream.on('end', finish);
    stream.on('error', () => {
      status = 0;
      finish();
    });
    if (opts.body !== undefined) stream.end(opts.body);
    else if (opts.trailers) stream.end();
  });
}

/** POST /register at the tunnel listener, as anyone may. */
const registerAt = (body: object): Promise<RegisterAnswer> =>
  postRegister(tunnelPort, tunnelCA.certPem, body);

/** Reads the HTTP/1.1 responses in `data`, in order. */
function parseResponses(data: Buffer): Answer | undefined {
  const answers: Answer[] = [];
  let rest = data;
  while (rest.length > 0) {
    const end = rest.indexOf('\r\n\r\n');
    if (end < 0) break;
    const lines = rest.subarray(0, end).toString('latin1').split('\r\n');
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? '')?.[1] ?? 0);
    const headers = new Map(
      lines
        .slice(1)
        .map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]),
    );
    rest = rest.subarray(end + 4);
    let body: Buffer;
    if (headers.has('content-length')) {
      const length = Number(headers.get('content-length'));
      body = rest.subarray(0, length);
      rest = rest.subarray(length);
    } else if (headers.get('transfer-encoding') === 'chunked') {
      const parts: Buffer[] = [];
      for (;;) {
        const lineEnd = rest.indexOf('\r\n');
        const size = parseInt(rest.subarray(0, lineEnd).toString('latin1'), 16);
        rest = rest.subarray(lineEnd + 2);
        if (!(size > 0)) {
          rest = rest.subarray(rest.indexOf('\r\n') + 2);
          break;
        }
        parts.push(rest.subarray(0, size));
        rest = rest.subarray(size + 2);
      }
      body = Buffer.concat(parts);
    } else {
      body = rest;
      rest = Buffer.alloc(0);
    }
    if (status >= 100 && status < 200 && status !== 101) continue;
    answers.push({ status, body: body.toString('utf8') });
  }
  for (let i = answers.length - 1; i > 0; i--) answers[i - 1]!.next = answers[i];
  return answers[0];
}

/**
 * Writes `bytes` to the proxy over TLS (HTTP/1.1) exactly as given and reads until the proxy closes the connection;
 * the requests should end with `Connection: close`. A hang guard of 20 s ends the read otherwise.
 */
function raw(bytes: string | Buffer, cert?: Credential): Promise<Answer> {
  return new Promise((done, fail) => {
    const socket = tlsConnect({
      host: '127.0.0.1',
      port: proxyPort(),
      ca: concierge.servingCA.certPem,
      ALPNProtocols: ['http/1.1'],
      ...(cert ? { cert: cert.certPem, key: cert.keyPem } : {}),
    });
    const chunks: Buffer[] = [];
    const guard = setTimeout(() => socket.destroy(), 20_000);
    socket.on('data', (c: Buffer) => chunks.push(c));
    socket.once('secureConnect', () => socket.write(bytes));
    socket.on('error', () => {});
    socket.once('close', () => {
      clearTimeout(guard);
      const answer = parseResponses(Buffer.concat(chunks));
      if (answer) done(answer);
      else fail(new Error(`no HTTP answer: ${JSON.stringify(Buffer.concat(chunks).toString('latin1'))}`));
    });
  });
}

/** A raw HTTP/1.1 SelfSubjectReview carrying the user's token, the given header lines, and `Connection: close`. */
const rawReview = (lines: string[], opts: { token?: string; close?: boolean } = {}): string =>
  [
    `POST ${SSR_PATH} HTTP/1.1`,
    'Host: proxy',
    'Content-Type: application/json',
    `Content-Length: ${Buffer.byteLength(SSR_BODY)}`,
    ...(opts.token === '' ? [] : [`Authorization: Bearer ${opts.token ?? userToken}`]),
    ...lines,
    ...(opts.close === false || lines.some((l) => /^connection:/i.test(l)) ? [] : ['Connection: close']),
    '',
    SSR_BODY,
  ].join('\r\n');

/** A SelfSubjectReview through the proxy (on `prefix`, e.g. `/clusters/edge`) as whoever `headers`/`cert` say. */
const review = (opts: { headers?: Record<string, string>; cert?: Credential; prefix?: string } = {}) =>
  https1(`${opts.prefix ?? ''}${SSR_PATH}`, {
    body: SSR_BODY,
    ...opts,
    // Through a tunnel, a body of declared length is mangled on a fresh tunnel stream (see the open holes below):
    // a chunked body is not, so the identity rows test identities, not that.
    headers: { ...(opts.prefix ? { 'transfer-encoding': 'chunked' } : {}), ...opts.headers },
  });
/** A GET with the user's token and `Connection: close`, sent exactly as written. */
const get = (path: string, token = userToken): Promise<Answer> =>
  raw(`GET ${path} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${token}\r\nConnection: close\r\n\r\n`);

/** An anonymous TokenCredentialRequest. */
const tcr = (token: string, ref: object = JWT_REF): Promise<Answer> =>
  https1(TCR_PATH, {
    body: JSON.stringify({
      apiVersion: 'login.concierge.sealion.dev/v1alpha1',
      kind: 'TokenCredentialRequest',
      spec: { token, authenticator: ref },
    }),
  });

/** The client certificate a TokenCredentialRequest issued, or undefined with the answer. */
async function credentialFor(token: string, ref: object = JWT_REF): Promise<Credential | Answer> {
  const answer = await tcr(token, ref);
  const credential = (
    JSON.parse(answer.body) as {
      status?: { credential?: { clientCertificateData: string; clientKeyData: string } };
    }
  ).status?.credential;
  if (!credential) return answer;
  return { certPem: credential.clientCertificateData, keyPem: keep(credential.clientKeyData) };
}

/** TokenCredentialRequest → client certificate → SelfSubjectReview with it; or the TokenCredentialRequest's answer. */
async function reviewWithCertificate(token: string, ref: object = JWT_REF, prefix = ''): Promise<Answer> {
  const credential = await credentialFor(token, ref);
  return 'status' in credential ? credential : review({ cert: credential, prefix });
}

/** A failed TokenCredentialRequest's answer for the authenticator `ref`: every failure with it must be this. */
const failedTCRBodies = new Map<string, Promise<string>>();
const failedTCRBody = (ref: object): Promise<string> => {
  const key = JSON.stringify(ref);
  if (!failedTCRBodies.has(key))
    failedTCRBodies.set(
      key,
      tcr('not-a-token-anyone-issued', ref).then((a) => a.body),
    );
  return failedTCRBodies.get(key)!;
};

// ---- Expected answers ----

interface UserView {
  username: string;
  uid?: string;
  groups: string[];
  extra?: Record<string, string[]>;
}

type Expected =
  /** A SelfSubjectReview answered by the API server, which saw exactly this user. */
  | { sees: UserView }
  /** The one 401, byte for byte. */
  | { unauthorized: true }
  /** A TokenCredentialRequest that failed, byte for byte as every other failure with the same authenticator. */
  | { tcrFailed: object }
  /** A Kubernetes Status with this code and reason, its message containing `says`. */
  | { status: number; reason: string; says?: string }
  /** A Namespace object, from the cluster that has it. */
  | { namespace: string }
  /** The API server's list of paths (its root). */
  | { root: true }
  /** The stream was reset: nothing was served. */
  | { reset: true };

const sees = (
  username: string,
  groups: string[] = [],
  more: Omit<UserView, 'username' | 'groups'> = {},
): Expected => ({
  sees: { username, ...more, groups: groups.includes(AUTHENTICATED) ? groups : [...groups, AUTHENTICATED] },
});
const SEES_USER = sees(USER, [READERS]);
const UNAUTHORIZED: Expected = { unauthorized: true };
const TCR_FAILED: Expected = { tcrFailed: JWT_REF };
const status = (code: number, reason: string, says?: string): Expected => ({
  status: code,
  reason,
  ...(says === undefined ? {} : { says }),
});

async function expectAnswer(answer: Answer, expected: Expected): Promise<void> {
  const context = `answer ${answer.status}: ${answer.body.slice(0, 600)}`;
  const expectCode = (code: number): void => {
    if (answer.status !== code) throw new Error(`expected ${code}, got ${context}`);
  };
  const json = (): Record<string, unknown> => {
    try {
      return JSON.parse(answer.body) as Record<string, unknown>;
    } catch {
      throw new Error(`not JSON: ${context}`);
    }
  };
  if ('sees' in expected) {
    expectCode(201);
    const userInfo = (json() as { status: { userInfo: UserView } }).status.userInfo;
    expect(userInfo).toEqual(expected.sees);
  } else if ('unauthorized' in expected) {
    expect({ status: answer.status, body: answer.body }).toEqual({ status: 401, body: unauthorizedBody });
  } else if ('tcrFailed' in expected) {
    expect({ status: answer.status, body: answer.body }).toEqual({
      status: 201,
      body: await failedTCRBody(expected.tcrFailed),
    });
    expect(json()).toMatchObject({ status: { message: 'authentication failed' } });
  } else if ('reset' in expected) {
    expectCode(0);
  } else if ('namespace' in expected) {
    expectCode(200);
    expect(json()).toMatchObject({ kind: 'Namespace', metadata: { name: expected.namespace } });
  } else if ('root' in expected) {
    expectCode(200);
    expect(json()['paths']).toEqual(expect.arrayContaining(['/api', '/apis']));
  } else {
    expectCode(expected.status);
    const body = json();
    expect(body).toMatchObject({ kind: 'Status', code: expected.status, reason: expected.reason });
    if (expected.says !== undefined) expect(String(body['message'])).toContain(expected.says);
  }
  // One request, one answer: a second answer on the connection means a request was smuggled in and served.
  expect(answer.next).toBeUndefined();
}

// ---- JWTs ----

/** Claims the corp JWTAuthenticator would accept, for hand-made tokens. */
const goodClaims = (): Record<string, unknown> => {
  const now = Math.floor(Date.now() / 1000);
  return {
    iss: issuer.url,
    aud: AUDIENCE,
    sub: USER,
    username: USER,
    groups: [READERS],
    iat: now,
    exp: now + 300,
  };
};
/** A JWT signed with HMAC-SHA256 under `secret`, naming the issuer's current key. */
const hs256 = (secret: string | Buffer): string => {
  const input = `${b64url({ alg: 'HS256', typ: 'JWT', kid: issuer.currentJWK().kid })}.${b64url(goodClaims())}`;
  return `${input}.${createHmac('sha256', secret).update(input).digest('base64url')}`;
};
const issuerPublicPem = (): string =>
  createPublicKey({ key: issuer.currentJWK(), format: 'jwk' }).export({
    type: 'spki',
    format: 'pem',
  }) as string;
const mint = async (
  claims: Record<string, unknown>,
  opts: Parameters<TestIssuer['mint']>[1] = {},
): Promise<string> => keep(await issuer.mint(claims, opts));

/** Tokens that must each get the one 401 as a bearer token, and "authentication failed" from TokenCredentialRequest. */
const BAD_TOKENS: [string, () => Promise<string> | string][] = [
  ['alg none, unsigned', () => `${b64url({ alg: 'none', typ: 'JWT' })}.${b64url(goodClaims())}.`],
  [
    'HS256 signed with the issuer’s public JWK as the HMAC secret (key confusion)',
    () => hs256(JSON.stringify(issuer.currentJWK())),
  ],
  [
    'HS256 signed with the issuer’s public key PEM as the HMAC secret (key confusion)',
    () => hs256(issuerPublicPem()),
  ],
  [
    'signed by a key the issuer never published, under an unknown kid',
    async () => {
      const key = await issuer.newKey();
      return mint({ username: USER, groups: [READERS] }, { signingKey: key });
    },
  ],
  [
    'signed by another key under the kid of the published one',
    async () => {
      const key = await issuer.newKey();
      return mint(
        { username: USER, groups: [READERS] },
        { signingKey: { ...key, kid: issuer.currentJWK().kid! } },
      );
    },
  ],
  [
    'from another issuer (iss names an issuer nobody configured)',
    () => mint({ username: USER, groups: [READERS] }, { issuer: 'https://issuer.example.com' }),
  ],
  ['for another audience', () => mint({ username: USER, groups: [READERS] }, { audience: 'someone-else' })],
  [
    'for several audiences, ours not among them',
    () => mint({ username: USER, groups: [READERS] }, { audience: ['a', 'b'] }),
  ],
  ['expired an hour ago', () => mint({ username: USER, groups: [READERS] }, { expiresIn: -3600 })],
  [
    'not valid for another hour (nbf)',
    () => mint({ username: USER, groups: [READERS] }, { notBefore: 3600 }),
  ],
  ['with a username claim that is not a string', () => mint({ username: 42, groups: [READERS] })],
  ['with groups that are not strings', () => mint({ username: USER, groups: [{ name: 'system:masters' }] })],
  ['with the signature cut off', async () => (await mint({ username: USER })).replace(/\.[^.]+$/, '.')],
  [
    'with its payload swapped for an admin’s, the signature kept',
    async () => {
      const [head, , signature] = (await mint({ username: USER })).split('.');
      return `${head}.${b64url({ ...goodClaims(), username: 'kubernetes-admin', groups: ['system:masters'] })}.${signature}`;
    },
  ],
  ['garbage', () => 'garbage'],
  ['three dots of garbage', () => 'a.b.c'],
  ['30 KiB of garbage (under the header limit, under the token limit)', () => 'x'.repeat(30 * 1024)],
  ['the edge cluster’s own service-account token', () => edgeToken],
];

// ---- Hostile identities ----

const hex = (text: string): string => Buffer.from(text, 'utf8').toString('hex');
/** What a hostile identity must come out as: exactly itself, or refused. */
type Verdict = 'exact' | 'refused';
const HOSTILE_IDENTITIES: [string, { username: string; groups: string[] }, Verdict][] = [
  [
    'a username starting with # (RFC 4514 hex DER of kubernetes-admin)',
    { username: `#0c10${hex('kubernetes-admin')}`, groups: [READERS] },
    'exact',
  ],
  [
    'a group starting with # (RFC 4514 hex DER of system:masters)',
    { username: USER, groups: [`#0c0e${hex('system:masters')}`] },
    'exact',
  ],
  [
    'a username that is an RFC 4514 subject naming system:masters',
    { username: 'CN=admin,O=system:masters', groups: [] },
    'exact',
  ],
  [
    'a username full of RFC 4514 specials ,+"\\<>;=',
    { username: 'a,b+c"d\\e<f>g;h=i', groups: ['x+O=system:masters'] },
    'exact',
  ],
  ['a username with a leading space', { username: ' kubernetes-admin', groups: [] }, 'refused'],
  ['a username with a trailing space', { username: 'kubernetes-admin ', groups: [] }, 'refused'],
  ['a group with a leading space', { username: USER, groups: [' system:masters'] }, 'refused'],
  [
    'a username with a newline and a header after it',
    { username: `${USER}\r\nImpersonate-Group: system:masters`, groups: [] },
    'refused',
  ],
  ['a username with a NUL', { username: `${USER}\u0000kubernetes-admin`, groups: [] }, 'refused'],
  ['a group with a tab', { username: USER, groups: ['system:\tmasters'] }, 'refused'],
  ['a username with DEL', { username: `${USER}\u007f`, groups: [] }, 'refused'],
  ['a username with a lone surrogate (broken Unicode)', { username: `${USER}\ud800`, groups: [] }, 'refused'],
  ['an empty group', { username: USER, groups: [''] }, 'refused'],
  ['a non-ASCII username (José)', { username: 'José', groups: [READERS] }, 'exact'],
  ['a non-ASCII username (東京)', { username: '東京', groups: ['東京-team'] }, 'exact'],
  [
    'a group ųystem:masters, whose low bytes spell system:masters',
    { username: USER, groups: ['ųystem:masters'] },
    'exact',
  ],
  ['a username ſystem:admin (long s, low byte 0x7f)', { username: 'ſystem:admin', groups: [] }, 'exact'],
  [
    'groups adding up to 33 KiB (over the identity limit, the token under the header limit)',
    { username: USER, groups: Array.from({ length: 33 }, (_, i) => `g${i}-${'x'.repeat(1000)}`) },
    'refused',
  ],
];
/** What each way in must answer for an identity that cannot reach the API server unchanged. */
const REFUSED_AS = { bearer: UNAUTHORIZED, certificate: TCR_FAILED };

// ---- Setup: one hub with the concierge, one edge with its agent, for the whole file ----

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-security-'));
  [hub, edge] = await Promise.all([
    startCluster({ name: 'sec-hub', controllerManager: false }),
    startCluster({ name: 'sec-edge', controllerManager: false }),
  ]);
  hubClients = newKubeClients({ path: hub.kubeconfigPath });
  [issuer, webhook] = await Promise.all([startOIDCIssuer({ audience: AUDIENCE }), startTokenWebhook()]);
  const log = newLogger({
    level: 'debug',
    destination: { write: (line: string) => void logLines.push(line) },
  });
  const must = async (cluster: Cluster, args: string[], input?: string): Promise<string> => {
    const result = await cluster.kubectl(args, input === undefined ? {} : { input });
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
    return result.stdout;
  };
  await must(hub, ['create', 'namespace', NS]);
  concierge = await startLocalConcierge(hub, {
    tunnel: { port: 0, namespace: NS },
    metrics: true,
    log,
  });
  tunnelPort = concierge.concierge.tunnel!.port;
  await applyJWTAuthenticator(hub, 'corp', issuer, AUDIENCE);
  await must(
    hub,
    ['apply', '-f', '-'],
    JSON.stringify({
      apiVersion: `${GROUP}/v1alpha1`,
      kind: 'WebhookAuthenticator',
      metadata: { name: 'hooks' },
      spec: { endpoint: webhook.url, tls: { certificateAuthorityData: webhook.caData } },
    }),
  );
  for (const cluster of [hub, edge]) {
    await must(cluster, ['create', 'clusterrole', 'ns-reader', '--verb=get,list', '--resource=namespaces']);
    await must(cluster, [
      'create',
      'clusterrolebinding',
      'readers',
      '--clusterrole=ns-reader',
      `--group=${READERS}`,
    ]);
  }
  // Only the edge lets readers see its root, so an answer listing paths came from the edge.
  await must(edge, ['create', 'clusterrole', 'root-reader', '--verb=get', '--non-resource-url=/']);
  await must(edge, [
    'create',
    'clusterrolebinding',
    'root-readers',
    '--clusterrole=root-reader',
    `--group=${READERS}`,
  ]);
  await must(hub, ['create', 'namespace', 'only-on-hub']);
  await must(edge, ['create', 'namespace', 'only-on-edge']);
  await must(hub, ['create', 'serviceaccount', 'root', '-n', 'kube-system']);
  await must(hub, [
    'create',
    'clusterrolebinding',
    'root',
    '--clusterrole=cluster-admin',
    '--serviceaccount=kube-system:root',
  ]);
  await must(hub, ['create', 'serviceaccount', 'robot', '-n', 'kube-system']);
  await must(edge, ['create', 'serviceaccount', 'robot', '-n', 'kube-system']);
  rootToken = keep((await must(hub, ['create', 'token', 'root', '-n', 'kube-system'])).trim());
  robotToken = keep((await must(hub, ['create', 'token', 'robot', '-n', 'kube-system'])).trim());
  edgeToken = keep((await must(edge, ['create', 'token', 'robot', '-n', 'kube-system'])).trim());
  userToken = await mint({ username: USER, groups: [READERS] }, { expiresIn: 3600 });

  // The edge cluster: registered on the hub, its agent in this process, dialing out.
  const agentKubeconfig = await prepareAgentCluster(edge, AGENT_NS);
  await must(
    hub,
    ['apply', '-f', '-'],
    JSON.stringify({
      apiVersion: `${TUNNEL_GROUP}/v1alpha1`,
      kind: 'Cluster',
      metadata: { name: EDGE },
      spec: {},
    }),
  );
  const bootstrap = keep((await createBootstrapToken(hubClients, NS, EDGE)).token);
  const upstream = agentUpstream(agentKubeconfig);
  keep(upstream.keyPem!);
  agent = newAgent({
    // One hub replica here: one tunnel.
    tunnels: 1,
    cluster: EDGE,
    hub: new URL(`https://127.0.0.1:${tunnelPort}`),
    trust: { caPem: concierge.concierge.tunnel!.caPem },
    bootstrapToken: () => bootstrap,
    store: {
      load: () => Promise.resolve(agentCredentials),
      save: (c) => {
        agentCredentials = c;
        keep(c.keyPem);
        return Promise.resolve();
      },
    },
    upstream,
    version: 'security-test',
    log: log.child({ component: 'agent' }),
  });
  await agent.start();
  const secret = (await readSecretData(hubClients, NS, TUNNEL_CA_SECRET))!;
  tunnelCA = await loadCA(secret['tls.crt']!, keep(secret['tls.key']!));
  keep(concierge.signerCA.keyPem);

  // Ready when both authenticators answer and the edge answers through its tunnel.
  await eventually(async () => {
    expect((await review({ headers: bearer(userToken) })).status).toBe(201);
    expect((await review({ headers: bearer(webhook.grant({ username: 'probe' })) })).status).toBe(201);
    const throughEdge = await get('/clusters/edge/api/v1/namespaces/only-on-edge');
    if (throughEdge.status !== 200)
      throw new Error(`the edge is not reachable yet: ${throughEdge.status} ${throughEdge.body}`);
  }, 60_000);
  unauthorizedBody = (await https1('/api/v1/namespaces')).body;
  expect(JSON.parse(unauthorizedBody)).toMatchObject({ kind: 'Status', code: 401, reason: 'Unauthorized' });
}, 180_000);

afterAll(async () => {
  await agent?.stop();
  await concierge?.stop();
  await Promise.all([issuer?.stop(), webhook?.stop()]);
  await Promise.all([hub?.stop(), edge?.stop()]);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

// ---- The table ----

describe('header smuggling: nothing the caller sends in these headers reaches the API server as sent', () => {
  const ADMIN_SUBPROTOCOL = (): string =>
    `base64url.bearer.authorization.k8s.io.${b64url(rootToken).replace(/=+$/, '')}`;
  it.each<[string, () => Promise<Answer>, () => Expected]>([
    [
      'Impersonate-User in odd case, from a user RBAC does not let impersonate',
      () => raw(rawReview(['iMPERSONATE-uSER: kubernetes-admin'])),
      // The first mode that applies, user-info, refuses first, as the API server's own answer does.
      () => status(403, 'Forbidden', `User "${USER}" cannot impersonate-on:user-info:create`),
    ],
    [
      'Impersonate-Group: system:masters without Impersonate-User',
      () => raw(rawReview(['Impersonate-Group: system:masters'])),
      () => status(400, 'BadRequest', 'without impersonating a user name'),
    ],
    [
      'Impersonate-Extra-scopes without Impersonate-User',
      () => raw(rawReview(['Impersonate-Extra-Scopes: all'])),
      () => status(400, 'BadRequest', 'without impersonating a user name'),
    ],
    [
      'Impersonate-Uid without Impersonate-User',
      () => raw(rawReview(['Impersonate-Uid: 0'])),
      () => status(400, 'BadRequest', 'without impersonating a user name'),
    ],
    [
      'Impersonate_User with an underscore',
      () => raw(rawReview(['Impersonate_User: kubernetes-admin', 'Impersonate_Group: system:masters'])),
      () => SEES_USER,
    ],
    [
      'X-Remote-User and X-Remote-Group: system:masters (the front-proxy headers)',
      () =>
        raw(
          rawReview([
            'X-Remote-User: kubernetes-admin',
            'X-Remote-Group: system:masters',
            'X-Remote-Extra-Scopes: all',
          ]),
        ),
      () => SEES_USER,
    ],
    [
      'X-REMOTE-USER in odd case, twice',
      () => raw(rawReview(['X-REMOTE-USER: kubernetes-admin', 'x-remote-user: root'])),
      () => SEES_USER,
    ],
    [
      'X-Forwarded-User, X-Forwarded-For, Forwarded, X-Real-Ip',
      () =>
        raw(
          rawReview([
            'X-Forwarded-User: kubernetes-admin',
            'X-Forwarded-For: 10.0.0.1',
            'Forwarded: for=10.0.0.1;by=apiserver',
            'X-Real-Ip: 10.0.0.1',
          ]),
        ),
      () => SEES_USER,
    ],
    [
      'Authorization twice: the user’s token, then a cluster-admin’s',
      () => raw(rawReview([`authorization: Bearer ${rootToken}`])),
      () => SEES_USER,
    ],
    [
      'Authorization twice: garbage first, then the user’s token',
      () =>
        raw(
          rawReview(['Authorization: Bearer garbage', `Authorization: Bearer ${userToken}`], { token: '' }),
        ),
      () => UNAUTHORIZED,
    ],
    [
      'AUTHORIZATION in upper case with a lower-case scheme',
      () => raw(rawReview([`AUTHORIZATION: bearer ${userToken}`], { token: '' })),
      () => SEES_USER,
    ],
    [
      'Proxy-Authorization carrying a cluster-admin’s token, and no Authorization',
      () => raw(rawReview([`Proxy-Authorization: Bearer ${rootToken}`], { token: '' })),
      () => UNAUTHORIZED,
    ],
    [
      'Connection: close, impersonate-user, impersonate-group, authorization (asking a hop to drop the proxy’s own headers)',
      () => raw(rawReview(['Connection: close, impersonate-user, impersonate-group, authorization'])),
      () => SEES_USER,
    ],
    [
      'Keep-Alive and Proxy-Connection naming Impersonate-User',
      () => raw(rawReview(['Keep-Alive: timeout=5', 'Proxy-Connection: impersonate-user'])),
      () => SEES_USER,
    ],
    [
      'a folded header line (obs-fold) hiding Impersonate-User',
      () => raw(rawReview(['X-Note: hello', ' Impersonate-User: kubernetes-admin'])),
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'a header name with a space before the colon',
      () => raw(rawReview(['Impersonate-User : kubernetes-admin'])),
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'a bare LF line ending smuggling a header',
      () => raw(rawReview(['X-Note: a\nImpersonate-User: kubernetes-admin'])),
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'Transfer-Encoding: chunked with a Content-Length, a second request smuggled in the body',
      () => {
        const smuggled = rawReview(['Impersonate-User: kubernetes-admin'], { close: false });
        return raw(
          `POST ${SSR_PATH} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n${smuggled}`,
        );
      },
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'Content-Length twice with different values',
      () => raw(rawReview(['Content-Length: 0'])),
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'Transfer-Encoding: chunked, identity (chunked not last)',
      () =>
        raw(
          `POST ${SSR_PATH} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nTransfer-Encoding: chunked, identity\r\nConnection: close\r\n\r\n${SSR_BODY}`,
        ),
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'Transfer-Encoding: xchunked',
      () =>
        raw(
          `POST ${SSR_PATH} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nTransfer-Encoding: xchunked\r\nConnection: close\r\n\r\n${SSR_BODY}`,
        ),
      () => status(400, 'BadRequest', 'malformed HTTP request'),
    ],
    [
      'chunked trailers carrying Impersonate-User and Authorization',
      () => {
        const body = `${Buffer.byteLength(SSR_BODY).toString(16)}\r\n${SSR_BODY}\r\n0\r\nImpersonate-User: kubernetes-admin\r\nAuthorization: Bearer ${rootToken}\r\n\r\n`;
        return raw(
          `POST ${SSR_PATH} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nAuthorization: Bearer ${userToken}\r\nTrailer: Impersonate-User, Authorization\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${body}`,
        );
      },
      () => SEES_USER,
    ],
    [
      'HTTP/2 trailers carrying Impersonate-User and Authorization',
      () =>
        h2(SSR_PATH, {
          headers: bearer(userToken),
          body: SSR_BODY,
          trailers: { 'impersonate-user': 'kubernetes-admin', authorization: `Bearer ${rootToken}` },
        }),
      () => SEES_USER,
    ],
    [
      'HTTP/2 x-remote-user, impersonate_user, x-forwarded-for',
      () =>
        h2(SSR_PATH, {
          headers: {
            ...bearer(userToken),
            'x-remote-user': 'kubernetes-admin',
            'x-remote-group': 'system:masters',
            impersonate_user: 'kubernetes-admin',
            'x-forwarded-for': '10.0.0.1',
          },
          body: SSR_BODY,
        }),
      () => SEES_USER,
    ],
    [
      // The API server reads a field as sent; Node's HTTP/2 would drop it unread (RFC 9113's whitespace check), and
      // the request would be served as the caller.
      'HTTP/2 Impersonate-Uid ending in a space, without Impersonate-User',
      () => h2(SSR_PATH, { headers: { ...bearer(userToken), 'impersonate-uid': 'Bearer ' }, body: SSR_BODY }),
      () => status(400, 'BadRequest', 'without impersonating a user name'),
    ],
    [
      'HTTP/2 Impersonate-User starting with a space, from a user RBAC does not let impersonate',
      () =>
        h2(SSR_PATH, {
          headers: { ...bearer(userToken), 'impersonate-user': ' kubernetes-admin' },
          body: SSR_BODY,
        }),
      () => status(403, 'Forbidden', `User "${USER}" cannot impersonate-on:user-info:create`),
    ],
    [
      'HTTP/2 with a Content-Length smaller than the body',
      () => h2(SSR_PATH, { headers: { ...bearer(userToken), 'content-length': '2' }, body: SSR_BODY }),
      () => ({ reset: true }),
    ],
    [
      'HTTP/2 :path in absolute form',
      () => h2(`https://127.0.0.1/api/v1/namespaces/only-on-hub`, { headers: bearer(userToken) }),
      () => ({ reset: true }),
    ],
    [
      'an upgrade whose Sec-WebSocket-Protocol carries a cluster-admin’s token as a bearer subprotocol',
      () =>
        raw(
          `GET /api/v1/namespaces/kube-system/secrets HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2VjdXJpdHktc3VpdGUhIQ==\r\nSec-WebSocket-Protocol: ${ADMIN_SUBPROTOCOL()}, v4.channel.k8s.io\r\n\r\n`,
        ),
      () => status(403, 'Forbidden', `User "${USER}" cannot list resource "secrets"`),
    ],
    [
      'an upgrade with Impersonate-User listed in Connection',
      () =>
        raw(
          `GET /api/v1/namespaces/kube-system/secrets HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nConnection: Upgrade, impersonate-user, impersonate-group\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2VjdXJpdHktc3VpdGUhIQ==\r\n\r\n`,
        ),
      () => status(403, 'Forbidden', `User "${USER}" cannot list resource "secrets"`),
    ],
  ])('%s', async (_name, attack, expected) => {
    await expectAnswer(await attack(), expected());
  });

  it('answers a request pipelined after the user’s on the same connection on its own credentials: none', async () => {
    const first = rawReview([], { close: false });
    const second = rawReview([], { token: '' });
    const answer = await raw(first + second);
    const { next, ...firstAnswer } = answer;
    await expectAnswer(firstAnswer, SEES_USER);
    expect(next).toBeDefined();
    await expectAnswer(next!, UNAUTHORIZED);
  });
});

describe('JWTs: every forged, foreign or stale token gets the one 401, and TokenCredentialRequest the one failure', () => {
  it.each(BAD_TOKENS)('%s', async (_name, make) => {
    const token = keep(await make());
    await expectAnswer(await review({ headers: bearer(token) }), UNAUTHORIZED);
    await expectAnswer(await h2(SSR_PATH, { headers: bearer(token), body: SSR_BODY }), UNAUTHORIZED);
    await expectAnswer(await tcr(token), TCR_FAILED);
  });

  it.each<[string, Record<string, string>, Expected]>([
    ['no credentials at all', {}, UNAUTHORIZED],
    ['Basic credentials', { authorization: 'Basic a3ViZXJuZXRlcy1hZG1pbjpwYXNz' }, UNAUTHORIZED],
    ['Bearer with no token', { authorization: 'Bearer ' }, UNAUTHORIZED],
    ['Bearer with two tokens', { authorization: `Bearer ${'x'} ${'y'}` }, UNAUTHORIZED],
    [
      'a token over the header limit: refused before anything reads it',
      { authorization: `Bearer ${'x'.repeat(HEADER_LIMIT)}` },
      status(431, 'RequestHeaderFieldsTooLarge'),
    ],
  ])('%s', async (_name, headers, expected) => {
    await expectAnswer(await review({ headers }), expected);
  });

  it('a token over 64 KiB in a TokenCredentialRequest', async () => {
    await expectAnswer(await tcr(`${'x'.repeat(64 * 1024)}.${'y'.repeat(64)}.z`), TCR_FAILED);
  });
});

describe('hostile identities from a real authenticator reach the API server exactly, or not at all', () => {
  const cases = HOSTILE_IDENTITIES.flatMap(([name, identity, verdict]) =>
    (['bearer', 'certificate'] as const).map(
      (path) =>
        [
          `${name}, by ${path === 'bearer' ? 'bearer JWT' : 'TokenCredentialRequest certificate'}`,
          identity,
          path,
          verdict,
        ] as const,
    ),
  );
  it.each(cases)('%s', async (_name, identity, path, verdict) => {
    const token = await mint(identity, { expiresIn: 600 });
    // Tokens over the proxy's header limit never get as far as authentication.
    const tooBig = path === 'bearer' && token.length > HEADER_LIMIT;
    const answer =
      path === 'bearer' ? await review({ headers: bearer(token) }) : await reviewWithCertificate(token);
    const expected =
      verdict === 'exact'
        ? sees(identity.username, identity.groups)
        : tooBig
          ? status(431, 'RequestHeaderFieldsTooLarge')
          : REFUSED_AS[path];
    await expectAnswer(answer, expected);
  });

  it.each<[string, Parameters<TokenWebhook['grant']>[0], { bearer: Expected; certificate: Expected }]>([
    [
      'a webhook user with a 64 KiB username',
      { username: 'a'.repeat(64 * 1024), groups: [] },
      { bearer: UNAUTHORIZED, certificate: { tcrFailed: WEBHOOK_REF } },
    ],
    [
      'a webhook user in ųystem:masters and #-groups',
      {
        username: `#0c10${hex('kubernetes-admin')}`,
        groups: ['ųystem:masters', `#0c0e${hex('system:masters')}`],
      },
      {
        bearer: sees(`#0c10${hex('kubernetes-admin')}`, ['ųystem:masters', `#0c0e${hex('system:masters')}`]),
        certificate: sees(`#0c10${hex('kubernetes-admin')}`, [
          'ųystem:masters',
          `#0c0e${hex('system:masters')}`,
        ]),
      },
    ],
    [
      'a webhook user with extras (a certificate cannot carry them)',
      { username: 'scoped', groups: [READERS], extra: { 'example.com/scopes': ['read-only'] } },
      {
        bearer: sees('scoped', [READERS], { extra: { 'example.com/scopes': ['read-only'] } }),
        certificate: { tcrFailed: WEBHOOK_REF },
      },
    ],
    [
      // Constrained impersonation, which the forwarding identity holds, takes only lower-case, domain-prefixed extra
      // keys: the API server itself refuses the rest, and says so.
      'a webhook user with an extra key that is not a domain-prefixed path',
      { username: 'scoped', groups: [READERS], extra: { scopes: ['read-only'] } },
      {
        bearer: status(403, 'Forbidden', 'only the legacy impersonate verb can carry it'),
        certificate: { tcrFailed: WEBHOOK_REF },
      },
    ],
    [
      'a webhook user with a uid (a certificate cannot carry it)',
      { username: 'with-uid', uid: 'u-1', groups: [] },
      { bearer: sees('with-uid', [], { uid: 'u-1' }), certificate: { tcrFailed: WEBHOOK_REF } },
    ],
    [
      'a webhook user whose extra key has a newline',
      { username: 'x', groups: [], extra: { 'a\nb': ['c'] } },
      { bearer: UNAUTHORIZED, certificate: { tcrFailed: WEBHOOK_REF } },
    ],
  ])('%s', async (_name, user, expected) => {
    const token = keep(webhook.grant(user));
    await expectAnswer(await review({ headers: bearer(token) }), expected.bearer);
    await expectAnswer(await reviewWithCertificate(token, WEBHOOK_REF), expected.certificate);
  });

  it('a webhook user in 800 groups is served on the hub and through the agent; one whose fields HTTP/2 could not send gets 431, and nobody else loses a request', async () => {
    const groups = [READERS, ...Array.from({ length: 799 }, (_, i) => `group-${i}`.padEnd(40, '-'))];
    const many = keep(webhook.grant({ username: 'many-groups', groups }));
    // 3,000 one-letter groups: 3 KB of names, but a field each, over what Node's HTTP/2 sends in one block.
    const tooMany = keep(
      webhook.grant({
        username: 'too-many-groups',
        groups: Array.from({ length: 3000 }, (_, i) => `${i % 10}`),
      }),
    );
    for (const prefix of ['', `/clusters/${EDGE}`]) {
      await expectAnswer(await review({ headers: bearer(many), prefix }), sees('many-groups', groups));
      // An upgrade goes on as HTTP/1.1, through the agent's local proxy on the edge: its fields are taken whole too.
      const upgrade = await raw(
        `GET ${prefix}/api/v1/namespaces/default HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${many}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2VjdXJpdHktc3VpdGUhIQ==\r\n\r\n`,
      );
      await expectAnswer(upgrade, { namespace: 'default' });
      const [refused, others] = await Promise.all([
        review({ headers: bearer(tooMany), prefix }),
        Promise.all(Array.from({ length: 4 }, () => review({ headers: bearer(userToken), prefix }))),
      ]);
      await expectAnswer(
        refused,
        status(431, 'RequestHeaderFieldsTooLarge', 'one per group and extra value'),
      );
      for (const answer of others) await expectAnswer(answer, SEES_USER);
    }
  });

  it.each<[string, { username: string; groups: string[] }]>([
    ['ųystem:masters', { username: 'José', groups: ['ųystem:masters'] }],
    ['#-hex usernames', { username: `#0c10${hex('kubernetes-admin')}`, groups: [READERS] }],
  ])('through the agent to the edge, by bearer and by certificate: %s', async (_name, identity) => {
    const token = await mint(identity, { expiresIn: 600 });
    const prefix = `/clusters/${EDGE}`;
    await expectAnswer(
      await review({ headers: bearer(token), prefix }),
      sees(identity.username, identity.groups),
    );
    await expectAnswer(
      await reviewWithCertificate(token, JWT_REF, prefix),
      sees(identity.username, identity.groups),
    );
  });
});

describe('client certificates: only the signer CA’s, and only while valid', () => {
  const tunnelDial = (path: string, cert?: Credential): Promise<number> =>
    new Promise((done) => {
      const ws = new WebSocket(`wss://127.0.0.1:${tunnelPort}${path}`, {
        ca: tunnelCA.certPem,
        headers: { [TUNNEL_PROTOCOL_HEADER]: TUNNEL_PROTOCOL },
        ...(cert ? { cert: cert.certPem, key: cert.keyPem } : {}),
      });
      ws.once('open', () => {
        ws.close();
        done(101);
      });
      ws.once('unexpected-response', (_req, res) => done(res.statusCode ?? 0));
      ws.once('error', () => done(0));
    });
  const renew = (cert: Credential): Promise<number> =>
    new Promise((done, fail) => {
      void newCSR(EDGE).then(({ csrPem }) => {
        const req = httpsRequest(
          {
            host: '127.0.0.1',
            port: tunnelPort,
            path: '/renew',
            method: 'POST',
            ca: tunnelCA.certPem,
            cert: cert.certPem,
            key: cert.keyPem,
            agent: false,
          },
          (res) => {
            res.resume();
            done(res.statusCode ?? 0);
          },
        );
        req.on('error', fail);
        req.end(JSON.stringify({ csr: csrPem }));
      });
    });
  const withKey = async (
    ca: CertificateAuthority,
    req: Parameters<typeof issueCert>[1],
  ): Promise<Credential> => {
    const cert = await issueCert(ca, req);
    return { certPem: cert.certPem, keyPem: keep(cert.keyPem) };
  };

  it.each<[string, () => Promise<Answer>, () => Expected]>([
    [
      'a certificate from another CA naming kubernetes-admin in system:masters',
      async () =>
        review({
          cert: await withKey(await newCA('sealion-proxy-signer-ca'), {
            commonName: 'kubernetes-admin',
            organizations: ['system:masters'],
            usage: 'client',
          }),
        }),
      () => UNAUTHORIZED,
    ],
    [
      'the hub API server’s own admin certificate (system:masters)',
      async () =>
        review({
          cert: await withKey(hub.ca, {
            commonName: 'kubernetes-admin',
            organizations: ['system:masters'],
            usage: 'client',
          }),
        }),
      () => UNAUTHORIZED,
    ],
    [
      'a signer-CA certificate that expired a minute ago',
      async () =>
        review({
          cert: await withKey(concierge.signerCA, {
            commonName: USER,
            organizations: [READERS],
            usage: 'client',
            validityMs: -60_000,
          }),
        }),
      () => UNAUTHORIZED,
    ],
    [
      'a signer-CA certificate for servers only',
      async () =>
        review({
          cert: await withKey(concierge.signerCA, {
            commonName: USER,
            organizations: [READERS],
            usage: 'server',
            hosts: ['localhost'],
          }),
        }),
      () => UNAUTHORIZED,
    ],
    [
      'an agent’s certificate (tunnel CA) at the proxy',
      async () => review({ cert: await withKey(tunnelCA, { commonName: EDGE, usage: 'client' }) }),
      () => UNAUTHORIZED,
    ],
    [
      'an agent’s certificate at the proxy with the user’s token: the token’s user, never the cluster',
      async () =>
        review({
          cert: await withKey(tunnelCA, { commonName: EDGE, usage: 'client' }),
          headers: bearer(userToken),
        }),
      () => SEES_USER,
    ],
    [
      'a signer-CA certificate: its user, whatever bearer token comes with it',
      async () =>
        review({
          cert: await withKey(concierge.signerCA, {
            commonName: USER,
            organizations: [READERS],
            usage: 'client',
          }),
          headers: bearer(rootToken),
        }),
      () => SEES_USER,
    ],
    [
      'a TokenCredentialRequest certificate on /clusters/edge: the same user, judged by the edge',
      async () => reviewWithCertificate(userToken, JWT_REF, `/clusters/${EDGE}`),
      () => SEES_USER,
    ],
  ])('%s', async (_name, attack, expected) => {
    await expectAnswer(await attack(), expected());
  });

  it.each<[string, () => Promise<number>, number]>([
    [
      'a proxy (signer CA) certificate at the tunnel listener’s /connect',
      async () =>
        tunnelDial('/connect', await withKey(concierge.signerCA, { commonName: EDGE, usage: 'client' })),
      401,
    ],
    [
      'a proxy (signer CA) certificate at /renew',
      async () => renew(await withKey(concierge.signerCA, { commonName: EDGE, usage: 'client' })),
      401,
    ],
    [
      'a TokenCredentialRequest certificate at /connect',
      async () => {
        const credential = await credentialFor(userToken);
        return tunnelDial('/connect', credential as Credential);
      },
      401,
    ],
    [
      'a tunnel-CA certificate for a cluster nobody registered',
      async () =>
        tunnelDial('/connect', await withKey(tunnelCA, { commonName: 'not-registered', usage: 'client' })),
      401,
    ],
    [
      'a tunnel-CA certificate that is not for client authentication',
      async () =>
        tunnelDial(
          '/connect',
          await withKey(tunnelCA, { commonName: EDGE, usage: 'server', hosts: ['localhost'] }),
        ),
      401,
    ],
    [
      'an expired tunnel-CA certificate',
      async () =>
        tunnelDial(
          '/connect',
          await withKey(tunnelCA, { commonName: EDGE, usage: 'client', validityMs: -60_000 }),
        ),
      401,
    ],
    ['no certificate at /connect', () => tunnelDial('/connect'), 401],
    [
      'a path other than /connect',
      async () => tunnelDial('/tunnel', await withKey(tunnelCA, { commonName: EDGE, usage: 'client' })),
      404,
    ],
  ])('%s', async (_name, attack, expected) => {
    expect(await attack()).toBe(expected);
  });

  // A Cluster's agent certificates are bound to the Cluster object (its UID), not only its name: removing a cluster and
  // adding one of the same name (another cluster, maybe) must not let the removed cluster's agent back in to hold the
  // new cluster's tunnel and see every request sent to it.
  it('refuses the certificate of a removed cluster after a cluster of the same name is added again', async () => {
    const name = 'rebound';
    const clusterObject = JSON.stringify({
      apiVersion: `${TUNNEL_GROUP}/v1alpha1`,
      kind: 'Cluster',
      metadata: { name },
      spec: {},
    });
    await hub.kubectl(['apply', '-f', '-'], { input: clusterObject });
    const register = async (): Promise<{ code: number; certificate?: string; keyPem: string }> => {
      const { token } = await createBootstrapToken(hubClients, NS, name);
      const { csrPem, keyPem } = await newCSR(name);
      const answer = await registerAt({ cluster: name, token: keep(token), csr: csrPem });
      return {
        code: answer.status,
        keyPem,
        ...(answer.status === 200
          ? { certificate: (JSON.parse(answer.body) as { certificate: string }).certificate }
          : {}),
      };
    };
    const old = await eventually(async () => {
      const registered = await register();
      expect(registered.code).toBe(200);
      return { certPem: registered.certificate!, keyPem: keep(registered.keyPem) };
    });
    expect(await tunnelDial('/connect', old)).toBe(101);
    await hub.kubectl(['delete', `clusters.${TUNNEL_GROUP}`, name]);
    await eventually(async () => expect(await tunnelDial('/connect', old)).toBe(401));
    // Added again: a new Cluster object. Once the listener knows it (a registration for it succeeds), the old
    // cluster's certificate must still be refused.
    await hub.kubectl(['apply', '-f', '-'], { input: clusterObject });
    await eventually(async () => expect((await register()).code).toBe(200));
    expect(await tunnelDial('/connect', old)).toBe(401);
  });
});

describe('/clusters/ paths: a clear Status, and never another cluster or the hub’s API server on the wrong path', () => {
  const upgrade = (target: string): Promise<Answer> =>
    raw(
      `GET ${target} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2VjdXJpdHktc3VpdGUhIQ==\r\n\r\n`,
    );
  const get = (path: string): Promise<Answer> =>
    raw(
      `GET ${path} HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${userToken}\r\nConnection: close\r\n\r\n`,
    );
  /** The API server's refusal names the path it was asked for: for a routed request, without the /clusters/ prefix. */
  const pathRefused = (path: string): Expected =>
    status(403, 'Forbidden', `User "${USER}" cannot get path "${path}"`);
  const notConnected = (name: string): Expected =>
    status(503, 'ServiceUnavailable', `cluster ${name} is not connected`);

  it.each<[string, () => Promise<Answer>, Expected]>([
    [
      '/clusters/edge/…: the edge’s own namespace',
      () => get('/clusters/edge/api/v1/namespaces/only-on-edge'),
      { namespace: 'only-on-edge' },
    ],
    [
      '/clusters/edge/… for the hub’s namespace: the edge says it has none',
      () => get('/clusters/edge/api/v1/namespaces/only-on-hub'),
      status(404, 'NotFound', 'namespaces "only-on-hub" not found'),
    ],
    [
      'the hub’s own path for the edge’s namespace: the hub says it has none',
      () => get('/api/v1/namespaces/only-on-edge'),
      status(404, 'NotFound', 'namespaces "only-on-edge" not found'),
    ],
    ['/clusters/../api', () => get('/clusters/../api/v1/namespaces/only-on-hub'), notConnected('..')],
    [
      '/clusters/%2e%2e/api',
      () => get('/clusters/%2e%2e/api/v1/namespaces/only-on-hub'),
      notConnected('%2e%2e'),
    ],
    [
      '/clusters//api (no name)',
      () => get('/clusters//api/v1/namespaces/only-on-hub'),
      pathRefused('/clusters//api/v1/namespaces/only-on-hub'),
    ],
    ['/clusters/ (nothing after)', () => get('/clusters/'), pathRefused('/clusters/')],
    [
      '/clusters/edge%2F..%2F/api (encoded slashes)',
      () => get('/clusters/edge%2F..%2F/api/v1/namespaces/only-on-hub'),
      notConnected('edge%2F..%2F'),
    ],
    [
      '/clusters/edge%2Fapi%2Fv1%2Fnamespaces%2Fonly-on-edge (the whole path encoded)',
      () => get('/clusters/edge%2Fapi%2Fv1%2Fnamespaces%2Fonly-on-edge'),
      notConnected('edge%2Fapi%2Fv1%2Fnamespaces%2Fonly-on-edge'),
    ],
    [
      '/clusters/edge/../../api/… (the edge’s path climbing out)',
      () => get('/clusters/edge/../../api/v1/namespaces/only-on-hub'),
      pathRefused('/../../api/v1/namespaces/only-on-hub'),
    ],
    [
      '/clusters/EDGE (case)',
      () => get('/clusters/EDGE/api/v1/namespaces/only-on-edge'),
      notConnected('EDGE'),
    ],
    [
      '/clusters/Edge_1 (not a DNS label)',
      () => get('/clusters/Edge_1/api/v1/namespaces/only-on-edge'),
      notConnected('Edge_1'),
    ],
    [
      '/clusters/ with a 16 KiB name',
      () => get(`/clusters/${'a'.repeat(16 * 1024)}/api`),
      notConnected('a'.repeat(16 * 1024)),
    ],
    ['/clusters/edge with no trailing path: the edge’s root', () => get('/clusters/edge'), { root: true }],
    [
      '/clusters/edge?/clusters/hub/api/… (a path smuggled in the query)',
      () => get('/clusters/edge?/api/v1/namespaces/only-on-hub'),
      { root: true },
    ],
    [
      '/api/…?/clusters/edge/… (a route smuggled in the query)',
      () => get('/api/v1/namespaces/only-on-edge?/clusters/edge/api/v1/namespaces/only-on-edge'),
      status(404, 'NotFound', 'namespaces "only-on-edge" not found'),
    ],
    [
      '/Clusters/edge/… (case of the prefix)',
      () => get('/Clusters/edge/api/v1/namespaces/only-on-edge'),
      pathRefused('/Clusters/edge/api/v1/namespaces/only-on-edge'),
    ],
    [
      '/%63lusters/edge/… (the prefix percent-encoded)',
      () => get('/%63lusters/edge/api/v1/namespaces/only-on-edge'),
      pathRefused('/clusters/edge/api/v1/namespaces/only-on-edge'),
    ],
    [
      'an absolute-form request naming /clusters/edge',
      () => get(`https://127.0.0.1/clusters/edge/api/v1/namespaces/only-on-edge`),
      status(400, 'BadRequest', 'malformed request path'),
    ],
    [
      'HTTP/2 :path /clusters/edge/…',
      () => h2('/clusters/edge/api/v1/namespaces/only-on-edge', { headers: bearer(userToken) }),
      { namespace: 'only-on-edge' },
    ],
    [
      'a hub service-account token on /clusters/edge',
      () => https1('/clusters/edge/api/v1/namespaces/only-on-edge', { headers: bearer(robotToken) }),
      SA_TOKEN_ON_EDGE,
    ],
    [
      'the edge’s own service-account token on /clusters/edge',
      () => https1('/clusters/edge/api/v1/namespaces/only-on-edge', { headers: bearer(edgeToken) }),
      UNAUTHORIZED,
    ],
    [
      'an upgrade on /clusters/%2e%2e/…',
      () => upgrade('/clusters/%2e%2e/api/v1/namespaces/only-on-hub'),
      notConnected('%2e%2e'),
    ],
    [
      'an upgrade on /clusters/edge/../../… (the edge’s path climbing out)',
      () => upgrade('/clusters/edge/../../api/v1/namespaces/only-on-hub'),
      pathRefused('/../../api/v1/namespaces/only-on-hub'),
    ],
    [
      'an upgrade in absolute form naming /clusters/edge',
      () => upgrade(`https://127.0.0.1/clusters/edge/api/v1/namespaces/only-on-edge`),
      // As the plain path does: a target that is not a path is no request of any cluster's.
      status(400, 'BadRequest', 'malformed request path'),
    ],
    [
      'an upgrade with a hub service-account token on /clusters/edge',
      () =>
        raw(
          `GET /clusters/edge/api/v1/namespaces HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer ${robotToken}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: c2VjdXJpdHktc3VpdGUhIQ==\r\n\r\n`,
        ),
      SA_TOKEN_ON_EDGE,
    ],
  ])('%s', async (_name, attack, expected) => {
    await expectAnswer(await attack(), expected);
  });
});

describe('hub workloads: a hub service account’s token for Sealion’s audience acts on the edge under its Cluster’s prefix, and nowhere else', () => {
  const WORKLOAD_AUDIENCE = 'workloads.concierge.sealion.dev';
  const PREFIX = 'hub:';
  const ORIGINAL = 'impersonation-proxy.concierge.sealion.dev/original-user-info';
  /** The hub's robot, as the edge sees it: every name behind the prefix, none of them one of the edge's own. */
  const ROBOT = `${PREFIX}system:serviceaccount:kube-system:robot`;
  const ROBOT_GROUPS = [`${PREFIX}system:serviceaccounts`, `${PREFIX}system:serviceaccounts:kube-system`];
  const kubectl = async (cluster: Cluster, args: string[], input?: string): Promise<string> => {
    const result = await cluster.kubectl(args, input === undefined ? {} : { input });
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
    return result.stdout;
  };
  /** A token of a hub service account for Sealion's audience (`more`: kubectl create token's other flags). */
  const workloadToken = async (namespace: string, name: string, more: string[] = []): Promise<string> =>
    keep(
      (
        await kubectl(hub, [
          'create',
          'token',
          name,
          '-n',
          namespace,
          `--audience=${WORKLOAD_AUDIENCE}`,
          ...more,
        ])
      ).trim(),
    );
  const setPrefix = (workloads: object | null): Promise<string> =>
    kubectl(hub, [
      'patch',
      'clusters.tunnel.concierge.sealion.dev',
      EDGE,
      '--type=merge',
      '-p',
      JSON.stringify({ spec: { workloads } }),
    ]);
  /** The hub account a mapped identity came from, read from the extra the edge saw. */
  const originalOf = (view: UserView): { username: string; extra?: Record<string, string[]> } =>
    JSON.parse(view.extra?.[ORIGINAL]?.[0] ?? '{}') as { username: string; extra?: Record<string, string[]> };
  const reviewOnEdge = async (token: string): Promise<UserView> => {
    const answer = await review({ headers: bearer(token), prefix: `/clusters/${EDGE}` });
    if (answer.status !== 201)
      throw new Error(`expected 201, got ${answer.status}: ${answer.body.slice(0, 600)}`);
    return (JSON.parse(answer.body) as { status: { userInfo: UserView } }).status.userInfo;
  };
  let robotWorkload = '';
  let workerWorkload = '';

  beforeAll(async () => {
    await kubectl(edge, [
      'create',
      'clusterrole',
      'ns-watcher',
      '--verb=get,list,watch',
      '--resource=namespaces',
    ]);
    // The edge's RBAC: the hub's service accounts of kube-system may read and watch namespaces; its own robot (same namespace
    // and name as the hub's) may read kube-system's ConfigMaps, which the hub's robot must not get by its name.
    await kubectl(edge, [
      'create',
      'clusterrolebinding',
      'hub-kube-system-readers',
      '--clusterrole=ns-watcher',
      `--group=${PREFIX}system:serviceaccounts:kube-system`,
    ]);
    await kubectl(edge, [
      'create',
      'role',
      'cm-reader',
      '-n',
      'kube-system',
      '--verb=get,list',
      '--resource=configmaps',
    ]);
    await kubectl(edge, [
      'create',
      'rolebinding',
      'robot-cm',
      '-n',
      'kube-system',
      '--role=cm-reader',
      '--serviceaccount=kube-system:robot',
    ]);
    await kubectl(hub, ['create', 'namespace', 'apps']);
    await kubectl(hub, ['create', 'serviceaccount', 'worker', '-n', 'apps']);
    robotWorkload = await workloadToken('kube-system', 'robot');
    workerWorkload = await workloadToken('apps', 'worker');
    await setPrefix({ usernamePrefix: PREFIX });
    await eventually(() => reviewOnEdge(robotWorkload), 30_000, 250);
  }, 60_000);

  it('the edge sees the mapped name, the mapped groups and, in the extra, the hub account it came from; its audit log too', async () => {
    const seen = await reviewOnEdge(robotWorkload);
    expect({ username: seen.username, groups: seen.groups }).toEqual({
      username: ROBOT,
      groups: [...ROBOT_GROUPS, AUTHENTICATED],
    });
    expect(Object.keys(seen.extra ?? {})).toEqual([ORIGINAL]);
    expect(originalOf(seen).username).toBe('system:serviceaccount:kube-system:robot');
    // The edge's own audit log names the mapped identity and the hub account behind it.
    await eventually(() => {
      const events = readFileSync(edge.auditLogPath, 'utf8')
        .split('\n')
        .filter((line) => line.includes(ROBOT))
        .map((line) => JSON.parse(line) as { impersonatedUser?: UserView });
      const event = events.find((e) => e.impersonatedUser?.username === ROBOT);
      expect(event && originalOf(event.impersonatedUser!).username).toBe(
        'system:serviceaccount:kube-system:robot',
      );
    });
  });

  it.each<[string, () => Promise<Answer>, Expected]>([
    [
      'a workload token on /clusters/edge: the edge’s RBAC for the mapped group allows it',
      () => get('/clusters/edge/api/v1/namespaces/only-on-edge', robotWorkload),
      { namespace: 'only-on-edge' },
    ],
    [
      'a workload token of a hub account the edge’s RBAC grants nothing: the edge refuses the mapped name',
      () => get('/clusters/edge/api/v1/namespaces/only-on-edge', workerWorkload),
      status(
        403,
        'Forbidden',
        `User "${PREFIX}system:serviceaccount:apps:worker" cannot get resource "namespaces"`,
      ),
    ],
    [
      'the hub’s kube-system/robot, named like the edge’s own kube-system/robot, does not get what the edge grants its own',
      () => get('/clusters/edge/api/v1/namespaces/kube-system/configmaps', robotWorkload),
      status(403, 'Forbidden', `User "${ROBOT}" cannot list resource "configmaps"`),
    ],
    [
      'a workload token on the hub’s own API',
      () => get('/api/v1/namespaces/only-on-hub', robotWorkload),
      status(403, 'Forbidden', "a token for Sealion's workload audience reaches other clusters only"),
    ],
    [
      'a workload token on the hub’s own WhoAmI',
      () => get('/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests', robotWorkload),
      status(403, 'Forbidden', "a token for Sealion's workload audience reaches other clusters only"),
    ],
    [
      'a workload token with its signature cut off',
      () =>
        get(
          '/clusters/edge/api/v1/namespaces/only-on-edge',
          `${robotWorkload.slice(0, robotWorkload.lastIndexOf('.'))}.`,
        ),
      UNAUTHORIZED,
    ],
    [
      'a workload token with its signature altered',
      () => get('/clusters/edge/api/v1/namespaces/only-on-edge', `${robotWorkload.slice(0, -4)}AAAA`),
      UNAUTHORIZED,
    ],
  ])('%s', async (_name, attack, expected) => {
    await expectAnswer(await attack(), expected);
  });

  it('the prefix is the workloads’ alone: no user under it is sent, nobody impersonates a name under it, and a workload that impersonates names its hub account', async () => {
    const onEdge = `/clusters/${EDGE}`;
    const RESERVED = `the prefix "${PREFIX}" is reserved for hub workloads on that cluster`;
    // Users the edge lets impersonate anyone: a webhook user, and the hub's kube-system accounts under their mapping.
    await kubectl(edge, [
      'create',
      'clusterrole',
      'impersonator',
      '--verb=impersonate',
      '--resource=users,groups',
    ]);
    await kubectl(edge, [
      'create',
      'clusterrolebinding',
      'impersonators',
      '--clusterrole=impersonator',
      '--user=imp-admin',
      `--group=${ROBOT_GROUPS[1]!}`,
    ]);
    await eventually(async () =>
      expect((await kubectl(edge, ['auth', 'can-i', 'impersonate', 'users', '--as=imp-admin'])).trim()).toBe(
        'yes',
      ),
    );
    // An IdP user named like the robot's mapping, and a webhook user in its mapped group: refused, not the robot.
    const named = await mint({ username: ROBOT, groups: [READERS] }, { expiresIn: 600 });
    await expectAnswer(
      await get(`${onEdge}/api/v1/namespaces/only-on-edge`, named),
      status(403, 'Forbidden', `cannot be sent: ${RESERVED}`),
    );
    const grouped = keep(webhook.grant({ username: 'mallory', groups: [ROBOT_GROUPS[1]!] }));
    await expectAnswer(
      await get(`${onEdge}/api/v1/namespaces/only-on-edge`, grouped),
      status(
        403,
        'Forbidden',
        `cluster ${EDGE}: the group "${ROBOT_GROUPS[1]!}" cannot be sent: ${RESERVED}`,
      ),
    );
    // Someone the edge lets impersonate anyone still cannot become a mapped name or group.
    const admin = keep(webhook.grant({ username: 'imp-admin', groups: [] }));
    expect(
      (await review({ headers: { ...bearer(admin), 'impersonate-user': 'someone' }, prefix: onEdge })).status,
    ).toBe(201);
    await expectAnswer(
      await review({ headers: { ...bearer(admin), 'impersonate-user': ROBOT }, prefix: onEdge }),
      status(403, 'Forbidden', `cluster ${EDGE}: cannot impersonate the username "${ROBOT}": ${RESERVED}`),
    );
    await expectAnswer(
      await review({
        headers: { ...bearer(admin), 'impersonate-user': 'someone', 'impersonate-group': ROBOT_GROUPS[0]! },
        prefix: onEdge,
      }),
      status(
        403,
        'Forbidden',
        `cluster ${EDGE}: cannot impersonate the group "${ROBOT_GROUPS[0]!}": ${RESERVED}`,
      ),
    );
    // The robot (allowed by its mapped group) impersonates someone: the edge sees the hub account as the original user.
    const answer = await review({
      headers: { ...bearer(robotWorkload), 'impersonate-user': 'someone' },
      prefix: onEdge,
    });
    expect(answer.status).toBe(201);
    const seen = (JSON.parse(answer.body) as { status: { userInfo: UserView } }).status.userInfo;
    expect(seen.username).toBe('someone');
    expect(originalOf(seen).username).toBe('system:serviceaccount:kube-system:robot');
    await expectAnswer(
      await review({
        headers: { ...bearer(robotWorkload), 'impersonate-user': `${PREFIX}someone` },
        prefix: onEdge,
      }),
      status(
        403,
        'Forbidden',
        `cluster ${EDGE}: cannot impersonate the username "${PREFIX}someone": ${RESERVED}`,
      ),
    );
  });

  it('no workload token ever reaches the webhook: a webhook could replay it', async () => {
    const altered = `${robotWorkload.slice(0, -4)}AAAA`;
    await expectAnswer(await get('/clusters/edge/api/v1/namespaces/only-on-edge', altered), UNAUTHORIZED);
    for (const token of [robotWorkload, workerWorkload, altered]) expect(webhook.received(token)).toBe(false);
  });

  it('a cluster whose Cluster names no prefix takes no workloads, from the moment it is taken out', async () => {
    const path = '/clusters/edge/api/v1/namespaces/only-on-edge';
    // `kubectl get clusters -o wide` shows the prefix.
    const wide = await kubectl(hub, ['get', 'clusters.tunnel.concierge.sealion.dev', '-o', 'wide']);
    expect(wide.split('\n')[0]).toContain('WORKLOADS');
    expect(wide.split('\n').find((line) => line.startsWith(`${EDGE} `))).toContain(PREFIX);
    try {
      await setPrefix(null);
      await eventually(async () =>
        expectAnswer(
          await get(path, robotWorkload),
          status(
            403,
            'Forbidden',
            'cluster edge takes no workloads from the hub: its Cluster has no spec.workloads.usernamePrefix',
          ),
        ),
      );
      // The API server refuses a prefix that would let hub names pass for the edge's own.
      for (const usernamePrefix of ['system:', 'hub', '']) {
        const result = await hub.kubectl([
          'patch',
          'clusters.tunnel.concierge.sealion.dev',
          EDGE,
          '--type=merge',
          '-p',
          JSON.stringify({ spec: { workloads: { usernamePrefix } } }),
        ]);
        expect(result.code).not.toBe(0);
      }
    } finally {
      await setPrefix({ usernamePrefix: PREFIX });
    }
    await eventually(async () => expectAnswer(await get(path, robotWorkload), { namespace: 'only-on-edge' }));
  });

  it('one workload opening many watches is bounded as a user is: by its account’s share, whichever token it holds', async () => {
    const path = '/clusters/edge/api/v1/namespaces/only-on-edge';
    // Another token of the same account (as another replica of a controller would hold).
    const sameAccount = await workloadToken('kube-system', 'robot');
    const limit = (spec: object): Promise<string> =>
      kubectl(hub, [
        'patch',
        'clusters.tunnel.concierge.sealion.dev',
        EDGE,
        '--type=merge',
        '-p',
        JSON.stringify({ spec }),
      ]);
    await limit({ maxRequestsPerUser: 2, queueTimeoutSeconds: 1 });
    const session = http2Connect(`https://127.0.0.1:${proxyPort()}`, { ca: concierge.servingCA.certPem });
    session.on('error', () => {});
    try {
      // Two watches hold the account's share; its next request, with the other token, waits a second and is refused.
      // Until the edit reaches the concierge's informer the third is served: the watches are closed, and tried again.
      await eventually(async () => {
        const watches = [0, 1].map(() => {
          const stream = session.request({
            ':path': '/clusters/edge/api/v1/namespaces?watch=1',
            authorization: `Bearer ${robotWorkload}`,
          });
          stream.on('error', () => {});
          return stream;
        });
        try {
          await Promise.all(
            watches.map(
              (stream) =>
                new Promise<void>((done, fail) =>
                  stream.once('response', (h) =>
                    Number(h[':status']) === 200 ? done() : fail(new Error(`watch: ${String(h[':status'])}`)),
                  ),
                ),
            ),
          );
          expect((await get(path, sameAccount)).status).toBe(429);
        } catch (err) {
          for (const stream of watches) stream.close();
          throw err;
        }
      }, 30_000);
      // Others are not held up: a person is served meanwhile.
      await expectAnswer(await get(path), { namespace: 'only-on-edge' });
    } finally {
      session.destroy();
      await limit({ maxRequestsPerUser: null, queueTimeoutSeconds: null });
    }
  }, 60_000);

  it('a deleted service account’s token, and a pod-bound token after its pod is gone, are refused with the one 401 once the cached answer expires', async () => {
    const path = '/clusters/edge/api/v1/namespaces/only-on-edge';
    await kubectl(hub, ['create', 'serviceaccount', 'leaving', '-n', 'kube-system']);
    await kubectl(
      hub,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Pod',
        metadata: { name: 'holder', namespace: 'kube-system' },
        spec: { serviceAccountName: 'robot', containers: [{ name: 'c', image: 'example.invalid/none' }] },
      }),
    );
    const leaving = await workloadToken('kube-system', 'leaving');
    const bound = await workloadToken('kube-system', 'robot', [
      '--bound-object-kind=Pod',
      '--bound-object-name=holder',
    ]);
    // Both good at first; the pod-bound one carries its pod to the edge, in the hub account's user info.
    await expectAnswer(await get(path, leaving), { namespace: 'only-on-edge' });
    await expectAnswer(await get(path, bound), { namespace: 'only-on-edge' });
    const seen = await reviewOnEdge(bound);
    expect(seen.username).toBe(ROBOT);
    expect(originalOf(seen).extra?.['authentication.kubernetes.io/pod-name']).toEqual(['holder']);
    await kubectl(hub, ['delete', 'serviceaccount', 'leaving', '-n', 'kube-system']);
    await kubectl(hub, ['delete', 'pod', 'holder', '-n', 'kube-system', '--grace-period=0', '--force']);
    // The answers cached before (SERVICE_ACCOUNT_TTL_MS, a minute) may still be given until they expire.
    await eventually(
      async () => {
        await expectAnswer(await get(path, leaving), UNAUTHORIZED);
        await expectAnswer(await get(path, bound), UNAUTHORIZED);
      },
      90_000,
      1_000,
    );
  }, 150_000);
});

describe('bodies anyone may send', () => {
  const big = Buffer.alloc(1024 * 1024, 'a');
  it.each<[string, () => Promise<Answer>, Expected]>([
    [
      'a 1 MiB anonymous TokenCredentialRequest, its length declared',
      () => https1(TCR_PATH, { body: big }),
      status(413, 'RequestEntityTooLarge'),
    ],
    [
      'a 1 MiB anonymous TokenCredentialRequest, chunked with no length',
      () =>
        raw(
          Buffer.concat([
            Buffer.from(
              `POST ${TCR_PATH} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n${big.length.toString(16)}\r\n`,
            ),
            big,
            Buffer.from('\r\n0\r\n\r\n'),
          ]),
        ),
      status(413, 'RequestEntityTooLarge'),
    ],
    [
      'a 1 MiB anonymous TokenCredentialRequest over HTTP/2',
      () => h2(TCR_PATH, { body: big }),
      status(413, 'RequestEntityTooLarge'),
    ],
    [
      'a 1 MiB WhoAmIRequest',
      () =>
        https1('/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests', {
          headers: bearer(userToken),
          body: big,
        }),
      status(413, 'RequestEntityTooLarge'),
    ],
  ])('%s', async (_name, attack, expected) => {
    await expectAnswer(await attack(), expected);
  });
});

describe('beyond the table: holes found by attacking it', () => {
  // The request counter and the duration histogram are labelled with the request's verb. HTTP/2 lets a client send any
  // token as :method, and the metrics are counted before authentication: a verb made of the method would let a
  // stranger grow the proxy's metrics (memory, and every scrape) by one series per request.
  it('keeps the metrics’ labels bounded whatever methods strangers send', async () => {
    for (let i = 0; i < 50; i++) await h2('/api', { method: `PROBE${i}` });
    const scraped = await new Promise<string>((done, fail) => {
      const port = concierge.concierge.metricsPort!;
      void fetch(`http://127.0.0.1:${port}/metrics`)
        .then((r) => r.text())
        .then(done, fail);
    });
    const verbs = new Set([...scraped.matchAll(/verb="([^"]*)"/g)].map((m) => m[1]));
    expect([...verbs].filter((v) => v!.startsWith('probe'))).toHaveLength(0);
  });

  it('serves the process’s own health beside the proxy’s metrics', async () => {
    const scraped = await (
      await fetch(`http://127.0.0.1:${concierge.concierge.metricsPort!}/metrics`)
    ).text();
    for (const name of [
      'process_resident_memory_bytes',
      'nodejs_heap_size_used_bytes',
      'nodejs_eventloop_lag_seconds',
    ])
      expect(scraped).toMatch(new RegExp(`^${name} `, 'm'));
  });

  // A JWT whose issuer no JWTAuthenticator names once went to every WebhookAuthenticator before the API server's
  // TokenReview. The hub's own service-account tokens are such JWTs: each one used through the proxy was handed to
  // every webhook's operator, who could then act as that service account on the hub.
  it('never sends the hub’s own service-account tokens to a webhook', async () => {
    await expectAnswer(await review({ headers: bearer(robotToken) }), {
      sees: expect.objectContaining({
        username: 'system:serviceaccount:kube-system:robot',
      }) as unknown as UserView,
    });
    expect(webhook.received(robotToken)).toBe(false);
  });
});

describe('beyond the table: the tunnel’s own framing', () => {
  // The first request on a new tunnel stream, when it had a body of declared length, reached the agent with its
  // request line overwritten (16 bytes of other memory of the hub's process in place of `POST /… HTTP/1.1`); the
  // agent's parser dropped the stream and the caller got 502. Requests reuse idle streams, so this showed when more
  // requests are in flight at once than idle streams wait: here, 80 writes at once.
  it('carries 80 concurrent writes with a declared length to the edge', async () => {
    const answers = await Promise.all(
      Array.from({ length: 80 }, () =>
        https1(`/clusters/${EDGE}${SSR_PATH}`, { body: SSR_BODY, headers: bearer(userToken) }),
      ),
    );
    expect(answers.map((a) => a.status)).toEqual(answers.map(() => 201));
  });
});

// Round 2 of the review: memory held per user across hops (finding 1), peer links (7), hop-by-hop headers (8).

describe('round 2: what one user can pin, and what crosses a hop', () => {
  /** A metric of the concierge's, summed over its series. */
  const metric = async (name: string): Promise<number> => {
    const text = await (await fetch(`http://127.0.0.1:${concierge.concierge.metricsPort!}/metrics`)).text();
    return [...text.matchAll(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, 'gm'))].reduce(
      (sum, m) => sum + Number(m[1]),
      0,
    );
  };

  // Finding 1. A signed-in user opened hundreds of requests for a large answer with a zero window and never read: each
  // pinned a stream window (1 MiB) in every process on the way. The same attack through separate processes, with
  // every process measured, is integration/unread-answers.test.ts.
  it('cuts what one user leaves unread at their share, directly and through the tunnel, and serves others', async () => {
    const cutBefore = await metric('sealion_unread_answers_cut_total');
    const session = http2Connect(`https://127.0.0.1:${proxyPort()}`, {
      ca: concierge.servingCA.certPem,
      settings: { initialWindowSize: 0 },
    });
    session.on('error', () => {});
    let reset = 0;
    try {
      for (const path of ['/openapi/v2', `/clusters/${EDGE}/openapi/v2`])
        for (let i = 0; i < 100; i++) {
          const stream = session.request({ ':path': path, ...bearer(userToken) });
          stream.on('error', () => {});
          stream.on('close', () => reset++);
        }
      await eventually(
        async () => expect(await metric('sealion_unread_answers_cut_total')).toBeGreaterThan(cutBefore + 50),
        60_000,
      );
      expect(await metric('sealion_unread_answer_bytes')).toBeLessThanOrEqual(USER_UNREAD_BYTES);
      expect(reset).toBeGreaterThan(50);
      // Another user, on both paths, meanwhile.
      const other = bearer(
        await mint({ username: 'bob@example.com', groups: [READERS] }, { expiresIn: 600 }),
      );
      expect((await https1('/api/v1/namespaces', { headers: other })).status).toBe(200);
      expect((await https1(`/clusters/${EDGE}/api/v1/namespaces`, { headers: other })).status).toBe(200);
    } finally {
      session.destroy();
    }
  }, 90_000);

  // Finding 8. A field the caller's Connection field names belongs to the caller's connection (RFC 9110 7.6.1); it was
  // sent on. Here it is Accept, so the API server's answer shows whether it arrived: protobuf if it did, JSON if not.
  it.each([
    ['directly', '/api/v1/namespaces'],
    ['through the tunnel', `/clusters/${EDGE}/api/v1/namespaces`],
  ])('keeps a field the Connection field names on the caller’s hop (%s)', async (_name, path) => {
    const protobuf = 'application/vnd.kubernetes.protobuf';
    const plain = await https1(path, { headers: { ...bearer(userToken), accept: protobuf } });
    expect(plain.status).toBe(200);
    expect(plain.body.startsWith('k8s')).toBe(true);
    const named = await https1(path, {
      headers: { ...bearer(userToken), accept: protobuf, connection: 'keep-alive, accept' },
    });
    expect(named.status).toBe(200);
    expect(named.body.startsWith('{')).toBe(true);
  });
});

// Round 2 of the review: anonymous /register (finding 2) and certificates bound to what their trust depends on (5).

describe('anonymous /register: one answer whatever exists, at a bounded rate, and no Secret read per attempt', () => {
  /** The answer once the listener takes the request (this address may have used its share just before). */
  const admitted = (body: object): Promise<RegisterAnswer> =>
    eventually(async () => {
      const answer = await registerAt(body);
      expect(answer.status).not.toBe(429);
      return answer;
    }, 30_000);
  /** A well-formed token id nobody issued. */
  const unknownId = (): string => globalThis.crypto.randomUUID().replace(/-/g, '').slice(0, 8);
  /** How many Secret GETs the hub's API server has served, by its own count. */
  const secretGets = async (): Promise<number> => {
    const scraped = await hub.kubectl(['get', '--raw', '/metrics']);
    if (scraped.code !== 0) throw new Error(`the hub's metrics: ${scraped.stderr}`);
    let total = 0;
    for (const line of scraped.stdout.split('\n'))
      if (
        line.startsWith('apiserver_request_total{') &&
        line.includes('resource="secrets"') &&
        line.includes('verb="GET"')
      )
        total += Number(line.slice(line.lastIndexOf(' ') + 1));
    return total;
  };

  // Which Cluster names exist, and which token ids, must not be learnt from /register: every failure is the one 401.
  // (That they take the same time is made so by the code doing the same work for each, lib/kube/bootstrap.ts; timing is
  // not asserted here.)
  it('answers a known and an unknown cluster, an unknown token id, a wrong secret and a malformed token alike', async () => {
    const { csrPem } = await newCSR(EDGE);
    const real = keep((await createBootstrapToken(hubClients, NS, EDGE)).token);
    const id = real.split('.')[0]!;
    // Once the listener's cache holds the real token, a wrong secret is checked against it: its log says so.
    await eventually(async () => {
      await admitted({ cluster: EDGE, token: `${id}.not-the-secret`, csr: csrPem });
      expect(logLines.some((l) => l.includes('"reason":"WrongSecret"') && l.includes(id))).toBe(true);
    }, 30_000);
    const attempts: [string, object][] = [
      ['a known cluster, an unknown token id', { cluster: EDGE, token: `${unknownId()}.x`, csr: csrPem }],
      [
        'an unknown cluster, an unknown token id',
        { cluster: 'nobody', token: `${unknownId()}.x`, csr: csrPem },
      ],
      ['a known cluster, a wrong secret', { cluster: EDGE, token: `${id}.not-the-secret`, csr: csrPem }],
      [
        'an unknown cluster, a wrong secret',
        { cluster: 'nobody', token: `${id}.not-the-secret`, csr: csrPem },
      ],
      ['a malformed token', { cluster: EDGE, token: 'not-a-token', csr: csrPem }],
    ];
    const answers: Record<string, { status: number; body: string }> = {};
    for (const [what, body] of attempts) {
      const { status, body: text } = await admitted(body);
      answers[what] = { status, body: text };
    }
    const one = { status: 401, body: unauthorizedBody };
    expect(answers).toEqual(Object.fromEntries(attempts.map(([what]) => [what, one])));
  });

  it('refuses a flood beyond the limit with 429 and a Status, and the API server reads no Secret for it', async () => {
    const { csrPem } = await newCSR(EDGE);
    const before = await secretGets();
    const answers = await Promise.all(
      Array.from({ length: 300 }, () =>
        registerAt({ cluster: EDGE, token: `${unknownId()}.x`, csr: csrPem }),
      ),
    );
    const after = await secretGets();
    const refused = answers.filter((a) => a.status === 429);
    expect(answers.filter((a) => a.status !== 429 && a.status !== 401)).toEqual([]);
    expect(refused.length).toBeGreaterThan(0);
    for (const answer of refused) {
      expect(Number(answer.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 429, reason: 'TooManyRequests' });
    }
    // Before, each attempt was a Secret GET by the concierge: 300 here. Now none are; the margin is for whatever else
    // runs meanwhile (the concierge's controllers).
    expect(after - before).toBeLessThan(10);
    // The listener takes this address again once its share refills, so rows after this one are not refused.
    await admitted({ cluster: EDGE, token: `${unknownId()}.x`, csr: csrPem });
  });
});

describe('TokenCredentialRequest certificates end when their authenticator is edited to trust otherwise', () => {
  /** Edits an authenticator with a JSON merge patch, as an admin would. */
  const patch = async (resource: string, name: string, body: object): Promise<void> => {
    const patched = await hub.kubectl(['patch', resource, name, '--type=merge', '-p', JSON.stringify(body)]);
    if (patched.code !== 0) throw new Error(`kubectl patch ${resource} ${name}: ${patched.stderr}`);
  };
  /** A certificate through `ref`, once its authenticator is loaded. */
  const certificateThrough = (token: string, ref: object): Promise<Credential> =>
    eventually(async () => {
      const credential = await credentialFor(token, ref);
      if ('status' in credential)
        throw new Error(`no certificate yet: ${credential.status} ${credential.body}`);
      return credential;
    }, 30_000);

  // Until now a certificate was bound to its authenticator's uid alone: an edit of whom the authenticator trusts (here
  // a username prefix, which makes every name it gives another) left certificates issued under the old spec valid for
  // the rest of their life, up to a day.
  it('a JWTAuthenticator: kept across a label, an annotation and a new lifetime; ended by a new username prefix', async () => {
    const name = 'trust-edited';
    const ref = { apiGroup: GROUP, kind: 'JWTAuthenticator', name };
    await applyJWTAuthenticator(hub, name, issuer, AUDIENCE);
    try {
      const before = await certificateThrough(userToken, ref);
      await expectAnswer(await review({ cert: before }), SEES_USER);

      await patch('jwtauthenticators', name, {
        metadata: { labels: { team: 'platform' }, annotations: { note: 'cosmetic' } },
        spec: { credentialLifetimeSeconds: 900 },
      });
      // The new lifetime is in effect once a new certificate gets it: the edit has been loaded.
      await eventually(async () => {
        const answer = JSON.parse((await tcr(userToken, ref)).body) as {
          status: { credential?: { expirationTimestamp: string; clientKeyData?: string } };
        };
        if (answer.status.credential?.clientKeyData) keep(answer.status.credential.clientKeyData);
        expect(Date.parse(answer.status.credential!.expirationTimestamp) - Date.now()).toBeGreaterThan(
          600_000,
        );
      }, 30_000);
      await expectAnswer(await review({ cert: before }), SEES_USER);

      await patch('jwtauthenticators', name, { spec: { claims: { usernamePrefix: 'oidc:' } } });
      await eventually(async () => expectAnswer(await review({ cert: before }), UNAUTHORIZED), 30_000);
      // What the authenticator says now holds for certificates issued now.
      const after = await certificateThrough(userToken, ref);
      await expectAnswer(await review({ cert: after }), sees(`oidc:${USER}`, [READERS]));
    } finally {
      await hub.kubectl(['delete', 'jwtauthenticator', name, '--ignore-not-found']);
    }
  });

  it('a WebhookAuthenticator: ended by allowing system names', async () => {
    const name = 'hooks-trust-edited';
    const ref = { apiGroup: GROUP, kind: 'WebhookAuthenticator', name };
    const applied = await hub.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: `${GROUP}/v1alpha1`,
        kind: 'WebhookAuthenticator',
        metadata: { name },
        spec: { endpoint: webhook.url, tls: { certificateAuthorityData: webhook.caData } },
      }),
    });
    expect(applied.code).toBe(0);
    try {
      const token = keep(webhook.grant({ username: 'grace', groups: [READERS] }));
      const before = await certificateThrough(token, ref);
      await expectAnswer(await review({ cert: before }), sees('grace', [READERS]));
      await patch('webhookauthenticators', name, { spec: { allowSystemNames: true } });
      await eventually(async () => expectAnswer(await review({ cert: before }), UNAUTHORIZED), 30_000);
    } finally {
      await hub.kubectl(['delete', 'webhookauthenticator', name, '--ignore-not-found']);
    }
  });
});

// Round 2 of the review: what the CLI prints, opens, writes and forgets (findings 3, 4, 6 and 9).

describe('the CLI: what it prints, opens, writes and forgets', () => {
  // Everything this block uses is imported here, so that its rows sit in one place of the file.
  const loadTools = async () => {
    const { REPO_ROOT } = await import('../dev/build.ts');
    const browser = await import('../dev/browser.ts');
    const undici = await import('undici');
    return {
      fs: await import('node:fs'),
      spawn: (await import('node:child_process')).spawn,
      execFile: (await import('node:child_process')).execFile,
      runSealion: (await import('../dev/processes.ts')).runSealion,
      runKubectl: (await import('../dev/cluster.ts')).runKubectl,
      browse: browser.browse,
      runWithLogin: browser.runWithLogin,
      fetch: undici.fetch,
      Agent: undici.Agent,
      main: join(REPO_ROOT, 'cli/main.ts'),
    };
  };
  let tools: Awaited<ReturnType<typeof loadTools>>;
  /** An issuer that logs a user in (the file's own logs nobody in), checked by the JWTAuthenticator cli-logins. */
  let loginIssuer: TestIssuer;
  let cliDir: string;
  const CLI_USER = 'grace@example.com';
  /** Escape sequences, CR, BEL, the 8-bit CSI, a bidi override: what a hostile server says. */
  const HOSTILE = 'ok\u001b]0;owned\u0007\u001b[2J\rforged\u009b31m\u202eevil';
  /** A control but a line break, or an invisible format character: none may reach the terminal. */
  const UNSAFE = /[^\n\P{Cc}]|[\p{Cf}\p{Zl}\p{Zp}]/u;

  beforeAll(async () => {
    tools = await loadTools();
    cliDir = mkdtempSync(join(dir, 'cli-'));
    loginIssuer = await startOIDCIssuer({ login: { username: CLI_USER, groups: [READERS] } });
    await applyJWTAuthenticator(hub, 'cli-logins', loginIssuer, loginIssuer.clientId);
    await eventually(async () => {
      const token = await loginIssuer.mint({ username: CLI_USER }, { audience: loginIssuer.clientId });
      expect((await review({ headers: bearer(keep(token)) })).status).toBe(201);
    }, 60_000);
  }, 90_000);
  afterAll(async () => {
    await loginIssuer?.stop();
  });

  /** A kubeconfig for the proxy whose user is `user` (a token, or an exec entry). */
  const kubeconfig = (name: string, user: object): string => {
    const path = join(cliDir, `${name}.kubeconfig`);
    tools.fs.writeFileSync(
      path,
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [
          {
            name,
            cluster: {
              server: `https://127.0.0.1:${proxyPort()}`,
              'certificate-authority-data': Buffer.from(concierge.servingCA.certPem).toString('base64'),
            },
          },
        ],
        users: [{ name, user }],
        contexts: [{ name, context: { cluster: name, user: name } }],
        'current-context': name,
      }),
      { mode: 0o600 },
    );
    return path;
  };
  /** A folder of its own for the CLI's cache. */
  const home = (): string => mkdtempSync(join(cliDir, 'home-'));
  /** The exec entry of a kubeconfig running this CLI's `args`, through a wrapper that writes down its arguments. */
  const recordedExec = (args: string[], argvFile: string, env: Record<string, string> = {}): object => {
    const wrapper = join(cliDir, `plugin-${Math.random().toString(36).slice(2)}`);
    tools.fs.writeFileSync(
      wrapper,
      `#!/bin/sh\nprintf '%s\\n' "$@" >> '${argvFile}'\nexec '${process.execPath}' '${tools.main}' "$@"\n`,
      { mode: 0o755 },
    );
    return {
      exec: {
        apiVersion: 'client.authentication.k8s.io/v1',
        command: wrapper,
        args,
        env: Object.entries(env).map(([name, value]) => ({ name, value })),
        provideClusterInfo: true,
        interactiveMode: 'Never',
      },
    };
  };

  // ---- Finding 3: server text reaches the terminal escaped ----

  it('sealion whoami shows a webhook user’s C1 control, bidi override and zero-width space escaped, and its JSON parses to them', async () => {
    const username = `ada\u009b2J\u202eexe.txt`;
    const groups = [`ops\u200b`, READERS];
    const path = kubeconfig('hostile-name', { token: keep(webhook.grant({ username, groups })) });
    const text = await tools.runSealion(['whoami', '--kubeconfig', path]);
    expect(text).toMatchObject({ code: 0, stderr: '' });
    expect(text.stdout).toMatch(/\nUsername +ada\\u009b2J\\u202eexe\.txt\n/);
    expect(text.stdout).toContain('ops\\u200b');
    expect(text.stdout).not.toMatch(UNSAFE);
    const json = await tools.runSealion(['whoami', '--kubeconfig', path, '-o', 'json']);
    expect(json.stdout).not.toMatch(UNSAFE);
    expect(JSON.parse(json.stdout)).toMatchObject({
      user: { username, groups: expect.arrayContaining(groups) },
    });
  });

  it('the exec plugin’s exchange failure shows a hostile concierge’s Status message escaped, through kubectl', async () => {
    // A stand-in concierge: the real one never says such things, a hostile or compromised one might.
    const { createServer } = await import('node:https');
    const ca = await newCA('hostile-concierge-ca');
    const serving = await issueCert(ca, { commonName: 'hostile', hosts: ['127.0.0.1'], usage: 'server' });
    const answers = [
      { status: 201, body: { status: { message: HOSTILE } } },
      { status: 401, body: { kind: 'Status', code: 401, message: HOSTILE } },
    ];
    let next = 0;
    const hostile = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
      req.resume();
      const answer = answers[next++ % answers.length]!;
      res.writeHead(answer.status, { 'content-type': 'application/json' }).end(JSON.stringify(answer.body));
    });
    await new Promise<void>((done) => hostile.listen(0, '127.0.0.1', done));
    try {
      const endpoint = `https://127.0.0.1:${(hostile.address() as { port: number }).port}`;
      const path = kubeconfig('hostile-concierge', {
        exec: {
          apiVersion: 'client.authentication.k8s.io/v1',
          command: process.execPath,
          args: [
            tools.main,
            'login',
            'static',
            '--token-env',
            'HOSTILE_TOKEN',
            '--exchange',
            '--authenticator-name',
            'hooks',
            '--concierge-endpoint',
            endpoint,
            '--concierge-ca-bundle-data',
            Buffer.from(ca.certPem).toString('base64'),
          ],
          interactiveMode: 'Never',
        },
      });
      for (const expected of [
        `WebhookAuthenticator hooks refused the token in environment variable HOSTILE_TOKEN on ${endpoint}: ok\\u001b]0;owned`,
        `cannot exchange the token on ${endpoint}: HTTP 401: ok\\u001b]0;owned`,
      ]) {
        const run = await tools.runKubectl(hub.binaries.kubectl, path, ['get', 'namespaces'], {
          env: { HOSTILE_TOKEN: 'anything', XDG_CONFIG_HOME: home() },
        });
        expect(run.code).not.toBe(0);
        expect(run.stderr).toContain(expected);
        expect(run.stderr).not.toMatch(UNSAFE);
      }
    } finally {
      hostile.closeAllConnections();
      await new Promise((done) => hostile.close(done));
    }
  });

  // ---- Finding 4: the OIDC login's browser link and callback ----

  it('sealion login oidc gives the browser only a local link; stray and other users’ requests neither end nor complete the login', async () => {
    // A stand-in for xdg-open that writes down what it was given: what every local user reads in the process list.
    const bin = mkdtempSync(join(cliDir, 'bin-'));
    const opened = join(bin, 'opened');
    tools.fs.writeFileSync(join(bin, 'xdg-open'), `#!/bin/sh\nprintf '%s\\n' "$@" > '${opened}'\n`, {
      mode: 0o755,
    });
    const child = tools.spawn(
      process.execPath,
      [
        tools.main,
        'login',
        'oidc',
        '--issuer',
        loginIssuer.url,
        '--ca-bundle-data',
        loginIssuer.caData,
        '--scopes',
        'openid',
      ],
      { env: { ...process.env, PATH: `${bin}:${process.env['PATH']}`, XDG_CONFIG_HOME: home() } },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const exited = new Promise<number | null>((done) => child.on('close', done));
    try {
      let link = '';
      await eventually(() => {
        link = / in a browser:\n {2}(\S+)\n/.exec(stderr)?.[1] ?? '';
        expect(link).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/login\/[\w-]+$/);
        expect(tools.fs.existsSync(opened)).toBe(true);
      }, 20_000);
      // What the opener got is the local link and nothing else: no state, no PKCE challenge.
      expect(tools.fs.readFileSync(opened, 'utf8')).toBe(`${link}\n`);
      const base = new URL(link).origin;
      for (const stray of ['/callback', '/callback?code=forged&state=wrong', '/callback?error=access_denied'])
        expect({ stray, status: (await fetch(`${base}${stray}`)).status }).toEqual({ stray, status: 400 });
      // Another local user (nobody) who read the link in the process list is turned away, and the link stays unused.
      const asNobody = await new Promise<string>((done) =>
        tools.execFile(
          'setpriv',
          [
            '--reuid=65534',
            '--regid=65534',
            '--clear-groups',
            'curl',
            '-s',
            '-o',
            '/dev/null',
            '-w',
            '%{http_code}',
            link,
          ],
          (_err, out) => done(out),
        ),
      );
      expect(asNobody).toBe('403');
      expect(child.exitCode).toBeNull();
      // The user's browser then completes the login.
      expect(await tools.browse(link, { caPem: loginIssuer.caPem })).toMatchObject({ status: 200 });
      expect(await exited).toBe(0);
      expect(JSON.parse(stdout)).toMatchObject({
        kind: 'ExecCredential',
        status: { token: expect.any(String) },
      });
      keep((JSON.parse(stdout) as { status: { token: string } }).status.token);
    } finally {
      child.kill('SIGKILL');
    }
  });

  // ---- Finding 6: static tokens out of the process list ----

  it('get kubeconfig refuses --static-token; a token file keeps it out of every plugin run’s arguments, through kubectl', async () => {
    const secret = keep(webhook.grant({ username: 'file-user', groups: [READERS] }));
    const refused = await tools.runSealion([
      'get',
      'kubeconfig',
      '--kubeconfig',
      hub.kubeconfigPath,
      '--static-token',
      secret,
      '--output-file',
      join(cliDir, 'refused.kubeconfig'),
    ]);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain(
      '--static-token would put the token in the arguments of every kubectl run',
    );
    expect(tools.fs.existsSync(join(cliDir, 'refused.kubeconfig'))).toBe(false);

    const tokenFile = join(cliDir, 'token');
    tools.fs.writeFileSync(tokenFile, `${secret}\n`, { mode: 0o600 });
    const argv = join(cliDir, 'file-argv');
    const login = [
      'login',
      'static',
      '--token-file',
      tokenFile,
      '--exchange',
      '--authenticator-name',
      'hooks',
    ];
    const path = kubeconfig('token-file', recordedExec(login, argv));
    const run = await tools.runKubectl(
      hub.binaries.kubectl,
      path,
      ['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'],
      {
        env: { XDG_CONFIG_HOME: home() },
      },
    );
    expect(run).toMatchObject({ code: 0, stdout: 'file-user', stderr: '' });
    expect(tools.fs.readFileSync(argv, 'utf8')).toContain(tokenFile);
    expect(tools.fs.readFileSync(argv, 'utf8')).not.toContain(secret);

    // A file other users may read is refused, and kubectl says why.
    tools.fs.chmodSync(tokenFile, 0o644);
    const open = await tools.runKubectl(hub.binaries.kubectl, path, ['get', 'namespaces'], {
      env: { XDG_CONFIG_HOME: home() },
    });
    expect(open.code).not.toBe(0);
    expect(open.stderr).toContain('is open to other users (mode 0644)');
    expect(open.stderr).not.toContain(secret);

    // A kubeconfig an older version wrote, with --token, still works, and warns on every run.
    const legacy = kubeconfig(
      'legacy-token',
      recordedExec(['login', 'static', '--token', secret], join(cliDir, 'legacy-argv')),
    );
    const warned = await tools.runKubectl(
      hub.binaries.kubectl,
      legacy,
      ['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'],
      {
        env: { XDG_CONFIG_HOME: home() },
      },
    );
    expect(warned).toMatchObject({ code: 0, stdout: 'file-user' });
    expect(warned.stderr).toContain('warning: this kubeconfig passes the token with --token');
  });

  // ---- Finding 9: logout ----

  it('sealion logout revokes the refresh token at the issuer and forgets the session: the next kubectl run asks for a login', async () => {
    const cache = home();
    const env = { XDG_CONFIG_HOME: cache };
    const path = kubeconfig('logout', {
      exec: {
        apiVersion: 'client.authentication.k8s.io/v1',
        command: process.execPath,
        args: [
          tools.main,
          'login',
          'oidc',
          '--issuer',
          loginIssuer.url,
          '--ca-bundle-data',
          loginIssuer.caData,
          '--scopes',
          'openid',
          '--skip-browser',
          '--exchange',
          '--authenticator-type',
          'jwt',
          '--authenticator-name',
          'cli-logins',
        ],
        provideClusterInfo: true,
        interactiveMode: 'IfAvailable',
      },
    });
    const whoami = ['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'];
    const kubectlWithBrowser = () =>
      tools.runWithLogin(hub.binaries.kubectl, [`--kubeconfig=${path}`, ...whoami], {
        caPem: loginIssuer.caPem,
        env,
        // On a terminal, as a person runs kubectl: without one, kubectl tells the plugin nobody can log in.
        terminal: true,
      });
    const first = await kubectlWithBrowser();
    expect(first.browserError).toBeUndefined();
    expect(first).toMatchObject({ code: 0, browsed: true, stdout: CLI_USER });
    const sessions = join(cache, 'sealion', 'sessions');
    const [file] = tools.fs.readdirSync(sessions).filter((f) => f.endsWith('.json'));
    const session = JSON.parse(tools.fs.readFileSync(join(sessions, file!), 'utf8')) as {
      refreshToken: string;
    };
    keep(session.refreshToken);
    // Logged in: the next run answers from the cache, no browser.
    expect(await tools.runKubectl(hub.binaries.kubectl, path, whoami, { env })).toMatchObject({
      code: 0,
      stdout: CLI_USER,
      stderr: '',
    });

    const out = await tools.runSealion(['logout', '--kubeconfig', path], env);
    expect(out).toMatchObject({ code: 0, stderr: '' });
    expect(out.stdout).toContain(
      `Logged out of ${loginIssuer.url} (client ${loginIssuer.clientId}): its refresh token is revoked.`,
    );
    expect(out.stdout).toContain('Deleted the cached client certificate.');
    for (const kind of ['sessions', 'credentials'])
      expect(tools.fs.readdirSync(join(cache, 'sealion', kind)).filter((f) => f.endsWith('.json'))).toEqual(
        [],
      );
    // The issuer refuses the refresh token from now on.
    const dispatcher = new tools.Agent({ connect: { ca: loginIssuer.caPem } });
    const refreshed = await tools.fetch(`${loginIssuer.url}/token`, {
      method: 'POST',
      body: new URLSearchParams({
        grant_type: 'refresh_token',
        refresh_token: session.refreshToken,
        client_id: loginIssuer.clientId,
      }),
      dispatcher,
    });
    expect({ status: refreshed.status, body: await refreshed.json() }).toMatchObject({
      status: 400,
      body: { error: 'invalid_grant' },
    });
    await dispatcher.close();
    // And kubectl asks for a login again.
    const again = await kubectlWithBrowser();
    expect(again.browserError).toBeUndefined();
    expect(again).toMatchObject({ code: 0, browsed: true, stdout: CLI_USER });
    expect(again.stderr).toMatch(/^Log in to https:\/\/127\.0\.0\.1:\d+ in a browser:\n/);
  });
});

describe('what the concierge and the agent wrote down', () => {
  it('never logs a token, a key or a bootstrap secret', () => {
    expect(logLines.length).toBeGreaterThan(0);
    const all = logLines.join('');
    for (const secret of secrets) {
      // Keys are PEM: look for their base64 body, which a JSON log line would keep as it is.
      const needle = secret.includes('-----BEGIN') ? (secret.split('\n')[1] ?? secret) : secret;
      expect({ leaked: all.includes(needle) ? needle.slice(0, 24) : undefined }).toEqual({
        leaked: undefined,
      });
    }
  });
});
