// The fuzz oracle catches a broken proxy: each mutant front (mutants.ts) breaks one thing between the fuzzer and the
// real concierge, and a short seeded run through it must fail with the finding that names what broke, and only that.
// A run through the same front mutating nothing finds nothing, so a mutant's finding comes from its mutation and not
// from the front (the unmutated concierge alone is fuzz.test.ts's). Last, a front between a second concierge and the
// API server drops the user's groups the concierge impersonates, which only the positive controls can notice.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { eventually } from '../../dev/eventually.ts';
import { issueCert, loadCA } from '../../lib/pki/pki.ts';
import { startConciergeProcess, type ConciergeProcess } from '../harness/concierge-process.ts';
import { startApiServerFront, startMutantFront, type Mutation } from './mutants.ts';
import { familyProblems, formatReport, runFuzz, type FuzzOptions, type FuzzReport } from './run.ts';
import { FUZZ_GROUP, FUZZ_USER, startFuzzTarget, type FuzzTarget } from './target.ts';
import { H2Client } from './wire.ts';
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

const options = (families: string[], cases: number): FuzzOptions => ({
  cases,
  seed: SEED,
  lanes: LANES,
  deadlineMs: 20_000,
  // Every failure recorded as it comes: shrinking a mutant's counterexample costs time and proves nothing here.
  shrinkPerFamily: 0,
  families,
});

/** One run through a front to the concierge that breaks what `mutation` says. */
async function runThrough(mutation: Mutation, families: string[], cases: number): Promise<FuzzReport> {
  const front = await startMutantFront(target!, mutation);
  try {
    return await runFuzz(front.target, options(families, cases));
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

describe("a concierge whose requests to the API server lose the user's groups", () => {
  // A second concierge (controllers off) whose API server is a front to the fuzz cluster's, with the same
  // JWTAuthenticator and a client certificate from its own signer: the front drops the Impersonate-Group fields it
  // forwards, so the API server decides for the fuzz user without the group that may read.
  it('fails the run through the positive controls, where the same front mutating nothing passes', async () => {
    const { cluster } = target!;
    const front = await startApiServerFront(cluster, 'none');
    let concierge: ConciergeProcess | undefined;
    try {
      concierge = await startConciergeProcess({
        dir: cluster.dir,
        url: front.url,
        binaries: cluster.binaries,
      });
      const signer = await loadCA(concierge.signer.certPem, concierge.signer.keyPem);
      const userCert = await issueCert(signer, {
        commonName: FUZZ_USER,
        organizations: [FUZZ_GROUP],
        usage: 'client',
      });
      const behind: FuzzTarget = {
        ...target!,
        concierge,
        proxyPort: Number(new URL(concierge.url).port),
        proxyCA: concierge.servingCA,
        userCert: { certPem: userCert.certPem, keyPem: userCert.keyPem },
      };
      // Its authenticator cache fills from the API server after it starts: serving the fuzz token is the sign.
      const client = new H2Client(concierge.url, concierge.servingCA);
      await eventually(async () => {
        const answer = await client.request(
          {
            headers: {
              ':method': 'GET',
              ':path': '/api/v1/namespaces',
              authorization: `Bearer ${target!.token}`,
            },
          },
          20_000,
        );
        if (answer.kind !== 'response' || answer.status !== 200)
          throw new Error(`the second concierge does not serve the fuzz token yet: ${answer.kind}`);
      }, 60_000);
      client.close();

      const clean = await runFuzz(behind, options(['HTTP/2'], 60));
      front.mutation = 'drop-groups';
      const broken = await runFuzz(behind, options(['HTTP/2'], 60));
      process.stderr.write(`${formatReport(broken)}\n`);
      expect({ clean: outcome(clean), broken: outcome(broken) }).toEqual({
        clean: { crash: undefined, processErrors: [], kinds: [], problems: [] },
        broken: {
          crash: undefined,
          processErrors: [],
          kinds: ['control-failed'],
          problems: [expect.stringMatching(/^HTTP\/2: no positive control passed \(\d+ failed\)$/)],
        },
      });
    } finally {
      await concierge?.stop();
      await front.close();
    }
  }, 120_000);
});
