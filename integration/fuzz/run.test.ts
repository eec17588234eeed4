// The fuzzer's own summary: what makes a run fail when no single answer is wrong. A proxy that resets every stream
// and closes every connection gives the oracle nothing to object to case by case (a closed connection is a legitimate
// answer to a hostile request), so only the positive controls and the families' tallies can fail it; this runs two
// families against such a proxy, and checks the summary of a made-up report, to show that they do.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { constants, createSecureServer, type Http2SecureServer } from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import { issueCert, newCA } from '../../lib/pki/pki.ts';
import {
  familyProblems,
  hasFindings,
  mergeReports,
  runFuzz,
  seedShares,
  type FamilyReport,
  type FuzzReport,
} from './run.ts';
import type { FuzzTarget } from './target.ts';

let server: Http2SecureServer;
let target: FuzzTarget;
const sockets = new Set<Socket>();

beforeAll(async () => {
  const ca = await newCA('fuzz summary test');
  const serving = await issueCert(ca, { commonName: 'resetter', hosts: ['127.0.0.1'], usage: 'server' });
  const user = await issueCert(ca, { commonName: 'fuzzer', usage: 'client' });
  // Every HTTP/2 stream reset, every HTTP/1.1 connection closed, before any answer.
  server = createSecureServer({ key: serving.keyPem, cert: serving.certPem, allowHTTP1: true }, (req) => {
    if (req.httpVersion === '2.0') req.stream.close(constants.NGHTTP2_REFUSED_STREAM);
    else req.socket.destroy();
  });
  // Node's own 400 for a request it cannot parse would be an answer: those connections close too.
  server.on('clientError', (_err, socket: Socket) => socket.destroy());
  server.on('connection', (socket: Socket) => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const port = (server.address() as AddressInfo).port;
  // Only what the HTTP/2 and raw HTTP/1.1 families and the runner use: the proxy's address and CA, credentials, and a
  // process that never dies.
  target = {
    concierge: {
      url: `https://127.0.0.1:${port}`,
      alive: () => true,
      rss: () => 100 * 2 ** 20,
      memory: () => Promise.resolve(process.memoryUsage()),
      eventLoop: () => Promise.resolve({ p50: 0, p99: 0, max: 0, mean: 0, samples: 0 }),
      resetEventLoop: () => Promise.resolve(),
      answeredAt: () => Date.now(),
      stderr: () => '',
      processErrors: () => [],
    },
    proxyPort: port,
    proxyCA: ca.certPem,
    token: 'a.b.c',
    userCert: { certPem: user.certPem, keyPem: user.keyPem },
  } as unknown as FuzzTarget;
});

afterAll(async () => {
  for (const socket of sockets) socket.destroy();
  await new Promise<void>((done) => server.close(() => done()));
});

describe('a proxy that resets every stream', () => {
  it('fails the run through the controls and the tallies, though no case is wrong by itself', async () => {
    const report = await runFuzz(target, {
      cases: 60,
      seed: 37,
      lanes: 1,
      deadlineMs: 5_000,
      shrinkPerFamily: 1,
      families: ['raw HTTP/1.1', 'HTTP/2'],
    });
    const failures = report.families.flatMap((f) => f.failures.map((c) => c.finding.kind));
    expect({
      findings: hasFindings(report),
      // Every failure is a control's: the oracle passes each closed or reset answer on its own.
      kinds: [...new Set(failures)],
      problems: report.families.flatMap(familyProblems),
    }).toEqual({
      findings: true,
      kinds: ['control-failed'],
      problems: [
        expect.stringMatching(/^raw HTTP\/1.1: no positive control passed \(\d+ failed\)$/),
        'raw HTTP/1.1: none of its 33 cases reached an HTTP answer',
        'raw HTTP/1.1: none of its 33 cases got an HTTP answer',
        expect.stringMatching(/^HTTP\/2: no positive control passed \(\d+ failed\)$/),
        'HTTP/2: none of its 27 cases reached an HTTP answer',
        'HTTP/2: none of its 27 cases got an HTTP answer',
      ],
    });
    expect(report.families.map((f) => Object.keys(f.answers).sort())).toEqual([
      ['closed'],
      expect.arrayContaining(['closed']),
    ]);
  }, 60_000);
});

describe('the summary of a report', () => {
  const family = (changes: Partial<FamilyReport>): FamilyReport => ({
    name: 'f',
    cases: 100,
    shrinkRuns: 0,
    failures: [],
    answers: { '2xx': 10, '4xx': 90 },
    controls: { passed: 2, failed: 0, undecided: 0 },
    reach: 'an HTTP answer',
    reached: 100,
    busyMs: 0,
    ...changes,
  });
  const report = (f: FamilyReport): FuzzReport => ({
    seed: 1,
    families: [f],
    processErrors: [],
    rss: { before: 0, after: 0, max: 0 },
    memory: { before: process.memoryUsage() },
    elapsedMs: 0,
    stoppedEarly: false,
  });
  const hang = {
    finding: { kind: 'hang' as const, message: 'no answer' },
    input: '',
    seed: 1,
    path: null,
    shrinks: 0,
  };

  it.each([
    ['a healthy family', false, family({})],
    ['a hang, however many others passed', true, family({ failures: [hang] })],
    ['controls that never passed', true, family({ controls: { passed: 0, failed: 0, undecided: 3 } })],
    ['a target never reached', true, family({ reach: 'from the agent', reached: 0 })],
    ['answers all closed or unsendable', true, family({ answers: { closed: 60, unsendable: 40 } })],
    [
      'a stage it must also reach never reached',
      true,
      family({ alsoReach: ['signed in'], answers: { 'kex done': 100 }, answersHttp: false }),
    ],
    [
      'no HTTP answers from a family that gets none',
      false,
      family({ alsoReach: ['signed in'], answers: { 'signed in': 3 }, answersHttp: false }),
    ],
    [
      'no cases at all',
      false,
      family({ cases: 0, controls: { passed: 0, failed: 0, undecided: 0 }, reached: 0 }),
    ],
  ])('%s: findings %s', (_name, findings, f) => {
    expect(hasFindings(report(f))).toBe(findings);
  });

  const delay = (max: number, p99 = 1) => ({ p50: 0, p99, max, mean: 0, samples: 100 });
  const loop = (during: ReturnType<typeof delay>) => ({
    before: delay(1),
    during,
    worstSecond: during,
    after: delay(1),
    stalls: [],
  });
  const MiB = 2 ** 20;
  it.each([
    ['vital signs within their bounds', false, { loop: loop(delay(900, 90)) }],
    ['an event loop stalled past 1 s', true, { loop: loop(delay(1_500)) }],
    ['an event loop late past 100 ms at the 99th percentile', true, { loop: loop(delay(500, 150)) }],
    ['RSS past the pod limit', true, { rss: { before: 0, after: 0, max: 600 * MiB } }],
    [
      'a heap that kept 100 MiB',
      true,
      {
        memory: {
          before: { ...process.memoryUsage(), heapUsed: 50 * MiB },
          after: { ...process.memoryUsage(), heapUsed: 150 * MiB },
        },
      },
    ],
  ])('%s: findings %s', (_name, findings, vitals) => {
    expect(hasFindings({ ...report(family({})), ...vitals })).toBe(findings);
  });
});

describe('a run over several seeds', () => {
  it.each([
    [100_000, 8, [12_500, 12_500, 12_500, 12_500, 12_500, 12_500, 12_500, 12_500]],
    [10, 3, [4, 3, 3]],
    [2_700, 1, [2_700]],
  ])('splits %i cases over %i seeds as %j', (cases, seeds, shares) => {
    expect(seedShares(cases, seeds)).toEqual(shares);
  });

  it("judges whether a family tested anything over all seeds, and finds every seed's failures", () => {
    const seed = (n: number, f: Partial<FamilyReport>): FuzzReport => ({
      seed: n,
      families: [
        {
          name: 'registration',
          cases: 18,
          shrinkRuns: 0,
          failures: [],
          answers: { '4xx': 18 },
          controls: { passed: 2, failed: 0, undecided: 0 },
          reach: 'registered',
          reached: 0,
          busyMs: 0,
          ...f,
        },
      ],
      processErrors: [],
      rss: { before: n, after: n + 1, max: n + 2 },
      memory: { before: process.memoryUsage() },
      elapsedMs: 1,
      stoppedEarly: false,
    });
    const unlucky = seed(1, {});
    const lucky = seed(2, { reached: 1, answers: { '2xx': 1, '4xx': 17 } });
    expect(hasFindings(unlucky)).toBe(true);
    const merged = mergeReports([unlucky, lucky]);
    expect(hasFindings(merged)).toBe(false);
    expect(merged.families[0]).toMatchObject({ cases: 36, reached: 1, answers: { '2xx': 1, '4xx': 35 } });
    expect(merged.rss).toEqual({ before: 1, after: 3, max: 4 });
    const failure = {
      finding: { kind: 'hang' as const, message: 'no answer' },
      input: '',
      seed: 3,
      path: null,
      shrinks: 0,
    };
    expect(hasFindings(mergeReports([lucky, seed(3, { reached: 1, failures: [failure] })]))).toBe(true);
    // An error the concierge reported and served on after is a finding too.
    const reported = {
      ...seed(4, { reached: 1 }),
      processErrors: [{ error: 'a rejection', inFlight: [], recent: [] }],
    };
    expect(hasFindings(mergeReports([lucky, reported]))).toBe(true);
  });
});
