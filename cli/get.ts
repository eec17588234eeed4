// `sealion get RESOURCE [NAME…] --all-clusters`: kubectl get over every context of the kubeconfig at once (as
// `get kubeconfig --all-clusters` writes them, one per cluster), each cluster answering through the proxy for itself:
// its own discovery resolves the resource, its own server-side Table gives the columns, its own RBAC decides. A
// cluster that fails or refuses is shown with its reason, never left out, and makes the exit status 1.
import { Option, type Command } from 'commander';
import { closeHttpsPools } from '../lib/https-client.ts';
import { collectionPath, discover, resolveResource, type ApiResource } from './discovery.ts';
import { UserError } from './errors.ts';
import {
  askFleet,
  checkFleetChoice,
  clusterTimeoutMs,
  fleetOf,
  progressLine,
  UnknownResource,
  withFleetOptions,
  type ClusterFailure,
  type FleetFlags,
  type FleetMember,
} from './fleet.ts';
import { printable, printableJSON } from './printable.ts';
import { printableDeep, requestAsKubeconfig, table } from './whoami.ts';

/**
 * The annotation `-o json|yaml` adds to every item: the context (cluster) it came from. An annotation, not a label,
 * so that a selector on the merged list, or the item applied back, means what it meant on the cluster; a name of
 * the CLI's own, not the API group's (whose suffix a hub may change), so one script reads every hub's output.
 */
export const CONTEXT_ANNOTATION = 'sealion.dev/context';

/** Server-side printing, as kubectl asks for it; the plain list as the type to fall to. */
const TABLE_ACCEPT = 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json';

/** Items per page, as kubectl pages (--chunk-size): a large list comes in bounded answers. */
const PAGE_SIZE = 500;

/** Pages read from one cluster at most: a server that always says "continue" is cut off, not followed forever. */
const MAX_PAGES = 200;

/** The largest page accepted from one cluster: 500 large objects. */
const PAGE_MAX_BYTES = 64 * 1024 * 1024;

export interface GetFlags extends FleetFlags {
  allNamespaces: boolean;
  selector: string;
  output: 'table' | 'wide' | 'name' | 'json' | 'yaml';
}

/** A server-side Table (meta.k8s.io/v1), as far as it is read here. */
export interface ServerTable {
  kind?: string;
  columnDefinitions?: { name?: string; type?: string; priority?: number }[];
  rows?: { cells?: unknown[]; object?: { metadata?: { name?: string; namespace?: string } } }[];
  metadata?: { continue?: string };
}

/** One cluster's answer: the resource it resolved, and its Table (table output) or its items (the others). */
export interface ClusterAnswer {
  resource: ApiResource;
  table?: ServerTable;
  items?: Record<string, unknown>[];
}

/** One cluster's outcome: its answer, or why there is none. */
export type ClusterResult = { context: string } & (
  { ok: true; answer: ClusterAnswer } | { ok: false; failure: ClusterFailure }
);

/** The query of one page: the selector, one name (as a field selector), the page size and where to go on. */
function pageQuery(selector: string, name: string | undefined, next: string | undefined): string {
  const query = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (selector) query.set('labelSelector', selector);
  if (name !== undefined) query.set('fieldSelector', `metadata.name=${name}`);
  if (next) query.set('continue', next);
  return query.toString();
}

/**
 * Lists `resource` on one cluster, page by page; with `names`, each name on its own (a field selector on
 * metadata.name, so that a name missing on this cluster is no failure: it is there on another, or nowhere).
 */
