// The audit sinks, each written as kube-apiserver writes its own so that what reads the API server's audit reads
// Sealion's: a JSON-lines log (--audit-log-path, a file rotated by size, or standard output) and a webhook that
// receives EventLists (--audit-webhook-config-file, a kubeconfig naming the receiver).
import { createPrivateKey } from 'node:crypto';
import { readdir, readFile, unlink } from 'node:fs/promises';
import { basename, dirname, extname, join, resolve } from 'node:path';
import { finished } from 'node:stream/promises';
import { createStream, type RotatingFileStream } from 'rotating-file-stream';
import { Agent, request } from 'undici';
import { parse } from 'yaml';
import { exponentialBackoff } from '../../lib/backoff.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';
import { certificateFingerprints, decodeCABundle } from '../../lib/pki/pem.ts';
import {
  AUDIT_CLOSED,
  AUDIT_CONFIG,
  AUDIT_REJECTED,
  AUDIT_UNAVAILABLE,
  AuditError,
  type AuditSink,
} from './backend.ts';
import { AUDIT_API_VERSION, type AuditEvent, type EventList } from './types.ts';

export interface LogSinkOptions {
  /**
   * The file the lines are appended to, created with mode 0600 (with its folder) if missing; '-' is stdout, which is
   * never rotated (the options below are for a file).
   */
  path: string;
  /**
   * The size in MiB at which the file is rotated (fractions allowed). Lines are written in chunks of up to 64 KiB (a
   * tenth of the limit when that is less), and a file ends with the chunk that reaches the limit: it can be larger
   * by that chunk, and a line is never split. Default: DEFAULT_LOG_MAX_SIZE_MIB (100).
   */
  maxSizeMiB?: number;
  /** Rotated files kept, newest first; 0 keeps all of them (maxAgeDays may still remove them). Default: 0. */
  maxBackups?: number;
  /** Days a rotated file is kept, judged by the time in its name; 0 keeps them whatever their age. Default: 0. */
  maxAgeDays?: number;
  /** Where '-' writes. Default: process.stdout. */
  stdout?: NodeJS.WritableStream;
}

/**
 * kube-apiserver's --audit-log-maxsize defaults to 0, which its rotation library (lumberjack) reads as 100 MiB. Its
 * --audit-log-maxbackup and --audit-log-maxage default to 0 too, meaning no limit: we keep those, so set one of them
 * where the folder's disk is not watched.
 */
export const DEFAULT_LOG_MAX_SIZE_MIB = 100;

const MIB = 1024 * 1024;
const DAY_MS = 24 * 3600 * 1000;
/** Only the owner reads the audit log: it names every user and what they did (kube-apiserver creates it so too). */
const LOG_FILE_MODE = 0o600;

/**
 * JSON lines, one event per line, as kube-apiserver's --audit-log-format=json. Each write() resolves once its lines
 * are handed to the file (or stdout), so a slow disk makes writes slow and the backend's queue absorbs the wait.
 */
export function newLogSink(opts: LogSinkOptions): AuditSink {
  const problems = [
    ...(opts.path === '' ? ['path: must be a file or -'] : []),
    ...atLeast('maxSizeMiB', opts.maxSizeMiB, 0, { exclusive: true }),
    ...atLeast('maxBackups', opts.maxBackups, 0, { integer: true }),
    ...atLeast('maxAgeDays', opts.maxAgeDays, 0),
  ];
  if (problems.length > 0) throw new AuditError(AUDIT_CONFIG, `audit log: ${problems.join('; ')}`);
  if (opts.path === '-') return newStreamLogSink(opts.stdout ?? process.stdout);
  return newFileLogSink(
    opts.path,
    Math.max(1, Math.round((opts.maxSizeMiB ?? DEFAULT_LOG_MAX_SIZE_MIB) * MIB)),
    opts.maxBackups ?? 0,
    opts.maxAgeDays ?? 0,
  );
}

function jsonLines(events: AuditEvent[]): string[] {
  return events.map((event) => JSON.stringify(event) + '\n');
}

