// Each cluster decides: every question about a request for cluster X is asked of X's API server, and what Sealion
// may do on X at all is what X's admin granted its forwarding identity. Real API servers for a hub and an edge, two
// concierge replicas (processes of their own), agents with different policies on the edge:
// - a differential table: each case sent straight to the API server by a service account holding the grants, and
//   through Sealion by a user holding the same grants, on the hub, on the edge through the tunnel, and on the edge
//   through a peer hop; the answers must agree, and on every path each grant must allow and refuse as many rows as
//   it should (agreement alone would pass a table that both sides refused whole);
// - the escalations a hub-only impersonator had (any group on every edge, a namespace's service accounts on every
//   edge) are refused by the edge;
// - policies: read-only, no-exec and full, as a user the edge's RBAC allows everything sees them, and as raw
//   requests with the agent's own credentials (a compromised hub) see them;
// - audit joins across every hop: each request's audit event on the replica it landed on, and the target API
//   server's own, share one audit ID.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { request } from 'node:https';
import { existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { DEFAULT_AUDIT_POLICY_YAML } from '../apis/install.ts';
import type { AuditEvent } from '../concierge/audit/types.ts';
import { newAgent, type Agent } from '../agent/agent.ts';
import { newSecretCredentialStore } from '../agent/credentials.ts';
import { detectImpersonation } from '../agent/main.ts';
import type { ClusterStatus } from '../apis/tunnel.ts';
import { addCluster } from '../cli/cluster.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { clusterAccess, loadKubeConfig, newKubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import {
  BUILTIN_GROUPS,
  CORE_RESOURCES,
  DEFAULT_POLICY,
  describePolicy,
  WORKLOAD_ACCESS,
  type ForwardingPolicy,
} from '../manifests/forwarding-policy.ts';
import { conciergeManifests, DEFAULT_INSTALL } from '../manifests/install.ts';
import { clusterStatus as clusterStatusOf } from './harness/cluster-status.ts';
import { startConciergeProcess, type ConciergeProcess } from './harness/concierge-process.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const DIFF_NS = 'diff';
const ORIGINAL_USER_KEY = 'impersonation-proxy.concierge.sealion.dev/original-user-info';
/** The differential needs forwarding identities that may act as every kind of identity the API server knows. */
const EVERY_IDENTITY: ForwardingPolicy = {
  ...DEFAULT_POLICY,
  identities: ['users', 'serviceaccounts', 'nodes'],
};

/** Agent-backed clusters (all on the one edge API server, each with an agent user of its own) and their policies. */
const AGENTS: Record<string, ForwardingPolicy> = {
  edge: EVERY_IDENTITY,
  plain: DEFAULT_POLICY,
  ro: { ...DEFAULT_POLICY, name: 'read-only' },
  noexec: { ...DEFAULT_POLICY, name: 'no-exec' },
};

const AGENTS_INDEX = (name: string): number => Object.keys(AGENTS).indexOf(name);

let hub: Cluster;
let edge: Cluster;
let signer: CertificateAuthority;
let holder: ConciergeProcess;
/** The replicas' audit policy and logs. */
let auditDir: string;
/** The agents' one-time tokens, which no audit event or log may hold. */
const bootstrapTokens: string[] = [];
let other: ConciergeProcess;
const agents: Agent[] = [];
const agentKubeconfigs: Record<string, string> = {};

interface Answer {
  status: number;
  body: string;
  retryAfter?: string | undefined;
}

interface Credential {
  token?: string;
  cert?: { certPem: string; keyPem: string };
}

/** One HTTPS request, headers as given (repeated ones as arrays). */
function send(
  base: { url: string; ca: string },
  credential: Credential,
  method: string,
  path: string,
  headers: Record<string, string | string[]> = {},
  body?: string,
): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = request(
      new URL(path, base.url),
      {
        method,
        ca: base.ca,
        agent: false,
        headers: {
          ...(body ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } : {}),
          ...headers,
          ...(credential.token ? { authorization: `Bearer ${credential.token}` } : {}),
        },
        ...(credential.cert ? { cert: credential.cert.certPem, key: credential.cert.keyPem } : {}),
      },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () =>
          done({ status: res.statusCode ?? 0, body: text, retryAfter: res.headers['retry-after'] }),
        );
      },
    );
    req.on('error', fail);
    req.end(body);
  });
}

/** A client certificate from the replicas' signer: how a Sealion user signs in here. */
async function userCert(name: string, groups: string[] = []): Promise<{ certPem: string; keyPem: string }> {
  const issued = await issueCert(signer, { commonName: name, organizations: groups, usage: 'client' });
  return { certPem: issued.certPem, keyPem: issued.keyPem };
}

const apiServer = (cluster: Cluster) => ({ url: cluster.url, ca: cluster.ca.certPem });
const replica = (r: ConciergeProcess, cluster?: string) => ({
  url: cluster ? `${r.url}/clusters/${cluster}/` : r.url,
  ca: r.servingCA,
});

async function apply(cluster: Cluster, objects: object[]): Promise<void> {
  const result = await cluster.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: objects }),
  });
  if (result.code !== 0) throw new Error(`kubectl apply: ${result.stderr}`);
}

