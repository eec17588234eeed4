// `npm run bench -- peering`: proxy peering, in one run on one real API server.
//   1. Requests: GET and LIST for a cluster whose tunnel replica A holds (a real `sealion agent` process), sent to A
//      itself and to replica B, which forwards them over its peer link to A; direct access beside them. Targets: at
//      concurrency 32 the peer path keeps at least 0.8× the holder's rate, and adds at most 0.5 ms to its p50.
//   2. Streams (BENCH_ONLY=streams): BENCH_STREAMS (10,000) watches held open at once through B, all over its one
//      peer link to A, into one tunnel.
//   3. Failover (BENCH_ONLY=failover): BENCH_PEER_AGENTS (1,000) simulated agents with one tunnel and as many with
//      two, dialing A and B through one balanced address; a third replica, C, serves the users. A is killed; the run
//      reports how long until C routes every cluster again, for each kind of agent, and B's peak CPU while A's
//      agents come over (a herd would show there).
import type { ChildProcess } from 'node:child_process';
import { connect as http2Connect } from 'node:http2';
import { TUNNEL_CA_SECRET } from '../apis/install.ts';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { newKubeClients, readSecretData } from '../lib/kube/kube.ts';
import { issueCert, loadCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { prepareAgentCluster, startAgentProcess } from '../dev/agent.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer } from '../dev/oidc-issuer.ts';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dieWithParent } from '../dev/processes.ts';
import { startLoadGenerator } from './loadgen.ts';
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
import { HOLDER, THROUGH_PEER, peeringVerdicts, printVerdicts, type Verdict } from './targets.ts';
import {
  agentCertificates,
  applyClusters,
  benchStreams,
  simulateAgents,
  startConcierge,
  type ConciergeProcess,
} from './tunnel.ts';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const PEER_AGENTS = Number(process.env['BENCH_PEER_AGENTS'] ?? 1000);
const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const CLUSTER = 'self';

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

export async function benchPeering(): Promise<Verdict> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const cluster = await startCluster({ name: 'bench-peering', controllerManager: false, log });
  const issuer = await startOIDCIssuer({ audience: 'sealion-bench' });
  const children: ChildProcess[] = [];
  const stops: (() => unknown)[] = [];
  const results: Record<string, unknown> = {};
  try {
    await cluster.kubectl(['create', 'namespace', NS]);
    log('waiting for replicas A and B');
    const a = await startConcierge(cluster, 0, children, 'replica-a');
    const b = await startConcierge(cluster, 0, children, 'replica-b');
    const token = await prepareBenchData(cluster, issuer);
    const clients = newKubeClients({ path: cluster.kubeconfigPath });
    const caData = (await readSecretData(clients, NS, TUNNEL_CA_SECRET))!;
    const tunnelCA = await loadCA(caData['tls.crt']!, caData['tls.key']!);

    if (selected('GET') || selected('LIST'))
      results['rows'] = await benchRequests(cluster, a, b, token, children, log);
    if (selected('streams'))
      results['streams'] = await benchStreams(cluster, a, tunnelCA, token, stops, log, b, 'peer-streams');
    if (selected('failover'))
      results['failover'] = await benchFailover(cluster, a, b, tunnelCA, token, stops, children, log);
    const verdict = report(results);
    console.log(`saved ${saveResults('peering', results)}`);
    return verdict;
  } finally {
    await Promise.all(stops.map((stop) => stop()));
    for (const child of children) child.kill('SIGKILL');
    await issuer.stop();
    await cluster.stop();
  }
}

