// Writes what a terminal session showed as an asciicast v2 file (https://docs.asciinema.org/manual/asciicast/v2/):
// a header line, then one JSON array per event, [seconds since the start, code, data]. stdout and stderr are "o",
// stdin "i" (only when asked: it holds what the user typed, passwords among it), a terminal size "r" ("WxH"), and the
// error channel's Status, the reason a session closed and a cut recording are markers ("m").
//
// The recorder is fed from the proxy's splice (through terminal-streams.ts), so it never blocks and never holds
// much: lines queue for one write at a time, and a file that would grow past `maxBytes`, or a disk that falls so far
// behind that the queue would pass `maxPendingBytes`, ends the recording with a marker that says so.
import { open, rm, type FileHandle } from 'node:fs/promises';
import { StringDecoder } from 'node:string_decoder';
import type { Clock } from '../../lib/clock.ts';
import { SealionError } from '../../lib/errors.ts';
import type { Channel } from './terminal-streams.ts';

/** The options are not usable (a limit that is not a positive integer, a header too large for `maxBytes`). */
export const RECORDING_OPTIONS = 'SEALION_RECORDING_OPTIONS';
/** The file could not be created (it exists, its folder does not, no permission) or its header not written. */
export const RECORDING_CREATE = 'SEALION_RECORDING_CREATE';
/** A write failed; the file holds what was written before it. */
export const RECORDING_WRITE = 'SEALION_RECORDING_WRITE';

/** What Sealion writes into a recording's header to find it later, beside the request's audit events. */
export interface SessionFields {
  /**
   * The request's audit ID, which the hub's and the cluster's audit events carry too. Absent for a session recorded
   * operation by operation (sftp): the audit events of the commands it ran name the recording instead.
   */
  auditID?: string;
  /** exec, attach or sftp. */
  kind?: string;
  /** The authenticated user, before any impersonation. */
  user: string;
  cluster: string;
  namespace: string;
  pod: string;
  /** Absent when the request named none (the pod's default container). */
  container?: string;
  /** exec's command; absent for attach. */
  command?: string[];
}

/**
 * The header's fields; `version` and `timestamp` are the recorder's. Other keys are written as they are (asciicast
 * v2 allows them).
 */
export interface RecordingHeader {
  /** Columns when the session started; default 80. The client's first size follows as an "r" event. */
  width?: number;
  /** Rows when the session started; default 24. */
  height?: number;
  title?: string;
  /** The session's environment, as asciinema records TERM and SHELL; default: none. */
  env?: Record<string, string>;
  sealion?: SessionFields;
  [key: string]: unknown;
}

export interface RecorderOptions {
  /** The file to create, mode 0600; it must not exist. */
  path: string;
  header: RecordingHeader;
  /** The most the file may hold, header and markers included; past it the recording ends with a marker. */
  maxBytes: number;
  /** Whether stdin is recorded ("i" events). */
  stdin: boolean;
  clock: Clock;
  /**
   * Lines waiting for the disk past this many bytes end the recording with a marker: a disk that far behind a
   * terminal is not catching up, and the proxy's memory is not the place to wait. Default: 1 MiB. At most twice
   * this is held (a write in progress and the lines queued behind it).
   */
  maxPendingBytes?: number;
}

export interface Recorder {
  /** Records one channel's bytes (as terminal-streams.ts reports them); after a cut or close, does nothing. */
  event(channel: Channel, bytes: Buffer): void;
  /**
   * Writes what is still pending (a character cut at the end of the output, `reason` as a marker; neither after a
   * cut) and closes the file. Idempotent. Rejects (RECORDING_WRITE) when any write failed, after closing the file.
   */
  close(reason?: string): Promise<void>;
  /** Bytes of the file: written, or on their way. */
  readonly bytes: number;
  /** Whether the recording was cut: the size limit, the disk falling behind, or a failed write. */
  readonly truncated: boolean;
}

const DEFAULTS = {
  /** A VT100's size, which terminals still start with; a header must have one. */
  width: 80,
  height: 24,
  maxPendingBytes: 1024 * 1024,
};
/**
 * Room kept under `maxBytes` for the marker that says the recording was cut, so that the file never passes it:
 * the marker's line is under 90 bytes for sessions shorter than 30 years.
 */
const TRUNCATION_RESERVE = 128;
/** Kubernetes' TerminalSize holds each side as a uint16. */
const MAX_TERMINAL_SIDE = 65535;

