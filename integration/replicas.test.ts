// Two concierge replicas on one hub, each holding tunnels of its own: the Clusters' status is what the live
// replicas hold, neither replica's writes undo the other's, and the tunnels of a replica that is killed (no clean
// stop, no last write) show disconnected within seconds. And a concierge that is still starting answers a
// request for a cluster with a Status, never a 500.
import { IMPERSONATOR_SERVICE_ACCOUNT } from '../apis/install.ts';
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request as httpsRequest } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newAgent, type Agent } from '../agent/agent.ts';
import { newSecretCredentialStore } from '../agent/credentials.ts';
import type { ClusterStatus } from '../apis/tunnel.ts';
import { addCluster } from '../cli/cluster.ts';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { newKubeClients, type KubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { freePort, startCluster, type Cluster } from '../dev/cluster.ts';
import { prepareConcierge, startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { clusterStatus as clusterStatusOf } from './harness/cluster-status.ts';
import { startConciergeProcess, type ConciergeProcess } from './harness/concierge-process.ts';
import { retryWhileAddressInUse } from './harness/ports.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';

let hub: Cluster;
let managed: Cluster;
let hubClients: KubeClients;
let managedClients: KubeClients;
let agentKubeconfig: string;
let dir: string;
/** How to stop what the current test started (its replicas and agents), run in the reverse order after it. */
const cleanups: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-replicas-'));
  [hub, managed] = await Promise.all([
    startCluster({ name: 'replicas-hub', controllerManager: false }),
    startCluster({ name: 'replicas-managed', controllerManager: false }),
  ]);
  hubClients = newKubeClients({ path: hub.kubeconfigPath });
  managedClients = newKubeClients({ path: managed.kubeconfigPath });
  agentKubeconfig = await prepareAgentCluster(managed, AGENT_NS);
}, 180_000);

afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

afterAll(async () => {
  await Promise.all([hub?.stop(), managed?.stop()]);
  rmSync(dir, { recursive: true, force: true });
});

/** An agent of `cluster` on the managed cluster, started, dialing the tunnel listener on `port`. */
async function agentFor(
  cluster: string,
  port: number,
  trust: { pin: string },
  token: string,
  store: string,
): Promise<Agent> {
  const agent = newAgent({
    // Each agent dials one replica's own port: one tunnel.
    tunnels: 1,
    cluster,
    hub: new URL(`https://127.0.0.1:${port}`),
    trust,
    bootstrapToken: () => token,
    store: newSecretCredentialStore(managedClients, AGENT_NS, store),
    upstream: agentUpstream(agentKubeconfig),
    version: 'replicas-test',
    log: silentLogger(),
  });
  cleanups.push(() => agent.stop());
  await agent.start();
  return agent;
}

/** A replica of the concierge in this process, with a tunnel listener; stopped after the test. */
async function localReplica(identity: string): Promise<LocalConcierge> {
  const replica = await startLocalConcierge(hub, { tunnel: { port: 0, namespace: NS }, identity });
  cleanups.push(() => replica.stop());
  return replica;
}

/** A replica of the concierge in a process of its own (to be killed), with a tunnel listener; stopped after the test. */
async function replicaProcess(identity: string): Promise<ConciergeProcess> {
  const replica = await startConciergeProcess(hub, { tunnel: { port: 0, namespace: NS }, identity });
  cleanups.push(() => replica.stop());
  return replica;
}

/** Registers `cluster` with the hub, as `sealion cluster add` does: the pin of the tunnel CA and a bootstrap token. */
const register = (cluster: string): ReturnType<typeof addCluster> =>
  addCluster(cluster, {
    kubeconfig: hub.kubeconfigPath,
    namespace: NS,
    groupSuffix: 'sealion.dev',
    hub: '',
    description: '',
  });

/** The replica Leases in the concierge's namespace, by name. */
const replicaLeases = async (): Promise<string> =>
  (
    await hub.kubectl([
      'get',
      'leases',
      '-n',
      NS,
      '-l',
      'app.kubernetes.io/component=concierge-replica',
      '-o',
      'name',
    ])
  ).stdout;

