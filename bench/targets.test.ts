import { describe, expect, it } from '@jest/globals';
import type { Row } from './measure.ts';
import {
  AUTH_PAIRS,
  AUTH_RS256,
  DIRECT,
  EDGE_DIRECT,
  EDGE_FORWARD,
  EDGE_TUNNEL,
  HUB_DIRECT,
  HUB_FORWARD,
  HUB_PROXY,
  REACH_PAIRS,
  reachVerdicts,
  roundRatio,
  type ReachFigures,
  HOLDER,
  KUBECTL_PROXY,
  PEERING_GROUPS,
  PROXY_GROUPS,
  SEALION_AUDITED,
  SEALION_CERTIFICATE,
  SEALION_JWT,
  THROUGH_PEER,
  TUNNEL_BASE,
  TUNNEL_DIRECT,
  TUNNEL_GROUPS,
  TUNNEL_WEBSOCKET,
  authVerdicts,
  groupName,
  headline,
  judgeFigures,
  overall,
  peeringVerdicts,
  proxyVerdicts,
  tunnelVerdicts,
  type Group,
  type Judgement,
  type Verdict,
} from './targets.ts';

/** A row of `target` in group `g` (none for auth), at `perSecond` with a p50 of `p50ms`, over 3 s. */
function row(g: Group | undefined, target: string, perSecond: number, p50ms = 1): Row {
  return {
    name: g ? `${groupName(g)} ${target}` : target,
    ...(g ? { op: g.op, concurrency: g.concurrency, layout: g.layout, target } : {}),
    ops: Math.round(perSecond * 3),
    seconds: 3,
    perSecond,
    p50us: p50ms * 1000,
    p99us: p50ms * 2000,
  };
}

const verdicts = (judgements: Judgement[]): Verdict[] => judgements.map((j) => j.verdict);
const only = (judgements: Judgement[], where: string, target?: string): Judgement[] =>
  judgements.filter((j) => j.where === where && (target === undefined || j.target === target));

