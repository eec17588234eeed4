import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { base64url, exportSPKI, importJWK, SignJWT, type CryptoKey } from 'jose';
import { startOIDCIssuer, type TestIssuer } from '../../dev/oidc-issuer.ts';
import {
  EXPIRY_LEEWAY_SECONDS,
  validateJWT,
  VERIFIED_TOKEN_TTL_MS,
  type JWTAuthenticator,
  type JWTSettings,
} from './jwt.ts';
import type { AuthResult } from './types.ts';

let issuer: TestIssuer;
let authenticator: JWTAuthenticator;
let settings: JWTSettings;

function checksOf(v: Awaited<ReturnType<typeof validateJWT>>): Record<string, string> {
  return Object.fromEntries(v.checks.map((c) => [c.type, `${c.status}/${c.reason}`]));
}

beforeAll(async () => {
  issuer = await startOIDCIssuer();
  settings = { issuer: issuer.url, audience: 'sealion', caBundlePem: issuer.caPem };
  const v = await validateJWT(settings, undefined);
  if (!v.authenticator) throw new Error(JSON.stringify(v.checks));
  authenticator = v.authenticator;
});

afterAll(async () => {
  authenticator?.close();
  await issuer?.stop();
});

beforeEach(() => {
  issuer.setMode('discovery', 'ok');
  issuer.setMode('jwks', 'ok');
  issuer.setDiscoveryIssuer(undefined);
});

describe('JWT validation of the authenticator itself', () => {
  it('passes every check against a working issuer', async () => {
    const v = await validateJWT(settings, undefined);
    v.authenticator?.close();
    expect(checksOf(v)).toEqual({
      TLSConfigurationValid: 'True/Success',
      IssuerURLValid: 'True/Success',
      DiscoveryURLValid: 'True/Success',
      JWKSURLValid: 'True/Success',
      JWKSFetchValid: 'True/Success',
      AuthenticatorValid: 'True/Success',
    });
  });

  it.each([
    ['an http issuer', 'http://127.0.0.1:1', 'IssuerURLValid'],
    ['an issuer with a query', 'https://127.0.0.1:1/?x=1', 'IssuerURLValid'],
    ['the discovery URL as issuer', 'https://127.0.0.1:1/.well-known/openid-configuration', 'IssuerURLValid'],
  ])('rejects %s at the issuer URL check', async (_name, url, failed) => {
    const v = await validateJWT({ ...settings, issuer: url }, undefined);
    expect(v.authenticator).toBeUndefined();
    expect(checksOf(v)[failed]).toBe('False/InvalidIssuerURL');
    expect(checksOf(v)['AuthenticatorValid']).toBe('Unknown/UnableToValidate');
  });

  it('fails the discovery check without the right CA, saying why', async () => {
    const v = await validateJWT({ ...settings, caBundlePem: undefined }, undefined);
    expect(checksOf(v)['DiscoveryURLValid']).toBe('False/InvalidDiscoveryProbe');
    expect(v.checks.find((c) => c.type === 'DiscoveryURLValid')?.message).toMatch(
      /could not fetch .*certificate/,
    );
  });

  it('fails when discovery points to another issuer', async () => {
    issuer.setDiscoveryIssuer('https://evil.example.com');
    const v = await validateJWT(settings, undefined);
    expect(checksOf(v)['DiscoveryURLValid']).toBe('False/InvalidDiscoveryProbe');
    expect(v.checks.find((c) => c.type === 'DiscoveryURLValid')?.message).toContain(
      '"https://evil.example.com"',
    );
  });

  it.each([
    ['down', 'JWKSFetchValid', 'False/InvalidCouldNotFetchJWKS'],
    ['garbage', 'JWKSFetchValid', 'False/InvalidCouldNotFetchJWKS'],
  ] as const)('fails when the JWKS endpoint is %s', async (mode, check, want) => {
    issuer.setMode('jwks', mode);
    const v = await validateJWT(settings, undefined);
    expect(checksOf(v)[check]).toBe(want);
    expect(v.authenticator).toBeUndefined();
  });

  it('reports a bad CA bundle at the TLS check', async () => {
    const v = await validateJWT(settings, 'no PEM certificate found');
    expect(checksOf(v)['TLSConfigurationValid']).toBe('False/InvalidTLSConfiguration');
    expect(checksOf(v)['DiscoveryURLValid']).toBe('Unknown/UnableToValidate');
  });
});

