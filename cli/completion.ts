// Shell completion: `sealion completion bash|zsh|fish` prints a script for the shell, and the script asks the CLI
// itself what may come next: it runs `sealion __complete WORD...` with the line's words up to the cursor (the last one
// the word being completed, empty after a space), and the CLI answers in cobra's protocol, one candidate a line
// (`value<TAB>description`) and then `:<directive>`. kubectl (1.26 and later) asks a plugin the same way, through
// an executable named kubectl_complete-sealion, so the one answer serves `kubectl sealion` too.
//
// The answer is read off the commander tree the CLI runs (subcommands, options, their choices and placeholders), so
// a new command or option completes without an edit here. Names that live in a cluster (agent-backed Clusters,
// authenticators, recordings, access requests) are asked of the API server the kubeconfig in effect names, with a short deadline: a
// shell must never hang on a TAB, and any failure is silently no names at all.
//
// Why our own scripts rather than a library's: @bomb.sh/tab's engine calls its value handlers synchronously (no API
// call can answer), and its bash script needs bash-completion's _get_comp_words_by_ref and never falls back to file
// names; @pnpm/tabtab reads its script templates from files beside its own module, which a single-file bundle and the
// standalone executables do not have, and splits the line at spaces. The protocol is cobra's, so that kubectl's
// plugin completion can use the same answers.
import { homedir } from 'node:os';
import type { Argument, Command, Option } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import { selfKind } from './self.ts';

/** The hidden subcommand the scripts run (cobra's name for it). */
export const COMPLETE_COMMAND = '__complete';
export const SHELLS = ['bash', 'zsh', 'fish'] as const;
export type Shell = (typeof SHELLS)[number];

/** Cobra's directives, a bit mask on the answer's last line: what the shell does besides offering the candidates. */
export const Directive = {
  /** Something failed: offer nothing. */
  Error: 1,
  NoSpace: 2,
  /** Offer no file names, even when there is no candidate. */
  NoFileComp: 4,
  FilterFileExt: 8,
  /** Offer directory names (the candidates, if any, are ignored). */
  FilterDirs: 16,
  KeepOrder: 32,
  /** The candidates, else file names. */
  Default: 0,
} as const;

export interface Candidate {
  value: string;
  description?: string;
}

export interface Answer {
  candidates: Candidate[];
  directive: number;
}

/** Kinds of names an option or argument takes whose values a cluster or the kubeconfig knows. */
export type NameKind = 'cluster' | 'authenticator' | 'context' | 'recording' | 'request';

const nameKinds = new WeakMap<Option | Argument, NameKind>();

/**
 * Marks `what` (an option or an argument of a command) as taking names of `kind`, which completion then offers.
 * Returns `what`, for use inside a command's definition.
 */
export function takesNames<T extends Option | Argument>(kind: NameKind, what: T): T {
  nameKinds.set(what, kind);
  return what;
}

/** What the line gave so far, by the options' attribute names (`--group-suffix x` gives groupSuffix: 'x'). */
export type GivenValues = ReadonlyMap<string, string>;

/** Looks names of `kind` up, as the options given on the line say where (kubeconfig, context, group suffix). */
export type NameLookup = (kind: NameKind, given: GivenValues) => Promise<Candidate[]>;

/** The option of `command` that `flag` (`--long` or `-s`) names; --help is commander's own and not in the list. */
function findOption(command: Command, flag: string): Option | undefined {
  return command.options.find((o) => o.long === flag || o.short === flag);
}

const takesValue = (option: Option): boolean => option.required || option.optional;

/** Where the word being completed stands on the line. */
type Place =
  | { kind: 'value'; owner: Option | Argument; command: Command; prefix: string }
  | { kind: 'option'; command: Command; prefix: string }
  | { kind: 'word'; command: Command; argument?: Argument; prefix: string; subcommands: boolean };

