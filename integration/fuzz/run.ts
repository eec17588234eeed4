// Runs the families against a started target: each family in several lanes at once (fast-check runs one case at a
// time, and a case mostly waits on sockets), every lane with its own seed derived from the run's, so a run replays
// from FUZZ_SEED. A failing case is shrunk by fast-check (the first few of a family) and recorded, every one of them,
// and its lane goes on with a fresh seed; the first crash of the concierge ends the run.
//
// An oracle that passes every answer it cannot judge (a closed connection, a header Node would not send) passes a
// target that answers nothing. So each family's answers are counted by kind, each lane runs its family's positive
// control (a well-formed, authenticated request that must succeed) at its start, every CONTROL_EVERY cases and at its
// end, and a family whose controls never passed, or whose cases never reached what it aims at, fails the run.
import fc from 'fast-check';
import { FAMILIES } from './families.ts';
import type { Family, LaneContext } from './family.ts';
import { FindingError, type Finding, type FindingKind } from './oracle.ts';
import type { FuzzTarget } from './target.ts';
import { H2Client } from './wire.ts';
import { boundProblems, fatalRss, formatVitals, watchEventLoop, type LoopReport } from './vitals.ts';
import type { LoopDelay } from '../harness/concierge-process.ts';

export interface FuzzOptions {
  /** Cases across all families, split by weight. */
  cases: number;
  seed: number;
  /** Lanes per family running at once, for a family of weight 20; heavier families get more, lighter fewer. */
  lanes: number;
  /** How long a case waits for an answer (raw HTTP/1.1: then as long again after half-closing). */
  deadlineMs: number;
  /** Counterexamples fast-check shrinks per family; later failures are recorded unshrunk. */
  shrinkPerFamily: number;
  /** Only these families (by name), or all. */
  families?: string[];
  log?: (line: string) => void;
  /** Set to stop early (Ctrl-C): lanes finish their current case and stop. */
  signal?: AbortSignal;
}

/** One failing case or control. */
export interface Failure {
  finding: Finding;
  /**
   * fast-check's rendering of the input (shrunk for a family's first failures), or what a control sent. Kept for a
   * family's first FAILURE_INPUTS failures only, so that a run where everything fails stays small.
   */
  input: string;
  /** The lane's seed and fast-check's path, which replay the case; null for a control. */
  seed: number | null;
  path: string | null;
  shrinks: number;
}

export interface FamilyReport {
  name: string;
  cases: number;
  /** Runs fast-check made while shrinking. */
  shrinkRuns: number;
  /** Every failing case and control, hangs included: none is left out. */
  failures: Failure[];
  /**
   * Its cases' answers by kind (status class, closed, unsendable, hang; and what the family counts besides, such as
   * answers relayed from its fake agent), shrink runs left out.
   */
  answers: Record<string, number>;
  /** Its positive controls' outcomes (undecided: the target declined for a reason of its own, a rate limit). */
  controls: { passed: number; failed: number; undecided: number };
  /** What its cases must reach (the answers tally's key), and how many did. */
  reach: string;
  reached: number;
  /** Further tally keys its cases must reach at least once each. Default: none. */
  alsoReach?: readonly string[];
  /** Whether its cases get HTTP answers (and so must get some). Default: true. */
  answersHttp?: boolean;
  /** Time its cases took, summed over lanes (mean per case = busyMs / cases). */
  busyMs: number;
}

