// Carries audit events to their sinks. Each sink has its own bounded queue and at most one write under way, so a slow
// or failing sink holds up neither the requests (batch mode) nor the other sinks. Blocking mode goes through the same
// queues: an event is written with whatever gathered while the sink's previous write ran, and emit() settles once
// every sink has written it.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import { systemClock, type Clock } from '../../lib/clock.ts';
import { SealionError } from '../../lib/errors.ts';
import type { Logger } from '../../lib/log.ts';
import { eventBytes, type AuditEvent } from './types.ts';

export type AuditMode = 'batch' | 'blocking';

export interface AuditSink {
  /** The metrics' `sink` label and the logs' `sink` field: 'log', 'webhook'. Unique within a backend. */
  readonly name: string;
  /** Rejects when the events could not be written, after the sink's own retries. */
  write(events: AuditEvent[]): Promise<void>;
  close(): Promise<void>;
}

export interface AuditBackendOptions {
  sinks: AuditSink[];
  /**
   * batch (default): events are queued and written in the background; a full queue drops them (counted, warned).
   * blocking: emit() settles once every sink wrote the event, and rejects when one could not (the caller refuses
   * the request). Default: batch.
   */
  mode?: AuditMode;
  /**
   * Events queued per sink. In batch mode a full queue drops what comes next; in blocking mode it refuses it (emit()
   * rejects) rather than let requests pile up behind a sink that stopped. Default: DEFAULT_BUFFER_SIZE (10,000).
   */
  bufferSize?: number;
  /**
   * The memory the events queued per sink may hold (bodies kept at the Request levels make events large), past which
   * they are dropped (or refused) as when the queue is full. Default: DEFAULT_MAX_QUEUE_BYTES.
   */
  maxQueueBytes?: number;
  /** The most events one write() carries. Default: DEFAULT_BATCH_MAX_SIZE (400). */
  batchMaxSize?: number;
  /**
   * Batch mode: the longest an event waits for its batch to fill before a smaller batch is written. Blocking mode
   * never waits (a request would). Default: per sink, DEFAULT_BATCH_MAX_WAIT_MS (log: 100 ms, webhook: 5 s), else
   * FALLBACK_BATCH_MAX_WAIT_MS (1 s).
   */
  batchMaxWaitMs?: number;
  /** The prom-client registry the metrics are registered on. */
  registry: Registry;
  log: Logger;
  /** Default: systemClock. */
  clock?: Clock;
}

export interface AuditBackend {
  readonly mode: AuditMode;
  /**
   * Hands `event` to every sink. Batch mode: resolves at once and never rejects. Blocking mode: resolves once every
   * sink wrote it, rejects (AuditError) when one could not. The event is the backend's from then on: it may be
   * written later, so the caller must not change it (each stage of a request is a new event object).
   */
  emit(event: AuditEvent): Promise<void>;
  /** Writes what is queued (for at most CLOSE_TIMEOUT_MS), then closes the sinks. Idempotent. */
  close(): Promise<void>;
}

/** Error codes of AuditError. */
export const AUDIT_CONFIG = 'SEALION_AUDIT_CONFIG';
/** Blocking mode: the sink's queue is full (it has stopped, or cannot keep up). */
export const AUDIT_QUEUE_FULL = 'SEALION_AUDIT_QUEUE_FULL';
/** Blocking mode: a sink's write() rejected; the cause is its error. */
export const AUDIT_WRITE_FAILED = 'SEALION_AUDIT_WRITE_FAILED';
/** The backend or sink is closed. */
export const AUDIT_CLOSED = 'SEALION_AUDIT_CLOSED';
/** A webhook answered 4xx (other than 429): retrying the same batch would get the same answer. */
export const AUDIT_REJECTED = 'SEALION_AUDIT_REJECTED';
/** A webhook could not be reached, or answered 429 or 5xx, on every attempt. */
export const AUDIT_UNAVAILABLE = 'SEALION_AUDIT_UNAVAILABLE';

export class AuditError extends SealionError {
  /** A webhook's answer, when there was one. */
  readonly status: number | undefined;

  constructor(code: string, message: string, options?: { cause?: unknown; status?: number }) {
    super(code, message, options);
    this.name = 'AuditError';
    this.status = options?.status;
  }
}

/**
 * kube-apiserver's --audit-*-batch-buffer-size. At the Metadata level an event is 1–2 KB, so a full queue holds
 * 10–20 MB per sink; at RequestResponse level with large objects it can hold far more, and a smaller one fits better.
 */
