import { describe, expect, it } from '@jest/globals';
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
    const times: number[] = [];
    let n = 0;
    const queue = new WorkQueue(
      async () => {
        times.push(Date.now());
        if (++n < 4) throw new Error('transient');
      },
      { baseDelayMs: 20, maxDelayMs: 1000 },
    );
    queue.start();
    queue.add('k');
    while (n < 4) await tick(10);
    await queue.idle();
    expect(n).toBe(4);
    const gaps = times.slice(1).map((t, i) => t - times[i]!);
    // 20, 40, 80 ms (±10% jitter): each wait longer than the one before.
    expect(gaps[1]!).toBeGreaterThan(gaps[0]!);
    expect(gaps[2]!).toBeGreaterThan(gaps[1]!);
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
    let n = 0;
    const queue = new WorkQueue(async () => (++n === 1 ? { requeueAfterMs: 30 } : undefined));
    queue.start();
    queue.add('k');
    await queue.idle();
    expect(n).toBe(1);
    await tick(60);
    await queue.idle();
    expect(n).toBe(2);
    await queue.stop();
  });
});
