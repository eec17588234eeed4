// `sealion request`: access on request. A user asks the hub for named groups on named clusters for a while, with a
// reason; reviewers approve or deny by the hub's RBAC (verb approve on accessrequests), never their own requests; the
// requester withdraws one, or waits for its review. Sealion writes every AccessRequest itself (the requester is whoever
// it authenticated, never a field the CLI sends), so the writes go to Sealion's own APIs at the hub's URL of the
// current context's proxy, never to a /clusters/<name> URL: POST accessrequests, <name>/approval, <name>/withdrawal.
// The caller's own requests come from selfaccessrequests, which needs no RBAC; `list --all` reads accessrequests as
// the hub's RBAC lets the user. Every name and flag is checked before any login or request.
import { Argument, Command, Option } from 'commander';
import { outputOption, withKubeconfig } from './options.ts';
import {
  ACCESS_REQUESTS,
  APPROVAL_SUBRESOURCE,
  MAX_DURATION_SECONDS,
  reasonProblem,
  WITHDRAWAL_SUBRESOURCE,
  type AccessDecision,
  type AccessRequest,
  type AccessRequestDecision,
  type AccessRequestSpec,
} from '../apis/access.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Kind, VERSION } from '../apis/groups.ts';
import { isDNSLabel, isDNSSubdomain } from '../apis/names.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { takesNames } from './completion.ts';
import { unreachableError, UserError } from './errors.ts';
import { failureOf } from './exec-credential.ts';
import { printable, printableJSON, printableJSONText } from './printable.ts';
import {
  kubeconfigAccess,
  loadKubeconfig,
  loginFirst,
  relativeTime,
  requestError,
  table,
  type KubeconfigAccess,
  type KubeconfigFlags,
} from './whoami.ts';

/**
 * The caller's own AccessRequests (an AccessRequestList, newest first), which Sealion answers from its informer at the
 * hub's URL without asking the hub's RBAC.
 */
export const SELF_ACCESS_REQUESTS = 'selfaccessrequests';

/** The most clusters and groups one request names (the API's own bounds). */
const MAX_CLUSTERS = 16;
const MAX_GROUPS = 16;
/** The longest group name (the API's bound on names it keeps). */
const MAX_GROUP_LENGTH = 1024;
/** The shortest grant the API takes. */
const MIN_DURATION_SECONDS = 60;
/** The longest `wait --timeout`: a pending request lapses after a day anyway. */
const MAX_WAIT_SECONDS = 7 * 86_400;
/**
 * How often `wait` asks for the request: one small GET every 2 s per waiting person, and an approval shows at most
 * 2 s late.
 */
export const POLL_INTERVAL_MS = 2_000;
/**
 * How long `wait` takes a request it does not find for one that is on its way: the replica that answers may not have
 * seen a request another replica has just written. A name that never appears costs this long before it is refused.
 */
export const NOT_FOUND_GRACE_MS = 5_000;
/** A list of the caller's requests or everyone's: room for thousands of entries. */
const MAX_LIST_BYTES = 16 * 1024 * 1024;
/** What a row shows of a reason; `-o json` has it whole. */
const REASON_WIDTH = 40;

export interface RequestFlags extends KubeconfigFlags {
  context: string;
  groupSuffix: string;
}

interface OutputFlags extends RequestFlags {
  output: 'table' | 'json' | 'yaml';
}

export interface CreateFlags extends OutputFlags {
  cluster: string[];
  group: string[];
  duration: string;
  reason: string;
  name?: string;
  wait: boolean;
  timeout: string;
}

const UNITS: Record<string, number> = { s: 1, m: 60, h: 3_600, d: 86_400 };

/**
 * A length of time as `--duration` and `--timeout` take it: whole units, added (90s, 15m, 1h30m, 2d), in seconds.
 * `flag` names the option in the error.
 */
