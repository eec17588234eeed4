// `sealion login oidc`: OpenID Connect for kubectl. openid-client does discovery, PKCE, the code and refresh
// grants and ID-token checks; this file adds the localhost callback, the browser (or a printed URL), and the
// session cache: an ID token is reused until shortly before it expires, then refreshed without a browser.
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import * as oidc from 'openid-client';
import { Agent, fetch as undiciFetch } from 'undici';
import {
  cacheFile,
  credentialFor,
  freshUntil,
  readCache,
  withFileLock,
  writeCache,
  type ExecCredential,
  type OIDCLoginFlags,
} from './login.ts';

/** How long the localhost callback waits for the browser. */
const LOGIN_TIMEOUT_MS = 5 * 60_000;

interface Session {
  idToken: string;
  /** Milliseconds since the epoch. */
  idTokenExpiry: number;
  refreshToken?: string;
}

/**
 * Discovery and token calls trust the given CA bundle (base64 PEM), or the system roots without one. `close`
 * ends their keep-alive connections, so the plugin exits as soon as it has answered.
 */
async function configuration(
  flags: OIDCLoginFlags,
): Promise<{ config: oidc.Configuration; close: () => Promise<void> }> {
  const options: oidc.DiscoveryRequestOptions = {};
  let dispatcher: Agent | undefined;
  if (flags.caBundleData) {
    dispatcher = new Agent({
      connect: { ca: Buffer.from(flags.caBundleData, 'base64').toString('utf8') },
    });
    const through = dispatcher;
    options[oidc.customFetch] = (url, init) => undiciFetch(url, { ...(init as object), dispatcher: through });
  }
  const config = await oidc.discovery(new URL(flags.issuer), flags.clientId, undefined, oidc.None(), options);
  return { config, close: async () => dispatcher?.close() };
}

function sessionOf(
  tokens: oidc.TokenEndpointResponse & oidc.TokenEndpointResponseHelpers,
  previous?: Session,
): Session {
  const claims = tokens.claims();
  if (!tokens.id_token || !claims) throw new Error('login: the issuer returned no ID token');
  return {
    idToken: tokens.id_token,
    idTokenExpiry: claims.exp * 1000,
    // Issuers that rotate refresh tokens send a new one; others keep the old one valid.
    ...((tokens.refresh_token ?? previous?.refreshToken)
      ? { refreshToken: tokens.refresh_token ?? previous!.refreshToken! }
      : {}),
  };
}

/** Opens the default browser; when there is none the printed URL still works. */
function openBrowser(url: string): void {
  const opener =
    process.platform === 'darwin' ? 'open' : process.platform === 'win32' ? 'explorer' : 'xdg-open';
  try {
    const child = spawn(opener, [url], { stdio: 'ignore', detached: true });
    child.on('error', () => {});
    child.unref();
  } catch {
    // The URL is printed as well.
  }
}

/** The authorization-code flow with PKCE, answered on a localhost callback. */
async function interactiveLogin(
  config: oidc.Configuration,
  flags: OIDCLoginFlags,
  say: (line: string) => void,
): Promise<Session> {
  const verifier = oidc.randomPKCECodeVerifier();
  const challenge = await oidc.calculatePKCECodeChallenge(verifier);
  const state = oidc.randomState();
  const server = createServer();
  await new Promise<void>((done) => server.listen(Number(flags.listenPort), '127.0.0.1', done));
  const redirectUri = `http://127.0.0.1:${(server.address() as AddressInfo).port}/callback`;
  try {
    const url = oidc.buildAuthorizationUrl(config, {
      redirect_uri: redirectUri,
      scope: flags.scopes
        .split(/[\s,]+/)
        .filter(Boolean)
        .join(' '),
      code_challenge: challenge,
      code_challenge_method: 'S256',
      state,
    });
    say(`Log in to ${flags.issuer} in a browser:\n  ${url.toString()}`);
    if (!flags.skipBrowser) openBrowser(url.toString());
    return await new Promise<Session>((done, fail) => {
      const timer = setTimeout(
        () => fail(new Error('login: no answer from the browser within 5 minutes')),
        LOGIN_TIMEOUT_MS,
      );
      server.on('request', (req, res) => {
        const here = new URL(req.url ?? '/', redirectUri);
        if (here.pathname !== '/callback') return void res.writeHead(404).end();
        oidc
          .authorizationCodeGrant(config, here, { pkceCodeVerifier: verifier, expectedState: state })
          .then((tokens) => {
            res
              .writeHead(200, { 'content-type': 'text/plain' })
              .end('Logged in. You can close this tab and return to the terminal.\n');
            clearTimeout(timer);
            done(sessionOf(tokens));
          })
          .catch((err: unknown) => {
            res.writeHead(400, { 'content-type': 'text/plain' }).end('Login failed; see the terminal.\n');
            clearTimeout(timer);
            fail(new Error(`login: ${(err as Error).message}`, { cause: err }));
          });
      });
    });
  } finally {
    server.closeAllConnections();
    server.close();
  }
}

/** What `sealion login oidc` prints: a cached, refreshed or freshly logged-in ID token, or its exchange. */
export async function oidcLogin(
  flags: OIDCLoginFlags,
  env: NodeJS.ProcessEnv,
  say: (line: string) => void,
): Promise<ExecCredential> {
  const file = cacheFile(env, 'sessions', [flags.issuer, flags.clientId, flags.scopes]);
  const usable = (s: Session | undefined): boolean => Boolean(s && freshUntil(s.idTokenExpiry));
  let session = readCache<Session>(file);
  if (!session || !usable(session)) {
    session = await withFileLock(file, async () => {
      const meanwhile = readCache<Session>(file);
      if (meanwhile && usable(meanwhile)) return meanwhile;
      const { config, close } = await configuration(flags);
      try {
        let next: Session | undefined;
        if (meanwhile?.refreshToken) {
          try {
            next = sessionOf(await oidc.refreshTokenGrant(config, meanwhile.refreshToken), meanwhile);
          } catch (err) {
            say(`the session could not be refreshed (${(err as Error).message}); logging in again`);
          }
        }
        next ??= await interactiveLogin(config, flags, say);
        writeCache(file, next);
        return next;
      } finally {
        await close();
      }
    });
  }
  return credentialFor(session.idToken, flags, env, new Date(session.idTokenExpiry).toISOString());
}
