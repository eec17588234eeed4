// The direct path: TokenCredentialRequest and WhoAmIRequest served as aggregated APIs of the cluster's own API
// server, whose users then talk to it directly with certificates it signs itself (concierge/direct/). Two
// controllers, as the impersonation proxy's: the server, on every replica, hands the aggregated listener its serving
// certificate and the front proxy's CA; the writer, on the leader, decides whether the path is on (the mode and, in
// auto, the nodes), keeps the serving CA and certificate, checks that the cluster signs client certificates (a probe
// request), registers the APIServices, and publishes the strategy with its evidence.
import { X509Certificate } from 'node:crypto';
import { parse } from 'yaml';
import { StrategyTypes, type ConciergeStrategy } from '../apis/authentication.ts';
import { VERSION, type ApiGroups } from '../apis/groups.ts';
import type { Informer, KubeObject } from '../lib/kube/informer.ts';
import type { ObjectWriter } from '../lib/kube/kube.ts';
import type { Logger } from '../lib/log.ts';
import { ensureStoredCA, storedCA, tlsSecret } from '../lib/pki/ca-secret.ts';
import { issueCert, loadCA } from '../lib/pki/pki.ts';
import type { Controller, Watch } from '../lib/controller/controller.ts';
import type { SyncResult } from '../lib/controller/queue.ts';
import { strategyOf } from './strategies.ts';
import { KUBE_APISERVER_CLIENT_SIGNER } from '../apis/install.ts';
import {
  EXTENSION_AUTH_CONFIGMAP,
  requestHeaderConfig,
  type RequestHeaderConfig,
} from '../lib/kube/request-header.ts';
import { signedByAny } from '../lib/pki/pem.ts';
import { detectManaged, type NodeLike } from './detect.ts';
import type { SecretLike } from './impersonation-proxy.ts';

export const API_CA_SECRET = 'sealion-concierge-api-ca';
export const API_TLS_SECRET = 'sealion-concierge-api-tls';
export const DIRECT_KEY = 'direct-login';
/** Where aggregated API servers usually sit among the groups: after the built-in ones (Pinniped's values too). */
const GROUP_PRIORITY_MINIMUM = 9900;
const VERSION_PRIORITY = 15;

const DAY_MS = 24 * 3600 * 1000;
const SERVING_VALIDITY_MS = 365 * DAY_MS;
const CA_VALIDITY_MS = 10 * 365 * DAY_MS;
const RENEW_FRACTION_LEFT = 1 / 3;
/** A working signer is checked again this often; a failing one sooner, so a fix shows within a minute. */
export const PROBE_AGAIN_MS = 6 * 3600 * 1000;
export const PROBE_RETRY_MS = 60_000;
/** How long registered APIServices may take to become Available before the strategy says they are not. */
export const APISERVICE_SETTLE_MS = 60_000;

export interface APIServiceLike extends KubeObject {
  spec?: { caBundle?: string; service?: { namespace?: string; name?: string; port?: number } };
  status?: { conditions?: { type: string; status: string; reason?: string; message?: string }[] };
}

export interface ConfigMapLike extends KubeObject {
  data?: Record<string, string>;
}

/** Where users reach the cluster's API server, as kubeadm publishes it in kube-public/cluster-info. */
export interface ClusterInfo {
  server: string;
  /** Base64 PEM. */
  certificateAuthorityData: string;
}

/** The server and CA of a kube-public/cluster-info ConfigMap's kubeconfig, or why there are none. */
export function clusterInfoFrom(data: Record<string, string> | undefined): ClusterInfo | string {
  const text = data?.['kubeconfig'];
  if (!text) return 'ConfigMap kube-public/cluster-info holds no kubeconfig';
  try {
    const config = parse(text) as {
      clusters?: { cluster?: { server?: unknown; 'certificate-authority-data'?: unknown } }[];
    };
    const cluster = config.clusters?.[0]?.cluster;
    const server = cluster?.server;
    const ca = cluster?.['certificate-authority-data'];
    if (typeof server !== 'string' || !server.startsWith('https://'))
      return 'the kubeconfig in kube-public/cluster-info names no https server';
    if (typeof ca !== 'string' || ca === '') return 'the kubeconfig in kube-public/cluster-info names no CA';
    return { server, certificateAuthorityData: ca };
  } catch {
    return 'the kubeconfig in kube-public/cluster-info is not YAML';
  }
}

