// `npm run bench -- tunnel`: the agents' reverse tunnel, in one run on one real API server.
//   1. Requests: GET and LIST through the tunnel next to direct access and the proxy's own path (the agents point at
//      the same API server, so only the tunnel differs): direct (admin certificate), Sealion (JWT, forwarded
//      directly), and Sealion through the tunnel (JWT, /clusters/<name>/…) with one real `sealion agent` process per
//      transport, side by side: direct (HTTP/2 on the TLS connection) and websocket.
//   2. Streams (BENCH_ONLY=streams): BENCH_STREAMS concurrent watches through one tunnel, held open.
//   3. Agents (BENCH_ONLY=agents): BENCH_AGENTS simulated agents (the agent's own code, each with its own
//      certificate and mutual-TLS connection): the concierge's memory and idle CPU per agent; then a reconnect storm,
//      the concierge killed and started again, with the time until every agent is back and the peak CPU and memory.
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import { connect as http2Connect, type ClientHttp2Session } from 'node:http2';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { TUNNEL_CA_SECRET } from '../apis/install.ts';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { newKubeClients, readSecretData, type KubeClients } from '../lib/kube/kube.ts';
import { issueCert, loadCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { serveTunnel } from '../lib/tunnel/tunnel.ts';
import { dialDirect, tlsContext } from '../lib/tunnel/dial.ts';
import { bindingURI } from '../apis/agent-binding.ts';
import { prepareAgentCluster, startAgentProcess } from '../dev/agent.ts';
import { freePort, startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer } from '../dev/oidc-issuer.ts';
import { startLoadGenerator, type Target } from './loadgen.ts';
import {
  formatNumber,
  measureRounds,
  paired,
  printComparison,
  saveResults,
  selected,
  type Row,
} from './measure.ts';
import { controlPlaneOf, cpuSeconds, lines, prepareBenchData } from './proxy.ts';
import { printVerdicts, TUNNEL_BASE, tunnelVerdicts, type Verdict } from './targets.ts';
import { dieWithParent } from '../dev/processes.ts';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const AGENTS = Number(process.env['BENCH_AGENTS'] ?? 10_000);
const STREAMS = Number(process.env['BENCH_STREAMS'] ?? 10_000);
/** How long the agents sit idle while the concierge's CPU is read. */
/** Processes the simulated agents run in. */
const AGENT_PROCESSES = 4;
const IDLE_SECONDS = Number(process.env['BENCH_IDLE_SECONDS'] ?? 30);
const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const CLUSTERS_API = 'tunnel.concierge.sealion.dev/v1alpha1';
/** The real agents, one per transport, both reaching the bench's API server. */
const AGENT_CLUSTERS = { direct: 'self', websocket: 'self-ws' } as const;
const SEALION = TUNNEL_BASE;
/** The request measurements' group names, which BENCH_ONLY matches (`c=32`, `GET c=1`, `LIST`). */
const REQUEST_GROUPS = ['GET c=1', 'GET c=32', 'LIST c=1', 'LIST c=32'];
/**
 * BENCH_PROFILE_DIR=dir: a CPU profile of the concierge during each measurement through it (the last round's,
 * `<group>-<target>.cpuprofile`), and one of each real agent over its whole life (`agent-<transport>/`, written when
 * it exits on the bench's SIGTERM), for chrome://inspect or speedscope.
 */
const PROFILE_DIR = process.env['BENCH_PROFILE_DIR'];

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/** A process's resident memory now and at its peak, from /proc (Linux), in bytes. */
function residentMemory(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const kib = (field: string): number =>
    Number(new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(status)?.[1] ?? 0);
  return { rss: kib('VmRSS') * 1024, peak: kib('VmHWM') * 1024 };
}

/** The concierge with its tunnel listener, in its own process (serve-tunnel.ts). */
export interface ConciergeProcess {
  child: ChildProcess;
  url: string;
  servingCA: string;
  tunnelPort: number;
  tunnelCA: string;
  /** Memory after a full collection. */
  memory(): Promise<{ rss: number; heapUsed: number; external: number }>;
  /** Sends a command of serve-tunnel.ts and resolves with its one-line answer, parsed. */
  ask(command: string): Promise<unknown>;
}

/** Starts the concierge; `children` gets its process at once, so that it is stopped whatever happens next. */
export async function startConcierge(
  cluster: Cluster,
  tunnelPort: number,
  children: ChildProcess[],
  identity = 'local',
): Promise<ConciergeProcess> {
  const child = spawn(
    ...dieWithParent(process.execPath, [
      '--expose-gc',
      fileURLToPath(new URL('./serve-tunnel.ts', import.meta.url)),
      cluster.dir,
      cluster.url,
      cluster.binaries.kubectl,
      NS,
      String(tunnelPort),
      identity,
    ]),
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  children.push(child);
  const out = lines(child);
  const ready = JSON.parse((await out.next()).value as string) as Omit<
    ConciergeProcess,
    'child' | 'memory' | 'ask'
  >;
  // One command at a time: each answer is the next line.
  let asked: Promise<unknown> = Promise.resolve();
  const ask = (command: string): Promise<unknown> => {
    const answer = asked.then(async () => {
      child.stdin.write(`${command}\n`);
      return JSON.parse((await out.next()).value as string) as unknown;
    });
    asked = answer.catch(() => {});
    return answer;
  };
  return {
    ...ready,
    child,
    ask,
    memory: () => ask('mem') as Promise<{ rss: number; heapUsed: number; external: number }>,
  };
}

/**
 * Runs `start` (which spawns a process) with Node's --cpu-prof into BENCH_PROFILE_DIR/`name`, when profiling: the
 * process inherits NODE_OPTIONS at its spawn, so it is set for that moment only.
 */
async function withProfile<T>(name: string, start: () => Promise<T>): Promise<T> {
  if (!PROFILE_DIR) return start();
  const was = process.env['NODE_OPTIONS'];
  process.env['NODE_OPTIONS'] = `${was ?? ''} --cpu-prof --cpu-prof-dir=${join(PROFILE_DIR, name)}`.trim();
  try {
    return await start();
  } finally {
    if (was === undefined) delete process.env['NODE_OPTIONS'];
    else process.env['NODE_OPTIONS'] = was;
  }
}

/** Registers Clusters by name (with `spec`) and returns their UIDs, which agent certificates are bound to. */
export async function applyClusters(
  cluster: Cluster,
  names: string[],
  spec: object = {},
): Promise<Map<string, string>> {
  type Applied = { kind: string; metadata: { name: string; uid: string } };
  const uids = new Map<string, string>();
  // In batches: one kubectl apply of 10,000 objects holds them all in one request.
  for (let i = 0; i < names.length; i += 1000) {
    const applied = await cluster.kubectl(['apply', '-o', 'json', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: names
          .slice(i, i + 1000)
          .map((name) => ({ apiVersion: CLUSTERS_API, kind: 'Cluster', metadata: { name }, spec })),
      }),
    });
    const out = JSON.parse(applied.stdout) as Applied & { items?: Applied[] };
    // kubectl prints one object as itself and several as a List.
    for (const c of out.kind === 'List' ? out.items! : [out]) uids.set(c.metadata.name, c.metadata.uid);
  }
  return uids;
}

