// What a list of recordings says of each one, and which ones it names. A recording's header holds who ran what where
// (asciicast.ts writes it once, when the session opens), so each replica reads a file's header once, keeps what the
// list shows of it (each field cut to a bound), and answers a list from that and the files' sizes and times: a list
// of thousands of recordings costs a directory read and a stat per file, and its answer is filtered and cut to a
// limit where the recordings are, before it travels to the replica that asked or to the CLI.
import { open } from 'node:fs/promises';

/** What a recording's header says of its session; a field its header lacks (or a file that has none) is absent. */
export interface RecordingFacts {
  /** exec, attach or sftp. */
  kind?: string;
  /** The authenticated user, before any impersonation. */
  user?: string;
  /** The cluster, by the name users give it (the hub's by the config's `ssh.hubName`). */
  cluster?: string;
  namespace?: string;
  pod?: string;
  container?: string;
  /** exec's command. */
  command?: string[];
  /** When the session started (the header's timestamp, whole seconds), RFC 3339. */
  started?: string;
}

export interface RecordingInfo extends RecordingFacts {
  id: string;
  bytes: number;
  /** The file's last write: the session's last event, or its end. RFC 3339. */
  modified: string;
}

/** Which recordings a list names. */
export interface RecordingFilter {
  /** Only this user's. */
  user?: string;
  /** Only this cluster's (the hub by its name). */
  cluster?: string;
  /** Only sessions that started at or after this time (ms since the epoch). */
  since?: number;
  /** At most this many, newest first. Default and most: MAX_LIST_ITEMS. */
  limit?: number;
}

/** A list: the recordings it names, newest first, and how many more matched beyond its limit. */
export interface RecordingPage {
  items: RecordingInfo[];
  remaining: number;
}

/**
 * The most one list names: a few thousand rows are what a person or a script reads at once; more come by narrowing
 * (since, user, cluster). At about 500 bytes a row it keeps a replica's answer to a few MiB.
 */
export const MAX_LIST_ITEMS = 5000;
/** The most of a header read: a command line is the long part, and the API server takes URLs of at most 64 KiB. */
const MAX_HEADER_BYTES = 64 * 1024;
/** Each name a list shows, cut to this: Kubernetes names are shorter, a user name is rarely longer. */
const MAX_NAME_CHARS = 256;
/** A command as a list shows it: its words, cut when they pass this in all (the recording itself keeps them whole). */
const MAX_COMMAND_CHARS = 512;

const text = (value: unknown): string | undefined =>
  typeof value === 'string' ? value.slice(0, MAX_NAME_CHARS) : undefined;

/** A command's words, up to MAX_COMMAND_CHARS in all; undefined when `value` is no list of strings. */
function commandOf(value: unknown): string[] | undefined {
  if (!Array.isArray(value) || !value.every((w) => typeof w === 'string')) return undefined;
  const words: string[] = [];
  let left = MAX_COMMAND_CHARS;
  for (const word of value) {
    if (left <= 0) break;
    words.push(word.slice(0, left));
    left -= word.length + 1;
  }
  return words;
}

/**
 * The facts of a parsed header (what asciicast.ts writes). The hub's recordings from before the hub was named there
 * say `cluster: ""`, kept so: the list names the hub as the config does when it is asked (`namedHub`).
 */
export function factsOfHeader(header: unknown): RecordingFacts {
  if (typeof header !== 'object' || header === null) return {};
  const { sealion, title, timestamp } = header as { sealion?: unknown; title?: unknown; timestamp?: unknown };
  const fields = (typeof sealion === 'object' && sealion !== null ? sealion : {}) as Record<string, unknown>;
  // Recordings made before the header named their kind: the title's first word (`exec ns/pod`).
  const kind =
    text(fields.kind) ?? (typeof title === 'string' ? /^(exec|attach|sftp) /.exec(title)?.[1] : undefined);
  const cluster = text(fields.cluster);
  const command = commandOf(fields.command);
  const started =
    typeof timestamp === 'number' && Number.isSafeInteger(timestamp) && timestamp > 0
      ? new Date(timestamp * 1000).toISOString()
      : undefined;
  const facts: RecordingFacts = {
    kind,
    user: text(fields.user),
    cluster,
    namespace: text(fields.namespace),
    pod: text(fields.pod),
    container: text(fields.container),
    command,
    started,
  };
  for (const key of Object.keys(facts) as (keyof RecordingFacts)[])
    if (facts[key] === undefined) delete facts[key];
  return facts;
}

