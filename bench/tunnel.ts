// `npm run bench -- tunnel`: GET and LIST through an agent's reverse tunnel next to direct access and the proxy's
// own path, in one run on one real API server (the agent points at the same API server, so only the tunnel
// differs): direct (admin certificate), Sealion (JWT, forwarded directly), Sealion through the tunnel (JWT,
// /clusters/<name>/…, the real `sealion agent` process). Then the concierge's memory per connected agent with
// 1,000 simulated agents (real mTLS WebSockets, each serving a tunnel).
import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { createWebSocketStream, WebSocket } from 'ws';
import { createBootstrapToken } from '../lib/bootstrap.ts';
import { newKubeClients, readSecretData } from '../lib/kube.ts';
import { issueCert, loadCA, spkiPin } from '../lib/pki.ts';
import { serveTunnel, type TunnelServer } from '../lib/tunnel.ts';
import { bindingURI } from '../concierge/tunnel/binding.ts';
import { REPO_ROOT } from '../integration/harness/build.ts';
import { prepareAgentCluster } from '../integration/harness/agent.ts';
import { startCluster } from '../integration/harness/cluster.ts';
import { eventually } from '../integration/harness/eventually.ts';
import { startOIDCIssuer } from '../integration/harness/oidc-issuer.ts';
import { waitForOutput } from '../integration/harness/processes.ts';
import { startLoadGenerator, type Target } from './loadgen.ts';
import {
  formatNumber,
  measureRounds,
  printComparison,
  saveResults,
  selected,
  type Measurement,
  type Row,
} from './measure.ts';
import { controlPlaneOf, cpuSeconds, lines, prepareBenchData } from './proxy.ts';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const AGENTS = Number(process.env['BENCH_AGENTS'] ?? 1000);
const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const CLUSTER = 'self';
const CLUSTERS_API = 'tunnel.concierge.sealion.dev/v1alpha1';