/** A client certificate from the tunnel CA for each cluster, bound to its UID as the listener issues them. */
export function agentCertificates(ca: CertificateAuthority, uids: Map<string, string>) {
  return Promise.all(
    [...uids].map(async ([name, uid]) => {
      const cert = await issueCert(ca, {
        commonName: name,
        uris: [bindingURI({ cluster: name, uid, generation: 0 })],
        usage: 'client',
      });
      return { name, certPem: cert.certPem, keyPem: cert.keyPem };
    }),
  );
}

export async function benchTunnel(): Promise<Verdict> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const cluster = await startCluster({ name: 'bench-tunnel', controllerManager: false, log });
  const issuer = await startOIDCIssuer({ audience: 'sealion-bench' });
  const children: ChildProcess[] = [];
  const stops: (() => unknown)[] = [];
  const results: Record<string, unknown> = {};
  try {
    await cluster.kubectl(['create', 'namespace', NS]);
    const tunnelPort = await freePort();
    log('waiting for the concierge');
    const concierge = await startConcierge(cluster, tunnelPort, children);
    const hub = `https://127.0.0.1:${tunnelPort}`;
    const token = await prepareBenchData(cluster, issuer);
    const clients = newKubeClients({ path: cluster.kubeconfigPath });
    const caData = (await readSecretData(clients, NS, TUNNEL_CA_SECRET))!;
    const tunnelCA = await loadCA(caData['tls.crt']!, caData['tls.key']!);

    if (REQUEST_GROUPS.some(selected) || selected('as')) {
      const measured = await benchRequests(cluster, clients, concierge, hub, token, children, log);
      results['rows'] = measured.rows;
      if (measured.impersonation) results['impersonation'] = measured.impersonation;
    }
    if (selected('streams'))
      results['streams'] = await benchStreams(cluster, concierge, tunnelCA, token, stops, log);
    if (selected('agents'))
      results['agents'] = await benchAgents(cluster, concierge, tunnelCA, stops, children, log);
    const verdict = report(results);
    console.log(`saved ${saveResults('tunnel', results)}`);
    return verdict;
  } finally {
    await Promise.all(stops.map((stop) => stop()));
    for (const child of children) child.kill('SIGKILL');
    await issuer.stop();
    await cluster.stop();
  }
}

