// The direct path on a self-hosted-looking cluster (a control-plane node, no managed provider's marks) in mode auto:
// the concierge serves TokenCredentialRequest and WhoAmIRequest as aggregated APIs of the cluster's real API server,
// which reaches them through an APIService and checks the front proxy's headers, and the certificates users get are
// signed by the cluster's own controller-manager through the CSR API. Users then talk to the API server directly,
// and its RBAC answers them.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { X509Certificate } from 'node:crypto';
import { mkdtempSync, readFileSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { networkInterfaces } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { CONFIG_MAP_NAME } from '../apis/install.ts';
import type { CredentialIssuerStrategy } from '../apis/config.ts';
import { kubeconfigYaml, runKubectl, startCluster, type Cluster } from '../dev/cluster.ts';
import { startControlledConcierge, type ControlledConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { runSealion } from '../dev/processes.ts';
import { issueCert, loadCA } from '../lib/pki/pki.ts';
import { startTokenWebhook, type TokenWebhook } from './harness/token-webhook.ts';

const NS = 'sealion-direct';
const SUFFIX = 'sealion.dev';
const LOGIN = `login.concierge.${SUFFIX}`;
const IDENTITY = `identity.concierge.${SUFFIX}`;
const API_SERVICE = 'sealion-concierge-api';
/** What the authenticator asks for: longer than the signer's 10-minute minimum, so it is what certificates get. */
const LIFETIME_SECONDS = 900;

let cluster: Cluster;
let webhook: TokenWebhook;
let concierge: ControlledConcierge;
/** The machine's own address: the API server dials the aggregated APIs at an endpoint address, never loopback. */
let host: string;

function machineAddress(): string {
  for (const addresses of Object.values(networkInterfaces()))
    for (const a of addresses ?? []) if (a.family === 'IPv4' && !a.internal) return a.address;
  throw new Error(
    'this machine has no non-loopback IPv4 address for the API server to reach the concierge at',
  );
}

async function kubectlOk(args: string[], input?: string): Promise<string> {
  const result = await cluster.kubectl(args, input === undefined ? {} : { input });
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  return result.stdout;
}

const apply = (...items: object[]): Promise<string> =>
  kubectlOk(['apply', '-f', '-'], JSON.stringify({ apiVersion: 'v1', kind: 'List', items }));

interface Answer {
  status: number;
  body: string;
}

/** One HTTPS request with the given TLS client identity (none: anonymous). */
function call(
  url: string,
  opts: {
    method?: string;
    body?: string;
    ca: string;
    cert?: string;
    key?: string;
    headers?: Record<string, string>;
  },
): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = request(
      url,
      {
        method: opts.method ?? 'GET',
        ca: opts.ca,
        ...(opts.cert ? { cert: opts.cert, key: opts.key } : {}),
        // The aggregated listener's certificate names the Service, not this address.
        checkServerIdentity: () => undefined,
        headers: {
          ...(opts.body ? { 'content-type': 'application/json' } : {}),
          accept: 'application/json, */*',
          ...opts.headers,
        },
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => done({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      },
    );
    req.on('error', fail);
    req.end(opts.body);
  });
}

/** A TokenCredentialRequest as Pinniped's CLI sends one: anonymous, to the API server, with these fields. */
function tokenCredentialRequest(token: string, name = 'corp'): string {
  return JSON.stringify({
    kind: 'TokenCredentialRequest',
    apiVersion: `${LOGIN}/v1alpha1`,
    metadata: { creationTimestamp: null },
    spec: {
      token,
      authenticator: { apiGroup: `authentication.concierge.${SUFFIX}`, kind: 'WebhookAuthenticator', name },
    },
    status: {},
  });
}

interface Credential {
  expirationTimestamp: string;
  clientCertificateData: string;
  clientKeyData: string;
}

async function login(token: string): Promise<{ credential?: Credential; message?: string }> {
  const answer = await call(`${cluster.url}/apis/${LOGIN}/v1alpha1/tokencredentialrequests`, {
    method: 'POST',
    body: tokenCredentialRequest(token),
    ca: cluster.ca.certPem,
  });
  expect(answer.status).toBe(201);
  return (JSON.parse(answer.body) as { status: { credential?: Credential; message?: string } }).status;
}

function directKubeconfig(credential: Credential, user: string): string {
  const path = join(cluster.dir, `direct-${user}.kubeconfig`);
  writeFileSync(
    path,
    kubeconfigYaml('direct', cluster.url, cluster.ca.certPem, {
      name: user,
      certPem: credential.clientCertificateData,
      keyPem: credential.clientKeyData,
    }),
  );
  return path;
}

const strategies = async (): Promise<CredentialIssuerStrategy[]> =>
  (
    JSON.parse(
      await kubectlOk(['get', `credentialissuers.config.concierge.${SUFFIX}`, CONFIG_MAP_NAME, '-o', 'json']),
    ) as {
      status?: { strategies?: CredentialIssuerStrategy[] };
    }
  ).status?.strategies ?? [];

beforeAll(async () => {
  host = machineAddress();
  cluster = await startCluster({ name: 'selfhosted' });
  webhook = await startTokenWebhook();
  await apply(
    { apiVersion: 'v1', kind: 'Namespace', metadata: { name: NS } },
    // Self-hosted-looking: a control-plane node, nothing a managed provider marks its nodes with.
    {
      apiVersion: 'v1',
      kind: 'Node',
      metadata: { name: 'cp-1', labels: { 'node-role.kubernetes.io/control-plane': '' } },
    },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: CONFIG_MAP_NAME, namespace: NS },
      data: {
        'config.yaml': stringify({ impersonationProxy: { mode: 'auto' }, kubeCertAgent: { mode: 'auto' } }),
      },
    },
  );
  concierge = await startControlledConcierge(cluster, {
    namespace: NS,
    configMap: CONFIG_MAP_NAME,
    identity: 'direct-1',
    aggregatedApi: { host, port: 0, service: API_SERVICE },
  });
  const port = concierge.concierge.aggregatedApiPort!;
  // What a Deployment's Service and its endpoints would be, for a concierge running on this machine.
  await apply(
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: API_SERVICE, namespace: NS },
      spec: { ports: [{ name: 'https', port: 443, targetPort: port, protocol: 'TCP' }] },
    },
    {
      apiVersion: 'discovery.k8s.io/v1',
      kind: 'EndpointSlice',
      metadata: {
        name: `${API_SERVICE}-local`,
        namespace: NS,
        labels: { 'kubernetes.io/service-name': API_SERVICE },
      },
      addressType: 'IPv4',
      ports: [{ name: 'https', port, protocol: 'TCP' }],
      endpoints: [{ addresses: [host], conditions: { ready: true } }],
    },
    {
      apiVersion: `authentication.concierge.${SUFFIX}/v1alpha1`,
      kind: 'WebhookAuthenticator',
      metadata: { name: 'corp' },
      spec: {
        endpoint: webhook.url,
        tls: { certificateAuthorityData: webhook.caData },
        credentialLifetimeSeconds: LIFETIME_SECONDS,
      },
    },
    // The cluster's own RBAC: the demo group may list namespaces, nothing more.
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: 'namespace-reader' },
      rules: [{ apiGroups: [''], resources: ['namespaces'], verbs: ['get', 'list'] }],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata: { name: 'namespace-reader' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'namespace-reader' },
      subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'demo' }],
    },
  );
}, 240_000);

