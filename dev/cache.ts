// Build caches that several builders share: tests in parallel workers, and parallel steps in one process.

import { randomBytes } from 'node:crypto';

const inFlight = new Map<string, Promise<unknown>>();

/**
 * Runs `make` for `key` once at a time in this process: callers that come while it runs share its result. A
 * failure is not remembered, so the next caller tries again.
 */
export function sharedBuild<T>(key: string, make: () => Promise<T>): Promise<T> {
  const running = inFlight.get(key) as Promise<T> | undefined;
  if (running) return running;
  const started = make().finally(() => inFlight.delete(key));
  inFlight.set(key, started);
  return started;
}

/** A name beside `path` that no other process or call writes: build there, then rename onto `path`. */
export function privatePath(path: string): string {
  return `${path}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
}