/** GET and LIST through each transport's real agent, beside direct access and the proxy's own path. */
async function benchRequests(
  cluster: Cluster,
  clients: KubeClients,
  concierge: ConciergeProcess,
  hub: string,
  token: string,
  children: ChildProcess[],
  log: (line: string) => void,
): Promise<{ rows: Row[]; impersonation?: Record<string, number> }> {
  // The real agent process, onboarded as an admin would, pointing at the same API server, once per transport.
  const agentKubeconfig = await prepareAgentCluster(cluster, AGENT_NS);
  await applyClusters(cluster, Object.values(AGENT_CLUSTERS));
  const agents: Record<string, ChildProcess> = {};
  for (const [transport, name] of Object.entries(AGENT_CLUSTERS)) {
    const bootstrap = await createBootstrapToken(clients, NS, name);
    const agent = await withProfile(`agent-${transport}`, () =>
      startAgentProcess({
        cluster: name,
        hub,
        tunnelCAPem: concierge.tunnelCA,
        kubeconfig: agentKubeconfig,
        namespace: AGENT_NS,
        bootstrapToken: bootstrap.token,
        transport: transport as 'direct' | 'websocket',
        started: (child) => children.push(child),
      }),
    );
    agents[name] = agent;
  }

  const admin = await issueCert(cluster.ca, {
    commonName: 'bench-admin',
    organizations: ['system:masters'],
    usage: 'client',
  });
  const loadgen = await startLoadGenerator(log);
  children.push(loadgen.process);
  const sealion = { url: concierge.url, ca: concierge.servingCA, token };
  const targets: (Target & { prefix: string; agent?: ChildProcess })[] = [
    {
      ...(await loadgen.target('direct', {
        url: cluster.url,
        ca: cluster.ca.certPem,
        cert: admin.certPem,
        key: admin.keyPem,
      })),
      prefix: '',
    },
    { ...(await loadgen.target(SEALION, sealion)), pid: concierge.child.pid!, prefix: '' },
    ...(await Promise.all(
      Object.entries(AGENT_CLUSTERS).map(async ([transport, name]) => ({
        ...(await loadgen.target(`tunnel, ${transport}`, sealion)),
        pid: concierge.child.pid!,
        prefix: `/clusters/${name}`,
        agent: agents[name]!,
      })),
    )),
  ];
  const apiserverPid = controlPlaneOf(cluster).apiserver;
  for (const t of targets) await eventually(() => t.get(`${t.prefix}/api/v1/namespaces/bench`), 30_000);
  log('all targets answer; measuring');

  const rows: Row[] = [];
  for (const [op, path] of [
    ['GET', '/api/v1/namespaces/bench'],
    ['LIST', '/api/v1/namespaces/bench/configmaps'],
  ] as const) {
    for (const concurrency of [1, 32]) {
      if (!selected(`${op} c=${concurrency}`)) continue;
      const measureOne = async (t: (typeof targets)[number], warmupSeconds: number) => {
        const counters = (): { proxy: number; agent: number; apiserver: number } => ({
          proxy: t.pid ? cpuSeconds(t.pid) : 0,
          agent: t.agent ? cpuSeconds(t.agent.pid!) : 0,
          apiserver: cpuSeconds(apiserverPid),
        });
        let before = counters();
        const profiled = t.pid !== undefined && PROFILE_DIR !== undefined;
        const profile = `${op}-c${concurrency}-${t.name.replace(/[^a-z0-9]+/gi, '-')}.cpuprofile`;
        const m = await t.measure(`${op} c=${concurrency} ${t.name}`, `${t.prefix}${path}`, {
          seconds: SECONDS,
          concurrency,
          warmupSeconds,
          onStart: () => {
            before = counters();
            if (profiled) void concierge.ask(`profile ${join(PROFILE_DIR, profile)}`);
          },
        });
        if (profiled) await concierge.ask('profile-end');
        const perRequest = (pid: number, was: number): number => ((cpuSeconds(pid) - was) * 1e6) / m.ops;
        log(`${m.name}: ${Math.round(m.perSecond)} req/s`);
        return {
          ...m,
          op,
          concurrency,
          target: t.name,
          proxyCpuUs: t.pid ? perRequest(t.pid, before.proxy) : 0,
          agentCpuUs: t.agent ? perRequest(t.agent.pid!, before.agent) : 0,
          apiserverCpuUs: perRequest(apiserverPid, before.apiserver),
        };
      };
      rows.push(...((await measureRounds(targets, measureOne)) as Row[]));
    }
  }
  const impersonation = selected('as') ? await benchImpersonation(concierge, token, log) : undefined;
  // SIGTERM: the agent drains and exits, and so writes its profile when it has one.
  for (const agent of Object.values(agents)) agent.kill('SIGTERM');
  if (PROFILE_DIR)
    await Promise.all(
      Object.values(agents).map((agent) =>
        agent.exitCode !== null ? Promise.resolve() : Promise.race([once(agent, 'exit'), sleep(25_000)]),
      ),
    );
  return { rows, ...(impersonation ? { impersonation } : {}) };
}