export const DEFAULT_BUFFER_SIZE = 10_000;
/**
 * 64 MiB per sink: ten thousand Metadata events are about 20 MiB; events that keep bodies (up to 256 KiB each) reach
 * the bound with a few hundred, and the rest are dropped and counted rather than grow the process past its limit.
 */
export const DEFAULT_MAX_QUEUE_BYTES = 64 * 1024 * 1024;
/** Strangers' events may fill at most one part in this many of a queue. */
const STRANGER_SHARE = 4;

/** An event of a request nobody authenticated sent: anyone who can reach the proxy or the tunnel listener. */
const isStranger = (event: AuditEvent): boolean =>
  !event.user.username || event.user.username === 'system:anonymous';
/** kube-apiserver's webhook batch default: an EventList of 400 Metadata events is under 1 MB. */
export const DEFAULT_BATCH_MAX_SIZE = 400;
/**
 * log: 100 ms, as the concierge's own log lines wait for their batch. A write per event cost a quiet proxy about a
 * tenth more CPU per request in the benchmark (a system call, a histogram sample and a stream turn each); under load
 * the events that arrive while one write runs go together in the next anyway.
 * webhook: 5 s, instead of kube-apiserver's 30 s. A quiet replica then sends at most 12 POSTs a minute, and a busy
 * one fills batches of 400 long before; 30 s would leave the receiver (a SIEM) half a minute behind during an
 * incident and lose that much more in a crash.
 */
export const DEFAULT_BATCH_MAX_WAIT_MS: Readonly<Record<string, number>> = { log: 100, webhook: 5_000 };
/** Sinks with no default of their own: a second bounds how late an event is without a write per event. */
export const FALLBACK_BATCH_MAX_WAIT_MS = 1_000;
/**
 * How long close() writes what is queued. Kubernetes gives a pod 30 s between SIGTERM and SIGKILL by default, and
 * the rest of the concierge needs some of it to stop.
 */
export const CLOSE_TIMEOUT_MS = 10_000;
/** Drops are logged at most once per sink per interval: a full queue drops thousands of events a second. */
export const DROP_WARNING_INTERVAL_MS = 10_000;

/** One write of a local file takes microseconds; a webhook's, with its retries, up to a minute or more. */
const LATENCY_BUCKETS = [
  0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
];

interface Queued {
  event: AuditEvent;
  /** About how much memory it holds (eventBytes). */
  bytes: number;
  /** Whether nobody authenticated sent its request (isStranger). */
  stranger: boolean;
  /** When it was queued (clock time), for batchMaxWaitMs. */
  at: number;
  /** Blocking mode: told whether the sink wrote it. */
  settle?: (err?: Error) => void;
}

/** A sink with its queue. */
interface Lane {
  readonly sink: AuditSink;
  readonly maxWaitMs: number;
  /** Events not yet handed to the sink, oldest first; never more than bufferSize. */
  queue: Queued[];
  /** The memory the queue and the write under way hold; never more than maxQueueBytes. */
  bytes: number;
  /** Strangers' events in the queue and the write under way; never more than a STRANGER_SHARE-th of bufferSize. */
  strangers: number;
  /** Whether a write() of this sink is under way (or about to start); at most one is. */
  writing: boolean;
  /** Writes a partial batch once its oldest event has waited maxWaitMs. Armed only while events wait and no write is under way. */
  batchTimer: unknown;
  /** Told when the queue is empty and no write is under way (close() waits for that). */
  drained: (() => void)[];
  /** Dropped since the last warning, by reason. */
  unreported: { queueFull: number; writeFailed: number; closed: number };
  /** The last failed write's error message, for the next warning. */
  lastError: string | undefined;
  lastWarningAt: number | undefined;
  /** Logs the drops of an interval that already had its warning, at its end. */
  warningTimer: unknown;
}

type DropReason = keyof Lane['unreported'];

export function newAuditBackend(opts: AuditBackendOptions): AuditBackend {
  const problems = validateAuditBackendOptions(opts);
  if (problems.length > 0) throw new AuditError(AUDIT_CONFIG, `audit backend: ${problems.join('; ')}`);
  const lanes = new SinkLanes(opts);
  let closing: Promise<void> | undefined;
  return {
    mode: lanes.mode,
    emit: (event) => lanes.emit(event),
    close() {
      closing ??= lanes.shutdown();
      return closing;
    },
  };
}

