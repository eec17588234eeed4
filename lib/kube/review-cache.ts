// Answers to authorization questions, kept per cluster (or caller) and question, so a script that runs `kubectl --as`
// in a loop costs a review per question every few seconds, not per request: an allowed answer for ALLOWED_TTL_MS (as
// long as the API server keeps a successful impersonation), a refusal for REFUSED_TTL_MS (so a grant applies soon).
// Questions asked while the same one is on its way wait for its answer instead of asking again.
import { createHash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { SealionError } from '../errors.ts';
import { CallFailed } from '../http2/forward.ts';
import type { AccessQuestion } from './access-review.ts';
import type { Ask } from './impersonation.ts';
import type { Clock } from '../clock.ts';

/** How long an allowed answer is used: the API server keeps a successful impersonation as long. */
export const ALLOWED_TTL_MS = 10_000;
/** How long a refusal is used: short, so that a permission just granted applies within seconds. */
export const REFUSED_TTL_MS = 2_000;
/**
 * Answers kept, all clusters and callers together. Each is a key of a few hundred bytes; 10,000 of them is a few
 * MiB at most (keys are hashes), and a caller that asks new questions without end only pushes out older answers.
 */
export const MAX_CACHED_ANSWERS = 10_000;

/** Keys up to this long are kept as they are; longer ones as their sha256. */
const MAX_PLAIN_KEY = 512;

/** A question could not be answered: the request fails with 503 and Retry-After, never on another's say. */
export class ReviewUnavailable extends SealionError {
  /** The status to answer with: 503, or what refused the review (a user over their share of a tunnel: 429). */
  readonly status: number;

  constructor(message: string, cause?: unknown) {
    super('SEALION_REVIEW_UNAVAILABLE', message, { cause });
    this.status = cause instanceof CallFailed && cause.status !== undefined ? cause.status : 503;
  }
}

/** Answers kept per cluster and question. */
export interface ReviewCache {
  /** `ask`, through the cache: `cluster` names whose answers these are. */
  asking(cluster: string, ask: Ask): Ask;
}

export function newReviewCache(
  opts: {
    allowedTtlMs?: number;
    refusedTtlMs?: number;
    max?: number;
    /**
     * The time answers age by. Default: lru-cache's own, the monotonic performance.now(). lru-cache reads a start of 0
     * as "no time to live", so a clock given here must be past 0 when answers are kept (a fake clock is moved on first).
     */
    clock?: Pick<Clock, 'now'>;
  } = {},
): ReviewCache {
  const allowedTtl = opts.allowedTtlMs ?? ALLOWED_TTL_MS;
  const refusedTtl = opts.refusedTtlMs ?? REFUSED_TTL_MS;
  const { clock } = opts;
  const cache = new LRUCache<string, boolean, { question: AccessQuestion; ask: Ask }>({
    max: opts.max ?? MAX_CACHED_ANSWERS,
    ttl: allowedTtl,
    // lru-cache keeps a time it read for ttlResolution ms of real time, arming a timer to forget it: a timer per
    // lookup at one request at a time. Reading the clock at each lookup costs less, and a test that moves a clock of
    // its own sees its time at once.
    ttlResolution: 0,
    ...(clock ? { perf: { now: () => clock.now() } } : {}),
    // Answers are never used past their time, and never refreshed in the background.
    allowStale: false,
    async fetchMethod(_key, _stale, { options, context }) {
      const allowed = await context.ask(context.question);
      if (!allowed) options.ttl = refusedTtl;
      return allowed;
    },
  });
  return {
    asking(cluster, ask) {
      return async (question) => {
        // A long key is hashed: a question holds strings a caller chose (a name in a path, a user to impersonate), and
        // 10,000 keys of tens of kilobytes each would be hundreds of MiB. Most keys are short, and every request asks
        // at least one question (its forwarding policy), so those skip the hash. A hash never starts with `[`, as a
        // key kept as it is does.
        const json = JSON.stringify([cluster, question]);
        const key = json.length <= MAX_PLAIN_KEY ? json : createHash('sha256').update(json).digest('base64');
        // An answer kept is read at once; only a question not asked yet (or asked and still under way) waits.
        const kept = cache.get(key);
        if (kept !== undefined) return kept;
        const answer = await cache.fetch(key, { context: { question, ask } });
        return answer === true;
      };
    },
  };
}
