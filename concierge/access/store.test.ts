// The grants read from the informer: active by the clock, ended by the clock or the informer within the second, and
// the expiry controller's writes.
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { AccessRequest, AccessRequestStatus } from '../../apis/access.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import { silentLogger } from '../../lib/log.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { AccessWriteError, type AccessRequestClient } from './client.ts';
import { accessExpiryController, ENDED_RETENTION_MS, STATUSLESS_GRACE_MS } from './expiry.ts';
import { newAccessStore, type AccessSettings } from './store.ts';

const T0 = Date.parse('2026-11-29T10:00:00Z');
const at = (ms: number): string => new Date(ms).toISOString().replace('.000Z', 'Z');

function request(
  name: string,
  status: AccessRequestStatus | undefined,
  over: Partial<AccessRequest['spec']> = {},
) {
  return {
    apiVersion: 'access.concierge.sealion.dev/v1alpha1',
    kind: 'AccessRequest',
    metadata: { name, resourceVersion: '1', creationTimestamp: at(T0) },
    spec: {
      clusters: ['edge', 'hub'],
      groups: ['edge-admins'],
      durationSeconds: 600,
      reason: 'INC-7',
      requester: { username: 'alice' },
      ...over,
    },
    ...(status ? { status } : {}),
  } as AccessRequest;
}

/** Approved by bob at T0 (or `approvedAt`), on the edge Cluster (uid-edge) and the hub, as the approval writes it. */
const approved = (ends: number, approvedAt = T0): AccessRequestStatus => ({
  phase: 'Approved',
  approvedAt: at(approvedAt),
  expiresAt: at(ends),
  approvalsRequired: 1,
  reviews: [{ user: 'bob', decision: 'Approved', time: at(approvedAt) }],
  clusterUIDs: { edge: 'uid-edge', hub: '' },
});