const rbac = 'rbac.authorization.k8s.io/v1';
/** A ClusterRole `name` with `rules`, bound to `subjects`. */
const clusterRole = (name: string, rules: object[], subjects: object[]): object[] => [
  { apiVersion: rbac, kind: 'ClusterRole', metadata: { name }, rules },
  {
    apiVersion: rbac,
    kind: 'ClusterRoleBinding',
    metadata: { name },
    roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name },
    subjects,
  },
];
const user = (name: string) => ({ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name });
/** A ClusterRole with `rules`, bound to a service account of DIFF_NS and a user of the same name. */
const grantTo = (name: string, rules: object[]): object[] => [
  { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name, namespace: DIFF_NS } },
  ...clusterRole(name, rules, [{ kind: 'ServiceAccount', name, namespace: DIFF_NS }, user(name)]),
];

const clusterStatus = (name: string): Promise<ClusterStatus> => clusterStatusOf(hub, name);

// ---- The differential table ----

const AUTHN = 'authentication.k8s.io';
const WHOAMI = '/apis/authentication.k8s.io/v1/selfsubjectreviews';
const on = (mode: string, ...verbs: string[]) => verbs.map((v) => `impersonate-on:${mode}:${v}`);

/** Grant sets: what the caller holds on the target cluster (the same on the hub and the edge). */
const GRANTS: Record<string, object[]> = {
  none: [],
  'legacy: users bob': [
    { apiGroups: [''], resources: ['users'], resourceNames: ['bob'], verbs: ['impersonate'] },
  ],
  'legacy: users bob, group ops': [
    { apiGroups: [''], resources: ['users'], resourceNames: ['bob'], verbs: ['impersonate'] },
    { apiGroups: [''], resources: ['groups'], resourceNames: ['ops'], verbs: ['impersonate'] },
  ],
  'legacy: everyone': [
    { apiGroups: [''], resources: ['users', 'groups', 'serviceaccounts'], verbs: ['impersonate'] },
    { apiGroups: [AUTHN], resources: ['*'], verbs: ['impersonate'] },
  ],
  'legacy: service accounts of the namespace': [
    { apiGroups: [''], resources: ['serviceaccounts'], verbs: ['impersonate'] },
  ],
  'user-info: bob, for whoami': [
    { apiGroups: [AUTHN], resources: ['users'], resourceNames: ['bob'], verbs: ['impersonate:user-info'] },
    { apiGroups: [AUTHN], resources: ['selfsubjectreviews'], verbs: on('user-info', 'create') },
  ],
  'user-info: bob and ops, for listing configmaps': [
    { apiGroups: [AUTHN], resources: ['users'], resourceNames: ['bob'], verbs: ['impersonate:user-info'] },
    { apiGroups: [AUTHN], resources: ['groups'], resourceNames: ['ops'], verbs: ['impersonate:user-info'] },
    { apiGroups: [''], resources: ['configmaps'], verbs: on('user-info', 'list') },
  ],
  'user-info: anyone, for anything': [
    { apiGroups: [AUTHN], resources: ['*'], verbs: ['impersonate:user-info'] },
    { apiGroups: ['*'], resources: ['*'], verbs: on('user-info', 'create', 'list', 'get') },
    { nonResourceURLs: ['*'], verbs: on('user-info', 'get') },
  ],
  'user-info: bob, but only to get': [
    { apiGroups: [AUTHN], resources: ['users'], verbs: ['impersonate:user-info'] },
    { apiGroups: ['*'], resources: ['*'], verbs: on('user-info', 'get') },
    // The table's one get is of /version: without this, the grant would refuse every row and show nothing it allows.
    { nonResourceURLs: ['*'], verbs: on('user-info', 'get') },
  ],
  'serviceaccount: the namespace, for whoami and lists': [
    { apiGroups: [AUTHN], resources: ['serviceaccounts'], verbs: ['impersonate:serviceaccount'] },
    { apiGroups: ['*'], resources: ['*'], verbs: on('serviceaccount', 'create', 'list') },
  ],
  'arbitrary-node: any node, for whoami': [
    { apiGroups: [AUTHN], resources: ['nodes'], verbs: ['impersonate:arbitrary-node'] },
    { apiGroups: [AUTHN], resources: ['selfsubjectreviews'], verbs: on('arbitrary-node', 'create') },
  ],
};

/** Identities asked for, as Impersonate-* headers. */
const WANTED: Record<string, Record<string, string | string[]>> = {
  bob: { 'impersonate-user': 'bob' },
  'bob in ops': { 'impersonate-user': 'bob', 'impersonate-group': 'ops' },
  'bob in system:masters': { 'impersonate-user': 'bob', 'impersonate-group': 'system:masters' },
  'bob with a uid and an extra': {
    'impersonate-user': 'bob',
    'impersonate-uid': '42',
    'impersonate-extra-example.com%2fteam': 'blue',
  },
  'bob in four groups': { 'impersonate-user': 'bob', 'impersonate-group': ['a', 'b', 'c', 'd'] },
  'a service account': { 'impersonate-user': `system:serviceaccount:${DIFF_NS}:robot` },
  'a node': { 'impersonate-user': 'system:node:n1' },
  'a group without a user': { 'impersonate-group': 'ops' },
};

const REQUESTS: Record<string, { method: string; path: string; body?: string }> = {
  whoami: {
    method: 'POST',
    path: WHOAMI,
    body: JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' }),
  },
  'list configmaps': { method: 'GET', path: `/api/v1/namespaces/${DIFF_NS}/configmaps` },
  'get /version': { method: 'GET', path: '/version' },
};

