// The concierge's controllers, in one list: each entry says what the controller is, whether it runs on every replica
// or only on the leader, and (through its watches and reads) the informers it needs, all taken from the process's
// one set of informers (lib/kube/kube.ts newKubeInformers), so that two controllers reading one collection share its
// cache and its watch. concierge.ts registers the list with the manager, which starts and stops them together; which
// of them write, and only on the leader, is the manager's business (lib/controller/manager.ts).
//
// On every replica: the authenticator validators (the cache the proxy asks), the proxy server (what this replica
// serves), the Cluster status facts (cluster-status.ts: this replica's entries and Lease), the tunnel listener's
// hosts and the peer certificate. On the leader: the authenticators' status, the proxy writer (Service, Secrets) and
// the strategy publisher (authenticators' and the CredentialIssuer's status).
import { CONCIERGE_VERSIONS_CONFIG_MAP, CONFIG_KEY } from '../apis/install.ts';
import type {
  AuthenticatorStatus,
  ConciergeStrategy,
  JWTAuthenticator,
  WebhookAuthenticator,
} from '../apis/authentication.ts';
import type {
  CredentialIssuer,
  AccessRequestsSpec,
  CredentialIssuerSpec,
  CredentialIssuerStatus,
  SSHStatus,
} from '../apis/config.ts';
import { apiGroups, Kind, Resource, VERSION } from '../apis/groups.ts';
import {
  newJWTAuthenticatorControllers,
  newWebhookAuthenticatorControllers,
  type AuthenticatorControllers,
} from '../controllers/authenticators.ts';
import type { NodeLike } from '../controllers/detect.ts';
import {
  endpointHost,
  hostOnly,
  newImpersonationProxyControllers,
  PROXY_KEY,
  SERVICE_NAME,
  type ProxySettings,
  type SecretLike,
  type ServiceLike,
  type ServingMaterial,
} from '../controllers/impersonation-proxy.ts';
import { newConciergeVersionsPublisher } from '../controllers/concierge-versions.ts';
import { newPeerCertificateController } from '../controllers/peer-certificate.ts';
import { newSshDoorControllers, SSH_KEY, type SshMaterial } from '../controllers/ssh-door.ts';
import type { SshSettings } from './ssh/server.ts';
import { parseTrustedCAKeys } from '../lib/ssh/keys.ts';
import { newStrategyBoard, newStrategyPublisher } from '../controllers/strategies.ts';
import {
  newDirectLoginControllers,
  DIRECT_KEY,
  type APIServiceLike,
  type DirectServingMaterial,
} from '../controllers/direct-login.ts';
import { EXTENSION_AUTH_CONFIGMAP } from '../lib/kube/request-header.ts';
import type { ClusterCertificateIssuer } from '../lib/kube/cluster-certificates.ts';
import { apiStatusCode } from '../lib/kube/kube.ts';
import { newTunnelHostsController, type TunnelHostsDeps } from '../controllers/tunnel-hosts.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import type { Clock } from '../lib/clock.ts';
import type { Controller, ControllerEntry } from '../lib/controller/controller.ts';
import type { ControllerManager } from '../lib/controller/manager.ts';
import type { Informer, KubeObject } from '../lib/kube/informer.ts';
import {
  newClusterStatusWriter,
  newObjectWriter,
  type KubeClients,
  type KubeInformers,
} from '../lib/kube/kube.ts';
import type { Logger } from '../lib/log.ts';
import {
  ConfigError,
  configFromObject,
  MIN_BINDING_LIFETIME_MS,
  newConfigSource,
  parseDuration,
  type SealionConfig,
} from './config.ts';
import type { ClusterStatusPublisher } from './tunnel/cluster-status.ts';

/** The authenticators: informers on both kinds, and the one cache the proxy asks and the validators fill. */
export interface Authenticators {
  cache: AuthenticatorCache;
  jwt: Informer<JWTAuthenticator>;
  webhook: Informer<WebhookAuthenticator>;
}