/** What the aggregated listener serves: its certificate, and the front proxy's settings (whose headers it believes). */
export interface DirectServingMaterial {
  certPem: string;
  keyPem: string;
  requestHeader: RequestHeaderConfig;
}

/** The outcome of the last probe of the signer. */
interface Probe {
  ok: boolean;
  at: Date;
  message: string;
  /** The certificate it signed, when it signed one. */
  certPem?: string;
}

export interface DirectLoginDeps {
  namespace: string;
  groups: ApiGroups;
  /** The Service (in `namespace`) the APIServices send requests to, and its port. */
  service: { name: string; port: number };
  mode: () => 'auto' | 'enabled' | 'disabled';
  nodes: Informer<NodeLike & KubeObject>;
  secrets: Informer<SecretLike>;
  /** kube-system/extension-apiserver-authentication and kube-public/cluster-info, by namespace/name. */
  configMaps: {
    extensionAuth: Informer<ConfigMapLike>;
    clusterInfo: () => Promise<ConfigMapLike | undefined>;
  };
  apiServices: Informer<APIServiceLike>;
  /** Asks the cluster to sign one certificate: its PEM, or a rejection with what went wrong. */
  probe: () => Promise<string>;
  writes: ObjectWriter;
  /**
   * The cluster-scoped object the APIServices belong to (the CredentialIssuer), so that uninstalling takes them
   * away: an APIService left naming a Service that is gone breaks the cluster's discovery for everyone.
   */
  owner: () => { apiVersion: string; kind: string; name: string; uid: string } | undefined;
  /** On every replica: what the aggregated listener serves (undefined: nothing yet). */
  serve: (material: DirectServingMaterial | undefined) => void;
  publish: (strategy: ConciergeStrategy) => void;
  log: Logger;
  now?: () => Date;
}

const b64 = (text: string): string => Buffer.from(text).toString('base64');
const unb64 = (text: string): string => Buffer.from(text, 'base64').toString('utf8');

/** The name the API server checks the aggregated listener's certificate against. */
export const serviceHost = (namespace: string, service: string): string => `${service}.${namespace}.svc`;

/** Whether the direct path is on, and why (for the strategy when it is not). */
export function decideDirect(
  mode: 'auto' | 'enabled' | 'disabled',
  nodes: readonly NodeLike[],
): { on: true; why: string } | { on: false; why: string } {
  if (mode === 'disabled') return { on: false, why: 'disabled by configuration (kubeCertAgent.mode)' };
  if (mode === 'enabled') return { on: true, why: 'enabled by configuration' };
  const detection = detectManaged(nodes);
  if (!detection)
    return { on: false, why: 'automatically disabled: no nodes found to tell a self-hosted cluster by' };
  return detection.managed
    ? { on: false, why: `automatically disabled: ${detection.evidence}; clients use the impersonation proxy` }
    : { on: true, why: `automatically enabled: ${detection.evidence}` };
}

function certificateLeft(certPem: string, caPem: string, host: string, now: Date): number {
  try {
    const cert = new X509Certificate(certPem);
    if (!cert.verify(new X509Certificate(caPem).publicKey) || cert.checkHost(host) === undefined) return -1;
    return new Date(cert.validTo).getTime() - now.getTime();
  } catch {
    return -1;
  }
}

export function newDirectLoginControllers(deps: DirectLoginDeps): { server: Controller; writer: Controller } {
  const ns = deps.namespace;
  const direct: Direct = {
    deps,
    ns,
    now: deps.now ?? (() => new Date()),
    host: serviceHost(ns, deps.service.name),
    apiServiceNames: [deps.groups.login, deps.groups.identity].map((g) => `${VERSION}.${g}`),
  };
  const watches: Watch[] = [
    { informer: deps.nodes, key: () => DIRECT_KEY },
    {
      informer: deps.secrets,
      filter: (s: SecretLike) => s.metadata?.name === API_TLS_SECRET || s.metadata?.name === API_CA_SECRET,
      key: () => DIRECT_KEY,
    },
    { informer: deps.configMaps.extensionAuth, key: () => DIRECT_KEY },
  ];
  return { server: directServer(direct, watches), writer: directWriter(direct, watches) };
}

