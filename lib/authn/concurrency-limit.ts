// A bound on concurrent calls to one upstream (a TokenReview webhook, the API server's TokenReview API), with a
// short first-come-first-served wait line. Past both, a call is refused at once instead of queued: a flood of
// distinct junk tokens then costs the upstream at most `inFlight` calls at a time and the concierge a bounded
// amount of memory, and callers learn immediately that the answer is "not now".

export interface ConcurrencyLimitOptions {
  /** Calls running at once. At least 1. */
  inFlight: number;
  /** Calls waiting for a running one to end. 0: none wait. */
  waiting: number;
}

export class ConcurrencyLimit {
  private readonly opts: ConcurrencyLimitOptions;
  /** Invariant: running <= opts.inFlight, and waiters is empty unless running === opts.inFlight. */
  private running = 0;
  /** Invariant: waiters.length <= opts.waiting. Each entry starts one waiting call in the slot just freed. */
  private readonly waiters: (() => void)[] = [];

  constructor(opts: ConcurrencyLimitOptions) {
    if (!(Number.isInteger(opts.inFlight) && opts.inFlight >= 1))
      throw new RangeError(`inFlight must be a positive integer, not ${opts.inFlight}`);
    if (!(Number.isInteger(opts.waiting) && opts.waiting >= 0))
      throw new RangeError(`waiting must be a non-negative integer, not ${opts.waiting}`);
    this.opts = { ...opts };
  }

  /** Calls running now. */
  get inFlight(): number {
    return this.running;
  }

  /** Calls waiting for a slot now. */
  get waiting(): number {
    return this.waiters.length;
  }

  /**
   * Runs `call` now, or once a slot frees; undefined (and `call` never runs) when every slot is taken and the wait
   * line is full.
   */
  run<T>(call: () => Promise<T>): Promise<T> | undefined {
    if (this.running < this.opts.inFlight) {
      this.running++;
      return this.execute(call);
    }
    if (this.waiters.length >= this.opts.waiting) return undefined;
    return new Promise<void>((start) => this.waiters.push(start)).then(() => this.execute(call));
  }

  private async execute<T>(call: () => Promise<T>): Promise<T> {
    try {
      return await call();
    } finally {
      // The slot passes straight to the first waiter, so a newcomer can never overtake the line.
      const next = this.waiters.shift();
      if (next) next();
      else this.running--;
    }
  }
}