/** Samples of each kind the impersonation measurement takes. */
const AS_SAMPLES = Number(process.env['BENCH_AS_SAMPLES'] ?? 200);

/**
 * What `kubectl --as` adds through a tunnel: the agent's cluster decides whether the caller may impersonate (its
 * SubjectAccessReviews, through the tunnel) and whether its forwarding policy lets Sealion act for that identity. One
 * HTTP/2 connection, one request at a time, interleaved: a GET without impersonation (the baseline), the same GET as
 * an identity never seen before (every identity question asked anew: the first request of a `kubectl --as`), and the
 * same again (answers from the cache: the requests after it). Medians and the added median against the baseline.
 */
async function benchImpersonation(
  concierge: ConciergeProcess,
  token: string,
  log: (line: string) => void,
): Promise<Record<string, number>> {
  const session: ClientHttp2Session = http2Connect(concierge.url, { ca: concierge.servingCA });
  const path = `/clusters/${AGENT_CLUSTERS.direct}/api/v1/namespaces/bench`;
  const get = (headers: Record<string, string> = {}): Promise<number> =>
    new Promise((done, fail) => {
      const started = process.hrtime.bigint();
      const stream = session.request({ ':path': path, authorization: `Bearer ${token}`, ...headers });
      stream.on('response', (h) => {
        if (h[':status'] !== 200)
          fail(new Error(`${path} as ${JSON.stringify(headers)}: HTTP ${h[':status']}`));
      });
      stream.on('data', () => {});
      stream.on('end', () => done(Number(process.hrtime.bigint() - started) / 1e6));
      stream.on('error', fail);
      stream.end();
    });
  try {
    // The impersonated identity is in the bench's admin group, so the request is allowed once impersonating is.
    const as = (i: number) => ({ 'impersonate-user': `bench-as-${i}`, 'impersonate-group': 'bench' });
    for (let i = 0; i < 20; i++) await get();
    await get(as(-1));
    const baseline: number[] = [];
    const first: number[] = [];
    const repeated: number[] = [];
    for (let i = 0; i < AS_SAMPLES; i++) {
      baseline.push(await get());
      first.push(await get(as(i)));
      repeated.push(await get(as(i)));
    }
    const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
    const result = {
      baselineMs: median(baseline),
      firstMs: median(first),
      repeatedMs: median(repeated),
      addedFirstMs: median(first.map((f, i) => f - baseline[i]!)),
      addedRepeatedMs: median(repeated.map((r, i) => r - baseline[i]!)),
    };
    log(`kubectl --as through the tunnel: ${JSON.stringify(result)}`);
    return result;
  } finally {
    session.close();
  }
}

