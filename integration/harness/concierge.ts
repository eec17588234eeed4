// Runs a concierge in this process against a harness cluster, the way tests, `sealion dev up` and the benchmarks
// need one: the CRDs applied, a forwarding identity that may only impersonate, generated serving and signer CAs.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { startConcierge, type Concierge, type ConciergeOptions } from '../../concierge/concierge.ts';
import type { Upstream } from '../../concierge/proxy/forward.ts';
import { newKubeClients } from '../../lib/kube.ts';
import { silentLogger, type Logger } from '../../lib/log.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../../lib/pki.ts';
import { REPO_ROOT } from './build.ts';
import { kubeconfigYaml, runKubectl, type Cluster } from './cluster.ts';

export interface LocalConcierge {
  concierge: Concierge;
  url: string;
  /** CA of the proxy's serving certificate (what clients trust). */
  servingCA: CertificateAuthority;
  /** CA that signs TokenCredentialRequest certificates. */
  signerCA: CertificateAuthority;
  /** A kubeconfig for the proxy with the given user credentials. */
  kubeconfig(user: { token?: string; certPem?: string; keyPem?: string }): string;
  stop(): Promise<void>;
}

export const FORWARDING_USER = 'sealion-impersonator';
/** The service account that is the forwarding identity with `forwardAs: 'serviceaccount'`, in kube-system. */
export const FORWARDING_SERVICE_ACCOUNT = 'sealion-concierge';

/**
 * Who the proxy forwards as. `certificate`: a client certificate of FORWARDING_USER, as a concierge run outside
 * the cluster with a kubeconfig does. `serviceaccount`: a token of FORWARDING_SERVICE_ACCOUNT from the TokenRequest
 * API, as a concierge in the cluster does; the API server then checks no certificate signature per request.
 */
export type ForwardAs = 'certificate' | 'serviceaccount';

/** Applies Sealion's CRDs and waits until the API server serves them. */
export async function installCRDs(cluster: Pick<Cluster, 'kubectl'>): Promise<void> {
  const crds = await cluster.kubectl(['apply', '-k', join(REPO_ROOT, 'config/crds')]);
  if (crds.code !== 0) throw new Error(`applying CRDs: ${crds.stderr}`);
  const wait = [
    'wait',
    '--for=condition=Established',
    '--timeout=60s',
    'crd',
    '-l',
    'app.kubernetes.io/part-of=sealion',
  ];
  const established = await cluster.kubectl(wait);
  if (established.code !== 0) throw new Error(`waiting for CRDs: ${established.stderr}`);
}

/** Creates (or updates) a JWTAuthenticator trusting a local issuer. */
export async function applyJWTAuthenticator(
  cluster: Pick<Cluster, 'kubectl'>,
  name: string,
  issuer: { url: string; caData: string },
  audience: string,
): Promise<void> {
  const applied = await cluster.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'authentication.concierge.sealion.dev/v1alpha1',
      kind: 'JWTAuthenticator',
      metadata: { name },
      spec: { issuer: issuer.url, audience, tls: { certificateAuthorityData: issuer.caData } },
    }),
  });
  if (applied.code !== 0) throw new Error(`applying JWTAuthenticator ${name}: ${applied.stderr}`);
}

/** A tunnel listener on loopback, for agents started by tests and the dev setup. */
function tunnelOptions(
  tunnel: { port: number; namespace: string } | undefined,
): Pick<ConciergeOptions, 'tunnel'> {
  return tunnel
    ? {
        tunnel: {
          host: '127.0.0.1',
          port: tunnel.port,
          hosts: ['127.0.0.1', 'localhost'],
          namespace: tunnel.namespace,
          replica: 'local',
        },
      }
    : {};
}

/** What the concierge harness needs of a cluster. */
export type ClusterForConcierge = Pick<Cluster, 'url' | 'kubeconfigPath' | 'ca' | 'kubectl'>;

/** A harness cluster another process started, from its folder, its URL and the kubectl binary. */
export async function clusterInDir(dir: string, url: string, kubectl: string): Promise<ClusterForConcierge> {
  const kubeconfigPath = join(dir, 'admin.kubeconfig');
  return {
    url,
    kubeconfigPath,
    ca: await loadCA(readFileSync(join(dir, 'ca.crt'), 'utf8'), readFileSync(join(dir, 'ca.key'), 'utf8')),
    kubectl: (args, opts = {}) => runKubectl(kubectl, opts.kubeconfig ?? kubeconfigPath, args, opts),
  };
}

/** A token of FORWARDING_SERVICE_ACCOUNT from the TokenRequest API, valid a day. */
export async function forwardingToken(cluster: Pick<Cluster, 'kubectl'>): Promise<string> {
  const created = await cluster.kubectl([
    'create',
    'token',
    FORWARDING_SERVICE_ACCOUNT,
    '-n',
    'kube-system',
    '--duration=24h',
  ]);
  if (created.code !== 0) throw new Error(`creating a forwarding token: ${created.stderr}`);
  return created.stdout.trim();
}

