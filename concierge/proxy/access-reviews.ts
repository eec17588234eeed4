// The authorization questions the proxy asks about a request, each of the cluster the request is for: the hub's API
// server for the hub's own requests, and for `/clusters/<name>/…` that cluster's, through its agent (here or on the
// replica holding its tunnel). Never the hub's about another cluster: each cluster's RBAC decides for that cluster.
// Their answers are kept per cluster and question (lib/kube/review-cache.ts).
import { reviewAllowed, selfSubjectAccessReview, subjectAccessReview } from '../../lib/kube/access-review.ts';
import { statusMessageOf } from '../../lib/kube/status.ts';
import { CallFailed } from '../../lib/http2/forward.ts';
import type { Ask } from '../../lib/kube/impersonation.ts';
import { ReviewUnavailable } from '../../lib/kube/review-cache.ts';
import type { Route } from './route.ts';

const REVIEW_PATH = '/apis/authorization.k8s.io/v1/subjectaccessreviews';
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
