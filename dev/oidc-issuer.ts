// A local OIDC issuer over real HTTPS: discovery and JWKS as a provider serves them, tokens minted with jose.
// Dex would be the real thing, but its current module needs an unreleased version of its own API module,
// which the Go module proxy does not serve; this issuer stands in for tests and the dev setup. Its failure
// switches (down, garbage, another issuer) let tests break it on purpose. Its authorization endpoint logs in one
// configured user without asking (the "browser" is a test or the developer), with PKCE (S256) required, and its
// token endpoint serves the code and refresh-token grants.
import { createHash, randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT, type JWK, type JWTPayload, type CryptoKey } from 'jose';
import { issueCert, newCA } from '../lib/pki.ts';

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
  /** Default: `sealion`. */
  audience?: string | string[];
  /** Sign with this key instead (e.g. one the issuer never published). */
  signingKey?: { privateKey: CryptoKey; kid: string };
}

export interface TestIssuer {
  url: string;
  /** PEM of the CA that signed the issuer's serving certificate. */
  caPem: string;
  /** The same CA, base64-encoded, as `spec.tls.certificateAuthorityData` wants it. */
  caData: string;
  /** Number of JWKS requests served so far. */
  jwksRequests(): number;
  mint(claims: JWTPayload, opts?: MintOptions): Promise<string>;
  /** The public JWK the issuer currently signs with. */
  currentJWK(): JWK;
  /** A fresh key the issuer does not publish (yet): see rotate(). */
  newKey(): Promise<{ privateKey: CryptoKey; kid: string; jwk: JWK }>;
  /** Publishes `key` alongside (or instead of) the current keys and signs with it from now on. */
  rotate(key: { privateKey: CryptoKey; kid: string; jwk: JWK }, opts?: { dropOld?: boolean }): void;
  /** How the discovery and JWKS endpoints behave. */
  setMode(endpoint: 'discovery' | 'jwks', mode: IssuerMode): void;
  /** Make discovery name another issuer. */
  setDiscoveryIssuer(issuer: string | undefined): void;
  /** Grants served by the token endpoint so far, by grant type. */
  grants(): { authorization_code: number; refresh_token: number };
  stop(): Promise<void>;
}

/** Who the authorization endpoint logs in. */
export interface IssuerLogin {
  username: string;
  groups: string[];
}

/** Lifetime of ID tokens from the token endpoint: short, so tests and the dev setup see refreshes. */
const ISSUED_TOKEN_SECONDS = 300;

