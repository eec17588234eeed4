// The per-key work queue under every controller: duplicates collapse, one key is never synced twice at once
// (a key added while it syncs runs again afterwards), failures back off per key and successes forget.
//
// Retries are bounded twice, as client-go's default controller rate limiter bounds them: each key backs off on its
// own, and all keys' retries together take turns from one token bucket, so that a thousand keys failing at once (the
// API server went away) come back at the bucket's pace rather than all at the same moment. A key that keeps failing
// is dropped after `maxRetries` retries, with a warning and a metric, until it is added again (its object changes, or
// the manager's periodic resync). Adds from events and requeues a sync asks for are not limited: they are not retries.
import { performance } from 'node:perf_hooks';
import { exponentialBackoff } from '../backoff.ts';
import { systemClock, type Clock } from '../clock.ts';
import { TokenBucket } from '../token-bucket.ts';

/** What a sync asks of the queue next. Nothing: done, forget the failures. */
export type SyncResult = void | { retry: true } | { requeueAfterMs: number };

/** A sync of one key; `signal` aborts when the queue stops (and, for a writer, when leadership is lost). */
export type Sync = (key: string, signal: AbortSignal) => Promise<SyncResult>;

/** What a queue reports, already bound to its controller's name (lib/controller/metrics.ts). */
export interface QueueMetrics {
  /** Keys waiting now (not those syncing, nor those waiting for a retry's or requeue's delay). */
  depth(keys: number): void;
  /** A key went into the queue (one already waiting is not counted again). */
  added(): void;
  /** A key failed and was put back with backoff. */
  retried(): void;
  /** A key failed more than maxRetries times in a row and was dropped. */
  dropped(): void;
  /** A sync took this long, successful or not. */
  synced(seconds: number): void;
}

export interface QueueOptions {
  /** First retry delay after a failure; doubles per consecutive failure. Default: 10 ms. */
  baseDelayMs?: number;
  /** Longest retry delay. Default: 5 minutes. */
  maxDelayMs?: number;
  /** Retries per second, all keys together, once the burst is spent. Default: 10 (client-go's). */
  retriesPerSecond?: number;
  /** Retries all keys together may take at once after a quiet spell. Default: 100 (client-go's). */
  retryBurst?: number;
  /**
   * Retries of one key in a row before it is dropped. Default: 20, about half an hour at the default delays (the
   * last ones 5 minutes apart); the manager's resync brings a dropped key back every 10 minutes.
   */
  maxRetries?: number;
  /** Keys synced in parallel (never the same key twice). Default: 2. */
  workers?: number;
  /** Called when a sync throws (the key is retried with backoff). Default: ignore. */
  onError?: (key: string, err: unknown) => void;
  /** Called when a key is dropped after `failures` failures in a row. Default: ignore. */
  onDrop?: (key: string, failures: number) => void;
  /** Default: none kept. */
  metrics?: QueueMetrics;
  /** The timers of retries and requeues, and the retry bucket's time. Default: the system's. */
  clock?: Clock;
}

/** DEFAULT_QUEUE_OPTIONS: every default of QueueOptions but the callbacks, in one place. */
export const DEFAULT_QUEUE_OPTIONS = {
  baseDelayMs: 10,
  maxDelayMs: 5 * 60_000,
  retriesPerSecond: 10,
  retryBurst: 100,
  maxRetries: 20,
  workers: 2,
};

const noMetrics: QueueMetrics = {
  depth: () => {},
  added: () => {},
  retried: () => {},
  dropped: () => {},
  synced: () => {},
};

