// Renewing a bound key's login: once the ID token of the device login expired, the door asks the issuer's token
// endpoint for a new one with the refresh token the binding keeps, and takes the new ID token exactly as a fresh
// login's (the same JWTAuthenticator, its claim mappings and rules), as Pinniped's supervisor refreshes the upstream
// session on each downstream refresh. So a user the issuer disabled, or who signed out there, loses the key's
// binding at its next use after the ID token's expiry, not at the session's hard end.
// What it costs is bounded: only a key whose signature was checked gets here (sign-in.ts), one renewal runs per
// binding in this process (concurrent sign-ins with the key wait on it), and each has a deadline.
import * as oidc from 'openid-client';
import type { Clock } from '../../lib/clock.ts';
import { issuerConfiguration } from '../../lib/authn/oidc-client.ts';
import {
  checkIdToken,
  type CheckedLogin,
  type DeviceLoginSettings,
  type LoginCache,
} from './device-login.ts';

/**
 * A sign-in waits this long for a renewal, then is refused (the binding stays). The renewal itself goes on to its
 * end, bounded by the issuer client's timeout per request and by this for the authenticator's check, and keeps what
 * it got: the issuer may have rotated the refresh token already.
 */
export const RENEWAL_MAX_MS = 30_000;

/**
 * How a renewal ended: a new login (and the refresh token to keep), a refusal that ends the binding (the issuer
 * refused the token, or the new ID token is not taken or names someone else), or a failure that does not (the issuer
 * did not answer in time).
 */
export type RenewalOutcome =
  ({ ok: true } & CheckedLogin & { refreshToken: string }) | { ok: false; ended: boolean; reason: string };

/** What is renewed: the binding's user and refresh token, at the login's authenticator. */
export interface Renewable {
  username: string;
  refreshToken: string;
}

const NO_ANSWER: RenewalOutcome = { ok: false, ended: false, reason: 'the issuer did not answer in time' };

/** Renews a binding's login at the issuer; never rejects. */
export async function renewLogin(
  cache: LoginCache,
  login: DeviceLoginSettings,
  bound: Renewable,
  clock: Clock,
): Promise<RenewalOutcome> {
  const deadline = new AbortController();
  const timer = clock.setTimeout(() => deadline.abort(), RENEWAL_MAX_MS);
  try {
    const outcome = await renew(cache, login, bound, deadline.signal);
    // A check cut short by the deadline says nothing about the session.
    return !outcome.ok && deadline.signal.aborted ? NO_ANSWER : outcome;
  } finally {
    clock.clearTimeout(timer);
  }
}

async function renew(
  cache: LoginCache,
  login: DeviceLoginSettings,
  bound: Renewable,
  signal: AbortSignal,
): Promise<RenewalOutcome> {
  const provider = cache.providerOf(login.authenticator);
  if (!provider)
    // Not loaded now (being reloaded, or gone: then the binding's own check refuses the key, whatever this says).
    return { ok: false, ended: false, reason: `JWTAuthenticator ${login.authenticator} is not loaded` };
  let issuer: Awaited<ReturnType<typeof issuerConfiguration>>;
  try {
    issuer = await issuerConfiguration({
      issuer: provider.issuer,
      clientId: login.clientId || provider.audience,
      ...(provider.caBundlePem ? { caBundleData: Buffer.from(provider.caBundlePem).toString('base64') } : {}),
    });
  } catch (err) {
    return { ok: false, ended: false, reason: `the issuer's discovery failed: ${(err as Error).message}` };
  }
  try {
    let tokens: oidc.TokenEndpointResponse;
    try {
      // Bounded by the configuration's timeout per request, and by the deadline around it all.
      tokens = await oidc.refreshTokenGrant(issuer.config, bound.refreshToken);
    } catch (err) {
      // invalid_grant (RFC 6749 section 5.2: the grant revoked or expired, the user disabled) is the issuer's refusal
      // of this session, which ends the binding. Any other answer (server_error, temporarily_unavailable, a client
      // the issuer does not know: the admin's setting) or none at all says nothing about the session: this sign-in
      // is refused and the binding kept.
      if (err instanceof oidc.ResponseBodyError)
        return {
          ok: false,
          ended: err.error === 'invalid_grant',
          reason: `the issuer refused the refresh token: ${err.error}`,
        };
      return { ok: false, ended: false, reason: `the issuer did not answer: ${(err as Error).message}` };
    }
    if (!tokens.id_token)
      return { ok: false, ended: true, reason: 'the issuer renewed the login without an ID token' };
    const checked = await checkIdToken(cache, login.authenticator, tokens.id_token, signal);
    const username = checked.identity.user.username;
    if (username !== bound.username)
      return { ok: false, ended: true, reason: `the renewed login names ${username}, not ${bound.username}` };
    // Issuers that rotate refresh tokens send a new one and consume the old; others keep the old one valid.
    return { ok: true, ...checked, refreshToken: tokens.refresh_token ?? bound.refreshToken };
  } catch (err) {
    return { ok: false, ended: true, reason: (err as Error).message };
  } finally {
    // Its connections to the issuer end with it; closing them has nothing to report.
    await issuer.close().catch(() => undefined);
  }
}

/**
 * One renewal at a time per binding (by name) in this process: a sign-in while one runs waits on the same outcome,
 * so a rotated refresh token is used once, and a burst of connections with one key costs the issuer one request.
 * Each sign-in waits at most RENEWAL_MAX_MS by `clock`; the renewal goes on without it, and holds its place until
 * it ends (what it stores is then there for the next sign-in).
 */
export function newRenewals(
  clock: Clock,
): (name: string, run: () => Promise<RenewalOutcome>) => Promise<RenewalOutcome> {
  const running = new Map<string, Promise<RenewalOutcome>>();
  return (name, run) => {
    let under = running.get(name);
    if (!under) {
      under = run().finally(() => running.delete(name));
      running.set(name, under);
    }
    let timer: unknown;
    const waited = new Promise<RenewalOutcome>((settle) => {
      timer = clock.setTimeout(() => settle(NO_ANSWER), RENEWAL_MAX_MS);
    });
    return Promise.race([under, waited]).finally(() => clock.clearTimeout(timer));
  };
}
