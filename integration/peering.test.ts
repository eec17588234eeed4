// Proxy peering with three concierge replicas (processes of their own) and several agents that dial them through
// one load-balanced address: any replica serves any cluster, whichever replica holds its tunnel; watches, bodies
// and upgrades cross the peer hop; a user's upgrade the holder refuses gets its Status and leaves the holder up; a
// killed holder's clusters come back through the others; the peer port takes no certificate but a replica's; and a hub
// workload is mapped once, by the replica it lands on.
import { PEER_CA_SECRET, PEER_ADDRESS_ANNOTATION, TUNNEL_CA_SECRET } from '../apis/install.ts';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { request as httpsRequest } from 'node:https';
import { connect as tlsConnect } from 'node:tls';
import { WebSocket } from 'ws';
import { stringify } from 'yaml';
import { newAgent, type Agent } from '../agent/agent.ts';
import { newSecretCredentialStore } from '../agent/credentials.ts';
import type { ClusterStatus } from '../apis/tunnel.ts';
import { addCluster } from '../cli/cluster.ts';

import { replicaLeaseName } from '../concierge/tunnel/cluster-status.ts';
import { newKubeClients, readSecretData, type KubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { kubeconfigYaml, runKubectl, startCluster, type Cluster } from '../dev/cluster.ts';
import { runSealion } from '../dev/processes.ts';
import { eventually } from '../dev/eventually.ts';
import { startTcpBalancer, type TcpBalancer } from '../dev/tcp-balancer.ts';
import { clusterStatus as clusterStatusOf } from './harness/cluster-status.ts';
import { startConciergeProcess, type ConciergeProcess } from './harness/concierge-process.ts';
import { podAtBackend, startNetnsBackend, type NetnsBackend } from './harness/netns.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const REPLICAS = ['replica-1', 'replica-2', 'replica-3'];
/** Each with its agent; `twice` holds two tunnels, each to another replica. */
const CLUSTERS = ['east', 'west', 'north', 'twice'];
const USER_GROUP = 'peering-testers';
/**
 * A user of the replicas' signer whose rights differ between the hub and the managed cluster, for `sealion auth can-i
 * --all-clusters` and `sealion get --all-clusters`, which run here because here a cluster is reached through a tunnel
 * and a peer hop: each cluster's answer is held against its own kubectl auth can-i.
 */
const FLEET_USER = 'dora';
const FLEET_GROUP = 'fleet-readers';
const FLEET_NS = 'fleet';
/** A Cluster with no agent: never connected. */
const GONE = 'gone';

let hub: Cluster;
let managed: Cluster;
let hubClients: KubeClients;
let managedClients: KubeClients;
let dir: string;
let signer: CertificateAuthority;
let balancer: TcpBalancer | undefined;
const replicas = new Map<string, ConciergeProcess>();
const agents = new Map<string, Agent>();
let user: { certPem: string; keyPem: string };
let fleetUser: { certPem: string; keyPem: string };
let backend: NetnsBackend | undefined;

function kubeconfigFor(replica: string, cluster: string): string {
  const r = replicas.get(replica)!;
  const file = join(dir, `${replica}-${cluster}.kubeconfig`);
  writeFileSync(
    file,
    kubeconfigYaml(cluster, `${r.url}/clusters/${cluster}`, r.servingCA, { name: 'alice', ...user }),
  );
  return file;
}

/** kubectl through `replica` for `cluster`, as the test user. */
const kubectl = (replica: string, cluster: string, args: string[], input?: string) =>
  managed.kubectl(args, { kubeconfig: kubeconfigFor(replica, cluster), ...(input ? { input } : {}) });

const clusterStatus = (name: string): Promise<ClusterStatus> => clusterStatusOf(hub, name);

/**
 * A kubeconfig as `sealion get kubeconfig --all-clusters` writes one, for the fleet user: a context for the hub and
 * one per cluster, all through the replica that holds the fewest tunnels, so that the others' clusters are reached
 * through a peer hop (`viaPeer`).
 */
async function fleetKubeconfig(
  name: string,
  clusters: string[],
): Promise<{ file: string; viaPeer: string[] }> {
  const holders = new Map(await Promise.all(CLUSTERS.map(async (c) => [c, await holdersOf(c)] as const)));
  const held = (r: string): number => CLUSTERS.filter((c) => holders.get(c)!.includes(r)).length;
  const entry = [...REPLICAS].sort((a, b) => held(a) - held(b))[0]!;
  const r = replicas.get(entry)!;
  const b64 = (text: string): string => Buffer.from(text).toString('base64');
  const file = join(dir, `fleet-${name}.kubeconfig`);
  writeFileSync(
    file,
    stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: ['hub', ...clusters].map((c) => ({
        name: c,
        cluster: {
          server: c === 'hub' ? r.url : `${r.url}/clusters/${c}`,
          'certificate-authority-data': b64(r.servingCA),
        },
      })),
      users: [
        {
          name: FLEET_USER,
          user: {
            'client-certificate-data': b64(fleetUser.certPem),
            'client-key-data': b64(fleetUser.keyPem),
          },
        },
      ],
      contexts: ['hub', ...clusters].map((c) => ({ name: c, context: { cluster: c, user: FLEET_USER } })),
      'current-context': 'hub',
    }),
  );
  return { file, viaPeer: clusters.filter((c) => holders.has(c) && !holders.get(c)!.includes(entry)) };
}

