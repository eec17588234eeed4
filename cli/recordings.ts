// `sealion recordings`: the sessions the concierge recorded (asciicast v2: exec and attach as the terminal showed them,
// sftp as the operations it ran), listed and played back through the impersonation proxy, for people whom the hub's
// RBAC lets list and get sessionrecordings in Sealion's recordings group. Every replica's recordings are listed,
// whichever replica answers; the list is filtered and cut where the recordings are, so a folder of thousands costs
// the CLI one bounded answer. The hub answers, whichever cluster the kubeconfig's context reaches through it.
import { Argument, Command, Option } from 'commander';
import { withKubeconfig } from './options.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import { takesNames } from './completion.ts';
import { failureOf } from './exec-credential.ts';
import { printable, printableJSON, printableJSONText } from './printable.ts';
import { hubBase } from './version.ts';
import { kubeconfigAccess, loginFirst } from './whoami.ts';

interface RecordingsFlags {
  kubeconfig: string;
  context: string;
  groupSuffix: string;
}

interface ListFlags extends RecordingsFlags {
  user?: string;
  cluster?: string;
  since?: string;
  limit?: string;
  output: 'table' | 'json' | 'yaml';
}

/** A SessionRecording as the list answers it (every value is the server's text). */
export interface SessionRecordingItem {
  metadata: { name: string; creationTimestamp?: string };
  status: {
    replica?: string;
    bytes?: number;
    kind?: string;
    user?: string;
    cluster?: string;
    namespace?: string;
    pod?: string;
    container?: string;
    command?: string[];
    startTime?: string;
    lastWriteTime?: string;
  };
}

export interface SessionRecordingList {
  metadata?: { unreachableReplicas?: string[]; remainingItemCount?: number };
  items?: SessionRecordingItem[];
}

/** The largest recording a replica keeps by default is 32 MiB; room for a larger limit. */
const MAX_RECORDING_BYTES = 256 * 1024 * 1024;
/** A list is at most 5,000 rows of about 500 bytes (the server's bound). */
const MAX_LIST_BYTES = 16 * 1024 * 1024;
/** What a row shows of a command; `-o json` has it whole. */
const COMMAND_WIDTH = 40;

const SINCE_UNITS: Record<string, number> = { s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000 };

/**
 * `--since`: a duration back from `now` (90s, 15m, 2h, 7d, 1h30m) or an RFC 3339 time with its zone; the time it
 * names, in ms.
 */
export function parseSince(text: string, now: number): number {
  const trimmed = text.trim();
  if (/^(\d+[smhd])+$/.test(trimmed)) {
    let ms = 0;
    for (const [, n, unit] of trimmed.matchAll(/(\d+)([smhd])/g)) ms += Number(n) * SINCE_UNITS[unit!]!;
    return now - ms;
  }
  const at = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/i.test(trimmed)
    ? Date.parse(trimmed)
    : NaN;
  if (Number.isFinite(at)) return at;
  throw new Error(
    `recordings list --since ${JSON.stringify(printable(text, 64))}: not a duration or an RFC 3339 time; give one such as 2h, 7d or 2026-11-28T09:00:00Z`,
  );
}

/** The list request's query, from the flags (checked here, so that a mistake costs no login). */
export function listQuery(
  flags: Pick<ListFlags, 'user' | 'cluster' | 'since' | 'limit'>,
  now: number,
): string {
  const query = new URLSearchParams();
  if (flags.user !== undefined) query.set('user', flags.user);
  if (flags.cluster !== undefined) query.set('cluster', flags.cluster);
  if (flags.since !== undefined) query.set('since', new Date(parseSince(flags.since, now)).toISOString());
  if (flags.limit !== undefined) {
    if (!/^\d{1,9}$/.test(flags.limit) || Number(flags.limit) < 1)
      throw new Error(
        `recordings list --limit ${JSON.stringify(printable(flags.limit, 64))}: not a positive whole number; give one such as 100`,
      );
    query.set('limit', flags.limit);
  }
  const text = query.toString();
  return text ? `?${text}` : '';
}

