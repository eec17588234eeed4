// Recorded exec and attach sessions. The replica a session lands on splices it (whether it goes to the hub's API
// server, a tunnel or a peer), so it records it there: what the terminal showed (stdout and stderr; stdin when the
// admin asks) as asciicast v2, named by the request's audit ID so the recording joins the audit events of every hop.
// A session whose bytes cannot be decoded, or whose recording cannot be opened, is refused where recording is
// required, and goes on unrecorded (said in its audit event) where it is not.
import { randomUUID } from 'node:crypto';
import { createReadStream, mkdirSync, statSync, type ReadStream } from 'node:fs';
import { readdir, stat, unlink } from 'node:fs/promises';
import type { IncomingMessage } from 'node:http';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import type { Clock } from '../../lib/clock.ts';
import { systemClock } from '../../lib/clock.ts';
import type { UpgradeTap } from '../../lib/http2/upgrade.ts';
import type { Logger } from '../../lib/log.ts';
import { DEFAULT_SSH_HUB_NAME } from '../../apis/install.ts';
import { newRecorder, type Recorder, type RecordingHeader } from './asciicast.ts';
import {
  namedHub,
  readFacts,
  selectRecordings,
  type RecordingFacts,
  type RecordingFilter,
  type RecordingInfo,
  type RecordingPage,
} from './listing.ts';
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
  /**
   * The name the hub's own cluster goes by (the config's `ssh.hubName`), for its sessions' recordings and lists.
   * Default: always DEFAULT_SSH_HUB_NAME.
   */
  hubName?: () => string;
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

export type { RecordingInfo } from './listing.ts';

/** What is known of a session recorded operation by operation (sftp) when it is opened. */
export interface OperationsFacts {
  user: string;
  /** What the operations are (sftp): the recording's kind. */
  kind: string;
}

/** Where a container's operations happen, as the operations' session names it. */
export interface OperationPlace {
  cluster: string;
  namespace: string;
  pod: string;
  container: string;
}

/**
 * The recording of a session that records its own operations (an sftp session: what it read, wrote, removed), and
 * of which every command it runs is a part rather than a recording of its own. The file opens with the first
 * operation, whose place its header names (a session that only looked around records nothing).
 */
export interface OperationsRecording {
  /** Records one operation's line at `place`; the first opens the file. */
  note(place: OperationPlace, line: string): void;
  /**
   * The recording's ID once its file is open, for the audit events of the commands run for it; rejects when it cannot
   * be opened. Undefined before the first operation.
   */
  opened(): Promise<string> | undefined;
  /** Closes the file (idempotent; nothing to close before the first operation). */
  close(): Promise<void>;
}

