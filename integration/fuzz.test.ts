// A short, seeded run of the fuzzer (integration/fuzz/, `npm run fuzz` for the long one) against a real API server
// and the concierge in its own process: hostile HTTP/1.1 and HTTP/2 requests, forged and odd tokens,
// TokenCredentialRequest bodies, strangers and broken agents at the tunnel listener. None may crash the concierge,
// get a 5xx the proxy made itself, a 401 other than the one, or credentials it must not get.
import { afterAll, beforeAll, expect, it } from '@jest/globals';
import { familyLanes, formatReport, runFuzz } from './fuzz/run.ts';
import { tunnelFamily } from './fuzz/families.ts';
import { startFuzzTarget, type FuzzTarget } from './fuzz/target.ts';

/** Fixed, so that a failure here replays with FUZZ_SEED=20260101 FUZZ_CASES=1500 npm run fuzz. */
const SEED = 20260101;
const CASES = 1500;
const LANES = 2;

let target: FuzzTarget | undefined;

beforeAll(async () => {
  target = await startFuzzTarget({ agents: familyLanes(tunnelFamily, LANES) });
}, 120_000);

afterAll(async () => {
  await target?.stop();
});

it('survives a seeded fuzz run without a crash, a proxy-made 5xx, another 401 or a forged credential accepted', async () => {
  const report = await runFuzz(target!, {
    cases: CASES,
    seed: SEED,
    lanes: LANES,
    // Generous: a loaded machine must not turn a slow answer into a finding (the long run keeps it short).
    deadlineMs: 20_000,
    shrinkPerFamily: 1,
  });
  const findings = report.families
    .flatMap((f) => f.counterexamples)
    // A missed deadline is a timing, which has no place in an assertion; `npm run fuzz` reports it.
    .filter((c) => c.finding.kind !== 'hang');
  expect({ crash: report.crash, findings, text: findings.length ? formatReport(report) : '' }).toEqual({
    crash: undefined,
    findings: [],
    text: '',
  });
  expect(report.families.reduce((sum, f) => sum + f.cases, 0)).toBe(CASES);
}, 300_000);
