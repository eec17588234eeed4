// What Sealion is held to in the suites that judge their runs (auth, proxy, tunnel, peering), and how a run's rows are
// judged against it. A verdict rests on every row it names: a target whose rows are missing (a group not run, or
// BENCH_ONLY left out, a row absent from its group, a row that served nothing) is "not measured", never "met", and
// so is a target judged on a figure that is not a number. Pure functions over rows, so targets.test.ts can hold
// the judging to this without a cluster.
import { paired, printColumns, type RoundFigures, type Row } from './measure.ts';

/** A target's verdict in one run. */
export type Verdict = 'met' | 'NOT MET' | 'not measured';

/** A promise, judged on figures: what it says, whether a figure keeps it, how a figure prints. */
export interface Target {
  name: string;
  meets: (figure: number) => boolean;
  format: (figure: number) => string;
}

/** One target judged in one place (a measurement group). */
export interface Judgement {
  target: string;
  /** The measurement group (`GET c=32 shared`) or what the figure counts (`1000 watches`). */
  where: string;
  /** The figures it was judged on, or what was missing. */
  figures: string;
  verdict: Verdict;
}

/** Whether a row is a measurement: there, with requests served in every round (an empty one has p50 0). */
function measured(row: Row | undefined): row is Row {
  return (
    row !== undefined &&
    row.ops > 0 &&
    row.perSecond > 0 &&
    (row.rounds ?? []).every((round) => round.perSecond > 0)
  );
}

/** `target` judged on `figures`: met when there is at least one and every one is a finite number that keeps it. */
export function judgeFigures(target: Target, where: string, figures: number[]): Judgement {
  if (figures.length === 0 || !figures.every(Number.isFinite))
    return {
      target: target.name,
      where,
      figures: figures.length === 0 ? 'no figures' : `figures ${figures.join(', ')}`,
      verdict: 'not measured',
    };
  return {
    target: target.name,
    where,
    figures: figures.map(target.format).join(' / '),
    verdict: figures.every(target.meets) ? 'met' : 'NOT MET',
  };
}

/**
 * `target` judged in `where` on `figures`, computed from `rows`, each by its name: not measured when any of them is
 * missing or served nothing (`figures` is not called then, so it may take each of them as there), so no verdict
 * rests on fewer rows than it names.
 */
export function judge(
  target: Target,
  where: string,
  rows: Record<string, Row | undefined>,
  figures: () => number[],
): Judgement {
  const missing = Object.entries(rows)
    .filter(([, row]) => !measured(row))
    .map(([name]) => name);
  if (missing.length > 0)
    return { target: target.name, where, figures: `no rows: ${missing.join(', ')}`, verdict: 'not measured' };
  return judgeFigures(target, where, figures());
}

/** A run's verdict: NOT MET if any target is; not measured if any target is, or none was judged; met otherwise. */
export function overall(judgements: Judgement[]): Verdict {
  if (judgements.some((j) => j.verdict === 'NOT MET')) return 'NOT MET';
  if (judgements.length === 0 || judgements.some((j) => j.verdict === 'not measured')) return 'not measured';
  return 'met';
}

/** One line for a run's verdicts: `all 9 met`, or how many of them are NOT MET and how many not measured. */
export function headline(judgements: Judgement[]): string {
  const n = judgements.length;
  const count = (v: Verdict): number => judgements.filter((j) => j.verdict === v).length;
  if (overall(judgements) === 'met') return `all ${n} met`;
  if (n === 0) return 'none measured';
  return [
    ...(count('NOT MET') > 0 ? [`${count('NOT MET')} of ${n} NOT MET`] : []),
    ...(count('not measured') > 0 ? [`${count('not measured')} of ${n} not measured`] : []),
  ].join(', ');
}

