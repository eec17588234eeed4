// `sealion login --reason`: the reason kept in reason.json, and the plugin's exchange while one is set, against a
// stand-in for the proxy that serves the real TokenCredentialRequest handler and signer over TLS, so that the
// certificate the plugin caches is one the concierge would issue, its reason in our extension.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { apiGroups } from '../apis/groups.ts';
import { REASON_EXTENSION_OID } from '../apis/login.ts';
import { newClientCertSigner, type ClientCertSigner } from '../concierge/proxy/credentials.ts';
import { handleTokenCredentialRequest } from '../concierge/proxy/login-apis.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import { newLogger } from '../lib/log.ts';
import { certificateText, issueCert, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { staticLogin, type StaticLoginFlags } from './exec-credential.ts';
import { logout } from './logout.ts';
import {
  clearReason,
  currentReason,
  DEFAULT_REASON_MS,
  loginReason,
  parseReasonDuration,
  reasonFile,
  setReason,
} from './reason.ts';

let server: Server;
let endpoint: string;
let caData: string;
let signer: CertificateAuthority;
let home: string;
/** The spec.reason of each TokenCredentialRequest the stand-in received (null: none). */
const sent: (string | null)[] = [];
/** Plays the cluster's signer (the direct path), which cannot write the extension. */
let dropsExtensions = false;

const flags = (over: Partial<StaticLoginFlags> = {}): StaticLoginFlags => ({
  token: '',
  tokenEnv: 'T',
  exchange: false,
  authenticatorType: 'webhook',
  authenticatorName: 'static',
  groupSuffix: 'sealion.dev',
  conciergeEndpoint: '',
  conciergeCaBundleData: '',
  ...over,
});
const env = (): NodeJS.ProcessEnv => ({
  T: 'erin-token',
  XDG_CONFIG_HOME: home,
  KUBERNETES_EXEC_INFO: JSON.stringify({
    kind: 'ExecCredential',
    spec: { cluster: { server: endpoint, 'certificate-authority-data': caData } },
  }),
});
const reasonIn = (pem: string | undefined): string | undefined =>
  certificateText(new X509Certificate(pem!).raw, REASON_EXTENSION_OID);

beforeAll(async () => {
  signer = await newCA('tcr-signer');
  const ca = await newCA('proxy-ca');
  const serving = await issueCert(ca, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
  caData = Buffer.from(ca.certPem).toString('base64');
  const cache = new AuthenticatorCache();
  cache.set('WebhookAuthenticator', 'static', {
    authenticate: (token) =>
      Promise.resolve(
        token === 'erin-token'
          ? { ok: true, authenticator: 'static', user: { username: 'erin', groups: [], extra: {} } }
          : { ok: false, reason: 'unknown token' },
      ),
  });
  const real = newClientCertSigner(() => signer);
  const clusterLike: ClientCertSigner = {
    issue: (user, { reason: _dropped, ...options }) => real.issue(user, options),
  };
  const chosen: ClientCertSigner = {
    issue: (user, options) => (dropsExtensions ? clusterLike : real).issue(user, options),
  };
  const deps = {
    groups: apiGroups(),
    cache,
    signer: chosen,
    log: newLogger({ level: 'silent' }),
  };
  const prefix = `/apis/${apiGroups().login}/v1alpha1`;
  server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
    // The body is read again here only to see what the plugin sent: a copy of the stream's chunks.
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const spec = (JSON.parse(Buffer.concat(chunks).toString()) as { spec: { reason?: string } }).spec;
      sent.push(spec.reason ?? null);
    });
    void handleTokenCredentialRequest(req, res, (req.url ?? '').slice(prefix.length), deps);
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'sealion-reason-'));
  sent.length = 0;
  dropsExtensions = false;
});

afterEach(() => rmSync(home, { recursive: true, force: true }));

afterAll(async () => {
  await new Promise((done) => server.close(done));
});

describe('reason.json', () => {
  it('keeps a reason 0600 for 12 hours by default, and forgets it once expired', () => {
    const now = Date.parse('2026-11-29T08:00:00Z');
    const stored = setReason(env(), 'INC-123', undefined, now);
    expect(stored).toEqual({ reason: 'INC-123', expiresAt: new Date(now + DEFAULT_REASON_MS).toISOString() });
    expect(JSON.parse(readFileSync(reasonFile(env()), 'utf8'))).toEqual(stored);
    expect(statSync(reasonFile(env())).mode & 0o777).toBe(0o600);
    expect(currentReason(env(), now + 1000)).toEqual(stored);
    expect(currentReason(env(), now + DEFAULT_REASON_MS)).toBeUndefined();
    expect(clearReason(env())).toBe(true);
    expect(clearReason(env())).toBe(false);
    expect(currentReason(env(), now)).toBeUndefined();
  });

  it.each([
    ['a newline', 'INC-1\nsystem:masters'],
    ['an escape sequence', '\u001b]0;owned\u0007'],
    ['only spaces', '  '],
    ['over 512 characters', 'x'.repeat(513)],
  ])('refuses %s, naming --reason and keeping nothing', (_, reason) => {
    expect(() => setReason(env(), reason)).toThrow(/^--reason must/);
    expect(currentReason(env())).toBeUndefined();
  });

  it.each([
    ['not JSON', 'INC-1'],
    [
      'a reason with a control character',
      JSON.stringify({ reason: 'a\u0000', expiresAt: '2999-01-01T00:00:00Z' }),
    ],
    ['no expiry', JSON.stringify({ reason: 'INC-1' })],
    ['an unreadable expiry', JSON.stringify({ reason: 'INC-1', expiresAt: 'soon' })],
    ['a list', '[]'],
  ])('takes a file holding %s for no reason at all', (_, text) => {
    setReason(env(), 'INC-0');
    writeFileSync(reasonFile(env()), text);
    expect(currentReason(env())).toBeUndefined();
  });

  it.each([
    ['4h', 4 * 3600_000],
    ['90m', 90 * 60_000],
    ['1h30m', 90 * 60_000],
    ['168h', 7 * 24 * 3600_000],
  ])('takes --reason-for %s', (text, ms) => expect(parseReasonDuration(text)).toBe(ms));

  it.each(['', '0m', '30s', '169h', '4 hours', '-1h', '1d', 'h'])('refuses --reason-for %j', (text) =>
    expect(() => parseReasonDuration(text)).toThrow(/^--reason-for takes a duration/),
  );

  it('says what sealion login did, and refuses flags that contradict each other', () => {
    expect(loginReason({}, env())).toEqual([expect.stringMatching(/^No reason set\./)]);
    expect(loginReason({ reason: 'INC-9', reasonFor: '4h' }, env())[0]).toMatch(/^Reason set until /);
    expect(loginReason({}, env())[0]).toBe('Reason: INC-9');
    expect(() => loginReason({ reason: 'x', clearReason: true }, env())).toThrow(/not both/);
    expect(() => loginReason({ reasonFor: '4h' }, env())).toThrow(/--reason-for/);
    expect(loginReason({ clearReason: true }, env())[0]).toMatch(/^Cleared the reason/);
  });
});

