// `sealion auth can-i VERB RESOURCE[/NAME] --all-clusters`: kubectl auth can-i asked of every context of the
// kubeconfig at once. Each cluster gets a SelfSubjectAccessReview through the proxy, so the cluster itself answers
// for the user Sealion forwards as there (through its agent's tunnel, and a peer hop when another replica holds it),
// with the question built as kubectl builds it from that cluster's own discovery.
import { Command, Option } from 'commander';
import { closeHttpsPools } from '../lib/https-client.ts';
import { discover, resolveResource } from './discovery.ts';
import { UserError } from './errors.ts';
import {
  askFleet,
  checkFleetChoice,
  clusterTimeoutMs,
  fleetOf,
  progressLine,
  withFleetOptions,
  type FleetFlags,
  type FleetMember,
} from './fleet.ts';
import { printable, printableJSON } from './printable.ts';
import { postAsKubeconfig, printableDeep, table } from './whoami.ts';

export interface CanIFlags extends FleetFlags {
  allNamespaces: boolean;
  subresource: string;
  output: 'table' | 'json' | 'yaml';
}

/** What is asked, before a cluster's discovery names the resource's group: the words as given. */
export interface Question {
  verb: string;
  /** A non-resource URL (`/healthz`), or a resource type as given (`pods`, `deployments.apps`, `*`). */
  what: string;
  name: string;
  subresource: string;
}

/** The SelfSubjectAccessReview spec kubectl auth can-i sends. */
export interface ReviewSpec {
  resourceAttributes?: {
    namespace: string;
    verb: string;
    group: string;
    resource: string;
    subresource: string;
    name: string;
  };
  nonResourceAttributes?: { path: string; verb: string };
}

/** VERB (or several, apart by commas: no verb has one) and TYPE[/NAME] or a URL: a question per verb. */
export function questionsOf(verbs: string, target: string, subresource: string): Question[] {
  const each = verbs.split(',').map((v) => v.trim());
  if (each.some((v) => !v))
    throw new UserError(
      `auth can-i: "${printable(verbs)}" names an empty verb; give verbs as get or get,list,delete`,
    );
  return [...new Set(each)].map((verb) => questionOf(verb, target, subresource));
}

/** VERB and TYPE[/NAME] or a URL, checked as kubectl checks them. */
export function questionOf(verb: string, target: string, subresource: string): Question {
  if (target.startsWith('/')) {
    if (subresource)
      throw new UserError(
        `auth can-i: --subresource does not go with a URL (${printable(target)}); drop one`,
      );
    return { verb, what: target, name: '', subresource: '' };
  }
  const slash = target.indexOf('/');
  const what = slash < 0 ? target : target.slice(0, slash);
  const name = slash < 0 ? '' : target.slice(slash + 1);
  if (!what)
    throw new UserError(`auth can-i: no resource type in ${printable(target)}; give one such as pods/web`);
  return { verb, what, name, subresource };
}

/**
 * The review for `question` on one cluster, as kubectl builds it: `*` as it is; else the type this cluster's discovery
 * resolves (kubectl's RESTMapper), else the words as given, with a warning (kubectl warns, and asks all the same).
 */
export function reviewSpec(
  question: Question,
  namespace: string,
  resolve: (what: string) => { group: string; resource: string } | undefined,
): { spec: ReviewSpec; warning?: string } {
  if (question.what.startsWith('/'))
    return { spec: { nonResourceAttributes: { path: question.what, verb: question.verb } } };
  const found = question.what === '*' ? { group: '', resource: '*' } : resolve(question.what);
  const attributes = {
    namespace,
    verb: question.verb,
    group: found?.group ?? '',
    resource: found?.resource ?? question.what,
    subresource: question.subresource,
    name: question.name,
  };
  return {
    spec: { resourceAttributes: attributes },
    ...(found ? {} : { warning: `the server doesn't have a resource type "${question.what}"` }),
  };
}

