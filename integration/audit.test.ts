// Audit, with the API server as the oracle. One audit policy file is given to a real kube-apiserver and to the
// concierge; each case is sent straight to the API server by a user with a client certificate of the cluster's CA,
// and through Sealion by the same user with a certificate of Sealion's signer. Sealion's events must say what the
// API server's say (level, stages, verb, object, user, whom they impersonate, the answer's code), and the request
// Sealion forwarded must have its events in the API server's log under the same audit ID, acting for the user.
// Nothing private reaches Sealion's audit log or its operational log: not the user's key, not a token.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { readFileSync, rmSync, writeFileSync, mkdtempSync, existsSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadPolicy } from '../concierge/audit/policy.ts';
import type { AuditEvent } from '../concierge/audit/types.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { newLogger } from '../lib/log.ts';
import { issueCert, type CertificateAuthority } from '../lib/pki/pki.ts';
import { IMPERSONATOR_SERVICE_ACCOUNT, DEFAULT_NAMESPACE } from '../apis/install.ts';

const NS = 'audited';
/** A token sent to the TokenCredentialRequest API, which no sink or log may ever hold. */
const SECRET_TOKEN = 'eyJhbGciOiJSUzI1NiJ9.never-in-any-sink.c2VjcmV0';

/** Exercises every kind of rule: users, groups, verbs, resources (with subresources and names), namespaces, URLs. */
const POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: [quiet]
  - level: RequestResponse
    userGroups: [auditors]
    verbs: [create]
  - level: None
    nonResourceURLs: [/version, /healthz*]
  - level: RequestResponse
    userGroups: [system:authenticated]
    namespaces: [default]
    verbs: [list]
  - level: Request
    resources: [{group: '', resources: [configmaps]}]
    verbs: [create, update]
  - level: Metadata
    resources: [{group: '', resources: [secrets]}]
  - level: Request
    resources: [{group: '', resources: ['pods/*'], resourceNames: [special]}]
  - level: Metadata
    namespaces: [${NS}]
    omitStages: [ResponseStarted]
  - level: Metadata
