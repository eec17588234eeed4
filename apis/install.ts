// The install contract: the names, keys and formats that the concierge, the agent, the manifests, the CLI and
// the tools around them (benchmarks, the fuzzer) agree on. A change here changes what a running install expects,
// so each is written once, here, and every side reads it from here.
import { DEFAULT_ACCESS_HUB_NAME, DEFAULT_MAX_DURATION_SECONDS, MAX_DURATION_SECONDS } from './access.ts';

/** The namespaces of an install, unless the installer names others. */
export const DEFAULT_NAMESPACE = 'sealion-concierge';
export const DEFAULT_AGENT_NAMESPACE = 'sealion-agent';
/** The concierge's Deployment, its pods' service account, and the identity requests are forwarded with. */
export const CONCIERGE_NAME = 'sealion-concierge';
export const IMPERSONATOR_SERVICE_ACCOUNT = 'sealion-impersonator';
/**
 * The ClusterRole an install ships for access requests' reviewers (read, and the `approve` verb), bound by the admin;
 * requesters need none (they read their own through selfaccessrequests). Named after the install's namespace, as its other cluster-scoped objects are, so that two
 * installs (two group suffixes) do not share it: `sealion-concierge-access-reviewer` in the default install.
 */
export const accessReviewerRole = (namespace: string): string => `${namespace}-access-reviewer`;
/** The ConfigMap with the concierge's configuration (CONFIG_KEY), also the CredentialIssuer's name. */
export const CONFIG_MAP_NAME = 'sealion-concierge-config';
/** The ConfigMap with the concierge's audit Policy (key AUDIT_POLICY_KEY); without it, audit is off. */
export const AUDIT_CONFIG_MAP_NAME = 'sealion-concierge-audit';
export const AUDIT_POLICY_KEY = 'policy.yaml';
/** Where the concierge's pods keep recorded exec and attach sessions. */
export const RECORDINGS_DIR = '/var/lib/sealion/recordings';
/**
 * The audit policy the install starts with: who did what, on which cluster, through which path; no bodies, which can
 * hold secrets. The same schema as kube-apiserver's --audit-policy-file.
 */
export const DEFAULT_AUDIT_POLICY_YAML = `# Sealion's audit policy (audit.k8s.io/v1, as kube-apiserver reads it). Read when a concierge starts:
# after an edit, \`kubectl -n sealion-concierge rollout restart deployment/sealion-concierge\`.
apiVersion: audit.k8s.io/v1
kind: Policy
# ResponseComplete says all that RequestReceived would, and more.
omitStages: [RequestReceived]
rules:
  # The kubelet's probes, every few seconds: nothing to account for.
  - level: None
    nonResourceURLs: [/healthz, /livez, /readyz]
  # Everything else at Metadata: who, what, where, the answer; never a body.
  - level: Metadata
`;
/** The Service in front of the replicas' tunnel listeners, which the concierge follows for its certificate's names. */
export const TUNNEL_SERVICE = 'sealion-concierge-tunnel';
/** The agent's Deployment, service account, ConfigMap and Secrets are named from this. */
export const AGENT_NAME = 'sealion-agent';
/** Container ports: the impersonation proxy (also health and metrics) and the agents' tunnel listener. */
export const PROXY_PORT = 8443;
export const TUNNEL_PORT = 8444;
/** Where replicas send each other requests for the tunnels they hold (concierge/peering/). */
export const PEER_PORT = 8445;
/** The aggregated APIs (TokenCredentialRequest, WhoAmIRequest) the cluster's API server proxies to (concierge/direct/). */
export const API_PORT = 10250;
/** The agent container's probes, /healthz and /readyz, in plain HTTP (agent/health.ts). */
export const AGENT_HEALTH_PORT = 8081;
/** The concierge container's SSH door port (the Service maps the config's ssh.port to it). */
export const SSH_PORT = 2222;
/** The Service the aggregated APIs' APIServices name. */
export const API_SERVICE = 'sealion-concierge-api';

/** The ConfigMap key that holds the concierge's configuration. */
export const CONFIG_KEY = 'config.yaml';
/** Run the proxy only where it is needed: on clusters that look managed (no reachable control plane). */
export const DEFAULT_PROXY_MODE = 'auto';
/** A cloud load balancer is the one address that works for users outside the cluster without extra setup. */
export const DEFAULT_SERVICE_TYPE = 'LoadBalancer';
/**
 * Keep clients' addresses: a LoadBalancer Service sends traffic only to nodes that run a replica, which then see the
 * client's own address rather than a node's. The SSH door bounds strangers per address, and audit events name the
 * source, so neither works on the one address every client shares behind the default Cluster policy's SNAT.
 */
