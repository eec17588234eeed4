// The request benchmarks' load generator: a Go process (integration/kube/kubernetes/loadgen) that sends requests
// through client-go's transport at the pinned release, so every target sees kubectl's HTTP/2 client, down to its
// header compression.
import { spawn, type ChildProcess } from 'node:child_process';
import type { OutgoingHttpHeaders } from 'node:http';
import { createInterface } from 'node:readline';
import { ensureLoadGenerator } from '../dev/build.ts';
import { dieWithParent } from '../dev/processes.ts';
import type { Measurement } from './measure.ts';

/** Where and how a target is reached: a URL, the CA to trust, and a client certificate, token or headers. */
export interface TargetSpec {
  url: string;
  ca?: string;
  cert?: string;
  key?: string;
  token?: string;
  headers?: OutgoingHttpHeaders;
}

export interface Target {
  name: string;
  /** The load generator's name for it. */
  id: string;
  /** The process doing the proxying, if any, whose CPU time per request is reported. */
  pid?: number;
  /**
   * Gives the target new credentials (a renewed certificate), as a client whose credential plugin hands it new
   * ones: later requests go over a new connection.
   */
  update: (spec: TargetSpec) => Promise<void>;
  /** Sends one GET; resolves with HTTP 200, rejects with anything else. */
  get: (path: string) => Promise<number>;
  /**
   * GETs `path` from `concurrency` loops for `warmupSeconds`, then, after `onStart` (where callers read CPU
   * counters), for `seconds` on the clock. Rejects if any measured request failed.
   */
  measure: (
    name: string,
    path: string,
    opts: { seconds: number; concurrency: number; warmupSeconds: number; onStart?: () => unknown },
  ) => Promise<Measurement>;
}

export interface LoadGenerator {
  /** The load generator's process: to pin to CPUs, and to kill when done. */
  process: ChildProcess;
  target: (name: string, spec: TargetSpec) => Promise<Target>;
  /**
   * GETs `path` from each of `targets` in turn, one request at a time (each cycle in a random order), for
   * `warmupSeconds`, then, after `onStart`, for `seconds` on the clock; a measurement per target, in their order.
   * Every target is sampled over the same stretch of time, so a drift of the machine moves them all alike. A
   * measurement's rate is the one its target would have served alone: requests over the sum of their latencies.
   */
  alternate: (
    targets: readonly Target[],
    path: string,
    opts: { seconds: number; warmupSeconds: number; onStart?: () => unknown },
  ) => Promise<Measurement[]>;
}

/** What the load generator answers a run with (for each target, when alternating). */
interface Run {
  ops: number;
  seconds: number;
  /** The sum of the requests' latencies. */
  busySeconds: number;
  p50us: number;
  p99us: number;
  errors: number;
  firstError: string;
}

export async function startLoadGenerator(log: (line: string) => void): Promise<LoadGenerator> {
  const binary = await ensureLoadGenerator(log);
  const child: ChildProcess = spawn(...dieWithParent(binary, []), { stdio: ['pipe', 'pipe', 'inherit'] });
  const answers = createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
  const next = async (): Promise<Record<string, unknown>> => {
    const line = await answers.next();
    if (line.done) throw new Error('the load generator exited');
    const answer = JSON.parse(line.value) as Record<string, unknown>;
    if (typeof answer['error'] === 'string') throw new Error(answer['error']);
    return answer;
  };
  const send = (line: unknown): void => {
    child.stdin!.write(`${typeof line === 'string' ? line : JSON.stringify(line)}\n`);
  };
  // One command at a time: each answer belongs to the command before it.
  let queue: Promise<unknown> = Promise.resolve();
  const serially = <T>(work: () => Promise<T>): Promise<T> => {
    const result = queue.then(work);
    queue = result.catch(() => {});
    return result;
  };
  let targets = 0;
  // A measuring command: it warms up and says so; then `onStart`, and "go" starts the measurement it answers.
  const measuring = async (command: unknown, onStart?: () => unknown): Promise<unknown> => {
    send(command);
    await next();
    await onStart?.();
    send('go');
    return next();
  };
  const failed = (measurement: string, m: Run): Error =>
    new Error(`${measurement}: ${m.errors} requests failed, the first with: ${m.firstError}`);
  return {
    process: child,
    alternate: (alternating, path, opts) =>
      serially(async () => {
        const { runs } = (await measuring(
          { cmd: 'alternate', ids: alternating.map((t) => t.id), path, ...opts },
          opts.onStart,
        )) as { runs: Run[] };
        return runs.map((m, i) => {
          const { name } = alternating[i]!;
          if (m.errors > 0) throw failed(name, m);
          return {
            name,
            ops: m.ops,
            seconds: m.busySeconds,
            perSecond: m.ops / m.busySeconds,
            p50us: m.p50us,
            p99us: m.p99us,
          };
        });
      }),
    target: async (name, spec) => {
      const id = String(targets++);
      const define = (spec: TargetSpec): Promise<void> =>
        serially(async () => {
          const headers = Object.entries(spec.headers ?? {}).map(([header, value]): [string, string[]] => [
            header,
            (Array.isArray(value) ? value : [value]).map(String),
          ]);
          send({ cmd: 'target', id, ...spec, headers: Object.fromEntries(headers) });
          await next();
        });
      await define(spec);
      return {
        name,
        id,
        update: define,
        get: (path) =>
          serially(async () => {
            send({ cmd: 'get', id, path });
            try {
              return (await next())['status'] as number;
            } catch (err) {
              throw new Error(`${name}: ${(err as Error).message}`, { cause: err });
            }
          }),
        measure: (measurement, path, opts) =>
          serially(async () => {
            const m = (await measuring({ cmd: 'run', id, path, ...opts }, opts.onStart)) as Run;
            if (m.errors > 0) throw failed(measurement, m);
            return {
              name: measurement,
              ops: m.ops,
              seconds: m.seconds,
              perSecond: m.ops / m.seconds,
              p50us: m.p50us,
              p99us: m.p99us,
            };
          }),
      };
    },
  };
}