`;

interface Case {
  name: string;
  user: string;
  groups?: string[];
  method?: string;
  path: string;
  body?: object;
  headers?: Record<string, string>;
}

const CASES: Case[] = [
  { name: 'a list, allowed', user: 'alice', groups: ['devs'], path: `/api/v1/namespaces/${NS}/pods` },
  {
    name: 'a get of nothing: 404',
    user: 'alice',
    groups: ['devs'],
    path: `/api/v1/namespaces/${NS}/configmaps/none`,
  },
  {
    name: 'a create, with its body (Request)',
    user: 'alice',
    groups: ['devs'],
    method: 'POST',
    path: `/api/v1/namespaces/${NS}/configmaps`,
    body: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { generateName: 'a-' }, data: { k: 'v' } },
  },
  {
    name: 'a create by an auditor (RequestResponse)',
    user: 'carol',
    groups: ['auditors', 'devs'],
    method: 'POST',
    path: `/api/v1/namespaces/${NS}/configmaps`,
    body: { apiVersion: 'v1', kind: 'ConfigMap', metadata: { generateName: 'c-' } },
  },
  {
    name: 'a create that names its object (Metadata: the name comes from the body)',
    user: 'alice',
    groups: ['devs'],
    method: 'POST',
    path: `/api/v1/namespaces/${NS}/services?dryRun=All`,
    body: {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: 'named' },
      spec: { ports: [{ port: 80 }] },
    },
  },
  {
    name: 'a refused create that names its object (never decoded: no name)',
    user: 'bob',
    method: 'POST',
    path: `/api/v1/namespaces/${NS}/services?dryRun=All`,
    body: { apiVersion: 'v1', kind: 'Service', metadata: { name: 'named' }, spec: { ports: [{ port: 80 }] } },
  },
  { name: 'a refused get: 403', user: 'bob', path: `/api/v1/namespaces/${NS}/pods` },
  {
    name: 'a rule for system:authenticated, which every user is in',
    user: 'alice',
    groups: ['devs'],
    path: '/api/v1/namespaces/default/pods',
  },
  { name: 'a refused secret', user: 'bob', path: `/api/v1/namespaces/${NS}/secrets/s` },
  {
    name: 'a watch',
    user: 'alice',
    groups: ['devs'],
    path: '/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1',
  },
  {
    name: 'a watch in the namespace that omits ResponseStarted',
    user: 'alice',
    groups: ['devs'],
    path: `/api/v1/namespaces/${NS}/pods?watch=1&timeoutSeconds=1`,
  },
  { name: 'a URL the policy leaves out', user: 'alice', groups: ['devs'], path: '/version' },
  { name: 'a non-resource URL', user: 'alice', groups: ['devs'], path: '/api' },
  { name: 'a user the policy leaves out', user: 'quiet', path: `/api/v1/namespaces/${NS}/pods` },
  {
    name: 'a subresource by name',
    user: 'alice',
    groups: ['devs'],
    path: `/api/v1/namespaces/${NS}/pods/special/log`,
  },
  {
    name: 'impersonating someone',
    user: 'alice',
    groups: ['devs'],
    path: `/api/v1/namespaces/${NS}/pods`,
    headers: { 'impersonate-user': 'bob' },
  },
];

interface Answer {
  status: number;
  auditID: string;
}

function call(base: string, ca: string, cert: { certPem: string; keyPem: string }, c: Case): Promise<Answer> {
  return new Promise((done, fail) => {
    const body = c.body ? JSON.stringify(c.body) : undefined;
    const req = request(
      new URL(c.path, base),
      {
        method: c.method ?? 'GET',
        ca,
        cert: cert.certPem,
        key: cert.keyPem,
        headers: {
          'user-agent': 'audit-test/1.0',
          ...(body ? { 'content-type': 'application/json' } : {}),
          ...c.headers,
          // A client's own Audit-ID: the API server adopts it, Sealion replaces it.
          'audit-id': `client-chosen-${c.name.replace(/\W/g, '-')}`,
        },
      },
      (res) => {
        res.resume();
        res.on('end', () =>
          done({ status: res.statusCode ?? 0, auditID: String(res.headers['audit-id'] ?? '') }),
        );
      },
    );
    req.on('error', fail);
    req.end(body);
  });
}

function events(path: string): AuditEvent[] {
  if (!existsSync(path)) return [];
  return readFileSync(path, 'utf8')
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as AuditEvent)
    .filter((e) => e.kind === 'Event');
}

/** What the two sides must agree on, for the events of one request. */
function projection(list: AuditEvent[]): object[] {
  return list
    .map((e) => ({
      level: e.level,
      stage: e.stage,
      verb: e.verb,
      objectRef: e.objectRef,
      user: { username: e.user.username, groups: [...(e.user.groups ?? [])].sort() },
      impersonatedUser: e.impersonatedUser?.username,
      code: e.responseStatus?.code,
      requestObject: e.requestObject !== undefined,
      responseObject: e.responseObject !== undefined,
      userAgent: e.userAgent,
    }))
    .sort((a, b) => a.stage.localeCompare(b.stage));
}

describe('audit, as the API server audits', () => {
  let cluster: Cluster;
  let proxy: LocalConcierge;
  let dir: string;
  let sealionLog: string;
  let operational: string[];
  const answers = new Map<string, { direct: Answer; through: Answer }>();
  const keys: string[] = [];

  const certFor = async (ca: CertificateAuthority, c: Case) => {
    const cert = await issueCert(ca, { commonName: c.user, organizations: c.groups ?? [], usage: 'client' });
    keys.push(cert.keyPem);
    return cert;
  };

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-audit-'));
    const policyFile = join(dir, 'policy.yaml');
    writeFileSync(policyFile, POLICY);
    sealionLog = join(dir, 'sealion-audit.log');
    cluster = await startCluster({
      name: 'audit',
      controllerManager: false,
      apiserverArgs: [`--audit-policy-file=${policyFile}`],
    });
    operational = [];
    proxy = await startLocalConcierge(cluster, {
      audit: { policy: loadPolicy(POLICY), log: { path: sealionLog } },
      log: newLogger({
        level: 'debug',
        destination: { write: (line: string) => void operational.push(line) },
      }),
    });
    const apply = async (args: string[]): Promise<void> => {
      const r = await cluster.kubectl(args);
      if (r.code !== 0) throw new Error(r.stderr);
    };
    await apply(['create', 'namespace', NS]);
    await apply([
      'create',
      'clusterrole',
      'devs',
      '--verb=get,list,watch,create',
      '--resource=pods,pods/log,configmaps,services',
    ]);
    await apply(['create', 'clusterrolebinding', 'devs', '--clusterrole=devs', '--group=devs']);
    await apply([
      'create',
      'clusterrole',
      'impersonate-bob',
      '--verb=impersonate',
      '--resource=users',
      '--resource-name=bob',
    ]);
    await apply([
      'create',
      'clusterrolebinding',
      'impersonate-bob',
      '--clusterrole=impersonate-bob',
      '--user=alice',
    ]);
    for (const c of CASES) {
      const direct = await call(cluster.url, cluster.ca.certPem, await certFor(cluster.ca, c), c);
      const through = await call(proxy.url, proxy.servingCA.certPem, await certFor(proxy.signerCA, c), c);
      answers.set(c.name, { direct, through });
    }
  }, 180_000);

  afterAll(async () => {
    await proxy?.stop();
    await cluster?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  it.each(CASES.map((c) => [c.name, c] as const))(
    '%s: the same answer and the same events',
    async (_name, c) => {
      const { direct, through } = answers.get(c.name)!;
      expect(through.status).toBe(direct.status);
      // The API server kept the client's ID; Sealion gave the request its own, which the API server then adopted.
      expect(direct.auditID).toMatch(/^client-chosen-/);
      expect(through.auditID).not.toMatch(/^client-chosen-/);
      expect(through.auditID).toMatch(/^[0-9a-f-]{36}$/);
      await eventually(() => {
        const oracle = events(cluster.auditLogPath).filter((e) => e.auditID === direct.auditID);
        const ours = events(sealionLog).filter((e) => e.auditID === through.auditID);
        expect(projection(ours)).toEqual(projection(oracle));
        // The join: what Sealion forwarded is in the API server's log under Sealion's ID, as the forwarding identity
        // acting for the user (the policy there is evaluated for the forwarding identity: its events may differ).
        if (ours.length > 0) {
          const joined = events(cluster.auditLogPath).filter((e) => e.auditID === through.auditID);
          expect(joined.length).toBeGreaterThan(0);
          for (const e of joined) {
            expect(e.user.username).toBe(
              `system:serviceaccount:${DEFAULT_NAMESPACE}:${IMPERSONATOR_SERVICE_ACCOUNT}`,
            );
            expect(e.impersonatedUser?.username).toBe(c.headers?.['impersonate-user'] ?? c.user);
          }
          for (const e of ours) {
            expect(e.annotations?.['sealion.dev/route']).toBe('local');
            expect(e.annotations?.['sealion.dev/authenticator']).toBe('certificate');
            expect(e.sourceIPs).toEqual(['127.0.0.1']);
          }
        }
      }, 15_000);
    },
  );

  it("audits Sealion's own APIs: a TokenCredentialRequest (anonymous) and a WhoAmIRequest", async () => {
    const post = (path: string, body: object, cert?: { certPem: string; keyPem: string }) =>
      new Promise<Answer>((done, fail) => {
        const text = JSON.stringify(body);
        const req = request(
          new URL(path, proxy.url),
          {
            method: 'POST',
            ca: proxy.servingCA.certPem,
            ...(cert ? { cert: cert.certPem, key: cert.keyPem } : {}),
            headers: { 'content-type': 'application/json' },
          },
          (res) => {
            res.resume();
            res.on('end', () => done({ status: res.statusCode ?? 0, auditID: '' }));
          },
        );
        req.on('error', fail);
        req.end(text);
      });
    const login = '/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests';
    const whoami = '/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests';
    expect(
      (
        await post(login, {
          apiVersion: 'login.concierge.sealion.dev/v1alpha1',
          kind: 'TokenCredentialRequest',
          spec: {
            token: SECRET_TOKEN,
            authenticator: {
              apiGroup: 'authentication.concierge.sealion.dev',
              kind: 'JWTAuthenticator',
              name: 'x',
            },
          },
        })
      ).status,
    ).toBe(201);
    const cert = await certFor(proxy.signerCA, { name: 'whoami', user: 'dana', groups: ['devs'], path: '' });
    expect(
      (
        await post(
          whoami,
          { apiVersion: 'identity.concierge.sealion.dev/v1alpha1', kind: 'WhoAmIRequest' },
          cert,
        )
      ).status,
    ).toBe(201);
    await eventually(() => {
      const all = events(sealionLog);
      expect(all.find((e) => e.requestURI === login)).toMatchObject({
        user: { username: 'system:anonymous', groups: ['system:unauthenticated'] },
        objectRef: { resource: 'tokencredentialrequests', apiGroup: 'login.concierge.sealion.dev' },
        responseStatus: { code: 201 },
      });
      expect(all.find((e) => e.requestURI === whoami)).toMatchObject({
        user: { username: 'dana' },
        objectRef: { resource: 'whoamirequests', apiGroup: 'identity.concierge.sealion.dev' },
        responseStatus: { code: 201 },
        annotations: { 'sealion.dev/authenticator': 'certificate' },
      });
    });
  });

  it('keeps keys and tokens out of the audit log and the operational log', async () => {
    const audit = readFileSync(sealionLog, 'utf8');
    expect(audit).not.toContain(SECRET_TOKEN);
    expect(operational.join('')).not.toContain(SECRET_TOKEN);
    const logs = operational.join('');
    for (const key of keys) {
      const body = key.split('\n').slice(1, 3).join('');
      expect(audit).not.toContain(body);
      expect(logs).not.toContain(body);
    }
    expect(audit).not.toMatch(/authorization|bearer/i);
  });
});
