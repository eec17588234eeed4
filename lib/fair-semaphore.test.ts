import { describe, expect, it } from '@jest/globals';
import { BUSY, CLOSED, KEY_LIMIT, newFairSemaphore, type FairLimits } from './fair-semaphore.ts';
import { fakeClock } from '../test-support/fake-clock.ts';

const CODES: Record<string, string> = { [KEY_LIMIT]: 'KEY_LIMIT', [BUSY]: 'BUSY', [CLOSED]: 'CLOSED' };
const LIMITS: FairLimits = { capacity: 2, perKey: 2, maxQueued: 100, maxQueuedPerKey: 100, maxWaitMs: 1000 };

/**
 * Runs steps against a semaphore and returns what happened, in order. Steps: `a1+` asks for a permit for key `a`
 * (the label is the request), `a1-` releases it, `a1x` cancels its wait, `t500` advances the clock 500 ms,
 * `perKey=3` (any limit) reconfigures, `close` closes. Events: `a1 granted`, `a1 BUSY` (refused at once),
 * `a1 BUSY waited` (refused after waiting).
 */
function run(limits: Partial<FairLimits>, steps: string): string[] {
  const clock = fakeClock();
  let current = { ...LIMITS, ...limits };
  const sem = newFairSemaphore(current, clock);
  const events: string[] = [];
  const releases = new Map<string, () => void>();
  const cancels = new Map<string, () => void>();
  for (const step of steps.split(/\s+/).filter(Boolean)) {
    const setting = /^(\w+)=(\d+)$/.exec(step);
    if (setting) {
      current = { ...current, [setting[1]!]: Number(setting[2]) };
      sem.configure(current);
    } else if (step === 'close') sem.close();
    else if (step.startsWith('t')) clock.advance(Number(step.slice(1)));
    else {
      const label = step.slice(0, -1);
      const op = step.at(-1);
      if (op === '+')
        cancels.set(
          label,
          sem.acquire(
            label.replace(/\d+$/, ''),
            (release) => {
              events.push(`${label} granted`);
              releases.set(label, release);
            },
            (why) => events.push(`${label} ${CODES[why.code]}${why.waited ? ' waited' : ''}`),
          ),
        );
      else if (op === '-') releases.get(label)!();
      else if (op === 'x') cancels.get(label)!();
      else throw new Error(`bad step ${step}`);
    }
  }
  return events;
}

