// `sealion login oidc`: OpenID Connect for kubectl. openid-client does discovery, PKCE, the code, refresh and
// device grants and ID-token checks; this file adds the localhost callback, the browser (or a printed URL), the
// device prompt, the session cache (an ID token is reused until shortly before it expires, then refreshed without
// a browser), and plain words for what went wrong.
import { spawn } from 'node:child_process';
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as oidc from 'openid-client';
import { issuerConfiguration } from '../lib/authn/oidc-client.ts';
import { systemReason, UserError } from './errors.ts';
import {
  cacheFile,
  credentialFor,
  DEFAULT_OIDC_CLIENT_ID,
  DEFAULT_OIDC_SCOPES,
  ExchangeRefused,
  freshUntil,
  interactiveRun,
  readCache,
  sessionPlace,
  withFileLock,
  writeCache,
  type ExecCredential,
  type OIDCLoginFlags,
} from './exec-credential.ts';
import { fromAnotherUser } from './loopback-peer.ts';
import { printable } from './printable.ts';

/** How long the localhost callback waits for the browser. */
const LOGIN_TIMEOUT_MS = 5 * 60_000;
/** An ID token issued further than this from this machine's clock is reported: one of the two clocks is wrong. */
const CLOCK_SKEW_WARN_S = 60;
/** A skew up to this is corrected for; beyond it the token's own times are not believed. */
const MAX_TRUSTED_SKEW_S = 15 * 60;
/** No ID token is used longer than this, whatever it says. */
const MAX_SESSION_S = 24 * 3600;

export interface Session {
  idToken: string;
  /** Milliseconds since the epoch. */
  idTokenExpiry: number;
  refreshToken?: string;
  /**
   * Whom the refresh token is for, so that `sealion logout --all` can revoke it without the kubeconfig (the cache
   * file's name is a hash). Sessions cached before these were kept have none.
   */
  issuer?: string;
  clientId?: string;
  caBundleData?: string;
}

/** The cache file of the OIDC session for an issuer, client and scopes. */
export const sessionFile = (
  flags: Pick<OIDCLoginFlags, 'issuer' | 'clientId' | 'scopes'>,
  env: NodeJS.ProcessEnv,
): string => cacheFile(env, 'sessions', [flags.issuer, flags.clientId, flags.scopes]);

/** The issuer's configuration, with what went wrong in plain words. */
async function configuration(
  flags: Pick<OIDCLoginFlags, 'issuer' | 'clientId' | 'caBundleData'>,
): Promise<{ config: oidc.Configuration; close: () => Promise<void> }> {
  try {
    return await issuerConfiguration(flags);
  } catch (err) {
    throw explain(err, flags, 'discovery');
  }
}

/** Network failures that mean the issuer could not be reached, and TLS failures that mean it is not trusted. */
const UNREACHABLE = new Set([
  'ECONNREFUSED',
  'ENOTFOUND',
  'EAI_AGAIN',
  'ETIMEDOUT',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'ECONNRESET',
  'UND_ERR_CONNECT_TIMEOUT',
  'UND_ERR_SOCKET',
  'OAUTH_TIMEOUT',
]);
const UNTRUSTED = new Set([
  'SELF_SIGNED_CERT_IN_CHAIN',
  'DEPTH_ZERO_SELF_SIGNED_CERT',
  'UNABLE_TO_VERIFY_LEAF_SIGNATURE',
  'UNABLE_TO_GET_ISSUER_CERT_LOCALLY',
  'CERT_HAS_EXPIRED',
  'ERR_TLS_CERT_ALTNAME_INVALID',
]);

/** An error and its causes, outermost first (a few deep: a cycle must not loop). */
function* causes(err: unknown): Generator<object> {
  for (let e = err, depth = 0; e && typeof e === 'object' && depth < 5; e = (e as Error).cause, depth++)
    yield e;
}

/** The first object along an error's cause chain that has `key`. */
const causeWith = (err: unknown, key: string): object | undefined => [...causes(err)].find((e) => key in e);

/** The codes along an error's cause chain, outermost first. */
const codesOf = (err: unknown): string[] =>
  [...causes(err)].flatMap((e) => {
    const code = (e as { code?: unknown }).code;
    return typeof code === 'string' ? [code] : [];
  });

/**
 * What went wrong, in the words a user can act on: the issuer cannot be reached or is not trusted, its tokens are
 * for another client, the clocks disagree, or the login was refused. `step` says what was being done.
 */
