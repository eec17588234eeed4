// Lease-based leader election: every replica serves the proxy, only the leader writes. The leader renews the
// Lease every RENEW_MS; the others poll it and take over once it has gone unrenewed for its whole duration, by their
// own clocks: a follower times the Lease from when it last saw it change, never by the renewTime the leader wrote
// (as client-go does), so clocks that disagree by any amount never make a follower take a Lease that is renewed. A
// leader that cannot renew steps down before its Lease could expire, so two replicas never both believe they
// lead; a leader that stops cleanly releases the Lease so the next one takes over at its next poll.
import type { LeaseClient, LeaseRecord } from '../kube/kube.ts';
import { systemClock, type Clock } from '../clock.ts';
import type { Logger } from '../log.ts';

/** How long a Lease holds without renewal. With RETRY_MS, a crashed leader is replaced within ~17 s. */
export const LEASE_SECONDS = 15;
/** How often the leader renews. */
const RENEW_MS = 5_000;
/** How often a follower looks at the Lease. */
const RETRY_MS = 2_000;
/** How long a stop waits to release the Lease. */
const RELEASE_TIMEOUT_MS = 5_000;
/** A leader that has not renewed for this long stops writing, well before its Lease could be taken. */
const STEP_DOWN_AFTER_MS = (LEASE_SECONDS * 1000 * 2) / 3;

export interface LeaderElection {
  isLeader(): boolean;
  /** Called with true on becoming leader and false on losing it. */
  onChange(handler: (leading: boolean) => void): void;
  /** Stops electing; a leader releases the Lease. */
  stop(): Promise<void>;
}

export interface LeaderElectionOptions {
  leases: LeaseClient;
  /** This replica's name in the Lease (the pod name in a cluster). */
  identity: string;
  log: Logger;
  /** Time and timers. Default: the system's. */
  clock?: Clock;
}

export function startLeaderElection(opts: LeaderElectionOptions): LeaderElection {
  const clock = opts.clock ?? systemClock;
  const now = (): number => clock.now();
  const handlers: ((leading: boolean) => void)[] = [];
  let leading = false;
  let lastRenew = 0;
  let stopped = false;
  let timer: unknown;
  let round: Promise<void> = Promise.resolve();
  /** The Lease as this replica last saw it, and when, by its own clock. */
  let seen: { record: string; at: number } | undefined;

  const setLeading = (next: boolean): void => {
    if (next === leading) return;
    leading = next;
    opts.log.info({ identity: opts.identity }, next ? 'became leader' : 'stopped leading');
    for (const h of handlers) h(next);
  };

  const mine = (previous: LeaseRecord | undefined): LeaseRecord => ({
    holder: opts.identity,
    renewTime: now(),
    leaseSeconds: LEASE_SECONDS,
    transitions: (previous?.transitions ?? 0) + (previous?.holder === opts.identity ? 0 : 1),
    ...(previous?.resourceVersion ? { resourceVersion: previous.resourceVersion } : {}),
  });

  /** Whether `lease` has gone unchanged for its whole duration, timed from when this replica saw it change. */
  const expired = (lease: LeaseRecord): boolean => {
    const record = JSON.stringify([lease.holder, lease.renewTime, lease.transitions, lease.resourceVersion]);
    if (seen?.record !== record) seen = { record, at: now() };
    return seen.at + lease.leaseSeconds * 1000 < now();
  };

  async function tryOnce(): Promise<void> {
    const lease = await opts.leases.get();
    let won: boolean;
    if (!lease) won = await opts.leases.create(mine(undefined));
    else if (lease.holder === opts.identity) won = await opts.leases.replace(mine(lease));
    else if (lease.holder === '' || expired(lease)) won = await opts.leases.replace(mine(lease));
    else won = false;
    if (won) lastRenew = now();
    setLeading(won);
  }

  const loop = (): void => {
    round = tryOnce()
      .catch((err: unknown) => {
        opts.log.warn({ err: (err as Error).message }, 'leader election: lease update failed');
        if (leading && now() - lastRenew > STEP_DOWN_AFTER_MS) setLeading(false);
      })
      .finally(() => {
        if (!stopped) timer = clock.setTimeout(loop, leading ? RENEW_MS : RETRY_MS);
      });
  };
  loop();

  return {
    // Not only the flag: a renewal that hangs (no answer, no error) must not let this replica go on writing after
    // another may have taken the Lease.
    isLeader: () => leading && now() - lastRenew <= STEP_DOWN_AFTER_MS,
    onChange(handler) {
      handlers.push(handler);
    },
    async stop() {
      stopped = true;
      clock.clearTimeout(timer);
      const release = (async () => {
        await round;
        if (!leading) return;
        setLeading(false);
        try {
          const lease = await opts.leases.get();
          if (lease?.holder === opts.identity)
            await opts.leases.replace({ ...lease, holder: '', renewTime: now() });
        } catch (err) {
          opts.log.warn({ err: (err as Error).message }, 'leader election: could not release the lease');
        }
      })();
      // Releasing is a courtesy that saves the others the Lease's duration; a stop never waits on a dead API server.
      let timeout: unknown;
      const gaveUp = new Promise<void>((done) => {
        timeout = clock.setTimeout(() => {
          opts.log.warn('leader election: the lease was not released in time; it expires on its own');
          done();
        }, RELEASE_TIMEOUT_MS);
      });
      await Promise.race([release, gaveUp]);
      clock.clearTimeout(timeout);
      setLeading(false);
    },
  };
}