describe('the fair semaphore', () => {
  it.each([
    {
      name: 'grants at once while both the capacity and the key’s cap allow',
      limits: { capacity: 3 },
      steps: 'a1+ b1+ a2+',
      want: ['a1 granted', 'b1 granted', 'a2 granted'],
    },
    {
      name: 'serves waiting keys round-robin, each in FIFO order',
      limits: { perKey: 3 },
      steps: 'a1+ a2+ a3+ a4+ a5+ b1+ b2+ c1+ a1- a2- a3- b1- c1- a4-',
      want: [
        'a1 granted',
        'a2 granted',
        'a3 granted',
        'b1 granted',
        'c1 granted',
        'a4 granted',
        'b2 granted',
        'a5 granted',
      ],
    },
    {
      name: 'holds a key at its cap while others still get free permits',
      limits: { capacity: 10, perKey: 2 },
      steps: 'a1+ a2+ a3+ b1+ b2+ a1-',
      want: ['a1 granted', 'a2 granted', 'b1 granted', 'b2 granted', 'a3 granted'],
    },
    {
      name: 'refuses a key whose own queue is full (its share), not others',
      limits: { capacity: 10, perKey: 1, maxQueuedPerKey: 1 },
      steps: 'a1+ a2+ a3+ b1+',
      want: ['a1 granted', 'a3 KEY_LIMIT', 'b1 granted'],
    },
    {
      name: 'refuses as busy when the queue of all keys is full',
      limits: { capacity: 1, perKey: 1, maxQueued: 1 },
      steps: 'a1+ b1+ c1+',
      want: ['a1 granted', 'c1 BUSY'],
    },
    {
      name: 'refuses as busy, not as the key’s limit, a key that holds and waits for nothing',
      limits: { capacity: 1, perKey: 1, maxQueuedPerKey: 0 },
      steps: 'a1+ a2+ b1+',
      want: ['a1 granted', 'a2 KEY_LIMIT', 'b1 BUSY'],
    },
    {
      name: 'never queues with maxQueued 0',
      limits: { capacity: 1, maxQueued: 0 },
      steps: 'a1+ b1+',
      want: ['a1 granted', 'b1 BUSY'],
    },
    {
      name: 'refuses a wait past the deadline: busy when others hold the permits',
      limits: { capacity: 1 },
      steps: 'a1+ b1+ t999 t1',
      want: ['a1 granted', 'b1 BUSY waited'],
    },
    {
      name: 'refuses a wait past the deadline: the key’s own limit when it holds its cap',
      limits: { capacity: 5, perKey: 1 },
      steps: 'a1+ a2+ t1000',
      want: ['a1 granted', 'a2 KEY_LIMIT waited'],
    },
    {
      name: 'grants in time, and the deadline then does nothing',
      limits: { capacity: 1 },
      steps: 'a1+ b1+ t500 a1- t2000',
      want: ['a1 granted', 'b1 granted'],
    },
    {
      name: 'forgets a cancelled wait: never granted, its place in the queue free again',
      limits: { capacity: 1, maxQueued: 1 },
      steps: 'a1+ b1+ b1x c1+ a1- t5000',
      want: ['a1 granted', 'c1 granted'],
    },
    {
      name: 'counts a second release of one permit once',
      limits: { capacity: 1 },
      steps: 'a1+ b1+ c1+ a1- a1- t5000',
      want: ['a1 granted', 'b1 granted', 'c1 BUSY waited'],
    },
    {
      name: 'grants waiting requests at once when the capacity is raised',
      limits: { capacity: 1 },
      steps: 'a1+ b1+ c1+ capacity=3',
      want: ['a1 granted', 'b1 granted', 'c1 granted'],
    },
    {
      name: 'grants a key’s waiting requests at once when its cap is raised',
      limits: { capacity: 10, perKey: 1 },
      steps: 'a1+ a2+ a3+ perKey=3',
      want: ['a1 granted', 'a2 granted', 'a3 granted'],
    },
    {
      name: 'revokes nothing when limits are lowered, and grants only under the new ones',
      limits: { capacity: 3 },
      steps: 'a1+ b1+ c1+ capacity=1 d1+ a1- b1- c1-',
      want: ['a1 granted', 'b1 granted', 'c1 granted', 'd1 granted'],
    },
    {
      name: 'refuses waiting and later requests once closed; held permits still release',
      limits: { capacity: 1 },
      steps: 'a1+ b1+ close c1+ a1-',
      want: ['a1 granted', 'b1 CLOSED waited', 'c1 CLOSED'],
    },
  ])('$name', ({ limits, steps, want }) => {
    expect(run(limits, steps)).toEqual(want);
  });

  it('keeps count, and forgets a key once it holds nothing and waits for nothing', () => {
    const clock = fakeClock();
    const sem = newFairSemaphore({ ...LIMITS, capacity: 1 }, clock);
    const releases: (() => void)[] = [];
    const refusals: string[] = [];
    const grant = (release: () => void): void => void releases.push(release);
    const refuse = (why: { code: string }): void => void refusals.push(why.code);
    sem.acquire('a', grant, refuse);
    const cancel = sem.acquire('b', grant, refuse);
    sem.acquire('c', grant, refuse);
    expect([sem.held(), sem.waiting(), sem.held('a'), sem.waiting('b'), sem.keys()]).toEqual([1, 2, 1, 1, 3]);
    cancel();
    expect([sem.waiting(), sem.keys()]).toEqual([1, 2]);
    releases.shift()!();
    expect([sem.held(), sem.held('c'), sem.waiting(), sem.keys()]).toEqual([1, 1, 0, 1]);
    releases.shift()!();
    clock.advance(10_000);
    expect([sem.held(), sem.waiting(), sem.keys(), refusals]).toEqual([0, 0, 0, []]);
  });

  it('stays consistent when a grant releases at once, inside the release that granted it', () => {
    const sem = newFairSemaphore({ ...LIMITS, capacity: 1, perKey: 1 }, fakeClock());
    const order: string[] = [];
    let first: (() => void) | undefined;
    sem.acquire(
      'a',
      (release) => (first = release),
      () => {},
    );
    for (const key of ['b', 'c', 'd'])
      sem.acquire(
        key,
        (release) => {
          order.push(key);
          release();
        },
        () => {},
      );
    first!();
    expect(order).toEqual(['b', 'c', 'd']);
    expect([sem.held(), sem.waiting(), sem.keys()]).toEqual([0, 0, 0]);
  });
});