const holdersOf = async (name: string): Promise<string[]> =>
  ((await clusterStatus(name)).tunnels ?? []).map((t) => t.replica).sort();

/** Whether every replica still running serves every cluster. */
async function everyRouteWorks(): Promise<void> {
  const live = [...replicas.entries()].filter(([, r]) => r.alive()).map(([name]) => name);
  const results = await Promise.all(
    live.flatMap((replica) =>
      CLUSTERS.map(async (cluster) => {
        const got = await kubectl(replica, cluster, ['get', 'namespace', 'kube-system', '-o', 'name']);
        return `${replica} → ${cluster}: ${got.code === 0 ? got.stdout.trim() : got.stderr.trim()}`;
      }),
    ),
  );
  expect(results).toEqual(
    live.flatMap((replica) => CLUSTERS.map((cluster) => `${replica} → ${cluster}: namespace/kube-system`)),
  );
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-peering-'));
  [hub, managed] = await Promise.all([
    startCluster({ name: 'peering-hub', controllerManager: false }),
    startCluster({ name: 'peering-managed', controllerManager: false }),
  ]);
  hubClients = newKubeClients({ path: hub.kubeconfigPath });
  managedClients = newKubeClients({ path: managed.kubeconfigPath });
  const agentKubeconfig = await prepareAgentCluster(managed, AGENT_NS);
  await managed.kubectl([
    'create',
    'clusterrolebinding',
    USER_GROUP,
    '--clusterrole=cluster-admin',
    `--group=${USER_GROUP}`,
  ]);
  // A backend behind the managed API server's pod proxy (no kubelet here): a Pod object whose status points at an
  // echo server in a network namespace, for an upgraded connection that carries data both ways.
  backend = await startNetnsBackend();
  await managed.kubectl(['create', 'serviceaccount', 'default', '-n', AGENT_NS]);
  await podAtBackend((args, opts) => managed.kubectl(args, opts), AGENT_NS, 'echo', backend);
  signer = await newCA('peering-test users');
  const issued = await issueCert(signer, {
    commonName: 'alice',
    organizations: [USER_GROUP],
    usage: 'client',
  });
  user = { certPem: issued.certPem, keyPem: issued.keyPem };
  const fleetIssued = await issueCert(signer, {
    commonName: FLEET_USER,
    organizations: [FLEET_GROUP],
    usage: 'client',
  });
  fleetUser = { certPem: fleetIssued.certPem, keyPem: fleetIssued.keyPem };
  await grantFleetUser();
  // One replica first, so that the tunnel and peer CAs are made once, then the others.
  const start = async (identity: string): Promise<void> => {
    replicas.set(
      identity,
      await startConciergeProcess(hub, {
        tunnel: { port: 0, namespace: NS },
        identity,
        signer: { certPem: signer.certPem, keyPem: signer.keyPem },
      }),
    );
  };
  await start(REPLICAS[0]!);
  await Promise.all(REPLICAS.slice(1).map(start));
  // The replicas' tunnel listeners behind one address, as a Service's load balancer puts them.
  balancer = await startTcpBalancer(() =>
    [...replicas.values()].filter((r) => r.alive()).map((r) => r.tunnel!.port),
  );
  const port = balancer.port;
  for (const cluster of CLUSTERS) {
    const added = await addCluster(cluster, {
      kubeconfig: hub.kubeconfigPath,
      namespace: NS,
      groupSuffix: 'sealion.dev',
      hub: '',
      description: '',
    });
    const agent = newAgent({
      cluster,
      hub: new URL(`https://127.0.0.1:${port}`),
      trust: { pin: added.pin },
      bootstrapToken: () => added.token,
      store: newSecretCredentialStore(managedClients, AGENT_NS, `${cluster}-credentials`),
      upstream: agentUpstream(agentKubeconfig),
      version: 'peering-test',
      log: silentLogger(),
      tunnels: cluster === 'twice' ? 2 : 1,
    });
    agents.set(cluster, agent);
    await agent.start();
  }
}, 240_000);

