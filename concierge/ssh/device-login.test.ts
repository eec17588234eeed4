import { describe, expect, it } from '@jest/globals';
import type * as oidc from 'openid-client';
import { scopesFor } from './device-login.ts';

/** An issuer's configuration as far as scopesFor reads it: its discovery's scopes_supported. */
const issuerListing = (scopes?: unknown): oidc.Configuration =>
  ({ serverMetadata: () => ({ issuer: 'https://issuer.example', scopes_supported: scopes }) }) as never;

describe('the scopes a device login asks for', () => {
  it('adds offline_access, for a refresh token, where the issuer lists it, and only there', () => {
    expect(scopesFor(issuerListing(['openid', 'offline_access']), ['openid', 'groups'])).toBe(
      'openid groups offline_access',
    );
    expect(scopesFor(issuerListing(['openid']), ['openid', 'groups'])).toBe('openid groups');
    expect(scopesFor(issuerListing(undefined), ['openid'])).toBe('openid');
    expect(scopesFor(issuerListing(['offline_access']), ['openid', 'offline_access'])).toBe(
      'openid offline_access',
    );
  });
});
