// A reason's way through a TokenCredentialRequest: checked by reasonProblem (a bad one is a 400 naming spec.reason),
// written by the signer into the certificate's own extension, and read back from it by the authenticator over a real
// TLS connection into identity.reason. A certificate whose extension is not exactly what the signer writes is refused
// whole, as any bad credential.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { connect as tlsConnect, createServer as createTLSServer, type TLSSocket } from 'node:tls';
// Before @peculiar/x509, whose internals need the Reflect metadata polyfill (as lib/pki/pki.ts loads it).
import 'reflect-metadata';
import * as x509 from '@peculiar/x509';
import * as asn1js from 'asn1js';
import { MAX_REASON_LENGTH } from '../../apis/access.ts';
import { apiGroups } from '../../apis/groups.ts';
import { REASON_EXTENSION_OID, type ClusterCredential } from '../../apis/login.ts';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { AuthResult } from '../../lib/authn/types.ts';
import type { Request } from '../../lib/http2/request.ts';
import { newLogger } from '../../lib/log.ts';
import {
  certificateText,
  CertificateTextError,
  fingerprint,
  issueCert,
  newCA,
  newKeyPair,
  privateKeyToPem,
  type CertificateAuthority,
} from '../../lib/pki/pki.ts';
import { CERTIFICATE_BAD_REASON, newRequestAuthenticator, type Identity } from './authenticate.ts';
import { newClientCertSigner } from './credentials.ts';
import { handleTokenCredentialRequest } from './login-apis.ts';

const groups = apiGroups();
let signer: CertificateAuthority;
let server: Server;
let url: string;
/** The tokens the authenticator was asked about: a refused request must cost it nothing. */
const asked: string[] = [];
const cache = new AuthenticatorCache();

beforeAll(async () => {
  signer = await newCA('tcr-signer');
  cache.set('WebhookAuthenticator', 'static', {
    authenticate: (token): Promise<AuthResult> => {
      asked.push(token);
      return Promise.resolve(
        token === 'erin-token'
          ? { ok: true, authenticator: 'static', user: { username: 'erin', groups: ['devs'], extra: {} } }
          : { ok: false, reason: 'unknown token' },
      );
    },
  });
  const deps = {
    groups,
    cache,
    signer: newClientCertSigner(() => signer),
    log: newLogger({ level: 'silent' }),
  };
  server = createServer((req, res) => {
    void handleTokenCredentialRequest(req, res, '/tokencredentialrequests', deps);
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/tokencredentialrequests`;
});

afterAll(async () => {
  await new Promise((done) => server.close(done));
});

/** What the tests read of an answer: a TokenCredentialRequest's status, or a Status. */
interface Answer {
  status: number;
  body: {
    kind?: string;
    code?: number;
    message?: string;
    details?: { causes?: { field?: string }[] };
    status?: { credential?: ClusterCredential };
  };
}

/** The credential an answer carries, with its key (the concierge made it: these requests send no CSR). */
function credentialOf(answer: Answer): { certPem: string; keyPem: string } {
  const credential = answer.body.status?.credential;
  if (!credential?.clientKeyData) throw new Error(`no credential: ${JSON.stringify(answer.body)}`);
  return { certPem: credential.clientCertificateData, keyPem: credential.clientKeyData };
}

const derOf = (pem: string): Uint8Array => new Uint8Array(new x509.X509Certificate(pem).rawData);

/** A TokenCredentialRequest with `spec` besides the token and the authenticator, and its answer. */
async function exchange(spec: Record<string, unknown>, query = ''): Promise<Answer> {
  const answer = await fetch(`${url}${query}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      apiVersion: `${groups.login}/v1alpha1`,
      kind: 'TokenCredentialRequest',
      spec: {
        token: 'erin-token',
        authenticator: { apiGroup: groups.authentication, kind: 'WebhookAuthenticator', name: 'static' },
        ...spec,
      },
    }),
  });
  return { status: answer.status, body: (await answer.json()) as Answer['body'] };
}

/**
 * Who the proxy's authenticator takes a real TLS connection presenting `credential` for: the connection is made to a
 * server that trusts the signer, and its server-side socket is what a request would carry.
 */
