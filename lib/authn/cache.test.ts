// The authenticator cache's reuse of answers: only successes that say how long they hold, never past that, and
// never across a change of authenticators.
import { describe, expect, it } from '@jest/globals';
import { AnswerCache } from './answer-cache.ts';
import { AuthenticatorCache } from './cache.ts';
import type { AuthResult, TokenAuthenticator } from './types.ts';

const ISSUER = 'https://issuer.example.com';

/** An unsigned token naming ISSUER: the cache only reads `iss` to route it; the fake authenticators judge it. */
function tokenFor(name: string): string {
  const part = (o: object): string => Buffer.from(JSON.stringify(o)).toString('base64url');
  return `${part({ alg: 'ES256' })}.${part({ iss: ISSUER, sub: name })}.c2ln`;
}

/** Answers from a table and counts how often it was asked. */
function countingAuthenticator(
  answer: (token: string) => AuthResult,
): TokenAuthenticator & { asked: number } {
  const a = {
    asked: 0,
    authenticate(token: string): Promise<AuthResult> {
      a.asked++;
      return Promise.resolve(answer(token));
    },
  };
  return a;
}

const user = (username: string): AuthResult & { ok: true } => ({
  ok: true,
  authenticator: 'fake',
  user: { username, groups: [], extra: {} },
});

