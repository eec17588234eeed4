// The concierge's vital signs over a fuzz run, and the bounds they must stay within (integration/README.md, "The
// fuzzer", says why each is what it is). The event loop is read from inside the process (how late a 10 ms timer
// fires): before the cases (a quiet second), in every second of them, over the whole of them, and after them (another
// quiet second); a second whose worst delay passes the bound is kept with the cases in flight then.
import { DEFAULT_CONCIERGE_POD } from '../../manifests/install.ts';
import type { ConciergeProcess, LoopDelay } from '../harness/concierge-process.ts';

const MiB = 2 ** 20;

/** The bounds a run holds the concierge to. */
export const BOUNDS = {
  /** The longest the event loop may be late once, in ms: the user's limit for a flow of work not broken (1 s). */
  loopMaxMs: 1_000,
  /** The 99th percentile of its lateness over the run, in ms: what a user takes for an instant answer (0.1 s). */
  loopP99Ms: 100,
  /** The most resident memory at any time: the installed pod's memory limit, past which the kernel kills it. */
  rssMaxBytes: Number.parseInt(DEFAULT_CONCIERGE_POD.resources.limits.memory, 10) * MiB,
  /** What the heap may keep after the run, all connections gone and a full GC run, over what it held before. */
  heapGrowthBytes: 64 * MiB,
};

export interface LoopReport {
  before: LoopDelay;
  /** Over all the cases. */
  during: LoopDelay;
  /** The worst second of the cases. */
  worstSecond: LoopDelay;
  after: LoopDelay;
  /** Seconds whose worst delay passed BOUNDS.loopMaxMs: when (ms into the cases), how late, and the cases in flight. */
  stalls: Array<{ atMs: number; maxMs: number; inFlight: string[] }>;
}

/**
 * How long the event loop may not turn before the harness kills the process, as the installed pod's liveness probe
 * would (every 10 s, restarted after 6 failures): a loop that never turns again would otherwise hold the run.
 */
export const FROZEN_MS = 60_000;

/** Why a process with this much resident memory would have been killed (past the pod's limit); undefined if none. */
export function fatalRss(rss: number): string | undefined {
  return rss > BOUNDS.rssMaxBytes
    ? `its RSS reached ${(rss / MiB).toFixed(0)} MiB, past the pod's memory limit of ${(BOUNDS.rssMaxBytes / MiB).toFixed(0)} MiB (the kernel would have killed it)`
    : undefined;
}

const QUIET_MS = 1_000;
const WINDOW_MS = 1_000;
/** Stalls kept with their cases; later ones are counted in `stalls` without them. */
const STALLS_KEPT = 20;

/** The event loop over a quiet second (nothing of the fuzzer's in flight). */
async function quietSecond(concierge: ConciergeProcess): Promise<LoopDelay> {
  await concierge.eventLoop('window');
  await new Promise((done) => setTimeout(done, QUIET_MS));
  return concierge.eventLoop('window');
}

/**
 * Watches the event loop while the cases run: `start` measures a quiet second first; `stop` ends the watch and
 * measures a quiet second after. `inFlight` names the cases running at a stall; `frozen` is told when the loop has
 * not turned for FROZEN_MS.
 */