export async function startOIDCIssuer(
  opts: {
    path?: string;
    audience?: string;
    login?: IssuerLogin;
    /** The address to listen on (and the issuer URL's host). Default: 127.0.0.1; a node's host address for pods. */
    host?: string;
  } = {},
): Promise<TestIssuer> {
  const host = opts.host ?? '127.0.0.1';
  const ca = await newCA('test-oidc-issuer-ca');
  const serving = await issueCert(ca, {
    commonName: 'oidc-issuer',
    hosts: [...new Set([host, '127.0.0.1', 'localhost'])],
    usage: 'server',
  });
  const audience = opts.audience ?? 'sealion';
  let kidCounter = 0;
  const newKey = async (): Promise<{ privateKey: CryptoKey; kid: string; jwk: JWK }> => {
    const { privateKey, publicKey } = await generateKeyPair('ES256', { extractable: true });
    const kid = `key-${++kidCounter}`;
    return { privateKey, kid, jwk: { ...(await exportJWK(publicKey)), kid, alg: 'ES256', use: 'sig' } };
  };
  let current = await newKey();
  let published: JWK[] = [current.jwk];
  const modes = { discovery: 'ok' as IssuerMode, jwks: 'ok' as IssuerMode };
  let discoveryIssuer: string | undefined;
  let jwksCount = 0;
  let url = '';
  const path = opts.path ?? '';

  const codes = new Map<
    string,
    { clientId: string; redirectUri: string; challenge: string; nonce?: string }
  >();
  const refreshTokens = new Map<string, string>();
  const grantCounts = { authorization_code: 0, refresh_token: 0 };
  const random = (): string => randomBytes(24).toString('base64url');

  async function idTokenFor(clientId: string, nonce?: string): Promise<string> {
    const login = opts.login!;
    const now = Math.floor(Date.now() / 1000);
    return new SignJWT({ username: login.username, groups: login.groups, ...(nonce ? { nonce } : {}) })
      .setProtectedHeader({ alg: 'ES256', kid: current.kid, typ: 'JWT' })
      .setIssuer(url)
      .setSubject(login.username)
      .setAudience(clientId)
      .setIssuedAt(now)
      .setExpirationTime(now + ISSUED_TOKEN_SECONDS)
      .sign(current.privateKey);
  }

  async function tokenResponse(clientId: string, nonce?: string): Promise<object> {
    const refresh = random();
    refreshTokens.set(refresh, clientId);
    return {
      token_type: 'Bearer',
      access_token: random(),
      id_token: await idTokenFor(clientId, nonce),
      refresh_token: refresh,
      expires_in: ISSUED_TOKEN_SECONDS,
    };
  }

  /** The authorization and token endpoints; false when the request is for another endpoint. */
  function serveLogin(req: IncomingMessage, res: ServerResponse): boolean {
    const here = new URL(req.url ?? '/', url);
    const fail = (status: number, error: string): void =>
      void res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify({ error }));
    if (here.pathname === `${path}/authorize` && opts.login) {
      const q = here.searchParams;
      const redirectUri = q.get('redirect_uri') ?? '';
      if (q.get('response_type') !== 'code' || q.get('code_challenge_method') !== 'S256' || !redirectUri)
        return (fail(400, 'invalid_request'), true);
      const code = random();
      codes.set(code, {
        clientId: q.get('client_id') ?? '',
        redirectUri,
        challenge: q.get('code_challenge') ?? '',
        ...(q.get('nonce') ? { nonce: q.get('nonce')! } : {}),
      });
      const back = new URL(redirectUri);
      back.searchParams.set('code', code);
      if (q.get('state')) back.searchParams.set('state', q.get('state')!);
      res.writeHead(302, { location: back.toString() }).end();
      return true;
    }
    if (here.pathname === `${path}/token` && req.method === 'POST' && opts.login) {
      let body = '';
      req.on('data', (c: Buffer) => (body += c.toString()));
      req.on('end', () => {
        const form = new URLSearchParams(body);
        const clientId = form.get('client_id') ?? '';
        const answer = async (): Promise<void> => {
          if (form.get('grant_type') === 'authorization_code') {
            const issued = codes.get(form.get('code') ?? '');
            codes.delete(form.get('code') ?? '');
            const challenge = createHash('sha256')
              .update(form.get('code_verifier') ?? '')
              .digest('base64url');
            if (!issued || issued.clientId !== clientId || issued.redirectUri !== form.get('redirect_uri'))
              return fail(400, 'invalid_grant');
            if (issued.challenge !== challenge) return fail(400, 'invalid_grant');
            grantCounts.authorization_code++;
            const tokens = await tokenResponse(clientId, issued.nonce);
            return void res
              .writeHead(200, { 'content-type': 'application/json' })
              .end(JSON.stringify(tokens));
          }
          if (form.get('grant_type') === 'refresh_token') {
            const owner = refreshTokens.get(form.get('refresh_token') ?? '');
            // Refresh tokens rotate: each is good once.
            refreshTokens.delete(form.get('refresh_token') ?? '');
            if (owner !== clientId) return fail(400, 'invalid_grant');
            grantCounts.refresh_token++;
            const tokens = await tokenResponse(clientId);
            return void res
              .writeHead(200, { 'content-type': 'application/json' })
              .end(JSON.stringify(tokens));
          }
          fail(400, 'unsupported_grant_type');
        };
        answer().catch(() => fail(500, 'server_error'));
      });
      return true;
    }
    return false;
  }

  const server: Server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
    if (serveLogin(req, res)) return;
    const endpoint =
      req.url === `${path}/.well-known/openid-configuration`
        ? 'discovery'
        : req.url === `${path}/jwks`
          ? 'jwks'
          : undefined;
    if (!endpoint) {
      res.writeHead(404).end();
      return;
    }
    if (endpoint === 'jwks') jwksCount++;
    const mode = modes[endpoint];
    if (mode === 'hang') return; // never answers; the client's deadline must fire
    if (mode === 'down') {
      res.writeHead(503, { 'content-type': 'text/plain' }).end('unavailable');
      return;
    }
    if (mode === 'garbage') {
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"keys": [ this is not json');
      return;
    }
    const body =
      endpoint === 'discovery'
        ? {
            issuer: discoveryIssuer ?? url,
            jwks_uri: `${url}/jwks`,
            authorization_endpoint: `${url}/authorize`,
            token_endpoint: `${url}/token`,
            response_types_supported: ['code'],
            grant_types_supported: ['authorization_code', 'refresh_token'],
            code_challenge_methods_supported: ['S256'],
            token_endpoint_auth_methods_supported: ['none'],
            subject_types_supported: ['public'],
            id_token_signing_alg_values_supported: ['ES256'],
          }
        : { keys: published };
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  });
  await new Promise<void>((done) => server.listen(0, host, done));
  url = `https://${host}:${(server.address() as AddressInfo).port}${path}`;

  return {
    url,
    caPem: ca.certPem,
    caData: Buffer.from(ca.certPem).toString('base64'),
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
      published = rotateOpts.dropOld ? [key.jwk] : [...published, key.jwk];
      current = key;
    },
    setMode(endpoint, mode) {
      modes[endpoint] = mode;
    },
    setDiscoveryIssuer(issuer) {
      discoveryIssuer = issuer;
    },
    grants: () => ({ ...grantCounts }),
    stop: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}
