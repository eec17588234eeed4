// `npm run fuzz`: starts a real API server and the concierge in its own process, throws FUZZ_CASES hostile cases at
// it (default 100,000, seeded by FUZZ_SEED), prints what it found and exits non-zero on any finding. Everything it
// started stops at the end, on a failure, and on Ctrl-C.
//
// FUZZ_CASES (100000), FUZZ_SEED (random; printed), FUZZ_LANES (4: lanes of a family of weight 20, the others in
// proportion), FUZZ_DEADLINE_MS (5000),
// FUZZ_FAMILIES (comma-separated family names; all by default).
import { formatReport, hasFindings, maxLanes, runFuzz } from './run.ts';
import { startFuzzTarget } from './target.ts';

const env = process.env;
const number = (name: string, fallback: number): number => {
  const value = env[name];
  if (value === undefined || value === '') return fallback;
  const n = Number(value);
  if (!Number.isInteger(n)) throw new Error(`${name}: must be an integer, not ${JSON.stringify(value)}`);
  return n;
};

const log = (line: string): void => console.error(`[fuzz] ${line}`);
const seed = number('FUZZ_SEED', (Math.random() * 2 ** 31) | 0);
const options = {
  cases: number('FUZZ_CASES', 100_000),
  seed,
  lanes: number('FUZZ_LANES', 4),
  deadlineMs: number('FUZZ_DEADLINE_MS', 5_000),
  shrinkPerFamily: 3,
  ...(env['FUZZ_FAMILIES'] ? { families: env['FUZZ_FAMILIES'].split(',').map((f) => f.trim()) } : {}),
  log,
};
log(`seed ${seed} (FUZZ_SEED=${seed} replays this run), ${options.cases} cases`);

const interrupt = new AbortController();
let target: Awaited<ReturnType<typeof startFuzzTarget>> | undefined;
process.on('SIGINT', () => {
  if (interrupt.signal.aborted) {
    // A second Ctrl-C: stop now. The servers die with this process (the harness starts them so).
    void target?.stop().finally(() => process.exit(130));
    return;
  }
  log('stopping after the cases in flight (Ctrl-C again to stop at once)');
  interrupt.abort();
});
process.on('SIGTERM', () => interrupt.abort());
// A failure of the fuzzer's own (its fake agents run lib/tunnel/tunnel.ts in this process): stop what it started, then exit.
process.on('uncaughtException', (err) => {
  console.error('[fuzz] the fuzzer itself failed:', err);
  void (target?.stop() ?? Promise.resolve()).finally(() => process.exit(2));
});

async function main(): Promise<number> {
  try {
    target = await startFuzzTarget({ log, agents: maxLanes(options.lanes) });
    if (interrupt.signal.aborted) return 130;
    const report = await runFuzz(target, { ...options, signal: interrupt.signal });
    console.log(formatReport(report));
    return hasFindings(report) ? 1 : report.stoppedEarly ? 130 : 0;
  } catch (err) {
    console.error(err);
    return 2;
  } finally {
    await target?.stop();
  }
}

process.exit(await main());
