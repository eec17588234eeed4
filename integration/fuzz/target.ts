// What the fuzzer attacks: a real API server, a local OIDC issuer, and the concierge in a process of its own (so a
// crash shows as a dead process, and its memory is its own) with its controllers on as installed, with its tunnel
// listener and peer listener, a JWTAuthenticator, a user who may only read, a client certificate from the proxy's
// signer, agent identities from the tunnel CA, bootstrap tokens for registration, a replica's identity from the peer
// CA (with identities that only look like one), and the SSH door: the device login at the local issuer, two SSH CAs
// whose user certificates sign in, and the keys the fuzzer holds.

import {
  PEER_CA_SECRET,
  PEER_URI_PREFIX,
  TUNNEL_CA_SECRET,
  PEER_ADDRESS_ANNOTATION,
} from '../../apis/install.ts';
import type { RegistrationLimits } from '../../concierge/concierge.ts';
import { bindingURI } from '../../apis/agent-binding.ts';

import { createBootstrapToken } from '../../lib/kube/bootstrap.ts';
import { newKubeClients, readSecretData, type KubeClients } from '../../lib/kube/kube.ts';
import { issueCert, loadCA, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { startCluster, type Cluster } from '../../dev/cluster.ts';
import { applyJWTAuthenticator } from '../../dev/concierge.ts';
import { startConciergeProcess, type ConciergeProcess } from '../harness/concierge-process.ts';
import { eventually } from '../../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../../dev/oidc-issuer.ts';
import { ecdsaKey, ed25519Key, keyLine, rsaKey, type HeldKey } from './ssh-keys.ts';

export const FUZZ_AUDIENCE = 'sealion-fuzz';
export const FUZZ_USER = 'fuzzer@example.com';
/** The fuzz user's group, bound to `view`: fuzzed methods and paths reach the API server but change nothing. */
export const FUZZ_GROUP = 'fuzzers';
const TUNNEL_NAMESPACE = 'sealion-fuzz';
const FUZZ_REGISTRATION_LIMITS: RegistrationLimits = {
  perAddressBurst: 1e9,
  perAddressPerSecond: 1e9,
  overallBurst: 1e9,
  overallPerSecond: 1e9,
  addresses: 100,
};
/**
 * Clusters of the fuzzer's own, four per lane: whose tunnels its fake agents hold (one that answers requests, one
 * that sends garbage; apart, so that a new garbage tunnel never replaces the answering one; one that answers requests
 * sent over the peer link), and one that agents register for, with nothing connected. Generated paths never name them.
 */
export const AGENT_CLUSTER_PREFIX = 'fuzz-agent-';

export type AgentRole = 'answers' | 'garbage' | 'peer' | 'register';
const ROLE_LETTER: Record<AgentRole, string> = { answers: '', garbage: 'g', peer: 'p', register: 'r' };

/** The agent cluster of a lane, for its role. */
export function agentCluster(lane: number, role: AgentRole): string {
  return `${AGENT_CLUSTER_PREFIX}${ROLE_LETTER[role]}${lane}`;
}

/**
 * Identities a stranger may show the peer port, none a replica's: certificates of other CAs (a user's, an agent's,
 * the tunnel CA's own, another CA's with a replica's name), the peer CA's without a replica's name, with two, with an
 * empty or undecodable one, expired, or for servers only.
 */
export const FORGED_PEERS = [
  'none',
  'user',
  'agent',
  'tunnel CA',
  'another CA',
  'unnamed',
  'two names',
  'empty name',
  'undecodable name',
  'expired',
  'server only',
] as const;
export type ForgedPeer = (typeof FORGED_PEERS)[number];
/** Replicas' names the fuzzer's peer certificates carry: its own, the replica's it attacks, and an odd one. */
export const PEER_NAMES = ['fuzz-peer', 'local', '\u0000\n../replica'] as const;
export type PeerName = (typeof PEER_NAMES)[number];

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
  /**
   * The API server itself, and FUZZ_USER's client certificate from the cluster's CA: the oracle asks it directly what
   * it decides about an impersonation a case asked the proxy for.
   */
  apiServer: { url: string; ca: string; userCert: Credential };
  /** An agent certificate for agentCluster(lane, role). */
  agentCert(lane: number, role: 'answers' | 'garbage' | 'peer'): Promise<Credential>;
  /** A fresh bootstrap token for `cluster`. */
  bootstrapToken(cluster: string): Promise<string>;
  /** The concierge's peer listener: where, its CA, certificates of replicas and identities that are none. */
  peer: {
    port: number;
    ca: string;
    replicas: Record<PeerName, Credential>;
    forged: Record<Exclude<ForgedPeer, 'none'>, Credential>;
  };
  clients: KubeClients;
  /** Where the tunnel listener keeps its CA and bootstrap tokens. */
  tunnelNamespace: string;
  ssh: SshMaterial;
  stop(): Promise<void>;
}