function positiveInteger(value: unknown): value is number {
  return typeof value === 'number' && Number.isSafeInteger(value) && value > 0;
}

function optionsError(message: string): SealionError {
  return new SealionError(RECORDING_OPTIONS, `recording options: ${message}`);
}

/** The size in a resize message's JSON, `{"Width":…,"Height":…}`; undefined for anything else. */
function terminalSize(bytes: Buffer): string | undefined {
  let size: unknown;
  try {
    size = JSON.parse(bytes.toString('utf8'));
  } catch {
    return undefined;
  }
  if (typeof size !== 'object' || size === null) return undefined;
  const { Width: width, Height: height } = size as { Width?: unknown; Height?: unknown };
  const side = (n: unknown): n is number => positiveInteger(n) && n <= MAX_TERMINAL_SIDE;
  return side(width) && side(height) ? `${width}x${height}` : undefined;
}

/** The error channel's message as a marker: a Status (v4 on) by its status and message, text as it is. */
function errorMarker(bytes: Buffer): string {
  const text = bytes.toString('utf8');
  try {
    const status: unknown = JSON.parse(text);
    if (
      typeof status === 'object' &&
      status !== null &&
      typeof (status as { status?: unknown }).status === 'string'
    ) {
      const { status: outcome, message } = status as { status: string; message?: unknown };
      return typeof message === 'string' && message !== ''
        ? `status: ${outcome}: ${message}`
        : `status: ${outcome}`;
    }
  } catch {
    // Not JSON: the text protocols (v1 to v3) write the error as text.
  }
  return `error: ${text.trim()}`;
}

async function writeAll(handle: FileHandle, data: Buffer): Promise<void> {
  for (let at = 0; at < data.length;) {
    const { bytesWritten } = await handle.write(data, at, data.length - at);
    at += bytesWritten;
  }
}

