import { describe, expect, it } from '@jest/globals';
import { requestAttributes } from '../../lib/kube/request-info.ts';
import { microTime, newAuditor, withoutCredentials } from './audit.ts';
import type { AuditBackend } from './backend.ts';
import { loadPolicy } from './policy.ts';
import type { AuditEvent } from './types.ts';
import { sampleEvent } from './sample-event.ts';

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
    audit.requestBody(JSON.stringify({ kind: 'ConfigMap', data: { k: 'v' } }));
    audit.answered(
      JSON.stringify({
        kind: 'Status',
        status: 'Failure',
        message: 'exists',
        reason: 'AlreadyExists',
        code: 409,
      }),
    );
    now += 2.5;
    audit.complete(409);
    audit.complete(409);
    expect(backend.events.map((e) => e.stage)).toEqual(['RequestReceived', 'ResponseComplete']);
    // As a sink writes them.
    const [received, complete] = JSON.parse(JSON.stringify(backend.events)) as [AuditEvent, AuditEvent];
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
    // Without its kind, as the API server takes it: the URL says it is a token review.
    review.requestBody(JSON.stringify({ spec: { token: 'secret-token' } }));
    review.answered(JSON.stringify({ kind: 'TokenReview', status: { authenticated: true, token: 'x' } }));
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

describe('the memory events hold while they wait', () => {
  it('drops events past the queue bound in bytes, counting each body as its text', async () => {
    const { Registry } = await import('prom-client');
    const { newAuditBackend } = await import('./backend.ts');
    const { silentLogger } = await import('../../lib/log.ts');
    const { JSONBody } = await import('./types.ts');
    const hung = { name: 'log', write: () => new Promise<void>(() => {}), close: () => Promise.resolve() };
    const registry = new Registry();
    const backend = newAuditBackend({
      sinks: [hung],
      registry,
      log: silentLogger(),
      maxQueueBytes: 1024 * 1024,
    });
    const body = JSON.stringify({ data: 'x'.repeat(100 * 1024) });
    const event = (): AuditEvent => sampleEvent(0, { level: 'Request', requestObject: new JSONBody(body) });
    for (let i = 0; i < 20; i++) await backend.emit(event());
    const dropped = (await registry.getSingleMetric('sealion_audit_events_dropped_total')!.get()).values[0]!
      .value;
    // About 200 KiB each (UTF-16): a 1 MiB bound holds 5.
    expect(dropped).toBe(15);
    void backend.close();
  });
});

describe("strangers' events", () => {
  it('fill at most a quarter of a queue, so people who signed in keep their place', async () => {
    const { Registry } = await import('prom-client');
    const { newAuditBackend } = await import('./backend.ts');
    const { silentLogger } = await import('../../lib/log.ts');
    const written: AuditEvent[][] = [];
    let release = (): void => {};
    const slow = {
      name: 'log',
      write: (events: AuditEvent[]) =>
        new Promise<void>((done) => {
          written.push(events);
          release = done;
        }),
      close: () => Promise.resolve(),
    };
    const backend = newAuditBackend({
      sinks: [slow],
      registry: new Registry(),
      log: silentLogger(),
      bufferSize: 8,
      batchMaxWaitMs: 0,
    });
    // The first event goes to the sink at once; the queue then fills behind it.
    await backend.emit(sampleEvent(0));
    await new Promise((r) => setImmediate(r));
    for (let i = 1; i <= 20; i++) await backend.emit(sampleEvent(i, { user: {} }));
    for (let i = 21; i <= 26; i++) await backend.emit(sampleEvent(i));
    release();
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    const next = written[1] ?? [];
    expect(next.filter((e) => !e.user.username)).toHaveLength(2);
    expect(next.filter((e) => e.user.username).map((e) => e.auditID)).toEqual(
      [21, 22, 23, 24, 25, 26].map((i) => `audit-id-${i}`),
    );
    release();
    void backend.close();
  });
});