async function listOn(
  member: FleetMember,
  resource: ApiResource,
  namespace: string,
  flags: Pick<GetFlags, 'selector' | 'output'>,
  names: string[],
  signal: AbortSignal,
): Promise<ClusterAnswer> {
  const asTable = flags.output === 'table' || flags.output === 'wide';
  const answer: ClusterAnswer = asTable ? { resource, table: { rows: [] } } : { resource, items: [] };
  let pages = 0;
  for (const name of names.length > 0 ? names : [undefined]) {
    let next: string | undefined;
    do {
      const text = await requestAsKubeconfig(
        member.config,
        `${collectionPath(resource, namespace)}?${pageQuery(flags.selector, name, next)}`,
        { accept: asTable ? TABLE_ACCEPT : 'application/json', signal, maxBytes: PAGE_MAX_BYTES },
      );
      const parsed = JSON.parse(text) as ServerTable & { items?: Record<string, unknown>[] };
      // A server that prints no Table for this type (some aggregated APIs) answers the list: NAME and AGE, as kubectl.
      const page =
        asTable && parsed.kind !== 'Table' ? { ...parsed, ...tableOfItems(parsed.items ?? []) } : parsed;
      // The server's text is checked before it is read: a cluster answering something else fails alone.
      if (asTable && (!Array.isArray(page.columnDefinitions) || !Array.isArray(page.rows)))
        throw new Error('its answer is not a Table');
      if (!asTable && !Array.isArray(page.items)) throw new Error('its answer is not a list');
      if (++pages > MAX_PAGES)
        throw new Error(`more than ${MAX_PAGES * PAGE_SIZE} items; narrow with -n or -l`);
      if (asTable) {
        answer.table!.columnDefinitions ??= page.columnDefinitions;
        answer.table!.rows!.push(...page.rows!.filter(isObject));
      } else answer.items!.push(...page.items!.filter(isObject));
      next = page.metadata?.continue || undefined;
    } while (next);
  }
  return answer;
}

const isObject = <T>(value: T): value is T & object =>
  typeof value === 'object' && value !== null && !Array.isArray(value);

/** A list's items as the Table kubectl prints for a type its server has no columns for: NAME and AGE. */
export function tableOfItems(
  items: Record<string, unknown>[],
): Pick<ServerTable, 'columnDefinitions' | 'rows'> {
  return {
    columnDefinitions: [
      { name: 'Name', type: 'string', priority: 0 },
      { name: 'Age', type: 'date', priority: 0 },
    ],
    rows: (Array.isArray(items) ? items : []).map((item) => {
      const metadata = (item['metadata'] ?? {}) as {
        name?: string;
        namespace?: string;
        creationTimestamp?: string;
      };
      return { cells: [metadata.name, metadata.creationTimestamp], object: { metadata } };
    }),
  };
}

/** The namespace a context lists in: -n, else the context's own, else default, as kubectl; -A: every one. */
export function namespaceOf(
  member: FleetMember,
  flags: Pick<GetFlags, 'namespace' | 'allNamespaces'>,
): string {
  if (flags.allNamespaces) return '';
  return flags.namespace || member.config.getContextObject(member.context)?.namespace || 'default';
}

/** Asks every cluster at once (bounded, each with its deadline), each resolving `resourceArg` in its own discovery. */
export async function getAcrossFleet(
  flags: GetFlags,
  resourceArg: string,
  names: string[],
  progress: (answered: number, of: number) => void = () => {},
): Promise<ClusterResult[]> {
  const members = await fleetOf(flags);
  const answers = await askFleet(
    members,
    clusterTimeoutMs(flags.clusterTimeout),
    async (member, signal) => {
      const resource = resolveResource(resourceArg, await discover(member.config, signal));
      if (!resource) throw new UnknownResource(resourceArg);
      return listOn(member, resource, namespaceOf(member, flags), flags, names, signal);
    },
    progress,
  );
  return answers.map((a) =>
    a.ok
      ? { context: a.member.context, ok: true, answer: a.answer }
      : { context: a.member.context, ok: false, failure: a.failure },
  );
}