export interface Recordings {
  readonly required: boolean;
  /** Opens the recording of a session; rejects when it cannot be opened. */
  open(facts: SessionFacts): Promise<SessionRecording>;
  /** Opens, lazily, the recording of a session that records its operations itself (sftp). */
  openOperations(facts: OperationsFacts): OperationsRecording;
  /** The recordings in the folder that `filter` names, newest first, cut to its limit. */
  list(filter?: RecordingFilter): Promise<RecordingPage>;
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
  const hubName = opts.hubName ?? (() => DEFAULT_SSH_HUB_NAME);
  const settings: SessionSettings = {
    maxBytes,
    stdin: opts.stdin ?? false,
    required: opts.required ?? false,
    clock: opts.clock ?? systemClock,
    log: opts.log,
    uploader: opts.uploader,
    hubName,
  };
  return {
    required: settings.required,
    open: (facts) => openSession(folder, settings, facts),
    openOperations: (facts) => new LazyOperations(folder, settings, facts),
    async list(filter) {
      const name = hubName();
      return selectRecordings(
        (await folder.listed()).map((r) => namedHub(r, name)),
        filter,
      );
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
  hubName: () => string;
}

/** The recordings' folder: what is in it, what is being written, and the room left. */
class RecordingFolder {
  /** Recordings being written: each counts as its whole limit until it is closed. */
  private readonly open = new Set<string>();
  /**
   * What each file's header says, read once per file (a header never changes once written): invariant, every key is
   * a recording the last listing found, with a header that could be read.
   */
  private readonly facts = new Map<string, RecordingFacts>();
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

  /** The recordings in the folder, oldest first (the open ones too), with what their headers say. */
  async listed(): Promise<RecordingInfo[]> {
    const found: RecordingInfo[] = [];
    const present = new Set<string>();
    for (const name of await readdir(this.dir)) {
      const match = RECORDING_NAME.exec(name);
      if (!match) continue;
      const id = match[1]!;
      try {
        const info = await stat(join(this.dir, name));
        let facts = this.facts.get(id);
        if (!facts) {
          facts = await readFacts(join(this.dir, name));
          // None read: a file whose header is still on its way is read again next time.
          if (Object.keys(facts).length > 0) this.facts.set(id, facts);
        }
        present.add(id);
        found.push({ ...facts, id, bytes: info.size, modified: info.mtime.toISOString() });
      } catch {
        // Removed meanwhile.
      }
    }
    for (const id of this.facts.keys()) if (!present.has(id)) this.facts.delete(id);
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
  const recorder = await createFile(
    folder,
    settings,
    facts.auditID,
    path,
    headerOf(facts, settings.hubName()),
  );
  return new OpenRecording(folder, settings, facts.auditID, path, recorder);
}

/** A recording's file, counted as being written from the moment room is made for it. */
async function createFile(
  folder: RecordingFolder,
  settings: SessionSettings,
  id: string,
  path: string,
  header: RecordingHeader,
): Promise<Recorder> {
  await folder.makeRoom();
  folder.writing(id);
  try {
    return await newRecorder({
      path,
      maxBytes: settings.maxBytes,
      stdin: settings.stdin,
      clock: settings.clock,
      header,
    });
  } catch (err) {
    folder.done(id);
    throw err;
  }
}

/**
 * The recording's header: its title, and the fields that join it to the session's audit events. The hub's own
 * sessions (the pipeline's cluster '') are named as users name the hub.
 */
function headerOf(facts: SessionFacts, hubName: string): RecordingHeader {
  const container = facts.query.get('container');
  const command = facts.query.getAll('command');
  return {
    title: `${facts.subresource} ${facts.namespace}/${facts.pod}`,
    sealion: {
      auditID: facts.auditID,
      kind: facts.subresource,
      user: facts.user,
      cluster: facts.cluster || hubName,
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

/** The file of a session that records its operations: opened with the first one, each a line of output. */
class LazyOperations implements OperationsRecording {
  private opening: Promise<{ id: string; path: string; recorder: Recorder }> | undefined;
  private closing: Promise<void> | undefined;
  private readonly folder: RecordingFolder;
  private readonly settings: SessionSettings;
  private readonly facts: OperationsFacts;

  constructor(folder: RecordingFolder, settings: SessionSettings, facts: OperationsFacts) {
    this.folder = folder;
    this.settings = settings;
    this.facts = facts;
  }

  note(place: OperationPlace, line: string): void {
    if (this.closing) return;
    this.opening ??= this.open(place);
    // In the order noted: the callbacks of one promise run in the order they were added.
    this.opening.then(
      ({ recorder }) => recorder.event('stdout', Buffer.from(`${line}\r\n`)),
      () => {},
    );
  }

  opened(): Promise<string> | undefined {
    return this.opening?.then(({ id, recorder }) => {
      // Cut at its size limit: what runs from now on would go unrecorded (refused where recording is required).
      if (recorder.truncated) throw new Unrecordable('the recording reached its size limit');
      return id;
    });
  }

  close(): Promise<void> {
    this.closing ??= (async () => {
      const file = await this.opening?.catch(() => undefined);
      if (!file) return;
      const { id, path, recorder } = file;
      try {
        await recorder.close();
        this.settings.uploader?.add(id, path);
      } catch (err) {
        this.settings.log.warn({ id, err: (err as Error).message }, 'a recording could not be finished');
      } finally {
        this.folder.done(id);
      }
    })();
    return this.closing;
  }

  private async open(place: OperationPlace): Promise<{ id: string; path: string; recorder: Recorder }> {
    const id = randomUUID();
    const path = this.folder.pathOf(id)!;
    const { kind, user } = this.facts;
    const header: RecordingHeader = {
      title: `${kind} ${place.namespace}/${place.pod}`,
      sealion: {
        kind,
        user,
        cluster: place.cluster,
        namespace: place.namespace,
        pod: place.pod,
        ...(place.container ? { container: place.container } : {}),
      },
    };
    try {
      return { id, path, recorder: await createFile(this.folder, this.settings, id, path, header) };
    } catch (err) {
      this.settings.log.warn({ err: (err as Error).message, kind }, 'a session could not be recorded');
      throw err;
    }
  }
}

/** The recordings of every replica, as a user asks for them through any one. */
export interface RecordingStore {
  /**
   * The recordings of every live replica that `filter` names, newest first, cut to its limit (`remaining`: how many
   * more matched); replicas that did not answer are named in `unreachable`.
   */
  list(filter?: RecordingFilter): Promise<ReplicasPage>;
  /** One recording, from whichever replica has it; undefined when none does. */
  read(id: string): Promise<Readable | undefined>;
}

/** A list of several replicas' recordings. */
export interface ReplicasPage {
  found: (RecordingInfo & { replica: string })[];
  remaining: number;
  unreachable: string[];
}

/** What the other replicas hold, over the peer links (concierge/peering/). */
export interface PeerRecordings {
  peerRecordings(filter: RecordingFilter): Promise<ReplicasPage>;
  peerRecording(id: string): Promise<Readable | undefined>;
}

/** This replica's recordings (named `replica`) and the peers' (when there are peers). */
export function sharedRecordings(
  local: Recordings,
  replica: string,
  peers: () => PeerRecordings | undefined,
): RecordingStore {
  return {
    async list(filter = {}) {
      const own = await local.list(filter);
      const others = (await peers()?.peerRecordings(filter)) ?? { found: [], remaining: 0, unreachable: [] };
      // Each replica filtered and cut its own list; the newest of them all are cut to the limit again, and filtered
      // again: a replica from before filtered lists answers every recording it holds.
      const merged = selectRecordings(
        [...own.items.map((r) => ({ ...r, replica })), ...others.found],
        filter,
      );
      return {
        found: merged.items,
        remaining: merged.remaining + own.remaining + others.remaining,
        unreachable: others.unreachable,
      };
    },
    async read(id) {
      // A name no recording could have is asked of no peer.
      if (!RECORDING_NAME.test(`${id}.cast`)) return undefined;
      return local.read(id) ?? (await peers()?.peerRecording(id));
    },
  };
}
