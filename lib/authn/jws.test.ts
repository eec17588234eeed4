// The synchronous JWT check: every algorithm it allows verifies tokens jose signs, and each way a token or key can be
// wrong is refused with the code jose gave it.
import { describe, expect, it } from '@jest/globals';
import { generateKeyPairSync, sign as cryptoSign } from 'node:crypto';
import {
  base64url,
  CompactSign,
  exportJWK,
  generateKeyPair,
  SignJWT,
  type CryptoKey,
  type JWK,
  type JWTPayload,
} from 'jose';
import { ALLOWED_ALGORITHMS, VerificationKeys, verifyJWT, type ClaimRules } from './jws.ts';
import { usableKeys } from './jwt.ts';

const ISSUER = 'https://issuer.example.com';
const now = Math.floor(Date.now() / 1000);
const rules: ClaimRules = {
  issuer: ISSUER,
  audiences: ['sealion', 'other'],
  notBeforeLeewaySeconds: 300,
  expiryLeewaySeconds: 0,
  now,
};
const claims: JWTPayload = { iss: ISSUER, aud: 'sealion', exp: now + 600, sub: 'alice' };

async function keyPair(alg: string, kid = alg): Promise<{ privateKey: CryptoKey; jwk: JWK }> {
  const { privateKey, publicKey } = await generateKeyPair(alg, { extractable: true });
  return { privateKey, jwk: { ...(await exportJWK(publicKey)), kid, alg } };
}

const sign = (payload: JWTPayload, alg: string, key: CryptoKey, header: object = {}): Promise<string> =>
  new SignJWT(payload).setProtectedHeader({ alg, kid: alg, ...header }).sign(key);

/** A token with the given header and payload and the signature of another token: for checks made before it. */
const forged = (header: object, payload: object, from: string): string =>
  `${base64url.encode(JSON.stringify(header))}.${base64url.encode(JSON.stringify(payload))}.${from.split('.')[2]}`;

