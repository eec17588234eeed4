// What the harness knows about processes: which are running, how to start one that dies with its parent, how to
// stop one for certain, and how to find and stop whatever a test file left running (environment.ts does that).
import { execFile, type ChildProcess, type ChildProcessByStdio } from 'node:child_process';
import type { Readable } from 'node:stream';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { REPO_ROOT } from './build.ts';

const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p));

/**
 * The command and arguments that run `command` so that the kernel sends it `signal` when the process that started
 * it dies, even by SIGKILL (setpriv --pdeathsig, which execs the command: same pid, no process in between).
 * Without setpriv the command runs as it is. The signal is sent when the starting thread exits, which for
 * child_process is the main thread.
 */
export function dieWithParent(
  command: string,
  args: string[],
  signal: 'SIGKILL' | 'SIGTERM' = 'SIGKILL',
): [string, string[]] {
  return SETPRIV ? [SETPRIV, ['--pdeathsig', signal, '--', command, ...args]] : [command, args];
}

/**
 * Writes what a child prints, on stdout and stderr, to the file `logPath` (made empty first). Output that reaches
 * the pipe after the child's exit, when its folder may already be removed, is dropped: the first write that fails
 * ends the log, rather than throwing from a stream handler and taking the test process down.
 */
export function logOutput(child: ChildProcess, logPath: string): void {
  writeFileSync(logPath, '');
  let open = true;
  const append = (chunk: Buffer): void => {
    if (!open) return;
    try {
      writeFileSync(logPath, chunk, { flag: 'a' });
    } catch {
      open = false;
    }
  };
  child.stdout?.on('data', append);
  child.stderr?.on('data', append);
}

/** Whether a process exists (EPERM: it does, and is just not ours to signal). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function signalQuietly(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(pid, signal);
  } catch {
    // Gone already.
  }
}

/**
 * Stops a child for certain: `signal` (default SIGTERM), then SIGKILL after `graceMs` (default 5 s); resolves once
 * it has exited. With `group`, both go to its whole process group (a child spawned with `detached: true`).
 * Idempotent, and safe on a child that never started or has exited, by a code or a signal.
 */
export function stopChild(
  child: ChildProcess,
  opts: { signal?: NodeJS.Signals; graceMs?: number; group?: boolean } = {},
): Promise<void> {
  const pid = child.pid;
  if (pid === undefined || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  const target = opts.group ? -pid : pid;
  return new Promise((done) => {
    const killer = setTimeout(() => signalQuietly(target, 'SIGKILL'), opts.graceMs ?? 5_000);
    child.once('exit', () => {
      clearTimeout(killer);
      done();
    });
    signalQuietly(target, opts.signal ?? 'SIGTERM');
  });
}

/** A process as /proc/<pid>/stat tells it. */
export interface ProcessInfo {
  pid: number;
  ppid: number;
  pgid: number;
  /** Clock ticks after boot: with the pid, tells a process from a later one that reuses its pid. */
  start: number;
  command: string;
}

function processInfo(pid: number): ProcessInfo | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // The command name is in parentheses and may hold spaces and parentheses itself: fields follow the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (fields[0] === 'Z') return undefined;
    const command = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ').trim();
    return {
      pid,
      ppid: Number(fields[1]),
      pgid: Number(fields[2]),
      start: Number(fields[19]),
      command,
    };
  } catch {
    return undefined;
  }
}

/** Every live (not zombie) descendant of process `root`, parents before their children. Linux only. */
export function descendants(root: number = process.pid): ProcessInfo[] {
  const byParent = new Map<number, ProcessInfo[]>();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const info = processInfo(Number(entry));
    if (!info) continue;
    byParent.set(info.ppid, [...(byParent.get(info.ppid) ?? []), info]);
  }
  const found: ProcessInfo[] = [];
  const queue = [root];
  while (queue.length > 0) {
    for (const child of byParent.get(queue.shift()!) ?? []) {
      found.push(child);
      queue.push(child.pid);
    }
  }
  return found;
}

const sameProcess = (a: ProcessInfo): boolean => {
  const now = processInfo(a.pid);
  return now !== undefined && now.start === a.start;
};

/**
 * Stops processes left running, for certain: SIGTERM to those among them that this process started (to their
 * whole group when they lead one, as `detached: true` children do), so that one like `npm start` takes
 * down what it started in order; then, after `graceMs`, SIGKILL to every one still there and to anything new
 * they started meanwhile. Resolves once all are gone (or after a last second, for the kernel to reap them).
 */
export async function stopLeftovers(leftovers: ProcessInfo[], graceMs = 5_000): Promise<void> {
  const mine = new Set(leftovers.map((p) => p.pid));
  for (const p of leftovers) {
    if (p.ppid !== process.pid) continue;
    signalQuietly(p.pgid === p.pid ? -p.pid : p.pid, 'SIGTERM');
  }
  const deadline = Date.now() + graceMs;
  while (leftovers.some(sameProcess) && Date.now() < deadline) await sleep(100);
  const remaining = [
    ...leftovers.filter(sameProcess),
    ...leftovers.flatMap((p) => descendants(p.pid)).filter((p) => !mine.has(p.pid)),
  ];
  for (const p of remaining) {
    if (p.pgid === p.pid) signalQuietly(-p.pid, 'SIGKILL');
    signalQuietly(p.pid, 'SIGKILL');
  }
  const reaped = Date.now() + 1_000;
  while (remaining.some(sameProcess) && Date.now() < reaped) await sleep(50);
}

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
      // A hung command must not hang a test (see COMMAND_TIMEOUT_MS in cluster.ts).
      { env: { ...process.env, ...env }, timeout: 120_000, killSignal: 'SIGKILL' },
      (err, stdout, stderr) =>
        done({
          code: err ? ((err as { code?: number }).code ?? 1) : 0,
          stdout,
          stderr: err?.killed ? `${stderr}\nsealion ${args.join(' ')}: killed after 120 s` : stderr,
        }),
    );
  });
}

/**
 * Stops what a command started on Ctrl-C or SIGTERM, then exits (1 if stopping failed). A second signal, or one
 * during a stop that hangs, exits at once: servers die with this process (setpriv --pdeathsig). `claim()` takes
 * the stop for another reason (a failed start); it answers false when a signal took it first.
 */
export function stopOnSignal(stop: () => Promise<void>, log: (line: string) => void): { claim(): boolean } {
  let stopping = false;
  const shutdown = (): void => {
    if (stopping) {
      log('stopping at once');
      process.exit(1);
    }
    stopping = true;
    log('stopping');
    stop().then(
      () => process.exit(0),
      (err: unknown) => {
        console.error(err);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);
  return {
    claim() {
      if (stopping) return false;
      stopping = true;
      return true;
    },
  };
}
