// The commands SFTP runs in a container, and one session's hold on them. Each operation is a POSIX command that
// busybox and GNU coreutils both have, given the user's paths as argv elements of their own: a script, where one is
// needed, is a constant run as `sh -c SCRIPT sh PATH...`, so no path is ever read as shell text. Every command a
// session starts is tracked, so that all of them end with the session, and its one-shot commands are bounded.
import ssh2 from 'ssh2';
import type { Readable } from 'node:stream';
import { SealionError } from '../../lib/errors.ts';
import type { Logger } from '../../lib/log.ts';
import type { OperationsRecording } from '../recording/session.ts';
import type { ContainerRef, Containers, Running } from './containers.ts';
import { STAT_FORMAT } from './sftp-stat.ts';

/** SFTP's status codes (version 3, the one OpenSSH speaks). */
export const STATUS = ssh2.utils.sftp.STATUS_CODE;

const STATUS_NAMES = new Map<number, string>(
  Object.entries(STATUS).map(([name, code]) => [Number(code), name]),
);

/** An SFTP request's failure: the status it is answered with, and a message for the user. */
export class SftpFailure extends SealionError {
  readonly status: number;

  constructor(status: number, message: string, options?: { cause?: unknown }) {
    super(`SEALION_SFTP_${STATUS_NAMES.get(status) ?? 'FAILURE'}`, message, options);
    this.name = 'SftpFailure';
    this.status = status;
  }
}

/** The longest status message: a command's error is one line, and a Kubernetes Status message a few. */
const MAX_MESSAGE = 1024;
/** A command's stderr kept for its error message: the end, where the reason is. */
const STDERR_TAIL = 4096;

function lastLine(text: string): string {
  const lines = text.split('\n').filter((l) => l.trim() !== '');
  return (lines.at(-1) ?? '').trim().slice(0, MAX_MESSAGE);
}

/**
 * A failed command's status, from its error message. The tools print strerror's words for the errno (glibc's and
 * musl's agree); dash's own redirection errors say "No such file" and "Directory nonexistent" instead.
 */
export function failureFromStderr(stderr: string, fallback: string): SftpFailure {
  const message = lastLine(stderr) || fallback;
  if (/No such file|Directory nonexistent|Not a directory/.test(message)) {
    return new SftpFailure(STATUS.NO_SUCH_FILE, message);
  }
  if (/Permission denied|Operation not permitted|Read-only file system/.test(message)) {
    return new SftpFailure(STATUS.PERMISSION_DENIED, message);
  }
  return new SftpFailure(STATUS.FAILURE, message);
}

/**
 * A command that could not run at all, or a listing that could not be read: the error's message (a Kubernetes
 * Status's) goes to the user unchanged, with the status its reason suggests.
 */
export function failureFromError(err: unknown): SftpFailure {
  if (err instanceof SftpFailure) return err;
  const message = (err instanceof Error ? err.message : String(err)).slice(0, MAX_MESSAGE) || 'failed';
  if (/forbidden|unauthorized/i.test(message))
    return new SftpFailure(STATUS.PERMISSION_DENIED, message, { cause: err });
  if (/not found/i.test(message)) return new SftpFailure(STATUS.NO_SUCH_FILE, message, { cause: err });
  return new SftpFailure(STATUS.FAILURE, message, { cause: err });
}

// The scripts. Each is constant text; the user's paths arrive as positional parameters ("$1", "$2"), and every
// path given to a tool is an absolute one, or follows `--`, so none is read as an option.

/**
 * Lists directory $1: its names (`.`, `..`, then the shell's own sorted glob, dotfiles included), each ended by NUL,
 * then an empty name, then `stat -c '<STAT_FORMAT> %n'` of each name, in the same order and through xargs (a
 * directory's names may not fit one command line). The names come from printf, a shell builtin, so a name with a
 * newline (or any byte but NUL and `/`) arrives whole; `parseListing` matches each to its stat line. A pattern that
 * matched nothing stays as itself, which stat cannot find and prints no line for.
 */