function newStreamLogSink(out: NodeJS.WritableStream): AuditSink {
  let closed = false;
  return {
    name: 'log',
    async write(events) {
      if (closed) throw new AuditError(AUDIT_CLOSED, 'audit log is closed');
      if (events.length === 0) return;
      const text = jsonLines(events).join('');
      await new Promise<void>((resolve, reject) => out.write(text, (err) => (err ? reject(err) : resolve())));
    },
    // Standard output belongs to the process: it stays open for the logs.
    close() {
      closed = true;
      return Promise.resolve();
    },
  };
}

/**
 * Rotated files are named as lumberjack names kube-apiserver's: `audit.log` becomes `audit-<UTC time>.log`, the time
 * of the rotation to the millisecond with `-` for `:` (2006-01-02T15-04-05.000).
 */
const BACKUP_TIME = /^(\d{4}-\d{2}-\d{2})T(\d{2})-(\d{2})-(\d{2}\.\d{3})$/;

/**
 * Lines go to the file in chunks of whole lines, each one write system call. The stream checks the size after each
 * chunk and rotates between two, so a chunk bounds how far a file runs past its limit, and a line is never split.
 * Line by line cost 20 times more (400 lines of 1.5 KB: 21 ms, against 1 ms as one write); a chunk of 64 KiB
 * overshoots 100 MiB by less than 0.1%.
 */
const CHUNK_BYTES = 64 * 1024;

/** `lines` joined into chunks of at most `max` bytes, or of one line when it is longer. */
function chunks(lines: string[], max: number): string[] {
  const out: string[] = [];
  let current = '';
  let size = 0;
  for (const line of lines) {
    const bytes = Buffer.byteLength(line);
    if (size > 0 && size + bytes > max) {
      out.push(current);
      current = '';
      size = 0;
    }
    current += line;
    size += bytes;
  }
  out.push(current);
  return out;
}

function newFileLogSink(path: string, maxBytes: number, maxBackups: number, maxAgeDays: number): AuditSink {
  const folder = dirname(resolve(path));
  const name = basename(path);
  const extension = extname(name);
  const stem = name.slice(0, name.length - extension.length);
  const backupPrefix = `${stem}-`;
  const chunkBytes = Math.max(1, Math.min(CHUNK_BYTES, Math.floor(maxBytes / 10)));

  /**
   * The last time given to a backup's name. Names are strictly increasing within the process (a rotation in the
   * same millisecond as the last takes the next one), so their times alone order the backups, newest last.
   */
  let lastBackupMs = 0;
  const backupName = (time: Date | number): string => {
    lastBackupMs = Math.max(new Date(time).getTime(), lastBackupMs + 1);
    const stamp = new Date(lastBackupMs).toISOString().slice(0, -1).replaceAll(':', '-');
    return `${backupPrefix}${stamp}${extension}`;
  };
  const backupTime = (file: string): number | undefined => {
    if (!file.startsWith(backupPrefix) || !file.endsWith(extension)) return undefined;
    const match = BACKUP_TIME.exec(file.slice(backupPrefix.length, file.length - extension.length));
    return match ? Date.parse(`${match[1]}T${match[2]}:${match[3]}:${match[4]}Z`) : undefined;
  };

  /** Removes the backups beyond maxBackups and those older than maxAgeDays. */
  async function prune(): Promise<void> {
    if (maxBackups === 0 && maxAgeDays === 0) return;
    const oldestKept = maxAgeDays > 0 ? Date.now() - maxAgeDays * DAY_MS : -Infinity;
    // A backup that cannot be listed or removed now is tried again at the next rotation, which lists the folder
    // anew; the events were written either way, so a failure here fails no write.
    const files = await readdir(folder).catch(() => [] as string[]);
    const backups = files
      .map((file) => ({ file, time: backupTime(file) }))
      .filter((b): b is { file: string; time: number } => b.time !== undefined)
      .sort((a, b) => b.time - a.time);
    const doomed = backups.filter((b, i) => (maxBackups > 0 && i >= maxBackups) || b.time < oldestKept);
    await Promise.all(doomed.map((b) => unlink(join(folder, b.file)).catch(() => undefined)));
  }

  let stream: RotatingFileStream | undefined;
  /** The removals the rotations so far started, one after another; a write waits for those it caused. */
  let pruning: Promise<void> = Promise.resolve();
  let closing: Promise<void> | undefined;

  function open(): RotatingFileStream {
    const opened = createStream((time) => (time ? backupName(time) : name), {
      path: folder,
      size: `${maxBytes}B`,
      mode: LOG_FILE_MODE,
    });
    // The write that meets an error rejects with it (its callback gets it); the next write opens the file anew.
    opened.on('error', () => undefined);
    opened.on('rotated', () => {
      pruning = pruning.then(prune).catch(() => undefined);
    });
    return opened;
  }

  return {
    name: 'log',
    async write(events) {
      if (closing) throw new AuditError(AUDIT_CLOSED, 'audit log is closed');
      if (events.length === 0) return;
      const pieces = chunks(jsonLines(events), chunkBytes);
      if (!stream || stream.destroyed) stream = open();
      const out = stream;
      const last = pieces.pop()!;
      for (const piece of pieces) out.write(piece);
      await new Promise<void>((resolve, reject) => out.write(last, (err) => (err ? reject(err) : resolve())));
      await pruning;
    },
    close() {
      closing ??= (async () => {
        const out = stream;
        stream = undefined;
        if (out && !out.destroyed) {
          out.end();
          await finished(out);
        }
        await pruning;
      })();
      return closing;
    },
  };
}