/** What the direct path's controllers share. */
interface Direct {
  deps: DirectLoginDeps;
  ns: string;
  now: () => Date;
  /** The name the aggregated listener's certificate is for. */
  host: string;
  /** The two APIServices, `v1alpha1.<group>`. */
  apiServiceNames: string[];
}

/** The API server's request-header settings, or undefined when there are none or they cannot be read. */
function frontProxySettings({ deps }: Direct): RequestHeaderConfig | undefined {
  try {
    return requestHeaderConfig(
      deps.configMaps.extensionAuth.get(EXTENSION_AUTH_CONFIGMAP.name, EXTENSION_AUTH_CONFIGMAP.namespace)
        ?.data,
    );
  } catch (err) {
    deps.log.warn(
      { err: (err as Error).message },
      'the API server publishes request-header settings that cannot be read',
    );
    return undefined;
  }
}

/** Every replica: hands the aggregated listener its certificate and the front proxy's settings, or nothing. */
function directServer(direct: Direct, watches: Watch[]): Controller {
  const { deps, ns } = direct;
  return {
    name: 'direct-login-server',
    watches,
    initialKeys: [DIRECT_KEY],
    sync(): Promise<SyncResult> {
      const tls = deps.secrets.get(API_TLS_SECRET, ns);
      const certPem = tls?.data?.['tls.crt'] ? unb64(tls.data['tls.crt']) : '';
      const caPem = tls?.data?.['ca.crt'] ? unb64(tls.data['ca.crt']) : '';
      const frontProxy = frontProxySettings(direct);
      if (!certPem || !frontProxy || certificateLeft(certPem, caPem, direct.host, direct.now()) <= 0) {
        deps.serve(undefined);
        return Promise.resolve({ requeueAfterMs: 10_000 });
      }
      deps.serve({ certPem, keyPem: unb64(tls?.data?.['tls.key'] ?? ''), requestHeader: frontProxy });
      return Promise.resolve();
    },
  };
}

/** Probes the cluster's signer when the last probe is old enough (PROBE_AGAIN_MS, or PROBE_RETRY_MS after a failure). */
function newSignerProbe({ deps, now }: Direct): () => Promise<Probe> {
  let lastProbe: Probe | undefined;
  return async () => {
    const due =
      !lastProbe ||
      now().getTime() - lastProbe.at.getTime() >= (lastProbe.ok ? PROBE_AGAIN_MS : PROBE_RETRY_MS);
    if (!due) return lastProbe!;
    const started = now();
    try {
      const certPem = await deps.probe();
      const ms = now().getTime() - started.getTime();
      lastProbe = {
        ok: true,
        at: started,
        certPem,
        message: `the cluster signed a probe request for ${KUBE_APISERVER_CLIENT_SIGNER} in ${(ms / 1000).toFixed(1)} s at ${started.toISOString()}`,
      };
    } catch (err) {
      lastProbe = {
        ok: false,
        at: started,
        message: `a probe request for ${KUBE_APISERVER_CLIENT_SIGNER} at ${started.toISOString()} failed: ${(err as Error).message}`,
      };
    }
    deps.log.info({ ok: lastProbe.ok, message: lastProbe.message }, 'signer probed');
    return lastProbe;
  };
}

