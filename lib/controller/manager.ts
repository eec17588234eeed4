// Runs a process's controllers, as controller-runtime's manager does. Every replica runs the controllers that only
// read (caches, what the local proxy serves); the writers run only on the replica that holds the leader Lease, and
// the writes they are given refuse to happen on any other (NotLeader), which is the one place leadership is checked.
// Becoming leader syncs every key of every writer, so a new leader repairs whatever its predecessor left undone.
//
// A sync reports a user's mistake (an invalid spec, a broken config edit) in the object's status or conditions and
// returns; it throws only for failures that may pass (the API server, an issuer that is down), which the queue
// retries with backoff. A write refused for want of leadership is not retried: the next leader syncs everything.
import { systemClock, type Clock } from '../clock.ts';
import type { KubeObject } from '../kube/informer.ts';
import type { Logger } from '../log.ts';
import type { LeaderElection } from './leader.ts';
import type { Controller, Watch } from './controller.ts';
import { WorkQueue } from './queue.ts';

/** A write attempted by a replica that does not lead. */
export class NotLeader extends Error {
  constructor() {
    super('not the leader: the write was refused');
  }
}

export interface ControllerManagerOptions {
  /** Without one, this replica always leads (a concierge with no Lease to share). */
  election?: LeaderElection;
  log: Logger;
  clock?: Clock;
  /** Every key of every controller is synced again this often, to repair drift nobody announced. Default: 10 min. */
  resyncMs?: number;
}

export interface ControllerManager {
  isLeader(): boolean;
  /** `writer` with every method refusing (rejecting with NotLeader, writing nothing) unless this replica leads. */
  leaderOnly<W extends object>(writer: W): W;
  /** Runs `controller` on every replica. It must write nothing (give it no writer). */
  run(controller: Controller): void;
  /** Runs `controller` only while this replica leads; give it writers through leaderOnly(). */
  runWhileLeading(controller: Controller): void;
  /** Enqueues every key of controller `name`, for a change no informer sees that concerns them all. */
  resync(name: string): void;
  /** Enqueues `key` on controller `name`, for a change no informer sees. */
  enqueue(name: string, key: string): void;
  /** Waits for every informer to sync, then starts every controller's workers. */
  start(): Promise<void>;
  stop(): Promise<void>;
}

interface Running {
  controller: Controller;
  queue: WorkQueue;
  leading: boolean;
}

export function newControllerManager(opts: ControllerManagerOptions): ControllerManager {
  const clock = opts.clock ?? systemClock;
  const isLeader = opts.election ? () => opts.election!.isLeader() : () => true;
  const running = new Map<string, Running>();
  let resyncTimer: unknown;
  let stopped = false;

  const enqueueAll = (r: Running): void => {
    for (const key of r.controller.initialKeys ?? []) r.queue.add(key);
    for (const watch of r.controller.watches)
      for (const obj of watch.informer.list()) enqueueFor(r, watch, obj);
  };
  const enqueueFor = (r: Running, watch: Watch, obj: KubeObject): void => {
    if (watch.filter && !watch.filter(obj)) return;
    const keys = watch.key ? watch.key(obj) : (obj.metadata?.name ?? '');
    for (const key of Array.isArray(keys) ? keys : [keys]) if (key) r.queue.add(key);
  };

  const add = (controller: Controller, leading: boolean): void => {
    if (running.has(controller.name)) throw new Error(`controller ${controller.name} added twice`);
    const log = opts.log.child({ controller: controller.name });
    const queue = new WorkQueue(
      async (key) => {
        if (leading && !isLeader()) return;
        try {
          return await controller.sync(key);
        } catch (err) {
          if (err instanceof NotLeader) return;
          throw err;
        }
      },
      {
        clock,
        onError: (key, err) =>
          log.warn({ key, err: (err as Error).message }, 'sync failed; retrying with backoff'),
      },
    );
    const r: Running = { controller, queue, leading };
    running.set(controller.name, r);
    for (const watch of controller.watches) watch.informer.onChange((obj) => enqueueFor(r, watch, obj));
  };

  opts.election?.onChange((leads) => {
    if (!leads || stopped) return;
    for (const r of running.values()) if (r.leading) enqueueAll(r);
  });

  return {
    isLeader,
    leaderOnly<W extends object>(writer: W): W {
      return new Proxy(writer, {
        get(target, property, receiver) {
          const value: unknown = Reflect.get(target, property, receiver);
          if (typeof value !== 'function') return value;
          return (...args: unknown[]) =>
            isLeader()
              ? (value as (...a: unknown[]) => unknown).apply(target, args)
              : Promise.reject(new NotLeader());
        },
      });
    },
    run: (controller) => add(controller, false),
    runWhileLeading: (controller) => add(controller, true),
    resync(name) {
      const r = running.get(name);
      if (r) enqueueAll(r);
    },
    enqueue(name, key) {
      running.get(name)?.queue.add(key);
    },
    async start() {
      const all = [...running.values()];
      await Promise.all(all.flatMap((r) => r.controller.watches.map((w) => w.informer.synced())));
      for (const r of all) {
        enqueueAll(r);
        r.queue.start();
      }
      const resync = (): void => {
        for (const r of running.values()) enqueueAll(r);
        resyncTimer = clock.setTimeout(resync, opts.resyncMs ?? 10 * 60_000);
      };
      resyncTimer = clock.setTimeout(resync, opts.resyncMs ?? 10 * 60_000);
      opts.log.debug({ controllers: all.map((r) => r.controller.name) }, 'controllers started');
    },
    async stop() {
      stopped = true;
      clock.clearTimeout(resyncTimer);
      await Promise.all([...running.values()].map((r) => r.queue.stop()));
    },
  };
}
