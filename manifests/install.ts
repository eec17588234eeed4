// What an admin applies: the concierge (with its RBAC, Deployment, Services, default ConfigMap) and, for
// clusters reached through a tunnel, the agent. Cluster-scoped names carry the namespace, so two
// installations (say, suffixes sealion.dev and pinniped.dev) live side by side.
import { APPROVE_VERB } from '../apis/access.ts';
import {
  accessReviewerRole,
  AGENT_HEALTH_PORT,
  AGENT_NAME,
  API_PORT,
  API_SERVICE,
  CONCIERGE_NAME,
  CONFIG_KEY,
  CONFIG_MAP_NAME,
  CONCIERGE_VERSIONS_CONFIG_MAP,
  AUDIT_CONFIG_MAP_NAME,
  AUDIT_POLICY_KEY,
  DEFAULT_AUDIT_POLICY_YAML,
  RECORDINGS_DIR,
  DEFAULT_AGENT_NAMESPACE,
  DEFAULT_CONFIG_YAML,
  DEFAULT_NAMESPACE,
  IMPERSONATOR_SERVICE_ACCOUNT,
  KUBE_APISERVER_CLIENT_SIGNER,
  PEER_PORT,
  PROXY_PORT,
  SSH_PORT,
  TUNNEL_PORT,
  TUNNEL_SERVICE,
} from '../apis/install.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import { AGENT_POLICY_KEY } from '../apis/tunnel.ts';
import { stringify } from 'yaml';
import { DEFAULT_SHUTDOWN_DELAY_SECONDS, DEFAULT_SHUTDOWN_GRACE_SECONDS } from '../concierge/drain.ts';

import {
  DEFAULT_POLICY,
  describePolicy,
  forwardingRules,
  type ForwardingPolicy,
  type PolicyRule,
} from './forwarding-policy.ts';

export interface InstallOptions {
  /** API group suffix. Default: sealion.dev. */
  groupSuffix: string;
  /** Namespace of the concierge. Default: sealion-concierge. */
  namespace: string;
  /** Namespace of the agent on a managed cluster. Default: sealion-agent. */
  agentNamespace: string;
  /** Container image for both processes. Default: DEFAULT_IMAGE. */
  image: string;
  /** What the hub's forwarding identity may do on the hub (forwarding-policy.ts). Default: DEFAULT_POLICY. */
  forwardingPolicy?: ForwardingPolicy;
  /** Where and how the concierge's pods run. */
  concierge?: PodSettings;
  /** Where and how the agent's pod runs (its replicas are always 1: one agent holds a cluster's credentials). */
  agent?: PodSettings;
  /** The concierge's Services that the install makes (the proxy's published one is the controllers'). */
  services?: { proxy?: ServiceSettings; tunnel?: ServiceSettings };
  /** The ConfigMap's settings (concierge/config.ts). Default: DEFAULT_CONFIG_YAML, comments and all. */
  config?: Obj;
  /** The audit policy (audit.k8s.io/v1 Policy). Default: DEFAULT_AUDIT_POLICY_YAML. */
  auditPolicy?: Obj;
  /**
   * How a forwarding policy becomes RBAC; the Helm chart's renderer (chart.ts) swaps in its template's version.
   * Default: renderPolicy.
   */
  renderPolicy?: (policy: ForwardingPolicy) => PolicyRendering;
}

/**
 * The settings of a Deployment's pods that installs differ in (the Helm charts' values). Empty maps, lists and
 * strings leave a field out, as the charts' templates do.
 */
export interface PodSettings {
  /** The concierge's replicas. Default: 2. */
  replicas?: number;
  /**
   * The concierge's `--shutdown-delay`: how long a replica told to stop serves on, unready, while Endpoints and load
   * balancers forget it. Default: DEFAULT_SHUTDOWN_DELAY_SECONDS, for a cloud load balancer's health checks; where the
   * load balancer follows readiness within a second (kube-proxy alone, a test's), a second or two does, and each
   * rollout is that much shorter. The pod's terminationGracePeriodSeconds follows it.
   */
  shutdownDelaySeconds?: number;
  /**
   * The concierge's `--shutdown-grace`: how long exec, attach, port-forward, reach and SSH sessions may go on once a
   * replica takes no new connections, before each is closed with a message. Default: DEFAULT_SHUTDOWN_GRACE_SECONDS.
   * A rollout's last replica holds sessions for all of it. The pod's terminationGracePeriodSeconds follows it.
   */
  shutdownGraceSeconds?: number;
  resources?: Obj;
  nodeSelector?: Record<string, string>;
  tolerations?: Obj[];
  affinity?: Obj;
  /** Default for the concierge: CONCIERGE_SPREAD. */
  topologySpreadConstraints?: Obj[];
  priorityClassName?: string;
  imagePullPolicy?: string;
  imagePullSecrets?: { name: string }[];
}

export interface ServiceSettings {
  /** Default: ClusterIP. */
  type?: string;
  annotations?: Record<string, string>;
}

/** A forwarding policy as RBAC: the rules of its ClusterRole (none for an admin's own), and how it is described. */
export interface PolicyRendering {
  rules: PolicyRule[] | undefined;
  /** describePolicy's line. */
  description: string;
  /** The admin's own ClusterRole, which is bound instead of a rendered one. */
  ownRole: string | undefined;
}

