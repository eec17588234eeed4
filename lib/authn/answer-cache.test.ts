// The answer cache's bound on calls to its authenticator, and the limit underneath it: a flood of distinct junk
// tokens reaches a slow authenticator at most `inFlight` at a time, the rest wait in a short line or are refused
// at once, and nothing refused for being over the bound is remembered.
import { describe, expect, it } from '@jest/globals';
import { AnswerCache } from './answer-cache.ts';
import { ConcurrencyLimit } from './concurrency-limit.ts';
import type { AuthResult } from './types.ts';

/**
 * An authenticator that answers nothing until released, and records how many calls it ever had at once.
 * `arrived(n)` resolves once n calls have reached it, so tests wait for events, never for time.
 */
function slowAuthenticator() {
  const held: { token: string; answer: (r: AuthResult) => void }[] = [];
  const waiters: { count: number; done: () => void }[] = [];
  const state = { running: 0, maxRunning: 0, calls: 0, released: false };
  const refuse = (token: string): AuthResult => ({ ok: false, reason: `unknown token ${token.length}` });
  return {
    state,
    ask(token: string): Promise<AuthResult> {
      state.calls++;
      state.running++;
      state.maxRunning = Math.max(state.maxRunning, state.running);
      for (const w of waiters.filter((w) => state.calls >= w.count)) w.done();
      const answer = new Promise<AuthResult>((done) => {
        if (state.released) done(refuse(token));
        else held.push({ token, answer: done });
      });
      return answer.finally(() => state.running--);
    },
    arrived(count: number): Promise<void> {
      return state.calls >= count ? Promise.resolve() : new Promise((done) => waiters.push({ count, done }));
    },
    releaseAll(): void {
      state.released = true;
      for (const h of held.splice(0)) h.answer(refuse(h.token));
    },
  };
}

const OPTIONS = { successTTLms: 60_000, failureTTLms: 60_000, entries: 10_000 };

describe('the answer cache under a flood of distinct junk tokens', () => {
  it('never has more calls under way than the limit, refuses past the wait line at once, and remembers none of those refusals', async () => {
    const slow = slowAuthenticator();
    const cache = new AnswerCache((t) => slow.ask(t), { ...OPTIONS, limit: { inFlight: 16, waiting: 32 } });
    const tokens = Array.from({ length: 1000 }, (_, i) => `junk-${i}`);
    const answers = tokens.map((t) => cache.authenticate(t));

    await slow.arrived(16);
    expect(cache.limit.inFlight).toBe(16);
    expect(cache.limit.waiting).toBe(32);
    // Everything past the first 48 was answered without a call, as a failure that says it is transient.
    const refusedAtOnce = await Promise.all(answers.slice(48));
    expect(refusedAtOnce.every((r) => !r.ok && 'transient' in r)).toBe(true);
    expect(refusedAtOnce[0]).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/^not asked/) as unknown,
    });

    slow.releaseAll();
    const asked = await Promise.all(answers.slice(0, 48));
    expect(asked.every((r) => !r.ok && !('transient' in r))).toBe(true);
    expect(slow.state.maxRunning).toBe(16);
    expect(slow.state.calls).toBe(48);
    expect(cache.limit.inFlight).toBe(0);

    // The authenticator's own refusals are remembered; refusals for being over the bound are not.
    await cache.authenticate(tokens[0]!);
    expect(slow.state.calls).toBe(48);
    await cache.authenticate(tokens[999]!);
    expect(slow.state.calls).toBe(49);
  });

  it('shares one call among concurrent lookups of one token, which then take no slot of their own', async () => {
    const slow = slowAuthenticator();
    const cache = new AnswerCache((t) => slow.ask(t), { ...OPTIONS, limit: { inFlight: 1, waiting: 0 } });
    const same = Array.from({ length: 100 }, () => cache.authenticate('kubectl-token'));
    await slow.arrived(1);
    expect(await cache.authenticate('another')).toMatchObject({ ok: false, transient: true });
    slow.releaseAll();
    const answers = await Promise.all(same);
    expect(answers.every((r) => !r.ok && !('transient' in r))).toBe(true);
    expect(slow.state.calls).toBe(1);
  });

  it('treats an authenticator that throws as not having answered, and frees its slot', async () => {
    let calls = 0;
    const cache = new AnswerCache(
      () => {
        calls++;
        return Promise.reject(new Error('boom'));
      },
      { ...OPTIONS, limit: { inFlight: 1, waiting: 0 } },
    );
    expect(await cache.authenticate('t')).toMatchObject({ ok: false, transient: true });
    expect(await cache.authenticate('t')).toMatchObject({ ok: false, transient: true });
    expect(calls).toBe(2);
    expect(cache.limit.inFlight).toBe(0);
  });
});

