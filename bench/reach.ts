// `npm run bench -- reach`: bytes to and from a pod through Sealion, in one run on the installed Sealion (its image on
// real nodes, two concierge replicas, an agent). BENCH_ONLY (a regular expression) picks `forward` or `copies`.
//   - forward: TCP to a pod through `sealion port-forward` to the hub's Service and to edge's (through the tunnel),
//     beside `kubectl port-forward` (the API server and the kubelet's streaming path) and the pod's own address. Each
//     round measures every way in, in another order each round: BENCH_REACH_MIB (1,024) MiB sent on one connection,
//     its length first, to a port that counts it and answers the count once all of it is in (kubectl port-forward
//     passes no half-close on); and BENCH_SECONDS (3) of connections opened, echoed one byte and closed, 8 at a time.
//   - copies (reach-copies.ts): kubectl cp into the demo pod and back out, and an exec's output, through the proxy
//     and through the tunnel, beside kubectl straight to the same cluster's API server.
// Targets (targets.ts REACH_PAIRS): one connection through the hub ≥ 0.8× kubectl port-forward, through the tunnel
// ≥ 0.9×; each copy and the exec output through the proxy and through the tunnel ≥ 0.8× direct.
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
  type InstalledSealion,
  type Running,
} from '../dev/installed.ts';
import { dieWithParent, stopChild, waitForOutput } from '../dev/processes.ts';
import { deployReachWorkload, ECHO_PORT, REACH_WORKLOAD, SIZED_PORT } from '../dev/reach-workload.ts';
import { formatNumber, printColumns, saveResults, selected } from './measure.ts';
import { AS_DEMO, COPY_DESCRIPTION, measureCopies } from './reach-copies.ts';
import {
  EDGE_DIRECT,
  EDGE_FORWARD,
  EDGE_TUNNEL,
  HUB_DIRECT,
  HUB_FORWARD,
  HUB_PROXY,
  KUBECTL_PORT_FORWARD,
  printVerdicts,
  REACH_PAIRS,
  reachVerdicts,
  roundRatio,
  type ReachFigures,
  type Verdict,
} from './targets.ts';

