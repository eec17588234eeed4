// The backend against sinks the tests hold in their hands: a write settles when the test says so, and time moves only
// when the fake clock is advanced.
import { afterEach, describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { fakeClock, type FakeClock } from '../../test-support/fake-clock.ts';
import { newLogger } from '../../lib/log.ts';
import {
  AUDIT_CLOSED,
  AUDIT_CONFIG,
  AUDIT_QUEUE_FULL,
  AUDIT_WRITE_FAILED,
  CLOSE_TIMEOUT_MS,
  DEFAULT_BATCH_MAX_WAIT_MS,
  DROP_WARNING_INTERVAL_MS,
  newAuditBackend,
  type AuditBackend,
  type AuditBackendOptions,
  type AuditSink,
} from './backend.ts';
import type { AuditEvent } from './types.ts';
import { sampleEvent } from './sample-event.ts';

const auditEvent = (i: number): AuditEvent => sampleEvent(i);

/** Leave every write, the first the backend queued in a microtask included, the turns it needs to settle. */
async function settle(): Promise<void> {
  for (let i = 0; i < 3; i++) await new Promise((resolve) => setImmediate(resolve));
}

interface HeldWrite {
  events: AuditEvent[];
  resolve: () => void;
  reject: (err: Error) => void;
}

/** A sink whose writes wait for the test; closing it fails the writes still waiting (as the webhook's close does). */
function heldSink(name: string): AuditSink & { writes: HeldWrite[]; closes: number } {
  const writes: HeldWrite[] = [];
  const sink = {
    name,
    writes,
    closes: 0,
    write: (events: AuditEvent[]) =>
      new Promise<void>((resolve, reject) => writes.push({ events, resolve, reject })),
    close: async () => {
      sink.closes++;
      for (const w of writes) w.reject(new Error('sink closed'));
    },
  };
  return sink;
}

/** A sink that writes at once, keeping each batch; or fails every write with `failure`. */
function recordingSink(
  name: string,
  failure?: Error,
): AuditSink & { batches: AuditEvent[][]; closes: number } {
  const sink = {
    name,
    batches: [] as AuditEvent[][],
    closes: 0,
    write: async (events: AuditEvent[]) => {
      if (failure) throw failure;
      sink.batches.push(events);
    },
    close: async () => {
      sink.closes++;
    },
  };
  return sink;
}

interface Harness {
  backend: AuditBackend;
  clock: FakeClock;
  registry: Registry;
  /** Parsed log lines. */
  lines: Record<string, unknown>[];
  /** The raw log text, to look for what must never be there. */
  text: () => string;
}

const open: Harness[] = [];

function harness(opts: Partial<AuditBackendOptions> & { sinks: AuditSink[] }): Harness {
  const clock = fakeClock();
  const registry = new Registry();
  const raw: string[] = [];
  const log = newLogger({ level: 'debug', destination: { write: (line: string) => void raw.push(line) } });
  const backend = newAuditBackend({ registry, log, clock, ...opts });
  const h: Harness = {
    backend,
    clock,
    registry,
    get lines() {
      return raw.map((line) => JSON.parse(line) as Record<string, unknown>);
    },
    text: () => raw.join(''),
  };
  open.push(h);
  return h;
}

afterEach(async () => {
  for (const h of open.splice(0)) {
    const closed = h.backend.close();
    h.clock.advance(CLOSE_TIMEOUT_MS);
    await closed;
  }
});

/** A metric's value for one sink (a histogram's `_count` with `suffix`). */
async function metric(registry: Registry, name: string, sink: string, suffix = ''): Promise<number> {
  const found = registry.getSingleMetric(name);
  if (!found) throw new Error(`no metric ${name}`);
  const { values } = await found.get();
  const value = values.find(
    (v) => v.labels.sink === sink && ((v as { metricName?: string }).metricName ?? name) === name + suffix,
  );
  return value?.value ?? 0;
}

const warnings = (h: Harness): Record<string, unknown>[] =>
  h.lines.filter((l) => l.msg === 'audit events dropped');

describe('batch mode', () => {
  it('never waits for a sink: one that hangs fills its own queue and drops the rest, another gets every event', async () => {
    const hung = heldSink('hung');
    const fine = recordingSink('fine');
    const h = harness({ sinks: [hung, fine], bufferSize: 5, batchMaxSize: 2, batchMaxWaitMs: 0 });

    // Each emit is awaited: it resolves although `hung` never answers. The first event is in hung's write by the
    // time the second comes, five wait, and the last four find the queue full.
    for (let i = 0; i < 10; i++) await h.backend.emit(auditEvent(i));
    await settle();

    expect(hung.writes.map((w) => w.events)).toEqual([[auditEvent(0)]]);
    expect(await metric(h.registry, 'sealion_audit_queue_events', 'hung')).toBe(5);
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'hung')).toBe(4);
    expect(await metric(h.registry, 'sealion_audit_events_total', 'hung')).toBe(0);

    expect(fine.batches.flat()).toEqual(Array.from({ length: 10 }, (_, i) => auditEvent(i)));
    expect(await metric(h.registry, 'sealion_audit_events_total', 'fine')).toBe(10);
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'fine')).toBe(0);
    expect(await metric(h.registry, 'sealion_audit_queue_events', 'fine')).toBe(0);

    // Once the hung write returns, the queue drains in batches of batchMaxSize.
    hung.writes[0]!.resolve();
    await settle();
    expect(hung.writes.map((w) => w.events.map((e) => e.auditID))).toEqual([
      ['audit-id-0'],
      ['audit-id-1', 'audit-id-2'],
    ]);
    expect(await metric(h.registry, 'sealion_audit_events_total', 'hung')).toBe(1);
    expect(await metric(h.registry, 'sealion_audit_queue_events', 'hung')).toBe(3);
  });

  it('has one write under way per sink; what comes meanwhile goes in the next batch', async () => {
    const sink = heldSink('log');
    const h = harness({ sinks: [sink], batchMaxWaitMs: 0 });
    void h.backend.emit(auditEvent(0));
    await settle();
    for (let i = 1; i <= 3; i++) void h.backend.emit(auditEvent(i));
    await settle();
    expect(sink.writes).toHaveLength(1);

    sink.writes[0]!.resolve();
    await settle();
    expect(sink.writes.map((w) => w.events.length)).toEqual([1, 3]);
    sink.writes[1]!.resolve();
    await settle();
    expect(await metric(h.registry, 'sealion_audit_events_total', 'log')).toBe(4);
    expect(await metric(h.registry, 'sealion_audit_sink_latency_seconds', 'log', '_count')).toBe(2);
  });

  it('writes a partial batch once its oldest event waited batchMaxWaitMs, a full one at once', async () => {
    const sink = recordingSink('siem');
    const h = harness({ sinks: [sink], batchMaxSize: 3, batchMaxWaitMs: 1_000 });
    void h.backend.emit(auditEvent(0));
    h.clock.advance(400);
    void h.backend.emit(auditEvent(1));
    await settle();
    h.clock.advance(599);
    await settle();
    expect(sink.batches).toEqual([]);

    h.clock.advance(1);
    await settle();
    expect(sink.batches).toEqual([[auditEvent(0), auditEvent(1)]]);

    for (let i = 2; i < 5; i++) void h.backend.emit(auditEvent(i));
    await settle();
    expect(sink.batches.map((b) => b.length)).toEqual([2, 3]);
    expect(h.clock.pending()).toEqual([]);
  });

  it('by default writes the log within a moment and lets the webhook gather a batch', async () => {
    const log = recordingSink('log');
    const webhook = recordingSink('webhook');
    const h = harness({ sinks: [log, webhook] });
    void h.backend.emit(auditEvent(0));
    await settle();
    expect(log.batches).toHaveLength(0);
    h.clock.advance(DEFAULT_BATCH_MAX_WAIT_MS.log!);
    await settle();
    expect(log.batches).toHaveLength(1);
    expect(webhook.batches).toHaveLength(0);

    h.clock.advance(DEFAULT_BATCH_MAX_WAIT_MS.webhook! - DEFAULT_BATCH_MAX_WAIT_MS.log!);
    await settle();
    expect(webhook.batches).toHaveLength(1);
  });

  it('drops a batch whose write failed, and warns at most once per interval with the count since the last line', async () => {
    const sink = recordingSink('webhook', new Error('audit webhook 127.0.0.1:1: HTTP 400'));
    const h = harness({ sinks: [sink], batchMaxWaitMs: 0 });
    await h.backend.emit(auditEvent(0));
    await settle();
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'webhook')).toBe(1);
    expect(warnings(h)).toEqual([
      expect.objectContaining({
        level: 40,
        sink: 'webhook',
        dropped: 1,
        writeFailed: 1,
        error: 'audit webhook 127.0.0.1:1: HTTP 400',
      }),
    ]);

    for (let i = 1; i <= 3; i++) {
      await h.backend.emit(auditEvent(i));
      await settle();
    }
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'webhook')).toBe(4);
    expect(warnings(h)).toHaveLength(1);

    h.clock.advance(DROP_WARNING_INTERVAL_MS);
    expect(warnings(h)).toHaveLength(2);
    expect(warnings(h)[1]).toMatchObject({ sink: 'webhook', dropped: 3, writeFailed: 3 });
    expect(await metric(h.registry, 'sealion_audit_events_total', 'webhook')).toBe(0);

    // Nothing of an event reaches the log: not its user, its resource, its address or its id.
    for (const secret of ['alice', 'secret-ns', '192.0.2.7', 'audit-id'])
      expect(h.text()).not.toContain(secret);
  });

  it('warns about a full queue once, then with the count of the interval', async () => {
    const sink = heldSink('log');
    const h = harness({ sinks: [sink], bufferSize: 1 });
    for (let i = 0; i < 5; i++) void h.backend.emit(auditEvent(i));
    expect(warnings(h)).toEqual([expect.objectContaining({ sink: 'log', dropped: 1, queueFull: 1 })]);
    h.clock.advance(DROP_WARNING_INTERVAL_MS);
    expect(warnings(h)[1]).toMatchObject({ sink: 'log', dropped: 3, queueFull: 3 });
    // A quiet interval logs nothing.
    h.clock.advance(DROP_WARNING_INTERVAL_MS);
    expect(warnings(h)).toHaveLength(2);
    expect(h.text()).not.toContain('alice');
  });
});

