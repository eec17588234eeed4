// A replica that stops hands its tunnels over: three concierge replicas on one hub, behind one load-balanced tunnel
// address, and a real agent holding two tunnels. While requests for its cluster flow through the replica that stays,
// the other replica stops cleanly (which hands its tunnels over first: refuses new dials, withdraws its facts, asks the
// agent to move); no request fails, the Cluster never shows disconnected, and the agent holds two tunnels again, on the
// replica that stays and the replacement, or one while only one replica lives.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { createInterface } from 'node:readline';
import { newAgent, type Agent } from '../agent/agent.ts';
import { newSecretCredentialStore } from '../agent/credentials.ts';
import { addCluster } from '../cli/cluster.ts';
import { newKubeClients, type KubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startTcpBalancer, type TcpBalancer } from '../dev/tcp-balancer.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const CLUSTER = 'moving';
const USER_GROUP = 'handover-testers';

let hub: Cluster;
let managed: Cluster;
let managedClients: KubeClients;
let signer: CertificateAuthority;
let balancer: TcpBalancer | undefined;
let agent: Agent | undefined;
/** The replicas running now, by name; a replica stays here (and behind the balancer) until its stop has returned. */
const replicas = new Map<string, LocalConcierge>();

/** A replica of the concierge in this process, with a tunnel listener; its clean stop hands its tunnels over. */
async function startReplica(identity: string): Promise<void> {
  replicas.set(
    identity,
    await startLocalConcierge(hub, { tunnel: { port: 0, namespace: NS }, identity, signerCA: signer }),
  );
}

async function stopReplica(identity: string): Promise<void> {
  await replicas.get(identity)?.stop();
  replicas.delete(identity);
}

beforeAll(async () => {
  [hub, managed] = await Promise.all([
    startCluster({ name: 'handover-hub', controllerManager: false }),
    startCluster({ name: 'handover-managed', controllerManager: false }),
  ]);
  managedClients = newKubeClients({ path: managed.kubeconfigPath });
  const agentKubeconfig = await prepareAgentCluster(managed, AGENT_NS);
  const granted = await managed.kubectl([
    'create',
    'clusterrolebinding',
    USER_GROUP,
    '--clusterrole=cluster-admin',
    `--group=${USER_GROUP}`,
  ]);
  if (granted.code !== 0) throw new Error(granted.stderr);
  signer = await newCA('handover-test users');
  // One replica first, so that the tunnel CA is made once.
  await startReplica('handover-a');
  await startReplica('handover-b');
  // The replicas' tunnel listeners behind one address, as a Service's load balancer puts them.
  balancer = await startTcpBalancer(() => [...replicas.values()].map((r) => r.concierge.tunnel!.port));
  const added = await addCluster(CLUSTER, {
    kubeconfig: hub.kubeconfigPath,
    namespace: NS,
    groupSuffix: 'sealion.dev',
    hub: '',
    description: '',
  });
  agent = newAgent({
    cluster: CLUSTER,
    hub: new URL(`https://127.0.0.1:${balancer.port}`),
    trust: { pin: added.pin },
    bootstrapToken: () => added.token,
    store: newSecretCredentialStore(managedClients, AGENT_NS, `${CLUSTER}-credentials`),
    upstream: agentUpstream(agentKubeconfig),
    version: 'handover-test',
    log: silentLogger(),
    tunnels: 2,
  });
  await agent.start();
}, 240_000);

afterAll(async () => {
  await agent?.stop();
  for (const identity of [...replicas.keys()]) await stopReplica(identity);
  await balancer?.stop();
  await Promise.all([hub?.stop(), managed?.stop()]);
});

/**
 * Requests for the cluster through `replica`, one after another until `stop`: each answer's status, and what any
 * failure said.
 */
function requestLoop(replica: LocalConcierge, user: { certPem: string; keyPem: string }) {
  const keepAlive = new HttpsAgent({ keepAlive: true, maxSockets: 1 });
  const counts = { ok: 0, failed: [] as string[] };
  let running = true;
  const once = (): Promise<void> =>
    new Promise((done) => {
      const req = httpsRequest(
        {
          host: '127.0.0.1',
          port: replica.concierge.port,
          path: `/clusters/${CLUSTER}/api/v1/namespaces/kube-system`,
          rejectUnauthorized: false,
          cert: user.certPem,
          key: user.keyPem,
          agent: keepAlive,
        },
        (res) => {
          let body = '';
          res.setEncoding('utf8').on('data', (c: string) => (body += c));
          res.on('end', () => {
            if (res.statusCode === 200) counts.ok++;
            else counts.failed.push(`${res.statusCode}: ${body.slice(0, 200)}`);
            done();
          });
        },
      );
      req.on('error', (err) => {
        counts.failed.push(err.message);
        done();
      });
      req.end();
    });
  const loop = (async () => {
    while (running) await once();
  })();
  return {
    counts,
    async stop() {
      running = false;
      await loop;
      keepAlive.destroy();
    },
  };
}

