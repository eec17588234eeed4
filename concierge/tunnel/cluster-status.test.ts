import {
  PEER_ADDRESS_ANNOTATION,
  REPLICA_PROTOCOL_ANNOTATION,
  REPLICA_VERSION_ANNOTATION,
} from '../../apis/install.ts';
import { describe, expect, it } from '@jest/globals';
import type { Condition } from '../../apis/meta.ts';
import type { Cluster, ClusterStatus, TunnelHolder } from '../../apis/tunnel.ts';
import { fakeClock, type FakeClock } from '../../test-support/fake-clock.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import type { LeaseClient, LeaseObject, LeaseRecord, StatusApplier } from '../../lib/kube/kube.ts';
import { silentLogger } from '../../lib/log.ts';
import { newControllerManager } from '../../lib/controller/manager.ts';
import {
  AGENT_PROTOCOL_CONDITION,
  deriveStatus,
  newClusterStatus,
  REPLICA_LEASE_SECONDS,
  replicaFieldManager,
  replicaLeaseName,
  type HeldTunnel,
  type ReplicaVersion,
} from './cluster-status.ts';

const T0 = '2026-01-01T00:00:00.000Z';
const T1 = '2026-01-01T00:01:00.000Z';

const cluster = (name: string, status: ClusterStatus = {}): Cluster => ({
  apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
  kind: 'Cluster',
  metadata: { name, resourceVersion: '1' },
  spec: {},
  status,
});

const lease = (holder: string, version: string): LeaseObject => ({
  metadata: { name: replicaLeaseName(holder), namespace: 'ns', resourceVersion: version },
  spec: { holderIdentity: holder, leaseDurationSeconds: REPLICA_LEASE_SECONDS },
});

/**
 * The status subresource as the API server keeps it, reduced to what matters here: each field manager's entry in
 * `tunnels` is its own, the derived fields go to whoever applied last, and JSON patches remove entries.
 */
function fakeStatus(clusters: MemoryInformer<Cluster>): StatusApplier<ClusterStatus> & {
  applies: { name: string; manager: string; status: Partial<ClusterStatus> }[];
  removed: string[];
} {
  const owner = new Map<string, string>();
  const applies: { name: string; manager: string; status: Partial<ClusterStatus> }[] = [];
  const removed: string[] = [];
  return {
    applies,
    removed,
    apply(name, status, manager) {
      applies.push({ name, manager, status });
      const current = clusters.get(name)!;
      // An entry this fake did not see written is owned as the replica named in it would have written it.
      const ownerOf = (t: TunnelHolder): string =>
        owner.get(`${name}/${t.replica}`) ?? replicaFieldManager(t.replica);
      const kept = (current.status?.tunnels ?? []).filter((t) => ownerOf(t) !== manager);
      for (const t of status.tunnels ?? []) owner.set(`${name}/${t.replica}`, manager);
      const tunnels: TunnelHolder[] = [...kept, ...(status.tunnels ?? [])];
      clusters.put({ ...current, status: { ...status, tunnels } });
      return Promise.resolve();
    },
    jsonPatch(name, operations) {
      const [test] = operations as { path: string; value: string }[];
      const index = Number(test!.path.split('/')[3]);
      const current = clusters.get(name)!;
      const tunnels = [...(current.status?.tunnels ?? [])];
      if (tunnels[index]?.replica !== test!.value) return Promise.reject(new Error('test failed'));
      removed.push(`${name}/${test!.value}`);
      tunnels.splice(index, 1);
      clusters.put({ ...current, status: { ...current.status, tunnels } });
      return Promise.resolve();
    },
  };
}