export function renderPolicy(policy: ForwardingPolicy): PolicyRendering {
  return {
    rules: forwardingRules(policy),
    description: describePolicy(policy),
    ownRole: policy.name.startsWith('clusterrole:') ? policy.name.slice('clusterrole:'.length) : undefined,
  };
}

export const DEFAULT_IMAGE = 'ghcr.io/sealion-dev/sealion:v0.1.0';
export const DEFAULT_INSTALL: InstallOptions = {
  groupSuffix: DEFAULT_GROUP_SUFFIX,
  namespace: DEFAULT_NAMESPACE,
  agentNamespace: DEFAULT_AGENT_NAMESPACE,
  image: DEFAULT_IMAGE,
};

type Obj = Record<string, unknown>;
const PART_OF = { 'app.kubernetes.io/part-of': 'sealion' };

function labels(component: string): Record<string, string> {
  return { ...PART_OF, 'app.kubernetes.io/component': component, app: component };
}

function namespace(name: string): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Namespace',
    metadata: {
      name,
      labels: { ...PART_OF, 'pod-security.kubernetes.io/enforce': 'restricted' },
    },
  };
}

function serviceAccount(name: string, ns: string, automount: boolean): Obj {
  return {
    apiVersion: 'v1',
    kind: 'ServiceAccount',
    metadata: { name, namespace: ns, labels: PART_OF },
    automountServiceAccountToken: automount,
  };
}

function binding(kind: 'ClusterRoleBinding' | 'RoleBinding', name: string, sa: string, ns: string): Obj {
  return {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind,
    metadata: { name, labels: PART_OF, ...(kind === 'RoleBinding' ? { namespace: ns } : {}) },
    roleRef: {
      apiGroup: 'rbac.authorization.k8s.io',
      kind: kind === 'RoleBinding' ? 'Role' : 'ClusterRole',
      name,
    },
    subjects: [{ kind: 'ServiceAccount', name: sa, namespace: ns }],
  };
}

/**
 * The forwarding identity's ClusterRole and its binding: impersonating, as the policy allows, is all it may do, so a
 * bug in the proxy cannot use the controllers' rights. A policy naming a ClusterRole of the admin's own binds that.
 */
function forwardingRBAC(role: string, policy: PolicyRendering, sa: string, ns: string): Obj[] {
  const { rules, ownRole: own } = policy;
  const bound = binding('ClusterRoleBinding', role, sa, ns);
  if (own) (bound['roleRef'] as { name: string }).name = own;
  return [
    ...(rules
      ? [
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'ClusterRole',
            metadata: {
              name: role,
              labels: PART_OF,
              annotations: { [POLICY_ANNOTATION]: policy.description },
            },
            rules,
          },
        ]
      : []),
    bound,
  ];
}

/** Says on the forwarding ClusterRole which policy it was rendered from. */
export const POLICY_ANNOTATION = 'sealion.dev/forwarding-policy';

/** Hardened pod and container settings; the image runs as a non-root user with a read-only root. */
const POD_SECURITY = { runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } };
/** The ClusterRole that lets its subjects list and read recorded sessions, for an installation in `namespace`. */
export const sessionAuditorRole = (namespace: string): string => `${namespace}-session-auditor`;

/** Where the audit ConfigMap is mounted in the concierge's pods. */
const AUDIT_MOUNT = '/etc/sealion/audit';
/** Room for recordings on each concierge pod: a session's recording stops at its own limit, well below. */
const RECORDINGS_VOLUME_SIZE = '1Gi';

const CONTAINER_SECURITY = {
  allowPrivilegeEscalation: false,
  readOnlyRootFilesystem: true,
  capabilities: { drop: ['ALL'] },
};
/**
 * Node options the concierge and the agent run with (both are proxies). `--max-semi-space-size=8` fixes V8's young generation at 8 MiB per
 * semi-space instead of letting V8 size it from the node's memory (32 MiB on a large node). A proxy's garbage is
 * almost all per request; with the large young generation, the spare room V8 leaves in the old generation after
 * a full collection is smaller than the young generation, so V8 starts the next full collection at once: under a
 * LIST load in the benchmark, one every 250 ms, each marking the whole heap, with pauses that left the API server
 * waiting for requests. With 8 MiB, short scavenges take the garbage and a full collection comes every 2 s or so.
 */
export const PROXY_NODE_OPTIONS = '--max-semi-space-size=8';
const DOWNWARD_ENV = [
  { name: 'POD_NAME', valueFrom: { fieldRef: { fieldPath: 'metadata.name' } } },
  { name: 'POD_NAMESPACE', valueFrom: { fieldRef: { fieldPath: 'metadata.namespace' } } },
];
/** The concierge's pods also learn their address, which they publish for their peers. */
const CONCIERGE_ENV = [
  ...DOWNWARD_ENV,
  { name: 'POD_IP', valueFrom: { fieldRef: { fieldPath: 'status.podIP' } } },
];

