// The fuzz oracle catches a broken proxy: each mutant front (mutants.ts) breaks one thing between the fuzzer and the
// real concierge, and a short seeded run through it must fail with the finding that names what broke, and only that.
// A run through the same front mutating nothing finds nothing, so a mutant's finding comes from its mutation and not
// from the front (the unmutated concierge alone is fuzz.test.ts's).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startMutantFront, type Mutation } from './mutants.ts';
import { familyProblems, formatReport, runFuzz, type FuzzReport } from './run.ts';
import { startFuzzTarget, type FuzzTarget } from './target.ts';
import type { FindingKind } from './oracle.ts';

/** Fixed, so that a run replays; small, since each mutant is caught within its first few dozen cases. */
const SEED = 20260201;
const LANES = 2;

let target: FuzzTarget | undefined;

beforeAll(async () => {
  // The families run here need no fake agents; the target's peer identities need one agent's certificate.
  target = await startFuzzTarget({ agents: 1 });
}, 120_000);

afterAll(async () => {
  await target?.stop();
});

/** One run through a front that breaks what `mutation` says. */
async function runThrough(mutation: Mutation, families: string[], cases: number): Promise<FuzzReport> {
  const front = await startMutantFront(target!, mutation);
  try {
    return await runFuzz(front.target, {
      cases,
      seed: SEED,
      lanes: LANES,
      deadlineMs: 20_000,
      // Every failure recorded as it comes: shrinking a mutant's counterexample costs time and proves nothing here.
      shrinkPerFamily: 0,
      families,
    });
  } finally {
    await front.close();
  }
}

/** What the run found, by kind, and whatever made it untested or a crash. */
function outcome(report: FuzzReport): object {
  return {
    crash: report.crash?.stderr,
    processErrors: report.processErrors.map((e) => e.error),
    kinds: [...new Set(report.families.flatMap((f) => f.failures.map((c) => c.finding.kind)))].sort(),
    problems: report.families.flatMap(familyProblems),
  };
}

interface Mutant {
  mutation: Mutation;
  what: string;
  families: string[];
  cases: number;
  kind: FindingKind;
}

const MUTANTS: Mutant[] = [
  {
    mutation: 'own-5xx',
    what: "answers 500 of its own where the API server refused (no Audit-Id: not the API server's)",
    // Both sides of the front, HTTP/1.1 and HTTP/2. Few of their cases are the fuzz user's well-formed requests that
    // reach the API server; 300 bring several of each.
    families: ['raw HTTP/1.1', 'HTTP/2'],
    cases: 300,
    kind: 'proxy-5xx',
  },
  {
    mutation: 'forged-token',
    what: 'serves a token the concierge refuses as the fuzz user',
    families: ['bearer tokens'],
    cases: 60,
    kind: 'accepted-forgery',
  },
  {
    mutation: 'drop-impersonation',
    what: "drops the client's Impersonate-* fields, serving the request as its caller",
    // Few HTTP/2 cases reach the API server with an impersonation it reads; 400 bring several.
    families: ['HTTP/2'],
    cases: 400,
    kind: 'impersonation-ignored',
  },
];

describe('a broken proxy', () => {
  it.each(MUTANTS)(
    'that $what fails the run with $kind',
    async ({ mutation, families, cases, kind }) => {
      const report = await runThrough(mutation, families, cases);
      process.stderr.write(`${formatReport(report)}\n`);
      // Its controls pass and its cases reach the API server: the finding is the only thing wrong, and every family
      // run finds it.
      expect({
        ...outcome(report),
        caughtBy: report.families.filter((f) => f.failures.length > 0).map((f) => f.name),
      }).toEqual({ crash: undefined, processErrors: [], kinds: [kind], problems: [], caughtBy: families });
    },
    120_000,
  );
});

describe('the front that mutates nothing', () => {
  it('passes the same families cleanly: a mutant is caught for its mutation, not for the front', async () => {
    const families = [...new Set(MUTANTS.flatMap((m) => m.families))];
    const report = await runThrough('none', families, 600);
    process.stderr.write(`${formatReport(report)}\n`);
    expect(outcome(report)).toEqual({ crash: undefined, processErrors: [], kinds: [], problems: [] });
  }, 120_000);
});
