// `sealion cluster kubeconfig NAME --service-account NS/SA`: a kubeconfig a controller on the hub mounts to reach an
// agent-backed cluster. Its server is the proxy's in-cluster Service plus `/clusters/NAME`, its CA the one the proxy
// publishes, and its credential the pod's own projected service-account token for Sealion's audience, read from a
// file kubelet keeps fresh: nothing secret is in the kubeconfig, so it may live in a ConfigMap. The target cluster
// acts on it under the Cluster's `spec.workloads.usernamePrefix` and the service account's name.
import { X509Certificate } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { isIP } from 'node:net';
import { stringify } from 'yaml';
import type { CredentialIssuer } from '../apis/config.ts';
import { apiGroups, Resource, VERSION } from '../apis/groups.ts';
import { isDNSLabel } from '../apis/names.ts';
import { workloadAudience, type ClusterSpec } from '../apis/tunnel.ts';
import type { KubeClients } from '../lib/kube/kube.ts';
import { SERVICE_NAME, TLS_SECRET } from '../controllers/impersonation-proxy.ts';
import { contextName } from './get-kubeconfig.ts';
import { printable } from './printable.ts';
import { UserError } from './errors.ts';

/** Where the pod mounts its projected token for Sealion's audience; the kubeconfig names the file in it. */
export const WORKLOAD_TOKEN_DIR = '/var/run/secrets/sealion';
export const WORKLOAD_TOKEN_FILE = `${WORKLOAD_TOKEN_DIR}/token`;
/** A projected token's life: kubelet renews it at 80%, and the API server's default bound is an hour. */
const TOKEN_SECONDS = 3600;
/** How many names a message lists when a name is not found. */
const NAMES_LISTED = 8;

export interface ClusterKubeconfigFlags {
  kubeconfig: string;
  context?: string;
  namespace: string;
  groupSuffix: string;
  /** NS/NAME of the hub service account the controller runs as. */
  serviceAccount: string;
  /** The proxy's address for the controller, https://host[:port]; empty: the proxy's in-cluster Service. */
  server: string;
  output: string;
  outputFile: string;
}

/** The part of a Cluster this command reads. */
interface WorkloadsCluster {
  metadata: { name?: string };
  spec?: Pick<ClusterSpec, 'workloads'>;
}

/** `NS/NAME`: a namespace (a DNS label) and a service account's name (a DNS subdomain), as the API server takes them. */
export function parseServiceAccount(value: string): { namespace: string; name: string } {
  const [namespace, name, ...rest] = value.split('/');
  if (!namespace || !name || rest.length > 0 || !isDNSLabel(namespace) || !isDNSSubdomain(name))
    throw new UserError(
      `--service-account ${JSON.stringify(printable(value))}: not NAMESPACE/NAME; give the hub service account as, for example, argocd/argocd-application-controller`,
    );
  return { namespace, name };
}

const isDNSSubdomain = (name: string): boolean =>
  name.length <= 253 && name.split('.').every((label) => isDNSLabel(label));

/**
 * The proxy's address given with --server: https and a host, no credentials, query or fragment; a path is kept (a
 * proxy behind a path prefix), and the command adds `/clusters/NAME` after it.
 */
function checkServer(server: string): string {
  let url: URL | undefined;
  try {
    url = new URL(server);
  } catch {
    url = undefined;
  }
  if (!url || url.protocol !== 'https:' || url.username || url.password || url.search || url.hash)
    throw new UserError(
      `--server ${JSON.stringify(printable(server))}: not an https:// address; give the proxy's address, such as https://proxy.example.com:8443`,
    );
  return `${url.origin}${url.pathname.replace(/\/+$/, '')}`;
}

/** The Cluster `name`, or a message that lists the ones there are. */
async function readCluster(
  clients: KubeClients,
  groupSuffix: string,
  name: string,
): Promise<WorkloadsCluster> {
  const resource = { group: apiGroups(groupSuffix).tunnel, version: VERSION, plural: Resource.Cluster };
  const list = (await clients.customObjects.listClusterCustomObject(resource)) as {
    items: WorkloadsCluster[];
  };
  const found = list.items.find((c) => c.metadata.name === name);
  if (found) return found;
  const names = list.items
    .map((c) => c.metadata.name ?? '')
    .filter(Boolean)
    .sort();
  const known =
    names.length === 0
      ? 'the hub has no agent-backed clusters; add one with sealion cluster add'
      : `known: ${names
          .slice(0, NAMES_LISTED)
          .map((n) => printable(n))
          .join(', ')}${names.length > NAMES_LISTED ? ', …' : ''}`;
  throw new UserError(`no cluster ${printable(name)}; ${known}`);
}

