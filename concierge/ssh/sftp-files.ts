// An open file of an SFTP session, as one streaming command in the container: a reader is one `cat` (from the
// offset the client reads at) whose output serves the client's READs in turn; a writer is one `cat` into the file
// that the client's WRITEs feed in offset order. Both hold a bounded number of bytes, and start their command again
// at another offset only when the client jumps.
import type { ContainerRef, Running } from './containers.ts';
import {
  READ_SCRIPT,
  WRITE_SCRIPT,
  STATUS,
  SftpFailure,
  failureFromError,
  failureFromStderr,
  script,
  stderrTail,
  type SessionCommands,
} from './sftp-commands.ts';

/** The byte a read or write script prints once its file is open; anything before it is not the file's. */
const OPENED = 0x6f; // 'o'

/** A command's outcome once it has ended: its exit status and error message, or why it could not run. */
type Outcome = { code: number; stderr: string } | { failure: SftpFailure };

function outcomeOf(running: Running, stderr: Promise<string>): Promise<Outcome> {
  return running.exit.then(
    async (code) => ({ code, stderr: await stderr }),
    (err: unknown) => ({ failure: failureFromError(err) }),
  );
}

function failureOf(outcome: Outcome, what: string): SftpFailure | undefined {
  if ('failure' in outcome) return outcome.failure;
  return outcome.code === 0
    ? undefined
    : failureFromStderr(outcome.stderr, `${what}: exit status ${outcome.code}`);
}

/** A reader's command: the file from `offset` on, of which `held` bytes have come and not yet been read. */
interface Source {
  running: Running;
  /** The file offset of the first byte held. */
  offset: number;
  held: Buffer[];
  heldBytes: number;
  /** stdout ended: what is held is all there will be. */
  ended: boolean;
  outcome: Promise<Outcome>;
  /** Called when anything above changes. */
  changed: () => void;
}

export interface FileReader {
  /** Up to `length` bytes at `offset`: fewer only at the end of the file; undefined at its end. */
  read(offset: number, length: number): Promise<Buffer | undefined>;
  /** Ends its command. */
  close(): void;
}

/**
 * Opens `path` in the container for reading: resolves once the file is open (or rejects with why it is not).
 * `readAhead`: the bytes it reads before the client asks for them; beyond them the command's output is paused,
 * which the exec stream carries back to `cat` as backpressure.
 */
export async function openReader(
  commands: SessionCommands,
  ref: ContainerRef,
  path: string,
  readAhead: number,
): Promise<FileReader> {
  let source = await startSource(commands, ref, path, 0, readAhead);

  const read = async (offset: number, length: number): Promise<Buffer | undefined> => {
    const skip = offset - source.offset;
    if (skip < 0 || skip > source.heldBytes) {
      discard(source.running);
      source = await startSource(commands, ref, path, offset, readAhead);
    } else {
      take(source, skip);
    }
    while (source.heldBytes < length && !source.ended) {
      source.running.stdout.resume();
      await new Promise<void>((resolve) => (source.changed = resolve));
    }
    if (source.heldBytes === 0) {
      const failure = failureOf(await source.outcome, 'cat');
      if (failure) throw failure;
      return undefined;
    }
    const data = take(source, Math.min(length, source.heldBytes));
    if (source.heldBytes < readAhead) source.running.stdout.resume();
    return data;
  };

  return { read, close: () => discard(source.running) };
}

/** Ends a reader's command, and lets what it already sent drain away, so that its streams can end. */
function discard(running: Running): void {
  running.kill();
  running.stdout.removeAllListeners('data');
  running.stdout.resume();
}

/** Removes and gives the first `n` held bytes. */
function take(source: Source, n: number): Buffer {
  const parts: Buffer[] = [];
  let left = n;
  while (left > 0) {
    const first = source.held[0]!;
    if (first.length <= left) {
      parts.push(first);
      source.held.shift();
      left -= first.length;
    } else {
      parts.push(first.subarray(0, left));
      source.held[0] = first.subarray(left);
      left = 0;
    }
  }
  source.heldBytes -= n;
  source.offset += n;
  return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
}