export interface WebhookSinkOptions {
  /**
   * A kubeconfig naming the receiver, as kube-apiserver's --audit-webhook-config-file: the cluster and user of its
   * current context (without one: its only cluster and only user). The cluster's `server` (https), its
   * `certificate-authority` or `certificate-authority-data` (default: the system roots) and `tls-server-name`; the
   * user's `client-certificate(-data)` with `client-key(-data)`, and/or `token`. Relative file paths are read from
   * the kubeconfig's folder. The file is read once, by newWebhookSink.
   */
  kubeconfigPath: string;
  /**
   * The pause before the first retry; each next one doubles, up to MAX_WEBHOOK_BACKOFF_MS, plus up to a fifth more
   * at random so that replicas do not retry in step. Default: DEFAULT_WEBHOOK_INITIAL_BACKOFF_MS (1 s).
   */
  initialBackoffMs?: number;
  /** Attempts after the first for a batch that met a connection error, a timeout, 429 or 5xx. Default: 4. */
  maxRetries?: number;
  /** The deadline of one attempt, from connecting to the end of the answer. Default: 10 s. */
  timeoutMs?: number;
  /** What the pauses between attempts wait on. Default: systemClock. */
  clock?: Clock;
}

/**
 * 1 s rather than kube-apiserver's 10 s (--audit-webhook-initial-backoff). A sink's queue waits while its batch is
 * retried, and in blocking mode so do the requests: with 4 retries, 1 + 2 + 4 + 8 s (and the jitter) rides out a
 * receiver's restart, about 20 s, while 10,000 queued events cover that at 500 a second. kube-apiserver's 10 s and
 * five attempts hold a batch for about two minutes.
 */
export const DEFAULT_WEBHOOK_INITIAL_BACKOFF_MS = 1_000;
export const DEFAULT_WEBHOOK_MAX_RETRIES = 4;
/** A receiver takes a batch of 400 events in well under a second; one that takes 10 s is stuck, and we try again. */
export const DEFAULT_WEBHOOK_TIMEOUT_MS = 10_000;
/** Caps the doubling for large maxRetries: a pause longer than this only delays the batches behind it. */
export const MAX_WEBHOOK_BACKOFF_MS = 30_000;
/** Jitter: each pause is up to this fraction longer, at random (kube-apiserver's webhook backoff uses 0.2 too). */
const BACKOFF_JITTER = 0.2;
/** Idle connections to the receiver are kept this long: a batch goes at least every few seconds when busy. */
const KEEP_ALIVE_MS = 30_000;

