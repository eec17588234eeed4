// An audit event for tests: every field a leak into a log would show, numbered so batches can be told apart.
import { AUDIT_API_VERSION, type AuditEvent } from './types.ts';

export function sampleEvent(i: number, overrides: Partial<AuditEvent> = {}): AuditEvent {
  return {
    kind: 'Event',
    apiVersion: AUDIT_API_VERSION,
    level: 'Metadata',
    auditID: `audit-id-${i}`,
    stage: 'ResponseComplete',
    requestURI: `/api/v1/namespaces/secret-ns/secrets/s${i}`,
    verb: 'get',
    user: { username: 'alice@example.com', groups: ['dev'] },
    sourceIPs: ['192.0.2.7'],
    responseStatus: { metadata: {}, code: 200 },
    requestReceivedTimestamp: '2025-01-02T03:04:05.000000Z',
    stageTimestamp: '2025-01-02T03:04:05.100000Z',
    ...overrides,
  };
}
