// A Cluster's status from facts, not events. Each replica publishes two facts about itself: a Lease it renews while
// it lives, and its own entry in the status.tunnels of each Cluster whose agent it holds a tunnel to (a server-side
// apply under a field manager of its own, so replicas never overwrite each other's entries). Every replica derives
// the rest (connected, since when, the agent's version and certificate expiry) from the entries of live replicas,
// and removes the entries of replicas whose Lease has lapsed: the tunnels of a replica that crashed show
// disconnected within seconds, with no leader needed. A replica that stops cleanly removes its entries and Lease.
//
// Liveness is judged by when this process last saw a Lease change, on its own clock, as client-go's leader election
// does: the replicas' clocks need not agree.
//
// Three controllers of the manager keep it, on every replica: `cluster-status` (a Cluster's status from the facts),
// `replica-lease` (this replica's Lease, renewed every 2 s) and `lapsed-replicas` (a look every second for Leases
// that stopped changing, which make no event of their own). The manager starts and stops them with the rest.
import {
  PEER_ADDRESS_ANNOTATION,
  REPLICA_PROTOCOL_ANNOTATION,
  REPLICA_VERSION_ANNOTATION,
} from '../../apis/install.ts';
import { createHash } from 'node:crypto';
import { isIP } from 'node:net';
import type { Condition } from '../../apis/meta.ts';
import {
  AGENT_PROTOCOL_CONDITION,
  type Cluster,
  type ClusterStatus,
  type TunnelHolder,
} from '../../apis/tunnel.ts';

export { AGENT_PROTOCOL_CONDITION } from '../../apis/tunnel.ts';
import type { Clock } from '../../lib/clock.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import {
  FIELD_MANAGER,
  type LeaseClient,
  type LeaseObject,
  type LeaseRecord,
  type StatusApplier,
} from '../../lib/kube/kube.ts';
import type { Logger } from '../../lib/log.ts';
import type { ControllerEntry } from '../../lib/controller/controller.ts';
import type { ControllerManager } from '../../lib/controller/manager.ts';
import { EntryIndex, Liveness, REPLICA_LEASE_SECONDS } from './replica-view.ts';

/** The label every replica Lease carries, as a selector. */
export const REPLICA_LEASE_LABEL = 'app.kubernetes.io/component=concierge-replica';
export { REPLICA_LEASE_SECONDS } from './replica-view.ts';
const RENEW_MS = 2_000;
/** How often lapsed Leases are looked for. */
const CHECK_MS = 1_000;
/** Status writes in flight at once: enough to keep up with agents connecting after a restart. */
const WRITERS = 8;
/** How long a clean stop waits for its entries to be removed. */
const RELEASE_TIMEOUT_MS = 5_000;

/** The controllers' names. */
export const CLUSTER_STATUS = 'cluster-status';
export const REPLICA_LEASE = 'replica-lease';
export const LAPSED_REPLICAS = 'lapsed-replicas';

/** A live replica that holds a cluster's tunnel, and where its peers reach it. */
export interface RemoteHolder {
  replica: string;
  address: string;
}

/** A live replica and the version it runs. */
export interface ReplicaVersion {
  replica: string;
  version: string;
  /** The tunnel protocol it serves, `major.minor`; absent when its Lease does not say. */
  tunnelProtocol?: string;
}

/** The Lease name of a replica: its identity when that is a valid name, else a digest of it. */
export function replicaLeaseName(identity: string): string {
  const name = `sealion-concierge-replica-${identity}`;
  return /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(name)
    ? name
    : `sealion-concierge-replica-${createHash('sha256').update(identity).digest('hex').slice(0, 32)}`;
}

/** The field manager that owns a replica's entries (at most 128 printable characters). */
export function replicaFieldManager(identity: string): string {
  const name = `${FIELD_MANAGER}/${identity}`;
  return name.length <= 128 && /^[\x21-\x7e]+$/.test(name)
    ? name
    : `${FIELD_MANAGER}/${createHash('sha256').update(identity).digest('hex').slice(0, 32)}`;
}

