// Runs a process's controllers, as controller-runtime's manager does. Every replica runs the controllers that only
// read (caches, what the local proxy serves); the writers run only on the replica that holds the leader Lease, and
// the writes they are given refuse to happen on any other (NotLeader), which is the one place leadership is checked.
// Becoming leader syncs every key of every writer, so a new leader repairs whatever its predecessor left undone.
//
// A sync reports a user's mistake (an invalid spec, a broken config edit) in the object's status or conditions and
// returns; it throws only for failures that may pass (the API server, an issuer that is down), which the queue
// retries with backoff. A write refused for want of leadership is not retried: the next leader syncs everything.
//
// Every sync is given a signal that aborts when the manager stops; a writer's also aborts when this replica stops
// leading, so that a long sync (an issuer's discovery, a certificate) gives up the moment its writes would be refused.
import type { Registry } from 'prom-client';
import { systemClock, type Clock } from '../clock.ts';
import type { Informer, KubeObject } from '../kube/informer.ts';
import type { Logger } from '../log.ts';
import type { LeaderElection } from './leader.ts';
import type { Controller, ControllerEntry, Watch } from './controller.ts';
import { newQueueMetrics } from './metrics.ts';
import { WorkQueue, type QueueOptions } from './queue.ts';

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
  /** Where the work queues' metrics go (lib/controller/metrics.ts). Default: nowhere. */
  registry?: Registry;
}

export interface ControllerManager {
  isLeader(): boolean;
  /** `writer` with every method refusing (rejecting with NotLeader, writing nothing) unless this replica leads. */
  leaderOnly<W extends object>(writer: W): W;
  /** Adds controllers, before start(): each runs on every replica or only while this one leads, as it says. */
  add(...entries: ControllerEntry[]): void;
  /** Runs `controller` on every replica. It must write nothing shared (give it no leader-only writer). */
  run(controller: Controller): void;
  /** Runs `controller` only while this replica leads; give it writers through leaderOnly(). */
  runWhileLeading(controller: Controller): void;
  /** Enqueues every key of controller `name`, for a change no informer sees that concerns them all. */
  resync(name: string): void;
  /** Enqueues `key` on controller `name`, for a change no informer sees. */
  enqueue(name: string, key: string): void;
  /** Resolves when controller `name` has nothing queued or syncing (keys waiting for a delay not counted). */
  idle(name: string): Promise<void>;
  /** Waits for every informer to sync, then starts every controller's workers. */
  start(): Promise<void>;
  /** Aborts the syncs under way and waits for them; nothing syncs after. */
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
  const metrics = opts.registry ? newQueueMetrics(opts.registry) : undefined;
  const running = new Map<string, Running>();
  let resyncTimer: unknown;
  let started = false;
  let stopped = false;
  /** Aborted when this replica stops leading; a new one for each term. Writers' syncs are given its signal. */
  let term = new AbortController();

  const add = (entry: ControllerEntry): void => {
    const { controller } = entry;
    if (started) throw new Error(`controller ${controller.name} added after the manager started`);
    if (running.has(controller.name)) throw new Error(`controller ${controller.name} added twice`);
    const queue = newControllerQueue(entry, {
      clock,
      log: opts.log.child({ controller: controller.name }),
      isLeader,
      term: () => term.signal,
      ...(metrics ? { metrics: metrics(controller.name) } : {}),
    });
    const r: Running = { controller, queue, leading: entry.runs === 'leader' };
    running.set(controller.name, r);
    for (const watch of controller.watches) watch.informer.onChange((obj) => enqueueFor(r, watch, obj));
  };

  opts.election?.onChange((leads) => {
    if (!leads) return void term.abort(new NotLeader());
    if (term.signal.aborted) term = new AbortController();
    if (stopped) return;
    for (const r of running.values()) if (r.leading) enqueueAll(r);
  });

  return {
    isLeader,
    leaderOnly: (writer) => refusedUnlessLeading(writer, isLeader),
    add: (...entries) => entries.forEach(add),
    run: (controller) => add({ controller, runs: 'every-replica' }),
    runWhileLeading: (controller) => add({ controller, runs: 'leader' }),
    resync(name) {
      const r = running.get(name);
      if (r) enqueueAll(r);
    },
    enqueue(name, key) {
      running.get(name)?.queue.add(key);
    },
    idle: (name) => running.get(name)?.queue.idle() ?? Promise.resolve(),
    async start() {
      started = true;
      const all = [...running.values()];
      await Promise.all([...informersOf(all)].map((i) => i.synced()));
      if (stopped) return;
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

/** Every key a controller has now: its initial keys and those of every object its watches see. */
function enqueueAll(r: Running): void {
  for (const key of r.controller.initialKeys ?? []) r.queue.add(key);
  for (const watch of r.controller.watches)
    for (const obj of watch.informer.list()) enqueueFor(r, watch, obj);
}

function enqueueFor(r: Running, watch: Watch, obj: KubeObject): void {
  if (watch.filter && !watch.filter(obj)) return;
  const keys = watch.key ? watch.key(obj) : (obj.metadata?.name ?? '');
  for (const key of Array.isArray(keys) ? keys : [keys]) if (key) r.queue.add(key);
}

/** The informers every controller watches or reads: the manager waits for them all before it starts any. */
function informersOf(all: Running[]): Set<Informer<KubeObject>> {
  return new Set<Informer<KubeObject>>(
    all.flatMap((r) => [...r.controller.watches.map((w) => w.informer), ...(r.controller.reads ?? [])]),
  );
}

/** `writer` with every method rejecting with NotLeader, writing nothing, unless this replica leads. */
function refusedUnlessLeading<W extends object>(writer: W, isLeader: () => boolean): W {
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
}

/** What a controller's queue needs of its manager. */
interface QueueContext {
  clock: Clock;
  log: Logger;
  isLeader: () => boolean;
  /** The current leadership term's signal. */
  term: () => AbortSignal;
  metrics?: QueueOptions['metrics'];
}

/**
 * The work queue of one controller. A writer's sync runs only while this replica leads, with a signal that also
 * aborts when leadership is lost; what it then fails with is not retried, as the next leader syncs everything.
 */
function newControllerQueue(
  { controller, runs, queue: tuning }: ControllerEntry,
  ctx: QueueContext,
): WorkQueue {
  const { log } = ctx;
  const options: QueueOptions = {
    ...tuning,
    clock: ctx.clock,
    onError: (key, err) =>
      log.warn({ key, err: (err as Error).message }, 'sync failed; retrying with backoff'),
    onDrop: (key, failures) =>
      log.warn(
        { key, failures },
        'sync failed too many times in a row; dropped until the key is added again',
      ),
    ...(ctx.metrics ? { metrics: ctx.metrics } : {}),
  };
  return new WorkQueue(async (key, stopping) => {
    if (runs !== 'leader') return controller.sync(key, stopping);
    if (!ctx.isLeader()) return;
    const signal = AbortSignal.any([stopping, ctx.term()]);
    try {
      return await controller.sync(key, signal);
    } catch (err) {
      // Refused or aborted for want of leadership: the next leader syncs everything.
      if (err instanceof NotLeader || (signal.aborted && !stopping.aborted)) return;
      throw err;
    }
  }, options);
}
