// `sealion cluster add|remove`: onboarding clusters the concierge reaches through an agent.
import { Command } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import { DEFAULT_INSTALL } from './manifests/install.ts';

interface ClusterFlags {
  kubeconfig: string;
  namespace: string;
  groupSuffix: string;
  hub: string;
  description: string;
}

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** Creates the Cluster and a bootstrap token; returns what to tell the admin. */
export async function addCluster(
  name: string,
  flags: ClusterFlags,
): Promise<{ token: string; pin: string; command: string; expires: Date }> {
  if (!DNS_LABEL.test(name))
    throw new Error(`${JSON.stringify(name)} is not a valid cluster name (a DNS label)`);
  const { newKubeClients, apiStatusCode, readSecretData } = await import('../lib/kube.ts');
  const { createBootstrapToken } = await import('../lib/bootstrap.ts');
  const { spkiPin } = await import('../lib/pki.ts');
  const clients = newKubeClients(flags.kubeconfig ? { path: flags.kubeconfig } : { default: true });
  const caPem = (await readSecretData(clients, flags.namespace, 'sealion-tunnel-ca'))?.['tls.crt'];
  if (!caPem)
    throw new Error(
      `no tunnel CA in namespace ${flags.namespace}: is the concierge running there with its tunnel listener?`,
    );
  const group = apiGroups(flags.groupSuffix).tunnel;
  try {
    await clients.customObjects.createClusterCustomObject({
      group,
      version: VERSION,
      plural: Resource.Cluster,
      body: {
        apiVersion: `${group}/${VERSION}`,
        kind: 'Cluster',
        metadata: { name },
        spec: flags.description ? { description: flags.description } : {},
      },
    });
  } catch (err) {
    // Adding again is how an admin gets a fresh token for an existing cluster.
    if (apiStatusCode(err) !== 409) throw err;
  }
  const { token, expires } = await createBootstrapToken(clients, flags.namespace, name);
  const hub = flags.hub || '<https://the concierge tunnel address>';
  const pin = spkiPin(caPem);
  const command = `SEALION_BOOTSTRAP_TOKEN=${token} sealion agent --cluster ${name} --hub ${hub} --ca-pin ${pin}`;
  return { token, pin, command, expires };
}

export function clusterCommand(): Command {
  const cluster = new Command('cluster').description('clusters reached through an agent');
  const common = (c: Command): Command =>
    c
      .option(
        '--kubeconfig <path>',
        "the hub admin's kubeconfig (default: $KUBECONFIG or ~/.kube/config)",
        '',
      )
      .option('--namespace <name>', "the concierge's namespace", DEFAULT_INSTALL.namespace)
      .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX);
  common(cluster.command('add <name>'))
    .description('register a cluster and print the agent command with a one-time bootstrap token')
    .option('--hub <url>', "the concierge's tunnel address agents dial, https://host:port", '')
    .option('--description <text>', 'shown in kubectl get clusters', '')
    .addHelpText('after', '\nExample:\n  sealion cluster add edge-1 --hub https://hub.example.com:8444\n')
    .action(async (name: string, flags: ClusterFlags) => {
      const added = await addCluster(name, flags);
      console.log(`Cluster ${name} is registered. Its bootstrap token works once, until ${added.expires.toISOString()}.
Run the agent with access to that cluster (or install the agent manifests there with these values):
  ${added.command}`);
    });
  common(cluster.command('remove <name>'))
    .description('remove a cluster: its agent is refused from now on, and its open tunnel is closed')
    .addHelpText('after', '\nExample:\n  sealion cluster remove edge-1\n')
    .action(async (name: string, flags: ClusterFlags) => {
      const { newKubeClients } = await import('../lib/kube.ts');
      const clients = newKubeClients(flags.kubeconfig ? { path: flags.kubeconfig } : { default: true });
      const group = apiGroups(flags.groupSuffix).tunnel;
      await clients.customObjects.deleteClusterCustomObject({
        group,
        version: VERSION,
        plural: Resource.Cluster,
        name,
      });
      console.log(`Cluster ${name} removed.`);
    });
  return cluster;
}
