// `sealion clusters`: every context of a kubeconfig (as `get kubeconfig --all-clusters` writes them), and whether
// each cluster answers the user now. It asks each cluster's own API server who the user is (SelfSubjectReview), so
// a cluster whose agent holds no tunnel shows the proxy's reason, and a refused login shows as such. The same answer
// names the access requests in force there (the extra Sealion forwards), so it also shows what each grant adds.
import { Command } from 'commander';
import { outputOption, withKubeconfig } from './options.ts';
import { ACCESS_REQUEST_EXTRA } from '../apis/access.ts';
import { DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import { closeHttpsPools } from '../lib/https-client.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { UserError } from './errors.ts';
import { askFleet, fleetOf, progressLine } from './fleet.ts';
import { printable, printableJSON } from './printable.ts';
import { postAsKubeconfig, printableDeep, table, type KubeconfigFlags } from './whoami.ts';

export interface ClusterState {
  context: string;
  /** Whether this is the kubeconfig's current context (kubectl config get-contexts marks it with *). */
  current: boolean;
  server: string;
  /** Ready, NotConnected, Unauthorized, Forbidden, Unreachable or Error. */
  state: string;
  /** The user the cluster sees when Ready; otherwise why it is not. */
  detail: string;
  /**
   * The access requests in force there, as the cluster's own answer names them (the sealion.dev/access-request extra
   * Sealion forwards), each with the groups it adds there. Absent when none.
   */
  grants?: ClusterGrant[];
}

/** What one cluster says of the user: the name, groups and extras its API server sees. */
interface SeenUser {
  username: string;
  groups: string[];
  extra: Record<string, string[]>;
}

/** Asks one context's cluster who the user is. */
async function probe(config: KubeConfig, signal: AbortSignal): Promise<SeenUser> {
  // The plugin runs without a terminal (the logins happened before).
  const answer = (await postAsKubeconfig(
    config,
    'apis/authentication.k8s.io/v1/selfsubjectreviews',
    { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
    signal,
  )) as { status?: { userInfo?: { username?: unknown; groups?: unknown; extra?: unknown } } };
  const info = answer.status?.userInfo;
  const strings = (v: unknown): string[] =>
    Array.isArray(v) ? v.filter((x): x is string => typeof x === 'string') : [];
  const extra =
    typeof info?.extra === 'object' && info.extra !== null
      ? Object.fromEntries(Object.entries(info.extra).map(([k, v]) => [k, strings(v)]))
      : {};
  return {
    username: typeof info?.username === 'string' ? info.username : '',
    groups: strings(info?.groups),
    extra,
  };
}

/** An access request in force on one cluster, and the groups the cluster sees from it. */
export interface ClusterGrant {
  name: string;
  /** The grant's groups the cluster's answer carries; absent when the grant could not be read from the hub. */
  groups?: string[];
}

/** How long one cluster may take to say who you are: the HTTPS client's own deadline. */
const PROBE_TIMEOUT_MS = 10_000;

export interface ClustersFlags extends KubeconfigFlags {
  context: string;
  groupSuffix: string;
  output: 'table' | 'json' | 'yaml';
}

/**
 * The groups of each grant that the clusters' answers name: read once per hub (the proxies the contexts reach) from
 * the caller's own requests. A hub that does not answer leaves its grants without groups.
 */
async function grantGroups(
  members: { config: KubeConfig; server: string; grantNames: string[] }[],
  groupSuffix: string,
): Promise<Map<string, Map<string, string[]>>> {
  const { hubBase } = await import('./version.ts');
  const { hubOf, ownRequests } = await import('./request.ts');
  const byHub = new Map<string, KubeConfig>();
  for (const m of members) if (m.grantNames.length > 0) byHub.set(hubBase(m.server), m.config);
  const found = new Map<string, Map<string, string[]>>();
  await Promise.all(
    [...byHub].map(async ([hub, config]) => {
      try {
        const own = await ownRequests(await hubOf(config, groupSuffix), { timeoutMs: PROBE_TIMEOUT_MS });
        found.set(hub, new Map(own.map((r) => [r.metadata.name ?? '', r.spec.groups])));
      } catch {
        // The names alone are shown.
      }
    }),
  );
  return found;
}

/**
 * Every context's cluster (or --context's alone) and whether it answers. `progress` hears how many answered so far,
 * for a person watching.
 */
export async function listClusters(
  flags: KubeconfigFlags & { groupSuffix?: string },
  progress: (answered: number, of: number) => void = () => {},
): Promise<ClusterState[]> {
  const members = await fleetOf(flags);
  const answers = await askFleet(members, PROBE_TIMEOUT_MS, (m, signal) => probe(m.config, signal), progress);
  const named = answers.map(({ member, ...answer }) => ({
    config: member.config,
    server: member.server,
    grantNames: answer.ok ? (answer.answer.extra[ACCESS_REQUEST_EXTRA] ?? []) : [],
  }));
  const groups = named.some((m) => m.grantNames.length > 0)
    ? await grantGroups(named, flags.groupSuffix ?? DEFAULT_GROUP_SUFFIX)
    : new Map<string, Map<string, string[]>>();
  const { hubBase } = await import('./version.ts');
  return answers.map(({ member: { context, current, server }, ...answer }, i) => {
    if (!answer.ok) return { context, current, server, ...answer.failure };
    const known = groups.get(hubBase(server));
    const grants = named[i]!.grantNames.map((name): ClusterGrant => {
      const asked = known?.get(name);
      // What the grant adds here: its groups that the cluster's answer carries.
      return asked ? { name, groups: asked.filter((g) => answer.answer.groups.includes(g)) } : { name };
    });
    return {
      context,
      current,
      server,
      state: 'Ready',
      detail: answer.answer.username,
      ...(grants.length > 0 ? { grants } : {}),
    };
  });
}

/** GRANTS: each grant in force there, with the groups it adds (`oncall-x7k2p (+sre-admins)`). */
function grantsCell(grants: ClusterGrant[] | undefined): string {
  return (grants ?? [])
    .map((g) =>
      g.groups?.length
        ? `${printable(g.name)} (+${g.groups.map((x) => printable(x)).join(', ')})`
        : printable(g.name),
    )
    .join('; ');
}

/**
 * The table, as `kubectl config get-contexts` prints it: CURRENT has a * on the current context. GRANTS, when an
 * access request is in force on some cluster, says what each adds there.
 */
export function clustersTable(states: ClusterState[]): string {
  const withGrants = states.some((s) => s.grants?.length);
  return table([
    ['CURRENT', 'CONTEXT', 'STATE', 'USER/DETAIL', ...(withGrants ? ['GRANTS'] : []), 'SERVER'],
    ...states.map((s) => [
      s.current ? '*' : '',
      ...[s.context, s.state, s.detail].map((cell) => printable(cell)),
      ...(withGrants ? [grantsCell(s.grants)] : []),
      printable(s.server),
    ]),
  ]);
}

export function clustersCommand(): Command {
  return withKubeconfig(
    new Command('clusters').description("list the kubeconfig's clusters and whether each answers you now"),
    'ask only this context (default: every context)',
  )
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .addOption(outputOption())
    .addHelpText(
      'after',
      `
Each context's cluster is asked who you are, with the context's credentials (one login serves every context that
shares its user). CURRENT marks the kubeconfig's current context. STATE is Ready (USER/DETAIL is the user it sees),
NotConnected (the cluster's agent holds no tunnel), Unauthorized, Forbidden, Unreachable or Error. GRANTS, shown
while an access request is in force, names each grant the cluster's own answer carries and the groups it adds there
(sealion request create asks for one). The exit status is 1 when no cluster answered.

Examples:
  sealion get kubeconfig --all-clusters --output-file me.kubeconfig && sealion clusters --kubeconfig me.kubeconfig
  sealion clusters -o json`,
    )
    .action(async (flags: ClustersFlags) => {
      const progress = progressLine(process.stderr);
      let states: ClusterState[];
      try {
        states = await listClusters(flags, progress.show);
      } finally {
        progress.clear();
      }
      await closeHttpsPools();
      if (flags.output === 'json') process.stdout.write(`${printableJSON(states)}\n`);
      else if (flags.output === 'yaml')
        process.stdout.write((await import('yaml')).stringify(printableDeep(states)));
      else process.stdout.write(clustersTable(states));
      if (!states.some((s) => s.state === 'Ready'))
        throw new UserError(
          states.length === 1
            ? `cluster ${states[0]!.context} did not answer: ${states[0]!.state}`
            : `none of the ${states.length} clusters answered; see STATE above`,
        );
    });
}