/** Where the webhook sends, and how it proves who it is. Holds key material: never logged. */
interface WebhookTarget {
  url: URL;
  ca: string | undefined;
  cert: string | undefined;
  key: string | undefined;
  servername: string | undefined;
  token: string | undefined;
}

/**
 * A receiver named by a kubeconfig-format file, as kube-apiserver's webhooks are: POSTs retried with backoff on
 * connection errors, timeouts, 429 and 5xx; other answers are not retried (AUDIT_REJECTED), and a body still failing
 * after the retries rejects with AUDIT_UNAVAILABLE. close() aborts a POST under way.
 */
export interface WebhookClient {
  /** `webhook <host>`, for messages. */
  readonly where: string;
  send(body: string | Buffer, headers: Record<string, string>): Promise<void>;
  close(): Promise<void>;
}

export async function newWebhookClient(
  opts: WebhookSinkOptions,
  what = 'audit webhook',
): Promise<WebhookClient> {
  const problems = [
    ...atLeast('initialBackoffMs', opts.initialBackoffMs, 0),
    ...atLeast('maxRetries', opts.maxRetries, 0, { integer: true }),
    ...atLeast('timeoutMs', opts.timeoutMs, 0, { exclusive: true }),
  ];
  if (problems.length > 0) throw new AuditError(AUDIT_CONFIG, `${what}: ${problems.join('; ')}`);
  const initialBackoffMs = opts.initialBackoffMs ?? DEFAULT_WEBHOOK_INITIAL_BACKOFF_MS;
  const maxRetries = opts.maxRetries ?? DEFAULT_WEBHOOK_MAX_RETRIES;
  const timeoutMs = opts.timeoutMs ?? DEFAULT_WEBHOOK_TIMEOUT_MS;
  const clock = opts.clock ?? systemClock;
  const target = await loadWebhookTarget(opts.kubeconfigPath);
  const where = `${what} ${target.url.host}`;

  const agent = new Agent({
    connect: {
      minVersion: 'TLSv1.2',
      ...(target.ca ? { ca: target.ca } : {}),
      ...(target.cert ? { cert: target.cert, key: target.key } : {}),
      ...(target.servername ? { servername: target.servername } : {}),
    },
    keepAliveTimeout: KEEP_ALIVE_MS,
  });
  const authorization: Record<string, string> = target.token
    ? { authorization: `Bearer ${target.token}` }
    : {};
  const closing = new AbortController();
  let closed: Promise<void> | undefined;
  const closedError = (): AuditError => new AuditError(AUDIT_CLOSED, `${where}: closed`);

  /** One POST: undefined when the receiver took the body, else why not and whether to try again. */
  async function post(
    body: string | Buffer,
    headers: Record<string, string>,
  ): Promise<{ retry: boolean; reason: string; status?: number } | undefined> {
    const deadline = AbortSignal.timeout(timeoutMs);
    try {
      const res = await request(target.url, {
        method: 'POST',
        dispatcher: agent,
        headers: { ...headers, ...authorization },
        body,
        signal: AbortSignal.any([deadline, closing.signal]),
      });
      // The answer's body is not used, and never logged (a receiver may echo what it got); it is read so that the
      // connection can carry the next body.
      await res.body.dump().catch(() => undefined);
      const status = res.statusCode;
      if (status >= 200 && status < 300) return undefined;
      return { retry: status === 429 || status >= 500, reason: `HTTP ${status}`, status };
    } catch (err) {
      if (closing.signal.aborted) throw closedError();
      if (deadline.aborted) return { retry: true, reason: `no answer within ${timeoutMs} ms` };
      return { retry: true, reason: networkReason(err) };
    }
  }

  return {
    where,
    async send(body, headers) {
      if (closing.signal.aborted) throw closedError();
      for (let attempt = 1; ; attempt++) {
        const failure = await post(body, headers);
        if (!failure) return;
        const status = failure.status === undefined ? {} : { status: failure.status };
        if (!failure.retry) throw new AuditError(AUDIT_REJECTED, `${where}: ${failure.reason}`, status);
        if (attempt > maxRetries)
          throw new AuditError(
            AUDIT_UNAVAILABLE,
            `${where}: ${failure.reason}, after ${attempt} attempts`,
            status,
          );
        const pauseMs =
          exponentialBackoff(attempt, initialBackoffMs, MAX_WEBHOOK_BACKOFF_MS) *
          (1 + Math.random() * BACKOFF_JITTER);
        if (!(await pause(clock, pauseMs, closing.signal))) throw closedError();
      }
    },
    close() {
      closed ??= (async () => {
        closing.abort();
        await agent.destroy();
      })();
      return closed;
    },
  };
}

