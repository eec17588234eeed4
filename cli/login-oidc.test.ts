import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import type { OIDCLoginFlags } from './exec-credential.ts';
import { explain, oidcLogin } from './login-oidc.ts';

const flags = (issuer: string): OIDCLoginFlags => ({
  issuer,
  clientId: 'sealion-cli',
  scopes: 'openid',
  caBundleData: '',
  listenPort: '0',
  skipBrowser: true,
  exchange: false,
  authenticatorType: 'jwt',
  authenticatorName: '',
  groupSuffix: 'sealion.dev',
  conciergeEndpoint: '',
  conciergeCaBundleData: '',
});

/** An error shaped as openid-client throws it: its wrapper, oauth4webapi's error, and what failed. */
const wrapped = (code: string, cause: object): Error =>
  Object.assign(new Error('openid-client says'), {
    code,
    cause: Object.assign(new Error('oauth4webapi says'), { code, cause }),
  });

describe('sealion login oidc explains what went wrong', () => {
  let home: string;
  let untrusted: Server;
  beforeAll(async () => {
    home = mkdtempSync(join(tmpdir(), 'sealion-oidc-'));
    const ca = await newCA('nobody-trusts-me');
    const cert = await issueCert(ca, { commonName: 'issuer', hosts: ['127.0.0.1'], usage: 'server' });
    untrusted = createServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) => res.end('{}'));
    await new Promise<void>((done) => untrusted.listen(0, '127.0.0.1', done));
  });
  afterAll(async () => {
    untrusted.closeAllConnections();
    await new Promise((done) => untrusted.close(done));
    rmSync(home, { recursive: true, force: true });
  });

  it('an issuer nobody listens for', async () => {
    // A port that was free a moment ago: nothing answers there.
    const closed = createServer();
    await new Promise<void>((done) => closed.listen(0, '127.0.0.1', done));
    const port = (closed.address() as AddressInfo).port;
    await new Promise((done) => closed.close(done));
    await expect(
      oidcLogin(flags(`https://127.0.0.1:${port}`), { XDG_CONFIG_HOME: home }, () => {}),
    ).rejects.toThrow(
      `login: cannot reach the issuer https://127.0.0.1:${port} during discovery: connection refused; is it running, and is --issuer right?`,
    );
  });

  it('an issuer whose certificate is not trusted', async () => {
    const url = `https://127.0.0.1:${(untrusted.address() as AddressInfo).port}`;
    await expect(oidcLogin(flags(url), { XDG_CONFIG_HOME: home }, () => {})).rejects.toThrow(
      /^login: cannot reach the issuer https:\/\/127\.0\.0\.1:\d+ during discovery: its certificate is (signed by an authority that is not trusted|self-signed and not trusted); give the issuer's CA bundle with --ca-bundle-data$/,
    );
  });

  it('a token for another client, a clock that is off, a login refused at the issuer', () => {
    const f = flags('https://issuer.example.com');
    expect(
      explain(
        wrapped('OAUTH_JWT_CLAIM_COMPARISON_FAILED', { claim: 'aud', claims: { aud: 'someone-else' } }),
        f,
        'login',
      ).message,
    ).toBe(
      'login: the issuer\'s ID token is for "someone-else", not for this client (sealion-cli): check --client-id against the client registered at the issuer',
    );
    expect(
      explain(
        wrapped('OAUTH_JWT_TIMESTAMP_CHECK_FAILED', {
          claim: 'exp',
          claims: { iat: 1000, exp: 1300 },
          now: 4600,
        }),
        f,
        'login',
      ).message,
    ).toBe(
      "login: the issuer's ID token is not valid at this machine's time (this machine's clock is about 3600 s from the issuer's): check the system clock",
    );
    const denied = Object.assign(new Error('authorization response from the server is an error'), {
      error: 'access_denied',
      error_description: 'End-User aborted interaction',
    });
    expect(explain(denied, f, 'login').message).toBe(
      'login: the login was refused at https://issuer.example.com: consent denied or the user may not use sealion-cli (End-User aborted interaction)',
    );
    expect(
      explain(Object.assign(new Error('x'), { error: 'expired_token' }), f, 'device login').message,
    ).toMatch(/the device code expired before the login was approved/);
  });
});
