// The impersonation-proxy controller: decides from the config (and, in mode auto, the nodes) whether the proxy
// runs; keeps its Service, CA, serving certificate and client-certificate signer in the concierge's namespace;
// hands the TLS material to the local proxy; and publishes the ImpersonationProxy strategy. It is two controllers:
// the server, on every replica, computes the decision and serves what the Secrets hold; the writer, on the leader
// only (lib/controller/manager.ts), keeps the Service and Secrets as the decision wants them.
import { X509Certificate } from 'node:crypto';
import { isIP } from 'node:net';
import {
  REJECTED_EDIT,
  StrategyReasons,
  StrategyStatuses,
  StrategyTypes,
  type ConciergeStrategy,
  type StrategyReason,
  type StrategyStatus,
} from '../apis/authentication.ts';
import type { Informer, KubeObject } from '../lib/kube/informer.ts';
import type { ObjectWriter } from '../lib/kube/kube.ts';
import type { Logger } from '../lib/log.ts';
import { ensureStoredCA, storedCA, tlsSecret, type StoredCA } from '../lib/pki/ca-secret.ts';
import { issueCert, loadCA, newCA } from '../lib/pki/pki.ts';
import type { Controller, Watch } from '../lib/controller/controller.ts';
import type { SyncResult } from '../lib/controller/queue.ts';
import { strategyOf } from './strategies.ts';
import { detectManaged, type NodeLike } from './detect.ts';

export const SERVICE_NAME = 'sealion-impersonation-proxy';
export const CA_SECRET = 'sealion-impersonation-proxy-ca';
export const TLS_SECRET = 'sealion-impersonation-proxy-tls';
export const SIGNER_SECRET = 'sealion-impersonation-proxy-signer';
/** The one key this controller syncs: it manages a singleton. */
export const PROXY_KEY = 'impersonation-proxy';
/** Pods the Service selects (the concierge Deployment's label). */
const POD_SELECTOR = { app: 'sealion-concierge' };
const PROXY_PORT_NAME = 'proxy';
/** The concierge container's port the SSH door listens on. */
const SSH_PORT_NAME = 'ssh';

const DAY_MS = 24 * 3600 * 1000;
/** Serving certificates live a year and are re-issued when a third of that is left. */
const SERVING_VALIDITY_MS = 365 * DAY_MS;
/** The signer rotates yearly; the previous one stays trusted until it expires, so issued certificates keep working. */
const SIGNER_VALIDITY_MS = 365 * DAY_MS;
/** The CA lives long: clients keep it in their kubeconfigs. */
const CA_VALIDITY_MS = 10 * 365 * DAY_MS;
const RENEW_FRACTION_LEFT = 1 / 3;

export interface ProxySettings {
  mode: 'auto' | 'enabled' | 'disabled';
  endpoint: string;
  service: {
    type: 'LoadBalancer' | 'ClusterIP' | 'None';
    annotations: Readonly<Record<string, string>>;
    loadBalancerIP: string;
    externalTrafficPolicy: 'Local' | 'Cluster';
  };
  tls: { certificateAuthorityData: string; secretName: string };
  /** The SSH door's port on the Service, when the door is enabled. */
  sshPort?: number;
}

export interface ServiceLike extends KubeObject {
  spec?: { clusterIP?: string };
  status?: { loadBalancer?: { ingress?: { ip?: string; hostname?: string }[] } };
}

export interface SecretLike extends KubeObject {
  data?: Record<string, string>;
}

/** What the proxy needs to serve: its certificate, and the signer that issues and verifies client certificates. */
export interface ServingMaterial {
  certPem: string;
  keyPem: string;
  signer: { certPem: string; keyPem: string };
  clientCAPems: string[];
}

