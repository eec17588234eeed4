#!/usr/bin/env node
// The `sealion` command. Node 24 runs the TypeScript sources directly (type stripping), so there is no build step.
// kubectl runs it for every command, so the compile cache (see cli/main.ts) is on before the first TypeScript file
// loads: a cached file is neither stripped nor compiled again, and a run that strips nothing never loads the
// stripper (a WebAssembly module, tens of milliseconds). Same folder as cli/main.ts uses.
import { enableCompileCache } from 'node:module';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { env } from 'node:process';

enableCompileCache(join(env.XDG_CACHE_HOME || join(homedir(), '.cache'), 'sealion', 'node-compile-cache'));
await import('../cli/main.ts');
