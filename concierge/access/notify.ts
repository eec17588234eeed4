// Word of each change to an AccessRequest: an audit.k8s.io/v1 event through the concierge's audit backend, and a POST
// of `{type, object}` to the optional access webhook (a kubeconfig-format file, as the audit webhook's). Neither may
// slow or fail the request that made the change: the event is handed to the backend and the POST to a bounded queue
// of its own, and what fails is logged.
import { randomUUID } from 'node:crypto';
import type { AccessRequest } from '../../apis/access.ts';
import { Resource, VERSION, type ApiGroups } from '../../apis/groups.ts';
import type { Logger } from '../../lib/log.ts';
import { ANNOTATIONS, microTime, type Auditor } from '../audit/audit.ts';
import type { WebhookClient } from '../audit/sinks.ts';
import { AUDIT_API_VERSION, type AuditEvent } from '../audit/types.ts';

export type AccessChange = 'created' | 'approved' | 'denied' | 'withdrawn' | 'expired' | 'deleted';

/** The annotation of an access request's audit event that names the change. */
export const ACCESS_CHANGE_ANNOTATION = 'sealion.dev/access-request-change';
/** Who an event names for the changes Sealion makes by itself (expiry) or only observes (a delete). */
export const SEALION_ACTOR = 'system:sealion:access-requests';
/**
 * Webhook bodies waiting at once. Changes are a person's pace, and a POST is retried for a few seconds at most; a
 * receiver that is down for long loses what comes past this (counted in the log) rather than hold memory.
 */
export const MAX_QUEUED_NOTIFICATIONS = 1000;

export type AccessNotifier = (
  change: AccessChange,
  request: AccessRequest,
  by?: { username: string; groups?: readonly string[]; uid?: string },
) => void;

export interface AccessNotifierOptions {
  groups: ApiGroups;
  replica: string;
  auditor?: Auditor;
  webhook?: WebhookClient;
  log: Logger;
  /** Default: Date.now. */
  now?: () => number;
}

const VERBS: Record<AccessChange, string> = {
  created: 'create',
  approved: 'update',
  denied: 'update',
  withdrawn: 'update',
  expired: 'update',
  deleted: 'delete',
};

export function newAccessNotifier(opts: AccessNotifierOptions): AccessNotifier & { close(): Promise<void> } {
  const { log } = opts;
  const now = opts.now ?? Date.now;
  const collection = `/apis/${opts.groups.access}/${VERSION}/${Resource.AccessRequest}`;
  const queue: string[] = [];
  let sending: Promise<void> | undefined;
  let dropped = 0;

  const drain = async (webhook: WebhookClient): Promise<void> => {
    for (let body = queue.shift(); body !== undefined; body = queue.shift())
      await webhook.send(body, { 'content-type': 'application/json' }).catch((err: unknown) => {
        log.warn(
          { err: (err as Error).message, where: webhook.where },
          'access webhook did not take a change',
        );
      });
    sending = undefined;
  };

  const post = (change: AccessChange, request: AccessRequest): void => {
    const webhook = opts.webhook;
    if (!webhook) return;
    if (queue.length >= MAX_QUEUED_NOTIFICATIONS) {
      if (dropped++ % 100 === 0)
        log.warn({ dropped, where: webhook.where }, 'access webhook queue full; changes dropped');
      return;
    }
    queue.push(JSON.stringify({ type: change, object: request }));
    sending ??= drain(webhook);
  };

  const audit = (change: AccessChange, request: AccessRequest, by: Parameters<AccessNotifier>[2]): void => {
    if (!opts.auditor) return;
    const at = microTime(now());
    const name = request.metadata.name ?? '';
    const event: AuditEvent = {
      kind: 'Event',
      apiVersion: AUDIT_API_VERSION,
      level: 'Metadata',
      auditID: randomUUID(),
      stage: 'ResponseComplete',
      requestURI: `${collection}/${name}`,
      verb: VERBS[change],
      user: by
        ? {
            username: by.username,
            ...(by.uid ? { uid: by.uid } : {}),
            ...(by.groups ? { groups: [...by.groups] } : {}),
          }
        : { username: SEALION_ACTOR },
      objectRef: {
        resource: Resource.AccessRequest,
        name,
        apiGroup: opts.groups.access,
        apiVersion: VERSION,
        ...(request.metadata.uid ? { uid: request.metadata.uid } : {}),
        ...(change === 'created' || change === 'deleted' ? {} : { subresource: 'status' }),
      },
      responseStatus: { metadata: {}, code: change === 'created' ? 201 : 200 },
      requestReceivedTimestamp: at,
      stageTimestamp: at,
      annotations: {
        [ANNOTATIONS.replica]: opts.replica,
        [ACCESS_CHANGE_ANNOTATION]: change,
        ...(request.spec?.reason ? { [ANNOTATIONS.reason]: request.spec.reason } : {}),
      },
    };
    opts.auditor.backend.emit(event).catch((err: unknown) => {
      log.warn({ err: (err as Error).message, name, change }, 'access request change not audited');
    });
  };

  const notify: AccessNotifier = (change, request, by) => {
    log.info({ name: request.metadata.name, change }, 'access request changed');
    audit(change, request, by);
    post(change, request);
  };
  return Object.assign(notify, {
    async close() {
      // The POST under way is aborted, not waited for: a stop does not wait out a receiver's retries.
      queue.length = 0;
      await opts.webhook?.close();
      await sending;
    },
  });
}