/** What this replica knows of a tunnel it holds. */
export type HeldTunnel = Omit<Required<TunnelHolder>, 'replica'>;

/** What the agent says of itself on a tunnel, taken into the status from its newest tunnel. */
const AGENT_FACTS = ['agentVersion', 'certificateExpiry', 'policy', 'impersonation'] as const;
type AgentFacts = Pick<ClusterStatus, (typeof AGENT_FACTS)[number]>;

/** The fields every replica derives from the live entries. */
type Derived = Pick<ClusterStatus, 'connected' | 'replicas' | 'connectedSince' | 'conditions'> & AgentFacts;

/** The protocol condition's reasons (AGENT_PROTOCOL_CONDITION). */
export const WITHIN_SKEW_POLICY = 'WithinSkewPolicy';
export const OUTSIDE_SKEW_POLICY = 'OutsideSkewPolicy';

/** A refusal of the agent for its protocol, by this replica, not yet in the status: why, and when by our clock. */
export interface ProtocolRefusal {
  message: string;
  at: string;
}

/**
 * The protocol condition from the facts, or undefined while there is none to state. A tunnel that is up proves the
 * agent served, whatever a replica refused before: a False condition turns True since the tunnel's connectedSince,
 * a time every replica derives alike. Else this replica's refusal, else what the status says already (a refusal stays said
 * when the replica that wrote it is gone: it was true, and stays so until a tunnel comes up).
 */
function protocolCondition(
  current: Condition | undefined,
  connectedSince: string | undefined,
  refusal: ProtocolRefusal | undefined,
): Condition | undefined {
  if (connectedSince) {
    if (!current || current.status === 'True') return current;
    return {
      type: AGENT_PROTOCOL_CONDITION,
      status: 'True',
      reason: WITHIN_SKEW_POLICY,
      message: "a tunnel is up: the agent's tunnel protocol is served",
      lastTransitionTime: connectedSince,
    };
  }
  if (!refusal) return current;
  return {
    type: AGENT_PROTOCOL_CONDITION,
    status: 'False',
    reason: OUTSIDE_SKEW_POLICY,
    message: refusal.message,
    lastTransitionTime: current?.status === 'False' ? current.lastTransitionTime : refusal.at,
  };
}

/**
 * The status's conditions with the protocol condition as derived. Every apply carries it: under server-side apply
 * a field left out of an apply by the manager that owns it would be removed.
 */
function derivedConditions(
  current: ClusterStatus,
  connectedSince: string | undefined,
  refusal: ProtocolRefusal | undefined,
): Pick<ClusterStatus, 'conditions'> {
  const was = current.conditions?.find((c) => c.type === AGENT_PROTOCOL_CONDITION);
  const condition = protocolCondition(was, connectedSince, refusal);
  return condition ? { conditions: [condition] } : {};
}

/** The agent's facts from `from`, each falling back to `fallback`'s; absent ones left out. */
function agentFacts(from: AgentFacts, fallback: AgentFacts): AgentFacts {
  const facts: Record<string, string> = {};
  for (const key of AGENT_FACTS) {
    const value = from[key] ?? fallback[key];
    if (value) facts[key] = value;
  }
  return facts;
}

/**
 * The derived fields for `live` entries. A cluster that stays connected keeps its connectedSince; what the agent
 * says of itself (version, certificate expiry, policy) comes from its newest tunnel, and stays as it was once it has
 * none.
 */