/**
 * Rows where Sealion is stricter than the API server, by design: the forwarding identity holds constrained
 * impersonation, which never carries system:masters, nor a node without its system:nodes group; only the legacy verb
 * could, and no forwarding policy grants it but `legacy`. There the API server answers 2xx and Sealion 403.
 */
const stricter = (grant: string, wanted: string): boolean =>
  wanted === 'bob in system:masters' || (wanted === 'a node' && grant.startsWith('legacy'));

/**
 * How many rows of each grant the API server allows (2xx) and refuses (403), the same on every path (both clusters
 * hold the same grants). Each grant's 14 rows: a whoami as bob, bob in ops, bob in system:masters, bob with a uid and
 * an extra, bob in four groups, a service account, a node, a group without a user; a list of configmaps and a get of
 * /version as bob, bob in ops and a service account. The group without a user is malformed under every grant (400),
 * so it is left out here and counted apart. Where Sealion is stricter (above), its own mix follows `sealion`. A table
 * whose grants were not in effect, or whose every answer was a refusal, cannot come out this way.
 */
const MIX: Record<
  string,
  { allowed: number; refused: number; sealion?: { allowed: number; refused: number } }
> = {
  none: { allowed: 0, refused: 13 },
  // bob alone: the whoami, the list and /version.
  'legacy: users bob': { allowed: 3, refused: 10 },
  // bob alone and bob in ops, three each.
  'legacy: users bob, group ops': { allowed: 6, refused: 7 },
  // Everyone, everything; Sealion refuses the two identities only the legacy verb carries.
  'legacy: everyone': { allowed: 13, refused: 0, sealion: { allowed: 11, refused: 2 } },
  // The service account's three.
  'legacy: service accounts of the namespace': { allowed: 3, refused: 10 },
  // bob's whoami.
  'user-info: bob, for whoami': { allowed: 1, refused: 12 },
  // bob's list and bob-in-ops' list.
  'user-info: bob and ops, for listing configmaps': { allowed: 2, refused: 11 },
  // Every user-info identity (bob four ways in a whoami, bob and bob in ops in a list and /version), never
  // system:masters, a service account or a node.
  'user-info: anyone, for anything': { allowed: 8, refused: 5 },
  // bob's get of /version; no create, no list, no group.
  'user-info: bob, but only to get': { allowed: 1, refused: 12 },
  // The service account's whoami and list, not its get.
  'serviceaccount: the namespace, for whoami and lists': { allowed: 2, refused: 11 },
  // The node's whoami.
  'arbitrary-node: any node, for whoami': { allowed: 1, refused: 12 },
};

/** What a row's answer counts as in the mix. */
type Verdict = 'allowed' | 'refused' | 'malformed' | `HTTP ${number}`;
const verdict = (status: number): Verdict =>
  status >= 200 && status < 300
    ? 'allowed'
    : status === 403
      ? 'refused'
      : status === 400
        ? 'malformed'
        : `HTTP ${status}`;
type Tally = Partial<Record<Verdict, number>>;

/** The mix every path must show: per grant, what the API server and Sealion answered. */
const WANTED_MIX: Record<string, { apiserver: Tally; sealion: Tally }> = Object.fromEntries(
  Object.entries(MIX).map(([grant, { allowed, refused, sealion }]) => [
    grant,
    {
      apiserver: { allowed, refused, malformed: 1 },
      sealion: { allowed, refused, ...sealion, malformed: 1 },
    },
  ]),
);

interface Row {
  grant: string;
  wanted: string;
  request: string;
}

const ROWS: Row[] = [
  ...Object.keys(GRANTS).flatMap((grant) =>
    Object.keys(WANTED).map((wanted) => ({ grant, wanted, request: 'whoami' })),
  ),
  ...Object.keys(GRANTS).flatMap((grant) =>
    ['bob', 'bob in ops', 'a service account'].flatMap((wanted) =>
      ['list configmaps', 'get /version'].map((request) => ({ grant, wanted, request })),
    ),
  ),
];

/** The part of an answer both must agree on: the status, and for a whoami the identity (less Sealion's record). */
function outcome(answer: Answer, request: string): unknown {
  if (request !== 'whoami' || answer.status !== 201) return { status: answer.status };
  const info = (JSON.parse(answer.body) as { status: { userInfo: Record<string, unknown> } }).status.userInfo;
  const extra = { ...((info['extra'] as Record<string, string[]> | undefined) ?? {}) };
  delete extra[ORIGINAL_USER_KEY];
  return { status: answer.status, ...info, extra };
}

const slug = (text: string): string => text.replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '');
const callerOf = (grant: string): string => `diff-${slug(grant)}`.slice(0, 60).replace(/-$/, '');

