import { describe, expect, it } from '@jest/globals';
import { fakeClock } from '../../test-support/fake-clock.ts';
import type { LeaseClient, LeaseRecord } from '../kube/kube.ts';
import { silentLogger } from '../log.ts';
import { LEASE_SECONDS, startLeaderElection } from './leader.ts';

/** A Lease kept in memory, with the API server's optimistic concurrency: a replace of a stale version loses. */
function memoryLease(): LeaseClient {
  let record: LeaseRecord | undefined;
  let version = 0;
  return {
    get: () => Promise.resolve(record && { ...record }),
    create(lease) {
      if (record) return Promise.resolve(false);
      record = { ...lease, resourceVersion: String(++version) };
      return Promise.resolve(true);
    },
    replace(lease) {
      if (!record || lease.resourceVersion !== record.resourceVersion) return Promise.resolve(false);
      record = { ...lease, resourceVersion: String(++version) };
      return Promise.resolve(true);
    },
    delete() {
      record = undefined;
      return Promise.resolve();
    },
  };
}

/** Lets the elections' pending Lease calls finish. */
const settle = async (): Promise<void> => {
  for (let i = 0; i < 5; i++) await new Promise((done) => setImmediate(done));
};

describe('leader election', () => {
  it('keeps one leader however far the replicas’ clocks disagree, and replaces one that stops renewing', async () => {
    const leases = memoryLease();
    const [leaderClock, followerClock] = [fakeClock(), fakeClock()];
    // The follower's clock is a minute ahead: by it, every renewTime the leader writes is long past.
    followerClock.advance(60_000);
    const leader = startLeaderElection({ leases, identity: 'a', log: silentLogger(), clock: leaderClock });
    await settle();
    expect(leader.isLeader()).toBe(true);
    const follower = startLeaderElection({
      leases,
      identity: 'b',
      log: silentLogger(),
      clock: followerClock,
    });
    for (let s = 0; s < 3 * LEASE_SECONDS; s++) {
      leaderClock.advance(1000);
      followerClock.advance(1000);
      await settle();
      expect({ second: s, leaders: [leader.isLeader(), follower.isLeader()] }).toEqual({
        second: s,
        leaders: [true, false],
      });
    }
    // The leader stops (its timers never fire again, as if its process hung): the Lease goes unrenewed.
    let waited = 0;
    while (!follower.isLeader() && waited < 3 * LEASE_SECONDS * 1000) {
      followerClock.advance(1000);
      waited += 1000;
      await settle();
    }
    expect(follower.isLeader()).toBe(true);
    // Not before the Lease's whole duration has gone by without a renewal.
    expect(waited).toBeGreaterThan(LEASE_SECONDS * 1000);
    await follower.stop();
  });
});