/** Reads the words before the last as commander would, and says what the last one is. */
function place(program: Command, words: readonly string[]): { at: Place; given: Map<string, string> } {
  const done = words.slice(0, -1);
  const current = words.at(-1) ?? '';
  const given = new Map<string, string>();
  const seen = new Set<Option>();
  let command = program;
  let positional = 0;
  let pending: Option | undefined;
  let literal = false;
  for (const word of done) {
    if (pending) {
      given.set(pending.attributeName(), word);
      pending = undefined;
      continue;
    }
    if (!literal && word === '--') {
      literal = true;
      continue;
    }
    if (!literal && word.startsWith('-') && word !== '-') {
      const long = word.startsWith('--');
      const eq = long ? word.indexOf('=') : -1;
      const option = findOption(command, eq > 0 ? word.slice(0, eq) : long ? word : word.slice(0, 2));
      if (!option) continue;
      seen.add(option);
      if (!takesValue(option)) continue;
      // `--flag=value`, or a short flag with its value attached (`-ojson`), else the next word.
      const attached = eq > 0 ? word.slice(eq + 1) : !long && word.length > 2 ? word.slice(2) : undefined;
      if (attached !== undefined) given.set(option.attributeName(), attached);
      else pending = option;
      continue;
    }
    // A subcommand is named only before the command's own arguments, as commander reads it.
    const sub =
      positional === 0
        ? command.commands.find((c) => c.name() === word || c.aliases().includes(word))
        : undefined;
    if (sub) {
      command = sub;
      continue;
    }
    positional++;
  }
  if (pending) {
    // Its value is the word being completed: not given yet.
    seen.delete(pending);
    return { at: { kind: 'value', owner: pending, command, prefix: current }, given: withSeen() };
  }
  if (!literal && current.startsWith('--') && current.includes('=')) {
    const eq = current.indexOf('=');
    const option = findOption(command, current.slice(0, eq));
    if (option && takesValue(option))
      return {
        at: { kind: 'value', owner: option, command, prefix: current.slice(eq + 1) },
        given: withSeen(),
      };
  }
  if (!literal && current.startsWith('-'))
    return { at: { kind: 'option', command, prefix: current }, given: withSeen() };
  const args = command.registeredArguments;
  const last = args.at(-1);
  const argument = args[positional] ?? (last?.variadic ? last : undefined);
  return {
    at: {
      kind: 'word',
      command,
      ...(argument ? { argument } : {}),
      prefix: current,
      subcommands: positional === 0,
    },
    given: withSeen(),
  };

  // Options given as flags without a value count as given too, so that they are not offered again.
  function withSeen(): Map<string, string> {
    for (const option of seen) if (!given.has(option.attributeName())) given.set(option.attributeName(), '');
    return given;
  }
}

/** A value placeholder that names a file or a folder: the shell offers those. */
function pathKind(owner: Option | Argument): 'file' | 'dir' | undefined {
  const placeholder = 'flags' in owner ? owner.flags : owner.name();
  if (/[<[](?:dir|directory)(?:\.\.\.)?[>\]]|^dir$/.test(placeholder)) return 'dir';
  if (/[<[](?:path|file)(?:\.\.\.)?[>\]]|^(?:path|file)$/.test(placeholder)) return 'file';
  return undefined;
}

const startsWith =
  (prefix: string) =>
  (c: Candidate): boolean =>
    c.value.startsWith(prefix);

/** The values an option or argument takes: its choices, names from the lookup, or file or folder names. */
async function valuesOf(
  owner: Option | Argument,
  prefix: string,
  given: GivenValues,
  lookup: NameLookup,
): Promise<Answer> {
  if (owner.argChoices)
    return {
      candidates: owner.argChoices.map((value) => ({ value })).filter(startsWith(prefix)),
      directive: Directive.NoFileComp,
    };
  const kind = nameKinds.get(owner);
  if (kind) {
    const names = await lookup(kind, given).catch(() => []);
    return { candidates: names.filter(startsWith(prefix)), directive: Directive.NoFileComp };
  }
  const path = pathKind(owner);
  if (path === 'dir') return { candidates: [], directive: Directive.FilterDirs };
  if (path === 'file') return { candidates: [], directive: Directive.Default };
  return { candidates: [], directive: Directive.NoFileComp };
}

/**
 * What may follow `words` (the words after the program's name; the last one is being completed, '' for a new word)
 * on `program`'s command line.
 */