/** Whether the service account exists on the hub; a kubeconfig for one that does not would only ever get 401. */
async function checkServiceAccount(clients: KubeClients, namespace: string, name: string): Promise<void> {
  const { apiStatusCode } = await import('../lib/kube/kube.ts');
  try {
    await clients.core.readNamespacedServiceAccount({ name, namespace });
  } catch (err) {
    if (apiStatusCode(err) !== 404) throw err;
    throw new UserError(
      `no service account ${namespace}/${name} on the hub; create it first: kubectl -n ${namespace} create serviceaccount ${name}`,
    );
  }
}

/** The prefix the cluster maps hub workloads under; its absence is the cluster's admin's choice, said as such. */
function usernamePrefixOf(cluster: WorkloadsCluster, name: string): string {
  const prefix = cluster.spec?.workloads?.usernamePrefix;
  // The cluster's text, printed to the terminal below.
  if (prefix) return printable(prefix);
  const patch = JSON.stringify({ spec: { workloads: { usernamePrefix: 'hub:' } } });
  throw new UserError(
    `cluster ${printable(name)} takes no workloads from the hub: its spec.workloads.usernamePrefix is not set; set it (the names its RBAC will see start with it): kubectl patch cluster ${name} --type merge -p '${patch}'`,
  );
}

/** The proxy's in-cluster address: its Service's DNS name and https port. */
async function inClusterServer(clients: KubeClients, namespace: string): Promise<string> {
  const { apiStatusCode } = await import('../lib/kube/kube.ts');
  try {
    const service = await clients.core.readNamespacedService({ name: SERVICE_NAME, namespace });
    const port = service.spec?.ports?.find((p) => p.name === 'https')?.port ?? 443;
    return `https://${SERVICE_NAME}.${namespace}.svc${port === 443 ? '' : `:${port}`}`;
  } catch (err) {
    if (apiStatusCode(err) !== 404) throw err;
    throw new UserError(
      `no Service ${namespace}/${SERVICE_NAME}: the impersonation proxy is not running there, or has no Service (service.type None); turn it on, or give the address pods reach it at with --server`,
    );
  }
}

/**
 * The CA the proxy serves with, as its ImpersonationProxy strategy publishes it on the CredentialIssuer, and the
 * Secret its certificate is in (the admin's own, from the settings in effect, or the generated one).
 */
async function proxyCA(clients: KubeClients, groupSuffix: string): Promise<{ ca: string; secret: string }> {
  const list = (await clients.customObjects.listClusterCustomObject({
    group: apiGroups(groupSuffix).config,
    version: VERSION,
    plural: Resource.CredentialIssuer,
  })) as { items: CredentialIssuer[] };
  const strategy = list.items[0]?.status?.strategies?.find((s) => s.type === 'ImpersonationProxy');
  const ca = strategy?.frontend?.impersonationProxyInfo?.certificateAuthorityData;
  const own = list.items[0]?.spec?.impersonationProxy?.tls?.secretName;
  if (strategy?.status === 'Success' && ca) return { ca, secret: own || TLS_SECRET };
  const why = strategy
    ? `${printable(String(strategy.status))} (${printable(String(strategy.reason))}): ${printable(String(strategy.message))}`
    : 'not published yet';
  throw new UserError(
    `the impersonation proxy is ${why}; workloads reach clusters through it: turn it on (impersonationProxy.mode) and wait until kubectl get credentialissuers shows it Success`,
  );
}

/**
 * Whether the proxy's serving certificate names the host the kubeconfig sends the controller to: kubectl and
 * client-go refuse one that does not, on every request. Said now rather than in the controller's log. A certificate
 * the admin may not read is left to the controller to find.
 */