export function deriveStatus(
  current: ClusterStatus,
  live: readonly TunnelHolder[],
  refusal?: ProtocolRefusal,
): Derived {
  if (live.length === 0) {
    return {
      connected: false,
      // Empty rather than absent: a field left out of an apply stays as another replica last wrote it.
      replicas: '',
      ...(current.connectedSince ? { connectedSince: current.connectedSince } : {}),
      ...agentFacts(current, {}),
      ...derivedConditions(current, undefined, refusal),
    };
  }
  const bySince = [...live].sort((a, b) => a.connectedSince.localeCompare(b.connectedSince));
  const newest = bySince[bySince.length - 1]!;
  const connectedSince =
    current.connected && current.connectedSince ? current.connectedSince : bySince[0]!.connectedSince;
  return {
    connected: true,
    replicas: live
      .map((t) => t.replica)
      .sort()
      .join(','),
    connectedSince,
    ...agentFacts(newest, current),
    ...derivedConditions(current, connectedSince, refusal),
  };
}

const entryKey = (a: TunnelHolder | undefined): string =>
  JSON.stringify(a && [a.replica, a.connectedSince, a.transport, ...AGENT_FACTS.map((k) => a[k])]);
const sameEntry = (a: TunnelHolder | undefined, b: TunnelHolder | undefined): boolean =>
  entryKey(a) === entryKey(b);

const sameDerived = (status: ClusterStatus, derived: Derived): boolean =>
  status.connected === derived.connected &&
  (status.replicas ?? '') === derived.replicas &&
  status.connectedSince === derived.connectedSince &&
  AGENT_FACTS.every((k) => status[k] === derived[k]) &&
  sameProtocolCondition(status, derived);

const protocolConditionOf = (status: Pick<ClusterStatus, 'conditions'>): string =>
  JSON.stringify(status.conditions?.find((c) => c.type === AGENT_PROTOCOL_CONDITION));
const sameProtocolCondition = (status: ClusterStatus, derived: Derived): boolean =>
  protocolConditionOf(status) === protocolConditionOf(derived);

export interface ClusterStatusOptions {
  clusters: Informer<Cluster>;
  /** The replica Leases of the concierge's namespace (REPLICA_LEASE_LABEL). */
  leases: Informer<LeaseObject>;
  /** This replica's own Lease. */
  lease: LeaseClient;
  /** Deletes the Lease `name` (a replica's that lapsed long ago). */
  deleteLease(name: string): Promise<void>;
  status: StatusApplier<ClusterStatus>;
  identity: string;
  /** The version this replica runs (its Lease's REPLICA_VERSION_ANNOTATION says the same to the others). */
  version: string;
  /** The tunnel protocol it serves agents with (REPLICA_PROTOCOL_ANNOTATION on its Lease). */
  tunnelProtocol: string;
  /** The tunnel this replica holds to a cluster's agent, if any. */
  held(cluster: string): HeldTunnel | undefined;
  /** The manager that runs the controllers: clusters are queued on it, and a withdrawal waits for it. */
  manager: Pick<ControllerManager, 'enqueue' | 'idle'>;
  clock: Clock;
  log: Logger;
}

export interface ClusterStatusPublisher {
  /** The controllers, for the manager: every replica runs them. */
  entries: ControllerEntry[];
  /** This replica's tunnel to `cluster` came or went. */
  changed(cluster: string): void;
  /**
   * This replica refused `cluster`'s agent for its tunnel protocol, for the reason `message`: the Cluster's
   * AGENT_PROTOCOL_CONDITION says so until a tunnel is up.
   */
  refusedProtocol(cluster: string, message: string): void;
  /**
   * The other live replicas whose entries say they hold `cluster`'s tunnel and that publish a peer address, newest
   * tunnel first (an agent that moved is likelier on its latest replica).
   */
  holders(cluster: string): RemoteHolder[];
  /**
   * When this process last found `cluster`'s agent connected (a live replica's entry in its status, or this replica's
   * tunnel), on its own clock; undefined when it never did, or when another live replica holds the tunnel now (a
   * request that finds no route then is on a replica without peering, and waiting brings none until the tunnel
   * moves).
   */
  lastConnected(cluster: string): number | undefined;
  /** Whether `ip` is the host of a peer address some replica publishes (or some replica publishes a name). */
  knownSource(ip: string): boolean;
  /** The other live replicas, where their peer listeners are. */
  replicas(): RemoteHolder[];
  /**
   * Every live replica, this one included while it runs, and the version its Lease says it runs ('' for a replica
   * that says none: one older than the annotation). A replica whose Lease lapsed is not in it, as for tunnels.
   */
  versions(): ReplicaVersion[];
  /**
   * Removes this replica's entries and Lease (waiting a few seconds at most) and publishes nothing more. The
   * controllers must still run (the removals are their syncs): call it before the manager stops.
   */
  withdraw(): Promise<void>;
}

