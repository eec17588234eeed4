// `npm run bench -- startup`: how long `sealion login` takes from start to exit. kubectl runs the exec plugin for
// every command (it keeps the credential only in memory), so this is time added to each kubectl command.
// Two commands: a static token (the ExecCredential printed as given) and an exchanged client certificate found in
// the credential cache (what each kubectl command after the first costs with --exchange; a cache entry is written
// first, so no network is needed). Each runs from the checkout (Node stripping the TypeScript), from the npm
// package's bundle on Node, from the single-file bundle on Node, and as the standalone executable; beside them, in
// the same run, `node -e 0` (the floor for anything on Node) and `kubectl version --client` (a Go binary's start).
// Every target runs BENCH_STARTUP_RUNS times (30), one run of each in turn, in another order each time, so that a
// slow spell of the machine slows all of them.
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Kind, DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import { cacheFile, EXEC_API_VERSION, writeCache, type ExecCredential } from '../cli/exec-credential.ts';
import { ensureBinaries, REPO_ROOT } from '../dev/build.ts';
import { ensureCli, type Target } from '../dev/build-cli.ts';
import { formatNumber, printColumns, saveResults } from './measure.ts';

const RUNS = Number(process.env['BENCH_STARTUP_RUNS'] ?? 30);
/** Runs of each target before the measured ones: files into the page cache, nothing more. */
const WARMUP_RUNS = 3;
/** The time the cached-credential path should stay within, at the median (README). */
const TARGET_MS = 100;

const TOKEN = 'bench-startup-token';
/** A concierge address nothing listens on: a run that does not find the cache entry fails at once. */
const ENDPOINT = 'https://127.0.0.1:1';
const AUTHENTICATOR = 'x';

interface Program {
  name: string;
  /** The command and the arguments before the subcommand's. */
  command: string;
  args: string[];
}

interface Case {
  name: string;
  args: string[];
  /** Checks a run's standard output; throws when the run did not do what is measured. */
  check: (stdout: string) => void;
}

interface StartupRow {
  case: string;
  target: string;
  runs: number;
  medianMs: number;
  p90Ms: number;
  minMs: number;
}

