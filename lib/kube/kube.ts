// The thin adapter over @kubernetes/client-node (ESM-only). Composition roots and tests build clients
// here; everything else depends on the small interfaces they are passed.
import { exponentialBackoff } from '../backoff.ts';
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import * as k8s from '@kubernetes/client-node';
import { createSecureContext } from 'node:tls';
import { callOverHttp2 } from '../http2/forward.ts';
import { newH2Pool, type H2Pool } from '../http2/pool.ts';
import { selfSubjectAccessReview, subjectAccessReview, type AccessQuestion } from './access-review.ts';
import type { Informer, KubeObject } from './informer.ts';
import type { Logger } from '../log.ts';
import { systemClock, type Clock } from '../clock.ts';
import type { StatusWriter } from './status-writer.ts';

export { ApiException } from '@kubernetes/client-node';
export type { KubeConfig } from '@kubernetes/client-node';
export type { V1Namespace, V1Status, V1CustomResourceDefinition } from '@kubernetes/client-node';

/** A kubeconfig file, its text, the pod's service account, or kubectl's default ($KUBECONFIG, ~/.kube/config). */
export type KubeconfigSource = { path: string } | { yaml: string } | { inCluster: true } | { default: true };

export interface KubeClients {
  config: k8s.KubeConfig;
  core: k8s.CoreV1Api;
  rbac: k8s.RbacAuthorizationV1Api;
  apiextensions: k8s.ApiextensionsV1Api;
  objects: k8s.KubernetesObjectApi;
  customObjects: k8s.CustomObjectsApi;
  authentication: k8s.AuthenticationV1Api;
  authorization: k8s.AuthorizationV1Api;
  certificates: k8s.CertificatesV1Api;
}

export function loadKubeConfig(source: KubeconfigSource): k8s.KubeConfig {
  const config = new k8s.KubeConfig();
  if ('path' in source) config.loadFromFile(source.path);
  else if ('yaml' in source) config.loadFromString(source.yaml);
  else if ('default' in source) config.loadFromDefault();
  else config.loadFromCluster();
  shareDispatchers(config);
  return config;
}

/** The kubeconfig a command's --kubeconfig names (or the default one), switched to --context when it names one. */
export function loadKubeConfigFlags(flags: { kubeconfig: string; context: string }): k8s.KubeConfig {
  const config = loadKubeConfig(flags.kubeconfig ? { path: flags.kubeconfig } : { default: true });
  if (flags.context) useContext(config, flags.context);
  return config;
}

/** Switches `config` to the context `--context` names; one it does not have is refused, with the ones it has. */
function useContext(config: k8s.KubeConfig, context: string): void {
  const names = config.getContexts().map((c) => c.name);
  if (!names.includes(context))
    throw new Error(
      `--context: the kubeconfig has no context ${JSON.stringify(context)}; known: ${names.map((n) => JSON.stringify(n)).join(', ') || 'none'}`,
    );
  config.setCurrentContext(context);
}

type MakeDispatcher = (cluster: k8s.Cluster | null, options: object) => unknown;

/**
 * client-node (2.0) makes a new undici Agent for every request it sends (applySecurityAuthentication calls its
 * createDispatcher each time), so every API call opened a TLS connection of its own, and left it open until the
 * Agent's idle timeout: a TokenReview, an access review or a status write cost a handshake each, and a burst of them
 * a burst of connections. The dispatcher is kept instead, one per set of connection options (the same server, CA and
 * client certificate), so calls share connections as client-go's do, and a rotated certificate still gets its own.
 */
function shareDispatchers(config: k8s.KubeConfig): void {
  const target = config as unknown as { createDispatcher?: MakeDispatcher };
  const make = target.createDispatcher?.bind(config);
  // A release that renamed it would otherwise silently go back to a connection per call.
  if (!make) throw new Error('@kubernetes/client-node no longer has KubeConfig.createDispatcher');
  const made = new Map<string, unknown>();
  target.createDispatcher = (cluster, options) => {
    const key = createHash('sha256')
      .update(JSON.stringify([cluster?.server, config.createDispatcherOptions(cluster, options)]))
      .digest('hex');
    if (!made.has(key)) made.set(key, make(cluster, options));
    return made.get(key);
  };
}