/** Prints `judgements` under `title` with the headline, one row each, and returns the run's verdict. */
export function printVerdicts(title: string, judgements: Judgement[], figuresHeader = 'figures'): Verdict {
  console.log(`\n${title}: ${headline(judgements)}`);
  if (judgements.length > 0)
    printColumns(
      [
        ['target', 'where', figuresHeader, 'verdict'],
        ...judgements.map((j) => [j.target, j.where, j.figures, j.verdict]),
      ],
      2,
    );
  return overall(judgements);
}

/** A measurement group of a request suite: one operation at one concurrency, on one layout of the cores. */
export interface Group {
  op: 'GET' | 'LIST';
  concurrency: number;
  layout?: 'shared' | 'split';
}

export const groupName = (g: Group): string =>
  `${g.op} c=${g.concurrency}${g.layout === undefined ? '' : ` ${g.layout}`}`;

/** The row of `target` in group `g`, if the run has one. */
export function rowOf(rows: Row[], g: Group, target: string): Row | undefined {
  return rows.find(
    (r) => r.op === g.op && r.concurrency === g.concurrency && r.layout === g.layout && r.target === target,
  );
}

const rate = (a: RoundFigures, b: RoundFigures): number => a.perSecond / b.perSecond;
const addedP50Ms = (a: RoundFigures, b: RoundFigures): number => (a.p50us - b.p50us) / 1000;
const atLeast = (min: number) => (x: number) => x >= min;
const atMost = (max: number) => (x: number) => x <= max;
const times = (digits: number) => (x: number) => `${x.toFixed(digits)}×`;
const plusMs = (ms: number): string => `${ms >= 0 ? '+' : ''}${ms.toFixed(2)} ms`;

// proxy: Sealion's impersonation proxy beside direct access and kubectl proxy.

export const DIRECT = 'direct';
export const KUBECTL_PROXY = 'kubectl proxy';
export const SEALION_JWT = 'sealion (JWT)';
export const SEALION_CERTIFICATE = 'sealion (certificate)';
/** Sealion with audit on (Metadata, to a file), beside the same without. */
export const SEALION_AUDITED = 'sealion (JWT, audit)';

/** Every group the proxy suite measures; each is judged, measured or not. */
export const PROXY_GROUPS: readonly Group[] = [
  { op: 'GET', concurrency: 1, layout: 'shared' },
  { op: 'GET', concurrency: 32, layout: 'shared' },
  { op: 'LIST', concurrency: 1, layout: 'shared' },
  { op: 'LIST', concurrency: 32, layout: 'shared' },
  { op: 'GET', concurrency: 32, layout: 'split' },
  { op: 'LIST', concurrency: 32, layout: 'split' },
];

/** What Sealion's proxy is held to, each ratio the median of the rounds' ratios in the same run. */
export const PROXY_TARGETS = {
  /** At concurrency 1: latency added to direct access's p50. */
  addedP50: { name: 'p50 at most 1 ms over direct', meets: atMost(1), format: plusMs },
  /** At concurrency 32: a share of direct access's rate. */
  timesDirect: { name: "rate at least 0.7× direct's", meets: atLeast(0.7), format: times(2) },
  /** At concurrency 32: audit at Metadata costs at most 5% of the rate without. */
  audit: { name: 'audit on: rate within 5% of audit off', meets: atLeast(0.95), format: times(3) },
  /** At concurrency 32: kubectl proxy's rate, the peer's. */
  timesPeer: { name: "rate at least kubectl proxy's", meets: atLeast(1), format: times(3) },
  /** RSS per idle watch the proxy holds. */
  watch: {
    name: 'under 64 KiB per idle watch',
    meets: (kib: number) => kib < 64,
    format: (kib: number) => `${kib.toFixed(1)} KiB RSS`,
  },
} satisfies Record<string, Target>;

/** The proxy's idle-watch figure: how many watches opened, and the RSS each cost. */
export interface WatchMemory {
  watches: number;
  rssPerWatchKiB: number;
}

/**
 * Judges a proxy run: in every group of PROXY_GROUPS, Sealion (JWT and certificate) against direct (added p50 at
 * concurrency 1, rate at 32) and against kubectl proxy (rate at 32), and audit on against off (at 32); then the
 * memory per idle watch, not measured when no watch opened.
 */