/** The fleet user's rights: pods (and their logs) on the hub; deployments, nodes and configmaps on the managed one. */
async function grantFleetUser(): Promise<void> {
  const group = `--group=${FLEET_GROUP}`;
  const steps: [Cluster, string[]][] = [
    [hub, ['create', 'namespace', FLEET_NS]],
    [hub, ['create', 'role', 'fleet-pods', '-n', FLEET_NS, '--verb=get,list', '--resource=pods,pods/log']],
    [hub, ['create', 'rolebinding', 'fleet-pods', '-n', FLEET_NS, '--role=fleet-pods', group]],
    [managed, ['create', 'namespace', FLEET_NS]],
    [managed, ['create', 'clusterrole', 'fleet-reader', '--verb=list', '--resource=deployments.apps,nodes']],
    [managed, ['create', 'clusterrolebinding', 'fleet-reader', '--clusterrole=fleet-reader', group]],
    [
      managed,
      [
        'create',
        'role',
        'fleet-configmaps',
        '-n',
        FLEET_NS,
        '--verb=get,list,delete',
        '--resource=configmaps',
      ],
    ],
    [
      managed,
      ['create', 'rolebinding', 'fleet-configmaps', '-n', FLEET_NS, '--role=fleet-configmaps', group],
    ],
    [managed, ['create', 'configmap', 'settings', '-n', FLEET_NS, '--from-literal=mode=fleet']],
  ];
  for (const [cluster, args] of steps) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
}

afterAll(async () => {
  await Promise.all([...agents.values()].map((a) => a.stop()));
  await Promise.all([...replicas.values()].map((r) => r.stop()));
  await balancer?.stop();
  await backend?.stop();
  await Promise.all([hub?.stop(), managed?.stop()]);
  rmSync(dir, { recursive: true, force: true });
});

/** Watches of ConfigMaps the managed cluster's API server holds open now, from its own metrics. */
async function configMapWatches(): Promise<number> {
  const metrics = await managed.kubectl(['get', '--raw', '/metrics']);
  let open = 0;
  for (const m of metrics.stdout.matchAll(/^apiserver_longrunning_requests\{([^}]*)\} (\d+)$/gm))
    if (m[1]!.includes('resource="configmaps"') && m[1]!.includes('verb="WATCH"')) open += Number(m[2]);
  return open;
}

