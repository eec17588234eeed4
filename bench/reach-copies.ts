// The reach suite's copies: `kubectl cp` of BENCH_COPY_MIB (1,024) MiB into the demo pod and back out, and
// BENCH_EXEC_MIB (100) MiB of `kubectl exec` output (`head -c` of /dev/zero in the pod, counted as it arrives), each
// through the impersonation proxy (the hub) and through the tunnel (edge), beside kubectl straight to the same
// cluster's API server (an admin impersonating the same user). Each round runs every way in, in another order.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, openSync, rmSync, statSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { DEMO_GROUP, DEMO_NAMESPACE, DEMO_POD, DEMO_USER } from '../dev/installed.ts';
import type { ReachFigures } from './targets.ts';

const COPY_KINDS = ['cp in', 'cp out', 'exec output'] as const;
type CopyKind = (typeof COPY_KINDS)[number];

const COPY_MIB = Number(process.env['BENCH_COPY_MIB'] ?? 1024);
const EXEC_MIB = Number(process.env['BENCH_EXEC_MIB'] ?? 100);
/** A copy of a GiB on a busy machine takes a while; one that hangs fails the run instead of holding it. */
const KUBECTL_TIMEOUT_MS = 900_000;

/** One way in for kubectl: its binary, kubeconfig and the arguments every command takes. */
export interface KubectlWay {
  name: string;
  kubectl: string;
  kubeconfig: string;
  /** `--as` and `--as-group` for an admin straight to the API server; nothing through Sealion. */
  args: string[];
}

/** The arguments that make an admin act as the demo user. */
export const AS_DEMO = [`--as=${DEMO_USER}`, `--as-group=${DEMO_GROUP}`];

/** Runs kubectl; resolves with the bytes it wrote to stdout (not kept), fails with its stderr unless it exits 0. */
function kubectl(way: KubectlWay, args: string[]): Promise<number> {
  return new Promise((done, fail) => {
    const child = spawn(way.kubectl, [`--kubeconfig=${way.kubeconfig}`, ...way.args, ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = 0;
    let err = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), KUBECTL_TIMEOUT_MS);
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.length));
    child.stderr.on('data', (chunk: Buffer) => (err = (err + chunk.toString('utf8')).slice(-2000)));
    child.once('error', (e) => {
      clearTimeout(timer);
      fail(e);
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      if (code === 0) done(out);
      else fail(new Error(`${way.name}: kubectl ${args[0]} failed (${code}): ${err.trim()}`));
    });
  });
}

/** MiB/s of `run`, which moves `mib` MiB. */
async function rate(mib: number, run: () => Promise<void>): Promise<number> {
  const started = process.hrtime.bigint();
  await run();
  return mib / (Number(process.hrtime.bigint() - started) / 1e9);
}

/** Writes `mib` MiB of random bytes (a 16 MiB random piece over and over) to `path`, piece by piece. */
function writeFile(path: string, mib: number): void {
  const piece = randomBytes(16 << 20);
  const fd = openSync(path, 'w');
  try {
    for (let left = mib << 20; left > 0; left -= piece.length)
      writeSync(fd, piece, 0, Math.min(left, piece.length));
  } finally {
    closeSync(fd);
  }
}

/**
 * One way's copy in, copy out and exec output, each checked for its size; MiB/s each. One that fails is logged and
 * counts as NaN (its verdict: not measured), and the others still run: a copy cut short is news, not a reason to
 * lose the rest of the run.
 */
async function measureWay(
  way: KubectlWay,
  local: string,
  back: string,
  log: (line: string) => void,
): Promise<Record<CopyKind, number>> {
  const inPod = `/tmp/bench-copy-${COPY_MIB}`;
  const remote = `${DEMO_NAMESPACE}/${DEMO_POD}:${inPod}`;
  const bytes = EXEC_MIB << 20;
  const runs: Record<CopyKind, [number, () => Promise<void>]> = {
    'cp in': [COPY_MIB, async () => void (await kubectl(way, ['cp', local, remote]))],
    'cp out': [
      COPY_MIB,
      async () => {
        rmSync(back, { force: true });
        await kubectl(way, ['cp', remote, back]);
        if (statSync(back).size !== COPY_MIB << 20) throw new Error(`${way.name}: the copy came back short`);
        rmSync(back, { force: true });
      },
    ],
    'exec output': [
      EXEC_MIB,
      async () => {
        const got = await kubectl(way, [
          ...['exec', '-n', DEMO_NAMESPACE, DEMO_POD, '--'],
          ...['head', '-c', String(bytes), '/dev/zero'],
        ]);
        if (got !== bytes) throw new Error(`${way.name}: exec wrote ${got} of ${bytes} bytes`);
      },
    ],
  };
  const measured = {} as Record<CopyKind, number>;
  for (const kind of COPY_KINDS) {
    const [mib, run] = runs[kind];
    measured[kind] = await rate(mib, run).catch((err: Error) => {
      log(`${way.name}: ${kind} failed: ${err.message}`);
      return NaN;
    });
  }
  return measured;
}

/** Measures every way's copies in `rounds` rounds, each in another order, into `figures`; `dir` holds the files. */
export async function measureCopies(
  ways: KubectlWay[],
  rounds: number,
  dir: string,
  figures: ReachFigures,
  log: (line: string) => void,
): Promise<void> {
  const local = join(dir, 'copy');
  writeFile(local, COPY_MIB);
  try {
    for (let round = 0; round < rounds; round++) {
      const order = ways.map((_, i) => ways[(i + round) % ways.length]!);
      for (const way of order) {
        const measured = await measureWay(way, local, join(dir, 'back'), log);
        const f = (figures[way.name] ??= {});
        for (const kind of COPY_KINDS) (f[kind] ??= []).push(measured[kind]);
        log(
          `round ${round + 1}: ${way.name}: cp in ${measured['cp in'].toFixed(0)} MiB/s, ` +
            `cp out ${measured['cp out'].toFixed(0)} MiB/s, exec output ${measured['exec output'].toFixed(0)} MiB/s`,
        );
      }
    }
  } finally {
    rmSync(local, { force: true });
  }
}

export const COPY_DESCRIPTION = `kubectl cp of ${COPY_MIB} MiB in and out, ${EXEC_MIB} MiB of exec output`;