/** The serving CA (made once) and a serving certificate with a third of its life left; returns the CA. */
async function ensureServing({ deps, ns, host, now }: Direct): Promise<string> {
  const ca = await ensureStoredCA(
    () => Promise.resolve(storedCA(deps.secrets.get(API_CA_SECRET, ns)?.data)),
    (made) => deps.writes.create(tlsSecret(ns, API_CA_SECRET, made)),
    'sealion concierge aggregated API CA',
    CA_VALIDITY_MS,
  );
  const tls = deps.secrets.get(API_TLS_SECRET, ns);
  const certPem = tls?.data?.['tls.crt'] ? unb64(tls.data['tls.crt']) : '';
  if (
    certPem &&
    certificateLeft(certPem, ca.certPem, host, now()) > SERVING_VALIDITY_MS * RENEW_FRACTION_LEFT
  )
    return ca.certPem;
  const issued = await issueCert(await loadCA(ca.certPem, ca.keyPem), {
    commonName: host,
    hosts: [host, `${host}.cluster.local`, deps.service.name, `${deps.service.name}.${ns}`],
    usage: 'server',
    validityMs: SERVING_VALIDITY_MS,
  });
  await deps.writes.apply(
    tlsSecret(ns, API_TLS_SECRET, { certPem: issued.certPem, keyPem: issued.keyPem, caPem: ca.certPem }),
  );
  deps.log.info({ host }, 'aggregated API serving certificate issued');
  return ca.certPem;
}

/** The APIServices, sending the two groups to the Service, trusted by the serving CA, owned by `owner`. */
async function registerAPIServices(
  { deps, ns }: Direct,
  caPem: string,
  owner: NonNullable<ReturnType<DirectLoginDeps['owner']>>,
): Promise<void> {
  for (const group of [deps.groups.login, deps.groups.identity]) {
    await deps.writes.apply({
      apiVersion: 'apiregistration.k8s.io/v1',
      kind: 'APIService',
      metadata: {
        name: `${VERSION}.${group}`,
        labels: { 'app.kubernetes.io/part-of': 'sealion' },
        ownerReferences: [owner],
      },
      spec: {
        group,
        version: VERSION,
        service: { namespace: ns, name: deps.service.name, port: deps.service.port },
        caBundle: b64(caPem),
        groupPriorityMinimum: GROUP_PRIORITY_MINIMUM,
        versionPriority: VERSION_PRIORITY,
      },
    } as never);
  }
}

/** Why each of our APIServices is not Available, if it is not. */
function unavailableAPIServices({ deps, apiServiceNames }: Direct): string[] {
  return apiServiceNames.flatMap((name) => {
    const available = deps.apiServices.get(name)?.status?.conditions?.find((c) => c.type === 'Available');
    return available?.status === 'True'
      ? []
      : [
          `${name} is not Available yet${available?.message ? ` (${available.reason}: ${available.message})` : ''}`,
        ];
  });
}

type Strategy = ReturnType<ReturnType<typeof strategyOf>>;

/**
 * The signer's verdict against the path: an Error strategy when no certificate may be handed out (the cluster signs
 * with the front proxy's CA, or does not sign at all), with when to look again; undefined when it signs.
 */
function signerRefusal(
  direct: Direct,
  strategy: ReturnType<typeof strategyOf>,
  why: string,
  probe: Probe,
  nextProbe: number,
): { strategy: Strategy; requeueAfterMs: number } | undefined {
  // A cluster whose client certificates come from the CA its API server trusts for the front proxy is one where a
  // certificate for a user named like the front proxy (any, when it allows every name) could claim any identity
  // in X-Remote-* headers, system:masters included: no certificate may be handed out there.
  const frontProxy = frontProxySettings(direct);
  if (probe.ok && probe.certPem && frontProxy && signedByAny(probe.certPem, frontProxy.caPem))
    return {
      strategy: strategy(
        'Error',
        'SharedFrontProxyCA',
        `${why}, but the cluster signs client certificates with the CA its API server trusts for the front proxy (requestheader-client-ca-file in kube-system/extension-apiserver-authentication): a certificate for a user named like the front proxy could claim any identity, so the direct path stays off; give the front proxy a CA of its own (as kubeadm does), or use the impersonation proxy (in mode auto it serves on such a cluster)`,
      ),
      requeueAfterMs: PROBE_RETRY_MS,
    };
  if (probe.ok) return undefined;
  // The APIServices stay away: a login that cannot be signed is no way in.
  return {
    strategy: strategy(
      'Error',
      'ClusterDoesNotSign',
      `${why}, but ${probe.message}; clients use the impersonation proxy (in mode auto it serves on such a cluster)`,
    ),
    requeueAfterMs: Math.max(1_000, nextProbe),
  };
}