export const LIST_SCRIPT = String.raw`[ -e "$1" ] || { printf '%s: No such file or directory\n' "$1" >&2; exit 1; }
[ -d "$1" ] || { printf '%s: Not a directory\n' "$1" >&2; exit 1; }
cd -- "$1" || { printf '%s: Permission denied\n' "$1" >&2; exit 1; }
set -- . .. .[!.]* ..?* *
printf '%s\0' "$@"
printf '\0'
printf '%s\0' "$@" | xargs -0 stat -c '${STAT_FORMAT} %n' -- 2>/dev/null
exit 0`;

/**
 * Streams file $1 from byte $2 to stdout, after one byte `o` that says the file opened. `dd count=0` only moves the
 * shared offset of stdin (lseek on a regular file), so `cat` carries on from there at full speed.
 */
export const READ_SCRIPT = String.raw`exec < "$1" || exit 1
printf o
if [ "$2" != 0 ]; then
  dd bs=1 skip="$2" count=0 2>/dev/null || { printf 'cannot seek to byte %s\n' "$2" >&2; exit 1; }
fi
exec cat`;

/**
 * Opens file $1 for writing as flags $2 say (c: create, x: exclusive, t: truncate, a: append), and gives a file
 * it creates mode $3 (octal; with the umask applied, as open(2) would), then prints `o`. Then it reads one line from
 * stdin, the byte offset to write at, and copies the rest of stdin there. The shell's `read` takes one byte at a
 * time from a pipe, so `cat` gets everything after that line. Without truncation the file is opened read-write
 * (`<>`), the one POSIX redirection that neither truncates nor appends, so such writes need read permission too.
 * `cat` runs in a child while the shell waits, holding its stdout open: containerd's CRI exec closes a command's
 * stdin as soon as its stdout ends (containerd issue 13934), so a `cat` that took stdout away lost what had not
 * reached it yet, the rest of an upload, and the file came out short. The `exit` after it is what keeps it a child:
 * shells exec the last command of `sh -c` in place of themselves.
 */
export const WRITE_SCRIPT = String.raw`new=
if [ ! -e "$1" ] && [ ! -L "$1" ]; then
  case $2 in *c*) new=1 ;; *) printf '%s: No such file or directory\n' "$1" >&2; exit 1 ;; esac
fi
case $2 in *x*) (set -C; : > "$1") || exit 1; new=1 ;; esac
case $2 in
  *t*) exec 3> "$1" ;;
  *a*) exec 3>> "$1" ;;
  *) exec 3<> "$1" ;;
esac
if [ -n "$new" ] && [ -n "$3" ]; then chmod "$(printf %o $(( 0$3 & ~0$(umask) )))" -- "$1" || exit 1; fi
printf o
read -r offset || exit 0
case $2 in
  *a*) ;;
  *) [ "$offset" = 0 ] || dd bs=1 seek="$offset" count=0 >&3 2>/dev/null ||
       { printf 'cannot seek to byte %s\n' "$offset" >&2; exit 1; } ;;
esac
cat >&3
exit $?`;

/** Makes directory $1, with mode $2 (octal, umask applied) when given. */
export const MKDIR_SCRIPT = String.raw`mkdir -- "$1" || exit 1
[ -z "$2" ] || chmod "$(printf %o $(( 0$2 & ~0$(umask) )))" -- "$1"`;

/**
 * Sets what is given of $1's attributes, in the order OpenSSH's server does: size $2, mode $3 (octal), atime $4 and
 * mtime $5 (seconds since the epoch), owner $6:$7. An empty one is left alone.
 */
export const SETSTAT_SCRIPT = String.raw`[ -z "$2" ] || truncate -c -s "$2" -- "$1" || exit 1
[ -z "$3" ] || chmod "$3" -- "$1" || exit 1
[ -z "$5" ] || touch -c -m -d "@$5" -- "$1" || exit 1
[ -z "$4" ] || touch -c -a -d "@$4" -- "$1" || exit 1
[ -z "$6" ] || chown "$6:$7" -- "$1" || exit 1`;

/**
 * Renames $1 to $2, refusing when $2 exists as SFTP version 3 says: `mv` would replace a file, or move $1 into a
 * directory. (Checked, then moved: another writer in the container could still slip in between.)
 */