/** What the publisher's pieces share. */
interface Publishing {
  opts: ClusterStatusOptions;
  fieldManager: string;
  liveness: Liveness;
  index: EntryIndex;
  /** This replica's refusals of agents for their protocol, by cluster, until the status says them. */
  refusals: Map<string, ProtocolRefusal>;
  /** When this process last saw each registered cluster connected (lastConnected). */
  connectedAt: Map<string, number>;
  /** The clusters a live replica held at their last sync here. */
  live: Set<string>;
}

/**
 * The entries of `status` other than this replica's: those of live replicas, in order, and those of lapsed ones, last
 * first, with where they were read.
 */
function otherEntries(
  at: Publishing,
  entries: readonly TunnelHolder[],
): { others: TunnelHolder[]; lapsedEntries: { index: number; replica: string }[] } {
  const others: TunnelHolder[] = [];
  const lapsedEntries: { index: number; replica: string }[] = [];
  for (let i = entries.length - 1; i >= 0; i--) {
    const entry = entries[i]!;
    if (entry.replica === at.opts.identity) continue;
    if (at.liveness.alive(entry.replica)) others.unshift(entry);
    else lapsedEntries.push({ index: i, replica: entry.replica });
  }
  return { others, lapsedEntries };
}

// Transient failures (the API server, a `test` that found an entry moved) throw and are retried.
async function syncCluster(at: Publishing, name: string): Promise<void> {
  const { opts, liveness } = at;
  at.index.update(name);
  const cluster = opts.clusters.get(name);
  if (!cluster) {
    at.connectedAt.delete(name);
    at.live.delete(name);
    return void at.refusals.delete(name);
  }
  const status = cluster.status ?? {};
  const entries = status.tunnels ?? [];
  const held = liveness.stopped ? undefined : opts.held(name);
  const mine: TunnelHolder | undefined = held ? { ...held, replica: opts.identity } : undefined;
  const { others, lapsedEntries } = otherEntries(at, entries);
  noteConnection(at, name, mine !== undefined || others.length > 0, status.connected === true);
  const remover = liveness.removesLapsed();
  // This replica's own entry first: other replicas route by it, and it needs nothing else written before it.
  const refusal = at.refusals.get(name);
  const derived = deriveStatus(status, mine ? [...others, mine] : others, refusal);
  const current = entries.find((e) => e.replica === opts.identity);
  // A refusal is this replica's to say, whoever removes lapsed entries; said once (or overtaken by a tunnel) it is
  // forgotten, so an agent that dials again and again costs a write only when the reason changes.
  const refusalToSay = refusal !== undefined && !sameProtocolCondition(status, derived);
  if (!sameEntry(current, mine) || refusalToSay || (remover && !sameDerived(status, derived)))
    await opts.status.apply(name, { ...derived, ...(mine ? { tunnels: [mine] } : {}) }, at.fieldManager);
  if (refusal && at.refusals.get(name) === refusal) at.refusals.delete(name);
  if (!remover) return;
  // Then lapsed replicas' entries, each only if it is still where it was read (a `test` operation; one that moved
  // fails the patch, and the sync runs again on what the API server has now). The last goes first, so that the
  // places read for the others stay right.
  for (const { index, replica } of lapsedEntries) {
    opts.log.info({ cluster: name, replica }, 'removing the tunnel of a replica whose Lease lapsed');
    await opts.status.jsonPatch(name, [
      { op: 'test', path: `/status/tunnels/${index}/replica`, value: replica },
      { op: 'remove', path: `/status/tunnels/${index}` },
    ]);
  }
}

