// Certificates a real API server trusts, issued by the cluster itself through the CSR API (signer
// kubernetes.io/kube-apiserver-client, signed by the real kube-controller-manager with the cluster's CA), by an issuer
// whose identity holds only what it needs. The issuer approves only the requests it created, for identities that
// pass its checks: a request anyone else made, or one naming system:masters, is never approved.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { kubeconfigYaml, startCluster, type Cluster } from '../dev/cluster.ts';
import {
  IssueRefused,
  newClusterCertificateIssuer,
  type ClusterCertificateIssuer,
} from '../lib/kube/cluster-certificates.ts';
import { newKubeClients } from '../lib/kube/kube.ts';
import { KUBE_APISERVER_CLIENT_SIGNER } from '../apis/install.ts';
import { newCSR } from '../lib/pki/pki.ts';
import { conciergeManifests, DEFAULT_INSTALL } from '../manifests/install.ts';

const NS = 'issuer';
const SA = 'sealion-issuer';

describe('certificates issued through the CSR API', () => {
  let cluster: Cluster;
  let issuer: ClusterCertificateIssuer;
  let dir: string;

  const kubectlOk = async (
    args: string[],
    opts: { input?: string; kubeconfig?: string } = {},
  ): Promise<string> => {
    const result = await cluster.kubectl(args, opts);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
    return result.stdout;
  };
  const requests = async (): Promise<string[]> =>
    (await kubectlOk(['get', 'csr', '-o', 'jsonpath={.items[*].metadata.name}'])).split(' ').filter(Boolean);

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-csr-'));
    cluster = await startCluster({ name: 'csr' });
    await kubectlOk(['create', 'namespace', NS]);
    await kubectlOk(['create', 'serviceaccount', SA, '-n', NS]);
    // The narrowest RBAC that lets it work, as the install grants it: its own requests, their approval, and approving
    // for this one signer (and its APIServices, unused here).
    const directRules = (
      conciergeManifests(DEFAULT_INSTALL).find(
        (o) =>
          o['kind'] === 'ClusterRole' &&
          (o['metadata'] as { name: string }).name.endsWith('-concierge-direct'),
      ) as { rules: object[] }
    ).rules;
    await kubectlOk(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: [
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'ClusterRole',
            metadata: { name: SA },
            rules: directRules,
          },
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'ClusterRoleBinding',
            metadata: { name: SA },
            roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: SA },
            subjects: [{ kind: 'ServiceAccount', name: SA, namespace: NS }],
          },
        ],
      }),
    });
    const token = (await kubectlOk(['create', 'token', SA, '-n', NS])).trim();
    const clients = newKubeClients({
      yaml: kubeconfigYaml('csr', cluster.url, cluster.ca.certPem, { name: SA, token }),
    });
    issuer = newClusterCertificateIssuer(clients, {
      self: { username: `system:serviceaccount:${NS}:${SA}` },
    });
  }, 180_000);

  afterAll(async () => {
    await cluster?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  }, 60_000);

  it('gives a certificate the API server trusts, for at least the signer minimum, and leaves no request behind', async () => {
    const before = Date.now();
    const issued = await issuer.issue({ username: 'alice@example.com', groups: ['devs'] }, 300);
    // 300 s asked; the signer's minimum is 10 minutes.
    const lifetime = (issued.notAfter.getTime() - before) / 1000;
    expect(lifetime).toBeGreaterThan(590);
    expect(lifetime).toBeLessThan(700);
    const kubeconfig = join(dir, 'alice.kubeconfig');
    writeFileSync(
      kubeconfig,
      kubeconfigYaml('csr', cluster.url, cluster.ca.certPem, {
        name: 'alice',
        certPem: issued.certPem,
        keyPem: issued.keyPem,
      }),
    );
    const whoami = JSON.parse(await kubectlOk(['auth', 'whoami', '-o', 'json'], { kubeconfig })) as {
      status: { userInfo: { username: string; groups: string[] } };
    };
    expect(whoami.status.userInfo.username).toBe('alice@example.com');
    expect(whoami.status.userInfo.groups).toEqual(expect.arrayContaining(['devs', 'system:authenticated']));
    // The cluster's own RBAC decides what the certificate may do.
    const refused = await cluster.kubectl(['get', 'pods', '-n', 'default'], { kubeconfig });
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain('forbidden');
    expect((await requests()).filter((n) => n.startsWith('sealion-'))).toEqual([]);
  });

  it.each([
    ['system:masters, whatever else', { username: 'alice@example.com', groups: ['system:masters'] }],
    ['a system: user', { username: 'system:kube-controller-manager', groups: [] }],
    ['a system: group', { username: 'alice@example.com', groups: ['system:nodes'] }],
  ])('never asks for %s', async (_what, identity) => {
    const before = await requests();
    await expect(issuer.issue(identity, 600)).rejects.toMatchObject({ code: 'ForbiddenIdentity' });
    expect(await requests()).toEqual(before);
  });

  it('never approves a request someone else created, whatever it names', async () => {
    // Not system:masters: the API server's CertificateSubjectRestriction admission refuses such a request for this
    // signer before anyone could approve it (seen here on v1.36).
    const { csrPem } = await newCSR('mallory', ['cluster-admins']);
    await kubectlOk(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'certificates.k8s.io/v1',
        kind: 'CertificateSigningRequest',
        metadata: { name: 'foreign' },
        spec: {
          request: Buffer.from(csrPem).toString('base64'),
          signerName: KUBE_APISERVER_CLIENT_SIGNER,
          expirationSeconds: 600,
          usages: ['client auth'],
        },
      }),
    });
    await expect(issuer.approveOwn('foreign')).rejects.toBeInstanceOf(IssueRefused);
    await expect(issuer.approveOwn('foreign')).rejects.toMatchObject({ code: 'NotOwnRequest' });
    const conditions = await kubectlOk(['get', 'csr', 'foreign', '-o', 'jsonpath={.status.conditions}']);
    expect(conditions).not.toContain('Approved');
    await kubectlOk(['delete', 'csr', 'foreign']);
  });
});