export async function complete(
  program: Command,
  words: readonly string[],
  lookup: NameLookup,
): Promise<Answer> {
  const { at, given } = place(program, words.length > 0 ? words : ['']);
  if (at.kind === 'value') return valuesOf(at.owner, at.prefix, given, lookup);
  const help = at.command.createHelp();
  if (at.kind === 'option') {
    const candidates = help
      .visibleOptions(at.command)
      .filter((o) => o.long && !(given.has(o.attributeName()) && !o.variadic))
      .map((o) => ({ value: o.long!, description: o.description }));
    return { candidates: candidates.filter(startsWith(at.prefix)), directive: Directive.NoFileComp };
  }
  const subcommands = (at.subcommands ? help.visibleCommands(at.command) : [])
    // commander lists its implicit `help` command too; it is as much a subcommand as any.
    .map((c) => ({ value: c.name(), description: c.summary() || c.description() }))
    .filter(startsWith(at.prefix));
  if (!at.argument) return { candidates: subcommands, directive: Directive.NoFileComp };
  const values = await valuesOf(at.argument, at.prefix, given, lookup);
  return { ...values, candidates: [...subcommands, ...values.candidates] };
}

/**
 * The answer as cobra's scripts (and kubectl) read it. A value with whitespace or a control character would break
 * the line format or the shell's word: names from a cluster are the server's text, so such a value is left out.
 */
export function formatAnswer(answer: Answer): string {
  const lines = answer.candidates
    // Control characters are what this expression is about.
    // eslint-disable-next-line no-control-regex
    .filter((c) => c.value !== '' && !/[\s\x00-\x1f\x7f]/.test(c.value))
    .map((c) => {
      // eslint-disable-next-line no-control-regex
      const description = (c.description ?? '').replace(/[\x00-\x1f\x7f]+/g, ' ').trim();
      return description ? `${c.value}\t${description}` : c.value;
    });
  return [...lines, `:${answer.directive}`].join('\n') + '\n';
}

/** How long a lookup of names may take, all requests included; then there are none. */
export const LOOKUP_DEADLINE_MS = 1_500;