function startSource(
  commands: SessionCommands,
  ref: ContainerRef,
  path: string,
  offset: number,
  readAhead: number,
): Promise<Source> {
  const running = commands.start(ref, script(READ_SCRIPT, path, String(offset)));
  running.stdin.end();
  const outcome = outcomeOf(running, stderrTail(running.stderr));
  const source: Source = {
    running,
    offset,
    held: [],
    heldBytes: 0,
    ended: false,
    outcome,
    changed: () => {},
  };
  return new Promise((resolve, reject) => {
    let opened = false;
    running.stdout.on('data', (chunk: Buffer) => {
      if (!opened) {
        if (chunk[0] !== OPENED) {
          running.kill();
          reject(new SftpFailure(STATUS.FAILURE, 'read: the command printed something unexpected'));
          return;
        }
        opened = true;
        resolve(source);
        chunk = chunk.subarray(1);
      }
      if (chunk.length === 0) return;
      source.held.push(chunk);
      source.heldBytes += chunk.length;
      if (source.heldBytes >= readAhead) running.stdout.pause();
      source.changed();
    });
    const end = (): void => {
      source.ended = true;
      source.changed();
      if (!opened) {
        void outcome.then((o) =>
          reject(failureOf(o, 'open') ?? new SftpFailure(STATUS.FAILURE, 'open: no file')),
        );
      }
    };
    running.stdout.once('end', end);
    running.stdout.once('close', end);
    // A command that could not run at all may never end its stdout.
    void outcome.then((o) => {
      if ('failure' in o) end();
    });
  });
}

/** How a file is opened for writing: WRITE_SCRIPT's flags. */
export interface WriteMode {
  create: boolean;
  exclusive: boolean;
  truncate: boolean;
  append: boolean;
  /** The mode of a file it creates (umask applied); undefined: the umask's default. */
  createMode?: number;
}

export interface FileWriter {
  /**
   * Writes `data` at `offset`: resolves once the command has taken it. A write beyond the next byte waits (held)
   * until the bytes before it arrive; one behind it starts the command again at its offset. FAILURE at once when
   * more than `bufferBytes` would be held, or when the command has failed.
   */
  write(offset: number, data: Buffer): Promise<void>;
  /** Writes what is held (leaving holes for bytes never sent), ends the command and gives its outcome. */
  close(): Promise<void>;
  /** Ends the command without waiting. */
  abort(): void;
}

interface HeldWrite {
  offset: number;
  data: Buffer;
  done: (failure?: SftpFailure) => void;
}

/** A writer's command. */
interface Sink {
  running: Running;
  outcome: Promise<Outcome>;
  /** Set once its outcome is known. */
  ended?: Outcome;
}

/** Opens `path` in the container for writing, as `mode` says; resolves once the file is open. */
export async function openWriter(
  commands: SessionCommands,
  ref: ContainerRef,
  path: string,
  mode: WriteMode,
  bufferBytes: number,
): Promise<FileWriter> {
  const flags =
    (mode.create ? 'c' : '') +
    (mode.exclusive ? 'x' : '') +
    (mode.truncate ? 't' : '') +
    (mode.append ? 'a' : '');
  const sink = await startSink(commands, ref, path, flags, mode.createMode);
  return new StreamingWriter(sink, () => startSink(commands, ref, path, '', undefined), mode, bufferBytes);
}

/**
 * A file open for writing: the WRITEs held until the command can take them in order, given to it one after another,
 * and the command started again where a write goes back.
 */
class StreamingWriter implements FileWriter {
  private sink: Sink;
  /** Starts the command again on the file as it is (no create, truncate or append). */
  private readonly reopen: () => Promise<Sink>;
  private readonly append: boolean;
  private readonly bufferBytes: number;
  /**
   * The next byte the command writes. A truncated file starts at 0 (a write beyond it waits for the bytes before
   * it); otherwise the first write given says where (a resumed upload starts at the size the file has).
   */
  private position: number | undefined;
  /** Whether the command has been told its offset: until then it writes nothing, and may start anywhere. */
  private started = false;
  /** Writes not yet given to the command, in the order they came. */
  private readonly held: HeldWrite[] = [];
  private heldBytes = 0;
  private failure: SftpFailure | undefined;
  /** The pumps, one after another: each gives the command what it can take of the held writes. Never rejects. */
  private pumps: Promise<void> = Promise.resolve();

  constructor(sink: Sink, reopen: () => Promise<Sink>, mode: WriteMode, bufferBytes: number) {
    this.sink = sink;
    this.reopen = reopen;
    this.append = mode.append;
    this.bufferBytes = bufferBytes;
    this.position = mode.truncate ? 0 : undefined;
  }

