// Who is calling: a client certificate from our signer CA, else a bearer token: a hub service account's token for
// Sealion's workload audience (a workload, which acts on clusters under a mapped name), else through the authenticator
// cache (JWT by issuer, else the webhooks), else a service-account token the API server itself confirms (forwarded
// as it came, not impersonated), else nobody.
import { AUTHENTICATOR_URI_PREFIX } from '../../apis/install.ts';
import type { TLSSocket } from 'node:tls';
import { decodeJwt } from 'jose';
import { AnswerCache, transientFailure, type AnswerCacheOptions } from '../../lib/authn/answer-cache.ts';
import { ConcurrencyLimit } from '../../lib/authn/concurrency-limit.ts';
import type { AuthenticatorBinding, AuthenticatorCache } from '../../lib/authn/cache.ts';
import { fail, JWT_SHAPE, type AuthResult, type UserInfo } from '../../lib/authn/types.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { peerChain } from '../../lib/pki/pem.ts';
import { REASON_EXTENSION_OID } from '../../apis/login.ts';
import { reasonProblem } from '../../apis/access.ts';
import { certificateText, certificateURIs } from '../../lib/pki/pki.ts';
import { parseAuthenticatorBinding } from './credentials.ts';
import type { Request } from '../../lib/http2/request.ts';

export type Identity =
  /** Impersonated: the proxy forwards with its own credentials and Impersonate-* headers. */
  | {
      kind: 'user';
      user: UserInfo;
      via: string;
      /** Why the user works now, as their credential carries it (`sealion login --reason`); checked when issued. */
      reason?: string;
    }
  /** A service account the API server knows: forwarded with its own token, unchanged. */
  | { kind: 'serviceaccount'; user: UserInfo; token: string }
  /**
   * A hub service account with a token for Sealion's workload audience, as the API server confirmed it: it reaches
   * other clusters under a name mapped from this one (decide.ts). Its token is not kept: it never leaves the hub.
   */
  | { kind: 'workload'; user: UserInfo }
  | { kind: 'anonymous'; reason: string };

/** Service-account answers: as briefly cached as webhook answers. */
export const SERVICE_ACCOUNT_TTL_MS = 60_000;
const SERVICE_ACCOUNT_FAILURE_TTL_MS = 10_000;
const SERVICE_ACCOUNT_ENTRIES = 10_000;
/**
 * TokenReviews the proxy has under way at once, of both kinds (a service account's own token, a workload's for
 * Sealion's audience), which share one limit. Any JWT-shaped token no authenticator accepts becomes one, and a
 * distinct junk token costs its sender nothing, so without a bound a flood of them turns into a flood on the API
 * server, made with the concierge's own credentials. Workloads that call through the proxy with their own
 * service-account token repeat it, and repeats are answered from the cache; sixteen at once is plenty for them.
 */
export const SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT = 16;
/**
 * TokenReviews waiting for one of those; past this, a token is refused at once without a review (and the refusal
 * is not remembered, so a retry asks again). Small, so that a slow API server makes callers wait at most a few
 * review times rather than pile up.
 */
export const SERVICE_ACCOUNT_REVIEWS_WAITING = 32;

/**
 * What a connection's verified client certificate says: who, from when until when (ms since the epoch), and the
 * fingerprints of the certificates it was verified through (its own, then each issuer up to the trusted CA).
 */
interface CertificateIdentity {
  user: UserInfo;
  notBefore: number;
  notAfter: number;
  chain: string[];
  /**
   * What the certificate is bound to (TokenCredentialRequest's); none for others; null for one that names a binding
   * no authenticator can hold (unreadable, from before bindings named the trust digest, or more than one).
   */
  binding?: AuthenticatorBinding | null;
  /** The reason it carries (TokenCredentialRequest's spec.reason); null for one it carries unreadably. */
  reason?: string | null;
}

/** Per connection, what its verified certificate says (null: none). getPeerCertificate is costly per request. */
const certificateIdentities = new WeakMap<object, CertificateIdentity | null>();

