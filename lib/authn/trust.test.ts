// Which edits of an authenticator's spec change what its certificates are bound to, and which do not.
import { describe, expect, it } from '@jest/globals';
import type { JWTAuthenticatorSpec, WebhookAuthenticatorSpec } from '../../apis/authentication.ts';
import { jwtTrustDigest, webhookTrustDigest } from './trust.ts';

const CA = Buffer.from('-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n').toString('base64');
const OTHER_CA = Buffer.from('-----BEGIN CERTIFICATE-----\nMIIC\n-----END CERTIFICATE-----\n').toString(
  'base64',
);

const JWT: JWTAuthenticatorSpec = {
  issuer: 'https://issuer.example.com',
  audience: 'kubectl',
  claims: { username: 'email', groups: 'roles', usernamePrefix: 'oidc:', groupsPrefix: 'oidc:' },
  tls: { certificateAuthorityData: CA },
};
const WEBHOOK: WebhookAuthenticatorSpec = {
  endpoint: 'https://hooks.example.com/authenticate',
  tls: { certificateAuthorityData: CA },
};

describe('the trust digest of a JWTAuthenticator', () => {
  it.each<[string, JWTAuthenticatorSpec]>([
    ['another issuer', { ...JWT, issuer: 'https://elsewhere.example.com' }],
    ['another audience', { ...JWT, audience: 'someone-else' }],
    ['another username claim', { ...JWT, claims: { ...JWT.claims, username: 'sub' } }],
    ['another groups claim', { ...JWT, claims: { ...JWT.claims, groups: 'teams' } }],
    ['another username prefix', { ...JWT, claims: { ...JWT.claims, usernamePrefix: 'corp:' } }],
    ['no username prefix', { ...JWT, claims: { ...JWT.claims, usernamePrefix: '' } }],
    ['another groups prefix', { ...JWT, claims: { ...JWT.claims, groupsPrefix: '' } }],
    ['no claims (the defaults)', { issuer: JWT.issuer, audience: JWT.audience, tls: JWT.tls! }],
    ['another CA bundle', { ...JWT, tls: { certificateAuthorityData: OTHER_CA } }],
    ['no CA bundle (the system roots)', { ...JWT, tls: {} }],
    ['system names allowed', { ...JWT, allowSystemNames: true }],
  ])('changes with %s', (_edit, edited) => {
    expect(jwtTrustDigest(edited)).not.toBe(jwtTrustDigest(JWT));
  });

  it.each<[string, JWTAuthenticatorSpec]>([
    ['another certificate lifetime', { ...JWT, credentialLifetimeSeconds: 3600 }],
    ['the fields written in another order', Object.fromEntries(Object.entries(JWT).reverse())],
    ['allowSystemNames written out as false', { ...JWT, allowSystemNames: false }],
  ])('stays with %s', (_edit, edited) => {
    expect(jwtTrustDigest(edited)).toBe(jwtTrustDigest(JWT));
  });

  it('stays when a default is written out', () => {
    const bare: JWTAuthenticatorSpec = { issuer: JWT.issuer, audience: JWT.audience };
    expect(
      jwtTrustDigest({
        ...bare,
        claims: { username: 'username', groups: 'groups', usernamePrefix: '', groupsPrefix: '' },
        tls: { certificateAuthorityData: '' },
      }),
    ).toBe(jwtTrustDigest(bare));
  });

  it('is 43 characters of base64url, which a binding URI carries as they are', () => {
    expect(jwtTrustDigest(JWT)).toMatch(/^[A-Za-z0-9_-]{43}$/);
  });
});

describe('the trust digest of a WebhookAuthenticator', () => {
  it.each<[string, WebhookAuthenticatorSpec]>([
    ['another endpoint', { ...WEBHOOK, endpoint: 'https://hooks.example.com/other' }],
    ['another CA bundle', { ...WEBHOOK, tls: { certificateAuthorityData: OTHER_CA } }],
    ['no CA bundle (the system roots)', { endpoint: WEBHOOK.endpoint }],
    ['system names allowed', { ...WEBHOOK, allowSystemNames: true }],
  ])('changes with %s', (_edit, edited) => {
    expect(webhookTrustDigest(edited)).not.toBe(webhookTrustDigest(WEBHOOK));
  });

  it('stays with another certificate lifetime', () => {
    expect(webhookTrustDigest({ ...WEBHOOK, credentialLifetimeSeconds: 120 })).toBe(
      webhookTrustDigest(WEBHOOK),
    );
  });

  it('differs from a JWTAuthenticator’s whose fields happen to read alike', () => {
    const alike = { issuer: '', audience: '', endpoint: '' } as unknown as JWTAuthenticatorSpec &
      WebhookAuthenticatorSpec;
    expect(webhookTrustDigest(alike)).not.toBe(jwtTrustDigest(alike));
  });
});
