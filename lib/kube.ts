// The thin adapter over @kubernetes/client-node (ESM-only). Composition roots and tests build clients
// here; everything else depends on the small interfaces they are passed.
import * as k8s from '@kubernetes/client-node';
import type { Informer, KubeObject } from './informer.ts';
import type { Logger } from './log.ts';
import type { StatusWriter } from './status-writer.ts';

export { ApiException } from '@kubernetes/client-node';
export type { V1Namespace, V1Status, V1CustomResourceDefinition } from '@kubernetes/client-node';

export type KubeconfigSource = { path: string } | { yaml: string } | { inCluster: true };

export interface KubeClients {
  config: k8s.KubeConfig;
  core: k8s.CoreV1Api;
  rbac: k8s.RbacAuthorizationV1Api;
  apiextensions: k8s.ApiextensionsV1Api;
  objects: k8s.KubernetesObjectApi;
  customObjects: k8s.CustomObjectsApi;
}

export function loadKubeConfig(source: KubeconfigSource): k8s.KubeConfig {
  const config = new k8s.KubeConfig();
  if ('path' in source) config.loadFromFile(source.path);
  else if ('yaml' in source) config.loadFromString(source.yaml);
  else config.loadFromCluster();
  return config;
}

export function newKubeClients(source: KubeconfigSource): KubeClients {
  const config = loadKubeConfig(source);
  return {
    config,
    core: config.makeApiClient(k8s.CoreV1Api),
    rbac: config.makeApiClient(k8s.RbacAuthorizationV1Api),
    apiextensions: config.makeApiClient(k8s.ApiextensionsV1Api),
    objects: k8s.KubernetesObjectApi.makeApiClient(config),
    customObjects: config.makeApiClient(k8s.CustomObjectsApi),
  };
}

/** The HTTP status of a failed API call, or undefined when the error did not come from the API server. */
export function apiStatusCode(err: unknown): number | undefined {
  return err instanceof k8s.ApiException ? err.code : undefined;
}

/** First and longest delay before an informer whose watch failed starts again. */
const INFORMER_RESTART_MIN_MS = 500;
const INFORMER_RESTART_MAX_MS = 30_000;

export interface InformerSource<T> {
  /** The collection's API path, e.g. /apis/authentication.concierge.sealion.dev/v1alpha1/jwtauthenticators. */
  path: string;
  list: () => Promise<{ items: T[]; metadata?: { resourceVersion?: string } }>;
  labelSelector?: string;
  fieldSelector?: string;
}

/**
 * An informer over client-node's ListWatch that restarts itself: client-node stops a ListWatch on any watch
 * error but 410 Gone, so a dropped connection or a missing CRD would otherwise end the watch for good.
 */
export function newInformer<T extends KubeObject>(
  config: k8s.KubeConfig,
  source: InformerSource<T>,
  log: Logger,
): Informer<T> {
  const listFn = source.list as unknown as k8s.ListPromise<k8s.KubernetesObject>;
  const watch = new k8s.ListWatch<k8s.KubernetesObject>(
    source.path,
    new k8s.Watch(config),
    listFn,
    false,
    source.labelSelector,
    source.fieldSelector,
  );
  const handlers: ((obj: T) => void)[] = [];
  let stopped = false;
  let failures = 0;
  let markSynced: () => void = () => {};
  const synced = new Promise<void>((done) => (markSynced = done));
  const start = (): void => {
    if (stopped) return;
    watch.start().then(
      () => {
        failures = 0;
        markSynced();
      },
      () => {
        // The error handler below schedules the restart.
      },
    );
  };
  watch.on('error', (err: unknown) => {
    if (stopped) return;
    failures++;
    const delay =
      Math.min(INFORMER_RESTART_MAX_MS, INFORMER_RESTART_MIN_MS * 2 ** (failures - 1)) *
      (0.5 + Math.random() / 2);
    log.warn(
      {
        path: source.path,
        err: err instanceof Error ? err.message : String(err),
        retryInMs: Math.round(delay),
      },
      'watch failed; restarting',
    );
    setTimeout(start, delay).unref();
  });
  for (const verb of [k8s.ADD, k8s.UPDATE, k8s.DELETE] as const) {
    watch.on(verb, (obj) => {
      for (const h of handlers) h(obj as unknown as T);
    });
  }
  start();
  return {
    list: () => watch.list() as unknown as T[],
    get: (name, namespace) => watch.get(name, namespace) as unknown as T | undefined,
    onChange: (handler) => void handlers.push(handler),
    synced: () => synced,
    stop: async () => {
      stopped = true;
      await watch.stop();
    },
  };
}

export interface ClusterResource {
  group: string;
  version: string;
  plural: string;
}

/** An informer over a cluster-scoped custom resource. */
export function newCustomResourceInformer<T extends KubeObject>(
  clients: KubeClients,
  resource: ClusterResource,
  log: Logger,
): Informer<T> {
  return newInformer<T>(
    clients.config,
    {
      path: `/apis/${resource.group}/${resource.version}/${resource.plural}`,
      list: () => clients.customObjects.listClusterCustomObject(resource) as Promise<{ items: T[] }>,
    },
    log,
  );
}

/** Status writes as JSON merge patches of the status subresource: fields other writers own are kept. */
export function newClusterStatusWriter<S>(clients: KubeClients, resource: ClusterResource): StatusWriter<S> {
  const mergePatch = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch);
  return {
    async patchStatus(name, status) {
      await clients.customObjects.patchClusterCustomObjectStatus(
        { ...resource, name, body: { status } },
        mergePatch,
      );
    },
  };
}
