import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { X509Certificate } from 'node:crypto';
import { issueCert, newCA, publicKeyFromCSR, type CertificateAuthority } from '../lib/pki/pki.ts';
import { configDir, staticLogin, type StaticLoginFlags } from './exec-credential.ts';

// A stand-in for the proxy's TokenCredentialRequest endpoint: real TLS on port 0.
let server: Server;
let endpoint: string;
let caData: string;
let exchanges = 0;
let home: string;
let signer: CertificateAuthority;
/** Every request body the stand-in received, as sent. */
const bodies: string[] = [];
/** The certificates the stand-in made a key for, in order. */
const issued: string[] = [];

const flags = (over: Partial<StaticLoginFlags> = {}): StaticLoginFlags => ({
  token: 'good-token',
  tokenEnv: '',
  exchange: true,
  authenticatorType: 'jwt',
  authenticatorName: 'corp',
  groupSuffix: 'sealion.dev',
  conciergeEndpoint: '',
  conciergeCaBundleData: '',
  ...over,
});
const env = (): NodeJS.ProcessEnv => ({
  XDG_CONFIG_HOME: home,
  KUBERNETES_EXEC_INFO: JSON.stringify({
    kind: 'ExecCredential',
    spec: { cluster: { server: endpoint, 'certificate-authority-data': caData } },
  }),
});

beforeAll(async () => {
  signer = await newCA('signer-ca');
  const ca = await newCA('proxy-ca');
  const cert = await issueCert(ca, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
  caData = Buffer.from(ca.certPem).toString('base64');
  server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      exchanges++;
      bodies.push(body);
      const spec = (
        JSON.parse(body) as {
          spec: { token: string; authenticator: { name: string }; certificateSigningRequest?: string };
        }
      ).spec;
      const ok =
        req.url === '/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests' &&
        spec.token.endsWith('good-token') &&
        spec.authenticator.name === 'corp';
      const expirationTimestamp = new Date(Date.now() + 5 * 60_000).toISOString();
      // `pop-good-token` plays Sealion's concierge, which certifies the CSR's key; any other token plays one that
      // makes a key itself (Pinniped's, which ignores the CSR).
      const answer = async (): Promise<object> => {
        if (!ok) return { message: 'authentication failed' };
        if (spec.token === 'pop-good-token' && spec.certificateSigningRequest) {
          const publicKey = await publicKeyFromCSR(spec.certificateSigningRequest);
          const cert = await issueCert(signer, { commonName: 'alice', usage: 'client', publicKey });
          return { credential: { clientCertificateData: cert.certPem, expirationTimestamp } };
        }
        const made = await issueCert(signer, { commonName: 'alice', usage: 'client' });
        issued.push(made.certPem);
        return {
          credential: {
            clientCertificateData: made.certPem,
            clientKeyData: made.keyPem,
            expirationTimestamp,
          },
        };
      };
      void answer().then((status) =>
        res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ status })),
      );
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

beforeEach(() => {
  home = mkdtempSync(join(tmpdir(), 'sealion-login-'));
  exchanges = 0;
  issued.length = 0;
});

afterEach(() => rmSync(home, { recursive: true, force: true }));

afterAll(async () => {
  await new Promise((done) => server.close(done));
});

describe('sealion login static', () => {
  it('prints the token as it is without --exchange', async () => {
    const credential = await staticLogin(flags({ exchange: false, token: '', tokenEnv: 'T' }), { T: 'abc' });
    expect(credential).toEqual({
      apiVersion: 'client.authentication.k8s.io/v1',
      kind: 'ExecCredential',
      status: { token: 'abc' },
    });
    await expect(staticLogin(flags({ token: '', tokenEnv: 'MISSING' }), {})).rejects.toThrow(/MISSING/);
  });

  it('exchanges the token for a certificate once, caches it 0600, and reuses it', async () => {
    const first = await staticLogin(flags(), env());
    expect(first.status.clientCertificateData).toBe(issued[0]);
    expect(await staticLogin(flags(), env())).toEqual(first);
    expect(exchanges).toBe(1);
    const dir = join(configDir(env()), 'credentials');
    const [file] = readdirSync(dir).filter((f) => f.endsWith('.json'));
    expect(statSync(join(dir, file!)).mode & 0o777).toBe(0o600);
    rmSync(home, { recursive: true });
  });

  it('exchanges again when the cached certificate is about to expire', async () => {
    await staticLogin(flags(), env());
    const dir = join(configDir(env()), 'credentials');
    const file = join(
      dir,
      readdirSync(dir).find((f) => f.endsWith('.json'))!,
    );
    const cached = JSON.parse(readFileSync(file, 'utf8')) as { status: { expirationTimestamp: string } };
    cached.status.expirationTimestamp = new Date(Date.now() + 10_000).toISOString();
    writeFileSync(file, JSON.stringify(cached));
    const renewed = await staticLogin(flags(), env());
    expect(renewed.status.clientCertificateData).toBe(issued[1]);
    rmSync(home, { recursive: true });
  });

  it('exchanges once when several plugins start at the same moment', async () => {
    const all = await Promise.all(Array.from({ length: 5 }, () => staticLogin(flags(), env())));
    expect(new Set(all.map((c) => c.status.clientCertificateData))).toEqual(new Set([issued[0]]));
    expect(exchanges).toBe(1);
    rmSync(home, { recursive: true });
  });

  it('sends a CSR by default and keeps the key it made; the certificate is checked to be for that key', async () => {
    bodies.length = 0;
    const credential = await staticLogin(flags({ token: 'pop-good-token' }), env());
    expect(bodies).toHaveLength(1);
    expect(bodies[0]).toContain('BEGIN CERTIFICATE REQUEST');
    expect(bodies[0]).not.toMatch(/PRIVATE KEY/);
    const cert = new X509Certificate(credential.status.clientCertificateData!);
    expect(
      cert.checkPrivateKey((await import('node:crypto')).createPrivateKey(credential.status.clientKeyData!)),
    ).toBe(true);
    rmSync(home, { recursive: true });
  });

  it('sends no CSR without proof of possession, and takes the key a Pinniped-style concierge makes', async () => {
    bodies.length = 0;
    const credential = await staticLogin(flags({ proofOfPossession: false }), env());
    expect(bodies[0]).not.toContain('certificateSigningRequest');
    expect(credential.status.clientCertificateData).toBe(issued[0]);
    expect(credential.status.clientKeyData).toMatch(/PRIVATE KEY/);
    rmSync(home, { recursive: true });
  });

  it('fails with the concierge’s answer for a bad token, naming the token and the authenticator, caching nothing', async () => {
    await expect(staticLogin(flags({ token: 'wrong' }), env())).rejects.toThrow(
      `JWTAuthenticator corp refused the token given with --token on ${endpoint}: authentication failed; check that it is current and meant for this cluster`,
    );
    await expect(staticLogin(flags({ token: '', tokenEnv: 'T' }), { ...env(), T: 'wrong' })).rejects.toThrow(
      /^JWTAuthenticator corp refused the token in environment variable T on /,
    );
    expect(readdirSync(join(configDir(env()), 'credentials')).filter((f) => f.endsWith('.json'))).toEqual([]);
    rmSync(home, { recursive: true });
  });
});