describe('reused answers', () => {
  it('gives a success again until its reusableUntil, without asking the authenticator', async () => {
    const cache = new AuthenticatorCache();
    const jwt = countingAuthenticator(() => ({ ...user('alice'), reusableUntil: Date.now() + 60_000 }));
    cache.set('JWTAuthenticator', 'corp', jwt, { issuer: ISSUER });
    const token = tokenFor('alice');
    const first = await cache.authenticate(token);
    expect(first).toMatchObject({
      ok: true,
      user: { username: 'alice' },
      authenticator: 'JWTAuthenticator/corp',
    });
    expect(await cache.authenticate(token)).toBe(first);
    expect(jwt.asked).toBe(1);
    // Another token is another question.
    await cache.authenticate(tokenFor('bob'));
    expect(jwt.asked).toBe(2);
  });

  it('gives an answer until the moment its reusableUntil comes and never after, by the clock it is given', async () => {
    let clock = 1_000_000;
    const cache = new AuthenticatorCache({ now: () => clock });
    const jwt = countingAuthenticator(() => ({ ...user('alice'), reusableUntil: clock + 5_000 }));
    cache.set('JWTAuthenticator', 'corp', jwt, { issuer: ISSUER });
    const token = tokenFor('alice');
    await cache.authenticate(token);
    clock += 4_999;
    expect(cache.reusedAnswer(token)).toMatchObject({ ok: true });
    await cache.authenticate(token);
    expect(jwt.asked).toBe(1);
    clock += 1;
    expect(cache.reusedAnswer(token)).toBeUndefined();
    await cache.authenticate(token);
    expect(jwt.asked).toBe(2);
    // An answer whose time has already come when it arrives is not kept at all.
    const late = countingAuthenticator(() => ({ ...user('bob'), reusableUntil: clock }));
    cache.set('JWTAuthenticator', 'corp', late, { issuer: ISSUER });
    await cache.authenticate(token);
    await cache.authenticate(token);
    expect(late.asked).toBe(2);
  });

  it('gives a named authenticator its own earlier answer again, and keeps it apart from the others’', async () => {
    const cache = new AuthenticatorCache();
    const reusable = (): AuthResult => ({ ...user('alice'), reusableUntil: Date.now() + 60_000 });
    const corp = countingAuthenticator(reusable);
    const other = countingAuthenticator(reusable);
    cache.set('JWTAuthenticator', 'corp', corp, { issuer: ISSUER });
    cache.set('JWTAuthenticator', 'other', other, { issuer: 'https://other.example.com' });
    const token = tokenFor('alice');
    // TokenCredentialRequest names the authenticator: corp's answer holds for corp, asked once.
    for (let i = 0; i < 2; i++)
      expect(await cache.authenticateWith('JWTAuthenticator', 'corp', token)).toMatchObject({
        ok: true,
        authenticator: 'JWTAuthenticator/corp',
      });
    expect(corp.asked).toBe(1);
    // Another authenticator is asked itself, and its answer does not become the one bearer requests get.
    await cache.authenticateWith('JWTAuthenticator', 'other', token);
    expect(other.asked).toBe(1);
    expect(await cache.authenticate(token)).toMatchObject({ authenticator: 'JWTAuthenticator/corp' });
  });

  it.each<[string, (token: string) => AuthResult]>([
    ['a success without reusableUntil', () => user('alice')],
    ['a success whose reusableUntil has passed', () => ({ ...user('alice'), reusableUntil: Date.now() - 1 })],
    ['a failure', () => ({ ok: false, reason: 'bad signature' })],
  ])('asks every time for %s', async (_, answer) => {
    const cache = new AuthenticatorCache();
    const jwt = countingAuthenticator(answer);
    cache.set('JWTAuthenticator', 'corp', jwt, { issuer: ISSUER });
    const token = tokenFor('alice');
    await cache.authenticate(token);
    await cache.authenticate(token);
    expect(jwt.asked).toBe(2);
  });

  it('forgets every answer when an authenticator is replaced or removed', async () => {
    const cache = new AuthenticatorCache();
    const reusable = (name: string) => () => ({ ...user(name), reusableUntil: Date.now() + 60_000 });
    cache.set('JWTAuthenticator', 'corp', countingAuthenticator(reusable('alice')), { issuer: ISSUER });
    const token = tokenFor('alice');
    expect(await cache.authenticate(token)).toMatchObject({ ok: true, user: { username: 'alice' } });

    // A changed spec (say, another audience) builds a new authenticator that now refuses the token.
    const stricter = countingAuthenticator(() => ({ ok: false, reason: 'wrong audience' }));
    cache.set('JWTAuthenticator', 'corp', stricter, { issuer: ISSUER });
    expect(await cache.authenticate(token)).toMatchObject({ ok: false });
    expect(stricter.asked).toBe(1);

    cache.set('JWTAuthenticator', 'corp', countingAuthenticator(reusable('alice')), { issuer: ISSUER });
    expect(await cache.authenticate(token)).toMatchObject({ ok: true });
    cache.delete('JWTAuthenticator', 'corp');
    expect(await cache.authenticate(token)).toMatchObject({ ok: false });
  });

  it('finds by the token alone only answers of the JWTAuthenticators that take its issuer, and only while they hold', async () => {
    const cache = new AuthenticatorCache();
    const reusable = (): AuthResult => ({ ...user('alice'), reusableUntil: Date.now() + 60_000 });
    cache.set('JWTAuthenticator', 'corp', countingAuthenticator(reusable), { issuer: ISSUER });
    cache.set('WebhookAuthenticator', 'hook', countingAuthenticator(reusable));
    const token = tokenFor('alice');
    expect(cache.reusedAnswer(token)).toBeUndefined();
    const answer = await cache.authenticate(token);
    expect(cache.reusedAnswer(token)).toBe(answer);
    // A webhook's answer, even a reusable one, is not: another token could be a service account's first.
    const opaque = 'not-a-jwt';
    expect(await cache.authenticate(opaque)).toMatchObject({ ok: true });
    expect(cache.reusedAnswer(opaque)).toBeUndefined();
    // Nor one a named authenticator gave (TokenCredentialRequest's).
    const other = tokenFor('bob');
    await cache.authenticateWith('JWTAuthenticator', 'corp', other);
    expect(cache.reusedAnswer(other)).toBeUndefined();
    cache.delete('WebhookAuthenticator', 'hook');
    expect(cache.reusedAnswer(token)).toBeUndefined();
  });

  it('does not remember an answer that arrives after the authenticators changed', async () => {
    const cache = new AuthenticatorCache();
    let release: () => void = () => {};
    const slow: TokenAuthenticator = {
      authenticate: () =>
        new Promise((done) => {
          release = () => done({ ...user('alice'), reusableUntil: Date.now() + 60_000 });
        }),
    };
    cache.set('JWTAuthenticator', 'corp', slow, { issuer: ISSUER });
    const token = tokenFor('alice');
    const pending = cache.authenticate(token);
    const refusing = countingAuthenticator(() => ({ ok: false, reason: 'revoked' }));
    cache.set('JWTAuthenticator', 'corp', refusing, { issuer: ISSUER });
    release();
    expect(await pending).toMatchObject({ ok: true });
    expect(await cache.authenticate(token)).toMatchObject({ ok: false });
    expect(refusing.asked).toBe(1);
  });
});

