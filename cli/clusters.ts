// `sealion clusters`: every context of a kubeconfig (as `get kubeconfig --all-clusters` writes them), and whether
// each cluster answers the user now. It asks each cluster's own API server who the user is (SelfSubjectReview), so
// a cluster whose agent holds no tunnel shows the proxy's reason, and a refused login shows as such.
import { Command } from 'commander';
import { outputOption, withKubeconfig } from './options.ts';
import { closeHttpsPools } from '../lib/https-client.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { statusMessageOf } from '../lib/kube/status.ts';
import { errorLine, oneLine, systemReason, UserError } from './errors.ts';
import { printable, printableJSON } from './printable.ts';
import {
  loadKubeconfig,
  loginFirst,
  postAsKubeconfig,
  printableDeep,
  table,
  type KubeconfigFlags,
} from './whoami.ts';

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

function stateOf(err: unknown): Pick<ClusterState, 'state' | 'detail'> {
  const e = err as { name?: unknown; code?: unknown; status?: unknown; body?: unknown };
  if (e.name === 'HttpsError' && e.code === 'BadStatus') {
    const detail =
      (typeof e.body === 'string' ? statusMessageOf(e.body) : undefined) ?? `HTTP ${String(e.status)}`;
    if (e.status === 401) return { state: 'Unauthorized', detail };
    if (e.status === 403) return { state: 'Forbidden', detail };
    if (e.status === 503) return { state: 'NotConnected', detail };
    return { state: 'Error', detail };
  }
  if (e.name === 'HttpsError' && e.code === 'Timeout')
    return { state: 'Unreachable', detail: 'no answer in time' };
  if (e.name === 'HttpsError' && e.code === 'Network')
    return { state: 'Unreachable', detail: systemReason(err) ?? oneLine(err) };
  // A login that failed, a kubeconfig entry that cannot be used: the one-line error.
  return { state: 'Error', detail: errorLine(err) };
}

/** Asks one context's cluster who the user is. */
async function probe(config: KubeConfig, name: string, current: boolean): Promise<ClusterState> {
  const server = config.getCurrentCluster()?.server ?? '';
  try {
    // Bounded by the HTTPS client's deadline; the plugin runs without a terminal (the logins happened before).
    const answer = (await postAsKubeconfig(config, 'apis/authentication.k8s.io/v1/selfsubjectreviews', {
      apiVersion: 'authentication.k8s.io/v1',
      kind: 'SelfSubjectReview',
    })) as { status?: { userInfo?: { username?: string } } };
    return {
      context: name,
      current,
      server,
      state: 'Ready',
      detail: answer.status?.userInfo?.username ?? '',
    };
  } catch (err) {
    return { context: name, current, server, ...stateOf(err) };
  }
}

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
  const all = await loadKubeconfig({ kubeconfig: flags.kubeconfig }, process.env, { current: false });
  const currentName = all.getCurrentContext();
  let contexts = all.getContexts();
  if (contexts.length === 0)
    throw new UserError(
      'the kubeconfig has no contexts; write one with sealion get kubeconfig --all-clusters',
    );
  if (flags.context) {
    contexts = contexts.filter((c) => c.name === flags.context);
    if (contexts.length === 0)
      throw new UserError(
        `no context ${flags.context} in the kubeconfig; known: ${all
          .getContexts()
          .map((c) => c.name)
          .join(', ')}`,
      );
  }
  // Each user logs in once, one after another, where the person can see the prompt; the probes then run at once
  // on the cached credentials. A login that fails is left for that user's probes to report.
  for (const user of new Set(contexts.map((c) => c.user))) {
    const context = contexts.find((c) => c.user === user)!;
    all.setCurrentContext(context.name);
    await loginFirst(all).catch(() => {});
  }
  let answered = 0;
  progress(0, contexts.length);
  return Promise.all(
    contexts.map(async ({ name }): Promise<ClusterState> => {
      // A config of its own per context: switching one shared config while the others are being asked would race.
      const config = await loadKubeconfig({ kubeconfig: flags.kubeconfig, context: name });
      const state = await probe(config, name, name === currentName);
      progress(++answered, contexts.length);
      return state;
    }),
  );
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

/**
 * A progress line on a terminal's standard error, rewritten in place and cleared when done; nothing when standard
 * error is not a terminal, so that piped or captured output has no stray text.
 */
export function progressLine(stream: NodeJS.WriteStream): {
  show: (answered: number, of: number) => void;
  clear: () => void;
} {
  if (!stream.isTTY) return { show: () => {}, clear: () => {} };
  let shown = false;
  return {
    show: (answered, of) => {
      shown = true;
      stream.write(`\r\u001b[Kasking ${of} ${of === 1 ? 'cluster' : 'clusters'}: ${answered} answered`);
    },
    clear: () => {
      if (shown) stream.write('\r\u001b[K');
    },
  };
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