export function explain(
  err: unknown,
  flags: Pick<OIDCLoginFlags, 'issuer' | 'clientId'>,
  step: string,
): Error {
  const codes = codesOf(err);
  const says = (message: string): Error => new Error(`login: ${message}`, { cause: err });
  const said = (err as { error?: unknown }).error;
  const oauthError = typeof said === 'string' ? printable(said) : said;
  const description = (err as { error_description?: unknown }).error_description;
  const detail = typeof description === 'string' && description ? ` (${printable(description)})` : '';
  if (oauthError === 'access_denied')
    return says(
      `the login was refused at ${flags.issuer}: consent denied or the user may not use ${flags.clientId}${detail}`,
    );
  if (oauthError === 'expired_token')
    return says(`the device code expired before the login was approved; run the command again${detail}`);
  if (typeof oauthError === 'string')
    return says(`${flags.issuer} refused the ${step}: ${oauthError}${detail}`);
  const untrusted = codes.find((c) => UNTRUSTED.has(c));
  if (untrusted)
    return says(
      `cannot reach the issuer ${flags.issuer} during ${step}: ${systemReason(err) ?? 'its certificate is not trusted'}; give the issuer's CA bundle with --ca-bundle-data`,
    );
  const unreachable = codes.find((c) => UNREACHABLE.has(c));
  if (unreachable)
    return says(
      `cannot reach the issuer ${flags.issuer} during ${step}: ${systemReason(err) ?? 'no answer in time'}; is it running, and is --issuer right?`,
    );
  // openid-client wraps oauth4webapi's error, whose cause names the claim that failed and the claims themselves.
  const cause = causeWith(err, 'claims') as
    { claim?: string; claims?: Record<string, unknown>; now?: number } | undefined;
  if (codes.includes('OAUTH_JWT_CLAIM_COMPARISON_FAILED') && cause?.claim === 'aud')
    return says(
      `the issuer's ID token is for ${printable(JSON.stringify(cause.claims?.['aud']) ?? 'nobody')}, not for this client (${flags.clientId}): ` +
        'check --client-id against the client registered at the issuer',
    );
  if (codes.includes('OAUTH_JWT_TIMESTAMP_CHECK_FAILED')) {
    const iat = Number(cause?.claims?.['iat']);
    const off =
      Number.isFinite(iat) && cause?.now
        ? ` (this machine's clock is about ${Math.round(cause.now - iat)} s from the issuer's)`
        : '';
    return says(`the issuer's ID token is not valid at this machine's time${off}: check the system clock`);
  }
  if (codes.includes('OAUTH_RESPONSE_IS_NOT_CONFORM') || codes.includes('OAUTH_RESPONSE_IS_NOT_JSON'))
    return says(
      `${flags.issuer} gave an unexpected answer during ${step}: ${printable((err as Error).message)}`,
    );
  return says(`${step} with ${flags.issuer} failed: ${printable((err as Error).message)}`);
}

function sessionOf(
  tokens: oidc.TokenEndpointResponse & oidc.TokenEndpointResponseHelpers,
  previous?: Session,
  say?: (line: string) => void,
): Session {
  const claims = tokens.claims();
  if (!tokens.id_token || !claims) throw new Error('login: the issuer returned no ID token');
  // The token's life is counted on this machine's clock from now, so a clock that is off does not make the cache
  // hand out a token the concierge already finds expired (or throw away a good one).
  // An iat that does not fit exp (after it, or far before what exp says is left) is not trusted: the token's life
  // is then what its exp says from this clock, so a hostile or broken issuer cannot make a token cached for ever.
  const now = Date.now() / 1000;
  const byClock = claims.exp - now;
  const byIssuer = typeof claims.iat === 'number' ? claims.exp - claims.iat : NaN;
  const lifetime = Math.min(
    MAX_SESSION_S,
    byIssuer > 0 && Math.abs(byIssuer - byClock) <= MAX_TRUSTED_SKEW_S ? byIssuer : byClock,
  );
  if (say && typeof claims.iat === 'number' && Math.abs(claims.iat - now) > CLOCK_SKEW_WARN_S)
    say(
      `warning: this machine's clock is about ${Math.round(now - claims.iat)} s from the issuer's; the concierge may refuse tokens that look valid here`,
    );
  return {
    idToken: tokens.id_token,
    idTokenExpiry: (now + lifetime) * 1000,
    // Issuers that rotate refresh tokens send a new one; others keep the old one valid.
    ...((tokens.refresh_token ?? previous?.refreshToken)
      ? { refreshToken: tokens.refresh_token ?? previous!.refreshToken! }
      : {}),
  };
}

