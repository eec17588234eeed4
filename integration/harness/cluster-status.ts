// A Cluster's status as the hub's API server has it, read with the real kubectl.
import type { ClusterStatus } from '../../apis/tunnel.ts';
import type { Cluster } from '../../dev/cluster.ts';

export async function clusterStatus(hub: Pick<Cluster, 'kubectl'>, name: string): Promise<ClusterStatus> {
  const out = await hub.kubectl([
    'get',
    'clusters.tunnel.concierge.sealion.dev',
    name,
    '-o',
    'jsonpath={.status}',
  ]);
  return JSON.parse(out.stdout || '{}') as ClusterStatus;
}
