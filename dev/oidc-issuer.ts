// A local OIDC issuer over real HTTPS for tests, benchmarks and `npm start`. The provider itself is oidc-provider
// (a certified OpenID Provider): discovery, JWKS, the authorization endpoint with PKCE, the token endpoint with the
// code, refresh-token and device-code grants, and revocation. What this file adds is what a test needs around it:
// - one configured user, logged in and consenting without a page (the "browser" is a test, dev/browser.ts, or the
//   developer), unless a test makes the consent fail;
// - `mint`, which signs any token a test asks for, hostile ones included, with the provider's own key;
// - key rotation, which oidc-provider only supports across a restart: a new Provider over the same storage;
// - failure switches in front of discovery and JWKS (down, garbage, hanging, naming another issuer).
import { KeyObject, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK, type JWTPayload } from 'jose';
import Provider, {
  type Adapter,
  type AdapterFactory,
  type AdapterPayload,
  type ClientMetadata,
  type Configuration,
  type ErrorOut,
  type KoaContextWithOIDC,
} from 'oidc-provider';
import { Agent, fetch } from 'undici';
import { issueCert, newCA } from '../lib/pki/pki.ts';

export type IssuerMode = 'ok' | 'down' | 'garbage' | 'hang';

export interface MintOptions {
  /** Default: the current signing key's kid. */
  kid?: string;
  /** Seconds from now; negative for an expired token. Default: 300. */
  expiresIn?: number;
  /** Seconds from now for nbf. Default: none. */
  notBefore?: number;
  /** Default: the issuer's URL. */
  issuer?: string;
  /** Default: the `audience` option of startOIDCIssuer (`sealion`). */
  audience?: string | string[];
  /** Sign with this key instead (e.g. one the issuer never published). */
  signingKey?: { privateKey: CryptoKey; kid: string };
}

export interface SigningKey {
  privateKey: CryptoKey;
  kid: string;
  /** The public half, as the JWKS publishes it. */
  jwk: JWK;
}

/** Successful token-endpoint grants, by grant type. */
export interface GrantCounts {
  authorization_code: number;
  refresh_token: number;
  device_code: number;
}

export interface TestIssuer {
  url: string;
  /** PEM of the CA that signed the issuer's serving certificate. */
  caPem: string;
  /** The same CA, base64-encoded, as `spec.tls.certificateAuthorityData` wants it. */
  caData: string;
  /** The OAuth client ID of the one registered client, the CLI. */
  clientId: string;
  /** Number of JWKS requests served so far. */
  jwksRequests(): number;
  mint(claims: JWTPayload, opts?: MintOptions): Promise<string>;
  /** The public JWK the issuer currently signs with. */
  currentJWK(): JWK;
  /** A fresh key the issuer does not publish (yet): see rotate(). */
  newKey(): Promise<SigningKey>;
  /**
   * Publishes `key` alongside (or instead of) the current keys; the provider signs its ID tokens with it from now
   * on, and `mint` does too. Sessions, grants and refresh tokens outlive the rotation.
   */
  rotate(key: SigningKey, opts?: { dropOld?: boolean }): void;
  /** How the discovery and JWKS endpoints behave. */
  setMode(endpoint: 'discovery' | 'jwks', mode: IssuerMode): void;
  /** Make discovery name another issuer. */
  setDiscoveryIssuer(issuer: string | undefined): void;
  /** Whether the user consents at the next logins: `deny` ends them with `access_denied`. Default: `grant`. */
  setConsent(answer: 'grant' | 'deny'): void;
  /** Revokes a refresh token at the revocation endpoint, as the client does at logout; its grant goes with it. */
  revoke(refreshToken: string): Promise<void>;
  /** Grants served by the token endpoint so far, by grant type. */
  grants(): GrantCounts;
  stop(): Promise<void>;
}

/** Who logs in at the issuer. */
export interface IssuerLogin {
  username: string;
  groups: string[];
}