/**
 * The concierge's replicas spread over nodes, then zones, where there are several. ScheduleAnyway, not DoNotSchedule:
 * a node being drained still counts as a place to spread to (it is only cordoned), so on two nodes a hard constraint
 * would leave the replacement of an evicted replica Pending until the drained node came back; the cost is that a
 * replica may share a node when the others are full. pod-template-hash counts each rollout's pods apart, so the new
 * ones spread among themselves rather than around the old ones about to go.
 */
export const CONCIERGE_SPREAD = ['kubernetes.io/hostname', 'topology.kubernetes.io/zone'].map(
  (topologyKey) => ({
    maxSkew: 1,
    topologyKey,
    whenUnsatisfiable: 'ScheduleAnyway',
    labelSelector: { matchLabels: { app: CONCIERGE_NAME } },
    matchLabelKeys: ['pod-template-hash'],
  }),
);

/** The concierge's pods by default: two, spread over nodes and zones where they can be. */
export const DEFAULT_CONCIERGE_POD = {
  replicas: 2,
  resources: { requests: { cpu: '100m', memory: '128Mi' }, limits: { memory: '512Mi' } },
  topologySpreadConstraints: CONCIERGE_SPREAD,
} satisfies PodSettings;

/**
 * A rollout starts a new pod before it stops an old one, and stops none before the new one is ready: the replicas
 * serving never drop below those asked for. The cost is one pod's room on the nodes during the rollout.
 */
export const ROLLING_UPDATE = {
  type: 'RollingUpdate',
  rollingUpdate: { maxUnavailable: 0, maxSurge: 1 },
};
export const DEFAULT_AGENT_POD = {
  resources: { requests: { cpu: '50m', memory: '64Mi' }, limits: { memory: '256Mi' } },
} satisfies PodSettings;

function isEmpty(value: unknown): boolean {
  if (value === undefined || value === null || value === '') return true;
  if (Array.isArray(value)) return value.length === 0;
  return typeof value === 'object' && Object.keys(value).length === 0;
}

/** The fields that are set and not empty: an empty setting is no setting (as a chart's `with` sees it). */
function present(fields: Obj): Obj {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => !isEmpty(value)));
}

/** Where a pod runs, for its spec. */
function placement(pod: PodSettings): Obj {
  return present({
    affinity: pod.affinity,
    topologySpreadConstraints: pod.topologySpreadConstraints,
    nodeSelector: pod.nodeSelector,
    tolerations: pod.tolerations,
    priorityClassName: pod.priorityClassName,
    imagePullSecrets: pod.imagePullSecrets,
  });
}

function service(name: string, ns: string, settings: ServiceSettings | undefined, spec: Obj): Obj {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: ns, labels: PART_OF, ...present({ annotations: settings?.annotations }) },
    spec: { type: settings?.type ?? 'ClusterIP', ...spec },
  };
}

export function conciergeManifests(opts: InstallOptions = DEFAULT_INSTALL): Obj[] {
  const ns = opts.namespace;
  const groups = apiGroups(opts.groupSuffix);
  const conciergeRole = `${ns}-concierge`;
  return [
    namespace(ns),
    serviceAccount(CONCIERGE_NAME, ns, true),
    sessionAuditorClusterRole(ns, groups),
    ...accessClusterRoles(ns, groups),
    // Tokens for this account are requested by the concierge (TokenRequest API), never mounted.
    serviceAccount(IMPERSONATOR_SERVICE_ACCOUNT, ns, false),
    ...forwardingRBAC(
      `${ns}-impersonator`,
      (opts.renderPolicy ?? renderPolicy)(opts.forwardingPolicy ?? DEFAULT_POLICY),
      IMPERSONATOR_SERVICE_ACCOUNT,
      ns,
    ),
    ...conciergeClusterRBAC(conciergeRole, ns, groups),
    ...directPathRBAC(conciergeRole, ns, groups),
    ...reachRBAC(`${conciergeRole}-reach`, CONCIERGE_NAME, ns),
    ...frontProxyAndClusterInfoRBAC(ns),
    ...loginRBAC(ns, groups),
    ...conciergeNamespaceRBAC(conciergeRole, ns),
    ...versionsReaderRBAC(ns),
    ...conciergeConfigMaps(opts),
    conciergeDeployment(opts),
    conciergeDisruptionBudget(ns),
    ...conciergeServices(opts),
    conciergeNetworkPolicy(ns),
  ];
}

type Groups = ReturnType<typeof apiGroups>;
const CONCIERGE_SELECTOR = { app: CONCIERGE_NAME };

/** A ClusterRole of the installation's. */
function clusterRole(name: string, rules: PolicyRule[]): Obj {
  return {
    apiVersion: 'rbac.authorization.k8s.io/v1',
    kind: 'ClusterRole',
    metadata: { name, labels: PART_OF },
    rules,
  };
}

/**
 * Bound by the admin to whoever may read recorded sessions (the SessionRecording API, which the proxy serves and the
 * API server does not know: kubectl create clusterrole would refuse the resource).
 */
function sessionAuditorClusterRole(ns: string, groups: Groups): Obj {
  return clusterRole(sessionAuditorRole(ns), [
    { apiGroups: [groups.recordings], resources: [Resource.SessionRecording], verbs: ['get', 'list'] },
  ]);
}

