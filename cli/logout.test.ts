// `sealion logout` against the real test issuer (oidc-provider, with revocation) and a scripted browser: the cached
// session and certificate go, and the refresh token is refused by the issuer afterwards.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { existsSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, fetch } from 'undici';
import { stringify } from 'yaml';
import { browse } from '../dev/browser.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { exchangeTarget, readCache, writeCache, type OIDCLoginFlags } from './exec-credential.ts';
import { oidcLogin, sessionFile, type Session } from './login-oidc.ts';
import { logout } from './logout.ts';

const PROXY = 'https://proxy.example.com';
let issuer: TestIssuer;
let dir: string;

const flags = (): OIDCLoginFlags => ({
  issuer: issuer.url,
  clientId: issuer.clientId,
  scopes: 'openid',
  caBundleData: issuer.caData,
  listenPort: '0',
  skipBrowser: true,
  exchange: true,
  authenticatorType: 'jwt',
  authenticatorName: 'corp',
  groupSuffix: 'sealion.dev',
  conciergeEndpoint: PROXY,
  conciergeCaBundleData: '',
});

/** A kubeconfig whose user runs `sealion login oidc` as get kubeconfig writes it. */
function kubeconfigFor(name: string, args: string[]): string {
  const path = join(dir, `${name}.kubeconfig`);
  writeFileSync(
    path,
    stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name, cluster: { server: PROXY } }],
      users: [
        { name, user: { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'sealion', args } } },
      ],
      contexts: [{ name, context: { cluster: name, user: name } }],
      'current-context': name,
    }),
  );
  return path;
}
const oidcArgs = (): string[] => {
  const f = flags();
  return [
    'login',
    'oidc',
    '--issuer',
    f.issuer,
    '--client-id',
    f.clientId,
    '--scopes',
    f.scopes,
    '--ca-bundle-data',
    f.caBundleData,
    '--skip-browser',
    '--exchange',
    '--authenticator-type',
    'jwt',
    '--authenticator-name',
    'corp',
    '--concierge-endpoint',
    PROXY,
  ];
};

/** Logs in through the browser into a fresh cache; the session, as cached. */
async function loggedIn(home: string): Promise<Session> {
  const env = { XDG_CONFIG_HOME: home };
  const login = oidcLogin({ ...flags(), exchange: false }, env, (line) => {
    const url = / in a browser:\n {2}(\S+)$/.exec(line)?.[1];
    if (url) void browse(url, { caPem: issuer.caPem });
  });
  await login;
  return readCache<Session>(sessionFile(flags(), env))!;
}

/** The issuer's answer to a refresh with `refreshToken`. */
async function refresh(refreshToken: string): Promise<{ status: number; error?: string }> {
  const dispatcher = new Agent({ connect: { ca: issuer.caPem } });
  try {
    const answer = await fetch(`${issuer.url}/token`, {
      method: 'POST',
      body: new URLSearchParams({
        grant_type: 'refresh_token',
        refresh_token: refreshToken,
        client_id: issuer.clientId,
      }),
      dispatcher,
    });
    return { status: answer.status, ...((await answer.json()) as { error?: string }) };
  } finally {
    await dispatcher.close();
  }
}

