// Word of access request changes: one audit event each, and the webhook's POSTs in order from a bounded queue that
// a stalled receiver never lets hold up the change.
import { describe, expect, it } from '@jest/globals';
import type { AccessRequest } from '../../apis/access.ts';
import { apiGroups } from '../../apis/groups.ts';
import { silentLogger } from '../../lib/log.ts';
import type { Auditor } from '../audit/audit.ts';
import type { WebhookClient } from '../audit/sinks.ts';
import type { AuditEvent } from '../audit/types.ts';
import {
  ACCESS_CHANGE_ANNOTATION,
  MAX_QUEUED_NOTIFICATIONS,
  newAccessNotifier,
  SEALION_ACTOR,
} from './notify.ts';

const groups = apiGroups('sealion.dev');
const request = {
  apiVersion: `${groups.access}/v1alpha1`,
  kind: 'AccessRequest',
  metadata: { name: 'r1', uid: 'u-1' },
  spec: {
    clusters: ['edge'],
    groups: ['edge-admins'],
    durationSeconds: 600,
    reason: 'INC-9',
    requester: { username: 'alice' },
  },
} as AccessRequest;

function stalledWebhook() {
  const sent: string[] = [];
  const releases: (() => void)[] = [];
  const webhook: WebhookClient = {
    where: 'webhook test',
    send(body) {
      sent.push(body.toString());
      return new Promise<void>((done) => releases.push(done));
    },
    close: () => Promise.resolve(),
  };
  return { webhook, sent, releases };
}

describe('the access notifier', () => {
  it('writes one audit event per change, naming who changed it and the change', () => {
    const events: AuditEvent[] = [];
    const auditor = {
      backend: {
        mode: 'batch',
        emit: (e: AuditEvent) => (events.push(e), Promise.resolve()),
        close: () => Promise.resolve(),
      },
      begin: () => undefined,
    } as unknown as Auditor;
    const notify = newAccessNotifier({ groups, replica: 'r-a', auditor, log: silentLogger(), now: () => 0 });
    notify('approved', request, { username: 'bob', groups: ['sre'] });
    notify('expired', request);
    expect(
      events.map((e) => [
        e.verb,
        e.user.username,
        e.objectRef?.subresource,
        e.annotations?.[ACCESS_CHANGE_ANNOTATION],
      ]),
    ).toEqual([
      ['update', 'bob', 'status', 'approved'],
      ['update', SEALION_ACTOR, 'status', 'expired'],
    ]);
    expect(events[0]).toMatchObject({
      apiVersion: 'audit.k8s.io/v1',
      stage: 'ResponseComplete',
      requestURI: `/apis/${groups.access}/v1alpha1/accessrequests/r1`,
      objectRef: { resource: 'accessrequests', name: 'r1', apiGroup: groups.access, uid: 'u-1' },
      annotations: { 'sealion.dev/replica': 'r-a', 'sealion.dev/reason': 'INC-9' },
    });
  });

  it('posts {type, object} in order, one at a time, and drops past its bound while the receiver stalls', async () => {
    const { webhook, sent, releases } = stalledWebhook();
    const notify = newAccessNotifier({ groups, replica: 'r-a', webhook, log: silentLogger() });
    // The change returns at once, whatever the receiver does.
    for (let i = 0; i < MAX_QUEUED_NOTIFICATIONS + 10; i++) notify('created', request);
    expect(sent).toHaveLength(1);
    expect(JSON.parse(sent[0]!)).toEqual({ type: 'created', object: request });
    let delivered = 1;
    while (releases.length > 0) {
      releases.shift()!();
      await new Promise((done) => setImmediate(done));
      delivered = sent.length;
    }
    // The first was under way; the queue held MAX_QUEUED_NOTIFICATIONS more.
    expect(delivered).toBe(MAX_QUEUED_NOTIFICATIONS + 1);
    await notify.close();
  });
});