export function proxyVerdicts(rows: Row[], watchMemory: WatchMemory | undefined): Judgement[] {
  const judgements: Judgement[] = [];
  for (const g of PROXY_GROUPS) {
    const where = groupName(g);
    const named = (target: string): Row | undefined => rowOf(rows, g, target);
    const [jwt, certificate, audited] = [SEALION_JWT, SEALION_CERTIFICATE, SEALION_AUDITED].map(named);
    // Both of Sealion's rows against the row of `other`.
    const against = (target: Target, other: string, compare: typeof rate): Judgement => {
      const theirs = named(other);
      return judge(
        target,
        where,
        { [SEALION_JWT]: jwt, [SEALION_CERTIFICATE]: certificate, [other]: theirs },
        () => [jwt!, certificate!].map((s) => paired(s, theirs!, compare)),
      );
    };
    if (g.concurrency === 1) {
      judgements.push(against(PROXY_TARGETS.addedP50, DIRECT, addedP50Ms));
      continue;
    }
    judgements.push(
      against(PROXY_TARGETS.timesDirect, DIRECT, rate),
      judge(PROXY_TARGETS.audit, where, { [SEALION_AUDITED]: audited, [SEALION_JWT]: jwt }, () => [
        paired(audited!, jwt!, rate),
      ]),
      against(PROXY_TARGETS.timesPeer, KUBECTL_PROXY, rate),
    );
  }
  const watches = watchMemory?.watches ?? 0;
  judgements.push(
    judgeFigures(PROXY_TARGETS.watch, `${watches} watches`, watches > 0 ? [watchMemory!.rssPerWatchKiB] : []),
  );
  return judgements;
}

// peering: requests through a peer replica beside the replica that holds the tunnel.

export const HOLDER = 'holder (A)';
export const THROUGH_PEER = 'through a peer (B → A)';

/** The groups the peering targets are judged in: concurrency 32. */
export const PEERING_GROUPS: readonly Group[] = [
  { op: 'GET', concurrency: 32 },
  { op: 'LIST', concurrency: 32 },
];

/** What the peer path is held to, against the holder's in the same rounds. */
export const PEERING_TARGETS = {
  timesHolder: { name: "rate at least 0.8× the holder's", meets: atLeast(0.8), format: times(2) },
  addedP50: { name: "p50 at most 0.5 ms over the holder's", meets: atMost(0.5), format: plusMs },
} satisfies Record<string, Target>;

/** Judges a peering run: in each group of PEERING_GROUPS, the peer path's rate and added p50 against the holder's. */
export function peeringVerdicts(rows: Row[]): Judgement[] {
  return PEERING_GROUPS.flatMap((g) => {
    const [peer, holder] = [rowOf(rows, g, THROUGH_PEER), rowOf(rows, g, HOLDER)];
    const vsHolder = (target: Target, compare: typeof rate): Judgement =>
      judge(target, groupName(g), { [THROUGH_PEER]: peer, [HOLDER]: holder }, () => [
        paired(peer!, holder!, compare),
      ]);
    return [vsHolder(PEERING_TARGETS.timesHolder, rate), vsHolder(PEERING_TARGETS.addedP50, addedP50Ms)];
  });
}

// tunnel: requests through an agent's tunnel beside the proxy's own path to the same API server.

/** The proxy's own path in the tunnel suite (its JWT row), and the tunnel's rows, one per transport. */
export const TUNNEL_BASE = SEALION_JWT;
export const TUNNEL_DIRECT = 'tunnel, direct';
export const TUNNEL_WEBSOCKET = 'tunnel, websocket';

/** The groups the tunnel targets are judged in: concurrency 32. */
export const TUNNEL_GROUPS: readonly Group[] = PEERING_GROUPS;