async function checkServingName(
  clients: KubeClients,
  namespace: string,
  secret: string,
  server: string,
): Promise<void> {
  const { readSecretData } = await import('../lib/kube/kube.ts');
  const certPem = await readSecretData(clients, namespace, secret).then(
    (data) => data?.['tls.crt'],
    () => undefined,
  );
  if (!certPem) return;
  const host = new URL(server).hostname.replace(/^\[(.*)\]$/, '$1');
  let named: boolean;
  try {
    const cert = new X509Certificate(certPem);
    named = (isIP(host) ? cert.checkIP(host) : cert.checkHost(host)) !== undefined;
  } catch {
    return;
  }
  if (!named)
    throw new UserError(
      `the proxy's serving certificate (Secret ${namespace}/${secret}) does not name ${printable(host)}, so the controller's kubectl would refuse it; ${secret === TLS_SECRET ? 'a concierge of this release issues one that does' : 'add that name to the certificate'}, or give with --server an address the certificate names`,
    );
}

/**
 * The kubeconfig, after every name is checked: the cluster, the service account, the cluster's opt-in, then where
 * the proxy is and its CA. Returns it with what the pod needs (said on standard error by the command).
 */
export async function clusterKubeconfig(
  name: string,
  flags: ClusterKubeconfigFlags,
  given?: KubeClients,
): Promise<{ kubeconfig: object; podNeeds: string }> {
  if (!isDNSLabel(name))
    throw new UserError(`${JSON.stringify(printable(name))} is not a valid cluster name (a DNS label)`);
  const account = parseServiceAccount(flags.serviceAccount);
  const server = flags.server ? checkServer(flags.server) : '';
  const clients =
    given ??
    (await import('../lib/kube/kube.ts')).newKubeClients(
      flags.kubeconfig ? { path: flags.kubeconfig } : { default: true },
      flags.context ?? '',
    );
  const cluster = await readCluster(clients, flags.groupSuffix, name);
  await checkServiceAccount(clients, account.namespace, account.name);
  const prefix = usernamePrefixOf(cluster, name);
  const base = server || (await inClusterServer(clients, flags.namespace));
  const { ca, secret } = await proxyCA(clients, flags.groupSuffix);
  await checkServingName(clients, flags.namespace, secret, base);
  const context = contextName(base, name);
  const user = `${context}/${account.namespace}/${account.name}`;
  const kubeconfig = {
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: context,
        cluster: { server: `${base}/clusters/${name}`, 'certificate-authority-data': ca },
      },
    ],
    // The token file of the pod's projected volume: kubelet rewrites it before it expires, and kubectl and
    // client-go read it again, so the kubeconfig never holds a credential.
    users: [{ name: user, user: { tokenFile: WORKLOAD_TOKEN_FILE } }],
    contexts: [{ name: context, context: { cluster: context, user } }],
    'current-context': context,
  };
  const podNeeds = `# The pod runs as ${account.namespace}/${account.name} and mounts its token for Sealion's audience at ${WORKLOAD_TOKEN_DIR}:
#   serviceAccountName: ${account.name}
#   volumes:
#     - name: sealion-token
#       projected:
#         sources:
#           - serviceAccountToken: {audience: ${workloadAudience(flags.groupSuffix)}, expirationSeconds: ${TOKEN_SECONDS}, path: token}
#   (and in the container) volumeMounts: [{name: sealion-token, mountPath: ${WORKLOAD_TOKEN_DIR}, readOnly: true}]
# On ${name} it acts as ${prefix}system:serviceaccount:${account.namespace}:${account.name}, in groups ${prefix}system:serviceaccounts and ${prefix}system:serviceaccounts:${account.namespace}: what ${name}'s RBAC grants those names.`;
  return { kubeconfig, podNeeds };
}

/** `sealion cluster kubeconfig`: checks, makes, and writes the kubeconfig as asked; nothing is written on a failure. */
export async function runClusterKubeconfig(
  name: string,
  flags: ClusterKubeconfigFlags,
  say: (line: string) => void,
): Promise<void> {
  const { kubeconfig, podNeeds } = await clusterKubeconfig(name, flags);
  const text = flags.output === 'json' ? `${JSON.stringify(kubeconfig, null, 2)}\n` : stringify(kubeconfig);
  if (flags.outputFile) {
    try {
      writeFileSync(flags.outputFile, text, { mode: 0o600 });
    } catch (err) {
      throw new UserError(
        `cannot write the kubeconfig to ${printable(flags.outputFile)}: ${(err as NodeJS.ErrnoException).code ?? 'failed'}; give another --output-file`,
        { cause: err },
      );
    }
  } else process.stdout.write(text);
  say(podNeeds);
}
