// `npm run bench -- proxy`: GET and LIST latency and throughput through six paths to one real API server, in
// one run: direct (admin certificate), direct with the concierge's impersonation, `kubectl proxy` (the peer), a
// bare Node relay (serve-relay.ts), Sealion with a JWT bearer token, and Sealion with a TokenCredentialRequest
// certificate. Then the proxy's memory while holding 1,000 idle watches.
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { connect as http2Connect } from 'node:http2';
import { request as httpsRequest } from 'node:https';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { availableParallelism } from 'node:os';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Kind } from '../apis/groups.ts';
import { exchange } from '../cli/exec-credential.ts';
import { PROXY_NODE_OPTIONS } from '../manifests/install.ts';
import { closeHttpsPools } from '../lib/https-client.ts';
import { clientCertChain } from '../lib/pki/pem.ts';
import { impersonationHeaders } from '../concierge/proxy/impersonate.ts';
import { issueCert } from '../lib/pki/pki.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { dieWithParent, processesUsing } from '../dev/processes.ts';
import { applyJWTAuthenticator, forwardingToken } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';
import { startLoadGenerator, type Target, type TargetSpec } from './loadgen.ts';
import {
  formatNumber,
  measureRounds,
  measureRoundsTogether,
  printComparison,
  saveResults,
  selected,
  type Measurement,
  type Row,
} from './measure.ts';
import {
  DIRECT,
  KUBECTL_PROXY,
  PROXY_GROUPS,
  SEALION_AUDITED,
  SEALION_CERTIFICATE,
  SEALION_JWT,
  printVerdicts,
  proxyVerdicts,
  type Group,
  type Verdict,
  type WatchMemory,
} from './targets.ts';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
/**
 * Idle watches for the memory per watch: enough that what the first ones cost once (code compiled, pools and tables
 * grown) is a small share of the figure.
 */
const WATCHES = Number(process.env['BENCH_WATCHES'] ?? 4000);
/** Streams per HTTP/2 connection that carries the idle watches: under the proxy's limit of 1,000. */
const WATCHES_PER_CONNECTION = 800;
/** Memory samples per reading of the idle watches' memory, and the pause before and between them. */
const MEMORY_SAMPLES = 5;
const MEMORY_SETTLE_MS = 2000;
const MEMORY_SAMPLE_GAP_MS = 500;
/** What each operation reads. */
const PATHS: Record<Group['op'], string> = {
  GET: '/api/v1/namespaces/bench',
  LIST: '/api/v1/namespaces/bench/configmaps',
};
const CONFIGMAPS = 100;
/** Who the bench token names; cluster-admin through its group. */
const BENCH_USER = { username: 'bench-user', groups: ['bench'], extra: {} };

/** CPU time a process has used so far, from /proc (Linux; USER_HZ is 100). */
export function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/**
 * Where the processes run during a measurement: `shared`, all on every core (as on a one-machine setup), or
 * `split`, the control plane (kube-apiserver and etcd) on one half of the cores and everything else on the other.
 */
type Layout = NonNullable<Group['layout']>;

/** The program a process runs (the base name of its argv[0]); '' if it is gone. */
function programOf(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0')[0]!.replace(/^.*\//, '');
  } catch {
    return '';
  }
}

/** A harness cluster's control-plane processes: its API server, and it with etcd. */
export function controlPlaneOf(cluster: Cluster): { apiserver: number; all: number[] } {
  const all = processesUsing(cluster.dir).filter((pid) =>
    ['kube-apiserver', 'etcd'].includes(programOf(pid)),
  );
  return { apiserver: all.find((pid) => programOf(pid) === 'kube-apiserver')!, all };
}

/** Sets the CPU affinity of every thread of `pid` (util-linux taskset). */
function pin(pid: number, cpus: string): boolean {
  return spawnSync('taskset', ['--all-tasks', '--cpu-list', '--pid', cpus, String(pid)]).status === 0;
}