/** What each transport's rate is held to, against the proxy's own path in the same rounds. */
export const TUNNEL_TARGETS = {
  direct: {
    name: "HTTP/2: rate at least 0.85× the proxy's own path",
    meets: atLeast(0.85),
    format: times(2),
  },
  websocket: {
    name: "WebSocket: rate at least 0.75× the proxy's own path",
    meets: atLeast(0.75),
    format: times(2),
  },
} satisfies Record<string, Target>;

/** Judges a tunnel run: in each group of TUNNEL_GROUPS, each transport's rate against the proxy's own path. */
export function tunnelVerdicts(rows: Row[]): Judgement[] {
  return TUNNEL_GROUPS.flatMap((g) => {
    const base = rowOf(rows, g, TUNNEL_BASE);
    const vsBase = (target: Target, name: string): Judgement => {
      const through = rowOf(rows, g, name);
      return judge(target, groupName(g), { [name]: through, [TUNNEL_BASE]: base }, () => [
        paired(through!, base!, rate),
      ]);
    };
    return [vsBase(TUNNEL_TARGETS.direct, TUNNEL_DIRECT), vsBase(TUNNEL_TARGETS.websocket, TUNNEL_WEBSOCKET)];
  });
}

// auth: CEL claim mappings beside the same issuer without them, and how many tokens one core authenticates.

/** The auth suite's pairs: a path without CEL mappings, and the same with them. */
export const AUTH_PAIRS = [
  { where: 'first verification', plain: 'jwt verify (cached keys)', cel: 'jwt verify + CEL' },
  { where: 'remembered token', plain: 'jwt (verified token)', cel: 'jwt (verified token) + CEL' },
] as const;

/** First verifications of RS256 tokens (what most issuers sign with), keys cached, every token checked in full. */
export const AUTH_RS256 = 'jwt verify RS256 (cached keys)';
/** node:crypto's signature check alone, the floor under a verification of each algorithm. */
export const AUTH_FLOORS = {
  rs256: 'RS256 signature alone (node:crypto)',
  es256: 'ES256 signature alone (node:crypto)',
} as const;

const perSecond = (x: number): string => `${Math.round(x).toLocaleString('en-US')}/s`;

export const AUTH_TARGETS = {
  /** CEL mappings cost at most 10% more time per token than the same path without them. */
  cel: {
    name: 'CEL: at most 10% more time per token',
    meets: atMost(10),
    format: (percent: number) => `${percent >= 0 ? '+' : ''}${percent.toFixed(1)}%`,
  },
  /** A first verification (signature, iss, aud, exp, nbf, claims) of an RS256 token, on one core. */
  firstVerification: {
    name: 'at least 20,000 first verifications/s on one core',
    meets: atLeast(20_000),
    format: perSecond,
  },
  /** A token answered from the verified-token cache, on one core. */
  rememberedToken: {
    name: 'at least 1,000,000 remembered tokens/s on one core',
    meets: atLeast(1_000_000),
    format: perSecond,
  },
} satisfies Record<string, Target>;

/** The rate targets: each judged on its row's median round. */
const AUTH_RATES = [
  { target: AUTH_TARGETS.firstVerification, where: 'first verification (RS256)', row: AUTH_RS256 },
  { target: AUTH_TARGETS.rememberedToken, where: 'remembered token', row: AUTH_PAIRS[1].plain },
] as const;

/**
 * Judges an auth run: each of AUTH_PAIRS, the time per token with CEL against without, round by round; then the
 * rates of a first RS256 verification and of a remembered token, each its row's median round.
 */
export function authVerdicts(rows: Row[]): Judgement[] {
  const named = (name: string): Row | undefined => rows.find((r) => r.name === name);
  const cel = AUTH_PAIRS.map(({ where, plain, cel }) => {
    const [without, withCEL] = [named(plain), named(cel)];
    return judge(AUTH_TARGETS.cel, where, { [plain]: without, [cel]: withCEL }, () => [
      // Time per token is the inverse of the rate: with CEL over without is the plain rate over the CEL rate.
      paired(without!, withCEL!, (p, c) => (p.perSecond / c.perSecond - 1) * 100),
    ]);
  });
  const rates = AUTH_RATES.map(({ target, where, row }) => {
    const measuredRow = named(row);
    return judge(target, where, { [row]: measuredRow }, () => [measuredRow!.perSecond]);
  });
  return [...cel, ...rates];
}

