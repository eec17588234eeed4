// `sealion cluster add|revoke|remove|kubeconfig`: onboarding clusters the concierge reaches through an agent, cutting
// them off, and a kubeconfig for a controller on the hub that reaches one (cluster-kubeconfig.ts). Revoking raises the Cluster's spec.agentGeneration, which every agent certificate is bound to, and
// deletes the cluster's unredeemed bootstrap tokens; the concierge closes the open tunnel when it sees the change.
import { Argument, Command, Option } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import type { Cluster } from '../apis/tunnel.ts';
import { TUNNEL_CA_SECRET } from '../apis/install.ts';
import type { ClusterResource, KubeClients } from '../lib/kube/kube.ts';
import { parsePolicy, POLICY_NAMES } from '../manifests/forwarding-policy.ts';
import { agentSettingsManifests, DEFAULT_INSTALL } from '../manifests/install.ts';
import { isDNSLabel } from '../apis/names.ts';
import type { ClusterKubeconfigFlags } from './cluster-kubeconfig.ts';
import { takesNames } from './completion.ts';
import { UserError } from './errors.ts';
import { printable } from './printable.ts';

interface ClusterFlags {
  kubeconfig: string;
  /** Empty or absent: the kubeconfig's current context. */
  context?: string;
  namespace: string;
  groupSuffix: string;
  hub: string;
  description: string;
  agentManifests?: boolean;
  helmValues?: boolean;
  policy?: string;
  identities?: string;
  apiGroups?: string;
  legacyImpersonation?: boolean;
  /** The Cluster's spec.workloads.usernamePrefix: hub service accounts reach it under names that start so. */
  workloadPrefix?: string;
}

/** Raising the generation races only with another admin doing the same; a few tries settle it. */
const ROTATE_ATTEMPTS = 5;

const checkName = (name: string): void => {
  if (!isDNSLabel(name)) throw new Error(`${JSON.stringify(name)} is not a valid cluster name (a DNS label)`);
};

const clusterResource = (groupSuffix: string): ClusterResource => ({
  group: apiGroups(groupSuffix).tunnel,
  version: VERSION,
  plural: Resource.Cluster,
});

/**
 * Revokes every agent certificate of the Cluster `name` by raising its agentGeneration (conditional on the
 * resourceVersion read, so two admins at once both raise it), then deletes its unredeemed bootstrap tokens.
 * Returns the new generation.
 */
async function revokeAgentCertificates(
  clients: KubeClients,
  namespace: string,
  resource: ClusterResource,
  name: string,
): Promise<number> {
  const { apiStatusCode, mergePatchClusterCustomObject, readClusterCustomObject } =
    await import('../lib/kube/kube.ts');
  const { deleteBootstrapTokens } = await import('../lib/kube/bootstrap.ts');
  for (let attempt = 1; ; attempt++) {
    const cluster = await readClusterCustomObject<Cluster>(clients, resource, name);
    if (!cluster) throw new Error(`no Cluster ${name}`);
    const generation = (cluster.spec.agentGeneration ?? 0) + 1;
    try {
      await mergePatchClusterCustomObject(clients, resource, name, {
        metadata: { resourceVersion: cluster.metadata.resourceVersion },
        spec: { agentGeneration: generation },
      });
    } catch (err) {
      if (apiStatusCode(err) !== 409 || attempt >= ROTATE_ATTEMPTS) throw err;
      continue;
    }
    await deleteBootstrapTokens(clients, namespace, name);
    return generation;
  }
}