/**
 * Pins `controlPlane` to the upper half of the CPUs and `clients` to the lower half, and returns how to undo it;
 * undefined when there are fewer than 2 CPUs or taskset is missing.
 */
function splitCores(
  controlPlane: number[],
  clients: number[],
): { controlPlane: string; clients: string; restore: () => void } | undefined {
  const n = availableParallelism();
  if (n < 2) return undefined;
  const half = Math.floor(n / 2);
  const range = (from: number, to: number): string => (from === to ? `${from}` : `${from}-${to}`);
  const layout = { controlPlane: range(half, n - 1), clients: range(0, half - 1) };
  const all = range(0, n - 1);
  const restore = (): void => {
    for (const pid of [...controlPlane, ...clients]) pin(pid, all);
  };
  const pinned =
    controlPlane.length > 0 &&
    controlPlane.every((pid) => pin(pid, layout.controlPlane)) &&
    clients.every((pid) => pin(pid, layout.clients));
  if (!pinned) {
    restore();
    return undefined;
  }
  return { ...layout, restore };
}

/**
 * The API server's CPU profile over the next SECONDS (rounded down, at least 1; pprof counts whole seconds),
 * written to `file`.
 */
async function fetchPprof(cluster: Cluster, admin: { certPem: string; keyPem: string }, file: string) {
  const seconds = Math.max(1, Math.floor(SECONDS));
  const profile = await new Promise<Buffer>((done, fail) => {
    const req = httpsRequest(
      `${cluster.url}/debug/pprof/profile?seconds=${seconds}`,
      { ca: cluster.ca.certPem, cert: clientCertChain(admin.certPem), key: admin.keyPem },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          res.statusCode === 200
            ? done(Buffer.concat(chunks))
            : fail(new Error(`pprof: HTTP ${res.statusCode}`)),
        );
      },
    );
    req.on('error', fail);
    req.end();
  });
  writeFileSync(file, profile);
}

export function lines(child: ChildProcess): AsyncIterator<string> {
  return createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
}

/**
 * The bench token's lifetime: a day, like the harness's forwarding token, so that no run outlives it (an hour is
 * shorter than a run of BENCH_ROUNDS=10 BENCH_SECONDS=10). The proxy re-verifies a token on the same schedule
 * either way: its answers are reused for a fixed time, well within an hour.
 */
const BENCH_TOKEN_SECONDS = 24 * 3600;

/**
 * What both request benchmarks read: a JWTAuthenticator, namespace `bench` with CONFIGMAPS ConfigMaps, and a
 * token for a user whose group is cluster-admin. Returns the token.
 */
export async function prepareBenchData(cluster: Cluster, issuer: TestIssuer): Promise<string> {
  await applyJWTAuthenticator(cluster, 'bench', issuer, 'sealion-bench');
  await cluster.kubectl(['create', 'namespace', 'bench']);
  await cluster.kubectl([
    'create',
    'clusterrolebinding',
    'bench-admin',
    '--clusterrole=cluster-admin',
    '--group=bench',
  ]);
  await Promise.all(
    Array.from({ length: CONFIGMAPS }, (_, i) =>
      cluster.kubectl(['create', 'configmap', `cm-${i}`, '-n', 'bench', '--from-literal=k=v']),
    ),
  );
  return issuer.mint(
    { username: BENCH_USER.username, groups: BENCH_USER.groups },
    { expiresIn: BENCH_TOKEN_SECONDS },
  );
}

/** A target, and what it needs done before each measurement. */
type BenchTarget = Target & {
  /** Called before a measurement of `seconds` (warm-up included), to renew a credential that would expire. */
  prepare?: (seconds: number) => Promise<void>;
};

type MemoryReading = { rss: number; heapTotal: number; heapUsed: number; external: number };

