// Access on request, with reasons (DESIGN.md §13), end to end: real API servers for a hub and an edge, two concierge
// replicas (processes of their own) and agents dialing one of them, so that every request to the edge goes through the
// tunnel (the replica `holder`) or through a peer hop first (the replica `other`). One environment for the file:
// - a user without rights asks for a group on edge, is refused while the request is pending, is allowed once a
//   reviewer approves exactly as edge's RBAC says for the group, through the tunnel and the peer hop, with the reason
//   and the request's name in edge's own audit log; at expiry the access ends, and so does a watch that used it (a
//   watch has no channel for a message; an exec's would need a pod on a real node, a minute of the file's run);
// - an edge whose agent may not impersonate the group refuses, though the hub approved;
// - hostile callers: approving one's own request, another requester written into the body, a group or a duration the
//   policy does not allow, a reason with control characters, a credential from the grant replayed after it, ten
//   thousand creates from one user;
// - a cluster that requires a reason refuses a request without one, saying how, and serves it after sealion login
//   --reason;
// - the README's walk-through (its section "Access on request"), run as written with the real CLI and kubectl.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect as connectHttp2, constants as h2 } from 'node:http2';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { stringify } from 'yaml';
import { newAgent, type Agent } from '../agent/agent.ts';
import { newSecretCredentialStore } from '../agent/credentials.ts';
import { detectImpersonation } from '../agent/main.ts';
import {
  ACCESS_REQUEST_EXTRA,
  MAX_PENDING_PER_USER,
  REASON_EXTRA,
  type AccessRequest,
} from '../apis/access.ts';
import type { AuditEvent } from '../concierge/audit/types.ts';
import { addCluster } from '../cli/cluster.ts';
import { agentUpstream, prepareAgentCluster } from '../dev/agent.ts';
import { REPO_ROOT } from '../dev/build.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { dieWithParent, stopChild } from '../dev/processes.ts';
import { writeShim } from '../dev/shim.ts';
import { newKubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { DEFAULT_POLICY, describePolicy } from '../manifests/forwarding-policy.ts';
import { startTokenWebhook, type TokenWebhook } from './harness/token-webhook.ts';
import { clusterStatus } from './harness/cluster-status.ts';
import { startConciergeProcess, type ConciergeProcess } from './harness/concierge-process.ts';

const NS = 'sealion-concierge';
const AGENT_NS = 'sealion-agent';
const SUFFIX = 'sealion.dev';
const ACCESS = `/apis/access.concierge.${SUFFIX}/v1alpha1`;
const ACCESS_REQUESTS = `${ACCESS}/accessrequests`;
/** The README's names: the reviewer, the group, the namespace edge's RBAC lets it read, the proxy's name. */
const REVIEWER = 'bob@example.com';
const ONCALL = 'oncall';
const OPS = 'ops';
const PROXY_NAME = 'proxy.example.com';
/** A user without rights anywhere, who asks. */
const ALICE = 'alice@example.com';
/** Agent-backed clusters, all on the one edge API server, each agent a user of its own there. */
const EDGE = 'edge';
/** Its agent may impersonate users, but no group but system:authenticated (which Sealion sends for every user). */
const NARROW = 'narrow';
/** Its policy requires a reason on every request. */
const PAYMENTS = 'payments';
/** The shortest grant a policy allows: a case that waits for the end waits this long. */
const SHORTEST_GRANT_SECONDS = 60;
/** The creates of one user in the flood, and how many are in flight at once. */
const FLOOD = 10_000;
const FLOOD_CONCURRENCY = 32;

let hub: Cluster;
let edge: Cluster;
let signer: CertificateAuthority;
let webhook: TokenWebhook;
let holder: ConciergeProcess;
let other: ConciergeProcess;
const agents: Agent[] = [];
/** Kubeconfigs, the shim's folder and the CLI's config homes. */
let dir: string;

interface Answer {
  status: number;
  body: string;
  auditID: string;
  contentType: string;
}
interface Cert {
  certPem: string;
  keyPem: string;
}
interface Base {
  url: string;
  ca: string;
}

/** One HTTPS request as `cert`, JSON in and out. */
function send(base: Base, cert: Cert, method: string, path: string, body?: unknown): Promise<Answer> {
  const text = body === undefined ? undefined : JSON.stringify(body);
  return new Promise((done, fail) => {
    const req = request(
      new URL(path.replace(/^\//, ''), base.url.endsWith('/') ? base.url : `${base.url}/`),
      {
        method,
        ca: base.ca,
        agent: false,
        cert: cert.certPem,
        key: cert.keyPem,
        headers: text
          ? { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) }
          : {},
      },
      (res) => {
        let out = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (out += c));
        res.on('end', () =>
          done({
            status: res.statusCode ?? 0,
            body: out,
            auditID: String(res.headers['audit-id'] ?? ''),
            contentType: String(res.headers['content-type'] ?? ''),
          }),
        );
      },
    );
    req.on('error', fail);
    req.end(text);
  });
}

const replica = (r: ConciergeProcess, cluster?: string): Base => ({
  url: cluster ? `${r.url}/clusters/${cluster}/` : `${r.url}/`,
  ca: r.servingCA,
});

/** A client certificate from the replicas' signer: how a user signs in here. */
async function userCert(name: string): Promise<Cert> {
  const issued = await issueCert(signer, { commonName: name, usage: 'client' });
  return { certPem: issued.certPem, keyPem: issued.keyPem };
}

/** An AccessRequest body as a client sends it. */
function accessRequest(spec: Record<string, unknown>, name?: string): Record<string, unknown> {
  return {
    apiVersion: `access.concierge.${SUFFIX}/v1alpha1`,
    kind: 'AccessRequest',
    metadata: name ? { name } : {},
    spec,
  };
}

const decision = (d: 'Approved' | 'Denied' | 'Withdrawn', reason?: string) => ({
  apiVersion: `access.concierge.${SUFFIX}/v1alpha1`,
  kind: 'AccessRequestDecision',
  decision: d,
  ...(reason ? { reason } : {}),
});

const parse = <T>(answer: Answer): T => JSON.parse(answer.body) as T;
const messageOf = (answer: Answer): string => {
  try {
    return String(parse<{ message?: string }>(answer).message ?? '');
  } catch {
    return answer.body;
  }
};

/** The stored object, read as the hub's admin. */
async function stored(name: string): Promise<AccessRequest> {
  const got = await hub.kubectl(['get', `accessrequests.access.concierge.${SUFFIX}`, name, '-o', 'json']);
  if (got.code !== 0) throw new Error(`kubectl get accessrequest ${name}: ${got.stderr}`);
  return JSON.parse(got.stdout) as AccessRequest;
}

async function must(cluster: Cluster, args: string[], input?: string): Promise<string> {
  const result = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  return result.stdout;
}

/** The audit events of a JSON-lines file. */
function auditEvents(path: string): AuditEvent[] {
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as AuditEvent)
    .filter((e) => e.kind === 'Event');
}

