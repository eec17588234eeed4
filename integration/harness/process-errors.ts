// Errors that nothing handled, in the processes a test file runs, made to fail the test they happened in (or the file,
// when they come between tests). A concierge in a process of its own (serve-concierge.ts) reports its own on its
// standard error, one marked line each, and keeps serving after a rejection as production does (lib/process-errors.ts);
// concierge-process.ts reads those lines and records them here; jest-setup.ts fails the test that was running, and
// the Jest environment the file, for whatever is left. Errors in the Jest worker itself fail the test whose code made
// them through Jest's own handlers; the environment's catch the rest (process-errors-environment.ts).
import { isNativeError } from 'node:util/types';
import type { ProcessErrorKind } from '../../lib/process-errors.ts';

/** How a concierge process marks the line that reports an error nothing handled. */
export const PROCESS_ERROR_MARK = '[sealion-process-error] ';

/** Where the errors wait, on the test file's global (the environment reads the same object). */
export const PROCESS_ERRORS = Symbol.for('sealion.test.process-errors');

function recorded(): string[] {
  const global = globalThis as { [PROCESS_ERRORS]?: string[] };
  return (global[PROCESS_ERRORS] ??= []);
}

/** Records an error nothing handled, in a process this file started. */
export function reportProcessError(text: string): void {
  recorded().push(text);
}

/** The errors recorded so far, which are then forgotten. */
export function takeProcessErrors(): string[] {
  return recorded().splice(0);
}

/** The line a concierge process writes to its standard error for one error: all of it, since this is a test. */
export function processErrorLine(kind: ProcessErrorKind, err: unknown): string {
  const text = isNativeError(err)
    ? (err.stack ?? `${err.name}: ${err.message}`)
    : `a ${typeof err}: ${String(err)}`;
  return `${PROCESS_ERROR_MARK}${JSON.stringify({ kind, text })}\n`;
}

/** The error a line of a concierge process's standard error reports, if it is such a line. */
export function parseProcessErrorLine(line: string): { kind: string; text: string } | undefined {
  if (!line.startsWith(PROCESS_ERROR_MARK)) return undefined;
  try {
    return JSON.parse(line.slice(PROCESS_ERROR_MARK.length)) as { kind: ProcessErrorKind; text: string };
  } catch {
    return { kind: 'an unreadable report', text: line };
  }
}

/** Errors a failure shows whole; past these it counts the rest. */
const SHOWN = 3;

/** The message that fails a test or a file for `errors`. */
export function processErrorsMessage(errors: string[]): string {
  const rest = errors.length - SHOWN;
  return (
    `${errors.length} error(s) nothing handled, in a process of this test file:\n\n${errors.slice(0, SHOWN).join('\n\n')}` +
    (rest > 0 ? `\n\nand ${rest} more` : '')
  );
}
