// Prepares a managed cluster for an agent, as the agent manifests would: an identity that may impersonate and
// keep its credentials Secret, with a kubeconfig for it (out of cluster the agent runs with a client certificate).
import type { Cluster } from './cluster.ts';

export const AGENT_USER = 'sealion-agent';

/** Creates the agent's namespace and RBAC; returns the agent's kubeconfig path. */
export async function prepareAgentCluster(cluster: Cluster, namespace: string): Promise<string> {
  for (const args of [
    ['create', 'namespace', namespace],
    [
      'create',
      'clusterrole',
      'sealion-agent-impersonator',
      '--verb=impersonate',
      '--resource=users,groups,serviceaccounts',
    ],
    [
      'create',
      'clusterrolebinding',
      'sealion-agent-impersonator',
      '--clusterrole=sealion-agent-impersonator',
      `--user=${AGENT_USER}`,
    ],
    [
      'create',
      'role',
      'sealion-agent-credentials',
      '-n',
      namespace,
      '--verb=get,create,update',
      '--resource=secrets',
    ],
    [
      'create',
      'rolebinding',
      'sealion-agent-credentials',
      '-n',
      namespace,
      '--role=sealion-agent-credentials',
      `--user=${AGENT_USER}`,
    ],
  ]) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  return cluster.userKubeconfig(AGENT_USER);
}