/** Edge's own audit event (ResponseComplete) for the request that answered with `auditID`. */
async function edgeEvent(auditID: string): Promise<AuditEvent> {
  return eventually(() => {
    const found = auditEvents(edge.auditLogPath).find(
      (e) => e.auditID === auditID && e.stage === 'ResponseComplete',
    );
    if (!found) throw new Error(`no audit event ${auditID} in edge's log`);
    return found;
  }, 15_000);
}

/** A watch as `cert`: its answer's status, what it delivered so far, and whether (and when) its response ended. */
interface OpenWatch {
  status: Promise<number>;
  text(): string;
  ended: Promise<void>;
  endedAt(): number | undefined;
  close(): void;
}

function openWatch(base: Base, cert: Cert, path: string): OpenWatch {
  let text = '';
  let endedAt: number | undefined;
  let settleStatus: (n: number) => void = () => {};
  const status = new Promise<number>((done) => (settleStatus = done));
  let settleEnded: () => void = () => {};
  const ended = new Promise<void>((done) => (settleEnded = done));
  const req = request(
    new URL(path, base.url),
    { method: 'GET', ca: base.ca, agent: false, cert: cert.certPem, key: cert.keyPem },
    (res) => {
      settleStatus(res.statusCode ?? 0);
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.on('close', () => {
        endedAt ??= Date.now();
        settleEnded();
      });
    },
  );
  req.on('error', () => {
    endedAt ??= Date.now();
    settleStatus(0);
    settleEnded();
  });
  req.end();
  return { status, text: () => text, ended, endedAt: () => endedAt, close: () => req.destroy() };
}

/** A kubeconfig whose contexts are named as `sealion get kubeconfig --all-clusters` names them, for one user. */
function writeKubeconfig(file: string, user: Record<string, unknown>, clusters: string[]): string {
  const b64 = (s: string): string => Buffer.from(s).toString('base64');
  const contexts = ['hub', ...clusters].map((c) => `${PROXY_NAME}/${c}`);
  writeFileSync(
    file,
    stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: ['hub', ...clusters].map((c, i) => ({
        name: contexts[i],
        cluster: {
          server: c === 'hub' ? holder.url : `${holder.url}/clusters/${c}`,
          'certificate-authority-data': b64(holder.servingCA),
        },
      })),
      users: [{ name: 'me', user }],
      contexts: contexts.map((name) => ({ name, context: { cluster: name, user: 'me' } })),
      'current-context': contexts[0],
    }),
    { mode: 0o600 },
  );
  return file;
}

/** The exec plugin a kubeconfig of `sealion get kubeconfig --static-token-env MY_TOKEN --exchange-credential` runs. */
const execUser = () => ({
  exec: {
    apiVersion: 'client.authentication.k8s.io/v1',
    command: process.execPath,
    args: [
      join(REPO_ROOT, 'cli/main.ts'),
      'login',
      'static',
      '--token-env',
      'MY_TOKEN',
      '--exchange',
      '--authenticator-type',
      'webhook',
      '--authenticator-name',
      'hooks',
      '--concierge-endpoint',
      holder.url,
      '--concierge-ca-bundle-data',
      Buffer.from(holder.servingCA).toString('base64'),
    ],
    interactiveMode: 'Never',
  },
});