export interface ProxyControllerDeps {
  namespace: string;
  /** The current good settings, and the problem with the latest edit if it was rejected. */
  settings: () => { settings: ProxySettings; problem?: string };
  /** The object that owns the Service and serving Secret (the ConfigMap), once known. */
  owner: () => { apiVersion: string; kind: string; name: string; uid: string } | undefined;
  nodes: Informer<NodeLike & KubeObject>;
  /** Why the direct path does not work on this cluster, if it does not (the CredentialIssuer's status says). */
  directFailure?: () => string | undefined;
  services: Informer<ServiceLike>;
  secrets: Informer<SecretLike>;
  /** The writer's writes (leader-only: see lib/controller/manager.ts). */
  writes: ObjectWriter;
  /** Called on every sync with what the proxy should serve (undefined: stop listening). */
  serve: (material: ServingMaterial | undefined) => void;
  publish: (strategy: ConciergeStrategy) => void;
  log: Logger;
  now?: () => Date;
}

interface Decision {
  run: boolean;
  status: StrategyStatus;
  reason: StrategyReason;
  message: string;
}

/** Whether the proxy runs, from the mode and what the nodes look like. */
/**
 * Whether the proxy runs, from the mode and what the nodes look like. `directFailure`: why the direct path (the
 * cluster's own API server with certificates it signs) does not work here, if it does not; in mode auto a
 * self-hosted cluster then gets the proxy, so its users are not left without a way in.
 */
export function decide(
  mode: ProxySettings['mode'],
  nodes: readonly NodeLike[],
  directFailure?: string,
): Decision {
  if (mode === 'disabled')
    return {
      run: false,
      status: 'NotAvailable',
      reason: 'Disabled',
      message: 'the impersonation proxy is disabled by configuration',
    };
  if (mode === 'enabled')
    return {
      run: true,
      status: 'Success',
      reason: 'Listening',
      message: 'the impersonation proxy is enabled by configuration',
    };
  const detection = detectManaged(nodes);
  if (!detection)
    return {
      run: false,
      status: 'Error',
      reason: 'CouldNotGetClusterInfo',
      message:
        'mode auto: no nodes found to tell whether the cluster is managed; set mode enabled or disabled',
    };
  if (!detection.managed && directFailure)
    return {
      run: true,
      status: 'Success',
      reason: 'Listening',
      message: `automatically enabled: ${detection.evidence}, but the direct path does not work (${directFailure})`,
    };
  return detection.managed
    ? {
        run: true,
        status: 'Success',
        reason: 'Listening',
        message: `automatically enabled: ${detection.evidence}`,
      }
    : {
        run: false,
        status: 'NotAvailable',
        reason: 'DisabledByDefault',
        message: `automatically disabled: ${detection.evidence}`,
      };
}

const b64 = (text: string): string => Buffer.from(text).toString('base64');
const unb64 = (data: string | undefined): string => Buffer.from(data ?? '', 'base64').toString('utf8');

/** The host clients dial: the configured endpoint, else the load balancer's hostname or IP, else the cluster IP. */
export function endpointHost(settings: ProxySettings, service: ServiceLike | undefined): string | undefined {
  if (settings.endpoint) return settings.endpoint;
  if (settings.service.type === 'ClusterIP') return service?.spec?.clusterIP || undefined;
  const ingress = service?.status?.loadBalancer?.ingress?.[0];
  return ingress?.hostname || ingress?.ip || undefined;
}

export function hostOnly(endpoint: string): string {
  const bracketed = /^\[([^\]]+)\](?::\d+)?$/.exec(endpoint);
  if (bracketed) return bracketed[1]!;
  return isIP(endpoint) ? endpoint : endpoint.replace(/:\d+$/, '');
}

/**
 * Whether `certPem` is signed by `caPem`, names `host` and has more than `keepMs` to live: the writer renews a
 * certificate with a third of its life left, the server serves one until it expires.
 */
