// Agents end to end on real API servers: a hub with the concierge, a managed cluster the hub never dials. The
// admin onboards the managed cluster with the CLI, the agent (the real `sealion agent` process) registers and
// dials out, and real kubectl reaches the managed cluster through the hub as a user whom that cluster's RBAC
// judges. Registration refusals, a killed agent and a restarted concierge are exercised too.
import { TUNNEL_CA_SECRET } from '../apis/install.ts';
import type { VersionReport } from '../cli/version.ts';
import { SEALION_VERSION } from '../lib/version.ts';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { connect as http2Connect, constants as http2, type ClientHttp2Stream } from 'node:http2';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createWebSocketStream, WebSocket } from 'ws';
import { X509Certificate } from 'node:crypto';
import { newAgent, type Agent, type AgentCredentials } from '../agent/agent.ts';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { systemClock, type Clock } from '../lib/clock.ts';
import { newLogger, silentLogger } from '../lib/log.ts';
import { Writable } from 'node:stream';
import { newKubeClients, readSecretData, type KubeClients } from '../lib/kube/kube.ts';
import { issueCert, loadCA, newCA, newCSR } from '../lib/pki/pki.ts';
import { serveTunnel, TUNNEL_PROTOCOL, TUNNEL_PROTOCOL_HEADER } from '../lib/tunnel/tunnel.ts';