/** The README section's sh blocks, in order. */
function readmeBlocks(): string[] {
  const readme = readFileSync(join(REPO_ROOT, 'README.md'), 'utf8');
  const start = readme.indexOf('### Access on request');
  if (start < 0) throw new Error('README.md has no section "Access on request"');
  // The next heading of its level or above (an sh block's comments start with # too, but not with ## ).
  const end = readme.slice(start + 1).search(/\n#{2,3} /);
  const section = readme.slice(start, end < 0 ? undefined : start + 1 + end);
  return [...section.matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

/** A person at a shell: a kubeconfig, a config home of their own, the token their plugin exchanges. */
interface Persona {
  kubeconfig: string;
  home: string;
  token?: string;
}

/** The shell a README block runs in: the CLI shim and the harness's kubectl first on PATH. */
function personaEnv(who: Persona): NodeJS.ProcessEnv {
  return {
    ...process.env,
    PATH: `${join(dir, 'bin')}:${dirname(hub.binaries.kubectl)}:${process.env['PATH'] ?? ''}`,
    KUBECONFIG: who.kubeconfig,
    // kubectl's discovery cache too (~/.kube/cache): one person's must not answer for another's.
    HOME: who.home,
    XDG_CONFIG_HOME: who.home,
    EDGE_KUBECONFIG: edge.kubeconfigPath,
    ...(who.token ? { MY_TOKEN: who.token } : {}),
  };
}

/** Runs a README block with bash, as `who`; resolves with its exit code and output. */
function runBlock(
  script: string,
  who: Persona,
): { done: Promise<{ code: number; output: string }>; stop(): Promise<void> } {
  const [command, args] = dieWithParent('bash', ['-euo', 'pipefail', '-c', script]);
  // A group of its own: a stop reaches what the shell started (a sealion that waits, its kubectl).
  const child = spawn(command, args, {
    cwd: dir,
    env: personaEnv(who),
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let output = '';
  const keep = (chunk: Buffer): void => void (output = (output + chunk.toString('utf8')).slice(-16_000));
  child.stdout.on('data', keep);
  child.stderr.on('data', keep);
  const done = new Promise<{ code: number; output: string }>((resolve) => {
    child.on('error', (err) => resolve({ code: -1, output: `${output}\n${String(err)}` }));
    // Once its output is all read, not at its exit.
    child.on('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : -1), output }));
  });
  return { done, stop: () => stopChild(child, { group: true }) };
}

/** Runs one command as `who`, its words as a shell would split them. */
async function runAs(who: Persona, line: string): Promise<{ code: number; output: string }> {
  return runBlock(line, who).done;
}

/** An agent for `cluster` on edge, dialing `holder`, as its user `agentUser` there (prepareAgentCluster's RBAC). */
async function startAgent(cluster: string, agentUser: string, narrowTo?: object[]): Promise<void> {
  const kubeconfig = await prepareAgentCluster(edge, AGENT_NS, DEFAULT_POLICY, agentUser);
  if (narrowTo) {
    // The edge admin's own grant instead of the policy's: users, uids and Sealion's extras, no group but
    // system:authenticated.
    await must(edge, ['delete', 'clusterrolebinding', `${agentUser}-forwarding`]);
    await must(
      edge,
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: [
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'ClusterRole',
            metadata: { name: `${agentUser}-narrow` },
            rules: narrowTo,
          },
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'ClusterRoleBinding',
            metadata: { name: `${agentUser}-narrow` },
            roleRef: {
              apiGroup: 'rbac.authorization.k8s.io',
              kind: 'ClusterRole',
              name: `${agentUser}-narrow`,
            },
            subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: agentUser }],
          },
        ],
      }),
    );
  }
  const impersonation = await detectImpersonation(newKubeClients({ path: kubeconfig }), silentLogger());
  const added = await addCluster(cluster, {
    kubeconfig: hub.kubeconfigPath,
    namespace: NS,
    groupSuffix: SUFFIX,
    hub: '',
    description: '',
  });
  const agent = newAgent({
    cluster,
    hub: new URL(`https://127.0.0.1:${holder.tunnel!.port}`),
    trust: { pin: added.pin },
    bootstrapToken: () => added.token,
    store: newSecretCredentialStore(
      newKubeClients({ path: edge.kubeconfigPath }),
      AGENT_NS,
      `${cluster}-credentials`,
    ),
    upstream: agentUpstream(kubeconfig),
    version: 'access-test',
    forwarding: { policy: narrowTo ? 'clusterrole:narrow' : describePolicy(DEFAULT_POLICY), impersonation },
    log: silentLogger(),
    tunnels: 1,
  });
  agents.push(agent);
  await agent.start();
}

