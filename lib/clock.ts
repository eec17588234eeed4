// Time as the code that waits sees it, so that tests can move it on their own (lib/fake-clock.ts) instead of
// waiting for real time to pass.
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /** Calls `fire` after `ms`; the timer never keeps the process alive. */
  setTimeout(fire: () => void, ms: number): unknown;
  clearTimeout(timer: unknown): void;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fire, ms) => setTimeout(fire, ms).unref(),
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout),
};
