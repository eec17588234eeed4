// Recorded exec and attach sessions. The replica a session lands on splices it (whether it goes to the hub's API
// server, a tunnel or a peer), so it records it there: what the terminal showed (stdout and stderr; stdin when the
// admin asks) as asciicast v2, named by the request's audit ID so the recording joins the audit events of every hop.
// A session whose bytes cannot be decoded, or whose recording cannot be opened, is refused where recording is
// required, and goes on unrecorded (said in its audit event) where it is not.
import { createReadStream, mkdirSync, statSync, type ReadStream } from 'node:fs';
import { readdir, stat, unlink } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { Clock } from '../../lib/clock.ts';
import { systemClock } from '../../lib/clock.ts';
import type { UpgradeTap } from '../../lib/http2/upgrade.ts';
import type { Logger } from '../../lib/log.ts';
import { newRecorder, type Recorder, type RecordingHeader } from './asciicast.ts';
import { newStreamDecoder } from './terminal-streams.ts';
import type { RecordingUploader } from './upload.ts';

/**
 * The most one session's recording may take: an hour of a busy build log is a few MiB; a session that prints more
 * (a `cat` of a big file) has its recording cut there, with a marker, rather than fill the volume.
 */
export const DEFAULT_MAX_SESSION_BYTES = 32 * 1024 * 1024;
/**
 * The most all recordings may take on one replica: three quarters of the install's 1 GiB volume, so that what is being
 * written (each session counted at its whole limit) never fills it.
 */
export const DEFAULT_MAX_TOTAL_BYTES = 768 * 1024 * 1024;
/** Below this a session's recording holds hardly more than its header: a limit that small is a mistake. */
const MIN_SESSION_BYTES = 64 * 1024;
/** Recording files: the audit ID (a UUID) and the asciicast extension; nothing else is ever read or listed. */
const RECORDING_NAME = /^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})\.cast$/;

export interface RecordingOptions {
  /** The folder recordings go to (created if missing). */
  dir: string;
  /** The most one session's recording may take. Default: DEFAULT_MAX_SESSION_BYTES. */
  maxBytes?: number;
  /** Record what the user typed, too. Default: false (passwords typed at a prompt would be kept). */
  stdin?: boolean;
  /** The most all recordings in the folder may take; the oldest go to make room. Default: DEFAULT_MAX_TOTAL_BYTES. */
  maxTotalBytes?: number;
  /**
   * Refuse an exec or attach that cannot be recorded, and end one whose recording stops. Default: false (it goes on,
   * unrecorded, and its audit event or the log says so).
   */
  required?: boolean;
  clock?: Clock;
  log: Logger;
  /** Where finished recordings are also sent. Default: nowhere. */
  uploader?: Pick<RecordingUploader, 'add'>;
}

/** What is known of a session when it is opened. */
export interface SessionFacts {
  auditID: string;
  user: string;
  cluster: string;
  namespace: string;
  pod: string;
  /** exec or attach */
  subresource: string;
  /** The request's query: its command, container, tty. */
  query: URLSearchParams;
}

export interface SessionRecording {
  readonly id: string;
  /** Whether the session must be refused when it cannot be recorded. */
  readonly required: boolean;
  /**
   * The observer of the spliced bytes, for the upstream's 101 answer; an Error when its protocol cannot be decoded.
   * `abort` ends the session: called where recording is required and the recording stops.
   */
  tap(res: IncomingMessage, abort: () => void): UpgradeTap | Unrecordable;
  /** Closes the file (also once the session ends). */
  close(reason?: string): Promise<void>;
}

export interface RecordingInfo {
  id: string;
  bytes: number;
  modified: string;
}

export interface Recordings {
  readonly required: boolean;
  /** Opens the recording of a session; rejects when it cannot be opened. */
  open(facts: SessionFacts): Promise<SessionRecording>;
  /** The recordings in the folder, newest first. */
  list(): Promise<RecordingInfo[]>;
  /** A recording's contents, or undefined when there is none by that ID. */
  read(id: string): ReadStream | undefined;
}

/** A session that cannot be recorded, where recording is required. */
export class Unrecordable extends Error {
  readonly code = 'SEALION_UNRECORDABLE';
}