describe('ConcurrencyLimit', () => {
  it('starts waiting calls first come, first served, each as a slot frees', async () => {
    const limit = new ConcurrencyLimit({ inFlight: 1, waiting: 2 });
    const order: string[] = [];
    const releases: (() => void)[] = [];
    const call = (name: string) => () =>
      new Promise<string>((done) => {
        order.push(name);
        releases.push(() => done(name));
      });
    const a = limit.run(call('a'));
    const b = limit.run(call('b'));
    const c = limit.run(call('c'));
    expect(limit.run(call('d'))).toBeUndefined();
    expect(order).toEqual(['a']);
    releases.shift()!();
    expect(await a).toBe('a');
    // The freed slot went to b, the first in line, so a newcomer finds none free.
    expect(limit.inFlight).toBe(1);
    await new Promise((done) => setImmediate(done));
    expect(order).toEqual(['a', 'b']);
    releases.shift()!();
    await b;
    await new Promise((done) => setImmediate(done));
    releases.shift()!();
    expect(await c).toBe('c');
    expect(order).toEqual(['a', 'b', 'c']);
    expect([limit.inFlight, limit.waiting]).toEqual([0, 0]);
  });

  it('frees the slot of a call that throws', async () => {
    const limit = new ConcurrencyLimit({ inFlight: 1, waiting: 0 });
    await expect(limit.run(() => Promise.reject(new Error('no')))).rejects.toThrow('no');
    expect(await limit.run(() => Promise.resolve(1))).toBe(1);
  });

  it.each([[{ inFlight: 0, waiting: 1 }], [{ inFlight: 1.5, waiting: 1 }], [{ inFlight: 1, waiting: -1 }]])(
    'refuses %o',
    (opts) => {
      expect(() => new ConcurrencyLimit(opts)).toThrow(RangeError);
    },
  );
});

describe('the answer cache’s lifetimes', () => {
  const LIMIT = { inFlight: 1, waiting: 0 };
  const counting = (reusableUntil: () => number | undefined) => {
    const state = { calls: 0 };
    const cache = new AnswerCache(
      () => {
        state.calls++;
        const until = reusableUntil();
        const user = { username: 'u', groups: [], extra: {} };
        return Promise.resolve<AuthResult>({
          ok: true,
          authenticator: 'a',
          user,
          ...(until === undefined ? {} : { reusableUntil: until }),
        });
      },
      { ...OPTIONS, limit: LIMIT },
    );
    return { cache, state };
  };

  it('remembers a success no longer than its reusableUntil (the token’s own expiry)', async () => {
    const expired = counting(() => Date.now() - 1);
    await expired.cache.authenticate('t');
    await expired.cache.authenticate('t');
    expect(expired.state.calls).toBe(2);
    const later = counting(() => Date.now() + 3_600_000);
    await later.cache.authenticate('t');
    await later.cache.authenticate('t');
    expect(later.state.calls).toBe(1);
    const unbounded = counting(() => undefined);
    await unbounded.cache.authenticate('t');
    await unbounded.cache.authenticate('t');
    expect(unbounded.state.calls).toBe(1);
  });

  it('shares a ConcurrencyLimit it is given with whoever else holds it', async () => {
    const limit = new ConcurrencyLimit({ inFlight: 1, waiting: 0 });
    const slow = slowAuthenticator();
    const a = new AnswerCache((t) => slow.ask(t), { ...OPTIONS, limit });
    const b = new AnswerCache((t) => slow.ask(t), { ...OPTIONS, limit });
    expect(a.limit).toBe(limit);
    const first = a.authenticate('one');
    await slow.arrived(1);
    // The one slot is a's call's: b's is refused at once, not asked.
    expect(await b.authenticate('two')).toMatchObject({ ok: false, transient: true });
    slow.releaseAll();
    await first;
    expect(slow.state.calls).toBe(1);
  });
});