export function watchEventLoop(
  concierge: ConciergeProcess,
  inFlight: () => string[],
  frozen: (why: string) => void,
) {
  let before: LoopDelay | undefined;
  let worst: LoopDelay | undefined;
  let started = 0;
  let timer: NodeJS.Timeout | undefined;
  let reading: Promise<void> = Promise.resolve();
  const stalls: LoopReport['stalls'] = [];
  const read = async (): Promise<void> => {
    if (!concierge.alive()) return;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<'frozen'>((done) => (timer = setTimeout(() => done('frozen'), FROZEN_MS)));
    const second = await Promise.race([concierge.eventLoop('window').catch(() => undefined), late]);
    clearTimeout(timer);
    if (second === 'frozen') {
      stalls.push({ atMs: Date.now() - started, maxMs: FROZEN_MS, inFlight: inFlight() });
      return frozen(
        `its event loop did not turn for ${FROZEN_MS / 1000} s (the liveness probe would have restarted it)`,
      );
    }
    if (!second) return;
    if (!worst || second.max > worst.max) worst = second;
    if (second.max > BOUNDS.loopMaxMs)
      stalls.push({
        atMs: Date.now() - started,
        maxMs: second.max,
        inFlight: stalls.length < STALLS_KEPT ? inFlight() : [],
      });
  };
  return {
    async start(): Promise<void> {
      before = await quietSecond(concierge);
      await concierge.resetEventLoop();
      started = Date.now();
      timer = setInterval(() => void (reading = reading.then(read)), WINDOW_MS);
    },
    async stop(): Promise<LoopReport | undefined> {
      clearInterval(timer);
      await reading;
      if (!before || !concierge.alive()) return undefined;
      try {
        const during = await concierge.eventLoop('total');
        await read();
        const after = await quietSecond(concierge);
        return { before, during, worstSecond: worst ?? during, after, stalls };
      } catch {
        // It died (or was killed) meanwhile: the crash is the report.
        return undefined;
      }
    },
  };
}

/** What the bounds are judged on: a run's report. */
interface Vitals {
  rss: { before: number; max: number };
  memory: { before: NodeJS.MemoryUsage; after?: NodeJS.MemoryUsage };
  loop?: LoopReport;
}

/** Where a run's vital signs passed their bounds: one line each, empty when they held. */
export function boundProblems(report: Vitals): string[] {
  return [...memoryProblems(report), ...loopProblems(report)];
}

/** Where memory passed its bounds. */
export function memoryProblems(report: Vitals): string[] {
  const problems: string[] = [];
  const mib = (n: number): string => `${(n / MiB).toFixed(1)} MiB`;
  if (report.rss.max > BOUNDS.rssMaxBytes)
    problems.push(`RSS reached ${mib(report.rss.max)}, past the pod's limit of ${mib(BOUNDS.rssMaxBytes)}`);
  const { before, after } = report.memory;
  if (after && after.heapUsed - before.heapUsed > BOUNDS.heapGrowthBytes)
    problems.push(
      `the heap after a full GC grew by ${mib(after.heapUsed - before.heapUsed)} over the run (bound ${mib(BOUNDS.heapGrowthBytes)})`,
    );
  return problems;
}

/** Where the event loop passed its bounds (timing: judged by `npm run fuzz`, reported by the tests). */
export function loopProblems(report: Vitals): string[] {
  const problems: string[] = [];
  const loop = report.loop;
  if (loop) {
    if (loop.during.max > BOUNDS.loopMaxMs)
      problems.push(
        `the event loop stalled for ${loop.during.max.toFixed(0)} ms (bound ${BOUNDS.loopMaxMs} ms), in ${loop.stalls.length} second(s)`,
      );
    if (loop.during.p99 > BOUNDS.loopP99Ms)
      problems.push(
        `the event loop's delay was ${loop.during.p99.toFixed(1)} ms at the 99th percentile (bound ${BOUNDS.loopP99Ms} ms)`,
      );
  }
  return problems;
}

const ms = (d: LoopDelay): string =>
  `p50 ${d.p50.toFixed(1)} ms, p99 ${d.p99.toFixed(1)} ms, max ${d.max.toFixed(0)} ms`;

/** The report's lines on the event loop and the bounds. */
export function formatVitals(report: Vitals): string[] {
  const lines: string[] = [];
  const loop = report.loop;
  if (loop) {
    lines.push(
      `concierge event loop, late by: before ${ms(loop.before)}; during ${ms(loop.during)} (worst second: max ${loop.worstSecond.max.toFixed(0)} ms); after ${ms(loop.after)}`,
    );
    for (const stall of loop.stalls.slice(0, 5)) {
      lines.push(
        `  a ${stall.maxMs.toFixed(0)} ms stall ${(stall.atMs / 1000).toFixed(0)} s in; cases in flight then:`,
      );
      for (const c of stall.inFlight) lines.push(`    ${c.slice(0, 600)}`);
    }
  }
  for (const problem of boundProblems(report)) lines.push(`over a bound: ${problem}`);
  return lines;
}