function percentile(sorted: number[], p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

/** Wall time of one run, from spawn to exit, in ms; throws with its output when it fails. */
function timeRun(
  command: string,
  args: string[],
  env: NodeJS.ProcessEnv,
  check?: (stdout: string) => void,
): number {
  const started = process.hrtime.bigint();
  const run = spawnSync(command, args, { env, encoding: 'utf8' });
  const ms = Number(process.hrtime.bigint() - started) / 1e6;
  if (run.error) throw run.error;
  if (run.status !== 0) throw new Error(`${command} ${args.join(' ')} exited ${run.status}: ${run.stderr}`);
  check?.(run.stdout);
  return ms;
}

/** Runs each of `entries` RUNS times, one of each in turn, each round in another order; times in ms by name. */
function measureTogether(
  entries: { name: string; run: () => number }[],
  log: (line: string) => void,
): Map<string, number[]> {
  for (const e of entries) for (let i = 0; i < WARMUP_RUNS; i++) e.run();
  const times = new Map<string, number[]>(entries.map((e) => [e.name, []]));
  for (let round = 0; round < RUNS; round++) {
    // As measure.ts's rounds: start at another entry each round, and go backwards every other round.
    const n = entries.length;
    const step = round % 2 === 0 ? 1 : n - 1;
    for (let i = 0; i < n; i++) {
      const e = entries[(round + i * step) % n]!;
      times.get(e.name)!.push(e.run());
    }
    if ((round + 1) % 10 === 0) log(`  ${round + 1}/${RUNS} rounds`);
  }
  return times;
}

export async function benchStartup(): Promise<void> {
  const log = (line: string): void => console.log(line);
  const host = `${process.platform}-${process.arch}` as Target;
  const built = await ensureCli([host], log);
  const { kubectl } = await ensureBinaries(log);
  const node = process.execPath;

  const home = mkdtempSync(join(tmpdir(), 'sealion-bench-startup-'));
  try {
    const env: NodeJS.ProcessEnv = {
      PATH: process.env['PATH'],
      HOME: home,
      XDG_CONFIG_HOME: join(home, 'config'),
      T: TOKEN,
    };
    // The entry `sealion login static --exchange` looks up (cli/login.ts credentialFor), valid for an hour.
    const cached: ExecCredential = {
      apiVersion: EXEC_API_VERSION,
      kind: 'ExecCredential',
      status: {
        clientCertificateData: 'bench-certificate',
        clientKeyData: 'bench-key',
        expirationTimestamp: new Date(Date.now() + 3_600_000).toISOString(),
      },
    };
    writeCache(
      cacheFile(env, 'credentials', [
        TOKEN,
        Kind.WebhookAuthenticator,
        AUTHENTICATOR,
        DEFAULT_GROUP_SUFFIX,
        ENDPOINT,
      ]),
      cached,
    );

    const programs: Program[] = [
      { name: 'checkout (node bin/sealion.js)', command: node, args: [join(REPO_ROOT, 'bin/sealion.js')] },
      {
        name: 'npm package (node, ES modules)',
        command: node,
        args: [join(built.packageDir, 'sealion.mjs')],
      },
      { name: 'bundle (node sealion.cjs)', command: node, args: [built.bundle] },
      { name: `executable (sealion-${host})`, command: built.executables[host]!, args: [] },
    ];
    const credential = (stdout: string): ExecCredential => {
      const parsed = JSON.parse(stdout) as ExecCredential;
      if (parsed.kind !== 'ExecCredential') throw new Error(`not an ExecCredential: ${stdout}`);
      return parsed;
    };
    const cases: Case[] = [
      {
        name: 'static token',
        args: ['login', 'static', '--token', TOKEN],
        check: (stdout) => {
          if (credential(stdout).status.token !== TOKEN) throw new Error(`the token is not in ${stdout}`);
        },
      },
      {
        name: 'cached certificate',
        args: [
          'login',
          'static',
          '--token-env',
          'T',
          '--exchange',
          '--authenticator-type',
          'webhook',
          '--authenticator-name',
          AUTHENTICATOR,
          '--concierge-endpoint',
          ENDPOINT,
        ],
        check: (stdout) => {
          if (credential(stdout).status.clientCertificateData !== 'bench-certificate')
            throw new Error(`not the cached credential (has the cache key changed?): ${stdout}`);
        },
      },
    ];
    const peers = [
      { name: 'node -e 0', run: () => timeRun(node, ['-e', '0'], env) },
      { name: 'kubectl version --client', run: () => timeRun(kubectl, ['version', '--client'], env) },
    ];
    const entries = [
      ...peers,
      ...cases.flatMap((c) =>
        programs.map((p) => ({
          name: `${c.name}\0${p.name}`,
          run: () => timeRun(p.command, [...p.args, ...c.args], env, c.check),
        })),
      ),
    ];
    log(`startup: ${entries.length} targets, ${RUNS} runs each, interleaved`);
    const times = measureTogether(entries, log);

    const rows: StartupRow[] = [...times].map(([name, ms]) => {
      const sorted = [...ms].sort((a, b) => a - b);
      const [group, target] = name.includes('\0') ? name.split('\0') : ['peer', name];
      return {
        case: group!,
        target: target!,
        runs: ms.length,
        medianMs: percentile(sorted, 50),
        p90Ms: percentile(sorted, 90),
        minMs: sorted[0]!,
      };
    });
    const floor = rows.find((r) => r.target === 'node -e 0')!;
    const kubectlRow = rows.find((r) => r.target === 'kubectl version --client')!;
    console.log(`\nStartup to exit, ms over ${RUNS} runs (one machine, all targets interleaved)`);
    printColumns(
      [
        ['case', 'target', 'median', 'p90', 'min', '× node -e 0', '× kubectl'],
        ...rows.map((r) => [
          r.case,
          r.target,
          formatNumber(r.medianMs, 1),
          formatNumber(r.p90Ms, 1),
          formatNumber(r.minMs, 1),
          (r.medianMs / floor.medianMs).toFixed(2),
          (r.medianMs / kubectlRow.medianMs).toFixed(2),
        ]),
      ],
      2,
    );
    console.log(`\nTarget: a cached certificate within ${TARGET_MS} ms at the median`);
    for (const r of rows.filter((row) => row.case === 'cached certificate'))
      console.log(
        `  ${r.target}: ${formatNumber(r.medianMs, 1)} ms, ${r.medianMs <= TARGET_MS ? 'met' : 'NOT met'}`,
      );
    console.log(`saved ${saveResults('startup', rows)}`);
  } finally {
    rmSync(home, { recursive: true, force: true });
  }
}