/** "5s", "3m", "4h", "12d", "2y": an age as kubectl prints it in tables, in the largest units that say enough. */
export function shortAge(ms: number): string {
  const s = Math.max(0, Math.floor(ms / 1000));
  const [m, h, d] = [Math.floor(s / 60), Math.floor(s / 3600), Math.floor(s / 86400)];
  if (s < 120) return `${s}s`;
  if (m < 10) return s % 60 ? `${m}m${s % 60}s` : `${m}m`;
  if (h < 3) return `${m}m`;
  if (h < 8) return m % 60 ? `${h}h${m % 60}m` : `${h}h`;
  if (h < 48) return `${h}h`;
  if (d < 8) return h % 24 ? `${d}d${h % 24}h` : `${d}d`;
  if (d < 730) return `${d}d`;
  return `${Math.floor(d / 365)}y`;
}

/** One cell as kubectl prints it: nothing is `<none>`; a date column's timestamp becomes an age. */
export function cellText(value: unknown, type: string | undefined, now: number): string {
  if (value === null || value === undefined) return '<none>';
  if (type === 'date' && typeof value === 'string' && /^\d{4}-\d\d-\d\dT/.test(value)) {
    const at = Date.parse(value);
    if (!Number.isNaN(at)) return shortAge(now - at);
  }
  return printable(typeof value === 'string' ? value : JSON.stringify(value));
}

/**
 * The answers as tables with CLUSTER first (and NAMESPACE with -A), the Table's priority-0 columns (all with -o
 * wide). Clusters whose columns are the same share one table, and those whose columns differ (another version of a
 * CRD, another server release) get one of their own after a blank line: a union would leave blank cells that read as
 * "no value", and a column's meaning would depend on the row. Undefined when no cluster had a row.
 */
export function fleetTables(
  results: ClusterResult[],
  opts: { wide: boolean; allNamespaces: boolean },
  now = Date.now(),
): string | undefined {
  const groups = new Map<string, string[][]>();
  for (const result of results) {
    if (!result.ok || !result.answer.table?.rows?.length) continue;
    const { columnDefinitions = [], rows = [] } = result.answer.table;
    const shown = columnDefinitions
      .map((c, at) => ({ ...c, at }))
      .filter((c) => opts.wide || (c.priority ?? 0) === 0);
    const header = [
      'CLUSTER',
      ...(opts.allNamespaces ? ['NAMESPACE'] : []),
      ...shown.map((c) => printable(String(c.name ?? '')).toUpperCase()),
    ];
    const key = JSON.stringify(header);
    if (!groups.has(key)) groups.set(key, [header]);
    for (const row of rows)
      groups
        .get(key)!
        .push([
          printable(result.context),
          ...(opts.allNamespaces ? [printable(String(row.object?.metadata?.namespace ?? ''))] : []),
          ...shown.map((c) => cellText(row.cells?.[c.at], c.type, now)),
        ]);
  }
  if (groups.size === 0) return undefined;
  return [...groups.values()].map((rows) => table(rows)).join('\n');
}

/** The clusters that did not answer, one row each: CLUSTER, STATE, REASON. Undefined when every cluster answered. */
export function failuresTable(results: ClusterResult[]): string | undefined {
  const failed = results.filter((r): r is ClusterResult & { ok: false } => !r.ok);
  if (failed.length === 0) return undefined;
  return table([
    ['CLUSTER', 'STATE', 'REASON'],
    ...failed.map((r) => [printable(r.context), r.failure.state, printable(r.failure.detail)]),
  ]);
}

/**
 * One `v1` List of every cluster's items, each with its apiVersion and kind (a list's items come without them) and
 * the CONTEXT_ANNOTATION naming its cluster, in the order of the kubeconfig's contexts.
 */
export function mergedList(results: ClusterResult[]): {
  apiVersion: 'v1';
  kind: 'List';
  metadata: { resourceVersion: '' };
  items: Record<string, unknown>[];
} {
  const items = results.flatMap((r) => {
    if (!r.ok) return [];
    const { group, version, kind } = r.answer.resource;
    return (r.answer.items ?? []).map((item) => {
      const metadata = (item['metadata'] ?? {}) as { annotations?: Record<string, string> };
      return {
        apiVersion: group ? `${group}/${version}` : version,
        kind,
        ...item,
        metadata: { ...metadata, annotations: { ...metadata.annotations, [CONTEXT_ANNOTATION]: r.context } },
      };
    });
  });
  return { apiVersion: 'v1', kind: 'List', metadata: { resourceVersion: '' }, items };
}