const AUTHN = 'authentication.k8s.io';
/** The narrow agent's grant: it may act as any user with Sealion's extras, in system:authenticated only, to read. */
const NARROW_RULES = [
  { apiGroups: [AUTHN], resources: ['users', 'uids'], verbs: ['impersonate:user-info'] },
  {
    apiGroups: [AUTHN],
    resources: ['groups'],
    resourceNames: ['system:authenticated'],
    verbs: ['impersonate:user-info'],
  },
  {
    apiGroups: [AUTHN],
    resources: [`userextras/${REASON_EXTRA}`, `userextras/${ACCESS_REQUEST_EXTRA}`],
    verbs: ['impersonate:user-info'],
  },
  {
    apiGroups: ['', AUTHN],
    resources: ['pods', 'selfsubjectreviews'],
    verbs: ['get', 'list', 'watch', 'create'].map((v) => `impersonate-on:user-info:${v}`),
  },
];

/** Sets a Cluster's access policy, as the admin does. */
const setAccess = (cluster: string, access: Record<string, unknown>): Promise<string> =>
  must(hub, [
    'patch',
    `clusters.tunnel.concierge.${SUFFIX}`,
    cluster,
    '--type',
    'merge',
    '-p',
    JSON.stringify({ spec: { access } }),
  ]);

let alice: Cert;
let bob: Cert;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-access-'));
  writeShim(join(dir, 'bin'));
  [hub, edge, webhook] = await Promise.all([
    startCluster({ name: 'access-hub', controllerManager: false }),
    startCluster({ name: 'access-edge', controllerManager: false }),
    startTokenWebhook(),
  ]);
  signer = await newCA('access users');
  const signerPems = { certPem: signer.certPem, keyPem: signer.keyPem };
  await must(hub, ['create', 'namespace', NS]);
  // One after the other: each applies the CRDs and the install's RBAC as it starts.
  holder = await startConciergeProcess(hub, {
    tunnel: { port: 0, namespace: NS },
    identity: 'holder',
    signer: signerPems,
  });
  other = await startConciergeProcess(hub, {
    tunnel: { port: 0, namespace: NS },
    identity: 'other',
    signer: signerPems,
  });
  await must(
    hub,
    ['apply', '-f', '-'],
    JSON.stringify({
      apiVersion: `authentication.concierge.${SUFFIX}/v1alpha1`,
      kind: 'WebhookAuthenticator',
      metadata: { name: 'hooks' },
      spec: { endpoint: webhook.url, tls: { certificateAuthorityData: webhook.caData } },
    }),
  );
  for (const ns of [OPS, 'elsewhere']) await must(edge, ['create', 'namespace', ns]);
  await startAgent(EDGE, 'agent-edge');
  await startAgent(NARROW, 'agent-narrow', NARROW_RULES);
  await startAgent(PAYMENTS, 'agent-payments');
  [alice, bob] = await Promise.all([userCert(ALICE), userCert(REVIEWER)]);
  await eventually(async () => {
    for (const cluster of [EDGE, NARROW, PAYMENTS])
      expect(await clusterStatus(hub, cluster)).toMatchObject({ connected: true, replicas: 'holder' });
  }, 60_000);
}, 240_000);

afterAll(async () => {
  await Promise.all(agents.map((a) => a.stop()));
  await Promise.all([holder?.stop(), other?.stop()]);
  await Promise.all([hub?.stop(), edge?.stop(), webhook?.stop()]);
  if (dir) rmSync(dir, { recursive: true, force: true });
});

/** The README's first block, the admin's, run as the hub's admin: edge's policy, the reviewer, edge's RBAC. */
describe("the admin's part of the README's walk-through", () => {
  it('sets edge’s policy, binds the reviewer and lets group oncall read the pods of namespace ops on edge', async () => {
    const blocks = readmeBlocks();
    expect(blocks.length).toBeGreaterThanOrEqual(3);
    const run = await runAs({ kubeconfig: hub.kubeconfigPath, home: join(dir, 'admin') }, blocks[0]!);
    if (run.code !== 0) throw new Error(`exit status ${run.code}: ${run.output}`);
    expect(
      (await must(hub, ['get', `clusters.tunnel.concierge.${SUFFIX}`, EDGE, '-o', 'json'])).length,
    ).toBeGreaterThan(0);
    // The other clusters' policies: narrow lists oncall too; payments requires a reason.
    await setAccess(NARROW, { groups: [ONCALL], maxDurationSeconds: 3600 });
    await setAccess(PAYMENTS, { groups: [ONCALL], maxDurationSeconds: 3600, requireReason: true });
  });
});

/** alice's request, approved in the first block and ended in the last: the cases between run while it lasts. */
const NAME = 'alice-incident';
const REASON = 'INC-4711: checkout pods crash';
let approvedAt = 0;
let watch: OpenWatch | undefined;
/** A certificate alice obtained (TokenCredentialRequest) while the grant held. */
let replayed: Cert | undefined;
afterAll(() => watch?.close());

