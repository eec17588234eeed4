// Access-request grants on real API servers: a hub with two concierge replicas (their AccessGrants a small one of the
// test's own, standing in for the approved AccessRequests), an edge reached through its agent's tunnel to one of them,
// and from the other over the peer hop. A user edge's RBAC gives nothing is refused; with a grant of edge's group
// `oncall` they list what that group may, and edge's own audit log shows the grant's group, its reason and its name on
// the impersonated user; when the grant ends, their open watch ends and the next request is refused. A cluster that
// requires a reason refuses a request without one. On the hub's own API, a grant there applies the same way, and the
// hub's own audit log shows it.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { readFileSync } from 'node:fs';
import { request, type RequestOptions } from 'node:https';
import { newAgent, type Agent, type AgentCredentials } from '../agent/agent.ts';
import { ACCESS_REQUEST_EXTRA, REASON_EXTRA } from '../apis/access.ts';
import type { AccessGrants, Grant } from '../concierge/access/grants.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { createBootstrapToken } from '../lib/kube/bootstrap.ts';
import { newKubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert } from '../lib/pki/pki.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const EDGE = 'edge';
const CONFIGMAPS = `/clusters/${EDGE}/api/v1/namespaces/default/configmaps`;

/** The grants the concierge applies: set and ended by the tests, as the AccessRequests' informer would. */
function testGrants() {
  const held = new Map<string, Grant[]>();
  const requiring = new Set<string>();
  const listeners = new Set<(name: string, why: string) => void>();
  const grants: AccessGrants = {
    active: (username, cluster) => held.get(`${username}\n${cluster}`) ?? [],
    reasonRequired: (cluster) => requiring.has(cluster),
    onEnded(ended) {
      listeners.add(ended);
      return () => void listeners.delete(ended);
    },
  };
  return {
    grants,
    give: (username: string, cluster: string, grant: Grant) => held.set(`${username}\n${cluster}`, [grant]),
    require: (cluster: string) => void requiring.add(cluster),
    end(name: string, why: string) {
      for (const [key, list] of held)
        held.set(
          key,
          list.filter((g) => g.name !== name),
        );
      for (const ended of [...listeners]) ended(name, why);
    },
  };
}

const granted = testGrants();
let hub: Cluster;
let edge: Cluster;
let concierge: LocalConcierge;
/** The replica without edge's tunnel: its requests for edge go over the peer hop, decided here. */
let other: LocalConcierge;
let agent: Agent | undefined;

interface Answer {
  status: number;
  body: string;
  auditId: string;
}

/** A user's client certificate from the concierge's signer: how a Sealion user signs in. */
async function userCert(name: string): Promise<Pick<RequestOptions, 'cert' | 'key'>> {
  const issued = await issueCert(concierge.signerCA, {
    commonName: name,
    organizations: ['dev'],
    usage: 'client',
  });
  return { cert: issued.certPem, key: issued.keyPem };
}

function get(
  user: Pick<RequestOptions, 'cert' | 'key'>,
  path: string,
  via: LocalConcierge = concierge,
): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = request(
      new URL(path, via.url),
      { ca: via.servingCA.certPem, agent: false, ...user },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (body += c));
        res.on('end', () =>
          done({ status: res.statusCode ?? 0, body, auditId: String(res.headers['audit-id'] ?? '') }),
        );
      },
    );
    req.on('error', fail);
    req.end();
  });
}

/** A watch: its text so far, and how it ended (its response complete or not). */
function watch(user: Pick<RequestOptions, 'cert' | 'key'>, path: string, via: LocalConcierge) {
  let text = '';
  let status = 0;
  const ended = new Promise<{ complete: boolean }>((done, fail) => {
    const req = request(
      new URL(path, via.url),
      { ca: via.servingCA.certPem, agent: false, ...user },
      (res) => {
        status = res.statusCode ?? 0;
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.once('end', () => done({ complete: res.complete }));
        res.once('error', fail);
      },
    );
    req.once('error', fail);
    req.end();
  });
  return { ended, text: () => text, status: () => status };
}

interface EdgeEvent {
  auditID: string;
  stage: string;
  impersonatedUser?: { username?: string; groups?: string[]; extra?: Record<string, string[]> };
}

/** A cluster's own audit events for the audit ID, once it wrote them. */
const eventsOf = (auditId: string, cluster: Cluster = edge): EdgeEvent[] =>
  readFileSync(cluster.auditLogPath, 'utf8')
    .split('\n')
    .filter((line) => line.includes(auditId))
    .map((line) => JSON.parse(line) as EdgeEvent);