/**
 * The proxy's memory, settled: after MEMORY_SETTLE_MS (connections and timers of what just happened come to rest),
 * the median of MEMORY_SAMPLES readings MEMORY_SAMPLE_GAP_MS apart, each after a full collection (`read`). One
 * reading moved by as much as the watches cost: the collector returns pages to the system when it chooses, and the
 * allocator keeps freed memory a while.
 */
async function settledMemory(read: () => Promise<MemoryReading>): Promise<MemoryReading> {
  await new Promise((r) => setTimeout(r, MEMORY_SETTLE_MS));
  const samples: MemoryReading[] = [];
  for (let i = 0; i < MEMORY_SAMPLES; i++) {
    if (i > 0) await new Promise((r) => setTimeout(r, MEMORY_SAMPLE_GAP_MS));
    samples.push(await read());
  }
  const mid = (key: keyof MemoryReading): number =>
    samples.map((s) => s[key]).sort((a, b) => a - b)[Math.floor(samples.length / 2)]!;
  return {
    rss: mid('rss'),
    heapTotal: mid('heapTotal'),
    heapUsed: mid('heapUsed'),
    external: mid('external'),
  };
}

/** Spare time a certificate must have beyond a measurement's end, for the bench's own bookkeeping around it. */
const CREDENTIAL_MARGIN_SECONDS = 30;

