// The drain sequence with an injected clock: what happens at each step, in order, and the counts it logs.
import { describe, expect, it } from '@jest/globals';
import { fakeClock } from '../test-support/fake-clock.ts';
import { silentLogger } from '../lib/log.ts';
import {
  CLOSING_MS,
  drainSequence,
  newSessionRegistry,
  SHUTDOWN_MESSAGE,
  type DrainCounts,
} from './drain.ts';
import { count, type RunningConcierge } from './main.ts';
import { onSignals } from '../lib/lifecycle.ts';
import { EventEmitter } from 'node:events';

/** Lets the promises settled so far run their reactions. */
const settle = (): Promise<void> => new Promise((done) => setImmediate(done));

describe('the drain sequence', () => {
  it('turns readiness off, serves on for the delay, stops taking connections, hands over, then ends and closes', async () => {
    const clock = fakeClock();
    const registry = newSessionRegistry();
    const events: string[] = [];
    const lines: { msg: string; fields: Record<string, unknown> }[] = [];
    const log = silentLogger();
    log.info = ((fields: Record<string, unknown>, msg: string) => void lines.push({ fields, msg })) as never;
    const inFlight = registry.request();
    const endWatch = registry.watch(() => events.push('watch ended'));
    const execDone = registry.session('exec', (message) => events.push(`exec closed: ${message}`));
    const sshDone = registry.session('ssh', () => events.push('ssh closed'));
    let counts: DrainCounts | undefined;
    const draining = drainSequence(
      {
        settings: { delayMs: 15_000, graceMs: 30_000 },
        registry,
        stopAccepting: () => (events.push('stop accepting'), Promise.resolve()),
        handOver: () => (events.push('hand over'), Promise.resolve(2)),
        clock,
        log,
      },
      new AbortController().signal,
    ).then((c) => (counts = c));
    // a. Readiness is off at once; nothing else has happened.
    expect(registry.draining()).toBe(true);
    expect(lines[0]).toMatchObject({ msg: 'draining', fields: { delaySeconds: 15, graceSeconds: 30 } });
    expect(events).toEqual([]);
    // b. A request that comes during the delay is served and counted.
    clock.advance(14_999);
    await settle();
    registry.request()();
    expect(events).toEqual([]);
    // c, d, e: after the delay, no new connections, the handover, and the watches end.
    clock.advance(1);
    await settle();
    expect(events).toEqual(['stop accepting', 'hand over', 'watch ended']);
    endWatch();
    inFlight();
    // The SSH session ends by itself during the grace; the exec does not.
    sshDone();
    clock.advance(29_999);
    await settle();
    expect(counts).toBeUndefined();
    clock.advance(1);
    await settle();
    // f. The exec is told, and the drain waits for it to close (its last bytes gone) before the stop.
    expect(events.at(-1)).toBe(`exec closed: ${SHUTDOWN_MESSAGE}`);
    expect(counts).toBeUndefined();
    execDone();
    await draining;
    expect(events).toEqual([
      'stop accepting',
      'hand over',
      'watch ended',
      `exec closed: ${SHUTDOWN_MESSAGE}`,
    ]);
    expect(counts).toEqual({
      requestsFinished: 2,
      requestsCut: 0,
      watchesEnded: 1,
      sessionsEnded: 1,
      sessionsClosed: 1,
      tunnelsHandedOver: 2,
    });
    expect(lines.at(-1)).toMatchObject({ msg: 'drained', fields: counts });
  });

  it('ends the watches while the tunnels are being handed over, as a watch on a tunnel holds its handover', async () => {
    const clock = fakeClock();
    const registry = newSessionRegistry();
    let moved: (n: number) => void = () => {};
    const handOver = new Promise<number>((resolve) => (moved = resolve));
    const endWatch = registry.watch(() => {
      endWatch();
      moved(1);
    });
    const counts = await drainSequence(
      {
        settings: { delayMs: 0, graceMs: 30_000 },
        registry,
        stopAccepting: () => Promise.resolve(),
        handOver: () => handOver,
        clock,
        log: silentLogger(),
      },
      new AbortController().signal,
    );
    expect(counts).toMatchObject({ watchesEnded: 1, tunnelsHandedOver: 1 });
  });

  it('lets a closed session that does not close go once its last bytes had their time', async () => {
    const clock = fakeClock();
    const registry = newSessionRegistry();
    registry.session('exec', () => {});
    const draining = drainSequence(
      {
        settings: { delayMs: 0, graceMs: 1_000 },
        registry,
        stopAccepting: () => Promise.resolve(),
        handOver: () => Promise.resolve(0),
        clock,
        log: silentLogger(),
      },
      new AbortController().signal,
    );
    await settle();
    clock.advance(1_000);
    await settle();
    clock.advance(CLOSING_MS);
    expect(await draining).toMatchObject({ sessionsClosed: 1, sessionsEnded: 0 });
  });

  it('does not wait out the grace once nothing is open', async () => {
    const clock = fakeClock();
    const registry = newSessionRegistry();
    const done = registry.session('port-forward', () => {});
    const draining = drainSequence(
      {
        settings: { delayMs: 0, graceMs: 30_000 },
        registry,
        stopAccepting: () => Promise.resolve(),
        handOver: () => Promise.resolve(0),
        clock,
        log: silentLogger(),
      },
      new AbortController().signal,
    );
    await settle();
    done();
    const counts = await draining;
    expect(counts).toMatchObject({ sessionsEnded: 1, sessionsClosed: 0 });
  });

  it('cut by a second signal, skips the waits and closes what is open', async () => {
    const clock = fakeClock();
    const registry = newSessionRegistry();
    const closed: string[] = [];
    registry.session('attach', (message) => closed.push(message));
    const cut = new AbortController();
    const draining = drainSequence(
      {
        settings: { delayMs: 15_000, graceMs: 30_000 },
        registry,
        stopAccepting: () => Promise.resolve(),
        handOver: () => Promise.resolve(1),
        clock,
        log: silentLogger(),
      },
      cut.signal,
    );
    cut.abort();
    const counts = await draining;
    expect(closed).toEqual([SHUTDOWN_MESSAGE]);
    expect(counts).toMatchObject({ sessionsClosed: 1, tunnelsHandedOver: 0 });
    expect(clock.pending()).toEqual([]);
  });
});