beforeAll(async () => {
  [hub, edge] = await Promise.all([
    startCluster({ name: 'access-hub', controllerManager: false }),
    startCluster({ name: 'access-edge', controllerManager: false }),
  ]);
  await hub.kubectl(['create', 'namespace', NS]);
  // The hub's admin, too: the group oncall reads ConfigMaps there.
  for (const args of [
    ['create', 'clusterrole', 'configmap-reader', '--verb=get,list,watch', '--resource=configmaps'],
    ['create', 'clusterrolebinding', 'oncall-reads', '--clusterrole=configmap-reader', '--group=oncall'],
  ]) {
    const result = await hub.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  concierge = await startLocalConcierge(hub, { tunnel: { port: 0, namespace: NS }, grants: granted.grants });
  const added = await hub.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
      kind: 'Cluster',
      metadata: { name: EDGE },
      spec: {},
    }),
  });
  if (added.code !== 0) throw new Error(`kubectl apply: ${added.stderr}`);
  const { token } = await createBootstrapToken(newKubeClients({ path: hub.kubeconfigPath }), NS, EDGE);
  // Edge's admin: its agent forwards as the default policy allows; the group oncall reads ConfigMaps, nothing else.
  const agentKubeconfig = await prepareAgentCluster(edge, AGENT_NS);
  for (const args of [
    ['create', 'clusterrole', 'configmap-reader', '--verb=get,list,watch', '--resource=configmaps'],
    ['create', 'clusterrolebinding', 'oncall-reads', '--clusterrole=configmap-reader', '--group=oncall'],
    ['-n', 'default', 'create', 'configmap', 'seen-on-edge', '--from-literal=a=b'],
  ]) {
    const result = await edge.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  const saved: AgentCredentials[] = [];
  agent = newAgent({
    tunnels: 1,
    cluster: EDGE,
    hub: new URL(`https://127.0.0.1:${concierge.concierge.tunnel!.port}`),
    trust: { caPem: concierge.concierge.tunnel!.caPem },
    bootstrapToken: () => token,
    store: { load: () => Promise.resolve(saved.at(-1)), save: (c) => Promise.resolve(void saved.push(c)) },
    upstream: agentUpstream(agentKubeconfig),
    version: 'test',
    log: silentLogger(),
  });
  await agent.start();
  await eventually(() => expect(agent!.connected()).toBe(true), 30_000);
  other = await startLocalConcierge(hub, {
    tunnel: { port: 0, namespace: NS },
    identity: 'other',
    signerCA: concierge.signerCA,
    grants: granted.grants,
  });
  // Once the other replica reads who holds edge's tunnel, it sends there over the peer hop.
  const admin = await userCert('nobody');
  await eventually(async () => {
    const answer = await get(admin, CONFIGMAPS, other);
    expect(answer.status).toBe(403);
    expect(answer.body).toContain('User \\"nobody\\" cannot list resource');
  }, 60_000);
}, 300_000);

afterAll(async () => {
  await agent?.stop();
  await other?.stop();
  await concierge?.stop();
  await Promise.all([hub?.stop(), edge?.stop()]);
}, 60_000);

describe('a grant of edge’s group', () => {
  it.each([
    ['the tunnel', 0],
    ['the peer hop', 1],
  ])(
    'through %s: is needed, applies to the next request with its reason and name in edge’s own audit log, and ends the open watch when it ends',
    async (_path, index) => {
      const via = [concierge, other][index]!;
      const name = `oncall-${index}`;
      const alice = await userCert('alice');
      const before = await get(alice, CONFIGMAPS, via);
      expect(before.status).toBe(403);
      expect(before.body).toContain('User \\"alice\\" cannot list resource \\"configmaps\\"');

      granted.give('alice', EDGE, {
        name,
        groups: ['oncall'],
        reason: 'INC-42: disk full',
        expiresAt: Date.now() + 3_600_000,
      });
      // No new credential: the same certificate's next request carries the grant. A refusal the cluster's answer cache
      // kept for alice without the group is not used for alice with it.
      const allowed = await get(alice, CONFIGMAPS, via);
      expect(allowed.status).toBe(200);
      expect(allowed.body).toContain('seen-on-edge');
      await eventually(() => {
        const complete = eventsOf(allowed.auditId).find((e) => e.stage === 'ResponseComplete');
        expect(complete?.impersonatedUser).toEqual({
          username: 'alice',
          groups: ['dev', 'oncall', 'system:authenticated'],
          extra: { [REASON_EXTRA]: ['INC-42: disk full'], [ACCESS_REQUEST_EXTRA]: [name] },
        });
      });

      const open = watch(alice, `${CONFIGMAPS}?watch=1`, via);
      await eventually(() => expect(open.text()).toContain('seen-on-edge'), 30_000);
      expect(open.status()).toBe(200);
      granted.end(name, 'expired');
      // Ended at an event's boundary, its response complete, as the API server ends a watch.
      expect(await open.ended).toEqual({ complete: true });
      expect((await get(alice, CONFIGMAPS, via)).status).toBe(403);
    },
    120_000,
  );

  it('is refused without a reason where the cluster requires one, and allowed with a grant’s', async () => {
    granted.require(EDGE);
    const bob = await userCert('bob');
    const refused = await get(bob, CONFIGMAPS);
    expect(refused.status).toBe(403);
    expect(JSON.parse(refused.body)).toMatchObject({
      kind: 'Status',
      message: `cluster ${EDGE} requires a reason for every request: run sealion login --reason "<why>" (or use an approved access request with a reason)`,
    });
    granted.give('bob', EDGE, {
      name: 'bob-1',
      groups: ['oncall'],
      reason: 'CHG-7',
      expiresAt: Date.now() + 3_600_000,
    });
    expect((await get(bob, CONFIGMAPS)).status).toBe(200);
  }, 60_000);

  it('on the hub’s own API: allowed with the grant, the hub’s own audit log showing its reason and name', async () => {
    const carol = await userCert('carol');
    const path = '/api/v1/namespaces/default/configmaps';
    expect((await get(carol, path)).status).toBe(403);
    granted.give('carol', '', {
      name: 'hub-1',
      groups: ['oncall'],
      reason: 'INC-9',
      expiresAt: Date.now() + 3_600_000,
    });
    const allowed = await get(carol, path);
    expect(allowed.status).toBe(200);
    await eventually(() => {
      const complete = eventsOf(allowed.auditId, hub).find((e) => e.stage === 'ResponseComplete');
      expect(complete?.impersonatedUser).toEqual({
        username: 'carol',
        groups: ['dev', 'oncall', 'system:authenticated'],
        extra: { [REASON_EXTRA]: ['INC-9'], [ACCESS_REQUEST_EXTRA]: ['hub-1'] },
      });
    });
  }, 60_000);
});
