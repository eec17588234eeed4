// Which Sealion this is: the package's version, and for a build of the CLI the commit it was built from. Small on
// purpose: `sealion --version` loads it and nothing else, and the concierge publishes SEALION_VERSION on its
// replica Lease.
//
// Imported rather than read beside this file, so that a bundle of the CLI (dev/build-cli.ts) carries it too.
import packageJson from '../package.json' with { type: 'json' };

/** The version in package.json, as the CLI, the concierge and the agent report it. */
export const SEALION_VERSION: string = packageJson.version;

/** The commit a build came from, and whether the files it was built from differed from that commit. */
export interface SourceBuild {
  /** The full commit hash. */
  commit: string;
  /** `dirty` when tracked files had changes that were not committed: the build is not that commit's. */
  treeState: 'clean' | 'dirty';
}

// Replaced by a literal when dev/build-cli.ts bundles the CLI (esbuild's `define`). Nothing declares it at run
// time, so `typeof` is the only safe way to ask: in the checkout, and in the image, it is undefined.
declare const __SEALION_BUILD__: SourceBuild | null | undefined;

/**
 * The build a bundle carries: `undefined` when this code was not bundled (the checkout, the image), `null` when it
 * was but the builder could not tell the commit (no git, or no repository).
 */
export function embeddedBuild(): SourceBuild | null | undefined {
  return typeof __SEALION_BUILD__ === 'undefined' ? undefined : __SEALION_BUILD__;
}

/** How long a git command may take before the build is called unknown: a version must never hang. */
const GIT_TIMEOUT_MS = 3_000;

/**
 * The commit checked out in `dir` and whether tracked files differ from it, asked of git; `null` when git cannot
 * say (not installed, not a repository, too slow). Untracked files do not count, as `git describe --dirty` has it:
 * caches, links and build output sit untracked in a working checkout without changing what it runs. Loads
 * node:child_process only when called.
 */
export async function describeCheckout(dir: string): Promise<SourceBuild | null> {
  const { execFile } = await import('node:child_process');
  const { promisify } = await import('node:util');
  const run = promisify(execFile);
  const git = async (args: string[]): Promise<string> =>
    (await run('git', ['-C', dir, ...args], { timeout: GIT_TIMEOUT_MS, windowsHide: true })).stdout;
  try {
    const [head, status] = await Promise.all([
      git(['rev-parse', 'HEAD']),
      git(['status', '--porcelain', '--untracked-files=no']),
    ]);
    const commit = head.trim();
    if (!/^[0-9a-f]{40,64}$/.test(commit)) return null;
    return { commit, treeState: status.trim() === '' ? 'clean' : 'dirty' };
  } catch {
    return null;
  }
}
