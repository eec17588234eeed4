// tunnel.concierge.<suffix>/v1alpha1: Cluster, a cluster the concierge reaches through an agent's tunnel.
import type { Condition, ObjectMeta } from './meta.ts';

/**
 * A cluster whose agent dials out to the concierge. The agent's certificate is bound to this object (its name and
 * uid, so a Cluster deleted and created again under the same name does not accept it) and to agentGeneration.
 */
export interface ClusterSpec {
  /**
   * A human-friendly description, shown by `sealion cluster list`.
   * @maxLength 1024
   */
  description?: string;
  /**
   * Most concurrent streams one tunnel may carry; more wait or fail with 503. Default: 1000.
   * @asType integer
   * @minimum 1
   * @maximum 100000
   */
  maxConcurrentStreams?: number;
  /**
   * The generation of agent certificates this Cluster accepts. Each certificate carries the generation it was
   * issued at and works only while this is unchanged: raising it (`sealion cluster revoke`, or `sealion cluster
   * add` on an existing name) revokes every certificate issued before and closes the open tunnel; the agent then
   * needs a new bootstrap token. Only ever raise it: setting an earlier value back revives that generation's
   * certificates.
   * @asType integer
   * @minimum 0
   * @maximum 2147483647
   * @default 0
   */
  agentGeneration?: number;
}

/** A concierge replica that holds a tunnel to this cluster. */
export interface TunnelHolder {
  /** The replica's pod name. */
  replica: string;
  /**
   * When the tunnel to this replica came up.
   * @format date-time
   */
  connectedSince: string;
}

/** Observed state, written by the concierge only. */
export interface ClusterStatus {
  /** Whether at least one replica holds a tunnel to the cluster's agent. */
  connected?: boolean;
  /**
   * Since when the cluster has been continuously connected.
   * @format date-time
   */
  connectedSince?: string;
  /**
   * The replicas holding a tunnel.
   * @listType map
   * @listMapKeys replica
   */
  tunnels?: TunnelHolder[];
  /** The version the agent reported. */
  agentVersion?: string;
  /**
   * When the agent's client certificate expires; it renews at two thirds of its lifetime.
   * @format date-time
   */
  certificateExpiry?: string;
  /**
   * Detailed state (Registered, Connected).
   * @listType map
   * @listMapKeys type
   */
  conditions?: Condition[];
}

export interface Cluster {
  apiVersion: string;
  kind: 'Cluster';
  metadata: ObjectMeta;
  spec: ClusterSpec;
  status?: ClusterStatus;
}
