// `npm test`: lint, the format check, the type check and the unit tests, beside the integration tests rather than
// before them. Jest runs the integration files one at a time (two cores: in band), and they spend most of their
// time waiting on servers (rollouts, drains, caches and grants running out), while the checks and the unit tests need
// only the CPU: one after the other, their minutes only add to the run. The checks' output is held and printed whole
// after the integration tests', so neither interleaves with the other; the run fails if either part does.
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';

/** The children running; each leads a process group of its own, which a stop signal is passed on to whole. */
const running = new Set<ChildProcess>();

/** Runs `npm run <script>`, its output to `out` (this process's when undefined); resolves its exit code. */
function run(script: string, out?: string[]): Promise<number> {
  return new Promise((done) => {
    const child = spawn('npm', ['run', script], {
      stdio: out ? ['ignore', 'pipe', 'pipe'] : 'inherit',
      detached: true,
    });
    running.add(child);
    if (out) {
      child.stdout!.on('data', (c: Buffer) => out.push(c.toString('utf8')));
      child.stderr!.on('data', (c: Buffer) => out.push(c.toString('utf8')));
    }
    child.once('error', (err) => {
      out?.push(`npm run ${script}: ${err.message}\n`);
      done(1);
    });
    child.once('close', (code, signal) => {
      running.delete(child);
      done(code ?? (signal ? 1 : 0));
    });
  });
}

// Stopped (Ctrl-C, a CI timeout): the signal goes on to every child's whole group (npm, jest, its workers and the
// servers they started, which the harness ties to them), and this process exits once they have, as a shell would.
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
  process.once(signal, () => {
    for (const child of running) {
      try {
        process.kill(-child.pid!, signal);
      } catch {
        // The group has already gone.
      }
    }
    const exit = (): never => process.exit(128 + constants.signals[signal]);
    if (running.size === 0) exit();
    for (const child of running) child.once('close', () => running.size === 0 && exit());
  });
}

const started = Date.now();
const seconds = (): number => Math.round((Date.now() - started) / 1000);

/** The checks and the unit tests, in `npm test`'s old order, stopping at the first that fails. */
async function checks(out: string[]): Promise<number> {
  for (const script of ['lint', 'format:check', 'typecheck', 'test:unit']) {
    const code = await run(script, out);
    if (code !== 0) return code;
  }
  return 0;
}

const held: string[] = [];
const [checked, integrated] = await Promise.all([
  checks(held),
  run('test:integration').then((code) => {
    console.log(`test: integration tests: exit ${code}, ${seconds()} s`);
    return code;
  }),
]);
process.stdout.write(held.join(''));
console.log(
  `test: lint, format check, type check and unit tests: exit ${checked}; all done in ${seconds()} s`,
);
process.exitCode = checked !== 0 || integrated !== 0 ? 1 : 0;
