#!/usr/bin/env node
// The `sealion` command. Node 24 runs the TypeScript sources directly (type stripping), so there is no build step.
import '../cli/main.ts';
