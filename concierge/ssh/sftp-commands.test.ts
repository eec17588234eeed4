import { describe, expect, it } from '@jest/globals';
import { PassThrough } from 'node:stream';
import { silentLogger } from '../../lib/log.ts';
import type { ContainerRef, Containers, Running } from './containers.ts';
import {
  LIST_SCRIPT,
  MKDIR_SCRIPT,
  READ_SCRIPT,
  RENAME_SCRIPT,
  SETSTAT_SCRIPT,
  WRITE_SCRIPT,
  newSessionCommands,
  operationOf,
  script,
} from './sftp-commands.ts';

const REF: ContainerRef = { cluster: 'edge', namespace: 'shop', pod: 'web', container: 'app' };

describe("what an sftp session's recording shows of its commands", () => {
  it.each([
    [script(LIST_SCRIPT, '/srv'), 'list /edge/shop/web/app/srv'],
    [script(READ_SCRIPT, '/etc/hosts', '0'), 'read /edge/shop/web/app/etc/hosts'],
    [script(READ_SCRIPT, '/var/log/big', '65536'), 'read /edge/shop/web/app/var/log/big from=65536'],
    [script(WRITE_SCRIPT, '/tmp/up', 'ct', '644'), 'write /edge/shop/web/app/tmp/up flags=ct mode=644'],
    [script(MKDIR_SCRIPT, '/tmp/d', ''), 'mkdir /edge/shop/web/app/tmp/d'],
    [
      script(SETSTAT_SCRIPT, '/tmp/up', '', '600', '', '1700000000', '', ''),
      'setstat /edge/shop/web/app/tmp/up mode=600 mtime=1700000000',
    ],
    [
      script(RENAME_SCRIPT, '/tmp/a', '/tmp/b'),
      'rename /edge/shop/web/app/tmp/a to=/edge/shop/web/app/tmp/b',
    ],
    [['rm', '--', '/tmp/up'], 'rm /edge/shop/web/app/tmp/up'],
    [['rmdir', '--', '/tmp/d'], 'rmdir /edge/shop/web/app/tmp/d'],
    [['stat', '-L', '-c', '%s', '--', '/etc'], 'stat /edge/shop/web/app/etc'],
    [['ln', '-s', '--', 'target', '/tmp/link'], 'ln target /edge/shop/web/app/tmp/link'],
  ])('%j is %s', (argv, line) => {
    expect(operationOf(REF, argv)).toBe(line);
  });

  it('quotes a name that is not plain, so that no name writes a line of its own', () => {
    expect(operationOf(REF, ['rm', '--', '/tmp/a b\r\nrm /etc/passwd'])).toBe(
      'rm "/edge/shop/web/app/tmp/a b\\r\\nrm /etc/passwd"',
    );
  });

  it('notes each command before it runs, and a failure after it, then closes the recording with the session', async () => {
    const notes: string[] = [];
    let closed = 0;
    const exits = [0, 1];
    const containers = {
      run(): Running {
        const stdout = new PassThrough();
        const stderr = new PassThrough();
        const code = exits.shift()!;
        setImmediate(() => {
          stdout.end();
          stderr.end(code ? 'rm: /tmp/x: No such file or directory\n' : '');
        });
        return {
          stdin: new PassThrough(),
          stdout,
          stderr,
          exit: Promise.resolve(code),
          resize() {},
          kill() {},
        };
      },
    } as unknown as Containers;
    const commands = newSessionCommands(containers, 8, silentLogger(), {
      note: (_place, line) => void notes.push(line),
      close: async () => void closed++,
    });
    await commands.run(REF, script(MKDIR_SCRIPT, '/tmp/x', ''), 1024);
    await commands.run(REF, ['rm', '--', '/tmp/x'], 1024);
    await new Promise((resolve) => setImmediate(resolve));
    expect(notes).toEqual([
      'mkdir /edge/shop/web/app/tmp/x',
      'rm /edge/shop/web/app/tmp/x',
      'failed (exit status 1): rm /edge/shop/web/app/tmp/x',
    ]);
    commands.close();
    expect(closed).toBe(1);
  });
});
