import { execFile, type ChildProcessByStdio } from 'node:child_process';
import type { Readable } from 'node:stream';
import { readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from './build.ts';

/** PIDs of live processes whose command line mentions `text` (e.g. a cluster's folder). Linux only. */
export function processesUsing(text: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      const state = /^State:\s+(\w)/m.exec(readFileSync(`/proc/${entry}/status`, 'utf8'))?.[1];
      if (cmdline.includes(text) && state !== 'Z') pids.push(Number(entry));
    } catch {
      // The process ended while we looked.
    }
  }
  return pids;
}

/**
 * Reads a child's stdout until `pattern` matches and returns the match, plus all output so far. Keeps the tail of
 * stderr (so the child never blocks on a full pipe) and puts it in the error when the child exits first.
 */
export function waitForOutput(
  child: ChildProcessByStdio<null, Readable, Readable>,
  pattern: RegExp,
): Promise<{ match: RegExpExecArray; output: string }> {
  let output = '';
  let errors = '';
  child.stdout.setEncoding('utf8');
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk: string) => (errors = (errors + chunk).slice(-4000)));
  return new Promise((done, fail) => {
    child.stdout.on('data', (chunk: string) => {
      output += chunk;
      const match = pattern.exec(output);
      if (match) done({ match, output });
    });
    child.once('exit', (code) =>
      fail(new Error(`exited ${code} before printing ${pattern}:\n${output}\n${errors}`)),
    );
  });
}

/** Runs the `sealion` CLI with the Node running the caller (Node 24), as kubectl runs the exec plugin. */
export function runSealion(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      [join(REPO_ROOT, 'cli/main.ts'), ...args],
      { env: { ...process.env, ...env } },
      (err, stdout, stderr) =>
        done({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}
