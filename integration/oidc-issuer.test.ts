// The local OIDC issuer (dev/oidc-issuer.ts) as the CLI meets it: openid-client as the client, dev/browser.ts as
// the browser. No cluster: what is checked here is the issuer every login test stands on.
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createLocalJWKSet, decodeProtectedHeader, jwtVerify, type JSONWebKeySet } from 'jose';
import * as oidc from 'openid-client';
import { Agent, fetch } from 'undici';
import { approveDevice, browse } from '../dev/browser.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const USER = 'dana@example.com';
const GROUPS = ['issuer-testers'];
/** What the CLI asks for. */
const CLI_SCOPES = 'openid offline_access email profile groups';

let issuer: TestIssuer;
let config: oidc.Configuration;
let trusting: Agent;

type Tokens = oidc.TokenEndpointResponse & oidc.TokenEndpointResponseHelpers;

/** openid-client set up as the CLI sets it up: a public client that trusts the issuer's CA. */
function discover(at: TestIssuer, agent: Agent): Promise<oidc.Configuration> {
  return oidc.discovery(new URL(at.url), at.clientId, undefined, oidc.None(), {
    [oidc.customFetch]: (url, init) => fetch(url, { ...(init as object), dispatcher: agent }),
  });
}

/**
 * The CLI's half of a code-flow login: a loopback callback that redeems the code with PKCE, and the scripted
 * browser for the user's half. `pkce: false` leaves the challenge out.
 */
async function codeLogin(
  at: TestIssuer,
  conf: oidc.Configuration,
  { pkce = true } = {},
): Promise<{ callback: { status: number; body: string }; tokens?: Tokens; error?: unknown }> {
  const verifier = oidc.randomPKCECodeVerifier();
  const server = createServer();
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const redirectUri = `http://127.0.0.1:${(server.address() as AddressInfo).port}/callback`;
  const result: { tokens?: Tokens; error?: unknown } = {};
  server.on('request', (req, res) => {
    oidc
      .authorizationCodeGrant(conf, new URL(req.url ?? '/', redirectUri), {
        pkceCodeVerifier: verifier,
        expectedState: 'the-state',
      })
      .then(
        (tokens) => {
          result.tokens = tokens;
          res.end('logged in');
        },
        (err: unknown) => {
          result.error = err;
          res.writeHead(400).end(`login failed: ${(err as Error).message}`);
        },
      );
  });
  try {
    const url = oidc.buildAuthorizationUrl(conf, {
      redirect_uri: redirectUri,
      scope: CLI_SCOPES,
      state: 'the-state',
      ...(pkce
        ? { code_challenge: await oidc.calculatePKCECodeChallenge(verifier), code_challenge_method: 'S256' }
        : {}),
    });
    return { callback: await browse(url.href, { caPem: at.caPem }), ...result };
  } finally {
    server.closeAllConnections();
    server.close();
  }
}

async function login(): Promise<Tokens> {
  const { tokens, error } = await codeLogin(issuer, config);
  if (!tokens) throw new Error(`login failed: ${String(error)}`);
  return tokens;
}

async function publishedKids(): Promise<string[]> {
  const jwks = (await (await fetch(`${issuer.url}/jwks`, { dispatcher: trusting })).json()) as JSONWebKeySet;
  return jwks.keys.map((k) => k.kid!).sort();
}

/** Checks an ID token's signature against what the issuer publishes now. */
async function verifyIDToken(idToken: string): Promise<Record<string, unknown>> {
  const jwks = (await (await fetch(`${issuer.url}/jwks`, { dispatcher: trusting })).json()) as JSONWebKeySet;
  const { payload } = await jwtVerify(idToken, createLocalJWKSet(jwks), {
    issuer: issuer.url,
    audience: issuer.clientId,
  });
  return payload;
}

beforeAll(async () => {
  issuer = await startOIDCIssuer({ login: { username: USER, groups: GROUPS } });
  trusting = new Agent({ connect: { ca: issuer.caPem } });
  config = await discover(issuer, trusting);
});

afterEach(() => issuer.setConsent('grant'));

afterAll(async () => {
  await issuer?.stop();
  await trusting?.close();
});