  write(offset: number, data: Buffer): Promise<void> {
    if (this.failure) return Promise.reject(this.failure);
    if (this.heldBytes + data.length > this.bufferBytes) {
      return Promise.reject(
        new SftpFailure(
          STATUS.FAILURE,
          `write: more than ${this.bufferBytes} bytes of writes waiting for their turn`,
        ),
      );
    }
    this.heldBytes += data.length;
    return new Promise((resolve, reject) => {
      this.held.push({ offset, data, done: (why) => (why ? reject(why) : resolve()) });
      void this.pump(false);
    });
  }

  async close(): Promise<void> {
    await this.pump(true);
    if (this.failure) {
      this.sink.running.kill();
      throw this.failure;
    }
    this.sink.running.stdin.end();
    const why = failureOf(await this.sink.outcome, 'write');
    if (why) throw why;
  }

  abort(): void {
    this.fail(new SftpFailure(STATUS.CONNECTION_LOST, 'the session has ended'));
    this.sink.running.kill();
  }

  private fail(why: SftpFailure): void {
    this.failure ??= why;
    for (const w of this.held.splice(0)) w.done(this.failure);
    this.heldBytes = 0;
  }

  private pump(flushing: boolean): Promise<void> {
    return (this.pumps = this.pumps.then(() => this.giveHeld(flushing)));
  }

  /** Gives the command the held writes it can take now; `flushing` (at close): all of them, holes and all. */
  private async giveHeld(flushing: boolean): Promise<void> {
    try {
      for (let w = this.next(flushing); w && !this.failure; w = this.next(flushing)) {
        this.held.splice(this.held.indexOf(w), 1);
        if (this.started && w.offset !== this.position && !this.append) await this.restart();
        await this.give(w);
        const why = this.sink.ended && failureOf(this.sink.ended, 'write');
        if (why) throw why;
      }
    } catch (err) {
      this.fail(failureFromError(err));
    }
  }

  /** The next held write to give: the one at the position, else one behind it (which restarts the command). */
  private next(flushing: boolean): HeldWrite | undefined {
    const held = this.held;
    if (held.length === 0) return undefined;
    const expected = this.position;
    if (this.append || expected === undefined) return held[0];
    const at = held.find((w) => w.offset === expected);
    if (at) return at;
    const behind = held.find((w) => w.offset < expected);
    if (behind) return behind;
    return flushing ? held.reduce((a, b) => (b.offset < a.offset ? b : a)) : undefined;
  }

  /** Gives `w` to the command; waits while its stdin is full. */
  private async give(w: HeldWrite): Promise<void> {
    const sink = this.sink;
    const { stdin } = sink.running;
    if (!this.started) {
      this.started = true;
      this.position = w.offset;
      stdin.write(`${this.append ? 0 : w.offset}\n`);
    }
    const more = stdin.write(w.data);
    this.position = w.offset + w.data.length;
    this.heldBytes -= w.data.length;
    if (!more) {
      await Promise.race([new Promise((resolve) => stdin.once('drain', resolve)), sink.outcome]);
    }
    if (sink.ended) {
      w.done(
        failureOf(sink.ended, 'write') ?? new SftpFailure(STATUS.FAILURE, 'write: the command ended early'),
      );
    } else w.done();
  }

  /** Ends the command, and starts it again (to write where the next write says), leaving what is there. */
  private async restart(): Promise<void> {
    this.sink.running.stdin.end();
    const why = failureOf(await this.sink.outcome, 'write');
    if (why) throw why;
    this.sink = await this.reopen();
    this.started = false;
  }
}

function startSink(
  commands: SessionCommands,
  ref: ContainerRef,
  path: string,
  flags: string,
  createMode: number | undefined,
): Promise<Sink> {
  const running = commands.start(
    ref,
    script(WRITE_SCRIPT, path, flags, createMode === undefined ? '' : createMode.toString(8)),
  );
  const outcome = outcomeOf(running, stderrTail(running.stderr));
  const sink: Sink = { running, outcome };
  void outcome.then((o) => (sink.ended = o));
  return new Promise((resolve, reject) => {
    let opened = false;
    running.stdout.on('data', (chunk: Buffer) => {
      if (opened) return;
      opened = true;
      if (chunk[0] === OPENED) resolve(sink);
      else {
        running.kill();
        reject(new SftpFailure(STATUS.FAILURE, 'write: the command printed something unexpected'));
      }
    });
    void outcome.then((o) => {
      if (!opened)
        reject(failureOf(o, 'open') ?? new SftpFailure(STATUS.FAILURE, 'open: the file did not open'));
    });
  });
}