/**
 * Bound by the admin to whoever reviews: reviewers read access requests and approve or deny them (the `approve` verb,
 * which the proxy asks the hub's authorizer about). Requesters need no role: the proxy writes their requests with the
 * concierge's rights and answers their own (selfaccessrequests), so nobody holds create, update or patch on them, and
 * no role lets a requester read everyone's.
 */
function accessClusterRoles(ns: string, groups: Groups): Obj[] {
  const read = {
    apiGroups: [groups.access],
    resources: [Resource.AccessRequest],
    verbs: ['get', 'list', 'watch'],
  };
  return [clusterRole(accessReviewerRole(ns), [read, { ...read, verbs: [APPROVE_VERB] }])];
}

/** The controllers' cluster-wide rights: authenticators, the CredentialIssuer, Clusters, nodes, reviews. */
function conciergeClusterRBAC(role: string, ns: string, groups: Groups): Obj[] {
  return [
    clusterRole(role, [
      {
        apiGroups: [groups.authentication],
        resources: [Resource.JWTAuthenticator, Resource.WebhookAuthenticator],
        verbs: ['get', 'list', 'watch'],
      },
      {
        apiGroups: [groups.authentication],
        resources: [`${Resource.JWTAuthenticator}/status`, `${Resource.WebhookAuthenticator}/status`],
        verbs: ['get', 'update', 'patch'],
      },
      {
        apiGroups: [groups.config],
        resources: [Resource.CredentialIssuer],
        verbs: ['get', 'list', 'watch', 'create', 'update', 'patch'],
      },
      {
        apiGroups: [groups.config],
        resources: [`${Resource.CredentialIssuer}/status`],
        verbs: ['get', 'update', 'patch'],
      },
      { apiGroups: [groups.tunnel], resources: [Resource.Cluster], verbs: ['get', 'list', 'watch'] },
      {
        apiGroups: [groups.tunnel],
        resources: [`${Resource.Cluster}/status`],
        verbs: ['get', 'update', 'patch'],
      },
      // Access requests: the proxy creates them for the users it authenticated and writes their decisions, the leader
      // their expiry, and deletes them a day after they ended (so one user's cannot pile up for ever).
      {
        apiGroups: [groups.access],
        resources: [Resource.AccessRequest],
        verbs: ['get', 'list', 'watch', 'create', 'delete'],
      },
      {
        apiGroups: [groups.access],
        resources: [`${Resource.AccessRequest}/status`],
        verbs: ['get', 'update', 'patch'],
      },
      // Managed-cluster detection reads node labels and provider IDs.
      { apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch'] },
      // Service-account tokens through the proxy, and nested impersonation checks.
      { apiGroups: ['authentication.k8s.io'], resources: ['tokenreviews'], verbs: ['create'] },
      { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
      // Whether its APIServices are Available (the direct path's evidence); writing them is the direct role's.
      {
        apiGroups: ['apiregistration.k8s.io'],
        resources: ['apiservices'],
        verbs: ['get', 'list', 'watch'],
      },
    ]),
    binding('ClusterRoleBinding', role, CONCIERGE_NAME, ns),
  ];
}

/**
 * The direct path's rights, apart: with them the concierge can mint any identity the cluster trusts (it approves only
 * its own requests, but RBAC cannot say so). Deleting this ClusterRoleBinding takes the direct path away for good,
 * whatever the ConfigMap says.
 */
function directPathRBAC(conciergeRole: string, ns: string, groups: Groups): Obj[] {
  return [
    clusterRole(`${conciergeRole}-direct`, [
      // The direct path (concierge/direct/): client certificates the cluster signs. Approving for this signer lets
      // the concierge mint any identity, which RBAC cannot narrow by subject; the concierge approves only requests it
      // created itself, for users it authenticated, never system:masters (lib/kube/cluster-certificates.ts).
      {
        apiGroups: ['certificates.k8s.io'],
        resources: ['certificatesigningrequests'],
        verbs: ['create', 'get', 'delete'],
      },
      {
        apiGroups: ['certificates.k8s.io'],
        resources: ['certificatesigningrequests/approval'],
        verbs: ['update'],
      },
      {
        apiGroups: ['certificates.k8s.io'],
        resources: ['signers'],
        verbs: ['approve'],
        resourceNames: [KUBE_APISERVER_CLIENT_SIGNER],
      },
      // Its two APIServices, and no other: a create cannot be narrowed by name (an existing group's APIService cannot
      // be created again), the rest is.
      { apiGroups: ['apiregistration.k8s.io'], resources: ['apiservices'], verbs: ['create'] },
      {
        apiGroups: ['apiregistration.k8s.io'],
        resources: ['apiservices'],
        verbs: ['update', 'patch', 'delete'],
        resourceNames: [`${VERSION}.${groups.login}`, `${VERSION}.${groups.identity}`],
      },
    ]),
    binding('ClusterRoleBinding', `${conciergeRole}-direct`, CONCIERGE_NAME, ns),
  ];
}

/** Finding the addresses of reach connections' objects (REACH_READ_RULES), in a ClusterRole of its own. */
function reachRBAC(role: string, sa: string, ns: string): Obj[] {
  return [clusterRole(role, REACH_READ_RULES), binding('ClusterRoleBinding', role, sa, ns)];
}

/** Reading what the API server publishes: the front proxy's CA and headers, and where users reach it. */
function frontProxyAndClusterInfoRBAC(ns: string): Obj[] {
  return [
    {
      // The front proxy's CA and headers, which the API server publishes for aggregated API servers (a Role it makes).
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: `${ns}-concierge-auth-reader`, namespace: 'kube-system', labels: PART_OF },
      roleRef: {
        apiGroup: 'rbac.authorization.k8s.io',
        kind: 'Role',
        name: 'extension-apiserver-authentication-reader',
      },
      subjects: [{ kind: 'ServiceAccount', name: CONCIERGE_NAME, namespace: ns }],
    },
    {
      // Where users reach the API server (kubeadm publishes it there, readable by anyone; elsewhere, by this Role).
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: `${ns}-concierge-cluster-info`, namespace: 'kube-public', labels: PART_OF },
      rules: [
        { apiGroups: [''], resources: ['configmaps'], verbs: ['get'], resourceNames: ['cluster-info'] },
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: `${ns}-concierge-cluster-info`, namespace: 'kube-public', labels: PART_OF },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: `${ns}-concierge-cluster-info` },
      subjects: [{ kind: 'ServiceAccount', name: CONCIERGE_NAME, namespace: ns }],
    },
  ];
}