function validFor(
  certPem: string,
  hosts: string | readonly string[],
  caPem: string,
  now: Date,
  keepMs: number,
): boolean {
  try {
    const cert = new X509Certificate(certPem);
    const ca = new X509Certificate(caPem);
    if (!cert.verify(ca.publicKey)) return false;
    const left = new Date(cert.validTo).getTime() - now.getTime();
    if (left <= keepMs) return false;
    return (typeof hosts === 'string' ? [hosts] : hosts).every((host) =>
      isIP(host) ? cert.checkIP(host) !== undefined : cert.checkHost(host) !== undefined,
    );
  } catch {
    return false;
  }
}

/**
 * The names the generated serving certificate carries: the endpoint clients dial, and while there is a Service, its
 * DNS name inside the cluster (`<service>.<namespace>.svc`), which pods on the hub dial: controllers that reach
 * agent-backed clusters with the kubeconfig `sealion cluster kubeconfig` writes.
 */
export function servingHosts(settings: ProxySettings, namespace: string, endpoint: string): string[] {
  const inCluster = `${SERVICE_NAME}.${namespace}.svc`;
  return settings.service.type === 'None' || endpoint === inCluster ? [endpoint] : [endpoint, inCluster];
}

/** The singleton's key, synced at start and whenever the leader changes. */
const INITIAL_KEYS = [PROXY_KEY];

interface Material {
  signer?: ServingMaterial['signer'] & { previousPem?: string };
  serving?: { certPem: string; keyPem: string; caPem: string };
}

export function newImpersonationProxyControllers(deps: ProxyControllerDeps): {
  server: Controller;
  writer: Controller;
} {
  const proxy: ProxyParts = {
    deps,
    ns: deps.namespace,
    now: deps.now ?? (() => new Date()),
  };
  const watches = [
    { informer: deps.nodes, key: () => PROXY_KEY },
    {
      informer: deps.services,
      filter: (s: ServiceLike) => s.metadata?.name === SERVICE_NAME,
      key: () => PROXY_KEY,
    },
    { informer: deps.secrets, key: () => PROXY_KEY },
  ];
  return { server: proxyServer(proxy, watches), writer: proxyWriter(proxy, watches) };
}

/** What the proxy's controllers share. */
interface ProxyParts {
  deps: ProxyControllerDeps;
  ns: string;
  now: () => Date;
}

const pem = (secret: SecretLike | undefined, key: string): string | undefined =>
  secret?.data?.[key] ? unb64(secret.data[key]) : undefined;

/** What the Secrets hold for serving at `host`, as far as it is usable now. */
function material({ deps, ns, now }: ProxyParts, settings: ProxySettings, host: string): Material {
  const signer = storedCA(deps.secrets.get(SIGNER_SECRET, ns)?.data);
  if (settings.tls.secretName) {
    // The admin's own certificate: used as given, and its CA published.
    const own = deps.secrets.get(settings.tls.secretName, ns);
    const certPem = pem(own, 'tls.crt');
    if (!certPem) return { ...(signer ? { signer } : {}) };
    const caPem = settings.tls.certificateAuthorityData
      ? unb64(settings.tls.certificateAuthorityData)
      : (pem(own, 'ca.crt') ?? '');
    return {
      ...(signer ? { signer } : {}),
      serving: { certPem, keyPem: pem(own, 'tls.key') ?? '', caPem },
    };
  }
  const caPem = storedCA(deps.secrets.get(CA_SECRET, ns)?.data)?.certPem;
  const tls = deps.secrets.get(TLS_SECRET, ns);
  const certPem = pem(tls, 'tls.crt');
  const usable = caPem && certPem && validFor(certPem, host, caPem, now(), 0);
  return {
    ...(signer ? { signer } : {}),
    ...(usable ? { serving: { certPem, keyPem: pem(tls, 'tls.key') ?? '', caPem } } : {}),
  };
}