describe('the plugin while a reason is set', () => {
  it('exchanges even without --exchange, with spec.reason, and the certificate carries it', async () => {
    setReason(env(), 'INC-123');
    const credential = await staticLogin(flags(), env());
    expect(sent).toEqual(['INC-123']);
    expect(reasonIn(credential.status.clientCertificateData)).toBe('INC-123');
  });

  it('hands out the token as it is once the reason is cleared (without --exchange)', async () => {
    setReason(env(), 'INC-123');
    await staticLogin(flags(), env());
    clearReason(env());
    expect((await staticLogin(flags(), env())).status).toEqual({ token: 'erin-token' });
  });

  it('caches per reason: the same reason reuses its certificate, a new one gets a new certificate', async () => {
    const login = (): ReturnType<typeof staticLogin> => staticLogin(flags({ exchange: true }), env());
    const plain = await login();
    expect(reasonIn(plain.status.clientCertificateData)).toBeUndefined();
    setReason(env(), 'INC-1');
    const first = await login();
    expect(await login()).toEqual(first);
    setReason(env(), 'INC-2');
    const second = await login();
    expect(reasonIn(first.status.clientCertificateData)).toBe('INC-1');
    expect(reasonIn(second.status.clientCertificateData)).toBe('INC-2');
    clearReason(env());
    // The certificate without a reason is still cached: no exchange for it.
    expect(await login()).toEqual(plain);
    expect(sent).toEqual([null, 'INC-1', 'INC-2']);
  });

  it('ends the credential no later than the reason, so that a client that keeps it asks again then', async () => {
    setReason(env(), 'INC-5', 2 * 60_000);
    const credential = await staticLogin(flags(), env());
    expect(credential.status.expirationTimestamp).toBe(currentReason(env())!.expiresAt);
  });

  it('says in one line what to do when the kubeconfig names no authenticator, and hands out the token', async () => {
    setReason(env(), 'INC-123');
    const said: string[] = [];
    const credential = await staticLogin(flags({ authenticatorName: '' }), env(), (l) => said.push(l));
    expect(credential.status).toEqual({ token: 'erin-token' });
    expect(said).toEqual([
      expect.stringMatching(
        /^warning: a reason is set .* write the kubeconfig again with sealion get kubeconfig$/,
      ),
    ]);
    expect(sent).toEqual([]);
  });

  it('says so when the certificate does not carry the reason (the direct path), naming the proxy', async () => {
    dropsExtensions = true;
    setReason(env(), 'INC-123');
    const said: string[] = [];
    const credential = await staticLogin(flags({ exchange: true }), env(), (l) => said.push(l));
    expect(reasonIn(credential.status.clientCertificateData)).toBeUndefined();
    expect(said).toEqual([expect.stringMatching(/does not carry your reason.*--mode proxy$/)]);
    expect(said[0]).not.toContain('\n');
  });

  it('takes a reason.json edited past what setReason takes for none, and exchanges nothing', async () => {
    setReason(env(), 'INC-0');
    writeFileSync(
      reasonFile(env()),
      JSON.stringify({ reason: 'r'.repeat(600), expiresAt: '2999-01-01T00:00:00Z' }),
    );
    expect((await staticLogin(flags(), env())).status).toEqual({ token: 'erin-token' });
    expect(sent).toEqual([]);
  });
});

describe('sealion logout', () => {
  it('clears the reason and forgets the certificate that carries it', async () => {
    setReason(env(), 'INC-123');
    await staticLogin(flags(), env());
    const kubeconfig = join(home, 'kubeconfig');
    writeFileSync(
      kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: { server: endpoint } }],
        users: [
          {
            name: 'u',
            user: {
              exec: {
                apiVersion: 'client.authentication.k8s.io/v1',
                command: 'sealion',
                args: ['login', 'static', '--token-env', 'T', '--authenticator-name', 'static'],
              },
            },
          },
        ],
        contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'c',
      }),
    );
    const result = await logout({ kubeconfig, all: false }, env());
    expect(result.lines).toEqual(
      expect.arrayContaining(['Deleted the cached client certificate.', 'Cleared the reason.']),
    );
    expect(currentReason(env())).toBeUndefined();
    // The next run, without a reason and without --exchange: the token as it is.
    expect((await staticLogin(flags(), env())).status).toEqual({ token: 'erin-token' });
  });
});
