// The AccessRequest local APIs against an in-memory store of requests (the API server's rules a caller relies on:
// a new resourceVersion per write, 409 on a stale one) over a real HTTP listener: the hostile cases first.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { createServer, request as httpRequest, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import {
  MAX_PENDING_PER_USER,
  MAX_REQUESTS_PER_USER,
  PENDING_LIFETIME_SECONDS,
  type AccessRequest,
  type AccessRequestStatus,
} from '../../apis/access.ts';
import { apiGroups, VERSION } from '../../apis/groups.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import type { AccessQuestion, Reviewer } from '../../lib/kube/kube.ts';
import { silentLogger } from '../../lib/log.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { localAPIs } from '../proxy/local-apis.ts';
import { accessAPIs, MAX_CALLS_IN_FLIGHT_PER_USER } from './api.ts';
import { AccessWriteError, type AccessRequestClient } from './client.ts';
import type { AccessChange } from './notify.ts';
import { clusterUIDsOf, newAccessStore, policyLookup, type AccessSettings } from './store.ts';

const groups = apiGroups('sealion.dev');
const prefix = `/apis/${groups.access}/${VERSION}`;
const apiVersion = `${groups.access}/${VERSION}`;
const START = Date.parse('2026-11-29T10:00:00Z');

/** The API server's part: each write a new resourceVersion, a stale one refused with 409. */
function memoryClient(requests: MemoryInformer<AccessRequest>, clock: { now(): number }) {
  let version = 0;
  let generated = 0;
  const client: AccessRequestClient & { conflicts: number; gets: string[] } = {
    conflicts: 0,
    gets: [],
    get(name) {
      client.gets.push(name);
      return Promise.resolve(structuredClone(requests.get(name)));
    },
    delete(name) {
      requests.remove(name);
      return Promise.resolve();
    },
    async create(request) {
      await Promise.resolve();
      const name =
        request.metadata.name ??
        `${(request.metadata as { generateName?: string }).generateName}${++generated}`;
      if (requests.get(name)) throw new AccessWriteError(409, 'exists');
      const created: AccessRequest = {
        ...structuredClone(request),
        metadata: {
          name,
          resourceVersion: String(++version),
          creationTimestamp: new Date(clock.now()).toISOString(),
        },
      };
      delete created.status;
      requests.put(created);
      return structuredClone(created);
    },
    async replaceStatus(request, status) {
      await Promise.resolve();
      const held = requests.get(request.metadata.name!);
      if (!held) throw new AccessWriteError(404, 'gone');
      if (held.metadata.resourceVersion !== request.metadata.resourceVersion) {
        client.conflicts++;
        throw new AccessWriteError(409, 'the object has been modified');
      }
      const next = {
        ...held,
        metadata: { ...held.metadata, resourceVersion: String(++version) },
        status: structuredClone(status),
      };
      requests.put(next);
      return structuredClone(next);
    },
  };
  return client;
}

const alice: UserInfo = { username: 'alice', groups: ['dev', 'system:authenticated'], extra: {} };
const bob: UserInfo = { username: 'bob', groups: ['sre', 'system:authenticated'], extra: {} };
const carol: UserInfo = { username: 'carol', groups: ['sre', 'system:authenticated'], extra: {} };

