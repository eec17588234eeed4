// Wires the impersonation-proxy controllers to the API server: the ConfigMap (last good config kept), nodes,
// the proxy's Service and Secrets, the CredentialIssuer, and the strategy publisher that writes how to reach
// the proxy onto every authenticator. Which of them write, and only on the leader, is the controller manager's
// business (lib/controller/manager.ts).
import { CONFIG_KEY } from '../apis/install.ts';
import type { ConciergeStrategy } from '../apis/authentication.ts';
import type { CredentialIssuer, CredentialIssuerSpec, CredentialIssuerStatus } from '../apis/config.ts';
import { apiGroups, Kind, Resource, VERSION } from '../apis/groups.ts';
import type { NodeLike } from '../controllers/detect.ts';
import {
  newImpersonationProxyControllers,
  PROXY_KEY,
  type ProxySettings,
  type SecretLike,
  type ServiceLike,
  type ServingMaterial,
} from '../controllers/impersonation-proxy.ts';
import type { ControllerManager } from '../lib/controller/manager.ts';
import {
  newStrategyBoard,
  newStrategyPublisher,
  tokenCredentialRequestStrategy,
} from '../controllers/strategies.ts';
import type { Informer, KubeObject } from '../lib/kube/informer.ts';
import {
  newClusterStatusWriter,
  newCoreInformer,
  newCustomResourceInformer,
  newObjectWriter,
  type KubeClients,
} from '../lib/kube/kube.ts';
import type { Logger } from '../lib/log.ts';
import type { Authenticators } from './authenticators.ts';
import { ConfigError, configFromObject, newConfigSource, type SealionConfig } from './config.ts';

export interface ProxyControlOptions {
  clients: KubeClients;
  groupSuffix: string;
  /** The concierge's namespace: its ConfigMap, the proxy's Service and Secrets. */
  namespace: string;
  /** The ConfigMap holding config.yaml; also the CredentialIssuer's name. */
  configMap: string;
  authenticators: Authenticators;
  /** What the proxy should serve; undefined: switched off. */
  serve: (material: ServingMaterial | undefined) => void;
  /** The Services of the namespace, watched once per process (the tunnel's host follower reads them too). */
  services: Informer<ServiceLike>;
  log: Logger;
}

interface ConfigMapLike extends KubeObject {
  data?: Record<string, string>;
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
  };
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
        },
        tls: {
          secretName: proxy.tls?.secretName ?? '',
          certificateAuthorityData: proxy.tls?.certificateAuthorityData ?? '',
        },
      },
      ...(spec.kubeCertAgent ? { kubeCertAgent: { mode: spec.kubeCertAgent.mode } } : {}),
    });
  } catch (err) {
    if (err instanceof ConfigError) return undefined;
    throw err;
  }
}

/**
 * Adds the proxy's controllers to `manager`: the proxy server on every replica, and on the leader the proxy writer
 * (Service, Secrets) and the strategy publisher (authenticators' and the CredentialIssuer's status). Resolves once
 * the CredentialIssuer is known, for the settings in effect before this process started; the manager starts them.
 */
export async function addProxyControllers(
  manager: ControllerManager,
  opts: ProxyControlOptions,
): Promise<{ stop(): Promise<void> }> {
  const { clients, namespace: ns, log } = opts;
  const configGroup = apiGroups(opts.groupSuffix).config;
  const issuerResource = { group: configGroup, version: VERSION, plural: Resource.CredentialIssuer };
  const authnGroup = apiGroups(opts.groupSuffix).authentication;
  const configMaps = newCoreInformer<ConfigMapLike>(clients, 'configmaps', ns, log);
  const nodes = newCoreInformer<NodeLike & KubeObject>(clients, 'nodes', '', log);
  const { services } = opts;
  const secrets = newCoreInformer<SecretLike>(clients, 'secrets', ns, log);
  const issuers = newCustomResourceInformer<CredentialIssuer>(clients, issuerResource, log);
  /** The informers these controllers own and stop (the Services' belong to the process). */
  const informers = [configMaps, nodes, secrets, issuers];
  const writes = manager.leaderOnly(newObjectWriter(clients));

  // The settings in effect before this process started, for a start while the ConfigMap holds a bad edit: without
  // them a restarted leader would fall back to the defaults and could take the proxy's Service away.
  await issuers.synced();
  const config = newConfigSource(
    () => configMaps.get(opts.configMap, ns)?.data?.[CONFIG_KEY],
    (problem) =>
      log.warn(
        { configMap: `${ns}/${opts.configMap}`, problem },
        'configuration edit rejected; the last good configuration keeps serving',
      ),
    configFromIssuerSpec(issuers.get(opts.configMap)?.spec),
  );
  const board = newStrategyBoard();
  const proxy = newImpersonationProxyControllers({
    namespace: ns,
    settings: () => {
      const state = config();
      return { settings: proxySettings(state.config), ...(state.problem ? { problem: state.problem } : {}) };
    },
    owner: () => {
      const uid = configMaps.get(opts.configMap, ns)?.metadata?.uid;
      return uid ? { apiVersion: 'v1', kind: 'ConfigMap', name: opts.configMap, uid } : undefined;
    },
    nodes,
    services,
    secrets,
    writes,
    serve: opts.serve,
    publish: (strategy: ConciergeStrategy) => {
      board.set(strategy);
      // The proxy server syncs on every ConfigMap change, so the other strategy follows the config here.
      board.set(tokenCredentialRequestStrategy(config().config.kubeCertAgent.mode, new Date()));
    },
    log: log.child({ controller: 'impersonation-proxy' }),
  });
  const configMapWatch = {
    informer: configMaps,
    filter: (c: ConfigMapLike) => c.metadata?.name === opts.configMap,
    key: () => PROXY_KEY,
  };
  manager.run({ ...proxy.server, watches: [...proxy.server.watches, configMapWatch] });
  manager.runWhileLeading({ ...proxy.writer, watches: [...proxy.writer.watches, configMapWatch] });

  const publisher = newStrategyPublisher({
    strategies: () => board.list(),
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
      name: opts.configMap,
      informer: issuers,
      spec: () => issuerSpec(config().config),
      applySpec: (spec) =>
        writes.apply({
          apiVersion: `${configGroup}/${VERSION}`,
          kind: Kind.CredentialIssuer,
          metadata: { name: opts.configMap },
          spec,
        } as never),
      status: manager.leaderOnly(newClusterStatusWriter<CredentialIssuerStatus>(clients, issuerResource)),
    },
    log: log.child({ controller: 'strategy-publisher' }),
  });
  manager.runWhileLeading(publisher);
  // A strategy changed: every authenticator and the CredentialIssuer show it.
  board.onChange(() => manager.resync(publisher.name));

  return {
    async stop() {
      await Promise.all(informers.map((i) => i.stop()));
    },
  };
}