/**
 * The leader: turns the path on or off. It decides from the mode and the nodes, reads where users reach the API
 * server, probes the signer, keeps the serving certificate, registers the APIServices and publishes the strategy.
 */
function directWriter(direct: Direct, watches: Watch[]): Controller {
  const { deps, now, apiServiceNames } = direct;
  const ours = new Set(apiServiceNames);
  const strategy = strategyOf(StrategyTypes.TokenCredentialRequestAPI, now);
  const probeIfDue = newSignerProbe(direct);
  /** When this leader first registered the APIServices: the API server needs a few seconds to find them Available. */
  let registeredAt: Date | undefined;

  /** The APIServices gone: the API server stops sending the path anything. */
  async function withdraw(): Promise<void> {
    registeredAt = undefined;
    for (const name of apiServiceNames)
      if (deps.apiServices.get(name)) await deps.writes.delete('APIService', '', name);
  }

  /** Success once the API server finds both APIServices Available; Pending while it may still be checking them. */
  function publishAvailability(why: string, probe: Probe, info: ClusterInfo, nextProbe: number): SyncResult {
    const unavailable = unavailableAPIServices(direct);
    registeredAt ??= now();
    if (unavailable.length > 0) {
      // Pending while the API server is likely still checking them (clients wait on Pending), an error after.
      const settling = now().getTime() - registeredAt.getTime() < APISERVICE_SETTLE_MS;
      deps.publish(
        strategy(
          'Error',
          settling ? 'Pending' : 'APIServiceUnavailable',
          `${why}; ${probe.message}; but ${unavailable.join('; ')}`,
        ),
      );
      return { requeueAfterMs: 5_000 };
    }
    deps.publish(
      strategy(
        'Success',
        'ClusterSigns',
        `${why}; ${probe.message}; the API server serves ${apiServiceNames.join(' and ')}; users log in at ${info.server}`,
        {
          tokenCredentialRequestConfig: {
            endpoint: info.server,
            certificateAuthorityData: info.certificateAuthorityData,
          },
        },
      ),
    );
    return { requeueAfterMs: Math.max(1_000, nextProbe) };
  }

  return {
    name: 'direct-login-writer',
    watches: [
      ...watches,
      {
        informer: deps.apiServices,
        filter: (a: APIServiceLike) => ours.has(a.metadata?.name ?? ''),
        key: () => DIRECT_KEY,
      },
    ],
    initialKeys: [DIRECT_KEY],
    // A path the configuration or the cluster rules out goes into the strategy; the API server's failures retry.
    async sync(): Promise<SyncResult> {
      const decision = decideDirect(deps.mode(), deps.nodes.list());
      if (!decision.on) {
        await withdraw();
        deps.publish(
          strategy('NotAvailable', 'Disabled', `the TokenCredentialRequest API is ${decision.why}`),
        );
        return;
      }
      const info = clusterInfoFrom((await deps.configMaps.clusterInfo())?.data);
      if (typeof info === 'string') {
        deps.publish(
          strategy(
            'Error',
            'CouldNotGetClusterInfo',
            `${decision.why}, but users would not know where the API server is: ${info} (kubeadm writes it; create it so, with the server users reach)`,
          ),
        );
        return { requeueAfterMs: PROBE_RETRY_MS };
      }
      const probe = await probeIfDue();
      const nextProbe = (probe.ok ? PROBE_AGAIN_MS : PROBE_RETRY_MS) - (now().getTime() - probe.at.getTime());
      const refusal = signerRefusal(direct, strategy, decision.why, probe, nextProbe);
      if (refusal) {
        await withdraw();
        deps.publish(refusal.strategy);
        return { requeueAfterMs: refusal.requeueAfterMs };
      }
      const caPem = await ensureServing(direct);
      const owner = deps.owner();
      // The CredentialIssuer is the strategy publisher's to create, which it does at once.
      if (!owner) return { requeueAfterMs: 1_000 };
      await registerAPIServices(direct, caPem, owner);
      return publishAvailability(decision.why, probe, info, nextProbe);
    },
  };
}
