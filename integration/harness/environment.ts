// The integration tests' Jest environment: Node's, plus a sweep when a test file is done. Whatever process the file
// started and left running (a forgotten stop(), a beforeAll that failed midway, a test that timed out while its
// cleanup waited) is named on stderr and stopped, so that it cannot outlive the file or keep Jest from exiting; and
// the file fails, so that a leak is fixed rather than swept up run after run.
// It runs after all of the file's own afterAll hooks, which a hook in a setup file would not: those run in the
// order they were declared, before the file's own. It fails the file too for errors nothing handled, in the Jest
// worker or in a concierge process of the file, that no test failed for (process-errors-environment.ts).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import type { TestEnvironment } from 'jest-environment-node';
import { REPO_ROOT } from '../../dev/build.ts';
import { descendants, stopLeftovers, type ProcessInfo } from '../../dev/processes.ts';
import ProcessErrorsEnvironment from './process-errors-environment.ts';

const key = (p: ProcessInfo): string => `${p.pid}@${p.start}`;

/** What this environment reads of the events Jest (jest-circus) tells it as a file runs. */
interface TestEvent {
  name: string;
  error?: unknown;
  hook?: { type: string };
  test?: { name: string };
}

export default class IntegrationEnvironment extends ProcessErrorsEnvironment {
  private readonly testPath: string;
  /** Processes that were running before the file started: not the file's to stop. */
  private before = new Set<string>();
  /**
   * kubectl's discovery cache for this file alone. kubectl keys its cache by host and port and trusts it for ten
   * minutes, so a port that another file's API server (or proxy) held a moment ago would otherwise answer with that
   * server's resources: a group this file never installed, or none of the ones it did.
   */
  private kubectlCache = '';
  /**
   * The file's own failures, a hook's or a test's: Jest reports only the teardown's error once teardown throws, so
   * the leak it names would hide what failed first (a beforeAll that failed midway is what usually leaves processes).
   */
  private readonly failures: string[] = [];

  constructor(...args: ConstructorParameters<typeof TestEnvironment>) {
    super(...args);
    this.testPath = relative(REPO_ROOT, args[1].testPath);
  }

  override async setup(): Promise<void> {
    await super.setup();
    this.kubectlCache = mkdtempSync(join(tmpdir(), 'sealion-kubectl-cache-'));
    // The worker's own environment, which the processes a test starts inherit, and the copy the test sees.
    process.env['KUBECACHEDIR'] = this.kubectlCache;
    this.global.process.env['KUBECACHEDIR'] = this.kubectlCache;
    this.before = new Set(descendants().map(key));
  }

  handleTestEvent(event: TestEvent): void {
    if (event.name === 'hook_failure')
      this.failures.push(`${event.hook?.type ?? 'a hook'} failed: ${firstLines(event.error)}`);
    else if (event.name === 'test_fn_failure')
      this.failures.push(`"${event.test?.name ?? 'a test'}" failed: ${firstLines(event.error)}`);
  }

  override async teardown(): Promise<void> {
    const problems: string[] = [];
    try {
      const left = descendants().filter((p) => !this.before.has(key(p)));
      if (left.length > 0) {
        process.stderr.write(
          `\n[harness] ${this.testPath} left ${left.length} process(es) running; stopping them:\n` +
            left.map((p) => `  ${p.pid} ${p.command.slice(0, 200)}\n`).join(''),
        );
        await stopLeftovers(left);
        problems.push(
          `${this.testPath} left ${left.length} process(es) running: ${left.map((p) => p.command.slice(0, 100)).join('; ')}`,
        );
      }
    } finally {
      delete process.env['KUBECACHEDIR'];
      rmSync(this.kubectlCache, { recursive: true, force: true });
      // Errors nothing handled, in the worker or in a process of the file (process-errors-environment.ts).
      await super.teardown().catch((err: Error) => problems.push(err.message));
    }
    if (problems.length > 0) {
      const first = this.failures.slice(0, 3);
      if (first.length > 0) problems.push(`before that, in ${this.testPath}:\n${first.join('\n')}`);
      throw new Error(problems.join('\n\n'));
    }
  }
}

/** The first lines of a failure's message, without its stack. */
function firstLines(error: unknown): string {
  const text = error instanceof Error ? error.message : String(error);
  return text.split('\n').slice(0, 6).join('\n');
}
