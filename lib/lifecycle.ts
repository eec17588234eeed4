// One start and one stop for a component made of parts (the concierge, the agent): its start function starts the
// parts in order and hands over how to stop each one as soon as it runs; stop runs those steps in the reverse order.
import type { Logger } from './log.ts';

export interface Lifecycle<T> {
  /** Starts everything; on a failure, stops what had started and rejects. */
  start(): Promise<T>;
  /** Stops what has started, in the reverse order; safe at any time, and more than once. */
  stop(): Promise<void>;
}

/** Records how to stop a part that has just started. */
export type OnStop = (step: () => unknown) => void;

/**
 * The lifecycle of `component` (named in the log and in errors), whose `start` starts its parts in order and gives
 * each one's stop to `onStop`. A step that fails is logged and the steps after it still run. When stop is called
 * while start runs, the part that starts next is stopped after the rest, and the start goes no further: `onStop`
 * throws, and start rejects.
 */
export function newLifecycle<T>(
  component: string,
  log: Logger,
  start: (onStop: OnStop) => Promise<T>,
): Lifecycle<T> {
  /** The steps of the parts started so far, in the order they started; emptied once stopping begins. */
  const steps: (() => unknown)[] = [];
  let stopping: Promise<void> | undefined;
  const runStep = async (step: () => unknown): Promise<void> => {
    try {
      await step();
    } catch (err) {
      log.warn({ err: (err as Error).message }, `stopping a part of the ${component} failed`);
    }
  };
  const stop = (): Promise<void> =>
    (stopping ??= (async () => {
      for (const step of steps.splice(0).reverse()) await runStep(step);
    })());
  const onStop: OnStop = (step) => {
    if (stopping) {
      void stopping.then(() => runStep(step));
      throw new Error(`the ${component} was stopped while it started`);
    }
    steps.push(step);
  };
  return {
    async start() {
      try {
        return await start(onStop);
      } catch (err) {
        await stop();
        throw err;
      }
    },
    stop,
  };
}