describe('blocking mode', () => {
  it('settles emit() once every sink wrote the event, without waiting for a batch', async () => {
    const a = heldSink('log');
    const b = heldSink('webhook');
    const h = harness({ sinks: [a, b], mode: 'blocking', batchMaxWaitMs: 60_000 });
    expect(h.backend.mode).toBe('blocking');
    let done = false;
    const emitted = h.backend.emit(auditEvent(0)).then(() => (done = true));
    await settle();
    expect(a.writes).toHaveLength(1);
    expect(b.writes).toHaveLength(1);

    a.writes[0]!.resolve();
    await settle();
    expect(done).toBe(false);
    b.writes[0]!.resolve();
    await emitted;
    expect(await metric(h.registry, 'sealion_audit_events_total', 'log')).toBe(1);
    expect(await metric(h.registry, 'sealion_audit_events_total', 'webhook')).toBe(1);
  });

  it('rejects emit() when a sink could not write the event', async () => {
    const fine = recordingSink('log');
    const cause = new Error('audit webhook 127.0.0.1:1: HTTP 503, after 5 attempts');
    const failing = recordingSink('webhook', cause);
    const h = harness({ sinks: [fine, failing], mode: 'blocking' });
    await expect(h.backend.emit(auditEvent(0))).rejects.toMatchObject({ code: AUDIT_WRITE_FAILED, cause });
    expect(fine.batches).toEqual([[auditEvent(0)]]);
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'webhook')).toBe(1);
  });

  it('refuses at once what a full queue cannot take', async () => {
    const sink = heldSink('log');
    const h = harness({ sinks: [sink], mode: 'blocking', bufferSize: 1 });
    const first = h.backend.emit(auditEvent(0));
    await settle();
    const second = h.backend.emit(auditEvent(1));
    await expect(h.backend.emit(auditEvent(2))).rejects.toMatchObject({ code: AUDIT_QUEUE_FULL });

    sink.writes[0]!.resolve();
    await first;
    await settle();
    sink.writes[1]!.resolve();
    await second;
  });
});