describe('the access store', () => {
  const clock = fakeClock();
  let requests: MemoryInformer<AccessRequest>;
  let settings: AccessSettings;
  let clusters: Record<string, ClusterSpec>;
  let uids: Record<string, string>;
  let ended: [string, string, number][];

  const newStore = () => {
    const store = newAccessStore({
      requests,
      clusterSpec: (name) => clusters[name],
      clusterUID: (name) => (clusters[name] ? (uids[name] ?? `uid-${name}`) : undefined),
      settings: () => settings,
      clock,
      log: silentLogger(),
    });
    store.onEnded((name, why) => ended.push([name, why, clock.now()]));
    made.push(store);
    return store;
  };
  const made: { close(): void }[] = [];
  afterEach(() => {
    for (const store of made.splice(0)) store.close();
  });

  beforeEach(() => {
    clock.advance(T0 - clock.now());
    requests = new MemoryInformer<AccessRequest>();
    settings = { hubName: 'hub', hub: { requireReason: true, groups: ['edge-admins'] } };
    clusters = { edge: { access: { groups: ['edge-admins'] } } };
    uids = {};
    ended = [];
  });

  it('grants the groups on the clusters named, to the requester only, while approved and unexpired', () => {
    requests.put(request('r1', approved(T0 + 600_000)));
    requests.put(request('pending', { phase: 'Pending', expiresAt: at(T0 + 86_400_000) }));
    const store = newStore();
    expect(store.active('alice', 'edge')).toEqual([
      { name: 'r1', groups: ['edge-admins'], reason: 'INC-7', expiresAt: T0 + 600_000 },
    ]);
    // The hub is '' to the pipeline and `hub` to requests.
    expect(store.active('alice', '').map((g) => g.name)).toEqual(['r1']);
    expect(store.active('alice', 'other')).toEqual([]);
    expect(store.active('bob', 'edge')).toEqual([]);
    clock.advance(600_000);
    expect(store.active('alice', 'edge')).toEqual([]);
  });

  it('lists a user’s grants the last approved first', () => {
    requests.put(request('older', approved(T0 + 500_000, T0 - 60_000)));
    requests.put(request('newer', approved(T0 + 300_000), { reason: 'INC-8' }));
    requests.put(request('oldest', approved(T0 + 400_000, T0 - 120_000)));
    expect(
      newStore()
        .active('alice', 'edge')
        .map((g) => g.name),
    ).toEqual(['newer', 'older', 'oldest']);
  });

  it('grants nothing on a Cluster named like the hub', () => {
    requests.put(request('r1', approved(T0 + 600_000)));
    clusters['hub'] = {};
    expect(newStore().active('alice', 'hub')).toEqual([]);
  });

  it('grants only the groups the cluster’s policy lists now, and nothing on a cluster without one', () => {
    clusters['edge'] = { access: { groups: ['edge-admins', 'edge-readers'] } };
    requests.put(request('r1', approved(T0 + 600_000), { groups: ['edge-admins', 'edge-readers'] }));
    const store = newStore();
    expect(store.active('alice', 'edge')[0]?.groups).toEqual(['edge-admins', 'edge-readers']);
    clusters['edge'] = { access: { groups: ['edge-readers'] } };
    expect(store.active('alice', 'edge')[0]?.groups).toEqual(['edge-readers']);
    clusters['edge'] = {};
    expect(store.active('alice', 'edge')).toEqual([]);
    settings = { ...settings, hub: {} };
    expect(store.active('alice', '')).toEqual([]);
  });

  it('grants nothing on a Cluster deleted and made again under the name approved', () => {
    requests.put(request('r1', approved(T0 + 600_000)));
    const store = newStore();
    expect(store.active('alice', 'edge')).toHaveLength(1);
    uids['edge'] = 'uid-edge-again';
    expect(store.active('alice', 'edge')).toEqual([]);
    // One approved before its Cluster's uid was recorded grants nothing either.
    requests.put(request('r2', { ...approved(T0 + 600_000), clusterUIDs: {} }));
    uids['edge'] = 'uid-edge';
    expect(store.active('alice', 'edge').map((g) => g.name)).toEqual(['r1']);
  });

  it('grants nothing on the hub once its name is also a Cluster’s, nor a Cluster’s grant on the hub', () => {
    requests.put(request('r1', approved(T0 + 600_000)));
    const store = newStore();
    expect(store.active('alice', '').map((g) => g.name)).toEqual(['r1']);
    clusters['hub'] = { access: { groups: ['edge-admins'] } };
    expect(store.active('alice', '')).toEqual([]);
    // The hub renamed to a Cluster's name: what was approved on that Cluster does not follow the name to the hub.
    delete clusters['hub'];
    settings = { ...settings, hubName: 'edge' };
    expect(store.active('alice', '')).toEqual([]);
  });

  it('takes no Approved status on its word: the approvals, who gave them and the time must bear it out', () => {
    const base = approved(T0 + 600_000);
    const bob = (user: string) => ({ user, decision: 'Approved' as const, time: at(T0) });
    requests.put(request('no-reviews', { ...base, reviews: [] }));
    requests.put(request('own', { ...base, reviews: [bob('alice')] }));
    requests.put(request('own-too', { ...base, approvalsRequired: 1, reviews: [bob('bob'), bob('alice')] }));
    requests.put(request('too-few', { ...base, approvalsRequired: 2, reviews: [bob('bob'), bob('bob')] }));
    requests.put(request('denied-review', { ...base, reviews: [{ ...bob('bob'), decision: 'Denied' }] }));
    requests.put(request('longer', approved(T0 + 601_001)));
    requests.put(request('future', approved(T0 + 86_400_000 + 600_000, T0 + 86_400_000)));
    requests.put(request('no-approval-time', { ...base, approvedAt: undefined }));
    requests.put(
      request('two', {
        ...approved(T0 + 601_000),
        approvalsRequired: 2,
        reviews: [bob('bob'), bob('carol')],
      }),
    );
    const store = newStore();
    expect(store.active('alice', 'edge').map((g) => g.name)).toEqual(['two']);
    // The cluster's policy asking more approvals than the status says it took.
    clusters['edge'] = { access: { groups: ['edge-admins'], approvals: 3 } };
    expect(store.active('alice', 'edge')).toEqual([]);
  });

  it('tells the end of a grant at its expiresAt, once, without the controller having written anything', () => {
    requests.put(request('r1', approved(T0 + 600_000)));
    newStore();
    clock.advance(599_999);
    expect(ended).toEqual([]);
    clock.advance(1);
    expect(ended).toEqual([['r1', 'expired', T0 + 600_000]]);
    // The controller's write afterwards tells nothing more.
    requests.put(request('r1', { ...approved(T0 + 600_000), phase: 'Expired' }));
    expect(ended).toHaveLength(1);
  });

  it('tells a denial, a withdrawal and a delete as the informer brings them', () => {
    requests.put(request('a', approved(T0 + 600_000)));
    requests.put(request('b', approved(T0 + 600_000)));
    newStore();
    requests.put(request('a', { ...approved(T0 + 600_000), phase: 'Withdrawn' }));
    requests.remove('b');
    expect(ended).toEqual([
      ['a', 'was withdrawn', T0],
      ['b', 'was deleted', T0],
    ]);
    expect(clock.pending()).toEqual([]);
  });

  it('tells a revocation (a denial of an approved request) as such', () => {
    requests.put(request('a', approved(T0 + 600_000)));
    newStore();
    requests.put(request('a', { ...approved(T0 + 600_000), phase: 'Denied', message: 'revoked by carol' }));
    expect(ended).toEqual([['a', 'was revoked', T0]]);
  });

  it('lists a user’s requests, and the pending ones, from what the hub holds now', () => {
    const store = newStore();
    requests.put(request('p1', { phase: 'Pending', expiresAt: at(T0 + 86_400_000) }));
    requests.put(request('p2', { phase: 'Pending', expiresAt: at(T0 + 86_400_000) }));
    requests.put(request('d1', { phase: 'Denied' }));
    requests.put(
      request('b1', { phase: 'Pending', expiresAt: at(T0 + 86_400_000) }, { requester: { username: 'bob' } }),
    );
    expect([store.requestsOf('alice').length, store.pendingOf('alice'), store.pendingOf('bob')]).toEqual([
      3, 2, 1,
    ]);
    requests.remove('p1');
    expect(store.requestsOf('alice').map((r) => r.metadata.name)).toEqual(['d1', 'p2']);
    expect(store.pendingOf('alice')).toBe(1);
  });

  it('arms a grant approved after the start, and tells nothing of one that never was active', () => {
    const store = newStore();
    requests.put(request('r1', { phase: 'Pending', expiresAt: at(T0 + 86_400_000) }));
    requests.put(request('r1', { phase: 'Denied' }));
    expect(ended).toEqual([]);
    requests.put(request('r2', approved(T0 + 60_000)));
    expect(store.active('alice', 'edge')).toHaveLength(1);
    clock.advance(60_000);
    expect(ended).toEqual([['r2', 'expired', T0 + 60_000]]);
  });

  it('says whether a cluster requires a reason: the hub by the config, a Cluster by its spec', () => {
    clusters['strict'] = { access: { requireReason: true } };
    const store = newStore();
    expect([store.reasonRequired(''), store.reasonRequired('strict'), store.reasonRequired('edge')]).toEqual([
      true,
      true,
      false,
    ]);
  });

  it('stops telling once closed', () => {
    requests.put(request('r1', approved(T0 + 1000)));
    const store = newStore();
    store.close();
    clock.advance(1000);
    expect(ended).toEqual([]);
  });
});