/** Opens the default browser (found on `env`'s PATH); when there is none the printed URL still works. */
function openBrowser(url: string, env: NodeJS.ProcessEnv): void {
  const opener =
    process.platform === 'darwin' ? 'open' : process.platform === 'win32' ? 'explorer' : 'xdg-open';
  try {
    const child = spawn(opener, [url], { env, stdio: 'ignore', detached: true });
    child.on('error', () => {});
    child.unref();
  } catch {
    // The URL is printed as well.
  }
}

/** Whether a callback's state is the login's own, compared in constant time. */
const sameState = (given: string | null, state: string): boolean => {
  const digest = (text: string): Buffer => createHash('sha256').update(text).digest();
  return given !== null && timingSafeEqual(digest(given), digest(state));
};

/** A short page for the browser. */
const answer = (
  res: ServerResponse,
  status: number,
  text: string,
  headers: Record<string, string> = {},
): void =>
  void res
    .writeHead(status, {
      'content-type': 'text/plain; charset=utf-8',
      'cache-control': 'no-store',
      ...headers,
    })
    .end(`${text}\n`);

/**
 * The authorization-code flow with PKCE, answered on a localhost callback.
 *
 * The browser is opened at a local link, http://127.0.0.1:<port>/login/<random>, never at the authorization URL:
 * a process's arguments are public (ps, /proc/<pid>/cmdline), and the authorization URL carries the state and the
 * PKCE challenge, with which another local user could start a login of their own on the issuer and send their code
 * to this callback: the user would then work as the attacker without knowing it (login CSRF). The local link
 * redirects to the authorization URL once; the state and challenge exist nowhere else.
 *
 * Who may fetch the link: on Linux, only a connection of this user (or root) is answered, which the kernel's socket
 * table tells (loopback-peer.ts). Elsewhere another user who reads the link in time could fetch it first; the
 * user's own browser then finds it used, and the login stops at once, telling why, rather than wait for a callback
 * that the other party could now forge. A login stopped that way costs a retry; a login completed for the wrong
 * account would cost much more.
 *
 * What the callback takes: only the answer to this login (its state), from this user, after the link was followed,
 * once. Anything else (a stray request, a wrong or missing state, a second answer) gets a 400 page and is ignored,
 * and the login keeps waiting until its deadline: a stray request must not end the login of whoever is at the
 * browser. The code itself is worth nothing to anyone who intercepts it (browser history, another listener, a log):
 * redeeming it takes the PKCE verifier, which never leaves this process.
 */
async function interactiveLogin(
  config: oidc.Configuration,
  flags: OIDCLoginFlags,
  env: NodeJS.ProcessEnv,
  say: (line: string) => void,
): Promise<Session> {
  const verifier = oidc.randomPKCECodeVerifier();
  const challenge = await oidc.calculatePKCECodeChallenge(verifier);
  const state = oidc.randomState();
  const server = createServer();
  await new Promise<void>((done) => server.listen(Number(flags.listenPort), '127.0.0.1', done));
  const port = (server.address() as AddressInfo).port;
  const base = `http://127.0.0.1:${port}`;
  const redirectUri = `${base}/callback`;
  // Random, so that a user who only sees a new listening port cannot guess the link and fetch it first.
  const entry = `/login/${randomBytes(16).toString('base64url')}`;
  try {
    const url = oidc.buildAuthorizationUrl(config, {
      redirect_uri: redirectUri,
      scope: scopesOf(flags),
      code_challenge: challenge,
      code_challenge_method: 'S256',
      state,
    });
    say(`Log in to ${flags.issuer} in a browser:\n  ${base}${entry}`);
    if (!flags.skipBrowser) openBrowser(`${base}${entry}`, env);
    return await new Promise<Session>((done, fail) => {
      const timer = setTimeout(
        () => fail(new Error('login: no answer from the browser within 5 minutes')),
        LOGIN_TIMEOUT_MS,
      );
      const stop = (err: Error): void => {
        clearTimeout(timer);
        fail(err);
      };
      /** The link was followed: the authorization URL has been handed out, once. */
      let followed = false;
      /** A callback with the right state is being redeemed: no other is taken. */
      let redeeming = false;
      server.on('request', (req, res) => {
        const here = new URL(req.url ?? '/', base);
        if (here.pathname !== entry && here.pathname !== '/callback') return answer(res, 404, 'Not found.');
        if (fromAnotherUser(req.socket.remotePort ?? 0, port))
          return answer(res, 403, 'This login belongs to another user of this machine.');
        if (here.pathname === entry) {
          if (!followed) {
            followed = true;
            // no-store: the redirect, which carries the state, is not kept; no-referrer: nor sent on.
            return answer(res, 302, 'Continue at the issuer.', {
              location: url.href,
              'referrer-policy': 'no-referrer',
            });
          }
          answer(res, 410, 'This login link was used already. Run the command again to log in.');
          return stop(
            new Error(
              'login: the login link was opened twice; if you did not open it twice, someone else may have: run the command again',
            ),
          );
        }
        if (!followed || redeeming || !sameState(here.searchParams.get('state'), state))
          return answer(
            res,
            400,
            'This is not the answer the login in your terminal waits for; it was ignored.',
          );
        redeeming = true;
        oidc
          .authorizationCodeGrant(config, here, { pkceCodeVerifier: verifier, expectedState: state })
          .then((tokens) => {
            const session = sessionOf(tokens, undefined, say);
            answer(res, 200, 'Logged in. You can close this tab and return to the terminal.');
            clearTimeout(timer);
            done(session);
          })
          .catch((err: unknown) => {
            // The issuer's own answer to this login (its state matched): a refusal, or a code it would not redeem.
            const explained = explain(err, flags, 'login');
            answer(res, 400, `Login failed: ${explained.message.replace(/^login: /, '')}`);
            stop(explained);
          });
      });
    });
  } finally {
    server.closeAllConnections();
    server.close();
  }
}