describe('what a certificate is bound to', () => {
  const A = 'a'.repeat(43);
  const B = 'b'.repeat(43);

  it('names the uid and trust of the authenticator that answered, and holds only while that object is loaded trusting that', async () => {
    const cache = new AuthenticatorCache();
    cache.set(
      'JWTAuthenticator',
      'corp',
      countingAuthenticator(() => user('alice')),
      {
        issuer: ISSUER,
        binding: { uid: 'uid-1', trust: A },
        credentialLifetimeSeconds: 3600,
      },
    );
    expect(await cache.authenticateWith('JWTAuthenticator', 'corp', 'token')).toMatchObject({
      ok: true,
      binding: { uid: 'uid-1', trust: A },
      credentialLifetimeSeconds: 3600,
    });
    expect(cache.holds({ uid: 'uid-1', trust: A })).toBe(true);
    // Loaded again trusting the same (another lifetime, say): still held.
    cache.set(
      'JWTAuthenticator',
      'corp',
      countingAuthenticator(() => user('alice')),
      { issuer: ISSUER, binding: { uid: 'uid-1', trust: A } },
    );
    expect(cache.holds({ uid: 'uid-1', trust: A })).toBe(true);
    // The same object, edited to trust otherwise: certificates from before no longer hold.
    cache.set(
      'JWTAuthenticator',
      'corp',
      countingAuthenticator(() => user('alice')),
      { issuer: ISSUER, binding: { uid: 'uid-1', trust: B } },
    );
    expect(cache.holds({ uid: 'uid-1', trust: A })).toBe(false);
    expect(cache.holds({ uid: 'uid-1', trust: B })).toBe(true);
    // Deleted and made again under the same name: another object, whose certificates are its own.
    cache.set(
      'JWTAuthenticator',
      'corp',
      countingAuthenticator(() => user('alice')),
      { issuer: ISSUER, binding: { uid: 'uid-2', trust: B } },
    );
    expect(cache.holds({ uid: 'uid-1', trust: B })).toBe(false);
    expect(cache.holds({ uid: 'uid-2', trust: B })).toBe(true);
    cache.delete('JWTAuthenticator', 'corp');
    expect(cache.holds({ uid: 'uid-2', trust: B })).toBe(false);
  });
});

describe('distinct junk tokens through the cache', () => {
  it('reach a slow webhook at most its limit at a time; the others fail at once, and no reason holds a token', async () => {
    let running = 0;
    let maxRunning = 0;
    let calls = 0;
    const release: (() => void)[] = [];
    let arrived: () => void = () => {};
    const filled = new Promise<void>((done) => (arrived = done));
    // A webhook authenticator's shape: an AnswerCache over a slow upstream that refuses everything.
    const webhook = new AnswerCache(
      (token) =>
        new Promise<AuthResult>((done) => {
          calls++;
          maxRunning = Math.max(maxRunning, ++running);
          if (running === 4) arrived();
          release.push(() => {
            running--;
            done({ ok: false, reason: `unknown token of ${token.length} bytes` });
          });
        }),
      { successTTLms: 60_000, failureTTLms: 10_000, entries: 100, limit: { inFlight: 4, waiting: 2 } },
    );
    const cache = new AuthenticatorCache();
    cache.set('WebhookAuthenticator', 'hook', webhook);
    const tokens = Array.from({ length: 1000 }, (_, i) => `junk-${i}-${'x'.repeat(20)}`);
    const answers = tokens.map((t) => cache.authenticate(t));
    await filled;
    const early = await Promise.all(answers.slice(6));
    expect(early.every((r) => !r.ok && /not asked/.test(r.reason))).toBe(true);
    // Release what runs, and what the wait line starts after it, until the line is empty.
    while (calls < 6 || release.length > 0) {
      release.splice(0).forEach((r) => r());
      await new Promise((done) => setImmediate(done));
    }
    const all = await Promise.all(answers);
    expect(maxRunning).toBe(4);
    expect(calls).toBe(6);
    all.forEach((r, i) => expect(r.ok ? '' : r.reason).not.toContain(tokens[i]));
  });
});