describe('JWT authentication', () => {
  it('maps the username and groups claims, groups as a list or a string', async () => {
    const list = await authenticator.authenticate(
      await issuer.mint({ username: 'alice', groups: ['dev', 'ops'] }),
    );
    expect(list).toMatchObject({ ok: true, user: { username: 'alice', groups: ['dev', 'ops'], extra: {} } });
    const single = await authenticator.authenticate(await issuer.mint({ username: 'bob', groups: 'dev' }));
    expect(single).toMatchObject({ ok: true, user: { username: 'bob', groups: ['dev'] } });
    const none = await authenticator.authenticate(await issuer.mint({ username: 'carol' }));
    expect(none).toMatchObject({ ok: true, user: { username: 'carol', groups: [] } });
  });

  it('uses configured claim names', async () => {
    const v = await validateJWT({ ...settings, usernameClaim: 'email', groupsClaim: 'roles' }, undefined);
    const token = await issuer.mint({ email: 'dana@example.com', roles: ['admin'], email_verified: true });
    expect(await v.authenticator?.authenticate(token)).toMatchObject({
      ok: true,
      user: { username: 'dana@example.com', groups: ['admin'] },
    });
    const unverified = await issuer.mint({ email: 'eve@example.com', email_verified: false });
    expect(await v.authenticator?.authenticate(unverified)).toMatchObject({ ok: false });
    v.authenticator?.close();
  });

  const header = (h: object): string => base64url.encode(JSON.stringify(h));

  it.each<[string, () => Promise<string>, RegExp]>([
    ['a malformed token', () => Promise.resolve('not.a.jwt'), /ERR_JWS_INVALID|ERR_JWT_INVALID/],
    ['garbage', () => Promise.resolve('%%%'), /ERR_JWS_INVALID/],
    [
      'alg none',
      () =>
        Promise.resolve(
          `${header({ alg: 'none', typ: 'JWT' })}.${base64url.encode(JSON.stringify({ iss: issuer.url, aud: 'sealion', username: 'mallory', exp: 9999999999 }))}.`,
        ),
      /ERR_JOSE_ALG_NOT_ALLOWED|ERR_JWS_INVALID/,
    ],
    [
      'HS256 signed with the public key',
      async () => {
        // The published key's own bytes as an HMAC secret: the key-confusion attack.
        const jwk = issuer.currentJWK();
        const spki = await exportSPKI((await importJWK(jwk, 'ES256')) as CryptoKey);
        return new SignJWT({ username: 'mallory' })
          .setProtectedHeader({ alg: 'HS256', kid: jwk.kid })
          .setIssuer(issuer.url)
          .setAudience('sealion')
          .setExpirationTime('5m')
          .sign(new TextEncoder().encode(spki));
      },
      /ERR_JOSE_ALG_NOT_ALLOWED/,
    ],
    ['an expired token', () => issuer.mint({ username: 'a' }, { expiresIn: -120 }), /ERR_JWT_EXPIRED/],
    [
      'a token not yet valid',
      () => issuer.mint({ username: 'a' }, { notBefore: 600 }),
      /ERR_JWT_CLAIM_VALIDATION_FAILED.*nbf/,
    ],
    [
      'a wrong audience',
      () => issuer.mint({ username: 'a' }, { audience: 'someone-else' }),
      /ERR_JWT_CLAIM_VALIDATION_FAILED.*aud/,
    ],
    [
      'a wrong issuer',
      () => issuer.mint({ username: 'a' }, { issuer: 'https://other.example.com' }),
      /ERR_JWT_CLAIM_VALIDATION_FAILED.*iss/,
    ],
    [
      'a key the issuer never published',
      async () => issuer.mint({ username: 'a' }, { signingKey: await issuer.newKey() }),
      /ERR_JWKS_NO_MATCHING_KEY/,
    ],
    ['a token of 1 MiB', () => Promise.resolve('a'.repeat(1024 * 1024)), /over the limit/],
    ['no username claim', () => issuer.mint({ sub: 'x' }), /claim username/],
    [
      'groups of the wrong type',
      () => issuer.mint({ username: 'a', groups: { admin: true } }),
      /claim groups/,
    ],
  ])('rejects %s cleanly', async (_name, token, reason) => {
    const result = await authenticator.authenticate(await token());
    expect(result.ok).toBe(false);
    expect(result.ok ? '' : result.reason).toMatch(reason);
  });

  it('says how long a verified answer may be reused: never past exp, nor the cache lifetime', async () => {
    const at = Date.now();
    const soon = await authenticator.authenticate(await issuer.mint({ username: 'a' }, { expiresIn: 10 }));
    const later = await authenticator.authenticate(await issuer.mint({ username: 'a' }, { expiresIn: 3600 }));
    const until = (r: AuthResult): number => (r.ok ? (r.reusableUntil ?? 0) : 0);
    // exp has whole seconds, so it may lie up to a second before the requested expiry.
    expect(until(soon)).toBeGreaterThanOrEqual(at + (10 + EXPIRY_LEEWAY_SECONDS - 1) * 1000);
    expect(until(soon)).toBeLessThanOrEqual(Date.now() + (10 + EXPIRY_LEEWAY_SECONDS) * 1000);
    expect(until(later)).toBeGreaterThanOrEqual(at + VERIFIED_TOKEN_TTL_MS);
    expect(until(later)).toBeLessThanOrEqual(Date.now() + VERIFIED_TOKEN_TTL_MS);
  });

  it('tolerates clock skew as the API server does: five minutes on nbf, none on exp', async () => {
    expect(
      (await authenticator.authenticate(await issuer.mint({ username: 'a' }, { expiresIn: -2 }))).ok,
    ).toBe(false);
    expect(
      (await authenticator.authenticate(await issuer.mint({ username: 'a' }, { notBefore: 240 }))).ok,
    ).toBe(true);
    expect(
      (await authenticator.authenticate(await issuer.mint({ username: 'a' }, { notBefore: 360 }))).ok,
    ).toBe(false);
  });
});