/** GET and LIST for a cluster held by A: at A, and at B through its peer link; direct beside them. */
async function benchRequests(
  cluster: Cluster,
  a: ConciergeProcess,
  b: ConciergeProcess,
  token: string,
  children: ChildProcess[],
  log: (line: string) => void,
): Promise<Row[]> {
  const clients = newKubeClients({ path: cluster.kubeconfigPath });
  const agentKubeconfig = await prepareAgentCluster(cluster, AGENT_NS);
  await applyClusters(cluster, [CLUSTER]);
  const bootstrap = await createBootstrapToken(clients, NS, CLUSTER);
  const agent = await startAgentProcess({
    cluster: CLUSTER,
    hub: `https://127.0.0.1:${a.tunnelPort}`,
    tunnelCAPem: a.tunnelCA,
    kubeconfig: agentKubeconfig,
    namespace: AGENT_NS,
    bootstrapToken: bootstrap.token,
    transport: 'direct',
    started: (child) => children.push(child),
  });
  const admin = await issueCert(cluster.ca, {
    commonName: 'bench-admin',
    organizations: ['system:masters'],
    usage: 'client',
  });
  const loadgen = await startLoadGenerator(log);
  children.push(loadgen.process);
  const prefix = `/clusters/${CLUSTER}`;
  const targets = [
    {
      ...(await loadgen.target('direct', {
        url: cluster.url,
        ca: cluster.ca.certPem,
        cert: admin.certPem,
        key: admin.keyPem,
      })),
      prefix: '',
    },
    { ...(await loadgen.target(HOLDER, { url: a.url, ca: a.servingCA, token })), pid: a.child.pid!, prefix },
    {
      ...(await loadgen.target(THROUGH_PEER, { url: b.url, ca: b.servingCA, token })),
      pid: b.child.pid!,
      prefix,
    },
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
        const pids = { a: a.child.pid!, b: b.child.pid!, agent: agent.pid!, apiserver: apiserverPid };
        const read = (): Record<keyof typeof pids, number> =>
          Object.fromEntries(Object.entries(pids).map(([k, pid]) => [k, cpuSeconds(pid)])) as Record<
            keyof typeof pids,
            number
          >;
        let before = read();
        const m = await t.measure(`${op} c=${concurrency} ${t.name}`, `${t.prefix}${path}`, {
          seconds: SECONDS,
          concurrency,
          warmupSeconds,
          onStart: () => (before = read()),
        });
        const after = read();
        const perRequest = (k: keyof typeof pids): number => ((after[k] - before[k]) * 1e6) / m.ops;
        log(`${m.name}: ${Math.round(m.perSecond)} req/s`);
        return {
          ...m,
          op,
          concurrency,
          target: t.name,
          aCpuUs: t.prefix ? perRequest('a') : 0,
          bCpuUs: t.name === THROUGH_PEER ? perRequest('b') : 0,
          agentCpuUs: t.prefix ? perRequest('agent') : 0,
          apiserverCpuUs: perRequest('apiserver'),
        };
      };
      rows.push(...((await measureRounds(targets, measureOne)) as Row[]));
    }
  }
  agent.kill();
  return rows;
}

/**
 * Which of `names` replica `via` routes to their agent now: a simulated agent answers with its local proxy's 502
 * (its API server is nowhere), where an unroutable cluster gets the concierge's 503.
 */
async function routable(via: ConciergeProcess, token: string, names: string[]): Promise<Map<string, number>> {
  const session = http2Connect(via.url, { ca: via.servingCA });
  session.on('error', () => {});
  /** Each routable cluster, with when its answer came. */
  const ok = new Map<string, number>();
  try {
    for (let i = 0; i < names.length; i += 200) {
      await Promise.all(
        names.slice(i, i + 200).map(
          (name) =>
            new Promise<void>((done) => {
              const req = session.request({
                ':path': `/clusters/${name}/version`,
                authorization: `Bearer ${token}`,
              });
              let body = '';
              req.setEncoding('utf8');
              req.on('data', (chunk: string) => (body += chunk));
              req.on('end', () => {
                if (body.includes('through the agent')) ok.set(name, Date.now());
                done();
              });
              req.on('error', () => done());
              req.end();
            }),
        ),
      );
    }
  } finally {
    session.destroy();
  }
  return ok;
}

