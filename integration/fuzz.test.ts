// A short, seeded run of the fuzzer (integration/fuzz/, `npm run fuzz` for the long one) against a real API server
// and the concierge in its own process: hostile HTTP/1.1 and HTTP/2 requests, forged and odd tokens,
// TokenCredentialRequest bodies, strangers and broken agents at the tunnel listener, registrations, CSRs, and
// requests on the peer link. None may crash the concierge, get a 5xx the proxy made itself, a 401 other than the
// one, or credentials it must not get; every family's positive controls must pass and its cases reach their target.
// Then a slice of the SSH family against the door, held to the same, and to the memory bounds (its event-loop
// bounds are timing, judged by `npm run fuzz` and only reported here).
import { afterAll, beforeAll, expect, it } from '@jest/globals';
import { FAMILIES } from './fuzz/families.ts';
import { familyProblems, formatReport, maxLanes, runFuzz } from './fuzz/run.ts';
import { sshFamily } from './fuzz/ssh.ts';
import { startFuzzTarget, type FuzzTarget } from './fuzz/target.ts';
import { memoryProblems } from './fuzz/vitals.ts';

/** Fixed, so that a failure here replays with FUZZ_SEED=20260101 FUZZ_CASES=1500 npm run fuzz. */
const SEED = 20260101;
const CASES = 1500;
const LANES = 2;
/** The SSH slice: FUZZ_SEED=20260102 FUZZ_CASES=300 FUZZ_FAMILIES=ssh npm run fuzz replays it. */
const SSH_SEED = 20260102;
const SSH_CASES = 300;
/** The HTTP side's families; the SSH family runs in a slice of its own, after, so that a crash hides nothing. */
const HTTP_FAMILIES = FAMILIES.map((f) => f.name).filter((name) => name !== sshFamily.name);

let target: FuzzTarget | undefined;

beforeAll(async () => {
  target = await startFuzzTarget({ agents: maxLanes(LANES) });
}, 120_000);

afterAll(async () => {
  await target?.stop();
});

it('survives a seeded fuzz run without a crash, a proxy-made 5xx, another 401 or a forged credential accepted', async () => {
  const report = await runFuzz(target!, {
    cases: CASES,
    seed: SEED,
    lanes: LANES,
    // Generous: an answer owed this long is stuck, not slow, even on a loaded machine (the long run keeps it short).
    deadlineMs: 20_000,
    shrinkPerFamily: 1,
    families: HTTP_FAMILIES,
  });
  // The answer kinds of every family, for whoever reads the log: what the run reached, not only that nothing failed.
  process.stderr.write(`${formatReport(report)}\n`);
  // Every failure, hangs included, and every family that tested nothing.
  const failures = report.families.flatMap((f) =>
    f.failures.map((c) => `${f.name}: ${c.finding.kind}: ${c.finding.message.slice(0, 500)}`),
  );
  expect({
    crash: report.crash,
    failures,
    problems: report.families.flatMap(familyProblems),
  }).toEqual({ crash: undefined, failures: [], problems: [] });
  expect(report.families.reduce((sum, f) => sum + f.cases, 0)).toBe(CASES);
}, 300_000);

it('survives a seeded SSH slice: no crash, no forgery, answers owed, a user served beside the crowds, memory bounded', async () => {
  const report = await runFuzz(target!, {
    cases: SSH_CASES,
    seed: SSH_SEED,
    lanes: LANES,
    deadlineMs: 20_000,
    shrinkPerFamily: 1,
    families: [sshFamily.name],
  });
  process.stderr.write(`${formatReport(report)}\n`);
  const failures = report.families.flatMap((f) =>
    f.failures.map((c) => `${f.name}: ${c.finding.kind}: ${c.finding.message.slice(0, 500)}`),
  );
  expect({
    crash: report.crash,
    failures,
    problems: report.families.flatMap(familyProblems),
    memory: memoryProblems(report),
  }).toEqual({ crash: undefined, failures: [], problems: [], memory: [] });
  expect(report.families[0]?.cases).toBe(SSH_CASES);
}, 300_000);