beforeAll(async () => {
  issuer = await startOIDCIssuer({ login: { username: 'ada@example.com', groups: ['readers'] } });
  dir = mkdtempSync(join(tmpdir(), 'sealion-logout-'));
});
afterAll(async () => {
  await issuer.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('sealion logout', () => {
  it("forgets the current context's session and certificate, and the issuer refuses the refresh token after", async () => {
    const home = mkdtempSync(join(dir, 'home-'));
    const env = { XDG_CONFIG_HOME: home };
    const session = await loggedIn(home);
    expect(session).toMatchObject({ issuer: issuer.url, clientId: issuer.clientId });
    // The certificate the plugin cached for this ID token, as --exchange keeps it.
    const certificate = exchangeTarget(session.idToken, flags(), env)!.file;
    writeCache(certificate, { kind: 'ExecCredential' });
    // Another login's session stays, and its refresh token keeps working: logout is about this context only.
    const otherHome = mkdtempSync(join(dir, 'home-'));
    const other = await loggedIn(otherHome);

    const result = await logout({ kubeconfig: kubeconfigFor('oidc', oidcArgs()), all: false }, env);
    expect(result.failed).toBe(false);
    expect(result.lines).toEqual([
      `Logged out of ${issuer.url} (client ${issuer.clientId}): its refresh token is revoked.`,
      'Deleted the cached client certificate.',
    ]);
    expect(existsSync(sessionFile(flags(), env))).toBe(false);
    expect(existsSync(certificate)).toBe(false);
    expect(await refresh(session.refreshToken!)).toMatchObject({ status: 400, error: 'invalid_grant' });
    expect(await refresh(other.refreshToken!)).toMatchObject({ status: 200 });
  });

  it('says so when the issuer has no revocation endpoint, and forgets everything with --all', async () => {
    // An issuer whose discovery document names no revocation endpoint.
    const ca = await newCA('bare-issuer-ca');
    const cert = await issueCert(ca, { commonName: 'issuer', hosts: ['127.0.0.1'], usage: 'server' });
    let url = '';
    const bare: Server = createServer({ cert: cert.certPem, key: cert.keyPem }, (_req, res) =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          issuer: url,
          token_endpoint: `${url}/token`,
          authorization_endpoint: `${url}/auth`,
        }),
      ),
    );
    await new Promise<void>((done) => bare.listen(0, '127.0.0.1', done));
    url = `https://127.0.0.1:${(bare.address() as AddressInfo).port}`;
    try {
      const home = mkdtempSync(join(dir, 'home-'));
      const env = { XDG_CONFIG_HOME: home };
      const revocable = await loggedIn(home);
      const bareFlags = { issuer: url, clientId: 'sealion-cli', scopes: 'openid' };
      writeCache(sessionFile(bareFlags, env), {
        idToken: 'x',
        idTokenExpiry: Date.now() + 60_000,
        refreshToken: 'bare-refresh',
        ...bareFlags,
        caBundleData: Buffer.from(ca.certPem).toString('base64'),
      });
      // Cached by a version that did not keep the issuer: it can only be deleted.
      writeCache(sessionFile({ ...bareFlags, scopes: 'old' }, env), {
        idToken: 'y',
        idTokenExpiry: 0,
        refreshToken: 'old-refresh',
      });
      writeCache(exchangeTarget('static', { ...flags(), authenticatorType: 'webhook' }, env)!.file, {});

      const result = await logout({ kubeconfig: '', all: true }, env);
      expect(result.failed).toBe(true);
      expect(result.lines).toEqual(
        expect.arrayContaining([
          `Logged out of ${issuer.url} (client ${issuer.clientId}): its refresh token is revoked.`,
          `Logged out of ${url} (client sealion-cli): the issuer offers no revocation endpoint, so its refresh token stays valid there until it expires (only the copy here is deleted).`,
          expect.stringMatching(
            /^Logged out of an unknown issuer: the session was cached by an older sealion/,
          ),
          'Deleted 1 cached client certificate(s).',
        ]),
      );
      for (const kind of ['sessions', 'credentials'])
        expect(readdirSync(join(home, 'sealion', kind)).filter((f) => f.endsWith('.json'))).toEqual([]);
      expect(await refresh(revocable.refreshToken!)).toMatchObject({ status: 400, error: 'invalid_grant' });
    } finally {
      bare.closeAllConnections();
      await new Promise((done) => bare.close(done));
    }
  });

  it("refuses a context whose user is not sealion's login plugin", async () => {
    const path = kubeconfigFor('other', ['oidc-login', 'get-token']);
    await expect(logout({ kubeconfig: path, all: false }, { XDG_CONFIG_HOME: dir })).rejects.toThrow(
      /^nothing to log out of for context \S+: its user \S+ does not log in with sealion login; pass --context, or --all to forget every cached login$/,
    );
  });
});