export async function benchProxy(): Promise<Verdict> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const profileDir = process.env['BENCH_PROFILE_DIR'];
  // With BENCH_PROFILE_DIR the API server serves pprof too, for its side of each measurement.
  const cluster = await startCluster({
    name: 'bench',
    controllerManager: false,
    log,
    ...(profileDir ? { apiserverArgs: ['--profiling=true'] } : {}),
  });
  const issuer = await startOIDCIssuer({ audience: 'sealion-bench' });
  const children: ChildProcess[] = [];
  try {
    // The concierge in its own process, so the load generator does not share its event loop, with the Node
    // options its Deployment gives it.
    const serveProxy = (...extra: string[]): ChildProcess =>
      spawn(
        ...dieWithParent(process.execPath, [
          ...PROXY_NODE_OPTIONS.split(' '),
          '--expose-gc',
          fileURLToPath(new URL('./serve-proxy.ts', import.meta.url)),
          cluster.dir,
          cluster.url,
          cluster.binaries.kubectl,
          ...extra,
        ]),
        { stdio: ['pipe', 'pipe', 'inherit'] },
      );
    const server = serveProxy();
    children.push(server);

    const serverLines = lines(server);
    log('waiting for the concierge');
    const { url: proxyURL, servingCA } = JSON.parse((await serverLines.next()).value as string) as {
      url: string;
      servingCA: string;
    };
    const ask = async <T>(command: string): Promise<T> => {
      server.stdin!.write(`${command}\n`);
      return JSON.parse((await serverLines.next()).value as string) as T;
    };
    const memory = (): Promise<MemoryReading> => ask('mem');
    const askAudited = async (command: string): Promise<void> => {
      auditedServer.stdin!.write(`${command}\n`);
      await auditedLines.next();
    };

    // The same concierge auditing every request at Metadata (the install's default policy): audit on against off.
    // Started once the first is ready: each prepares the cluster (its CRDs, its identity), which two at once race.
    const auditedServer = serveProxy('audit');
    children.push(auditedServer);
    const auditedLines = lines(auditedServer);
    const audited = JSON.parse((await auditedLines.next()).value as string) as {
      url: string;
      servingCA: string;
    };
    const token = await prepareBenchData(cluster, issuer);

    // kubectl proxy, the peer: plain HTTP on loopback, forwarding with the admin's credentials.
    const kubectlProxy = spawn(
      ...dieWithParent(cluster.binaries.kubectl, [
        '--kubeconfig',
        cluster.kubeconfigPath,
        'proxy',
        '--port=0',
      ]),
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    children.push(kubectlProxy);
    const started = (await lines(kubectlProxy).next()).value as string;
    const kubectlProxyURL = `http://${/Starting to serve on (\S+)/.exec(started)![1]}`;
    log(`kubectl proxy at ${kubectlProxyURL}`);

    const admin = await issueCert(cluster.ca, {
      commonName: 'bench-admin',
      organizations: ['system:masters'],
      usage: 'client',
    });
    // The concierge's own forwarding identity, a service account (serve-proxy.ts).
    const forwarding = await forwardingToken(cluster);
    // What Sealion sends the API server for the bench user: its forwarding token and Impersonate-* headers.
    const impersonating = {
      authorization: `Bearer ${forwarding}`,
      ...impersonationHeaders(BENCH_USER),
    };
    // The floor for a proxy in Node: a bare relay sending the same (serve-relay.ts).
    const relay = spawn(
      ...dieWithParent(process.execPath, [
        fileURLToPath(new URL('./serve-relay.ts', import.meta.url)),
        cluster.dir,
        cluster.url,
      ]),
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    children.push(relay);
    relay.stdin.write(`${JSON.stringify(impersonating)}\n`);
    const { url: relayURL, servingCA: relayCA } = JSON.parse((await lines(relay).next()).value as string) as {
      url: string;
      servingCA: string;
    };
    const loadgen = await startLoadGenerator(log);
    children.push(loadgen.process);
    const targets: BenchTarget[] = [
      await loadgen.target(DIRECT, {
        url: cluster.url,
        ca: cluster.ca.certPem,
        cert: admin.certPem,
        key: admin.keyPem,
      }),
      // The floor for any impersonating proxy: the API server's own cost of authorizing impersonation, paid by
      // a direct client with the concierge's identity that sends the same Impersonate-* headers Sealion sends.
      await loadgen.target('direct impersonating', {
        url: cluster.url,
        ca: cluster.ca.certPem,
        headers: impersonating,
      }),
      { ...(await loadgen.target(KUBECTL_PROXY, { url: kubectlProxyURL })), pid: kubectlProxy.pid! },
      { ...(await loadgen.target('node relay', { url: relayURL, ca: relayCA })), pid: relay.pid! },
      {
        ...(await loadgen.target(SEALION_JWT, { url: proxyURL, ca: servingCA, token })),
        pid: server.pid!,
      },
      {
        ...(await loadgen.target(SEALION_AUDITED, { url: audited.url, ca: audited.servingCA, token })),
        pid: auditedServer.pid!,
      },
    ];
    // A TokenCredentialRequest certificate lasts 5 minutes, and the proxy refuses it after that even on a
    // connection made before. Like kubectl's credential plugin, the bench asks for a new one when the one it holds
    // would run out during the next measurement.
    const newCredential = async (): Promise<{ spec: TargetSpec; expires: number }> => {
      // What `sealion login` sends, through its own code.
      const credential = await exchange(proxyURL, servingCA, token, {
        kind: Kind.JWTAuthenticator,
        name: 'bench',
      });
      return {
        spec: {
          url: proxyURL,
          ca: servingCA,
          cert: credential.clientCertificateData,
          key: credential.clientKeyData,
        },
        expires: Date.parse(credential.expirationTimestamp),
      };
    };
    let credential = await newCredential();
    const certificate = await loadgen.target(SEALION_CERTIFICATE, credential.spec);
    targets.push({
      ...certificate,
      pid: server.pid!,
      prepare: async (seconds) => {
        if (credential.expires - Date.now() > (seconds + CREDENTIAL_MARGIN_SECONDS) * 1000) return;
        credential = await newCredential();
        await certificate.update(credential.spec);
        log(
          `new TokenCredentialRequest certificate, good until ${new Date(credential.expires).toISOString()}`,
        );
      },
    });
    const controlPlane = controlPlaneOf(cluster);
    const apiserverPid = controlPlane.apiserver;
    for (const t of targets) await eventually(() => t.get('/api/v1/namespaces/bench'), 30_000);
    log('all targets answer; measuring');

    // Idle watches, first, while the proxy's memory is not yet grown by the throughput runs: one HTTP/2 connection to the proxy carries them all; the proxy holds one upstream request each.
    const before = await settledMemory(memory);
    // Several connections, each below the proxy's limit of concurrent HTTP/2 streams.
    const sessions = Array.from({ length: Math.ceil(WATCHES / WATCHES_PER_CONNECTION) }, () =>
      // A session the proxy ends with an error fails its watches (each stream's error says so), not the run.
      http2Connect(proxyURL, { ca: servingCA }).on('error', (err: Error) =>
        log(`a watch connection failed: ${err.message}`),
      ),
    );
    // Like client-go, a watch refused with 429 (the API server's priority and fairness) is retried after the
    // server's Retry-After.
    const openWatch = async (i: number): Promise<string> => {
      for (let attempt = 0; ; attempt++) {
        const stream = sessions[i % sessions.length]!.request({
          ':path': `/api/v1/namespaces/bench/configmaps?watch=true&fieldSelector=metadata.name%3Dnone-${i}`,
          authorization: `Bearer ${token}`,
        });
        stream.on('data', () => {});
        const answer = await new Promise<{ status: string; retryAfter?: number }>((done) => {
          stream.once('response', (headers) =>
            done({ status: String(headers[':status']), retryAfter: Number(headers['retry-after'] ?? 1) }),
          );
          stream.once('error', (err: Error & { code?: string }) => done({ status: err.code ?? err.message }));
          setTimeout(() => done({ status: 'no answer in 30 s' }), 30_000).unref();
        });
        if (answer.status !== '429' || attempt === 5) return answer.status;
        stream.close();
        await new Promise((r) => setTimeout(r, answer.retryAfter! * 1000));
      }
    };
    const streams = Array.from({ length: WATCHES }, (_, i) => openWatch(i));
    const outcomes = new Map<string, number>();
    for (const outcome of await Promise.all(streams)) outcomes.set(outcome, (outcomes.get(outcome) ?? 0) + 1);
    const opened = outcomes.get('200') ?? 0;
    log(`${opened} of ${WATCHES} watches open (${[...outcomes].map(([k, n]) => `${k}: ${n}`).join(', ')})`);
    const after = await settledMemory(memory);
    for (const session of sessions) session.destroy();
    // Shown beside the figure: what the proxy gave back once the watches closed.
    const released = await settledMemory(memory);
    // The growth from before the watches opened to while they are open, each reading settled (settledMemory).
    const perWatch = (key: keyof MemoryReading): number => (after[key] - before[key]) / 1024 / opened;
    const watchMemory = {
      watches: opened,
      rssPerWatchKiB: perWatch('rss'),
      heapPerWatchKiB: perWatch('heapUsed'),
      heapTotalPerWatchKiB: perWatch('heapTotal'),
      externalPerWatchKiB: perWatch('external'),
      rssBeforeMiB: before.rss / 1024 / 1024,
      rssAfterMiB: after.rss / 1024 / 1024,
      rssReleasedMiB: released.rss / 1024 / 1024,
    };

    // BENCH_PROFILE_DIR=dir: a CPU profile of the concierge during each measurement of Sealion (for
    // chrome://inspect or speedscope), and the API server's during every measurement (`go tool pprof`). Returns
    // how to end them.
    const startProfiles = async (name: string, concierge: boolean): Promise<() => Promise<void>> => {
      if (!profileDir) return async () => {};
      if (concierge) await ask(`profile ${join(profileDir, `${name}.cpuprofile`)}`);
      // And the audited concierge's, beside it.
      if (concierge) await askAudited(`profile ${join(profileDir, `${name}.audited.cpuprofile`)}`);
      const apiserver = fetchPprof(cluster, admin, join(profileDir, `${name}.apiserver.pprof`));
      return async () => {
        if (concierge) await ask('profile-end');
        if (concierge) await askAudited('profile-end');
        await apiserver;
      };
    };

    const rows: Measurement[] = [];
    const measureGroup = async ({ op, concurrency, layout = 'shared' }: Group) => {
      if (!selected(`${op} c=${concurrency} ${layout}`)) return;
      const path = PATHS[op];
      // CPU time so far of the proxies `pids`, the API server and the load generator (whose share, on shared
      // cores, the others do not get).
      const counters = (pids: number[]) => ({
        proxies: new Map(pids.map((pid) => [pid, cpuSeconds(pid)])),
        apiserver: cpuSeconds(apiserverPid),
        client: cpuSeconds(loadgen.process.pid!),
      });
      type Counters = ReturnType<typeof counters>;
      // A row of the table: `m`, measured through `t`, with the CPU time per request between two readings: its
      // proxy's over `proxyOps` (the requests it served), the API server's and the client's over `allOps`.
      const row = (
        m: Measurement,
        t: BenchTarget,
        [before, after]: [Counters, Counters],
        proxyOps: number,
        allOps: number,
      ): Measurement => {
        const perRequest = (from: number, to: number, ops: number): number => ((to - from) * 1e6) / ops;
        return {
          ...m,
          name: `${op} c=${concurrency} ${layout} ${t.name}`,
          op,
          concurrency,
          layout,
          target: t.name,
          proxyCpuUs: t.pid ? perRequest(before.proxies.get(t.pid)!, after.proxies.get(t.pid)!, proxyOps) : 0,
          apiserverCpuUs: perRequest(before.apiserver, after.apiserver, allOps),
          clientCpuUs: perRequest(before.client, after.client, allOps),
        };
      };
      const measureOne = async (t: BenchTarget, warmupSeconds: number): Promise<Measurement> => {
        await t.prepare?.(warmupSeconds + SECONDS);
        const pids = t.pid ? [t.pid] : [];
        let cpuBefore = counters(pids);
        const profileName = `${op}-c${concurrency}-${layout}-${t.name.replace(/\W+/g, '-')}`;
        let endProfiles = async (): Promise<void> => {};
        const m = await t.measure(`${op} c=${concurrency} ${layout} ${t.name}`, path, {
          seconds: SECONDS,
          concurrency,
          warmupSeconds,
          onStart: async () => {
            endProfiles = await startProfiles(profileName, t.pid === server.pid);
            cpuBefore = counters(pids);
          },
        });
        const cpuAfter = counters(pids);
        await endProfiles();
        log(`${m.name}: ${Math.round(m.perSecond)} req/s`);
        return row(m, t, [cpuBefore, cpuAfter], m.ops, m.ops);
      };
      // At concurrency 1 every target is measured at once, a request at a time to each in turn, so all are
      // sampled under the same state of the machine and the API server: their p50s differ by a fraction of a
      // millisecond, less than that state moves a p50 in the time it takes to measure them one after another. So
      // the CPU times are shared: the API server's and the client's per request of any target, a proxy's per
      // request through it.
      const measureTogether = async (warmupSeconds: number): Promise<Measurement[]> => {
        for (const t of targets) await t.prepare?.(warmupSeconds + SECONDS);
        const pids = [...new Set(targets.map((t) => t.pid).filter((pid) => pid !== undefined))];
        let cpuBefore = counters(pids);
        let endProfiles = async (): Promise<void> => {};
        const measured = await loadgen.alternate(targets, path, {
          seconds: SECONDS,
          warmupSeconds,
          onStart: async () => {
            endProfiles = await startProfiles(`${op}-c${concurrency}-${layout}`, true);
            cpuBefore = counters(pids);
          },
        });
        const cpuAfter = counters(pids);
        await endProfiles();
        // Requests served by the process `pid`, or by all targets.
        const ops = (pid?: number): number =>
          measured.reduce((sum, m, i) => sum + (pid === undefined || targets[i]!.pid === pid ? m.ops : 0), 0);
        log(
          `${op} c=${concurrency} ${layout}: ${measured.map((m) => `${m.name} ${m.ops}`).join(', ')} requests`,
        );
        return measured.map((m, i) =>
          row(m, targets[i]!, [cpuBefore, cpuAfter], ops(targets[i]!.pid), ops()),
        );
      };
      rows.push(
        ...(concurrency === 1
          ? await measureRoundsTogether(targets, measureTogether)
          : await measureRounds(targets, measureOne)),
      );
    };
    const layoutOf = (layout: Layout) => PROXY_GROUPS.filter((g) => g.layout === layout);
    for (const group of layoutOf('shared')) await measureGroup(group);

    // Again at concurrency 32 with the control plane on cores of its own, as where Sealion is deployed: there the
    // proxy and its clients never take CPU from the API server. On shared cores every microsecond the proxy
    // spends is one the API server does not get, so those rows price the proxy's CPU rather than its throughput.
    const split = splitCores(controlPlane.all, [
      process.pid,
      loadgen.process.pid!,
      server.pid!,
      auditedServer.pid!,
      kubectlProxy.pid!,
      relay.pid!,
    ]);
    if (split) {
      log(
        `split cores: control plane on CPUs ${split.controlPlane}, clients and proxies on ${split.clients}`,
      );
      try {
        for (const group of layoutOf('split')) await measureGroup(group);
      } finally {
        split.restore();
      }
    } else log('could not pin processes (fewer than 2 CPUs, or no taskset): no split-core measurements');

    const verdict = report(rows, watchMemory);
    console.log(`saved ${saveResults('proxy', { rows, watchMemory })}`);
    return verdict;
  } finally {
    for (const child of children) child.kill();
    await closeHttpsPools();
    await issuer.stop();
    await cluster.stop();
  }
}

function report(rows: Row[], watchMemory: WatchMemory & Record<string, number>): Verdict {
  const fmt = formatNumber;
  console.log(
    `\nImpersonation proxy vs direct access and kubectl proxy (one real kube-apiserver, ${availableParallelism()} cores)\n` +
      'cores: shared = every process on every core; split = kube-apiserver and etcd on half the cores, the load ' +
      'generator and the proxies on the other half',
  );
  const cpu = (key: string) => (r: Row) => (r[key] ? fmt(r[key] as number) : '-');
  printComparison(rows, [
    { header: 'proxy CPU µs/req', cell: cpu('proxyCpuUs') },
    { header: 'API server CPU µs/req', cell: cpu('apiserverCpuUs') },
    { header: 'client CPU µs/req', cell: cpu('clientCpuUs') },
  ]);
  console.log(
    `\n${watchMemory['watches']} idle watches held by the proxy: ${fmt(watchMemory.rssPerWatchKiB, 1)} KiB RSS per watch ` +
      `(${fmt(watchMemory['heapPerWatchKiB']!, 1)} KiB heap used of ${fmt(watchMemory['heapTotalPerWatchKiB']!, 1)} KiB the heap grew, ${fmt(watchMemory['externalPerWatchKiB']!, 1)} KiB external); ` +
      `RSS ${fmt(watchMemory['rssBeforeMiB']!, 1)} → ${fmt(watchMemory['rssAfterMiB']!, 1)} MiB with them → ` +
      `${fmt(watchMemory['rssReleasedMiB']!, 1)} MiB after they closed`,
  );
  // Each ratio as the table shows it: each round against direct access (or kubectl proxy, or audit off) in the
  // same round, then the median of the rounds; against kubectl proxy that is the median of the rounds' ratios of
  // the two rates, not a comparison of their two medians against direct.
  return printVerdicts('Targets', proxyVerdicts(rows, watchMemory), 'Sealion: JWT / certificate');
}