export function newRecordings(opts: RecordingOptions): Recordings {
  const maxBytes = opts.maxBytes ?? DEFAULT_MAX_SESSION_BYTES;
  const maxTotalBytes = opts.maxTotalBytes ?? DEFAULT_MAX_TOTAL_BYTES;
  if (!(maxBytes >= MIN_SESSION_BYTES))
    throw new Error(`recording: a session may not take less than ${MIN_SESSION_BYTES} bytes`);
  if (!(maxTotalBytes >= maxBytes))
    throw new Error('recording: the folder may not take less than one session');
  mkdirSync(opts.dir, { recursive: true, mode: 0o700 });
  const folder = new RecordingFolder(opts.dir, maxBytes, maxTotalBytes, opts.log);
  const settings: SessionSettings = {
    maxBytes,
    stdin: opts.stdin ?? false,
    required: opts.required ?? false,
    clock: opts.clock ?? systemClock,
    log: opts.log,
    uploader: opts.uploader,
  };
  return {
    required: settings.required,
    open: (facts) => openSession(folder, settings, facts),
    async list() {
      return (await folder.listed()).reverse();
    },
    read: (id) => folder.read(id),
  };
}

/** What every session's recording is made with. */
interface SessionSettings {
  maxBytes: number;
  stdin: boolean;
  required: boolean;
  clock: Clock;
  log: Logger;
  uploader: Pick<RecordingUploader, 'add'> | undefined;
}

/** The recordings' folder: what is in it, what is being written, and the room left. */
class RecordingFolder {
  /** Recordings being written: each counts as its whole limit until it is closed. */
  private readonly open = new Set<string>();
  private readonly dir: string;
  private readonly maxBytes: number;
  private readonly maxTotalBytes: number;
  private readonly log: Logger;

  constructor(dir: string, maxBytes: number, maxTotalBytes: number, log: Logger) {
    this.dir = dir;
    this.maxBytes = maxBytes;
    this.maxTotalBytes = maxTotalBytes;
    this.log = log;
  }

  /** The file of recording `id`; undefined when `id` is not a name a recording can have. */
  pathOf(id: string): string | undefined {
    return RECORDING_NAME.test(`${id}.cast`) ? join(this.dir, `${id}.cast`) : undefined;
  }

  /** The recordings in the folder, oldest first (the open ones too). */
  async listed(): Promise<RecordingInfo[]> {
    const found: RecordingInfo[] = [];
    for (const name of await readdir(this.dir)) {
      const match = RECORDING_NAME.exec(name);
      if (!match) continue;
      try {
        const info = await stat(join(this.dir, name));
        found.push({ id: match[1]!, bytes: info.size, modified: info.mtime.toISOString() });
      } catch {
        // Removed meanwhile.
      }
    }
    return found.sort((a, b) => a.modified.localeCompare(b.modified));
  }

  read(id: string): ReadStream | undefined {
    const path = this.pathOf(id);
    if (!path) return undefined;
    try {
      statSync(path);
    } catch {
      return undefined;
    }
    return createReadStream(path);
  }

  /**
   * Room for one more session within maxTotalBytes, the oldest closed recordings removed to make it: the volume never
   * fills (a kubelet evicts a pod whose emptyDir does, and the eviction would take every recording with it). Rejects
   * when the sessions being recorded leave no room.
   */
  async makeRoom(): Promise<void> {
    const { open, maxBytes, maxTotalBytes } = this;
    const all = await this.listed();
    let used = open.size * maxBytes;
    for (const r of all) if (!open.has(r.id)) used += r.bytes;
    for (const r of all) {
      if (used + maxBytes <= maxTotalBytes) return;
      if (open.has(r.id)) continue;
      await unlink(join(this.dir, `${r.id}.cast`)).catch(() => {});
      used -= r.bytes;
      this.log.info({ id: r.id, bytes: r.bytes }, 'an old recording was removed to make room');
    }
    if (used + maxBytes > maxTotalBytes)
      throw new Unrecordable('the sessions being recorded leave no room for another recording');
  }

  /** Counts recording `id` as being written (at its whole limit) until `done(id)`. */
  writing(id: string): void {
    this.open.add(id);
  }

  done(id: string): void {
    this.open.delete(id);
  }
}

/** Opens the recording of one session: room made for it, its file created with its header. */
async function openSession(
  folder: RecordingFolder,
  settings: SessionSettings,
  facts: SessionFacts,
): Promise<SessionRecording> {
  const path = folder.pathOf(facts.auditID);
  if (!path) throw new Unrecordable('the session has no audit ID a recording can be named by');
  await folder.makeRoom();
  folder.writing(facts.auditID);
  let recorder: Recorder;
  try {
    recorder = await newRecorder({
      path,
      maxBytes: settings.maxBytes,
      stdin: settings.stdin,
      clock: settings.clock,
      header: headerOf(facts),
    });
  } catch (err) {
    folder.done(facts.auditID);
    throw err;
  }
  return new OpenRecording(folder, settings, facts.auditID, path, recorder);
}