/** The SSH door and what the fuzzer signs in with. */
export interface SshMaterial {
  port: number;
  /** The user CAs the door trusts (its config's certificateAuthorities), and one it does not. */
  cas: { ed25519: HeldKey; rsa: HeldKey; stranger: HeldKey };
  /** Keys the fuzzer holds: certified, bound by device logins, or neither. */
  keys: { ed25519: HeldKey; ecdsa: HeldKey; rsa: HeldKey };
}

/** The JWTAuthenticator the door's device login uses (the issuer's client is its audience). */
export const FUZZ_AUTHENTICATOR = 'fuzz';
/** The certificate extension that carries groups (the config's default). */
export const SSH_GROUPS_EXTENSION = 'groups@sealion.dev';
/**
 * A group only the fuzzer's valid SSH certificates carry, which may exec into pods of the fuzz namespace (there are
 * none): the API server then answers an exec with NotFound, which it can only do if the certificate's groups reached
 * it (without them it is Forbidden).
 */
export const SSH_EXEC_GROUP = 'ssh-fuzzers';

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
    // The device login asks as the authenticator's audience (the door's default client) and the person who approves
    // a code signs in as the fuzz user.
    const issuer = await startOIDCIssuer({
      audience: FUZZ_AUDIENCE,
      clientId: FUZZ_AUDIENCE,
      login: { username: FUZZ_USER, groups: [FUZZ_GROUP] },
    });
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
    await kubectl([
      'create',
      'role',
      'ssh-exec',
      '-n',
      TUNNEL_NAMESPACE,
      '--verb=get,create',
      '--resource=pods/exec',
    ]);
    await kubectl([
      'create',
      'rolebinding',
      'ssh-exec',
      '-n',
      TUNNEL_NAMESPACE,
      '--role=ssh-exec',
      `--group=${SSH_EXEC_GROUP}`,
    ]);

    log('starting the concierge');
    const cas = { ed25519: ed25519Key(), rsa: rsaKey(3072), stranger: ed25519Key() };
    const concierge = await startConciergeProcess(cluster, {
      // Registration's rate limits, raised so far that every case is judged by what it sends, never turned away for
      // coming often from one address (the limits themselves have tests of their own).
      tunnel: { port: 0, namespace: TUNNEL_NAMESPACE, registrationLimits: FUZZ_REGISTRATION_LIMITS },
      // As installed: the controllers serve the proxy, and the config turns the SSH door on with the device login and
      // the two CAs (the door's own limits are its defaults).
      controlled: {
        config: {
          ssh: {
            mode: 'enabled',
            login: { authenticator: FUZZ_AUTHENTICATOR },
            certificateAuthorities: [keyLine(cas.ed25519, 'fuzz-ca'), keyLine(cas.rsa, 'fuzz-rsa-ca')],
            groupsExtension: SSH_GROUPS_EXTENSION,
          },
        },
        ssh: true,
      },
    });
    stops.push(() => concierge.stop());
    await applyJWTAuthenticator(cluster, FUZZ_AUTHENTICATOR, issuer, FUZZ_AUDIENCE);
    await eventually(async () => {
      const r = await cluster.kubectl([
        'get',
        'jwtauthenticator.authentication.concierge.sealion.dev',
        FUZZ_AUTHENTICATOR,
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
          (['answers', 'garbage', 'peer', 'register'] as const).map((role) => ({
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
    const directCert = await issueCert(cluster.ca, {
      commonName: FUZZ_USER,
      organizations: [FUZZ_GROUP],
      usage: 'client',
      validityMs: 24 * 3600_000,
    });
    const token = await issuer.mint({ username: FUZZ_USER, groups: [FUZZ_GROUP] }, { expiresIn: 3600 * 24 });
    const agentCerts = new Map<string, Promise<Credential>>();
    const agentCert = (lane: number, role: 'answers' | 'garbage' | 'peer'): Promise<Credential> => {
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
    };
    const peer = await peerIdentities(cluster, clients, tunnelCA, {
      user: { certPem: userCert.certPem, keyPem: userCert.keyPem },
      agent: await agentCert(0, 'answers'),
    });
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
      apiServer: {
        url: cluster.url,
        ca: cluster.ca.certPem,
        userCert: { certPem: directCert.certPem, keyPem: directCert.keyPem },
      },
      agentCert,
      async bootstrapToken(name: string) {
        return (await createBootstrapToken(clients, TUNNEL_NAMESPACE, name)).token;
      },
      peer,
      clients,
      tunnelNamespace: TUNNEL_NAMESPACE,
      ssh: {
        port: concierge.ssh!.port,
        cas,
        keys: { ed25519: ed25519Key(), ecdsa: ecdsaKey(), rsa: rsaKey(2048) },
      },
      stop,
    } satisfies FuzzTarget;
  } catch (err) {
    await stop();
    throw err;
  }
}

/**
 * Where the concierge's peer listener is (from its replica Lease, once its status publisher wrote it) and the
 * identities the fuzzer shows it: replicas' certificates from the peer CA, and the forged ones of FORGED_PEERS.
 */
async function peerIdentities(
  cluster: Cluster,
  clients: KubeClients,
  tunnelCA: CertificateAuthority,
  others: { user: Credential; agent: Credential },
): Promise<FuzzTarget['peer']> {
  const address = await eventually(async () => {
    const r = await cluster.kubectl([
      'get',
      'lease',
      '-n',
      TUNNEL_NAMESPACE,
      '-o',
      `jsonpath={.items[*].metadata.annotations.${PEER_ADDRESS_ANNOTATION.replace(/\./g, '\\.')}}`,
    ]);
    if (r.code !== 0 || !r.stdout.includes(':'))
      throw new Error(`no peer address on a Lease yet: ${r.stderr}`);
    return r.stdout.trim().split(' ')[0]!;
  }, 60_000);
  const secret = await eventually(async () => {
    const data = await readSecretData(clients, TUNNEL_NAMESPACE, PEER_CA_SECRET);
    if (!data) throw new Error('no peer CA yet');
    return data;
  });
  const peerCA = await loadCA(secret['tls.crt'] ?? '', secret['tls.key'] ?? '');
  const pair = (c: { certPem: string; keyPem: string }): Credential => ({
    certPem: c.certPem,
    keyPem: c.keyPem,
  });
  const replica = async (name: string, ca = peerCA, extra: { validityMs?: number; usage?: 'server' } = {}) =>
    pair(
      await issueCert(ca, {
        commonName: 'sealion-peer',
        uris: [`${PEER_URI_PREFIX}${encodeURIComponent(name)}`],
        usage: extra.usage ?? 'server+client',
        validityMs: extra.validityMs ?? 24 * 3600_000,
      }),
    );
  const peerWith = async (uris: string[]) =>
    pair(await issueCert(peerCA, { commonName: 'sealion-peer', uris, usage: 'server+client' }));
  const replicas = Object.fromEntries(
    await Promise.all(PEER_NAMES.map(async (name) => [name, await replica(name)] as const)),
  ) as Record<PeerName, Credential>;
  const forged: FuzzTarget['peer']['forged'] = {
    user: others.user,
    agent: others.agent,
    'tunnel CA': pair(tunnelCA),
    'another CA': await replica('fuzz-peer', await newCA('sealion peer CA')),
    unnamed: pair(await issueCert(peerCA, { commonName: 'sealion-peer', usage: 'server+client' })),
    'two names': await peerWith([`${PEER_URI_PREFIX}a`, `${PEER_URI_PREFIX}b`]),
    'empty name': await peerWith([PEER_URI_PREFIX]),
    'undecodable name': await peerWith([`${PEER_URI_PREFIX}%zz`]),
    expired: await replica('fuzz-peer', peerCA, { validityMs: -60_000 }),
    'server only': await replica('fuzz-peer', peerCA, { usage: 'server' }),
  };
  return { port: Number(address.slice(address.lastIndexOf(':') + 1)), ca: peerCA.certPem, replicas, forged };
}