beforeAll(async () => {
  [hub, edge] = await Promise.all([
    startCluster({ name: 'decides-hub', controllerManager: false }),
    startCluster({ name: 'decides-edge', controllerManager: false }),
  ]);
  signer = await newCA('each-cluster-decides users');
  const signerPems = { certPem: signer.certPem, keyPem: signer.keyPem };
  auditDir = mkdtempSync(join(tmpdir(), 'sealion-decides-audit-'));
  const policyFile = join(auditDir, 'policy.yaml');
  writeFileSync(policyFile, DEFAULT_AUDIT_POLICY_YAML);
  holder = await startConciergeProcess(hub, {
    tunnel: { port: 0, namespace: NS },
    identity: 'holder',
    signer: signerPems,
    audit: { policyFile, logPath: join(auditDir, 'holder.log') },
  });
  other = await startConciergeProcess(hub, {
    tunnel: { port: 0, namespace: NS },
    identity: 'other',
    signer: signerPems,
    audit: { policyFile, logPath: join(auditDir, 'other.log') },
  });
  // The hub's forwarding identity with every identity kind, for the differential.
  await apply(
    hub,
    conciergeManifests({ ...DEFAULT_INSTALL, forwardingPolicy: EVERY_IDENTITY }).filter(
      (o) => o['kind'] === 'ClusterRole' && (o['metadata'] as { name: string }).name === `${NS}-impersonator`,
    ),
  );
  const edgeClients = newKubeClients({ path: edge.kubeconfigPath });
  for (const [cluster, policy] of Object.entries(AGENTS)) {
    const kubeconfig = await prepareAgentCluster(edge, AGENT_NS, policy, `agent-${cluster}`);
    agentKubeconfigs[cluster] = kubeconfig;
    // What the agent reports: the policy its RBAC came from, and what it found it may impersonate, asked of the edge.
    const impersonation = await detectImpersonation(newKubeClients({ path: kubeconfig }), silentLogger());
    const added = await addCluster(cluster, {
      kubeconfig: hub.kubeconfigPath,
      namespace: NS,
      groupSuffix: 'sealion.dev',
      hub: '',
      description: '',
    });
    const agent = newAgent({
      cluster,
      // Every agent dials the replica `holder`: the other one reaches them through a peer hop.
      hub: new URL(`https://127.0.0.1:${holder.tunnel!.port}`),
      trust: { pin: added.pin },
      bootstrapToken: () => added.token,
      store: newSecretCredentialStore(edgeClients, AGENT_NS, `${cluster}-credentials`),
      upstream: agentUpstream(kubeconfig),
      version: 'decides-test',
      forwarding: { policy: describePolicy(policy), impersonation },
      log: silentLogger(),
      tunnels: 1,
    });
    agents.push(agent);
    bootstrapTokens.push(added.token);
    await agent.start();
  }
  // The same grants on both clusters, for a service account (straight to the API server) and a user (through
  // Sealion); every impersonated identity may read configmaps of the namespace, so a list answers 200 once allowed.
  for (const cluster of [hub, edge]) {
    await cluster.kubectl(['create', 'namespace', DIFF_NS]);
    await apply(cluster, [
      ...Object.entries(GRANTS).flatMap(([grant, rules]) => grantTo(callerOf(grant), rules)),
      {
        apiVersion: rbac,
        kind: 'Role',
        metadata: { name: 'read', namespace: DIFF_NS },
        rules: [{ apiGroups: [''], resources: ['configmaps'], verbs: ['list', 'watch'] }],
      },
      {
        apiVersion: rbac,
        kind: 'RoleBinding',
        metadata: { name: 'read', namespace: DIFF_NS },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'read' },
        subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'system:authenticated' }],
      },
    ]);
  }
  await eventually(async () => {
    for (const cluster of Object.keys(AGENTS))
      expect(await clusterStatus(cluster)).toMatchObject({ connected: true, replicas: 'holder' });
  }, 60_000);
}, 240_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop()));
  await Promise.all([holder?.stop(), other?.stop()]);
  await Promise.all([hub?.stop(), edge?.stop()]);
  if (auditDir) rmSync(auditDir, { recursive: true, force: true });
});