/** The backend's metrics, a series per sink. */
interface AuditMetrics {
  written: Counter;
  dropped: Counter;
  latency: Histogram;
}

function newAuditMetrics(registry: Registry, lanes: readonly Lane[]): AuditMetrics {
  const written = new Counter({
    name: 'sealion_audit_events_total',
    help: 'Audit events written, by sink.',
    labelNames: ['sink'],
    registers: [registry],
  });
  const dropped = new Counter({
    name: 'sealion_audit_events_dropped_total',
    help: 'Audit events a sink did not write: its queue was full, its write failed after its retries, or the backend had closed.',
    labelNames: ['sink'],
    registers: [registry],
  });
  const latency = new Histogram({
    name: 'sealion_audit_sink_latency_seconds',
    help: "Time of one sink's write of a batch of audit events, retries included.",
    labelNames: ['sink'],
    buckets: LATENCY_BUCKETS,
    registers: [registry],
  });
  new Gauge({
    name: 'sealion_audit_queue_events',
    help: 'Audit events waiting for their sink.',
    labelNames: ['sink'],
    registers: [registry],
    collect() {
      for (const lane of lanes) this.set({ sink: lane.sink.name }, lane.queue.length);
    },
  });
  for (const lane of lanes) {
    // Every series exists from the start, so a rate() over them sees the first drop.
    written.inc({ sink: lane.sink.name }, 0);
    dropped.inc({ sink: lane.sink.name }, 0);
  }
  return { written, dropped, latency };
}

/** A sink's lane, empty; blocking mode never waits for a batch to fill. */
function newLane(sink: AuditSink, mode: AuditMode, batchMaxWaitMs: number | undefined): Lane {
  const defaultWait = Object.hasOwn(DEFAULT_BATCH_MAX_WAIT_MS, sink.name)
    ? DEFAULT_BATCH_MAX_WAIT_MS[sink.name]!
    : FALLBACK_BATCH_MAX_WAIT_MS;
  return {
    sink,
    maxWaitMs: mode === 'blocking' ? 0 : (batchMaxWaitMs ?? defaultWait),
    queue: [],
    bytes: 0,
    strangers: 0,
    writing: false,
    batchTimer: undefined,
    drained: [],
    unreported: { queueFull: 0, writeFailed: 0, closed: 0 },
    lastError: undefined,
    lastWarningAt: undefined,
    warningTimer: undefined,
  };
}

/** Every sink's lane, and what moves events along them: queueing, batching, writing, dropping, closing. */
class SinkLanes {
  readonly mode: AuditMode;
  private readonly bufferSize: number;
  private readonly maxQueueBytes: number;
  private readonly batchMaxSize: number;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly lanes: Lane[];
  private readonly metrics: AuditMetrics;
  /** open → closing (shutdown() writes what is queued; emit() still queues) → closed (emit() drops or rejects). */
  private state: 'open' | 'closing' | 'closed' = 'open';

  constructor(opts: AuditBackendOptions) {
    this.mode = opts.mode ?? 'batch';
    this.bufferSize = opts.bufferSize ?? DEFAULT_BUFFER_SIZE;
    this.maxQueueBytes = opts.maxQueueBytes ?? DEFAULT_MAX_QUEUE_BYTES;
    this.batchMaxSize = opts.batchMaxSize ?? DEFAULT_BATCH_MAX_SIZE;
    this.clock = opts.clock ?? systemClock;
    this.log = opts.log.child({ component: 'audit' });
    this.lanes = opts.sinks.map((sink) => newLane(sink, this.mode, opts.batchMaxWaitMs));
    this.metrics = newAuditMetrics(opts.registry, this.lanes);
  }

  emit(event: AuditEvent): Promise<void> {
    if (this.mode === 'batch') {
      for (const lane of this.lanes) this.enqueue(lane, event);
      return RESOLVED;
    }
    return new Promise((resolve, reject) => {
      let left = this.lanes.length;
      let failure: Error | undefined;
      const settle = (err?: Error): void => {
        failure ??= err;
        if (--left > 0) return;
        if (failure) reject(failure);
        else resolve();
      };
      for (const lane of this.lanes) this.enqueue(lane, event, settle);
    });
  }