/** Clients for the kubeconfig `source`, at its context `context` when one is named (`--context`). */
export function newKubeClients(source: KubeconfigSource, context = ''): KubeClients {
  const config = loadKubeConfig(source);
  if (context) useContext(config, context);
  return kubeClientsFor(config);
}

/** The clients of newKubeClients for a kubeconfig loaded already (loadKubeConfigFlags: --kubeconfig and --context). */
export function kubeClientsFor(config: k8s.KubeConfig): KubeClients {
  return {
    config,
    core: config.makeApiClient(k8s.CoreV1Api),
    rbac: config.makeApiClient(k8s.RbacAuthorizationV1Api),
    apiextensions: config.makeApiClient(k8s.ApiextensionsV1Api),
    objects: k8s.KubernetesObjectApi.makeApiClient(config),
    customObjects: config.makeApiClient(k8s.CustomObjectsApi),
    authentication: config.makeApiClient(k8s.AuthenticationV1Api),
    authorization: config.makeApiClient(k8s.AuthorizationV1Api),
    certificates: config.makeApiClient(k8s.CertificatesV1Api),
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
 * error but 410 Gone, so a dropped connection or a missing CRD would otherwise end the watch for good. It is synced
 * once a list has succeeded, not before.
 */
export function newInformer<T extends KubeObject>(
  config: k8s.KubeConfig,
  source: InformerSource<T>,
  log: Logger,
  clock: Clock = systemClock,
): Informer<T> {
  // client-node's ListWatch reports a failed list as an 'error' event and still resolves its start(): synced must
  // mean that a list succeeded, or a brief refusal at start-up (a 403 before RBAC lands) runs controllers on an empty
  // cache. So the list is watched here.
  let listed = false;
  const listFn = (async () => {
    const answer = await source.list();
    listed = true;
    return answer;
  }) as unknown as k8s.ListPromise<k8s.KubernetesObject>;
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
  let isSynced = false;
  let restart: unknown;
  const synced = new Promise<void>((done) => (markSynced = done)).then(() => void (isSynced = true));
  const start = (): void => {
    if (stopped) return;
    watch.start().then(
      () => {
        if (!listed) return;
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
      exponentialBackoff(failures, INFORMER_RESTART_MIN_MS, INFORMER_RESTART_MAX_MS) *
      (0.5 + Math.random() / 2);
    log.warn(
      {
        path: source.path,
        err: err instanceof Error ? err.message : String(err),
        retryInMs: Math.round(delay),
      },
      'watch failed; restarting',
    );
    // Until a list has succeeded someone is waiting for synced(), and this timer is all that will end the wait:
    // it keeps the process alive. After that, a restart must not keep a stopping process up.
    restart = clock.setTimeout(start, delay, { keepAlive: !isSynced });
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
      clock.clearTimeout(restart);
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
  clock: Clock = systemClock,
): Informer<T> {
  return newInformer<T>(
    clients.config,
    {
      path: `/apis/${resource.group}/${resource.version}/${resource.plural}`,
      list: () => clients.customObjects.listClusterCustomObject(resource) as Promise<{ items: T[] }>,
    },
    log,
    clock,
  );
}

/** One cluster-scoped custom object as the API server has it now (not a cache); undefined when there is none. */
export async function readClusterCustomObject<T>(
  clients: KubeClients,
  resource: ClusterResource,
  name: string,
): Promise<T | undefined> {
  try {
    return (await clients.customObjects.getClusterCustomObject({ ...resource, name })) as T;
  } catch (err) {
    if (apiStatusCode(err) === 404) return undefined;
    throw err;
  }
}

/**
 * A JSON merge patch of a cluster-scoped custom object. Put `metadata.resourceVersion` in the patch to make it
 * conditional: the API server then answers 409 when the object changed since it was read.
 */
export async function mergePatchClusterCustomObject(
  clients: KubeClients,
  resource: ClusterResource,
  name: string,
  patch: object,
): Promise<void> {
  await clients.customObjects.patchClusterCustomObject(
    { ...resource, name, body: patch },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
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

/**
 * Writes to a cluster-scoped custom object's status subresource that take part in server-side apply's field
 * ownership: each writer owns what it applied, and a later apply by the same field manager removes what it no
 * longer sends, never another manager's fields.
 */
export interface StatusApplier<S> {
  /** A server-side apply of `status` as `fieldManager`, taking over fields others own when the values differ. */
  apply(name: string, status: Partial<S>, fieldManager: string): Promise<void>;
  /** A JSON patch of the object (its paths start at the root, say /status/…); `test` operations make it conditional. */
  jsonPatch(name: string, operations: object[]): Promise<void>;
}

export function newStatusApplier<S>(
  clients: KubeClients,
  resource: ClusterResource,
  kind: string,
): StatusApplier<S> {
  const apply = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.ServerSideApply);
  const jsonPatch = k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.JsonPatch);
  const apiVersion = `${resource.group}/${resource.version}`;
  return {
    async apply(name, status, fieldManager) {
      await clients.customObjects.patchClusterCustomObjectStatus(
        {
          ...resource,
          name,
          body: { apiVersion, kind, metadata: { name }, status },
          fieldManager,
          force: true,
        },
        apply,
      );
    },
    async jsonPatch(name, operations) {
      await clients.customObjects.patchClusterCustomObjectStatus(
        { ...resource, name, body: operations },
        jsonPatch,
      );
    },
  };
}

/** What the API server says about a token (TokenReview), as plain data. */
export interface TokenReviewAnswer {
  authenticated: boolean;
  user?: { username?: string; uid?: string; groups?: string[]; extra?: Record<string, string[]> };
  error?: string;
  /** The audiences the token was found good for, of those asked about. */
  audiences?: string[];
}

/** The API server's authentication and authorization reviews, for the proxy. */
export interface Reviewer {
  /**
   * Whether the API server accepts `token`: with `audiences`, for one of those (the API server checks the token's
   * audience against them); without, for the API server's own audiences.
   */
  tokenReview(token: string, audiences?: string[]): Promise<TokenReviewAnswer>;
  allowed(question: AccessQuestion): Promise<boolean>;
}

export type { AccessQuestion };

/** Whether this client's own identity may do one resource action (SelfSubjectAccessReview). */
export async function selfAllowed(
  clients: KubeClients,
  attributes: Omit<AccessQuestion, 'user' | 'groups' | 'extra'>,
): Promise<boolean> {
  const review = await clients.authorization.createSelfSubjectAccessReview({
    body: selfSubjectAccessReview({ user: '', groups: [], extra: {}, ...attributes }),
  });
  return review.status?.allowed === true;
}

export function newReviewer(clients: KubeClients): Reviewer {
  return {
    async tokenReview(token, audiences) {
      const review = await clients.authentication.createTokenReview({
        body: {
          apiVersion: 'authentication.k8s.io/v1',
          kind: 'TokenReview',
          spec: { token, ...(audiences ? { audiences } : {}) },
        },
      });
      return {
        authenticated: review.status?.authenticated === true,
        ...(review.status?.user ? { user: review.status.user } : {}),
        ...(review.status?.error ? { error: review.status.error } : {}),
        ...(review.status?.audiences ? { audiences: review.status.audiences } : {}),
      };
    },
    async allowed(q) {
      const review = await clients.authorization.createSubjectAccessReview({ body: subjectAccessReview(q) });
      return review.status?.allowed === true;
    },
  };
}

/** Short-lived tokens for a service account (TokenRequest API), e.g. the proxy's forwarding identity. */
export async function requestServiceAccountToken(
  clients: KubeClients,
  namespace: string,
  serviceAccount: string,
  expirationSeconds: number,
): Promise<{ token: string; expiresAt: Date }> {
  const answer = await clients.core.createNamespacedServiceAccountToken({
    name: serviceAccount,
    namespace,
    body: {
      apiVersion: 'authentication.k8s.io/v1',
      kind: 'TokenRequest',
      spec: { audiences: [], expirationSeconds },
    },
  });
  const token = answer.status?.token;
  if (!token) throw new Error(`TokenRequest for ${namespace}/${serviceAccount} returned no token`);
  return {
    token,
    expiresAt: new Date(answer.status?.expirationTimestamp ?? Date.now() + expirationSeconds * 1000),
  };
}

/** Connection details of a kubeconfig's current context, for components that speak HTTP themselves. */
export interface ClusterAccess {
  server: URL;
  caPem?: string;
  certPem?: string;
  keyPem?: string;
  token?: string;
  insecureSkipTLSVerify?: boolean;
}

export function clusterAccess(config: k8s.KubeConfig): ClusterAccess {
  const cluster = config.getCurrentCluster();
  const user = config.getCurrentUser();
  if (!cluster) throw new Error('kubeconfig has no current cluster');
  const read = (data?: string, file?: string): string | undefined =>
    data ? Buffer.from(data, 'base64').toString('utf8') : file ? readFileSync(file, 'utf8') : undefined;
  const caPem = read(cluster.caData, cluster.caFile);
  const certPem = read(user?.certData, user?.certFile);
  const keyPem = read(user?.keyData, user?.keyFile);
  return {
    server: new URL(cluster.server),
    ...(caPem ? { caPem } : {}),
    ...(certPem ? { certPem } : {}),
    ...(keyPem ? { keyPem } : {}),
    ...(user?.token ? { token: user.token } : {}),
    ...(cluster.skipTLSVerify ? { insecureSkipTLSVerify: true } : {}),
  };
}

/** A coordination.k8s.io Lease as the leader election reads and writes it. */
export interface LeaseRecord {
  holder: string;
  /** Milliseconds since the epoch. */
  renewTime: number;
  leaseSeconds: number;
  transitions: number;
  resourceVersion?: string;
}

export interface LeaseClient {
  get(): Promise<LeaseRecord | undefined>;
  /** False when someone else wrote first (409), so the caller lost the race. */
  create(lease: LeaseRecord): Promise<boolean>;
  replace(lease: LeaseRecord): Promise<boolean>;
  /** Deletes it if it exists. */
  delete(): Promise<void>;
}

/** Kubernetes MicroTime wants exactly six fractional digits. */
function microTime(ms: number): string {
  return new Date(ms).toISOString().replace(/\.(\d{3})Z$/, '.$1000Z');
}

/**
 * Leases through the untyped custom-objects client: the typed client writes MicroTime fields with three
 * fractional digits, which the API server rejects.
 */
export function newLeaseClient(
  clients: KubeClients,
  namespace: string,
  name: string,
  labels: Record<string, string> = {},
  annotations: Record<string, string> = {},
): LeaseClient {
  const where = { group: 'coordination.k8s.io', version: 'v1', namespace, plural: 'leases', name };
  const body = (lease: LeaseRecord): object => ({
    apiVersion: 'coordination.k8s.io/v1',
    kind: 'Lease',
    metadata: {
      name,
      namespace,
      labels,
      annotations,
      ...(lease.resourceVersion ? { resourceVersion: lease.resourceVersion } : {}),
    },
    spec: {
      holderIdentity: lease.holder,
      leaseDurationSeconds: lease.leaseSeconds,
      renewTime: microTime(lease.renewTime),
      leaseTransitions: lease.transitions,
    },
  });
  const conflictIsFalse = async (call: () => Promise<unknown>): Promise<boolean> => {
    try {
      await call();
      return true;
    } catch (err) {
      if (apiStatusCode(err) === 409) return false;
      throw err;
    }
  };
  return {
    async get() {
      try {
        const lease = (await clients.customObjects.getNamespacedCustomObject(where)) as {
          metadata: { resourceVersion?: string };
          spec?: {
            holderIdentity?: string;
            renewTime?: string;
            leaseDurationSeconds?: number;
            leaseTransitions?: number;
          };
        };
        return {
          holder: lease.spec?.holderIdentity ?? '',
          renewTime: lease.spec?.renewTime ? Date.parse(lease.spec.renewTime) : 0,
          leaseSeconds: lease.spec?.leaseDurationSeconds ?? 0,
          transitions: lease.spec?.leaseTransitions ?? 0,
          ...(lease.metadata.resourceVersion ? { resourceVersion: lease.metadata.resourceVersion } : {}),
        };
      } catch (err) {
        if (apiStatusCode(err) === 404) return undefined;
        throw err;
      }
    },
    create: (lease) =>
      conflictIsFalse(() =>
        clients.customObjects.createNamespacedCustomObject({ ...where, body: body(lease) }),
      ),
    replace: (lease) =>
      conflictIsFalse(() =>
        clients.customObjects.replaceNamespacedCustomObject({ ...where, body: body(lease) }),
      ),
    async delete() {
      try {
        await clients.customObjects.deleteNamespacedCustomObject(where);
      } catch (err) {
        if (apiStatusCode(err) !== 404) throw err;
      }
    },
  };
}

/** A Lease as an informer holds it. */
export interface LeaseObject extends KubeObject {
  metadata?: KubeObject['metadata'] & { annotations?: Record<string, string> };
  spec?: { holderIdentity?: string; leaseDurationSeconds?: number; renewTime?: string };
}

/** An informer over the Leases of one namespace that carry `label` (key=value). */
export function newLeaseInformer(
  clients: KubeClients,
  namespace: string,
  label: string,
  log: Logger,
  clock: Clock = systemClock,
): Informer<LeaseObject> {
  const where = { group: 'coordination.k8s.io', version: 'v1', namespace, plural: 'leases' };
  return newInformer<LeaseObject>(
    clients.config,
    {
      path: `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`,
      labelSelector: label,
      list: () =>
        clients.customObjects.listNamespacedCustomObject({ ...where, labelSelector: label }) as Promise<{
          items: LeaseObject[];
        }>,
    },
    log,
    clock,
  );
}

/** Core kinds the impersonation-proxy controllers watch. */
export type CoreCollection = 'nodes' | 'services' | 'secrets' | 'configmaps';

/** Which objects of a collection an informer keeps (all when empty). */
export interface Selectors {
  labelSelector?: string;
  fieldSelector?: string;
}

/**
 * An informer over a core collection: nodes cluster-wide, the others in one namespace (all when it is ''), only the
 * objects `selectors` select: the API server filters both the list and the watch, so the cache holds no more.
 */
export function newCoreInformer<T extends KubeObject>(
  clients: KubeClients,
  collection: CoreCollection,
  namespace: string,
  log: Logger,
  selectors: Selectors = {},
  clock: Clock = systemClock,
): Informer<T> {
  const everywhere = collection === 'nodes' || namespace === '';
  const list = {
    nodes: () => clients.core.listNode(selectors),
    services: () =>
      everywhere
        ? clients.core.listServiceForAllNamespaces(selectors)
        : clients.core.listNamespacedService({ namespace, ...selectors }),
    secrets: () =>
      everywhere
        ? clients.core.listSecretForAllNamespaces(selectors)
        : clients.core.listNamespacedSecret({ namespace, ...selectors }),
    configmaps: () =>
      everywhere
        ? clients.core.listConfigMapForAllNamespaces(selectors)
        : clients.core.listNamespacedConfigMap({ namespace, ...selectors }),
  }[collection] as () => Promise<{ items: T[] }>;
  const path = everywhere ? `/api/v1/${collection}` : `/api/v1/namespaces/${namespace}/${collection}`;
  return newInformer<T>(clients.config, { path, list, ...selectors }, log, clock);
}

/** Sets a Service's load-balancer status (what a cloud's controller writes). */
export async function patchServiceLoadBalancer(
  clients: KubeClients,
  namespace: string,
  name: string,
  ingress: { ip?: string; hostname?: string }[],
): Promise<void> {
  await clients.core.patchNamespacedServiceStatus(
    { name, namespace, body: { status: { loadBalancer: { ingress } } } },
    k8s.setHeaderOptions('Content-Type', k8s.PatchStrategy.MergePatch),
  );
}

/** Writes to namespaced core objects. Applies are server-side applies: keys we stop sending are removed. */
export interface ObjectWriter {
  /** Namespaced or cluster-scoped (then without a namespace). */
  apply(obj: {
    apiVersion: string;
    kind: string;
    metadata: { name: string; namespace?: string };
  }): Promise<void>;
  /** Creates unless it exists; false when it already did (someone else won the race). */
  create(obj: {
    apiVersion: string;
    kind: string;
    metadata: { name: string; namespace: string };
  }): Promise<boolean>;
  /**
   * Deletes if present (an APIService is cluster-scoped: its namespace is ''). With `resourceVersion`, only that
   * version of it: the API server refuses (409) when it changed since, and the caller learns that it did.
   */
  delete(
    kind: 'Service' | 'Secret' | 'APIService',
    namespace: string,
    name: string,
    resourceVersion?: string,
  ): Promise<void>;
}

/** The field manager of what the concierge applies. */
export const FIELD_MANAGER = 'sealion-concierge';

export function newObjectWriter(clients: KubeClients, fieldManager: string = FIELD_MANAGER): ObjectWriter {
  return {
    async apply(obj) {
      await clients.objects.patch(
        obj,
        undefined,
        undefined,
        fieldManager,
        true,
        k8s.PatchStrategy.ServerSideApply,
      );
    },
    async create(obj) {
      try {
        await clients.objects.create(obj);
        return true;
      } catch (err) {
        if (apiStatusCode(err) === 409) return false;
        throw err;
      }
    },
    async delete(kind, namespace, name, resourceVersion) {
      try {
        await clients.objects.delete(
          kind === 'APIService'
            ? { apiVersion: 'apiregistration.k8s.io/v1', kind, metadata: { name } }
            : { apiVersion: 'v1', kind, metadata: { name, namespace } },
          undefined,
          undefined,
          undefined,
          undefined,
          undefined,
          resourceVersion ? { preconditions: { resourceVersion } } : undefined,
        );
      } catch (err) {
        if (apiStatusCode(err) !== 404) throw err;
      }
    },
  };
}

/** A Secret's data as the API server returns it (base64); undefined when the Secret does not exist. */
export async function readSecret(
  clients: KubeClients,
  namespace: string,
  name: string,
): Promise<Record<string, string> | undefined> {
  try {
    return (await clients.core.readNamespacedSecret({ name, namespace })).data ?? {};
  } catch (err) {
    if (apiStatusCode(err) === 404) return undefined;
    throw err;
  }
}

/** A Secret's data, decoded to text; undefined when the Secret does not exist. */
export async function readSecretData(
  clients: KubeClients,
  namespace: string,
  name: string,
): Promise<Record<string, string> | undefined> {
  const data = await readSecret(clients, namespace, name);
  return data
    ? Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v, 'base64').toString('utf8')]))
    : undefined;
}

/**
 * A process's informers, made once each and shared by everyone who reads the same collection (by resource,
 * namespace and selectors): two readers of one collection never hold two caches and two watches of it.
 */
export interface KubeInformers {
  core<T extends KubeObject>(
    collection: CoreCollection,
    namespace: string,
    selectors?: Selectors,
  ): Informer<T>;
  customResource<T extends KubeObject>(resource: ClusterResource): Informer<T>;
  leases(namespace: string, label: string): Informer<LeaseObject>;
  /** Stops every informer made; after all their readers have stopped. */
  stop(): Promise<void>;
}

/** `clock` times the restarts of watches that failed. Default: the system's. */
export function newKubeInformers(
  clients: KubeClients,
  log: Logger,
  clock: Clock = systemClock,
): KubeInformers {
  const made = new Map<string, Informer<KubeObject>>();
  const shared = <T extends KubeObject>(key: string, make: () => Informer<T>): Informer<T> => {
    let informer = made.get(key);
    if (!informer) made.set(key, (informer = make() as unknown as Informer<KubeObject>));
    return informer as unknown as Informer<T>;
  };
  return {
    core: (collection, namespace, selectors = {}) =>
      shared(
        `core/${collection}/${namespace}/${selectors.labelSelector ?? ''}/${selectors.fieldSelector ?? ''}`,
        () => newCoreInformer(clients, collection, namespace, log, selectors, clock),
      ),
    customResource: (resource) =>
      shared(`${resource.group}/${resource.version}/${resource.plural}`, () =>
        newCustomResourceInformer(clients, resource, log, clock),
      ),
    leases: (namespace, label) =>
      shared(`coordination.k8s.io/leases/${namespace}/${label}`, () =>
        newLeaseInformer(clients, namespace, label, log, clock),
      ),
    async stop() {
      const all = [...made.values()];
      made.clear();
      await Promise.all(all.map((i) => i.stop()));
    },
  };
}

/** GETs of raw API paths over kept-alive HTTP/2 connections (reads on a hot path, where a new TLS connection per call costs more than the call). */
export interface RawReader {
  /** The status and body of GET `path` (with its query), as the kubeconfig's identity. */
  get(path: string): Promise<{ status: number; body: Buffer }>;
  close(): void;
}

/** The longest answer a raw read takes: an object or a short list, not a cluster's worth. */
const RAW_READ_MAX_BYTES = 4 * 1024 * 1024;
const RAW_READ_TIMEOUT_MS = 10_000;

/**
 * A RawReader for the kubeconfig's current context: its CA and client certificate in one secure context, and its
 * Authorization asked of client-node at every call (in-cluster tokens rotate, exec plugins renew).
 */
export function newRawReader(config: k8s.KubeConfig): RawReader {
  const server = config.getCurrentCluster()?.server;
  if (!server) throw new Error('kubeconfig has no current cluster');
  let pool: H2Pool | undefined;
  const tls = async (): Promise<{ headers: Record<string, string>; pool: H2Pool }> => {
    const opts: { ca?: unknown; cert?: unknown; key?: unknown; headers?: Record<string, string> } = {};
    await config.applyToHTTPSOptions(opts as never);
    pool ??= newH2Pool(new URL(server).origin, {
      secureContext: createSecureContext({
        ...(opts.ca ? { ca: opts.ca as string | Buffer } : {}),
        ...(opts.cert ? { cert: opts.cert as string | Buffer, key: opts.key as string | Buffer } : {}),
      }),
    });
    return { headers: opts.headers ?? {}, pool };
  };
  return {
    async get(path) {
      const { headers, pool: p } = await tls();
      const answer = await callOverHttp2(
        (h, endStream) => p.request(h, endStream),
        { ...lowerCased(headers), ':method': 'GET', ':path': path, accept: 'application/json' },
        undefined,
        { timeoutMs: RAW_READ_TIMEOUT_MS, maxBytes: RAW_READ_MAX_BYTES },
      );
      return answer;
    },
    close() {
      pool?.close();
    },
  };
}

const lowerCased = (headers: Record<string, string>): Record<string, string> =>
  Object.fromEntries(Object.entries(headers).map(([k, v]) => [k.toLowerCase(), v]));
