// On the leader: an AccessRequest whose grant or wait is over is written Expired, so that no status says Approved or
// Pending for long after the clock ended it (the grants themselves end by the clock on every replica, store.ts, not
// by this write). It also tells of deleted requests (each replica sees the delete; the leader alone tells it), and
// ends a request whose status was never written (its create's second write failed), which would otherwise count
// against its requester's pending bound for ever. A request that ended (Denied, Withdrawn, Expired) is deleted a day
// later, so that nothing a user does fills the hub's store and every replica's informer for ever.
import type { AccessRequest } from '../../apis/access.ts';
import type { Clock } from '../../lib/clock.ts';
import type { Controller } from '../../lib/controller/controller.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import type { Logger } from '../../lib/log.ts';
import { AccessWriteError, type AccessRequestClient } from './client.ts';
import type { AccessNotifier } from './notify.ts';
import { expired, timeOf } from './policy.ts';

/** How long a request may go without a status after its creation before it is ended. */
export const STATUSLESS_GRACE_MS = 60_000;
/**
 * How long an ended request (Denied, Withdrawn, Expired) is kept before it is deleted: a day for its requester and
 * reviewers to read how it ended (sealion request list), while what one user holds stays bounded
 * (MAX_REQUESTS_PER_USER). The audit log and the access webhook keep its story for longer.
 */
export const ENDED_RETENTION_MS = 86_400_000;

export interface AccessExpiryOptions {
  requests: Informer<AccessRequest>;
  /** A leader-only client (the manager's leaderOnly): a replica that does not lead writes nothing. */
  client: AccessRequestClient;
  notify: AccessNotifier;
  clock: Clock;
  log: Logger;
}

export function accessExpiryController(opts: AccessExpiryOptions): Controller {
  const { requests, client, clock } = opts;
  /** The requests this replica has synced while leading, so that a delete of one is told once. */
  const known = new Set<string>();
  /** The ended requests this controller deleted: their delete is housekeeping, not news to tell. */
  const collected = new Set<string>();
  return {
    name: 'access-request-expiry',
    watches: [{ informer: requests }],
    async sync(name) {
      const request = requests.get(name);
      if (!request) {
        if (collected.delete(name)) return void known.delete(name);
        if (known.delete(name))
          opts.notify('deleted', { metadata: { name }, spec: undefined } as unknown as AccessRequest);
        return;
      }
      known.add(name);
      const now = clock.now();
      const ended = endedAt(request);
      if (ended !== undefined) {
        if (now < ended + ENDED_RETENTION_MS) return { requeueAfterMs: ended + ENDED_RETENTION_MS - now };
        collected.add(name);
        try {
          await client.delete(name);
        } catch (err) {
          collected.delete(name);
          throw err;
        }
        return;
      }
      const next = request.status?.phase ? expired(request, now) : statusless(request, now);
      if (next === undefined) return untilEnd(request, now);
      try {
        const stored = await client.replaceStatus(request, next);
        opts.notify('expired', stored);
        return;
      } catch (err) {
        // Changed meanwhile (decided, withdrawn): the informer brings the new version, and its sync looks again.
        if (err instanceof AccessWriteError && (err.code === 409 || err.code === 404)) return;
        throw err;
      }
    },
  };
}

/**
 * When an ended request ended (in ms since the epoch): a decision's time (its last review), a lapse's or a grant's
 * expiresAt; its creation when neither is there (a status never written). Undefined while it is live.
 */
function endedAt(request: AccessRequest): number | undefined {
  const status = request.status;
  const phase = status?.phase;
  if (phase !== 'Denied' && phase !== 'Withdrawn' && phase !== 'Expired') return undefined;
  const decided = phase === 'Expired' ? undefined : status?.reviews?.at(-1)?.time;
  const at = timeOf(decided ?? status?.expiresAt);
  const ended = Number.isNaN(at) ? timeOf(request.metadata.creationTimestamp) : at;
  // No time at all (the API server always sets creationTimestamp): left alone rather than deleted early.
  return Number.isNaN(ended) ? undefined : ended;
}

/** The ended status of a request whose status was never written, once its grace is over. */
function statusless(request: AccessRequest, now: number) {
  const created = timeOf(request.metadata.creationTimestamp);
  if (!(now - created >= STATUSLESS_GRACE_MS)) return undefined;
  return {
    phase: 'Expired' as const,
    requester: request.spec.requester.username,
    message: 'its creation did not complete; ask again',
  };
}

/** When to look at a live request again: at its end (or its status grace), else never. */
function untilEnd(request: AccessRequest, now: number): { requeueAfterMs: number } | undefined {
  const phase = request.status?.phase;
  if (!phase) {
    const created = timeOf(request.metadata.creationTimestamp);
    return Number.isNaN(created) ? undefined : { requeueAfterMs: created + STATUSLESS_GRACE_MS - now };
  }
  if (phase !== 'Pending' && phase !== 'Approved') return undefined;
  const ends = timeOf(request.status?.expiresAt);
  return Number.isNaN(ends) ? undefined : { requeueAfterMs: Math.max(0, ends - now) };
}