const podsIn = (via: ConciergeProcess, ns: string, who: Cert = alice) =>
  send(replica(via, EDGE), who, 'GET', `api/v1/namespaces/${ns}/pods`);

describe('a grant, from request to approval', () => {
  it('refuses alice on edge, takes her request, and still refuses her while it is pending', async () => {
    for (const via of [holder, other]) expect((await podsIn(via, OPS)).status).toBe(403);
    const created = await send(
      replica(holder),
      alice,
      'POST',
      ACCESS_REQUESTS,
      accessRequest(
        { clusters: [EDGE], groups: [ONCALL], durationSeconds: SHORTEST_GRANT_SECONDS, reason: REASON },
        NAME,
      ),
    );
    expect({ status: created.status, body: created.body }).toMatchObject({ status: 201 });
    expect(parse<AccessRequest>(created)).toMatchObject({
      metadata: { name: NAME },
      spec: { requester: { username: ALICE } },
      status: { phase: 'Pending', approvalsRequired: 1 },
    });
    // The grant is not a grant yet, on either path.
    for (const via of [holder, other]) expect((await podsIn(via, OPS)).status).toBe(403);
  });

  it('lets no one but a reviewer approve, and never the requester', async () => {
    // alice is no reviewer: the hub's RBAC says no.
    const own = await send(
      replica(holder),
      alice,
      'POST',
      `${ACCESS_REQUESTS}/${NAME}/approval`,
      decision('Approved'),
    );
    expect(own.status).toBe(403);
    // bob is, but not for his own request.
    const bobs = await send(
      replica(other),
      bob,
      'POST',
      ACCESS_REQUESTS,
      accessRequest({ clusters: [EDGE], groups: [ONCALL], durationSeconds: 600, reason: 'INC-1' }, 'bob-own'),
    );
    expect(bobs.status).toBe(201);
    const self = await send(
      replica(holder),
      bob,
      'POST',
      `${ACCESS_REQUESTS}/bob-own/approval`,
      decision('Approved'),
    );
    expect(self.status).toBe(403);
    expect(messageOf(self)).toContain('you cannot approve your own request');
    expect((await stored('bob-own')).status?.phase).toBe('Pending');
  });

  it('is approved by the reviewer, and alice may then do what edge’s RBAC lets oncall do, on both paths', async () => {
    const approved = await send(
      replica(holder),
      bob,
      'POST',
      `${ACCESS_REQUESTS}/${NAME}/approval`,
      decision('Approved', 'on call this week'),
    );
    approvedAt = Date.now();
    expect({ status: approved.status, body: approved.body }).toMatchObject({ status: 200 });
    expect(parse<AccessRequest>(approved).status).toMatchObject({
      phase: 'Approved',
      reviews: [
        expect.objectContaining({ user: REVIEWER, decision: 'Approved', reason: 'on call this week' }),
      ],
    });
    // The next request carries the group: no new login. Each replica sees the approval through its informer.
    for (const via of [holder, other]) {
      const allowed = await eventually(async () => {
        const answer = await podsIn(via, OPS);
        if (answer.status !== 200) throw new Error(`HTTP ${answer.status}: ${answer.body}`);
        return answer;
      }, 10_000);
      // Edge's own audit log shows why, and under which grant.
      const event = await edgeEvent(allowed.auditID);
      expect(event.impersonatedUser).toMatchObject({
        username: ALICE,
        groups: expect.arrayContaining([ONCALL]) as unknown,
        extra: { [REASON_EXTRA]: [REASON], [ACCESS_REQUEST_EXTRA]: [NAME] },
      });
      // Exactly what edge's RBAC lets oncall do: read ops, not elsewhere, not write.
      expect((await podsIn(via, 'elsewhere')).status).toBe(403);
      const write = await send(replica(via, EDGE), alice, 'POST', `api/v1/namespaces/${OPS}/configmaps`, {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'nope' },
      });
      expect(write.status).toBe(403);
    }
    // The grant is edge's only: on the hub alice is who she was.
    expect((await send(replica(holder), alice, 'GET', 'api/v1/namespaces/kube-system/pods')).status).toBe(
      403,
    );
  });

  it('opens a watch through the peer hop, and a credential obtained during the grant', async () => {
    watch = openWatch(replica(other, EDGE), alice, `api/v1/namespaces/${OPS}/pods?watch=1`);
    expect(await watch.status).toBe(200);
    const token = webhook.grant({ username: ALICE });
    const tcr = await send(
      replica(holder),
      alice,
      'POST',
      `/apis/login.concierge.${SUFFIX}/v1alpha1/tokencredentialrequests`,
      {
        apiVersion: `login.concierge.${SUFFIX}/v1alpha1`,
        kind: 'TokenCredentialRequest',
        spec: {
          token,
          authenticator: {
            apiGroup: `authentication.concierge.${SUFFIX}`,
            kind: 'WebhookAuthenticator',
            name: 'hooks',
          },
        },
      },
    );
    expect(tcr.status).toBe(201);
    const credential = parse<{
      status: { credential: { clientCertificateData: string; clientKeyData: string } };
    }>(tcr).status.credential;
    replayed = { certPem: credential.clientCertificateData, keyPem: credential.clientKeyData };
    expect((await podsIn(holder, OPS, replayed)).status).toBe(200);
  });
});

