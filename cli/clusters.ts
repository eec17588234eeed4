// `sealion clusters`: every context of a kubeconfig (as `get kubeconfig --all-clusters` writes them), and whether
// each cluster answers the user now. It asks each cluster's own API server who the user is (SelfSubjectReview), so
// a cluster whose agent holds no tunnel shows the proxy's reason, and a refused login shows as such.
import { Command, Option } from 'commander';
import { closeHttpsPools, HttpsError } from '../lib/https-client.ts';
import { statusMessageOf } from '../lib/kube/status.ts';
import { printable, printableJSON } from './printable.ts';
import { loginFirst, postAsKubeconfig } from './whoami.ts';

export interface ClusterState {
  context: string;
  server: string;
  /** Ready, NotConnected, Unauthorized, Forbidden, Unreachable or Error. */
  state: string;
  /** The user the cluster sees when Ready; otherwise why it is not. */
  detail: string;
}

function stateOf(err: unknown): Pick<ClusterState, 'state' | 'detail'> {
  if (err instanceof HttpsError && err.code === 'BadStatus') {
    const detail = statusMessageOf(err.body) ?? err.message;
    if (err.status === 401) return { state: 'Unauthorized', detail };
    if (err.status === 403) return { state: 'Forbidden', detail };
    if (err.status === 503) return { state: 'NotConnected', detail };
    return { state: 'Error', detail };
  }
  if (err instanceof HttpsError && (err.code === 'Network' || err.code === 'Timeout'))
    return { state: 'Unreachable', detail: err.message };
  return { state: 'Error', detail: (err as Error).message };
}

export async function listClusters(kubeconfig: string): Promise<ClusterState[]> {
  const { loadKubeConfig } = await import('../lib/kube/kube.ts');
  const source = kubeconfig ? { path: kubeconfig } : { default: true as const };
  const all = loadKubeConfig(source);
  const contexts = all.getContexts();
  // Each user logs in once, one after another, where the person can see the prompt; the probes then run at once
  // on the cached credentials. A login that fails is left for that user's probes to report.
  for (const user of new Set(contexts.map((c) => c.user))) {
    const context = contexts.find((c) => c.user === user)!;
    all.setCurrentContext(context.name);
    await loginFirst(all).catch(() => {});
  }
  return Promise.all(
    contexts.map(async ({ name }): Promise<ClusterState> => {
      // A config of its own per context: switching one shared config while the others are being asked would race.
      const config = loadKubeConfig(source);
      config.setCurrentContext(name);
      const server = config.getCurrentCluster()?.server ?? '';
      try {
        // Bounded by the HTTPS client's deadline, and the exec plugin's own (a first login may wait for a person).
        const answer = (await postAsKubeconfig(config, 'apis/authentication.k8s.io/v1/selfsubjectreviews', {
          apiVersion: 'authentication.k8s.io/v1',
          kind: 'SelfSubjectReview',
        })) as { status?: { userInfo?: { username?: string } } };
        return { context: name, server, state: 'Ready', detail: answer.status?.userInfo?.username ?? '' };
      } catch (err) {
        return { context: name, server, ...stateOf(err) };
      }
    }),
  );
}

/** Columns padded to their widest cell, as kubectl prints tables. */
export function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)));
  return (
    rows
      .map((r) =>
        r
          .map((cell, i) => cell.padEnd(widths[i]!))
          .join('   ')
          .trimEnd(),
      )
      .join('\n') + '\n'
  );
}

export function clustersCommand(): Command {
  return new Command('clusters')
    .description("list the kubeconfig's clusters and whether each answers you now")
    .option('--kubeconfig <path>', 'kubeconfig (default: $KUBECONFIG or ~/.kube/config)', '')
    .addOption(new Option('-o, --output <format>', 'text or json').choices(['text', 'json']).default('text'))
    .addHelpText(
      'after',
      `
Each context's cluster is asked who you are, with the context's credentials (one login serves every context that
shares its user). STATE is Ready (USER/DETAIL is the user it sees), NotConnected (the cluster's agent holds no
tunnel), Unauthorized, Forbidden, Unreachable or Error.

Examples:
  sealion get kubeconfig --all-clusters --output-file me.kubeconfig && sealion clusters --kubeconfig me.kubeconfig
  sealion clusters -o json`,
    )
    .action(async (flags: { kubeconfig: string; output: string }) => {
      const states = await listClusters(flags.kubeconfig);
      await closeHttpsPools();
      if (flags.output === 'json') return void process.stdout.write(`${printableJSON(states)}\n`);
      process.stdout.write(
        table([
          ['CONTEXT', 'STATE', 'USER/DETAIL', 'SERVER'],
          ...states.map((s) => [s.context, s.state, s.detail, s.server].map((cell) => printable(cell))),
        ]),
      );
    });
}
