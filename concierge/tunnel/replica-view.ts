// What a replica knows of the others, for cluster-status.ts: which are alive (judged by when this process last saw
// each one's Lease change, on its own clock, as client-go's leader election does: the replicas' clocks need not
// agree), which of them removes lapsed replicas' entries, and which clusters each one has an entry in.
import type { Cluster } from '../../apis/tunnel.ts';
import type { Clock } from '../../lib/clock.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import type { LeaseObject } from '../../lib/kube/kube.ts';

/** How long a replica's Lease holds without renewal; with CHECK_MS, a crashed replica's tunnels go in about 7 s. */
export const REPLICA_LEASE_SECONDS = 6;

export class Liveness {
  /** When this process last saw each replica's Lease change, or first missed a Lease it looked for. */
  private readonly seen = new Map<string, { version: string; at: number }>();
  private readonly leases: Informer<LeaseObject>;
  private readonly identity: string;
  private readonly clock: Clock;
  /** Set when this replica withdraws: it is no longer alive, and removes nothing. */
  stopped = false;

  constructor(leases: Informer<LeaseObject>, identity: string, clock: Clock) {
    this.leases = leases;
    this.identity = identity;
    this.clock = clock;
    // From now on: a process whose watch never shows its own Lease never judges another replica lapsed.
    this.unchangedFor(identity);
  }

  leaseOf(replica: string): LeaseObject | undefined {
    return this.leases.list().find((l) => l.spec?.holderIdentity === replica);
  }

  /** How long ago this process last saw `replica`'s Lease change (0: just now, or for the first time). */
  unchangedFor(replica: string): number {
    const version = this.leaseOf(replica)?.metadata?.resourceVersion ?? '';
    const last = this.seen.get(replica);
    if (!last || last.version !== version) {
      this.seen.set(replica, { version, at: this.clock.now() });
      return 0;
    }
    return this.clock.now() - last.at;
  }

  durationOf(replica: string): number {
    return (this.leaseOf(replica)?.spec?.leaseDurationSeconds ?? REPLICA_LEASE_SECONDS) * 1000;
  }

  /**
   * Whether this process's view of the Leases is current: it has seen its own renewals. A watch that stalls or
   * restarts would otherwise make every other replica look dead; then nothing is judged lapsed.
   */
  viewFresh(): boolean {
    return this.unchangedFor(this.identity) < REPLICA_LEASE_SECONDS * 1000;
  }

  alive(replica: string): boolean {
    if (replica === this.identity) return !this.stopped;
    return this.unchangedFor(replica) < this.durationOf(replica) || !this.viewFresh();
  }

  /**
   * Whether this replica is the one that removes lapsed replicas' entries and writes the fields derived from them:
   * the first live replica by name. One writer instead of every replica racing the same patches (each but the
   * first failing its `test`), which after a replica with thousands of tunnels died held up the entries of the
   * replicas their agents moved to. Should two replicas each think they are first for a moment, the `test`
   * operations keep their patches apart.
   */
  removesLapsed(): boolean {
    if (this.stopped) return false;
    for (const lease of this.leases.list()) {
      const replica = lease.spec?.holderIdentity;
      if (replica && replica < this.identity && this.alive(replica)) return false;
    }
    return true;
  }

  /** The replicas this process remembers having seen. */
  remembered(): Iterable<string> {
    return this.seen.keys();
  }

  forget(replica: string): void {
    this.seen.delete(replica);
  }
}

/** The clusters each replica has an entry in, from the cache, so a lapsed Lease finds them without a scan. */
export class EntryIndex {
  private readonly entriesOf = new Map<string, Set<string>>();
  private readonly replicasIn = new Map<string, string[]>();
  private readonly clusters: Informer<Cluster>;

  constructor(clusters: Informer<Cluster>) {
    this.clusters = clusters;
  }

  /** Keeps the index in step with the cache's view of cluster `name` (gone: no entries). */
  update(name: string): void {
    for (const replica of this.replicasIn.get(name) ?? []) {
      const set = this.entriesOf.get(replica);
      set?.delete(name);
      if (set?.size === 0) this.entriesOf.delete(replica);
    }
    const now = this.clusters.get(name)?.status?.tunnels?.map((t) => t.replica) ?? [];
    this.replicasIn.set(name, now);
    if (now.length === 0) this.replicasIn.delete(name);
    for (const replica of now) {
      let set = this.entriesOf.get(replica);
      if (!set) this.entriesOf.set(replica, (set = new Set()));
      set.add(name);
    }
  }

  /** The clusters `replica` has an entry in. */
  of(replica: string): Iterable<string> {
    return this.entriesOf.get(replica) ?? [];
  }

  has(replica: string): boolean {
    return this.entriesOf.has(replica);
  }

  /** Every replica with an entry somewhere, and the clusters it has them in. */
  all(): Iterable<[string, Set<string>]> {
    return this.entriesOf;
  }
}