async function identityOver(credential: { certPem: string; keyPem: string }): Promise<Identity> {
  const serving = await issueCert(signer, { commonName: 'serving', hosts: ['127.0.0.1'], usage: 'server' });
  const tlsServer = createTLSServer({
    cert: serving.certPem,
    key: serving.keyPem,
    ca: signer.certPem,
    requestCert: true,
    rejectUnauthorized: false,
  });
  const accepted = new Promise<TLSSocket>((done) => tlsServer.once('secureConnection', done));
  await new Promise<void>((done) => tlsServer.listen(0, '127.0.0.1', done));
  const client = tlsConnect({
    host: '127.0.0.1',
    port: (tlsServer.address() as AddressInfo).port,
    ca: signer.certPem,
    cert: credential.certPem,
    key: credential.keyPem,
  });
  client.on('error', () => {});
  try {
    const socket = await accepted;
    const authenticator = newRequestAuthenticator(
      cache,
      { tokenReview: () => Promise.resolve({ authenticated: false }), allowed: () => Promise.resolve(false) },
      () => new Set([fingerprint(signer.certPem)]),
    );
    return await authenticator.authenticate({ headers: {}, socket } as unknown as Request);
  } finally {
    client.destroy();
    await new Promise((done) => tlsServer.close(done));
  }
}

describe('a reason through TokenCredentialRequest', () => {
  it("names an OID whose every arc Go's X.509 parser takes (kubectl refuses a certificate with one past 2^63)", () => {
    const arcs = REASON_EXTENSION_OID.split('.').map((arc) => BigInt(arc));
    expect(arcs.every((arc) => arc < 2n ** 63n)).toBe(true);
  });

  it.each([
    ['an incident number', 'INC-123'],
    ['words, quotes and commas', 'restore "orders", then check the queue'],
    ['text beyond ASCII', 'Störung — ваш сервер 🔥'],
    ['the longest allowed', 'r'.repeat(MAX_REASON_LENGTH)],
  ])('carries %s from spec.reason into the certificate and the identity', async (_, reason) => {
    const answer = await exchange({ reason });
    expect(answer.status).toBe(201);
    const credential = credentialOf(answer);
    expect(certificateText(derOf(credential.certPem), REASON_EXTENSION_OID)).toBe(reason);
    const extension = new x509.X509Certificate(credential.certPem).getExtension(REASON_EXTENSION_OID);
    expect(extension?.critical).toBe(false);
    const identity = await identityOver(credential);
    expect(identity).toMatchObject({ kind: 'user', user: { username: 'erin' }, reason });
  });

  it('issues a certificate without the extension, and an identity without a reason, when none is given', async () => {
    const answer = await exchange({});
    expect(answer.status).toBe(201);
    const credential = credentialOf(answer);
    expect(certificateText(derOf(credential.certPem), REASON_EXTENSION_OID)).toBeUndefined();
    const identity = await identityOver(credential);
    expect(identity).toMatchObject({ kind: 'user', user: { username: 'erin' } });
    expect('reason' in identity).toBe(false);
  });

  it('knows spec.reason under strict field validation', async () => {
    expect((await exchange({ reason: 'INC-123' }, '?fieldValidation=Strict')).status).toBe(201);
  });

  it.each([
    ['empty', ''],
    ['only spaces', '   '],
    ['a newline', 'INC-1\nsystem:masters'],
    ['an escape sequence', 'INC-1\u001b[2J'],
    ['a NUL', 'INC\u0000'],
    ['DEL', 'INC\u007f'],
    ['a C1 control', 'INC\u0085'],
    ['a line separator', 'INC\u2028'],
    ['over the length', 'r'.repeat(MAX_REASON_LENGTH + 1)],
    ['a number', 42],
    ['null', null],
    ['an object', { text: 'INC-1' }],
    ['a list', ['INC-1']],
  ])('refuses %s with a 400 naming spec.reason, never asking the authenticator', async (_, reason) => {
    asked.length = 0;
    const answer = await exchange({ reason });
    expect(answer.status).toBe(400);
    expect(answer.body).toMatchObject({ kind: 'Status', code: 400 });
    expect(answer.body.message).toMatch(/^spec\.reason /);
    expect(answer.body.details?.causes?.[0]).toMatchObject({ field: 'spec.reason' });
    if (typeof reason === 'string' && reason.length > 3)
      expect(answer.body.message).not.toContain(reason.trim());
    expect(asked).toEqual([]);
  });
});