import { bindingURI } from '../apis/agent-binding.ts';
import { REPO_ROOT } from '../dev/build.ts';
import { kubeconfigYaml, runKubectl, startCluster, type Cluster } from '../dev/cluster.ts';
import { applyJWTAuthenticator, startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';
import { eventually } from '../dev/eventually.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { podAtBackend, startNetnsBackend, type NetnsBackend } from './harness/netns.ts';
import { retryWhileAddressInUse } from './harness/ports.ts';
import { dieWithParent, runSealion, stopChild, waitForOutput } from '../dev/processes.ts';
import { CURRENT_PROTOCOL, formatProtocol } from '../lib/tunnel/protocol.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const USER = 'dana@example.com';
const GROUP = 'edge-operators';
const CLUSTER = 'edge-1';

let hub: Cluster;
let managed: Cluster;
let hubClients: KubeClients;
let managedClients: KubeClients;
let concierge: LocalConcierge;
let tunnelPort: number;
let dir: string;
/** The agent processes the current test started; each test's are killed after it. */
const agents = new Set<ChildProcess>();
let agentKubeconfig: string;
let backend: NetnsBackend;
let issuer: TestIssuer;
/** The user's OIDC token, which the hub's JWTAuthenticator accepts. */
let TOKEN = '';

/** A cluster onboarded with `cluster add`: its bootstrap token, and the agent command it printed. */
interface Onboarded {
  name: string;
  token: string;
  command: string[];
}

/** Onboards `name` with `sealion cluster add`, as an admin of the hub. */
async function onboard(name: string): Promise<Onboarded> {
  const added = await sealionOnHub(['cluster', 'add', name, '--hub', `https://127.0.0.1:${tunnelPort}`]);
  expect(added).toMatchObject({ code: 0 });
  const printed = /SEALION_BOOTSTRAP_TOKEN=(\S+) sealion (agent .+)$/m.exec(added.stdout);
  expect(printed).not.toBeNull();
  return { name, token: printed![1]!, command: printed![2]!.split(' ') };
}

/**
 * Starts the agent as printed by `cluster add`, with this test's kubeconfig for the managed cluster and a credentials
 * Secret of its cluster's own; resolves with it once its tunnel is up. `token` is the bootstrap token it is given
 * (none: it is registered already).
 */
async function startAgentProcess(onboarded: Onboarded, token = onboarded.token): Promise<ChildProcess> {
  // An agent left by a test process that died would dial the next hub on this port: it dies with this process.
  const [command, args] = dieWithParent(process.execPath, [
    join(REPO_ROOT, 'cli/main.ts'),
    ...onboarded.command,
    '--kubeconfig',
    agentKubeconfig,
    '--namespace',
    AGENT_NS,
    '--credentials-secret',
    credentialsSecret(onboarded.name),
    '--log-level',
    'debug',
  ]);
  const child = spawn(command, args, {
    env: { ...process.env, SEALION_BOOTSTRAP_TOKEN: token },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  agents.add(child);
  await waitForOutput(child, /tunnel up/);
  return child;
}

function stopAgent(child: ChildProcess, signal: NodeJS.Signals = 'SIGTERM'): Promise<void> {
  agents.delete(child);
  return stopChild(child, { signal });
}

/** A cluster onboarded and its agent connected, reached by kubectl through the hub as the user. */
async function connectedCluster(name: string): Promise<{ onboarded: Onboarded; agent: ChildProcess }> {
  const onboarded = await onboard(name);
  const agent = await startAgentProcess(onboarded);
  await untilReachable(name);
  return { onboarded, agent };
}

/** Waits until kubectl through the hub lists the managed cluster's namespaces as the user. */
const untilReachable = (cluster: string): Promise<void> =>
  eventually(async () => {
    const back = await runKubectl(hub.binaries.kubectl, userKubeconfig(`/clusters/${cluster}`), [
      'get',
      'namespaces',
      '-o',
      'name',
    ]);
    expect(back).toMatchObject({ code: 0 });
  });

const credentialsSecret = (cluster: string): string => `${cluster}-credentials`;

/** The user's kubeconfig for the managed cluster through the hub's proxy (or for the hub itself). */
function userKubeconfig(path: string): string {
  const file = join(dir, `user${path.replace(/\//g, '_')}.kubeconfig`);
  writeFileSync(
    file,
    kubeconfigYaml('through-hub', `${concierge.url}${path}`, concierge.servingCA.certPem, {
      name: USER,
      token: TOKEN,
    }),
  );
  return file;
}

/** Dials the tunnel listener, presenting a client certificate if given. */
const dialTunnel = (options: { cert?: string; key?: string }): WebSocket =>
  new WebSocket(`wss://127.0.0.1:${tunnelPort}/connect`, {
    ca: concierge.concierge.tunnel!.caPem,
    headers: { [TUNNEL_PROTOCOL_HEADER]: TUNNEL_PROTOCOL },
    ...options,
  });

/** The HTTP status a dial of the tunnel listener gets: 101 when the tunnel opened (it is closed again), 0 on error. */
const dialStatus = (options: { cert?: string; key?: string }): Promise<number> =>
  new Promise((done) => {
    const ws = dialTunnel(options);
    ws.once('open', () => {
      ws.close();
      done(101);
    });
    ws.once('unexpected-response', (_req, res) => done(res.statusCode ?? 0));
    ws.once('error', () => done(0));
  });

/** The agent's key and certificate. */
interface ClientCert {
  cert: string;
  key: string;
}

/** Posts JSON to the tunnel listener, with a client certificate if given; the status and the body. */
const postTunnel = (
  path: string,
  body: object,
  client?: ClientCert,
): Promise<{ status: number; body: string }> =>
  new Promise((done, fail) => {
    const req = httpsRequest(
      {
        host: '127.0.0.1',
        port: tunnelPort,
        path,
        method: 'POST',
        ca: concierge.concierge.tunnel!.caPem,
        ...client,
      },
      (res) => {
        let text = '';
        res.on('data', (c: Buffer) => (text += c.toString()));
        res.on('end', () => done({ status: res.statusCode ?? 0, body: text }));
      },
    );
    req.on('error', fail);
    req.end(JSON.stringify(body));
  });

/** Registers as an agent of `cluster` with a bootstrap token; the certificate and key it got. */
async function registerWith(cluster: string, token: string): Promise<ClientCert> {
  const { csrPem, keyPem } = await newCSR(cluster);
  const answer = await postTunnel('/register', { cluster, token, csr: csrPem });
  if (answer.status !== 200) throw new Error(`registration refused: ${answer.status}`);
  return { cert: (JSON.parse(answer.body) as { certificate: string }).certificate, key: keyPem };
}

/** The HTTP status a renewal with this certificate gets. */
const renewStatus = async (client: ClientCert): Promise<number> =>
  (await postTunnel('/renew', { csr: (await newCSR('renewal')).csrPem }, client)).status;

/** The certificate the real agent process of `cluster` keeps in its Secret on the managed cluster. */
const agentCertificate = async (cluster: string): Promise<ClientCert> => {
  const data = (await readSecretData(managedClients, AGENT_NS, credentialsSecret(cluster)))!;
  return { cert: data['tls.crt']!, key: data['tls.key']! };
};

const CLUSTERS = 'clusters.tunnel.concierge.sealion.dev';

async function applyCluster(name: string): Promise<void> {
  const applied = await hub.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
      kind: 'Cluster',
      metadata: { name },
      spec: {},
    }),
  });
  if (applied.code !== 0) throw new Error(`applying Cluster ${name}: ${applied.stderr}`);
}

/** The sealion CLI against the hub, as its admin. */
const sealionOnHub = (args: string[]): ReturnType<typeof runSealion> =>
  runSealion([...args, '--kubeconfig', hub.kubeconfigPath, '--namespace', NS]);

