import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { MemoryInformer, type KubeObject } from '../kube/informer.ts';
import { silentLogger } from '../log.ts';
import type { Controller } from './controller.ts';
import type { LeaderElection } from './leader.ts';
import { newControllerManager, NotLeader } from './manager.ts';

/** An election this test decides. */
function election(): LeaderElection & { set(leading: boolean): void } {
  let leading = false;
  const handlers: ((l: boolean) => void)[] = [];
  return {
    isLeader: () => leading,
    onChange: (h) => void handlers.push(h),
    stop: () => Promise.resolve(),
    set(next) {
      leading = next;
      for (const h of handlers) h(next);
    },
  };
}

const obj = (name: string): KubeObject => ({ metadata: { name } });

/** A controller that records the keys it syncs and fails as told. */
function recorder(
  name: string,
  informer: MemoryInformer<KubeObject>,
  fail?: (key: string) => Error | undefined,
) {
  const synced: string[] = [];
  const controller: Controller = {
    name,
    watches: [{ informer }],
    initialKeys: ['singleton'],
    sync(key) {
      synced.push(key);
      const err = fail?.(key);
      return err ? Promise.reject(err) : Promise.resolve();
    },
  };
  return { controller, synced };
}

const settle = async (): Promise<void> => {
  for (let i = 0; i < 10; i++) await new Promise((done) => setImmediate(done));
};

describe('the controller manager', () => {
  it('runs readers everywhere, and writers only while leading, syncing all their keys on becoming leader', async () => {
    const elected = election();
    const informer = new MemoryInformer<KubeObject>([obj('a'), obj('b')]);
    const manager = newControllerManager({ election: elected, log: silentLogger(), clock: fakeClock() });
    const reader = recorder('reader', informer);
    const writer = recorder('writer', informer);
    manager.run(reader.controller);
    manager.runWhileLeading(writer.controller);
    await manager.start();
    await settle();
    expect(reader.synced.sort()).toEqual(['a', 'b', 'singleton']);
    // Queued, but a follower's writer does nothing.
    expect(writer.synced).toEqual([]);
    informer.put(obj('c'));
    await settle();
    expect(writer.synced).toEqual([]);

    elected.set(true);
    await settle();
    expect(writer.synced.sort()).toEqual(['a', 'b', 'c', 'singleton']);
    await manager.stop();
  });

  it('refuses leader-only writes on a follower, without calling the writer', async () => {
    const elected = election();
    const manager = newControllerManager({ election: elected, log: silentLogger() });
    const calls: string[] = [];
    const writes = manager.leaderOnly({
      patchStatus: (name: string) => (calls.push(name), Promise.resolve()),
    });
    await expect(writes.patchStatus('x')).rejects.toBeInstanceOf(NotLeader);
    expect(calls).toEqual([]);
    elected.set(true);
    await writes.patchStatus('y');
    expect(calls).toEqual(['y']);
  });

  it('retries failures with backoff, but not a write refused because leadership was lost', async () => {
    const clock = fakeClock();
    const manager = newControllerManager({ log: silentLogger(), clock });
    const informer = new MemoryInformer<KubeObject>([obj('flaky'), obj('demoted')]);
    let failures = 2;
    const { controller, synced } = recorder('writer', informer, (key) =>
      key === 'flaky' && failures-- > 0
        ? new Error('API server unavailable')
        : key === 'demoted'
          ? new NotLeader()
          : undefined,
    );
    manager.runWhileLeading(controller);
    await manager.start();
    await settle();
    for (let i = 0; i < 20; i++) {
      clock.advance(1000);
      await settle();
    }
    expect(synced.filter((k) => k === 'flaky')).toHaveLength(3);
    expect(synced.filter((k) => k === 'demoted')).toHaveLength(1);
    await manager.stop();
  });

  /** A controller whose syncs wait until their signal aborts, and say what aborted them. */
  function blocking(name: string) {
    const aborted: string[] = [];
    let started = 0;
    const controller: Controller = {
      name,
      watches: [],
      initialKeys: ['k'],
      sync: (_key, signal) =>
        new Promise((_done, fail) => {
          started++;
          signal.addEventListener('abort', () => {
            aborted.push((signal.reason as Error).constructor.name);
            fail(signal.reason as Error);
          });
        }),
    };
    return { controller, aborted, started: () => started };
  }

  it("aborts a writer's sync when leadership is lost, and every sync when it stops", async () => {
    const elected = election();
    elected.set(true);
    const manager = newControllerManager({ election: elected, log: silentLogger(), clock: fakeClock() });
    const writer = blocking('writer');
    const reader = blocking('reader');
    manager.add(
      { controller: writer.controller, runs: 'leader' },
      { controller: reader.controller, runs: 'every-replica' },
    );
    await manager.start();
    await settle();
    expect([writer.started(), reader.started()]).toEqual([1, 1]);

    elected.set(false);
    await settle();
    expect(writer.aborted).toEqual(['NotLeader']);
    expect(reader.aborted).toEqual([]);

    // A new term: the writer syncs everything again, with a signal of the new term.
    elected.set(true);
    await settle();
    expect(writer.started()).toBe(2);
    await manager.stop();
    expect(writer.aborted).toHaveLength(2);
    expect(reader.aborted).toHaveLength(1);
  });

  it('waits for the caches its controllers read as for those they watch, and counts by controller', async () => {
    let synced: () => void = () => {};
    const read = new MemoryInformer<KubeObject>();
    read.synced = () => new Promise<void>((done) => (synced = done));
    const registry = new Registry();
    const manager = newControllerManager({ log: silentLogger(), clock: fakeClock(), registry });
    const seen: string[] = [];
    manager.add({
      controller: {
        name: 'reader',
        watches: [],
        reads: [read],
        initialKeys: ['k'],
        sync: (key) => (seen.push(key), Promise.resolve()),
      },
      runs: 'every-replica',
    });
    const starting = manager.start();
    await settle();
    expect(seen).toEqual([]);
    synced();
    await starting;
    await manager.idle('reader');
    expect(seen).toEqual(['k']);
    expect(await registry.metrics()).toContain('sealion_controller_queue_adds_total{controller="reader"} 1');
    expect(() => manager.run({ name: 'late', watches: [], sync: () => Promise.resolve() })).toThrow(
      'added after the manager started',
    );
    await manager.stop();
  });
});