function readCertificate(req: Request): CertificateIdentity | null {
  const socket = req.socket as TLSSocket | undefined;
  if (!socket || typeof socket.getPeerCertificate !== 'function' || !socket.authorized) return null;
  const cert = socket.getPeerCertificate(true);
  const cn = cert?.subject?.CN;
  const o = cert?.subject?.O;
  const username = Array.isArray(cn) ? cn[0] : cn;
  if (!username) return null;
  // Read from the parsed extension, never from Node's formatted subjectaltname text.
  const bindings = certificateURIs(cert.raw).filter((uri) => uri.startsWith(AUTHENTICATOR_URI_PREFIX));
  const reason = certificateReason(cert.raw);
  return {
    user: { username, groups: o === undefined ? [] : Array.isArray(o) ? o : [o], extra: {} },
    ...(reason !== undefined ? { reason } : {}),
    notBefore: Date.parse(cert.valid_from),
    notAfter: Date.parse(cert.valid_to),
    chain: peerChain(cert).map((c) => c.fingerprint256),
    // Two bindings are one too many: such a certificate is bound to nothing an authenticator can hold.
    ...(bindings.length > 0
      ? { binding: bindings.length === 1 ? (parseAuthenticatorBinding(bindings[0]!) ?? null) : null }
      : {}),
  };
}

/**
 * The reason a certificate carries, from its parsed extension: undefined when it has none, null when the extension is
 * there but is not a DER UTF8String that reasonProblem takes. Our signer writes only good ones, so a bad one is not
 * our signer's, and the certificate is refused whole.
 */
function certificateReason(der: Uint8Array): string | null | undefined {
  try {
    const reason = certificateText(der, REASON_EXTENSION_OID);
    return reason === undefined || reasonProblem(reason) === undefined ? reason : null;
  } catch {
    return null;
  }
}

/** Why a client certificate that was good at the connection's handshake is not any more. */
export const CERTIFICATE_EXPIRED = 'client certificate expired since the connection was made';
export const CERTIFICATE_UNTRUSTED =
  'client certificate signer no longer trusted since the connection was made';
export const CERTIFICATE_UNBOUND =
  'the authenticator the client certificate was issued through is gone, or trusts otherwise since';
export const CERTIFICATE_BAD_REASON = 'the client certificate carries a reason extension that cannot be read';

/** Who a verified client certificate names, and the reason it carries, if any. */
export interface CertificateUser {
  user: UserInfo;
  reason?: string;
}

/**
 * The user named by a verified client certificate (CN is the username, each O a group), or why a certificate that
 * was good at the connection's handshake is not now. A connection outlives a 5-minute TokenCredentialRequest
 * certificate, and a signer CA taken out of `trusted` (fingerprints of the client CAs the server trusts now), so
 * both are checked on every request, as the API server does.
 */
export function certificateUser(
  req: Request,
  trusted: ReadonlySet<string>,
  bindingHolds: (binding: AuthenticatorBinding) => boolean = () => false,
): CertificateUser | { refused: string } | undefined {
  // Keyed by the connection: the HTTP/2 session, or the HTTP/1.1 socket. Looked up before the socket is touched,
  // since an HTTP/2 session's socket is a stand-in that binds a new function on every property read.
  const key: object = 'stream' in req ? (req.stream.session ?? req.stream) : req.socket;
  let known = certificateIdentities.get(key);
  if (known === undefined) {
    known = readCertificate(req);
    certificateIdentities.set(key, known);
  }
  if (!known) return undefined;
  const now = Date.now();
  // A date that could not be read compares false: such a certificate counts as expired.
  if (!(now >= known.notBefore && now <= known.notAfter)) return { refused: CERTIFICATE_EXPIRED };
  if (!known.chain.some((fingerprint) => trusted.has(fingerprint))) return { refused: CERTIFICATE_UNTRUSTED };
  if (known.binding !== undefined && (known.binding === null || !bindingHolds(known.binding)))
    return { refused: CERTIFICATE_UNBOUND };
  if (known.reason === null) return { refused: CERTIFICATE_BAD_REASON };
  return { user: known.user, ...(known.reason !== undefined ? { reason: known.reason } : {}) };
}

/**
 * Why a JWT-shaped token cannot be one the API server accepts, without asking it; undefined when it might be.
 * Only what holds for every service-account token the API server accepts, bound or legacy, whatever its issuer
 * flags: the payload is a JSON object with a string `iss` (its authenticator reads `iss` before anything else and
 * ignores a token whose issuer it does not know, and no issuer is empty). Which issuers it knows cannot be learned:
 * its discovery document names only the first of them, and legacy tokens name `kubernetes/serviceaccount`.
 */