/**
 * The device authorization grant (RFC 8628), for machines without a browser: the user opens the printed address
 * anywhere, enters the code, and this process polls the token endpoint until they have.
 */
async function deviceLogin(
  config: oidc.Configuration,
  flags: OIDCLoginFlags,
  say: (line: string) => void,
): Promise<Session> {
  let started: oidc.DeviceAuthorizationResponse;
  try {
    started = await oidc.initiateDeviceAuthorization(config, { scope: scopesOf(flags) });
  } catch (err) {
    if (err instanceof oidc.ClientError && err.code === 'OAUTH_MISSING_SERVER_METADATA')
      throw new Error(
        `login: ${flags.issuer} does not offer the device authorization grant; log in without --device`,
        { cause: err },
      );
    throw explain(err, flags, 'device authorization');
  }
  say(
    `To log in to ${flags.issuer}, open ${printable(started.verification_uri)} on any device and enter the code ${printable(started.user_code)}` +
      (started.verification_uri_complete
        ? `\n  or open ${printable(started.verification_uri_complete)}`
        : ''),
  );
  try {
    return sessionOf(await oidc.pollDeviceAuthorizationGrant(config, started), undefined, say);
  } catch (err) {
    throw explain(err, flags, 'device login');
  }
}

/**
 * Revokes a refresh token at the issuer (RFC 7009), and with it the grant behind it, where the issuer's discovery
 * document names a revocation endpoint. Answers false when it names none: the token then stays valid at the issuer
 * until it expires, whatever is deleted here.
 */
export async function revokeRefreshToken(
  flags: Pick<OIDCLoginFlags, 'issuer' | 'clientId' | 'caBundleData'>,
  refreshToken: string,
): Promise<boolean> {
  const { config, close } = await configuration(flags);
  try {
    if (!config.serverMetadata().revocation_endpoint) return false;
    await oidc.tokenRevocation(config, refreshToken, { token_type_hint: 'refresh_token' });
    return true;
  } catch (err) {
    throw explain(err, flags, 'revocation');
  } finally {
    await close();
  }
}

const scopesOf = (flags: OIDCLoginFlags): string =>
  flags.scopes
    .split(/[\s,]+/)
    .filter(Boolean)
    .join(' ');

/**
 * The command a person runs in a terminal to log in to this issuer: the session it makes is the one this plugin
 * reads (its cache is keyed by issuer, client and scopes), so the exchange flags are left out.
 */