/**
 * Logging in through the API server: anyone may trade a token (that is how people without credentials get some), and
 * anyone signed in may ask who they are.
 */
function loginRBAC(ns: string, groups: Groups): Obj[] {
  return [
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: `${ns}-login`, labels: PART_OF },
      rules: [
        {
          apiGroups: [groups.login],
          resources: [Resource.TokenCredentialRequest],
          verbs: ['create', 'list'],
        },
        { apiGroups: [groups.identity], resources: [Resource.WhoAmIRequest], verbs: ['create'] },
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRoleBinding',
      metadata: { name: `${ns}-login`, labels: PART_OF },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: `${ns}-login` },
      subjects: [
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'system:authenticated' },
        { apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'system:unauthenticated' },
      ],
    },
  ];
}

/** The controllers' rights in their own namespace: ConfigMaps, Services, Secrets, Leases, events, tokens. */
function conciergeNamespaceRBAC(conciergeRole: string, ns: string): Obj[] {
  return [
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: conciergeRole, namespace: ns, labels: PART_OF },
      rules: [
        { apiGroups: [''], resources: ['configmaps'], verbs: ['get', 'list', 'watch'] },
        // The leader publishes the replicas' versions in a ConfigMap of their own, and makes it again should it go (a
        // server-side apply: a patch, or a create when it is absent). A create cannot be narrowed by name; the
        // concierge may create Secrets and Services here anyway, and may change no ConfigMap but that one.
        { apiGroups: [''], resources: ['configmaps'], verbs: ['create'] },
        {
          apiGroups: [''],
          resources: ['configmaps'],
          verbs: ['patch'],
          resourceNames: [CONCIERGE_VERSIONS_CONFIG_MAP],
        },
        {
          apiGroups: [''],
          resources: ['services', 'secrets'],
          verbs: ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'],
        },
        {
          apiGroups: ['coordination.k8s.io'],
          resources: ['leases'],
          // Each replica deletes its own Lease when it stops.
          verbs: ['get', 'list', 'watch', 'create', 'update', 'delete'],
        },
        { apiGroups: ['', 'events.k8s.io'], resources: ['events'], verbs: ['create', 'patch'] },
        // Owner references on what the controllers create point at the Deployment.
        { apiGroups: ['apps'], resources: ['deployments'], verbs: ['get'], resourceNames: [CONCIERGE_NAME] },
        // The forwarding identity's tokens, and no other account's.
        {
          apiGroups: [''],
          resources: ['serviceaccounts/token'],
          verbs: ['create'],
          resourceNames: [IMPERSONATOR_SERVICE_ACCOUNT],
        },
      ],
    },
    binding('RoleBinding', conciergeRole, CONCIERGE_NAME, ns),
  ];
}

/**
 * Which versions the concierge runs (`sealion version`), for anyone signed in, as the API server's /version is:
 * a user who knows what they talk to can report a problem or tell a fixed bug from an open one. The ConfigMap
 * (the concierge makes it) holds nothing else: versions and counts, no pod names or addresses, and the Role
 * names it alone. Anonymous requests are left out: they need no version to log in.
 */
function versionsReaderRBAC(ns: string): Obj[] {
  return [
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: `${ns}-versions-reader`, namespace: ns, labels: PART_OF },
      rules: [
        {
          apiGroups: [''],
          resources: ['configmaps'],
          verbs: ['get'],
          resourceNames: [CONCIERGE_VERSIONS_CONFIG_MAP],
        },
      ],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: `${ns}-versions-reader`, namespace: ns, labels: PART_OF },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: `${ns}-versions-reader` },
      subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'Group', name: 'system:authenticated' }],
    },
  ];
}

/** The settings (concierge/config.ts) and the audit policy. */
function conciergeConfigMaps(opts: InstallOptions): Obj[] {
  const ns = opts.namespace;
  return [
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: CONFIG_MAP_NAME, namespace: ns, labels: PART_OF },
      data: { [CONFIG_KEY]: opts.config ? stringify(opts.config) : DEFAULT_CONFIG_YAML },
    },
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: AUDIT_CONFIG_MAP_NAME, namespace: ns, labels: PART_OF },
      data: {
        [AUDIT_POLICY_KEY]: opts.auditPolicy ? stringify(opts.auditPolicy) : DEFAULT_AUDIT_POLICY_YAML,
      },
    },
  ];
}