describe('the AccessRequest APIs', () => {
  const clock = fakeClock();
  let requests: MemoryInformer<AccessRequest>;
  let client: ReturnType<typeof memoryClient>;
  let settings: AccessSettings;
  let clusters: Record<string, ClusterSpec>;
  let reviewers: Set<string>;
  let questions: AccessQuestion[];
  let changes: [AccessChange, string, string | undefined][];
  let server: Server;
  let base: string;
  let beforeWrite: (() => void) | undefined;
  let reviewGate: Promise<void> | undefined;
  let store: ReturnType<typeof newAccessStore>;

  beforeAll(async () => {
    server = createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0]!;
      const caller = JSON.parse(String(req.headers['x-test-user'])) as UserInfo;
      const api = table().find(path, req.method ?? 'GET');
      if (!api) {
        res.writeHead(599).end();
        return;
      }
      void api.serve(req, res, path, caller);
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((done) => server.close(() => done())));

  let table: () => ReturnType<typeof localAPIs>;
  beforeEach(() => {
    clock.advance(START - clock.now());
    requests = new MemoryInformer<AccessRequest>();
    client = memoryClient(requests, clock);
    settings = { hubName: 'hub', hub: { groups: ['hub-admins'], maxDurationSeconds: 7200, approvals: 1 } };
    clusters = {
      edge: { access: { groups: ['edge-admins', 'edge-readers'], maxDurationSeconds: 3600 } },
      strict: {
        access: { groups: ['edge-admins'], approvals: 2, requireReason: true, maxDurationSeconds: 1800 },
      },
      closed: {},
    };
    reviewers = new Set(['bob', 'carol']);
    questions = [];
    changes = [];
    beforeWrite = undefined;
    reviewGate = undefined;
    const clusterUID = (name: string) => (clusters[name] ? `uid-${name}` : undefined);
    store = newAccessStore({
      requests,
      clusterSpec: (name) => clusters[name],
      clusterUID,
      settings: () => settings,
      clock,
      log: silentLogger(),
    });
    const reviewer: Reviewer = {
      tokenReview: () => Promise.reject(new Error('unused')),
      async allowed(question) {
        questions.push(question);
        await reviewGate;
        return reviewers.has(question.user);
      },
    };
    const apis = localAPIs(
      accessAPIs({
        groups,
        store,
        client: {
          ...client,
          replaceStatus(request, status) {
            beforeWrite?.();
            return client.replaceStatus(request, status);
          },
        },
        reviewer,
        policyOf: policyLookup(
          () => settings,
          (name) => clusters[name],
        ),
        clusterUIDs: clusterUIDsOf(
          () => settings,
          (name) => clusters[name],
          clusterUID,
        ),
        notify: (change, request, by) => changes.push([change, request.metadata.name!, by?.username]),
        clock,
        log: silentLogger(),
      }),
    );
    table = () => apis;
  });

  async function post(user: UserInfo, path: string, body: unknown) {
    const res = await fetch(`${base}${prefix}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-test-user': JSON.stringify(user) },
      body: typeof body === 'string' ? body : JSON.stringify(body),
    });
    const answer = (await res.json()) as Record<string, unknown>;
    return { code: res.status, answer, retryAfter: res.headers.get('retry-after') };
  }

  const ask = (user: UserInfo, spec: Record<string, unknown>, name?: string) =>
    post(user, '/accessrequests', {
      apiVersion,
      kind: 'AccessRequest',
      metadata: name ? { name } : {},
      spec: { clusters: ['edge'], groups: ['edge-admins'], durationSeconds: 600, reason: 'INC-1', ...spec },
    });

  const decide = (user: UserInfo, name: string, decision: string, reason?: string) =>
    post(user, `/accessrequests/${name}/approval`, {
      apiVersion,
      kind: 'AccessRequestDecision',
      decision,
      ...(reason === undefined ? {} : { reason }),
    });

  const statusOf = (name: string): AccessRequestStatus => requests.get(name)!.status!;

  it('creates a request as the caller, whoever the body names, pending for a day', async () => {
    const { code, answer } = await ask(
      alice,
      { requester: { username: 'mallory', groups: ['system:masters'] } },
      'r1',
    );
    expect(code).toBe(201);
    const stored = requests.get('r1')!;
    expect(answer).toEqual(stored);
    expect(stored.spec.requester).toEqual({ username: 'alice', groups: ['dev', 'system:authenticated'] });
    expect(stored.status).toEqual({
      phase: 'Pending',
      approvalsRequired: 1,
      reviews: [],
      expiresAt: new Date(START + PENDING_LIFETIME_SECONDS * 1000).toISOString().replace('.000Z', 'Z'),
      requester: 'alice',
    });
    expect(changes).toEqual([['created', 'r1', 'alice']]);
  });

  it('generates a name when none is given', async () => {
    const { code, answer } = await ask(alice, {});
    expect(code).toBe(201);
    expect((answer['metadata'] as { name: string }).name).toMatch(/^access-/);
  });

  it('refuses a group the policy of a named cluster does not list (403)', async () => {
    const { code, answer } = await ask(alice, { groups: ['system:masters'] });
    expect([code, answer['message']]).toEqual([
      403,
      `cluster edge's access policy does not list "system:masters"; it lists "edge-admins", "edge-readers"`,
    ]);
    const both = await ask(alice, { clusters: ['edge', 'strict'], groups: ['edge-readers'] });
    expect(both.code).toBe(403);
    expect(both.answer['message']).toContain('cluster strict');
    expect((await ask(alice, { clusters: ['closed'] })).answer['message']).toBe(
      'cluster closed takes no access requests (its access policy lists no groups)',
    );
    expect(requests.list()).toEqual([]);
  });

  it('refuses a duration over the smallest limit of the clusters named (403), and one out of bounds (422)', async () => {
    expect((await ask(alice, { durationSeconds: 3601 })).code).toBe(403);
    const over = await ask(alice, {
      clusters: ['edge', 'hub'],
      groups: ['edge-admins'],
      durationSeconds: 3000,
    });
    expect(over.code).toBe(403);
    expect((await ask(alice, { durationSeconds: 59 })).code).toBe(422);
    expect((await ask(alice, { durationSeconds: 600.5 })).code).toBe(422);
    expect((await ask(alice, { durationSeconds: '600' })).code).toBe(422);
    expect((await ask(alice, { durationSeconds: 3600 })).code).toBe(201);
  });

  it('refuses a reason with control characters, an empty one, a long one, and none where one is required', async () => {
    for (const reason of ['INC-1\nrm -rf', 'INC\u001b[31m', 'a\u2028b', '   ', 'x'.repeat(513), 42]) {
      const { code, answer } = await ask(alice, { reason });
      expect(code).toBe(422);
      expect(String(answer['message'])).toMatch(/^spec\.reason /);
    }
    const none = await ask(alice, { clusters: ['strict'], reason: undefined });
    expect([none.code, none.answer['message']]).toEqual([
      422,
      'spec.reason is required: cluster strict requires a reason',
    ]);
  });

  it('refuses unknown clusters, the hub name when a Cluster also has it, and malformed bodies', async () => {
    expect((await ask(alice, { clusters: ['nowhere'] })).code).toBe(422);
    expect((await ask(alice, { clusters: ['hub'], groups: ['hub-admins'] })).code).toBe(201);
    clusters['hub'] = { access: { groups: ['hub-admins'] } };
    const ambiguous = await ask(alice, { clusters: ['hub'], groups: ['hub-admins'] });
    expect(ambiguous.code).toBe(422);
    expect(ambiguous.answer['message']).toContain('names both the hub and a Cluster');
    expect((await post(alice, '/accessrequests', 'not json')).code).toBe(400);
    expect((await post(alice, '/accessrequests', [])).code).toBe(400);
    expect((await ask(alice, {}, 'Not_A_Name')).code).toBe(422);
    expect((await ask(alice, { clusters: [] })).code).toBe(422);
    expect((await ask(alice, { groups: ['x'.repeat(300)] })).code).toBe(422);
    expect((await ask(alice, { clusters: Array.from({ length: 17 }, (_, i) => `c${i}`) })).code).toBe(422);
  });

  it('bounds the pending requests of one user (429 with Retry-After), not those of others', async () => {
    for (let i = 0; i < MAX_PENDING_PER_USER; i++) expect((await ask(alice, {})).code).toBe(201);
    const over = await ask(alice, {});
    expect([over.code, over.retryAfter]).toEqual([429, '60']);
    expect(over.answer['message']).toContain('withdraw one or wait for a decision');
    expect((await ask(bob, {})).code).toBe(201);
    // One decided frees a place.
    const first = requests.list().find((r) => r.spec.requester.username === 'alice')!;
    expect((await decide(bob, first.metadata.name!, 'Denied')).code).toBe(200);
    expect((await ask(alice, {})).code).toBe(201);
  });

  it('bounds the pending requests of a user who sends many at once', async () => {
    for (let i = 0; i < MAX_PENDING_PER_USER - 2; i++) expect((await ask(alice, {})).code).toBe(201);
    const answers = await Promise.all(
      Array.from({ length: MAX_CALLS_IN_FLIGHT_PER_USER }, () => ask(alice, {})),
    );
    expect(answers.map((a) => a.code).sort()).toEqual([201, 201, 429, 429]);
  });

  it('bounds the requests one user holds in any phase, and lists at most that many', async () => {
    for (let i = 0; i < MAX_REQUESTS_PER_USER; i++) {
      expect((await ask(alice, {}, `loop-${i}`)).code).toBe(201);
      expect(
        (await post(alice, `/accessrequests/loop-${i}/withdrawal`, { decision: 'Withdrawn' })).code,
      ).toBe(200);
    }
    const over = await ask(alice, {});
    expect([over.code, over.retryAfter]).toEqual([429, '60']);
    expect(over.answer['message']).toBe(
      `you hold ${MAX_REQUESTS_PER_USER} access requests, the most one user may; withdraw one, or wait a day for ended ones to be deleted`,
    );
    expect((await ask(bob, {})).code).toBe(201);
    // More than that, written past the proxy: selfaccessrequests answers the newest MAX_REQUESTS_PER_USER.
    for (let i = 0; i < 10; i++) {
      const extra = structuredClone(requests.get('loop-0')!);
      extra.metadata = { ...extra.metadata, name: `extra-${i}` };
      requests.put(extra);
    }
    const res = await fetch(`${base}${prefix}/selfaccessrequests`, {
      headers: { 'x-test-user': JSON.stringify(alice) },
    });
    expect(((await res.json()) as { items: unknown[] }).items).toHaveLength(MAX_REQUESTS_PER_USER);
  });

  it('bounds the creates and decisions one user has under way (429), not those of others', async () => {
    for (let i = 0; i < MAX_CALLS_IN_FLIGHT_PER_USER + 2; i++) await ask(alice, {}, `r-${i}`);
    let release = (): void => {};
    reviewGate = new Promise((done) => (release = done));
    const answers: number[] = [];
    const calls = Array.from({ length: MAX_CALLS_IN_FLIGHT_PER_USER + 2 }, (_, i) =>
      decide(bob, `r-${i}`, 'Approved').then((a) => void answers.push(a.code)),
    );
    while (questions.length < MAX_CALLS_IN_FLIGHT_PER_USER || answers.length < 2)
      await new Promise((done) => setImmediate(done));
    expect(answers).toEqual([429, 429]);
    // Another reviewer is not held up by bob's.
    const carols = decide(carol, 'r-0', 'Denied');
    while (questions.length < MAX_CALLS_IN_FLIGHT_PER_USER + 1)
      await new Promise((done) => setImmediate(done));
    release();
    await Promise.all(calls);
    expect(answers.sort()).toEqual([200, 200, 200, 200, 429, 429]);
    expect((await carols).code).toBe(200);
    // Done: the bound is free again.
    expect((await decide(bob, `r-${MAX_CALLS_IN_FLIGHT_PER_USER}`, 'Approved')).code).toBe(200);
  });

  it('checks a request name before any use: . and .. never reach the API server', async () => {
    const raw = (path: string, user: UserInfo) =>
      new Promise<number>((done, fail) => {
        const { hostname, port } = new URL(base);
        const req = httpRequest({
          host: hostname,
          port,
          path: `${prefix}${path}`,
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-test-user': JSON.stringify(user) },
        });
        req.on('response', (res) => {
          res.resume();
          done(res.statusCode ?? 0);
        });
        req.on('error', fail);
        req.end(JSON.stringify({ apiVersion, kind: 'AccessRequestDecision', decision: 'Approved' }));
      });
    // Given as options, node:http sends the path as written: no URL normalisation on the way.
    for (const name of ['..', '.', '%2E%2E', 'UPPER', 'a%2Fb'])
      expect(await raw(`/accessrequests/${name}/approval`, bob)).toBe(404);
    expect(await raw(`/accessrequests/%2E%2E/withdrawal`, alice)).toBe(404);
    expect([questions, client.gets]).toEqual([[], []]);
  });

  it('lets a reviewer revoke an approved, unexpired grant: Denied, who and why recorded, the grant over', async () => {
    await ask(alice, {}, 'r-app');
    expect((await decide(bob, 'r-app', 'Approved')).code).toBe(200);
    expect(store.active('alice', 'edge').map((g) => g.name)).toEqual(['r-app']);
    // Never by the requester, even one the hub lets approve.
    reviewers.add('alice');
    expect((await decide(alice, 'r-app', 'Denied')).code).toBe(403);
    clock.advance(1000);
    const revoked = await decide(carol, 'r-app', 'Denied', 'approved by mistake');
    expect(revoked.code).toBe(200);
    const status = statusOf('r-app');
    expect([status.phase, status.message]).toEqual(['Denied', 'revoked by carol']);
    expect(status.reviews!.at(-1)).toEqual({
      user: 'carol',
      decision: 'Denied',
      reason: 'approved by mistake',
      time: '2026-11-29T10:00:01Z',
    });
    expect(store.active('alice', 'edge')).toEqual([]);
    expect(changes.map(([c, , by]) => [c, by]).at(-1)).toEqual(['denied', 'carol']);
    // Approving it again is no way back.
    expect((await decide({ ...bob, username: 'dave' }, 'r-app', 'Approved')).code).toBe(403);
    reviewers.add('dave');
    expect((await decide({ ...bob, username: 'dave' }, 'r-app', 'Approved')).code).toBe(409);
  });

  it('revokes no grant that is over', async () => {
    await ask(alice, {}, 'r-over');
    expect((await decide(bob, 'r-over', 'Approved')).code).toBe(200);
    clock.advance(600_000);
    const late = await decide(carol, 'r-over', 'Denied');
    expect([late.code, late.answer['message']]).toEqual([
      409,
      "access request r-over's grant is over; there is nothing to revoke",
    ]);
  });

  it('records the uids of the Clusters approved, and the hub as its own', async () => {
    await ask(alice, { clusters: ['edge', 'hub'], groups: ['edge-admins'] }, 'r-uid');
    // Policies must list the group on both: the hub's here.
    settings = { ...settings, hub: { ...settings.hub, groups: ['hub-admins', 'edge-admins'] } };
    await ask(alice, { clusters: ['edge', 'hub'], groups: ['edge-admins'] }, 'r-uid2');
    expect((await decide(bob, 'r-uid2', 'Approved')).code).toBe(200);
    expect(statusOf('r-uid2').clusterUIDs).toEqual({ edge: 'uid-edge', hub: '' });
    expect(store.active('alice', '').map((g) => g.name)).toEqual(['r-uid2']);
  });

  it('refuses a requester approving or denying their own request, even one the hub lets approve', async () => {
    await ask(bob, { groups: ['edge-readers'] }, 'mine');
    const self = await decide(bob, 'mine', 'Approved');
    expect([self.code, self.answer['message']]).toEqual([403, 'you cannot approve your own request']);
    expect((await decide(bob, 'mine', 'Denied')).code).toBe(403);
    expect(statusOf('mine').phase).toBe('Pending');
  });

  it('asks the hub whether the reviewer may approve the request, and refuses one it does not let', async () => {
    await ask(alice, {}, 'r1');
    const mallory: UserInfo = { username: 'mallory', groups: ['system:authenticated'], extra: {} };
    const refused = await decide(mallory, 'r1', 'Approved');
    expect(refused.code).toBe(403);
    expect(questions[0]).toEqual({
      user: 'mallory',
      groups: ['system:authenticated'],
      extra: {},
      verb: 'approve',
      group: groups.access,
      version: VERSION,
      resource: 'accessrequests',
      name: 'r1',
    });
    expect(statusOf('r1').phase).toBe('Pending');
  });

  it('approves with enough approvals, one review per reviewer, and sets the grant from the approval', async () => {
    await ask(alice, { clusters: ['strict'], durationSeconds: 1800 }, 'r2');
    expect(statusOf('r2').approvalsRequired).toBe(2);
    expect((await decide(bob, 'r2', 'Approved', 'ok')).code).toBe(200);
    expect(statusOf('r2').phase).toBe('Pending');
    const again = await decide(bob, 'r2', 'Approved');
    expect([again.code, again.answer['message']]).toEqual([
      409,
      'you have already reviewed access request r2; one review per reviewer',
    ]);
    clock.advance(5000);
    expect((await decide(carol, 'r2', 'Approved')).code).toBe(200);
    const status = statusOf('r2');
    expect(status.phase).toBe('Approved');
    expect(status.approvedAt).toBe('2026-11-29T10:00:05Z');
    expect(status.expiresAt).toBe('2026-11-29T10:30:05Z');
    expect(status.reviews!.map((r) => [r.user, r.decision, r.reason])).toEqual([
      ['bob', 'Approved', 'ok'],
      ['carol', 'Approved', undefined],
    ]);
    expect(changes.map(([c]) => c)).toEqual(['created', 'approved']);
    // Decided: no more approvals (a denial now is a revocation).
    reviewers.add('dave');
    const late = await decide({ ...bob, username: 'dave' }, 'r2', 'Approved');
    expect([late.code, late.answer['message']]).toEqual([
      409,
      'access request r2 is Approved already; a reviewer may still deny it, which revokes the grant',
    ]);
  });

  it('retries a decision whose request changed under it, and decides afresh', async () => {
    await ask(alice, { clusters: ['strict'] }, 'r3');
    let raced = false;
    beforeWrite = () => {
      if (raced) return;
      raced = true;
      // Another replica's reviewer lands first.
      const held = requests.get('r3')!;
      requests.put({
        ...held,
        metadata: { ...held.metadata, resourceVersion: `${held.metadata.resourceVersion}-other` },
        status: {
          ...held.status,
          reviews: [{ user: 'carol', decision: 'Approved', time: '2026-11-29T10:00:00Z' }],
        },
      });
    };
    expect((await decide(bob, 'r3', 'Approved')).code).toBe(200);
    expect(client.conflicts).toBe(1);
    expect(statusOf('r3').phase).toBe('Approved');
    expect(statusOf('r3').reviews!.map((r) => r.user)).toEqual(['carol', 'bob']);
  });

  it('lets only the requester withdraw, a pending or approved request', async () => {
    await ask(alice, {}, 'r4');
    expect((await post(bob, '/accessrequests/r4/withdrawal', { decision: 'Withdrawn' })).code).toBe(403);
    expect((await post(alice, '/accessrequests/r4/withdrawal', { decision: 'Approved' })).code).toBe(422);
    expect((await decide(bob, 'r4', 'Approved')).code).toBe(200);
    const done = await post(alice, '/accessrequests/r4/withdrawal', {
      decision: 'Withdrawn',
      reason: 'fixed',
    });
    expect(done.code).toBe(200);
    expect(statusOf('r4').phase).toBe('Withdrawn');
    expect((await post(alice, '/accessrequests/r4/withdrawal', { decision: 'Withdrawn' })).code).toBe(409);
    expect(changes.map(([c, , by]) => [c, by])).toEqual([
      ['created', 'alice'],
      ['approved', 'bob'],
      ['withdrawn', 'alice'],
    ]);
  });

  it('refuses a decision on a lapsed request, a missing one, a bad reason and other subresources', async () => {
    await ask(alice, {}, 'r5');
    clock.advance(PENDING_LIFETIME_SECONDS * 1000);
    expect((await decide(bob, 'r5', 'Approved')).code).toBe(409);
    expect((await decide(bob, 'nothing', 'Approved')).code).toBe(404);
    expect((await decide(bob, 'r5', 'Approved', 'a\tb')).code).toBe(422);
    expect((await decide(bob, 'r5', 'Withdrawn')).code).toBe(422);
    expect((await post(bob, '/accessrequests/r5/status', {})).code).toBe(405);
    expect((await post(bob, '/accessrequests/r5', {})).code).toBe(405);
  });

  it('refuses service accounts', async () => {
    const robot: UserInfo = { username: 'system:serviceaccount:ci:deployer', groups: [], extra: {} };
    expect((await ask(robot, {})).code).toBe(403);
  });

  it("lists the caller's own requests, newest first, and only theirs", async () => {
    await ask(alice, {}, 'older');
    clock.advance(2000);
    await ask(alice, {}, 'newer');
    await ask(bob, {}, 'bobs');
    const res = await fetch(`${base}${prefix}/selfaccessrequests`, {
      headers: { 'x-test-user': JSON.stringify(alice) },
    });
    const list = (await res.json()) as { kind: string; items: AccessRequest[] };
    expect(list.kind).toBe('AccessRequestList');
    expect(list.items.map((r) => r.metadata.name)).toEqual(['newer', 'older']);
  });

  it('leaves every other method on accessrequests to the API server', () => {
    for (const [method, path] of [
      ['GET', '/accessrequests'],
      ['GET', '/accessrequests/r1'],
      ['DELETE', '/accessrequests/r1'],
      ['PUT', '/accessrequests/r1/status'],
      ['PATCH', '/accessrequests/r1'],
      ['POST', '/selfaccessrequests'],
    ] as const)
      expect(table().find(`${prefix}${path}`, method)).toBeUndefined();
  });
});