describe('proxy verdicts', () => {
  const watchMemory = { watches: 1000, rssPerWatchKiB: 20 };
  /** A run where every target is met: Sealion 0.9× direct and 1.125× kubectl proxy, 0.5 ms over direct. */
  const fullRun = (): Row[] =>
    PROXY_GROUPS.flatMap((g) => [
      row(g, DIRECT, 1000, 1),
      row(g, KUBECTL_PROXY, 800, 1.4),
      row(g, SEALION_JWT, 900, 1.5),
      row(g, SEALION_CERTIFICATE, 900, 1.5),
      row(g, SEALION_AUDITED, 880, 1.5),
    ]);
  const without = (rows: Row[], where: string, target: string): Row[] =>
    rows.filter((r) => !(r.name === `${where} ${target}`));

  it('judges every group, measured or not: a run with no rows is not measured, never met', () => {
    const judgements = proxyVerdicts([], undefined);
    // At concurrency 1 the added p50; at 32 the rate against direct, audit against none, against kubectl proxy;
    // and the memory per idle watch.
    expect(judgements).toHaveLength(2 * 1 + 4 * 3 + 1);
    expect(new Set(verdicts(judgements))).toEqual(new Set(['not measured']));
    expect(overall(judgements)).toBe('not measured');
    expect(headline(judgements)).toBe('15 of 15 not measured');
  });

  it('is met when every row is there and within its target', () => {
    const judgements = proxyVerdicts(fullRun(), watchMemory);
    expect(new Set(verdicts(judgements))).toEqual(new Set(['met']));
    expect(overall(judgements)).toBe('met');
    expect(headline(judgements)).toBe('all 15 met');
  });

  it.each([
    ['direct', 'GET c=32 shared', DIRECT, ["rate at least 0.7× direct's"]],
    ['kubectl proxy (the peer)', 'LIST c=32 split', KUBECTL_PROXY, ["rate at least kubectl proxy's"]],
    ['Sealion with a certificate', 'GET c=1 shared', SEALION_CERTIFICATE, ['p50 at most 1 ms over direct']],
    ['audited Sealion', 'LIST c=32 shared', SEALION_AUDITED, ['audit on: rate within 5% of audit off']],
  ])(
    'a group without its %s row leaves the targets that need it not measured',
    (_, where, target, missed) => {
      const judgements = proxyVerdicts(without(fullRun(), where, target), watchMemory);
      const notMeasured = judgements.filter((j) => j.verdict === 'not measured');
      expect(notMeasured.map((j) => [j.where, j.target])).toEqual(missed.map((t) => [where, t]));
      expect(notMeasured[0]!.figures).toBe(`no rows: ${target}`);
      expect(overall(judgements)).toBe('not measured');
      expect(headline(judgements)).not.toMatch(/\bmet\b/);
    },
  );

  it('a whole group missing (not run, or left out by BENCH_ONLY) is not measured', () => {
    const rows = fullRun().filter((r) => r.layout !== 'split');
    const judgements = proxyVerdicts(rows, watchMemory);
    expect(verdicts(judgements.filter((j) => j.where.endsWith('split')))).toEqual(
      Array(6).fill('not measured'),
    );
    expect(overall(judgements)).toBe('not measured');
    expect(headline(judgements)).toBe('6 of 15 not measured');
  });

  it('a row that served nothing is not a measurement', () => {
    const rows = fullRun().map((r) =>
      r.name === `GET c=1 shared ${DIRECT}` ? { ...r, ops: 0, perSecond: 0, p50us: 0 } : r,
    );
    expect(verdicts(only(proxyVerdicts(rows, watchMemory), 'GET c=1 shared'))).toEqual(['not measured']);
  });

  it('a round that served nothing is not a measurement either', () => {
    const rows = fullRun().map((r) =>
      r.name === `GET c=32 shared ${KUBECTL_PROXY}`
        ? {
            ...r,
            rounds: [
              { perSecond: 800, p50us: 1400 },
              { perSecond: 0, p50us: 0 },
            ],
          }
        : r,
    );
    expect(
      verdicts(only(proxyVerdicts(rows, watchMemory), 'GET c=32 shared', "rate at least kubectl proxy's")),
    ).toEqual(['not measured']);
  });

  it.each([
    ['GET c=1 shared', SEALION_CERTIFICATE, 900, 2.2, ['p50 at most 1 ms over direct']],
    ['GET c=32 shared', SEALION_CERTIFICATE, 790, 1.5, ["rate at least kubectl proxy's"]],
    ['LIST c=32 shared', SEALION_AUDITED, 800, 1.5, ['audit on: rate within 5% of audit off']],
    // Under 0.7× direct is under kubectl proxy's 0.8× as well.
    [
      'LIST c=32 split',
      SEALION_JWT,
      650,
      1.5,
      ["rate at least 0.7× direct's", "rate at least kubectl proxy's"],
    ],
  ])(
    'one row out of its target in %s (%s) is NOT MET, and so is the run',
    (where, target, rate, p50, missed) => {
      const g = PROXY_GROUPS.find((x) => groupName(x) === where);
      const rows = fullRun().map((r) => (r.name === `${where} ${target}` ? row(g, target, rate, p50) : r));
      const judgements = proxyVerdicts(rows, watchMemory);
      expect(
        judgements.filter((j) => j.verdict !== 'met').map((j) => [j.where, j.target, j.verdict]),
      ).toEqual(missed.map((t) => [where, t, 'NOT MET']));
      expect(overall(judgements)).toBe('NOT MET');
      expect(headline(judgements)).toBe(`${missed.length} of 15 NOT MET`);
    },
  );

  it('compares each round with the other row in the same round, then takes the median', () => {
    // Direct's median round (1000/s) and Sealion's (650/s) are 0.65× apart, but in each round Sealion kept 0.9× of
    // direct in the same round except the one where it alone was slowed: met.
    const rounds = (rates: number[]) => rates.map((perSecond) => ({ perSecond, p50us: 1000 }));
    const rows = fullRun().map((r) => {
      if (r.name === `GET c=32 shared ${DIRECT}`) return { ...r, rounds: rounds([500, 1000, 1100]) };
      if (r.name === `GET c=32 shared ${SEALION_JWT}`)
        return { ...r, perSecond: 650, rounds: rounds([450, 650, 990]) };
      return r;
    });
    expect(only(proxyVerdicts(rows, watchMemory), 'GET c=32 shared', "rate at least 0.7× direct's")).toEqual([
      expect.objectContaining({ figures: '0.90× / 0.90×', verdict: 'met' }),
    ]);
  });

  it.each([
    ['no watch opened', 'not measured', { watches: 0, rssPerWatchKiB: Infinity }],
    ['no watch figure', 'not measured', undefined],
    ['a figure that is not a number', 'not measured', { watches: 1000, rssPerWatchKiB: NaN }],
    ['64 KiB per watch', 'NOT MET', { watches: 1000, rssPerWatchKiB: 64 }],
    ['20 KiB per watch', 'met', { watches: 1000, rssPerWatchKiB: 20 }],
  ] as const)('memory per idle watch, %s: %s', (_, verdict, memory) => {
    const judgements = proxyVerdicts(fullRun(), memory);
    expect(judgements.at(-1)).toEqual(
      expect.objectContaining({ target: 'under 64 KiB per idle watch', verdict }),
    );
    expect(overall(judgements)).toBe(verdict);
  });
});