/** One cluster's answer to one verb: yes or no with the cluster's reason, or why it could not answer. */
export interface CanIAnswer {
  context: string;
  verb: string;
  /** Answered, or the state of a cluster that did not (NotConnected, Unauthorized, Forbidden, Unreachable, Error). */
  state: string;
  allowed: boolean;
  /** The authorizer's reason; for a cluster that did not answer, why. */
  reason: string;
  denied?: boolean;
  evaluationError?: string;
  warning?: string;
}

interface ReviewStatus {
  status?: { allowed?: boolean; denied?: boolean; reason?: string; evaluationError?: string };
}

/** Asks one cluster each question (one discovery for all of them, the reviews at once). */
async function askOne(
  member: FleetMember,
  questions: Question[],
  flags: Pick<CanIFlags, 'namespace' | 'allNamespaces'>,
  signal: AbortSignal,
): Promise<Omit<CanIAnswer, 'context' | 'state'>[]> {
  const namespace = flags.allNamespaces
    ? ''
    : flags.namespace || member.config.getContextObject(member.context)?.namespace || 'default';
  const { what } = questions[0]!;
  const resources = !what.startsWith('/') && what !== '*' ? await discover(member.config, signal) : [];
  return Promise.all(
    questions.map(async (question) => {
      const { spec, warning } = reviewSpec(question, namespace, (w) => resolveResource(w, resources));
      const review = (await postAsKubeconfig(
        member.config,
        'apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
        { apiVersion: 'authorization.k8s.io/v1', kind: 'SelfSubjectAccessReview', spec },
        signal,
      )) as ReviewStatus;
      const status = review.status ?? {};
      return {
        verb: question.verb,
        allowed: status.allowed === true,
        reason: typeof status.reason === 'string' ? status.reason : '',
        ...(status.denied === true ? { denied: true } : {}),
        ...(typeof status.evaluationError === 'string' && status.evaluationError
          ? { evaluationError: status.evaluationError }
          : {}),
        ...(warning ? { warning } : {}),
      };
    }),
  );
}

/**
 * Every cluster's answer to each question, in the order of the kubeconfig's contexts; a cluster that did not answer
 * has its state as the answer to each.
 */
export async function canIAcrossFleet(
  flags: CanIFlags,
  questions: Question[],
  progress: (answered: number, of: number) => void = () => {},
): Promise<CanIAnswer[]> {
  const members = await fleetOf(flags);
  const answers = await askFleet(
    members,
    clusterTimeoutMs(flags.clusterTimeout),
    (member, signal) => askOne(member, questions, flags, signal),
    progress,
  );
  return answers.flatMap((a) =>
    a.ok
      ? a.answer.map((answer) => ({ context: a.member.context, state: 'Answered', ...answer }))
      : questions.map(({ verb }) => ({
          context: a.member.context,
          verb,
          state: a.failure.state,
          allowed: false,
          reason: a.failure.detail,
        })),
  );
}

/** An answer's cell: yes, no, or the state of a cluster that did not answer. */
const cell = (a: CanIAnswer): string => (a.state === 'Answered' ? (a.allowed ? 'yes' : 'no') : a.state);

/** What REASON says: the authorizer's reason, its evaluation error, the warning; or why the cluster did not answer. */
const reasonOf = (a: CanIAnswer): string =>
  printable(
    [a.reason, a.evaluationError, a.warning ? `warning: ${a.warning}` : ''].filter(Boolean).join(' - '),
  );

/**
 * The matrix: a row per cluster. One verb: its ANSWER (yes, no, or the state of a cluster that did not answer) and
 * the cluster's REASON. Several: a column per verb, and REASON only for a cluster that did not answer, or a warning.
 */
export function canITable(answers: CanIAnswer[]): string {
  const verbs = [...new Set(answers.map((a) => a.verb))];
  if (verbs.length > 1) {
    const contexts = [...new Set(answers.map((a) => a.context))];
    return table([
      ['CLUSTER', ...verbs.map((v) => printable(v).toUpperCase()), 'REASON'],
      ...contexts.map((context) => {
        const row = answers.filter((a) => a.context === context);
        const first = row[0]!;
        return [
          printable(context),
          ...verbs.map((v) => {
            const a = row.find((r) => r.verb === v);
            return a ? cell(a) : '';
          }),
          first.state !== 'Answered'
            ? reasonOf(first)
            : first.warning
              ? `warning: ${printable(first.warning)}`
              : '',
        ];
      }),
    ]);
  }
  return table([
    ['CLUSTER', 'ANSWER', 'REASON'],
    ...answers.map((a) => [printable(a.context), cell(a), reasonOf(a)]),
  ]);
}