/** Creates the Cluster and a bootstrap token; returns what to tell the admin. */
export async function addCluster(
  name: string,
  flags: ClusterFlags,
): Promise<{ token: string; pin: string; command: string; expires: Date }> {
  checkName(name);
  const {
    kubeClientsFor,
    loadKubeConfigFlags,
    apiStatusCode,
    mergePatchClusterCustomObject,
    readSecretData,
  } = await import('../lib/kube/kube.ts');
  const { createBootstrapToken, deleteBootstrapTokens } = await import('../lib/kube/bootstrap.ts');
  const { spkiPin } = await import('../lib/pki/pki.ts');
  const clients = kubeClientsFor(loadKubeConfigFlags({ ...flags, context: flags.context ?? '' }));
  const caPem = (await readSecretData(clients, flags.namespace, TUNNEL_CA_SECRET))?.['tls.crt'];
  if (!caPem)
    throw new Error(
      `no tunnel CA in namespace ${flags.namespace}: is the concierge running there with its tunnel listener?`,
    );
  const resource = clusterResource(flags.groupSuffix);
  try {
    await clients.customObjects.createClusterCustomObject({
      ...resource,
      body: {
        apiVersion: `${resource.group}/${VERSION}`,
        kind: 'Cluster',
        metadata: { name },
        spec: {
          ...(flags.description ? { description: flags.description } : {}),
          ...(flags.workloadPrefix ? { workloads: { usernamePrefix: flags.workloadPrefix } } : {}),
        },
      },
    });
    // Tokens left from an earlier Cluster of this name must not register an agent for this one.
    await deleteBootstrapTokens(clients, flags.namespace, name);
  } catch (err) {
    if (apiStatusCode(err) !== 409) throw err;
    // Adding again is how an admin re-onboards a cluster: a fresh token, and whatever certificate or token was
    // issued before stops working, so only the agent given this token gets in.
    await revokeAgentCertificates(clients, flags.namespace, resource, name);
    if (flags.workloadPrefix)
      await mergePatchClusterCustomObject(clients, resource, name, {
        spec: { workloads: { usernamePrefix: flags.workloadPrefix } },
      });
  }
  const { token, expires } = await createBootstrapToken(clients, flags.namespace, name);
  const hub = flags.hub || '<https://the concierge tunnel address>';
  const pin = spkiPin(caPem);
  const command = `SEALION_BOOTSTRAP_TOKEN=${token} sealion agent --cluster ${name} --hub ${hub} --ca-pin ${pin}`;
  return { token, pin, command, expires };
}

/** The options every cluster subcommand takes: which hub, and where Sealion is installed there. */
function common(c: Command): Command {
  return c
    .option('--kubeconfig <path>', "the hub admin's kubeconfig (default: $KUBECONFIG or ~/.kube/config)", '')
    .option('--context <name>', "the kubeconfig's context to use (default: its current context)", '')
    .option('--namespace <name>', "the concierge's namespace", DEFAULT_INSTALL.namespace)
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX);
}

