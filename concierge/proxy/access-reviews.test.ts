import { describe, expect, it } from '@jest/globals';
import type { AccessQuestion } from '../../lib/kube/access-review.ts';
import type { CallAnswer } from '../../lib/http2/forward.ts';
import { CallFailed } from '../../lib/http2/forward.ts';
import { newReviewCache, ReviewUnavailable } from '../../lib/kube/review-cache.ts';
import { askThrough } from './access-reviews.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import type { OwnCall, Route } from './route.ts';

const question = (name: string): AccessQuestion => ({
  user: 'pat',
  groups: ['system:authenticated'],
  extra: {},
  verb: 'impersonate',
  resource: 'users',
  name,
});
const sleep = (ms: number): Promise<void> => new Promise((done) => setTimeout(done, ms));

/** A route whose cluster answers every call with `answer`, recording the calls. */
function cluster(answer: (call: OwnCall) => Promise<CallAnswer>): Route & { calls: OwnCall[] } {
  const calls: OwnCall[] = [];
  return {
    kind: 'tunnel',
    calls,
    forward: () => Promise.resolve(),
    call: (own) => {
      calls.push(own);
      return answer(own);
    },
  };
}
const allowed = (yes: boolean): Promise<CallAnswer> =>
  Promise.resolve({ status: 201, body: Buffer.from(JSON.stringify({ status: { allowed: yes } })) });

describe('reviews asked through a cluster', () => {
  it('sends a SubjectAccessReview, or with self a SelfSubjectAccessReview, and reads the answer', async () => {
    const edge = cluster(() => allowed(true));
    expect(await askThrough('edge', edge, 'pat')(question('bob'))).toBe(true);
    expect(await askThrough('edge', edge, 'pat', true)(question('bob'))).toBe(true);
    expect(edge.calls.map((c) => [c.method, c.path, c.user])).toEqual([
      ['POST', '/apis/authorization.k8s.io/v1/subjectaccessreviews', 'pat'],
      ['POST', '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews', 'pat'],
    ]);
    const [review, self] = edge.calls.map((c) => JSON.parse(c.body.toString()) as Record<string, unknown>);
    expect(review).toMatchObject({
      kind: 'SubjectAccessReview',
      spec: { user: 'pat', resourceAttributes: { name: 'bob' } },
    });
    expect(self).toEqual({
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SelfSubjectAccessReview',
      spec: { resourceAttributes: { verb: 'impersonate', group: '', resource: 'users', name: 'bob' } },
    });
  });

  it('never reads a failure as a refusal: it is unavailable, with the cluster’s words or the queue’s status', async () => {
    const refused = cluster(() =>
      Promise.resolve({ status: 403, body: Buffer.from('{"kind":"Status","message":"no reviews for you"}') }),
    );
    await expect(askThrough('edge', refused, 'pat')(question('bob'))).rejects.toThrow(
      'its API server answered a SubjectAccessReview with HTTP 403: no reviews for you',
    );
    const malformed = cluster(() => Promise.resolve({ status: 201, body: Buffer.from('<html>') }));
    await expect(askThrough('edge', malformed, 'pat')(question('bob'))).rejects.toBeInstanceOf(
      ReviewUnavailable,
    );
    const busy = cluster(() => Promise.reject(new CallFailed('your share is used up', 429)));
    await expect(askThrough('edge', busy, 'pat')(question('bob'))).rejects.toMatchObject({ status: 429 });
    const gone = cluster(() => Promise.reject(new Error('ECONNRESET')));
    await expect(askThrough('edge', gone, 'pat')(question('bob'))).rejects.toMatchObject({ status: 503 });
  });
});

describe('the review cache', () => {
  it('asks once per cluster and question, however many ask at once', async () => {
    const cache = newReviewCache();
    let asked = 0;
    const ask = async (): Promise<boolean> => {
      asked++;
      await sleep(5);
      return true;
    };
    const edge = cache.asking('edge', ask);
    await Promise.all(Array.from({ length: 20 }, () => edge(question('bob'))));
    expect(asked).toBe(1);
    await edge(question('alice'));
    await cache.asking('other', ask)(question('bob'));
    expect(asked).toBe(3);
  });

  it('keeps refusals shorter than allowed answers, and failures not at all', async () => {
    const clock = fakeClock();
    clock.advance(1_000);
    const cache = newReviewCache({ allowedTtlMs: 10_000, refusedTtlMs: 2_000, clock });
    const answers = new Map([
      ['yes', true],
      ['no', false],
    ]);
    let asked = 0;
    const ask = (q: AccessQuestion): Promise<boolean> => {
      asked++;
      if (q.name === 'fail') return Promise.reject(new Error('unreachable'));
      return Promise.resolve(answers.get(q.name!)!);
    };
    const edge = cache.asking('edge', ask);
    expect(await edge(question('yes'))).toBe(true);
    expect(await edge(question('no'))).toBe(false);
    await expect(edge(question('fail'))).rejects.toThrow('unreachable');
    await expect(edge(question('fail'))).rejects.toThrow('unreachable');
    expect(asked).toBe(4);
    // Both kept until the refusal's time is up, to the millisecond.
    clock.advance(2_000);
    await edge(question('yes'));
    await edge(question('no'));
    expect(asked).toBe(4);
    // Then only the refusal is asked again; the allowed answer, until its own time is up.
    clock.advance(1);
    await edge(question('yes'));
    await edge(question('no'));
    expect(asked).toBe(5);
    clock.advance(10_000 - 2_001);
    await edge(question('yes'));
    expect(asked).toBe(5);
    clock.advance(1);
    await edge(question('yes'));
    expect(asked).toBe(6);
  });

  it('keeps clusters apart even when names look like keys', async () => {
    const cache = newReviewCache();
    const a = cache.asking('a\nb', () => Promise.resolve(true));
    const b = cache.asking('a', () => Promise.resolve(false));
    expect(await a(question('x'))).toBe(true);
    expect(await b(question('x'))).toBe(false);
  });
});