// This replica's Lease: created at start, renewed while the process lives. An update must name the version it
// replaces (the API server refuses an unconditional one for Leases): the cache's, else the API server's.
async function renewLease(at: Publishing): Promise<void> {
  const { opts } = at;
  const record = (resourceVersion: string | undefined): LeaseRecord => ({
    holder: opts.identity,
    renewTime: opts.clock.now(),
    leaseSeconds: REPLICA_LEASE_SECONDS,
    transitions: 0,
    ...(resourceVersion ? { resourceVersion } : {}),
  });
  const cached = at.liveness.leaseOf(opts.identity)?.metadata?.resourceVersion;
  if (cached && (await opts.lease.replace(record(cached)))) return;
  const current = await opts.lease.get();
  const written = current
    ? await opts.lease.replace(record(current.resourceVersion))
    : await opts.lease.create(record(undefined));
  if (!written) throw new Error('the replica Lease changed while it was renewed');
}

/** The look for Leases that stopped changing, which make no event of their own. */
class LapsedCheck {
  /** Replicas found lapsed, whose clusters were queued once. */
  private readonly lapsed = new Set<string>();
  /** Whether this replica removed lapsed entries at the last look. */
  private wasRemover = false;
  private readonly at: Publishing;

  constructor(at: Publishing) {
    this.at = at;
  }

  check(): void {
    this.queueLapsed();
    this.deleteGoneLeases();
    this.forgetGone();
  }

  /**
   * Queues the clusters of replicas that lapsed since the last look. A replica that has just become the remover
   * (the one before it lapsed) takes up what is left to remove.
   */
  private queueLapsed(): void {
    const { opts, liveness, index } = this.at;
    const remover = liveness.removesLapsed();
    const takeOver = remover && !this.wasRemover;
    this.wasRemover = remover;
    for (const [replica, clusters] of index.all()) {
      if (replica === opts.identity) continue;
      if (liveness.alive(replica)) this.lapsed.delete(replica);
      else if (!this.lapsed.has(replica) || takeOver) {
        this.lapsed.add(replica);
        for (const name of clusters) opts.manager.enqueue(CLUSTER_STATUS, name);
      }
    }
  }

  /** A Lease lapsed twice its duration, with no entries left, goes. */
  private deleteGoneLeases(): void {
    const { opts, liveness, index } = this.at;
    for (const lease of opts.leases.list()) {
      const replica = lease.spec?.holderIdentity ?? '';
      if (!replica || replica === opts.identity || index.has(replica) || !liveness.viewFresh()) continue;
      if (liveness.unchangedFor(replica) < 2 * liveness.durationOf(replica)) continue;
      opts.log.info({ replica }, 'deleting the Lease of a replica gone for good');
      opts
        .deleteLease(lease.metadata?.name ?? '')
        .catch((err: unknown) =>
          opts.log.warn({ err: (err as Error).message }, 'deleting a lapsed Lease failed'),
        );
    }
  }

  /** What this process knew of a replica with neither entries nor Lease goes. */
  private forgetGone(): void {
    const { opts, liveness, index } = this.at;
    for (const replica of [...liveness.remembered()])
      if (replica !== opts.identity && !index.has(replica) && !liveness.leaseOf(replica)) {
        liveness.forget(replica);
        this.lapsed.delete(replica);
      }
  }
}