export function notAServiceAccountToken(token: string): string | undefined {
  let iss: unknown;
  try {
    iss = decodeJwt(token).iss;
  } catch {
    return 'not a JWT with a JSON payload';
  }
  return typeof iss === 'string' && iss !== '' ? undefined : 'a JWT without an issuer';
}

/**
 * Whether a JWT's own (unverified) `aud` claim names `audience`. It only chooses which question the API server is
 * asked (a TokenReview for that audience); the answer decides.
 */
export function claimsAudience(token: string, audience: string): boolean {
  let aud: unknown;
  try {
    aud = decodeJwt(token).aud;
  } catch {
    return false;
  }
  return aud === audience || (Array.isArray(aud) && aud.includes(audience));
}

const SERVICE_ACCOUNT_USER = 'system:serviceaccount:';

const BEARER = /^Bearer\s+(\S+)\s*$/i;

/** The bearer token of a request, if it carries exactly one. */
export function bearerToken(req: Request): string | undefined {
  const header = req.headers['authorization'];
  if (typeof header !== 'string') return undefined;
  return BEARER.exec(header)?.[1];
}

export interface RequestAuthenticator {
  authenticate(req: Request): Promise<Identity>;
}

export interface RequestAuthenticatorOptions {
  /**
   * The audience of hub service-account tokens taken as workloads' (apis/tunnel.ts workloadAudience). Default: none
   * (no token is taken as a workload's).
   */
  workloadAudience?: string;
}

/** The reviews' bounds and lifetimes, the same for both kinds of service-account answers, and their shared limit. */
function reviewCacheOptions(limit: ConcurrencyLimit): AnswerCacheOptions {
  return {
    successTTLms: SERVICE_ACCOUNT_TTL_MS,
    failureTTLms: SERVICE_ACCOUNT_FAILURE_TTL_MS,
    entries: SERVICE_ACCOUNT_ENTRIES,
    limit,
  };
}

/**
 * Until when (ms since the epoch) a reviewed token's answer may be given again: its `exp`, read once the API server
 * has accepted the token (so it is the token's own), or undefined for a token without one (a legacy token).
 */