/** The facts in the header of the recording at `path`; none when it has no header that can be read. */
export async function readFacts(path: string): Promise<RecordingFacts> {
  let handle;
  try {
    handle = await open(path, 'r');
  } catch {
    return {};
  }
  try {
    const buffer = Buffer.alloc(MAX_HEADER_BYTES);
    const { bytesRead } = await handle.read(buffer, 0, MAX_HEADER_BYTES, 0);
    const end = buffer.subarray(0, bytesRead).indexOf(0x0a);
    if (end < 0) return {};
    return factsOfHeader(JSON.parse(buffer.subarray(0, end).toString('utf8')));
  } catch {
    return {};
  } finally {
    await handle.close().catch(() => {});
  }
}

/** The recording's facts with the hub named `hubName` (its header may say `cluster: ""`). */
export function namedHub<T extends RecordingFacts>(facts: T, hubName: string): T {
  return facts.cluster === '' ? { ...facts, cluster: hubName } : facts;
}

/** When a recording's session started, for ordering and `since`: its header's time, else its file's last write. */
const startOf = (r: RecordingInfo): string => r.started ?? r.modified;

/** The recordings `filter` names, newest first, cut to its limit. */
export function selectRecordings<T extends RecordingInfo>(
  all: T[],
  filter: RecordingFilter = {},
): { items: T[]; remaining: number } {
  const limit = Math.min(filter.limit ?? MAX_LIST_ITEMS, MAX_LIST_ITEMS);
  const matching = all
    .filter(
      (r) =>
        (filter.user === undefined || r.user === filter.user) &&
        (filter.cluster === undefined || r.cluster === filter.cluster) &&
        (filter.since === undefined || Date.parse(startOf(r)) >= filter.since),
    )
    .sort((a, b) => startOf(b).localeCompare(startOf(a)) || b.modified.localeCompare(a.modified));
  return { items: matching.slice(0, limit), remaining: Math.max(0, matching.length - limit) };
}

/** The filter as a list request's query carries it (the SessionRecording API's, and a peer's). */
export function filterQuery(filter: RecordingFilter): URLSearchParams {
  const query = new URLSearchParams();
  if (filter.user !== undefined) query.set('user', filter.user);
  if (filter.cluster !== undefined) query.set('cluster', filter.cluster);
  if (filter.since !== undefined) query.set('since', new Date(filter.since).toISOString());
  query.set('limit', String(filter.limit ?? MAX_LIST_ITEMS));
  return query;
}

/** A list request's filter, or the problem with its query (for a 400). Unknown parameters are ignored. */
export function parseFilterQuery(query: URLSearchParams): RecordingFilter | { problem: string } {
  const filter: RecordingFilter = {};
  const user = query.get('user');
  const cluster = query.get('cluster');
  const since = query.get('since');
  const limit = query.get('limit');
  if (user !== null) filter.user = user;
  if (cluster !== null) filter.cluster = cluster;
  if (since !== null) {
    // RFC 3339 with a zone: a time without one would mean the server's zone, which the asker does not know.
    const ms = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/i.test(since)
      ? Date.parse(since)
      : NaN;
    if (!Number.isFinite(ms))
      return { problem: `since: ${JSON.stringify(since.slice(0, 64))} is not an RFC 3339 time` };
    filter.since = ms;
  }
  if (limit !== null) {
    const n = /^\d{1,9}$/.test(limit) ? Number(limit) : NaN;
    if (!(n >= 1))
      return { problem: `limit: ${JSON.stringify(limit.slice(0, 64))} is not a positive integer` };
    filter.limit = Math.min(n, MAX_LIST_ITEMS);
  }
  return filter;
}

/** One item of another replica's list, checked (the list is another process's word); undefined when malformed. */
export function checkedInfo(value: unknown): RecordingInfo | undefined {
  if (typeof value !== 'object' || value === null) return undefined;
  const r = value as Record<string, unknown>;
  if (typeof r.id !== 'string' || typeof r.modified !== 'string') return undefined;
  if (typeof r.bytes !== 'number' || !Number.isFinite(r.bytes)) return undefined;
  const info: RecordingInfo = { id: r.id, modified: r.modified, bytes: r.bytes };
  for (const key of ['kind', 'user', 'cluster', 'namespace', 'pod', 'container', 'started'] as const) {
    const value = text(r[key]);
    if (value !== undefined) info[key] = value;
  }
  const command = commandOf(r.command);
  if (command) info.command = command;
  return info;
}
