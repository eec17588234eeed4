// One start and one stop for a component made of parts (the concierge, the agent): its start function starts the
// parts in order and hands over how to stop each one as soon as it runs; stop runs those steps in the reverse order.
// A component that has more to do before it stops (the concierge's drain on SIGTERM) gives its drain sequence to
// `onDrain`; drain runs it, then the stop.
import type { Logger } from './log.ts';

export interface Lifecycle<T> {
  /** Starts everything; on a failure, stops what had started and rejects. */
  start(): Promise<T>;
  /** Stops what has started, in the reverse order; safe at any time, and more than once. A drain under way is cut. */
  stop(): Promise<void>;
  /**
   * Runs the drain sequence the start gave (none: nothing), then stops. Safe at any time and more than once: the one
   * drain is returned again. A stop called meanwhile aborts the sequence (its signal) and stops at once.
   */
  drain(): Promise<void>;
}

/** Records how to stop a part that has just started. */
export type OnStop = (step: () => unknown) => void;

/** Records the component's drain sequence, given a signal that aborts when a stop cuts it short. */
export type OnDrain = (sequence: (signal: AbortSignal) => Promise<void>) => void;

/**
 * The lifecycle of `component` (named in the log and in errors), whose `start` starts its parts in order and gives
 * each one's stop to `onStop`. A step that fails is logged and the steps after it still run. When stop is called
 * while start runs, the part that starts next is stopped after the rest, and the start goes no further: `onStop`
 * throws, and start rejects.
 */
export function newLifecycle<T>(
  component: string,
  log: Logger,
  start: (onStop: OnStop, onDrain: OnDrain) => Promise<T>,
): Lifecycle<T> {
  /** The steps of the parts started so far, in the order they started; emptied once stopping begins. */
  const steps: (() => unknown)[] = [];
  let stopping: Promise<void> | undefined;
  let draining: Promise<void> | undefined;
  let sequence: ((signal: AbortSignal) => Promise<void>) | undefined;
  const cut = new AbortController();
  const runStep = async (step: () => unknown): Promise<void> => {
    try {
      await step();
    } catch (err) {
      log.warn({ err: (err as Error).message }, `stopping a part of the ${component} failed`);
    }
  };
  const stop = (): Promise<void> => {
    cut.abort();
    return (stopping ??= (async () => {
      for (const step of steps.splice(0).reverse()) await runStep(step);
    })());
  };
  const onStop: OnStop = (step) => {
    if (stopping) {
      void stopping.then(() => runStep(step));
      throw new Error(`the ${component} was stopped while it started`);
    }
    steps.push(step);
  };
  const onDrain: OnDrain = (given) => void (sequence = given);
  const drain = (): Promise<void> =>
    (draining ??= (async () => {
      if (sequence && !stopping) {
        try {
          await sequence(cut.signal);
        } catch (err) {
          // A drain that fails still stops: what it did not finish, the stop cuts.
          if (!cut.signal.aborted)
            log.warn({ err: (err as Error).message }, `draining the ${component} failed`);
        }
      }
      await stop();
    })());
  return {
    async start() {
      try {
        return await start(onStop, onDrain);
      } catch (err) {
        await stop();
        throw err;
      }
    },
    stop,
    drain,
  };
}

/** A process's one occupant, as its signals end it. */
export interface Running {
  drain(): Promise<void>;
  stop(): Promise<void>;
}

/**
 * The process's signals: the first SIGTERM drains (what the kubelet sends a pod it stops), SIGINT stops (a
 * person at a terminal), and a second signal of either during the drain stops, cutting it short. `exit` is called once the
 * drain or the stop has finished.
 */
export function onSignals(
  running: Running,
  exit: () => void,
  signals: Pick<NodeJS.Process, 'on'> = process,
): void {
  let ending: Promise<void> | undefined;
  const end = (how: () => Promise<void>): void => {
    ending = how();
    void ending.then(exit, exit);
  };
  signals.on('SIGTERM', () => end(ending ? () => running.stop() : () => running.drain()));
  signals.on('SIGINT', () => end(() => running.stop()));
}