export function newAuthenticators(informers: KubeInformers, groupSuffix: string): Authenticators {
  const group = apiGroups(groupSuffix).authentication;
  return {
    cache: new AuthenticatorCache(),
    jwt: informers.customResource<JWTAuthenticator>({
      group,
      version: VERSION,
      plural: Resource.JWTAuthenticator,
    }),
    webhook: informers.customResource<WebhookAuthenticator>({
      group,
      version: VERSION,
      plural: Resource.WebhookAuthenticator,
    }),
  };
}

export interface ConciergeControllerOptions {
  /** Gives writers their leader-only form, and takes what no informer sees (a validation, a strategy change). */
  manager: Pick<ControllerManager, 'leaderOnly' | 'enqueue' | 'resync'>;
  clients: KubeClients;
  informers: KubeInformers;
  groupSuffix: string;
  /** The concierge's namespace: where authenticators' CA bundles may be kept (tls.certificateAuthorityDataSource). */
  namespace?: string;
  authenticators: Authenticators;
  /** The impersonation proxy, when the controllers manage it (no fixed TLS files). Default: not managed. */
  proxy?: {
    /** The concierge's namespace: its ConfigMap, the proxy's Service and Secrets. */
    namespace: string;
    /** The ConfigMap holding config.yaml; also the CredentialIssuer's name. */
    configMap: string;
    /** What the proxy should serve; undefined: switched off. */
    serve: (material: ServingMaterial | undefined) => void;
    /**
     * The direct path (concierge/direct/): the aggregated APIs' Service in the namespace, what their listener should
     * serve, and the issuer of the cluster's certificates. Default: off.
     */
    direct?: {
      service: { name: string; port: number };
      serve: (material: DirectServingMaterial | undefined) => void;
      issuer: ClusterCertificateIssuer;
    };
    /** The SSH door: what it should serve (undefined: not listening). Default: none. */
    ssh?: { serve: (material: (SshMaterial & { settings: SshSettings }) | undefined) => void };
    /**
     * Told the name the hub's own cluster goes by (the config's `ssh.hubName`) at start and whenever the config
     * changes, for what names it outside the SSH door (the recordings). Default: nobody is told.
     */
    hubName?: (name: string) => void;
    /** Told the access requests' settings (the config's accessRequests) at start and on every change. Default: nobody. */
    accessRequests?: (settings: AccessRequestsSpec) => void;
  };
  /** The Cluster status facts, with the tunnel listener. Default: none. */
  clusterStatus?: ClusterStatusPublisher;
  /** The tunnel listener's hosts, when a Service's load balancer adds to them. Default: fixed hosts. */
  tunnelHosts?: Omit<TunnelHostsDeps, 'services'>;
  /** The peer certificate, with the peer listener. Default: none. */
  peerCertificate?: { issuedAt(): number; reissue(): Promise<void>; renewAfterMs: number };
  clock: Clock;
  log: Logger;
}

/**
 * The concierge's controllers. Resolves once the CredentialIssuer is known when the proxy is managed (for the
 * settings in effect before this process started); the manager starts them.
 */
