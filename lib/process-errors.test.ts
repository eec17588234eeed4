// What a process that installed handleProcessErrors does with an error nothing handled, in a Node process of its own:
// in a Jest worker, Jest's own handlers would take the error first and fail the test.
import { describe, expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';

const MODULES = {
  errors: new URL('./process-errors.ts', import.meta.url).href,
  log: new URL('./log.ts', import.meta.url).href,
};

/** Runs `body` in a new Node process after it installed the handlers, logging as the concierge does (buffered). */
function run(body: string): {
  status: number | null;
  lines: Array<Record<string, unknown>>;
  other: string[];
} {
  const script = `
    import { handleProcessErrors } from ${JSON.stringify(MODULES.errors)};
    import { newLogger } from ${JSON.stringify(MODULES.log)};
    handleProcessErrors({ log: newLogger({ buffered: true }) });
    ${body}
  `;
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  const lines: Array<Record<string, unknown>> = [];
  const other: string[] = [];
  for (const line of child.stdout.split('\n').filter(Boolean)) {
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      other.push(line);
    }
  }
  return { status: child.status, lines, other };
}

describe('handleProcessErrors', () => {
  it('logs a rejection nothing handled with its stack, counts it, and serves on', () => {
    const got = run(`
      Promise.reject(new TypeError('exchange.socket.destroySoon is not a function'));
      // Rejections nothing handled are told of at the end of the tick they happened in.
      setImmediate(() => console.log('served on'));
    `);
    expect(got.status).toBe(0);
    expect(got.lines).toEqual([
      expect.objectContaining({
        level: 50,
        msg: 'a promise rejection nothing handled; this is a bug, and the process serves on',
        unhandledRejections: 1,
        error: {
          type: 'TypeError',
          message: 'exchange.socket.destroySoon is not a function',
          stack: expect.stringMatching(/^at /),
        },
      }),
    ]);
    expect(got.other).toEqual(['served on']);
  });

  it('logs only the type of a reason that is no Error, which may hold what a request carried', () => {
    const got = run(`
      Promise.reject({ authorization: 'Bearer secret-token', body: 'a user\\'s data' });
      Promise.reject('Bearer secret-token');
      setImmediate(() => console.log('served on'));
    `);
    expect(got.status).toBe(0);
    expect(got.lines.map((line) => line['error'])).toEqual([{ type: 'Object' }, { type: 'string' }]);
    expect(JSON.stringify(got.lines)).not.toContain('secret');
    expect(got.other).toEqual(['served on']);
  });

  it('logs an exception nothing caught, and exits with status 1 once the buffered log is written', () => {
    const got = run(`
      setImmediate(() => {
        throw new Error('a listener threw');
      });
      setTimeout(() => console.log('served on'), 60_000);
    `);
    expect(got.status).toBe(1);
    expect(got.lines).toEqual([
      expect.objectContaining({
        level: 60,
        msg: 'an exception nothing caught; this is a bug, and the process exits',
        error: { type: 'Error', message: 'a listener threw', stack: expect.stringMatching(/^at /) },
      }),
    ]);
    expect(got.other).toEqual([]);
  });
});
