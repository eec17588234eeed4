// Remembers authentication answers briefly, keyed by the token's SHA-256 (never the token): separate lifetimes
// for yes and no, a bound on entries, and one call shared by concurrent lookups of the same token. Answers
// marked transient (the authenticator could not be asked) are not remembered.
import { createHash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { fail, MAX_TOKEN_BYTES, type AuthResult, type TokenAuthenticator } from './types.ts';

export interface AnswerCacheOptions {
  successTTLms: number;
  failureTTLms: number;
  entries: number;
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

  constructor(ask: (token: string) => Promise<AuthResult>, opts: AnswerCacheOptions) {
    this.ask = ask;
    this.opts = opts;
    this.cache = new LRUCache({ max: opts.entries });
  }

  authenticate(token: string): Promise<AuthResult> {
    if (token.length > MAX_TOKEN_BYTES)
      return Promise.resolve(fail(`token of ${token.length} bytes is over the limit`));
    const key = createHash('sha256').update(token).digest('base64url');
    const cached = this.cache.get(key);
    if (cached) return Promise.resolve(cached);
    let pending = this.inflight.get(key);
    if (!pending) {
      pending = this.ask(token).then((result) => {
        this.inflight.delete(key);
        if (!('transient' in result)) {
          this.cache.set(key, result, { ttl: result.ok ? this.opts.successTTLms : this.opts.failureTTLms });
        }
        return result;
      });
      this.inflight.set(key, pending);
    }
    return pending;
  }
}