/** This replica's Lease, written into `leases` as the API server's watch would show it, with a new version each time. */
function recordingLease(
  leases: MemoryInformer<LeaseObject>,
  identity: string,
  /** Whether this replica's own watch shows its renewals (false: a stalled watch). */
  visible = true,
): LeaseClient & { records: LeaseRecord[]; deleted: boolean } {
  const records: LeaseRecord[] = [];
  const write = (l: LeaseRecord): Promise<boolean> => {
    records.push(l);
    if (visible) leases.put(lease(identity, String(records.length)));
    return Promise.resolve(true);
  };
  const client = {
    records,
    deleted: false,
    get: () =>
      Promise.resolve(records.at(-1) && { ...records.at(-1)!, resourceVersion: String(records.length) }),
    create: write,
    // As the API server: a Lease update must name the version it replaces.
    replace: (l: LeaseRecord) =>
      !records.length
        ? Promise.resolve(false)
        : l.resourceVersion
          ? write(l)
          : Promise.reject(new Error('metadata.resourceVersion: must be specified for an update')),
    delete: () => (
      (client.deleted = true),
      leases.remove(replicaLeaseName(identity), 'ns'),
      Promise.resolve()
    ),
  };
  return client;
}

/** Moves the fake clock on `times` steps of `ms`, letting what each step wakes run. */
async function tick(clock: FakeClock, ms: number, times: number): Promise<void> {
  for (let i = 0; i < times; i++) {
    clock.advance(ms);
    await settle();
  }
}

/** Lets queued syncs run. */
const settle = async (): Promise<void> => {
  for (let i = 0; i < 20; i++) await new Promise((done) => setImmediate(done));
};

describe('deriveStatus', () => {
  it('is connected while a live replica holds a tunnel, since the first one, with the newest agent', () => {
    const live: TunnelHolder[] = [
      { replica: 'b', connectedSince: T1, agentVersion: 'v2', certificateExpiry: T1 },
      { replica: 'a', connectedSince: T0, agentVersion: 'v1', certificateExpiry: T0 },
    ];
    expect(deriveStatus({}, live)).toEqual({
      connected: true,
      replicas: 'a,b',
      connectedSince: T0,
      agentVersion: 'v2',
      certificateExpiry: T1,
    });
    // A cluster that stayed connected keeps the time it first connected.
    expect(
      deriveStatus({ connected: true, connectedSince: '2025-01-01T00:00:00.000Z' }, live).connectedSince,
    ).toBe('2025-01-01T00:00:00.000Z');
  });

  it('is disconnected with no live tunnel, keeping what was last known of the agent', () => {
    const current = { connected: true, connectedSince: T0, agentVersion: 'v1', certificateExpiry: T1 };
    expect(deriveStatus(current, [])).toEqual({ ...current, connected: false, replicas: '' });
  });
});

describe('the agent protocol condition', () => {
  const refusal = {
    message: 'the agent speaks tunnel protocol 3.0 and the hub 2.1, …: upgrade the hub',
    at: T1,
  };
  const refused = (message: string, at: string): Condition => ({
    type: AGENT_PROTOCOL_CONDITION,
    status: 'False',
    reason: 'OutsideSkewPolicy',
    message,
    lastTransitionTime: at,
  });
  const live: TunnelHolder[] = [{ replica: 'a', connectedSince: T1 }];

  it('is absent until a replica refuses the agent, connected or not', () => {
    expect(deriveStatus({}, []).conditions).toBeUndefined();
    expect(deriveStatus({}, live).conditions).toBeUndefined();
  });

  it('says a refusal while no tunnel is up, keeping when it first turned False', () => {
    expect(deriveStatus({}, [], refusal).conditions).toEqual([refused(refusal.message, T1)]);
    const before = { conditions: [refused('an earlier reason', T0)] };
    expect(deriveStatus(before, [], refusal).conditions).toEqual([refused(refusal.message, T0)]);
    // Said by a replica that is gone: it stays, as nothing has proved it wrong.
    expect(deriveStatus(before, []).conditions).toEqual(before.conditions);
  });

  it('turns True once a tunnel is up, since the cluster connected, whatever a replica refuses meanwhile', () => {
    const served: Condition = {
      type: AGENT_PROTOCOL_CONDITION,
      status: 'True',
      reason: 'WithinSkewPolicy',
      message: "a tunnel is up: the agent's tunnel protocol is served",
      lastTransitionTime: T1,
    };
    expect(deriveStatus({ conditions: [refused('old', T0)] }, live).conditions).toEqual([served]);
    expect(deriveStatus({ conditions: [served] }, live, refusal).conditions).toEqual([served]);
  });
});