export async function benchTunnel(): Promise<void> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const cluster = await startCluster({ name: 'bench-tunnel', controllerManager: false, log });
  const issuer = await startOIDCIssuer({ audience: 'sealion-bench' });
  const children: ChildProcess[] = [];
  const simulated: { ws: WebSocket; tunnel?: TunnelServer }[] = [];
  try {
    await cluster.kubectl(['create', 'namespace', NS]);
    const server = spawn(
      process.execPath,
      [
        '--expose-gc',
        fileURLToPath(new URL('./serve-tunnel.ts', import.meta.url)),
        cluster.dir,
        cluster.url,
        cluster.binaries.kubectl,
        NS,
      ],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    children.push(server);
    const serverLines = lines(server);
    log('waiting for the concierge');
    const ready = JSON.parse((await serverLines.next()).value as string) as {
      url: string;
      servingCA: string;
      tunnelPort: number;
      tunnelCA: string;
    };
    const memory = async (): Promise<{ rss: number; heapUsed: number; external: number }> => {
      server.stdin.write('mem\n');
      return JSON.parse((await serverLines.next()).value as string) as {
        rss: number;
        heapUsed: number;
        external: number;
      };
    };
    const hub = `https://127.0.0.1:${ready.tunnelPort}`;

    const token = await prepareBenchData(cluster, issuer);

    // The real agent process, onboarded as an admin would, pointing at the same API server.
    const clients = newKubeClients({ path: cluster.kubeconfigPath });
    const agentKubeconfig = await prepareAgentCluster(cluster, AGENT_NS);
    await cluster.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: CLUSTERS_API,
        kind: 'Cluster',
        metadata: { name: CLUSTER },
        spec: {},
      }),
    });
    const bootstrap = await createBootstrapToken(clients, NS, CLUSTER);
    const agent = spawn(
      process.execPath,
      [
        `${REPO_ROOT}/cli/main.ts`,
        'agent',
        '--cluster',
        CLUSTER,
        '--hub',
        hub,
        '--ca-pin',
        spkiPin(ready.tunnelCA),
        '--kubeconfig',
        agentKubeconfig,
        '--namespace',
        AGENT_NS,
      ],
      {
        env: { ...process.env, SEALION_BOOTSTRAP_TOKEN: bootstrap.token },
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    children.push(agent);
    await waitForOutput(agent, /tunnel up/);

    const admin = await issueCert(cluster.ca, {
      commonName: 'bench-admin',
      organizations: ['system:masters'],
      usage: 'client',
    });
    const loadgen = await startLoadGenerator(log);
    children.push(loadgen.process);
    const targets: (Target & { prefix: string })[] = [
      {
        ...(await loadgen.target('direct', {
          url: cluster.url,
          ca: cluster.ca.certPem,
          cert: admin.certPem,
          key: admin.keyPem,
        })),
        prefix: '',
      },
      {
        ...(await loadgen.target('sealion (JWT)', { url: ready.url, ca: ready.servingCA, token })),
        pid: server.pid!,
        prefix: '',
      },
      {
        ...(await loadgen.target('sealion via tunnel', { url: ready.url, ca: ready.servingCA, token })),
        pid: server.pid!,
        prefix: `/clusters/${CLUSTER}`,
      },
    ];
    const apiserverPid = controlPlaneOf(cluster).apiserver;
    for (const t of targets) await eventually(() => t.get(`${t.prefix}/api/v1/namespaces/bench`), 30_000);
    log('all targets answer; measuring');

    const rows: Measurement[] = [];
    for (const [op, path] of [
      ['GET', '/api/v1/namespaces/bench'],
      ['LIST', '/api/v1/namespaces/bench/configmaps'],
    ] as const) {
      for (const concurrency of [1, 32]) {
        if (!selected(`${op} c=${concurrency}`)) continue;
        const measureOne = async (t: Target & { prefix: string }, warmupSeconds: number) => {
          const counters = (): { proxy: number; agent: number; apiserver: number } => ({
            proxy: t.pid ? cpuSeconds(t.pid) : 0,
            agent: cpuSeconds(agent.pid!),
            apiserver: cpuSeconds(apiserverPid),
          });
          let before = counters();
          const m = await t.measure(`${op} c=${concurrency} ${t.name}`, `${t.prefix}${path}`, {
            seconds: SECONDS,
            concurrency,
            warmupSeconds,
            onStart: () => (before = counters()),
          });
          const perRequest = (pid: number, was: number): number => ((cpuSeconds(pid) - was) * 1e6) / m.ops;
          log(`${m.name}: ${Math.round(m.perSecond)} req/s`);
          return {
            ...m,
            op,
            concurrency,
            target: t.name,
            proxyCpuUs: t.pid ? perRequest(t.pid, before.proxy) : 0,
            agentCpuUs: t.prefix ? perRequest(agent.pid!, before.agent) : 0,
            apiserverCpuUs: perRequest(apiserverPid, before.apiserver),
          };
        };
        rows.push(...(await measureRounds(targets, measureOne)));
      }
    }

    // 1,000 simulated agents: each a registered Cluster with its own certificate from the tunnel CA, holding an
    // mTLS WebSocket with a tunnel served on it. The concierge's memory is read before and after.
    log(`connecting ${AGENTS} simulated agents`);
    const caData = (await readSecretData(clients, NS, 'sealion-tunnel-ca'))!;
    const tunnelCA = await loadCA(caData['tls.crt']!, caData['tls.key']!);
    const names = Array.from({ length: AGENTS }, (_, i) => `sim-${i}`);
    const applied = await cluster.kubectl(['apply', '-o', 'json', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: names.map((name) => ({
          apiVersion: CLUSTERS_API,
          kind: 'Cluster',
          metadata: { name },
          spec: {},
        })),
      }),
    });
    // Each certificate is bound to its Cluster's UID, as the listener issues them.
    type Applied = { kind: string; metadata: { name: string; uid: string } };
    const out = JSON.parse(applied.stdout) as Applied & { items?: Applied[] };
    // kubectl prints one object as itself and several as a List.
    const uids = new Map(
      (out.kind === 'List' ? out.items! : [out]).map((c) => [c.metadata.name, c.metadata.uid]),
    );
    const certs = await Promise.all(
      names.map((name) =>
        issueCert(tunnelCA, {
          commonName: name,
          uris: [bindingURI({ cluster: name, uid: uids.get(name)!, generation: 0 })],
          usage: 'client',
        }),
      ),
    );
    // The Clusters must be in the concierge's registry (its informer) before their agents dial.
    await new Promise((r) => setTimeout(r, 3000));
    const memBefore = await memory();
    let connected = 0;
    await Promise.all(
      certs.map(
        (cert) =>
          new Promise<void>((done) => {
            const ws = new WebSocket(`wss://127.0.0.1:${ready.tunnelPort}/connect`, {
              ca: ready.tunnelCA,
              cert: cert.certPem,
              key: cert.keyPem,
            });
            const entry: { ws: WebSocket; tunnel?: TunnelServer } = { ws };
            simulated.push(entry);
            ws.once('open', () => {
              entry.tunnel = serveTunnel(createWebSocketStream(ws), (stream) => stream.destroy());
              connected++;
              done();
            });
            ws.once('error', () => done());
            ws.once('unexpected-response', () => done());
          }),
      ),
    );
    await new Promise((r) => setTimeout(r, 3000));
    const memAfter = await memory();
    const agentMemory = {
      agents: connected,
      rssPerAgentKiB: (memAfter.rss - memBefore.rss) / 1024 / connected,
      heapPerAgentKiB: (memAfter.heapUsed - memBefore.heapUsed) / 1024 / connected,
      rssBeforeMiB: memBefore.rss / 1024 / 1024,
      rssAfterMiB: memAfter.rss / 1024 / 1024,
    };

    report(rows, agentMemory);
    console.log(`saved ${saveResults('tunnel', { rows, agentMemory })}`);
  } finally {
    for (const s of simulated) {
      if (s.tunnel) s.tunnel.close();
      else s.ws.terminate();
    }
    for (const child of children) child.kill();
    await issuer.stop();
    await cluster.stop();
  }
}

function report(rows: Row[], agentMemory: Record<string, number>): void {
  const fmt = formatNumber;
  console.log('\nThrough an agent tunnel vs direct (one real kube-apiserver, 2 cores shared by all)');
  const cpu = (key: string) => (r: Row) => (r[key] ? fmt(r[key] as number) : '-');
  printComparison(rows, [
    { header: 'proxy CPU µs/req', cell: cpu('proxyCpuUs') },
    { header: 'agent CPU µs/req', cell: cpu('agentCpuUs') },
  ]);
  console.log(
    `\n${agentMemory['agents']} connected agents: ${fmt(agentMemory['rssPerAgentKiB']!, 1)} KiB RSS per agent ` +
      `(${fmt(agentMemory['heapPerAgentKiB']!, 1)} KiB heap); concierge RSS ${fmt(agentMemory['rssBeforeMiB']!, 1)} → ` +
      `${fmt(agentMemory['rssAfterMiB']!, 1)} MiB`,
  );
}