/** POSTs each batch as an audit.k8s.io/v1 EventList, as kube-apiserver's webhook backend (see WebhookClient). */
export async function newWebhookSink(opts: WebhookSinkOptions): Promise<AuditSink> {
  const client = await newWebhookClient(opts);
  const headers = { 'content-type': 'application/json', accept: 'application/json' };
  return {
    name: 'webhook',
    async write(events) {
      if (events.length === 0) return;
      const list: EventList = {
        kind: 'EventList',
        apiVersion: AUDIT_API_VERSION,
        metadata: {},
        items: events,
      };
      await client.send(JSON.stringify(list), headers);
    },
    close: () => client.close(),
  };
}

/**
 * Waits `ms` on `clock`: true once it has passed, false as soon as `signal` aborts. The timer does not keep the
 * process alive, as a pause before a retry is never all there is left to do.
 */
function pause(clock: Clock, ms: number, signal: AbortSignal): Promise<boolean> {
  if (signal.aborted) return Promise.resolve(false);
  return new Promise((resolve) => {
    const aborted = (): void => {
      clock.clearTimeout(timer);
      resolve(false);
    };
    const timer = clock.setTimeout(() => {
      signal.removeEventListener('abort', aborted);
      resolve(true);
    }, ms);
    signal.addEventListener('abort', aborted, { once: true });
  });
}

/** The innermost message of a connection error ("connect ECONNREFUSED 127.0.0.1:443"), no more. */
function networkReason(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  return err.cause instanceof Error ? err.cause.message : err.message;
}