describe('peering verdicts', () => {
  const full = (peerRate = 900, peerP50 = 1.3): Row[] =>
    PEERING_GROUPS.flatMap((g) => [
      row(g, DIRECT, 1200, 0.8),
      row(g, HOLDER, 1000, 1),
      row(g, THROUGH_PEER, peerRate, peerP50),
    ]);

  it('a run with no peer rows is not measured, never met', () => {
    for (const rows of [[], full().filter((r) => r.target !== THROUGH_PEER)]) {
      const judgements = peeringVerdicts(rows);
      expect(verdicts(judgements)).toEqual(Array(4).fill('not measured'));
      expect(headline(judgements)).toBe('4 of 4 not measured');
    }
  });

  it('rows at concurrency 1 only do not measure the targets at 32', () => {
    const rows = PEERING_GROUPS.flatMap((g) =>
      [HOLDER, THROUGH_PEER].map((t) => row({ ...g, concurrency: 1 }, t, 1000)),
    );
    expect(overall(peeringVerdicts(rows))).toBe('not measured');
  });

  it('a group without its holder row is not measured there', () => {
    const rows = full().filter((r) => !(r.op === 'LIST' && r.target === HOLDER));
    const judgements = peeringVerdicts(rows);
    expect(verdicts(only(judgements, 'GET c=32'))).toEqual(['met', 'met']);
    expect(only(judgements, 'LIST c=32')).toEqual([
      expect.objectContaining({ verdict: 'not measured', figures: `no rows: ${HOLDER}` }),
      expect.objectContaining({ verdict: 'not measured', figures: `no rows: ${HOLDER}` }),
    ]);
    expect(overall(judgements)).toBe('not measured');
  });

  it('is met with both rows in both groups within target', () => {
    const judgements = peeringVerdicts(full());
    expect(verdicts(judgements)).toEqual(Array(4).fill('met'));
    expect(judgements[0]!.figures).toBe('0.90×');
    expect(judgements[1]!.figures).toBe('+0.30 ms');
    expect(headline(judgements)).toBe('all 4 met');
  });

  it.each([
    ['a rate under 0.8× the holder', 790, 1.3, "rate at least 0.8× the holder's"],
    ['a p50 more than 0.5 ms over the holder', 900, 1.6, "p50 at most 0.5 ms over the holder's"],
  ])('%s is NOT MET', (_, rate, p50, missed) => {
    const judgements = peeringVerdicts(full(rate, p50));
    expect(judgements.filter((j) => j.verdict === 'NOT MET').map((j) => j.target)).toEqual([missed, missed]);
    expect(overall(judgements)).toBe('NOT MET');
  });
});

