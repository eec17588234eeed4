// The harness's log of a server's output, against a real child process whose folder is removed while it still prints:
// the stop of a cluster removes its folder as soon as its processes exit, and output can still be in the pipe.
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { logOutput } from '../../dev/processes.ts';

describe('logOutput', () => {
  it("writes a child's stdout and stderr to its log, and drops what the child prints once the log's folder is gone", async () => {
    const dir = mkdtempSync(join(tmpdir(), 'sealion-log-output-'));
    const log = join(dir, 'child.log');
    const child = spawn('sh', ['-c', 'echo out; echo err >&2; read line; echo late; echo later >&2'], {
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    const closed = new Promise((done) => child.once('close', done));
    try {
      logOutput(child, log);
      while (!readFileSync(log, 'utf8').includes('err')) await sleep(20);
      expect(readFileSync(log, 'utf8').split('\n').sort()).toEqual(['', 'err', 'out']);
      rmSync(dir, { recursive: true, force: true });
      child.stdin.end('go\n');
      // Before the fix, the first late chunk threw ENOENT from the stream's handler: an error nothing handled.
      await closed;
      expect(child.exitCode).toBe(0);
    } finally {
      child.kill('SIGKILL');
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