// --- reach: bytes through a forward, a copy and an exec, each beside a way in without Sealion ---

/** What the reach suite moves: one connection's bytes through a forward, a file each way, an exec's output. */
export const REACH_KINDS = ['forward', 'cp in', 'cp out', 'exec output'] as const;
export type ReachKind = (typeof REACH_KINDS)[number];
/** MiB/s of each round, by way in and by what was moved (a way that did not move a kind has no entry). */
export type ReachFigures = Record<string, Partial<Record<ReachKind, number[]>>>;

/** The ways in the reach suite names, and which each is judged against. */
export const KUBECTL_PORT_FORWARD = 'kubectl port-forward';
export const HUB_FORWARD = 'sealion port-forward, hub';
export const EDGE_FORWARD = 'sealion port-forward, edge (tunnel)';
export const HUB_DIRECT = 'kubectl, hub API server (direct)';
export const HUB_PROXY = 'kubectl, hub through the proxy';
export const EDGE_DIRECT = 'kubectl, edge API server (direct)';
export const EDGE_TUNNEL = 'kubectl, edge through the tunnel';

export const REACH_TARGETS = {
  hubForward: {
    name: 'one connection through the hub ≥ 0.8× kubectl port-forward',
    meets: atLeast(0.8),
    format: times(2),
  },
  tunnelForward: {
    name: 'one connection through the tunnel ≥ 0.9× kubectl port-forward',
    meets: atLeast(0.9),
    format: times(2),
  },
  copy: { name: 'kubectl cp and exec output ≥ 0.8× direct', meets: atLeast(0.8), format: times(2) },
} satisfies Record<string, Target>;

/** Which way is judged against which, on what, by which target. */
export const REACH_PAIRS: readonly {
  target: Target;
  way: string;
  base: string;
  kinds: readonly ReachKind[];
}[] = [
  { target: REACH_TARGETS.hubForward, way: HUB_FORWARD, base: KUBECTL_PORT_FORWARD, kinds: ['forward'] },
  { target: REACH_TARGETS.tunnelForward, way: EDGE_FORWARD, base: KUBECTL_PORT_FORWARD, kinds: ['forward'] },
  { target: REACH_TARGETS.copy, way: HUB_PROXY, base: HUB_DIRECT, kinds: ['cp in', 'cp out', 'exec output'] },
  {
    target: REACH_TARGETS.copy,
    way: EDGE_TUNNEL,
    base: EDGE_DIRECT,
    kinds: ['cp in', 'cp out', 'exec output'],
  },
];

/**
 * The median of the rounds' ratios of `way` to `base` (each round's pair measured close together, so a slow spell
 * of the machine cancels out), or NaN when either is missing, holds a round that moved nothing, or the rounds differ
 * in number.
 */
export function roundRatio(way: number[] | undefined, base: number[] | undefined): number {
  if (!way || !base || way.length === 0 || way.length !== base.length) return NaN;
  if (![...way, ...base].every((v) => Number.isFinite(v) && v > 0)) return NaN;
  const ratios = way.map((v, i) => v / base[i]!).sort((a, b) => a - b);
  return ratios[Math.floor(ratios.length / 2)]!;
}

/** Judges a reach run: each of REACH_PAIRS on each of its kinds; a kind not measured is "not measured". */
export function reachVerdicts(figures: ReachFigures): Judgement[] {
  return REACH_PAIRS.flatMap(({ target, way, base, kinds }) =>
    kinds.map((kind) => {
      const ratio = roundRatio(figures[way]?.[kind], figures[base]?.[kind]);
      return judgeFigures(target, `${kind}: ${way} / ${base}`, Number.isNaN(ratio) ? [] : [ratio]);
    }),
  );
}
