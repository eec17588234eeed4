// Work that runs on a schedule rather than on a change (a key set's refresh, a file poll, a credential's renewal, a
// sweep of what expired): a controller of one key whose sync does the work and asks to run again later. The manager
// then owns it as it owns every controller: it starts once the caches have synced, a failure is retried with the
// queue's backoff, it stops with the process, and its time is the manager's clock, which tests move by hand.
import type { Controller } from './controller.ts';

/** The one key of a periodic controller. */
export const PERIODIC_KEY = 'periodic';

/**
 * A controller that calls `work` at start and then every `everyMs`. `work` may return another delay for its next
 * run (a credential renewed when it is two-thirds through its life); a throw is retried with backoff instead.
 * `manager.enqueue(name, PERIODIC_KEY)` runs it now, for a change that cannot wait for the next turn.
 */
export function periodic(
  name: string,
  everyMs: number,
  work: (signal: AbortSignal) => Promise<number | void>,
): Controller {
  return {
    name,
    watches: [],
    initialKeys: [PERIODIC_KEY],
    async sync(_key, signal) {
      const next = await work(signal);
      return { requeueAfterMs: Math.max(0, next ?? everyMs) };
    },
  };
}
