// A Clock (lib/clock.ts) for tests: timers fire only when the test advances time, in the order they are due.
import type { Clock } from '../lib/clock.ts';

export interface FakeClock extends Clock {
  advance(ms: number): void;
  /** The delays of the timers armed now. */
  pending(): number[];
}

export function fakeClock(): FakeClock {
  let now = 0;
  let next = 0;
  const timers = new Map<number, { at: number; ms: number; fire: () => void }>();
  return {
    now: () => now,
    setTimeout(fire, ms) {
      timers.set(++next, { at: now + ms, ms, fire });
      return next;
    },
    clearTimeout: (id) => void timers.delete(id as number),
    advance(ms) {
      now += ms;
      const due = [...timers].filter(([, t]) => t.at <= now).sort((x, y) => x[1].at - y[1].at || x[0] - y[0]);
      for (const [id, t] of due) if (timers.delete(id)) t.fire();
    },
    pending: () => [...timers.values()].map((t) => t.ms),
  };
}
