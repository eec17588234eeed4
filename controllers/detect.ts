// Managed-cluster detection for `mode: auto`. A managed cluster (EKS, AKS, GKE) hides its control plane, so its
// API server cannot be reached with the cluster signing key and the impersonation proxy is the way in. The
// decision comes with its evidence, which goes into the strategy message for the admin to check.

export interface NodeLike {
  metadata?: { name?: string; labels?: Record<string, string> };
  spec?: { providerID?: string };
}

export interface Detection {
  managed: boolean;
  /** Why, in words an admin can verify with `kubectl get nodes --show-labels`. */
  evidence: string;
}

const CONTROL_PLANE_LABELS = ['node-role.kubernetes.io/control-plane', 'node-role.kubernetes.io/master'];

/** Provider-ID schemes and node labels that only a managed provider's nodes carry. */
const MANAGED_MARKS: { provider: string; providerID?: string; labels: string[] }[] = [
  { provider: 'EKS', labels: ['eks.amazonaws.com/nodegroup', 'eks.amazonaws.com/compute-type'] },
  {
    provider: 'AKS',
    providerID: 'azure://',
    labels: ['kubernetes.azure.com/cluster', 'kubernetes.azure.com/role'],
  },
  { provider: 'GKE', labels: ['cloud.google.com/gke-nodepool', 'cloud.google.com/gke-os-distribution'] },
];

/** Undefined when there are no nodes to judge by. */
export function detectManaged(nodes: readonly NodeLike[]): Detection | undefined {
  if (nodes.length === 0) return undefined;
  for (const node of nodes) {
    const labels = node.metadata?.labels ?? {};
    for (const mark of MANAGED_MARKS) {
      const label = mark.labels.find((l) => l in labels);
      if (label)
        return {
          managed: true,
          evidence: `node ${node.metadata?.name} has the ${mark.provider} label ${label}`,
        };
      if (mark.providerID && node.spec?.providerID?.startsWith(mark.providerID))
        return {
          managed: true,
          evidence: `node ${node.metadata?.name} has the ${mark.provider} provider ID ${node.spec.providerID}`,
        };
    }
  }
  const controlPlane = nodes.find((n) => CONTROL_PLANE_LABELS.some((l) => l in (n.metadata?.labels ?? {})));
  if (controlPlane)
    return { managed: false, evidence: `node ${controlPlane.metadata?.name} is a control-plane node` };
  return { managed: true, evidence: `none of the ${nodes.length} nodes carries a control-plane role label` };
}