/** Waits until the hub's proxy answers that the cluster's tunnel is gone. */
const untilDisconnected = (cluster: string): Promise<void> =>
  eventually(async () => {
    const result = await runKubectl(hub.binaries.kubectl, userKubeconfig(`/clusters/${cluster}`), [
      'get',
      'namespaces',
    ]);
    expect(result.stderr).toContain(`cluster ${cluster} is not connected`);
  });

const clusterStatus = async (name: string): Promise<Record<string, unknown>> => {
  const out = await hub.kubectl([
    'get',
    `clusters.tunnel.concierge.sealion.dev`,
    name,
    '-o',
    'jsonpath={.status}',
  ]);
  return JSON.parse(out.stdout || '{}') as Record<string, unknown>;
};

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-tunnel-'));
  [hub, managed] = await Promise.all([
    startCluster({ name: 'hub', controllerManager: false }),
    startCluster({ name: 'managed', controllerManager: false }),
  ]);
  hubClients = newKubeClients({ path: hub.kubeconfigPath });
  managedClients = newKubeClients({ path: managed.kubeconfigPath });
  for (const args of [['create', 'namespace', NS]]) await hub.kubectl(args);
  concierge = await startLocalConcierge(hub, { tunnel: { port: 0, namespace: NS } });
  tunnelPort = concierge.concierge.tunnel!.port;
  // The hub knows the user through a JWTAuthenticator trusting a local OIDC issuer.
  issuer = await startOIDCIssuer({ audience: 'sealion-tunnel' });
  await applyJWTAuthenticator(hub, 'corp', issuer, 'sealion-tunnel');
  TOKEN = await issuer.mint({ username: USER, groups: [GROUP] }, { expiresIn: 3600 });

  // On the managed cluster: the agent's identity may impersonate; the user may read namespaces there.
  agentKubeconfig = await prepareAgentCluster(managed, AGENT_NS);
  for (const args of [
    ['create', 'namespace', 'only-on-managed'],
    ['create', 'clusterrole', 'ns-reader', '--verb=get,list,watch', '--resource=namespaces'],
    ['create', 'clusterrolebinding', 'operators-read', '--clusterrole=ns-reader', `--group=${GROUP}`],
  ]) {
    const result = await managed.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  // A backend on the managed cluster, behind its API server's pod proxy (no kubelet here): a Pod object whose
  // status points at a server in a network namespace. It echoes WebSockets and can hold a request forever.
  backend = await startNetnsBackend();
  for (const args of [
    // No kube-controller-manager here to create the namespace's default service account.
    ['create', 'serviceaccount', 'default', '-n', AGENT_NS],
    ['create', 'role', 'proxy-echo', '-n', AGENT_NS, '--verb=get,create', '--resource=pods/proxy'],
    ['create', 'rolebinding', 'proxy-echo', '-n', AGENT_NS, '--role=proxy-echo', `--group=${GROUP}`],
  ]) {
    const result = await managed.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  await podAtBackend((args, opts) => managed.kubectl(args, opts), AGENT_NS, 'echo', backend);
}, 180_000);

afterEach(async () => {
  await Promise.all([...agents].map((child) => stopAgent(child, 'SIGKILL')));
});

afterAll(async () => {
  await backend?.stop();
  await concierge?.stop();
  await issuer?.stop();
  await Promise.all([hub?.stop(), managed?.stop()]);
  rmSync(dir, { recursive: true, force: true });
});