export function tokenExpiry(token: string): number | undefined {
  try {
    const exp = decodeJwt(token).exp;
    return typeof exp === 'number' && Number.isFinite(exp) ? exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}

/** `user` as an accepted answer, remembered no longer than the token lives. */
function accepted(token: string, authenticator: string, user: UserInfo): AuthResult {
  const until = tokenExpiry(token);
  return { ok: true, authenticator, user, ...(until === undefined ? {} : { reusableUntil: until }) };
}

/**
 * A workload's token, reviewed for `audience` alone: taken only when the API server says it is good for that
 * audience, and a service account's. An account or pod deleted since is known at the next review, at most
 * SERVICE_ACCOUNT_TTL_MS after the last one.
 */
function workloadReviews(reviewer: Reviewer, audience: string, limit: ConcurrencyLimit): AnswerCache {
  return new AnswerCache(async (token): Promise<AuthResult> => {
    try {
      const answer = await reviewer.tokenReview(token, [audience]);
      const username = answer.user?.username ?? '';
      if (!answer.authenticated)
        return fail(
          `not a token the API server accepts for ${audience}${answer.error ? `: ${answer.error}` : ''}`,
        );
      if (!username.startsWith(SERVICE_ACCOUNT_USER))
        return fail(`a token for ${audience} of ${username}, who is not a service account`);
      if (!(answer.audiences ?? []).includes(audience))
        return fail(`the API server did not confirm the audience ${audience}`);
      return accepted(token, 'workload', {
        username,
        ...(answer.user?.uid ? { uid: answer.user.uid } : {}),
        groups: answer.user?.groups ?? [],
        extra: answer.user?.extra ?? {},
      });
    } catch (err) {
      return transientFailure(`token review failed: ${(err as Error).message}`);
    }
  }, reviewCacheOptions(limit));
}

/**
 * `trustedClientCAs` gives the fingerprints of the client CAs the proxy's listener trusts now (ProxyServer's
 * trustedClientCAs).
 */
export function newRequestAuthenticator(
  cache: AuthenticatorCache,
  reviewer: Reviewer,
  trustedClientCAs: () => ReadonlySet<string>,
  opts: RequestAuthenticatorOptions = {},
): RequestAuthenticator {
  const audience = opts.workloadAudience;
  // Their own cache: the same token reviewed for another audience is another question, with another answer.
  // One bound on the TokenReviews under way, whichever kind: the flood it stops can come as either.
  const limit = new ConcurrencyLimit({
    inFlight: SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT,
    waiting: SERVICE_ACCOUNT_REVIEWS_WAITING,
  });
  const workloads = audience === undefined ? undefined : workloadReviews(reviewer, audience, limit);
  // Tokens no Sealion authenticator knows may still be the cluster's own service-account tokens. Those answers
  // are cached like webhook answers, so unknown tokens cannot turn into a TokenReview per request, and the reviews
  // under way are bounded, so distinct unknown tokens cannot turn into a flood of them.
  const serviceAccounts = new AnswerCache(async (token): Promise<AuthResult> => {
    try {
      const answer = await reviewer.tokenReview(token);
      const username = answer.user?.username ?? '';
      if (!answer.authenticated)
        return fail(`not a token the API server accepts${answer.error ? `: ${answer.error}` : ''}`);
      if (!username.startsWith(SERVICE_ACCOUNT_USER))
        return fail(`API server token for ${username} is not a service account's`);
      return accepted(token, 'TokenReview', {
        username,
        groups: answer.user?.groups ?? [],
        extra: answer.user?.extra ?? {},
      });
    } catch (err) {
      return transientFailure(`token review failed: ${(err as Error).message}`);
    }
  }, reviewCacheOptions(limit));

  const bindingHolds = (binding: AuthenticatorBinding): boolean => cache.holds(binding);
  return {
    async authenticate(req) {
      const fromCert = certificateUser(req, trustedClientCAs(), bindingHolds);
      if (fromCert !== undefined && !('refused' in fromCert))
        return {
          kind: 'user',
          user: fromCert.user,
          via: 'certificate',
          ...(fromCert.reason !== undefined ? { reason: fromCert.reason } : {}),
        };
      const token = bearerToken(req);
      if (token === undefined) {
        return {
          kind: 'anonymous',
          reason:
            fromCert !== undefined
              ? fromCert.refused
              : req.headers['authorization'] === undefined
                ? 'no credentials'
                : 'malformed Authorization header',
        };
      }
      // A token a JWTAuthenticator has verified before, answered from the cache without decoding it: where the steps
      // below would have sent it anyway.
      const reused = cache.reusedAnswer(token);
      if (reused?.ok) return { kind: 'user', user: reused.user, via: reused.authenticator };
      // A token that names Sealion's workload audience is asked about for that audience, and only that: the API
      // server's answer decides, and whatever it says, the token goes to no other authenticator (a webhook could
      // replay a service account's token).
      if (workloads && JWT_SHAPE.test(token) && !token.endsWith('.') && claimsAudience(token, audience!)) {
        const answer = await workloads.authenticate(token);
        return answer.ok
          ? { kind: 'workload', user: answer.user }
          : { kind: 'anonymous', reason: answer.reason };
      }
      // A JWT that no JWTAuthenticator takes may be one of this cluster's own service-account tokens. The API server
      // is asked first, and only tokens it does not know as a service account's go on to the webhooks: a webhook
      // is someone else's server, and a service-account token sent there could be replayed as that account.
      // (An unsigned one cannot be a service account's.)
      if (
        JWT_SHAPE.test(token) &&
        !token.endsWith('.') &&
        !cache.takesIssuerOf(token) &&
        notAServiceAccountToken(token) === undefined
      ) {
        const sa = await serviceAccounts.authenticate(token);
        if (sa.ok) return { kind: 'serviceaccount', user: sa.user, token };
        // Not asked (at the bound on reviews, or the API server unreachable): the token may be a service account's,
        // so it goes nowhere else.
        if ('transient' in sa) return { kind: 'anonymous', reason: sa.reason };
        const result = await cache.authenticate(token);
        if (result.ok) return { kind: 'user', user: result.user, via: result.authenticator };
        return { kind: 'anonymous', reason: `${sa.reason}; ${result.reason}` };
      }
      const result = await cache.authenticate(token);
      if (result.ok) return { kind: 'user', user: result.user, via: result.authenticator };
      return { kind: 'anonymous', reason: result.reason };
    },
  };
}