/** `sealion cluster add`: checks every flag, registers the cluster, and prints how its agent starts. */
async function runClusterAdd(name: string, flags: ClusterFlags): Promise<void> {
  // Checked before anything is created: a typo must not leave a Cluster and a token behind.
  const policy = parsePolicy(flags);
  if (flags.workloadPrefix !== undefined) {
    const { usernamePrefixProblem } = await import('../apis/tunnel.ts');
    const problem = usernamePrefixProblem(flags.workloadPrefix);
    if (problem)
      throw new UserError(
        `--workload-prefix ${JSON.stringify(printable(flags.workloadPrefix))}: it ${problem}; give one such as hub:`,
      );
  }
  if ((flags.agentManifests || flags.helmValues) && !flags.hub)
    throw new Error(
      `--${flags.helmValues ? 'helm-values' : 'agent-manifests'} needs --hub: the agent must know where to dial`,
    );
  if (flags.agentManifests && flags.helmValues)
    throw new Error('--agent-manifests or --helm-values: one of them');
  // The agent dials TLS only, and the chart takes nothing else: refused before a token is made for nothing.
  if (flags.helmValues && !/^https:\/\/[^\s/?#@]+(\/\S*)?$/.test(flags.hub))
    throw new Error(`--hub ${JSON.stringify(flags.hub)}: an https:// URL, host and port`);
  const added = await addCluster(name, flags);
  if (flags.helmValues) {
    const { yamlText } = await import('../manifests/render.ts');
    // The token is spent at the agent's first start, but Helm keeps values in the release's history: this is
    // the one secret in them, and it is worth nothing once used or expired.
    process.stdout.write(
      `# sealion-agent values for cluster ${name}: its bootstrap token works once, until ${added.expires.toISOString()}.\n` +
        yamlText({
          cluster: { name, hubURL: flags.hub, caPin: added.pin, bootstrapToken: added.token },
          forwardingPolicy: policy,
        }),
    );
    return;
  }
  if (flags.agentManifests) {
    const { toYaml } = await import('../manifests/render.ts');
    const settings = agentSettingsManifests({
      clusterName: name,
      hubURL: flags.hub,
      caPin: added.pin,
      bootstrapToken: added.token,
      policy,
    });
    process.stdout.write(toYaml(settings));
    return;
  }
  console.log(`Cluster ${name} is registered. Its bootstrap token works once, until ${added.expires.toISOString()}.
Run the agent with access to that cluster (or install the agent manifests there with these values):
  ${added.command}`);
}

/** `sealion cluster add NAME`. */
function addSubcommand(cluster: Command): void {
  common(cluster.command('add <name>'))
    .description('register a cluster and print the agent command with a one-time bootstrap token')
    .option('--hub <url>', "the concierge's tunnel address agents dial, https://host:port", '')
    .option('--description <text>', 'shown in kubectl get clusters', '')
    .option(
      '--agent-manifests',
      "print the agent's forwarding RBAC, ConfigMap and bootstrap Secret as YAML, to apply on that cluster before its agent manifests",
    )
    .option(
      '--helm-values',
      "print the sealion-agent Helm chart's values for that cluster (where it dials, the hub's pin, the token, the policy) as YAML",
    )
    .option(
      '--policy <name>',
      `what the hub may do on that cluster, enforced by its API server: ${POLICY_NAMES.join(', ')}, or clusterrole:<name> (a ClusterRole of that cluster's admin)`,
      'full',
    )
    .option(
      '--identities <kinds>',
      'whom the hub may act as there, comma-separated: users (always), serviceaccounts, nodes',
      'users',
    )
    .option(
      '--api-groups <groups>',
      'API groups of custom resources that read-only and no-exec cover too',
      '',
    )
    .option(
      '--legacy-impersonation',
      'grant the legacy impersonate verb instead (clusters before Kubernetes 1.36; full only, and it can act as anyone)',
    )
    .option(
      '--workload-prefix <prefix>',
      "let the hub's service accounts reach this cluster, under names that start with this prefix (for example hub:); see sealion cluster kubeconfig",
    )
    .addHelpText(
      'after',
      `
Policies (the cluster's API server enforces them, through constrained impersonation):
  full        anything the users' own RBAC there allows
  no-exec     everything but exec, attach, port-forward, proxy and ephemeral containers (kubectl debug);
              creating pods and workloads, which run what they name, stays allowed
  read-only   get, list and watch, but not into workloads (exec, attach, port-forward, proxy); logs and
              Secrets are reads
Whatever the policy, the hub can never act as system:masters there, nor as a service account or node unless
--identities lists them.

Examples:
  sealion cluster add edge-1 --hub https://hub.example.com:8444
  sealion cluster add edge-1 --hub https://hub.example.com:8444 --policy no-exec --agent-manifests | kubectl --context edge-1 apply -f -
  sealion cluster add edge-1 --hub https://hub.example.com:8444 --helm-values > edge-1.yaml
  helm --kube-context edge-1 install sealion-agent config/charts/sealion-agent -n sealion-agent --create-namespace -f edge-1.yaml
`,
    )
    .action(runClusterAdd);
}

/** The name of a cluster there is: completion offers the hub's. */
const existing = (): Argument => takesNames('cluster', new Argument('<name>', 'the cluster'));

/** `sealion cluster revoke NAME` and `sealion cluster remove NAME`. */
function revokeAndRemoveSubcommands(cluster: Command): void {
  common(cluster.command('revoke'))
    .addArgument(existing())
    .description(
      "revoke a cluster's agent certificates and unredeemed tokens: its open tunnel closes, and its agent needs a new token",
    )
    .addHelpText('after', '\nExample:\n  sealion cluster revoke edge-1\n')
    .action(async (name: string, flags: ClusterFlags) => {
      checkName(name);
      const { kubeClientsFor, loadKubeConfigFlags } = await import('../lib/kube/kube.ts');
      const clients = kubeClientsFor(loadKubeConfigFlags({ ...flags, context: flags.context ?? '' }));
      const generation = await revokeAgentCertificates(
        clients,
        flags.namespace,
        clusterResource(flags.groupSuffix),
        name,
      );
      console.log(`Cluster ${name}: every agent certificate and bootstrap token issued before is revoked (agent generation ${generation} now).
Its open tunnel closes. To let its agent back in, run: sealion cluster add ${name}`);
    });
  common(cluster.command('remove'))
    .addArgument(existing())
    .description('remove a cluster: its agent is refused from now on, and its open tunnel is closed')
    .addHelpText('after', '\nExample:\n  sealion cluster remove edge-1\n')
    .action(async (name: string, flags: ClusterFlags) => {
      checkName(name);
      const { kubeClientsFor, loadKubeConfigFlags } = await import('../lib/kube/kube.ts');
      const { deleteBootstrapTokens } = await import('../lib/kube/bootstrap.ts');
      const clients = kubeClientsFor(loadKubeConfigFlags({ ...flags, context: flags.context ?? '' }));
      await clients.customObjects.deleteClusterCustomObject({ ...clusterResource(flags.groupSuffix), name });
      await deleteBootstrapTokens(clients, flags.namespace, name);
      console.log(`Cluster ${name} removed.`);
    });
}

/** `sealion cluster kubeconfig NAME --service-account NS/SA`. */
function kubeconfigSubcommand(cluster: Command): void {
  common(cluster.command('kubeconfig'))
    .addArgument(existing())
    .description(
      "print a kubeconfig for a controller on the hub: the cluster through its agent, as a hub service account, with the pod's projected token",
    )
    .requiredOption('--service-account <namespace/name>', 'the hub service account the controller runs as')
    .option(
      '--server <url>',
      "the proxy's address the controller reaches (default: the proxy's Service inside the hub, https://sealion-impersonation-proxy.<namespace>.svc)",
      '',
    )
    .addOption(new Option('-o, --output <format>', 'yaml or json').choices(['yaml', 'json']).default('yaml'))
    .option('--output-file <path>', 'write the kubeconfig here (mode 0600) instead of standard output', '')
    .addHelpText(
      'after',
      `
The kubeconfig holds no credential: its user reads the pod's projected service-account token for Sealion's
audience (workloads.concierge.<group suffix>) from /var/run/secrets/sealion/token, which kubelet renews. What the pod
needs is said on standard error. The cluster must take hub workloads (its spec.workloads.usernamePrefix); there the
controller is <prefix>system:serviceaccount:<namespace>:<name>, and that cluster's RBAC decides what it may do.

Examples:
  sealion cluster kubeconfig edge-1 --service-account argocd/argocd-application-controller > edge-1.kubeconfig
  kubectl -n argocd create secret generic edge-1-kubeconfig --from-file=kubeconfig=edge-1.kubeconfig
  sealion cluster kubeconfig edge-1 --service-account flux-system/kustomize-controller -o json
`,
    )
    .action(async (name: string, flags: ClusterKubeconfigFlags) => {
      const { runClusterKubeconfig } = await import('./cluster-kubeconfig.ts');
      await runClusterKubeconfig(name, flags, (line) => console.error(line));
    });
}

export function clusterCommand(): Command {
  const cluster = new Command('cluster').description('clusters reached through an agent');
  addSubcommand(cluster);
  revokeAndRemoveSubcommands(cluster);
  kubeconfigSubcommand(cluster);
  return cluster;
}
