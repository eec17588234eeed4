// The SSH door's login: the OAuth 2.0 device authorization grant (RFC 8628) at the issuer of a JWTAuthenticator.
// The SSH client shows the issuer's address and code; the person approves on any device; the door polls the token
// endpoint, and the ID token it gets is authenticated by that same JWTAuthenticator, exactly as a kubectl user's
// token is (its claim mappings, its system-name rules). The door never sees a password.
import { decodeJwt } from 'jose';
import * as oidc from 'openid-client';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
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

/** A login under way: what to show the person, and its end. */
export interface StartedLogin {
  /** The lines to show: where to go, and the code. */
  instructions: string;
  /** The identity the token names, and when the token expires. Rejects with a reason for the log. */
  done: Promise<{ identity: SignedIn; expires: Date }>;
}

/** A device login that takes longer than this is given up, whatever the issuer allows. */
export const DEVICE_LOGIN_MAX_MS = 10 * 60_000;

/** Starts a device login; rejects (with a reason for the log) when the issuer cannot start one. */
export async function startDeviceLogin(
  cache: AuthenticatorCache,
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
    started = await oidc.initiateDeviceAuthorization(config, { scope: settings.scopes.join(' ') });
  } catch (err) {
    await close();
    throw err;
  }
  const instructions =
    `To sign in, open ${started.verification_uri} and enter the code ${started.user_code}` +
    (started.verification_uri_complete ? `\n  or open ${started.verification_uri_complete}` : '') +
    '\n';
  const timeout = AbortSignal.timeout(DEVICE_LOGIN_MAX_MS);
  const done = (async () => {
    try {
      const tokens = await oidc.pollDeviceAuthorizationGrant(config, started, undefined, {
        signal: AbortSignal.any([signal, timeout]),
      });
      const idToken = tokens.id_token;
      if (!idToken) throw new Error('the issuer answered without an ID token (is the openid scope asked?)');
      const answer = await cache.authenticate(idToken, signal);
      if (!answer.ok) throw new Error(`the ID token was not accepted: ${answer.reason}`);
      if (answer.authenticator !== `JWTAuthenticator/${settings.authenticator}`)
        throw new Error(`the ID token was accepted by ${answer.authenticator}, not the one configured`);
      const problem = identityProblem(answer.user);
      if (problem) throw new Error(problem);
      const exp = decodeJwt(idToken).exp;
      if (typeof exp !== 'number') throw new Error('the ID token has no expiry');
      return {
        identity: { kind: 'user' as const, user: answer.user, via: `ssh/${answer.authenticator}` },
        expires: new Date(exp * 1000),
      };
    } finally {
      await close();
    }
  })();
  return { instructions, done };
}
