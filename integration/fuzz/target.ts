// What the fuzzer attacks: a real API server, a local OIDC issuer, and the concierge in a process of its own (so a
// crash shows as a dead process, and its memory is its own), with its tunnel listener, a JWTAuthenticator, a user
// who may only read, a client certificate from the proxy's signer, and agent identities from the tunnel CA.
import { TUNNEL_CA_SECRET } from '../../concierge/tunnel/listener.ts';
import { bindingURI } from '../../concierge/tunnel/binding.ts';
import { newKubeClients, readSecretData } from '../../lib/kube.ts';
import { issueCert, loadCA } from '../../lib/pki.ts';
import { startCluster, type Cluster } from '../../dev/cluster.ts';
import { applyJWTAuthenticator } from '../../dev/concierge.ts';
import { startConciergeProcess, type ConciergeProcess } from '../harness/concierge-process.ts';
import { eventually } from '../../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../../dev/oidc-issuer.ts';

export const FUZZ_AUDIENCE = 'sealion-fuzz';
export const FUZZ_USER = 'fuzzer@example.com';
/** The fuzz user's group, bound to `view`: fuzzed methods and paths reach the API server but change nothing. */
export const FUZZ_GROUP = 'fuzzers';
const TUNNEL_NAMESPACE = 'sealion-fuzz';
/**
 * Clusters whose tunnels the fuzzer's own fake agents hold, two per lane (one that answers requests, one that sends
 * garbage; apart, so that a new garbage tunnel never replaces the answering one); generated paths never name them.
 */
export const AGENT_CLUSTER_PREFIX = 'fuzz-agent-';

/** The agent cluster of a lane, for answering or for garbage. */
export function agentCluster(lane: number, role: 'answers' | 'garbage'): string {
  return `${AGENT_CLUSTER_PREFIX}${role === 'answers' ? '' : 'g'}${lane}`;
}

export interface Credential {
  certPem: string;
  keyPem: string;
}

export interface FuzzTarget {
  cluster: Cluster;
  issuer: TestIssuer;
  concierge: ConciergeProcess;
  /** host and port of the proxy and of the tunnel listener */
  proxyPort: number;
  tunnelPort: number;
  /** CA of the proxy's serving certificate. */
  proxyCA: string;
  /** CA of the tunnel listener (and of agent certificates). */
  tunnelCA: string;
  /** A valid JWT of FUZZ_USER, for an hour. */
  token: string;
  /** A client certificate of FUZZ_USER from the proxy's signer CA. */
  userCert: Credential;
  /** An agent certificate for agentCluster(lane, role). */
  agentCert(lane: number, role: 'answers' | 'garbage'): Promise<Credential>;
  stop(): Promise<void>;
}

interface ObjectWithUid {
  metadata: { name: string; uid: string };
}

/** Starts everything; on failure stops what it started before rethrowing. */
export async function startFuzzTarget(opts: { log?: (line: string) => void; agents?: number } = {}) {
  const log = opts.log ?? (() => {});
  const stops: Array<() => Promise<void>> = [];
  const stop = async (): Promise<void> => {
    for (const fn of stops.splice(0).reverse()) await fn().catch(() => {});
  };
  try {
    log('starting a cluster');
    const cluster = await startCluster({ name: 'fuzz', controllerManager: false });
    stops.push(() => cluster.stop());
    const issuer = await startOIDCIssuer({ audience: FUZZ_AUDIENCE });
    stops.push(() => issuer.stop());

    const kubectl = async (args: string[], input?: string): Promise<void> => {
      const r = await cluster.kubectl(args, input === undefined ? {} : { input });
      if (r.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${r.stderr}`);
    };
    await kubectl(['create', 'namespace', TUNNEL_NAMESPACE]);
    // `view` is an aggregated role, filled by kube-controller-manager, which this cluster does not run: a role of
    // our own with the same intent.
    await kubectl(['create', 'clusterrole', 'fuzz-reader', '--verb=get,list,watch', '--resource=*.*']);
    await kubectl([
      'create',
      'clusterrolebinding',
      'fuzz-reader',
      '--clusterrole=fuzz-reader',
      `--group=${FUZZ_GROUP}`,
    ]);

    log('starting the concierge');
    const concierge = await startConciergeProcess(cluster, {
      tunnel: { port: 0, namespace: TUNNEL_NAMESPACE },
    });
    stops.push(() => concierge.stop());
    await applyJWTAuthenticator(cluster, 'fuzz', issuer, FUZZ_AUDIENCE);
    await eventually(async () => {
      const r = await cluster.kubectl([
        'get',
        'jwtauthenticator.authentication.concierge.sealion.dev',
        'fuzz',
        '-o',
        'jsonpath={.status.phase}',
      ]);
      if (r.stdout !== 'Ready') throw new Error(`JWTAuthenticator fuzz is ${r.stdout || 'not ready'}`);
    }, 60_000);
    const agents = opts.agents ?? 8;
    // Each fake agent's certificate is bound to its Cluster object, as the listener requires: their uids, from what
    // the apply answers (a List, or one object when there is one).
    const applied = await cluster.kubectl(['apply', '-o', 'json', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: Array.from({ length: agents }, (_, lane) =>
          (['answers', 'garbage'] as const).map((role) => ({
            apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
            kind: 'Cluster',
            metadata: { name: agentCluster(lane, role) },
            spec: {},
          })),
        ).flat(),
      }),
    });
    if (applied.code !== 0) throw new Error(`applying the fuzz Clusters: ${applied.stderr}`);
    const answer = JSON.parse(applied.stdout) as { items?: ObjectWithUid[] } & ObjectWithUid;
    const uids = new Map((answer.items ?? [answer]).map((o) => [o.metadata.name, o.metadata.uid]));

    const clients = newKubeClients({ path: cluster.kubeconfigPath });
    const secret = await eventually(async () => {
      const data = await readSecretData(clients, TUNNEL_NAMESPACE, TUNNEL_CA_SECRET);
      if (!data) throw new Error('no tunnel CA yet');
      return data;
    });
    const tunnelCA = await loadCA(secret['tls.crt'] ?? '', secret['tls.key'] ?? '');
    const signer = await loadCA(concierge.signer.certPem, concierge.signer.keyPem);
    const userCert = await issueCert(signer, {
      commonName: FUZZ_USER,
      organizations: [FUZZ_GROUP],
      usage: 'client',
      validityMs: 24 * 3600_000,
    });
    const token = await issuer.mint({ username: FUZZ_USER, groups: [FUZZ_GROUP] }, { expiresIn: 3600 * 24 });
    const agentCerts = new Map<string, Promise<Credential>>();
    return {
      cluster,
      issuer,
      concierge,
      proxyPort: Number(new URL(concierge.url).port),
      tunnelPort: concierge.tunnel!.port,
      proxyCA: concierge.servingCA,
      tunnelCA: tunnelCA.certPem,
      token,
      userCert: { certPem: userCert.certPem, keyPem: userCert.keyPem },
      agentCert(lane: number, role: 'answers' | 'garbage') {
        const name = agentCluster(lane, role);
        let cert = agentCerts.get(name);
        if (!cert) {
          cert = issueCert(tunnelCA, {
            commonName: name,
            usage: 'client',
            validityMs: 24 * 3600_000,
            uris: [bindingURI({ cluster: name, uid: uids.get(name)!, generation: 0 })],
          }).then((c) => ({ certPem: c.certPem, keyPem: c.keyPem }));
          agentCerts.set(name, cert);
        }
        return cert;
      },
      stop,
    } satisfies FuzzTarget;
  } catch (err) {
    await stop();
    throw err;
  }
}