/** Reads the receiver and the credentials from a kubeconfig; every problem with it is reported at once. */
async function loadWebhookTarget(kubeconfigPath: string): Promise<WebhookTarget> {
  const where = `audit webhook: kubeconfig ${kubeconfigPath}`;
  let doc: unknown;
  try {
    doc = parse(await readFile(kubeconfigPath, 'utf8'));
  } catch (err) {
    throw new AuditError(AUDIT_CONFIG, `${where}: ${messageOf(err)}`, { cause: err });
  }
  const problems: string[] = [];
  const folder = dirname(resolve(kubeconfigPath));
  const { cluster, clusterName, user, userName } = chooseEntries(doc, problems);

  let url: URL | undefined;
  let ca: string | undefined;
  let servername: string | undefined;
  if (cluster) {
    const at = `cluster ${JSON.stringify(clusterName)}`;
    url = serverURL(cluster.server, `${at}: server`, problems);
    if (cluster['insecure-skip-tls-verify'] === true)
      problems.push(
        `${at}: insecure-skip-tls-verify: not supported: audit events go only to a verified receiver`,
      );
    if (cluster['proxy-url'] !== undefined) problems.push(`${at}: proxy-url: not supported`);
    const tlsServerName = cluster['tls-server-name'];
    if (tlsServerName !== undefined && typeof tlsServerName !== 'string')
      problems.push(`${at}: tls-server-name: must be a string`);
    else if (tlsServerName) servername = tlsServerName;
    ca = await material(cluster, 'certificate-authority', folder, at, problems);
    if (ca !== undefined) {
      try {
        if (certificateFingerprints([ca]).size === 0)
          problems.push(`${at}: certificate-authority: holds no PEM certificate`);
      } catch (err) {
        problems.push(`${at}: certificate-authority: ${messageOf(err)}`);
      }
    }
  }

  let cert: string | undefined;
  let key: string | undefined;
  let token: string | undefined;
  if (user) {
    const at = `user ${JSON.stringify(userName)}`;
    for (const field of ['tokenFile', 'exec', 'auth-provider', 'username', 'password'])
      if (user[field] !== undefined)
        problems.push(`${at}: ${field}: not supported (use token, or client-certificate and client-key)`);
    if (user.token !== undefined) {
      // A token pasted with its newline would fail every request as a bad header, and be retried for nothing.
      if (typeof user.token !== 'string' || !TOKEN.test(user.token))
        problems.push(`${at}: token: must be printable ASCII, without spaces`);
      else token = user.token;
    }
    cert = await material(user, 'client-certificate', folder, at, problems);
    key = await material(user, 'client-key', folder, at, problems);
    if ((cert === undefined) !== (key === undefined))
      problems.push(`${at}: client-certificate and client-key: set both or neither`);
    if (cert !== undefined) {
      try {
        if (certificateFingerprints([cert]).size === 0)
          problems.push(`${at}: client-certificate: holds no PEM certificate`);
      } catch (err) {
        problems.push(`${at}: client-certificate: ${messageOf(err)}`);
      }
    }
    if (key !== undefined) {
      try {
        createPrivateKey(key);
      } catch {
        // Not the parser's message: only that it is not a key, and nothing of what it holds.
        problems.push(`${at}: client-key: is not a PEM private key`);
      }
    }
  }

  if (problems.length > 0 || !url) throw new AuditError(AUDIT_CONFIG, `${where}: ${problems.join('; ')}`);
  return { url, ca, cert, key, servername, token };
}

/** What a bearer token may hold: RFC 6750's token68 and more, but no space, control character or non-ASCII. */
const TOKEN = /^[\x21-\x7e]+$/;

type Entry = Record<string, unknown>;

/** The cluster and user of the current context, or the only cluster and only user when there is no current context. */
function chooseEntries(
  doc: unknown,
  problems: string[],
): { cluster?: Entry; clusterName?: string; user?: Entry; userName?: string } {
  if (!isEntry(doc)) {
    problems.push('must be a YAML mapping');
    return {};
  }
  const clusters = namedEntries(doc, 'clusters', 'cluster', problems);
  const users = namedEntries(doc, 'users', 'user', problems);
  const contexts = namedEntries(doc, 'contexts', 'context', problems);
  let clusterName: string | undefined;
  let userName: string | undefined;
  const current = doc['current-context'];
  if (current !== undefined && current !== null && current !== '') {
    const context = typeof current === 'string' ? contexts.get(current) : undefined;
    if (typeof current !== 'string') problems.push('current-context: must be a string');
    else if (!context) problems.push(`current-context: no context is named ${JSON.stringify(current)}`);
    else {
      if (typeof context.cluster !== 'string' || context.cluster === '')
        problems.push(`context ${JSON.stringify(current)}: cluster: needed`);
      else clusterName = context.cluster;
      if (context.user !== undefined && typeof context.user !== 'string')
        problems.push(`context ${JSON.stringify(current)}: user: must be a string`);
      else if (context.user) userName = context.user;
    }
  } else {
    if (clusters.size !== 1)
      problems.push(
        `current-context: needed to choose among ${clusters.size} clusters (or give exactly one)`,
      );
    else clusterName = [...clusters.keys()][0];
    if (users.size > 1) problems.push(`current-context: needed to choose among ${users.size} users`);
    else if (users.size === 1) userName = [...users.keys()][0];
  }
  const cluster = clusterName === undefined ? undefined : clusters.get(clusterName);
  if (clusterName !== undefined && !cluster)
    problems.push(`clusters: none is named ${JSON.stringify(clusterName)}`);
  const user = userName === undefined ? undefined : users.get(userName);
  if (userName !== undefined && !user) problems.push(`users: none is named ${JSON.stringify(userName)}`);
  return {
    ...(cluster ? { cluster, clusterName } : {}),
    ...(user ? { user, userName } : {}),
  };
}

