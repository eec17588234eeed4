// What a replica does when it is told to stop (SIGTERM): the drain. In order:
//   a. readiness off (/readyz 503, liveness stays 200), `draining` logged with the settings;
//   b. everything still served for the shutdown delay, while Endpoints and load balancers forget the replica;
//   c. no new connections on any listener (idle keep-alive connections closed, HTTP/2 GOAWAY);
//   d. the tunnels handed over to other replicas;
//   e. plain requests in flight finish; watches end as the API server ends one at its timeout, so clients resume by
//      resourceVersion;
//   f. long sessions (exec, attach, port-forward, reach, SSH) get the shutdown grace to end, then each is closed with
//      a message on the session;
//   g. the rest stops (the lifecycle's stop), `drained` logged with the counts.
// The sessions register here as they start (Sessions); the steps that need a part's work (c, d) are given in.
import type { Clock } from '../lib/clock.ts';
import type { Logger } from '../lib/log.ts';

/**
 * How long the replica keeps serving after SIGTERM before it stops taking connections. Default 15 s: kube-proxy and
 * the Endpoints controller take a second or two to drop a pod that turned unready, but a cloud load balancer drops it
 * only after its health check fails `unhealthy threshold` times in a row, commonly 2 x 5 s; the API server's own
 * --shutdown-delay-duration waits for the same reason. Shorter loses the requests still sent here meanwhile; longer
 * only makes a rollout slower.
 */
export const DEFAULT_SHUTDOWN_DELAY_SECONDS = 15;

/**
 * How long long sessions (exec, attach, port-forward, reach, SSH) may go on once the replica stops taking
 * connections, before each is closed with a message. Default 30 s: enough for a command under way to finish and for a
 * user to read the warning, short enough that delay + grace + the stop fit in the install's
 * terminationGracePeriodSeconds (60 s) with a margin.
 */
export const DEFAULT_SHUTDOWN_GRACE_SECONDS = 30;

/**
 * How long sessions closed with the message have to write it and close before the stop cuts them: a message waits for
 * the end of the frame under way (proxy/session-close.ts) and is a few hundred bytes, so a client that reads at all
 * has it at once; lib/http2/upgrade.ts's endAndClose cuts one that does not after as long.
 */
export const CLOSING_MS = 5_000;

/** What a user reads on a session this replica closes. */
export const SHUTDOWN_MESSAGE =
  'sealion: this gateway replica is shutting down for an upgrade; run the command again';

/** The kinds of long sessions, as counted and logged. */
export type SessionKind = 'exec' | 'attach' | 'port-forward' | 'reach' | 'ssh' | 'stream';

/** Ends a watch at an event's boundary, the response complete. */
export type EndWatch = () => void;
/** Closes a session with `message`, by its protocol's means. */
export type CloseSession = (message: string) => void;

/** The requests, watches and sessions this replica serves now, registered as they begin. */
export interface Sessions {
  /** A plain request is on its way; the returned function says it finished (idempotent). */
  request(): () => void;
  /** A watch is on its way; `end` ends it cleanly. The returned function says it ended (idempotent). */
  watch(end: EndWatch): () => void;
  /** A long session is open; `close` closes it with a message. The returned function says it ended (idempotent). */
  session(kind: SessionKind, close: CloseSession): () => void;
  /** Whether the drain has begun: readiness is off from then on. */
  draining(): boolean;
}

/** The counts `drained` logs. */
export interface DrainCounts {
  /** Plain requests that finished after the drain began. */
  requestsFinished: number;
  /** Plain requests still in flight when the grace ended, cut by the stop. */
  requestsCut: number;
  /** Watches ended cleanly. */
  watchesEnded: number;
  /** Long sessions that ended by themselves during the drain. */
  sessionsEnded: number;
  /** Long sessions closed with the message when the grace ended. */
  sessionsClosed: number;
  /** Tunnels handed over to other replicas. */
  tunnelsHandedOver: number;
}

/** The registry behind Sessions, with what the drain sequence reads of it. */
export interface SessionRegistry extends Sessions {
  /** Begins the drain: readiness goes off. */
  begin(): void;
  /** What is open now. */
  open(): { requests: number; watches: number; sessions: number };
  /** Ends every open watch; returns how many. */
  endWatches(): number;
  /** Closes every open session with `message` (each stays open until its last bytes are gone); returns how many. */
  closeSessions(message: string): number;
  /**
   * Resolves once no plain request and no session is open, those being closed included (watches end on their own
   * time, see endWatches).
   */
  idle(): Promise<void>;
  counts(): Pick<DrainCounts, 'requestsFinished' | 'requestsCut' | 'sessionsEnded'>;
}

