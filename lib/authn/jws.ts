// A JWT's signature and registered claims, checked with node:crypto in one synchronous call. jose made these checks
// before; since version 6 it verifies through WebCrypto only, where each verification is an asynchronous job on
// libuv's thread pool: the hop there and back, and the promises around it, cost a first verification more than an
// RS256 signature check itself (a CPU profile of `npm run bench -- auth` showed the main thread idle for 60% of it,
// waiting for the pool). Here a verification is one `crypto.verify` with a key imported once per key set, and the
// token is decoded once. What jose checked is checked the same way: the algorithm from an allow-list of asymmetric
// ones, a key whose type, curve, size, `alg` and `key_ops` fit it, no `crit` extension, then iss, aud, exp and nbf.
import { constants, createPublicKey, verify, type KeyObject } from 'node:crypto';
import type { JSONWebKeySet, JWTPayload } from 'jose';
import { JWT_SHAPE } from './types.ts';

/** What each accepted algorithm needs of its key and signature. */
interface Algorithm {
  kty: 'RSA' | 'EC' | 'OKP';
  /** The digest node:crypto hashes with; null where the algorithm hashes itself (Ed25519). */
  hash: string | null;
  /** EC and OKP: the curve the key must be on. */
  crv?: string;
  /** RSASSA-PSS, with a salt as long as the digest (RFC 7518 3.5). */
  pss?: true;
  /** EC and OKP signatures have a fixed length (R and S, each as long as the curve's order). */
  signatureBytes?: number;
}

/**
 * Asymmetric algorithms only: `none` proves nothing, and an HMAC "signed" with the public key is the classic
 * key-confusion attack. EdDSA means Ed25519 here, as in jose 6 and the API server.
 */
const ALGORITHMS: Readonly<Record<string, Algorithm>> = {
  RS256: { kty: 'RSA', hash: 'sha256' },
  RS384: { kty: 'RSA', hash: 'sha384' },
  RS512: { kty: 'RSA', hash: 'sha512' },
  PS256: { kty: 'RSA', hash: 'sha256', pss: true },
  PS384: { kty: 'RSA', hash: 'sha384', pss: true },
  PS512: { kty: 'RSA', hash: 'sha512', pss: true },
  ES256: { kty: 'EC', hash: 'sha256', crv: 'P-256', signatureBytes: 64 },
  ES384: { kty: 'EC', hash: 'sha384', crv: 'P-384', signatureBytes: 96 },
  ES512: { kty: 'EC', hash: 'sha512', crv: 'P-521', signatureBytes: 132 },
  EdDSA: { kty: 'OKP', hash: null, crv: 'Ed25519', signatureBytes: 64 },
  Ed25519: { kty: 'OKP', hash: null, crv: 'Ed25519', signatureBytes: 64 },
};
export const ALLOWED_ALGORITHMS: readonly string[] = Object.keys(ALGORITHMS);

/** RSA keys shorter than this are refused, as jose refuses them: 1024-bit RSA is within reach of factoring. */
export const MIN_RSA_BITS = 2048;

/** One published key, imported. */
interface VerificationKey {
  kid: string | undefined;
  /** The JWK's `alg`, when it names one: the key is then for that algorithm only. */
  alg: string | undefined;
  kty: string;
  crv: string | undefined;
  key: KeyObject;
}

/** A key that imports and may verify signatures, or undefined (the key is left out, as one never published). */
function importKey(jwk: JSONWebKeySet['keys'][number]): VerificationKey | undefined {
  if (typeof jwk.kty !== 'string') return undefined;
  if (Array.isArray(jwk.key_ops) && !jwk.key_ops.includes('verify')) return undefined;
  let key: KeyObject;
  try {
    // Only the public members: a JWK that also carries `d` must not become a private key here.
    const { kty, crv, x, y, n, e } = jwk;
    key = createPublicKey({ key: { kty, crv, x, y, n, e }, format: 'jwk' });
  } catch {
    return undefined;
  }
  if (jwk.kty === 'RSA' && (key.asymmetricKeyDetails?.modulusLength ?? 0) < MIN_RSA_BITS) return undefined;
  return {
    kid: typeof jwk.kid === 'string' ? jwk.kid : undefined,
    alg: typeof jwk.alg === 'string' ? jwk.alg : undefined,
    kty: jwk.kty,
    crv: typeof jwk.crv === 'string' ? jwk.crv : undefined,
    key,
  };
}