export async function conciergeControllers(opts: ConciergeControllerOptions): Promise<ControllerEntry[]> {
  const { informers, log } = opts;
  const entries: ControllerEntry[] = [...authenticatorControllers(opts)];
  if (opts.proxy) entries.push(...(await proxyControllers(opts, opts.proxy)));
  if (opts.clusterStatus) {
    const facts = opts.clusterStatus;
    entries.push(...facts.entries);
    // The live replicas are known from their Leases, which only the tunnel's publisher keeps.
    if (opts.namespace) {
      const namespace = opts.namespace;
      const writes = opts.manager.leaderOnly(newObjectWriter(opts.clients));
      const configMaps = informers.core<ConfigMapLike>('configmaps', namespace);
      // Owned by the configuration's ConfigMap, as the proxy's Service is: uninstalling takes it too.
      const owner = opts.proxy?.configMap;
      entries.push({
        controller: newConciergeVersionsPublisher({
          replicas: () => facts.versions(),
          configMaps,
          namespace,
          publish: (data) => {
            const uid = owner ? configMaps.get(owner, namespace)?.metadata?.uid : undefined;
            return writes.apply({
              apiVersion: 'v1',
              kind: 'ConfigMap',
              metadata: {
                name: CONCIERGE_VERSIONS_CONFIG_MAP,
                namespace,
                ...(uid
                  ? { ownerReferences: [{ apiVersion: 'v1', kind: 'ConfigMap', name: owner, uid }] }
                  : {}),
              },
              data,
            } as never);
          },
          clock: opts.clock,
          log: log.child({ controller: 'concierge-versions' }),
        }),
        runs: 'leader',
      });
    }
  }
  if (opts.tunnelHosts) {
    const services = informers.core<ServiceLike>('services', opts.tunnelHosts.namespace);
    entries.push({
      controller: newTunnelHostsController({ ...opts.tunnelHosts, services }),
      runs: 'every-replica',
    });
  }
  if (opts.peerCertificate)
    entries.push({
      controller: newPeerCertificateController({ ...opts.peerCertificate, clock: opts.clock }),
      runs: 'every-replica',
      // A certificate that cannot be issued is tried again within seconds, then every few minutes.
      queue: { baseDelayMs: 1000 },
    });
  log.debug({ controllers: entries.map((e) => e.controller.name) }, 'controllers declared');
  return entries;
}

/** Per kind, the validator on every replica (it fills the cache) and the status writer on the leader. */
function authenticatorControllers(opts: ConciergeControllerOptions): ControllerEntry[] {
  const { manager, clients, authenticators } = opts;
  const group = apiGroups(opts.groupSuffix).authentication;
  const log = opts.log.child({ component: 'authenticators' });
  const validated = (controller: string, name: string): void => manager.enqueue(controller, name);
  const ns = opts.namespace;
  const caSources = ns
    ? {
        caSources: {
          namespace: ns,
          secrets: opts.informers.core<SecretLike>('secrets', ns),
          configMaps: opts.informers.core<ConfigMapLike>('configmaps', ns),
        },
      }
    : {};
  const entries = (controllers: AuthenticatorControllers): ControllerEntry[] => [
    { controller: controllers.validator, runs: 'every-replica' },
    { controller: controllers.status, runs: 'leader' },
  ];
  return [
    ...entries(
      newJWTAuthenticatorControllers({
        informer: authenticators.jwt,
        cache: authenticators.cache,
        status: manager.leaderOnly(
          newClusterStatusWriter<AuthenticatorStatus>(clients, {
            group,
            version: VERSION,
            plural: Resource.JWTAuthenticator,
          }),
        ),
        validated,
        log,
        ...caSources,
      }),
    ),
    ...entries(
      newWebhookAuthenticatorControllers({
        informer: authenticators.webhook,
        cache: authenticators.cache,
        status: manager.leaderOnly(
          newClusterStatusWriter<AuthenticatorStatus>(clients, {
            group,
            version: VERSION,
            plural: Resource.WebhookAuthenticator,
          }),
        ),
        validated,
        log,
        ...caSources,
      }),
    ),
  ];
}

interface ConfigMapLike extends KubeObject {
  data?: Record<string, string>;
}

/** The identity the signer probe asks a certificate for; its key is thrown away at once. */
const PROBE_IDENTITY = { username: 'sealion-signer-probe', groups: [] };