export interface IssuerOptions {
  /** A path after the host in the issuer URL, e.g. `/dex`. Default: none. */
  path?: string;
  /** Default audience of minted tokens. Default: `sealion`. */
  audience?: string;
  /** The OAuth client ID of the CLI, and so the audience of the provider's ID tokens. Default: `sealion-cli`. */
  clientId?: string;
  /** The user who logs in. Default: none, and every login ends with `access_denied`. */
  login?: IssuerLogin;
  /** The address to listen on (and the issuer URL's host). Default: 127.0.0.1; a node's host address for pods. */
  host?: string;
}

/** Lifetime of ID and access tokens from the token endpoint: short, so tests and the dev setup see refreshes. */
const ISSUED_TOKEN_SECONDS = 300;
/** Sessions, grants and refresh tokens last as long as `npm start`'s demo token: a working day. */
const SESSION_SECONDS = 12 * 3600;
/** Time to finish a login or enter a device code: the CLI waits 5 minutes, so twice that is never the limit. */
const INTERACTION_SECONDS = 600;
/**
 * Device-flow clients wait this long between polls. RFC 8628's default when the server names none is 5 s, which
 * every device-flow test would spend waiting; nobody here polls hard enough for 1 s to matter.
 */
const DEVICE_POLL_SECONDS = 1;
/** The loopback redirect the CLI registers; oidc-provider lets native clients use it with any port (RFC 8252). */
const LOOPBACK_REDIRECT = 'http://127.0.0.1/callback';
const DEVICE_CODE_GRANT = 'urn:ietf:params:oauth:grant-type:device_code';

/**
 * oidc-provider's storage, kept outside any one Provider so that a rotation's new Provider finds the sessions,
 * grants and tokens of the old one. (The library's own in-memory adapter keeps one store per Provider and is not
 * part of its API.) The store stays small, so lookups by secondary keys scan it.
 */
function newStore(): AdapterFactory {
  const entries = new Map<string, { payload: AdapterPayload; expiresAt: number }>();
  /** The payload under `key` unless it expired; an expired one is dropped on the way. */
  const live = (key: string): AdapterPayload | undefined => {
    const entry = entries.get(key);
    if (!entry || entry.expiresAt > Date.now()) return entry?.payload;
    entries.delete(key);
    return undefined;
  };
  return (model: string): Adapter => {
    const key = (id: string): string => `${model}:${id}`;
    const ofModel = (): [string, AdapterPayload][] =>
      [...entries.keys()]
        .filter((k) => k.startsWith(`${model}:`))
        .flatMap((k) => {
          const payload = live(k);
          return payload ? [[k, payload] as [string, AdapterPayload]] : [];
        });
    return {
      upsert(id, payload, expiresIn) {
        for (const k of entries.keys()) live(k); // drops what expired, so a long `npm start` does not grow
        entries.set(key(id), { payload, expiresAt: expiresIn ? Date.now() + expiresIn * 1000 : Infinity });
        return Promise.resolve();
      },
      find: (id) => Promise.resolve(live(key(id))),
      findByUid: (uid) => Promise.resolve(ofModel().find(([, p]) => p.uid === uid)?.[1]),
      findByUserCode: (code) => Promise.resolve(ofModel().find(([, p]) => p.userCode === code)?.[1]),
      consume(id) {
        const payload = live(key(id));
        if (payload) payload.consumed = Math.floor(Date.now() / 1000);
        return Promise.resolve();
      },
      destroy(id) {
        entries.delete(key(id));
        return Promise.resolve();
      },
      revokeByGrantId(grantId) {
        for (const [k, p] of ofModel()) if (p.grantId === grantId) entries.delete(k);
        return Promise.resolve();
      },
    };
  };
}

const escapeHTML = (text: string): string => text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

/**
 * The issuer's pages, as small as a browser (or dev/browser.ts) needs: `data-outcome` says which page it is, and
 * `form` is oidc-provider's own form (with its CSRF token) plus the buttons that submit it.
 */
