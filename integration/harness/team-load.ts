// A team's load on Sealion, as the demo user through the proxy, with the real kubectl on both clusters (the hub, and
// edge through its tunnel): a loop of writes and reads, watches that resume by resourceVersion when their response
// ends (as an informer does), two `logs -f`, an interactive exec and a port-forward moving bytes. It counts what an
// upgrade must not cost: failed plain requests, events a watch missed, sessions that hung instead of ending with a
// message, and the seconds each cluster was unreachable, each by the phase it happened in (`phase`).
import { spawn, type ChildProcess } from 'node:child_process';
import { get } from 'node:http';
import { setTimeout as sleep } from 'node:timers/promises';
import { runKubectl, type KubectlResult } from '../../dev/cluster.ts';
import { DEMO_NAMESPACE, DEMO_POD } from '../../dev/installed.ts';
import { dieWithParent, stopChild } from '../../dev/processes.ts';

export type Where = 'hub' | 'edge';
export const WHERE: readonly Where[] = ['hub', 'edge'];

/**
 * How long an open session or watch may stay silent while it owes something (a log line, an echo, a transfer, an
 * event written) before it counts as hung, and is stopped and started again. Long enough for a drain's grace (a
 * session keeps being served through it, then ends with a message) and a busy machine's pauses; a session that
 * outlives its replica with nothing to say is the hang this catches.
 */
export const HUNG_MS = 60_000;
/** The loop's pause between iterations: a request or two a second per cluster, as a few people and a controller. */
const PACE_MS = 300;
/** A plain request's deadline: past it, it failed. */
const REQUEST_TIMEOUT_MS = 30_000;
/** What a user or an informer waits before starting again what ended. */
const RESTART_MS = 500;
/** The file the demo pod's httpd serves for port-forward: enough bytes that a transfer is more than one packet. */
export const BLOB_PATH = '/blob.bin';
export const BLOB_BYTES = 256 * 1024;

export interface LoadOptions {
  kubectl: string;
  /** The demo user's kubeconfig for each cluster, through Sealion. */
  kubeconfigs: Record<Where, string>;
  /** Set for every kubectl (where the exec plugin keeps its credentials). */
  env: NodeJS.ProcessEnv;
  /** Watches on each cluster. */
  watchesPer: number;
  /** The `ssh` command (program first) that opens a shell in the hub's demo pod through the SSH door, if any. */
  ssh?: string[];
  log: (line: string) => void;
}

interface RequestRecord {
  where: Where;
  phase: string;
  start: number;
  ok: boolean;
  said: string;
}

interface SessionEnd {
  session: string;
  phase: string;
  how: 'message' | 'silent' | 'hung';
  said: string;
}

/** What each phase cost, as the table prints it. */
export interface PhaseCount {
  phase: string;
  requests: Record<Where, number>;
  failed: Record<Where, number>;
  /** Writes of the phase that some watch of their cluster never delivered, summed over the watches. */
  missed: number;
  /** Responses of watches that ended (and resumed from their resourceVersion). */
  resumed: number;
  endedWithMessage: number;
  endedSilently: number;
  hung: number;
  unreachableSeconds: Record<Where, number>;
  /** The first few failures and session ends, for a reader of the table. */
  said: string[];
  /** What the first few failed requests said, for an assertion's diff. */
  failures: string[];
}

/** A process the load started, with what it printed and when it last made progress. */
interface Running {
  child: ChildProcess;
  stderr: string;
  lastProgress: number;
  exited: Promise<number | null>;
}

export class TeamLoad {
  phase = 'start';
  /** Whether the request loops write and read; cleared first when the load stops. */
  private writing = true;
  /** Whether watches and sessions run (and start again when they end). */
  private running = true;
  private readonly requests: RequestRecord[] = [];
  private readonly writes: { where: Where; phase: string; key: string; at: number }[] = [];
  private readonly ends: SessionEnd[] = [];
  private readonly resumes: { phase: string }[] = [];
  private readonly seen: { where: Where; keys: Set<string> }[] = [];
  private readonly open = new Map<string, Running>();
  private readonly loops: Promise<void>[] = [];
  private readonly requestLoops: Promise<void>[] = [];
  /** Names this load's ConfigMaps, apart from another load's on the same cluster. */
  private readonly id = Date.now().toString(36);
  private readonly o: LoadOptions;
  constructor(o: LoadOptions) {
    this.o = o;
  }

