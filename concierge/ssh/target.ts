// What an SSH user names, read strictly: the target of `ssh user@hub <cluster>/<namespace>/<pod>[/<container>] [--]
// [command args…]`, and the destination of `ssh -L <port>:<cluster>/<namespace>/<svc|pod>/<name>:<port>`. Every
// name is checked as the API server checks it before it becomes part of a path.
import { parse as parseShellWords } from 'shell-quote';
import { isDNSLabel, isDNSSubdomain } from '../../apis/names.ts';
import type { ReachTarget } from '../../lib/reach/target.ts';
import type { ContainerRef } from './containers.ts';

/** A command line longer than this is refused (the API server bounds a request's URL too). */
const MAX_COMMAND_BYTES = 16 * 1024;

export interface ExecRequest {
  target: ContainerRef;
  /** The command to run; empty: an interactive shell. */
  argv: string[];
}

/** Why the parts of `<cluster>/<namespace>/<pod>[/<container>]` are no names; undefined when they are. */
export function containerProblem(ref: ContainerRef): string | undefined {
  if (!isDNSLabel(ref.cluster)) return `"${ref.cluster.slice(0, 64)}" is not a cluster name`;
  if (!isDNSLabel(ref.namespace)) return `"${ref.namespace.slice(0, 64)}" is not a namespace name`;
  if (!isDNSSubdomain(ref.pod)) return `"${ref.pod.slice(0, 64)}" is not a pod name`;
  if (ref.container && !isDNSLabel(ref.container))
    return `"${ref.container.slice(0, 64)}" is not a container name`;
  return undefined;
}

/** `<cluster>/<namespace>/<pod>[/<container>]` as a container, or why it is not one. */
export function parseContainer(text: string): ContainerRef | { problem: string } {
  const parts = text.split('/');
  if (parts.length < 3 || parts.length > 4)
    return { problem: `"${text.slice(0, 128)}" is not <cluster>/<namespace>/<pod>[/<container>]` };
  const [cluster, namespace, pod, container] = parts as [string, string, string, string | undefined];
  const ref = { cluster, namespace, pod, container: container ?? '' };
  const problem = containerProblem(ref);
  return problem ? { problem } : ref;
}

/** Whether every quote `text` opens is closed, as a POSIX shell reads quotes (shell-quote takes an open one as closed). */
function quotesBalance(text: string): boolean {
  let quote: "'" | '"' | undefined;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (quote === "'") {
      if (c === "'") quote = undefined;
    } else if (c === '\\') i++;
    else if (quote === '"') {
      if (c === '"') quote = undefined;
    } else if (c === "'" || c === '"') quote = c;
  }
  return quote === undefined;
}

/**
 * An SSH exec request's command: the target, then the command to run there. SSH sends the command as one string
 * (the client joins its arguments with spaces), which a server's shell would split; here no shell runs, so it is
 * split by the shell's quoting rules, and shell syntax that would need one (pipes, redirections, globs) is refused
 * with how to ask a shell in the container for it. `$` is kept as written.
 */
export function parseExecCommand(command: string): ExecRequest | CommandProblem {
  if (Buffer.byteLength(command) > MAX_COMMAND_BYTES) return { problem: 'the command is too long' };
  const trimmed = command.trim();
  const space = trimmed.search(/\s/);
  const targetText = space === -1 ? trimmed : trimmed.slice(0, space);
  const target = parseContainer(targetText);
  if ('problem' in target) return { ...target, usage: true };
  const rest = space === -1 ? '' : trimmed.slice(space).trim();
  if (!quotesBalance(rest)) return { problem: 'the command has a quote that is never closed' };
  let words: ReturnType<typeof parseShellWords>;
  try {
    words = parseShellWords(rest, (name) => `$${name}`);
  } catch {
    return { problem: 'the command could not be read' };
  }
  const argv: string[] = [];
  for (const word of words) {
    if (typeof word !== 'string') {
      const op = 'op' in word ? (word.op === 'glob' ? word.pattern : word.op) : '#';
      return { problem: `"${op}" needs a shell, and none runs here; ${askTheShell(targetText, rest)}` };
    }
    argv.push(word);
  }
  if (argv[0] === '--') argv.shift();
  return { target, argv };
}

/** Why a command cannot run; `usage`: the target itself is wrong, and the ways to name one help. */
export interface CommandProblem {
  problem: string;
  usage?: boolean;
}

/**
 * How to have the container's shell run `command`, as the person types it: ssh joins its words with spaces before
 * the door splits them, so the shell's command must be quoted once more than on a shell's own command line. The
 * person's own command is shown when single quotes can hold it as it is.
 */
function askTheShell(targetText: string, rest: string): string {
  const command = rest.replace(/^--\s*/, '');
  // Inside the double quotes the person's own shell still reads $, `, \ and ", and inside the single ones the
  // container's would end at a '.
  const quoted = /['"$`\\]/.test(command) || command === '' ? '<command>' : command;
  return `ask the container's, quoting the command once more for ssh: ssh <host> ${targetText} -- "sh -c '${quoted}'"`;
}

/** The kinds a forward may name, as people write them. */
const FORWARD_KINDS: Record<string, ReachTarget['kind']> = {
  svc: 'services',
  service: 'services',
  services: 'services',
  pod: 'pods',
  pods: 'pods',
};

/** `-L`'s destination `<cluster>/<namespace>/<svc|pod>/<name>` and port, or why it is not one. */
export function parseForward(
  host: string,
  port: number,
): { cluster: string; target: ReachTarget } | { problem: string } {
  const parts = host.split('/');
  const kind = Object.hasOwn(FORWARD_KINDS, parts[2] ?? '') ? FORWARD_KINDS[parts[2]!] : undefined;
  if (parts.length !== 4 || !kind)
    return {
      problem: `"${host.slice(0, 128)}" is not <cluster>/<namespace>/svc/<name> or <cluster>/<namespace>/pod/<name>`,
    };
  const [cluster, namespace, , name] = parts as [string, string, string, string];
  if (!isDNSLabel(cluster)) return { problem: `"${cluster.slice(0, 64)}" is not a cluster name` };
  if (!isDNSLabel(namespace)) return { problem: `"${namespace.slice(0, 64)}" is not a namespace name` };
  if (kind === 'services' ? !isDNSLabel(name) : !isDNSSubdomain(name))
    return { problem: `"${name.slice(0, 64)}" is not a ${kind === 'services' ? 'Service' : 'pod'} name` };
  if (!Number.isInteger(port) || port < 1 || port > 65535) return { problem: `port ${port} is not a port` };
  return { cluster, target: { namespace, kind, name, port } };
}