export function newSessionRegistry(): SessionRegistry {
  let draining = false;
  let requests = 0;
  let requestsFinished = 0;
  let sessionsEnded = 0;
  const watches = new Set<EndWatch>();
  /** Open sessions, each with whether it is being closed (its last bytes on their way): those are not "ended". */
  const sessions = new Map<CloseSession, { kind: SessionKind; closing: boolean }>();
  let waiters: (() => void)[] = [];
  const settle = (): void => {
    if (requests > 0 || sessions.size > 0) return;
    const ready = waiters;
    waiters = [];
    for (const done of ready) done();
  };
  const once = (end: () => void): (() => void) => {
    let ended = false;
    return () => {
      if (ended) return;
      ended = true;
      end();
      settle();
    };
  };
  return {
    request() {
      requests++;
      return once(() => {
        requests--;
        if (draining) requestsFinished++;
      });
    },
    watch(end) {
      // A watch's own function: one watch registered twice (never done) must still count twice.
      const own: EndWatch = () => end();
      watches.add(own);
      return once(() => void watches.delete(own));
    },
    session(kind, close) {
      const own: CloseSession = (message) => close(message);
      sessions.set(own, { kind, closing: false });
      return once(() => {
        const closing = sessions.get(own)?.closing;
        sessions.delete(own);
        if (draining && !closing) sessionsEnded++;
      });
    },
    draining: () => draining,
    begin: () => void (draining = true),
    open: () => ({ requests, watches: watches.size, sessions: sessions.size }),
    endWatches() {
      const all = [...watches];
      watches.clear();
      for (const end of all) end();
      return all.length;
    },
    closeSessions(message) {
      const open = [...sessions].filter(([, s]) => !s.closing);
      for (const [, s] of open) s.closing = true;
      for (const [close] of open) close(message);
      return open.length;
    },
    idle() {
      return new Promise((done) => {
        waiters.push(done);
        settle();
      });
    },
    counts: () => ({ requestsFinished, requestsCut: requests, sessionsEnded }),
  };
}

export interface DrainSettings {
  delayMs: number;
  graceMs: number;
}

export interface DrainSteps {
  settings: DrainSettings;
  registry: SessionRegistry;
  /** Step c: every listener stops taking connections (idle ones closed, HTTP/2 GOAWAY sent). */
  stopAccepting(): Promise<void>;
  /**
   * Step d: the tunnels go to other replicas; resolves with how many were handed over, once each agent has moved or
   * its bound has passed.
   */
  handOver(): Promise<number>;
  clock: Clock;
  log: Logger;
}

/**
 * Runs steps a to f (g, the stop, is the lifecycle's), and logs `drained` with the counts. `signal` aborts the waits
 * (a second SIGTERM): the stop that follows cuts what is left.
 */
export async function drainSequence(steps: DrainSteps, signal: AbortSignal): Promise<DrainCounts> {
  const { settings, registry, clock, log } = steps;
  const began = clock.now();
  registry.begin();
  log.info(
    {
      delaySeconds: settings.delayMs / 1000,
      graceSeconds: settings.graceMs / 1000,
      ...registry.open(),
    },
    'draining',
  );
  await wait(clock, settings.delayMs, signal);
  await steps.stopAccepting();
  // d. The tunnels' handover, under way while e runs: a tunnel closes once its last stream ends, and a watch carried
  // on it would otherwise hold it (and this step) until the handover's own bound.
  const handingOver = signal.aborted
    ? Promise.resolve(0)
    : steps.handOver().catch((err: unknown) => {
        log.warn({ err: (err as Error).message }, 'handing the tunnels over failed');
        return 0;
      });
  // e. Watches end now (clients resume elsewhere by resourceVersion); plain requests and sessions have the grace.
  const watchesEnded = registry.endWatches();
  await Promise.race([registry.idle(), wait(clock, settings.graceMs, signal)]);
  const tunnelsHandedOver = await handingOver;
  // f. What is still open when the grace ends is told why it closes, and its last bytes are let go before the stop.
  const sessionsClosed = registry.closeSessions(SHUTDOWN_MESSAGE);
  if (sessionsClosed > 0) await Promise.race([registry.idle(), wait(clock, CLOSING_MS, signal)]);
  const counts: DrainCounts = { ...registry.counts(), watchesEnded, sessionsClosed, tunnelsHandedOver };
  log.info({ ...counts, seconds: (clock.now() - began) / 1000, cut: signal.aborted }, 'drained');
  return counts;
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function wait(clock: Clock, ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted || ms <= 0) return Promise.resolve();
  return new Promise((done) => {
    const finish = (): void => {
      clock.clearTimeout(timer);
      signal.removeEventListener('abort', finish);
      done();
    };
    const timer = clock.setTimeout(finish, ms);
    signal.addEventListener('abort', finish);
  });
}
