// The SSH door's SFTP subsystem (so also scp, which OpenSSH 9 speaks over SFTP): the protocol's requests, each
// answered from the tree the user sees (sftp-tree.ts: `/` lists the clusters, then namespaces, pods and containers,
// each a read-only directory, and below a container its file system), worked on with POSIX commands run in the
// container (sftp-commands.ts) as the user signed in: an exec through the proxy's pipeline, so the cluster's RBAC
// decides and audit and recording apply. An open file is one streaming command (sftp-files.ts). What one session
// can hold is bounded (`SftpLimits`), and every command it started ends when its channel closes.
import type { Attributes, FileEntry, SFTPWrapper } from 'ssh2';
import ssh2 from 'ssh2';
import type { Logger } from '../../lib/log.ts';
import type { OperationsRecording } from '../recording/session.ts';
import type { Containers } from './containers.ts';
import {
  MKDIR_SCRIPT,
  RENAME_SCRIPT,
  SMALL_OUTPUT,
  STATUS,
  SftpFailure,
  failureFromError,
  newSessionCommands,
  script,
  type SessionCommands,
  succeeded,
} from './sftp-commands.ts';
import { openReader, openWriter, type FileReader, type FileWriter } from './sftp-files.ts';
import { resolvePath, sameContainer, treePath } from './sftp-paths.ts';
import { fileAt, newTree, where, type FileAt, type Tree } from './sftp-tree.ts';

const OPEN_MODE = ssh2.utils.sftp.OPEN_MODE;

/** What one SFTP session may hold. */
export interface SftpLimits {
  /** Files and directories open at once; an OPEN or OPENDIR beyond gets FAILURE. Default: 64. */
  maxHandles: number;
  /**
   * One-shot commands (stat, mkdir, a listing, ...) running at once; more requests wait their turn. Each is an exec
   * the cluster serves, so a client that sends a thousand STATs at once gets them a few at a time. Default: 8.
   */
  maxCommands: number;
  /**
   * Per file open for reading: the bytes read from the container before the client asks for them. Beyond them the
   * command's output is paused. At least `MAX_READ`. Default: 1 MiB.
   */
  readAheadBytes: number;
  /**
   * Per file open for writing: the bytes of WRITEs held before the command takes them (out of order ones, and ones
   * behind a full pipe); a WRITE beyond gets FAILURE. OpenSSH keeps 64 requests of 32 KiB in flight, 2 MiB.
   * Default: 8 MiB.
   */
  writeBufferBytes: number;
  /** Per file or directory: requests queued behind the one being served; more get FAILURE. Default: 1024. */
  maxQueuedRequests: number;
  /** The output of one directory listing; a larger directory gets FAILURE. About 100 bytes a file. Default: 16 MiB. */
  maxListingBytes: number;
}

export const DEFAULT_SFTP_LIMITS: SftpLimits = {
  maxHandles: 64,
  maxCommands: 8,
  readAheadBytes: 1024 * 1024,
  writeBufferBytes: 8 * 1024 * 1024,
  maxQueuedRequests: 1024,
  maxListingBytes: 16 * 1024 * 1024,
};

export interface SftpOptions {
  /** Requests at debug level, sessions at info; paths and statuses, never file contents. */
  log: Logger;
  /** Default: `DEFAULT_SFTP_LIMITS`, field by field. */
  limits?: Partial<SftpLimits>;
  /** The session's recording: each command it runs, as the operation it is for. Default: not recorded. */
  recording?: Pick<OperationsRecording, 'note' | 'close'>;
}

/**
 * The most a READ is answered with: OpenSSH asks for 32 KiB, and any client takes a shorter answer and asks for the
 * rest.
 */
export const MAX_READ = 64 * 1024;
/** A READDIR answer: at most this many entries, and about this many bytes of names (OpenSSH takes 256 KiB). */
const DIR_BATCH_ENTRIES = 100;
const DIR_BATCH_BYTES = 64 * 1024;

/**
 * ssh2 writes only the attributes present in the object it is given, and REALPATH's answer carries none (the path
 * need not exist yet), so an empty object stands for "no attributes".
 */
const NO_ATTRS = {} as Attributes;

type Answer =
  | { status: number; message?: string }
  | { handle: Buffer }
  | { data: Buffer }
  | { names: FileEntry[] }
  | { attrs: Attributes };

const OK: Answer = { status: STATUS.OK };
const EOF: Answer = { status: STATUS.EOF };

/** Requests for one handle, served one after another. */
interface Serial {
  tail: Promise<unknown>;
  queued: number;
}