export interface FuzzReport {
  seed: number;
  families: FamilyReport[];
  /**
   * The concierge died: its stderr, the cases in flight then, and each lane's last cases before them (a case can
   * kill it just after its own answer, or the death is seen a moment later).
   */
  crash?: {
    stderr: string;
    inFlight: string[];
    recent: string[];
    /** Why the harness ended it, when it did: what an installed pod would have been killed for (vitals.ts). */
    killed?: string;
  };
  /**
   * Errors nothing handled that the concierge reported (a rejection, after which it serves on as production does; an
   * uncaught exception, after which it exits), each with the cases in flight when it was seen and just before.
   */
  processErrors: Array<{ error: string; inFlight: string[]; recent: string[] }>;
  rss: { before: number; after: number; max: number };
  /** The concierge's memory after a full GC, before and after the cases. */
  memory: { before: NodeJS.MemoryUsage; after?: NodeJS.MemoryUsage };
  /** The concierge's event loop before, during and after the cases (vitals.ts); none when it died. */
  loop?: LoopReport;
  elapsedMs: number;
  stoppedEarly: boolean;
}

/** Lanes of a family: in proportion to its weight, so that the families finish together. */
export function familyLanes(family: { weight: number }, lanes: number): number {
  return Math.max(1, Math.round((lanes * family.weight) / 20));
}

/** The most lanes any family runs: the target makes that many of each fake agent's clusters. */
export function maxLanes(lanes: number): number {
  return Math.max(...FAMILIES.map((f) => familyLanes(f, lanes)));
}

/** A lane runs its family's positive control before its first case, after every this many, and after its last. */
export const CONTROL_EVERY = 100;
/** Failures whose inputs a family keeps; the rest are counted and kept without them. */
const FAILURE_INPUTS = 50;
/** The tally key of every answer that is an HTTP response, whatever its status: the default reach. */
const ANY_RESPONSE = /^\dxx$/;

/** A lane's seed: the run's seed, the family and the lane mixed (FNV-1a), so that lanes never share a stream. */
function laneSeed(seed: number, family: string, lane: number, round: number): number {
  let h = 0x811c9dc5 ^ seed;
  for (const c of `${family}/${lane}/${round}`) h = Math.imul(h ^ c.charCodeAt(0), 0x01000193);
  return h | 0;
}

function toFinding(err: unknown): Finding {
  if (err instanceof FindingError) return err.finding;
  return { kind: 'other', message: `the case threw: ${(err as Error)?.stack ?? String(err)}` };
}