/** A kubeconfig list (`clusters: [{name, cluster: {…}}]`) by name. */
function namedEntries(doc: Entry, list: string, inner: string, problems: string[]): Map<string, Entry> {
  const found = new Map<string, Entry>();
  const items = doc[list];
  if (items === undefined || items === null) return found;
  if (!Array.isArray(items)) {
    problems.push(`${list}: must be a list`);
    return found;
  }
  items.forEach((item: unknown, i) => {
    if (!isEntry(item) || typeof item.name !== 'string') {
      problems.push(`${list}[${i}]: needs a name`);
      return;
    }
    const body = item[inner];
    if (!isEntry(body))
      problems.push(`${list}[${i}] (${JSON.stringify(item.name)}): ${inner}: must be a mapping`);
    else if (found.has(item.name)) problems.push(`${list}: two are named ${JSON.stringify(item.name)}`);
    else found.set(item.name, body);
  });
  return found;
}

function serverURL(server: unknown, at: string, problems: string[]): URL | undefined {
  if (typeof server !== 'string' || server === '') {
    problems.push(`${at}: needed`);
    return undefined;
  }
  let url: URL;
  try {
    url = new URL(server);
  } catch {
    problems.push(`${at}: is not a URL`);
    return undefined;
  }
  // The events say who did what, and a token may go along: never in the clear.
  if (url.protocol !== 'https:') problems.push(`${at}: must be an https URL`);
  else if (url.username || url.password) problems.push(`${at}: must not hold credentials`);
  else return url;
  return undefined;
}

/**
 * A PEM given as a file (`<field>`, relative to the kubeconfig's folder) or inline in base64 (`<field>-data`), never
 * both; undefined when neither is set.
 */
async function material(
  entry: Entry,
  field: string,
  folder: string,
  at: string,
  problems: string[],
): Promise<string | undefined> {
  const file = entry[field];
  const data = entry[`${field}-data`];
  if (file !== undefined && data !== undefined) {
    problems.push(`${at}: ${field} and ${field}-data: set one, not both`);
    return undefined;
  }
  if (file !== undefined) {
    if (typeof file !== 'string' || file === '') {
      problems.push(`${at}: ${field}: must be a file name`);
      return undefined;
    }
    try {
      return await readFile(resolve(folder, file), 'utf8');
    } catch (err) {
      problems.push(`${at}: ${field}: ${messageOf(err)}`);
      return undefined;
    }
  }
  if (data !== undefined) {
    if (typeof data !== 'string' || data === '') {
      problems.push(`${at}: ${field}-data: must be base64 text`);
      return undefined;
    }
    // A CA bundle is checked certificate by certificate as it is decoded; the other PEMs after.
    if (field === 'certificate-authority') {
      try {
        return decodeCABundle(data);
      } catch (err) {
        problems.push(`${at}: ${field}-data: ${messageOf(err)}`);
        return undefined;
      }
    }
    return Buffer.from(data, 'base64').toString('utf8');
  }
  return undefined;
}

function isEntry(value: unknown): value is Entry {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/** Problems of an optional number that must be at least `min` (more than it, when exclusive). */
function atLeast(
  field: string,
  value: number | undefined,
  min: number,
  how: { exclusive?: boolean; integer?: boolean } = {},
): string[] {
  if (value === undefined) return [];
  const ok =
    Number.isFinite(value) &&
    (how.exclusive ? value > min : value >= min) &&
    (!how.integer || Number.isSafeInteger(value));
  if (ok) return [];
  const what = how.integer ? 'a whole number' : 'a number';
  return [`${field}: must be ${what} ${how.exclusive ? 'above' : 'of at least'} ${min}`];
}

function messageOf(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}
