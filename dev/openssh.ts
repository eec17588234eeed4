// The real OpenSSH client (ssh, sftp, scp) as tests run it: no user configuration, no agent, one key, a bounded
// time, and what it printed and how it ended.
import { spawn } from 'node:child_process';
import { dieWithParent } from './processes.ts';

export interface OpenSSHResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * The options every run shares: no config file, the one key given, batch mode (no prompt can wait), and the host key
 * pinned in `knownHosts` (or, without it, whatever the server shows: a test's own throwaway server).
 */
export function opensshOptions(key: string, knownHosts?: string): string[] {
  return [
    '-F',
    '/dev/null',
    '-o',
    knownHosts ? `UserKnownHostsFile=${knownHosts}` : 'UserKnownHostsFile=/dev/null',
    '-o',
    `StrictHostKeyChecking=${knownHosts ? 'yes' : 'no'}`,
    '-o',
    'BatchMode=yes',
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    'IdentityAgent=none',
    '-o',
    'LogLevel=ERROR',
    '-i',
    key,
  ];
}

/** Runs `program` with `args`, `input` on its stdin; killed after `timeoutMs`, so that a red test ends. */
export function runOpenSSH(
  program: 'ssh' | 'sftp' | 'scp',
  args: string[],
  input = '',
  timeoutMs = 30_000,
): Promise<OpenSSHResult> {
  return new Promise((done, fail) => {
    const [command, argv] = dieWithParent(program, args);
    const child = spawn(command, argv, { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += String(c)));
    child.stderr.on('data', (c: Buffer) => (stderr += String(c)));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.once('error', fail);
    child.once('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr });
    });
    child.stdin.on('error', () => {});
    child.stdin.end(input);
  });
}
