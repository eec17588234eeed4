// Remembers authentication answers briefly, keyed by the token's SHA-256 (never the token): separate lifetimes
// for yes and no, a bound on entries, and one call shared by concurrent lookups of the same token. Calls to the
// authenticator are bounded too (a ConcurrencyLimit): every distinct token the cache has not seen is a call, and
// distinct junk tokens cost nothing to make. Answers marked transient (the authenticator could not be asked, or
// was not asked because too many calls were under way) are not remembered.
import { createHash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { ConcurrencyLimit, type ConcurrencyLimitOptions } from './concurrency-limit.ts';
import { fail, oversized, type AuthResult, type TokenAuthenticator } from './types.ts';

export interface AnswerCacheOptions {
  successTTLms: number;
  failureTTLms: number;
  entries: number;
  /**
   * Calls to the authenticator at once, and calls waiting for one; past both, a lookup fails at once. A
   * ConcurrencyLimit given here is shared with whoever else holds it (one bound on several caches' calls).
   */
  limit: ConcurrencyLimitOptions | ConcurrencyLimit;
}

/** An AuthResult that says the authenticator could not be asked (not cached). */
export function transientFailure(reason: string): AuthResult & { transient: true } {
  return { ...fail(reason), transient: true };
}

export class AnswerCache implements TokenAuthenticator {
  private readonly cache: LRUCache<string, AuthResult>;
  private readonly inflight = new Map<string, Promise<AuthResult>>();
  private readonly ask: (token: string) => Promise<AuthResult>;
  private readonly opts: AnswerCacheOptions;
  /** Bounds calls to `ask`; lookups of a token already being asked about share its call and take no slot. */
  readonly limit: ConcurrencyLimit;

  constructor(ask: (token: string) => Promise<AuthResult>, opts: AnswerCacheOptions) {
    this.ask = ask;
    this.opts = opts;
    // ttlResolution 0: the age is read at each lookup, where lru-cache would arm a timer to forget a time it read.
    this.cache = new LRUCache({ max: opts.entries, ttlResolution: 0 });
    this.limit = opts.limit instanceof ConcurrencyLimit ? opts.limit : new ConcurrencyLimit(opts.limit);
  }

  /**
   * How long `result` is remembered (0: not at all): a transient one never; a success no longer than its
   * `reusableUntil` (the token's own expiry), so a cached yes never outlives the token it is about.
   */
  private ttlOf(result: AuthResult): number {
    if ('transient' in result) return 0;
    if (!result.ok) return this.opts.failureTTLms;
    if (result.reusableUntil === undefined) return this.opts.successTTLms;
    return Math.min(this.opts.successTTLms, Math.floor(result.reusableUntil - Date.now()));
  }

  authenticate(token: string): Promise<AuthResult> {
    const tooLarge = oversized(token);
    if (tooLarge) return Promise.resolve(tooLarge);
    const key = createHash('sha256').update(token).digest('base64url');
    const cached = this.cache.get(key);
    if (cached) return Promise.resolve(cached);
    let pending = this.inflight.get(key);
    if (!pending) {
      const call = this.limit.run(() => this.ask(token));
      if (!call) {
        return Promise.resolve(
          transientFailure(
            `not asked: ${this.limit.inFlight} calls in flight and ${this.limit.waiting} waiting`,
          ),
        );
      }
      pending = call
        .then(
          (result) => {
            const ttl = this.ttlOf(result);
            if (ttl > 0) this.cache.set(key, result, { ttl });
            return result;
          },
          // An authenticator that throws instead of answering has not answered.
          (err: unknown) => transientFailure(`authenticator failed: ${(err as Error).message}`),
        )
        .finally(() => this.inflight.delete(key));
      this.inflight.set(key, pending);
    }
    return pending;
  }
}