type Handle =
  | { kind: 'dir'; path: string; entries: FileEntry[]; next: number; serial: Serial }
  | { kind: 'read'; at: FileAt; reader: FileReader; serial: Serial }
  | {
      kind: 'write';
      at: FileAt;
      writer: FileWriter;
      serial: Serial;
      /** What FSETSTAT asked for that must wait until the data is in: size and times (`cat` would undo them). */
      later: Partial<Attributes>;
    };

/** Serves SFTP on `sftp` (the accepted `sftp` subsystem of a session) until its channel closes. */
export function serveSftp(sftp: SFTPWrapper, containers: Containers, options: SftpOptions): void {
  const session = new SftpSession(sftp, containers, options);
  answerLookups(session);
  answerDirectories(session);
  answerFiles(session);
  answerChanges(session);
  session.endWithChannel();
  options.log.info('sftp session started');
}

/**
 * One SFTP session's state: its open handles, the requests not yet answered, and whether it has ended. Requests are
 * served through `serve`, which answers each exactly once (unless the session has closed) and logs what failed.
 */
class SftpSession {
  readonly sftp: SFTPWrapper;
  readonly limits: SftpLimits;
  readonly log: Logger;
  readonly commands: SessionCommands;
  readonly tree: Tree;
  private readonly handles = new Map<number, Handle>();
  private nextHandle = 0;
  private closed = false;
  /** Requests not yet answered, and whether the client has said it sends no more (channel EOF). */
  private inFlight = 0;
  private clientDone = false;
  /** Handles being opened: counted with the open ones, so that OPENs sent at once cannot pass the limit together. */
  private opening = 0;

  constructor(sftp: SFTPWrapper, containers: Containers, options: SftpOptions) {
    this.sftp = sftp;
    const limits: SftpLimits = { ...DEFAULT_SFTP_LIMITS, ...options.limits };
    limits.readAheadBytes = Math.max(limits.readAheadBytes, MAX_READ);
    this.limits = limits;
    this.log = options.log;
    this.commands = newSessionCommands(containers, limits.maxCommands, this.log, options.recording);
    this.tree = newTree(containers, this.commands, limits.maxListingBytes);
  }

  /** Answers request `id` with what `work` gives, or with the status its failure maps to. */
  serve(id: number, op: string, path: string, work: () => Answer | Promise<Answer>): void {
    this.log.debug({ op, path }, 'sftp request');
    this.inFlight++;
    Promise.resolve()
      .then(work)
      .then(
        (answer) => this.send(id, answer),
        (err: unknown) => {
          const failure = failureFromError(err);
          if (!(err instanceof SftpFailure))
            this.log.warn({ op, path, err }, 'sftp request failed unexpectedly');
          this.log.debug(
            { op, path, status: failure.status, message: failure.message },
            'sftp request refused',
          );
          this.send(id, { status: failure.status, message: failure.message });
        },
      )
      .finally(() => {
        this.inFlight--;
        if (this.clientDone && this.inFlight === 0) this.finish();
      });
  }

  /** Holds a place for a handle while `open` makes it; FAILURE when every place is taken. */
  async withPlace(open: () => Promise<Handle>): Promise<Answer> {
    if (this.handles.size + this.opening >= this.limits.maxHandles) {
      throw new SftpFailure(
        STATUS.FAILURE,
        `at most ${this.limits.maxHandles} files and directories open at once`,
      );
    }
    this.opening++;
    try {
      return this.addHandle(await open());
    } finally {
      this.opening--;
    }
  }

  /** The handle the client names by `raw`, and its number; FAILURE when there is none. */
  handleOf(raw: Buffer): [number, Handle] {
    const id = raw.length === 4 ? raw.readUInt32BE() : -1;
    const handle = this.handles.get(id);
    if (!handle) throw new SftpFailure(STATUS.FAILURE, 'no such handle');
    return [id, handle];
  }

  /** Forgets handle `id` (CLOSE); what it holds is the caller's to end. */
  dropHandle(id: number): void {
    this.handles.delete(id);
  }

  /** Runs `work` after the handle's earlier requests; FAILURE when too many wait already. */
  inTurn<T>(handle: Handle, work: () => Promise<T>): Promise<T> {
    const s = handle.serial;
    if (s.queued >= this.limits.maxQueuedRequests) {
      return Promise.reject(
        new SftpFailure(STATUS.FAILURE, `more than ${this.limits.maxQueuedRequests} requests queued`),
      );
    }
    s.queued++;
    const result = s.tail.then(work);
    s.tail = result.then(
      () => s.queued--,
      () => s.queued--,
    );
    return result;
  }

