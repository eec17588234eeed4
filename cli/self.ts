// How a kubeconfig runs this very CLI again: the exec entry `sealion get kubeconfig` writes. kubectl runs it for
// every command, long after this process is gone and perhaps after the CLI was upgraded, so the entry names what
// will still be there: the command on PATH when that is this CLI, else absolute paths.
import { accessSync, constants, realpathSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { isSea } from 'node:sea';
import { fileURLToPath } from 'node:url';

/** A kubeconfig exec entry's `command` and `args` (before the subcommand's own arguments). */
export interface SelfCommand {
  command: string;
  args: string[];
}

/** The name the npm package installs the CLI under (its bin), and the one to give a standalone executable. */
export const COMMAND_NAME = 'sealion';

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
 *   upgrades of the CLI and of Node (whose path changes with each version under nvm or Homebrew);
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
  if (onPath(COMMAND_NAME, env['PATH'] ?? '') === file) return { command: COMMAND_NAME, args: [] };
  return kind === 'executable' ? { command: file, args: [] } : { command: process.execPath, args: [file] };
}

/** What kubectl prints when it cannot start `self.command`: how to get the CLI back. */
export function installHint(self: SelfCommand): string {
  const what =
    self.command === COMMAND_NAME ? `the ${COMMAND_NAME} command` : [self.command, ...self.args].join(' ');
  return (
    `This kubeconfig runs the Sealion CLI (${what}). Install it: npm install -g with the sealion-cli package, or ` +
    `a standalone sealion-<os>-<arch> executable on your PATH named ${COMMAND_NAME}; then run ` +
    `${COMMAND_NAME} get kubeconfig again if it lives elsewhere now`
  );
}
