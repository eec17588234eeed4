import { describe, expect, it } from '@jest/globals';
import { apiGroups, apiVersionOf, isValidGroupSuffix } from './groups.ts';

describe('api groups', () => {
  it('builds every group from the default suffix', () => {
    expect(apiGroups()).toEqual({
      access: 'access.concierge.sealion.dev',
      authentication: 'authentication.concierge.sealion.dev',
      config: 'config.concierge.sealion.dev',
      login: 'login.concierge.sealion.dev',
      identity: 'identity.concierge.sealion.dev',
      tunnel: 'tunnel.concierge.sealion.dev',
      recordings: 'recordings.concierge.sealion.dev',
      reach: 'reach.concierge.sealion.dev',
    });
  });

  it("gives Pinniped's exact groups for pinniped.dev", () => {
    expect(apiVersionOf('TokenCredentialRequest', 'pinniped.dev')).toBe(
      'login.concierge.pinniped.dev/v1alpha1',
    );
    expect(apiVersionOf('JWTAuthenticator', 'pinniped.dev')).toBe(
      'authentication.concierge.pinniped.dev/v1alpha1',
    );
  });

  it.each(['', 'dev', 'Sealion.dev', 'sealion_dev.io', '-a.dev', 'a..dev', `${'a'.repeat(250)}.dev`])(
    'rejects the suffix %j',
    (suffix) => {
      expect(isValidGroupSuffix(suffix)).toBe(false);
      expect(() => apiGroups(suffix)).toThrow(/must be a DNS subdomain/);
    },
  );

  it.each(['sealion.dev', 'pinniped.dev', 'auth.example.co.uk'])('accepts the suffix %j', (suffix) => {
    expect(isValidGroupSuffix(suffix)).toBe(true);
  });
});
