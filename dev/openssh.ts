// The real OpenSSH client (ssh, sftp, scp, ssh-keygen) as tests run it: no user configuration, no agent, one key, a
// bounded time, and what it printed and how it ended; and a terminal's side of a conversation with a shell.
import { spawn } from 'node:child_process';
import { dieWithParent } from './processes.ts';

export interface OpenSSHResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Sees all the output so far each time more comes, and may type. */
export type Conversation = (output: string, type: (text: string) => void) => void;

export interface OpenSSHOptions {
  /** The host key pinned here; without it, whatever the server shows (a test's own throwaway server). */
  knownHosts?: string;
  /** No prompt can wait. Default: true. */
  batch?: boolean;
  /** Only errors on stderr. Default: true. */
  quiet?: boolean;
}

/** The options every run shares: no config file, the one key given, no agent. */
export function opensshOptions(key: string, opts: OpenSSHOptions = {}): string[] {
  const { knownHosts, batch = true, quiet = true } = opts;
  return [
    '-F',
    '/dev/null',
    '-o',
    knownHosts ? `UserKnownHostsFile=${knownHosts}` : 'UserKnownHostsFile=/dev/null',
    '-o',
    `StrictHostKeyChecking=${knownHosts ? 'yes' : 'no'}`,
    '-o',
    `BatchMode=${batch ? 'yes' : 'no'}`,
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    'IdentityAgent=none',
    ...(quiet ? ['-o', 'LogLevel=ERROR'] : []),
    '-i',
    key,
  ];
}

/**
 * A terminal's side of a conversation: each line is typed once the output shows `prompt` one more time than when the
 * line before was typed, and cursor-position queries (busybox's shell asks one per prompt) are answered as a
 * terminal answers them.
 */
export function typing(prompt: RegExp, lines: string[]): Conversation {
  let answered = 0;
  let typed = 0;
  return (output, type) => {
    const queries = output.split('\x1b[6n').length - 1;
    for (; answered < queries; answered++) type('\x1b[1;1R');
    const prompts = output.split(prompt).length - 1;
    if (prompts > typed && typed < lines.length) type(`${lines[typed++]!}\n`);
  };
}

/**
 * Runs `program` with `args`: `input` on its stdin, or a conversation that types as output comes; `onStderr` sees
 * the error output so far as it comes. Killed after `timeoutMs`, so that a red test ends.
 */
export function runOpenSSH(
  program: 'ssh' | 'sftp' | 'scp' | 'ssh-keygen',
  args: string[],
  input: string | Conversation = '',
  opts: { timeoutMs?: number; onStderr?: (stderr: string) => void } = {},
): Promise<OpenSSHResult> {
  return new Promise((done, fail) => {
    const [command, argv] = dieWithParent(program, args);
    const child = spawn(command, argv, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    const talk = typeof input === 'function' ? input : undefined;
    child.stdout.on('data', (c: Buffer) => {
      stdout += String(c);
      talk?.(stdout, (text) => child.stdin.write(text));
    });
    child.stderr.on('data', (c: Buffer) => {
      stderr += String(c);
      opts.onStderr?.(stderr);
    });
    const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 30_000);
    child.once('error', fail);
    child.once('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr });
    });
    child.stdin.on('error', () => {});
    if (!talk) child.stdin.end(input);
  });
}