/** The three controllers, for the manager: every replica runs them. */
function statusControllers(at: Publishing): ControllerEntry[] {
  const { opts, liveness } = at;
  const lapsedCheck = new LapsedCheck(at);
  return [
    {
      // Every cluster at start: entries a previous process of this replica left, and lapsed ones, go then.
      controller: {
        name: CLUSTER_STATUS,
        watches: [{ informer: opts.clusters }],
        reads: [opts.leases],
        sync: (name) => syncCluster(at, name),
      },
      runs: 'every-replica',
      // Enough writers to keep up with agents connecting after a restart; retries within half a minute.
      queue: { workers: WRITERS, baseDelayMs: 100, maxDelayMs: 30_000 },
    },
    {
      controller: {
        name: REPLICA_LEASE,
        watches: [],
        reads: [opts.leases],
        initialKeys: [REPLICA_LEASE],
        // Never throws: a failed renewal is tried again at the next turn (a retry cap must never drop the Lease).
        async sync() {
          if (liveness.stopped) return;
          try {
            await renewLease(at);
          } catch (err) {
            opts.log.warn({ err: (err as Error).message }, 'renewing the replica Lease failed');
          }
          return liveness.stopped ? undefined : { requeueAfterMs: RENEW_MS };
        },
      },
      runs: 'every-replica',
    },
    {
      controller: {
        name: LAPSED_REPLICAS,
        watches: [],
        reads: [opts.leases, opts.clusters],
        initialKeys: [LAPSED_REPLICAS],
        // Lapsed Leases make no event of their own: this looks for them, every CHECK_MS. It only reads and queues.
        sync() {
          if (liveness.stopped) return Promise.resolve();
          lapsedCheck.check();
          return Promise.resolve({ requeueAfterMs: CHECK_MS });
        },
      },
      runs: 'every-replica',
    },
  ];
}

/** Whether `ip` is the host of a peer address some replica publishes (or some replica publishes a name). */
function knownSource(leases: Informer<LeaseObject>, ip: string): boolean {
  for (const lease of leases.list()) {
    const address = lease.metadata?.annotations?.[PEER_ADDRESS_ANNOTATION];
    if (!address) continue;
    const host = address.slice(0, address.lastIndexOf(':')).replace(/^\[|\]$/g, '');
    if (host === ip || !isIP(host)) return true;
  }
  return false;
}

/** The other live replicas that publish a peer address. */
function liveReplicas(at: Publishing): RemoteHolder[] {
  const found: RemoteHolder[] = [];
  for (const lease of at.opts.leases.list()) {
    const replica = lease.spec?.holderIdentity;
    const address = lease.metadata?.annotations?.[PEER_ADDRESS_ANNOTATION];
    if (replica && address && replica !== at.opts.identity && at.liveness.alive(replica))
      found.push({ replica, address });
  }
  return found;
}

/** Every live replica and the version it runs, this one included while it runs. */
function replicaVersions(at: Publishing): ReplicaVersion[] {
  const { opts, liveness } = at;
  const found: ReplicaVersion[] = liveness.stopped
    ? []
    : [{ replica: opts.identity, version: opts.version, tunnelProtocol: opts.tunnelProtocol }];
  for (const lease of opts.leases.list()) {
    const replica = lease.spec?.holderIdentity;
    if (!replica || replica === opts.identity || !liveness.alive(replica)) continue;
    const annotations = lease.metadata?.annotations ?? {};
    const protocol = annotations[REPLICA_PROTOCOL_ANNOTATION];
    found.push({
      replica,
      version: annotations[REPLICA_VERSION_ANNOTATION] ?? '',
      ...(protocol === undefined ? {} : { tunnelProtocol: protocol }),
    });
  }
  return found;
}

/** The other live replicas holding `cluster`'s tunnel that publish a peer address, newest tunnel first. */
function remoteHolders(at: Publishing, cluster: string): RemoteHolder[] {
  const { opts, liveness } = at;
  const entries = opts.clusters.get(cluster)?.status?.tunnels ?? [];
  const found: (RemoteHolder & { since: string })[] = [];
  for (const entry of entries) {
    if (entry.replica === opts.identity || !liveness.alive(entry.replica)) continue;
    const address = liveness.leaseOf(entry.replica)?.metadata?.annotations?.[PEER_ADDRESS_ANNOTATION];
    if (address) found.push({ replica: entry.replica, address, since: entry.connectedSince });
  }
  return found
    .sort((a, b) => b.since.localeCompare(a.since))
    .map(({ replica, address }) => ({ replica, address }));
}