/**
 * What a concierge's terminationGracePeriodSeconds holds besides the drain's delay and grace (concierge/drain.ts):
 * 15 s for what follows them (closing sessions, the stop, the last audit events) with room to spare. Killed sooner, a
 * replica would cut the sessions the grace promised to warn. The chart adds the two values to it.
 */
export const TERMINATION_GRACE_MARGIN_SECONDS = 15;

/** How long the kubelet waits after SIGTERM before it kills a concierge that drains for `delay` and `grace` s. */
export function conciergeTerminationGraceSeconds(delay: number, grace: number): number {
  return delay + grace + TERMINATION_GRACE_MARGIN_SECONDS;
}

/** The default install's terminationGracePeriodSeconds. */
export const CONCIERGE_TERMINATION_GRACE_SECONDS = conciergeTerminationGraceSeconds(
  DEFAULT_SHUTDOWN_DELAY_SECONDS,
  DEFAULT_SHUTDOWN_GRACE_SECONDS,
);

/** The concierge's Deployment: its replicas, where they run, and the recordings' and audit policy's volumes. */
function conciergeDeployment(opts: InstallOptions): Obj {
  const ns = opts.namespace;
  const pod: PodSettings = { ...DEFAULT_CONCIERGE_POD, ...opts.concierge };
  const selector = CONCIERGE_SELECTOR;
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: CONCIERGE_NAME, namespace: ns, labels: labels(CONCIERGE_NAME) },
    spec: {
      // Every replica serves the proxy; a Lease picks the one that writes.
      replicas: pod.replicas,
      strategy: ROLLING_UPDATE,
      selector: { matchLabels: selector },
      template: {
        metadata: { labels: labels(CONCIERGE_NAME) },
        spec: {
          serviceAccountName: CONCIERGE_NAME,
          securityContext: POD_SECURITY,
          terminationGracePeriodSeconds: conciergeTerminationGraceSeconds(
            shutdownDelay(pod),
            shutdownGrace(pod),
          ),
          ...placement(pod),
          containers: [conciergeContainer(opts, pod)],
          volumes: [
            { name: 'audit', configMap: { name: AUDIT_CONFIG_MAP_NAME, optional: true } },
            // Recordings live as long as the pod: keep them longer with a persistent volume here, or send them
            // to the audit webhook.
            { name: 'recordings', emptyDir: { sizeLimit: RECORDINGS_VOLUME_SIZE } },
          ],
        },
      },
    },
  };
}

/**
 * Voluntary disruptions (a node drain, a cluster autoscaler) take one replica at a time: maxUnavailable, not
 * minAvailable, so that a single replica (replicas: 1) can still be evicted and a drain never waits for ever.
 * AlwaysAllow evicts a replica that is not ready at once: it serves nothing, and under the default policy two
 * replicas failing together would hold every drain of their nodes.
 */
function conciergeDisruptionBudget(ns: string): Obj {
  return {
    apiVersion: 'policy/v1',
    kind: 'PodDisruptionBudget',
    metadata: { name: CONCIERGE_NAME, namespace: ns, labels: PART_OF },
    spec: {
      maxUnavailable: 1,
      selector: { matchLabels: CONCIERGE_SELECTOR },
      unhealthyPodEvictionPolicy: 'AlwaysAllow',
    },
  };
}

const shutdownDelay = (pod: PodSettings): number =>
  pod.shutdownDelaySeconds ?? DEFAULT_SHUTDOWN_DELAY_SECONDS;
const shutdownGrace = (pod: PodSettings): number =>
  pod.shutdownGraceSeconds ?? DEFAULT_SHUTDOWN_GRACE_SECONDS;