describe('three replicas sharing agents', () => {
  it('serves every cluster from every replica, whichever holds its tunnel', async () => {
    await eventually(async () => {
      for (const cluster of CLUSTERS)
        expect((await holdersOf(cluster)).length).toBe(cluster === 'twice' ? 2 : 1);
    }, 60_000);
    // The agent with two tunnels has them on two replicas.
    expect(new Set(agents.get('twice')!.replicas()).size).toBe(2);
    await eventually(everyRouteWorks, 30_000);
    // The replicas holding each cluster, as `kubectl get clusters -o wide` shows them.
    const table = await hub.kubectl(['get', 'clusters.tunnel.concierge.sealion.dev', '-o', 'wide']);
    expect(table.stdout).toMatch(/REPLICAS/);
    const rowOf = (cluster: string): string =>
      table.stdout.split('\n').find((line) => line.startsWith(`${cluster} `)) ?? '';
    expect(rowOf('twice')).toContain((await holdersOf('twice')).join(','));
    expect(rowOf('east')).toContain((await holdersOf('east')).join(','));
  }, 120_000);

  it('takes a hub workload on every replica, the holder of the tunnel or not, and maps it once', async () => {
    const must = async (cluster: Cluster, args: string[]): Promise<string> => {
      const result = await cluster.kubectl(args);
      if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
      return result.stdout;
    };
    const mapped = 'hub:system:serviceaccount:apps:deployer';
    await must(hub, ['create', 'namespace', 'apps']);
    await must(hub, ['create', 'serviceaccount', 'deployer', '-n', 'apps']);
    await must(hub, [
      'patch',
      'clusters.tunnel.concierge.sealion.dev',
      'east',
      '--type=merge',
      '-p',
      JSON.stringify({ spec: { workloads: { usernamePrefix: 'hub:' } } }),
    ]);
    // No controller manager here to aggregate the built-in view role: a role of its own.
    await must(managed, [
      'create',
      'clusterrole',
      'hub-reader',
      '--verb=get,list',
      '--resource=namespaces,configmaps',
    ]);
    await must(managed, [
      'create',
      'clusterrolebinding',
      'hub-deployer',
      '--clusterrole=hub-reader',
      `--user=${mapped}`,
    ]);
    const token = (
      await must(hub, [
        'create',
        'token',
        'deployer',
        '-n',
        'apps',
        '--audience=workloads.concierge.sealion.dev',
      ])
    ).trim();
    await eventually(async () => expect(await holdersOf('east')).toHaveLength(1), 60_000);
    const [holder] = await holdersOf('east');
    /** A request through `replica` with the workload's token (a body goes chunked, as kubectl sends it). */
    const send = (replica: string, path: string, body?: string) =>
      new Promise<{ status: number; body: string }>((done, fail) => {
        const r = replicas.get(replica)!;
        const req = httpsRequest(
          new URL(path, r.url),
          {
            method: body === undefined ? 'GET' : 'POST',
            ca: r.servingCA,
            headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
          },
          (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () => done({ status: res.statusCode ?? 0, body: text }));
          },
        );
        req.on('error', fail);
        if (body !== undefined) req.write(body);
        req.end();
      });
    const review = JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' });
    // Every replica knows the Cluster's prefix once its informer has the edit; the holder and the others alike.
    await eventually(async () => {
      for (const replica of REPLICAS) {
        const seen = await send(
          replica,
          '/clusters/east/apis/authentication.k8s.io/v1/selfsubjectreviews',
          review,
        );
        expect(`${replica}: ${seen.status}`).toBe(`${replica}: 201`);
        // Mapped where the request landed, and only there: never hub:hub:…
        expect(JSON.parse(seen.body)).toMatchObject({ status: { userInfo: { username: mapped } } });
      }
    }, 30_000);
    const other = REPLICAS.find((r) => r !== holder)!;
    expect((await send(other, '/clusters/east/api/v1/namespaces/kube-system')).status).toBe(200);
    // The managed cluster's RBAC decides for the mapped name: it reads, and writes nothing.
    const write = await send(
      other,
      '/clusters/east/api/v1/namespaces/default/configmaps',
      JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'from-hub' } }),
    );
    expect(write.status).toBe(403);
    expect((JSON.parse(write.body) as { message: string }).message).toContain(
      `User "${mapped}" cannot create resource "configmaps"`,
    );
  }, 120_000);

  it('carries watches, large bodies and upgrades through a replica that does not hold the tunnel', async () => {
    const [holder] = await holdersOf('east');
    const other = REPLICAS.find((r) => r !== holder)!;
    // A watch through the peer hop sees an object created through the holder, once the API server holds it open.
    const watchesBefore = await configMapWatches();
    const watch = kubectl(other, 'east', [
      'get',
      'configmaps',
      '-n',
      'default',
      '--watch-only',
      '-o',
      'name',
      '--request-timeout=10s',
    ]);
    await eventually(async () => expect(await configMapWatches()).toBeGreaterThan(watchesBefore), 30_000);
    const created = await kubectl(holder!, 'east', ['create', 'configmap', 'watched', '-n', 'default']);
    expect(created.stderr).toBe('');
    // A body of 900 KiB, both ways through the hop; and one of 10 MiB, whose refusal by the API server comes back.
    const configMap = (name: string, size: number): string =>
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name, namespace: 'default' },
        data: { big: 'x'.repeat(size) },
      });
    const applied = await kubectl(other, 'east', ['create', '-f', '-'], configMap('big', 900 * 1024));
    expect(applied.stderr).toBe('');
    const read = await kubectl(other, 'east', [
      'get',
      'configmap',
      'big',
      '-n',
      'default',
      '-o',
      'jsonpath={.data.big}',
    ]);
    expect(read.stdout.length).toBe(900 * 1024);
    const refused = await kubectl(other, 'east', ['create', '-f', '-'], configMap('huge', 10 * 1024 * 1024));
    expect(refused.stderr).toMatch(/too large/i);
    const watched = await watch;
    expect(watched.stdout).toContain('configmap/big');
    expect(watched.stdout).toContain('configmap/watched');
    // An upgraded connection carries data both ways through the hop: a WebSocket to the echo backend, through the
    // API server's pod proxy, with a message of 1 MiB among small ones.
    const r = replicas.get(other)!;
    const url = `wss://${r.url.slice('https://'.length)}/clusters/east/api/v1/namespaces/${AGENT_NS}/pods/echo:${backend!.port}/proxy/echo`;
    const messages = ['through a peer', 'y'.repeat(1024 * 1024), 'and back'];
    const echoed = await new Promise<string[]>((done, fail) => {
      const ws = new WebSocket(url, { ca: r.servingCA, cert: user.certPem, key: user.keyPem });
      const got: string[] = [];
      ws.once('open', () => messages.forEach((m) => ws.send(m)));
      ws.on('message', (data: Buffer) => {
        got.push(data.toString());
        if (got.length === messages.length) {
          ws.close();
          done(got);
        }
      });
      ws.once('error', fail);
      ws.once('unexpected-response', (_req, res) => fail(new Error(`upgrade refused: ${res.statusCode}`)));
    });
    expect(echoed.map((m) => m.length)).toEqual(messages.map((m) => m.length));
    expect(echoed).toEqual(messages);
    // kubectl's own upgrades (exec, over WebSocket and over SPDY) reach the API server through the hop, which answers
    // them with its own Status: the echo Pod has no container to run in.
    for (const websockets of ['true', 'false']) {
      const exec = await runKubectl(
        managed.binaries.kubectl,
        kubeconfigFor(other, 'east'),
        ['exec', '-n', 'default', 'nowhere', '--', 'true'],
        { env: { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: websockets } },
      );
      expect(exec.stderr).toContain('pods "nowhere" not found');
    }
  }, 120_000);

  it("refuses a user's upgrade over the peer hop with a Status when their share is full, and the holder serves on", async () => {
    // Whoever may sign in can reach this refusal: exec, attach and port-forward are upgrades, and one that lands on a
    // replica without the cluster's tunnel crosses a peer link, where the holder's fair queue refuses it (429 for a
    // full share of the user's, 503 for a full tunnel; and the holder's own 503 once the tunnel moved).
    const cluster = 'north';
    const [holder] = await eventually(async () => {
      const holders = await holdersOf(cluster);
      expect(holders).toHaveLength(1);
      return holders;
    }, 60_000);
    const other = REPLICAS.find((r) => r !== holder)!;
    const r = replicas.get(other)!;
    const url = `wss://${r.url.slice('https://'.length)}/clusters/${cluster}/api/v1/namespaces/${AGENT_NS}/pods/echo:${backend!.port}/proxy/echo`;
    /** A WebSocket through `other` to the echo backend: open, or refused with its status and body. */
    const connect = (): Promise<WebSocket | { status: number; body: string }> =>
      new Promise((done, fail) => {
        const ws = new WebSocket(url, { ca: r.servingCA, cert: user.certPem, key: user.keyPem });
        ws.once('open', () => done(ws));
        ws.once('error', fail);
        ws.once('unexpected-response', (_req, res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (chunk: string) => (body += chunk));
          res.once('end', () => done({ status: res.statusCode ?? 0, body }));
          res.once('error', fail);
        });
      });
    const echo = (ws: WebSocket, text: string): Promise<string> =>
      new Promise((done, fail) => {
        ws.once('message', (data: Buffer) => done(data.toString()));
        ws.once('error', fail);
        ws.send(text);
      });
    const patch = (spec: object): Promise<unknown> =>
      hub.kubectl([
        'patch',
        'clusters.tunnel.concierge.sealion.dev',
        cluster,
        '--type=merge',
        '-p',
        JSON.stringify({ spec }),
      ]);
    // One upgrade at a time for each user, and one more may wait a second.
    await patch({ maxRequestsPerUser: 1, queueTimeoutSeconds: 1 });
    const open: WebSocket[] = [];
    try {
      const first = await connect();
      if (!(first instanceof WebSocket)) throw new Error(`the first upgrade was refused: ${first.status}`);
      open.push(first);
      // Until the edit reaches the holder's informer a second upgrade is let through too: closed, and tried again.
      const refused = await eventually(async () => {
        const second = await connect();
        if (second instanceof WebSocket) {
          second.close();
          throw new Error('a second upgrade was let through: the edit has not reached the holder yet');
        }
        return second;
      }, 30_000);
      expect(refused.status).toBe(429);
      expect(JSON.parse(refused.body)).toMatchObject({
        kind: 'Status',
        code: 429,
        reason: 'TooManyRequests',
      });
      // The holder is up and still carries the first upgrade; once that closes, the user's place is free again.
      expect(replicas.get(holder!)!.alive()).toBe(true);
      expect(await echo(first, 'still there')).toBe('still there');
      first.close();
      await eventually(async () => {
        const through = await kubectl(holder!, cluster, ['get', 'namespace', 'kube-system', '-o', 'name']);
        expect(through.stdout.trim()).toBe('namespace/kube-system');
      }, 30_000);
    } finally {
      for (const ws of open) ws.terminate();
      await patch({ maxRequestsPerUser: null, queueTimeoutSeconds: null });
    }
  }, 90_000);

  it('refuses at the peer port every certificate but a replica’s', async () => {
    const lease = await hub.kubectl([
      'get',
      'lease',
      '-n',
      NS,
      replicaLeaseName(REPLICAS[0]!),
      '-o',
      `jsonpath={.metadata.annotations.${PEER_ADDRESS_ANNOTATION.replace(/\./g, '\\.')}}`,
    ]);
    const [host, port] = [
      lease.stdout.slice(0, lease.stdout.lastIndexOf(':')),
      Number(lease.stdout.split(':').pop()),
    ];
    expect(port).toBeGreaterThan(0);
    const peerData = await readSecretData(hubClients, NS, PEER_CA_SECRET);
    const peerCA = await loadCA(peerData!['tls.crt']!, peerData!['tls.key']!);
    const agentCredentials = await readSecretData(managedClients, AGENT_NS, 'east-credentials');
    const tunnelCA = await readSecretData(hubClients, NS, TUNNEL_CA_SECRET);
    // A certificate of the peer CA that names no replica: a key taken from a replica would have its name.
    const unnamed = await issueCert(peerCA, { commonName: 'sealion-peer', usage: 'client' });
    /** What a TLS client with `cert` gets from the peer port: an HTTP/2 preface answered, or the connection closed. */
    const attempt = (cert?: { certPem: string; keyPem: string }): Promise<string> =>
      new Promise((done) => {
        const socket = tlsConnect({
          host,
          port,
          ca: peerCA.certPem,
          ALPNProtocols: ['sealion-peer/1'],
          checkServerIdentity: () => undefined,
          ...(cert ? { cert: cert.certPem, key: cert.keyPem } : {}),
        });
        let got = '';
        socket.on('data', (chunk: Buffer) => (got += chunk.length));
        socket.once('secureConnect', () =>
          socket.write('PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0'),
        );
        socket.once('error', () => done('refused'));
        socket.once('close', () => done(got ? 'answered' : 'refused'));
        setTimeout(() => {
          socket.destroy();
          done(got ? 'answered' : 'silent');
        }, 3000);
      });
    const agentCert = { certPem: agentCredentials!['tls.crt']!, keyPem: agentCredentials!['tls.key']! };
    expect({
      none: await attempt(),
      user: await attempt(user),
      agent: await attempt(agentCert),
      tunnelCA: await attempt({ certPem: tunnelCA!['tls.crt']!, keyPem: tunnelCA!['tls.key']! }),
      unnamed: await attempt({ certPem: unnamed.certPem, keyPem: unnamed.keyPem }),
    }).toEqual({
      none: 'refused',
      user: 'refused',
      agent: 'refused',
      tunnelCA: 'refused',
      unnamed: 'refused',
    });
    // The same client with a replica's certificate gets its answer: the refusals above are the certificates'.
    const replicaCert = await issueCert(peerCA, {
      commonName: 'sealion-peer',
      uris: ['urn:sealion:peer:replica-test'],
      usage: 'server+client',
    });
    expect(await attempt({ certPem: replicaCert.certPem, keyPem: replicaCert.keyPem })).toBe('answered');
  }, 60_000);

  it("answers sealion auth can-i --all-clusters, per cluster, as that cluster's own kubectl auth can-i does, through tunnels and peer hops", async () => {
    const { file: kubeconfig, viaPeer } = await fleetKubeconfig('can-i', CLUSTERS);
    expect(viaPeer.length).toBeGreaterThan(0);
    const cases: string[][] = [
      ['get', 'pods', '-n', FLEET_NS],
      ['get', 'pods/web', '-n', FLEET_NS, '--subresource', 'log'],
      ['list', 'deployments.apps', '-n', FLEET_NS],
      ['list', 'deploy', '-A'],
      ['delete', 'configmaps', '-n', FLEET_NS],
      ['create', 'configmaps', '-n', 'default'],
      ['list', 'nodes'],
      ['get', 'widgets.example.com', '-n', FLEET_NS],
      ['get', '/healthz'],
    ];
    /** The API server's own answer for the user, asked with admin credentials: yes or no. */
    const oracle = async (cluster: Cluster, question: string[]): Promise<boolean> => {
      const asked = await cluster.kubectl([
        'auth',
        'can-i',
        ...question,
        `--as=${FLEET_USER}`,
        `--as-group=${FLEET_GROUP}`,
      ]);
      if (![0, 1].includes(asked.code)) throw new Error(`kubectl auth can-i: ${asked.stderr}`);
      return asked.stdout.startsWith('yes');
    };
    for (const question of cases) {
      const [hubSays, managedSays] = await Promise.all([oracle(hub, question), oracle(managed, question)]);
      const got = await runSealion([
        'auth',
        'can-i',
        ...question,
        '--all-clusters',
        '--kubeconfig',
        kubeconfig,
        '-o',
        'json',
      ]);
      const answers = JSON.parse(got.stdout) as { context: string; state: string; allowed: boolean }[];
      expect({ question, answers: answers.map((a) => [a.context, a.state, a.allowed]) }).toEqual({
        question,
        answers: [
          ['hub', 'Answered', hubSays],
          ...CLUSTERS.map((cluster) => [cluster, 'Answered', managedSays]),
        ],
      });
      // 0 only when every cluster said yes, as kubectl auth can-i exits 1 on a no.
      expect({ question, code: got.code }).toEqual({ question, code: hubSays && managedSays ? 0 : 1 });
    }
    // Several verbs in one run: each (cluster, verb) as that cluster's kubectl answers it.
    const verbs = ['get', 'list', 'delete', 'create'];
    const matrix = await runSealion([
      'auth',
      'can-i',
      verbs.join(','),
      'configmaps',
      '-n',
      FLEET_NS,
      '--all-clusters',
      '--kubeconfig',
      kubeconfig,
      '-o',
      'json',
    ]);
    const said = new Map<string, boolean>();
    for (const verb of verbs) {
      said.set(`hub ${verb}`, await oracle(hub, [verb, 'configmaps', '-n', FLEET_NS]));
      said.set(`managed ${verb}`, await oracle(managed, [verb, 'configmaps', '-n', FLEET_NS]));
    }
    expect(
      (JSON.parse(matrix.stdout) as { context: string; verb: string; allowed: boolean }[]).map((a) => [
        a.context,
        a.verb,
        a.allowed,
      ]),
    ).toEqual(
      ['hub', ...CLUSTERS].flatMap((context) =>
        verbs.map((verb) => [context, verb, said.get(`${context === 'hub' ? 'hub' : 'managed'} ${verb}`)]),
      ),
    );
    expect(said.get('managed list')).toBe(true);
    expect(said.get('managed create')).toBe(false);
    // The cases tell the clusters apart: each says yes where the other says no.
    expect(await oracle(hub, cases[0]!)).toBe(true);
    expect(await oracle(managed, cases[0]!)).toBe(false);
    expect(await oracle(managed, cases[2]!)).toBe(true);
  }, 120_000);

  it('shows, in sealion get --all-clusters, a cluster that refuses and one that is not connected, and exits 1', async () => {
    await addCluster(GONE, {
      kubeconfig: hub.kubeconfigPath,
      namespace: NS,
      groupSuffix: 'sealion.dev',
      hub: '',
      description: '',
    });
    const { file: kubeconfig } = await fleetKubeconfig('get', [CLUSTERS[0]!, GONE]);
    const args = ['get', 'configmaps', '--all-clusters', '-n', FLEET_NS, '--kubeconfig', kubeconfig];
    const got = await runSealion(args);
    expect(got.code).toBe(1);
    const lines = got.stdout.split('\n');
    expect(lines.slice(0, 2)).toEqual([
      expect.stringMatching(/^CLUSTER +NAME +DATA +AGE$/),
      expect.stringMatching(new RegExp(`^${CLUSTERS[0]} +settings +1 +\\S+$`)),
    ]);
    expect(lines.slice(2)).toEqual([
      '',
      expect.stringMatching(/^CLUSTER +STATE +REASON$/),
      expect.stringMatching(
        /^hub +Forbidden +configmaps is forbidden: User "dora" cannot list resource "configmaps"/,
      ),
      expect.stringMatching(new RegExp(`^${GONE} +NotConnected +cluster ${GONE} is not connected`)),
      '',
    ]);
    expect(got.stderr).toBe(
      `sealion: get configmaps: 2 of 3 clusters did not answer (hub: Forbidden, ${GONE}: NotConnected); see each reason above; sealion clusters shows which clusters answer you now\n`,
    );
    // As JSON: the items that came, each marked with its cluster; a line on stderr for each cluster that did not.
    const json = await runSealion([...args, '-o', 'json']);
    expect(json.code).toBe(1);
    expect(
      (
        JSON.parse(json.stdout) as {
          items: { kind: string; metadata: { name: string; annotations: object } }[];
        }
      ).items.map((i) => [i.kind, i.metadata.name, i.metadata.annotations]),
    ).toEqual([['ConfigMap', 'settings', { 'sealion.dev/context': CLUSTERS[0] }]]);
    expect(json.stderr.split('\n').slice(0, 2)).toEqual([
      expect.stringMatching(/^hub: Forbidden: configmaps is forbidden/),
      expect.stringMatching(new RegExp(`^${GONE}: NotConnected: cluster ${GONE} is not connected`)),
    ]);
  }, 60_000);

  it("brings a killed holder's clusters back through the other replicas", async () => {
    // The replica holding the most tunnels.
    const held = new Map<string, number>();
    for (const cluster of CLUSTERS)
      for (const r of await holdersOf(cluster)) held.set(r, (held.get(r) ?? 0) + 1);
    const [victim] = [...held.entries()].sort((a, b) => b[1] - a[1])[0]!;
    const killed = Date.now();
    process.kill(replicas.get(victim)!.pid, 'SIGKILL');
    await eventually(() => expect(replicas.get(victim)!.alive()).toBe(false));
    await eventually(everyRouteWorks, 60_000, 250);
    const seconds = (Date.now() - killed) / 1000;
    process.stderr.write(
      `every cluster answered through every live replica ${seconds.toFixed(1)} s after the kill\n`,
    );
    // Nothing routes to the dead replica once its Lease lapsed: the status shows the live holders only.
    await eventually(async () => {
      for (const cluster of CLUSTERS) expect(await holdersOf(cluster)).not.toContain(victim);
    }, 30_000);
  }, 120_000);
});
