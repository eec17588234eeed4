// Lease-based leader election against a real API server: one leader at a time, a clean handover when the
// leader stops, and a takeover when the leader can no longer renew.
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { startLeaderElection, type LeaderElection } from '../lib/controller/leader.ts';
import { newKubeClients, newLeaseClient, type KubeClients, type LeaseClient } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';

let cluster: Cluster;
let clients: KubeClients;
/** Electors a test started: one left running after a failure would keep polling, and keep Jest from exiting. */
const electors: LeaderElection[] = [];
const elect = (...args: Parameters<typeof startLeaderElection>): LeaderElection => {
  const elector = startLeaderElection(...args);
  electors.push(elector);
  return elector;
};

beforeAll(async () => {
  cluster = await startCluster({ name: 'leader', controllerManager: false });
  clients = newKubeClients({ path: cluster.kubeconfigPath });
});

afterEach(async () => {
  await Promise.all(electors.splice(0).map((e) => e.stop()));
});

afterAll(async () => {
  await cluster?.stop();
});

const leaders = (electors: LeaderElection[]): number => electors.filter((e) => e.isLeader()).length;

describe('leader election', () => {
  it('elects one leader and hands over when it stops', async () => {
    const leases = newLeaseClient(clients, 'default', 'handover');
    const a = elect({ leases, identity: 'replica-a', log: silentLogger() });
    const b = elect({ leases, identity: 'replica-b', log: silentLogger() });
    await eventually(() => expect(leaders([a, b])).toBe(1));
    const [leader, follower] = a.isLeader() ? [a, b] : [b, a];
    const changes: boolean[] = [];
    follower.onChange((leading) => changes.push(leading));
    await leader.stop();
    await eventually(() => expect(follower.isLeader()).toBe(true));
    // No flapping: the follower became leader once and stayed.
    expect(changes).toEqual([true]);
    expect((await leases.get())?.holder).toBe(follower === a ? 'replica-a' : 'replica-b');
    await follower.stop();
  });

  it('lets another replica take over from a leader that can no longer reach the API server', async () => {
    const leases = newLeaseClient(clients, 'default', 'takeover');
    let cutOff = false;
    const failing: LeaseClient = {
      get: () => (cutOff ? Promise.reject(new Error('connection refused')) : leases.get()),
      create: (l) => (cutOff ? Promise.reject(new Error('connection refused')) : leases.create(l)),
      replace: (l) => (cutOff ? Promise.reject(new Error('connection refused')) : leases.replace(l)),
      delete: () => (cutOff ? Promise.reject(new Error('connection refused')) : leases.delete()),
    };
    const a = elect({ leases: failing, identity: 'replica-a', log: silentLogger() });
    await eventually(() => expect(a.isLeader()).toBe(true));
    const b = elect({ leases, identity: 'replica-b', log: silentLogger() });
    cutOff = true;
    // The lost leader steps down before its Lease expires; the other takes over once it has.
    await eventually(() => expect(a.isLeader()).toBe(false), 20_000);
    await eventually(() => expect(b.isLeader()).toBe(true), 20_000);
    expect((await leases.get())?.holder).toBe('replica-b');
    await a.stop();
    await b.stop();
  });
});