describe('the names a replica writes under', () => {
  it('are valid for any identity', () => {
    expect(replicaLeaseName('concierge-7d9f-abc')).toBe('sealion-concierge-replica-concierge-7d9f-abc');
    expect(replicaLeaseName('Host_Name-12')).toMatch(/^sealion-concierge-replica-[0-9a-f]{32}$/);
    expect(replicaFieldManager('x'.repeat(200))).toMatch(/^sealion-concierge\/[0-9a-f]{32}$/);
  });
});

describe('the cluster status publisher', () => {
  const held: HeldTunnel = {
    connectedSince: T0,
    transport: 'direct',
    agentVersion: 'v1',
    certificateExpiry: T1,
    policy: 'full',
    impersonation: 'constrained',
  };

  async function replica(
    identity: string,
    clusters: MemoryInformer<Cluster>,
    leases: MemoryInformer<LeaseObject>,
    status: StatusApplier<ClusterStatus>,
    tunnels: Map<string, HeldTunnel>,
    clock = fakeClock(),
    ownWatch = true,
  ) {
    const lease = recordingLease(leases, identity, ownWatch);
    const deletedLeases: string[] = [];
    // The manager that runs the publisher's controllers, as the concierge's does.
    const manager = newControllerManager({ log: silentLogger(), clock });
    const publisher = newClusterStatus({
      clusters,
      leases,
      lease,
      deleteLease: (name) => (deletedLeases.push(name), Promise.resolve()),
      status,
      identity,
      version: 'v-a',
      tunnelProtocol: '2.1',
      held: (name) => tunnels.get(name),
      manager,
      clock,
      log: silentLogger(),
    });
    manager.add(...publisher.entries);
    await manager.start();
    await settle();
    /** A clean stop: the entries and Lease withdrawn while the controllers run, then the manager stopped. */
    const stop = async (): Promise<void> => {
      await publisher.withdraw();
      await manager.stop();
    };
    return { publisher, lease, clock, deletedLeases, stop };
  }

  it("publishes its own entry, keeps the other replicas' entries, and removes its own when the tunnel goes", async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        replicas: 'b',
        connectedSince: T0,
        tunnels: [{ replica: 'b', connectedSince: T0 }],
      }),
    ]);
    const leases = new MemoryInformer<LeaseObject>([lease('b', '1')]);
    const status = fakeStatus(clusters);
    const tunnels = new Map<string, HeldTunnel>();
    const a = await replica('a', clusters, leases, status, tunnels);
    await settle();
    expect(status.applies).toEqual([]);

    tunnels.set('edge', held);
    a.publisher.changed('edge');
    await settle();
    expect(status.applies.at(-1)).toMatchObject({ manager: 'sealion-concierge/a' });
    expect(
      clusters
        .get('edge')!
        .status!.tunnels!.map((t) => t.replica)
        .sort(),
    ).toEqual(['a', 'b']);

    tunnels.delete('edge');
    a.publisher.changed('edge');
    await settle();
    expect(clusters.get('edge')!.status).toMatchObject({ connected: true, tunnels: [{ replica: 'b' }] });
    expect(a.lease.records.length).toBeGreaterThan(0);
    await a.stop();
    expect(a.lease.deleted).toBe(true);
  });

  it('remembers when it last saw each cluster connected, and says nothing while another live replica holds it', async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        tunnels: [{ replica: 'b', connectedSince: T0 }],
      }),
      cluster('never'),
    ]);
    const leases = new MemoryInformer<LeaseObject>([lease('b', '1')]);
    const clock = fakeClock();
    const a = await replica('a', clusters, leases, fakeStatus(clusters), new Map(), clock);
    // b holds edge's tunnel: a request here that finds no route has none to wait for.
    expect(a.publisher.lastConnected('edge')).toBeUndefined();
    expect(a.publisher.lastConnected('never')).toBeUndefined();
    expect(a.publisher.lastConnected('unknown')).toBeUndefined();
    // A while later b's tunnel goes (its agent moves): asked before the sync that notes it, the time is now all the same.
    clock.advance(300_000);
    const seen = clock.now();
    clusters.put(cluster('edge', { connected: true, connectedSince: T0, tunnels: [] }));
    expect(a.publisher.lastConnected('edge')).toBe(seen);
    await settle();
    // The status then says the cluster is disconnected.
    clock.advance(4_000);
    clusters.put(cluster('edge', { connected: false, connectedSince: T0, tunnels: [] }));
    await settle();
    expect(a.publisher.lastConnected('edge')).toBe(seen);
    // A status that says connected with no live entry, left so (its writer stuck), counts once, not on every change.
    clusters.put(cluster('stale', { connected: true, tunnels: [] }));
    await settle();
    const first = clock.now();
    clock.advance(60_000);
    clusters.put({
      ...cluster('stale', { connected: true, tunnels: [] }),
      metadata: { name: 'stale', resourceVersion: '2' },
    });
    await settle();
    expect(a.publisher.lastConnected('stale')).toBe(first);
    // Removed: forgotten.
    clusters.remove('edge');
    await settle();
    expect(a.publisher.lastConnected('edge')).toBeUndefined();
    await a.stop();
  });

  it('removes the entries of a replica whose Lease stopped changing, within its duration and a check', async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        agentVersion: 'v1',
        tunnels: [{ replica: 'crashed', connectedSince: T0 }],
      }),
      cluster('other', {
        connected: true,
        connectedSince: T0,
        tunnels: [{ replica: 'alive', connectedSince: T0 }],
      }),
    ]);
    const leases = new MemoryInformer<LeaseObject>([lease('crashed', '1'), lease('alive', '1')]);
    const status = fakeStatus(clusters);
    const a = await replica('a', clusters, leases, status, new Map());
    await settle();
    expect(status.removed).toEqual([]);

    // The live replica renews; the crashed one does not.
    for (let ms = 0; ms < REPLICA_LEASE_SECONDS * 1000 + 1000; ms += 1000) {
      leases.put(lease('alive', String(ms + 2)));
      a.clock.advance(1000);
      await settle();
      // Not before the Lease's duration has passed without a change.
      if (ms + 1000 < REPLICA_LEASE_SECONDS * 1000) expect(status.removed).toEqual([]);
    }
    expect(status.removed).toEqual(['edge/crashed']);
    expect(clusters.get('edge')!.status).toMatchObject({ connected: false, agentVersion: 'v1', tunnels: [] });
    expect(clusters.get('other')!.status).toMatchObject({ connected: true, tunnels: [{ replica: 'alive' }] });
    await a.stop();
  });

  it('routes to the live replicas that hold a tunnel and publish a peer address, newest tunnel first', async () => {
    const withAddress = (holder: string, version: string, address?: string): LeaseObject => ({
      ...lease(holder, version),
      metadata: {
        ...lease(holder, version).metadata,
        ...(address ? { annotations: { [PEER_ADDRESS_ANNOTATION]: address } } : {}),
      },
    });
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        tunnels: [
          { replica: 'old', connectedSince: T0 },
          { replica: 'new', connectedSince: T1 },
          { replica: 'crashed', connectedSince: T1 },
          { replica: 'silent', connectedSince: T1 },
          { replica: 'a', connectedSince: T1 },
        ],
      }),
    ]);
    const leases = new MemoryInformer<LeaseObject>([
      withAddress('old', '1', '10.0.0.1:8445'),
      withAddress('new', '1', '10.0.0.2:8445'),
      withAddress('crashed', '1', '10.0.0.3:8445'),
      withAddress('silent', '1'),
    ]);
    const a = await replica('a', clusters, leases, fakeStatus(clusters), new Map());
    expect(a.publisher.holders('edge').map((h) => h.replica)).toEqual(['new', 'crashed', 'old']);
    // The crashed replica's Lease lapses: it is no longer a route, even before its entry is removed.
    for (let ms = 0; ms <= REPLICA_LEASE_SECONDS * 1000; ms += 1000) {
      leases.put(withAddress('old', String(ms + 2), '10.0.0.1:8445'));
      leases.put(withAddress('new', String(ms + 2), '10.0.0.2:8445'));
      a.clock.advance(1000);
    }
    expect(a.publisher.holders('edge')).toEqual([
      { replica: 'new', address: '10.0.0.2:8445' },
      { replica: 'old', address: '10.0.0.1:8445' },
    ]);
    expect(a.publisher.holders('nowhere')).toEqual([]);
    await a.stop();
  });

  it('lists the live replicas with the version each Lease names, and drops one whose Lease lapsed', async () => {
    const withVersion = (holder: string, resourceVersion: string, version?: string): LeaseObject => ({
      ...lease(holder, resourceVersion),
      metadata: {
        ...lease(holder, resourceVersion).metadata,
        ...(version
          ? { annotations: { [REPLICA_VERSION_ANNOTATION]: version, [REPLICA_PROTOCOL_ANNOTATION]: '2.2' } }
          : {}),
      },
    });
    const clusters = new MemoryInformer<Cluster>([]);
    const leases = new MemoryInformer<LeaseObject>([
      withVersion('upgraded', '1', 'v-b'),
      withVersion('crashed', '1', 'v-b'),
      withVersion('older', '1'),
    ]);
    const a = await replica('a', clusters, leases, fakeStatus(clusters), new Map());
    const byName = (): ReplicaVersion[] =>
      a.publisher.versions().sort((x, y) => x.replica.localeCompare(y.replica));
    expect(byName()).toEqual([
      { replica: 'a', version: 'v-a', tunnelProtocol: '2.1' },
      { replica: 'crashed', version: 'v-b', tunnelProtocol: '2.2' },
      { replica: 'older', version: '' },
      { replica: 'upgraded', version: 'v-b', tunnelProtocol: '2.2' },
    ]);
    for (let ms = 0; ms <= REPLICA_LEASE_SECONDS * 1000; ms += 1000) {
      leases.put(withVersion('upgraded', String(ms + 2), 'v-b'));
      leases.put(withVersion('older', String(ms + 2)));
      await tick(a.clock, 1000, 1);
    }
    expect(byName().map((r) => r.replica)).toEqual(['a', 'older', 'upgraded']);
    // A replica that stopped says nothing of itself any more.
    await a.stop();
    expect(byName().map((r) => r.replica)).not.toContain('a');
  });

  it('leaves the removal to the first live replica by name, and takes it over once that one lapses too', async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        tunnels: [{ replica: 'crashed', connectedSince: T0 }],
      }),
    ]);
    const leases = new MemoryInformer<LeaseObject>([lease('crashed', '1'), lease('alive', '1')]);
    const status = fakeStatus(clusters);
    const zed = await replica('zed', clusters, leases, status, new Map());
    for (let ms = 0; ms < REPLICA_LEASE_SECONDS * 1000 + 2000; ms += 1000) {
      leases.put(lease('alive', String(ms + 2)));
      await tick(zed.clock, 1000, 1);
    }
    // 'alive' comes first by name, and removes it (not in this test): 'zed' writes nothing.
    expect(status.removed).toEqual([]);
    expect(status.applies).toEqual([]);
    // 'alive' lapses as well: 'zed' is the first live replica now.
    await tick(zed.clock, 1000, REPLICA_LEASE_SECONDS + 2);
    expect(status.removed).toEqual(['edge/crashed']);
    expect(clusters.get('edge')!.status).toMatchObject({ connected: false, tunnels: [] });
    await zed.stop();
  });

  it('says its refusal of an agent for its protocol, once per reason, though another replica removes lapsed entries', async () => {
    const clusters = new MemoryInformer<Cluster>([cluster('edge')]);
    const leases = new MemoryInformer<LeaseObject>([lease('alive', '1')]);
    const status = fakeStatus(clusters);
    const tunnels = new Map<string, HeldTunnel>();
    const zed = await replica('zed', clusters, leases, status, tunnels);
    const why =
      'the agent speaks tunnel protocol 3.0 and the hub 2.1, which serves agents of 2.0 to 2.2: upgrade the hub';
    zed.publisher.refusedProtocol('edge', why);
    await settle();
    expect(status.applies).toHaveLength(1);
    expect(clusters.get('edge')!.status!.conditions).toEqual([
      expect.objectContaining({ type: AGENT_PROTOCOL_CONDITION, status: 'False', message: why }),
    ]);
    // The agent dials again with its backoff: the same reason writes nothing more.
    zed.publisher.refusedProtocol('edge', why);
    await settle();
    expect(status.applies).toHaveLength(1);
    // Upgraded, it holds a tunnel here: the condition turns True with this replica's entry.
    tunnels.set('edge', held);
    zed.publisher.changed('edge');
    await settle();
    expect(clusters.get('edge')!.status).toMatchObject({
      tunnels: [{ replica: 'zed' }],
      conditions: [{ type: AGENT_PROTOCOL_CONDITION, status: 'True', lastTransitionTime: T0 }],
    });
    await zed.stop();
  });

  it('renews its own Lease, naming the version it replaces', async () => {
    const clusters = new MemoryInformer<Cluster>();
    const leases = new MemoryInformer<LeaseObject>();
    const a = await replica('a', clusters, leases, fakeStatus(clusters), new Map());
    await tick(a.clock, 2000, 5);
    expect(a.lease.records.length).toBeGreaterThanOrEqual(5);
    expect(leases.get(replicaLeaseName('a'), 'ns')?.metadata?.resourceVersion).toBe(
      String(a.lease.records.length),
    );
    await a.stop();
    expect(a.lease.deleted).toBe(true);
  });

  it('keeps trying to renew its Lease every turn, however long the API server refuses (never dropped)', async () => {
    const clusters = new MemoryInformer<Cluster>();
    const leases = new MemoryInformer<LeaseObject>();
    const clock = fakeClock();
    let attempts = 0;
    const refusing: LeaseClient = {
      get: () => (attempts++, Promise.reject(new Error('unavailable'))),
      create: () => Promise.reject(new Error('unavailable')),
      replace: () => Promise.reject(new Error('unavailable')),
      delete: () => Promise.resolve(),
    };
    const manager = newControllerManager({ log: silentLogger(), clock });
    const publisher = newClusterStatus({
      clusters,
      leases,
      lease: refusing,
      deleteLease: () => Promise.resolve(),
      status: fakeStatus(clusters),
      identity: 'a',
      version: 'v-a',
      tunnelProtocol: '2.1',
      held: () => undefined,
      manager,
      clock,
      log: silentLogger(),
    });
    expect(publisher.entries.map((e) => [e.controller.name, e.runs])).toEqual([
      ['cluster-status', 'every-replica'],
      ['replica-lease', 'every-replica'],
      ['lapsed-replicas', 'every-replica'],
    ]);
    manager.add(...publisher.entries);
    await manager.start();
    await tick(clock, 2000, 40);
    expect(attempts).toBeGreaterThanOrEqual(40);
    await publisher.withdraw();
    await manager.stop();
  });

  it('judges no other replica lapsed while its own watch does not show its renewals', async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        tunnels: [{ replica: 'b', connectedSince: T0 }],
      }),
    ]);
    const leases = new MemoryInformer<LeaseObject>([lease('b', '1')]);
    const status = fakeStatus(clusters);
    const a = await replica('a', clusters, leases, status, new Map(), fakeClock(), false);
    await tick(a.clock, 1000, 20);
    expect(status.removed).toEqual([]);
    expect(a.deletedLeases).toEqual([]);
    await a.stop();
  });

  it('deletes the Lease of a replica gone for good, once its entries are gone', async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        tunnels: [{ replica: 'gone', connectedSince: T0 }],
      }),
    ]);
    const leases = new MemoryInformer<LeaseObject>([lease('gone', '1')]);
    const status = fakeStatus(clusters);
    const a = await replica('a', clusters, leases, status, new Map());
    await tick(a.clock, 1000, 2 * REPLICA_LEASE_SECONDS + 2);
    expect(status.removed).toEqual(['edge/gone']);
    expect(a.deletedLeases).toContain(replicaLeaseName('gone'));
    await a.stop();
  });

  it('removes on start the entries an earlier process of the same replica left behind', async () => {
    const clusters = new MemoryInformer<Cluster>([
      cluster('edge', {
        connected: true,
        connectedSince: T0,
        tunnels: [{ replica: 'a', connectedSince: T0 }],
      }),
    ]);
    const status = fakeStatus(clusters);
    const a = await replica('a', clusters, new MemoryInformer<LeaseObject>(), status, new Map());
    await settle();
    expect(clusters.get('edge')!.status).toMatchObject({ connected: false });
    await a.stop();
  });
});
