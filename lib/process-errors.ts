// What a process does with an error that nothing handled: the concierge's and the agent's composition roots install
// this before they start anything.
//
// A promise rejection nothing handled is logged at error level, with its stack, and counted; the process keeps
// serving. Node's default, an exit, would turn one bug that a client can trigger into an outage for every user of the
// replica, and into a restart loop for as long as that client keeps sending. A rejection surfaces after the code that
// made the promise has returned: what it leaves behind is that one task's, whose own deadlines and closes still run.
//
// An exception nothing caught is logged and the process exits with status 1. It unwound a synchronous call stack part
// way, through our code or through Node's own (a parser's, a stream's), which may be left half-changed; a process
// that goes on from there may answer wrongly, or hold what it can never release. The orchestrator restarts it, and
// the other replicas take its tunnels meanwhile. So request-serving code catches its own errors at each request's
// entry, where the harm is that request's (the proxy's handler and the peer port answer a 500, or close an upgrade),
// and an uncaught exception is a bug in code that has no such boundary.
import { isNativeError } from 'node:util/types';
import type { Logger } from './log.ts';

export type ProcessErrorKind = 'unhandled-rejection' | 'uncaught-exception';

/** Longest message logged: enough to name the fault, never a whole body a message happened to quote. */
const MAX_MESSAGE = 500;

let rejections = 0;

/** Rejections that nothing handled in this process so far (for the concierge's metrics). */
export function unhandledRejectionsSeen(): number {
  return rejections;
}

/**
 * What the log gets of an error nothing handled: its class, code, message (cut short) and stack frames. A reason that
 * is no Error (a rejection with a string or an object) may be anything a request carried, so only its type is logged.
 */
export function describeUnhandled(err: unknown): Record<string, string> {
  if (!isNativeError(err)) {
    const type = err === null ? 'null' : typeof err;
    const name = (err as { constructor?: { name?: unknown } } | null | undefined)?.constructor?.name;
    return { type: typeof name === 'string' && type === 'object' ? name : type };
  }
  const code = (err as { code?: unknown }).code;
  const frames = (err.stack ?? '')
    .split('\n')
    .filter((line) => line.trimStart().startsWith('at '))
    .map((line) => line.trim())
    .join('\n');
  return {
    type: err.name,
    ...(typeof code === 'string' ? { code } : {}),
    message: err.message.slice(0, MAX_MESSAGE),
    stack: frames,
  };
}

export interface ProcessErrorOptions {
  log: Logger;
  /** Told of each error, once it is logged. Default: nobody. */
  seen?: (kind: ProcessErrorKind, err: unknown) => void;
  /** Ends the process after an uncaught exception. Default: process.exit (pino writes what it buffered on exit). */
  exit?: (code: number) => void;
}

/** Installs the process's handlers of errors nothing handled; returns what removes them. */
export function handleProcessErrors(opts: ProcessErrorOptions): () => void {
  const exit = opts.exit ?? ((code: number) => process.exit(code));
  const onRejection = (reason: unknown): void => {
    rejections++;
    opts.log.error(
      { error: describeUnhandled(reason), unhandledRejections: rejections },
      'a promise rejection nothing handled; this is a bug, and the process serves on',
    );
    opts.seen?.('unhandled-rejection', reason);
  };
  const onException = (err: unknown): void => {
    try {
      opts.log.fatal(
        { error: describeUnhandled(err) },
        'an exception nothing caught; this is a bug, and the process exits',
      );
      opts.seen?.('uncaught-exception', err);
    } finally {
      exit(1);
    }
  };
  process.on('unhandledRejection', onRejection);
  process.on('uncaughtException', onException);
  return () => {
    process.off('unhandledRejection', onRejection);
    process.off('uncaughtException', onException);
  };
}