export function parseDuration(text: string, flag: string, min: number, max: number): number {
  const trimmed = text.trim();
  let seconds = NaN;
  if (/^(\d{1,7}[smhd])+$/.test(trimmed)) {
    seconds = 0;
    for (const [, n, unit] of trimmed.matchAll(/(\d+)([smhd])/g)) seconds += Number(n) * UNITS[unit!]!;
  }
  if (!Number.isFinite(seconds))
    throw new UserError(
      `${flag} "${printable(text, 64)}": not a duration; give one such as 30m, 1h or 1h30m`,
    );
  if (seconds < min || seconds > max)
    throw new UserError(
      `${flag} ${printable(trimmed, 64)}: must be between ${shortDuration(min)} and ${shortDuration(max)}`,
    );
  return seconds;
}

/** Seconds as a person reads a length of time: 45s, 1h, 1h30m, 7d. */
export function shortDuration(seconds: number): string {
  const s = Math.max(0, Math.round(seconds));
  const parts: [number, string][] = [
    [Math.floor(s / 86_400), 'd'],
    [Math.floor(s / 3_600) % 24, 'h'],
    [Math.floor(s / 60) % 60, 'm'],
    [s % 60, 's'],
  ];
  return parts.map(([n, unit]) => (n ? `${n}${unit}` : '')).join('') || '0s';
}

/** A request's name as the line gave it, checked: a DNS subdomain, as Kubernetes names objects. */
export function checkRequestName(name: string): string {
  if (!isDNSSubdomain(name))
    throw new UserError(
      `"${printable(name, 64)}" is not an access request name (lower-case letters, digits, '-' and '.', at most 253); see sealion request list for the names there are`,
    );
  return name;
}

/** Each value once, in the order given. */
const unique = (values: readonly string[]): string[] => [...new Set(values)];

/** What is wrong with a group name, or undefined: not empty, not too long, nothing a terminal or a log would hide. */
function groupProblem(group: string): string | undefined {
  if (group.trim() === '') return 'is empty';
  if (group.length > MAX_GROUP_LENGTH) return `is longer than ${MAX_GROUP_LENGTH} characters`;
  if (/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u.test(group)) return 'holds a control or invisible character';
  return undefined;
}

/** What `request create` posts: an AccessRequest without a requester, which the server sets from whoever it authenticated. */
export type NewAccessRequest = Omit<AccessRequest, 'spec' | 'status'> & {
  spec: Omit<AccessRequestSpec, 'requester'>;
};

/** The AccessRequest `request create` posts, from the flags, every one checked (so that a mistake costs no login). */
export function requestToCreate(flags: CreateFlags): NewAccessRequest {
  const clusters = unique(flags.cluster ?? []);
  const groups = unique(flags.group ?? []);
  if (clusters.length === 0)
    throw new UserError(
      'request create: no cluster named; pass --cluster NAME (the hub by its name, hub unless the admin named it otherwise)',
    );
  if (clusters.length > MAX_CLUSTERS)
    throw new UserError(`request create: ${clusters.length} clusters; name at most ${MAX_CLUSTERS}`);
  for (const cluster of clusters)
    if (!isDNSLabel(cluster))
      throw new UserError(
        `request create --cluster "${printable(cluster, 64)}": not a cluster name (a DNS label); see sealion clusters for the names`,
      );
  if (groups.length === 0)
    throw new UserError(
      "request create: no group named; pass --group NAME, one the clusters' access policy lists",
    );
  if (groups.length > MAX_GROUPS)
    throw new UserError(`request create: ${groups.length} groups; name at most ${MAX_GROUPS}`);
  for (const group of groups) {
    const problem = groupProblem(group);
    if (problem)
      throw new UserError(`request create --group "${printable(group, 64)}": ${problem}; give a group name`);
  }
  const durationSeconds = parseDuration(
    flags.duration,
    'request create --duration',
    MIN_DURATION_SECONDS,
    MAX_DURATION_SECONDS,
  );
  const problem = reasonProblem(flags.reason);
  if (problem)
    throw new UserError(
      `request create --reason: ${problem}; say why in one line, such as --reason "INC-123: restart the payment pods"`,
    );
  if (flags.name !== undefined) checkRequestName(flags.name);
  return {
    apiVersion: `${apiGroups(flags.groupSuffix).access}/${VERSION}`,
    kind: Kind.AccessRequest,
    metadata: flags.name !== undefined ? { name: flags.name } : {},
    spec: { clusters, groups, durationSeconds, reason: flags.reason },
  };
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);
const isStringList = (value: unknown): value is string[] =>
  Array.isArray(value) && value.every((v) => typeof v === 'string');