describe('JWT key handling', () => {
  it('picks up a rotated key on an unknown kid, at most once per cooldown', async () => {
    let clock = Date.now();
    const v = await validateJWT(settings, undefined, { now: () => clock });
    const auth = v.authenticator!;
    // Right after the first fetch: loading the keys starts no cooldown, so a key rotated in now is found at once.
    const key = await issuer.newKey();
    issuer.rotate(key);
    const before = issuer.jwksRequests();
    const token = await issuer.mint({ username: 'rotated' });
    // Many concurrent tokens with the new kid share one refresh.
    const results = await Promise.all(Array.from({ length: 20 }, () => auth.authenticate(token)));
    expect(results.filter((r) => !r.ok)).toEqual([]);
    expect(issuer.jwksRequests() - before).toBe(1);
    // Unknown kids right after a refresh do not cause another fetch.
    const stranger = await issuer.mint({ username: 'x' }, { signingKey: await issuer.newKey() });
    expect((await auth.authenticate(stranger)).ok).toBe(false);
    expect(issuer.jwksRequests() - before).toBe(1);
    // Once the cooldown has passed, an unknown kid may fetch again (and only once more).
    clock += 31_000;
    expect((await auth.authenticate(stranger)).ok).toBe(false);
    expect((await auth.authenticate(stranger)).ok).toBe(false);
    expect(issuer.jwksRequests() - before).toBe(2);
    auth.close();
  });

  it('keeps serving with the last good keys while the issuer is down', async () => {
    const v = await validateJWT(settings, undefined);
    const auth = v.authenticator!;
    issuer.setMode('jwks', 'down');
    await auth.keys.refresh();
    expect(await auth.authenticate(await issuer.mint({ username: 'still-works' }))).toMatchObject({
      ok: true,
    });
    issuer.setMode('jwks', 'garbage');
    await auth.keys.refresh();
    expect(await auth.authenticate(await issuer.mint({ username: 'still-works' }))).toMatchObject({
      ok: true,
    });
    auth.close();
  });
});

/** Authenticators built by the tests below, each against the issuer's current keys (earlier tests rotate them). */
const built: JWTAuthenticator[] = [];
afterAll(() => built.forEach((a) => a.close()));
async function withSettings(more: Partial<JWTSettings> = {}): Promise<JWTAuthenticator> {
  const v = await validateJWT({ ...settings, ...more }, undefined);
  if (!v.authenticator) throw new Error(JSON.stringify(v.checks));
  built.push(v.authenticator);
  return v.authenticator;
}

describe('email_verified', () => {
  let byEmail: JWTAuthenticator;
  beforeEach(async () => {
    byEmail = await withSettings({ usernameClaim: 'email' });
  });

  // Kubernetes parses email_verified as a boolean and refuses the token when that fails, so "false" is no yes.
  it.each<[string, unknown]>([
    ['the string "false"', 'false'],
    ['the string "true"', 'true'],
    ['the string "yes"', 'yes'],
    ['the number 0', 0],
    ['the number 1', 1],
    ['null', null],
    ['a list', [true]],
  ])('refuses %s, which is not a boolean', async (_name, value) => {
    const token = await issuer.mint({ email: 'dana@example.com', email_verified: value });
    expect(await byEmail.authenticate(token)).toEqual({
      ok: false,
      reason: 'claim email_verified is present but not a boolean',
    });
  });

  it('accepts true and an absent claim, refuses false', async () => {
    const verified = await issuer.mint({ email: 'dana@example.com', email_verified: true });
    expect(await byEmail.authenticate(verified)).toMatchObject({
      ok: true,
      user: { username: 'dana@example.com' },
    });
    const silent = await issuer.mint({ email: 'dana@example.com' });
    expect(await byEmail.authenticate(silent)).toMatchObject({ ok: true });
    const unverified = await issuer.mint({ email: 'dana@example.com', email_verified: false });
    expect(await byEmail.authenticate(unverified)).toEqual({ ok: false, reason: 'email is not verified' });
  });

  it('is not looked at when the username comes from another claim, as in Kubernetes', async () => {
    const token = await issuer.mint({ username: 'dana', email_verified: 'false' });
    expect(await (await withSettings()).authenticate(token)).toMatchObject({ ok: true });
  });
});