  /** Ends the session with its channel: at the client's EOF once every request is answered, or at close or error. */
  endWithChannel(): void {
    this.sftp.on('end', () => {
      this.clientDone = true;
      if (this.inFlight === 0) this.finish();
    });
    this.sftp.on('close', () => this.end());
    this.sftp.on('error', (err: Error) => {
      this.log.info({ err: err.message }, 'sftp channel error');
      this.end();
    });
  }

  private send(id: number, answer: Answer): void {
    if (this.closed) return;
    const sftp = this.sftp;
    if ('status' in answer) sftp.status(id, answer.status, answer.message);
    else if ('handle' in answer) sftp.handle(id, answer.handle);
    else if ('data' in answer) sftp.data(id, answer.data);
    else if ('names' in answer) sftp.name(id, answer.names);
    else sftp.attrs(id, answer.attrs);
  }

  private addHandle(handle: Handle): Answer {
    // The session ended while this one opened; its command has been ended with the others.
    if (this.closed) releaseHandle(handle);
    const id = this.nextHandle++ >>> 0;
    this.handles.set(id, handle);
    const buf = Buffer.alloc(4);
    buf.writeUInt32BE(id);
    return { handle: buf };
  }

  /** Ends what the session still holds: open files' commands, and any other command it started. */
  private end(): void {
    if (this.closed) return;
    this.closed = true;
    for (const handle of this.handles.values()) releaseHandle(handle);
    const open = this.handles.size;
    this.handles.clear();
    const killed = this.commands.close();
    this.log.info({ openHandles: open, commandsEnded: killed }, 'sftp session ended');
  }

  /** The client sends no more and every request is answered: close our side, as sftp-server exits at EOF. */
  private finish(): void {
    this.end();
    sendExitStatus(this.sftp, 0);
    this.sftp.end();
  }
}

/** Ends a handle's command: a reader's is closed, a writer's aborted (its file left as far as it got). */
function releaseHandle(handle: Handle): void {
  if (handle.kind === 'read') handle.reader.close();
  if (handle.kind === 'write') handle.writer.abort();
}

function pathOf(handle: Handle): string {
  return handle.kind === 'dir' ? handle.path : treePath(handle.at.ref, handle.at.path);
}

/** REALPATH, STAT, LSTAT and READLINK: what a path is, without opening it. */
function answerLookups(session: SftpSession): void {
  const { sftp, tree, commands } = session;
  sftp.on('REALPATH', (id: number, path: string) =>
    session.serve(id, 'REALPATH', path, () => {
      const resolved = resolvePath(path);
      return { names: [{ filename: resolved, longname: resolved, attrs: NO_ATTRS }] };
    }),
  );

  for (const op of ['STAT', 'LSTAT'] as const) {
    sftp.on(op, (id: number, path: string) =>
      session.serve(id, op, path, async () => ({
        attrs: (await tree.stat(where(path), op === 'STAT')).attrs,
      })),
    );
  }

  sftp.on('READLINK', (id: number, path: string) =>
    session.serve(id, 'READLINK', path, async () => {
      const at = fileAt(where(path), 'read');
      const out = succeeded(
        await commands.run(at.ref, ['readlink', '--', at.path], SMALL_OUTPUT),
        'readlink',
      );
      const target = out.stdout.toString('utf8').replace(/\n$/, '');
      // An absolute target is the container's path; the user's tree has the container's root above it.
      const shown = target.startsWith('/') ? treePath(at.ref, target) : target;
      return { names: [{ filename: shown, longname: shown, attrs: NO_ATTRS }] };
    }),
  );
}

/** OPENDIR and READDIR: a directory's listing, read once at OPENDIR and handed out in batches. */
function answerDirectories(session: SftpSession): void {
  const { sftp, tree } = session;
  sftp.on('OPENDIR', (id: number, path: string) =>
    session.serve(id, 'OPENDIR', path, async () => {
      const loc = where(path);
      return session.withPlace(async () => {
        const entries = await tree.list(loc);
        return { kind: 'dir', path: resolvePath(path), entries, next: 0, serial: newSerial() };
      });
    }),
  );

  sftp.on('READDIR', (id: number, raw: Buffer) =>
    session.serve(id, 'READDIR', '', () => {
      const [, handle] = session.handleOf(raw);
      if (handle.kind !== 'dir') throw new SftpFailure(STATUS.FAILURE, 'not a directory handle');
      const batch = nextBatch(handle.entries, handle.next);
      handle.next += batch.length;
      return batch.length === 0 ? EOF : { names: batch };
    }),
  );
}