  private enqueue(lane: Lane, event: AuditEvent, settle?: (err?: Error) => void): void {
    if (this.state === 'closed') {
      this.drop(lane, 1, 'closed');
      settle?.(new AuditError(AUDIT_CLOSED, 'audit backend is closed'));
      return;
    }
    const bytes = eventBytes(event);
    const stranger = isStranger(event);
    // Strangers (nobody authenticated: 401s, registrations, health checks) share a quarter of the queue, so a flood
    // of them never costs the events of people who signed in.
    const strangersFull = stranger && lane.strangers >= Math.ceil(this.bufferSize / STRANGER_SHARE);
    if (strangersFull || lane.queue.length >= this.bufferSize || lane.bytes + bytes > this.maxQueueBytes) {
      this.drop(lane, 1, 'queueFull');
      settle?.(
        new AuditError(
          AUDIT_QUEUE_FULL,
          `audit sink ${lane.sink.name}: ${lane.queue.length} events (${lane.bytes} bytes) wait already`,
        ),
      );
      return;
    }
    lane.bytes += bytes;
    if (stranger) lane.strangers++;
    const at = this.clock.now();
    lane.queue.push(settle ? { event, bytes, stranger, at, settle } : { event, bytes, stranger, at });
    this.pump(lane);
  }

  /** Starts a write when the sink is free and a batch is full, due, or wanted now (closing). */
  private pump(lane: Lane): void {
    if (lane.writing) return;
    const oldest = lane.queue[0];
    if (!oldest) {
      for (const done of lane.drained.splice(0)) done();
      return;
    }
    const clock = this.clock;
    const now = clock.now();
    const due = oldest.at + lane.maxWaitMs;
    if (lane.queue.length >= this.batchMaxSize || now >= due || this.state !== 'open') {
      if (lane.batchTimer !== undefined) clock.clearTimeout(lane.batchTimer);
      lane.batchTimer = undefined;
      lane.writing = true;
      // A microtask later: emit() never runs a sink's code, and the events emitted in the same turn share a batch.
      queueMicrotask(() => void this.write(lane));
    } else if (lane.batchTimer === undefined) {
      lane.batchTimer = clock.setTimeout(() => {
        lane.batchTimer = undefined;
        this.pump(lane);
      }, due - now);
    }
  }

  private async write(lane: Lane): Promise<void> {
    const batch = lane.queue.splice(0, this.batchMaxSize);
    const sink = lane.sink.name;
    const { written, latency } = this.metrics;
    // Real elapsed time, not the injected clock's: this measures the sink, and nothing waits on it.
    const started = performance.now();
    try {
      await lane.sink.write(batch.map((q) => q.event));
      written.inc({ sink }, batch.length);
      for (const q of batch) q.settle?.();
    } catch (err) {
      lane.lastError = messageOf(err);
      this.drop(lane, batch.length, 'writeFailed');
      const failure = new AuditError(AUDIT_WRITE_FAILED, `audit sink ${sink}: ${lane.lastError}`, {
        cause: err,
      });
      for (const q of batch) q.settle?.(failure);
    }
    latency.observe({ sink }, (performance.now() - started) / 1000);
    release(lane, batch);
    lane.writing = false;
    this.pump(lane);
  }

  private drop(lane: Lane, count: number, reason: DropReason): void {
    this.metrics.dropped.inc({ sink: lane.sink.name }, count);
    lane.unreported[reason] += count;
    if (lane.warningTimer !== undefined) return;
    const now = this.clock.now();
    const next = lane.lastWarningAt === undefined ? now : lane.lastWarningAt + DROP_WARNING_INTERVAL_MS;
    if (next <= now) {
      this.warnDropped(lane);
      return;
    }
    lane.warningTimer = this.clock.setTimeout(() => {
      lane.warningTimer = undefined;
      this.warnDropped(lane);
    }, next - now);
  }

  /** One line for what was dropped since the last: counts and the sink's last error, never an event. */
  private warnDropped(lane: Lane): void {
    const { queueFull, writeFailed, closed } = lane.unreported;
    const count = queueFull + writeFailed + closed;
    if (count === 0) return;
    this.log.warn(
      {
        sink: lane.sink.name,
        dropped: count,
        queueFull,
        writeFailed,
        closed,
        ...(writeFailed > 0 ? { error: lane.lastError } : {}),
      },
      'audit events dropped',
    );
    lane.unreported = { queueFull: 0, writeFailed: 0, closed: 0 };
    lane.lastWarningAt = this.clock.now();
  }