describe('system names and prefixes', () => {
  it.each<[string, Record<string, unknown>, RegExp]>([
    ['the username system:admin', { username: 'system:admin' }, /username "system:admin" is a system name/],
    [
      'a service account name',
      { username: 'system:serviceaccount:kube-system:default' },
      /username "system:serviceaccount:kube-system:default"/,
    ],
    [
      'the group system:masters',
      { username: 'eve', groups: ['dev', 'system:masters'] },
      /group "system:masters"/,
    ],
    [
      'system:masters as a single group',
      { username: 'eve', groups: 'system:masters' },
      /group "system:masters"/,
    ],
    ['the group system:nodes', { username: 'eve', groups: ['system:nodes'] }, /group "system:nodes"/],
    [
      'system:unauthenticated',
      { username: 'eve', groups: ['system:unauthenticated'] },
      /group "system:unauthenticated"/,
    ],
  ])('refuses a validly signed token with %s', async (_name, claims, reason) => {
    const token = await issuer.mint(claims);
    const result = await (await withSettings()).authenticate(token);
    expect(result).toMatchObject({ ok: false, reason: expect.stringMatching(reason) as unknown });
    // The reason names the claim, never the token.
    expect(result.ok ? '' : result.reason).not.toContain(token.split('.')[2]);
  });

  it('lets system:authenticated through, which every authenticated user has anyway', async () => {
    const token = await issuer.mint({ username: 'pat', groups: ['dev', 'system:authenticated'] });
    expect(await (await withSettings()).authenticate(token)).toMatchObject({
      ok: true,
      user: { username: 'pat', groups: ['dev', 'system:authenticated'] },
    });
  });

  it('puts the prefixes before the username and every group, and checks for system names after them', async () => {
    const prefixed = await withSettings({ usernamePrefix: 'oidc:', groupsPrefix: 'corp:' });
    const token = await issuer.mint({ username: 'system:admin', groups: ['system:masters', 'dev'] });
    expect(await prefixed.authenticate(token)).toMatchObject({
      ok: true,
      user: { username: 'oidc:system:admin', groups: ['corp:system:masters', 'corp:dev'] },
    });
    // A username prefix alone leaves the groups as they came: system:masters is still refused.
    const userOnly = await withSettings({ usernamePrefix: 'oidc:' });
    expect(await userOnly.authenticate(token)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/group "system:masters"/) as unknown,
    });
  });

  it('accepts system names from an authenticator that opts out', async () => {
    const trusting = await withSettings({ allowSystemNames: true });
    const token = await issuer.mint({ username: 'system:admin', groups: ['system:masters'] });
    expect(await trusting.authenticate(token)).toMatchObject({
      ok: true,
      user: { username: 'system:admin', groups: ['system:masters'] },
    });
  });

  it('never reads a claim from the object prototype', async () => {
    const byConstructor = await withSettings({ usernameClaim: 'constructor', groupsClaim: 'toString' });
    expect(await byConstructor.authenticate(await issuer.mint({ username: 'x' }))).toMatchObject({
      ok: false,
      reason: 'claim constructor is missing or not a string',
    });
    const token = await issuer.mint({ constructor: 'carol' });
    expect(await byConstructor.authenticate(token)).toMatchObject({
      ok: true,
      user: { username: 'carol', groups: [] },
    });
  });

  it.each<[string, Partial<JWTSettings>]>([
    ['a username prefix', { usernamePrefix: 'system:oidc:' }],
    ['a groups prefix', { groupsPrefix: 'system:' }],
  ])('fails AuthenticatorValid for %s that would make every name a system name', async (_name, more) => {
    const v = await validateJWT({ ...settings, ...more }, undefined);
    expect(v.authenticator).toBeUndefined();
    expect(checksOf(v)['AuthenticatorValid']).toBe('False/InvalidAuthenticator');
    expect(v.checks.find((c) => c.type === 'AuthenticatorValid')?.message).toMatch(/spec\.allowSystemNames/);
    const allowed = await validateJWT({ ...settings, ...more, allowSystemNames: true }, undefined);
    allowed.authenticator?.close();
    expect(checksOf(allowed)['AuthenticatorValid']).toBe('True/Success');
    expect(allowed.checks.find((c) => c.type === 'AuthenticatorValid')?.message).toMatch(
      /accepts usernames and groups that start with system:/,
    );
  });
});