/** The direct path's controllers: its listener's material on every replica, the rest on the leader. */
function directControllers(
  opts: ConciergeControllerOptions,
  direct: NonNullable<NonNullable<ConciergeControllerOptions['proxy']>['direct']>,
  mode: () => 'auto' | 'enabled' | 'disabled',
  board: { set(strategy: ConciergeStrategy): void },
  owner: () => { apiVersion: string; kind: string; name: string; uid: string } | undefined,
): ControllerEntry[] {
  const { clients, informers, manager } = opts;
  const ns = opts.proxy!.namespace;
  const log = opts.log.child({ component: 'controllers', controller: 'direct-login' });
  const controllers = newDirectLoginControllers({
    namespace: ns,
    groups: apiGroups(opts.groupSuffix),
    service: direct.service,
    mode,
    nodes: informers.core<NodeLike & KubeObject>('nodes', ''),
    secrets: informers.core<SecretLike>('secrets', ns),
    configMaps: {
      extensionAuth: informers.core<ConfigMapLike>('configmaps', EXTENSION_AUTH_CONFIGMAP.namespace, {
        fieldSelector: `metadata.name=${EXTENSION_AUTH_CONFIGMAP.name}`,
      }),
      clusterInfo: async () => {
        try {
          return await clients.core.readNamespacedConfigMap({
            name: 'cluster-info',
            namespace: 'kube-public',
          });
        } catch (err) {
          if (apiStatusCode(err) === 404) return undefined;
          throw err;
        }
      },
    },
    apiServices: informers.customResource<APIServiceLike>({
      group: 'apiregistration.k8s.io',
      version: 'v1',
      plural: 'apiservices',
    }),
    probe: async () => (await direct.issuer.issue(PROBE_IDENTITY, 0)).certPem,
    writes: manager.leaderOnly(newObjectWriter(clients)),
    owner,
    serve: direct.serve,
    publish: (strategy) => board.set(strategy),
    log,
  });
  return [
    { controller: controllers.server, runs: 'every-replica' },
    // The config decides the mode: its changes reach the writer as the proxy's do.
    {
      controller: {
        ...controllers.writer,
        watches: [
          ...controllers.writer.watches,
          {
            informer: informers.core<ConfigMapLike>('configmaps', ns),
            filter: (c: ConfigMapLike) => c.metadata?.name === opts.proxy!.configMap,
            key: () => DIRECT_KEY,
          },
        ],
      },
      runs: 'leader',
    },
  ];
}

/** The door's settings from the config: the CA keys parsed (the config was checked, so they parse). */
export function sshSettings(config: SealionConfig): SshSettings {
  const ssh = config.ssh;
  return {
    hubName: ssh.hubName,
    ...(ssh.login
      ? {
          login: {
            authenticator: ssh.login.authenticator,
            clientId: ssh.login.clientID,
            scopes: [...ssh.login.scopes],
          },
        }
      : {}),
    certificateAuthorities: parseTrustedCAKeys([...ssh.certificateAuthorities]).keys,
    groupsExtension: ssh.groupsExtension,
    allowSystemNames: ssh.allowSystemNames,
    // Checked when the config was loaded.
    maxBindingMs: parseDuration(ssh.maxBindingLifetime) ?? MIN_BINDING_LIFETIME_MS,
  };
}

/** The SSH door's controllers: its server on every replica, its host key and status on the leader. */
function sshControllers(
  door: NonNullable<NonNullable<ConciergeControllerOptions['proxy']>['ssh']>,
  deps: {
    namespace: string;
    config: () => { config: SealionConfig; problem?: string };
    host: () => string | undefined;
    secrets: Informer<SecretLike>;
    services: Informer<ServiceLike>;
    configMapWatch: {
      informer: Informer<ConfigMapLike>;
      filter: (c: ConfigMapLike) => boolean;
      key: () => string;
    };
    writes: ReturnType<typeof newObjectWriter>;
    publish: (status: SSHStatus | null) => Promise<void>;
    log: Logger;
  },
): ControllerEntry[] {
  const controllers = newSshDoorControllers<SshSettings>({
    namespace: deps.namespace,
    settings: () => {
      const { config, problem } = deps.config();
      return {
        enabled: config.ssh.mode === 'enabled',
        port: config.ssh.port,
        settings: sshSettings(config),
        ...(problem ? { problem } : {}),
      };
    },
    host: deps.host,
    secrets: deps.secrets,
    writes: deps.writes,
    serve: door.serve,
    publish: deps.publish,
    log: deps.log,
  });
  const serviceWatch = {
    informer: deps.services,
    filter: (s: ServiceLike) => s.metadata?.name === SERVICE_NAME,
    key: () => SSH_KEY,
  };
  return [
    {
      controller: {
        ...controllers.server,
        // The Service too: its address is what signed-in users read to connect (`sealion ssh config`).
        watches: [...controllers.server.watches, deps.configMapWatch, serviceWatch],
      },
      runs: 'every-replica',
    },
    {
      controller: {
        ...controllers.writer,
        watches: [...controllers.writer.watches, deps.configMapWatch, serviceWatch],
      },
      runs: 'leader',
    },
  ];
}