export async function runFuzz(target: FuzzTarget, opts: FuzzOptions): Promise<FuzzReport> {
  const log = opts.log ?? (() => {});
  const started = Date.now();
  const families = FAMILIES.filter((f) => !opts.families || opts.families.includes(f.name)) as Array<
    Family<unknown>
  >;
  const totalWeight = families.reduce((sum, f) => sum + f.weight, 0);
  const reports = new Map<string, FamilyReport>(
    families.map((f) => [
      f.name,
      {
        name: f.name,
        cases: 0,
        shrinkRuns: 0,
        failures: [],
        answers: {},
        controls: { passed: 0, failed: 0, undecided: 0 },
        reach: f.reach ?? 'an HTTP answer',
        reached: 0,
        alsoReach: f.alsoReach ?? [],
        answersHttp: f.answersHttp ?? true,
        busyMs: 0,
      },
    ]),
  );
  const inFlight = new Map<string, unknown>();
  /** Each lane's last RECENT cases, oldest first. */
  const recent = new Map<string, unknown[]>();
  const RECENT = 3;
  let crash: FuzzReport['crash'];
  const crashReport = (): NonNullable<FuzzReport['crash']> => ({
    stderr: target.concierge.stderr(),
    inFlight: [...inFlight.entries()].map(([lane, input]) => `${lane}: ${fc.stringify(input)}`),
    recent: [...recent.entries()].flatMap(([lane, inputs]) =>
      inputs.map((input, i) => `${lane} (${inputs.length - i} back): ${fc.stringify(input)}`),
    ),
  });
  const processErrors: FuzzReport['processErrors'] = [];
  /** The concierge's reports seen so far (it keeps those of earlier runs against it). */
  let reportsSeen = target.concierge.processErrors().length;
  const collectProcessErrors = (): void => {
    const reported = target.concierge.processErrors();
    for (const error of reported.slice(reportsSeen)) {
      const { inFlight, recent } = crashReport();
      processErrors.push({ error, inFlight, recent });
      log(error.split('\n')[0]!.slice(0, 200));
    }
    reportsSeen = reported.length;
  };
  let stopped = false;
  const stop = (): boolean => stopped || crash !== undefined || opts.signal?.aborted === true;

  await target.concierge.memory(); // a GC first, so that "before" is what the proxy really holds
  const memoryBefore = await target.concierge.memory();
  const rssBefore = target.concierge.rss();
  let rssMax = rssBefore;
  /** Ends a concierge that an install would have lost (past its memory limit, or failing its liveness probe). */
  const kill = (why: string): void => {
    if (crash) return;
    crash = { ...crashReport(), killed: why };
    try {
      process.kill(target.concierge.pid, 'SIGKILL');
    } catch {
      // gone already
    }
  };
  const watch = setInterval(() => {
    collectProcessErrors();
    if (!target.concierge.alive()) {
      crash ??= crashReport();
      return;
    }
    try {
      rssMax = Math.max(rssMax, target.concierge.rss());
      const fatal = fatalRss(rssMax);
      if (fatal) kill(fatal);
    } catch {
      // the process is exiting; the next tick sees it dead
    }
  }, 250);
  const loop = watchEventLoop(
    target.concierge,
    () => [...inFlight.entries()].map(([lane, input]) => `${lane}: ${fc.stringify(input)}`),
    kill,
  );
  await loop.start();
  const progress = setInterval(() => {
    const done = [...reports.values()].map((r) => `${r.name} ${r.cases}`).join(', ');
    log(`${done}; rss ${Math.round(rssMax / 2 ** 20)} MiB max`);
  }, 15_000);

  const record = (report: FamilyReport, failure: Failure): void => {
    report.failures.push(report.failures.length < FAILURE_INPUTS ? failure : { ...failure, input: '' });
    log(`${report.name}: ${failure.finding.kind}: ${failure.finding.message.slice(0, 200)}`);
  };

  const runLane = async (family: Family<unknown>, lane: number, numRuns: number): Promise<void> => {
    const report = reports.get(family.name)!;
    const key = `${family.name}#${lane}`;
    /** Whether fast-check is shrinking a failure: those runs are not counted among the answers. */
    let shrinking = false;
    /** Whether the lane's control is running: what it counts is kept apart from the cases' answers. */
    let controlling = false;
    const ctx: LaneContext = {
      target,
      lane,
      deadlineMs: opts.deadlineMs,
      h2: new H2Client(target.concierge.url, target.proxyCA),
      h2Cert: new H2Client(target.concierge.url, target.proxyCA, target.userCert),
      state: {},
      count(counted) {
        if (shrinking) return;
        const what = controlling ? `control: ${counted}` : counted;
        report.answers[what] = (report.answers[what] ?? 0) + 1;
        if (what === family.reach || (family.reach === undefined && ANY_RESPONSE.test(what)))
          report.reached++;
      },
    };
    const control = async (): Promise<void> => {
      controlling = true;
      try {
        if ((await family.control(ctx)) === 'undecided') report.controls.undecided++;
        else report.controls.passed++;
      } catch (err) {
        // A control cut short by a crash is not a finding of its own: the crash is.
        if (!crash) await new Promise((done) => setTimeout(done, 250));
        if (crash || !target.concierge.alive()) return;
        report.controls.failed++;
        const finding = toFinding(err);
        record(report, {
          finding: finding.kind === 'other' ? { ...finding, kind: 'control-failed' } : finding,
          input: `${family.name}: positive control`,
          seed: null,
          path: null,
          shrinks: 0,
        });
      } finally {
        controlling = false;
      }
    };
    let remaining = numRuns;
    let laneCases = 0;
    try {
      for (let round = 0; remaining > 0 && !stop(); round++) {
        let failedOnce = false;
        const seed = laneSeed(opts.seed, family.name, lane, round);
        const details = await fc.check(
          fc.asyncProperty(family.arbitrary, async (input) => {
            if (stop()) return;
            shrinking = failedOnce;
            if (failedOnce) report.shrinkRuns++;
            else {
              if (laneCases++ % CONTROL_EVERY === 0) await control();
              report.cases++;
            }
            inFlight.set(key, input);
            const began = Date.now();
            try {
              await family.run(input, ctx);
            } catch (err) {
              // A case cut short by a crash (its own or another lane's) is not a finding of its own: the crash is.
              // The process's exit can reach us a moment after the refused connection that it caused.
              if (!crash) await new Promise((done) => setTimeout(done, 250));
              if (crash || !target.concierge.alive()) return;
              failedOnce = true;
              throw err;
            } finally {
              inFlight.delete(key);
              report.busyMs += Date.now() - began;
              if (!failedOnce) recent.set(key, [...(recent.get(key) ?? []), input].slice(-RECENT));
            }
            // The crash is reported once, with the cases around it (crashReport); with the process gone there is
            // nothing to shrink against.
            if (!target.concierge.alive()) crash ??= crashReport();
          }),
          {
            numRuns: remaining,
            seed,
            endOnFailure: report.failures.length >= opts.shrinkPerFamily,
          },
        );
        remaining -= details.failed ? Math.max(1, details.numRuns) : remaining;
        if (!details.failed) continue;
        record(report, {
          finding: toFinding(details.errorInstance),
          input: fc.stringify(details.counterexample?.[0]).slice(0, 4000),
          seed,
          path: details.counterexamplePath,
          shrinks: details.numShrinks,
        });
      }
      // The last control comes after every hostile case of the lane: the target still serves what it must.
      if (!stop()) await control();
    } finally {
      ctx.h2.close();
      ctx.h2Cert.close();
      await family.closeLane?.(ctx);
    }
  };

  // Each family's share by weight, rounded down, and the cases left over to the largest remainders: the shares add
  // up to the cases asked for.
  const exact = families.map((f) => (opts.cases * f.weight) / totalWeight);
  const shares = exact.map(Math.floor);
  const byRemainder = exact.map((x, i) => [x - Math.floor(x), i] as const).sort((a, b) => b[0] - a[0]);
  const leftOver = opts.cases - shares.reduce((sum, n) => sum + n, 0);
  for (let k = 0; k < leftOver; k++) shares[byRemainder[k]![1]]!++;
  const lanes: Array<Promise<void>> = [];
  for (const [i, family] of families.entries()) {
    const cases = shares[i]!;
    const count = familyLanes(family, opts.lanes);
    for (let lane = 0; lane < count; lane++) {
      const share = Math.floor(cases / count) + (lane < cases % count ? 1 : 0);
      if (share > 0) lanes.push(runLane(family, lane, share));
    }
  }
  try {
    await Promise.all(lanes);
  } finally {
    stopped = true;
    clearInterval(watch);
    clearInterval(progress);
  }
  collectProcessErrors();
  const loopReport = await loop.stop();
  if (!crash && !target.concierge.alive()) crash = crashReport();

  // A process the harness killed may not have exited yet.
  const alive = target.concierge.alive() && !crash?.killed;
  const memoryAfter = alive ? await target.concierge.memory().catch(() => undefined) : undefined;
  return {
    seed: opts.seed,
    families: [...reports.values()],
    ...(crash ? { crash } : {}),
    processErrors,
    rss: { before: rssBefore, after: alive ? target.concierge.rss() : 0, max: rssMax },
    memory: { before: memoryBefore, ...(memoryAfter ? { after: memoryAfter } : {}) },
    ...(loopReport ? { loop: loopReport } : {}),
    elapsedMs: Date.now() - started,
    stoppedEarly: opts.signal?.aborted === true,
  };
}