describe('the expiry controller', () => {
  const clock = fakeClock();
  let requests: MemoryInformer<AccessRequest>;
  let writes: [string, AccessRequestStatus][];
  let deleted: string[];
  let told: string[];
  let conflict: boolean;

  const controller = () =>
    accessExpiryController({
      requests,
      client: {
        get: () => Promise.reject(new Error('unused')),
        create: () => Promise.reject(new Error('unused')),
        delete(name) {
          deleted.push(name);
          requests.remove(name);
          return Promise.resolve();
        },
        replaceStatus(r, status) {
          if (conflict) return Promise.reject(new AccessWriteError(409, 'modified'));
          writes.push([r.metadata.name!, status]);
          return Promise.resolve({ ...r, status });
        },
      } satisfies AccessRequestClient,
      notify: (change, r) => told.push(`${change} ${r.metadata.name}`),
      clock,
      log: silentLogger(),
    });

  beforeEach(() => {
    clock.advance(T0 - clock.now());
    requests = new MemoryInformer<AccessRequest>();
    writes = [];
    deleted = [];
    told = [];
    conflict = false;
  });

  const signal = new AbortController().signal;

  it('waits for the end, then writes Expired and tells it', async () => {
    requests.put(request('r1', approved(T0 + 600_000)));
    const sync = controller();
    expect(await sync.sync('r1', signal)).toEqual({ requeueAfterMs: 600_000 });
    clock.advance(600_000);
    expect(await sync.sync('r1', signal)).toBeUndefined();
    expect(writes.map(([n, s]) => [n, s.phase, s.message])).toEqual([
      ['r1', 'Expired', 'the grant ran its time'],
    ]);
    expect(told).toEqual(['expired r1']);
  });

  it('lapses a pending request, leaves decided ones, and ends one whose status was never written', async () => {
    requests.put(request('p', { phase: 'Pending', expiresAt: at(T0) }));
    requests.put(request('d', { phase: 'Denied' }));
    requests.put(request('bare', undefined));
    const sync = controller();
    await sync.sync('p', signal);
    await sync.sync('d', signal);
    expect(await sync.sync('bare', signal)).toEqual({ requeueAfterMs: STATUSLESS_GRACE_MS });
    clock.advance(STATUSLESS_GRACE_MS);
    await sync.sync('bare', signal);
    expect(writes.map(([n, s]) => [n, s.phase])).toEqual([
      ['p', 'Expired'],
      ['bare', 'Expired'],
    ]);
  });

  it('leaves a request that changed meanwhile to its next sync, and tells a delete of one it knew once', async () => {
    requests.put(request('r1', approved(T0)));
    const sync = controller();
    conflict = true;
    expect(await sync.sync('r1', signal)).toBeUndefined();
    requests.remove('r1');
    await sync.sync('r1', signal);
    await sync.sync('r1', signal);
    await sync.sync('never', signal);
    expect(told).toEqual(['deleted r1']);
  });

  it('deletes an ended request a day after it ended, quietly, and no live one', async () => {
    const decided = (phase: 'Denied' | 'Withdrawn', ms: number): AccessRequestStatus => ({
      phase,
      reviews: [{ user: 'bob', decision: phase, time: at(ms) }],
    });
    requests.put(request('denied', decided('Denied', T0)));
    requests.put(request('withdrawn', decided('Withdrawn', T0 + 60_000)));
    requests.put(request('expired', { ...approved(T0 + 600_000), phase: 'Expired' }));
    requests.put(request('live', approved(T0 + 600_000)));
    const sync = controller();
    expect(await sync.sync('denied', signal)).toEqual({ requeueAfterMs: ENDED_RETENTION_MS });
    expect(await sync.sync('withdrawn', signal)).toEqual({ requeueAfterMs: ENDED_RETENTION_MS + 60_000 });
    expect(await sync.sync('expired', signal)).toEqual({ requeueAfterMs: ENDED_RETENTION_MS + 600_000 });
    clock.advance(ENDED_RETENTION_MS);
    for (const name of ['denied', 'withdrawn', 'expired']) await sync.sync(name, signal);
    expect(deleted).toEqual(['denied']);
    clock.advance(600_000);
    for (const name of ['denied', 'withdrawn', 'expired', 'live']) await sync.sync(name, signal);
    expect(deleted).toEqual(['denied', 'withdrawn', 'expired']);
    // Its own deletes are housekeeping: no 'deleted' told of them.
    expect(told).toEqual(['expired live']);
  });
});