describe('tunnel verdicts', () => {
  const full = (directRate = 900, websocketRate = 800): Row[] =>
    TUNNEL_GROUPS.flatMap((g) => [
      row(g, DIRECT, 1200),
      row(g, TUNNEL_BASE, 1000),
      row(g, TUNNEL_DIRECT, directRate),
      row(g, TUNNEL_WEBSOCKET, websocketRate),
    ]);

  it('a run without the tunnel rows (BENCH_ONLY=agents, say) is not measured, never met', () => {
    for (const rows of [[], full().filter((r) => r.target === DIRECT || r.target === TUNNEL_BASE)]) {
      const judgements = tunnelVerdicts(rows);
      expect(verdicts(judgements)).toEqual(Array(4).fill('not measured'));
      expect(headline(judgements)).toBe('4 of 4 not measured');
    }
  });

  it("a group without the proxy's own row is not measured there", () => {
    const judgements = tunnelVerdicts(full().filter((r) => !(r.op === 'GET' && r.target === TUNNEL_BASE)));
    expect(verdicts(only(judgements, 'GET c=32'))).toEqual(['not measured', 'not measured']);
    expect(verdicts(only(judgements, 'LIST c=32'))).toEqual(['met', 'met']);
  });

  it('is met with both transports within target in both groups', () => {
    const judgements = tunnelVerdicts(full(850, 750));
    expect(verdicts(judgements)).toEqual(Array(4).fill('met'));
    expect(judgements.map((j) => j.figures)).toEqual(['0.85×', '0.75×', '0.85×', '0.75×']);
  });

  it.each([
    ['HTTP/2 under 0.85×', 840, 800, 'HTTP/2'],
    ['WebSocket under 0.75×', 900, 740, 'WebSocket'],
  ])('%s is NOT MET', (_, direct, websocket, missed) => {
    const judgements = tunnelVerdicts(full(direct, websocket));
    const notMet = judgements.filter((j) => j.verdict === 'NOT MET');
    expect(notMet).toHaveLength(2);
    expect(notMet.every((j) => j.target.startsWith(missed))).toBe(true);
    expect(overall(judgements)).toBe('NOT MET');
  });
});

describe('auth verdicts', () => {
  const [first, remembered] = AUTH_PAIRS;
  /** A run with CEL at the given rates beside 10,000/s and 1,000,000/s without, and RS256 at `rs256` per second. */
  const pairs = (
    firstCEL: number,
    rememberedCEL: number,
    rs256 = 25_000,
    rememberedPlain = 1_000_000,
  ): Row[] => [
    row(undefined, first.plain, 10_000),
    row(undefined, first.cel, firstCEL),
    row(undefined, remembered.plain, rememberedPlain),
    row(undefined, remembered.cel, rememberedCEL),
    row(undefined, AUTH_RS256, rs256),
    row(undefined, 'webhook round trip', 2_000),
  ];

  // Verdicts in order: CEL on first verification, CEL on remembered tokens, the RS256 rate, the remembered rate.
  it.each([
    ['all within', pairs(9_500, 950_000), ['met', 'met', 'met', 'met']],
    ['CEL 18% slower on first verification', pairs(8_500, 950_000), ['NOT MET', 'met', 'met', 'met']],
    [
      'no CEL row for remembered tokens',
      pairs(9_500, 950_000).filter((r) => r.name !== remembered.cel),
      ['met', 'not measured', 'met', 'met'],
    ],
    ['RS256 at 19,999/s', pairs(9_500, 950_000, 19_999), ['met', 'met', 'NOT MET', 'met']],
    ['RS256 at exactly 20,000/s', pairs(9_500, 950_000, 20_000), ['met', 'met', 'met', 'met']],
    [
      'remembered tokens at 999,999/s',
      pairs(9_500, 950_000, 25_000, 999_999),
      ['met', 'met', 'met', 'NOT MET'],
    ],
    [
      'no RS256 row',
      pairs(9_500, 950_000).filter((r) => r.name !== AUTH_RS256),
      ['met', 'met', 'not measured', 'met'],
    ],
    [
      'an RS256 round that served nothing',
      pairs(9_500, 950_000).map((r) =>
        r.name === AUTH_RS256
          ? { ...r, rounds: [25_000, 0, 25_000].map((perSecond) => ({ perSecond, p50us: 40 })) }
          : r,
      ),
      ['met', 'met', 'not measured', 'met'],
    ],
    ['no rows', [], ['not measured', 'not measured', 'not measured', 'not measured']],
  ] as const)('%s', (_, rows, expected) => {
    expect(verdicts(authVerdicts([...rows]))).toEqual(expected);
  });

  it('names the rate targets and where they were judged', () => {
    const judged = authVerdicts(pairs(9_500, 950_000, 21_500, 1_200_000)).slice(2);
    expect(judged.map(({ where, figures }) => [where, figures])).toEqual([
      ['first verification (RS256)', '21,500/s'],
      ['remembered token', '1,200,000/s'],
    ]);
  });

  it('prints the extra time per token, compared round by round', () => {
    const rounds = (rates: number[]) => rates.map((perSecond) => ({ perSecond, p50us: 100 }));
    const rows = [
      { ...row(undefined, first.plain, 10_000), rounds: rounds([5_000, 10_000, 10_000]) },
      { ...row(undefined, first.cel, 9_000), rounds: rounds([4_800, 9_600, 9_000]) },
    ];
    // +4.2%, +4.2%, +11.1%: the median is +4.2%, where the two medians' rates would say +11.1%.
    expect(authVerdicts(rows)[0]).toEqual(
      expect.objectContaining({ where: 'first verification', figures: '+4.2%', verdict: 'met' }),
    );
  });
});