export const DEFAULT_EXTERNAL_TRAFFIC_POLICY = 'Local';
/** Use the cluster signing key where the concierge can reach it; otherwise the proxy's own signer. */
export const DEFAULT_KUBE_CERT_AGENT_MODE = 'auto';

/** The default ConfigMap content: every setting at its default, documented. */
/** The SSH door's defaults (the config's ssh section). */
export const DEFAULT_SSH_SERVICE_PORT = 22;
export const DEFAULT_SSH_HUB_NAME = 'hub';
/** What the device login asks the issuer for: an ID token with the claims JWTAuthenticators usually map. */
export const DEFAULT_SSH_SCOPES = ['openid', 'email', 'profile', 'groups'] as const;
export const DEFAULT_GROUPS_EXTENSION = 'groups@sealion.dev';
/**
 * How long a device login keeps a key bound at most, renewals included: a working day, as Teleport's default
 * max_session_ttl, so a key left on a laptop overnight needs a login the next morning.
 */
export const DEFAULT_SSH_MAX_BINDING_LIFETIME = '12h';

export const DEFAULT_CONFIG_YAML = `# Sealion concierge configuration. Edits apply live; a bad edit is reported on the
# authenticators' status and the last good configuration keeps serving.
impersonationProxy:
  # auto: run the proxy when the cluster looks managed (EKS, AKS, GKE, or no control-plane nodes)
  # enabled: always run it; disabled: never (its Service goes; its CA is kept).
  mode: ${DEFAULT_PROXY_MODE}
  # host[:port] or https://host[:port] that users reach the proxy at. Empty: use the Service's address.
  endpoint: ""
  service:
    # LoadBalancer, ClusterIP, or None (then set endpoint).
    type: ${DEFAULT_SERVICE_TYPE}
    annotations: {}
    loadBalancerIP: ""
    # Local: the load balancer sends traffic only to nodes that run a replica, which see clients' own addresses (for
    # audit and the SSH door's bounds per address); Cluster: any node, which hides them behind its own.
    externalTrafficPolicy: ${DEFAULT_EXTERNAL_TRAFFIC_POLICY}
  tls:
    # Empty: Sealion generates a CA, keeps it in a Secret, and issues the serving certificate.
    # Or name your own kubernetes.io/tls Secret, and optionally the CA to advertise for it.
    secretName: ""
    certificateAuthorityData: ""
kubeCertAgent:
  # The direct path: TokenCredentialRequest served through the cluster's own API server, with client certificates the
  # cluster signs (its CSR API), so users talk to the API server itself. (Pinniped's name; no agent runs for it.)
  # auto: on where the cluster looks self-hosted (a control-plane node, no managed provider's marks);
  # enabled: always (beside the proxy, if that runs too); disabled: never.
  mode: ${DEFAULT_KUBE_CERT_AGENT_MODE}
ssh:
  # The SSH door: ssh, sftp and -L into every cluster's pods and Services, on a port of the proxy's Service.
  # enabled or disabled.
  mode: disabled
  port: ${DEFAULT_SSH_SERVICE_PORT}
  # What targets call this (the hub's) cluster: ssh <user>@<host> ${DEFAULT_SSH_HUB_NAME}/<namespace>/<pod>
  hubName: ${DEFAULT_SSH_HUB_NAME}
  # The device login at a JWTAuthenticator's issuer, e.g. {authenticator: my-oidc}; without it only SSH
  # certificates (and keys an earlier login bound) sign in.
  # login: {authenticator: my-oidc, clientID: "", scopes: [${DEFAULT_SSH_SCOPES.join(', ')}]}
  # User-certificate CAs, one public key each as in authorized_keys.
  certificateAuthorities: []
  # The certificate extension listing the user's groups.
  groupsExtension: ${DEFAULT_GROUPS_EXTENSION}
  # Whether certificates may name users and groups that start with system: (Kubernetes' own, such as system:masters).
  allowSystemNames: false
  # How long a device login keeps a key bound at most (h, m, s: 12h, 1h30m; from 5m to 168h). Within it the door
  # renews the login with the issuer's refresh token, so the key stays bound while the login lasts at the issuer.
  maxBindingLifetime: ${DEFAULT_SSH_MAX_BINDING_LIFETIME}
accessRequests:
  # Access requests ask for groups on clusters for a while (sealion request create); reviewers approve them by the
  # hub's RBAC (verb approve on accessrequests: the ClusterRole sealion-concierge-access-reviewer). A Cluster's own policy is
  # on its spec.access; this is the hub's.
  # What requests call this (the hub's) cluster in spec.clusters.
  hubName: ${DEFAULT_ACCESS_HUB_NAME}
  hub:
    # The groups a user may ask for here; empty: no access requests for the hub.
    groups: []
    # The longest grant, in seconds (60 to ${MAX_DURATION_SECONDS}).
    maxDurationSeconds: ${DEFAULT_MAX_DURATION_SECONDS}
    # How many reviewers, none of them the requester, must approve.
    approvals: 1
    # Whether every request to the hub must carry a reason (sealion login --reason, or an approved request's).
    requireReason: false
`;