describe('the differential table: the API server and Sealion answer every case alike', () => {
  const paths: [string, () => Cluster, () => { url: string; ca: string }][] = [
    ['the hub', () => hub, () => replica(holder)],
    ['the edge through the tunnel', () => edge, () => replica(holder, 'edge')],
    ['the edge through a peer hop', () => edge, () => replica(other, 'edge')],
  ];

  it.each(paths)(
    'on %s',
    async (_where, target, sealion) => {
      const tokens = new Map<string, string>();
      for (const grant of Object.keys(GRANTS)) {
        const created = await target().kubectl(['create', 'token', callerOf(grant), '-n', DIFF_NS]);
        tokens.set(grant, created.stdout.trim());
      }
      const certs = new Map<string, { certPem: string; keyPem: string }>();
      for (const grant of Object.keys(GRANTS)) certs.set(grant, await userCert(callerOf(grant)));
      const mismatches: string[] = [];
      let same = 0;
      let strict = 0;
      // Every grant starts at zero, so a grant the table never reached shows as such.
      const mix: Record<string, { apiserver: Tally; sealion: Tally }> = Object.fromEntries(
        Object.keys(GRANTS).map((grant) => [
          grant,
          {
            apiserver: { allowed: 0, refused: 0, malformed: 0 },
            sealion: { allowed: 0, refused: 0, malformed: 0 },
          },
        ]),
      );
      const count = (tally: Tally, answer: Answer): void => {
        const kind = verdict(answer.status);
        tally[kind] = (tally[kind] ?? 0) + 1;
      };
      // A few rows at a time: every row is two requests, and through Sealion the first of a caller asks a dozen reviews.
      const pending = [...ROWS];
      const run = async (): Promise<void> => {
        for (let row = pending.shift(); row; row = pending.shift()) {
          const { grant, wanted, request: name } = row;
          const req = REQUESTS[name]!;
          const headers = WANTED[wanted]!;
          const direct = await send(
            apiServer(target()),
            { token: tokens.get(grant)! },
            req.method,
            req.path,
            headers,
            req.body,
          );
          const through = await send(
            sealion(),
            { cert: certs.get(grant)! },
            req.method,
            req.path.slice(1),
            headers,
            req.body,
          );
          count(mix[grant]!.apiserver, direct);
          count(mix[grant]!.sealion, through);
          const label = `${grant} | ${wanted} | ${name}`;
          if (stricter(grant, wanted) && direct.status < 300) {
            strict++;
            if (
              through.status !== 403 ||
              !through.body.includes('only the legacy impersonate verb can carry it')
            )
              mismatches.push(
                `${label}: direct ${direct.status}, Sealion ${through.status} ${through.body.slice(0, 300)}`,
              );
            continue;
          }
          const a = outcome(direct, name);
          const b = outcome(through, name);
          if (JSON.stringify(a) === JSON.stringify(b)) same++;
          else
            mismatches.push(
              `${label}: direct ${JSON.stringify(a)} ${direct.body.slice(0, 200)}, Sealion ${JSON.stringify(b)} ${through.body.slice(0, 300)}`,
            );
        }
      };
      await Promise.all(Array.from({ length: 4 }, run));
      expect(mismatches).toEqual([]);
      expect(same + strict).toBe(ROWS.length);
      // Agreement proves little if both sides refused everything: each grant must allow and refuse what it should.
      expect(mix).toEqual(WANTED_MIX);
      console.log(
        `${_where}: ${ROWS.length} rows, ${same} the same, ${strict} refused by design (legacy-only identities)`,
      );
    },
    300_000,
  );
});

describe('the escalations of a hub-only impersonator', () => {
  let demo: { certPem: string; keyPem: string };

  beforeAll(async () => {
    demo = await userCert('demo@sealion.dev');
    // On the hub, demo may impersonate anyone, and the service accounts of namespace team (as `edit` there allows).
    await hub.kubectl(['create', 'namespace', 'team']);
    await apply(hub, [
      ...clusterRole(
        'demo-impersonates',
        [{ apiGroups: [''], resources: ['users', 'groups'], verbs: ['impersonate'] }],
        [user('demo@sealion.dev')],
      ),
      {
        apiVersion: rbac,
        kind: 'Role',
        metadata: { name: 'sa-impersonator', namespace: 'team' },
        rules: [{ apiGroups: [''], resources: ['serviceaccounts'], verbs: ['impersonate'] }],
      },
      {
        apiVersion: rbac,
        kind: 'RoleBinding',
        metadata: { name: 'sa-impersonator', namespace: 'team' },
        roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'sa-impersonator' },
        subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'demo@sealion.dev' }],
      },
    ]);
    await edge.kubectl(['create', 'namespace', 'team']);
  });

  it.each([
    ['through the tunnel', () => holder],
    ['through a peer hop', () => other],
  ])(
    'refuses --as and --as-group=system:masters on the edge, which never allowed them (%s)',
    async (_how, via) => {
      const whoami = REQUESTS['whoami']!;
      for (const cluster of ['edge', 'plain']) {
        const answer = await send(
          replica(via(), cluster),
          { cert: demo },
          'POST',
          whoami.path.slice(1),
          {
            'impersonate-user': 'anyone',
            'impersonate-group': 'system:masters',
          },
          whoami.body,
        );
        expect([cluster, answer.status]).toEqual([cluster, 403]);
        expect(answer.body).toContain('User \\"demo@sealion.dev\\" cannot impersonate');
        const sa = await send(
          replica(via(), cluster),
          { cert: demo },
          'GET',
          'api/v1/namespaces/team/secrets',
          {
            'impersonate-user': 'system:serviceaccount:team:deployer',
          },
        );
        expect([cluster, sa.status]).toEqual([cluster, 403]);
      }
      // On the hub itself the same caller may: the hub decided about the hub.
      const onHub = await send(
        replica(via()),
        { cert: demo },
        'POST',
        whoami.path.slice(1),
        { 'impersonate-user': 'anyone' },
        whoami.body,
      );
      expect(onHub.status).toBe(201);
    },
  );

  it('fails with 503 and Retry-After when the edge cannot answer, never forwarding on the hub’s say', async () => {
    // The agent may no longer ask its cluster about users: its tunnel is up, its reviews are refused.
    const removed = await edge.kubectl(['delete', 'clusterrolebinding', 'agent-plain-reviews']);
    expect(removed.code).toBe(0);
    const answer = await send(replica(holder, 'plain'), { cert: demo }, 'GET', 'api/v1/namespaces', {
      'impersonate-user': 'anyone',
    });
    expect(answer).toMatchObject({ status: 503, retryAfter: '1' });
    expect(JSON.parse(answer.body)).toMatchObject({
      kind: 'Status',
      code: 503,
      message: expect.stringContaining(
        'cluster plain: the request could not be decided: its API server answered a SubjectAccessReview with HTTP 403',
      ) as unknown,
    });
    // Without the agent's tunnel, the same.
    await agents[AGENTS_INDEX('plain')]!.stop();
    await eventually(
      async () => expect(await clusterStatus('plain')).toMatchObject({ connected: false }),
      30_000,
    );
    const gone = await send(replica(holder, 'plain'), { cert: demo }, 'GET', 'api/v1/namespaces', {
      'impersonate-user': 'anyone',
    });
    expect(gone.status).toBe(503);
  });
});