const optional = (value: unknown, type: 'string' | 'number'): boolean =>
  value === undefined || typeof value === type;

/** What is wrong with one AccessRequest from the server, or undefined: every field the CLI reads, of its type. */
export function accessRequestProblem(item: unknown): string | undefined {
  if (!isRecord(item) || !isRecord(item['metadata']) || !isRecord(item['spec']))
    return 'an object without metadata and spec';
  const { metadata, spec, status } = item;
  if (typeof metadata['name'] !== 'string') return 'a name that is not a string';
  if (!optional(metadata['creationTimestamp'], 'string')) return 'a creationTimestamp that is not a string';
  if (!isStringList(spec['clusters']) || !isStringList(spec['groups']))
    return 'spec.clusters or spec.groups that is not a list of names';
  if (typeof spec['durationSeconds'] !== 'number') return 'a spec.durationSeconds that is not a number';
  if (!optional(spec['reason'], 'string')) return 'a spec.reason that is not a string';
  if (spec['requester'] !== undefined && !isRecord(spec['requester']))
    return 'a spec.requester that is not an object';
  if (!optional(spec['requester']?.['username'], 'string'))
    return 'a spec.requester.username that is not a string';
  if (status === undefined) return undefined;
  if (!isRecord(status)) return 'a status that is not an object';
  for (const field of ['phase', 'approvedAt', 'expiresAt', 'requester', 'message'])
    if (!optional(status[field], 'string')) return `a status.${field} that is not a string`;
  if (!optional(status['approvalsRequired'], 'number'))
    return 'a status.approvalsRequired that is not a number';
  const reviews = status['reviews'];
  if (reviews === undefined) return undefined;
  if (
    !Array.isArray(reviews) ||
    !reviews.every(
      (r) =>
        isRecord(r) &&
        typeof r['user'] === 'string' &&
        typeof r['decision'] === 'string' &&
        optional(r['reason'], 'string') &&
        optional(r['time'], 'string'),
    )
  )
    return 'a status.reviews that is not a list of reviews';
  return undefined;
}

/** An answer's body read as one AccessRequest (a list when `list`), every field checked, or one line saying what is wrong. */
export function parseAnswer(text: string, host: string, list: true): AccessRequest[];
export function parseAnswer(text: string, host: string, list: false): AccessRequest;
export function parseAnswer(text: string, host: string, list: boolean): AccessRequest | AccessRequest[] {
  const notA = (what: string): UserError =>
    new UserError(
      `the answer of ${host} is not ${list ? 'an AccessRequestList' : 'an AccessRequest'} (${what}); check that the kubeconfig's server is a Sealion proxy that serves access requests`,
    );
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw notA('not JSON');
  }
  if (!list) {
    const problem = accessRequestProblem(value);
    if (problem) throw notA(problem);
    return value as AccessRequest;
  }
  if (!isRecord(value) || (value['items'] !== undefined && !Array.isArray(value['items'])))
    throw notA('no list of items');
  const items = (value['items'] ?? []) as unknown[];
  for (const item of items) {
    const problem = accessRequestProblem(item);
    if (problem) throw notA(`an item with ${problem}`);
  }
  return items as AccessRequest[];
}

/** Whether `request` is a grant in force at `now`: approved, and its end (by the clock) not passed. */
export function isActive(request: AccessRequest, now: number): boolean {
  return request.status?.phase === 'Approved' && Date.parse(request.status.expiresAt ?? '') > now;
}

/**
 * The phase a person should see: the server's, except that an Approved or Pending request whose end has passed is
 * Expired (the clock decides, as the proxy's grants do; the controller's write may come a moment later).
 */
export function phaseAt(request: AccessRequest, now: number): string {
  const phase = request.status?.phase ?? 'Pending';
  const ends = Date.parse(request.status?.expiresAt ?? '');
  if ((phase === 'Approved' || phase === 'Pending') && ends <= now) return 'Expired';
  return phase;
}

const NONE = '<none>';