/** The concierge's one container: its flags, mounts, ports and probes. */
function conciergeContainer(opts: InstallOptions, pod: PodSettings): Obj {
  // Answered 200, the proxy logs no line for them (concierge/proxy/local-apis.ts).
  const probe = (path: string): Obj => ({
    httpGet: { path, port: 'proxy', scheme: 'HTTPS' },
    periodSeconds: 10,
  });
  return {
    name: 'concierge',
    image: opts.image,
    ...present({ imagePullPolicy: pod.imagePullPolicy }),
    args: [
      'concierge',
      `--group-suffix=${opts.groupSuffix}`,
      `--config-map=${CONFIG_MAP_NAME}`,
      // Audit events go to standard output, beside the log lines (they have kind: Event); the policy
      // comes from its ConfigMap, and deleting that turns audit off.
      `--audit-policy-file=${AUDIT_MOUNT}/${AUDIT_POLICY_KEY}`,
      '--audit-log-path=-',
      `--recordings-dir=${RECORDINGS_DIR}`,
      `--aggregated-api-listen=0.0.0.0:${API_PORT}`,
      // Listens only while the ConfigMap's ssh.mode is enabled.
      `--ssh-listen=0.0.0.0:${SSH_PORT}`,
      // The drain on SIGTERM, written out so that its sum beside terminationGracePeriodSeconds is plain to read.
      `--shutdown-delay=${shutdownDelay(pod)}`,
      `--shutdown-grace=${shutdownGrace(pod)}`,
    ],
    volumeMounts: [
      { name: 'audit', mountPath: AUDIT_MOUNT, readOnly: true },
      { name: 'recordings', mountPath: RECORDINGS_DIR },
    ],
    env: [...CONCIERGE_ENV, { name: 'NODE_OPTIONS', value: PROXY_NODE_OPTIONS }],
    ports: [
      { name: 'proxy', containerPort: PROXY_PORT, protocol: 'TCP' },
      { name: 'tunnel', containerPort: TUNNEL_PORT, protocol: 'TCP' },
      { name: 'peer', containerPort: PEER_PORT, protocol: 'TCP' },
      { name: 'api', containerPort: API_PORT, protocol: 'TCP' },
      { name: 'ssh', containerPort: SSH_PORT, protocol: 'TCP' },
    ],
    // Every 2 s: a new replica counts as ready (and a rollout goes on) within 2 s of serving. At 10 s the kubelet's
    // first try usually came before the process listened, and the next 10 s later. A drain's 503 is seen as soon.
    readinessProbe: { ...probe('/readyz'), periodSeconds: 2 },
    livenessProbe: { ...probe('/healthz'), failureThreshold: 6 },
    ...present({ resources: pod.resources }),
    securityContext: CONTAINER_SECURITY,
  };
}

/** The proxy's Service, the aggregated APIs' and the tunnel's. */
function conciergeServices(opts: InstallOptions): Obj[] {
  const ns = opts.namespace;
  const selector = CONCIERGE_SELECTOR;
  return [
    service(`${CONCIERGE_NAME}-proxy`, ns, opts.services?.proxy, {
      selector,
      ports: [{ name: 'https', port: 443, targetPort: 'proxy', protocol: 'TCP' }],
    }),
    // The cluster's API server reaches the aggregated APIs here (the APIServices the controllers register name it).
    service(API_SERVICE, ns, undefined, {
      selector,
      ports: [{ name: 'https', port: 443, targetPort: 'api', protocol: 'TCP' }],
    }),
    // Agents dial in here; expose it (LoadBalancer, Ingress passthrough) where agents live outside the cluster.
    service(TUNNEL_SERVICE, ns, opts.services?.tunnel, {
      selector,
      ports: [{ name: 'tunnel', port: 443, targetPort: 'tunnel', protocol: 'TCP' }],
    }),
  ];
}

/** Who may reach which of the concierge's ports, where the network enforces policies. */
function conciergeNetworkPolicy(ns: string): Obj {
  const selector = CONCIERGE_SELECTOR;
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    // Where the network enforces policies: the proxy and tunnel ports take anyone, the peer port only the other
    // replicas (which it also checks itself, by address and by certificate).
    metadata: { name: CONCIERGE_NAME, namespace: ns, labels: PART_OF },
    spec: {
      podSelector: { matchLabels: selector },
      policyTypes: ['Ingress'],
      ingress: [
        {
          // The api port only believes the API server's front proxy (by its client certificate).
          ports: [
            { port: 'proxy', protocol: 'TCP' },
            { port: 'tunnel', protocol: 'TCP' },
            { port: 'api', protocol: 'TCP' },
            { port: 'ssh', protocol: 'TCP' },
          ],
        },
        { from: [{ podSelector: { matchLabels: selector } }], ports: [{ port: 'peer', protocol: 'TCP' }] },
      ],
    },
  };
}

/** What one cluster's agent is told: which cluster it is, where the hub is, how to trust it, and its one-time token. */
export interface AgentSettings {
  clusterName: string;
  hubURL: string;
  /** SPKI pin of the hub's tunnel CA (`sha256:<hex>`). */
  caPin: string;
  bootstrapToken: string;
  /** What the hub may do on that cluster through its agent. Default: DEFAULT_POLICY. */
  policy?: ForwardingPolicy;
}

/**
 * The agent's ConfigMap and bootstrap Secret for one cluster (with the namespace they live in), which
 * `sealion cluster add --agent-manifests` prints. Applied before the agent manifests, the agent's first start
 * finds them.
 */
export function agentSettingsManifests(
  settings: AgentSettings,
  opts: InstallOptions = DEFAULT_INSTALL,
): Obj[] {
  const ns = opts.agentNamespace;
  const policy = (opts.renderPolicy ?? renderPolicy)(settings.policy ?? DEFAULT_POLICY);
  return [
    namespace(ns),
    ...forwardingRBAC(`${ns}-forwarding`, policy, AGENT_NAME, ns),
    {
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: `${AGENT_NAME}-config`, namespace: ns, labels: PART_OF },
      data: {
        clusterName: settings.clusterName,
        hubURL: settings.hubURL,
        caPin: settings.caPin,
        [AGENT_POLICY_KEY]: policy.description,
      },
    },
    {
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: { name: `${AGENT_NAME}-bootstrap`, namespace: ns, labels: PART_OF },
      type: 'Opaque',
      stringData: { token: settings.bootstrapToken },
    },
  ];
}