/** Installs the CRDs and a forwarding identity that may only impersonate, as the install manifests do. */
async function prepareCluster(cluster: ClusterForConcierge, forwardAs: ForwardAs): Promise<Upstream> {
  await installCRDs(cluster);
  // The forwarding identity may impersonate and nothing else, as in the install manifests.
  const rbac = await cluster.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'v1',
      kind: 'List',
      items: [
        {
          apiVersion: 'rbac.authorization.k8s.io/v1',
          kind: 'ClusterRole',
          metadata: { name: 'sealion-test-impersonator' },
          rules: [
            { apiGroups: [''], resources: ['users', 'groups', 'serviceaccounts'], verbs: ['impersonate'] },
            // RBAC matches `*/subresource` but not `resource/*`, so userextras/<key> for every key needs `*` here; within
            // authentication.k8s.io that adds only uids, and only for impersonation.
            { apiGroups: ['authentication.k8s.io'], resources: ['*'], verbs: ['impersonate'] },
          ],
        },
        {
          apiVersion: 'rbac.authorization.k8s.io/v1',
          kind: 'ClusterRoleBinding',
          metadata: { name: 'sealion-test-impersonator' },
          roleRef: {
            apiGroup: 'rbac.authorization.k8s.io',
            kind: 'ClusterRole',
            name: 'sealion-test-impersonator',
          },
          subjects: [
            { apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: FORWARDING_USER },
            { kind: 'ServiceAccount', name: FORWARDING_SERVICE_ACCOUNT, namespace: 'kube-system' },
          ],
        },
        {
          apiVersion: 'v1',
          kind: 'ServiceAccount',
          metadata: { name: FORWARDING_SERVICE_ACCOUNT, namespace: 'kube-system' },
        },
      ],
    }),
  });
  if (rbac.code !== 0) throw new Error(`applying RBAC: ${rbac.stderr}`);

  if (forwardAs === 'serviceaccount') {
    // One token for the harness's lifetime; a concierge in a cluster reads its projected token, which rotates.
    const token = await forwardingToken(cluster);
    return { url: new URL(cluster.url), credentials: { caPem: cluster.ca.certPem, token: () => token } };
  }

  const forwarding = await issueCert(cluster.ca, { commonName: FORWARDING_USER, usage: 'client' });
  return {
    url: new URL(cluster.url),
    credentials: { caPem: cluster.ca.certPem, certPem: forwarding.certPem, keyPem: forwarding.keyPem },
  };
}

export async function startLocalConcierge(
  cluster: ClusterForConcierge,
  opts: {
    log?: Logger;
    port?: number;
    metrics?: boolean;
    /** Run the agents' tunnel listener on this port (0: any), keeping its CA in `namespace`. */
    tunnel?: { port: number; namespace: string };
    /** The forwarding identity. Default: `certificate`. */
    forwardAs?: ForwardAs;
  } = {},
): Promise<LocalConcierge> {
  const upstream = await prepareCluster(cluster, opts.forwardAs ?? 'certificate');
  const servingCA = await newCA('sealion-proxy-serving-ca');
  const signerCA = await newCA('sealion-proxy-signer-ca');
  const serving = await issueCert(servingCA, {
    commonName: 'sealion-proxy',
    hosts: ['127.0.0.1', 'localhost'],
    usage: 'server',
  });
  const concierge = await startConcierge({
    clients: newKubeClients({ path: cluster.kubeconfigPath }),
    upstream,
    groupSuffix: 'sealion.dev',
    host: '127.0.0.1',
    port: opts.port ?? 0,
    tls: { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [signerCA.certPem] },
    signer: signerCA,
    ...(opts.metrics ? { metrics: { host: '127.0.0.1', port: 0 } } : {}),
    ...tunnelOptions(opts.tunnel),
    log: opts.log ?? silentLogger(),
  });
  const url = `https://127.0.0.1:${concierge.port}`;
  return {
    concierge,
    url,
    servingCA,
    signerCA,
    kubeconfig: (user) => kubeconfigYaml('sealion', url, servingCA.certPem, { name: 'user', ...user }),
    stop: () => concierge.stop(),
  };
}

/** A concierge whose controllers manage the proxy, as in a cluster: no fixed certificates. */
export interface ControlledConcierge {
  concierge: Concierge;
  /** Where this replica listens (what a Service's backend is). */
  port: number;
  stop(): Promise<void>;
}

/**
 * Starts a concierge replica with its controllers on: the ConfigMap `configMap` in `namespace` drives the proxy.
 * Replicas started with the same namespace share one Lease.
 */
export async function startControlledConcierge(
  cluster: ClusterForConcierge,
  opts: {
    namespace: string;
    configMap: string;
    identity: string;
    log?: Logger;
    port?: number;
    /** Run the agents' tunnel listener on this port (0: any). */
    tunnelPort?: number;
  },
): Promise<ControlledConcierge> {
  const upstream = await prepareCluster(cluster, 'certificate');
  const concierge = await startConcierge({
    clients: newKubeClients({ path: cluster.kubeconfigPath }),
    upstream,
    groupSuffix: 'sealion.dev',
    host: '127.0.0.1',
    port: opts.port ?? 0,
    control: { namespace: opts.namespace, configMap: opts.configMap, identity: opts.identity },
    ...tunnelOptions(
      opts.tunnelPort === undefined ? undefined : { port: opts.tunnelPort, namespace: opts.namespace },
    ),
    log: opts.log ?? silentLogger(),
  });
  return { concierge, port: concierge.port, stop: () => concierge.stop() };
}