const clusterStatus = (name: string): Promise<ClusterStatus> => clusterStatusOf(hub, name);

const holders = (status: ClusterStatus): string[] => (status.tunnels ?? []).map((t) => t.replica).sort();

describe('the Cluster status with two replicas', () => {
  it("keeps each replica's tunnels, and shows a killed replica's tunnels disconnected within seconds", async () => {
    const replicaA = await localReplica('replica-a');
    const replicaB = await replicaProcess('replica-b');
    const portA = replicaA.concierge.tunnel!.port;
    const portB = replicaB.tunnel!.port;
    // `shared` has an agent on each replica; `only-b` only one, on the replica that will be killed.
    const shared = await register('shared');
    const onlyB = await register('only-b');
    const second = await createBootstrapToken(hubClients, NS, 'shared');
    const viaA = await agentFor('shared', portA, shared, shared.token, 'shared-a');
    const viaB = await agentFor('shared', portB, shared, second.token, 'shared-b');
    const onlyViaB = await agentFor('only-b', portB, onlyB, onlyB.token, 'only-b');
    await eventually(() =>
      expect([viaA, viaB, onlyViaB].map((a) => a.connected())).toEqual([true, true, true]),
    );
    await eventually(async () => {
      expect(holders(await clusterStatus('shared'))).toEqual(['replica-a', 'replica-b']);
      expect(await clusterStatus('shared')).toMatchObject({ connected: true, agentVersion: 'replicas-test' });
      expect(await clusterStatus('only-b')).toMatchObject({
        connected: true,
        tunnels: [{ replica: 'replica-b' }],
      });
    });

    // Both replicas keep renewing their Leases (an update the API server refuses would leave them unchanged, and
    // each replica would then remove the other's entries again and again).
    const version = async (replica: string): Promise<string> =>
      (
        await hub.kubectl([
          'get',
          'lease',
          '-n',
          NS,
          `sealion-concierge-replica-${replica}`,
          '-o',
          'jsonpath={.metadata.resourceVersion}',
        ])
      ).stdout;
    for (const replica of ['replica-a', 'replica-b']) {
      const before = await version(replica);
      await eventually(async () => expect(await version(replica)).not.toBe(before));
    }
    expect(holders(await clusterStatus('shared'))).toEqual(['replica-a', 'replica-b']);

    // Killed: no clean stop, so nothing of replica B's removes its entries but the other replica.
    const killed = Date.now();
    process.kill(replicaB.pid, 'SIGKILL');
    await eventually(async () => {
      const status = await clusterStatus('only-b');
      expect(status.connected).toBe(false);
      expect(holders(status)).toEqual([]);
    }, 30_000);
    const seconds = (Date.now() - killed) / 1000;
    process.stderr.write(`a killed replica's tunnel showed disconnected after ${seconds.toFixed(1)} s\n`);
    // The live replica's entry is untouched, and the shared cluster stays connected through it.
    const after = await clusterStatus('shared');
    expect(holders(after)).toEqual(['replica-a']);
    expect(after.connected).toBe(true);
  }, 120_000);

  it('removes its entries when a replica stops cleanly', async () => {
    const replica = await localReplica('replica-c');
    const added = await register('clean-stop');
    const agent = await agentFor(
      'clean-stop',
      replica.concierge.tunnel!.port,
      added,
      added.token,
      'clean-stop',
    );
    await eventually(() => expect(agent.connected()).toBe(true));
    await eventually(async () => {
      expect(holders(await clusterStatus('clean-stop'))).toEqual(['replica-c']);
      expect(await replicaLeases()).toContain('sealion-concierge-replica-replica-c');
    });

    await replica.stop();
    await eventually(async () => {
      const status = await clusterStatus('clean-stop');
      expect(status.connected).toBe(false);
      expect(holders(status)).toEqual([]);
    });
    // The stopped replica's Lease is gone. (A killed replica's goes once a live replica has seen it lapse for twice
    // its duration; none is left here to see it.)
    expect(await replicaLeases()).not.toContain('sealion-concierge-replica-replica-c');
  }, 60_000);
});