/**
 * The agent's own rights on its cluster, besides forwarding (whose RBAC comes with its settings, from the policy the
 * cluster's admin picks): asking the cluster whether a user may do something, which is how the hub has every decision
 * about this cluster made by it.
 */
export const AGENT_REVIEW_RULES: PolicyRule[] = [
  { apiGroups: ['authorization.k8s.io'], resources: ['subjectaccessreviews'], verbs: ['create'] },
];

/**
 * What whoever dials reach connections (concierge/reach/) reads, as itself, to find the one address a user's named
 * object has: the pod, or the Service, its EndpointSlices and the pods they name (and the API server's own, which it
 * never dials). Whether the user may reach it is asked of the cluster as the user; this role only finds addresses.
 * Its own ClusterRole: deleting its binding takes reach connections away on that cluster.
 */
export const REACH_READ_RULES: PolicyRule[] = [
  { apiGroups: [''], resources: ['pods', 'services'], verbs: ['get'] },
  { apiGroups: ['discovery.k8s.io'], resources: ['endpointslices'], verbs: ['list'] },
];

/**
 * The agent for a cluster the concierge cannot reach. Its ConfigMap and bootstrap token come from
 * `sealion cluster add --agent-manifests` (agentSettingsManifests).
 */
export function agentManifests(opts: InstallOptions = DEFAULT_INSTALL): Obj[] {
  const ns = opts.agentNamespace;
  const role = `${ns}-reviews`;
  return [
    namespace(ns),
    serviceAccount(AGENT_NAME, ns, true),
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'ClusterRole',
      metadata: { name: role, labels: PART_OF },
      rules: AGENT_REVIEW_RULES,
    },
    binding('ClusterRoleBinding', role, AGENT_NAME, ns),
    ...reachRBAC(`${ns}-reach`, AGENT_NAME, ns),
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: AGENT_NAME, namespace: ns, labels: PART_OF },
      rules: [
        // Its settings (agentSettingsManifests).
        {
          apiGroups: [''],
          resources: ['configmaps'],
          verbs: ['get'],
          resourceNames: [`${AGENT_NAME}-config`],
        },
        // The agent keeps its key and certificate in a Secret so a restart does not register again.
        { apiGroups: [''], resources: ['secrets'], verbs: ['create'] },
        {
          apiGroups: [''],
          resources: ['secrets'],
          verbs: ['get', 'update', 'patch'],
          resourceNames: [`${AGENT_NAME}-credentials`],
        },
      ],
    },
    binding('RoleBinding', AGENT_NAME, AGENT_NAME, ns),
    agentDeployment(opts),
  ];
}

/**
 * The agent's Deployment: one replica, as one agent holds a cluster's credentials (its two tunnels, to two hub
 * replicas, are what keeps the cluster reachable while a hub replica goes). A rollout starts the new agent before it
 * stops the old one; the new one's tunnels take the old one's place on each hub replica, so the cluster is not left
 * without a tunnel while the new pod starts. (Kubernetes' default, 25% rounded, comes to the same for one replica;
 * said here so that it does not hang on rounding.) No PodDisruptionBudget: for one replica, a budget either blocks
 * every drain of its node or allows the eviction anyway.
 */
function agentDeployment(opts: InstallOptions): Obj {
  const ns = opts.agentNamespace;
  const pod: PodSettings = { ...DEFAULT_AGENT_POD, ...opts.agent };
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: AGENT_NAME, namespace: ns, labels: labels(AGENT_NAME) },
    spec: {
      replicas: 1,
      strategy: ROLLING_UPDATE,
      selector: { matchLabels: { app: AGENT_NAME } },
      template: {
        metadata: { labels: labels(AGENT_NAME) },
        spec: {
          serviceAccountName: AGENT_NAME,
          securityContext: POD_SECURITY,
          ...placement(pod),
          containers: [
            {
              name: 'agent',
              image: opts.image,
              ...present({ imagePullPolicy: pod.imagePullPolicy }),
              args: [
                'agent',
                `--config-map=${AGENT_NAME}-config`,
                `--credentials-secret=${AGENT_NAME}-credentials`,
                `--health-listen=0.0.0.0:${AGENT_HEALTH_PORT}`,
              ],
              ports: [{ name: 'health', containerPort: AGENT_HEALTH_PORT, protocol: 'TCP' }],
              // Ready while a tunnel is up: a rollout of the agent stops the old pod only once the new one holds one,
              // seen within 2 s of its tunnel (its health port logs nothing per probe).
              readinessProbe: { httpGet: { path: '/readyz', port: 'health' }, periodSeconds: 2 },
              livenessProbe: {
                httpGet: { path: '/healthz', port: 'health' },
                periodSeconds: 10,
                failureThreshold: 6,
              },
              env: [
                ...DOWNWARD_ENV,
                { name: 'NODE_OPTIONS', value: PROXY_NODE_OPTIONS },
                {
                  name: 'SEALION_BOOTSTRAP_TOKEN',
                  valueFrom: {
                    secretKeyRef: { name: `${AGENT_NAME}-bootstrap`, key: 'token', optional: true },
                  },
                },
              ],
              ...present({ resources: pod.resources }),
              securityContext: CONTAINER_SECURITY,
            },
          ],
        },
      },
    },
  };
}