/** A length of time as kubectl shows ages: 45s, 3m12s, 2h5m, 3d4h. */
export function shortDuration(ms: number): string {
  const s = Math.max(0, Math.round(ms / 1000));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60 ? `${s % 60}s` : ''}`;
  if (s < 86400)
    return `${Math.floor(s / 3600)}h${Math.floor(s / 60) % 60 ? `${Math.floor(s / 60) % 60}m` : ''}`;
  return `${Math.floor(s / 86400)}d${Math.floor(s / 3600) % 24 ? `${Math.floor(s / 3600) % 24}h` : ''}`;
}

/** Bytes as a person reads them: 512B, 1.5KiB, 32MiB. */
export function shortSize(bytes: number): string {
  if (!Number.isFinite(bytes) || bytes < 0) return '';
  if (bytes < 1024) return `${bytes}B`;
  const units = ['KiB', 'MiB', 'GiB'];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return `${value < 10 ? value.toFixed(1).replace(/\.0$/, '') : Math.round(value)}${units[unit]}`;
}

const NONE = '<none>';

/** What the COMMAND column shows: exec's words (cut), or the kind of session in parentheses. */
function commandCell(status: SessionRecordingItem['status']): string {
  if (status.kind === 'exec' || (status.kind === undefined && status.command)) {
    const words = (status.command ?? []).join(' ');
    return words ? printable(words, COMMAND_WIDTH) : NONE;
  }
  return status.kind ? `(${printable(status.kind, 16)})` : NONE;
}

/** One row of the table; times in UTC to the second, as RFC 3339. */
function row(item: SessionRecordingItem): string[] {
  const s = item.status;
  const cell = (text: string | undefined, max = 64): string => (text ? printable(text, max) : NONE);
  const started = Date.parse(s.startTime ?? '');
  const last = Date.parse(s.lastWriteTime ?? item.metadata.creationTimestamp ?? '');
  return [
    printable(item.metadata.name, 64),
    cell(s.user),
    cell(s.cluster),
    s.namespace || s.pod ? `${printable(s.namespace ?? '', 64)}/${printable(s.pod ?? '', 64)}` : NONE,
    commandCell(s),
    Number.isFinite(started) ? new Date(started).toISOString().replace(/\.\d+Z$/, 'Z') : NONE,
    Number.isFinite(started) && Number.isFinite(last) ? shortDuration(last - started) : NONE,
    typeof s.bytes === 'number' ? shortSize(s.bytes) : NONE,
  ];
}

/** The table `recordings list` prints. */
export function recordingsTable(list: SessionRecordingList): string {
  const rows = (list.items ?? []).map(row);
  const header = ['ID', 'USER', 'CLUSTER', 'NAMESPACE/POD', 'COMMAND', 'STARTED', 'DURATION', 'SIZE'];
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]): string =>
    cells
      .map((c, i) => c.padEnd(widths[i]!))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)].join('\n');
}

/** What the list leaves out, for stderr (the table stays the rows alone, for scripts). */
export function listNotes(list: SessionRecordingList): string[] {
  const notes: string[] = [];
  const remaining = list.metadata?.remainingItemCount ?? 0;
  if (remaining > 0)
    notes.push(
      `${remaining} more recordings match; narrow with --since, --user or --cluster, or raise --limit`,
    );
  const unreachable = list.metadata?.unreachableReplicas ?? [];
  if (unreachable.length > 0)
    notes.push(
      `replicas that did not answer: ${unreachable.map((r) => printable(r, 64)).join(', ')}; their recordings are not listed, retry later`,
    );
  return notes;
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);
const isStringList = (value: unknown): boolean =>
  Array.isArray(value) && value.every((v) => typeof v === 'string');
const STATUS_STRINGS = ['replica', 'kind', 'user', 'cluster', 'namespace', 'pod', 'container'] as const;
const STATUS_TIMES = ['startTime', 'lastWriteTime'] as const;

/** What is wrong with one item of the list, or undefined: every field the table reads, of the type it reads. */
function itemProblem(item: unknown): string | undefined {
  if (!isRecord(item) || !isRecord(item['metadata']) || !isRecord(item['status']))
    return 'an item without metadata and status';
  const { metadata, status } = item;
  if (typeof metadata['name'] !== 'string') return 'an item whose name is not a string';
  if (metadata['creationTimestamp'] !== undefined && typeof metadata['creationTimestamp'] !== 'string')
    return 'an item whose creationTimestamp is not a string';
  for (const field of [...STATUS_STRINGS, ...STATUS_TIMES])
    if (status[field] !== undefined && typeof status[field] !== 'string')
      return `an item whose status.${field} is not a string`;
  if (status['bytes'] !== undefined && typeof status['bytes'] !== 'number')
    return 'an item whose status.bytes is not a number';
  if (status['command'] !== undefined && !isStringList(status['command']))
    return 'an item whose status.command is not a list of strings';
  return undefined;
}

/**
 * The list the server answered, every field the table and the notes read checked: a malformed answer (or a server
 * that is no Sealion proxy) is one line saying what is wrong, not a TypeError. `host` names the server.
 */
export function parseRecordingList(text: string, host: string): SessionRecordingList {
  const notA = (what: string): Error =>
    new Error(
      `list recordings on ${host}: the server's answer is not a SessionRecordingList (${what}); check that the kubeconfig's server is a Sealion proxy`,
    );
  let list: unknown;
  try {
    list = JSON.parse(text);
  } catch {
    throw notA('not JSON');
  }
  if (!isRecord(list)) throw notA('not an object');
  const { metadata, items } = list;
  if (metadata !== undefined && !isRecord(metadata)) throw notA('its metadata is not an object');
  if (metadata?.['unreachableReplicas'] !== undefined && !isStringList(metadata['unreachableReplicas']))
    throw notA('its unreachableReplicas is not a list of names');
  if (metadata?.['remainingItemCount'] !== undefined && typeof metadata['remainingItemCount'] !== 'number')
    throw notA('its remainingItemCount is not a number');
  if (items !== undefined && !Array.isArray(items)) throw notA('its items is not a list');
  for (const item of items ?? []) {
    const problem = itemProblem(item);
    if (problem) throw notA(problem);
  }
  return list;
}

/** The list as `-o json` or `-o yaml` prints it: the SessionRecordingList the server answered, made printable. */
export async function listOutput(list: SessionRecordingList, format: 'json' | 'yaml'): Promise<string> {
  if (format === 'json') return `${printableJSON(list)}\n`;
  const { stringify } = await import('yaml');
  // Through JSON's escapes first: YAML would write a C1 control or a format character as it is.
  return printableJSONText(stringify(JSON.parse(printableJSON(list)) as unknown));
}

/** A failed request in one line: what failed, where, why, and what to do. */
export async function recordingsFailure(err: unknown, what: string, host: string): Promise<Error> {
  const status = (err as { status?: unknown }).status;
  const why = await failureOf(err);
  const todo =
    status === 401
      ? 'log in again (sealion login) or check the kubeconfig'
      : status === 403
        ? 'ask an admin to bind you the ClusterRole sealion-concierge-session-auditor'
        : status === 404
          ? what.startsWith('get')
            ? 'see sealion recordings list for the IDs there are'
            : 'the concierge records no sessions (its --recordings-dir is not set)'
          : status === 400
            ? 'check the flags'
            : 'retry, or check that the kubeconfig reaches a Sealion proxy';
  return new Error(`${what} on ${host}: ${why}; ${todo}`, { cause: err });
}

/** GETs `rest` of the SessionRecording collection from the hub the kubeconfig's context reaches. */
async function fetchFromHub(
  flags: RecordingsFlags,
  what: string,
  rest: string,
  accept: string,
  maxBytes: number,
): Promise<{ text: string; host: string }> {
  const { loadKubeConfigFlags } = await import('../lib/kube/kube.ts');
  const config = loadKubeConfigFlags(flags);
  await loginFirst(config);
  const group = apiGroups(flags.groupSuffix).recordings;
  const access = await kubeconfigAccess(config);
  const base = hubBase(access.base);
  const { closeHttpsPools, httpsText } = await import('../lib/https-client.ts');
  try {
    const answer = await httpsText(
      new URL(`apis/${group}/${VERSION}/${Resource.SessionRecording}${rest}`, base).toString(),
      {
        maxBytes,
        timeoutMs: 120_000,
        headers: access.headers,
        ...(access.caPem ? { caBundlePem: access.caPem } : {}),
        ...(access.clientCert ? { clientCert: access.clientCert } : {}),
      },
      accept,
    );
    return { text: answer.text, host: new URL(base).host };
  } catch (err) {
    throw await recordingsFailure(err, what, new URL(base).host);
  } finally {
    await closeHttpsPools();
  }
}

const common = (c: Command): Command =>
  withKubeconfig(c).option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX);

function listCommand(): Command {
  return common(new Command('list').description('the recorded sessions, newest first'))
    .option('--user <name>', "only this user's sessions")
    .addOption(
      takesNames(
        'cluster',
        new Option('--cluster <name>', "only this cluster's sessions (the hub by its name)"),
      ),
    )
    .option('--since <when>', 'only sessions that started since: a duration (2h, 7d) or an RFC 3339 time')
    .option('--limit <n>', 'at most this many (default and most: 5000)')
    .addOption(
      new Option('-o, --output <format>', 'table, json or yaml')
        .choices(['table', 'json', 'yaml'])
        .default('table'),
    )
    .action(async (flags: ListFlags) => {
      const query = listQuery(flags, Date.now());
      const { text, host } = await fetchFromHub(
        flags,
        'list recordings',
        query,
        'application/json',
        MAX_LIST_BYTES,
      );
      const list = parseRecordingList(text, host);
      if (flags.output !== 'table') return void process.stdout.write(await listOutput(list, flags.output));
      process.stdout.write(`${recordingsTable(list)}\n`);
      for (const note of listNotes(list)) process.stderr.write(`sealion: ${note}\n`);
    });
}

function playCommand(): Command {
  return common(new Command('play').description('play a recorded session back in this terminal'))
    .addArgument(
      takesNames(
        'recording',
        new Argument(
          '<id>',
          "the recording's ID, as recordings list shows it (an exec's or attach's is its audit ID)",
        ),
      ),
    )
    .option('--speed <factor>', 'play faster (2) or slower (0.5)', '1')
    .option('--max-idle <seconds>', 'shorten longer pauses to this', '2')
    .option('--raw', 'print the recording itself (asciicast v2, for asciinema play)', false)
    .action(async (id: string, flags: RecordingsFlags & { speed: string; maxIdle: string; raw: boolean }) => {
      const speed = Number(flags.speed);
      const maxIdle = Number(flags.maxIdle);
      if (!(speed > 0))
        throw new Error(
          `recordings play --speed ${JSON.stringify(printable(flags.speed, 64))}: not a positive number; give one such as 2 or 0.5`,
        );
      if (!(maxIdle > 0))
        throw new Error(
          `recordings play --max-idle ${JSON.stringify(printable(flags.maxIdle, 64))}: not a positive number; give one such as 2`,
        );
      const { text } = await fetchFromHub(
        flags,
        `get recording ${printable(id, 64)}`,
        `/${encodeURIComponent(id)}`,
        'application/x-asciicast',
        MAX_RECORDING_BYTES,
      );
      // The file as it is to anything that reads JSON, with the control characters JSON leaves raw escaped.
      if (flags.raw) return void process.stdout.write(printableJSONText(text));
      const { parseAsciicast, play } = await import('../concierge/recording/playback.ts');
      // play() passes only text and the sequences a replay needs: the recorded session cannot command this terminal.
      await play(parseAsciicast(text), process.stdout, { speed, maxIdleSeconds: maxIdle });
    });
}

export function recordingsCommand(): Command {
  const command = new Command('recordings').description(
    'list and play back recorded sessions: exec and attach (asciicast v2), and sftp as the operations it ran',
  );
  command.addCommand(listCommand());
  command.addCommand(playCommand());
  return command.addHelpText(
    'after',
    `
Examples:
  sealion recordings list --since 2h
  sealion recordings list --user alice@example.com --cluster edge -o json
  sealion recordings play 0b8f0c1e-5d7a-4c1e-9a57-3f2f5f7c9e11 --speed 4
The hub's RBAC decides who may: verbs list and get on ${Resource.SessionRecording} in API group
recordings.concierge.<suffix>, as the install's ClusterRole sealion-concierge-session-auditor grants:
  kubectl create clusterrolebinding session-auditors --clusterrole=sealion-concierge-session-auditor --group=auditors`,
  );
}