describe('forwarding policies the edge admin picks', () => {
  let admin: { certPem: string; keyPem: string };

  beforeAll(async () => {
    // The edge's RBAC lets this user do anything; only the policy stands between.
    admin = await userCert('edge-admin', ['edge-admins']);
    await edge.kubectl([
      'create',
      'clusterrolebinding',
      'edge-admins',
      '--clusterrole=cluster-admin',
      '--group=edge-admins',
    ]);
    await edge.kubectl(['create', 'namespace', 'policy']);
  });

  const create = (cluster: string, name: string) =>
    send(
      replica(holder, cluster),
      { cert: admin },
      'POST',
      'api/v1/namespaces/policy/configmaps',
      {},
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name },
      }),
    );
  const connect = (cluster: string, sub: string) =>
    send(
      replica(holder, cluster),
      { cert: admin },
      'POST',
      `api/v1/namespaces/policy/pods/p/${sub}?command=ls`,
    );
  const refusedByPolicy = (answer: Answer, cluster: string): void => {
    expect(answer.status).toBe(403);
    expect(answer.body).toContain(`cluster ${cluster}'s policy for Sealion refuses this request`);
  };
  /** The API server answered (for a pod that does not exist), not the policy. */
  const reachedTheAPIServer = (answer: Answer): void => {
    expect(answer.status).not.toBe(403);
    expect(answer.body).not.toContain('policy for Sealion');
  };
  /**
   * What `kubectl debug --target` sends: an ephemeral container added to a running pod (a strategic merge patch of
   * pods/ephemeralcontainers; a POST is the create verb on it).
   */
  const debug = (cluster: string, method: 'PATCH' | 'POST') =>
    send(
      replica(holder, cluster),
      { cert: admin },
      method,
      'api/v1/namespaces/policy/pods/p/ephemeralcontainers',
      method === 'PATCH' ? { 'content-type': 'application/strategic-merge-patch+json' } : {},
      JSON.stringify({
        spec: { ephemeralContainers: [{ name: 'dbg', image: 'busybox', targetContainerName: 'app' }] },
      }),
    );

  it('read-only refuses create and exec for a user the edge allows everything, and serves reads', async () => {
    refusedByPolicy(await create('ro', 'ro'), 'ro');
    refusedByPolicy(await connect('ro', 'exec'), 'ro');
    expect(
      (await send(replica(holder, 'ro'), { cert: admin }, 'GET', 'api/v1/namespaces/policy/configmaps'))
        .status,
    ).toBe(200);
  });

  it('no-exec refuses exec, port-forward and ephemeral containers, and serves writes', async () => {
    refusedByPolicy(await connect('noexec', 'exec'), 'noexec');
    refusedByPolicy(await connect('noexec', 'portforward'), 'noexec');
    refusedByPolicy(await debug('noexec', 'PATCH'), 'noexec');
    refusedByPolicy(await debug('noexec', 'POST'), 'noexec');
    expect((await create('noexec', 'noexec')).status).toBe(201);
  });

  it('still allows what the README says each allows: workloads under no-exec, logs and secrets under both', async () => {
    // A workload runs the command it is created with: no-exec keeps that, as it keeps every write.
    const deployment = await send(
      replica(holder, 'noexec'),
      { cert: admin },
      'POST',
      'apis/apps/v1/namespaces/policy/deployments',
      {},
      JSON.stringify({
        apiVersion: 'apps/v1',
        kind: 'Deployment',
        metadata: { name: 'runs-code' },
        spec: {
          selector: { matchLabels: { app: 'runs-code' } },
          template: {
            metadata: { labels: { app: 'runs-code' } },
            spec: {
              containers: [{ name: 'app', image: 'busybox', command: ['sh', '-c', 'cat /etc/secret'] }],
            },
          },
        },
      }),
    );
    expect(deployment.status).toBe(201);
    for (const cluster of ['noexec', 'ro']) {
      // What a container prints is a read (the pod is missing: the API server answers 404).
      const logs = await send(
        replica(holder, cluster),
        { cert: admin },
        'GET',
        'api/v1/namespaces/policy/pods/p/log',
      );
      expect([cluster, logs.status]).toEqual([cluster, 404]);
      const secrets = await send(
        replica(holder, cluster),
        { cert: admin },
        'GET',
        'api/v1/namespaces/policy/secrets',
      );
      expect([cluster, secrets.status]).toEqual([cluster, 200]);
    }
  });

  it('full allows all of them: the request reaches the API server, which answers for the missing pod', async () => {
    expect((await create('edge', 'full')).status).toBe(201);
    for (const sub of ['exec', 'portforward']) reachedTheAPIServer(await connect('edge', sub));
    reachedTheAPIServer(await debug('edge', 'PATCH'));
    reachedTheAPIServer(await debug('edge', 'POST'));
  });

  it('holds against raw requests with the agent’s own credentials (a compromised hub)', async () => {
    const asAgent = (cluster: string) => {
      const access = clusterAccess(loadKubeConfig({ path: agentKubeconfigs[cluster]! }));
      return { cert: { certPem: access.certPem!, keyPem: access.keyPem! } };
    };
    const edgeServer = apiServer(edge);
    const body = JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'forged' } });
    // read-only: no create as anyone, no exec.
    const forgedCreate = await send(
      edgeServer,
      asAgent('ro'),
      'POST',
      '/api/v1/namespaces/policy/configmaps',
      { 'impersonate-user': 'edge-admin', 'impersonate-group': 'edge-admins' },
      body,
    );
    expect(forgedCreate.status).toBe(403);
    expect(forgedCreate.body).toContain('impersonate-on:user-info:create');
    // An exec disguised as a list (an empty name, the pod in a field selector) is refused as a list of pods/exec.
    const disguised = await send(
      edgeServer,
      asAgent('ro'),
      'GET',
      '/api/v1/namespaces/policy/pods//exec?fieldSelector=metadata.name%3Dp&command=ls',
      { 'impersonate-user': 'edge-admin', 'impersonate-group': 'edge-admins' },
    );
    expect(disguised.status).toBe(403);
    expect(disguised.body).toContain('impersonate-on:user-info:list');
    // no-exec: no ephemeral container in a running pod (kubectl debug), by patch or by create.
    for (const [method, verb] of [
      ['PATCH', 'patch'],
      ['POST', 'create'],
    ] as const) {
      const forgedDebug = await send(
        edgeServer,
        asAgent('noexec'),
        method,
        '/api/v1/namespaces/policy/pods/p/ephemeralcontainers',
        {
          'impersonate-user': 'edge-admin',
          'impersonate-group': 'edge-admins',
          ...(method === 'PATCH' ? { 'content-type': 'application/strategic-merge-patch+json' } : {}),
        },
        JSON.stringify({ spec: { ephemeralContainers: [{ name: 'dbg', image: 'busybox' }] } }),
      );
      expect([method, forgedDebug.status]).toEqual([method, 403]);
      expect(forgedDebug.body).toContain(`impersonate-on:user-info:${verb}`);
    }
    // The default policy: users only. No service account, no node, never system:masters.
    const forgeries: Record<string, string>[] = [
      { 'impersonate-user': 'system:serviceaccount:kube-system:default' },
      { 'impersonate-user': 'system:node:n1' },
      { 'impersonate-user': 'anyone', 'impersonate-group': 'system:masters' },
    ];
    for (const headers of forgeries) {
      const forged = await send(edgeServer, asAgent('plain'), 'GET', '/api/v1/namespaces', headers);
      expect([headers, forged.status]).toEqual([headers, 403]);
      expect(forged.body).toContain('User \\"agent-plain\\" cannot impersonate');
    }
    // A plain user is what it may act as: the request is then that user's, whom the edge's RBAC refuses here.
    const asUser = await send(edgeServer, asAgent('plain'), 'GET', '/api/v1/namespaces', {
      'impersonate-user': 'anyone',
    });
    expect(asUser.status).toBe(403);
    expect(asUser.body).toContain('User \\"anyone\\" cannot list');
    // And without impersonating, the agent may only ask reviews.
    expect(
      (await send(edgeServer, asAgent('plain'), 'GET', '/api/v1/namespaces/policy/configmaps')).status,
    ).toBe(403);
  });

  it('shows each cluster’s policy and impersonation in kubectl get clusters -o wide', async () => {
    const table = await hub.kubectl(['get', 'clusters.tunnel.concierge.sealion.dev', '-o', 'wide']);
    expect(table.stdout).toMatch(/\bro\b.*\bread-only\b.*\bconstrained\b/);
    expect(table.stdout).toMatch(/\bnoexec\b.*\bno-exec\b.*\bconstrained\b/);
    expect(table.stdout).toMatch(/\bedge\b.*\bfull\+serviceaccounts\+nodes\b.*\bconstrained\b/);
  });
});