/**
 * STREAMS watches held open at once through one tunnel: a simulated agent whose streams each answer a watch's
 * headers and then hold it, reached through the proxy by one user over HTTP/2 (as kubectl). Counts refusals and
 * failures, and the concierge's memory per stream. The watches are sent to `via` (default: the concierge holding
 * the tunnel), and the memory read is `via`'s.
 */
export async function benchStreams(
  cluster: Cluster,
  concierge: ConciergeProcess,
  tunnelCA: CertificateAuthority,
  token: string,
  stops: (() => unknown)[],
  log: (line: string) => void,
  via: ConciergeProcess = concierge,
  name = 'streams',
): Promise<Record<string, number>> {
  const uids = await applyClusters(cluster, [name], {
    maxConcurrentStreams: STREAMS,
    maxRequestsPerUser: STREAMS,
    maxQueuedRequests: STREAMS,
  });
  const [cert] = await agentCertificates(tunnelCA, uids);
  await sleep(2000); // until the concierge's registry has the Cluster
  // The agent's end: each watch gets its headers and no end. The one question the proxy asks first (whether the
  // cluster's forwarding policy lets Sealion act there, a SelfSubjectAccessReview) is answered yes, as the API server
  // behind a real agent with the default policy answers it.
  const dial = dialDirect({
    hub: new URL(`https://127.0.0.1:${concierge.tunnelPort}`),
    tls: tlsContext(concierge.tunnelCA, cert!.certPem, cert!.keyPem),
    version: 'bench',
  });
  const agentEnd = serveTunnel((await dial.done).stream, {
    connect: (stream) => stream.destroy(),
    request: (stream, headers) => {
      stream.on('error', () => {});
      if (String(headers[':path']).endsWith('/selfsubjectaccessreviews')) {
        stream.respond({ ':status': 201, 'content-type': 'application/json' });
        stream.end(JSON.stringify({ status: { allowed: true } }));
        return;
      }
      stream.respond({ ':status': 200, 'content-type': 'application/json' });
    },
  });
  stops.push(() => agentEnd.close());
  // Until the tunnel is in the Cluster's status, which another replica routes by.
  await sleep(via === concierge ? 500 : 3000);

  const before = await via.memory();
  const sessions: ClientHttp2Session[] = [];
  // The proxy allows 1,000 streams per connection, as the API server's default is close to.
  for (let i = 0; i < Math.ceil(STREAMS / 1000); i++) {
    const session = http2Connect(via.url, { ca: via.servingCA });
    session.on('error', () => {});
    sessions.push(session);
  }
  stops.push(() => sessions.forEach((s) => s.destroy()));
  const outcome = { open: 0, refused: 0, failed: 0 };
  const statuses = new Map<number, number>();
  const started = Date.now();
  await Promise.all(
    Array.from(
      { length: STREAMS },
      (_, i) =>
        new Promise<void>((done) => {
          const req = sessions[i % sessions.length]!.request({
            ':path': `/clusters/${name}/api/v1/namespaces/bench/configmaps?watch=1&i=${i}`,
            authorization: `Bearer ${token}`,
          });
          req.on('response', (headers) => {
            const status = Number(headers[':status']);
            statuses.set(status, (statuses.get(status) ?? 0) + 1);
            if (status === 200) outcome.open++;
            else outcome.refused++;
            done();
          });
          req.on('error', () => {
            outcome.failed++;
            done();
          });
          req.end();
        }),
    ),
  );
  const openSeconds = (Date.now() - started) / 1000;
  await sleep(1000);
  const after = await via.memory();
  log(`streams: ${JSON.stringify(outcome)} statuses ${JSON.stringify([...statuses])} in ${openSeconds} s`);
  for (const s of sessions) s.destroy();
  agentEnd.close();
  return {
    streams: STREAMS,
    ...outcome,
    openSeconds,
    rssPerStreamKiB: (after.rss - before.rss) / 1024 / Math.max(1, outcome.open),
    heapPerStreamKiB: (after.heapUsed - before.heapUsed) / 1024 / Math.max(1, outcome.open),
  };
}