describe('hostile requests', () => {
  let carol: Cert;
  beforeAll(async () => {
    carol = await userCert('carol@example.com');
  });
  const create = (who: Cert, spec: Record<string, unknown>, name?: string) =>
    send(replica(holder), who, 'POST', ACCESS_REQUESTS, accessRequest(spec, name));
  const BASE = { clusters: [EDGE], groups: [ONCALL], durationSeconds: 600, reason: 'INC-2' };

  it('stores the authenticated requester, whatever the body says', async () => {
    const answer = await create(
      carol,
      { ...BASE, requester: { username: REVIEWER, groups: ['system:masters'] } },
      'written-requester',
    );
    expect({ status: answer.status, body: answer.body }).toMatchObject({ status: 201 });
    const saved = await stored('written-requester');
    expect(saved.spec.requester.username).toBe('carol@example.com');
    expect(saved.spec.requester.groups ?? []).not.toContain('system:masters');
    expect(saved.status?.requester).toBe('carol@example.com');
    // The requester withdraws it, through the other replica.
    const withdrawn = await send(
      replica(other),
      carol,
      'POST',
      `${ACCESS_REQUESTS}/written-requester/withdrawal`,
      decision('Withdrawn'),
    );
    expect(withdrawn.status).toBe(200);
    expect((await stored('written-requester')).status?.phase).toBe('Withdrawn');
  });

  it.each([
    ['a group the policy does not list', { groups: ['cluster-admins'] }, [403], 'cluster-admins'],
    ['a duration over the policy’s longest', { durationSeconds: 7200 }, [403, 422], 'durationSeconds'],
    [
      'a reason with control characters',
      { reason: 'INC-3\u001b]0;owned\u0007' },
      [400, 422],
      'control characters',
    ],
  ])('refuses %s, with a Status that says why', async (_what, change, codes, why) => {
    const answer = await create(carol, { ...BASE, ...change });
    expect(messageOf(answer)).toContain(why);
    expect([answer.status, answer.body]).toEqual([
      codes.includes(answer.status) ? answer.status : codes,
      answer.body,
    ]);
    expect(parse(answer)).toMatchObject({ kind: 'Status', code: answer.status });
    expect(answer.body).not.toContain('\u001b');
  });

  it(`holds ${FLOOD} creates from one user to ${MAX_PENDING_PER_USER} pending, the rest 429, and serves others meanwhile`, async () => {
    const mallory = await userCert('mallory@example.com');
    const session = connectHttp2(holder.url, {
      ca: holder.servingCA,
      cert: mallory.certPem,
      key: mallory.keyPem,
    });
    session.on('error', () => {});
    const body = JSON.stringify(
      accessRequest({ clusters: [EDGE], groups: [ONCALL], durationSeconds: 600, reason: 'flood' }),
    );
    const statuses = new Map<number, number>();
    let refusal = '';
    const one = (): Promise<number> =>
      new Promise((done) => {
        const stream = session.request({
          [h2.HTTP2_HEADER_METHOD]: 'POST',
          [h2.HTTP2_HEADER_PATH]: ACCESS_REQUESTS,
          'content-type': 'application/json',
        });
        let status = 0;
        let text = '';
        stream.setEncoding('utf8');
        stream.on('response', (headers) => (status = Number(headers[h2.HTTP2_HEADER_STATUS])));
        stream.on('data', (c: string) => (text += c));
        stream.on('end', () => {
          if (status === 429 && !refusal) refusal = text;
          done(status);
        });
        stream.on('error', () => done(0));
        stream.end(body);
      });
    let sent = 0;
    const lane = async (): Promise<void> => {
      while (sent < FLOOD) {
        sent++;
        const status = await one();
        statuses.set(status, (statuses.get(status) ?? 0) + 1);
      }
    };
    // Another user's requests meanwhile, one after another: each must be answered.
    let flooding = true;
    const served: number[] = [];
    const bystander = (async () => {
      while (flooding) served.push((await send(replica(holder), bob, 'GET', 'version')).status);
    })();
    try {
      await Promise.all(Array.from({ length: FLOOD_CONCURRENCY }, lane));
    } finally {
      flooding = false;
      await bystander;
      session.close();
    }
    expect(Object.fromEntries(statuses)).toEqual({
      201: MAX_PENDING_PER_USER,
      429: FLOOD - MAX_PENDING_PER_USER,
    });
    expect(JSON.parse(refusal)).toMatchObject({ kind: 'Status', code: 429 });
    expect(served.length).toBeGreaterThan(0);
    expect(served.filter((s) => s !== 200)).toEqual([]);
    expect(holder.alive()).toBe(true);
    const all = JSON.parse(
      await must(hub, ['get', `accessrequests.access.concierge.${SUFFIX}`, '-o', 'json']),
    ) as { items: AccessRequest[] };
    const pending = all.items.filter(
      (r) => r.spec.requester.username === 'mallory@example.com' && r.status?.phase === 'Pending',
    );
    expect(pending).toHaveLength(MAX_PENDING_PER_USER);
  }, 180_000);
});