/** APPROVALS: the approvals in so far, of those required. */
function approvalsCell(request: AccessRequest): string {
  const got = (request.status?.reviews ?? []).filter((r) => r.decision === 'Approved').length;
  const required = request.status?.approvalsRequired;
  return typeof required === 'number' ? `${got}/${required}` : `${got}`;
}

/** ENDS: when a grant ends, or when a pending request lapses undecided; nothing once it is over. */
function endsCell(request: AccessRequest, now: number): string {
  const phase = phaseAt(request, now);
  const ends = Date.parse(request.status?.expiresAt ?? '');
  if ((phase !== 'Approved' && phase !== 'Pending') || !Number.isFinite(ends)) return NONE;
  return relativeTime(ends, now);
}

/**
 * The table `request list` (and create, approve, deny, withdraw, wait) prints, one row a request; REQUESTER when the
 * list holds others' requests. Every cell is the server's text, made printable.
 */
export function requestsTable(requests: readonly AccessRequest[], now: number, requester = false): string {
  const p = (text: string, max = 64): string => printable(text, max);
  const header = [
    'NAME',
    ...(requester ? ['REQUESTER'] : []),
    'CLUSTERS',
    'GROUPS',
    'DURATION',
    'PHASE',
    'APPROVALS',
    'ENDS',
    'REASON',
  ];
  const rows = requests.map((r) => [
    p(r.metadata.name ?? ''),
    ...(requester ? [p(r.spec.requester?.username || r.status?.requester || NONE)] : []),
    r.spec.clusters.map((c) => p(c)).join(','),
    r.spec.groups.map((g) => p(g)).join(','),
    shortDuration(r.spec.durationSeconds),
    phaseAt(r, now),
    approvalsCell(r),
    endsCell(r, now),
    r.spec.reason ? p(r.spec.reason, REASON_WIDTH) : NONE,
  ]);
  return table([header, ...rows]);
}

/** A request or a list as `-o json` or `-o yaml` prints it: the server's objects, made printable. */
export async function requestOutput(value: unknown, format: 'json' | 'yaml'): Promise<string> {
  if (format === 'json') return `${printableJSON(value)}\n`;
  const { stringify } = await import('yaml');
  // Through JSON's escapes first: YAML would write a C1 control or a format character as it is.
  return printableJSONText(stringify(JSON.parse(printableJSON(value)) as unknown));
}

/** The hub the current context's proxy serves, and how to call it. */
export interface Hub {
  config: KubeConfig;
  access: KubeconfigAccess;
  /** The hub's URL (the proxy's, without a /clusters/<name>), ending in '/'. */
  base: string;
  /** The access group's path under it: apis/access.concierge.<suffix>/v1alpha1/. */
  prefix: string;
}

/** The hub of the context `flags` name, after its login (which may want the terminal). */
export async function openHub(flags: RequestFlags): Promise<Hub> {
  const config = await loadKubeconfig(flags);
  await loginFirst(config);
  return hubOf(config, flags.groupSuffix);
}

/** The hub of the current context of a loaded (and logged-in) kubeconfig. */
export async function hubOf(config: KubeConfig, groupSuffix: string): Promise<Hub> {
  const access = await kubeconfigAccess(config);
  const { hubBase } = await import('./version.ts');
  return {
    config,
    access,
    base: hubBase(access.base),
    prefix: `apis/${apiGroups(groupSuffix).access}/${VERSION}/`,
  };
}