/** A client certificate from the signer with `extensions` of a test's making, and its key. */
async function certificateWith(extensions: x509.Extension[]): Promise<{ certPem: string; keyPem: string }> {
  const keys = await newKeyPair();
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: '01',
    subject: 'CN=mallory',
    issuer: signer.cert.subjectName,
    notBefore: new Date(Date.now() - 60_000),
    notAfter: new Date(Date.now() + 600_000),
    publicKey: keys.publicKey,
    signingKey: signer.keys.privateKey,
    signingAlgorithm: { name: 'ECDSA', hash: 'SHA-256' },
    extensions: [new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.clientAuth]), ...extensions],
  });
  return { certPem: cert.toString('pem'), keyPem: await privateKeyToPem(keys.privateKey) };
}

const utf8 = (text: string): ArrayBuffer => new asn1js.Utf8String({ value: text }).toBER(false);
const bytes = (...b: number[]): ArrayBuffer => new Uint8Array(b).buffer;
const reasonExtension = (value: ArrayBuffer, critical = false): x509.Extension =>
  new x509.Extension(REASON_EXTENSION_OID, critical, value);

describe('a certificate whose reason cannot be read', () => {
  it('takes a well-formed one made the same way (the control)', async () => {
    const identity = await identityOver(await certificateWith([reasonExtension(utf8('INC-7'))]));
    expect(identity).toMatchObject({ kind: 'user', user: { username: 'mallory' }, reason: 'INC-7' });
  });

  it.each([
    ['an OCTET STRING', () => [reasonExtension(new asn1js.OctetString({ valueHex: utf8('INC') }).toBER())]],
    ['a PrintableString', () => [reasonExtension(new asn1js.PrintableString({ value: 'INC' }).toBER())]],
    ['bytes after the UTF8String', () => [reasonExtension(bytes(0x0c, 0x01, 0x41, 0x00))]],
    ['a long-form length', () => [reasonExtension(bytes(0x0c, 0x81, 0x01, 0x41))]],
    ['a constructed UTF8String', () => [reasonExtension(bytes(0x2c, 0x03, 0x0c, 0x01, 0x41))]],
    ['an indefinite length', () => [reasonExtension(bytes(0x0c, 0x80, 0x41, 0x00, 0x00))]],
    ['a truncated value', () => [reasonExtension(bytes(0x0c, 0x05, 0x41))]],
    ['not UTF-8', () => [reasonExtension(bytes(0x0c, 0x02, 0xc3, 0x28))]],
    ['a lone surrogate as UTF-8', () => [reasonExtension(bytes(0x0c, 0x03, 0xed, 0xa0, 0x80))]],
    ['a newline', () => [reasonExtension(utf8('INC-1\nsystem:masters'))]],
    ['an empty reason', () => [reasonExtension(utf8(''))]],
    ['an overlong reason', () => [reasonExtension(utf8('r'.repeat(MAX_REASON_LENGTH + 1)))]],
    ['the extension twice', () => [reasonExtension(utf8('INC-1')), reasonExtension(utf8('INC-2'))]],
  ])('is refused whole when the extension is %s', async (_, extensions) => {
    const identity = await identityOver(await certificateWith(extensions()));
    expect(identity).toEqual({ kind: 'anonymous', reason: CERTIFICATE_BAD_REASON });
  });

  it('is refused when the extension is marked critical: the handshake does not verify it, and the reader refuses it too', async () => {
    const credential = await certificateWith([reasonExtension(utf8('INC-1'), true)]);
    // OpenSSL's verification refuses an unknown critical extension before anything of ours reads it.
    expect(await identityOver(credential)).toMatchObject({ kind: 'anonymous' });
    expect(() => certificateText(derOf(credential.certPem), REASON_EXTENSION_OID)).toThrow(
      CertificateTextError,
    );
  });
});