export const RENAME_SCRIPT = String.raw`if [ -e "$2" ] || [ -L "$2" ]; then printf '%s: File exists\n' "$2" >&2; exit 1; fi
exec mv -- "$1" "$2"`;

/** `sh -c script` with its positional parameters. */
export function script(text: string, ...args: string[]): string[] {
  return ['sh', '-c', text, 'sh', ...args];
}

/** A one-shot command's end. */
export interface CommandResult {
  code: number;
  stdout: Buffer;
  /** Its last STDERR_TAIL bytes. */
  stderr: string;
}

/** A one-shot command's result, or its failure as SFTP reports it. */
export function succeeded(result: CommandResult, what: string): CommandResult {
  if (result.code !== 0) throw failureFromStderr(result.stderr, `${what}: exit status ${result.code}`);
  return result;
}

/** What one SFTP session runs in containers. */
export interface SessionCommands {
  /** Starts a command that the caller streams (a file handle's); it is ended, at the latest, with the session. */
  start(ref: ContainerRef, argv: readonly string[]): Running;
  /**
   * Runs a command with stdin closed, to its end, and gives its output; no more than `maxCommands` run at once (the
   * rest wait their turn). More than `maxOutput` bytes of stdout end it with FAILURE.
   */
  run(ref: ContainerRef, argv: readonly string[], maxOutput: number): Promise<CommandResult>;
  /** Ends every command the session started, and refuses new ones. Gives how many were still running. */
  close(): number;
}

/** Bytes of stdout a one-shot command may print unless its caller says otherwise: a stat line or a link. */
export const SMALL_OUTPUT = 64 * 1024;

interface Drained {
  data: Buffer;
  overflow: boolean;
}

/** Everything `stream` gives until it ends, up to `max` bytes (more: `overflow`, and `onOverflow` is called). */
function drain(stream: Readable, max: number, onOverflow: () => void): Promise<Drained> {
  return new Promise((resolve) => {
    const chunks: Buffer[] = [];
    let size = 0;
    let overflow = false;
    const done = (): void => resolve({ data: Buffer.concat(chunks), overflow });
    stream.on('data', (chunk: Buffer) => {
      if (overflow) return;
      size += chunk.length;
      if (size > max) {
        overflow = true;
        onOverflow();
        return;
      }
      chunks.push(chunk);
    });
    stream.once('end', done);
    stream.once('close', done);
    stream.once('error', done);
  });
}

/** The end of what `stream` gives, as text, when it ends. */
export function stderrTail(stream: Readable): Promise<string> {
  return new Promise((resolve) => {
    let tail = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => {
      tail = (tail + chunk).slice(-STDERR_TAIL);
    });
    const done = (): void => resolve(tail);
    stream.once('end', done);
    stream.once('close', done);
    stream.once('error', done);
  });
}

/** What the session's recording shows of a script: the operation, and the names of its arguments after the path. */
const OPERATIONS = new Map<string, { name: string; args: string[] }>([
  [LIST_SCRIPT, { name: 'list', args: [] }],
  [READ_SCRIPT, { name: 'read', args: ['from'] }],
  [WRITE_SCRIPT, { name: 'write', args: ['flags', 'mode'] }],
  [MKDIR_SCRIPT, { name: 'mkdir', args: ['mode'] }],
  [SETSTAT_SCRIPT, { name: 'setstat', args: ['size', 'mode', 'atime', 'mtime', 'uid', 'gid'] }],
  [RENAME_SCRIPT, { name: 'rename', args: ['to'] }],
]);

/** A word of an operation's line: as it is when plain, else quoted as JSON (a name cannot forge a line of its own). */
const shown = (word: string): string => (/^[\w./@:+,=%~-]+$/.test(word) ? word : JSON.stringify(word));

/**
 * A command as the operation a recording shows: the script's name, the path as the tree names it
 * (`/<cluster>/<namespace>/<pod>/<container>/…`) and its other arguments by name; or a tool's name and what follows
 * its `--`.
 */