/** Options' values as typed: quotes around them and a leading `~/` are the shell's, which did not expand them yet. */
export function typedPath(value: string): string {
  const unquoted = /^(['"])(.*)\1$/.exec(value)?.[2] ?? value;
  return unquoted.startsWith('~/') ? `${homedir()}${unquoted.slice(1)}` : unquoted;
}

/**
 * Names from the kubeconfig in effect (`--kubeconfig` on the line, else $KUBECONFIG, else ~/.kube/config), and from
 * the cluster it names, as the current user there. Only a user whose credentials are in the kubeconfig (a client
 * certificate, a token) asks the cluster: an exec plugin or an auth provider may want a person, and a TAB must not
 * start a login.
 */
export async function lookupNames(kind: NameKind, given: GivenValues): Promise<Candidate[]> {
  const { loadKubeConfig } = await import('../lib/kube/kube.ts');
  const path = given.get('kubeconfig');
  const config = loadKubeConfig(path ? { path: typedPath(path) } : { default: true });
  const context = given.get('context');
  if (context) config.setCurrentContext(context);
  if (kind === 'context') return config.getContexts().map((c) => ({ value: c.name, description: c.cluster }));
  const fromServers =
    kind === 'cluster'
      ? config.getClusters().flatMap((c) => {
          // A kubeconfig from `get kubeconfig --cluster` or `--all-clusters` names the agent-backed clusters in its
          // servers' paths (/clusters/<name>): known without asking anyone.
          const name = /\/clusters\/([^/]+)\/?$/.exec(c.server)?.[1];
          return name ? [{ value: decodeURIComponent(name), description: 'in the kubeconfig' }] : [];
        })
      : [];
  const user = config.getCurrentUser();
  if (!config.getCurrentCluster() || user?.exec || user?.authProvider) return fromServers;
  const { kubeconfigAccess } = await import('./whoami.ts');
  const { destroyHttpsPools, httpsText } = await import('../lib/https-client.ts');
  const access = await kubeconfigAccess(config);
  const groups = apiGroups(given.get('groupSuffix') || DEFAULT_GROUP_SUFFIX);
  // Access requests live on the hub, whichever cluster the context reaches through it.
  const hub = kind === 'request' ? (await import('./version.ts')).hubBase(access.base) : access.base;
  const list = async (
    group: string,
    plural: string,
  ): Promise<{ name: string; connected: boolean; phase?: string }[]> => {
    const { text } = await httpsText(
      new URL(`apis/${group}/${VERSION}/${plural}`, hub).toString(),
      {
        timeoutMs: LOOKUP_DEADLINE_MS,
        maxBytes: 4 * 1024 * 1024,
        headers: access.headers,
        ...(access.caPem ? { caBundlePem: access.caPem } : {}),
        ...(access.clientCert ? { clientCert: access.clientCert } : {}),
      },
      'application/json',
    );
    const items = (
      JSON.parse(text) as {
        items?: { metadata?: { name?: string }; status?: { connected?: boolean; phase?: unknown } }[];
      }
    ).items;
    return (items ?? []).flatMap((i) =>
      i.metadata?.name
        ? [
            {
              name: i.metadata.name,
              connected: i.status?.connected === true,
              ...(typeof i.status?.phase === 'string' ? { phase: i.status.phase } : {}),
            },
          ]
        : [],
    );
  };
  const ask = async (): Promise<Candidate[]> => {
    if (kind === 'cluster') {
      const clusters = await list(groups.tunnel, Resource.Cluster).catch(() => []);
      const listed = clusters.map((c) => ({
        value: c.name,
        description: c.connected ? 'connected' : 'not connected',
      }));
      return [...listed, ...fromServers.filter((s) => !clusters.some((c) => c.name === s.value))];
    }
    if (kind === 'recording')
      return (await list(groups.recordings, Resource.SessionRecording)).map((r) => ({ value: r.name }));
    if (kind === 'request') {
      // A reviewer's RBAC lists everyone's; anyone's own come from selfaccessrequests, which needs none.
      const { SELF_ACCESS_REQUESTS } = await import('./request.ts');
      const [all, own] = await Promise.all([
        list(groups.access, Resource.AccessRequest).catch(() => []),
        list(groups.access, SELF_ACCESS_REQUESTS).catch(() => []),
      ]);
      const names = new Map([...all, ...own].map((r) => [r.name, r.phase]));
      return [...names].map(([value, phase]) => ({ value, ...(phase ? { description: phase } : {}) }));
    }
    const type = given.get('authenticatorType');
    const kinds = [
      ['jwt', Resource.JWTAuthenticator, 'JWTAuthenticator'],
      ['webhook', Resource.WebhookAuthenticator, 'WebhookAuthenticator'],
    ] as const;
    const found = await Promise.all(
      kinds
        .filter(([t]) => !type || type === t)
        .map(async ([, plural, description]) =>
          (await list(groups.authentication, plural).catch(() => [])).map((a) => ({
            value: a.name,
            description,
          })),
        ),
    );
    return found.flat();
  };
  // The requests' own deadline does not cover a TLS handshake that never ends (undici waits for its connect timeout,
  // 10 s): the lookup ends at the deadline whatever is under way, and the connections are destroyed.
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>(
    (done) => (timer = setTimeout(() => done(undefined), LOOKUP_DEADLINE_MS)),
  );
  try {
    return (await Promise.race([ask(), late])) ?? fromServers;
  } finally {
    clearTimeout(timer);
    await destroyHttpsPools();
  }
}

/** The name of the shell function a script defines for `command`. */
const functionName = (command: string): string => `_${command.replace(/[^A-Za-z0-9_]/g, '_')}_complete`;

/**
 * Bash (3.2 and later), without bash-completion: the line's words up to the cursor, with `--flag=value` put back
 * together (bash splits words at '=', see COMP_WORDBREAKS), go to `__complete`; the candidates become COMPREPLY. No
 * answer at all (the CLI missing, say) leaves bash's default, file names.
 */
function bashScript(command: string): string {
  const fn = functionName(command);
  return `# bash completion for ${command}. Load it with: source <(${command} completion bash)
# or save it as ~/.local/share/bash-completion/completions/${command}
${fn}() {
  local -a words=() lines=()
  local i=1 out line directive=0 cur=\${COMP_WORDS[COMP_CWORD]}
  while [ "$i" -le "$COMP_CWORD" ]; do
    if [ "\${COMP_WORDS[i]}" = "=" ] && [ \${#words[@]} -gt 0 ] && [[ \${words[\${#words[@]}-1]} == -* ]]; then
      words[\${#words[@]}-1]+="="
      if [ "$i" -lt "$COMP_CWORD" ]; then
        i=$((i + 1))
        words[\${#words[@]}-1]+="\${COMP_WORDS[i]}"
      fi
    else
      words+=("\${COMP_WORDS[i]}")
    fi
    i=$((i + 1))
  done
  [ "$cur" = "=" ] && cur=
  out=$("\${COMP_WORDS[0]/#\\~/$HOME}" ${COMPLETE_COMMAND} "\${words[@]}" 2>/dev/null) || return 0
  while IFS= read -r line; do lines+=("$line"); done <<<"$out"
  line=\${lines[\${#lines[@]}-1]}
  if [[ $line == :* ]]; then
    directive=\${line#:}
    unset "lines[\${#lines[@]}-1]"
  fi
  COMPREPLY=()
  (( directive & 1 )) && return 0
  if (( directive & 16 )); then
    type compopt >/dev/null 2>&1 && compopt -o filenames 2>/dev/null
    while IFS= read -r line; do COMPREPLY+=("$line"); done < <(compgen -d -- "$cur")
    return 0
  fi
  for line in "\${lines[@]}"; do
    [ -n "$line" ] && COMPREPLY+=("\${line%%$'\\t'*}")
  done
  if type compopt >/dev/null 2>&1; then
    (( directive & 2 )) && compopt -o nospace 2>/dev/null
    (( directive & 4 )) && compopt +o default 2>/dev/null
  fi
  return 0
}
complete -o default -F ${fn} ${command}
`;
}

/**
 * Zsh, sourced (after compinit) or autoloaded from a file named _${'<command>'} on $fpath. `compset -P '*='` leaves the
 * `--flag=` of the word alone, so the candidates are the values themselves; descriptions show beside them.
 */
function zshScript(command: string): string {
  const fn = functionName(command);
  return `#compdef ${command}
# zsh completion for ${command}. Load it with: source <(${command} completion zsh)   (after compinit)
# or save it as _${command} in a folder on $fpath.
${fn}() {
  local -a args lines described
  local out line directive=0 value
  args=("\${(@Q)words[2,CURRENT]}")
  out=$("\${(Q)words[1]}" ${COMPLETE_COMMAND} "\${args[@]}" 2>/dev/null) || { _files; return; }
  lines=("\${(@f)out}")
  if [[ \${lines[-1]} == :* ]]; then
    directive=\${lines[-1]#:}
    lines=("\${(@)lines[1,-2]}")
  fi
  (( directive & 1 )) && return 1
  [[ $PREFIX == -*=* ]] && compset -P '*='
  (( directive & 16 )) && { _files -/; return; }
  for line in "\${lines[@]}"; do
    [[ -z $line ]] && continue
    value=\${line%%$'\\t'*}
    value=\${value//:/\\\\:}
    if [[ $line == *$'\\t'* ]]; then described+=("$value:\${line#*$'\\t'}"); else described+=("$value"); fi
  done
  if (( \${#described} )); then
    if (( directive & 2 )); then _describe -t values 'value' described -S ''; else _describe -t values 'value' described; fi
    return
  fi
  (( directive & 4 )) || _files
}
if [[ \${zsh_eval_context[-1]} == loadautofunc ]]; then
  ${fn} "$@"
else
  compdef ${fn} ${command}
fi
`;
}

/**
 * Fish: the candidates keep their descriptions; fish replaces the whole token, so a `--flag=` being completed is put
 * back in front of each value.
 */
function fishScript(command: string): string {
  const fn = functionName(command);
  return `# fish completion for ${command}. Load it with: ${command} completion fish | source
# or save it as ~/.config/fish/completions/${command}.fish
function ${fn}
    set -l args (commandline -opc)
    set -l cur (commandline -ct)
    set -l out ($args[1] ${COMPLETE_COMMAND} $args[2..-1] "$cur" 2>/dev/null)
    or begin
        __fish_complete_path "$cur"
        return
    end
    set -l directive 0
    if string match -q -- ':*' "$out[-1]"
        set directive (string sub --start 2 -- "$out[-1]")
        set -e out[-1]
    end
    test (math "bitand($directive, 1)") -ne 0; and return
    set -l flag (string match -r -- '^-[^=]*=' "$cur")
    if test (math "bitand($directive, 16)") -ne 0
        __fish_complete_directories "$cur"
        return
    end
    if test (count $out) -gt 0; and test -n "$flag"
        printf '%s\\n' $flag$out
    else if test (count $out) -gt 0
        printf '%s\\n' $out
    else if test (math "bitand($directive, 4)") -eq 0
        __fish_complete_path "$cur"
    end
end
complete -c ${command} -e
complete -c ${command} -f -a '(${fn})'
`;
}

/** The completion script for `shell` that completes `command` (the name it is run as: sealion, kubectl-sealion). */
export function completionScript(shell: Shell, command: string): string {
  if (shell === 'bash') return bashScript(command);
  if (shell === 'zsh') return zshScript(command);
  return fishScript(command);
}

/** Answers `__complete WORD...` for `program` on standard output, looking names up in clusters as the line says. */
export async function answerCompletion(program: Command, words: readonly string[]): Promise<void> {
  const answer = await complete(program, words, lookupNames).catch((): Answer => ({
    candidates: [],
    directive: Directive.Error,
  }));
  // Nothing left under way (a socket, a timer) may keep the shell waiting once the answer is out.
  process.stdout.write(formatAnswer(answer), () => process.exit(0));
}

/**
 * Run through npx (npm marks what `npx` runs with npm_command=exec), the line a user completes starts with npx, and
 * the script registers `command`, which the shell may not even find: one line on standard error says how to get the
 * command itself (the script is still printed, for a user who has it elsewhere). Undefined otherwise.
 */
export function npxHint(command: string, env: NodeJS.ProcessEnv, fromCheckout: boolean): string | undefined {
  if (env['npm_command'] !== 'exec') return undefined;
  const how = fromCheckout
    ? `npm run shim in the checkout writes a ${command} command and prints how to put it on PATH`
    : `install the CLI so that ${command} is on PATH`;
  return `sealion: completion does not complete npx ${command}: the script completes the command ${command}; ${how}`;
}

/** `sealion completion bash|zsh|fish`; `command` is the name the script completes. */
export async function completionCommand(command: string): Promise<Command> {
  const { Argument, Command } = await import('commander');
  return new Command('completion')
    .description('print a script that gives your shell completion of commands, options and names')
    .addArgument(new Argument('<shell>', 'bash, zsh or fish').choices(SHELLS))
    .addHelpText(
      'after',
      `
Names of agent-backed clusters, authenticators, recordings and access requests complete from the cluster the kubeconfig in effect names
(--kubeconfig on the line, else $KUBECONFIG or ~/.kube/config), when its user's credentials are in it: a TAB never
starts a login. kubectl sealion completes through kubectl's own completion when an executable named
kubectl_complete-sealion is on PATH: a link to kubectl-sealion under that name is one.

Examples:
  source <(${command} completion bash)                # in ~/.bashrc
  source <(${command} completion zsh)                 # in ~/.zshrc, after compinit
  ${command} completion zsh > "\${fpath[1]}/_${command}"
  ${command} completion fish | source                 # or > ~/.config/fish/completions/${command}.fish`,
    )
    .action((shell: Shell) => {
      process.stdout.write(completionScript(shell, command));
      const hint = npxHint(command, process.env, selfKind() === 'checkout');
      if (hint) process.stderr.write(`${hint}\n`);
    });
}