describe('judging figures', () => {
  const target = { name: 'at most 1', meets: (x: number) => x <= 1, format: String };
  it.each([
    ['none', [], 'not measured'],
    ['one not a number', [0.5, NaN], 'not measured'],
    ['one infinite', [0.5, Infinity], 'not measured'],
    ['all within', [0.5, 1], 'met'],
    ['one out', [0.5, 1.1], 'NOT MET'],
  ] as const)('figures: %s: %s', (_, figures, verdict) => {
    expect(judgeFigures(target, 'here', [...figures]).verdict).toBe(verdict);
  });

  it('a run that judged nothing is not measured', () => {
    expect(overall([])).toBe('not measured');
    expect(headline([])).toBe('none measured');
  });

  it('NOT MET outweighs not measured, and the headline counts both', () => {
    const j = (verdict: Verdict): Judgement => ({ target: 't', where: 'w', figures: '', verdict });
    const judgements = [j('met'), j('NOT MET'), j('not measured')];
    expect(overall(judgements)).toBe('NOT MET');
    expect(headline(judgements)).toBe('1 of 3 NOT MET, 1 of 3 not measured');
  });
});

describe('judging a reach run', () => {
  /** Every way of REACH_PAIRS at `mibps` for each kind it is judged on, in each of `rounds` rounds. */
  const run = (mibps: (way: string) => number, rounds = 3): ReachFigures =>
    Object.fromEntries(
      REACH_PAIRS.flatMap(({ way, base, kinds }) => [way, base].map((w) => [w, kinds] as const)).map(
        ([w, kinds]) => [w, Object.fromEntries(kinds.map((k) => [k, Array<number>(rounds).fill(mibps(w))]))],
      ),
    );
  const sealion = new Set([HUB_FORWARD, EDGE_FORWARD, HUB_PROXY, EDGE_TUNNEL]);

  it('judges each copy, the exec output and each forward against its own baseline', () => {
    const judgements = reachVerdicts(run((w) => (sealion.has(w) ? 95 : 100)));
    expect(judgements).toHaveLength(8);
    expect(overall(judgements)).toBe('met');
    expect(judgements.find((j) => j.where === `cp in: ${EDGE_TUNNEL} / ${EDGE_DIRECT}`)?.figures).toBe(
      '0.95×',
    );
  });

  it('misses the tunnel forward at 0.85× of kubectl port-forward, which the hub forward meets', () => {
    const judgements = reachVerdicts(run((w) => (sealion.has(w) ? 85 : 100)));
    const verdictOf = (way: string): Verdict | undefined =>
      judgements.find((j) => j.where.includes(way))?.verdict;
    expect(verdictOf(HUB_FORWARD)).toBe('met');
    expect(verdictOf(EDGE_FORWARD)).toBe('NOT MET');
    expect(verdictOf(HUB_PROXY)).toBe('met');
  });

  it('takes the median of the rounds’ ratios, so one disturbed round moves nothing', () => {
    expect(roundRatio([50, 90, 100], [100, 100, 100])).toBe(0.9);
    expect(roundRatio([90, 45], [100, 50])).toBe(0.9);
  });

  it.each([
    ['a way missing', (f: ReachFigures) => delete f[EDGE_DIRECT]],
    ['a kind missing', (f: ReachFigures) => delete f[HUB_PROXY]!['exec output']],
    ['a round that moved nothing', (f: ReachFigures) => (f[HUB_PROXY]!['cp out']![1] = 0)],
    ['rounds that differ in number', (f: ReachFigures) => f[HUB_DIRECT]!['cp in']!.pop()],
    ['a figure not a number', (f: ReachFigures) => (f[EDGE_TUNNEL]!['cp in']![0] = NaN)],
  ])('%s is not measured, never met', (_, spoil) => {
    const figures = run(() => 100);
    spoil(figures);
    const judgements = reachVerdicts(figures);
    expect(judgements.filter((j) => j.verdict === 'not measured')).toHaveLength(figures[EDGE_DIRECT] ? 1 : 3);
    expect(overall(judgements)).toBe('not measured');
  });
});
