// `npm run fuzz`: starts a real API server and the concierge in its own process, throws FUZZ_CASES hostile cases at
// it (default 100,000), split over FUZZ_SEEDS seeds (default 8, each random and printed), prints what each seed found
// and exits non-zero on any finding. Everything it started stops at the end, on a failure, and on Ctrl-C.
//
// FUZZ_CASES (100000), FUZZ_SEEDS (8), FUZZ_SEED (one seed instead: replays that seed's part of a run),
// FUZZ_LANES (4: lanes of a family of weight 20, the others in proportion), FUZZ_DEADLINE_MS (5000),
// FUZZ_FAMILIES (comma-separated family names; all by default).
import {
  formatReport,
  formatSummary,
  hasFindings,
  maxLanes,
  mergeReports,
  runFuzz,
  seedShares,
  type FuzzReport,
} from './run.ts';
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
const cases = number('FUZZ_CASES', 100_000);
// Several seeds rather than one: a run's lanes each follow one seed's stream of cases, and a stream that happens to
// miss a shape misses it for the whole run. Each seed's part is short enough to replay.
const seedCount = env['FUZZ_SEED'] ? 1 : number('FUZZ_SEEDS', 8);
if (seedCount < 1 || seedCount > Math.max(1, cases))
  throw new Error(`FUZZ_SEEDS: must be between 1 and FUZZ_CASES, not ${seedCount}`);
const seeds = env['FUZZ_SEED']
  ? [number('FUZZ_SEED', 0)]
  : Array.from({ length: seedCount }, () => (Math.random() * 2 ** 31) | 0);
const shares = seedShares(cases, seeds.length);
const options = {
  lanes: number('FUZZ_LANES', 4),
  deadlineMs: number('FUZZ_DEADLINE_MS', 5_000),
  shrinkPerFamily: 3,
  ...(env['FUZZ_FAMILIES'] ? { families: env['FUZZ_FAMILIES'].split(',').map((f) => f.trim()) } : {}),
  log,
};
log(
  `${seeds.length} seed${seeds.length === 1 ? '' : 's'}, ${cases} cases: ` +
    seeds.map((seed, i) => `${seed} (${shares[i]})`).join(', ') +
    `; FUZZ_SEED=<seed> FUZZ_CASES=<its cases> replays one`,
);

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
  const reports: FuzzReport[] = [];
  try {
    target = await startFuzzTarget({ log, agents: maxLanes(options.lanes) });
    for (const [i, seed] of seeds.entries()) {
      if (interrupt.signal.aborted || reports.some((r) => r.crash)) break;
      log(`seed ${seed} (FUZZ_SEED=${seed} FUZZ_CASES=${shares[i]} replays it), ${i + 1} of ${seeds.length}`);
      const report = await runFuzz(target, { ...options, seed, cases: shares[i]!, signal: interrupt.signal });
      console.log(formatReport(report, seeds.length === 1));
      reports.push(report);
    }
    if (reports.length === 0) return 130;
    if (seeds.length > 1) console.log(`\n${formatSummary(reports, seeds.slice(reports.length))}`);
    if (hasFindings(mergeReports(reports))) return 1;
    return interrupt.signal.aborted ? 130 : 0;
  } catch (err) {
    console.error(err);
    return 2;
  } finally {
    await target?.stop();
  }
}

process.exit(await main());