describe('close', () => {
  it('writes what is queued, then closes each sink once; a second close() is the first', async () => {
    const sink = recordingSink('webhook');
    const h = harness({ sinks: [sink], batchMaxWaitMs: 60_000 });
    for (let i = 0; i < 3; i++) void h.backend.emit(auditEvent(i));
    await settle();
    expect(sink.batches).toEqual([]);

    const first = h.backend.close();
    expect(h.backend.close()).toBe(first);
    await first;
    await h.backend.close();
    expect(sink.batches.flat()).toHaveLength(3);
    expect(sink.closes).toBe(1);
    expect(h.clock.pending()).toEqual([]);

    // After close an event is dropped (batch mode) and said so.
    await h.backend.emit(auditEvent(3));
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'webhook')).toBe(1);
    expect(warnings(h)).toEqual([expect.objectContaining({ dropped: 1, closed: 1 })]);
  });

  it('gives up on a sink that does not finish in CLOSE_TIMEOUT_MS: what is left is dropped, counted and warned', async () => {
    const hung = heldSink('webhook');
    const fine = recordingSink('log');
    const h = harness({ sinks: [hung, fine], batchMaxSize: 1, batchMaxWaitMs: 0 });
    for (let i = 0; i < 3; i++) void h.backend.emit(auditEvent(i));
    await settle();
    let closed = false;
    const closing = h.backend.close().then(() => (closed = true));
    await settle();
    expect(closed).toBe(false);

    h.clock.advance(CLOSE_TIMEOUT_MS);
    await closing;
    expect(hung.closes).toBe(1);
    expect(fine.closes).toBe(1);
    expect(fine.batches.flat()).toHaveLength(3);
    // The two that waited are dropped at the deadline; the one being written when the sink closed, as it fails.
    await settle();
    expect(await metric(h.registry, 'sealion_audit_events_dropped_total', 'webhook')).toBe(3);
    expect(warnings(h)[0]).toMatchObject({ sink: 'webhook', closed: 2 });
    expect(h.lines.some((l) => l.msg === 'audit sinks did not finish writing in time')).toBe(true);
  });

  it('rejects a blocking emit() after close', async () => {
    const h = harness({ sinks: [recordingSink('log')], mode: 'blocking' });
    await h.backend.close();
    await expect(h.backend.emit(auditEvent(0))).rejects.toMatchObject({ code: AUDIT_CLOSED });
  });
});

describe('options', () => {
  it('reports every problem at once', () => {
    const registry = new Registry();
    const log = newLogger({ level: 'silent' });
    let thrown: unknown;
    try {
      newAuditBackend({
        sinks: [recordingSink('log'), recordingSink('log')],
        bufferSize: 0,
        batchMaxSize: 1.5,
        batchMaxWaitMs: -1,
        registry,
        log,
      });
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toMatchObject({ code: AUDIT_CONFIG });
    for (const field of ['sinks', 'bufferSize', 'batchMaxSize', 'batchMaxWaitMs'])
      expect((thrown as Error).message).toContain(field);
    expect(() => newAuditBackend({ sinks: [], registry, log })).toThrow(
      expect.objectContaining({ code: AUDIT_CONFIG }),
    );
  });
});