/** The Secret, in the concierge's namespace, with the CA that agents pin and are issued from. */
export const TUNNEL_CA_SECRET = 'sealion-tunnel-ca';
/** The Secret, in the concierge's namespace, with the CA of the replicas' peer certificates. */
export const PEER_CA_SECRET = 'sealion-peer-ca';
/** The URI SAN every peer certificate carries, the replica's name (percent-encoded) after it. */
export const PEER_URI_PREFIX = 'urn:sealion:peer:';
/** The annotation on a replica's Lease with the host:port its peers reach it at. */
export const PEER_ADDRESS_ANNOTATION = 'sealion.dev/peer-address';
/**
 * The URI SAN of a TokenCredentialRequest certificate: the authenticator's uid (percent-encoded) and the digest of
 * what its spec trusts after it, `urn:sealion:authenticator:<uid>:<digest>` (concierge/proxy/credentials.ts).
 */
export const AUTHENTICATOR_URI_PREFIX = 'urn:sealion:authenticator:';
/** The annotation on a replica's Lease with the Sealion version the replica runs. */
export const REPLICA_VERSION_ANNOTATION = 'sealion.dev/version';
/**
 * How long an agent's drain (SIGTERM) lets its tunnels' streams in flight end, in seconds: within the 30 s the
 * kubelet gives a pod that stops (terminationGracePeriodSeconds' default), with room for the stop. Plain requests end
 * in well under it; a watch or an exec on the agent's tunnels that outlasts it is cut.
 */
export const AGENT_DRAIN_SECONDS = 20;
/**
 * The annotation on a replica's Lease with the tunnel protocol it serves agents with, `major.minor`
 * (lib/tunnel/protocol.ts). Absent on replicas from before it was published.
 */
export const REPLICA_PROTOCOL_ANNOTATION = 'sealion.dev/tunnel-protocol';
/**
 * The ConfigMap, in the concierge's namespace, where the leader publishes the versions of the live replicas
 * (controllers/concierge-versions.ts) for `sealion version`. Nothing else is in it, so that every signed-in user may
 * read it, as they may read the API server's /version; the install grants that by name. The leader creates it.
 */
export const CONCIERGE_VERSIONS_CONFIG_MAP = 'sealion-concierge-versions';
/** Its key with the versions, a JSON list of ConciergeVersion, most replicas first. */
export const CONCIERGE_VERSIONS_KEY = 'versions';
/**
 * Its key with when the leader last confirmed the list (RFC 3339, on the leader's clock). The leader confirms it
 * every minute or so even when nothing changed, so a reader can tell a list that nobody keeps any more (every replica
 * gone) from a current one.
 */
export const CONCIERGE_VERSIONS_OBSERVED_KEY = 'observedAt';

/** One version the concierge's live replicas run, and how many run it. */
export interface ConciergeVersion {
  version: string;
  replicas: number;
  /** The tunnel protocol these replicas speak; absent when they did not say (older than this field). */
  tunnelProtocol?: string;
}

/**
 * Kubernetes' signer of client certificates its API server trusts, which the direct path asks the cluster to sign
 * with (and which the install's RBAC names): here, not beside the code that signs, so that the manifests need no
 * Kubernetes client to be rendered.
 */
export const KUBE_APISERVER_CLIENT_SIGNER = 'kubernetes.io/kube-apiserver-client';