afterAll(async () => {
  await concierge?.stop();
  await webhook?.stop();
  await cluster?.stop();
});

describe('the direct path on a self-hosted cluster in mode auto', () => {
  it('reports Success with the TokenCredentialRequestAPI frontend and its evidence, before the proxy', async () => {
    const all = await eventually(
      async () => {
        const found = await strategies();
        const direct = found.find((s) => s.type === 'CertificateSigningRequest');
        if (direct?.status !== 'Success') throw new Error(`not yet: ${JSON.stringify(direct)}`);
        return found;
      },
      90_000,
      500,
    );
    const [direct, proxy] = all;
    expect(direct).toMatchObject({
      type: 'CertificateSigningRequest',
      status: 'Success',
      reason: 'ClusterSigns',
      frontend: {
        type: 'TokenCredentialRequestAPI',
        tokenCredentialRequestInfo: {
          server: cluster.url,
          certificateAuthorityData: Buffer.from(cluster.ca.certPem).toString('base64'),
        },
      },
    });
    // The evidence: why it is on, that a probe was signed, and that the API server serves the APIServices.
    expect(direct!.message).toContain('automatically enabled: node cp-1 is a control-plane node');
    expect(direct!.message).toMatch(
      /the cluster signed a probe request for kubernetes\.io\/kube-apiserver-client in/,
    );
    expect(direct!.message).toContain(`v1alpha1.${LOGIN} and v1alpha1.${IDENTITY}`);
    // Self-hosted in auto: no impersonation proxy.
    expect(proxy).toMatchObject({ type: 'ImpersonationProxy', status: 'NotAvailable' });
    // The authenticator's status says the same, in Sealion's shape.
    const status = JSON.parse(
      await kubectlOk([
        'get',
        `webhookauthenticators.authentication.concierge.${SUFFIX}`,
        'corp',
        '-o',
        'json',
      ]),
    ) as {
      status?: {
        conciergeStrategies?: { type: string; status: string; tokenCredentialRequestConfig?: object }[];
      };
    };
    expect(
      status.status?.conciergeStrategies?.find((s) => s.type === 'TokenCredentialRequestAPI'),
    ).toMatchObject({
      status: 'Success',
      tokenCredentialRequestConfig: { endpoint: cluster.url },
    });
  }, 120_000);

  it('shows the APIs in kubectl api-resources and kubectl explain', async () => {
    const resources = await kubectlOk(['api-resources', '--api-group', LOGIN]);
    expect(resources).toMatch(
      /tokencredentialrequests\s+.*login\.concierge\.sealion\.dev\/v1alpha1\s+false\s+TokenCredentialRequest/,
    );
    expect(await kubectlOk(['api-resources', '--api-group', IDENTITY])).toContain('WhoAmIRequest');
    // The API server gathers aggregated APIs' OpenAPI in the background, a little after they are Available.
    const explained = await eventually(
      () => kubectlOk(['explain', `tokencredentialrequests.${LOGIN}.spec`]),
      60_000,
      1_000,
    );
    expect(
      await eventually(() => kubectlOk(['explain', `whoamirequests.${IDENTITY}`]), 60_000, 1_000),
    ).toContain('WhoAmIRequest answers with the user');
    expect(explained).toContain('token');
    expect(explained).toContain('authenticator');
  }, 90_000);

  it('trades a token for a certificate the cluster signs, with the lifetime configured, and the API server decides', async () => {
    const token = webhook.grant({ username: 'dana@example.com', groups: ['demo'] });
    const before = Date.now();
    const { credential } = await login(token);
    expect(credential).toBeDefined();
    const cert = new X509Certificate(credential!.clientCertificateData);
    // Signed by the cluster's CA, which the API server trusts; the subject is the user and the groups only.
    expect(cert.verify(new X509Certificate(cluster.ca.certPem).publicKey)).toBe(true);
    expect(cert.subject).toBe('O=demo\nCN=dana@example.com');
    const lifetime = (Date.parse(cert.validTo) - before) / 1000;
    expect(lifetime).toBeGreaterThan(LIFETIME_SECONDS - 60);
    expect(lifetime).toBeLessThanOrEqual(LIFETIME_SECONDS + 60);
    expect(Date.parse(credential!.expirationTimestamp)).toBe(Date.parse(cert.validTo));
    // Nothing left behind: the request was deleted once collected.
    expect(await kubectlOk(['get', 'csr', '-o', 'name'])).not.toMatch(/sealion-/);

    const kubeconfig = directKubeconfig(credential!, 'dana');
    const listed = await cluster.kubectl(['get', 'namespaces', '-o', 'name'], { kubeconfig });
    expect(listed.stderr).toBe('');
    expect(listed.stdout).toContain(`namespace/${NS}`);
    // The cluster's own refusal, naming the user.
    const refused = await cluster.kubectl(['get', 'secrets', '-n', 'kube-system'], { kubeconfig });
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain(
      'secrets is forbidden: User "dana@example.com" cannot list resource "secrets"',
    );

    // WhoAmIRequest through the aggregated API names the user as the API server authenticated her.
    // --validate=false: kubectl checks a kind it finds no PATCH operation for by listing CRDs, which a user may not
    // (so for every create-only aggregated API, Pinniped's too).
    const created = await cluster.kubectl(['create', '--validate=false', '-o', 'json', '-f', '-'], {
      kubeconfig,
      input: JSON.stringify({
        apiVersion: `${IDENTITY}/v1alpha1`,
        kind: 'WhoAmIRequest',
        metadata: {},
        spec: {},
      }),
    });
    expect(created.stderr).toBe('');
    const whoami = JSON.parse(created.stdout) as {
      status: { kubernetesUserInfo: { user: { username: string; groups: string[] } } };
    };
    expect(whoami.status.kubernetesUserInfo.user).toMatchObject({
      username: 'dana@example.com',
      groups: ['demo', 'system:authenticated'],
    });
  }, 60_000);

  it('gives no certificate for a token it does not accept, nor for a system: group', async () => {
    expect(await login('not-a-token')).toEqual({ message: 'authentication failed' });
    const token = webhook.grant({ username: 'eve', groups: ['system:masters'] });
    expect(await login(token)).toEqual({ message: 'authentication failed' });
  });

  it('refuses X-Remote-* headers from anyone but the front proxy', async () => {
    const url = `https://${host}:${concierge.concierge.aggregatedApiPort}/apis/${IDENTITY}/v1alpha1/whoamirequests`;
    const body = JSON.stringify({ apiVersion: `${IDENTITY}/v1alpha1`, kind: 'WhoAmIRequest', spec: {} });
    const forged = { 'x-remote-user': 'admin', 'x-remote-group': 'system:masters' };
    const caPem = Buffer.from(
      (
        JSON.parse(await kubectlOk(['get', 'apiservice', `v1alpha1.${IDENTITY}`, '-o', 'json'])) as {
          spec: { caBundle: string };
        }
      ).spec.caBundle,
      'base64',
    ).toString();
    const frontProxyCA = await loadCA(
      readFileSync(join(cluster.dir, 'front-proxy-ca.crt'), 'utf8'),
      readFileSync(join(cluster.dir, 'front-proxy-ca.key'), 'utf8'),
    );
    const clusterUser = await issueCert(cluster.ca, { commonName: 'front-proxy-client', usage: 'client' });
    const otherName = await issueCert(frontProxyCA, { commonName: 'not-the-front-proxy', usage: 'client' });
    const realProxy = {
      cert: readFileSync(join(cluster.dir, 'front-proxy-client.crt'), 'utf8'),
      key: readFileSync(join(cluster.dir, 'front-proxy-client.key'), 'utf8'),
    };
    const send = (client: { cert?: string; key?: string }): Promise<Answer> =>
      call(url, { method: 'POST', body, ca: caPem, headers: forged, ...client });
    // No certificate, or a certificate the API server trusts for users (with the front proxy's name): the listener
    // only the API server dials refuses them at the handshake, so strangers hold none of its connections.
    for (const client of [{}, { cert: clusterUser.certPem, key: clusterUser.keyPem }]) {
      await expect(send(client)).rejects.toThrow();
    }
    // The front proxy's CA, another name: the same 401 as every failed authentication.
    const answer = await send({ cert: otherName.certPem, key: otherName.keyPem });
    expect(answer.status).toBe(401);
    expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 401, message: 'Unauthorized' });
    // The front proxy itself is believed.
    const believed = await send(realProxy);
    expect(believed.status).toBe(201);
    const who = JSON.parse(believed.body) as {
      status: { kubernetesUserInfo: { user: { username: string } } };
    };
    expect(who.status.kubernetesUserInfo.user.username).toBe('admin');
  });

  it('never approves a request someone else created', async () => {
    const { newCSR } = await import('../lib/pki/pki.ts');
    const { csrPem } = await newCSR('mallory', ['demo']);
    await apply({
      apiVersion: 'certificates.k8s.io/v1',
      kind: 'CertificateSigningRequest',
      metadata: { name: 'someone-elses' },
      spec: {
        request: Buffer.from(csrPem).toString('base64'),
        signerName: 'kubernetes.io/kube-apiserver-client',
        expirationSeconds: 600,
        usages: ['client auth'],
      },
    });
    // Logins meanwhile approve their own requests only.
    await login(webhook.grant({ username: 'frank', groups: ['demo'] }));
    const csr = JSON.parse(await kubectlOk(['get', 'csr', 'someone-elses', '-o', 'json'])) as {
      status?: { conditions?: { type: string }[]; certificate?: string };
    };
    expect(csr.status?.conditions ?? []).toEqual([]);
    expect(csr.status?.certificate).toBeUndefined();
  });

  it('sealion get kubeconfig writes a kubeconfig for the API server itself, whose plugin kubectl runs', async () => {
    const path = join(cluster.dir, 'cli-direct.kubeconfig');
    const written = await runSealion([
      'get',
      'kubeconfig',
      '--kubeconfig',
      cluster.kubeconfigPath,
      '--authenticator-name',
      'corp',
      '--static-token-env',
      'DIRECT_TOKEN',
      '--output-file',
      path,
    ]);
    expect(written).toMatchObject({ code: 0, stderr: '' });
    // No --mode: the direct path works here, so the kubeconfig points at the API server, with its CA.
    const config = parse(readFileSync(path, 'utf8')) as {
      clusters: { cluster: { server: string; 'certificate-authority-data': string } }[];
    };
    expect(config.clusters.map((c) => c.cluster.server)).toEqual([cluster.url]);
    expect(config.clusters[0]!.cluster['certificate-authority-data']).toBe(
      Buffer.from(cluster.ca.certPem).toString('base64'),
    );

    const env = {
      DIRECT_TOKEN: webhook.grant({ username: 'gail@example.com', groups: ['demo'] }),
      XDG_CONFIG_HOME: mkdtempSync(join(cluster.dir, 'cli-home-')),
    };
    const listed = await runKubectl(cluster.binaries.kubectl, path, ['get', 'namespaces', '-o', 'name'], {
      env,
    });
    // Nothing on stderr: the plugin asked the concierge for the key and warns of nothing.
    expect(listed).toMatchObject({ code: 0, stderr: '' });
    expect(listed.stdout).toContain(`namespace/${NS}`);
    const refused = await runKubectl(
      cluster.binaries.kubectl,
      path,
      ['get', 'secrets', '-n', 'kube-system'],
      {
        env,
      },
    );
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain(
      'secrets is forbidden: User "gail@example.com" cannot list resource "secrets"',
    );
  }, 60_000);

  it('takes its APIServices away when disabled', async () => {
    await apply({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: CONFIG_MAP_NAME, namespace: NS },
      data: {
        'config.yaml': stringify({
          impersonationProxy: { mode: 'auto' },
          kubeCertAgent: { mode: 'disabled' },
        }),
      },
    });
    await eventually(
      async () => {
        const names = await kubectlOk(['get', 'apiservices', '-o', 'name']);
        if (names.includes(LOGIN) || names.includes(IDENTITY)) throw new Error(`still there: ${names}`);
      },
      30_000,
      500,
    );
    expect((await strategies()).find((s) => s.type === 'CertificateSigningRequest')).toMatchObject({
      status: 'NotAvailable',
      reason: 'Disabled',
    });
  }, 60_000);
});