/**
 * What the run ends with: nothing when every cluster said yes; `{ no: true }` when every cluster answered and some
 * said no (exit 1 and nothing more, as kubectl auth can-i); the one error line when a cluster did not answer.
 */
export function canIVerdict(answers: CanIAnswer[]): { no?: true; failure?: string } {
  const states = new Map(answers.map((a) => [a.context, a.state]));
  const failed = [...states].filter(([, state]) => state !== 'Answered');
  if (failed.length > 0)
    return {
      failure: `auth can-i: ${failed.length} of ${states.size} ${states.size === 1 ? 'cluster' : 'clusters'} did not answer (${failed
        .map(([context, state]) => `${printable(context)}: ${state}`)
        .join(', ')}); see each reason above; sealion clusters shows which clusters answer you now`,
    };
  return answers.every((a) => a.allowed) ? {} : { no: true };
}

export function authCommand(): Command {
  const auth = new Command('auth').description('ask every cluster what you may do');
  withFleetOptions(
    auth
      .command('can-i')
      .description('ask every cluster whether you may VERB RESOURCE, each answering for itself')
      .argument(
        '<verb>',
        'get, list, watch, create, update, patch, delete, escalate, bind, impersonate, or *; several apart by commas',
      )
      .argument('<resource>', 'TYPE, TYPE/NAME or a URL: pods, deployments.apps/web, *, /healthz'),
  )
    .option('-A, --all-namespaces', 'in every namespace', false)
    .option('--subresource <name>', 'a subresource: log, exec, status, scale', '')
    .addOption(
      new Option('-o, --output <format>', 'table, json or yaml')
        .choices(['table', 'json', 'yaml'])
        .default('table'),
    )
    .addHelpText(
      'after',
      `
Each context of the kubeconfig (as sealion get kubeconfig --all-clusters writes them) gets a SelfSubjectAccessReview
through the proxy, so each cluster answers for itself, through its agent and any peer hop. The resource is resolved
in each cluster's own discovery as kubectl resolves it, and asked as given where a cluster does not have it (with a
warning in REASON). ANSWER is yes, no, or the state of a cluster that did not answer (NotConnected, Unauthorized,
Forbidden, Unreachable, Error). Several verbs (get,list,delete) make a matrix: a column per verb.

The exit status is 0 when every cluster answered yes; 1 when any answered no (as kubectl auth can-i), and 1 with an
error line when any did not answer.

Examples:
  sealion auth can-i list pods --all-clusters -n shop
  sealion auth can-i create deployments.apps --all-clusters -A
  sealion auth can-i get,list,delete configmaps --all-clusters -n shop
  sealion auth can-i get pods/web --subresource log --all-clusters -n shop
  sealion auth can-i get /healthz --all-clusters -o json`,
    )
    .action(async (verb: string, target: string, flags: CanIFlags) => {
      checkFleetChoice(flags, 'auth can-i', 'kubectl auth can-i');
      const questions = questionsOf(verb, target, flags.subresource);
      const progress = progressLine(process.stderr);
      let answers: CanIAnswer[];
      try {
        answers = await canIAcrossFleet(flags, questions, progress.show);
      } finally {
        progress.clear();
        await closeHttpsPools();
      }
      if (flags.output === 'json') process.stdout.write(`${printableJSON(answers)}\n`);
      else if (flags.output === 'yaml')
        process.stdout.write((await import('yaml')).stringify(printableDeep(answers)));
      else process.stdout.write(canITable(answers));
      const verdict = canIVerdict(answers);
      if (verdict.failure) throw new UserError(verdict.failure);
      if (verdict.no) process.exitCode = 1;
    });
  return auth;
}
