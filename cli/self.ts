// How a kubeconfig runs this very CLI again: the exec entry `sealion get kubeconfig` writes. kubectl runs it for
// every command, long after this process is gone and perhaps after the CLI was upgraded, so the entry names what
// will still be there: the command on PATH when that is this CLI, else absolute paths.
import { accessSync, constants, realpathSync } from 'node:fs';
import { basename, delimiter, join } from 'node:path';
import { isSea } from 'node:sea';
import { fileURLToPath } from 'node:url';

/** A kubeconfig exec entry's `command` and `args` (before the subcommand's own arguments). */
export interface SelfCommand {
  command: string;
  args: string[];
}

/** The name the npm package installs the CLI under (its bin), and the one to give a standalone executable. */
export const COMMAND_NAME = 'sealion';
/** The name that makes it a kubectl plugin: kubectl runs `kubectl-sealion` for `kubectl sealion` (krew installs it so). */
export const PLUGIN_COMMAND_NAME = 'kubectl-sealion';
/**
 * The name under which kubectl (1.26 and later) asks a plugin for completions: it runs `kubectl_complete-sealion` with
 * the words after `kubectl sealion`, and reads cobra's `__complete` answer.
 */
export const PLUGIN_COMPLETION_NAME = 'kubectl_complete-sealion';

/**
 * The file name this process was started as, without a script's extension. Node keeps the script's path as it was
 * given (a symlink's own name), and a standalone executable gets its own argv[0] in argv[1]: so a symlink or copy
 * named kubectl-sealion says so here.
 */
export function invokedName(argv: readonly string[] = process.argv): string {
  return basename(argv[1] ?? '').replace(/\.(?:[cm]?js|ts|exe)$/, '');
}

/**
 * What help and usage call this command: `kubectl sealion` when kubectl runs it as a plugin (its file is named
 * kubectl-sealion; kubectl before 1.12 said so in KUBECTL_PLUGINS_CALLER instead), else `sealion`.
 */
export function displayName(argv: readonly string[], env: NodeJS.ProcessEnv): string {
  const name = invokedName(argv);
  return name === PLUGIN_COMMAND_NAME || name === PLUGIN_COMPLETION_NAME || env['KUBECTL_PLUGINS_CALLER']
    ? 'kubectl sealion'
    : COMMAND_NAME;
}

/** How this copy of the CLI runs: from the TypeScript sources, a bundle run by Node, or a standalone executable. */
export type SelfKind = 'checkout' | 'bundle' | 'executable';

/**
 * How this copy runs. The checkout runs this module's own TypeScript (its URL ends in .ts); a bundle
 * (dev/build-cli.ts) carries it inside a .mjs or .cjs file, and a standalone executable carries a bundle.
 */
export function selfKind(): SelfKind {
  if (isSea()) return 'executable';
  // A CommonJS bundle defines import.meta.url as its own file's URL too (dev/build-cli.ts).
  return import.meta.url.endsWith('.ts') ? 'checkout' : 'bundle';
}

/** The file that `command` is when it is found in one of `path`'s folders, else undefined. */
function onPath(command: string, path: string): string | undefined {
  for (const dir of path.split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, command);
    try {
      accessSync(candidate, constants.X_OK);
      return realpathSync(candidate);
    } catch {
      // Not in this folder: kubectl, like a shell, goes on to the next.
    }
  }
  return undefined;
}

/**
 * How to run this CLI from a kubeconfig (`env` stands for process.env; its PATH is consulted):
 * - an installed one, that is when the first `sealion` on PATH is this very file (the npm package's bin, or a
 *   standalone executable put on PATH as `sealion`): `sealion`, found through PATH, so that the kubeconfig outlives
 *   upgrades of the CLI and of Node (whose path changes with each version under nvm or Homebrew); else, when the
 *   first `kubectl-sealion` on PATH is this file (the kubectl plugin, as krew installs it): `kubectl-sealion`, since
 *   krew keeps each version in a folder of its own and deletes the old one on upgrade, and only the link on PATH
 *   stays. Not `kubectl sealion`: kubectl would start twice for every command;
 * - a standalone executable elsewhere: its absolute path;
 * - a bundle elsewhere: the Node running it and the bundle's absolute path;
 * - the checkout: the Node running it and bin/sealion.js, which turns the compile cache on before any TypeScript
 *   loads (started as cli/main.ts, the CLI would strip that file's types at every start). Never through PATH,
 *   even when `npm link` put bin/sealion.js there: its `#!/usr/bin/env node` finds whichever Node comes first,
 *   perhaps one older than the Node 24 the TypeScript sources need.
 */
export function selfCommand(env: NodeJS.ProcessEnv): SelfCommand {
  const kind = selfKind();
  if (kind === 'checkout')
    return {
      command: process.execPath,
      args: [fileURLToPath(new URL('../bin/sealion.js', import.meta.url))],
    };
  // A bundle is only ever started as `node <bundle>` or through the package's bin link to it.
  const file = realpathSync(kind === 'executable' ? process.execPath : process.argv[1]!);
  for (const name of [COMMAND_NAME, PLUGIN_COMMAND_NAME])
    if (onPath(name, env['PATH'] ?? '') === file) return { command: name, args: [] };
  return kind === 'executable' ? { command: file, args: [] } : { command: process.execPath, args: [file] };
}

/** What kubectl prints when it cannot start `self.command`: how to get the CLI back. */
export function installHint(self: SelfCommand): string {
  if (self.command === PLUGIN_COMMAND_NAME)
    return (
      `This kubeconfig runs the Sealion CLI as the kubectl plugin ${PLUGIN_COMMAND_NAME}. Install it: kubectl krew ` +
      `install with the sealion.yaml manifest, or a standalone sealion-<os>-<arch> executable on your PATH named ` +
      `${PLUGIN_COMMAND_NAME}`
    );
  const what =
    self.command === COMMAND_NAME ? `the ${COMMAND_NAME} command` : [self.command, ...self.args].join(' ');
  return (
    `This kubeconfig runs the Sealion CLI (${what}). Install it: npm install -g with the sealion-cli package, or ` +
    `a standalone sealion-<os>-<arch> executable on your PATH named ${COMMAND_NAME}; then run ` +
    `${COMMAND_NAME} get kubeconfig again if it lives elsewhere now`
  );
}