  /** Starts every part; resolves once each has made progress (an answer, an event, a line, an echo, a transfer). */
  async start(): Promise<void> {
    const from = await this.listVersions();
    for (const where of WHERE) {
      for (let i = 0; i < this.o.watchesPer; i++) this.spawnLoop(this.watchLoop(where, i, from[where]));
    }
    for (const where of WHERE) this.requestLoops.push(this.guarded(this.requestLoop(where)));
    this.spawnLoop(this.sessionLoop('logs -f hub', () => this.followLogs('hub')));
    this.spawnLoop(this.sessionLoop('logs -f edge', () => this.followLogs('edge')));
    this.spawnLoop(this.sessionLoop('exec -i hub', () => this.interactiveExec()));
    this.spawnLoop(this.sessionLoop('port-forward hub', () => this.portForward()));
    const ssh = this.o.ssh;
    if (ssh) this.spawnLoop(this.sessionLoop('ssh hub', () => this.typedShell('ssh hub', ssh)));
    await this.waitFor(() => {
      const missing = [...this.open.entries()].filter(([, r]) => r.lastProgress === 0).map(([n]) => n);
      const answered = WHERE.filter((w) => this.requests.some((r) => r.where === w && r.ok));
      const sessions = this.o.ssh ? 5 : 4;
      if (
        missing.length ||
        answered.length < WHERE.length ||
        this.open.size < sessions + 2 * this.o.watchesPer
      )
        throw new Error(`not yet under way: ${missing.join(', ')}; answered on ${answered.join(', ')}`);
    }, 120_000);
  }

  /**
   * Resolves once everything still open has made progress since `since` (or was counted hung and started again),
   * and each cluster answered a request sent after it: the load has come through what happened at `since`.
   */
  async settled(since: number): Promise<void> {
    await this.waitFor(() => {
      const behind = [...this.open.entries()].filter(([, r]) => r.lastProgress < since).map(([n]) => n);
      const answered = WHERE.filter((w) =>
        this.requests.some((r) => r.where === w && r.ok && r.start > since),
      );
      if (behind.length || answered.length < WHERE.length)
        throw new Error(`silent since then: ${behind.join(', ')}; answered on ${answered.join(', ')}`);
    }, HUNG_MS + 60_000);
  }

  /** Stops the writes, waits (a bounded time) for the watches to deliver the last ones, and stops everything. */
  async stop(): Promise<void> {
    this.writing = false;
    // The writes in flight are recorded first: the watches owe them too.
    await Promise.all(this.requestLoops);
    const writesStopped = Date.now();
    await this.waitFor(() => {
      if (this.undelivered().length) throw new Error('watches still behind');
    }, 30_000).catch(() => this.o.log(`${this.undelivered().length} events never delivered`));
    this.running = false;
    await Promise.all([...this.open.values()].map((r) => stopChild(r.child)));
    await Promise.all(this.loops);
    this.o.log(`load stopped ${Date.now() - writesStopped} ms after its last writes`);
  }

  /** The counts of each phase, in the order they began. */
  counts(): PhaseCount[] {
    const phases = [...new Set(this.requests.map((r) => r.phase))];
    const missed = this.undelivered();
    return phases.map((phase) => {
      const reqs = this.requests.filter((r) => r.phase === phase);
      const ends = this.ends.filter((e) => e.phase === phase);
      const byWhere = (f: (r: RequestRecord[]) => number): Record<Where, number> => ({
        hub: f(reqs.filter((r) => r.where === 'hub')),
        edge: f(reqs.filter((r) => r.where === 'edge')),
      });
      return {
        phase,
        requests: byWhere((r) => r.length),
        failed: byWhere((r) => r.filter((x) => !x.ok).length),
        missed: missed.filter((m) => m.phase === phase).length,
        resumed: this.resumes.filter((r) => r.phase === phase).length,
        endedWithMessage: ends.filter((e) => e.how === 'message').length,
        endedSilently: ends.filter((e) => e.how === 'silent').length,
        hung: ends.filter((e) => e.how === 'hung').length,
        unreachableSeconds: byWhere(unreachableSeconds),
        failures: reqs
          .filter((r) => !r.ok)
          .slice(0, 4)
          .map((r) => `${r.where}: ${r.said}`),
        said: [
          ...reqs.filter((r) => !r.ok).map((r) => `${r.where}: ${r.said}`),
          ...ends.map((e) => `${e.session} ${e.how}: ${e.said}`),
        ].slice(0, 8),
      };
    });
  }

