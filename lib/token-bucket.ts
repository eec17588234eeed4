// A token bucket: `burst` turns at once after a quiet spell, then `perSecond`. The tunnel listener refuses a
// registration when its buckets are empty (take); the work queue instead books a retry's turn ahead (reserve), as
// client-go's BucketRateLimiter does, so that many keys failing at once retry at the bucket's pace.

export class TokenBucket {
  /** Invariant: tokens <= burst, as of `at` (ms since the epoch); below 0 only when reserve() booked turns ahead. */
  private tokens: number;
  private at: number;
  private readonly burst: number;
  private readonly perSecond: number;
  private readonly now: () => number;

  constructor(burst: number, perSecond: number, now: () => number = Date.now) {
    this.burst = burst;
    this.perSecond = perSecond;
    this.now = now;
    this.tokens = burst;
    this.at = now();
  }

  /** The tokens there now (refilled up to the burst), without taking one. */
  available(): number {
    const t = this.now();
    this.tokens = Math.min(this.burst, this.tokens + (Math.max(0, t - this.at) / 1000) * this.perSecond);
    this.at = t;
    return this.tokens;
  }

  /** Takes a token. Call it after available() said there is one, or through reserve(). */
  take(): void {
    this.tokens -= 1;
  }

  /** Milliseconds until a token is there (0: now). */
  waitMs(): number {
    const missing = 1 - this.available();
    return missing <= 0 ? 0 : Math.ceil((missing / this.perSecond) * 1000);
  }

  /** Books the next turn, even one in the future: how many milliseconds from now it is (0: now). */
  reserve(): number {
    const wait = this.waitMs();
    this.take();
    return wait;
  }
}