/** Calls `path` (under the access group) on the hub; the answer's body. */
export async function callHub(
  hub: Hub,
  path: string,
  opts: { method?: 'GET' | 'POST'; body?: unknown; timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<string> {
  const { httpsText } = await import('../lib/https-client.ts');
  const { access } = hub;
  const answer = await httpsText(
    new URL(`${hub.prefix}${path}`, hub.base).toString(),
    {
      method: opts.method ?? 'GET',
      ...(opts.body === undefined ? {} : { body: opts.body }),
      ...(opts.timeoutMs === undefined ? {} : { timeoutMs: opts.timeoutMs }),
      ...(opts.signal ? { signal: opts.signal } : {}),
      maxBytes: MAX_LIST_BYTES,
      headers: access.headers,
      ...(access.caPem ? { caBundlePem: access.caPem } : {}),
      ...(access.clientCert ? { clientCert: access.clientCert } : {}),
    },
    'application/json',
  );
  return answer.text;
}

/** The caller's own requests, newest first, as the hub answers them. */
export async function ownRequests(
  hub: Hub,
  opts: { timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<AccessRequest[]> {
  const text = await callHub(hub, SELF_ACCESS_REQUESTS, opts);
  return parseAnswer(text, new URL(hub.base).host, true);
}

/** What to do after a refusal with this HTTP status, for one command; the server's message says why. */
export type Advice = Partial<Record<number, string>>;

/** The advice every command shares: a concierge without access requests, too many requests. */
const COMMON_ADVICE: Advice = {
  404: 'the concierge does not serve access requests here (is it older than them, or is the group suffix other?)',
  429: 'too many at once; retry in a moment',
  503: 'the concierge is not ready; retry in a moment',
};

/** A failed call to the hub as one line: cannot reach it, the credential refused (whoami's words), or the refusal. */
export async function hubFailure(err: unknown, hub: Hub, what: string, advice: Advice): Promise<UserError> {
  if (err instanceof UserError) return err;
  const status = (err as { status?: unknown }).status;
  if (status === 401 || unreachableError(err, hub.base, '')) return requestError(err, hub.config, what);
  const host = new URL(hub.base).origin;
  const todo = typeof status === 'number' ? (advice[status] ?? COMMON_ADVICE[status]) : undefined;
  const why = await failureOf(err);
  return new UserError(`${what} on ${host}: ${why}${todo ? `; ${todo}` : ''}`, { cause: err });
}

/** Ends the process's HTTPS connections, so that a one-shot command exits at once. */
async function done(): Promise<void> {
  await (await import('../lib/https-client.ts')).closeHttpsPools();
}

async function print(
  value: AccessRequest | AccessRequest[],
  output: OutputFlags['output'],
  requester = false,
): Promise<void> {
  if (output !== 'table') {
    process.stdout.write(
      await requestOutput(
        Array.isArray(value) ? { apiVersion: 'v1', kind: 'List', metadata: {}, items: value } : value,
        output,
      ),
    );
    return;
  }
  process.stdout.write(requestsTable(Array.isArray(value) ? value : [value], Date.now(), requester));
}

/** One line to standard error: what happened and what to do next (the table on standard output stays data). */
const note = (text: string): void => void process.stderr.write(`sealion: ${text}\n`);

/** How to read a decided request in one line: who decided and why. */
function lastReview(request: AccessRequest, decision: AccessDecision): string {
  const review = [...(request.status?.reviews ?? [])].reverse().find((r) => r.decision === decision);
  if (!review) return '';
  return ` by ${printable(review.user, 128)}${review.reason ? ` (${printable(review.reason, 128)})` : ''}`;
}

export interface WaitDeps {
  /** The caller's requests now; rejects with the HTTPS client's error. */
  fetch: (signal: AbortSignal) => Promise<AccessRequest[]>;
  now: () => number;
  /** Resolves after `ms`, or when `signal` aborts. */
  sleep: (ms: number, signal: AbortSignal) => Promise<void>;
}

/** Whether a failed poll is worth another: no answer, or the server's passing trouble (5xx, 429). */
function transient(err: unknown): boolean {
  const { status, code } = err as { status?: unknown; code?: unknown };
  if (typeof status === 'number') return status >= 500 || status === 429;
  return code === 'Timeout' || code === 'Network';
}

/**
 * Waits until the caller's request `name` is decided: resolves with it once Approved (and in force); rejects with one
 * line when it is Denied, Withdrawn or Expired, when it is not found (after NOT_FOUND_GRACE_MS), on a refusal, or
 * when `timeoutMs` passes. Passing trouble (no answer, a 5xx) is retried until then.
 */
export async function waitFor(name: string, timeoutMs: number, deps: WaitDeps): Promise<AccessRequest> {
  const start = deps.now();
  const deadline = start + timeoutMs;
  const stop = new AbortController();
  let lastTrouble: unknown;
  try {
    for (;;) {
      const left = deadline - deps.now();
      if (left <= 0) break;
      let found: AccessRequest | undefined;
      let listed = false;
      try {
        const signal = AbortSignal.any([stop.signal, AbortSignal.timeout(Math.min(left, 10_000))]);
        found = (await deps.fetch(signal)).find((r) => r.metadata.name === name);
        listed = true;
      } catch (err) {
        if (!transient(err)) throw err;
        lastTrouble = err;
      }
      const now = deps.now();
      if (found) {
        const phase = phaseAt(found, now);
        if (phase === 'Approved') return found;
        if (phase === 'Denied')
          throw new UserError(
            `access request ${name} was denied${lastReview(found, 'Denied')}; ask again with sealion request create if the need remains`,
          );
        if (phase === 'Withdrawn')
          throw new UserError(`access request ${name} was withdrawn${lastReview(found, 'Withdrawn')}`);
        if (phase === 'Expired')
          throw new UserError(
            found.status?.approvedAt
              ? `access request ${name} has expired: its grant ended; ask again with sealion request create`
              : `access request ${name} has expired undecided; ask again with sealion request create, and a reviewer to approve it`,
          );
      } else if (listed && now - start >= NOT_FOUND_GRACE_MS)
        throw new UserError(
          `you have no access request ${name}; see sealion request list for yours (wait follows your own requests only)`,
        );
      const pause = Math.min(POLL_INTERVAL_MS, deadline - now);
      if (pause > 0) await deps.sleep(pause, stop.signal);
    }
  } finally {
    stop.abort();
  }
  const trouble = lastTrouble ? ` (the last try: ${await failureOf(lastTrouble)})` : '';
  throw new UserError(
    `access request ${name} is still not approved after ${shortDuration(timeoutMs / 1000)}${trouble}; run sealion request wait ${name} again, or ask a reviewer to run sealion request approve ${name}`,
  );
}

/** The deps of waitFor against a real hub and clock. */
function hubWaitDeps(hub: Hub): WaitDeps {
  return {
    fetch: (signal) => ownRequests(hub, { signal, timeoutMs: 10_000 }),
    now: Date.now,
    sleep: async (ms, signal) => {
      const { setTimeout: sleep } = await import('node:timers/promises');
      await sleep(ms, undefined, { signal }).catch(() => {});
    },
  };
}

/** `wait NAME` and `create --wait`: waits on `hub`, prints the approved request, or throws the outcome's line. */
async function waitAndPrint(
  hub: Hub,
  name: string,
  timeout: string,
  output: OutputFlags['output'],
): Promise<void> {
  const timeoutMs = parseDuration(timeout, 'request wait --timeout', 1, MAX_WAIT_SECONDS) * 1000;
  try {
    const approved = await waitFor(name, timeoutMs, hubWaitDeps(hub)).catch(async (err: unknown) => {
      throw await hubFailure(err, hub, `wait for access request ${name}`, {
        403: 'ask your admin for access to the hub',
      });
    });
    await print(approved, output);
  } finally {
    await done();
  }
}

const common = (command: Command): Command =>
  withKubeconfig(command).option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX);

/** The NAME argument of approve, deny, withdraw and wait, completed from the hub. */
const nameArgument = (): Argument =>
  takesNames('request', new Argument('<name>', 'the access request, as sealion request list shows it'));

const collect = (value: string, previous: string[] | undefined): string[] => [...(previous ?? []), value];

function createCommand(): Command {
  return common(new Command('create').description('ask for groups on clusters for a while, with a reason'))
    .addOption(
      takesNames(
        'cluster',
        new Option(
          '--cluster <name>',
          'a cluster the groups are for, the hub by its name (repeatable)',
        ).argParser(collect),
      ),
    )
    .addOption(
      new Option(
        '--group <name>',
        "a group to be given, one the clusters' access policy lists (repeatable)",
      ).argParser(collect),
    )
    .option('--duration <duration>', 'how long the grant lasts once approved (30m, 1h, 2h30m)', '1h')
    .requiredOption(
      '--reason <text>',
      'why: an incident, a ticket (shown to reviewers and in every audit log)',
    )
    .option('--name <name>', "the request's name (default: one the server makes)")
    .option('--wait', 'then wait until it is approved, as request wait does', false)
    .option('--timeout <duration>', 'with --wait, how long to wait', '10m')
    .addOption(outputOption())
    .action(async (flags: CreateFlags) => {
      const body = requestToCreate(flags);
      // Checked before the login too, so that a typo costs nothing.
      if (flags.wait) parseDuration(flags.timeout, 'request create --timeout', 1, MAX_WAIT_SECONDS);
      const hub = await openHub(flags);
      let created: AccessRequest;
      try {
        const text = await callHub(hub, ACCESS_REQUESTS, { method: 'POST', body }).catch(
          async (err: unknown) => {
            throw await hubFailure(err, hub, 'cannot create the access request', {
              400: 'fix the flag the message names',
              403: "ask your admin what the clusters' access policies allow (kubectl get cluster NAME -o yaml shows spec.access)",
              409: 'that name is taken; pass another --name, or none',
              422: 'fix the flag the message names',
              429: 'you have too many pending requests; withdraw one (sealion request withdraw NAME) or wait for its review',
            });
          },
        );
        created = parseAnswer(text, new URL(hub.base).host, false);
      } catch (err) {
        await done();
        throw err;
      }
      const name = created.metadata.name ?? '';
      if (!flags.wait) {
        await done();
        await print(created, flags.output);
        note(`ask a reviewer to run: sealion request approve ${printable(name, 253)}`);
        return;
      }
      note(
        `access request ${printable(name, 253)} created; waiting for its approval (a reviewer runs sealion request approve ${printable(name, 253)}); interrupting stops the wait, not the request`,
      );
      await waitAndPrint(hub, name, flags.timeout, flags.output);
    });
}

function listCommand(): Command {
  return common(new Command('list').description('your access requests, newest first'))
    .option('--all', "everyone's, as the hub's RBAC lets you list accessrequests (reviewers)", false)
    .addOption(outputOption())
    .action(async (flags: OutputFlags & { all: boolean }) => {
      const hub = await openHub(flags);
      let requests: AccessRequest[];
      try {
        if (flags.all) {
          const text = await callHub(hub, ACCESS_REQUESTS);
          requests = parseAnswer(text, new URL(hub.base).host, true).sort(
            (a, b) =>
              (Date.parse(b.metadata.creationTimestamp ?? '') || 0) -
              (Date.parse(a.metadata.creationTimestamp ?? '') || 0),
          );
        } else requests = await ownRequests(hub);
      } catch (err) {
        throw await hubFailure(
          err,
          hub,
          flags.all ? 'cannot list access requests' : 'cannot list your access requests',
          {
            403: 'listing them all needs the ClusterRole sealion-concierge-access-reviewer bound to you on the hub; without --all, the list is your own',
          },
        );
      } finally {
        await done();
      }
      await print(requests, flags.output, flags.all);
    });
}

/** approve and deny: a reviewer's decision, posted to the request's approval subresource. */
function decideCommand(verb: 'approve' | 'deny'): Command {
  const decision: AccessDecision = verb === 'approve' ? 'Approved' : 'Denied';
  return common(
    new Command(verb).description(
      verb === 'approve'
        ? "approve someone's access request (a reviewer: verb approve on accessrequests on the hub)"
        : "deny someone's access request, or revoke an approved one that has not ended (a reviewer: verb approve on accessrequests on the hub)",
    ),
  )
    .addArgument(nameArgument())
    .option('--reason <text>', 'why, recorded in the request and the audit log')
    .addOption(outputOption())
    .action(async (name: string, flags: OutputFlags & { reason?: string }) => {
      await decide(name, flags, decision, APPROVAL_SUBRESOURCE, verb, {
        403: 'reviewers need the verb approve on accessrequests on the hub (the ClusterRole sealion-concierge-access-reviewer), and nobody decides their own request',
        404: 'see sealion request list --all for the names there are',
        409: 'only a pending request can be decided, and an approved one only denied (revoked) before it ends; see sealion request list --all',
      });
    });
}

function withdrawCommand(): Command {
  return common(new Command('withdraw').description('withdraw your own access request, pending or approved'))
    .addArgument(nameArgument())
    .option('--reason <text>', 'why, recorded in the request and the audit log')
    .addOption(outputOption())
    .action(async (name: string, flags: OutputFlags & { reason?: string }) => {
      await decide(name, flags, 'Withdrawn', WITHDRAWAL_SUBRESOURCE, 'withdraw', {
        403: 'only its requester may withdraw a request',
        404: 'see sealion request list for yours',
        409: 'only a pending or approved request can be withdrawn; see sealion request list',
      });
    });
}

/** Posts a decision on `name` to its `subresource` and prints the request as it is then. */
async function decide(
  name: string,
  flags: OutputFlags & { reason?: string },
  decision: AccessDecision,
  subresource: string,
  verb: string,
  advice: Advice,
): Promise<void> {
  checkRequestName(name);
  if (flags.reason !== undefined) {
    const problem = reasonProblem(flags.reason);
    if (problem) throw new UserError(`request ${verb} --reason: ${problem}; say why in one line`);
  }
  const body: AccessRequestDecision = {
    apiVersion: `${apiGroups(flags.groupSuffix).access}/${VERSION}`,
    kind: 'AccessRequestDecision',
    decision,
    ...(flags.reason !== undefined ? { reason: flags.reason } : {}),
  };
  const hub = await openHub(flags);
  let request: AccessRequest;
  try {
    const text = await callHub(hub, `${ACCESS_REQUESTS}/${encodeURIComponent(name)}/${subresource}`, {
      method: 'POST',
      body,
    });
    request = parseAnswer(text, new URL(hub.base).host, false);
  } catch (err) {
    throw await hubFailure(err, hub, `cannot ${verb} access request ${name}`, advice);
  } finally {
    await done();
  }
  await print(request, flags.output);
}

function waitCommand(): Command {
  return common(
    new Command('wait').description(
      'wait until your access request is approved; exits non-zero if it is denied, withdrawn or expires, or on timeout',
    ),
  )
    .addArgument(nameArgument())
    .option('--timeout <duration>', 'how long to wait (30s, 10m, 1h)', '10m')
    .addOption(outputOption())
    .action(async (name: string, flags: OutputFlags & { timeout: string }) => {
      checkRequestName(name);
      parseDuration(flags.timeout, 'request wait --timeout', 1, MAX_WAIT_SECONDS);
      await waitAndPrint(await openHub(flags), name, flags.timeout, flags.output);
    });
}

export function requestCommand(): Command {
  const command = new Command('request').description(
    'ask for groups on clusters for a while (access requests), and review, withdraw or wait for them',
  );
  command.addCommand(createCommand());
  command.addCommand(listCommand());
  command.addCommand(decideCommand('approve'));
  command.addCommand(decideCommand('deny'));
  command.addCommand(withdrawCommand());
  command.addCommand(waitCommand());
  return command.addHelpText(
    'after',
    `
An access request asks the hub for groups on clusters for a while, with a reason. Each cluster's policy (a Cluster's
spec.access; the hub's in the concierge config) lists the groups one may ask for, the longest duration and the
approvals needed. Once approved, your requests to those clusters carry the groups until it ends: no new login. What
the groups may do there is each cluster's RBAC. Every command talks to the hub of the current context's proxy.

Examples:
  sealion request create --cluster edge --group oncall-admins --duration 1h --reason "INC-123: restart payments" --wait
  sealion request list
  sealion request list --all                     # reviewers: everyone's
  sealion request approve alice-x7k2p --reason "on call this week"
  sealion request deny alice-x7k2p --reason "use the runbook's read-only role"   # approved already: revoked
  sealion request withdraw alice-x7k2p
  sealion request wait alice-x7k2p --timeout 30m && kubectl --context edge rollout restart deploy/payments
Reviewers hold the verb approve on accessrequests on the hub, as the install's ClusterRole sealion-concierge-access-reviewer
grants; nobody approves their own request:
  kubectl create clusterrolebinding access-reviewers --clusterrole=sealion-concierge-access-reviewer --group=sre-leads`,
  );
}