const withoutScheme = (endpoint: string): string => endpoint.replace(/^https:\/\//, '');

/** The proxy controller's view of the configuration. */
function proxySettings(config: SealionConfig): ProxySettings {
  const proxy = config.impersonationProxy;
  return {
    mode: proxy.mode,
    endpoint: withoutScheme(proxy.endpoint),
    service: { ...proxy.service, annotations: { ...proxy.service.annotations } },
    tls: { ...proxy.tls },
    ...(config.ssh.mode === 'enabled' ? { sshPort: config.ssh.port } : {}),
  };
}

/** The settings in effect, in the CredentialIssuer spec's (Pinniped's) shape, with Sealion's kubeCertAgent. */
export function issuerSpec(config: SealionConfig): CredentialIssuerSpec {
  const proxy = config.impersonationProxy;
  const tls = proxy.tls;
  return {
    impersonationProxy: {
      mode: proxy.mode,
      service: {
        type: proxy.service.type,
        annotations: { ...proxy.service.annotations },
        ...(proxy.service.loadBalancerIP ? { loadBalancerIP: proxy.service.loadBalancerIP } : {}),
        externalTrafficPolicy: proxy.service.externalTrafficPolicy,
      },
      ...(proxy.endpoint ? { externalEndpoint: withoutScheme(proxy.endpoint) } : {}),
      ...(tls.secretName || tls.certificateAuthorityData
        ? {
            tls: {
              ...(tls.secretName ? { secretName: tls.secretName } : {}),
              ...(tls.certificateAuthorityData
                ? { certificateAuthorityData: tls.certificateAuthorityData }
                : {}),
            },
          }
        : {}),
    },
    kubeCertAgent: { mode: config.kubeCertAgent.mode },
    ssh: {
      mode: config.ssh.mode,
      port: config.ssh.port,
      hubName: config.ssh.hubName,
      ...(config.ssh.login ? { login: { ...config.ssh.login, scopes: [...config.ssh.login.scopes] } } : {}),
      certificateAuthorities: [...config.ssh.certificateAuthorities],
      groupsExtension: config.ssh.groupsExtension,
      allowSystemNames: config.ssh.allowSystemNames,
      maxBindingLifetime: config.ssh.maxBindingLifetime,
    },
    accessRequests: accessSettings(config),
  };
}

/** The access requests' settings in effect, as the CredentialIssuer's spec and the access store (concierge/access) hold them. */
export function accessSettings(config: SealionConfig): AccessRequestsSpec {
  const { hubName, hub } = config.accessRequests;
  return { hubName, hub: { ...hub, groups: [...hub.groups] } };
}

/**
 * The configuration a CredentialIssuer spec holds, checked as an edit of the ConfigMap would be; undefined when
 * there is none or it does not pass (anyone who may edit the CredentialIssuer could have written it).
 */
export function configFromIssuerSpec(spec: CredentialIssuerSpec | undefined): SealionConfig | undefined {
  const proxy = spec?.impersonationProxy;
  if (!proxy) return undefined;
  const service = proxy.service ?? {};
  try {
    return configFromObject({
      impersonationProxy: {
        mode: proxy.mode,
        endpoint: proxy.externalEndpoint ?? '',
        service: {
          ...(service.type === undefined ? {} : { type: service.type }),
          annotations: service.annotations ?? {},
          loadBalancerIP: service.loadBalancerIP ?? '',
          ...(service.externalTrafficPolicy ? { externalTrafficPolicy: service.externalTrafficPolicy } : {}),
        },
        tls: {
          secretName: proxy.tls?.secretName ?? '',
          certificateAuthorityData: proxy.tls?.certificateAuthorityData ?? '',
        },
      },
      ...(spec.kubeCertAgent ? { kubeCertAgent: { mode: spec.kubeCertAgent.mode } } : {}),
      ...(spec.ssh ? { ssh: spec.ssh } : {}),
      ...(spec.accessRequests ? { accessRequests: spec.accessRequests } : {}),
    });
  } catch (err) {
    if (err instanceof ConfigError) return undefined;
    throw err;
  }
}

/** What the proxy's controllers share: the collections they read, the leader-only writer, the config in effect. */
interface ProxyContext {
  opts: ConciergeControllerOptions;
  proxy: NonNullable<ConciergeControllerOptions['proxy']>;
  /** The concierge's namespace, and the ConfigMap with config.yaml (also the CredentialIssuer's name). */
  ns: string;
  configMap: string;
  configGroup: string;
  issuerResource: { group: string; version: string; plural: string };
  configMaps: Informer<ConfigMapLike>;
  nodes: Informer<NodeLike & KubeObject>;
  services: Informer<ServiceLike>;
  secrets: Informer<SecretLike>;
  issuers: Informer<CredentialIssuer>;
  writes: ReturnType<typeof newObjectWriter>;
  config: () => { config: SealionConfig; problem?: string };
  /** The strategies the controllers found, which the publisher shows. */
  board: ReturnType<typeof newStrategyBoard>;
  /** The config's ConfigMap, waking a controller's one key. */
  configMapWatch: {
    informer: Informer<ConfigMapLike>;
    filter: (c: ConfigMapLike) => boolean;
    key: () => string;
  };
  log: Logger;
}

/**
 * The proxy's controllers: the proxy server on every replica, and on the leader the proxy writer (Service, Secrets)
 * and the strategy publisher (authenticators' and the CredentialIssuer's status), with the SSH door's and the direct
 * path's when they run. Resolves once the CredentialIssuer is known, for the settings in effect before this process
 * started; the manager starts them.
 */
async function proxyControllers(
  opts: ConciergeControllerOptions,
  proxyOpts: NonNullable<ConciergeControllerOptions['proxy']>,
): Promise<ControllerEntry[]> {
  const ctx = await proxyContext(opts, proxyOpts);
  // Published before any controller runs, so before the proxy serves: no moment where the hub's access policy reads
  // as the empty one (no reason required, nothing to grant) because the hub-name controller has not run yet. The
  // ConfigMap's first list is awaited, so this is the ConfigMap's config, not only the CredentialIssuer's copy.
  await ctx.configMaps.synced();
  publishHub(ctx, proxyOpts);
  return [
    ...(proxyOpts.ssh ? sshEntries(ctx, proxyOpts.ssh) : []),
    ...(proxyOpts.hubName || proxyOpts.accessRequests
      ? [{ controller: hubNamePublisher(ctx, proxyOpts), runs: 'every-replica' as const }]
      : []),
    ...impersonationProxyEntries(ctx),
    { controller: strategyPublisher(ctx), runs: 'leader' },
    ...(proxyOpts.direct
      ? directControllers(
          opts,
          proxyOpts.direct,
          () => ctx.config().config.kubeCertAgent.mode,
          ctx.board,
          () => {
            const issuer = ctx.issuers.get(ctx.configMap);
            const uid = issuer?.metadata?.uid;
            return uid
              ? {
                  apiVersion: `${ctx.configGroup}/${VERSION}`,
                  kind: Kind.CredentialIssuer,
                  name: ctx.configMap,
                  uid,
                }
              : undefined;
          },
        )
      : []),
  ];
}

/** The informers and writer the proxy's controllers share, and the config in effect. */
async function proxyContext(
  opts: ConciergeControllerOptions,
  proxy: NonNullable<ConciergeControllerOptions['proxy']>,
): Promise<ProxyContext> {
  const { informers } = opts;
  const { namespace: ns, configMap } = proxy;
  const log = opts.log.child({ component: 'controllers' });
  const configGroup = apiGroups(opts.groupSuffix).config;
  const issuerResource = { group: configGroup, version: VERSION, plural: Resource.CredentialIssuer };
  const configMaps = informers.core<ConfigMapLike>('configmaps', ns);
  const nodes = informers.core<NodeLike & KubeObject>('nodes', '');
  const services = informers.core<ServiceLike>('services', ns);
  const secrets = informers.core<SecretLike>('secrets', ns);
  const issuers = informers.customResource<CredentialIssuer>(issuerResource);
  // The settings in effect before this process started, for a start while the ConfigMap holds a bad edit: without
  // them a restarted leader would fall back to the defaults and could take the proxy's Service away.
  await issuers.synced();
  const config = newConfigSource(
    () => configMaps.get(configMap, ns)?.data?.[CONFIG_KEY],
    (problem) =>
      log.warn(
        { configMap: `${ns}/${configMap}`, problem },
        'configuration edit rejected; the last good configuration keeps serving',
      ),
    configFromIssuerSpec(issuers.get(configMap)?.spec),
  );
  return {
    opts,
    proxy,
    ns,
    configMap,
    configGroup,
    issuerResource,
    configMaps,
    nodes,
    services,
    secrets,
    issuers,
    writes: opts.manager.leaderOnly(newObjectWriter(opts.clients)),
    config,
    board: newStrategyBoard(),
    configMapWatch: {
      informer: configMaps,
      filter: (c: ConfigMapLike) => c.metadata?.name === configMap,
      key: () => PROXY_KEY,
    },
    log,
  };
}

/** The proxy server on every replica and the proxy writer on the leader. */
function impersonationProxyEntries(ctx: ProxyContext): ControllerEntry[] {
  const { ns, configMap, configMaps, issuers, config, log } = ctx;
  const proxy = newImpersonationProxyControllers({
    namespace: ns,
    settings: () => {
      const state = config();
      return { settings: proxySettings(state.config), ...(state.problem ? { problem: state.problem } : {}) };
    },
    owner: () => {
      const uid = configMaps.get(configMap, ns)?.metadata?.uid;
      return uid ? { apiVersion: 'v1', kind: 'ConfigMap', name: configMap, uid } : undefined;
    },
    nodes: ctx.nodes,
    services: ctx.services,
    secrets: ctx.secrets,
    writes: ctx.writes,
    serve: ctx.proxy.serve,
    publish: (strategy: ConciergeStrategy) => ctx.board.set(strategy),
    directFailure: () => {
      // Read from the CredentialIssuer, which every replica sees: the leader's probe found it.
      const direct = issuers
        .get(configMap)
        ?.status?.strategies?.find((s) => s.type === 'CertificateSigningRequest');
      return direct?.reason === 'ClusterDoesNotSign' || direct?.reason === 'SharedFrontProxyCA'
        ? direct.message
        : undefined;
    },
    log: log.child({ controller: 'impersonation-proxy' }),
  });
  // The direct path's status decides the proxy's in mode auto (decide's directFailure).
  const issuerWatch = {
    informer: issuers,
    filter: (c: CredentialIssuer) => c.metadata?.name === configMap,
    key: () => PROXY_KEY,
  };
  return [
    {
      controller: { ...proxy.server, watches: [...proxy.server.watches, ctx.configMapWatch, issuerWatch] },
      runs: 'every-replica',
    },
    {
      controller: { ...proxy.writer, watches: [...proxy.writer.watches, ctx.configMapWatch, issuerWatch] },
      runs: 'leader',
    },
  ];
}

/** The strategy publisher (authenticators' and the CredentialIssuer's status), resynced when a strategy changes. */
function strategyPublisher(ctx: ProxyContext): Controller {
  const { opts, configMap, configGroup, issuerResource, writes } = ctx;
  const { clients, manager } = opts;
  const authnGroup = apiGroups(opts.groupSuffix).authentication;
  const publisher = newStrategyPublisher({
    strategies: () => ctx.board.list(),
    jwtAuthenticators: opts.authenticators.jwt,
    webhookAuthenticators: opts.authenticators.webhook,
    jwtStatus: manager.leaderOnly(
      newClusterStatusWriter(clients, {
        group: authnGroup,
        version: VERSION,
        plural: Resource.JWTAuthenticator,
      }),
    ),
    webhookStatus: manager.leaderOnly(
      newClusterStatusWriter(clients, {
        group: authnGroup,
        version: VERSION,
        plural: Resource.WebhookAuthenticator,
      }),
    ),
    credentialIssuer: {
      name: configMap,
      informer: ctx.issuers,
      spec: () => issuerSpec(ctx.config().config),
      applySpec: (spec) =>
        writes.apply({
          apiVersion: `${configGroup}/${VERSION}`,
          kind: Kind.CredentialIssuer,
          metadata: { name: configMap },
          spec,
        } as never),
      status: manager.leaderOnly(newClusterStatusWriter<CredentialIssuerStatus>(clients, issuerResource)),
    },
    log: ctx.log.child({ controller: 'strategy-publisher' }),
  });
  // A strategy changed: every authenticator and the CredentialIssuer show it.
  ctx.board.onChange(() => manager.resync(publisher.name));
  return publisher;
}

/** The key of the hub's name: one config, one name. */
const HUB_NAME_KEY = 'hub-name';

/**
 * On every replica: the hub's name from the config in effect, told to the parts that show it. Never fails: a
 * rejected edit leaves the last good config, and its name, in effect.
 */
function hubNamePublisher(
  ctx: ProxyContext,
  publish: Pick<NonNullable<ConciergeControllerOptions['proxy']>, 'hubName' | 'accessRequests'>,
): Controller {
  return {
    name: 'hub-name',
    watches: [{ ...ctx.configMapWatch, key: () => HUB_NAME_KEY }],
    initialKeys: [HUB_NAME_KEY],
    sync() {
      publishHub(ctx, publish);
      return Promise.resolve();
    },
  };
}

/** Tells the hub's name and access settings of the config in effect. */
function publishHub(
  ctx: ProxyContext,
  publish: Pick<NonNullable<ConciergeControllerOptions['proxy']>, 'hubName' | 'accessRequests'>,
): void {
  const { config } = ctx.config();
  publish.hubName?.(config.ssh.hubName);
  publish.accessRequests?.(accessSettings(config));
}

/** The SSH door's controllers, given what they read from the proxy's context. */
function sshEntries(
  ctx: ProxyContext,
  door: NonNullable<NonNullable<ConciergeControllerOptions['proxy']>['ssh']>,
): ControllerEntry[] {
  const { ns, services, config } = ctx;
  return sshControllers(door, {
    namespace: ns,
    config: () => config(),
    host: () => {
      const endpoint = endpointHost(proxySettings(config().config), services.get(SERVICE_NAME, ns));
      return endpoint ? hostOnly(endpoint) : undefined;
    },
    secrets: ctx.secrets,
    services,
    configMapWatch: { ...ctx.configMapWatch, key: () => SSH_KEY },
    writes: ctx.writes,
    publish: (status) =>
      ctx.opts.manager
        .leaderOnly(newClusterStatusWriter<CredentialIssuerStatus>(ctx.opts.clients, ctx.issuerResource))
        .patchStatus(ctx.configMap, { ssh: status } as never),
    log: ctx.log.child({ controller: 'ssh-door' }),
  });
}
