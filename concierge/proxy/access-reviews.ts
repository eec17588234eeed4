// The authorization questions the proxy asks about a request, each of the cluster the request is for: the hub's API
// server for the hub's own requests, and for `/clusters/<name>/…` that cluster's, through its agent (here or on the
// replica holding its tunnel). Never the hub's about another cluster: each cluster's RBAC decides for that cluster.
//
// Answers are cached per cluster and question, so a script that runs `kubectl --as` in a loop costs a review per
// question every few seconds, not per request: an allowed answer for ALLOWED_TTL_MS (as long as the API server keeps
// a successful impersonation), a refusal for REFUSED_TTL_MS (so a grant applies soon). Questions asked while the same
// one is on its way wait for its answer instead of asking again.
import { createHash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import {
  reviewAllowed,
  selfSubjectAccessReview,
  subjectAccessReview,
  type AccessQuestion,
} from '../../lib/kube/access-review.ts';
import { SealionError } from '../../lib/errors.ts';
import { statusMessageOf } from '../../lib/kube/status.ts';
import { CallFailed } from '../../lib/http2/forward.ts';
import type { Ask } from './decide-impersonation.ts';
import type { Route } from './route.ts';

/** How long an allowed answer is used: the API server keeps a successful impersonation as long. */
export const ALLOWED_TTL_MS = 10_000;
/** How long a refusal is used: short, so that a permission just granted applies within seconds. */
export const REFUSED_TTL_MS = 2_000;
/**
 * Answers kept, all clusters and callers together. Each is a key of a few hundred bytes; 10,000 of them is a few
 * MiB at most (keys are hashes), and a caller that asks new questions without end only pushes out older answers.
 */
export const MAX_CACHED_ANSWERS = 10_000;

const REVIEW_PATH = '/apis/authorization.k8s.io/v1/subjectaccessreviews';
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

const SELF_REVIEW_PATH = '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews';

/**
 * Asks a cluster's API server along its route, with the forwarding identity's credential (the agent's, for a
 * cluster reached through one), on behalf of `user`: whether the question's subject may (a SubjectAccessReview), or
 * with `self`, whether the forwarding identity itself may (a SelfSubjectAccessReview; the subject is ignored).
 */
export function askThrough(cluster: string, route: Route, user: string, self = false): Ask {
  const path = self ? SELF_REVIEW_PATH : REVIEW_PATH;
  const kind = self ? 'SelfSubjectAccessReview' : 'SubjectAccessReview';
  const where = cluster ? 'its API server' : 'the API server';
  return async (question) => {
    let answer;
    try {
      const review = self ? selfSubjectAccessReview(question) : subjectAccessReview(question);
      answer = await route.call({
        method: 'POST',
        path,
        body: Buffer.from(JSON.stringify(review)),
        user,
      });
    } catch (err) {
      if (err instanceof CallFailed && err.status !== undefined)
        throw new ReviewUnavailable(err.message, err);
      throw new ReviewUnavailable(`${where} could not be asked: ${(err as Error).message}`, err);
    }
    if (answer.status !== 201 && answer.status !== 200)
      throw new ReviewUnavailable(
        `${where} answered a ${kind} with HTTP ${answer.status}: ${statusMessage(answer.body)}`,
      );
    try {
      return reviewAllowed(JSON.parse(answer.body.toString('utf8')));
    } catch (err) {
      throw new ReviewUnavailable(`${where} answered a ${kind} with malformed JSON`, err);
    }
  };
}

/** The message of a Status answer, short and printable, for a refusal that explains itself. */
const statusMessage = (body: Buffer): string =>
  (statusMessageOf(body.toString('utf8')) ?? '').replace(/[^\x20-\x7e]/g, '').slice(0, 300) || 'no message';

/** Answers kept per cluster and question. */
export interface ReviewCache {
  /** `ask`, through the cache: `cluster` names whose answers these are. */
  asking(cluster: string, ask: Ask): Ask;
}

export function newReviewCache(
  opts: { allowedTtlMs?: number; refusedTtlMs?: number; max?: number } = {},
): ReviewCache {
  const allowedTtl = opts.allowedTtlMs ?? ALLOWED_TTL_MS;
  const refusedTtl = opts.refusedTtlMs ?? REFUSED_TTL_MS;
  const cache = new LRUCache<string, boolean, { question: AccessQuestion; ask: Ask }>({
    max: opts.max ?? MAX_CACHED_ANSWERS,
    ttl: allowedTtl,
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
