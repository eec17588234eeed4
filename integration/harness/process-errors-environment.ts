// Node's test environment, plus this: a test file fails for any error nothing handled in the Jest worker while the file
// runs, and for any a concierge process of the file reported (process-errors.ts) that no test has failed for yet.
//
// Jest's own handlers (jest-circus) already fail the test whose code made a rejection or threw, from the first hook
// to the last: a concierge started in beforeAll makes its rejections that hook's, and every test of the block fails,
// naming the error. These handlers hold before and after that stretch (Jest swaps them out for its own, and back),
// and teardown gives a late rejection one turn of the event loop to surface. After the file, nothing is the file's:
// Node's default stops the worker, loudly.
import { isNativeError } from 'node:util/types';
import { TestEnvironment } from 'jest-environment-node';
import { PROCESS_ERRORS, processErrorsMessage } from './process-errors.ts';

const describe = (err: unknown): string =>
  isNativeError(err) ? (err.stack ?? `${err.name}: ${err.message}`) : `a ${typeof err}: ${String(err)}`;

export default class ProcessErrorsEnvironment extends TestEnvironment {
  private readonly seen: string[] = [];
  private readonly onRejection = (reason: unknown): void =>
    void this.seen.push(`the Jest worker: a promise rejection nothing handled: ${describe(reason)}`);
  private readonly onException = (err: unknown): void =>
    void this.seen.push(`the Jest worker: an exception nothing caught: ${describe(err)}`);

  override async setup(): Promise<void> {
    await super.setup();
    process.on('unhandledRejection', this.onRejection);
    process.on('uncaughtException', this.onException);
  }

  override async teardown(): Promise<void> {
    let errors: string[];
    try {
      await new Promise((done) => setImmediate(done));
      const reported = (this.global as { [PROCESS_ERRORS]?: string[] })[PROCESS_ERRORS] ?? [];
      errors = [...this.seen, ...reported.splice(0)];
    } finally {
      process.off('unhandledRejection', this.onRejection);
      process.off('uncaughtException', this.onException);
      await super.teardown();
    }
    if (errors.length > 0) throw new Error(processErrorsMessage(errors));
  }
}