describe('the local OIDC issuer', () => {
  it('logs the configured user in with the code flow and PKCE, through the scripted browser', async () => {
    const before = issuer.grants();
    const { callback, tokens } = await codeLogin(issuer, config);
    expect(callback).toEqual({ status: 200, body: 'logged in' });
    const claims = await verifyIDToken(tokens!.id_token!);
    expect(claims).toMatchObject({ sub: USER, username: USER, groups: GROUPS, aud: 'sealion-cli' });
    expect((claims['exp'] as number) - (claims['iat'] as number)).toBe(300);
    expect(decodeProtectedHeader(tokens!.id_token!)).toMatchObject({
      alg: 'ES256',
      kid: issuer.currentJWK().kid,
    });
    expect(tokens!.refresh_token).toEqual(expect.any(String));
    expect(issuer.grants()).toEqual({ ...before, authorization_code: before.authorization_code + 1 });
  });

  it('refuses a login without PKCE', async () => {
    const { callback, error } = await codeLogin(issuer, config, { pkce: false });
    expect(callback.status).toBe(400);
    expect(error).toMatchObject({ error: 'invalid_request' });
  });

  it('rotates refresh tokens: each refreshes once', async () => {
    const first = await login();
    const second = await oidc.refreshTokenGrant(config, first.refresh_token!);
    expect(second.refresh_token).toEqual(expect.any(String));
    expect(second.refresh_token).not.toBe(first.refresh_token);
    expect(await verifyIDToken(second.id_token!)).toMatchObject({ sub: USER, groups: GROUPS });
    const third = await oidc.refreshTokenGrant(config, second.refresh_token!);
    expect(third.refresh_token).not.toBe(second.refresh_token);
    await expect(oidc.refreshTokenGrant(config, first.refresh_token!)).rejects.toMatchObject({
      error: 'invalid_grant',
    });
  });

  it('logs a device in with the device flow, by link or by typed code', async () => {
    const before = issuer.grants().device_code;
    const byLink = await oidc.initiateDeviceAuthorization(config, { scope: 'openid offline_access' });
    await approveDevice(byLink.verification_uri_complete!, { caPem: issuer.caPem });
    const tokens = await oidc.pollDeviceAuthorizationGrant(config, byLink);
    expect(await verifyIDToken(tokens.id_token!)).toMatchObject({
      sub: USER,
      username: USER,
      groups: GROUPS,
    });
    expect(tokens.refresh_token).toEqual(expect.any(String));

    const byCode = await oidc.initiateDeviceAuthorization(config, { scope: 'openid' });
    await approveDevice(
      { verificationUri: byCode.verification_uri, userCode: byCode.user_code },
      { caPem: issuer.caPem },
    );
    expect((await oidc.pollDeviceAuthorizationGrant(config, byCode)).id_token).toEqual(expect.any(String));
    expect(issuer.grants().device_code).toBe(before + 2);

    // A used code, like a wrong one, ends on the issuer's page with its message.
    await expect(approveDevice(byLink.verification_uri_complete!, { caPem: issuer.caPem })).rejects.toThrow(
      /code has already been used/,
    );
  });

  it('rotates keys: publishes both, signs with the new one, and keeps refresh tokens and sessions', async () => {
    const before = await login();
    const old = issuer.currentJWK().kid!;
    const key = await issuer.newKey();
    issuer.rotate(key);
    expect(await publishedKids()).toEqual([old, key.kid].sort());

    const refreshed = await oidc.refreshTokenGrant(config, before.refresh_token!);
    expect(decodeProtectedHeader(refreshed.id_token!).kid).toBe(key.kid);
    expect(await verifyIDToken(refreshed.id_token!)).toMatchObject({ sub: USER });
    expect(decodeProtectedHeader(await issuer.mint({ username: 'x' })).kid).toBe(key.kid);
    // The old key's tokens still verify while it is published.
    expect(await verifyIDToken(before.id_token!)).toMatchObject({ sub: USER });

    // Logins go on across a rotation that drops the old key.
    const last = await issuer.newKey();
    issuer.rotate(last, { dropOld: true });
    expect(await publishedKids()).toEqual([last.kid]);
    const after = await login();
    expect(decodeProtectedHeader(after.id_token!).kid).toBe(last.kid);
    expect(
      decodeProtectedHeader((await oidc.refreshTokenGrant(config, refreshed.refresh_token!)).id_token!).kid,
    ).toBe(last.kid);
  });

  it('revokes a refresh token, which then refreshes nothing', async () => {
    const tokens = await login();
    await issuer.revoke(tokens.refresh_token!);
    await expect(oidc.refreshTokenGrant(config, tokens.refresh_token!)).rejects.toMatchObject({
      error: 'invalid_grant',
    });
  });

  it('ends logins with access_denied when the user denies consent', async () => {
    issuer.setConsent('deny');
    const { callback, error } = await codeLogin(issuer, config);
    expect(callback.status).toBe(400);
    expect(error).toMatchObject({ error: 'access_denied' });

    const device = await oidc.initiateDeviceAuthorization(config, { scope: 'openid' });
    await expect(approveDevice(device.verification_uri_complete!, { caPem: issuer.caPem })).rejects.toThrow(
      /aborted/,
    );
    await expect(oidc.pollDeviceAuthorizationGrant(config, device)).rejects.toMatchObject({
      error: 'access_denied',
    });
  });

  it('breaks discovery and JWKS on purpose, and stops while a request hangs', async () => {
    const broken = await startOIDCIssuer();
    const agent = new Agent({ connect: { ca: broken.caPem } });
    const get = (path: string): ReturnType<typeof fetch> =>
      fetch(`${broken.url}${path}`, { dispatcher: agent });
    try {
      broken.setMode('jwks', 'down');
      expect((await get('/jwks')).status).toBe(503);
      broken.setMode('jwks', 'garbage');
      await expect((await get('/jwks')).json()).rejects.toThrow(SyntaxError);
      broken.setDiscoveryIssuer('https://elsewhere.example.com');
      expect(await (await get('/.well-known/openid-configuration')).json()).toMatchObject({
        issuer: 'https://elsewhere.example.com',
        jwks_uri: `${broken.url}/jwks`,
      });
      broken.setMode('jwks', 'hang');
      const hanging = get('/jwks');
      await eventually(() => expect(broken.jwksRequests()).toBe(3));
      await broken.stop();
      await expect(hanging).rejects.toThrow();
    } finally {
      await agent.close();
    }
  });

  it('serves below a path in its URL', async () => {
    const below = await startOIDCIssuer({ path: '/dex', login: { username: USER, groups: GROUPS } });
    const agent = new Agent({ connect: { ca: below.caPem } });
    try {
      expect(below.url).toMatch(/\/dex$/);
      const discovery = (await (
        await fetch(`${below.url}/.well-known/openid-configuration`, { dispatcher: agent })
      ).json()) as Record<string, string>;
      expect(discovery).toMatchObject({ issuer: below.url, jwks_uri: `${below.url}/jwks` });
      const { tokens } = await codeLogin(below, await discover(below, agent));
      expect(tokens?.claims()).toMatchObject({ iss: below.url, sub: USER });
    } finally {
      await below.stop();
      await agent.close();
    }
  });
});