export async function newRecorder(opts: RecorderOptions): Promise<Recorder> {
  const maxPendingBytes = opts.maxPendingBytes ?? DEFAULTS.maxPendingBytes;
  const width = opts.header.width ?? DEFAULTS.width;
  const height = opts.header.height ?? DEFAULTS.height;
  if (!positiveInteger(opts.maxBytes)) throw optionsError(`maxBytes: must be a positive integer`);
  if (!positiveInteger(maxPendingBytes)) throw optionsError(`maxPendingBytes: must be a positive integer`);
  if (!positiveInteger(width) || !positiveInteger(height))
    throw optionsError(`header: width and height must be positive integers`);

  const start = opts.clock.now();
  const header: Record<string, unknown> = { version: 2, width, height, timestamp: Math.floor(start / 1000) };
  for (const [key, value] of Object.entries(opts.header)) if (!(key in header)) header[key] = value;
  const headerLine = `${JSON.stringify(header)}\n`;
  const headerBytes = Buffer.byteLength(headerLine);
  if (headerBytes + TRUNCATION_RESERVE > opts.maxBytes)
    throw optionsError(`maxBytes: ${opts.maxBytes} leaves no room after the header's ${headerBytes} bytes`);

  let handle: FileHandle;
  try {
    // wx: O_CREAT|O_EXCL, so an existing file (or a link planted in its place) is never written through.
    handle = await open(opts.path, 'wx', 0o600);
  } catch (err) {
    throw new SealionError(RECORDING_CREATE, `create recording ${opts.path}: ${(err as Error).message}`, {
      cause: err,
    });
  }
  try {
    await writeAll(handle, Buffer.from(headerLine));
  } catch (err) {
    await handle.close().catch(() => {});
    // The file is this recorder's own (it created it): a header-less file is no recording, so it goes.
    await rm(opts.path, { force: true }).catch(() => {});
    throw new SealionError(
      RECORDING_CREATE,
      `write recording header ${opts.path}: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  return new OpenRecorder(opts, handle, start, headerBytes, maxPendingBytes);
}

/** A recording whose header is written: events become lines, queued and written one batch at a time. */
class OpenRecorder implements Recorder {
  private readonly text = {
    stdout: { decoder: new StringDecoder('utf8'), code: 'o' },
    stderr: { decoder: new StringDecoder('utf8'), code: 'o' },
    stdin: { decoder: new StringDecoder('utf8'), code: 'i' },
  };
  private written: number;
  private cut = false;
  /** Set by a cut or by close(): nothing more is recorded. */
  private stopped = false;
  /** Invariant: `pendingBytes` is the UTF-8 length of `pending`, lines not yet handed to a write. */
  private pending: string[] = [];
  private pendingBytes = 0;
  /** The one write in progress; it never rejects (a failure lands in `writeError`). */
  private writing: Promise<void> | undefined;
  private writeError: unknown;
  private closing: Promise<void> | undefined;
  /** Seconds of the last event: a wall clock set back must not make the times run backwards. */
  private last = 0;
  private readonly opts: RecorderOptions;
  private readonly handle: FileHandle;
  private readonly start: number;
  private readonly maxPendingBytes: number;

  constructor(
    opts: RecorderOptions,
    handle: FileHandle,
    start: number,
    headerBytes: number,
    maxPendingBytes: number,
  ) {
    this.opts = opts;
    this.handle = handle;
    this.start = start;
    this.written = headerBytes;
    this.maxPendingBytes = maxPendingBytes;
  }

  get bytes(): number {
    return this.written;
  }

  get truncated(): boolean {
    return this.cut;
  }

  event(channel: Channel, data: Buffer): void {
    if (this.stopped || (channel === 'stdin' && !this.opts.stdin)) return;
    switch (channel) {
      case 'stdin':
      case 'stdout':
      case 'stderr': {
        const { decoder, code } = this.text[channel];
        const chars = decoder.write(data);
        if (chars !== '') this.append(code, chars);
        return;
      }
      case 'resize': {
        const size = terminalSize(data);
        if (size) this.append('r', size);
        return;
      }
      case 'error':
        return this.append('m', errorMarker(data));
    }
  }

  close(reason?: string): Promise<void> {
    this.closing ??= this.finish(reason);
    return this.closing;
  }

  /** The last characters and `reason` recorded, every write awaited, the file closed; rejects if a write failed. */
  private async finish(reason: string | undefined): Promise<void> {
    for (const [channel, { decoder, code }] of Object.entries(this.text)) {
      const rest = decoder.end();
      if (rest !== '' && (channel !== 'stdin' || this.opts.stdin)) this.append(code, rest);
    }
    if (reason !== undefined) this.append('m', reason);
    this.stopped = true;
    while (this.writing) await this.writing;
    try {
      await this.handle.close();
    } catch (err) {
      this.writeError ??= err;
    }
    if (this.writeError !== undefined)
      throw new SealionError(
        RECORDING_WRITE,
        `write recording ${this.opts.path}: ${(this.writeError as Error).message}`,
        { cause: this.writeError },
      );
  }

  private seconds(): number {
    this.last = Math.max(this.last, Math.round((this.opts.clock.now() - this.start) * 1000) / 1e6);
    return this.last;
  }

  /** One event's line, or the marker that cuts the recording when it would pass a bound. */
  private append(code: string, data: string): void {
    if (this.stopped) return;
    const line = `${JSON.stringify([this.seconds(), code, data])}\n`;
    const size = Buffer.byteLength(line);
    let cut: string | undefined;
    if (this.written + size > this.opts.maxBytes - TRUNCATION_RESERVE) cut = 'size limit reached';
    else if (this.pendingBytes + size > this.maxPendingBytes) cut = 'writes fell behind the session';
    if (!cut) return this.queue(line, size);
    this.cut = true;
    this.stopped = true;
    const marker = `${JSON.stringify([this.seconds(), 'm', `recording truncated: ${cut}`])}\n`;
    this.queue(marker, Buffer.byteLength(marker));
  }

  private queue(line: string, size: number): void {
    this.pending.push(line);
    this.pendingBytes += size;
    this.written += size;
    this.pump();
  }

  /** Starts a write of every pending line unless one is under way; a failed write cuts the recording. */
  private pump(): void {
    if (this.writing || this.pending.length === 0) return;
    const data = Buffer.from(this.pending.join(''));
    this.pending = [];
    this.pendingBytes = 0;
    this.writing = writeAll(this.handle, data).then(
      () => {
        this.writing = undefined;
        this.pump();
      },
      (err: unknown) => {
        this.writing = undefined;
        this.writeError ??= err;
        this.cut = true;
        this.stopped = true;
        this.pending = [];
        this.pendingBytes = 0;
      },
    );
  }
}