/** Simulated agents on A and B; A killed; how long until C routes every cluster again. */
async function benchFailover(
  cluster: Cluster,
  a: ConciergeProcess,
  b: ConciergeProcess,
  tunnelCA: CertificateAuthority,
  token: string,
  stops: (() => unknown)[],
  children: ChildProcess[],
  log: (line: string) => void,
): Promise<Record<string, number>> {
  const c = await startConcierge(cluster, 0, children, 'replica-c');
  // The agents dial A and B through one balanced address, a balancer in its own process (serve-balancer.ts).
  const balancer = spawn(
    ...dieWithParent(process.execPath, [
      fileURLToPath(new URL('./serve-balancer.ts', import.meta.url)),
      String(a.tunnelPort),
      String(b.tunnelPort),
    ]),
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  children.push(balancer);
  const hub = `https://127.0.0.1:${Number((await lines(balancer).next()).value)}`;
  const kinds = { one: 1, two: 2 } as const;
  const names: Record<string, string[]> = {};
  const sims: Record<string, { count(): Promise<number> }> = {};
  for (const [kind, tunnels] of Object.entries(kinds)) {
    names[kind] = Array.from({ length: PEER_AGENTS }, (_, i) => `${kind}-${i}`);
    log(`registering ${PEER_AGENTS} Clusters whose agents hold ${tunnels} tunnel(s)`);
    const certs = await agentCertificates(tunnelCA, await applyClusters(cluster, names[kind]));
    await sleep(3000); // until the replicas' registries have the Clusters
    sims[kind] = simulateAgents(certs, hub, a.tunnelCA, tunnels, children, stops);
  }
  const all = Object.values(names).flat();
  const expected = PEER_AGENTS * 3;
  await eventually(
    async () => {
      const up = (await sims['one']!.count()) + (await sims['two']!.count());
      if (up !== PEER_AGENTS * 2) throw new Error(`${up} agents up`);
    },
    600_000,
    1000,
  );
  log(`all agents up (${expected} tunnels); waiting for C to route every cluster`);
  await eventually(
    async () => {
      const ok = await routable(c, token, all);
      if (ok.size !== all.length) throw new Error(`${ok.size} of ${all.length} routable through C`);
    },
    120_000,
    1000,
  );

  // The clusters whose only tunnel is on A: the ones that lose their way in when it dies.
  const listed = JSON.parse(
    (await cluster.kubectl(['get', 'clusters.tunnel.concierge.sealion.dev', '-o', 'json'])).stdout,
  ) as { items: { metadata: { name: string }; status?: { tunnels?: { replica: string }[] } }[] };
  const onlyOnA = new Set(
    listed.items
      .filter((i) => (i.status?.tunnels ?? []).every((t) => t.replica === 'replica-a'))
      .map((i) => i.metadata.name),
  );
  log(`killing replica A, the only holder of ${onlyOnA.size} clusters`);
  let peakCpuPercent = 0;
  let lastCpu = cpuSeconds(b.child.pid!);
  let lastAt = Date.now();
  const sampler = setInterval(() => {
    const cpu = cpuSeconds(b.child.pid!);
    const now = Date.now();
    peakCpuPercent = Math.max(peakCpuPercent, ((cpu - lastCpu) / ((now - lastAt) / 1000)) * 100);
    [lastCpu, lastAt] = [cpu, now];
  }, 1000);
  const killed = Date.now();
  a.child.kill('SIGKILL');
  // When every agent has a tunnel up again (to B), read from the simulators, beside when C routes to them.
  let agentsBack = 0;
  let watching = true;
  const watchAgents = (async () => {
    let dropped = false;
    while (watching) {
      const up = (await sims['one']!.count()) + (await sims['two']!.count());
      if (up < PEER_AGENTS * 2) dropped = true;
      else if (dropped && !agentsBack) agentsBack = (Date.now() - killed) / 1000;
      await sleep(250);
    }
  })();
  /** When each cluster was routable after the kill: those that lost their only tunnel, and the others by kind. */
  const back: Record<string, number[]> = { onlyOnA: [], one: [], two: [] };
  const pending = new Set(all);
  try {
    while (pending.size > 0) {
      if (Date.now() - killed > 300_000)
        throw new Error(`${pending.size} clusters unroutable 300 s after the kill`);
      const ok = await routable(c, token, [...pending]);
      for (const [name, when] of ok) {
        const at = (when - killed) / 1000;
        pending.delete(name);
        if (onlyOnA.has(name)) back['onlyOnA']!.push(at);
        else back[name.startsWith('one-') ? 'one' : 'two']!.push(at);
      }
      if (pending.size > 0) await sleep(200);
    }
  } finally {
    clearInterval(sampler);
    watching = false;
    await watchAgents;
  }
  const quantile = (xs: number[], q: number): number =>
    xs.length === 0 ? 0 : [...xs].sort((x, y) => x - y)[Math.floor((xs.length - 1) * q)]!;
  return {
    agents: PEER_AGENTS,
    onlyOnA: back['onlyOnA']!.length,
    onlyOnAMedianSeconds: quantile(back['onlyOnA']!, 0.5),
    onlyOnAAllSeconds: quantile(back['onlyOnA']!, 1),
    oneTunnelOthersAllSeconds: quantile(back['one']!, 1),
    twoTunnelsAllSeconds: quantile(back['two']!, 1),
    survivorPeakCpuPercent: peakCpuPercent,
    agentsBackSeconds: agentsBack,
  };
}

/** Prints the run's figures and judges its targets, measured or not (a run without requests has none). */
function report(results: Record<string, unknown>): Verdict {
  const fmt = formatNumber;
  const rows = results['rows'] as Row[] | undefined;
  if (rows) {
    console.log('\nThrough a peer vs the holder (one real kube-apiserver, 2 cores shared by all)');
    const holderOf = (r: Row): Row | undefined =>
      rows.find((h) => h.op === r.op && h.concurrency === r.concurrency && h.target === HOLDER);
    const vsHolder = (
      r: Row,
      f: (x: { perSecond: number; p50us: number }, h: { perSecond: number; p50us: number }) => number,
    ): number | undefined => {
      const h = holderOf(r);
      return h && r.target === THROUGH_PEER ? paired(r, h, f) : undefined;
    };
    const cpu = (key: string) => (r: Row) => (r[key] ? fmt(r[key] as number) : '-');
    printComparison(rows, [
      {
        header: '× holder req/s',
        cell: (r) => vsHolder(r, (x, h) => x.perSecond / h.perSecond)?.toFixed(2) ?? '-',
      },
      {
        header: '+p50 ms vs holder',
        cell: (r) => {
          const added = vsHolder(r, (x, h) => x.p50us - h.p50us);
          return added === undefined ? '-' : fmt(added / 1000, 2);
        },
      },
      { header: 'A CPU µs/req', cell: cpu('aCpuUs') },
      { header: 'B CPU µs/req', cell: cpu('bCpuUs') },
      { header: 'agent CPU µs/req', cell: cpu('agentCpuUs') },
    ]);
  }
  const streams = results['streams'] as Record<string, number> | undefined;
  if (streams)
    console.log(
      `\n${streams['streams']} concurrent watches through a peer (one peer link) into one tunnel: ${streams['open']} open, ` +
        `${streams['refused']} refused, ${streams['failed']} failed, in ${fmt(streams['openSeconds']!, 1)} s; ` +
        `${fmt(streams['rssPerStreamKiB']!, 1)} KiB RSS (${fmt(streams['heapPerStreamKiB']!, 1)} KiB heap) per stream on the peer`,
    );
  const failover = results['failover'] as Record<string, number> | undefined;
  if (failover)
    console.log(
      `\nreplica A killed, ${failover['agents']} agents of each kind on A and B; replica C routes every cluster again:\n` +
        `  the ${failover['onlyOnA']} clusters whose only tunnel was on A: median ${fmt(failover['onlyOnAMedianSeconds']!, 1)} s, all ${fmt(failover['onlyOnAAllSeconds']!, 1)} s after the kill\n` +
        `  agents with one tunnel, on B: all ${fmt(failover['oneTunnelOthersAllSeconds']!, 1)} s; agents with two tunnels (one on A): all ${fmt(failover['twoTunnelsAllSeconds']!, 1)} s\n` +
        `  every agent had a tunnel up again ${fmt(failover['agentsBackSeconds']!, 1)} s after the kill (0: no agent was seen down)\n` +
        `  replica B's peak CPU while A's agents came over: ${fmt(failover['survivorPeakCpuPercent']!)}% of one core`,
    );
  return printVerdicts('Peering targets', peeringVerdicts(rows ?? []));
}