export function operationOf(ref: ContainerRef, argv: readonly string[]): string {
  const inTree = (path: string): string =>
    path.startsWith('/') ? `/${ref.cluster}/${ref.namespace}/${ref.pod}/${ref.container}${path}` : path;
  const script = argv[0] === 'sh' && argv[1] === '-c' ? OPERATIONS.get(argv[2] ?? '') : undefined;
  if (script) {
    const [path = '', ...rest] = argv.slice(4);
    const named = script.args.flatMap((name, i) => {
      const value = rest[i] ?? '';
      if (value === '' || (name === 'from' && value === '0')) return [];
      return [`${name}=${name === 'to' ? inTree(value) : value}`];
    });
    return [script.name, inTree(path), ...named].map(shown).join(' ');
  }
  const dashes = argv.indexOf('--');
  const args = dashes < 0 ? argv.slice(1) : argv.slice(dashes + 1);
  return [argv[0] ?? '', ...args.map(inTree)].map(shown).join(' ');
}

export function newSessionCommands(
  containers: Containers,
  maxCommands: number,
  log: Logger,
  recording?: Pick<OperationsRecording, 'note' | 'close'>,
): SessionCommands {
  const live = new Set<Running>();
  const waiting: (() => void)[] = [];
  let active = 0;
  let closed = false;
  let rejectClosed: (err: SftpFailure) => void = () => {};
  /** Rejects when the session closes, so that a one-shot command's caller stops waiting for an answer no one reads. */
  const sessionClosed = new Promise<never>((_, reject) => (rejectClosed = reject));
  sessionClosed.catch(() => {});

  const start = (ref: ContainerRef, argv: readonly string[]): Running => {
    if (closed) throw new SftpFailure(STATUS.CONNECTION_LOST, 'the session has ended');
    // Noted before it runs: the recording opens with the first, and the command waits for it in the pipeline.
    const operation = recording && operationOf(ref, argv);
    if (operation) recording.note(ref, operation);
    let running: Running;
    try {
      running = containers.run(ref, argv);
    } catch (err) {
      throw failureFromError(err);
    }
    // Its outcome when it failed, named again: commands run side by side, so the lines of several interleave.
    if (operation)
      running.exit.then(
        (code) => {
          if (code !== 0) recording.note(ref, `failed (exit status ${code}): ${operation}`);
        },
        (err: unknown) =>
          recording.note(
            ref,
            `refused (${JSON.stringify((err as Error).message.slice(0, 512))}): ${operation}`,
          ),
      );
    live.add(running);
    // A command that ends early makes writes to its stdin fail (EPIPE); its exit status says why, so these are noise.
    for (const stream of [running.stdin, running.stdout, running.stderr]) {
      stream.on('error', (err: Error) =>
        log.debug({ err: err.message, command: argv[0] }, 'sftp command stream error'),
      );
    }
    running.exit.then(
      () => live.delete(running),
      () => live.delete(running),
    );
    return running;
  };

  const acquire = async (): Promise<void> => {
    if (active < maxCommands) {
      active++;
      return;
    }
    await Promise.race([new Promise<void>((resolve) => waiting.push(resolve)), sessionClosed]);
  };
  const release = (): void => {
    const next = waiting.shift();
    if (next) next();
    else active--;
  };

  const run = async (
    ref: ContainerRef,
    argv: readonly string[],
    maxOutput: number,
  ): Promise<CommandResult> => {
    await acquire();
    try {
      const running = start(ref, argv);
      running.stdin.end();
      const stdout = drain(running.stdout, maxOutput, () => running.kill());
      const stderr = stderrTail(running.stderr);
      let code: number;
      try {
        code = await Promise.race([running.exit, sessionClosed]);
      } catch (err) {
        throw failureFromError(err);
      }
      const [out, err] = await Promise.race([Promise.all([stdout, stderr]), sessionClosed]);
      if (out.overflow) throw new SftpFailure(STATUS.FAILURE, `${argv[0]}: output over ${maxOutput} bytes`);
      return { code, stdout: out.data, stderr: err };
    } finally {
      release();
    }
  };

  const close = (): number => {
    closed = true;
    rejectClosed(new SftpFailure(STATUS.CONNECTION_LOST, 'the session has ended'));
    const count = live.size;
    for (const running of live) running.kill();
    live.clear();
    void recording?.close();
    return count;
  };

  return { start, run, close };
}
