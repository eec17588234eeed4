// What the commands over many clusters share (`clusters`, `get --all-clusters`, `auth can-i --all-clusters`): the
// kubeconfig's contexts (as `get kubeconfig --all-clusters` writes them, one per cluster), one login per user, a
// fan-out with a bound and a deadline per cluster, and a failed cluster put in one state and one line.
import { Option, type Command } from 'commander';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { takesNames } from './completion.ts';
import { statusMessageOf } from '../lib/kube/status.ts';
import { errorLine, oneLine, systemReason, UserError } from './errors.ts';
import { loadKubeconfig, loginFirst, type KubeconfigFlags } from './whoami.ts';

/** The flags that choose which clusters a command over the fleet asks, and how long each may take. */
export interface FleetFlags extends KubeconfigFlags {
  context: string;
  allClusters: boolean;
  namespace: string;
  clusterTimeout: string;
}

/** The options of FleetFlags, as `get` and `auth can-i` take them. */
export function withFleetOptions(command: Command): Command {
  return command
    .option('--kubeconfig <path>', 'kubeconfig (default: $KUBECONFIG or ~/.kube/config)', '')
    .addOption(
      takesNames(
        'context',
        new Option(
          '--context <name>',
          'ask only this context (default: with --all-clusters, every context)',
        ).default(''),
      ),
    )
    .option(
      '--all-clusters',
      'every context of the kubeconfig (as sealion get kubeconfig --all-clusters writes them)',
      false,
    )
    .option('-n, --namespace <name>', "the namespace (default: the context's, else default)", '')
    .option('--cluster-timeout <seconds>', 'how long one cluster may take to answer', '20');
}

/**
 * Refuses a command over the fleet that names no clusters or names them twice. `doing` starts its error lines
 * (`get pods`); `kubectl` is the kubectl command that asks the current context alone.
 */
export function checkFleetChoice(flags: FleetFlags, doing: string, kubectl: string): void {
  if (!flags.allClusters && !flags.context)
    throw new UserError(
      `${doing}: no clusters named; pass --all-clusters for every context, or --context NAME for one (${kubectl} does the current context alone)`,
    );
  if (flags.allClusters && flags.context)
    throw new UserError(`${doing}: --all-clusters and --context exclude each other; pass one`);
}

/** One context of the kubeconfig: a cluster as a command over the fleet asks it. */
export interface FleetMember {
  /** The context's name (Sealion's are `<proxy host>/<cluster>`), which `--context` takes. */
  context: string;
  /** Whether this is the kubeconfig's current context. */
  current: boolean;
  server: string;
  /** A kubeconfig of its own, switched to this context: switching one shared config while others ask would race. */
  config: KubeConfig;
}

/**
 * Every context of the kubeconfig `flags` name (or --context's alone), each with its own config, after one login per
 * user: one after another, where the person can see the prompt, so that the fan-out then runs on cached credentials.
 * A login that fails is left for that user's requests to report.
 */
export async function fleetOf(flags: KubeconfigFlags): Promise<FleetMember[]> {
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
  for (const user of new Set(contexts.map((c) => c.user))) {
    const context = contexts.find((c) => c.user === user)!;
    all.setCurrentContext(context.name);
    await loginFirst(all).catch(() => {});
  }
  return Promise.all(
    contexts.map(async ({ name }) => {
      const config = await loadKubeconfig({ kubeconfig: flags.kubeconfig, context: name });
      return {
        context: name,
        current: name === currentName,
        server: config.getCurrentCluster()?.server ?? '',
        config,
      };
    }),
  );
}

/** How many clusters are asked at once: enough that a fleet of dozens answers in a few rounds, few enough for one
 * laptop's sockets and the hub's fair share per user. */
export const FAN_OUT = 8;

/**
 * `each` applied to every item, at most `limit` at once, the answers in the items' order. `each` must not reject
 * (each cluster's failure is its answer); a rejection would still settle every worker before it is thrown. A dozen
 * lines: the one library that does this (p-limit) is no dependency of ours.
 */
export async function fanOut<T, R>(items: T[], limit: number, each: (item: T) => Promise<R>): Promise<R[]> {
  const answers = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const at = next++;
      answers[at] = await each(items[at]!);
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, items.length) }, worker));
  return answers;
}

/** A cluster that did not answer, and why: a state a script can test and one line a person reads. */
export interface ClusterFailure {
  /** NotConnected, Unauthorized, Forbidden, Unreachable, UnknownResource or Error. */
  state: string;
  detail: string;
}

/** A resource type that one cluster's discovery does not have: shown as that cluster's state. */
export class UnknownResource extends Error {
  readonly resource: string;
  constructor(resource: string) {
    super(`the server doesn't have a resource type "${resource}"`);
    this.name = 'UnknownResource';
    this.resource = resource;
  }
}

/**
 * The state of a cluster whose request failed: the proxy's 503 for a cluster whose agent holds no tunnel is
 * NotConnected; 401 and 403 say so with the Status message; no answer (or none within `deadline`) is Unreachable.
 */
export function failureState(err: unknown, deadline?: AbortSignal): ClusterFailure {
  const e = err as { name?: unknown; code?: unknown; status?: unknown; body?: unknown };
  if (err instanceof UnknownResource) return { state: 'UnknownResource', detail: err.message };
  if (e.name === 'HttpsError' && e.code === 'BadStatus') {
    const detail =
      (typeof e.body === 'string' ? statusMessageOf(e.body) : undefined) ?? `HTTP ${String(e.status)}`;
    if (e.status === 401) return { state: 'Unauthorized', detail };
    if (e.status === 403) return { state: 'Forbidden', detail };
    if (e.status === 503) return { state: 'NotConnected', detail };
    return { state: 'Error', detail };
  }
  if ((e.name === 'HttpsError' && e.code === 'Timeout') || deadline?.aborted)
    return { state: 'Unreachable', detail: 'no answer in time' };
  if (e.name === 'HttpsError' && e.code === 'Network')
    return { state: 'Unreachable', detail: systemReason(err) ?? oneLine(err) };
  // A login that failed, a kubeconfig entry that cannot be used: the one-line error.
  return { state: 'Error', detail: errorLine(err) };
}

/**
 * Runs `ask` on every member, FAN_OUT at once, each with its own deadline (`timeoutMs` over all of that cluster's
 * requests), and turns each failure into the cluster's state; `progress` hears how many answered so far.
 */
export async function askFleet<R>(
  members: FleetMember[],
  timeoutMs: number,
  ask: (member: FleetMember, signal: AbortSignal) => Promise<R>,
  progress: (answered: number, of: number) => void = () => {},
): Promise<({ member: FleetMember } & ({ ok: true; answer: R } | { ok: false; failure: ClusterFailure }))[]> {
  let answered = 0;
  progress(0, members.length);
  return fanOut(members, FAN_OUT, async (member) => {
    const deadline = AbortSignal.timeout(timeoutMs);
    try {
      const answer = await ask(member, deadline);
      return { member, ok: true as const, answer };
    } catch (err) {
      return { member, ok: false as const, failure: failureState(err, deadline) };
    } finally {
      progress(++answered, members.length);
    }
  });
}

/** --cluster-timeout in seconds, checked: how long one cluster may take over everything it is asked. */
export function clusterTimeoutMs(text: string): number {
  const seconds = Number(text);
  if (!/^\d+(\.\d+)?$/.test(text.trim()) || !(seconds > 0) || seconds > 3600)
    throw new UserError(
      `--cluster-timeout "${text}": not a number of seconds between 0 and 3600; give one such as 20`,
    );
  return seconds * 1000;
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