/** On every replica: what the proxy serves, and the strategy that says so. Writes nothing. */
function proxyServer(proxy: ProxyParts, watches: Watch[]): Controller {
  const { deps, ns, now } = proxy;
  const strategy = strategyOf(StrategyTypes.ImpersonationProxy, now);
  return {
    name: 'impersonation-proxy-server',
    watches,
    initialKeys: INITIAL_KEYS,
    // Configuration problems, a pending load balancer and certificates not issued yet are reported in the strategy.
    sync(): Promise<SyncResult> {
      const { settings, problem } = deps.settings();
      const note = problem ? `; ${REJECTED_EDIT}: ${problem}` : '';
      const decision = decide(settings.mode, deps.nodes.list(), deps.directFailure?.());
      if (!decision.run) {
        // Not serving: the broken edit is the error an admin must see. Serving (below), the status says so, and the
        // message says what is wrong with the edit; clients use the proxy and warn.
        if (problem) {
          decision.status = StrategyStatuses.Error;
          decision.reason = StrategyReasons.ErrorDuringSetup;
        }
        deps.serve(undefined);
        deps.publish(strategy(decision.status, decision.reason, decision.message + note));
        return Promise.resolve();
      }
      const endpoint = endpointHost(settings, deps.services.get(SERVICE_NAME, ns));
      if (!endpoint) {
        deps.publish(
          strategy(
            'Error',
            problem ? 'ErrorDuringSetup' : 'Pending',
            `waiting for the load balancer of Service ${ns}/${SERVICE_NAME} to get an address${note}`,
          ),
        );
        return Promise.resolve({ requeueAfterMs: 10_000 });
      }
      const { signer, serving } = material(proxy, settings, hostOnly(endpoint));
      if (!serving || !signer) {
        deps.serve(undefined);
        deps.publish(
          strategy('Error', 'Pending', `waiting for the proxy's certificates to be issued${note}`),
        );
        // The leader's Secrets arrive through the informer; a missing admin Secret may be created later.
        return Promise.resolve({ requeueAfterMs: 5_000 });
      }
      deps.serve({
        certPem: serving.certPem,
        keyPem: serving.keyPem,
        signer: { certPem: signer.certPem, keyPem: signer.keyPem },
        clientCAPems: [signer.certPem, ...(signer.previousPem ? [signer.previousPem] : [])],
      });
      deps.publish(
        strategy(
          decision.status,
          decision.reason,
          `${decision.message}; serving at https://${endpoint}${note}`,
          {
            impersonationProxyConfig: {
              endpoint: `https://${endpoint}`,
              certificateAuthorityData: b64(serving.caPem),
            },
          },
        ),
      );
      return Promise.resolve();
    },
  };
}

/** The generated CA, created once and kept: clients keep it in their kubeconfigs. */
const ensureCA = ({ deps, ns }: ProxyParts): Promise<StoredCA> =>
  ensureStoredCA(
    // A CA another leader created may not be in the cache yet: then the create finds it, and this sync fails and
    // is retried once the cache has it.
    () => Promise.resolve(storedCA(deps.secrets.get(CA_SECRET, ns)?.data)),
    // No owner: the CA outlives the proxy being disabled, so kubeconfigs that trust it stay valid.
    (ca) => deps.writes.create(tlsSecret(ns, CA_SECRET, ca)),
    'sealion impersonation proxy CA',
    CA_VALIDITY_MS,
  );

/** The client-certificate signer, rotated with the previous one kept trusted until it expires. */
async function ensureSigner({ deps, ns, now }: ProxyParts): Promise<void> {
  const current = storedCA(deps.secrets.get(SIGNER_SECRET, ns)?.data);
  const due =
    !current ||
    new Date(new X509Certificate(current.certPem).validTo).getTime() - now().getTime() <
      SIGNER_VALIDITY_MS * RENEW_FRACTION_LEFT;
  if (!due) return;
  const next = await newCA('sealion client certificate signer', SIGNER_VALIDITY_MS);
  await deps.writes.apply(
    tlsSecret(ns, SIGNER_SECRET, {
      certPem: next.certPem,
      keyPem: next.keyPem,
      ...(current ? { previousPem: current.certPem } : {}),
    }),
  );
  deps.log.info({ rotated: Boolean(current) }, 'client certificate signer issued');
}

