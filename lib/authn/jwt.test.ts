import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { base64url, exportSPKI, importJWK, SignJWT, type CryptoKey } from 'jose';
import { startOIDCIssuer, type TestIssuer } from '../../integration/harness/oidc-issuer.ts';
import {
  CLOCK_LEEWAY_SECONDS,
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
      () => issuer.mint({ username: 'a' }, { notBefore: 300 }),
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

  it('says how long a verified answer may be reused: never past exp plus the leeway, nor the cache lifetime', async () => {
    const at = Date.now();
    const soon = await authenticator.authenticate(await issuer.mint({ username: 'a' }, { expiresIn: 10 }));
    const later = await authenticator.authenticate(await issuer.mint({ username: 'a' }, { expiresIn: 3600 }));
    const until = (r: AuthResult): number => (r.ok ? (r.reusableUntil ?? 0) : 0);
    // exp has whole seconds, so it may lie up to a second before the requested expiry.
    expect(until(soon)).toBeGreaterThanOrEqual(at + (10 + CLOCK_LEEWAY_SECONDS - 1) * 1000);
    expect(until(soon)).toBeLessThanOrEqual(Date.now() + (10 + CLOCK_LEEWAY_SECONDS) * 1000);
    expect(until(later)).toBeGreaterThanOrEqual(at + VERIFIED_TOKEN_TTL_MS);
    expect(until(later)).toBeLessThanOrEqual(Date.now() + VERIFIED_TOKEN_TTL_MS);
  });

  it('tolerates a little clock skew but not more', async () => {
    expect(
      (await authenticator.authenticate(await issuer.mint({ username: 'a' }, { expiresIn: -10 }))).ok,
    ).toBe(true);
    expect(
      (await authenticator.authenticate(await issuer.mint({ username: 'a' }, { notBefore: 10 }))).ok,
    ).toBe(true);
  });
});

describe('JWT key handling', () => {
  it('picks up a rotated key on an unknown kid, at most once per cooldown', async () => {
    let clock = Date.now();
    const v = await validateJWT(settings, undefined, { now: () => clock });
    const auth = v.authenticator!;
    clock += 60_000; // past the cooldown that started with the first fetch
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