describe('an edge whose agent may not impersonate the group', () => {
  it('refuses, though the hub approved', async () => {
    const carol = await userCert('carol@example.com');
    const pods = (via: ConciergeProcess) =>
      send(replica(via, NARROW), carol, 'GET', `api/v1/namespaces/${OPS}/pods`);
    // Before: the agent may act as carol, and edge's RBAC refuses her.
    const before = await pods(holder);
    expect(before.status).toBe(403);
    expect(messageOf(before)).toContain('cannot list resource "pods"');
    const created = await send(
      replica(holder),
      carol,
      'POST',
      ACCESS_REQUESTS,
      accessRequest(
        { clusters: [NARROW], groups: [ONCALL], durationSeconds: 600, reason: 'INC-5' },
        'carol-narrow',
      ),
    );
    expect(created.status).toBe(201);
    const approved = await send(
      replica(other),
      bob,
      'POST',
      `${ACCESS_REQUESTS}/carol-narrow/approval`,
      decision('Approved'),
    );
    expect(approved.status).toBe(200);
    // After: the request carries group oncall, which edge does not let this agent assert.
    for (const via of [holder, other])
      await eventually(async () => {
        const after = await pods(via);
        expect(after.status).toBe(403);
        expect(messageOf(after)).toContain(`cannot impersonate:user-info resource "groups"`);
      }, 10_000);
  });
});

/** The README block's command lines, each a line that starts with `word`. */
const linesOf = (block: string, word: string): string[] =>
  block.split('\n').filter((line) => line.startsWith(`${word} `));

describe('a cluster that requires a reason', () => {
  it('refuses a request without one, saying how, and serves it after sealion login --reason', async () => {
    const DAVE = 'dave@example.com';
    // The README's admin block made the role on edge; dave holds it himself.
    await must(edge, [
      '-n',
      OPS,
      'create',
      'rolebinding',
      'dave-pods',
      '--role=pod-reader',
      `--user=${DAVE}`,
    ]);
    const dave: Persona = {
      kubeconfig: writeKubeconfig(join(dir, 'dave.kubeconfig'), execUser(), [EDGE, PAYMENTS]),
      home: mkdtempSync(join(dir, 'dave-')),
      token: webhook.grant({ username: DAVE }),
    };
    const block = readmeBlocks()[3]!;
    const [kubectlLine] = linesOf(block, 'kubectl');
    expect(kubectlLine).toContain(`${PROXY_NAME}/${PAYMENTS}`);
    const reason = /--reason "([^"]+)"/.exec(block)![1]!;
    // Without a reason: refused before it is forwarded, with what to run.
    const how = `cluster ${PAYMENTS} requires a reason for every request: run sealion login --reason`;
    const plain = await send(
      replica(other, PAYMENTS),
      await userCert(DAVE),
      'GET',
      `api/v1/namespaces/${OPS}/pods`,
    );
    expect({ status: plain.status, body: plain.body }).toMatchObject({
      status: 403,
      body: expect.stringContaining(how),
    });
    expect(parse(plain)).toMatchObject({ kind: 'Status', code: 403, message: expect.stringContaining(how) });
    expect(plain.contentType).toBe('application/json');
    const refused = await runAs(dave, kubectlLine!);
    expect(refused.code).not.toBe(0);
    // Discovery is served without a reason, so kubectl goes on to the request itself and prints its refusal.
    expect(refused.output).toContain(`Error from server (Forbidden): ${how}`);
    // An access request for it needs one too.
    const noReason = await send(
      replica(holder),
      await userCert(DAVE),
      'POST',
      ACCESS_REQUESTS,
      accessRequest({ clusters: [PAYMENTS], groups: [ONCALL], durationSeconds: 600 }),
    );
    expect(noReason.status).toBeGreaterThanOrEqual(400);
    expect(messageOf(noReason)).toMatch(/reason/);
    // The README's block: the reason, then the same request.
    const run = await runAs(dave, block);
    if (run.code !== 0) throw new Error(`exit status ${run.code}: ${run.output}`);
    await eventually(() => {
      const event = auditEvents(edge.auditLogPath).find(
        (e) =>
          e.impersonatedUser?.username === DAVE &&
          e.stage === 'ResponseComplete' &&
          e.requestURI.startsWith(`/api/v1/namespaces/${OPS}/pods`),
      );
      expect(event?.impersonatedUser?.extra).toMatchObject({ [REASON_EXTRA]: [reason] });
      expect(event?.responseStatus?.code).toBe(200);
    }, 15_000);
  });
});