describe('verifyJWT', () => {
  it.each(ALLOWED_ALGORITHMS)('verifies a token signed with %s and gives its payload', async (alg) => {
    const { privateKey, jwk } = await keyPair(alg === 'Ed25519' ? 'EdDSA' : alg, alg);
    const keys = new VerificationKeys({ keys: [{ ...jwk, alg }] });
    const token = await sign(claims, alg, privateKey);
    expect(verifyJWT(token, keys, rules)).toEqual({ ok: true, payload: claims });
    // One changed byte of the payload, and the signature no longer holds.
    const [h, p, s] = token.split('.');
    const other = base64url.encode(JSON.stringify({ ...claims, sub: 'mallory' }));
    expect(verifyJWT(`${h}.${other}.${s}`, keys, rules)).toMatchObject({
      ok: false,
      code: 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED',
    });
    expect(p).not.toBe(other);
  });

  it('tries each key that fits a token without a kid, as during a rotation', async () => {
    const [old, current] = [await keyPair('RS256', 'old'), await keyPair('RS256', 'new')];
    const keys = new VerificationKeys({ keys: [old.jwk, current.jwk] });
    const token = await new SignJWT(claims).setProtectedHeader({ alg: 'RS256' }).sign(current.privateKey);
    expect(verifyJWT(token, keys, rules)).toMatchObject({ ok: true });
    // With a kid, only that key: the old one's kid on the new one's signature fails.
    const misnamed = await sign(claims, 'RS256', current.privateKey, { kid: 'old' });
    expect(verifyJWT(misnamed, keys, rules)).toMatchObject({ code: 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED' });
  });

  it('refuses keys that do not fit the token, or may not verify at all', async () => {
    const es256 = await keyPair('ES256');
    const token = await sign(claims, 'ES256', es256.privateKey);
    const refused = (jwk: JWK): unknown => verifyJWT(token, new VerificationKeys({ keys: [jwk] }), rules);
    // A key published for another algorithm, one whose operations exclude verify, one on another curve.
    expect(refused({ ...es256.jwk, alg: 'ES384' })).toMatchObject({ code: 'ERR_JWKS_NO_MATCHING_KEY' });
    expect(refused({ ...es256.jwk, key_ops: ['sign'] })).toMatchObject({ code: 'ERR_JWKS_NO_MATCHING_KEY' });
    const p384 = await keyPair('ES384', 'ES256');
    expect(refused({ ...p384.jwk, alg: undefined })).toMatchObject({ code: 'ERR_JWKS_NO_MATCHING_KEY' });
    // An RSA key of 1024 bits is not taken, whatever it signed.
    const weak = generateKeyPairSync('rsa', { modulusLength: 1024 });
    const weakJWK = { ...weak.publicKey.export({ format: 'jwk' }), kid: 'RS256', alg: 'RS256' };
    // jose will not sign with it either: the signature is made by hand.
    const input = `${base64url.encode(JSON.stringify({ alg: 'RS256', kid: 'RS256' }))}.${base64url.encode(JSON.stringify(claims))}`;
    const weakToken = `${input}.${cryptoSign('sha256', Buffer.from(input), weak.privateKey).toString('base64url')}`;
    expect(verifyJWT(weakToken, new VerificationKeys({ keys: [weakJWK] }), rules)).toMatchObject({
      code: 'ERR_JWKS_NO_MATCHING_KEY',
    });
  });

  it('refuses headers it cannot trust before looking for a key', async () => {
    const { privateKey, jwk } = await keyPair('ES256');
    const keys = new VerificationKeys({ keys: [jwk] });
    const token = await sign(claims, 'ES256', privateKey);
    const cases: [object, string][] = [
      [{ alg: 'none' }, 'ERR_JOSE_ALG_NOT_ALLOWED'],
      [{ alg: 'HS256', kid: 'ES256' }, 'ERR_JOSE_ALG_NOT_ALLOWED'],
      [{ alg: 'toString', kid: 'ES256' }, 'ERR_JOSE_ALG_NOT_ALLOWED'],
      [{ alg: 'ES256', kid: 'ES256', crit: ['exp'], exp: 1 }, 'ERR_JOSE_NOT_SUPPORTED'],
      [{ alg: 'ES256', kid: 'ES256', b64: false, crit: ['b64'] }, 'ERR_JOSE_NOT_SUPPORTED'],
      [{ alg: 'ES256', kid: 'unknown' }, 'ERR_JWKS_NO_MATCHING_KEY'],
    ];
    for (const [header, code] of cases)
      expect([header, verifyJWT(forged(header, claims, token), keys, rules)]).toMatchObject([
        header,
        { ok: false, code },
      ]);
    for (const malformed of ['%%%', 'a.b', 'a.b.c.d', `${base64url.encode('[1]')}.e30.`, '.e30.'])
      expect(verifyJWT(malformed, keys, rules)).toMatchObject({ ok: false, code: 'ERR_JWS_INVALID' });
    // Letters appended to the signature (86 characters) leave one past whole bytes, which a lenient decoder drops:
    // another token, refused as no base64url rather than taken as the same.
    expect(verifyJWT(`${token}AAA`, keys, rules)).toMatchObject({ ok: false, code: 'ERR_JWS_INVALID' });
    // An ECDSA signature in DER rather than the 64 bytes JWS uses is refused.
    const der = Buffer.concat([Buffer.from([0x30, 0x44, 0x02, 0x20]), Buffer.alloc(68, 1)]).toString(
      'base64url',
    );
    expect(verifyJWT(`${token.slice(0, token.lastIndexOf('.'))}.${der}`, keys, rules)).toMatchObject({
      code: 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED',
    });
  });

  it.each<[string, Record<string, unknown> | unknown[], string]>([
    ['another issuer', { ...claims, iss: 'https://other.example.com' }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['no issuer', { ...claims, iss: undefined }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['another audience', { ...claims, aud: 'someone' }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['no audience', { ...claims, aud: undefined }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['an audience list without ours', { ...claims, aud: ['a', 'b'] }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['no exp', { ...claims, exp: undefined }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['an exp that is a string', { ...claims, exp: String(now + 600) }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['an iat that is a string', { ...claims, iat: 'yesterday' }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['an exp that is now', { ...claims, exp: now }, 'ERR_JWT_EXPIRED'],
    ['an nbf over five minutes ahead', { ...claims, nbf: now + 301 }, 'ERR_JWT_CLAIM_VALIDATION_FAILED'],
    ['a payload that is a list', [1, 2], 'ERR_JWT_INVALID'],
  ])('refuses a signed token with %s', async (_name, payload, code) => {
    const { privateKey, jwk } = await keyPair('RS256');
    const keys = new VerificationKeys({ keys: [jwk] });
    const token = Array.isArray(payload)
      ? await signedRaw(payload, privateKey)
      : await sign(
          Object.fromEntries(Object.entries(payload).filter(([, v]) => v !== undefined)),
          'RS256',
          privateKey,
        );
    expect(verifyJWT(token, keys, rules)).toMatchObject({ ok: false, code });
  });

  it('takes an audience list that names ours, and an nbf within five minutes', async () => {
    const { privateKey, jwk } = await keyPair('RS256');
    const keys = new VerificationKeys({ keys: [jwk] });
    const token = await sign(
      { ...claims, aud: ['x', 'other'], nbf: now + 299, iat: now },
      'RS256',
      privateKey,
    );
    expect(verifyJWT(token, keys, rules)).toMatchObject({ ok: true });
  });

  it('refuses what Go cannot read: a kid that is no string, a date past float64', async () => {
    const { privateKey, jwk } = await keyPair('RS256');
    const keys = new VerificationKeys({ keys: [jwk] });
    // A numeric kid names no key: it is not taken as "no kid", which would try every key.
    expect(verifyJWT(await sign(claims, 'RS256', privateKey, { kid: 5 }), keys, rules)).toMatchObject({
      ok: false,
    });
    // JSON spells 1e400; JavaScript reads it as Infinity, Go's float64 cannot hold it.
    const text = `{"iss":"${ISSUER}","aud":"sealion","sub":"alice","exp":1e400}`;
    const huge = await new CompactSign(new TextEncoder().encode(text))
      .setProtectedHeader({ alg: 'RS256', kid: 'RS256' })
      .sign(privateKey);
    expect(verifyJWT(huge, keys, rules)).toMatchObject({
      ok: false,
      code: 'ERR_JWT_CLAIM_VALIDATION_FAILED',
    });
  });

  it('keeps only the keys a key set marks for signatures, or leaves unmarked', async () => {
    const { jwk } = await keyPair('ES256');
    expect(
      usableKeys({ keys: [jwk, { ...jwk, use: 'sig' }, { ...jwk, use: 'enc' }, { ...jwk, use: 'foo' }] })
        .keys,
    ).toEqual([jwk, { ...jwk, use: 'sig' }]);
  });

  it('reads only the public members of a published key', async () => {
    const { privateKey, jwk } = await keyPair('ES256');
    const { jwk: other } = await keyPair('ES256');
    // A JWKS that (wrongly) publishes a private member: the public point alone is imported.
    const keys = new VerificationKeys({ keys: [{ ...jwk, d: other.x }] });
    expect(verifyJWT(await sign(claims, 'ES256', privateKey), keys, rules)).toMatchObject({ ok: true });
  });
});

/** A compact JWS over any JSON payload (jose's SignJWT takes objects only). */
function signedRaw(payload: unknown, key: CryptoKey): Promise<string> {
  return new CompactSign(new TextEncoder().encode(JSON.stringify(payload)))
    .setProtectedHeader({ alg: 'RS256', kid: 'RS256' })
    .sign(key);
}