/**
 * What a family's tallies say it never did, though no single answer was wrong: a family whose positive controls
 * never passed, or whose cases never reached what they aim at (the tunnel family's fake agent never answered, every
 * request was reset), tested nothing. Empty for a family that ran no cases.
 */
export function familyProblems(f: FamilyReport): string[] {
  if (f.cases === 0) return [];
  const problems: string[] = [];
  if (f.controls.passed === 0)
    problems.push(`${f.name}: no positive control passed (${f.controls.failed} failed)`);
  if (f.reached === 0) problems.push(`${f.name}: none of its ${f.cases} cases reached ${f.reach}`);
  for (const what of f.alsoReach ?? [])
    if (!f.answers[what]) problems.push(`${f.name}: none of its ${f.cases} cases reached ${what}`);
  if (f.answersHttp === false) return problems;
  const responses = Object.entries(f.answers)
    .filter(([kind]) => ANY_RESPONSE.test(kind))
    .reduce((sum, [, n]) => sum + n, 0);
  if (responses === 0) problems.push(`${f.name}: none of its ${f.cases} cases got an HTTP answer`);
  return problems;
}

/** Every failure of the run by kind, across families. */
export function failuresByKind(report: FuzzReport): Map<FindingKind, number> {
  const byKind = new Map<FindingKind, number>();
  for (const f of report.families)
    for (const c of f.failures) byKind.set(c.finding.kind, (byKind.get(c.finding.kind) ?? 0) + 1);
  return byKind;
}