  /** Writes that some watch of their cluster has not delivered, once for each such watch. */
  private undelivered(): { phase: string; key: string }[] {
    return this.writes.flatMap((w) =>
      this.seen.filter((s) => s.where === w.where && !s.keys.has(w.key)).map(() => w),
    );
  }

  private spawnLoop(loop: Promise<void>): void {
    this.loops.push(this.guarded(loop));
  }

  /** A loop that cannot reject: a loop that failed is logged, and what it did not do shows in the counts. */
  private guarded(loop: Promise<void>): Promise<void> {
    return loop.catch((err: unknown) => this.o.log(`a load loop failed: ${String(err)}`));
  }

  private async waitFor(check: () => void, timeoutMs: number): Promise<void> {
    const deadline = Date.now() + timeoutMs;
    for (;;) {
      try {
        check();
        return;
      } catch (err) {
        if (Date.now() > deadline) throw err;
        await sleep(250);
      }
    }
  }

  private kubectl(where: Where, args: string[], timeoutMs = REQUEST_TIMEOUT_MS): Promise<KubectlResult> {
    return runKubectl(this.o.kubectl, this.o.kubeconfigs[where], ['-n', DEMO_NAMESPACE, ...args], {
      env: this.o.env,
      timeoutMs,
    });
  }

  /** The collection each cluster's watches follow: the demo user writes ConfigMaps on the hub, the demo pod on edge. */
  private static collection(where: Where): string {
    return `/api/v1/namespaces/${DEMO_NAMESPACE}/${where === 'hub' ? 'configmaps' : 'pods'}`;
  }

  private async listVersions(): Promise<Record<Where, string>> {
    const out = {} as Record<Where, string>;
    for (const where of WHERE) out[where] = await this.listVersion(where);
    return out;
  }

  /** The resourceVersion of a list of a cluster's collection: where its watches start. */
  private async listVersion(where: Where): Promise<string> {
    const listed = await this.kubectl(where, ['get', '--raw', TeamLoad.collection(where)]);
    if (listed.code !== 0) throw new Error(`listing on ${where}: ${listed.stderr}`);
    return (JSON.parse(listed.stdout) as { metadata: { resourceVersion: string } }).metadata.resourceVersion;
  }

  /** Writes and reads, one after the other, until stopped: each a kubectl of its own, as people run them. */
  private async requestLoop(where: Where): Promise<void> {
    // What the reads ask for: the newest object written (on the hub, a ConfigMap that exists for certain).
    let written = where === 'hub' ? 'kube-root-ca.crt' : DEMO_POD;
    for (let n = 0; this.writing; n++) {
      const name = where === 'hub' ? `load-${this.id}-${n}` : DEMO_POD;
      const write =
        where === 'hub'
          ? ['create', 'configmap', name, `--from-literal=n=${n}`]
          : ['annotate', 'pod', name, `sealion.dev/load=${n}`, '--overwrite'];
      const wrote = await this.request(where, [...write, '-o', 'jsonpath={.metadata.resourceVersion}']);
      const rv = wrote.code === 0 ? wrote.stdout.trim() : '';
      if (rv) {
        this.writes.push({ where, phase: this.phase, key: `${name}@${rv}`, at: Date.now() });
        written = name;
      }
      await this.request(where, ['get', where === 'hub' ? 'configmap' : 'pod', written, '-o', 'name']);
      await sleep(PACE_MS);
    }
  }

  private async request(where: Where, args: string[]): Promise<KubectlResult> {
    const start = Date.now();
    const phase = this.phase;
    const result = await this.kubectl(where, args);
    const said = result.stderr.trim().split('\n').pop() ?? '';
    this.requests.push({ where, phase, start, ok: result.code === 0, said });
    return result;
  }

  /**
   * One watch as an informer keeps it: from `from`, each response followed to its end, then resumed from the last
   * resourceVersion it delivered (a bookmark's included); a 410 Gone lists again, which the count shows as missed
   * events if any fell in between.
   */
  private async watchLoop(where: Where, index: number, from: string): Promise<void> {
    const seen = { where, keys: new Set<string>() };
    this.seen.push(seen);
    let rv = from;
    const name = `watch ${where} #${index}`;
    while (this.running) {
      const path = `${TeamLoad.collection(where)}?watch=1&allowWatchBookmarks=true&resourceVersion=${rv}`;
      let buffered = '';
      let gone = false;
      const run = this.startProcess(name, where, ['get', '--raw', path], (chunk, r) => {
        buffered += chunk;
        for (let at = buffered.indexOf('\n'); at >= 0; at = buffered.indexOf('\n')) {
          const line = buffered.slice(0, at);
          buffered = buffered.slice(at + 1);
          const event = parseEvent(line);
          if (!event) continue;
          if (event.type === 'ERROR') gone = event.object.code === 410;
          else if (event.object.metadata?.resourceVersion) {
            rv = event.object.metadata.resourceVersion;
            if (event.type !== 'BOOKMARK') seen.keys.add(`${event.object.metadata.name}@${rv}`);
          }
          r.lastProgress = Date.now();
        }
      });
      // Owed: a write of its cluster made a while ago that it has not delivered.
      const owes = (): boolean =>
        this.writes.some((w) => w.where === where && w.at < Date.now() - HUNG_MS && !seen.keys.has(w.key));
      const how = await this.followToEnd(name, run, owes);
      if (how !== 'stopped') this.resumes.push({ phase: this.phase });
      if (gone) rv = await this.listVersion(where).catch(() => rv);
      await sleep(RESTART_MS);
    }
  }

