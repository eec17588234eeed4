// Runs a concierge in this process against a harness cluster, the way tests, the development environment and the
// benchmarks need one, through the same composition root a deployed concierge runs: the CRDs and the RBAC the
// install manifests grant are applied, the concierge acts as its own service account, and forwards as the
// impersonator service account with tokens it requests itself.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AuditOptions } from '../concierge/audit/setup.ts';
import { newConcierge, type ConciergeEndpoints, type ConciergeOptions } from '../concierge/concierge.ts';
import { silentLogger, type Logger } from '../lib/log.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { conciergeManifests, DEFAULT_INSTALL } from '../manifests/install.ts';
import { CONCIERGE_NAME, IMPERSONATOR_SERVICE_ACCOUNT } from '../apis/install.ts';
import type { RegistrationLimits } from '../concierge/concierge.ts';
import { REPO_ROOT } from './build.ts';
import { kubeconfigYaml, runKubectl, type Cluster } from './cluster.ts';

export interface LocalConcierge {
  concierge: ConciergeEndpoints;
  url: string;
  /** CA of the proxy's serving certificate (what clients trust). */
  servingCA: CertificateAuthority;
  /** CA that signs TokenCredentialRequest certificates. */
  signerCA: CertificateAuthority;
  /** A kubeconfig for the proxy with the given user credentials. */
  kubeconfig(user: { token?: string; certPem?: string; keyPem?: string }): string;
  stop(): Promise<void>;
}

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

/** A token of a service account in `namespace` from the TokenRequest API, valid a day. */
async function serviceAccountToken(
  cluster: Pick<Cluster, 'kubectl'>,
  namespace: string,
  name: string,
): Promise<string> {
  const created = await cluster.kubectl(['create', 'token', name, '-n', namespace, '--duration=24h']);
  if (created.code !== 0) throw new Error(`creating a token for ${namespace}/${name}: ${created.stderr}`);
  return created.stdout.trim();
}

/** A token of the forwarding identity (the impersonator service account), as the concierge requests them. */
export function forwardingToken(
  cluster: Pick<Cluster, 'kubectl'>,
  namespace: string = DEFAULT_INSTALL.namespace,
): Promise<string> {
  return serviceAccountToken(cluster, namespace, IMPERSONATOR_SERVICE_ACCOUNT);
}

/** Kinds of the install manifests that say who the concierge is and what it may do. */
const IDENTITY_KINDS = new Set([
  'Namespace',
  'ServiceAccount',
  'ClusterRole',
  'ClusterRoleBinding',
  'Role',
  'RoleBinding',
]);

/**
 * Installs the CRDs and the namespace, service accounts and RBAC of the install manifests for `namespace`, and
 * returns a kubeconfig of the concierge's own service account: it may do what a deployed concierge may, no more.
 */
export async function prepareConcierge(cluster: ClusterForConcierge, namespace: string): Promise<string> {
  await installCRDs(cluster);
  const identity = conciergeManifests({ ...DEFAULT_INSTALL, namespace }).filter((o) =>
    IDENTITY_KINDS.has(o['kind'] as string),
  );
  const applied = await cluster.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: identity }),
  });
  if (applied.code !== 0) throw new Error(`applying the concierge's RBAC: ${applied.stderr}`);
  const token = await serviceAccountToken(cluster, namespace, CONCIERGE_NAME);
  return kubeconfigYaml('sealion-concierge', cluster.url, cluster.ca.certPem, {
    name: CONCIERGE_NAME,
    token,
  });
}

/** Options every harness concierge shares. */
async function baseOptions(
  cluster: ClusterForConcierge,
  opts: {
    namespace: string;
    identity: string;
    log?: Logger;
    port?: number;
    tunnelPort?: number;
    registrationLimits?: RegistrationLimits;
  },
): Promise<Omit<ConciergeOptions, 'configMap'>> {
  return {
    kubeconfig: { yaml: await prepareConcierge(cluster, opts.namespace) },
    forwardAs: { serviceAccount: IMPERSONATOR_SERVICE_ACCOUNT },
    groupSuffix: 'sealion.dev',
    namespace: opts.namespace,
    identity: opts.identity,
    proxy: { host: '127.0.0.1', port: opts.port ?? 0 },
    // A tunnel listener on loopback, for agents started by tests and the development environment, and a peer
    // listener for the other replicas.
    ...(opts.tunnelPort === undefined
      ? {}
      : {
          tunnel: {
            host: '127.0.0.1',
            port: opts.tunnelPort,
            hosts: ['127.0.0.1', 'localhost'],
            ...(opts.registrationLimits ? { registrationLimits: opts.registrationLimits } : {}),
          },
          peer: { host: '127.0.0.1', port: 0, advertise: '127.0.0.1' },
        }),
    log: opts.log ?? silentLogger(),
  };
}