/** An issuer's published keys, each imported once, so that a verification costs no key parsing. */
export class VerificationKeys {
  private readonly keys: VerificationKey[];

  constructor(jwks: JSONWebKeySet) {
    this.keys = jwks.keys.flatMap((jwk) => importKey(jwk) ?? []);
  }

  /** The keys a token with this `kid` and algorithm may be signed with: several only without a kid, in a rotation. */
  candidates(kid: unknown, alg: string, algorithm: Algorithm): VerificationKey[] {
    return this.keys.filter(
      (k) =>
        // A kid that is not a string names no key (go-jose refuses the header), rather than every key.
        (kid === undefined || k.kid === kid) &&
        k.kty === algorithm.kty &&
        (algorithm.crv === undefined || k.crv === algorithm.crv) &&
        (k.alg === undefined || k.alg === alg),
    );
  }
}

/** How a token's claims are judged. */
export interface ClaimRules {
  issuer: string;
  /** The token's aud (a string or a list) must name one of these. */
  audiences: readonly string[];
  /** Seconds an nbf may lie in the future (an issuer whose clock runs ahead). */
  notBeforeLeewaySeconds: number;
  /** Seconds a token is still taken after its exp. */
  expiryLeewaySeconds: number;
  /** Seconds since the epoch. */
  now: number;
}

/** The failure codes jose used for the same failures, so that logs and tests read the same as before. */
export type JWSFailureCode =
  | 'ERR_JWS_INVALID'
  | 'ERR_JWT_INVALID'
  | 'ERR_JOSE_ALG_NOT_ALLOWED'
  | 'ERR_JOSE_NOT_SUPPORTED'
  | 'ERR_JWKS_NO_MATCHING_KEY'
  | 'ERR_JWS_SIGNATURE_VERIFICATION_FAILED'
  | 'ERR_JWT_EXPIRED'
  | 'ERR_JWT_CLAIM_VALIDATION_FAILED';

export type Verified =
  { ok: true; payload: JWTPayload } | { ok: false; code: JWSFailureCode; message: string };

const refuse = (code: JWSFailureCode, message: string): Verified => ({ ok: false, code, message });

/** A JSON object decoded from a base64url part, or undefined for anything else. */
function decodeObject(part: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(Buffer.from(part, 'base64url').toString('utf8'));
    return value !== null && typeof value === 'object' && !Array.isArray(value)
      ? (value as Record<string, unknown>)
      : undefined;
  } catch {
    return undefined;
  }
}

/** Whether one of the keys signed `signingInput` with `signature` under `algorithm`. */
function signedByOneOf(
  keys: VerificationKey[],
  algorithm: Algorithm,
  signingInput: Buffer,
  signature: Buffer,
): boolean {
  if (algorithm.signatureBytes !== undefined && signature.length !== algorithm.signatureBytes) return false;
  return keys.some((k) => {
    try {
      return verify(
        algorithm.hash,
        signingInput,
        algorithm.pss
          ? {
              key: k.key,
              padding: constants.RSA_PKCS1_PSS_PADDING,
              saltLength: constants.RSA_PSS_SALTLEN_DIGEST,
            }
          : algorithm.kty === 'EC'
            ? { key: k.key, dsaEncoding: 'ieee-p1363' }
            : k.key,
        signature,
      );
    } catch {
      // A signature OpenSSL cannot even parse for this key is not this key's.
      return false;
    }
  });
}

/** Whether a NumericDate claim is absent or a number. */
/** A number JSON can spell but Go's float64 cannot hold (`1e400` parses as Infinity here) is refused, as Go does. */
const isNumericDate = (value: unknown): value is number =>
  typeof value === 'number' && Number.isFinite(value);
const numericOrAbsent = (value: unknown): boolean => value === undefined || isNumericDate(value);