describe("the concierge's signals", () => {
  const running = (calls: string[]): RunningConcierge => ({
    drain: () => (calls.push('drain'), new Promise<void>(() => {})),
    stop: () => (calls.push('stop'), Promise.resolve()),
  });

  it('drains on SIGTERM, and stops at once on a second one', async () => {
    const calls: string[] = [];
    const signals = new EventEmitter();
    let exits = 0;
    onSignals(running(calls), () => exits++, signals as never);
    signals.emit('SIGTERM');
    await settle();
    expect(calls).toEqual(['drain']);
    expect(exits).toBe(0);
    signals.emit('SIGTERM');
    await settle();
    expect(calls).toEqual(['drain', 'stop']);
    expect(exits).toBe(1);
  });

  it('stops at once on SIGINT', async () => {
    const calls: string[] = [];
    const signals = new EventEmitter();
    let exits = 0;
    onSignals(running(calls), () => exits++, signals as never);
    signals.emit('SIGINT');
    await settle();
    expect(calls).toEqual(['stop']);
    expect(exits).toBe(1);
  });
});

describe('the drain flags', () => {
  it('take whole seconds, 0 included, and refuse anything else naming the flag', () => {
    expect(count('shutdown-delay', '0')).toBe(0);
    expect(count('shutdown-grace', '30')).toBe(30);
    for (const bad of ['-1', '1.5', 'soon', ''])
      expect(() => count('shutdown-delay', bad)).toThrow(/^--shutdown-delay: .* is not a whole number$/);
  });
});
