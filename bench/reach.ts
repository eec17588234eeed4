// `npm run bench -- reach`: TCP to a pod through `sealion port-forward`, beside `kubectl port-forward` (the API
// server and the kubelet's streaming path) and the pod's own address from this machine, in one run on the installed
// Sealion (its image on real nodes, two concierge replicas, an agent). Each round measures every way in, in another
// order each round:
//   - throughput: BENCH_REACH_MIB (1,024) MiB sent on one connection, its length first, to a port that counts it and
//     answers the count once all of it is in (kubectl port-forward passes no half-close on);
//   - connections per second: BENCH_SECONDS (3) of connections opened, echoed one byte and closed, 8 at a time.
// Target: sealion port-forward to the hub's Service at least 0.8× kubectl port-forward's throughput.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from '../dev/build.ts';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_USER,
  EDGE,
  startInstalledSealion,
  stopInstalled,
  type Running,
} from '../dev/installed.ts';
import { stopChild, waitForOutput } from '../dev/processes.ts';
import { deployReachWorkload, ECHO_PORT, REACH_WORKLOAD, SIZED_PORT } from '../dev/reach-workload.ts';
import { formatNumber, printColumns, saveResults } from './measure.ts';

const MIB = Number(process.env['BENCH_REACH_MIB'] ?? 1024);
const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const CONCURRENCY = 8;
const TARGET_RATIO = 0.8;
/** The user's token lives this long: longer than any run. */
const TOKEN_SECONDS = 6 * 60 * 60;

/** Where one way in takes the echo and count ports. */
interface Way {
  name: string;
  host: string;
  echo: number;
  count: number;
  /** What its port-forward has written on stderr so far (the last few KiB): why a connection failed. */
  said?: () => string;
}

/** How long a port-forward's line about a failed connection may take to reach us after the connection closed. */
const FAILURE_LINE_MS = 500;

/** Sends `bytes` on one connection, its length first, and waits for the count; MiB/s. */
function throughput(host: string, port: number, bytes: number): Promise<number> {
  return new Promise((done, fail) => {
    const started = process.hrtime.bigint();
    const socket = connect({ host, port, allowHalfOpen: true });
    const piece = randomBytes(1 << 20);
    let sent = 0;
    const pump = (): void => {
      while (sent < bytes) {
        sent += piece.length;
        if (!socket.write(piece)) return void socket.once('drain', pump);
      }
    };
    const length = Buffer.alloc(8);
    length.writeBigUInt64BE(BigInt(bytes));
    let answer = '';
    socket.on('data', (c: Buffer) => (answer += c.toString('utf8')));
    socket.once('end', () => {
      socket.destroy();
      if (answer !== String(bytes))
        return fail(new Error(`${host}:${port} counted ${answer || 'nothing'} of ${bytes}`));
      done(bytes / (1 << 20) / (Number(process.hrtime.bigint() - started) / 1e9));
    });
    socket.once('error', fail);
    socket.once('connect', () => {
      socket.write(length);
      pump();
    });
  });
}

/** One connection: a byte out, the byte back, closed. */
function oneConnection(host: string, port: number): Promise<void> {
  return new Promise((done, fail) => {
    const socket = connect({ host, port });
    socket.once('error', fail);
    socket.once('data', () => {
      socket.destroy();
      done();
    });
    socket.once('end', () => fail(new Error(`${host}:${port} closed before its echo`)));
    socket.write('x');
  });
}

/**
 * Connections completed per second, CONCURRENCY at a time, for `seconds`. A failed connection fails the run, with
 * what the way's port-forward said meanwhile (its stderr line for the connection: the server's refusal, or why the
 * credentials could not be had).
 */
async function connectionsPerSecond(way: Way, seconds: number): Promise<number> {
  const until = Date.now() + seconds * 1000;
  let completed = 0;
  const saidBefore = way.said?.().length ?? 0;
  const started = process.hrtime.bigint();
  try {
    await Promise.all(
      Array.from({ length: CONCURRENCY }, async () => {
        while (Date.now() < until) {
          await oneConnection(way.host, way.echo);
          completed++;
        }
      }),
    );
  } catch (err) {
    if (!way.said) throw err;
    await new Promise((done) => setTimeout(done, FAILURE_LINE_MS));
    const said = way.said().slice(saidBefore).trim();
    throw new Error(
      `${way.name}: ${(err as Error).message} after ${completed} connections; its port-forward said: ${said || 'nothing'}`,
      { cause: err },
    );
  }
  return completed / (Number(process.hrtime.bigint() - started) / 1e9);
}

/**
 * Starts a port-forward command; resolves with its local ports, in the order of `remotes`, and what it has written on
 * stderr so far.
 */
async function startForward(
  command: string,
  args: string[],
  remotes: string[],
  children: ChildProcess[],
): Promise<{ ports: number[]; said: () => string }> {
  const child = spawn(command, [...args, ...remotes.map((r) => `:${r}`)], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let said = '';
  child.stderr.on('data', (chunk: Buffer) => (said = (said + String(chunk)).slice(-8000)));
  // Both commands print a line per port: `Forwarding from 127.0.0.1:<local> -> <remote>`.
  const { output } = await waitForOutput(
    child,
    new RegExp(remotes.map((r) => `127\\.0\\.0\\.1:\\d+ -> ${r}\\b[\\s\\S]*`).join('')),
  );
  return {
    ports: remotes.map((r) => Number(new RegExp(`127\\.0\\.0\\.1:(\\d+) -> ${r}\\b`).exec(output)![1])),
    said: () => said,
  };
}

const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
};

