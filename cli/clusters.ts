// `sealion clusters`: every context of a kubeconfig (as `get kubeconfig --all-clusters` writes them), and whether
// each cluster answers the user now. It asks each cluster's own API server who the user is (SelfSubjectReview), so
// a cluster whose agent holds no tunnel shows the proxy's reason, and a refused login shows as such.
import { Command } from 'commander';
import { outputOption, withKubeconfig } from './options.ts';
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
}

/** Asks one context's cluster who the user is. */
async function probe(config: KubeConfig, signal: AbortSignal): Promise<string> {
  // The plugin runs without a terminal (the logins happened before).
  const answer = (await postAsKubeconfig(
    config,
    'apis/authentication.k8s.io/v1/selfsubjectreviews',
    { apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' },
    signal,
  )) as { status?: { userInfo?: { username?: string } } };
  return answer.status?.userInfo?.username ?? '';
}

/** How long one cluster may take to say who you are: the HTTPS client's own deadline. */
const PROBE_TIMEOUT_MS = 10_000;

export interface ClustersFlags extends KubeconfigFlags {
  context: string;
  output: 'table' | 'json' | 'yaml';
}

/**
 * Every context's cluster (or --context's alone) and whether it answers. `progress` hears how many answered so far,
 * for a person watching.
 */
export async function listClusters(
  flags: KubeconfigFlags,
  progress: (answered: number, of: number) => void = () => {},
): Promise<ClusterState[]> {
  const members = await fleetOf(flags);
  const answers = await askFleet(members, PROBE_TIMEOUT_MS, (m, signal) => probe(m.config, signal), progress);
  return answers.map(({ member: { context, current, server }, ...answer }) => ({
    context,
    current,
    server,
    ...(answer.ok ? { state: 'Ready', detail: answer.answer } : answer.failure),
  }));
}

/** The table, as `kubectl config get-contexts` prints it: CURRENT has a * on the current context. */
export function clustersTable(states: ClusterState[]): string {
  return table([
    ['CURRENT', 'CONTEXT', 'STATE', 'USER/DETAIL', 'SERVER'],
    ...states.map((s) => [
      s.current ? '*' : '',
      ...[s.context, s.state, s.detail, s.server].map((cell) => printable(cell)),
    ]),
  ]);
}

export function clustersCommand(): Command {
  return withKubeconfig(
    new Command('clusters').description("list the kubeconfig's clusters and whether each answers you now"),
    'ask only this context (default: every context)',
  )
    .addOption(outputOption())
    .addHelpText(
      'after',
      `
Each context's cluster is asked who you are, with the context's credentials (one login serves every context that
shares its user). CURRENT marks the kubeconfig's current context. STATE is Ready (USER/DETAIL is the user it sees),
NotConnected (the cluster's agent holds no tunnel), Unauthorized, Forbidden, Unreachable or Error. The exit status
is 1 when no cluster answered.

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
