import { describe, expect, it } from '@jest/globals';
import { requestAttributes } from '../proxy/request-info.ts';
import { microTime, newAuditor, withoutCredentials } from './audit.ts';
import type { AuditBackend } from './backend.ts';
import { loadPolicy } from './policy.ts';
import type { AuditEvent } from './types.ts';

const POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: None
    nonResourceURLs: [/healthz]
  - level: RequestResponse
    resources: [{group: authentication.k8s.io}]
  - level: Metadata
    omitStages: [ResponseStarted]
    verbs: [watch]
  - level: Request
`;

function collecting(): AuditBackend & { events: AuditEvent[] } {
  const events: AuditEvent[] = [];
  return {
    events,
    mode: 'batch',
    emit(event) {
      events.push(event);
      return Promise.resolve();
    },
    close: () => Promise.resolve(),
  };
}

const facts = (method: string, url: string) => ({
  auditID: '5f0c3f8e-2f7b-4a8e-9a1b-0c2d3e4f5a6b',
  requestURI: url,
  attributes: requestAttributes(method, url),
  sourceIP: '10.1.2.3',
  userAgent: 'kubectl/v1.36.3',
  receivedMs: Date.UTC(2026, 10, 26, 8, 0, 0) + 0.123456,
});
const alice = { username: 'alice', groups: ['devs'], extra: { 'example.com/team': ['blue'] } };

describe('audit events', () => {
  it('writes each stage the policy keeps, with the request and its answer', async () => {
    const backend = collecting();
    let now = Date.UTC(2026, 10, 26, 8, 0, 1);
    const auditor = newAuditor({ policy: loadPolicy(POLICY), backend, replica: 'r1', now: () => now });
    const audit = auditor.begin(facts('POST', '/api/v1/namespaces/a/configmaps'), alice, {
      'sealion.dev/cluster': 'edge',
    })!;
    expect(audit.level).toBe('Request');
    await audit.received();
    audit.impersonating({ username: 'bob', groups: [], extra: {} });
    audit.requestObject({ kind: 'ConfigMap', data: { k: 'v' } });
    audit.answered({
      kind: 'Status',
      status: 'Failure',
      message: 'exists',
      reason: 'AlreadyExists',
      code: 409,
    });
    now += 2.5;
    audit.complete(409);
    audit.complete(409);
    expect(backend.events.map((e) => e.stage)).toEqual(['RequestReceived', 'ResponseComplete']);
    const [received, complete] = backend.events as [AuditEvent, AuditEvent];
    expect(received.requestObject).toBeUndefined();
    expect(received.impersonatedUser).toBeUndefined();
    expect(complete).toMatchObject({
      apiVersion: 'audit.k8s.io/v1',
      kind: 'Event',
      level: 'Request',
      auditID: '5f0c3f8e-2f7b-4a8e-9a1b-0c2d3e4f5a6b',
      verb: 'create',
      user: { username: 'alice', groups: ['devs', 'system:authenticated'], extra: alice.extra },
      impersonatedUser: { username: 'bob', groups: ['system:authenticated'] },
      sourceIPs: ['10.1.2.3'],
      userAgent: 'kubectl/v1.36.3',
      objectRef: { resource: 'configmaps', namespace: 'a', apiVersion: 'v1' },
      responseStatus: {
        metadata: {},
        status: 'Failure',
        message: 'exists',
        reason: 'AlreadyExists',
        code: 409,
      },
      requestObject: { kind: 'ConfigMap', data: { k: 'v' } },
      requestReceivedTimestamp: '2026-11-26T08:00:00.000123Z',
      stageTimestamp: '2026-11-26T08:00:01.002500Z',
      annotations: { 'sealion.dev/cluster': 'edge', 'sealion.dev/replica': 'r1' },
    });
    // The answer's object is kept at RequestResponse only.
    expect(complete.responseObject).toBeUndefined();
  });

  it('writes a watch as it starts and as it ends, as the policy says', () => {
    const backend = collecting();
    const auditor = newAuditor({ policy: loadPolicy(POLICY), backend, replica: 'r1' });
    const watch = auditor.begin(facts('GET', '/api/v1/pods?watch=1'), alice)!;
    watch.responseStarted(200);
    watch.complete(200);
    expect(backend.events.map((e) => e.stage)).toEqual(['ResponseComplete']);
    const exec = auditor.begin(facts('POST', '/api/v1/namespaces/a/pods/p/exec'), alice)!;
    exec.responseStarted(101);
    exec.complete(101);
    expect(backend.events.slice(1).map((e) => e.stage)).toEqual(['ResponseStarted', 'ResponseComplete']);
  });

  it('audits nothing the policy leaves out, and a stranger as nobody', () => {
    const backend = collecting();
    const auditor = newAuditor({ policy: loadPolicy(POLICY), backend, replica: 'r1' });
    expect(auditor.begin(facts('GET', '/healthz'), undefined)).toBeUndefined();
    const refused = auditor.begin(facts('GET', '/api'), undefined)!;
    refused.complete(401, 'Unauthorized');
    expect(backend.events[0]).toMatchObject({
      user: {},
      responseStatus: { status: 'Failure', message: 'Unauthorized', reason: 'Unauthorized', code: 401 },
    });
  });

  it('never keeps a credential a body carries, whatever the level', () => {
    const backend = collecting();
    const auditor = newAuditor({ policy: loadPolicy(POLICY), backend, replica: 'r1' });
    const review = auditor.begin(facts('POST', '/apis/authentication.k8s.io/v1/tokenreviews'), alice)!;
    expect(review.level).toBe('RequestResponse');
    review.requestObject({ kind: 'TokenReview', spec: { token: 'secret-token' } });
    review.answered({ kind: 'TokenReview', status: { authenticated: true, token: 'x' } });
    review.complete(201);
    const text = JSON.stringify(backend.events);
    expect(text).not.toContain('secret-token');
    expect(
      withoutCredentials({
        kind: 'TokenCredentialRequest',
        status: { credential: { clientKeyData: 'KEY' } },
      }),
    ).toEqual({ kind: 'TokenCredentialRequest', status: { credential: { clientKeyData: '[redacted]' } } });
  });

  it('formats times as the API server does, with microseconds', () => {
    expect(microTime(Date.UTC(2026, 0, 2, 3, 4, 5, 6) + 0.789)).toBe('2026-01-02T03:04:05.006789Z');
  });
});
