// A local OIDC issuer over real HTTPS: discovery and JWKS as a provider serves them, tokens minted with jose.
// Dex would be the real thing, but its current module needs an unreleased version of its own API module,
// which the Go module proxy does not serve; this issuer stands in for tests and the dev setup. Its failure
// switches (down, garbage, another issuer) let tests break it on purpose.
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { exportJWK, generateKeyPair, SignJWT, type JWK, type JWTPayload, type CryptoKey } from 'jose';
import { issueCert, newCA } from '../../lib/pki.ts';

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
  stop(): Promise<void>;
}

export async function startOIDCIssuer(opts: { path?: string; audience?: string } = {}): Promise<TestIssuer> {
  const ca = await newCA('test-oidc-issuer-ca');
  const serving = await issueCert(ca, {
    commonName: 'oidc-issuer',
    hosts: ['127.0.0.1', 'localhost'],
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

  const server: Server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
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
            subject_types_supported: ['public'],
            id_token_signing_alg_values_supported: ['ES256'],
          }
        : { keys: published };
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  url = `https://127.0.0.1:${(server.address() as AddressInfo).port}${path}`;

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
    stop: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}
