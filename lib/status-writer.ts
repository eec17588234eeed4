/** Writes part of an object's status (a JSON merge patch of the status subresource: fields not named are kept). */
export interface StatusWriter<S> {
  patchStatus(name: string, status: Partial<S>, namespace?: string): Promise<void>;
}

/**
 * A StatusWriter for statuses that change in bursts (every agent connecting at once after a restart): at most
 * `concurrency` writes in flight, and a write still waiting for its turn takes in any later one for the same object
 * (their fields merged, the later winning, as the API server would apply the two patches one after the other), so
 * that a burst costs the API server one write per object, not one per change, and never a request per change at
 * once. Each call resolves when the write that carries its fields is done.
 */
export function coalescingStatusWriter<S>(inner: StatusWriter<S>, concurrency: number): StatusWriter<S> {
  interface Pending {
    status: Partial<S>;
    namespace: string | undefined;
    waiters: { done: () => void; fail: (err: unknown) => void }[];
  }
  const pending = new Map<string, Pending>();
  let running = 0;
  const key = (name: string, namespace?: string): string => `${namespace ?? ''}/${name}`;

  const next = (): void => {
    while (running < concurrency && pending.size > 0) {
      const [id, write] = pending.entries().next().value!;
      pending.delete(id);
      running++;
      inner
        .patchStatus(id.slice(id.indexOf('/') + 1), write.status, write.namespace)
        .then(
          () => write.waiters.forEach((w) => w.done()),
          (err: unknown) => write.waiters.forEach((w) => w.fail(err)),
        )
        .finally(() => {
          running--;
          next();
        });
    }
  };

  return {
    patchStatus(name, status, namespace) {
      return new Promise((done, fail) => {
        const id = key(name, namespace);
        const waiting = pending.get(id);
        if (waiting) {
          waiting.status = { ...waiting.status, ...status };
          waiting.waiters.push({ done, fail });
        } else pending.set(id, { status, namespace, waiters: [{ done, fail }] });
        next();
      });
    },
  };
}

/** A StatusWriter that records writes, for controller tests. */
export class RecordingStatusWriter<S> implements StatusWriter<S> {
  readonly writes: { name: string; status: Partial<S> }[] = [];
  failNext: Error | undefined;

  patchStatus(name: string, status: Partial<S>): Promise<void> {
    if (this.failNext) {
      const err = this.failNext;
      this.failNext = undefined;
      return Promise.reject(err);
    }
    this.writes.push({ name, status });
    return Promise.resolve();
  }
}
