// The SSH door's login: the OAuth 2.0 device authorization grant (RFC 8628) at the issuer of a JWTAuthenticator.
// The SSH client shows the issuer's address and code; the person approves on any device; the door polls the token
// endpoint, and the ID token it gets is authenticated by that same JWTAuthenticator, exactly as a kubectl user's
// token is (its claim mappings, its system-name rules). The door never sees a password. Where the issuer's discovery
// lists the offline_access scope, the login asks for it too: the refresh token it gets lets the door renew the login
// (renewal.ts) and keep the key bound as long as the issuer keeps the session.
import { decodeJwt } from 'jose';
import * as oidc from 'openid-client';
import type { AuthenticatorBinding, AuthenticatorCache } from '../../lib/authn/cache.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import { issuerConfiguration } from '../../lib/authn/oidc-client.ts';
import type { SignedIn } from './in-process.ts';

export interface DeviceLoginSettings {
  /** The JWTAuthenticator whose issuer runs the grant, and which authenticates the ID token. */
  authenticator: string;
  /** The client the door asks as; empty: the authenticator's audience. */
  clientId: string;
  scopes: readonly string[];
}

/** What a login asks of the authenticators: the issuer to log in at, and the ID token's check. */
export type LoginCache = Pick<AuthenticatorCache, 'providerOf' | 'authenticateWith'>;

/** What a device login ends with: the identity and its binding, or why there is none (for the log). */
export type LoginOutcome =
  ({ ok: true } & CheckedLogin & { refreshToken?: string }) | { ok: false; reason: string };

/** An ID token as its JWTAuthenticator took it: whom it names, until when, and the authenticator's binding. */
export interface CheckedLogin {
  identity: SignedIn;
  expires: Date;
  authenticator: AuthenticatorBinding;
}

/** The scope that asks for a refresh token (OpenID Connect Core 11). */
const OFFLINE_ACCESS = 'offline_access';

/** The scopes to ask for: the configured ones, and offline_access where the issuer says it knows it. */
export function scopesFor(config: oidc.Configuration, scopes: readonly string[]): string {
  const supported = config.serverMetadata().scopes_supported;
  const offline =
    Array.isArray(supported) && supported.includes(OFFLINE_ACCESS) && !scopes.includes(OFFLINE_ACCESS);
  return [...scopes, ...(offline ? [OFFLINE_ACCESS] : [])].join(' ');
}

/** A login under way: what to show the person, and its end. */
export interface StartedLogin {
  /** The lines to show: where to go, and the code. */
  instructions: string;
  /**
   * How it ended. Never rejects: it settles while nobody may be waiting for it yet (the person reads the code first),
   * and an abort (the client left) settles it too.
   */
  outcome: Promise<LoginOutcome>;
}

/** A device login that takes longer than this is given up, whatever the issuer allows. */
export const DEVICE_LOGIN_MAX_MS = 10 * 60_000;

/** Starts a device login; rejects (with a reason for the log) when the issuer cannot start one. */
export async function startDeviceLogin(
  cache: LoginCache,
  settings: DeviceLoginSettings,
  signal: AbortSignal,
): Promise<StartedLogin> {
  const provider = cache.providerOf(settings.authenticator);
  if (!provider) throw new Error(`JWTAuthenticator ${settings.authenticator} is not loaded`);
  const { config, close } = await issuerConfiguration({
    issuer: provider.issuer,
    clientId: settings.clientId || provider.audience,
    ...(provider.caBundlePem ? { caBundleData: Buffer.from(provider.caBundlePem).toString('base64') } : {}),
  });
  let started: oidc.DeviceAuthorizationResponse;
  try {
    started = await oidc.initiateDeviceAuthorization(config, { scope: scopesFor(config, settings.scopes) });
  } catch (err) {
    await close();
    throw err;
  }
  const instructions =
    `To sign in, open ${started.verification_uri} and enter the code ${started.user_code}` +
    (started.verification_uri_complete ? `\n  or open ${started.verification_uri_complete}` : '') +
    '\n';
  const timeout = AbortSignal.timeout(DEVICE_LOGIN_MAX_MS);
  const outcome = pollForIdentity(cache, settings, config, started, AbortSignal.any([signal, timeout]))
    .then(
      (ended): LoginOutcome => ended,
      (err: unknown): LoginOutcome => ({ ok: false, reason: (err as Error).message }),
    )
    // Its connections to the issuer end with it; closing them has nothing to report.
    .finally(() => close().catch(() => undefined));
  return { instructions, outcome };
}

/** Polls the token endpoint until the person approves (or the grant ends), then authenticates the ID token. */
async function pollForIdentity(
  cache: LoginCache,
  settings: DeviceLoginSettings,
  config: oidc.Configuration,
  started: oidc.DeviceAuthorizationResponse,
  signal: AbortSignal,
): Promise<LoginOutcome> {
  const tokens = await oidc.pollDeviceAuthorizationGrant(config, started, undefined, { signal });
  const idToken = tokens.id_token;
  if (!idToken) throw new Error('the issuer answered without an ID token (is the openid scope asked?)');
  const checked = await checkIdToken(cache, settings.authenticator, idToken, signal);
  return { ok: true, ...checked, ...(tokens.refresh_token ? { refreshToken: tokens.refresh_token } : {}) };
}

/**
 * Authenticates an ID token as the door takes every one, from a login or a renewal; throws why it is not taken.
 */
export async function checkIdToken(
  cache: LoginCache,
  authenticator: string,
  idToken: string,
  signal: AbortSignal,
): Promise<CheckedLogin> {
  // That very authenticator, as a TokenCredentialRequest names it: its claim mappings and system-name rules, and the
  // binding (its uid and what it trusts) that the key's binding keeps, so that re-creating or editing it ends the key.
  const answer = await cache.authenticateWith('JWTAuthenticator', authenticator, idToken, signal);
  if (!answer.ok) throw new Error(`the ID token was not accepted: ${answer.reason}`);
  if (!answer.binding) throw new Error(`JWTAuthenticator ${authenticator} has no binding to keep`);
  const problem = identityProblem(answer.user);
  if (problem) throw new Error(problem);
  const exp = decodeJwt(idToken).exp;
  if (typeof exp !== 'number') throw new Error('the ID token has no expiry');
  return {
    identity: { kind: 'user', user: answer.user, via: `ssh/${answer.authenticator}` },
    expires: new Date(exp * 1000),
    authenticator: answer.binding,
  };
}