/** On the leader only: the Service and Secrets as the decision wants them. Failed writes throw and retry. */
function proxyWriter(proxy: ProxyParts, watches: Watch[]): Controller {
  const { deps, ns } = proxy;
  return {
    name: 'impersonation-proxy-writer',
    watches,
    initialKeys: INITIAL_KEYS,
    async sync(): Promise<SyncResult> {
      const { settings } = deps.settings();
      const decision = decide(settings.mode, deps.nodes.list(), deps.directFailure?.());
      if (!decision.run) {
        await deps.writes.delete('Service', ns, SERVICE_NAME);
        await deps.writes.delete('Secret', ns, TLS_SECRET);
        return;
      }
      await ensureService(proxy, settings);
      const endpoint = endpointHost(settings, deps.services.get(SERVICE_NAME, ns));
      // The load balancer's address arrives through the Service informer.
      if (!endpoint) return;
      await ensureSigner(proxy);
      // An admin's own certificate is theirs to renew.
      if (settings.tls.secretName) return;
      await ensureServingCertificate(proxy, servingHosts(settings, ns, hostOnly(endpoint)));
    },
  };
}

/** The proxy's Service as the settings want it (type None: no Service). */
async function ensureService({ deps, ns }: ProxyParts, settings: ProxySettings): Promise<void> {
  const ref = deps.owner();
  if (settings.service.type === 'None') return deps.writes.delete('Service', ns, SERVICE_NAME);
  await deps.writes.apply({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name: SERVICE_NAME,
      namespace: ns,
      labels: { 'app.kubernetes.io/part-of': 'sealion' },
      annotations: { ...settings.service.annotations },
      ...(ref ? { ownerReferences: [{ ...ref, controller: true }] } : {}),
    },
    spec: {
      type: settings.service.type,
      selector: POD_SELECTOR,
      ports: [
        { name: 'https', port: 443, targetPort: PROXY_PORT_NAME, protocol: 'TCP' },
        ...(settings.sshPort
          ? [{ name: 'ssh', port: settings.sshPort, targetPort: SSH_PORT_NAME, protocol: 'TCP' }]
          : []),
      ],
      ...(settings.service.loadBalancerIP ? { loadBalancerIP: settings.service.loadBalancerIP } : {}),
      // Only a Service with node ports has a policy for outside traffic.
      ...(settings.service.type === 'LoadBalancer'
        ? { externalTrafficPolicy: settings.service.externalTrafficPolicy }
        : {}),
    },
  } as never);
}

/**
 * A serving certificate for `hosts` from the generated CA, issued again once two thirds of its life are gone or when
 * it lacks one of them (a certificate from before the in-cluster name was added is reissued once).
 */
async function ensureServingCertificate(proxy: ProxyParts, hosts: string[]): Promise<void> {
  const { deps, ns, now } = proxy;
  const ca = await ensureCA(proxy);
  const certPem = pem(deps.secrets.get(TLS_SECRET, ns), 'tls.crt');
  if (certPem && validFor(certPem, hosts, ca.certPem, now(), SERVING_VALIDITY_MS * RENEW_FRACTION_LEFT))
    return;
  const issued = await issueCert(await loadCA(ca.certPem, ca.keyPem), {
    commonName: 'sealion-impersonation-proxy',
    hosts,
    usage: 'server',
    validityMs: SERVING_VALIDITY_MS,
  });
  await deps.writes.apply(
    tlsSecret(
      ns,
      TLS_SECRET,
      { certPem: issued.certPem, keyPem: issued.keyPem, caPem: ca.certPem },
      deps.owner(),
    ),
  );
  deps.log.info({ hosts }, 'serving certificate issued');
}