/**
 * AGENTS simulated agents on one concierge, each the agent's own code (its dialing, transport and jittered
 * backoff) with a certificate of its own: the concierge's memory and idle CPU per agent, then a reconnect storm.
 */
async function benchAgents(
  cluster: Cluster,
  concierge: ConciergeProcess,
  tunnelCA: CertificateAuthority,
  stops: (() => unknown)[],
  children: ChildProcess[],
  log: (line: string) => void,
): Promise<Record<string, number>> {
  log(`registering ${AGENTS} Clusters`);
  const names = Array.from({ length: AGENTS }, (_, i) => `sim-${i}`);
  const uids = await applyClusters(cluster, names);
  log(`issuing ${AGENTS} certificates`);
  const certs = await agentCertificates(tunnelCA, uids);
  await sleep(3000); // until the concierge's registry has the Clusters
  const memBefore = await concierge.memory();
  // The agents, in AGENT_PROCESSES processes: one Node process would be their bottleneck, not the concierge.
  const simulators = simulateAgents(
    certs,
    `https://127.0.0.1:${concierge.tunnelPort}`,
    concierge.tunnelCA,
    1,
    children,
    stops,
  );
  let counted = 0;
  let countedAt = 0;
  /** Agents connected now, asked of the simulators at most once a second. */
  const connectedCount = (): number => {
    if (Date.now() - countedAt >= 1000) {
      countedAt = Date.now();
      void simulators.count().then((n) => (counted = n));
    }
    return counted;
  };
  const started = Date.now();
  await waitFor('agents connected', connectedCount, AGENTS, 600_000, log);
  const firstConnectSeconds = (Date.now() - started) / 1000;
  log(`${AGENTS} agents connected in ${firstConnectSeconds} s; idle for ${IDLE_SECONDS} s`);
  await sleep(5000); // the status writes of the connects settle
  const memAfter = await concierge.memory();
  const cpuBefore = cpuSeconds(concierge.child.pid!);
  await sleep(IDLE_SECONDS * 1000);
  const idleCpuPercent = ((cpuSeconds(concierge.child.pid!) - cpuBefore) / IDLE_SECONDS) * 100;

  // The storm: the concierge killed and started again; every agent's tunnel drops at once and each dials again
  // on its own backoff.
  log('killing the concierge');
  concierge.child.kill('SIGKILL');
  const killed = Date.now();
  await waitFor('agents connected', connectedCount, 0, 60_000, log);
  const restarted = await startConcierge(cluster, concierge.tunnelPort, children);
  const restartedSeconds = (Date.now() - killed) / 1000;
  let peakCpuPercent = 0;
  let lastCpu = cpuSeconds(restarted.child.pid!);
  let lastAt = Date.now();
  const sampler = setInterval(() => {
    const cpu = cpuSeconds(restarted.child.pid!);
    const now = Date.now();
    peakCpuPercent = Math.max(peakCpuPercent, ((cpu - lastCpu) / ((now - lastAt) / 1000)) * 100);
    [lastCpu, lastAt] = [cpu, now];
  }, 1000);
  let reconnected: number;
  try {
    await waitFor('agents back', connectedCount, AGENTS, 600_000, log);
    reconnected = (Date.now() - killed) / 1000;
  } finally {
    clearInterval(sampler);
  }
  const peakRssMiB = residentMemory(restarted.child.pid!).peak / 1024 / 1024;
  log(`all ${AGENTS} agents back ${reconnected} s after the kill`);
  return {
    agents: AGENTS,
    firstConnectSeconds,
    rssPerAgentKiB: (memAfter.rss - memBefore.rss) / 1024 / AGENTS,
    heapPerAgentKiB: (memAfter.heapUsed - memBefore.heapUsed) / 1024 / AGENTS,
    rssBeforeMiB: memBefore.rss / 1024 / 1024,
    rssAfterMiB: memAfter.rss / 1024 / 1024,
    idleCpuPercent,
    stormRestartedSeconds: restartedSeconds,
    stormAllBackSeconds: reconnected,
    stormPeakCpuPercent: peakCpuPercent,
    stormPeakRssMiB: peakRssMiB,
  };
}