/** OPEN, READ, WRITE, CLOSE, FSTAT and FSETSTAT: the requests on a handle. */
function answerFiles(session: SftpSession): void {
  const { sftp, tree } = session;
  sftp.on('OPEN', (id: number, path: string, flags: number, attrs: Attributes) =>
    session.serve(id, 'OPEN', path, async () => {
      const at = fileAt(where(path), flags & OPEN_MODE.WRITE ? 'write' : 'read');
      return session.withPlace(() => openFile(session, at, flags, attrs));
    }),
  );

  sftp.on('READ', (id: number, raw: Buffer, offset: number, length: number) =>
    session.serve(id, 'READ', '', async () => {
      const [, handle] = session.handleOf(raw);
      if (handle.kind !== 'read') throw new SftpFailure(STATUS.FAILURE, 'not a handle open for reading');
      const data = await session.inTurn(handle, () => handle.reader.read(offset, Math.min(length, MAX_READ)));
      return data ? { data } : EOF;
    }),
  );

  sftp.on('WRITE', (id: number, raw: Buffer, offset: number, data: Buffer) =>
    session.serve(id, 'WRITE', '', async () => {
      const [, handle] = session.handleOf(raw);
      if (handle.kind !== 'write') throw new SftpFailure(STATUS.FAILURE, 'not a handle open for writing');
      await handle.writer.write(offset, data);
      return OK;
    }),
  );

  sftp.on('CLOSE', (id: number, raw: Buffer) =>
    session.serve(id, 'CLOSE', '', async () => {
      const [key, handle] = session.handleOf(raw);
      session.dropHandle(key);
      if (handle.kind === 'read') handle.reader.close();
      if (handle.kind !== 'write') return OK;
      await session.inTurn(handle, () => handle.writer.close());
      if (Object.keys(handle.later).length > 0) await tree.setAttrs(handle.at, handle.later);
      return OK;
    }),
  );

  sftp.on('FSTAT', (id: number, raw: Buffer) =>
    session.serve(id, 'FSTAT', '', async () => {
      const [, handle] = session.handleOf(raw);
      return { attrs: (await tree.stat(where(pathOf(handle)), true)).attrs };
    }),
  );

  sftp.on('FSETSTAT', (id: number, raw: Buffer, attrs: Attributes) =>
    session.serve(id, 'FSETSTAT', '', async () => {
      const [, handle] = session.handleOf(raw);
      if (handle.kind === 'dir') {
        await tree.setAttrs(fileAt(where(handle.path), 'change'), attrs);
        return OK;
      }
      if (handle.kind === 'write') {
        const { size, atime, mtime, ...now } = attrs;
        handle.later = { ...handle.later, ...definedOnly({ size, atime, mtime }) };
        attrs = now as Attributes;
      }
      await tree.setAttrs(handle.at, attrs);
      return OK;
    }),
  );
}

/** The handle OPEN makes: a streaming read, or a write with the open flags' create, truncate and append. */
async function openFile(session: SftpSession, at: FileAt, flags: number, attrs: Attributes): Promise<Handle> {
  const { commands, limits } = session;
  if (!(flags & OPEN_MODE.WRITE)) {
    const reader = await openReader(commands, at.ref, at.path, limits.readAheadBytes);
    return { kind: 'read', at, reader, serial: newSerial() };
  }
  const mode = {
    create: !!(flags & OPEN_MODE.CREAT),
    exclusive: !!(flags & OPEN_MODE.EXCL),
    truncate: !!(flags & OPEN_MODE.TRUNC),
    append: !!(flags & OPEN_MODE.APPEND),
    createMode: typeof attrs.mode === 'number' ? attrs.mode & 0o7777 : undefined,
  };
  const writer = await openWriter(commands, at.ref, at.path, mode, limits.writeBufferBytes);
  return { kind: 'write', at, writer, serial: newSerial(), later: {} };
}

