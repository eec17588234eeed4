#!/usr/bin/env node
// The `sealion` command from the checkout. Node 24 runs the TypeScript sources directly (type stripping), so there is
// no build step.
//
// This file is plain JavaScript that an old Node parses: no import statement (Node 20 fails to link
// `enableCompileCache`, which it lacks, before a line runs) and no top-level await. So an older Node, the machine's
// own found first on PATH, reaches the version check and says in one line what to do, not a stack trace.
//
// kubectl runs the CLI for every command, so the compile cache (see cli/main.ts) is on before the first TypeScript
// file loads: a cached file is neither stripped nor compiled again, and a run that strips nothing never loads the
// stripper (a WebAssembly module, tens of milliseconds). Same folder as cli/main.ts uses.

/* global process -- Node's, in every version: this file imports nothing before the check. */

/** The Node the sources need: package.json's engines.node (cli/checkout.test.ts keeps the two equal). */
const NEEDED_NODE_MAJOR = 24;

if (Number(process.versions.node.split('.')[0]) < NEEDED_NODE_MAJOR) {
  process.stderr.write(
    `sealion: cannot run on Node ${process.version} (${process.execPath}): the CLI needs Node ` +
      `${NEEDED_NODE_MAJOR} or later; run npm ci in the checkout, which installs Node ${NEEDED_NODE_MAJOR} into ` +
      'node_modules, then run the CLI as npx sealion, or as sealion after npm run shim\n',
  );
  process.exitCode = 1;
} else {
  Promise.all([import('node:module'), import('node:os'), import('node:path')])
    .then(([{ enableCompileCache }, { homedir }, { join }]) => {
      enableCompileCache(
        join(process.env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'sealion', 'node-compile-cache'),
      );
      return import('../cli/main.ts');
    })
    .catch((err) => {
      // A checkout that cannot load (a file missing, a syntax error): cli/main.ts handles everything after it loaded.
      const why = err instanceof Error ? err.message : String(err);
      process.stderr.write(`sealion: cannot load the CLI from ${import.meta.dirname}: ${why}\n`);
      process.exitCode = 1;
    });
}