/** Whether the report holds anything worth failing a run for. */
export function hasFindings(report: FuzzReport): boolean {
  return (
    report.crash !== undefined ||
    report.processErrors.length > 0 ||
    report.families.some((f) => f.failures.length > 0 || familyProblems(f).length > 0) ||
    boundProblems(report).length > 0
  );
}

/**
 * The event loop over several seeds: before the first, after the last, and over the cases the worst of each figure
 * (percentiles cannot be merged; the worst seed's is an upper bound of the whole run's).
 */
function mergeLoops(reports: FuzzReport[]): { loop: LoopReport } | undefined {
  const loops = reports.flatMap((r) => (r.loop ? [r.loop] : []));
  if (loops.length === 0) return undefined;
  const worst = (pick: (l: LoopReport) => LoopDelay): LoopDelay =>
    loops.map(pick).reduce((a, b) => ({
      p50: Math.max(a.p50, b.p50),
      p99: Math.max(a.p99, b.p99),
      max: Math.max(a.max, b.max),
      mean: Math.max(a.mean, b.mean),
      samples: a.samples + b.samples,
    }));
  return {
    loop: {
      before: loops[0]!.before,
      during: worst((l) => l.during),
      worstSecond: worst((l) => l.worstSecond),
      after: loops.at(-1)!.after,
      stalls: loops.flatMap((l) => l.stalls),
    },
  };
}

/**
 * The cases of each seed when a run splits `cases` over `seeds` seeds: as even as they go, the first seeds taking
 * what is left over. Each seed's part replays alone with FUZZ_SEED=<seed> FUZZ_CASES=<its cases>: a lane's cases
 * depend on the seed, the family and the lane, never on the other seeds.
 */
export function seedShares(cases: number, seeds: number): number[] {
  return Array.from({ length: seeds }, (_, i) => Math.floor(cases / seeds) + (i < cases % seeds ? 1 : 0));
}

/**
 * A run over several seeds as one report: each family's cases, failures and tallies summed over the seeds, the first
 * crash, the memory from the first seed's start to the last one's end. Whether a family tested anything is judged on
 * this: a light family's share of one seed (registration's is a twentieth of it) may by chance reach nothing.
 */