  /** Starts a session again each time it ends, as a user runs the command again, until stopped. */
  private async sessionLoop(name: string, start: () => { run: Running; owes: () => boolean }): Promise<void> {
    while (this.running) {
      const { run, owes } = start();
      await this.followToEnd(name, run, owes);
      await sleep(RESTART_MS);
    }
  }

  /**
   * Waits for a session or watch to end, judging how: with a message on standard error, silently, or not at all
   * while it owed something for HUNG_MS (then it is stopped: hung).
   */
  private async followToEnd(
    name: string,
    run: Running,
    owes: () => boolean,
  ): Promise<'message' | 'silent' | 'hung' | 'stopped'> {
    const phase = (): string => this.phase;
    for (;;) {
      const code = await Promise.race([run.exited, sleep(1_000, 'open' as const)]);
      if (code !== 'open') {
        this.open.delete(name);
        if (!this.running) return 'stopped';
        const said = run.stderr.trim().split('\n').pop() ?? '';
        const how = said ? 'message' : 'silent';
        if (!name.startsWith('watch'))
          this.ends.push({ session: name, phase: phase(), how, said: `${code} ${said}` });
        return how;
      }
      if (!this.running) continue;
      if (Date.now() - run.lastProgress > HUNG_MS && owes()) {
        this.ends.push({
          session: name,
          phase: phase(),
          how: 'hung',
          said: `silent for ${HUNG_MS / 1000} s`,
        });
        await stopChild(run.child);
        this.open.delete(name);
        return 'hung';
      }
    }
  }

  /** Starts kubectl for a session; `onOut` sees its standard output. */
  private startProcess(
    name: string,
    where: Where,
    args: string[],
    onOut: (chunk: string, run: Running) => void,
  ): Running {
    const kubectl = [
      this.o.kubectl,
      `--kubeconfig=${this.o.kubeconfigs[where]}`,
      '-n',
      DEMO_NAMESPACE,
      ...args,
    ];
    return this.startCommand(name, kubectl, onOut);
  }