/** The registered claims of a verified payload, judged by `rules`: undefined when they pass. */
function claimsProblem(payload: JWTPayload, rules: ClaimRules): Verified | undefined {
  if (payload.iss !== rules.issuer)
    return refuse('ERR_JWT_CLAIM_VALIDATION_FAILED', 'unexpected "iss" claim value');
  const aud = payload.aud;
  const audienceMatches =
    typeof aud === 'string'
      ? rules.audiences.includes(aud)
      : Array.isArray(aud) && aud.some((a) => typeof a === 'string' && rules.audiences.includes(a));
  if (!audienceMatches) return refuse('ERR_JWT_CLAIM_VALIDATION_FAILED', 'unexpected "aud" claim value');
  if (!isNumericDate(payload.exp))
    return refuse('ERR_JWT_CLAIM_VALIDATION_FAILED', 'missing or non-numeric "exp" claim');
  if (!numericOrAbsent(payload.nbf) || !numericOrAbsent(payload.iat))
    return refuse('ERR_JWT_CLAIM_VALIDATION_FAILED', '"nbf" and "iat" claims must be numbers');
  if (payload.exp + rules.expiryLeewaySeconds <= rules.now)
    return refuse('ERR_JWT_EXPIRED', '"exp" claim timestamp check failed');
  if (payload.nbf !== undefined && payload.nbf > rules.now + rules.notBeforeLeewaySeconds)
    return refuse('ERR_JWT_CLAIM_VALIDATION_FAILED', '"nbf" claim timestamp check failed');
  return undefined;
}

/**
 * Verifies a compact JWT: its header, its signature by one of `keys`, then its claims (nothing of the payload is
 * read before the signature holds). Never throws. ERR_JWKS_NO_MATCHING_KEY means no published key fits the token's
 * kid and algorithm: the caller may fetch the keys again and retry.
 */
export function verifyJWT(token: string, keys: VerificationKeys, rules: ClaimRules): Verified {
  if (!JWT_SHAPE.test(token)) return refuse('ERR_JWS_INVALID', 'not a compact JWS');
  const headerEnd = token.indexOf('.');
  const signatureStart = token.lastIndexOf('.') + 1;
  // A part one character past a whole number of bytes is no base64url at all; Buffer would drop the character, and
  // so take a token and the same with a letter appended as one.
  if ([headerEnd, signatureStart - 1 - headerEnd - 1, token.length - signatureStart].some((n) => n % 4 === 1))
    return refuse('ERR_JWS_INVALID', 'a part of the token is not base64url');
  const header = decodeObject(token.slice(0, headerEnd));
  if (header === undefined) return refuse('ERR_JWS_INVALID', 'the protected header is not a JSON object');
  // No extension is understood here, so a token that makes one critical is refused (RFC 7515 4.1.11).
  if (header['crit'] !== undefined)
    return refuse('ERR_JOSE_NOT_SUPPORTED', 'critical header extensions are not supported');
  const alg = header['alg'];
  const algorithm = typeof alg === 'string' && Object.hasOwn(ALGORITHMS, alg) ? ALGORITHMS[alg] : undefined;
  if (algorithm === undefined || typeof alg !== 'string')
    return refuse('ERR_JOSE_ALG_NOT_ALLOWED', '"alg" (Algorithm) Header Parameter value not allowed');
  const candidates = keys.candidates(header['kid'], alg, algorithm);
  if (candidates.length === 0)
    return refuse('ERR_JWKS_NO_MATCHING_KEY', 'no applicable key found in the JSON Web Key Set');
  const signingInput = Buffer.from(token.slice(0, signatureStart - 1), 'latin1');
  const signature = Buffer.from(token.slice(signatureStart), 'base64url');
  if (!signedByOneOf(candidates, algorithm, signingInput, signature))
    return refuse('ERR_JWS_SIGNATURE_VERIFICATION_FAILED', 'signature verification failed');
  const payload: JWTPayload | undefined = decodeObject(token.slice(headerEnd + 1, signatureStart - 1));
  if (payload === undefined)
    return refuse('ERR_JWT_INVALID', 'JWT Claims Set must be a top-level JSON object');
  return claimsProblem(payload, rules) ?? { ok: true, payload };
}