// Each test onboards a cluster (and starts an agent) of its own on the servers all tests share, so that it runs alone
// as it runs among the others.
describe('a cluster reached through its agent', () => {
  it('onboards with the CLI, and kubectl through the hub reaches it with that cluster’s RBAC', async () => {
    const added = await runSealion([
      'cluster',
      'add',
      CLUSTER,
      '--kubeconfig',
      hub.kubeconfigPath,
      '--namespace',
      NS,
      '--hub',
      `https://127.0.0.1:${tunnelPort}`,
    ]);
    expect(added).toMatchObject({ code: 0 });
    const printed = /SEALION_BOOTSTRAP_TOKEN=(\S+) sealion (agent .+)$/m.exec(added.stdout);
    expect(printed).not.toBeNull();
    const onboarded = { name: CLUSTER, token: printed![1]!, command: printed![2]!.split(' ') };
    expect(onboarded.command).toContain('--ca-pin');
    await startAgentProcess(onboarded);

    const through = userKubeconfig(`/clusters/${CLUSTER}`);
    // The JWTAuthenticator becomes ready a moment after it is applied.
    const list = await eventually(async () => {
      const result = await runKubectl(hub.binaries.kubectl, through, ['get', 'namespaces', '-o', 'name']);
      expect(result).toMatchObject({ code: 0, stderr: '' });
      return result;
    });
    expect(list.stdout).toContain('namespace/only-on-managed');
    // The managed cluster's RBAC decides: reading is granted there, creating is not.
    const denied = await runKubectl(hub.binaries.kubectl, through, ['create', 'namespace', 'nope']);
    expect(denied.stderr).toContain(`User "${USER}" cannot create resource "namespaces"`);
    // The hub's own RBAC grants the user nothing.
    const onHub = await runKubectl(hub.binaries.kubectl, userKubeconfig('/'), ['get', 'namespaces']);
    expect(onHub.stderr).toContain(`User "${USER}" cannot list resource "namespaces"`);

    const status = await eventually(async () => {
      const s = await clusterStatus(CLUSTER);
      expect(s['connected']).toBe(true);
      return s;
    });
    expect(status['agentVersion']).toMatch(/^\d+\.\d+\.\d+/);
    expect(Date.parse(String(status['certificateExpiry']))).toBeGreaterThan(
      Date.now() + 80 * 24 * 3600 * 1000,
    );
    // kubectl's wide view shows the expiry as written (a date column would print a future time as <invalid>).
    const wide = await hub.kubectl(['get', CLUSTERS, CLUSTER, '-o', 'wide']);
    expect(wide.stdout).toContain(String(status['certificateExpiry']).replace(/\.\d+Z$/, ''));
    expect(wide.stdout).not.toContain('<invalid>');
  });

  it('shows `sealion version` the concierge’s and each agent’s version, for the admin and for a user through the proxy', async () => {
    const name = 'edge-version';
    await connectedCluster(name);
    const version = async (kubeconfig: string): Promise<VersionReport> => {
      const result = await runSealion([
        'version',
        '--kubeconfig',
        kubeconfig,
        '--concierge-namespace',
        NS,
        '-o',
        'json',
      ]);
      expect(result).toMatchObject({ code: 0, stderr: '' });
      return JSON.parse(result.stdout) as VersionReport;
    };
    const protocol = formatProtocol(CURRENT_PROTOCOL);
    const conciergeVersions = [{ version: SEALION_VERSION, replicas: 1, tunnelProtocol: protocol }];
    const agent = { version: SEALION_VERSION, connected: true };

    // The admin reads it all from the hub's API server.
    const admin = await eventually(async () => {
      const report = await version(hub.kubeconfigPath);
      expect(report.errors).toBeUndefined();
      expect(report.conciergeVersions).toEqual(conciergeVersions);
      expect(report.agents?.[name]).toEqual(agent);
      return report;
    });
    expect(admin.serverVersion?.['gitVersion']).toMatch(/^v1\./);

    // A user through the proxy: the install lets everyone signed in read the concierge's versions, but grants no
    // user the Clusters. What is forbidden says so, the rest prints.
    const before = await version(userKubeconfig('/'));
    expect(before.serverVersion?.['gitVersion']).toBe(admin.serverVersion?.['gitVersion']);
    expect(before.conciergeVersions).toEqual(conciergeVersions);
    expect(before.errors).toEqual({
      agents: expect.stringMatching(/^forbidden: .*cannot list resource "clusters"/) as unknown,
    });

    // An admin who lets the user see the clusters.
    const reader = `${name}-reader`;
    for (const args of [
      ['create', 'clusterrole', reader, '--verb=list', `--resource=${CLUSTERS}`],
      ['create', 'clusterrolebinding', reader, `--clusterrole=${reader}`, `--group=${GROUP}`],
    ])
      expect(await hub.kubectl(args)).toMatchObject({ code: 0 });
    try {
      const after = await eventually(async () => {
        const report = await version(userKubeconfig('/'));
        expect(report.errors).toBeUndefined();
        return report;
      });
      expect(after.conciergeVersions).toEqual(conciergeVersions);
      expect(after.agents?.[name]).toEqual(agent);
      // Through the proxy to the agent's cluster: the server is that cluster's, the concierge and agents the hub's.
      const text = await runSealion([
        'version',
        '--kubeconfig',
        userKubeconfig(`/clusters/${name}`),
        '--concierge-namespace',
        NS,
      ]);
      expect(text).toMatchObject({ code: 0, stderr: '' });
      expect(text.stdout).toContain(`Client Version: ${SEALION_VERSION}\n`);
      expect(text.stdout).toMatch(/^Server Version: v1\.\d+/m);
      expect(text.stdout).toContain(
        `Concierge Version: ${SEALION_VERSION} (1 replica, tunnel protocol ${protocol})\n`,
      );
      expect(text.stdout).not.toContain('Warning:');
      expect(text.stdout).toContain(`  ${name}: ${SEALION_VERSION}\n`);
    } finally {
      await hub.kubectl(['delete', 'clusterrolebinding,clusterrole', reader, '--ignore-not-found']);
      await hub.kubectl([
        'delete',
        '-n',
        NS,
        'rolebinding,role',
        `${NS}-versions-reader`,
        '--ignore-not-found',
      ]);
    }
  });

  it('carries watches and an upgraded (WebSocket) connection', async () => {
    const name = 'edge-watched';
    await connectedCluster(name);
    const through = userKubeconfig(`/clusters/${name}`);
    const watch = spawn(hub.binaries.kubectl, [
      `--kubeconfig=${through}`,
      'get',
      'namespaces',
      '-w',
      '-o',
      'name',
    ]);
    let seen = '';
    watch.stdout.on('data', (c: Buffer) => (seen += c.toString()));
    try {
      await eventually(() => expect(seen).toContain('namespace/only-on-managed'));
      await managed.kubectl(['create', 'namespace', 'appears-while-watching']);
      await eventually(() => expect(seen).toContain('namespace/appears-while-watching'));
    } finally {
      await stopChild(watch);
    }

    const url = `wss://127.0.0.1:${concierge.concierge.port}/clusters/${name}/api/v1/namespaces/${AGENT_NS}/pods/echo:${backend.port}/proxy/echo`;
    const echoed = await eventually(
      () =>
        new Promise<string>((done, fail) => {
          const ws = new WebSocket(url, {
            ca: concierge.servingCA.certPem,
            headers: { authorization: `Bearer ${TOKEN}` },
          });
          ws.once('open', () => ws.send('through the tunnel'));
          ws.once('message', (data: Buffer) => {
            done(data.toString());
            ws.close();
          });
          ws.once('error', fail);
          ws.once('unexpected-response', (_req, res) =>
            fail(new Error(`upgrade refused: ${res.statusCode}`)),
          );
        }),
    );
    expect(echoed).toBe('through the tunnel');
  });

  it('keeps serving one user while another, with no RBAC, holds slow discovery reads; its own share follows an edit', async () => {
    const name = 'edge-shared';
    await connectedCluster(name);
    // A small tunnel, edited while the agent stays connected: four requests in all, two per user.
    const patch = (spec: object): Promise<unknown> =>
      hub.kubectl([
        'patch',
        'clusters.tunnel.concierge.sealion.dev',
        name,
        '--type=merge',
        '-p',
        JSON.stringify({ spec }),
      ]);
    await patch({ maxConcurrentStreams: 4, maxRequestsPerUser: 2 });
    const mallory = await issuer.mint({ username: 'mallory@example.com', groups: [] }, { expiresIn: 3600 });
    const session = http2Connect(concierge.url, { ca: concierge.servingCA.certPem });
    session.on('error', () => {});
    try {
      // OpenAPI documents are megabytes: unread, each holds its stream through the agent with backpressure. Five
      // at once: two hold her share, two wait, one is refused. Until the edit reaches the concierge's informer all
      // five are answered: those are closed again, and she tries once more.
      await eventually(async () => {
        const streams: ClientHttp2Stream[] = [];
        const statuses: number[] = [];
        for (let i = 0; i < 5; i++) {
          const stream = session.request({
            ':path': `/clusters/${name}/openapi/v2`,
            authorization: `Bearer ${mallory}`,
            accept: 'application/json',
          });
          stream.pause();
          stream.on('error', () => {});
          stream.once('response', (h) => statuses.push(Number(h[':status'])));
          streams.push(stream);
        }
        try {
          await eventually(() => expect(statuses.length).toBeGreaterThanOrEqual(3), 10_000);
          expect(statuses.filter((code) => code === 429)).toHaveLength(1);
          await eventually(() => expect(statuses.filter((code) => code === 200)).toHaveLength(2), 10_000);
        } catch (err) {
          for (const stream of streams) stream.close(http2.NGHTTP2_CANCEL);
          throw err;
        }
      }, 30_000);

      const through = userKubeconfig(`/clusters/${name}`);
      const list = await runKubectl(hub.binaries.kubectl, through, ['get', 'namespaces', '-o', 'name']);
      expect(list).toMatchObject({ code: 0 });
      expect(list.stdout).toContain('namespace/only-on-managed');
    } finally {
      session.destroy();
      await patch({ maxConcurrentStreams: null, maxRequestsPerUser: null });
    }
  }, 60_000);

  it('refuses a reused, expired or misnamed token, a foreign certificate and no certificate', async () => {
    const register = async (body: object): Promise<number> =>
      new Promise((done, fail) => {
        const req = httpsRequest(
          {
            host: '127.0.0.1',
            port: tunnelPort,
            path: '/register',
            method: 'POST',
            ca: concierge.concierge.tunnel!.caPem,
          },
          (res) => {
            res.resume();
            done(res.statusCode ?? 0);
          },
        );
        req.on('error', fail);
        req.end(JSON.stringify(body));
      });
    const name = 'edge-tokens';
    const onboarded = await onboard(name);
    const { csrPem } = await newCSR(name);
    // The token `cluster add` printed works once, as its agent's registration: the listener takes it as soon as its
    // watch of tokens has brought it.
    await eventually(async () =>
      expect(await register({ cluster: name, token: onboarded.token, csr: csrPem })).toBe(200),
    );
    expect(await register({ cluster: name, token: onboarded.token, csr: csrPem })).toBe(401);
    const expired = await createBootstrapToken(hubClients, NS, name, new Date(Date.now() - 3600_000));
    expect(await register({ cluster: name, token: expired.token, csr: csrPem })).toBe(401);
    // A wrong cluster name burns the token: the right name fails afterwards too.
    await hub.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name: 'other' },
        spec: {},
      }),
    });
    const misnamed = await createBootstrapToken(hubClients, NS, name);
    const good = await createBootstrapToken(hubClients, NS, name);
    // The listener knows tokens from its watch of them, which brings them in the order they were made: once it takes
    // the later one, it knows the earlier.
    await eventually(async () =>
      expect(await register({ cluster: name, token: good.token, csr: csrPem })).toBe(200),
    );
    expect(await register({ cluster: 'other', token: misnamed.token, csr: csrPem })).toBe(401);
    expect(await register({ cluster: name, token: misnamed.token, csr: csrPem })).toBe(401);

    expect(await dialStatus({})).toBe(401);
    const foreignCA = await newCA('not the tunnel CA');
    const foreign = await issueCert(foreignCA, { commonName: name, usage: 'client' });
    expect(await dialStatus({ cert: foreign.certPem, key: foreign.keyPem })).toBe(401);
  });

  it('answers a clean Status to a request in flight when the agent dies, and while it is gone', async () => {
    const name = 'edge-killed';
    const { onboarded, agent } = await connectedCluster(name);
    const heldBefore = backend.held();
    const inFlight = new Promise<{ status: number; body: string }>((done, fail) => {
      httpsRequest(
        {
          host: '127.0.0.1',
          port: concierge.concierge.port,
          path: `/clusters/${name}/api/v1/namespaces/${AGENT_NS}/pods/echo:${backend.port}/proxy/hang`,
          ca: concierge.servingCA.certPem,
          headers: { authorization: `Bearer ${TOKEN}` },
        },
        (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () => done({ status: res.statusCode ?? 0, body }));
        },
      )
        .on('error', fail)
        .end();
    });
    // The request has crossed the hub, the tunnel and the API server to the backend, which holds it.
    await eventually(() => expect(backend.held()).toBeGreaterThan(heldBefore));
    await stopAgent(agent, 'SIGKILL');
    const answer = await inFlight;
    expect(answer.status).toBe(502);
    expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 502, reason: 'BadGateway' });

    await eventually(async () => expect((await clusterStatus(name))['connected']).toBe(false));
    const through = userKubeconfig(`/clusters/${name}`);
    const gone = await runKubectl(hub.binaries.kubectl, through, ['get', 'namespaces']);
    expect(gone.code).not.toBe(0);
    expect(gone.stderr).toContain(`cluster ${name} is not connected`);

    // Registered already: the restarted agent needs no token, and it comes back within 10 s.
    await startAgentProcess(onboarded, '');
    await eventually(async () => {
      const back = await runKubectl(hub.binaries.kubectl, through, ['get', 'namespaces', '-o', 'name']);
      expect(back).toMatchObject({ code: 0 });
    }, 10_000);
  });

  it('reconnects on its own when the concierge restarts', async () => {
    const name = 'edge-reconnects';
    await connectedCluster(name);
    await concierge.stop();
    // The port the agents dial: another process may have taken it since (any server binding port 0), for a while.
    concierge = await retryWhileAddressInUse(() =>
      startLocalConcierge(hub, { tunnel: { port: tunnelPort, namespace: NS } }),
    );
    await eventually(async () => {
      const back = await runKubectl(hub.binaries.kubectl, userKubeconfig(`/clusters/${name}`), [
        'get',
        'namespaces',
        '-o',
        'name',
      ]);
      expect(back).toMatchObject({ code: 0 });
    }, 45_000);
  }, 60_000);

  it('renews its certificate over mutual TLS once two thirds of its life have passed', async () => {
    await hub.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name: 'edge-2' },
        spec: {},
      }),
    });
    const { token } = await createBootstrapToken(hubClients, NS, 'edge-2');
    const saved: AgentCredentials[] = [];
    // The agent's own clock, ahead of the real one by `ahead`; its pauses take real time.
    let ahead = 0;
    const clock: Clock = { ...systemClock, now: () => Date.now() + ahead };
    const start = async (): Promise<Agent> => {
      const agent = newAgent({
        // One hub replica here: one tunnel.
        tunnels: 1,
        cluster: 'edge-2',
        hub: new URL(`https://127.0.0.1:${tunnelPort}`),
        trust: { caPem: concierge.concierge.tunnel!.caPem },
        bootstrapToken: () => token,
        store: {
          load: () => Promise.resolve(saved.at(-1)),
          save: (c) => Promise.resolve(void saved.push(c)),
        },
        upstream: agentUpstream(agentKubeconfig),
        version: 'test',
        log: silentLogger(),
        clock,
      });
      await agent.start();
      return agent;
    };
    let edge2 = await start();
    // An agent left running after a failure would keep redialling, and keep Jest from exiting.
    try {
      await eventually(() => expect(edge2.connected()).toBe(true));
      await edge2.stop();
      expect(saved).toHaveLength(1);

      // 61 of its 90 days later, the next start renews before it connects.
      ahead = 61 * 24 * 3600 * 1000;
      edge2 = await start();
      await eventually(() => expect(edge2.connected()).toBe(true));
    } finally {
      await edge2.stop();
    }
    expect(saved).toHaveLength(2);
    const [first, renewed] = saved.map((c) => new X509Certificate(c.certPem));
    expect(renewed!.subject).toBe('CN=edge-2');
    expect(renewed!.serialNumber).not.toBe(first!.serialNumber);
    expect(saved[1]!.keyPem).not.toBe(saved[0]!.keyPem);
  });

  it('refuses an agent outside the tunnel protocol’s skew policy, in its log and its Cluster’s status, and takes it once within', async () => {
    const name = 'edge-skew';
    await hub.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name },
        spec: {},
      }),
    });
    const { token } = await createBootstrapToken(hubClients, NS, name);
    const saved: AgentCredentials[] = [];
    let logged = '';
    const log = newLogger({
      destination: new Writable({
        write(chunk: Buffer, _enc, next) {
          logged += chunk.toString();
          next();
        },
      }),
    });
    /** An agent of this build that claims `protocol` (the option no flag reaches), or its own. */
    const start = async (protocol?: { major: number; minor: number }): Promise<Agent> => {
      const agent = newAgent({
        tunnels: 1,
        cluster: name,
        hub: new URL(`https://127.0.0.1:${tunnelPort}`),
        trust: { caPem: concierge.concierge.tunnel!.caPem },
        bootstrapToken: () => token,
        store: {
          load: () => Promise.resolve(saved.at(-1)),
          save: (c) => Promise.resolve(void saved.push(c)),
        },
        upstream: agentUpstream(agentKubeconfig),
        version: 'test',
        log,
        ...(protocol ? { protocol } : {}),
      });
      await agent.start();
      return agent;
    };
    const condition = async (): Promise<Record<string, unknown> | undefined> =>
      ((await clusterStatus(name))['conditions'] as Record<string, unknown>[] | undefined)?.find(
        (c) => c['type'] === 'AgentProtocolSupported',
      );
    const why =
      'the agent speaks tunnel protocol 3.0 and the hub 2.1, which serves agents of 2.0 to 2.2: upgrade the hub';
    let agent = await start({ major: 3, minor: 0 });
    // An agent left running after a failure would keep redialling, and keep Jest from exiting.
    try {
      await eventually(() => {
        const refused = logged
          .split('\n')
          .filter(Boolean)
          .map((line) => JSON.parse(line) as Record<string, unknown>)
          .filter((line) => line['msg'] === 'tunnel refused');
        expect(refused[0]).toMatchObject({ problem: why });
      });
      await eventually(async () =>
        expect(await condition()).toMatchObject({
          status: 'False',
          reason: 'OutsideSkewPolicy',
          message: why,
        }),
      );
      expect(agent.connected()).toBe(false);
      expect((await clusterStatus(name))['connected']).not.toBe(true);
      await agent.stop();

      // The same agent, within the policy: its tunnel comes up, and the condition says so.
      agent = await start();
      await eventually(() => expect(agent.connected()).toBe(true));
      await eventually(async () =>
        expect(await condition()).toMatchObject({ status: 'True', reason: 'WithinSkewPolicy' }),
      );
    } finally {
      await agent.stop();
    }
  });

  it('closes a tunnel when the certificate it was opened with expires', async () => {
    // An agent of its own (the real tunnel library, answering pings) for another registered cluster, with a
    // certificate from the tunnel CA that lives a few seconds. Nothing but the expiry can end its tunnel.
    const name = 'short-lived';
    await hub.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name },
        spec: {},
      }),
    });
    const secret = (await readSecretData(hubClients, NS, TUNNEL_CA_SECRET))!;
    const tunnelCA = await loadCA(secret['tls.crt']!, secret['tls.key']!);
    const uid = (await hub.kubectl(['get', CLUSTERS, name, '-o', 'jsonpath={.metadata.uid}'])).stdout;
    const cert = await issueCert(tunnelCA, {
      commonName: name,
      uris: [bindingURI({ cluster: name, uid, generation: 0 })],
      usage: 'client',
      validityMs: 4_000,
    });
    const ws = dialTunnel({ cert: cert.certPem, key: cert.keyPem });
    await new Promise((done, fail) => {
      ws.once('open', done);
      ws.once('error', fail);
    });
    const agentEnd = serveTunnel(createWebSocketStream(ws), { connect: (stream) => stream.destroy() });
    await eventually(async () => expect((await clusterStatus(name))['connected']).toBe(true));
    await agentEnd.closed;
    await eventually(async () => expect((await clusterStatus(name))['connected']).toBe(false));
    // The same certificate cannot open another.
    expect(await dialStatus({ cert: cert.certPem, key: cert.keyPem })).toBe(401);
  }, 30_000);

  it('refuses the certificate of a deleted Cluster to a new Cluster of the same name', async () => {
    const name = 'reborn';
    await applyCluster(name);
    const earlier = await eventually(async () =>
      registerWith(name, (await createBootstrapToken(hubClients, NS, name)).token),
    );
    await eventually(async () => expect(await dialStatus(earlier)).toBe(101));
    expect(await renewStatus(earlier)).toBe(200);

    const deleted = await hub.kubectl(['delete', CLUSTERS, name]);
    expect(deleted).toMatchObject({ code: 0 });
    await applyCluster(name);
    // Once the hub knows the new Cluster (its own agent gets in), the earlier one's certificate does not.
    const { token } = await createBootstrapToken(hubClients, NS, name);
    const current = await eventually(() => registerWith(name, token));
    await eventually(async () => expect(await dialStatus(current)).toBe(101));
    expect(await dialStatus(earlier)).toBe(401);
    expect(await renewStatus(earlier)).toBe(401);
  });

  it('re-onboards with `cluster add` on an existing name: the earlier certificate is refused at once', async () => {
    const name = 'edge-again';
    const { onboarded, agent } = await connectedCluster(name);
    const earlier = await agentCertificate(name);
    const again = await onboard(name);
    // The running agent's tunnel closes, and its certificate opens no other and renews no more.
    await untilDisconnected(name);
    expect(await dialStatus(earlier)).toBe(401);
    expect(await renewStatus(earlier)).toBe(401);

    // The agent restarted with the new token: refused with its stored certificate, it registers again.
    await stopAgent(agent);
    await startAgentProcess(onboarded, again.token);
    await untilReachable(name);
    expect((await agentCertificate(name)).cert).not.toBe(earlier.cert);
  });

  it('revokes a cluster’s certificates and unredeemed tokens with `cluster revoke`, closing its tunnel', async () => {
    const name = 'edge-revoked';
    await connectedCluster(name);
    const current = await agentCertificate(name);
    expect(await renewStatus(current)).toBe(200);
    const pending = await createBootstrapToken(hubClients, NS, name);

    const revoked = await sealionOnHub(['cluster', 'revoke', name]);
    expect(revoked).toMatchObject({ code: 0 });
    await untilDisconnected(name);
    expect(await renewStatus(current)).toBe(401);
    expect(await dialStatus(current)).toBe(401);
    const { csrPem } = await newCSR(name);
    expect((await postTunnel('/register', { cluster: name, token: pending.token, csr: csrPem })).status).toBe(
      401,
    );
  });

  it('refuses a cluster removed from the registry, closing its tunnel', async () => {
    const name = 'edge-removed';
    await connectedCluster(name);
    const removed = await sealionOnHub(['cluster', 'remove', name]);
    expect(removed).toMatchObject({ code: 0 });
    await untilDisconnected(name);
  });
});
