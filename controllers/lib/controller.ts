// A controller is a name, the informers it watches (each mapping an object to the keys it affects) and a
// level-triggered sync(key). Events only enqueue keys; sync reads the caches and never learns which event woke it.
import type { Logger } from '../../lib/log.ts';
import { WorkQueue, type QueueOptions, type SyncResult } from './queue.ts';
import type { Informer, KubeObject } from '../../lib/informer.ts';

export interface Watch<T extends KubeObject = KubeObject> {
  informer: Informer<T>;
  /** Objects to ignore. Default: none ignored. */
  filter?(obj: T): boolean;
  /** The keys an object affects. Default: its name. */
  key?(obj: T): string | string[];
}

export interface Controller {
  name: string;
  /** Method-style members make a Watch of any object type fit here. */
  watches: Watch[];
  sync(key: string): Promise<SyncResult>;
}

export interface RunningController {
  queue: WorkQueue;
  /** Enqueues every known key, for when something outside the watches changed (say, leadership). */
  resync(): void;
  stop(): Promise<void>;
}

export interface RunOptions extends QueueOptions {
  log: Logger;
  /** Re-sync every known key this often, to repair drift nobody announced. Default: 10 minutes. */
  resyncMs?: number;
}

/** Wires a controller's watches to its queue and starts its workers once every informer has synced. */
export async function runController(controller: Controller, opts: RunOptions): Promise<RunningController> {
  const log = opts.log.child({ controller: controller.name });
  const queue = new WorkQueue(controller.sync.bind(controller), {
    ...opts,
    onError: (key, err) =>
      log.warn({ key, err: (err as Error).message }, 'sync failed; retrying with backoff'),
  });
  const enqueueAll = (): void => {
    for (const watch of controller.watches) {
      for (const obj of watch.informer.list()) enqueue(watch, obj);
    }
  };
  const enqueue = (watch: Watch, obj: KubeObject): void => {
    if (watch.filter && !watch.filter(obj)) return;
    const keys = watch.key ? watch.key(obj) : (obj.metadata?.name ?? '');
    for (const key of Array.isArray(keys) ? keys : [keys]) if (key) queue.add(key);
  };
  for (const watch of controller.watches) watch.informer.onChange((obj) => enqueue(watch, obj));
  await Promise.all(controller.watches.map((w) => w.informer.synced()));
  enqueueAll();
  queue.start();
  const resync = setInterval(enqueueAll, opts.resyncMs ?? 10 * 60_000);
  resync.unref();
  log.debug('started');
  return {
    queue,
    resync: enqueueAll,
    async stop() {
      clearInterval(resync);
      await queue.stop();
    },
  };
}