/**
 * Starts a concierge serving fixed certificates (generated here, written to files it watches), controllers off.
 * Its namespace defaults to the install manifests'.
 */
export async function startLocalConcierge(
  cluster: ClusterForConcierge,
  opts: {
    log?: Logger;
    port?: number;
    metrics?: boolean;
    /**
     * Run the agents' tunnel listener on this port (0: any), keeping its CA in `namespace`, with these limits on
     * registration (default: the listener's).
     */
    tunnel?: { port: number; namespace: string; registrationLimits?: RegistrationLimits };
    /** This replica's name. Default: local. */
    identity?: string;
    /** The CA that signs users' client certificates. Default: a new one. */
    signerCA?: CertificateAuthority;
    /** Audit events (concierge/audit/). Default: none. */
    audit?: AuditOptions;
    /** Record exec and attach sessions (concierge/recording/). Default: not recorded. */
    recording?: ConciergeOptions['recording'];
    /** The access requests' grants the proxy applies, in place of the concierge's own. Default: its own. */
    grants?: ConciergeOptions['grants'];
  } = {},
): Promise<LocalConcierge> {
  const servingCA = await newCA('sealion-proxy-serving-ca');
  const signerCA = opts.signerCA ?? (await newCA('sealion-proxy-signer-ca'));
  const serving = await issueCert(servingCA, {
    commonName: 'sealion-proxy',
    hosts: ['127.0.0.1', 'localhost'],
    usage: 'server',
  });
  const dir = mkdtempSync(join(tmpdir(), 'sealion-tls-'));
  const file = (name: string, text: string): string => {
    writeFileSync(join(dir, name), text, { mode: 0o600 });
    return join(dir, name);
  };
  const concierge = newConcierge({
    ...(await baseOptions(cluster, {
      namespace: opts.tunnel?.namespace ?? DEFAULT_INSTALL.namespace,
      identity: opts.identity ?? 'local',
      ...(opts.log ? { log: opts.log } : {}),
      ...(opts.port === undefined ? {} : { port: opts.port }),
      ...(opts.tunnel ? { tunnelPort: opts.tunnel.port } : {}),
      ...(opts.tunnel?.registrationLimits ? { registrationLimits: opts.tunnel.registrationLimits } : {}),
    })),
    configMap: '',
    tlsFiles: {
      certFile: file('tls.crt', serving.certPem),
      keyFile: file('tls.key', serving.keyPem),
      signerCertFile: file('signer.crt', signerCA.certPem),
      signerKeyFile: file('signer.key', signerCA.keyPem),
      clientCAFiles: [],
    },
    ...(opts.metrics ? { metrics: { host: '127.0.0.1', port: 0 } } : {}),
    ...(opts.audit ? { audit: opts.audit } : {}),
    ...(opts.recording ? { recording: opts.recording } : {}),
    ...(opts.grants ? { grants: opts.grants } : {}),
  });
  const stop = async (): Promise<void> => {
    await concierge.stop();
    rmSync(dir, { recursive: true, force: true });
  };
  let endpoints: ConciergeEndpoints;
  try {
    endpoints = await concierge.start();
  } catch (err) {
    rmSync(dir, { recursive: true, force: true });
    throw err;
  }
  const url = `https://127.0.0.1:${endpoints.port}`;
  return {
    concierge: endpoints,
    url,
    servingCA,
    signerCA,
    kubeconfig: (user) => kubeconfigYaml('sealion', url, servingCA.certPem, { name: 'user', ...user }),
    stop,
  };
}

/** A concierge whose controllers manage the proxy, as in a cluster: no fixed certificates. */
export interface ControlledConcierge {
  concierge: ConciergeEndpoints;
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
    /** How often strangers may ask the tunnel listener to register. Default: the listener's limits. */
    registrationLimits?: RegistrationLimits;
    /** Serve the aggregated APIs (concierge/direct/) here, for the cluster's API server. Default: not served. */
    aggregatedApi?: ConciergeOptions['aggregatedApi'];
    /** Where the SSH door listens when the ConfigMap turns it on. Default: no door. */
    ssh?: ConciergeOptions['ssh'];
  },
): Promise<ControlledConcierge> {
  const concierge = newConcierge({
    ...(await baseOptions(cluster, opts)),
    configMap: opts.configMap,
    ...(opts.aggregatedApi ? { aggregatedApi: opts.aggregatedApi } : {}),
    ...(opts.ssh ? { ssh: opts.ssh } : {}),
  });
  const endpoints = await concierge.start();
  return { concierge: endpoints, port: endpoints.port, stop: () => concierge.stop() };
}
