// The main script of the standalone executables (dev/build-cli.ts bundles it as CommonJS; nothing else runs it):
// runs the CLI's bundle, which the executable carries as an asset, with V8's compiled code for it kept in the
// user's cache folder, one file per subcommand.
//
// Why not the blob's own code cache (`useCodeCache`): V8 loads it only on the platform that made it, so every
// executable built for another platform than the build machine's (macOS, arm64) would compile the 3.7 MB bundle
// at each start, which takes two to two and a half times as long as a cached start; and it holds only the bundle's
// top level, not the functions a command then runs. This cache is made on the user's machine by the first run of
// each subcommand, after the command ran, so it holds those functions too, for every platform alike. A startup
// snapshot (`useSnapshot`) is platform-bound as well, and would need the bundle written for it.
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join } from 'node:path';
import { getAsset, getRawAsset } from 'node:sea';
import { constants, Script } from 'node:vm';

/** The assets dev/build-cli.ts puts in the blob (same names there): the CLI's CommonJS bundle, and a hash of it. */
const BUNDLE_ASSET = 'sealion.cjs';
const BUILD_ID_ASSET = 'build-id';

const buildId = getAsset(BUILD_ID_ASSET, 'utf8');
// A view of the executable's own bytes, decoded once as Latin-1: the bundle is ASCII (esbuild escapes the rest),
// and this is several times faster than decoding UTF-8.
const source = Buffer.from(getRawAsset(BUNDLE_ASSET)).toString('latin1');
const subcommand = /^[a-z][a-z-]{0,31}$/.exec(process.argv[2] ?? '')?.[0] ?? 'other';
const dir = join(process.env['XDG_CACHE_HOME'] || join(homedir(), '.cache'), 'sealion', 'executable');
// V8 refuses code made by another V8 or for other flags; the platform in the name keeps a home folder shared by
// machines of several kinds from trading one file back and forth.
const file = join(dir, `${buildId}-${process.platform}-${process.arch}-${subcommand}.v8`);

let cachedData: Buffer | undefined;
try {
  cachedData = readFileSync(file);
} catch {
  // The first run of this subcommand: compiled from the source, and cached when it ends.
}

// The wrapper Node gives a CommonJS module, with the executable's require (built-in modules only), so the bundle
// runs as it would as a file; import() still reaches the built-in modules through Node's own loader. That option is
// experimental, and Node warns so at the first import() a command runs (an exec plugin's runner, a values file's
// reader), naming a flag no user can pass: the executables start with the warning off (dev/build-cli.ts,
// EXECUTABLE_NODE_FLAGS).
const script = new Script(`(function (exports, require, module, __filename, __dirname) {${source}\n})`, {
  filename: BUNDLE_ASSET,
  ...(cachedData ? { cachedData } : {}),
  importModuleDynamically: constants.USE_MAIN_CONTEXT_DEFAULT_LOADER,
});

if (!cachedData || script.cachedDataRejected)
  process.once('exit', () => {
    // An optimization only: a folder that cannot be written means slower starts, never a failed command.
    try {
      mkdirSync(dir, { recursive: true, mode: 0o700 });
      // Files of other builds are dead weight once this one runs.
      for (const old of readdirSync(dir))
        if (old.endsWith('.v8') && !old.startsWith(`${buildId}-`)) rmSync(join(dir, old), { force: true });
      const partial = `${file}.${process.pid}.tmp`;
      writeFileSync(partial, script.createCachedData(), { mode: 0o600 });
      renameSync(partial, file);
    } catch {
      // See above.
    }
  });

(script.runInThisContext() as (...args: unknown[]) => void)(
  module.exports,
  require,
  module,
  process.execPath,
  dirname(process.execPath),
);
