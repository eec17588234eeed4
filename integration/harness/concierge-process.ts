// Starts serve-concierge.ts: the concierge of startLocalConcierge (or, `controlled`, of an install: its controllers on),
// but in its own process, so a test can tell a crash from a refusal and measure the proxy's memory and event loop
// without the test's own.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import { PROXY_NODE_OPTIONS } from '../../manifests/install.ts';
import type { Cluster } from '../../dev/cluster.ts';
import type { RegistrationLimits } from '../../concierge/concierge.ts';
import { parseProcessErrorLine, reportProcessError } from './process-errors.ts';

export interface ConciergeProcess {
  url: string;
  /** CA of the proxy's serving certificate (what clients trust). */
  servingCA: string;
  /** The CA that signs TokenCredentialRequest certificates, to mint client certificates in tests. */
  signer: { certPem: string; keyPem: string };
  /** The agents' tunnel listener (its port and CA), when started with the `tunnel` option. */
  tunnel?: { port: number; caPem: string };
  /** The SSH door, when started `controlled` with an SSH port and a config that turns the door on. */
  ssh?: { port: number };
  /** The loopback port of its metrics (Prometheus text), when started with the `metrics` option. */
  metricsPort?: number;
  pid: number;
  /** The process's resident memory now, in bytes, from /proc. */
  rss(): number;
  /** process.memoryUsage() inside the concierge, after a full GC. */
  memory(): Promise<NodeJS.MemoryUsage>;
  /**
   * How late the concierge's event loop ran: `window`, since the last window's reading (the first: since it started);
   * `total`, since the last `reset`.
   */
  eventLoop(what: 'window' | 'total'): Promise<LoopDelay>;
  /** Starts both of eventLoop's readings afresh. */
  resetEventLoop(): Promise<void>;
  /** When it last answered a question on stdin (ms since the epoch): one asked every second answers at once. */
  answeredAt(): number;
  /** Whether it is still running (a crash makes this false). */
  alive(): boolean;
  /** Its standard error so far (the tail). */
  stderr(): string;
  /**
   * The errors nothing handled that it reported so far (each also fails the test it came in: process-errors.ts). It
   * serves on after a rejection, as production does, and exits after an uncaught exception.
   */
  processErrors(): string[];
  stop(): Promise<void>;
}

/** How late a 10 ms timer fired in the concierge, in ms: percentiles, the worst, the mean, over `samples` ticks. */
export interface LoopDelay {
  p50: number;
  p99: number;
  max: number;
  mean: number;
  samples: number;
}

/** Resident memory of process `pid` in bytes (VmRSS). */
export function residentBytes(pid: number): number {
  const kib = /^VmRSS:\s+(\d+)\s+kB/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1];
  if (kib === undefined) throw new Error(`no VmRSS for process ${pid}`);
  return Number(kib) * 1024;
}

export async function startConciergeProcess(
  cluster: Pick<Cluster, 'dir' | 'url' | 'binaries'>,
  opts: {
    /**
     * Run the agents' tunnel listener on this port (0: any), keeping its CA in `namespace` (which must exist), with
     * these limits on registration (default: the listener's).
     */
    tunnel?: { port: number; namespace: string; registrationLimits?: RegistrationLimits };
    /** The replica's name (in its Lease and the Clusters' status). Default: local. */
    identity?: string;
    /** The CA of users' client certificates (replicas of one hub share it). Default: a new one. */
    signer?: { certPem: string; keyPem: string };
    /** Audit every request by the policy in `policyFile`, as JSON lines into `logPath`. Default: no audit. */
    audit?: { policyFile: string; logPath: string };
    /**
     * The controllers on, as installed: the ConfigMap holds `config` (the proxy enabled at the process's own port
     * added), the proxy's CA and signer are the controllers', and with `ssh` the SSH door listens (on a port it
     * picks) when `config` turns it on. Needs `tunnel` (its namespace is the concierge's). Default: fixed TLS files, no
     * controllers.
     */
    controlled?: { config: Record<string, unknown>; ssh?: boolean };
    /** Serve the metrics on a loopback port (metricsPort). Default: no metrics. */
    metrics?: boolean;
  } = {},
): Promise<ConciergeProcess> {
  const child = spawn(
    process.execPath,
    [
      // The Node options the install's Deployment gives the concierge.
      ...PROXY_NODE_OPTIONS.split(' '),
      '--expose-gc',
      fileURLToPath(new URL('./serve-concierge.ts', import.meta.url)),
      cluster.dir,
      cluster.url,
      cluster.binaries.kubectl,
      JSON.stringify(opts),
    ],
    { stdio: ['pipe', 'pipe', 'pipe'] },
  );
  let errors = '';
  // A question written to a process that has just died fails with EPIPE; its answer fails through `exited` instead.
  child.stdin.on('error', () => {});
  const reported: string[] = [];
  child.stderr.setEncoding('utf8');
  child.stderr.on('data', (chunk: string) => (errors = (errors + chunk).slice(-8000)));
  createInterface({ input: child.stderr }).on('line', (line) => {
    const report = parseProcessErrorLine(line);
    if (!report) return;
    const text = `the concierge process ${opts.identity ?? child.pid} reported ${report.kind}: ${report.text}`;
    reported.push(text);
    reportProcessError(text);
  });
  const exited = new Promise<void>((done) => child.once('exit', () => done()));
  const lines = createInterface({ input: child.stdout })[Symbol.asyncIterator]();
  let answeredAt = Date.now();
  const next = async (): Promise<string> => {
    const line = await Promise.race([lines.next(), exited.then(() => undefined)]);
    if (!line || line.done) throw new Error(`the concierge process exited:\n${errors}`);
    answeredAt = Date.now();
    return line.value;
  };
  const stop = async (): Promise<void> => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    // Closing stdin is its cue to exit; a kill makes sure.
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), 5_000);
    await exited;
    clearTimeout(timer);
  };
  // One question on stdin at a time: the answers come back in order on the same stdout.
  let asking: Promise<unknown> = Promise.resolve();
  const ask = <T>(question: string): Promise<T> => {
    const answer = asking.then(async () => {
      child.stdin.write(`${question}\n`);
      return JSON.parse(await next()) as T;
    });
    asking = answer.catch(() => {});
    return answer;
  };
  try {
    const info = JSON.parse(await next()) as Pick<
      ConciergeProcess,
      'url' | 'servingCA' | 'signer' | 'tunnel' | 'ssh' | 'metricsPort'
    >;
    return {
      ...info,
      pid: child.pid!,
      rss: () => residentBytes(child.pid!),
      memory: () => ask<NodeJS.MemoryUsage>('mem'),
      eventLoop: (what) => ask<LoopDelay>(what === 'window' ? 'loop' : 'loop total'),
      answeredAt: () => answeredAt,
      resetEventLoop: () => ask<object>('loop reset').then(() => {}),
      alive: () => child.exitCode === null && child.signalCode === null,
      stderr: () => errors,
      processErrors: () => [...reported],
      stop,
    };
  } catch (err) {
    await stop();
    throw err;
  }
}
