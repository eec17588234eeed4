// `npm run shim` (and `npm start`): the `sealion` command for people working in the checkout, a small script in
// .sealion/bin/ that runs bin/sealion.js with the Node 24 that runs this (node_modules' own, under npm). `npx sealion`
// runs the same file through npm, which starts on the machine's Node and reads the whole dependency tree first: that
// costs seconds a command, and under an older Node npm prints its EBADENGINE and update notices when the output is
// not a terminal. With the folder on PATH the command is also named `sealion`, the name completion registers.
import { chmodSync, mkdirSync, renameSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { privatePath } from './cache.ts';
import { REPO_ROOT } from './build.ts';

/**
 * One word for a POSIX shell (and fish): as it is when it holds no special character, else in single quotes, with a quote inside written as '\''. shell-quote's quote()
 * escapes backslashes inside single quotes, where sh keeps them as they are.
 */
const sq = (word: string): string =>
  /^[\w./@%+=:,-]+$/.test(word) ? word : `'${word.replace(/'/g, `'\\''`)}'`;

/**
 * Where the shim goes: beside `npm start`'s kubeconfigs, in a folder git ignores. Not .cache/, which worktrees may
 * share through a link: the shim names its own checkout.
 */
export const SHIM_DIR = join(REPO_ROOT, '.sealion/bin');

/**
 * Writes `<dir>/sealion`, a POSIX shell script that execs `node` with the checkout's bin/sealion.js and the
 * arguments it got; returns its path. Absolute paths: it works from any folder, and a checkout that moves needs it
 * written again (each `npm start` does). The file is replaced whole, so a run that starts meanwhile sees the old or
 * the new one.
 */
export function writeShim(dir = SHIM_DIR, node = process.execPath): string {
  const file = join(dir, 'sealion');
  mkdirSync(dir, { recursive: true });
  const tmp = privatePath(file);
  writeFileSync(
    tmp,
    `#!/bin/sh\n# The sealion CLI from ${REPO_ROOT.replace(/\n/g, ' ')} (written by npm start and npm run shim).\n` +
      `exec ${sq(node)} ${sq(join(REPO_ROOT, 'bin/sealion.js'))} "$@"\n`,
  );
  chmodSync(tmp, 0o755);
  renameSync(tmp, file);
  return file;
}

/** The shells whose completion lines shimLines knows; others get bash's. */
const SHELLS = ['bash', 'zsh', 'fish'] as const;

/**
 * How to put the shim's folder on PATH and turn completion on, in the user's shell (`$SHELL`; bash when it is none of
 * bash, zsh or fish): one command a line.
 */
export function shimLines(dir: string, shellPath = process.env['SHELL'] ?? ''): string[] {
  const shell = SHELLS.find((s) => s === basename(shellPath)) ?? 'bash';
  if (shell === 'fish') return [`fish_add_path --path ${sq(dir)}`, 'sealion completion fish | source'];
  return [`export PATH=${sq(dir)}:"$PATH"`, `source <(sealion completion ${shell})`];
}

if (process.argv[1] === import.meta.filename) {
  const shim = writeShim();
  console.log(`Wrote ${shim}: the sealion CLI of this checkout on Node ${process.versions.node}, without npm in between
(npx sealion works too, seconds slower). To run it as sealion, with completion, in this shell and in your shell's
startup file:`);
  for (const line of shimLines(SHIM_DIR)) console.log(`  ${line}`);
}
