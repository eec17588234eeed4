// The CLI run from the checkout: bin/sealion.js under a Node too old for it, and the shim `npm start` and
// `npm run shim` write (dev/shim.ts), run as a person runs it: its folder on PATH, completion loaded in bash.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile, execFileSync } from 'node:child_process';
import { accessSync, constants, mkdtempSync, readFileSync, realpathSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT } from '../dev/build.ts';
import { shimLines, writeShim } from '../dev/shim.ts';
import { SEALION_VERSION } from '../lib/version.ts';

const run = promisify(execFile);
const BIN = join(REPO_ROOT, 'bin/sealion.js');

/** Runs `command`; its exit code and both outputs, whether it failed or not. */
async function outcome(
  command: string,
  args: string[],
  env: NodeJS.ProcessEnv = process.env,
): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await run(command, args, { env, timeout: 30_000 });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const { code, stdout, stderr } = err as { code: number; stdout: string; stderr: string };
    return { code, stdout, stderr };
  }
}

/** A `node` on PATH older than the one running the tests (the machine's own, outside node_modules), if any. */
function olderNode(): { path: string; version: string } | undefined {
  for (const dir of (process.env['PATH'] ?? '').split(delimiter)) {
    const candidate = join(dir, 'node');
    try {
      accessSync(candidate, constants.X_OK);
      if (realpathSync(candidate) === realpathSync(process.execPath)) continue;
      const version = execFileSync(candidate, ['-p', 'process.version'], { encoding: 'utf8' }).trim();
      if (Number(version.slice(1).split('.')[0]) < 24) return { path: candidate, version };
    } catch {
      // Not there, or not a Node that runs: the next folder.
    }
  }
  return undefined;
}

describe('bin/sealion.js', () => {
  it("needs the Node major package.json's engines names", () => {
    const engines = (
      JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as {
        engines: { node: string };
      }
    ).engines.node;
    const needed = /const NEEDED_NODE_MAJOR = (\d+);/.exec(readFileSync(BIN, 'utf8'))?.[1];
    expect(engines).toBe(`>=${needed}`);
  });

  const old = olderNode();
  // The machines ship Node 20; where none older is found, there is nothing to run this with.
  (old ? it : it.skip)(
    `says in one line which Node it needs under ${old?.version ?? 'an older Node'}`,
    async () => {
      const result = await outcome(old!.path, [BIN, 'version', '--client']);
      expect(result).toEqual({
        code: 1,
        stdout: '',
        stderr:
          `sealion: cannot run on Node ${old!.version} (${old!.path}): the CLI needs Node 24 or later; run npm ci in ` +
          'the checkout, which installs Node 24 into node_modules, then run the CLI as npx sealion, or as sealion ' +
          'after npm run shim\n',
      });
    },
  );
});

describe('the shim', () => {
  let dir: string;
  let binDir: string;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-shim-'));
    // A space and a quote in its path: the lines printed for it still work as typed.
    binDir = join(dir, "it's a bin");
    writeShim(binDir);
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('runs the CLI with the Node it names, whatever Node comes first on PATH', async () => {
    // Only the system's folders: a Node there is the machine's own (older), and must not be the one that runs.
    const result = await outcome(join(binDir, 'sealion'), ['--version'], { PATH: '/usr/bin:/bin' });
    expect(result).toEqual({ code: 0, stdout: `${SEALION_VERSION}\n`, stderr: '' });
  });

  it('runs as sealion and completes, with the lines printed for bash', async () => {
    const script = [
      ...shimLines(binDir, '/bin/bash'),
      'complete -p sealion',
      'COMP_WORDS=(sealion vers); COMP_CWORD=1; _sealion_complete',
      'echo "${COMPREPLY[@]}"',
      'sealion --version',
    ].join('\n');
    const result = await outcome('bash', ['-c', script], { PATH: '/usr/bin:/bin', HOME: dir });
    expect(result).toEqual({
      code: 0,
      stdout: `complete -o default -F _sealion_complete sealion\nversion\n${SEALION_VERSION}\n`,
      stderr: '',
    });
  });

  it("prints the lines for the user's shell", () => {
    expect(shimLines('/a/b', '/usr/bin/zsh')).toEqual([
      'export PATH=/a/b:"$PATH"',
      'source <(sealion completion zsh)',
    ]);
    expect(shimLines("/a b/it's", '/usr/bin/fish')).toEqual([
      "fish_add_path --path '/a b/it'\\''s'",
      'sealion completion fish | source',
    ]);
    expect(shimLines('/a/b', '')).toEqual(['export PATH=/a/b:"$PATH"', 'source <(sealion completion bash)']);
  });
});