/** Starts AGENT_PROCESSES simulators (serve-agents.ts) for `certs`, each agent holding `tunnels` tunnels. */
export function simulateAgents(
  certs: { name: string; certPem: string; keyPem: string }[],
  hub: string,
  caPem: string,
  tunnels: number,
  children: ChildProcess[],
  stops: (() => unknown)[],
): { count(): Promise<number> } {
  const simulators = Array.from({ length: AGENT_PROCESSES }, (_, i) => {
    const child = spawn(
      ...dieWithParent(process.execPath, [fileURLToPath(new URL('./serve-agents.ts', import.meta.url))]),
      {
        stdio: ['pipe', 'pipe', 'inherit'],
      },
    );
    children.push(child);
    stops.push(() => child.kill('SIGTERM'));
    const agents = certs.filter((_, j) => j % AGENT_PROCESSES === i);
    child.stdin.write(`${JSON.stringify({ hub, caPem, agents, tunnels })}\n`);
    return { child, out: lines(child) };
  });
  return {
    async count() {
      const counts = await Promise.all(
        simulators.map(async (s) => {
          s.child.stdin.write('count\n');
          return Number((await s.out.next()).value);
        }),
      );
      return counts.reduce((x, y) => x + y, 0);
    },
  };
}

/** Waits for `count()` to reach `target`, logging it every 10 s; throws after `timeoutMs`. */
async function waitFor(
  what: string,
  count: () => number,
  target: number,
  timeoutMs: number,
  log: (line: string) => void,
): Promise<void> {
  const started = Date.now();
  let logged = started;
  while (count() !== target) {
    if (Date.now() - started > timeoutMs)
      throw new Error(`${what}: ${count()} of ${target} after ${timeoutMs / 1000} s`);
    if (Date.now() - logged >= 10_000) {
      logged = Date.now();
      log(`${what}: ${count()} of ${target} after ${Math.round((logged - started) / 1000)} s`);
    }
    await sleep(100);
  }
}