describe('a cluster that requires a reason, through a grant', () => {
  it('serves a request that carries an approved access request’s reason', async () => {
    const GINA = 'gina@example.com';
    const gina = await userCert(GINA);
    const pods = (via: ConciergeProcess) =>
      send(replica(via, PAYMENTS), gina, 'GET', `api/v1/namespaces/${OPS}/pods`);
    expect((await pods(holder)).status).toBe(403);
    const reason = 'INC-4712: payments timeouts';
    const created = await send(
      replica(holder),
      gina,
      'POST',
      ACCESS_REQUESTS,
      accessRequest(
        { clusters: [PAYMENTS], groups: [ONCALL], durationSeconds: 600, reason },
        'gina-payments',
      ),
    );
    expect(created.status).toBe(201);
    const approved = await send(
      replica(holder),
      bob,
      'POST',
      `${ACCESS_REQUESTS}/gina-payments/approval`,
      decision('Approved'),
    );
    expect(approved.status).toBe(200);
    for (const via of [holder, other]) {
      const allowed = await eventually(async () => {
        const answer = await pods(via);
        if (answer.status !== 200) throw new Error(`HTTP ${answer.status}: ${answer.body}`);
        return answer;
      }, 10_000);
      expect((await edgeEvent(allowed.auditID)).impersonatedUser?.extra).toMatchObject({
        [REASON_EXTRA]: [reason],
        [ACCESS_REQUEST_EXTRA]: ['gina-payments'],
      });
    }
  });
});

describe("the README's walk-through: the on-call engineer and the reviewer", () => {
  it('runs as written: ask and wait, approve, use, withdraw', async () => {
    const [, asks, reviews] = readmeBlocks();
    const ERIN = 'erin@example.com';
    const b64 = (s: string): string => Buffer.from(s).toString('base64');
    const erin: Persona = {
      kubeconfig: writeKubeconfig(join(dir, 'erin.kubeconfig'), execUser(), [EDGE, PAYMENTS]),
      home: mkdtempSync(join(dir, 'erin-')),
      token: webhook.grant({ username: ERIN }),
    };
    const reviewer: Persona = {
      kubeconfig: writeKubeconfig(
        join(dir, 'bob.kubeconfig'),
        { 'client-certificate-data': b64(bob.certPem), 'client-key-data': b64(bob.keyPem) },
        [EDGE],
      ),
      home: mkdtempSync(join(dir, 'bob-')),
    };
    const name = /--name (\S+)/.exec(asks!)![1]!;
    const engineer = runBlock(asks!, erin);
    try {
      // The reviewer acts once the request is there to see.
      await eventually(async () => expect((await stored(name)).status?.phase).toBe('Pending'), 30_000);
      const review = await runAs(reviewer, reviews!);
      if (review.code !== 0) throw new Error(`exit status ${review.code}: ${review.output}`);
      expect(review.output).toContain(name);
      const asked = await engineer.done;
      if (asked.code !== 0) throw new Error(`exit status ${asked.code}: ${asked.output}`);
      // whoami shows the grant and when it ends.
      expect(asked.output).toMatch(new RegExp(`Grant: ${name}\\s+groups ${ONCALL} on ${EDGE}, ends \\d{4}-`));
    } finally {
      await engineer.stop();
    }
    const after = await stored(name);
    expect(after.spec.requester.username).toBe(ERIN);
    expect(after.status?.reviews?.map((r) => [r.user, r.decision])).toEqual([
      [REVIEWER, 'Approved'],
      [ERIN, 'Withdrawn'],
    ]);
    expect(after.status?.phase).toBe('Withdrawn');
    // The grant ended with it: the engineer's next request is refused again, as edge's RBAC refuses erin.
    const [use] = linesOf(asks!, 'kubectl');
    await eventually(async () => {
      const again = await runAs(erin, use!);
      expect(again.code).not.toBe(0);
      expect(again.output).toContain(`User "${ERIN}" cannot list resource "pods"`);
    }, 10_000);
  }, 120_000);
});

describe('at the grant’s end', () => {
  it(
    'refuses alice again, ends the watch that used it, and refuses a credential obtained during it',
    async () => {
      expect(approvedAt).toBeGreaterThan(0);
      // The watch held until now.
      expect(watch!.endedAt()).toBeUndefined();
      await eventually(
        async () => {
          for (const via of [holder, other]) expect((await podsIn(via, OPS)).status).toBe(403);
        },
        (SHORTEST_GRANT_SECONDS + 30) * 1000,
        500,
      );
      // A watch has no channel for a message: it ends at an event's boundary, its response complete, as the API
      // server ends one at its timeout (a client resumes it, and is refused). Upgraded sessions get the message.
      await watch!.ended;
      const credential = replayed;
      if (!credential) throw new Error('no credential was obtained during the grant');
      for (const via of [holder, other]) expect((await podsIn(via, OPS, credential)).status).toBe(403);
    },
    (SHORTEST_GRANT_SECONDS + 60) * 1000,
  );
});