export function mergeReports(reports: FuzzReport[]): FuzzReport {
  const families = new Map<string, FamilyReport>();
  for (const r of reports)
    for (const f of r.families) {
      const sum = families.get(f.name);
      if (!sum) {
        families.set(f.name, {
          ...f,
          failures: [...f.failures],
          answers: { ...f.answers },
          controls: { ...f.controls },
        });
        continue;
      }
      sum.cases += f.cases;
      sum.shrinkRuns += f.shrinkRuns;
      sum.failures.push(...f.failures);
      for (const [kind, n] of Object.entries(f.answers)) sum.answers[kind] = (sum.answers[kind] ?? 0) + n;
      sum.controls.passed += f.controls.passed;
      sum.controls.failed += f.controls.failed;
      sum.controls.undecided += f.controls.undecided;
      sum.reached += f.reached;
      sum.busyMs += f.busyMs;
    }
  const first = reports[0]!;
  const last = reports.at(-1)!;
  const crash = reports.find((r) => r.crash)?.crash;
  return {
    seed: first.seed,
    families: [...families.values()],
    ...(crash ? { crash } : {}),
    processErrors: reports.flatMap((r) => r.processErrors),
    rss: {
      before: first.rss.before,
      after: last.rss.after,
      max: Math.max(...reports.map((r) => r.rss.max)),
    },
    memory: { before: first.memory.before, ...(last.memory.after ? { after: last.memory.after } : {}) },
    ...(mergeLoops(reports) ?? {}),
    elapsedMs: reports.reduce((sum, r) => sum + r.elapsedMs, 0),
    stoppedEarly: last.stoppedEarly,
  };
}

/** What a run over several seeds found, after each seed's own report (`mergeReports` says how it is judged). */
export function formatSummary(reports: FuzzReport[], notRun: number[]): string {
  const merged = mergeReports(reports);
  const cases = merged.families.reduce((n, f) => n + f.cases, 0);
  const failing = reports.filter(
    (r) => r.crash || r.processErrors.length > 0 || r.families.some((f) => f.failures.length > 0),
  );
  const lines = [
    `fuzz over ${reports.length + notRun.length} seeds: ${cases} cases in ${(merged.elapsedMs / 1000).toFixed(1)} s, ` +
      `${merged.crash ? 1 : 0} crashes, ${merged.processErrors.length} errors nothing handled, ` +
      `${failing.length} seeds with findings` +
      (failing.length ? ` (${failing.map((r) => r.seed).join(', ')})` : ''),
  ];
  if (notRun.length) lines.push(`not run, the concierge being gone: ${notRun.join(', ')}`);
  for (const f of merged.families)
    lines.push(
      `  ${f.name.padEnd(24)} ${String(f.cases).padStart(7)} cases, ${f.failures.length} failing, ` +
        `controls ${f.controls.passed} passed ${f.controls.failed} failed, ${f.reached} reached ${f.reach}`,
    );
  for (const f of merged.families)
    for (const problem of familyProblems(f)) lines.push(`tested nothing: ${problem}`);
  lines.push(
    `concierge RSS over the run: before ${MiB(merged.rss.before)}, after ${MiB(merged.rss.after)}, ` +
      `max ${MiB(merged.rss.max)} (growth ${MiB(merged.rss.after - merged.rss.before)})`,
  );
  for (const r of failing)
    lines.push(
      `seed ${r.seed} found something: keep it in integration/fuzz.test.ts (KNOWN_BAD_SEEDS), with the family and ` +
        `as many cases as it took to reach the finding`,
    );
  return lines.join('\n');
}

const MiB = (n: number): string => `${(n / 2 ** 20).toFixed(1)} MiB`;

/**
 * One run's report. `judged`: whether its families' tallies are judged here (false for one seed of several, whose
 * tallies `formatSummary` judges together).
 */