function report(results: Record<string, unknown>): Verdict {
  const fmt = formatNumber;
  const rows = results['rows'] as Row[] | undefined;
  if (rows) {
    console.log('\nThrough an agent tunnel vs direct (one real kube-apiserver, 2 cores shared by all)');
    const cpu = (key: string) => (r: Row) => (r[key] ? fmt(r[key] as number) : '-');
    const sealionOf = (r: Row): Row | undefined =>
      rows.find((s) => s.op === r.op && s.concurrency === r.concurrency && s.target === SEALION);
    printComparison(rows, [
      {
        header: '× sealion req/s',
        cell: (r) => {
          const s = sealionOf(r);
          return s && r.target !== 'direct'
            ? paired(r, s, (a, b) => a.perSecond / b.perSecond).toFixed(2)
            : '-';
        },
      },
      {
        header: '+p50 ms vs sealion',
        cell: (r) => {
          const s = sealionOf(r);
          return s && r.target !== 'direct' ? fmt(paired(r, s, (a, b) => a.p50us - b.p50us) / 1000, 2) : '-';
        },
      },
      { header: 'proxy CPU µs/req', cell: cpu('proxyCpuUs') },
      { header: 'agent CPU µs/req', cell: cpu('agentCpuUs') },
    ]);
  }
  const as = results['impersonation'] as Record<string, number> | undefined;
  if (as) {
    console.log(`\nkubectl --as through the tunnel (median of ${AS_SAMPLES}, one request at a time)`);
    console.log(`  without --as:             ${fmt(as['baselineMs']!, 2)} ms`);
    console.log(
      `  --as, first request:      ${fmt(as['firstMs']!, 2)} ms (+${fmt(as['addedFirstMs']!, 2)} ms: the edge's reviews)`,
    );
    console.log(
      `  --as, repeated:           ${fmt(as['repeatedMs']!, 2)} ms (+${fmt(as['addedRepeatedMs']!, 2)} ms: cached answers)`,
    );
  }
  const streams = results['streams'] as Record<string, number> | undefined;
  if (streams)
    console.log(
      `\n${streams['streams']} concurrent watches through one tunnel: ${streams['open']} open, ` +
        `${streams['refused']} refused, ${streams['failed']} failed, in ${fmt(streams['openSeconds']!, 1)} s; ` +
        `${fmt(streams['rssPerStreamKiB']!, 1)} KiB RSS (${fmt(streams['heapPerStreamKiB']!, 1)} KiB heap) per stream`,
    );
  const agents = results['agents'] as Record<string, number> | undefined;
  if (agents)
    console.log(
      `\n${agents['agents']} agents on one concierge (connected in ${fmt(agents['firstConnectSeconds']!, 1)} s): ` +
        `${fmt(agents['rssPerAgentKiB']!, 1)} KiB RSS per agent (${fmt(agents['heapPerAgentKiB']!, 1)} KiB heap); ` +
        `RSS ${fmt(agents['rssBeforeMiB']!, 1)} → ${fmt(agents['rssAfterMiB']!, 1)} MiB; ` +
        `idle CPU ${fmt(agents['idleCpuPercent']!, 1)}% of one core\n` +
        `reconnect storm (concierge killed and started again, up in ${fmt(agents['stormRestartedSeconds']!, 1)} s): ` +
        `all agents back ${fmt(agents['stormAllBackSeconds']!, 1)} s after the kill; ` +
        `peak CPU ${fmt(agents['stormPeakCpuPercent']!)}% of one core, peak RSS ${fmt(agents['stormPeakRssMiB']!)} MiB`,
    );
  return printVerdicts('Tunnel targets', tunnelVerdicts(rows ?? []), "× the proxy's own path");
}
