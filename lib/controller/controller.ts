// A controller is a name, the informers it watches (each mapping an object to the keys it affects) and a
// level-triggered sync(key). Events only enqueue keys; sync reads the caches and never learns which event woke it.
import type { SyncResult } from './queue.ts';
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
  /** Keys to sync at start, on every resync and on becoming leader, that no watched object yields (a singleton). */
  initialKeys?: readonly string[];
  sync(key: string): Promise<SyncResult>;
}