/**
 * `-o name`: a line per item, the context then `kind.group/name` (kubectl's -o name), apart by a space, which is
 * in neither, so that `while read context object` feeds each back to kubectl --context.
 */
export function nameLines(results: ClusterResult[]): string {
  return results
    .flatMap((r) => {
      if (!r.ok) return [];
      const { kind, group } = r.answer.resource;
      const type = `${kind.toLowerCase()}${group ? `.${group}` : ''}`;
      return (r.answer.items ?? []).map((item) => {
        const name = (item['metadata'] as { name?: unknown } | undefined)?.name;
        return `${printable(r.context)} ${type}/${printable(typeof name === 'string' ? name : '')}\n`;
      });
    })
    .join('');
}

/** Whether any cluster that answered has the item `name` (for names given on the line). */
function foundAnywhere(results: ClusterResult[], name: string): boolean {
  return results.some(
    (r) =>
      r.ok &&
      ((r.answer.items ?? []).some((i) => (i['metadata'] as { name?: unknown } | undefined)?.name === name) ||
        (r.answer.table?.rows ?? []).some((row) => row.object?.metadata?.name === name)),
  );
}

/**
 * What `sealion get` prints, on standard output and standard error, and the one line of its failure (undefined when
 * every cluster answered and every name was found): the table, then the clusters that did not answer as a block; with
 * -o json|yaml|name, the data alone on standard output and each cluster that did not answer on a line of standard
 * error.
 */
export async function getOutput(
  results: ClusterResult[],
  flags: Pick<GetFlags, 'output' | 'allNamespaces'>,
  what: string,
  names: string[],
  now = Date.now(),
): Promise<{ stdout: string; stderr: string; failure?: string }> {
  let stdout = '';
  let stderr = '';
  const failed = results.filter((r): r is ClusterResult & { ok: false } => !r.ok);
  if (flags.output === 'table' || flags.output === 'wide') {
    const tables = fleetTables(
      results,
      { wide: flags.output === 'wide', allNamespaces: flags.allNamespaces },
      now,
    );
    const failures = failuresTable(results);
    if (tables) stdout += tables;
    else if (names.length === 0 && failed.length < results.length)
      stderr += 'No resources found in the clusters that answered.\n';
    if (failures) stdout += `${tables ? '\n' : ''}${failures}`;
  } else {
    if (flags.output === 'name') stdout = nameLines(results);
    else if (flags.output === 'json') stdout = `${printableJSON(mergedList(results))}\n`;
    else stdout = (await import('yaml')).stringify(printableDeep(mergedList(results)));
    for (const r of failed)
      stderr += `${printable(r.context)}: ${r.failure.state}: ${printable(r.failure.detail)}\n`;
  }
  const missing = failed.length < results.length ? names.filter((n) => !foundAnywhere(results, n)) : [];
  const problems = [
    ...(failed.length > 0
      ? [
          `${failed.length} of ${results.length} ${results.length === 1 ? 'cluster' : 'clusters'} did not answer (${failed
            .map((r) => `${printable(r.context)}: ${r.failure.state}`)
            .join(', ')})`,
        ]
      : []),
    ...(missing.length > 0
      ? [`not found on any cluster that answered: ${missing.map((n) => printable(n)).join(', ')}`]
      : []),
  ];
  if (problems.length === 0) return { stdout, stderr };
  const fix =
    failed.length > 0
      ? 'see each reason above; sealion clusters shows which clusters answer you now'
      : 'check the names';
  return { stdout, stderr, failure: `get ${printable(what)}: ${problems.join('; ')}; ${fix}` };
}

/** What -o takes here: kubectl get's formats that read across clusters. */
const GET_OUTPUTS = ['table', 'wide', 'name', 'json', 'yaml'];

