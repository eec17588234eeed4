// The thin adapter over @kubernetes/client-node (ESM-only). Composition roots and tests build clients
// here; everything else depends on the small interfaces they are passed.
import * as k8s from '@kubernetes/client-node';

export { ApiException } from '@kubernetes/client-node';
export type { V1Namespace, V1Status, V1CustomResourceDefinition } from '@kubernetes/client-node';

export type KubeconfigSource = { path: string } | { yaml: string } | { inCluster: true };

export interface KubeClients {
  config: k8s.KubeConfig;
  core: k8s.CoreV1Api;
  rbac: k8s.RbacAuthorizationV1Api;
  apiextensions: k8s.ApiextensionsV1Api;
  objects: k8s.KubernetesObjectApi;
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
  };
}

/** The HTTP status of a failed API call, or undefined when the error did not come from the API server. */
export function apiStatusCode(err: unknown): number | undefined {
  return err instanceof k8s.ApiException ? err.code : undefined;
}