export function loginCommandLine(flags: OIDCLoginFlags, name = 'sealion'): string {
  const args = [
    'login',
    'oidc',
    '--issuer',
    flags.issuer,
    ...(flags.clientId && flags.clientId !== DEFAULT_OIDC_CLIENT_ID ? ['--client-id', flags.clientId] : []),
    ...(flags.scopes !== DEFAULT_OIDC_SCOPES ? ['--scopes', flags.scopes] : []),
    ...(flags.caBundleData ? ['--ca-bundle-data', flags.caBundleData] : []),
    ...(flags.listenPort && flags.listenPort !== '0' ? ['--listen-port', flags.listenPort] : []),
    ...(flags.skipBrowser ? ['--skip-browser'] : []),
    ...(flags.device ? ['--device'] : []),
  ];
  // Quoted for a POSIX shell only where needed: an issuer URL and base64 are typed as they are.
  const quoted = args.map((arg) =>
    /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replaceAll("'", "'\\''")}'`,
  );
  return `${name} ${quoted.join(' ')}`;
}

/**
 * Why a login that needs a person cannot happen: kubectl said nobody is at a terminal (its standard input is not
 * one, or it reads it itself). It fails at once, with the command to run in a terminal, rather than wait minutes
 * for a browser nobody opens.
 */
async function noTerminal(
  flags: OIDCLoginFlags,
  env: NodeJS.ProcessEnv,
  expired: { why?: string } | undefined,
): Promise<UserError> {
  const { displayName } = await import('./self.ts');
  const place = sessionPlace(env) ?? flags.issuer;
  const run = loginCommandLine(flags, displayName(process.argv, env));
  return new UserError(
    expired
      ? `your session for ${place} expired${expired.why ? ` (${expired.why})` : ''} and there is no terminal to log in; run: ${run}`
      : `no session for ${place} and no terminal to log in; run: ${run}`,
  );
}

/** What `sealion login oidc` prints: a cached, refreshed or freshly logged-in ID token, or its exchange. */
export async function oidcLogin(
  flags: OIDCLoginFlags,
  env: NodeJS.ProcessEnv,
  say: (line: string) => void,
): Promise<ExecCredential> {
  const file = sessionFile(flags, env);
  const usable = (s: Session | undefined): boolean => Boolean(s && freshUntil(s.idTokenExpiry));
  let session = readCache<Session>(file);
  if (!session || !usable(session)) {
    session = await withFileLock(file, async () => {
      const meanwhile = readCache<Session>(file);
      if (meanwhile && usable(meanwhile)) return meanwhile;
      // Nothing to refresh and nobody to log in: said before the issuer is even asked.
      if (!meanwhile?.refreshToken && !interactiveRun(env))
        throw await noTerminal(flags, env, meanwhile && {});
      const { config, close } = await configuration(flags);
      try {
        let next: Session | undefined;
        let refreshFailed: string | undefined;
        if (meanwhile?.refreshToken) {
          try {
            next = sessionOf(await oidc.refreshTokenGrant(config, meanwhile.refreshToken), meanwhile, say);
          } catch (err) {
            const explained = explain(err, flags, 'refresh');
            // An issuer that cannot be reached (or trusted) would not answer the browser either: say so. Anything
            // else (a refused or unusable refresh) calls for a new login, and the refresh token is dropped with it.
            if (codesOf(err).some((c) => UNREACHABLE.has(c) || UNTRUSTED.has(c))) throw explained;
            refreshFailed = explained.message.replace(/^login: /, '');
            if (interactiveRun(env))
              say(`the session could not be refreshed (${refreshFailed}); logging in again`);
          }
        }
        if (!next && !interactiveRun(env))
          throw await noTerminal(flags, env, {
            ...(refreshFailed ? { why: `its refresh failed: ${refreshFailed}` } : {}),
          });
        next ??= flags.device
          ? await deviceLogin(config, flags, say)
          : await interactiveLogin(config, flags, env, say);
        next = { ...next, issuer: flags.issuer, clientId: flags.clientId, caBundleData: flags.caBundleData };
        writeCache(file, next);
        return next;
      } finally {
        await close();
      }
    });
  }
  try {
    return await credentialFor(
      session.idToken,
      flags,
      env,
      new Date(session.idTokenExpiry).toISOString(),
      say,
    );
  } catch (err) {
    // The ID token is fresh by this machine's clock: the authenticator does not take this issuer's tokens for this
    // client, or the clocks disagree.
    if (err instanceof ExchangeRefused)
      throw err.explained(
        `the ID token of ${flags.issuer}`,
        `ask your admin whether it takes ID tokens of this issuer for client ${flags.clientId}, and check the system clock`,
      );
    throw err;
  }
}
