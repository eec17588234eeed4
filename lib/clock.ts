// Time as the code that waits sees it, so that tests can move it on their own (test-support/fake-clock.ts) instead of
// waiting for real time to pass.
export interface Clock {
  /** Milliseconds since the epoch. */
  now(): number;
  /**
   * Calls `fire` after `ms`. The timer keeps the process alive only with `keepAlive` (default: false): for a wait
   * that is all a process has left to do, such as an agent's pause before it dials again.
   */
  setTimeout(fire: () => void, ms: number, options?: { keepAlive?: boolean }): unknown;
  clearTimeout(timer: unknown): void;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  setTimeout: (fire, ms, options) => {
    const timer = setTimeout(fire, ms);
    return options?.keepAlive ? timer : timer.unref();
  },
  clearTimeout: (timer) => clearTimeout(timer as NodeJS.Timeout),
};
