// A controller is a name, the informers it watches (each mapping an object to the keys it affects) and a
// level-triggered sync(key). Events only enqueue keys; sync reads the caches and never learns which event woke it.
import type { QueueOptions, SyncResult } from './queue.ts';
import type { Informer, KubeObject } from '../kube/informer.ts';

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
  /** Caches sync reads but is not woken by. Default: none. The manager waits for them as for the watched ones. */
  reads?: Informer<KubeObject>[];
  /** Keys to sync at start, on every resync and on becoming leader, that no watched object yields (a singleton). */
  initialKeys?: readonly string[];
  /**
   * `signal` aborts when the manager stops and, for a controller that runs only while leading, when leadership is
   * lost: a long sync passes it to what it waits on.
   */
  sync(key: string, signal: AbortSignal): Promise<SyncResult>;
}

/** Where a controller runs: readers and a replica's own facts everywhere, writers of shared state on the leader. */
export type Runs = 'every-replica' | 'leader';

/** One line of a process's list of controllers: what runs, where, and how its queue is tuned. */
export interface ControllerEntry {
  controller: Controller;
  runs: Runs;
  /** Default: DEFAULT_QUEUE_OPTIONS (lib/controller/queue.ts). */
  queue?: Pick<
    QueueOptions,
    'workers' | 'baseDelayMs' | 'maxDelayMs' | 'maxRetries' | 'retriesPerSecond' | 'retryBurst'
  >;
}
