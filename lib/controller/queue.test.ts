import { describe, expect, it } from '@jest/globals';
import { fakeClock } from '../fake-clock.ts';
import { WorkQueue } from './queue.ts';

const tick = (ms = 0): Promise<void> => new Promise((r) => setTimeout(r, ms));

describe('WorkQueue', () => {
  it('collapses duplicate keys', async () => {
    const seen: string[] = [];
    const queue = new WorkQueue(async (key) => void seen.push(key));
    for (let i = 0; i < 5; i++) queue.add('a');
    queue.add('b');
    queue.start();
    await queue.idle();
    expect(seen).toEqual(['a', 'b']);
  });

  it('never syncs one key twice at once, and runs it again when it changed meanwhile', async () => {
    let running = 0;
    let maxRunning = 0;
    let calls = 0;
    let release: () => void = () => {};
    const queue = new WorkQueue(
      async () => {
        calls++;
        running++;
        maxRunning = Math.max(maxRunning, running);
        if (calls === 1) await new Promise<void>((r) => (release = r));
        running--;
      },
      { workers: 4 },
    );
    queue.start();
    queue.add('k');
    await tick();
    queue.add('k');
    queue.add('k');
    await tick();
    expect(calls).toBe(1);
    release();
    await queue.idle();
    expect(calls).toBe(2);
    expect(maxRunning).toBe(1);
  });

  it('retries a failing key with growing delays and forgets the failures after a success', async () => {
    const clock = fakeClock();
    let n = 0;
    const queue = new WorkQueue(
      async () => {
        if (++n < 4) throw new Error('transient');
      },
      { baseDelayMs: 20, maxDelayMs: 1000, clock },
    );
    queue.start();
    queue.add('k');
    // 20, 40, 80 ms (±10% jitter): each retry waits for its own, longer delay.
    for (const [attempt, delay] of [
      [1, 20],
      [2, 40],
      [3, 80],
    ] as const) {
      await queue.idle();
      expect(n).toBe(attempt);
      const [pending] = clock.pending();
      expect(pending).toBeGreaterThanOrEqual(delay * 0.9);
      expect(pending).toBeLessThanOrEqual(delay * 1.1);
      clock.advance(pending! - 1);
      await tick();
      expect(n).toBe(attempt);
      clock.advance(1);
    }
    await queue.idle();
    expect(n).toBe(4);
    // Succeeded: nothing is waiting, and a later failure starts again at the first delay.
    expect(clock.pending()).toEqual([]);
    await queue.stop();
  });

  it('caps the backoff and jitters it', () => {
    const queue = new WorkQueue(async () => {}, { baseDelayMs: 10, maxDelayMs: 1000 });
    expect(queue.backoff(1)).toBeGreaterThanOrEqual(9);
    expect(queue.backoff(1)).toBeLessThanOrEqual(11);
    expect(queue.backoff(4)).toBeGreaterThanOrEqual(72);
    expect(queue.backoff(4)).toBeLessThanOrEqual(88);
    expect(queue.backoff(30)).toBeLessThanOrEqual(1100);
    expect(queue.backoff(30)).toBeGreaterThanOrEqual(900);
  });

  it('requeues after the delay a sync asks for', async () => {
    const clock = fakeClock();
    let n = 0;
    const queue = new WorkQueue(async () => (++n === 1 ? { requeueAfterMs: 30 } : undefined), { clock });
    queue.start();
    queue.add('k');
    await queue.idle();
    expect(n).toBe(1);
    expect(clock.pending()).toEqual([30]);
    clock.advance(29);
    await queue.idle();
    expect(n).toBe(1);
    clock.advance(1);
    await queue.idle();
    expect(n).toBe(2);
    await queue.stop();
  });
});