export async function benchReach(): Promise<void> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const running: Running = {};
  const children: ChildProcess[] = [];
  const dir = mkdtempSync(join(tmpdir(), 'sealion-bench-reach-'));
  try {
    const installed = await startInstalledSealion(running, log);
    const { hub, edge } = installed;
    await Promise.all([
      deployReachWorkload(hub, installed.image.name, 'hub'),
      deployReachWorkload(edge, installed.image.name, EDGE),
    ]);
    // The exec plugin trades the token for 5-minute certificates, again whenever one expires: the token must outlive
    // the whole run (three rounds of 1 GiB each way in, on a busy machine, take longer than the default 5 minutes).
    const token = await installed.issuer.mint(
      { username: DEMO_USER, groups: [DEMO_GROUP] },
      { expiresIn: TOKEN_SECONDS },
    );
    writeFileSync(join(dir, 'hub.kubeconfig'), await installed.kubeconfig(token));
    writeFileSync(join(dir, 'edge.kubeconfig'), await installed.kubeconfig(token, EDGE));
    const podIP = (
      await hub.kubectl([
        'get',
        'pod',
        REACH_WORKLOAD,
        '-n',
        DEMO_NAMESPACE,
        '-o',
        'jsonpath={.status.podIP}',
      ])
    ).stdout.trim();

    const sealion = (kubeconfig: string): [string, string[]] => [
      process.execPath,
      [join(REPO_ROOT, 'bin/sealion.js'), 'port-forward', `--kubeconfig=${kubeconfig}`, '-n', DEMO_NAMESPACE],
    ];
    const remotes = [String(ECHO_PORT), String(SIZED_PORT)];
    const {
      ports: [kubectlEcho, kubectlCount],
      said: kubectlSaid,
    } = await startForward(
      hub.binaries.kubectl,
      [`--kubeconfig=${hub.kubeconfigPath}`, '-n', DEMO_NAMESPACE, 'port-forward', `pod/${REACH_WORKLOAD}`],
      remotes,
      children,
    );
    const ways: Way[] = [
      { name: 'pod address (direct)', host: podIP, echo: ECHO_PORT, count: SIZED_PORT },
      {
        name: 'kubectl port-forward',
        host: '127.0.0.1',
        echo: kubectlEcho!,
        count: kubectlCount!,
        said: kubectlSaid,
      },
    ];
    for (const [name, kubeconfig] of [
      ['sealion port-forward, hub', join(dir, 'hub.kubeconfig')],
      [`sealion port-forward, ${EDGE} (tunnel)`, join(dir, 'edge.kubeconfig')],
    ] as const) {
      const [command, args] = sealion(kubeconfig);
      const {
        ports: [echo, count],
        said,
      } = await startForward(command, [...args, `svc/${REACH_WORKLOAD}`], remotes, children);
      ways.push({ name, host: '127.0.0.1', echo: echo!, count: count!, said });
    }

    const figures = new Map(ways.map((w) => [w.name, { mibps: [] as number[], cps: [] as number[] }]));
    for (let round = 0; round < ROUNDS; round++) {
      const order = round % 2 === 0 ? ways : [...ways].reverse();
      for (const way of order) {
        const f = figures.get(way.name)!;
        f.mibps.push(await throughput(way.host, way.count, MIB << 20));
        f.cps.push(await connectionsPerSecond(way, SECONDS));
        log(
          `round ${round + 1}: ${way.name}: ${formatNumber(f.mibps.at(-1)!)} MiB/s, ${formatNumber(f.cps.at(-1)!)} conn/s`,
        );
      }
    }
    const kubectl = figures.get('kubectl port-forward')!;
    const table = [['way in', 'MiB/s', '× kubectl', 'conn/s', '× kubectl', 'rounds (MiB/s)']];
    for (const way of ways) {
      const f = figures.get(way.name)!;
      table.push([
        way.name,
        formatNumber(median(f.mibps)),
        formatNumber(median(f.mibps) / median(kubectl.mibps), 2),
        formatNumber(median(f.cps)),
        formatNumber(median(f.cps) / median(kubectl.cps), 2),
        f.mibps.map((v) => formatNumber(v)).join(' '),
      ]);
    }
    console.log(
      `\nreach: ${MIB} MiB on one connection, and ${CONCURRENCY} at a time for ${SECONDS} s; median of ${ROUNDS} rounds`,
    );
    printColumns(table, 1);
    const hubRatio = median(figures.get('sealion port-forward, hub')!.mibps) / median(kubectl.mibps);
    console.log(
      `target: sealion port-forward at least ${TARGET_RATIO}× kubectl port-forward's throughput: ${formatNumber(hubRatio, 2)}× (${hubRatio >= TARGET_RATIO ? 'met' : 'NOT met'})`,
    );
    saveResults('reach', Object.fromEntries(figures));
  } finally {
    await Promise.all(children.map((c) => stopChild(c)));
    await stopInstalled(running);
    rmSync(dir, { recursive: true, force: true });
  }
}
