import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { newQueueMetrics } from './metrics.ts';
import { WorkQueue, type QueueMetrics } from './queue.ts';

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

  it('paces the retries of all keys together by one token bucket', async () => {
    const clock = fakeClock();
    const queue = new WorkQueue(() => Promise.reject(new Error('down')), {
      baseDelayMs: 10,
      retriesPerSecond: 2,
      retryBurst: 2,
      workers: 4,
      clock,
    });
    queue.start();
    for (const key of ['a', 'b', 'c', 'd', 'e']) queue.add(key);
    await queue.idle();
    // Two retries from the burst after their own backoff (about 10 ms), then one turn every 500 ms.
    const delays = clock.pending().sort((x, y) => x - y);
    expect(delays.slice(0, 2).every((d) => d >= 9 && d <= 11)).toBe(true);
    expect(delays.slice(2)).toEqual([500, 1000, 1500]);
    await queue.stop();
  });

  it('drops a key that keeps failing after maxRetries retries, until it is added again', async () => {
    const clock = fakeClock();
    const dropped: [string, number][] = [];
    let calls = 0;
    const queue = new WorkQueue(
      async () => {
        calls++;
        return { retry: true };
      },
      { baseDelayMs: 10, maxRetries: 2, clock, onDrop: (key, failures) => dropped.push([key, failures]) },
    );
    queue.start();
    queue.add('k');
    for (let i = 0; i < 5; i++) {
      await queue.idle();
      clock.advance(1000);
    }
    await queue.idle();
    // The first try and two retries; nothing is waiting after.
    expect(calls).toBe(3);
    expect(dropped).toEqual([['k', 3]]);
    expect(clock.pending()).toEqual([]);
    // Added again (its object changed): tried again, from the first delay.
    queue.add('k');
    await queue.idle();
    expect(calls).toBe(4);
    const [delay] = clock.pending();
    expect(delay).toBeLessThanOrEqual(11);
    await queue.stop();
  });

  it('reports depth, adds, retries, drops and sync times', async () => {
    const clock = fakeClock();
    const seen = { depth: [] as number[], added: 0, retried: 0, dropped: 0, synced: 0 };
    const metrics: QueueMetrics = {
      depth: (n) => void seen.depth.push(n),
      added: () => void seen.added++,
      retried: () => void seen.retried++,
      dropped: () => void seen.dropped++,
      synced: () => void seen.synced++,
    };
    const queue = new WorkQueue(async (key) => (key === 'bad' ? { retry: true } : undefined), {
      maxRetries: 1,
      workers: 1,
      metrics,
      clock,
    });
    queue.add('a');
    queue.add('a');
    queue.add('bad');
    expect(seen.depth).toEqual([1, 2]);
    queue.start();
    await queue.idle();
    clock.advance(60_000);
    await queue.idle();
    expect(seen).toMatchObject({ added: 3, retried: 1, dropped: 1, synced: 3 });
    expect(seen.depth.at(-1)).toBe(0);
    await queue.stop();
  });

  it('puts its metrics on the registry it is given, by controller', async () => {
    const registry = new Registry();
    const metricsOf = newQueueMetrics(registry);
    const queue = new WorkQueue(async () => {}, { metrics: metricsOf('proxy') });
    new WorkQueue(async () => {}, { metrics: metricsOf('status') }).add('x');
    queue.add('a');
    queue.start();
    await queue.idle();
    const text = await registry.metrics();
    expect(text).toContain('sealion_controller_queue_adds_total{controller="proxy"} 1');
    expect(text).toContain('sealion_controller_queue_depth{controller="status"} 1');
    expect(text).toContain('sealion_controller_queue_depth{controller="proxy"} 0');
    expect(text).toContain('sealion_controller_sync_duration_seconds_count{controller="proxy"} 1');
    expect(text).toContain('sealion_controller_queue_retries_total');
    expect(text).toContain('sealion_controller_queue_dropped_total');
  });

  it('aborts the signal of the syncs under way when it stops, and neither logs nor retries them', async () => {
    const clock = fakeClock();
    const errors: string[] = [];
    let signal: AbortSignal | undefined;
    const queue = new WorkQueue(
      (_key, given) =>
        new Promise((_done, fail) => {
          signal = given;
          given.addEventListener('abort', () => fail(new Error('aborted')));
        }),
      { clock, onError: (key) => errors.push(key) },
    );
    queue.start();
    queue.add('k');
    await tick();
    expect(signal?.aborted).toBe(false);
    await queue.stop();
    expect(signal?.aborted).toBe(true);
    expect(errors).toEqual([]);
    expect(clock.pending()).toEqual([]);
  });
});
