// The harness fails a test for an error nothing handled in a process of its file (harness/process-errors.ts): shown
// on fixture files, in a Jest of their own with the integration tests' setup and environment.
import { describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';
import { REPO_ROOT } from '../dev/build.ts';
import { parseProcessErrorLine, processErrorLine } from './harness/process-errors.ts';

interface JestResults {
  testResults: Array<{
    name: string;
    message: string;
    assertionResults: Array<{ title: string; status: string; failureMessages: string[] }>;
  }>;
}

/** Runs one fixture (harness/fixtures/) as the integration project runs a test file; its results as Jest reports them. */
function runFixture(name: string): JestResults['testResults'][number] {
  const swc = {
    jsc: { parser: { syntax: 'typescript' }, target: 'es2024', experimental: { keepImportAttributes: true } },
    module: { type: 'es6' },
  };
  const config = {
    rootDir: REPO_ROOT,
    testMatch: [`<rootDir>/integration/harness/fixtures/${name}.fixture.ts`],
    extensionsToTreatAsEsm: ['.ts'],
    transform: { '^.+\\.ts$': ['@swc/jest', swc] },
    moduleFileExtensions: ['ts', 'js', 'json'],
    setupFilesAfterEnv: ['<rootDir>/integration/harness/jest-setup.ts'],
    testEnvironment: '<rootDir>/integration/harness/environment.ts',
  };
  const jest = spawnSync(
    process.execPath,
    [
      '--experimental-vm-modules',
      '--disable-warning=ExperimentalWarning',
      `${REPO_ROOT}/node_modules/jest/bin/jest.js`,
      '--config',
      JSON.stringify(config),
      '--json',
      '--runInBand',
    ],
    { cwd: REPO_ROOT, encoding: 'utf8', timeout: 60_000 },
  );
  const results = JSON.parse(jest.stdout) as JestResults;
  expect(results.testResults).toHaveLength(1);
  return results.testResults[0]!;
}

describe('errors nothing handled, in a process of the test file', () => {
  it('are read back whole from the line a concierge process writes', () => {
    const err = new TypeError('exchange.socket.destroySoon is not a function');
    const line = processErrorLine('uncaught-exception', err);
    expect(line.endsWith('\n')).toBe(true);
    expect(parseProcessErrorLine(line.trimEnd())).toEqual({ kind: 'uncaught-exception', text: err.stack });
    expect(parseProcessErrorLine('an ordinary line of the process')).toBeUndefined();
  });

  it('fail the test in which a concierge process reported one, naming it', () => {
    const file = runFixture('reported');
    expect(file.assertionResults.map((t) => [t.title, t.status])).toEqual([
      ['runs before the report', 'passed'],
      ['runs while a concierge process reports', 'failed'],
      ['runs after the report', 'passed'],
    ]);
    expect(file.assertionResults[1]!.failureMessages.join('\n')).toContain(
      'the concierge process replica-1 reported unhandled-rejection: Error: deliberately broken',
    );
  }, 90_000);

  it("fail the file when one comes in the worker after the file's last hook, naming it", () => {
    const file = runFixture('after-last-hook');
    expect(file.message).toContain('a promise rejection nothing handled');
    expect(file.message).toContain('deliberately broken: rejected after the last hook');
  }, 90_000);
});