  /** Starts `program` (first of `words`) for a session; `onOut` sees its standard output. */
  private startCommand(name: string, words: string[], onOut: (chunk: string, run: Running) => void): Running {
    const [command, argv] = dieWithParent(words[0]!, words.slice(1));
    const child = spawn(command, argv, {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, ...this.o.env },
    });
    const run: Running = {
      child,
      stderr: '',
      lastProgress: 0,
      exited: new Promise((done) => {
        child.once('exit', (code) => done(code));
        child.once('error', () => done(-1));
      }),
    };
    // Progress only once it shows it works (lastProgress 0 until then).
    child.stdout.setEncoding('utf8');
    child.stderr.setEncoding('utf8');
    child.stdout.on('data', (chunk: string) => onOut(chunk, run));
    child.stderr.on('data', (chunk: string) => (run.stderr = (run.stderr + chunk).slice(-2000)));
    child.stdin.on('error', () => {});
    this.open.set(name, run);
    return run;
  }

  private followLogs(where: Where): { run: Running; owes: () => boolean } {
    const started = Date.now();
    const run = this.startProcess(
      `logs -f ${where}`,
      where,
      ['logs', '-f', '--tail=1', DEMO_POD],
      (_c, r) => {
        r.lastProgress = Date.now();
      },
    );
    // The demo pod prints a line every 5 s: a follower is always owed one.
    return { run, owes: () => Date.now() - started > HUNG_MS };
  }

  /** `exec -i` into a shell that echoes what is typed, a line every 2 s. */
  private interactiveExec(): { run: Running; owes: () => boolean } {
    const exec = [this.o.kubectl, `--kubeconfig=${this.o.kubeconfigs.hub}`, '-n', DEMO_NAMESPACE];
    return this.typedShell('exec -i hub', [...exec, 'exec', '-i', DEMO_POD, '--', 'sh']);
  }

  /** A session whose shell is typed a line every 2 s, each echoed back. */
  private typedShell(name: string, words: string[]): { run: Running; owes: () => boolean } {
    const started = Date.now();
    const run = this.startCommand(name, words, (_c, r) => {
      r.lastProgress = Date.now();
    });
    const typing = setInterval(() => {
      if (run.child.stdin?.writable) run.child.stdin.write(`echo typed $(date +%s)\n`);
    }, 2_000);
    void run.exited.then(() => clearInterval(typing));
    return { run, owes: () => Date.now() - started > HUNG_MS };
  }

  /** `port-forward` to the demo pod's httpd, with BLOB_BYTES fetched through it every 2 s. */
  private portForward(): { run: Running; owes: () => boolean } {
    const started = Date.now();
    let port = 0;
    let output = '';
    const run = this.startProcess(
      'port-forward hub',
      'hub',
      ['port-forward', `pod/${DEMO_POD}`, ':8080'],
      (c) => {
        output += c;
        port ||= Number(/127\.0\.0\.1:(\d+)/.exec(output)?.[1] ?? 0);
      },
    );
    const fetching = (async () => {
      while (run.child.exitCode === null && run.child.signalCode === null) {
        if (port && (await fetchLength(port, BLOB_PATH)) === BLOB_BYTES) run.lastProgress = Date.now();
        await sleep(2_000);
      }
    })();
    fetching.catch((err: unknown) => this.o.log(`port-forward's fetches failed: ${String(err)}`));
    return { run, owes: () => Date.now() - started > HUNG_MS };
  }
}

interface WatchEvent {
  type: string;
  object: { code?: number; metadata?: { name: string; resourceVersion: string } };
}

/** A line of a watch's response, or undefined for one that is no event (kubectl prints nothing else there). */
function parseEvent(line: string): WatchEvent | undefined {
  try {
    const event = JSON.parse(line) as WatchEvent;
    return typeof event.type === 'string' && typeof event.object === 'object' ? event : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The seconds a cluster was unreachable in a phase: from each failed request that followed a success (or began the
 * phase) to the next request that succeeded, summed.
 */
function unreachableSeconds(requests: RequestRecord[]): number {
  const sorted = [...requests].sort((a, b) => a.start - b.start);
  let total = 0;
  let failingSince: number | undefined;
  for (const r of sorted) {
    if (!r.ok) failingSince ??= r.start;
    else if (failingSince !== undefined) {
      total += r.start - failingSince;
      failingSince = undefined;
    }
  }
  if (failingSince !== undefined) total += (sorted.at(-1)?.start ?? failingSince) - failingSince;
  return Math.round(total / 100) / 10;
}

/** The length of what `path` answers through a forwarded port, or -1 when it fails (in 10 s at most). */
function fetchLength(port: number, path: string): Promise<number> {
  return new Promise((done) => {
    const req = get({ host: '127.0.0.1', port, path, timeout: 10_000 }, (res) => {
      let length = 0;
      res.on('data', (chunk: Buffer) => (length += chunk.length));
      res.on('end', () => done(res.statusCode === 200 ? length : -1));
      res.on('error', () => done(-1));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => done(-1));
  });
}

/** The counts as one table, a row a phase. */
export function countsTable(counts: PhaseCount[]): string {
  const header = [
    'phase',
    'requests hub/edge',
    'failed hub/edge',
    'missed events',
    'watch resumes',
    'ended with message',
    'ended silently',
    'hung',
    'unreachable s hub/edge',
  ];
  const rows = counts.map((c) => [
    c.phase,
    `${c.requests.hub}/${c.requests.edge}`,
    `${c.failed.hub}/${c.failed.edge}`,
    String(c.missed),
    String(c.resumed),
    String(c.endedWithMessage),
    String(c.endedSilently),
    String(c.hung),
    `${c.unreachableSeconds.hub}/${c.unreachableSeconds.edge}`,
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]): string => cells.map((c, i) => c.padEnd(widths[i]!)).join(' | ');
  const said = counts.flatMap((c) => c.said.map((s) => `  ${c.phase}: ${s}`));
  return [line(header), widths.map((w) => '-'.repeat(w)).join('-|-'), ...rows.map(line), ...said].join('\n');
}