/** The recording's header: its title, and the fields that join it to the session's audit events. */
function headerOf(facts: SessionFacts): RecordingHeader {
  const container = facts.query.get('container');
  const command = facts.query.getAll('command');
  return {
    title: `${facts.subresource} ${facts.namespace}/${facts.pod}`,
    sealion: {
      auditID: facts.auditID,
      user: facts.user,
      cluster: facts.cluster,
      namespace: facts.namespace,
      pod: facts.pod,
      ...(container ? { container } : {}),
      ...(facts.subresource === 'exec' ? { command } : {}),
    },
  };
}

/** One session's recording, from its open file to its close (kept and uploaded, or removed when it never started). */
class OpenRecording implements SessionRecording {
  readonly id: string;
  readonly required: boolean;
  /** Whether the upstream switched protocols: a session refused before that recorded nothing worth keeping. */
  private started = false;
  private closed: Promise<void> | undefined;
  private readonly folder: RecordingFolder;
  private readonly settings: SessionSettings;
  private readonly path: string;
  private readonly recorder: Recorder;

  constructor(
    folder: RecordingFolder,
    settings: SessionSettings,
    id: string,
    path: string,
    recorder: Recorder,
  ) {
    this.folder = folder;
    this.settings = settings;
    this.id = id;
    this.required = settings.required;
    this.path = path;
    this.recorder = recorder;
  }

  close(reason?: string): Promise<void> {
    const { id, path, settings } = this;
    // A failed last write is logged, never thrown at whoever ends the session.
    return (this.closed ??= this.recorder
      .close(reason)
      .then(() => (this.started ? settings.uploader?.add(id, path) : unlink(path)))
      .catch((err: unknown) => {
        settings.log.warn({ id, err: (err as Error).message }, 'a recording could not be finished');
      })
      .finally(() => this.folder.done(id)));
  }

  tap(res: IncomingMessage, abort: () => void): UpgradeTap | Unrecordable {
    this.started = true;
    const protocol = String(
      res.headers['sec-websocket-protocol'] ?? res.headers['x-stream-protocol-version'] ?? '',
    );
    const decoder = newStreamDecoder(
      { upgrade: String(res.headers['upgrade'] ?? ''), protocol },
      { data: (channel, bytes) => this.recorder.event(channel, bytes) },
    );
    if (!decoder) {
      const why = `the session's protocol (${protocol || 'none'}) cannot be recorded`;
      void this.close(why);
      return new Unrecordable(why);
    }
    const check = this.stopWhenBroken(() => decoder.failure, abort);
    return {
      fromClient(chunk) {
        decoder.fromClient(chunk);
        check();
      },
      fromServer(chunk) {
        decoder.fromServer(chunk);
        check();
      },
      end: () => void this.close(),
    };
  }

  /**
   * A check after each chunk: a session whose recording stopped (its bytes could not be decoded, or it reached its
   * size limit) goes on unrecorded, said in the log; where recording is required it ends there.
   */
  private stopWhenBroken(decoderFailure: () => string | undefined, abort: () => void): () => void {
    let stopped = false;
    return () => {
      if (stopped) return;
      const problem =
        decoderFailure() ?? (this.recorder.truncated ? 'the recording reached its size limit' : undefined);
      if (!problem) return;
      stopped = true;
      this.settings.log.warn(
        { id: this.id, problem, required: this.required },
        'a session stopped being recorded',
      );
      void this.close(`recording stopped: ${problem}`);
      if (this.required) abort();
    };
  }
}

/** The recordings of every replica, as a user asks for them through any one. */
export interface RecordingStore {
  /** Every live replica's recordings, newest first; replicas that did not answer are named in `unreachable`. */
  list(): Promise<{ found: (RecordingInfo & { replica: string })[]; unreachable: string[] }>;
  /** One recording, from whichever replica has it; undefined when none does. */
  read(id: string): Promise<Readable | undefined>;
}

/** What the other replicas hold, over the peer links (concierge/peering/). */
export interface PeerRecordings {
  peerRecordings(): Promise<{ found: (RecordingInfo & { replica: string })[]; unreachable: string[] }>;
  peerRecording(id: string): Promise<Readable | undefined>;
}

/** This replica's recordings (named `replica`) and the peers' (when there are peers). */
export function sharedRecordings(
  local: Recordings,
  replica: string,
  peers: () => PeerRecordings | undefined,
): RecordingStore {
  return {
    async list() {
      const own = (await local.list()).map((r) => ({ ...r, replica }));
      const others = (await peers()?.peerRecordings()) ?? { found: [], unreachable: [] };
      const found = [...own, ...others.found].sort((a, b) => b.modified.localeCompare(a.modified));
      return { found, unreachable: others.unreachable };
    },
    async read(id) {
      return local.read(id) ?? (await peers()?.peerRecording(id));
    },
  };
}