describe('the identity the tests run the concierge as', () => {
  it('is its service account, with the RBAC of the install manifests and nothing more', async () => {
    const file = join(dir, 'concierge.kubeconfig');
    writeFileSync(file, await prepareConcierge(hub, NS), { mode: 0o600 });
    const as = (args: string[]): Promise<string> =>
      hub.kubectl(['--kubeconfig', file, ...args]).then((r) => r.stdout.trim());
    expect(await as(['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'])).toBe(
      `system:serviceaccount:${NS}:sealion-concierge`,
    );
    // What it needs, in its namespace and for its kinds…
    expect(await as(['auth', 'can-i', 'update', 'leases', '-n', NS])).toBe('yes');
    expect(
      await as(['auth', 'can-i', 'patch', 'clusters.tunnel.concierge.sealion.dev', '--subresource=status']),
    ).toBe('yes');
    // …and nothing an administrator has: not another namespace's Secrets, not RBAC, not other accounts' tokens.
    expect(await as(['auth', 'can-i', 'get', 'secrets', '-n', 'kube-system'])).toBe('no');
    expect(await as(['auth', 'can-i', 'create', 'clusterrolebindings'])).toBe('no');
    const token = (account: string): string[] => [
      'auth',
      'can-i',
      'create',
      `serviceaccounts/${account}`,
      '--subresource=token',
      '-n',
      NS,
    ];
    expect(await as(token(IMPERSONATOR_SERVICE_ACCOUNT))).toBe('yes');
    expect(await as(token('default'))).toBe('no');
  }, 60_000);
});

describe('a concierge that is still starting', () => {
  it('answers a request for a cluster with a Status, never a 500', async () => {
    // A user with a client certificate: authenticated without any authenticator having to load first.
    const signerCA = await newCA('starting-signer');
    const user = await issueCert(signerCA, { commonName: 'starting-user', usage: 'client' });
    /** The answers to requests sent as fast as they are answered, from before the listener opens until it has started. */
    const whileStarting = async (port: number): Promise<{ status: number; kind: string }[]> => {
      const answers: { status: number; kind: string }[] = [];
      let started = false;
      const ask = (): Promise<void> =>
        new Promise((done) => {
          const req = httpsRequest(
            {
              host: '127.0.0.1',
              port,
              path: '/clusters/starting/api',
              rejectUnauthorized: false,
              cert: user.certPem,
              key: user.keyPem,
              agent: false,
            },
            (res) => {
              let body = '';
              res.setEncoding('utf8').on('data', (c: string) => (body += c));
              res.on('end', () => {
                let kind: string;
                try {
                  kind = (JSON.parse(body) as { kind?: string }).kind ?? '';
                } catch {
                  kind = body.slice(0, 80);
                }
                answers.push({ status: res.statusCode ?? 0, kind });
                done();
              });
            },
          );
          req.on('error', () => done());
          // Whoever else may hold the port need not answer at all.
          req.setTimeout(10_000, () => req.destroy());
          req.end();
        });
      const asking = (async () => {
        while (!started) await ask();
      })();
      try {
        const concierge = await startLocalConcierge(hub, {
          port,
          signerCA,
          tunnel: { port: 0, namespace: 'starting' },
        });
        await concierge.stop();
      } finally {
        started = true;
        await asking;
      }
      return answers;
    };
    // The port is asked before anything listens on it, so it is picked beforehand, and another process may bind it
    // first: then the concierge's start fails with EADDRINUSE, and the test starts again on another port, leaving out
    // what the other process answered.
    const answers = await retryWhileAddressInUse(async () => whileStarting(await freePort()));
    expect(answers.length).toBeGreaterThan(0);
    for (const answer of answers) expect(answer).toEqual({ status: 503, kind: 'Status' });
  }, 60_000);
});