/** `kubectl get -w` of the Cluster: every state its status passes through, as `connected replicas`. */
function watchCluster(): { states: string[]; stop(): void } {
  const states: string[] = [];
  const child: ChildProcess = spawn(
    hub.binaries.kubectl,
    [
      '--kubeconfig',
      hub.kubeconfigPath,
      'get',
      'clusters.tunnel.concierge.sealion.dev',
      CLUSTER,
      '--watch',
      '-o',
      'jsonpath={.status.connected} {.status.replicas}{"\\n"}',
    ],
    { stdio: ['ignore', 'pipe', 'ignore'] },
  );
  createInterface({ input: child.stdout! }).on('line', (line) => states.push(line.trim()));
  return { states, stop: () => void child.kill() };
}

const sorted = (names: string[]): string[] => [...names].sort();

/**
 * A watch of ConfigMaps through `replica` that the API server ends after `seconds`: resolves once its answer has begun
 * (so it is in flight on the replica's tunnel), with how it ended: `ended` for a whole answer, else what cut it.
 */
function watchThrough(
  replica: LocalConcierge,
  user: { certPem: string; keyPem: string },
  seconds: number,
): Promise<{ status: number; ended: Promise<string> }> {
  return new Promise((begun, fail) => {
    const req = httpsRequest(
      {
        host: '127.0.0.1',
        port: replica.concierge.port,
        path: `/clusters/${CLUSTER}/api/v1/namespaces/default/configmaps?watch=1&timeoutSeconds=${seconds}`,
        rejectUnauthorized: false,
        cert: user.certPem,
        key: user.keyPem,
        agent: false,
      },
      (res) => {
        const ended = new Promise<string>((done) => {
          res.on('end', () => done('ended'));
          res.on('aborted', () => done('aborted'));
          res.on('error', (err) => done(err.message));
        });
        res.resume();
        begun({ status: res.statusCode ?? 0, ended });
      },
    );
    req.on('error', fail);
    req.end();
  });
}

describe('a replica that stops while a cluster is used through another', () => {
  it('hands its tunnel over: no request fails, the cluster never shows disconnected, and the agent moves', async () => {
    await eventually(() => expect(sorted(agent!.replicas())).toEqual(['handover-a', 'handover-b']), 90_000);
    const issued = await issueCert(signer, {
      commonName: 'hana',
      organizations: [USER_GROUP],
      usage: 'client',
    });
    const watch = watchCluster();
    const loop = requestLoop(replicas.get('handover-a')!, issued);
    try {
      await eventually(() => expect(watch.states).toContain('true handover-a,handover-b'), 30_000);
      await eventually(() => expect(loop.counts.ok).toBeGreaterThan(10), 30_000);
      // The replacement first, as a surge-first rollout starts it; then the old replica stops, with a watch in flight
      // on its tunnel, which the move does not cut: the API server ends it at its timeout, as it would have anyway.
      await startReplica('handover-c');
      const inFlight = await watchThrough(replicas.get('handover-b')!, issued, 4);
      expect(inFlight.status).toBe(200);
      await stopReplica('handover-b');
      expect(await inFlight.ended).toBe('ended');
      await eventually(() => expect(sorted(agent!.replicas())).toEqual(['handover-a', 'handover-c']), 60_000);
      await eventually(() => expect(watch.states).toContain('true handover-a,handover-c'), 30_000);
      // And with only one replica left, the agent holds one tunnel, to it.
      const before = loop.counts.ok;
      await stopReplica('handover-c');
      await eventually(() => expect(agent!.replicas()).toEqual(['handover-a']), 30_000);
      await eventually(() => expect(watch.states).toContain('true handover-a'), 30_000);
      await eventually(() => expect(loop.counts.ok).toBeGreaterThan(before + 10), 30_000);
    } finally {
      await loop.stop();
      watch.stop();
    }
    process.stderr.write(
      `handover: ${loop.counts.ok} requests through the replica that stayed, ${loop.counts.failed.length} failed; ` +
        `the Cluster's status went through ${JSON.stringify(watch.states)}\n`,
    );
    expect(loop.counts.failed).toEqual([]);
    expect(watch.states.filter((s) => !s.startsWith('true'))).toEqual([]);
    expect(agent!.connected()).toBe(true);
  }, 300_000);
});