/**
 * Notes, at a sync of `name`, whether a live replica holds its tunnel (`live`): the time is set at each sync that finds
 * one, and at the first look (a sync, or lastConnected) that finds none any more. A status that says `connected`
 * with no live entry (not yet rewritten) counts only when nothing is known yet, for a process that starts in such a
 * gap: a status left stale (its writer stuck) never makes requests wait long after.
 */
function noteConnection(at: Publishing, name: string, live: boolean, statusSaysConnected: boolean): void {
  const was = at.live.has(name);
  if (live || was || (statusSaysConnected && !at.connectedAt.has(name)))
    at.connectedAt.set(name, at.opts.clock.now());
  if (live) at.live.add(name);
  else at.live.delete(name);
}

function lastConnected(at: Publishing, name: string): number | undefined {
  const { opts, liveness } = at;
  const status = opts.clusters.get(name)?.status;
  if (!status) return undefined;
  // Another live replica holds it: the router would have a route to it, were peering on; waiting brings none.
  if (otherEntries(at, status.tunnels ?? []).others.length > 0) return undefined;
  // The holder's entry has just gone from the cache and the sync that notes it has not run yet (the queue is busiest
  // in a rollout, when this matters): the cluster was connected until now.
  const held = !liveness.stopped && opts.held(name) !== undefined;
  if (!held && at.live.has(name)) noteConnection(at, name, false, false);
  return at.connectedAt.get(name);
}

/**
 * Removes this replica's entries and Lease, with one deadline for all of it: a stop never waits on an API server
 * that does not answer.
 */
async function withdraw(at: Publishing): Promise<void> {
  const { opts } = at;
  const { manager, clock } = opts;
  at.liveness.stopped = true;
  const release = (async () => {
    for (const name of at.index.of(opts.identity)) manager.enqueue(CLUSTER_STATUS, name);
    await manager.idle(CLUSTER_STATUS);
    // A renewal under way ends before the Lease goes; none starts after (stopped).
    await manager.idle(REPLICA_LEASE);
    await opts.lease.delete();
  })().catch((err: unknown) =>
    opts.log.warn({ err: (err as Error).message }, 'removing the replica Lease failed'),
  );
  let timer: unknown;
  await Promise.race([
    release,
    new Promise<void>((done) => (timer = clock.setTimeout(done, RELEASE_TIMEOUT_MS))),
  ]);
  clock.clearTimeout(timer);
}

export function newClusterStatus(opts: ClusterStatusOptions): ClusterStatusPublisher {
  const at: Publishing = {
    opts,
    fieldManager: replicaFieldManager(opts.identity),
    liveness: new Liveness(opts.leases, opts.identity, opts.clock),
    index: new EntryIndex(opts.clusters),
    refusals: new Map(),
    connectedAt: new Map(),
    live: new Set(),
  };
  let withdrawn: Promise<void> | undefined;
  return {
    entries: statusControllers(at),
    changed: (cluster) => opts.manager.enqueue(CLUSTER_STATUS, cluster),
    refusedProtocol(cluster, message) {
      if (at.liveness.stopped) return;
      at.refusals.set(cluster, { message, at: new Date(opts.clock.now()).toISOString() });
      opts.manager.enqueue(CLUSTER_STATUS, cluster);
    },
    knownSource: (ip) => knownSource(opts.leases, ip),
    replicas: () => liveReplicas(at),
    versions: () => replicaVersions(at),
    holders: (cluster) => remoteHolders(at, cluster),
    lastConnected: (cluster) => lastConnected(at, cluster),
    withdraw: () => (withdrawn ??= withdraw(at)),
  };
}
