// The grants read from the informer: active by the clock, ended by the clock or the informer within the second, and
// the expiry controller's writes.
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import type { AccessRequest, AccessRequestStatus } from '../../apis/access.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import { silentLogger } from '../../lib/log.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { AccessWriteError, type AccessRequestClient } from './client.ts';
import { accessExpiryController, STATUSLESS_GRACE_MS } from './expiry.ts';
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

const approved = (ends: number): AccessRequestStatus => ({
  phase: 'Approved',
  approvedAt: at(T0),
  expiresAt: at(ends),
  approvalsRequired: 1,
});

describe('the access store', () => {
  const clock = fakeClock();
  let requests: MemoryInformer<AccessRequest>;
  let settings: AccessSettings;
  let clusters: Record<string, ClusterSpec>;
  let ended: [string, string, number][];

  const newStore = () => {
    const store = newAccessStore({
      requests,
      clusterSpec: (name) => clusters[name],
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
    settings = { hubName: 'hub', hub: { requireReason: true } };
    clusters = { edge: { access: { groups: ['edge-admins'] } } };
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
    requests.put(request('older', { ...approved(T0 + 600_000), approvedAt: at(T0 - 60_000) }));
    requests.put(request('newer', approved(T0 + 300_000), { reason: 'INC-8' }));
    requests.put(request('oldest', { ...approved(T0 + 900_000), approvedAt: at(T0 - 120_000) }));
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
  let told: string[];
  let conflict: boolean;

  const controller = () =>
    accessExpiryController({
      requests,
      client: {
        get: () => Promise.reject(new Error('unused')),
        create: () => Promise.reject(new Error('unused')),
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
});