describe('the built-in resources the policies name', () => {
  it('are every resource and API group of the pinned release, but what reaches into workloads', async () => {
    const get = async (path: string) =>
      JSON.parse(
        (await send(apiServer(edge), { token: undefined, cert: await adminCert() }, 'GET', path)).body,
      ) as {
        resources?: { name: string }[];
        groups?: { name: string }[];
      };
    const core = (await get('/api/v1')).resources!.map((r) => r.name).sort();
    expect(core).toEqual([...CORE_RESOURCES, ...WORKLOAD_ACCESS].sort());
    const groups = (await get('/apis')).groups!.map((g) => g.name).sort();
    expect(groups).toEqual([...BUILTIN_GROUPS].sort());
  });
});

async function adminCert(): Promise<{ certPem: string; keyPem: string }> {
  const access = clusterAccess(loadKubeConfig({ path: edge.kubeconfigPath }));
  return { certPem: access.certPem!, keyPem: access.keyPem! };
}

describe('audit joins across every hop', () => {
  /** The audit events in a JSON-lines file. */
  const eventsIn = (path: string): AuditEvent[] =>
    existsSync(path)
      ? readFileSync(path, 'utf8')
          .split('\n')
          .filter((line) => line.startsWith('{'))
          .map((line) => JSON.parse(line) as AuditEvent)
          .filter((e) => e.kind === 'Event')
      : [];
  /** One request; its status and the Audit-ID the answer carries. */
  const audited = (
    base: { url: string; ca: string },
    cert: { certPem: string; keyPem: string },
    method: string,
    path: string,
    headers: Record<string, string> = {},
  ): Promise<{ status: number; auditID: string }> =>
    new Promise((done, fail) => {
      const req = request(
        new URL(path, base.url),
        { method, ca: base.ca, agent: false, cert: cert.certPem, key: cert.keyPem, headers },
        (res) => {
          res.resume();
          res.on('end', () =>
            done({ status: res.statusCode ?? 0, auditID: String(res.headers['audit-id'] ?? '') }),
          );
        },
      );
      req.on('error', fail);
      req.end();
    });
  const exec = {
    connection: 'Upgrade',
    upgrade: 'SPDY/3.1',
    'x-stream-protocol-version': 'v4.channel.k8s.io',
  };
  const CASES: [string, string, string, Record<string, string>, number][] = [
    ['an allowed list', 'GET', `api/v1/namespaces/${DIFF_NS}/configmaps`, {}, 200],
    ['a 403', 'GET', `api/v1/namespaces/${DIFF_NS}/secrets`, {}, 403],
    ['a watch', 'GET', `api/v1/namespaces/${DIFF_NS}/configmaps?watch=1&timeoutSeconds=1`, {}, 200],
    ['an exec', 'POST', `api/v1/namespaces/${DIFF_NS}/pods/nowhere/exec?command=true&stdout=true`, exec, 403],
    [
      'a nested impersonation',
      'GET',
      `api/v1/namespaces/${DIFF_NS}/configmaps`,
      { 'impersonate-user': 'bob' },
      200,
    ],
  ];
  const WAYS: [string, () => Cluster, () => { url: string; ca: string }, string, string][] = [
    ['the hub', () => hub, () => replica(holder), 'local', 'holder'],
    ['the edge through the tunnel', () => edge, () => replica(holder, 'edge'), 'tunnel', 'holder'],
    ['the edge through a peer hop', () => edge, () => replica(other, 'edge'), 'peer', 'other'],
  ];

  it("audits the agents' registrations and tunnels, and keeps their tokens out", async () => {
    await eventually(() => {
      const events = eventsIn(join(auditDir, 'holder.log'));
      for (const cluster of Object.keys(AGENTS)) {
        expect(
          events.find(
            (e) => e.requestURI === '/register' && e.annotations?.['sealion.dev/cluster'] === cluster,
          ),
        ).toMatchObject({ verb: 'post', responseStatus: { code: 200 } });
        // The tunnel is audited as it opens; its ResponseComplete comes when it closes.
        expect(
          events.find(
            (e) => e.requestURI.startsWith('/connect') && e.user.username === `sealion:agent:${cluster}`,
          ),
        ).toMatchObject({ stage: 'ResponseStarted', responseStatus: { code: 101 } });
      }
    });
    const written = readFileSync(join(auditDir, 'holder.log'), 'utf8');
    for (const token of bootstrapTokens) expect(written).not.toContain(token);
  });

  it.each(WAYS.flatMap((way) => CASES.map((c) => [way[0], c[0], way, c] as const)))(
    '%s: %s gives one Sealion event that joins one API server event',
    async (_way, _case, [, target, sealion, route, landed], [, method, path, headers, status]) => {
      // A caller the grant lets impersonate bob, on both clusters.
      const caller = callerOf('legacy: users bob');
      const answer = await audited(sealion(), await userCert(caller), method, path, {
        ...headers,
        // A client's own Audit-ID is replaced.
        'audit-id': 'chosen-by-the-client',
      });
      expect(answer.status).toBe(status);
      expect(answer.auditID).toMatch(/^[0-9a-f-]{36}$/);
      await eventually(() => {
        const ours = eventsIn(join(auditDir, `${landed}.log`)).filter(
          (e) => e.auditID === answer.auditID && e.stage === 'ResponseComplete',
        );
        const theirs = eventsIn(target().auditLogPath).filter(
          (e) => e.auditID === answer.auditID && e.stage === 'ResponseComplete',
        );
        expect(ours).toHaveLength(1);
        expect(theirs).toHaveLength(1);
        const [event, apiserver] = [ours[0]!, theirs[0]!];
        expect(event.user.username).toBe(caller);
        expect(event.responseStatus?.code).toBe(status);
        expect(apiserver.responseStatus?.code).toBe(status);
        expect(event.annotations).toMatchObject({
          'sealion.dev/route': route,
          'sealion.dev/replica': landed,
          ...(target() === edge ? { 'sealion.dev/cluster': 'edge' } : {}),
        });
        // The API server saw the forwarding identity acting for the user, with Sealion's extra when the user
        // impersonated someone.
        expect(apiserver.user.username).not.toBe(caller);
        const as = headers['impersonate-user'] ?? caller;
        expect(apiserver.impersonatedUser?.username).toBe(as);
        expect(event.impersonatedUser?.username).toBe(headers['impersonate-user']);
        if (headers['impersonate-user'])
          expect(Object.keys(apiserver.impersonatedUser?.extra ?? {})).toContain(ORIGINAL_USER_KEY);
      }, 15_000);
    },
  );
});
