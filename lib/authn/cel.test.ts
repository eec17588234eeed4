import { describe, expect, it } from '@jest/globals';
import { compileExpression, evaluateAll, evaluationProblem, ExpressionError, stringsResult } from './cel.ts';

/**
 * Evaluates one expression. Its deadline is 10 s, not the concierge's 100 ms: that is wall-clock time, and a worker
 * paused on two busy cores would fail an expression that takes microseconds. The deadline's own test sets its own.
 */
const run = (kind: Parameters<typeof compileExpression>[0], expression: string, variables: object): unknown =>
  evaluateAll([compileExpression(kind, expression)], variables as Record<string, unknown>, 10_000)[0];

describe('CEL for structured authentication', () => {
  it('maps claims as the API server does', () => {
    const claims = {
      email: 'dana@example.com',
      groups: ['dev', 'ops'],
      exp: 1700000000,
      nested: { team: 'blue' },
    };
    expect(run('username', "claims.email.split('@')[0]", { claims })).toBe('dana');
    expect(run('groups', "claims.groups.map(g, 'oidc:' + g)", { claims })).toEqual(['oidc:dev', 'oidc:ops']);
    expect(run('uid', 'claims.nested.team', { claims })).toBe('blue');
    expect(run('extra', 'claims.?missing.orValue("none")', { claims })).toBe('none');
    // JSON numbers are doubles, as cel-go decodes them.
    expect(run('claimValidation', 'claims.exp == 1700000000', { claims })).toBe(true);
    expect(run('claimValidation', 'has(claims.missing)', { claims })).toBe(false);
    expect(
      run('userValidation', "!user.username.startsWith('system:') && 'dev' in user.groups", {
        user: { username: 'dana', uid: '', groups: ['dev'], extra: {} },
      }),
    ).toBe(true);
  });

  it.each([
    ["claims.sub.replace('-', '_')", 'u_10_01'],
    ["claims.sub.replace('-', '_', 1)", 'u_10-01'],
    ["claims.sub.replace('-', '_', 0)", 'u-10-01'],
    ['claims.sub.charAt(2)', '1'],
    ["claims.sub.find('[0-9]+')", '10'],
    ["claims.sub.find('x')", ''],
    ["claims.sub.findAll('[0-9]+')", ['10', '01']],
    ["claims.sub.findAll('[0-9]+', 1)", ['10']],
    ['dyn(claims.groups).isSorted()', true],
    ['[3, 1].isSorted()', false],
    ['[1, 2, 3].sum()', 6n],
    ['[2, 1, 3].min()', 1n],
    ["['b', 'c', 'a'].max()", 'c'],
    ["dyn(claims.groups).indexOf('ops')", 1n],
  ] as const)('has the API server’s library functions: %s', (expression, value) => {
    expect(run('extra', expression, { claims: { sub: 'u-10-01', groups: ['dev', 'ops'] } })).toEqual(value);
  });

  it('checks a mapping’s result when it runs, as the API server does', () => {
    // An int username compiles (the API server takes it) and gives an int, which the mapping refuses per token.
    expect(run('username', 'claims.sub == 1 ? 1 : 2', { claims: { sub: 'x' } })).toBe(2n);
  });

  it('gives a missing claim as an error in its place, with where in the expression', () => {
    const e = compileExpression('username', 'claims.email');
    const [result] = evaluateAll([e], { claims: {} });
    expect(result).toBeInstanceOf(Error);
    expect(evaluationProblem(e, result as Error)).toMatch(/^expression "claims\.email" at 1:\d+: /);
  });

  it.each([
    ['claimValidation', 'claims.hd', /must evaluate to bool, not dyn/],
    ['username', 'claims +', /^1:\d+: /],
    ['groups', 'claims.groups.map(g,\n  g +)', /^2:\d+: /],
    ['userValidation', 'claims.sub == "x"', /claims/],
    ['username', 'cel.bind(x, claims.sub, x)', /cel.bind is not available|bind/],
    ['username', '   ', /empty/],
  ] as const)('refuses %s %j, saying where', (kind, expression, problem) => {
    let thrown: unknown;
    try {
      compileExpression(kind, expression);
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(ExpressionError);
    expect((thrown as Error).message).toMatch(problem);
  });

  it('ends a pathological expression at the deadline instead of pinning the CPU', () => {
    const list = '[0,1,2,3,4,5,6,7,8,9]';
    let heavy = 'true';
    for (let i = 0; i < 9; i++) heavy = `${list}.all(x${i}, ${heavy})`;
    const e = compileExpression('claimValidation', heavy);
    expect(() => evaluateAll([e], { claims: {} }, 50)).toThrow(/took more than 50 ms/);
    // The guard is ready for the next token.
    expect(evaluateAll([compileExpression('claimValidation', 'true')], { claims: {} })).toEqual([true]);
  });

  it('guards only what can cost more than a pass over the claims', () => {
    const guarded = (e: string): boolean => compileExpression('claimValidation', e).guarded;
    expect(guarded("claims.email.endsWith('@example.com')")).toBe(false);
    expect(guarded("claims.groups.exists(g, g == 'dev')")).toBe(false);
    expect(guarded('claims.groups.exists(g, claims.groups.all(h, h != g))')).toBe(true);
    expect(guarded("claims.email.matches('^(a+)+$')")).toBe(true);
  });

  it('takes groups and extra values as the API server does', () => {
    expect(stringsResult('a')).toEqual(['a']);
    expect(stringsResult(['a', '', 'b'])).toEqual(['a', 'b']);
    expect(stringsResult(null)).toEqual([]);
    expect(stringsResult('')).toEqual([]);
    expect(stringsResult([1])).toBeUndefined();
    expect(stringsResult(1)).toBeUndefined();
  });
});