/**
 * The options of `sealion get RESOURCE`, on the `get` command that also holds `get kubeconfig`. The options are read
 * before the first argument only when it is a subcommand (positional options): `get kubeconfig --context x` is that
 * subcommand's, and what came before it is handed down, so `get --kubeconfig f kubeconfig` means what it meant.
 */
export function withResourceGet(get: Command): Command {
  withFleetOptions(
    get
      .enablePositionalOptions()
      .argument(
        '[resource]',
        'a resource type as kubectl takes it: pods, po, deployments.apps, widgets.example.com',
      )
      .argument('[names...]', 'only these objects (by name)'),
  )
    .option('-A, --all-namespaces', 'every namespace', false)
    .option('-l, --selector <selector>', 'a label selector, as kubectl takes it', '')
    .addOption(
      new Option('-o, --output <format>', 'table, wide, name, json or yaml')
        .choices(GET_OUTPUTS)
        .default('table'),
    )
    .hook('preSubcommand', (parent, sub) => {
      for (const option of parent.options) {
        const key = option.attributeName();
        if (parent.getOptionValueSource(key) === 'cli' && sub.options.some((o) => o.attributeName() === key))
          sub.setOptionValueWithSource(key, parent.getOptionValue(key), 'cli');
      }
    })
    .addHelpText(
      'after',
      `
sealion get RESOURCE --all-clusters asks every context of the kubeconfig at once (8 at a time, each within
--cluster-timeout), each cluster through the proxy for itself: its own discovery resolves RESOURCE, its own RBAC
decides. The table has a CLUSTER column first (the context's name). A cluster that does not answer is listed after
the table with its state (NotConnected, Unauthorized, Forbidden, Unreachable, UnknownResource, Error) and reason; with
-o json|yaml|name, on standard error, one line each. -o json|yaml prints one v1 List of every cluster's items, each
with the annotation ${CONTEXT_ANNOTATION} naming its context. -o name prints the context and kind/name on each line.
The exit status is 1 when any cluster did not answer, or a NAME was found on none.

Examples:
  sealion get pods --all-clusters -n shop
  sealion get deployments.apps --all-clusters -A -l app=web -o wide
  sealion get nodes --all-clusters -o json | jq -r '.items[] | .metadata.annotations["${CONTEXT_ANNOTATION}"] + " " + .metadata.name'
  sealion get configmaps settings --context proxy.example.com/edge -n shop`,
    )
    .action(async (resource: string | undefined, names: string[], flags: GetFlags) => {
      if (!resource)
        throw new UserError(
          'get: name a resource type (sealion get pods --all-clusters) or get kubeconfig; see sealion get --help',
        );
      // kubectl prints a table per type; here every type's columns and failures would interleave across clusters.
      if (resource.includes(','))
        throw new UserError(
          `get ${printable(resource)}: one resource type at a time; run sealion get once for each of ${resource
            .split(',')
            .map((r) => printable(r))
            .join(', ')}`,
        );
      // A name goes into a field selector: a comma or an operator in it would be another term, and is in no name.
      const bad = names.find((name) => !/^[^\s,=!]+$/.test(name));
      if (bad !== undefined)
        throw new UserError(
          `get ${printable(resource)}: "${printable(bad)}" is no object name; give names as kubectl get takes them`,
        );
      checkFleetChoice(flags, `get ${printable(resource)}`, 'kubectl get');
      await runGet(flags, resource, names);
    });
  return get;
}

async function runGet(flags: GetFlags, resource: string, names: string[]): Promise<void> {
  const progress = progressLine(process.stderr);
  let results: ClusterResult[];
  try {
    results = await getAcrossFleet(flags, resource, names, progress.show);
  } finally {
    progress.clear();
    await closeHttpsPools();
  }
  const out = await getOutput(results, flags, [resource, ...names].join(' '), names);
  process.stdout.write(out.stdout);
  process.stderr.write(out.stderr);
  if (out.failure) throw new UserError(out.failure);
}