function page(outcome: 'input' | 'confirm' | 'approved' | 'error', text: string, form = ''): string {
  return `<!DOCTYPE html><html><head><meta charset="utf-8"><title>Sealion test issuer</title></head>
<body><main data-outcome="${outcome}"><p>${escapeHTML(text)}</p>${form}</main></body></html>`;
}

const submit = (form: string, label: string, extra = ''): string =>
  `<button type="submit" form="${form}"${extra}>${label}</button>`;

function describeError(out: ErrorOut | undefined, err: Error | undefined): string {
  const description = out?.error_description ? `: ${out.error_description}` : '';
  return out ? `${out.error}${description}` : (err?.message ?? 'error');
}

export async function startOIDCIssuer(opts: IssuerOptions = {}): Promise<TestIssuer> {
  const host = opts.host ?? '127.0.0.1';
  const path = opts.path ?? '';
  const clientId = opts.clientId ?? 'sealion-cli';
  const audience = opts.audience ?? 'sealion';
  const login = opts.login;
  const ca = await newCA('test-oidc-issuer-ca');
  const serving = await issueCert(ca, {
    commonName: 'oidc-issuer',
    hosts: [...new Set([host, '127.0.0.1', 'localhost'])],
    usage: 'server',
  });

  let kidCounter = 0;
  const newKey = async (): Promise<SigningKey> => {
    const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
    const kid = `key-${++kidCounter}`;
    return { privateKey, kid, jwk: { ...(await exportJWK(publicKey)), kid, alg: 'ES256', use: 'sig' } };
  };
  /** The provider's key set needs private JWKs; exported synchronously so that rotate() takes effect at once. */
  const privateJWK = (key: SigningKey): JWK => ({
    ...KeyObject.from(key.privateKey).export({ format: 'jwk' }),
    kid: key.kid,
    alg: 'ES256',
    use: 'sig',
  });

  let current = await newKey();
  /** Published keys, the signing key first: oidc-provider signs with the first key that fits. */
  let published: SigningKey[] = [current];
  const modes = { discovery: 'ok' as IssuerMode, jwks: 'ok' as IssuerMode };
  let discoveryIssuer: string | undefined;
  let consent: 'grant' | 'deny' = 'grant';
  let jwksCount = 0;
  const grantCounts: GrantCounts = { authorization_code: 0, refresh_token: 0, device_code: 0 };
  const countedGrants: Record<string, keyof GrantCounts> = {
    authorization_code: 'authorization_code',
    refresh_token: 'refresh_token',
    [DEVICE_CODE_GRANT]: 'device_code',
  };
  // Shared by every Provider this issuer builds, so that rotation keeps sessions, grants and cookies valid.
  const store = newStore();
  const cookieKeys = [randomBytes(32).toString('base64url')];

  const server: Server = createServer({ cert: serving.certPem, key: serving.keyPem });
  await new Promise<void>((done) => server.listen(0, host, done));
  const url = `https://${host}:${(server.address() as AddressInfo).port}${path}`;

  const client: ClientMetadata = {
    client_id: clientId,
    application_type: 'native',
    token_endpoint_auth_method: 'none',
    grant_types: ['authorization_code', 'refresh_token', DEVICE_CODE_GRANT],
    response_types: ['code'],
    redirect_uris: [LOOPBACK_REDIRECT],
    // oidc-provider's default is RS256; this issuer has EC keys only.
    id_token_signed_response_alg: 'ES256',
  };

  const configuration: Configuration = {
    adapter: store,
    clients: [client],
    // The code flow only: nothing here takes tokens from the authorization endpoint.
    responseTypes: ['code'],
    cookies: { keys: cookieKeys },
    // The authenticators under test read `username` and `groups`; with `openid` every ID token carries them.
    claims: { openid: ['sub', 'username', 'groups'] },
    findAccount: (_ctx, sub) =>
      login && sub === login.username
        ? { accountId: sub, claims: () => ({ sub, username: login.username, groups: login.groups }) }
        : undefined,
    // Native clients must use PKCE; oidc-provider accepts S256 only.
    pkce: { required: () => true },
    // The CLI asks for offline_access to get a refresh token. OpenID Connect Core lets a provider honour that in
    // the code flow only with prompt=consent, which the CLI does not send, so oidc-provider drops the scope there
    // (the device flow keeps it). Refresh tokens therefore go by the grant type alone; without offline_access
    // they last as long as the login's session (SESSION_SECONDS) instead of outliving a logout.
    issueRefreshToken: (_ctx, c) => c.grantTypeAllowed('refresh_token'),
    // Every refresh answers with a new refresh token and consumes the old one, as for any public client.
    rotateRefreshToken: true,
    interactions: { url: (_ctx, interaction) => `${path}/interaction/${interaction.uid}` },
    // No browser-based client calls this issuer.
    clientBasedCORS: () => false,
    ttl: {
      AccessToken: ISSUED_TOKEN_SECONDS,
      IdToken: ISSUED_TOKEN_SECONDS,
      AuthorizationCode: 60,
      DeviceCode: INTERACTION_SECONDS,
      Interaction: INTERACTION_SECONDS,
      Grant: SESSION_SECONDS,
      RefreshToken: SESSION_SECONDS,
      Session: SESSION_SECONDS,
    },
    features: {
      devInteractions: { enabled: false },
      revocation: {
        enabled: true,
        allowedPolicy: (_ctx, c, token) => token.clientId === c.clientId,
      },
      deviceFlow: {
        enabled: true,
        userCodeInputSource: (ctx, form, out, err) => {
          const again = form + submit('op.deviceInputForm', 'Continue');
          ctx.body = err
            ? page('error', describeError(out, err), again)
            : page('input', 'Enter the code your device shows.', again);
        },
        userCodeConfirmSource: (ctx, form, c, _info, userCode) => {
          const buttons =
            submit('op.deviceConfirmForm', 'Approve') +
            submit('op.deviceConfirmForm', 'Abort', ' name="abort" value="yes"');
          ctx.body = page('confirm', `Approve ${c.clientId} with code ${userCode}?`, form + buttons);
        },
        successSource: (ctx) => {
          ctx.body = page('approved', 'The device is logged in. You can close this page.');
        },
      },
    },
    renderError: (ctx, out) => {
      ctx.type = 'html';
      ctx.body = page('error', describeError(out, undefined));
    },
  };

  /** A Provider over the shared store, signing with the first published key. Rotation builds the next one. */
  function newProvider(): { provider: Provider; handle: ReturnType<Provider['callback']> } {
    const provider = new Provider(url, { ...configuration, jwks: { keys: published.map(privateJWK) } });
    provider.on('grant.success', (ctx: KoaContextWithOIDC) => {
      const counted = countedGrants[String(ctx.oidc.params?.['grant_type'])];
      if (counted) grantCounts[counted]++;
    });
    provider.use(async (ctx, next) => {
      await next();
      // @types/oidc-provider types provider.use() with Koa's default context, which knows nothing of `oidc`.
      const route = (ctx as KoaContextWithOIDC).oidc?.route;
      if (route === 'discovery' && discoveryIssuer)
        ctx.body = { ...(ctx.body as object), issuer: discoveryIssuer };
      if (route === 'device_authorization' && ctx.status === 200)
        ctx.body = { ...(ctx.body as object), interval: DEVICE_POLL_SECONDS };
    });
    return { provider, handle: provider.callback() };
  }
  let active = newProvider();

  /** The interaction page: logs the configured user in and consents to what the client asked, or denies it. */
  async function interact(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const { provider } = active;
    const details = await provider.interactionDetails(req, res);
    if (consent === 'deny' || !login) {
      const description = login ? 'the user denied consent' : 'this issuer has no user to log in';
      return provider.interactionFinished(
        req,
        res,
        { error: 'access_denied', error_description: description },
        { mergeWithLastSubmission: false },
      );
    }
    const accountId = login.username;
    const grant =
      (details.grantId ? await provider.Grant.find(details.grantId) : undefined) ??
      new provider.Grant({ accountId, clientId: String(details.params['client_id']) });
    // Claims come with scopes only: the claims parameter is off, as oidc-provider has it by default.
    const scope = details.params['scope'];
    grant.addOIDCScope(typeof scope === 'string' ? scope : 'openid');
    await provider.interactionFinished(
      req,
      res,
      { login: { accountId }, consent: { grantId: await grant.save() } },
      { mergeWithLastSubmission: false },
    );
  }

  server.on('request', (req: IncomingMessage, res: ServerResponse) => {
    const original = req.url ?? '/';
    if (!original.startsWith(`${path}/`)) return void res.writeHead(404).end();
    const local = original.slice(path.length);
    const pathname = local.split('?')[0];
    const endpoint =
      pathname === '/.well-known/openid-configuration'
        ? 'discovery'
        : pathname === '/jwks'
          ? 'jwks'
          : undefined;
    if (endpoint === 'jwks') jwksCount++;
    const mode = endpoint ? modes[endpoint] : 'ok';
    if (mode === 'hang') return; // never answers; the client's deadline must fire, and stop() ends the socket
    if (mode === 'down') return void res.writeHead(503, { 'content-type': 'text/plain' }).end('unavailable');
    if (mode === 'garbage')
      return void res
        .writeHead(200, { 'content-type': 'application/json' })
        .end('{"keys": [ this is not json');
    if (pathname?.startsWith('/interaction/')) {
      interact(req, res).catch((err: unknown) => {
        if (!res.headersSent)
          res
            .writeHead(400, { 'content-type': 'text/plain' })
            .end(`interaction: ${(err as Error).message}\n`);
        // Half an answer must still end, or the browser waits for the rest.
        else res.destroy();
      });
      return;
    }
    // Mounted below a path the way Express mounts it: oidc-provider reads the mount point from originalUrl.
    if (path) Object.assign(req, { originalUrl: original, url: local });
    void active.handle(req, res);
  });

  return {
    url,
    caPem: ca.certPem,
    caData: Buffer.from(ca.certPem).toString('base64'),
    clientId,
    jwksRequests: () => jwksCount,
    async mint(claims, mintOpts = {}) {
      const key = mintOpts.signingKey ?? current;
      const now = Math.floor(Date.now() / 1000);
      const jwt = new SignJWT(claims)
        .setProtectedHeader({ alg: 'ES256', kid: mintOpts.kid ?? key.kid, typ: 'JWT' })
        .setIssuer(mintOpts.issuer ?? url)
        .setAudience(mintOpts.audience ?? audience)
        .setIssuedAt(now)
        .setExpirationTime(now + (mintOpts.expiresIn ?? 300));
      if (mintOpts.notBefore !== undefined) jwt.setNotBefore(now + mintOpts.notBefore);
      return jwt.sign(key.privateKey);
    },
    currentJWK: () => current.jwk,
    newKey,
    rotate(key, rotateOpts = {}) {
      const others = rotateOpts.dropOld ? [] : published.filter((k) => k.kid !== key.kid);
      published = [key, ...others];
      current = key;
      active = newProvider();
    },
    setMode(endpoint, mode) {
      modes[endpoint] = mode;
    },
    setDiscoveryIssuer(issuer) {
      discoveryIssuer = issuer;
    },
    setConsent(answer) {
      consent = answer;
    },
    async revoke(refreshToken) {
      const dispatcher = new Agent({ connect: { ca: ca.certPem } });
      try {
        const answer = await fetch(active.provider.urlFor('revocation'), {
          method: 'POST',
          body: new URLSearchParams({
            token: refreshToken,
            token_type_hint: 'refresh_token',
            client_id: clientId,
          }),
          dispatcher,
        });
        const body = await answer.text();
        if (answer.status !== 200) throw new Error(`revoke: the issuer answered ${answer.status}: ${body}`);
      } finally {
        await dispatcher.close();
      }
    },
    grants: () => ({ ...grantCounts }),
    stop: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}