export class WorkQueue {
  /** Keys waiting, in order. Invariant: every key of `order` is in `queued` and not in `processing`. */
  private readonly order: string[] = [];
  private readonly queued = new Set<string>();
  /** Keys syncing now. Invariant: `dirty` ⊆ `processing` (a key added while it syncs, run again after). */
  private readonly processing = new Set<string>();
  private readonly dirty = new Set<string>();
  /** Failures in a row per key; a key is absent once it succeeded or was dropped. */
  private readonly failures = new Map<string, number>();
  private readonly timers = new Map<string, { at: number; timer: unknown }>();
  private readonly idleWaiters: (() => void)[] = [];
  /** Aborted by stop(): every sync's signal. */
  private readonly stopping = new AbortController();
  private running = false;
  private active = 0;
  private readonly opts: typeof DEFAULT_QUEUE_OPTIONS;
  private readonly sync: Sync;
  private readonly onError: (key: string, err: unknown) => void;
  private readonly onDrop: (key: string, failures: number) => void;
  private readonly metrics: QueueMetrics;
  private readonly clock: Clock;
  private readonly retryBucket: TokenBucket;

  constructor(sync: Sync, opts: QueueOptions = {}) {
    this.sync = sync;
    const { onError, onDrop, metrics, clock, ...numbers } = opts;
    this.opts = { ...DEFAULT_QUEUE_OPTIONS, ...numbers };
    this.onError = onError ?? (() => {});
    this.onDrop = onDrop ?? (() => {});
    this.metrics = metrics ?? noMetrics;
    this.clock = clock ?? systemClock;
    this.retryBucket = new TokenBucket(this.opts.retryBurst, this.opts.retriesPerSecond, () =>
      this.clock.now(),
    );
  }

  add(key: string): void {
    if (this.processing.has(key)) {
      this.dirty.add(key);
      return;
    }
    if (this.queued.has(key)) return;
    this.queued.add(key);
    this.order.push(key);
    this.metrics.added();
    this.metrics.depth(this.order.length);
    this.pump();
  }

  /** Adds the key after a delay; an earlier pending delay for the key wins. */
  addAfter(key: string, delayMs: number): void {
    if (this.stopping.signal.aborted) return;
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
    const { baseDelayMs, maxDelayMs } = this.opts;
    return Math.round(exponentialBackoff(failures, baseDelayMs, maxDelayMs) * (0.9 + Math.random() * 0.2));
  }

  start(): void {
    this.running = true;
    this.pump();
  }

  /** Stops taking new keys, aborts the syncs under way (their signal) and waits for them. */
  async stop(): Promise<void> {
    this.running = false;
    this.stopping.abort(new Error('the work queue stopped'));
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
    while (this.running && this.active < this.opts.workers && this.order.length > 0) {
      const key = this.order.shift()!;
      this.queued.delete(key);
      this.processing.add(key);
      this.active++;
      this.metrics.depth(this.order.length);
      void this.run(key);
    }
    if (this.active === 0 && (this.order.length === 0 || !this.running)) {
      for (const done of this.idleWaiters.splice(0)) done();
    }
  }

  private async run(key: string): Promise<void> {
    let result: SyncResult;
    const started = performance.now();
    try {
      result = await this.sync(key, this.stopping.signal);
    } catch (err) {
      // What a stop aborted is neither an error nor retried.
      if (!this.stopping.signal.aborted) this.onError(key, err);
      result = { retry: true };
    }
    this.metrics.synced((performance.now() - started) / 1000);
    this.processing.delete(key);
    this.active--;
    if (this.stopping.signal.aborted) this.dirty.delete(key);
    else if (result && 'retry' in result) this.retry(key);
    else {
      this.failures.delete(key);
      if (result && 'requeueAfterMs' in result) this.addAfter(key, result.requeueAfterMs);
    }
    if (this.dirty.delete(key)) this.add(key);
    this.pump();
  }

  /** Puts a failed key back after its own backoff or the retry bucket's next turn, whichever is later; or drops it. */
  private retry(key: string): void {
    const n = (this.failures.get(key) ?? 0) + 1;
    if (n > this.opts.maxRetries) {
      this.failures.delete(key);
      this.metrics.dropped();
      this.onDrop(key, n);
      return;
    }
    this.failures.set(key, n);
    this.metrics.retried();
    this.addAfter(key, Math.max(this.backoff(n), this.retryBucket.reserve()));
  }
}
