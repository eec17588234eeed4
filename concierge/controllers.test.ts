import { describe, expect, it } from '@jest/globals';
import { loadConfig } from './config.ts';
import { configFromIssuerSpec, issuerSpec } from './controllers.ts';

describe('the settings kept on the CredentialIssuer', () => {
  it('give back the configuration they were written from', () => {
    const config = loadConfig(`
impersonationProxy:
  mode: enabled
  endpoint: proxy.example.com:8443
  service: {type: ClusterIP, annotations: {a.example.com/b: c}}
  tls: {secretName: my-tls}
kubeCertAgent: {mode: disabled}
`);
    expect(configFromIssuerSpec(issuerSpec(config))).toEqual(config);
    expect(configFromIssuerSpec(issuerSpec(loadConfig('')))).toEqual(loadConfig(''));
  });

  it('are checked as an edit of the ConfigMap would be', () => {
    expect(configFromIssuerSpec(undefined)).toBeUndefined();
    expect(configFromIssuerSpec({})).toBeUndefined();
    const spec = issuerSpec(loadConfig('impersonationProxy: {mode: enabled}'));
    expect(
      configFromIssuerSpec({
        ...spec,
        impersonationProxy: { ...spec.impersonationProxy!, mode: 'sometimes' as never },
      }),
    ).toBeUndefined();
    expect(
      configFromIssuerSpec({
        ...spec,
        impersonationProxy: { ...spec.impersonationProxy!, externalEndpoint: 'http://plain.example.com' },
      }),
    ).toBeUndefined();
  });

  it('written by a concierge that kept fewer of them, leave the rest at their defaults', () => {
    expect(configFromIssuerSpec({ impersonationProxy: { mode: 'disabled' } })).toEqual(
      loadConfig('impersonationProxy: {mode: disabled}'),
    );
  });
});
