// tunnel.concierge.<suffix>/v1alpha1: Cluster, a cluster the concierge reaches through an agent's tunnel.
import type { AccessPolicy } from './access.ts';
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
   * Most requests one tunnel carries at once, all users together (each holds one of the tunnel's streams); more
   * wait in the tunnel's fair queue (see maxQueuedRequests). Default: 1000.
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
  /**
   * Most requests one user (the authenticated name, before any impersonation) has in flight through one tunnel at
   * once, so that no user can take the whole tunnel; more of theirs wait, at most this many too, and beyond that
   * they are refused with 429 and a Retry-After. Default: a quarter of maxConcurrentStreams, rounded up.
   * @asType integer
   * @minimum 1
   * @maximum 100000
   */
  maxRequestsPerUser?: number;
  /**
   * Most requests waiting for the tunnel at once, all users together. Waiting users are served in turn, each
   * user's requests in order; a request that finds the queue full is refused with 503 and a Retry-After, and 0
   * refuses at once instead of waiting. Default: 1000.
   * @asType integer
   * @minimum 0
   * @maximum 100000
   */
  maxQueuedRequests?: number;
  /**
   * How long a request waits in the queue before it is refused: with 429 when the user's own requests fill their
   * share, with 503 otherwise, both with a Retry-After. Default: 15 (as the API server's own priority and fairness
   * queues wait at most a quarter of its 60 s request timeout).
   * @asType integer
   * @minimum 1
   * @maximum 60
   */
  queueTimeoutSeconds?: number;
  /**
   * How long a request through the tunnel may make no progress before it is cut and its place freed: its answer
   * (or an exec or port-forward connection's data) held back because the client does not read it, or its body
   * stopped arriving. A watch with no events to send, or an idle shell, is not stalled. A client that pauses reading longer (`kubectl logs -f | less` left on one screen) loses its
   * request. Default: 60.
   * @asType integer
   * @minimum 1
   * @maximum 3600
   */
  progressTimeoutSeconds?: number;
  /**
   * Lets the hub's service accounts into this cluster, under a prefixed name. A hub service account whose token has
   * Sealion's audience (workloads.concierge.<group suffix>) reaches `/clusters/<name>/…` and acts here as
   * `<usernamePrefix><its username>`, in `<usernamePrefix><group>` for each of its groups but system:authenticated;
   * this cluster's RBAC decides what that name may do, and its grant to the agent whether the hub may assert it.
   * Default: none (the cluster takes no hub workloads).
   */
  workloads?: ClusterWorkloads;
  /**
   * Who may ask for groups here through an AccessRequest, for how long, with how many approvals, and whether every
   * request here must carry a reason. Default: no access requests, no reason required.
   */
  access?: AccessPolicy;
}

/** How hub service accounts are named on a cluster that takes them. */
export interface ClusterWorkloads {
  /**
   * What every hub workload's username and groups start with on this cluster, e.g. `hub:`, so that no hub name can
   * equal one of the cluster's own. Ends with `:`; never starts with `system:` (names the cluster's own components
   * hold); 1 to 64 characters.
   * @minLength 1
   * @maxLength 64
   * @validation self.endsWith(':') && !self.startsWith('system:') :: must end with ':' and must not start with 'system:'
   */
  usernamePrefix: string;
}

/** The longest usernamePrefix. */
export const MAX_USERNAME_PREFIX_LENGTH = 64;

/** Why a usernamePrefix cannot be used (the CRD's rules, checked again for an object that got past them), or undefined. */
export function usernamePrefixProblem(prefix: unknown): string | undefined {
  if (typeof prefix !== 'string') return 'must be a string';
  // Counted in characters (code points), as the CRD's maxLength is, not in UTF-16 units.
  const length = [...prefix].length;
  if (length < 1 || length > MAX_USERNAME_PREFIX_LENGTH)
    return `must be 1 to ${MAX_USERNAME_PREFIX_LENGTH} characters`;
  if (!prefix.endsWith(':')) return "must end with ':'";
  if (prefix.startsWith('system:')) return "must not start with 'system:'";
  return undefined;
}

/**
 * The audience a hub service account's token must have for Sealion to take it as a workload's: a token for the hub's
 * own API server is not enough, so a token leaked from Sealion's path cannot be used against the hub, nor one meant
 * for the hub against the clusters.
 */
export function workloadAudience(groupSuffix: string): string {
  return `workloads.concierge.${groupSuffix}`;
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
  /** What the tunnel runs on: `direct` (HTTP/2 on the TLS connection) or `websocket`. */
  transport?: 'direct' | 'websocket';
  /**
   * The version the agent reported on this tunnel.
   * @maxLength 256
   */
  agentVersion?: string;
  /**
   * When the client certificate this tunnel was opened with expires.
   * @format date-time
   */
  certificateExpiry?: string;
  /**
   * The forwarding policy the agent's RBAC was rendered from, as the agent reported it (`sealion cluster add
   * --policy`). The cluster's API server enforces it; this says which one it is.
   * @maxLength 256
   */
  policy?: string;
  /** Which impersonation the agent holds, as it asked its cluster: constrained, legacy (before 1.36), or none. */
  impersonation?: 'constrained' | 'legacy' | 'none';
}

/** Observed state, written by the concierge only. */
export interface ClusterStatus {
  /** Whether at least one live replica holds a tunnel to the cluster's agent (derived from `tunnels`). */
  connected?: boolean;
  /**
   * The live replicas holding a tunnel, by name, comma-separated (derived from `tunnels`, for `kubectl get -o wide`,
   * which shows one value of a list).
   * @maxLength 4096
   */
  replicas?: string;
  /**
   * Since when the cluster has been continuously connected.
   * @format date-time
   */
  connectedSince?: string;
  /**
   * The replicas holding a tunnel, one entry each, written by that replica alone; the entry of a replica that
   * stopped renewing its Lease is removed by the others.
   * @listType map
   * @listMapKeys replica
   */
  tunnels?: TunnelHolder[];
  /** The version the agent reported. */
  agentVersion?: string;
  /**
   * The forwarding policy the agent reported (what its cluster lets the hub do there).
   * @maxLength 256
   */
  policy?: string;
  /** Which impersonation the agent holds on its cluster: constrained, legacy (before Kubernetes 1.36), or none. */
  impersonation?: 'constrained' | 'legacy' | 'none';
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

/**
 * The condition that says whether the agent's tunnel protocol is within the hub's skew policy
 * (lib/tunnel/protocol.ts). Absent until a replica refuses the agent for its protocol (an upgrade of the hub writes
 * nothing to Clusters whose agents it serves); then False until a tunnel is up, and True from then on, until the
 * next refusal.
 */
export const AGENT_PROTOCOL_CONDITION = 'AgentProtocolSupported';

export interface Cluster {
  apiVersion: string;
  kind: 'Cluster';
  metadata: ObjectMeta;
  spec: ClusterSpec;
  status?: ClusterStatus;
}

/**
 * The agent's ConfigMap key that says which forwarding policy its RBAC was rendered from (`sealion cluster add
 * --policy`); the agent reports it to the hub, which shows it in the Cluster's status.
 */
export const AGENT_POLICY_KEY = 'policy';
