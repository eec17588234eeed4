import { describe, expect, it } from '@jest/globals';
import type { JWTConfiguration } from '../../apis/authentication.ts';
import { compileJWTConfiguration, mapClaims, type JWTMapping } from './jwt-mapping.ts';

const ISSUER = { url: 'https://issuer.example.com', audiences: ['sealion'] };
const compiled = (config: Partial<JWTConfiguration>): JWTMapping => {
  const result = compileJWTConfiguration({
    issuer: ISSUER,
    claimMappings: { username: { claim: 'sub', prefix: '' } },
    ...config,
  });
  if ('problems' in result) throw new Error(result.problems.join('; '));
  return result;
};

describe('a jwt entry of AuthenticationConfiguration', () => {
  it.each([
    ['no username', { claimMappings: {} as never }, /claimMappings.username: required/],
    [
      'claim and expression',
      { claimMappings: { username: { claim: 'sub', prefix: '', expression: 'claims.sub' } } },
      /exactly one of claim or expression/,
    ],
    [
      'a claim without its prefix',
      { claimMappings: { username: { claim: 'sub' } } },
      /prefix: required with claim/,
    ],
    [
      'an expression with a prefix',
      { claimMappings: { username: { expression: 'claims.sub', prefix: 'x:' } } },
      /prefix: only with claim/,
    ],
    [
      'an email without email_verified',
      { claimMappings: { username: { expression: 'claims.email' } } },
      /claims.email_verified must be used/,
    ],
    [
      'an expression that does not compile',
      { claimMappings: { username: { expression: 'claims.sub +' } } },
      /username.expression: 1:\d+: /,
    ],
    [
      'a validation rule that is not bool',
      { claimValidationRules: [{ expression: 'claims.hd' }] },
      /claimValidationRules\[0\].expression: must evaluate to bool/,
    ],
    [
      'a reserved extra key',
      {
        claimMappings: {
          username: { claim: 'sub', prefix: '' },
          extra: [{ key: 'kubernetes.io/x', valueExpression: '"a"' }],
        },
      },
      /reserved/,
    ],
    [
      'an extra key not in lower case',
      {
        claimMappings: {
          username: { claim: 'sub', prefix: '' },
          extra: [{ key: 'example.com/Team', valueExpression: '"a"' }],
        },
      },
      /lower case/,
    ],
    ['two audiences without MatchAny', { issuer: { ...ISSUER, audiences: ['a', 'b'] } }, /MatchAny/],
    [
      'a plain-http issuer',
      { issuer: { ...ISSUER, url: 'http://issuer.example.com' } },
      /issuer.url: must be an https URL/,
    ],
  ] as const)('is refused with %s, naming the field', (_what, config, problem) => {
    const result = compileJWTConfiguration({
      issuer: ISSUER,
      claimMappings: { username: { claim: 'sub', prefix: '' } },
      ...(config as Partial<JWTConfiguration>),
    });
    expect('problems' in result && result.problems.join('; ')).toMatch(problem);
  });

  it('maps claims to a user with expressions, rules and extras', () => {
    const mapping = compiled({
      claimValidationRules: [
        { claim: 'hd', requiredValue: 'example.com' },
        { expression: 'claims.email_verified == true', message: 'verified emails only' },
      ],
      claimMappings: {
        username: { expression: "claims.email.split('@')[0]" },
        groups: { expression: "claims.roles.map(r, 'role:' + r)" },
        uid: { claim: 'sub' },
        extra: [
          { key: 'example.com/team', valueExpression: 'claims.team' },
          { key: 'example.com/none', valueExpression: 'null' },
        ],
      },
      userValidationRules: [{ expression: "!user.username.startsWith('admin')", message: 'no admins' }],
    });
    const claims = {
      sub: 's-1',
      hd: 'example.com',
      email: 'dana@example.com',
      email_verified: true,
      roles: ['dev', ''],
      team: 'blue',
    };
    expect(mapClaims(mapping, claims)).toEqual({
      username: 'dana',
      uid: 's-1',
      groups: ['role:dev', 'role:'],
      extra: { 'example.com/team': ['blue'] },
    });
    expect(mapClaims(mapping, { ...claims, hd: 'other.com' })).toEqual({
      reason: 'claim hd does not hold its required value',
    });
    expect(mapClaims(mapping, { ...claims, email_verified: 'true' })).toEqual({
      reason: 'claim validation rule failed: verified emails only',
    });
    expect(mapClaims(mapping, { ...claims, email: 'admin@example.com' })).toEqual({
      reason: 'user validation rule failed: no admins',
    });
    expect('reason' in mapClaims(mapping, { ...claims, roles: 'dev' })).toBe(true);
  });

  it('maps by claims as the API server does: prefixes, email_verified, groups as a string', () => {
    const mapping = compiled({
      claimMappings: {
        username: { claim: 'email', prefix: 'oidc:' },
        groups: { claim: 'groups', prefix: 'g:' },
      },
    });
    expect(mapClaims(mapping, { email: 'a@b.c', groups: 'devs' })).toEqual({
      username: 'oidc:a@b.c',
      groups: ['g:devs'],
      extra: {},
    });
    expect(mapClaims(mapping, { email: 'a@b.c', email_verified: false })).toEqual({
      reason: 'email is not verified',
    });
    expect(mapClaims(mapping, { email: 'a@b.c', email_verified: 'true' })).toEqual({
      reason: 'claim email_verified is present but not a boolean',
    });
    expect(mapClaims(mapping, { email: 7 })).toEqual({ reason: 'claim email is missing or not a string' });
  });
});