  /**
   * Writes what is queued and closes the sinks, each within CLOSE_TIMEOUT_MS of the start; then drops what is left
   * and writes the last report of drops.
   */
  async shutdown(): Promise<void> {
    this.state = 'closing';
    let deadlineTimer: unknown;
    const deadline = new Promise<'late'>((resolve) => {
      deadlineTimer = this.clock.setTimeout(() => resolve('late'), CLOSE_TIMEOUT_MS);
    });
    const flushed = await Promise.race([this.drainAll(), deadline]);
    this.state = 'closed';
    for (const lane of this.lanes) this.dropLeft(lane);
    if (flushed === 'late')
      this.log.warn({ timeoutMs: CLOSE_TIMEOUT_MS }, 'audit sinks did not finish writing in time');
    await this.closeSinks(deadline);
    this.clock.clearTimeout(deadlineTimer);
    // The last report is written now, whatever the rate limit: nothing comes after it.
    for (const lane of this.lanes) {
      if (lane.batchTimer !== undefined) this.clock.clearTimeout(lane.batchTimer);
      if (lane.warningTimer !== undefined) this.clock.clearTimeout(lane.warningTimer);
      lane.batchTimer = lane.warningTimer = undefined;
      this.warnDropped(lane);
    }
  }

  /** Settles once every lane's queue is empty and no write is under way. */
  private async drainAll(): Promise<'drained'> {
    const drained = this.lanes.map(
      (lane) =>
        new Promise<void>((resolve) => {
          lane.drained.push(resolve);
          this.pump(lane);
        }),
    );
    await Promise.all(drained);
    return 'drained';
  }

  /** Drops what is still queued (the backend has closed), telling blocking callers. */
  private dropLeft(lane: Lane): void {
    const left = lane.queue.splice(0);
    release(lane, left);
    if (left.length === 0) return;
    this.drop(lane, left.length, 'closed');
    const failure = new AuditError(AUDIT_CLOSED, 'audit backend closed before the event was written');
    for (const q of left) q.settle?.(failure);
  }

  /** Closes every sink, waiting at most until `deadline`; says which did not close cleanly. */
  private async closeSinks(deadline: Promise<'late'>): Promise<void> {
    const lanes = this.lanes;
    // A write still under way is the sink's to end: closing it aborts the write, which then counts as dropped.
    const closed = await Promise.race([
      Promise.allSettled(lanes.map((lane) => Promise.resolve().then(() => lane.sink.close()))),
      deadline,
    ]);
    if (closed === 'late') {
      this.log.warn({ timeoutMs: CLOSE_TIMEOUT_MS }, 'audit sinks did not close in time');
      return;
    }
    closed.forEach((result, i) => {
      if (result.status === 'rejected')
        this.log.warn(
          { sink: lanes[i]!.sink.name, error: messageOf(result.reason) },
          'audit sink did not close cleanly',
        );
    });
  }
}

/** Gives back the room `events` held in the lane's bounds. */
function release(lane: Lane, events: readonly Queued[]): void {
  for (const q of events) {
    lane.bytes -= q.bytes;
    if (q.stranger) lane.strangers--;
  }
}

const RESOLVED = Promise.resolve();

/** Every problem with `opts`, each a phrase; empty when there is none. */
function validateAuditBackendOptions(opts: AuditBackendOptions): string[] {
  const problems: string[] = [];
  if (opts.sinks.length === 0) problems.push('sinks: at least one is needed');
  const names = new Set<string>();
  for (const sink of opts.sinks) {
    if (sink.name === '') problems.push('sinks: a sink has an empty name');
    else if (names.has(sink.name)) problems.push(`sinks: two are named ${JSON.stringify(sink.name)}`);
    names.add(sink.name);
  }
  if (opts.mode !== undefined && opts.mode !== 'batch' && opts.mode !== 'blocking')
    problems.push(`mode: must be one of batch, blocking`);
  const positiveInteger = (field: string, value: number | undefined): void => {
    if (value !== undefined && !(Number.isSafeInteger(value) && value >= 1))
      problems.push(`${field}: must be a whole number of at least 1`);
  };
  positiveInteger('bufferSize', opts.bufferSize);
  positiveInteger('maxQueueBytes', opts.maxQueueBytes);
  positiveInteger('batchMaxSize', opts.batchMaxSize);
  if (
    opts.batchMaxWaitMs !== undefined &&
    !(Number.isFinite(opts.batchMaxWaitMs) && opts.batchMaxWaitMs >= 0)
  )
    problems.push('batchMaxWaitMs: must be a number of at least 0');
  return problems;
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
