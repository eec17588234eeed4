// `npm test`: lint, the format check, the type check and the unit tests, beside the integration tests rather than
// before them. Jest runs the integration files one at a time (two cores: in band), and they spend most of their
// time waiting on servers (rollouts, drains, caches and grants running out), while the checks and the unit tests need
// only the CPU: one after the other, their minutes only add to the run. The checks' output is held and printed whole
// after the integration tests', so neither interleaves with the other; the run fails if either part does.
import { spawn } from 'node:child_process';

/** Runs `npm run <script>`, its output to `out` (this process's when undefined); resolves its exit code. */
function run(script: string, out?: string[]): Promise<number> {
  return new Promise((done) => {
    const child = spawn('npm', ['run', script], { stdio: out ? ['ignore', 'pipe', 'pipe'] : 'inherit' });
    if (out) {
      child.stdout!.on('data', (c: Buffer) => out.push(c.toString('utf8')));
      child.stderr!.on('data', (c: Buffer) => out.push(c.toString('utf8')));
    }
    child.once('error', (err) => {
      out?.push(`npm run ${script}: ${err.message}\n`);
      done(1);
    });
    child.once('close', (code, signal) => done(code ?? (signal ? 1 : 0)));
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