export function formatReport(report: FuzzReport, judged = true): string {
  const lines: string[] = [];
  const total = report.families.reduce((sum, f) => sum + f.cases, 0);
  lines.push(`fuzz: ${total} cases in ${(report.elapsedMs / 1000).toFixed(1)} s, seed ${report.seed}`);
  for (const f of report.families) {
    lines.push(
      `  ${f.name.padEnd(24)} ${String(f.cases).padStart(7)} cases, ${f.failures.length} failing, ` +
        `controls ${f.controls.passed} passed ${f.controls.failed} failed` +
        (f.controls.undecided ? ` ${f.controls.undecided} undecided` : '') +
        `, ${f.reached} reached ${f.reach}, ` +
        `${(f.busyMs / Math.max(1, f.cases + f.shrinkRuns)).toFixed(0)} ms a case` +
        (f.shrinkRuns ? ` (${f.shrinkRuns} shrink runs)` : ''),
    );
    const answers = Object.entries(f.answers).sort(([a], [b]) => a.localeCompare(b));
    lines.push(
      `  ${''.padEnd(24)} answers: ${answers.map(([kind, n]) => `${kind} ${n}`).join(', ') || 'none'}`,
    );
  }
  const byKind = failuresByKind(report);
  lines.push(`crashes: ${report.crash ? 1 : 0}`);
  lines.push(`errors nothing handled, reported by the concierge: ${report.processErrors.length}`);
  lines.push(`proxy-made 5xx: ${byKind.get('proxy-5xx') ?? 0}`);
  for (const [kind, n] of byKind) if (kind !== 'proxy-5xx') lines.push(`${kind}: ${n}`);
  if (judged)
    for (const f of report.families)
      for (const problem of familyProblems(f)) lines.push(`tested nothing: ${problem}`);
  lines.push(
    `concierge RSS: before ${MiB(report.rss.before)}, after ${MiB(report.rss.after)}, max ${MiB(report.rss.max)}` +
      ` (growth ${MiB(report.rss.after - report.rss.before)})`,
  );
  const { before, after } = report.memory;
  if (after)
    lines.push(
      `concierge after a full GC: heap used ${MiB(before.heapUsed)} → ${MiB(after.heapUsed)} (of ` +
        `${MiB(before.heapTotal)} → ${MiB(after.heapTotal)} reserved), external ` +
        `${MiB(before.external)} → ${MiB(after.external)}, array buffers ${MiB(before.arrayBuffers)} → ` +
        `${MiB(after.arrayBuffers)}`,
    );
  lines.push(...formatVitals(report));
  if (report.stoppedEarly) lines.push('stopped early (interrupted)');
  for (const f of report.families) {
    for (const c of f.failures.slice(0, 5)) {
      lines.push('', `[${f.name}] ${c.finding.kind}: ${c.finding.message}`);
      lines.push(`  input (${c.shrinks} shrinks): ${c.input}`);
      if (c.seed !== null) lines.push(`  replay: seed ${c.seed}, path ${c.path ?? '-'}`);
    }
    if (f.failures.length > 5) lines.push('', `[${f.name}] and ${f.failures.length - 5} more failures`);
  }
  for (const e of report.processErrors.slice(0, 5)) {
    lines.push('', e.error.slice(0, 2000), 'cases in flight then:');
    for (const c of e.inFlight) lines.push(`  ${c.slice(0, 2000)}`);
    lines.push("each lane's last cases before:");
    for (const c of e.recent) lines.push(`  ${c.slice(0, 2000)}`);
  }
  if (report.processErrors.length > 5)
    lines.push('', `and ${report.processErrors.length - 5} more errors reported`);
  if (report.crash) {
    lines.push(
      '',
      report.crash.killed
        ? `the harness killed the concierge: ${report.crash.killed}; cases in flight then:`
        : 'the concierge crashed; cases in flight then:',
    );
    for (const c of report.crash.inFlight) lines.push(`  ${c.slice(0, 2000)}`);
    lines.push("each lane's last cases before:");
    for (const c of report.crash.recent) lines.push(`  ${c.slice(0, 2000)}`);
    lines.push('its stderr (tail):', report.crash.stderr.slice(-4000));
  }
  return lines.join('\n');
}
