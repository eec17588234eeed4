// Small measuring kit for the benchmarks: run an async operation for a while, report rate and latency
// percentiles, print a table with ratios, save JSON.
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { REPO_ROOT } from '../dev/build.ts';

export interface Measurement {
  name: string;
  ops: number;
  seconds: number;
  perSecond: number;
  p50us: number;
  p99us: number;
  [extra: string]: unknown;
}

/**
 * How long each measurement runs its load before it starts the clock (BENCH_WARMUP_SECONDS): long enough for V8
 * to have compiled the hot paths of a Node process, so a measurement shows a running proxy, not a starting one.
 */
export const WARMUP_SECONDS = Number(process.env['BENCH_WARMUP_SECONDS'] ?? 3);

/**
 * BENCH_ONLY, a regular expression: the request suites measure only the groups whose name (`LIST c=32 split`)
 * it matches, for a quicker look at one part or a profile of it.
 */
const ONLY = process.env['BENCH_ONLY'] ? new RegExp(process.env['BENCH_ONLY']) : undefined;

/** Whether the measurement group `name` is to be run (BENCH_ONLY). */
export function selected(name: string): boolean {
  return ONLY?.test(name) ?? true;
}

function percentile(sorted: number[], p: number): number {
  return sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/**
 * Runs `op` with `concurrency` loops in flight: for `warmupSeconds` (default WARMUP_SECONDS), then, after
 * `onStart` (where callers read CPU counters), for `seconds` on the clock.
 */
export async function measure(
  name: string,
  op: (i: number) => Promise<unknown>,
  opts: { seconds?: number; concurrency?: number; warmupSeconds?: number; onStart?: () => unknown } = {},
): Promise<Measurement> {
  const seconds = opts.seconds ?? 2;
  const concurrency = opts.concurrency ?? 1;
  let i = 0;
  const run = (runSeconds: number, latencies?: number[]): Promise<unknown> => {
    const deadline = process.hrtime.bigint() + BigInt(Math.round(runSeconds * 1e9));
    return Promise.all(
      Array.from({ length: concurrency }, async () => {
        while (process.hrtime.bigint() < deadline) {
          const t0 = process.hrtime.bigint();
          await op(i++);
          latencies?.push(Number(process.hrtime.bigint() - t0) / 1000);
        }
      }),
    );
  };
  await run(opts.warmupSeconds ?? WARMUP_SECONDS);
  await opts.onStart?.();
  const latencies: number[] = [];
  const started = process.hrtime.bigint();
  await run(seconds, latencies);
  const elapsed = Number(process.hrtime.bigint() - started) / 1e9;
  latencies.sort((a, b) => a - b);
  return {
    name,
    ops: latencies.length,
    seconds: elapsed,
    perSecond: latencies.length / elapsed,
    p50us: percentile(latencies, 50),
    p99us: percentile(latencies, 99),
  };
}

/**
 * The order of round `k`: `items` from index `k` (mod length) on, going backwards in every other round. Each
 * round starts with another target, so no target always runs first or last, on an API server whose heap and
 * caches change as the run goes on. Going backwards changes which target runs just before each one: two targets
 * served by one process (Sealion's JWT and certificate targets) take turns at finding it idle since its last
 * measurement or busy from the one before.
 */
function roundOrder<T>(items: readonly T[], k: number): T[] {
  const n = items.length;
  const step = k % 2 === 0 ? 1 : n - 1;
  return items.map((_, i) => items[(k + i * step) % n]!);
}

/** How many rounds the request suites measure each target in (BENCH_ROUNDS), in another order each round. */
const ROUNDS = Math.max(1, Number(process.env['BENCH_ROUNDS'] ?? 3));

/** The warm-up of every round after the first: the processes are hot by then. */
const REWARM_SECONDS = Math.min(1, WARMUP_SECONDS);

/** The middle value (the upper of the two middle ones for an even count). */
function median(values: number[]): number {
  return [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
}

/** What a row keeps of each round: its rate and p50. */
export interface RoundFigures {
  perSecond: number;
  p50us: number;
}

/** Rounds measured so far in this process: each round starts with the next target (see roundOrder). */
let roundsSoFar = 0;

/**
 * Measures each of `targets` in ROUNDS rounds, each round starting with the next target (see roundOrder, counted
 * across calls), and keeps for each target its round with the median rate, with every round's figures in
 * `rounds` (printComparison compares them round by round). A disturbance that hits one measurement (the API
 * server collecting garbage, say) then moves one round rather than the figure. `measureOne` gets the warm-up to
 * run: WARMUP_SECONDS in the first round.
 */
export async function measureRounds<T>(
  targets: readonly T[],
  measureOne: (target: T, warmupSeconds: number) => Promise<Measurement>,
): Promise<Measurement[]> {
  const runs = new Map<T, Measurement[]>(targets.map((t) => [t, []]));
  for (let round = 0; round < ROUNDS; round++)
    for (const t of roundOrder(targets, roundsSoFar++))
      runs.get(t)!.push(await measureOne(t, round === 0 ? WARMUP_SECONDS : REWARM_SECONDS));
  return medianRounds(targets, runs);
}

/**
 * As measureRounds, for a `measureRound` that measures all `targets` at once (alternating between them) and
 * returns their measurements in the order of `targets`.
 */
export async function measureRoundsTogether<T>(
  targets: readonly T[],
  measureRound: (warmupSeconds: number) => Promise<Measurement[]>,
): Promise<Measurement[]> {
  const runs = new Map<T, Measurement[]>(targets.map((t) => [t, []]));
  for (let round = 0; round < ROUNDS; round++) {
    const measured = await measureRound(round === 0 ? WARMUP_SECONDS : REWARM_SECONDS);
    targets.forEach((t, i) => runs.get(t)!.push(measured[i]!));
  }
  return medianRounds(targets, runs);
}

/** Each target's round with the median rate, with every round's figures in `rounds`. */
function medianRounds<T>(targets: readonly T[], runs: Map<T, Measurement[]>): Measurement[] {
  return targets.map((t) => {
    const measured = runs.get(t)!;
    const rate = median(measured.map((m) => m.perSecond));
    const rounds: RoundFigures[] = measured.map(({ perSecond, p50us }) => ({ perSecond, p50us }));
    return { ...measured.find((m) => m.perSecond === rate)!, rounds };
  });
}

/**
 * Prints the measurements as a table, each rate also as a ratio to the baseline (the first row by default), and
 * each round's rate for rows measured in rounds (measureRounds).
 */
export function printTable(title: string, rows: Row[], baseline: Measurement = rows[0]!): void {
  const fmt = (n: number): string => (n >= 100 ? Math.round(n).toLocaleString('en-US') : n.toFixed(1));
  const rounds = rows.some((r) => (r.rounds?.length ?? 0) > 1);
  const lines = [
    ['', 'ops/s', 'p50 µs', 'p99 µs', `× ${baseline.name}`, ...(rounds ? ['ops/s of each round'] : [])],
  ];
  for (const r of rows)
    lines.push([
      r.name,
      fmt(r.perSecond),
      fmt(r.p50us),
      fmt(r.p99us),
      (r.perSecond / baseline.perSecond).toFixed(2),
      ...(rounds ? [(r.rounds ?? []).map((round) => fmt(round.perSecond)).join(' ')] : []),
    ]);
  const widths = lines[0]!.map((_, c) => Math.max(...lines.map((l) => l[c]!.length)));
  console.log(`\n${title}`);
  for (const l of lines)
    console.log(
      l.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  '),
    );
}

/** Prints rows as aligned columns: the first `left` columns padded on the right, the others on the left. */
export function printColumns(table: string[][], left: number): void {
  const widths = table[0]!.map((_, c) => Math.max(...table.map((row) => row[c]!.length)));
  for (const row of table)
    console.log(
      row.map((cell, c) => (c < left ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  '),
    );
}

/** Formats a number with thousands separators and `digits` decimals. */
export const formatNumber = (n: number, digits = 0): string =>
  n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });

/** A measurement of one operation at one concurrency through one target. */
export type Row = Measurement & {
  op?: string;
  concurrency?: number;
  target?: string;
  layout?: string;
  rounds?: RoundFigures[];
};

/**
 * `compare` applied to a row and another row of its group (direct, say): round by round when both were measured
 * in the same rounds, so that a slow spell of the machine, which slows a whole round, cancels out; then the
 * median of the rounds.
 */
export function paired(row: Row, other: Row, compare: (r: RoundFigures, o: RoundFigures) => number): number {
  const [mine, theirs] = [row.rounds, other.rounds];
  return mine && theirs && mine.length === theirs.length
    ? median(mine.map((r, i) => compare(r, theirs[i]!)))
    : compare(row, other);
}

/**
 * Prints rows compared with the `direct` row of the same operation, concurrency and layout (where the processes
 * ran, when rows say): rate, latency, the ratio to direct and the added p50 (see paired), then the suite's
 * own columns, and each round's rate when there were several.
 */
export function printComparison(rows: Row[], extra: { header: string; cell: (r: Row) => string }[]): void {
  const layouts = rows.some((r) => r.layout !== undefined);
  if (rows.some((r) => (r.rounds?.length ?? 0) > 1)) {
    console.log(
      '× direct and +p50: each round against direct in the same round, then the median of the rounds',
    );
    extra = [
      ...extra,
      {
        header: 'req/s of each round',
        cell: (r) => (r.rounds ?? []).map((round) => formatNumber(round.perSecond)).join(' '),
      },
    ];
  }
  const table = [
    [
      'op',
      'c',
      ...(layouts ? ['cores'] : []),
      'target',
      'req/s',
      'p50 ms',
      'p99 ms',
      '× direct req/s',
      '+p50 ms vs direct',
      ...extra.map((e) => e.header),
    ],
  ];
  for (const r of rows) {
    // A group without direct's row (a measurement that failed) prints no ratio to it rather than stopping the report.
    const direct = rows.find(
      (d) =>
        d.op === r.op && d.concurrency === r.concurrency && d.layout === r.layout && d.target === 'direct',
    );
    table.push([
      r.op!,
      String(r.concurrency),
      ...(layouts ? [r.layout ?? ''] : []),
      r.target!,
      formatNumber(r.perSecond),
      formatNumber(r.p50us / 1000, 2),
      formatNumber(r.p99us / 1000, 2),
      direct ? paired(r, direct, (a, d) => a.perSecond / d.perSecond).toFixed(2) : '-',
      direct ? formatNumber(paired(r, direct, (a, d) => a.p50us - d.p50us) / 1000, 2) : '-',
      ...extra.map((e) => e.cell(r)),
    ]);
  }
  printColumns(table, layouts ? 4 : 3);
}

/** Saves results under bench/results/ (git-ignored) and returns the path. */
export function saveResults(suite: string, data: unknown): string {
  const dir = join(REPO_ROOT, 'bench/results');
  mkdirSync(dir, { recursive: true });
  const file = join(dir, `${suite}-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  writeFileSync(
    file,
    JSON.stringify({ suite, node: process.version, when: new Date().toISOString(), data }, null, 2),
  );
  return file;
}
