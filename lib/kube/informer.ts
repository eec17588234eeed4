// What controllers need from a watched collection: a cache to read and a signal that something changed.
// lib/kube/kube.ts implements it over the API server (restarting watches by itself); MemoryInformer serves tests.
// It lives in lib/ because lib/kube/kube.ts implements it; controllers depend only on this interface.

export interface KubeObject {
  metadata?: {
    name?: string;
    namespace?: string;
    resourceVersion?: string;
    generation?: number;
    uid?: string;
  };
}

export interface Informer<T extends KubeObject> {
  /** Everything in the cache. */
  list(): T[];
  /** One object from the cache by name (and namespace for namespaced kinds). */
  get(name: string, namespace?: string): T | undefined;
  /** Called with the object on every add, update and delete (the deleted object's last state). */
  onChange(handler: (obj: T) => void): void;
  /** Resolves once the first list has filled the cache. */
  synced(): Promise<void>;
  stop(): Promise<void>;
}

/** An informer over an in-memory store, for controller tests. */
export class MemoryInformer<T extends KubeObject> implements Informer<T> {
  private readonly objects = new Map<string, T>();
  private readonly handlers: ((obj: T) => void)[] = [];

  constructor(initial: T[] = []) {
    for (const obj of initial) this.objects.set(MemoryInformer.key(obj), obj);
  }

  private static key(obj: KubeObject): string {
    return `${obj.metadata?.namespace ?? ''}/${obj.metadata?.name ?? ''}`;
  }

  list(): T[] {
    return [...this.objects.values()];
  }

  get(name: string, namespace?: string): T | undefined {
    return this.objects.get(`${namespace ?? ''}/${name}`);
  }

  onChange(handler: (obj: T) => void): void {
    this.handlers.push(handler);
  }

  synced(): Promise<void> {
    return Promise.resolve();
  }

  stop(): Promise<void> {
    return Promise.resolve();
  }

  /** Stores (or replaces) an object and notifies, as a watch event would. */
  put(obj: T): void {
    this.objects.set(MemoryInformer.key(obj), obj);
    for (const h of this.handlers) h(obj);
  }

  remove(name: string, namespace?: string): void {
    const obj = this.get(name, namespace);
    if (!obj) return;
    this.objects.delete(`${namespace ?? ''}/${name}`);
    for (const h of this.handlers) h(obj);
  }
}