const MIB = Number(process.env['BENCH_REACH_MIB'] ?? 1024);
const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const CONCURRENCY = 8;
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
  const child = spawn(...dieWithParent(command, [...args, ...remotes.map((r) => `:${r}`)]), {
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

/** The forwards' ways in: the pod's address, kubectl port-forward, sealion port-forward to the hub and to edge. */
async function startForwards(
  installed: InstalledSealion,
  kubeconfigs: { hub: string; edge: string },
  children: ChildProcess[],
): Promise<Way[]> {
  const { hub } = installed;
  const podIP = (
    await hub.kubectl(['get', 'pod', REACH_WORKLOAD, '-n', DEMO_NAMESPACE, '-o', 'jsonpath={.status.podIP}'])
  ).stdout.trim();
  const sealion = (kubeconfig: string): [string, string[]] => [
    process.execPath,
    [join(REPO_ROOT, 'bin/sealion.js'), 'port-forward', `--kubeconfig=${kubeconfig}`, '-n', DEMO_NAMESPACE],
  ];
  const remotes = [String(ECHO_PORT), String(SIZED_PORT)];
  const kubectl = await startForward(
    hub.binaries.kubectl,
    [`--kubeconfig=${hub.kubeconfigPath}`, '-n', DEMO_NAMESPACE, 'port-forward', `pod/${REACH_WORKLOAD}`],
    remotes,
    children,
  );
  const [kubectlEcho, kubectlCount] = kubectl.ports;
  const ways: Way[] = [
    { name: 'pod address (direct)', host: podIP, echo: ECHO_PORT, count: SIZED_PORT },
    {
      name: KUBECTL_PORT_FORWARD,
      host: '127.0.0.1',
      echo: kubectlEcho!,
      count: kubectlCount!,
      said: kubectl.said,
    },
  ];
  for (const [name, kubeconfig] of [
    [HUB_FORWARD, kubeconfigs.hub],
    [EDGE_FORWARD, kubeconfigs.edge],
  ] as const) {
    const [command, args] = sealion(kubeconfig);
    const { ports, said } = await startForward(
      command,
      [...args, `svc/${REACH_WORKLOAD}`],
      remotes,
      children,
    );
    ways.push({ name, host: '127.0.0.1', echo: ports[0]!, count: ports[1]!, said });
  }
  return ways;
}

/** Each way's throughput on one connection and connections per second, ROUNDS rounds: printed, the MiB/s into `reach`. */
async function measureForwards(
  ways: Way[],
  reach: ReachFigures,
  log: (line: string) => void,
): Promise<Record<string, { mibps: number[]; cps: number[] }>> {
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
  const kubectl = figures.get(KUBECTL_PORT_FORWARD)!;
  const table = [['way in', 'MiB/s', '× kubectl', 'conn/s', '× kubectl', 'rounds (MiB/s)']];
  for (const way of ways) {
    const f = figures.get(way.name)!;
    (reach[way.name] ??= {}).forward = f.mibps;
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
  return Object.fromEntries(figures);
}

/** The copies' table: each way's MiB/s (the rounds' median) and its ratio to its cluster's direct way. */
function printCopies(reach: ReachFigures): void {
  const table = [['way in', 'cp in MiB/s', '× direct', 'cp out MiB/s', '× direct', 'exec MiB/s', '× direct']];
  const baseOf = new Map(REACH_PAIRS.map((p) => [p.way, p.base]));
  for (const name of [HUB_DIRECT, HUB_PROXY, EDGE_DIRECT, EDGE_TUNNEL]) {
    const f = reach[name];
    if (!f) continue;
    const base = reach[baseOf.get(name) ?? name];
    table.push([
      name,
      ...(['cp in', 'cp out', 'exec output'] as const).flatMap((kind) => [
        formatNumber(median(f[kind] ?? [NaN]), 1),
        formatNumber(roundRatio(f[kind], base?.[kind]), 2),
      ]),
    ]);
  }
  console.log(`\nreach: ${COPY_DESCRIPTION}; median of ${ROUNDS} rounds`);
  printColumns(table, 1);
}

export async function benchReach(): Promise<Verdict> {
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
    // A token for the whole run: the copies of a GiB, three rounds of them, outlast the issuer's default 5 minutes.
    const token = await installed.issuer.mint(
      { username: DEMO_USER, groups: [DEMO_GROUP] },
      { expiresIn: TOKEN_SECONDS },
    );
    const kubeconfigs = { hub: join(dir, 'hub.kubeconfig'), edge: join(dir, 'edge.kubeconfig') };
    writeFileSync(kubeconfigs.hub, await installed.kubeconfig(token));
    writeFileSync(kubeconfigs.edge, await installed.kubeconfig(token, EDGE));
    const reach: ReachFigures = {};
    const forwards = selected('forward')
      ? await measureForwards(await startForwards(installed, kubeconfigs, children), reach, log)
      : undefined;
    if (selected('copies')) {
      await measureCopies(
        [
          { name: HUB_DIRECT, kubectl: hub.binaries.kubectl, kubeconfig: hub.kubeconfigPath, args: AS_DEMO },
          { name: HUB_PROXY, kubectl: hub.binaries.kubectl, kubeconfig: kubeconfigs.hub, args: [] },
          {
            name: EDGE_DIRECT,
            kubectl: edge.binaries.kubectl,
            kubeconfig: edge.kubeconfigPath,
            args: AS_DEMO,
          },
          { name: EDGE_TUNNEL, kubectl: edge.binaries.kubectl, kubeconfig: kubeconfigs.edge, args: [] },
        ],
        ROUNDS,
        dir,
        reach,
        log,
      );
      printCopies(reach);
    }
    saveResults('reach', { forwards, mibps: reach });
    return printVerdicts('Reach targets', reachVerdicts(reach));
  } finally {
    await Promise.all(children.map((c) => stopChild(c)));
    await stopInstalled(running);
    rmSync(dir, { recursive: true, force: true });
  }
}