/** SETSTAT, MKDIR, RMDIR, REMOVE, RENAME and SYMLINK change the tree; EXTENDED is refused. */
function answerChanges(session: SftpSession): void {
  const { sftp, tree, commands } = session;
  sftp.on('SETSTAT', (id: number, path: string, attrs: Attributes) =>
    session.serve(id, 'SETSTAT', path, async () => {
      await tree.setAttrs(fileAt(where(path), 'change'), attrs);
      return OK;
    }),
  );

  sftp.on('MKDIR', (id: number, path: string, attrs: Attributes) =>
    session.serve(id, 'MKDIR', path, async () => {
      const at = fileAt(where(path), 'change');
      const mode =
        typeof attrs.mode === 'number' && (attrs.mode & 0o7777) !== 0o777 ? attrs.mode & 0o7777 : undefined;
      const args = mode === undefined ? [at.path, ''] : [at.path, mode.toString(8)];
      succeeded(await commands.run(at.ref, script(MKDIR_SCRIPT, ...args), SMALL_OUTPUT), 'mkdir');
      return OK;
    }),
  );

  for (const [op, argv] of [
    ['RMDIR', ['rmdir', '--']],
    ['REMOVE', ['rm', '--']],
  ] as const) {
    sftp.on(op, (id: number, path: string) =>
      session.serve(id, op, path, async () => {
        const at = fileAt(where(path), 'change');
        succeeded(await commands.run(at.ref, [...argv, at.path], SMALL_OUTPUT), argv[0]);
        return OK;
      }),
    );
  }

  sftp.on('RENAME', (id: number, from: string, to: string) =>
    session.serve(id, 'RENAME', `${from} -> ${to}`, async () => {
      const a = fileAt(where(from), 'change');
      const b = fileAt(where(to), 'change');
      if (!sameContainer(a.ref, b.ref)) {
        throw new SftpFailure(STATUS.OP_UNSUPPORTED, 'rename: a file moves only within its container');
      }
      succeeded(await commands.run(a.ref, script(RENAME_SCRIPT, a.path, b.path), SMALL_OUTPUT), 'rename');
      return OK;
    }),
  );

  // ssh2 hands every client's SYMLINK over as (link to make, its target), putting OpenSSH's swapped order right
  // (its types name the two the other way round).
  sftp.on('SYMLINK', (id: number, link: string, target: string) =>
    session.serve(id, 'SYMLINK', link, async () => {
      const at = fileAt(where(link), 'change');
      let content = target;
      if (target.startsWith('/')) {
        const to = where(target);
        if (to.level !== 'file' || !sameContainer(to.ref, at.ref)) {
          throw new SftpFailure(STATUS.OP_UNSUPPORTED, 'symlink: a link points only within its container');
        }
        content = to.path;
      }
      succeeded(await commands.run(at.ref, ['ln', '-s', '--', content, at.path], SMALL_OUTPUT), 'ln');
      return OK;
    }),
  );

  sftp.on('EXTENDED', (id: number, name: string) =>
    session.serve(id, 'EXTENDED', name, () => ({
      status: STATUS.OP_UNSUPPORTED,
      message: `${name} is not supported`,
    })),
  );
}

/** The parts of ssh2's SFTP stream (1.17) that `sendExitStatus` uses; not in its types. */
interface SftpChannelInternals {
  outgoing?: { id: number; state: string };
  _protocol?: { exitStatus?: (channel: number, status: number) => void };
}

/**
 * Tells the client the subsystem exited with `status`, as OpenSSH's server does when sftp-server exits. OpenSSH's
 * scp (SFTP mode) fails a copy that went well when the session ends without an exit status, and ssh2's SFTP stream,
 * unlike its other channels, has no `exit()`: so its own protocol object sends it, if this ssh2 still has one.
 */
function sendExitStatus(sftp: SFTPWrapper, status: number): void {
  const channel = sftp as unknown as SftpChannelInternals;
  if (channel.outgoing?.state !== 'open' || typeof channel._protocol?.exitStatus !== 'function') return;
  channel._protocol.exitStatus(channel.outgoing.id, status);
}

function newSerial(): Serial {
  return { tail: Promise.resolve(), queued: 0 };
}

/** The fields of `attrs` that are set: ssh2 leaves out the ones the client did not send. */
function definedOnly(attrs: Partial<Attributes>): Partial<Attributes> {
  return Object.fromEntries(Object.entries(attrs).filter(([, v]) => typeof v === 'number'));
}

/** The next READDIR answer's entries, from `from`. */
function nextBatch(entries: FileEntry[], from: number): FileEntry[] {
  const batch: FileEntry[] = [];
  let bytes = 0;
  for (let i = from; i < entries.length && batch.length < DIR_BATCH_ENTRIES; i++) {
    const e = entries[i]!;
    bytes += Buffer.byteLength(e.filename) + Buffer.byteLength(e.longname) + 64;
    if (batch.length > 0 && bytes > DIR_BATCH_BYTES) break;
    batch.push(e);
  }
  return batch;
}
