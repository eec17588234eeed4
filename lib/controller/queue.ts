// The per-key work queue under every controller: duplicates collapse, one key is never synced twice at once
// (a key added while it syncs runs again afterwards), failures back off per key and successes forget.
import { exponentialBackoff } from '../backoff.ts';
import { systemClock, type Clock } from '../clock.ts';

/** What a sync asks of the queue next. Nothing: done, forget the failures. */
export type SyncResult = void | { retry: true } | { requeueAfterMs: number };

export interface QueueOptions {
  /** First retry delay after a failure; doubles per consecutive failure. Default: 10 ms. */
  baseDelayMs?: number;
  /** Longest retry delay. Default: 5 minutes. */
  maxDelayMs?: number;
  /** Keys synced in parallel (never the same key twice). Default: 2. */
  workers?: number;
  /** Called when a sync throws (the key is retried with backoff). Default: ignore. */
  onError?: (key: string, err: unknown) => void;
  /** The timers of retries and requeues. Default: the system's. */
  clock?: Clock;
}

export class WorkQueue {
  private readonly order: string[] = [];
  private readonly queued = new Set<string>();
  private readonly processing = new Set<string>();
  private readonly dirty = new Set<string>();
  private readonly failures = new Map<string, number>();
  private readonly timers = new Map<string, { at: number; timer: unknown }>();
  private readonly idleWaiters: (() => void)[] = [];
  private running = false;
  private active = 0;
  private readonly base: number;
  private readonly max: number;
  private readonly workers: number;
  private readonly sync: (key: string) => Promise<SyncResult>;
  private readonly onError: (key: string, err: unknown) => void;
  private readonly clock: Clock;

  constructor(sync: (key: string) => Promise<SyncResult>, opts: QueueOptions = {}) {
    this.sync = sync;
    this.base = opts.baseDelayMs ?? 10;
    this.max = opts.maxDelayMs ?? 5 * 60_000;
    this.workers = opts.workers ?? 2;
    this.onError = opts.onError ?? (() => {});
    this.clock = opts.clock ?? systemClock;
  }

  add(key: string): void {
    if (this.processing.has(key)) {
      this.dirty.add(key);
      return;
    }
    if (this.queued.has(key)) return;
    this.queued.add(key);
    this.order.push(key);
    this.pump();
  }

  /** Adds the key after a delay; an earlier pending delay for the key wins. */
  addAfter(key: string, delayMs: number): void {
    const at = this.clock.now() + delayMs;
    const existing = this.timers.get(key);
    if (existing && existing.at <= at) return;
    if (existing) this.clock.clearTimeout(existing.timer);
    const timer = this.clock.setTimeout(() => {
      this.timers.delete(key);
      this.add(key);
    }, delayMs);
    this.timers.set(key, { at, timer });
  }

  /** The delay before the next retry of a key that failed `failures` times in a row, with ±10% jitter. */
  backoff(failures: number): number {
    return Math.round(exponentialBackoff(failures, this.base, this.max) * (0.9 + Math.random() * 0.2));
  }

  start(): void {
    this.running = true;
    this.pump();
  }

  /** Stops taking new keys and waits for the syncs under way. */
  async stop(): Promise<void> {
    this.running = false;
    for (const { timer } of this.timers.values()) this.clock.clearTimeout(timer);
    this.timers.clear();
    await this.idle();
  }

  /** Resolves when nothing is queued or syncing (delayed keys not counted). For tests and shutdown. */
  idle(): Promise<void> {
    if (this.active === 0 && (this.order.length === 0 || !this.running)) return Promise.resolve();
    return new Promise((done) => this.idleWaiters.push(done));
  }

  get length(): number {
    return this.order.length;
  }

  private pump(): void {
    while (this.running && this.active < this.workers && this.order.length > 0) {
      const key = this.order.shift()!;
      this.queued.delete(key);
      this.processing.add(key);
      this.active++;
      void this.run(key);
    }
    if (this.active === 0 && (this.order.length === 0 || !this.running)) {
      for (const done of this.idleWaiters.splice(0)) done();
    }
  }

  private async run(key: string): Promise<void> {
    let result: SyncResult;
    try {
      result = await this.sync(key);
    } catch (err) {
      this.onError(key, err);
      result = { retry: true };
    }
    this.processing.delete(key);
    this.active--;
    if (result && 'retry' in result) {
      const n = (this.failures.get(key) ?? 0) + 1;
      this.failures.set(key, n);
      this.addAfter(key, this.backoff(n));
    } else {
      this.failures.delete(key);
      if (result && 'requeueAfterMs' in result) this.addAfter(key, result.requeueAfterMs);
    }
    if (this.dirty.delete(key)) this.add(key);
    this.pump();
  }
}
