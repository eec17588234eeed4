// What a forwarding identity may do: the RBAC of the identity the hub forwards requests as (the concierge's
// impersonator on the hub, the agent on every other cluster). Sealion decides who a request is for; this decides,
// on each cluster and enforced by that cluster's API server, what Sealion may do there at all. A compromised hub, or
// a bug in Sealion, gets no further than this.
//
// It is written with constrained impersonation (KEP-5284, on by default from Kubernetes 1.36):
// `impersonate:<mode>` on the identities, and `impersonate-on:<mode>:<verb>` on what the request does. What that
// guarantees, enforced by the API server whatever Sealion sends:
// - never `system:masters`: no constrained mode impersonates that group;
// - service accounts and nodes only when the policy lists them (`identities`): the user-info mode refuses their
//   names, and their own modes take a username alone, with the groups the API server gives it;
// - the verbs and resources of the policy only.
// What it cannot guarantee: RBAC has no "every group but X", so user-info may impersonate any other group (and any
// user), including groups an RBAC binding trusts; a ClusterRole of the admin's own (`clusterrole:NAME`) can name the
// users and groups allowed instead (resourceNames on users and groups), an allowlist. And RBAC has no "every
// resource but pods/exec": read-only and no-exec name the built-in resources of the pinned Kubernetes release one by
// one, and grant custom resources only for the API groups they are given (`apiGroups`), for every verb: list and
// watch reach subresources too.
//
// Clusters older than 1.36 (or with the feature gate off) know only the legacy `impersonate` verb: `legacy` renders
// that, which can impersonate anyone, system:masters included, for anything; only `full` can be rendered so.

/** The policies an admin picks from, and a ClusterRole of their own. */
export const POLICY_NAMES = ['read-only', 'no-exec', 'full'] as const;
export type PolicyName = (typeof POLICY_NAMES)[number];

/** Who the forwarding identity may act as, besides users: constrained modes that are off unless listed. */
export const IDENTITY_KINDS = ['users', 'serviceaccounts', 'nodes'] as const;
export type IdentityKind = (typeof IDENTITY_KINDS)[number];

export interface ForwardingPolicy {
  /** A built-in policy, or `clusterrole:<name>`: the admin's own ClusterRole, bound as it is. */
  name: PolicyName | `clusterrole:${string}`;
  /** Identity kinds the forwarding identity may act as. Default: users only. */
  identities: IdentityKind[];
  /** API groups of custom resources that read-only and no-exec cover too. Default: none. */
  apiGroups: string[];
  /** Render the legacy `impersonate` verb, for clusters without constrained impersonation. Default: false. */
  legacy: boolean;
}

export const DEFAULT_POLICY: ForwardingPolicy = {
  name: 'full',
  identities: ['users'],
  apiGroups: [],
  legacy: false,
};

/** An RBAC PolicyRule. */
export interface PolicyRule {
  apiGroups?: string[];
  resources?: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
  verbs: string[];
}

/** The verbs a resource request is authorized as (the API server's RequestInfo), each needing its own grant. */
const RESOURCE_VERBS = ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete', 'deletecollection'];
/** A non-resource request's verb is its lower-cased method. */
const NON_RESOURCE_VERBS = ['get', 'head', 'post', 'put', 'patch', 'delete', 'options'];
const READ_VERBS = ['get', 'list', 'watch'];
const NON_RESOURCE_READ_VERBS = ['get', 'head'];
/**
 * What reaches into running workloads and nodes: a shell, a stream, a port, a proxy into the cluster's network, and
 * an ephemeral container, which runs a command of the caller's inside a running pod (`kubectl debug --target`
 * shares the target's processes, so its files and mounted secrets too) and is then read with pods/log or attach.
 */
export const WORKLOAD_ACCESS = [
  'pods/exec',
  'pods/attach',
  'pods/portforward',
  'pods/proxy',
  'pods/ephemeralcontainers',
  'services/proxy',
  'nodes/proxy',
] as const;

/**
 * The core group's resources and subresources at the pinned release (Kubernetes 1.36), but WORKLOAD_ACCESS. A test
 * compares it with a real API server's discovery, so a new release that adds one is noticed.
 */
export const CORE_RESOURCES = [
  'bindings',
  'componentstatuses',
  'configmaps',
  'endpoints',
  'events',
  'limitranges',
  'namespaces',
  'namespaces/finalize',
  'namespaces/status',
  'nodes',
  'nodes/status',
  'persistentvolumeclaims',
  'persistentvolumeclaims/status',
  'persistentvolumes',
  'persistentvolumes/status',
  'pods',
  'pods/binding',
  'pods/eviction',
  'pods/log',
  'pods/resize',
  'pods/status',
  'podtemplates',
  'replicationcontrollers',
  'replicationcontrollers/scale',
  'replicationcontrollers/status',
  'resourcequotas',
  'resourcequotas/status',
  'secrets',
  'serviceaccounts',
  'serviceaccounts/token',
  'services',
  'services/status',
];

/**
 * The built-in API groups besides the core group at the pinned release; none has a subresource that reaches into a
 * workload, so each is granted whole. A test compares it with a real API server's discovery.
 */
export const BUILTIN_GROUPS = [
  'admissionregistration.k8s.io',
  'apiextensions.k8s.io',
  'apiregistration.k8s.io',
  'apps',
  'authentication.k8s.io',
  'authorization.k8s.io',
  'autoscaling',
  'batch',
  'certificates.k8s.io',
  'coordination.k8s.io',
  'discovery.k8s.io',
  'events.k8s.io',
  'flowcontrol.apiserver.k8s.io',
  'networking.k8s.io',
  'node.k8s.io',
  'policy',
  'rbac.authorization.k8s.io',
  'resource.k8s.io',
  'scheduling.k8s.io',
  'storage.k8s.io',
];

/** The constrained mode each identity kind is impersonated in. */
const MODES: Record<IdentityKind, string> = {
  users: 'user-info',
  serviceaccounts: 'serviceaccount',
  nodes: 'arbitrary-node',
};

/** A problem with a policy written as text (`--policy`), or undefined. */
export function policyProblem(policy: ForwardingPolicy): string | undefined {
  if (!(POLICY_NAMES as readonly string[]).includes(policy.name)) {
    const role = policy.name.startsWith('clusterrole:') ? policy.name.slice('clusterrole:'.length) : '';
    if (!/^[a-z0-9]([-a-z0-9.:]*[a-z0-9])?$/.test(role))
      return `policy ${JSON.stringify(policy.name)}: must be one of ${POLICY_NAMES.join(', ')}, or clusterrole:<name>`;
  }
  for (const kind of policy.identities)
    if (!(IDENTITY_KINDS as readonly string[]).includes(kind))
      return `identities: ${JSON.stringify(kind)} is not one of ${IDENTITY_KINDS.join(', ')}`;
  if (!policy.identities.includes('users')) return 'identities: users are always among them';
  for (const group of policy.apiGroups)
    if (!/^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/.test(group) || !group.includes('.'))
      return `apiGroups: ${JSON.stringify(group)} is not an API group of custom resources`;
  if (policy.legacy && policy.name !== 'full')
    return 'legacy impersonation cannot limit verbs or resources: only the full policy can be rendered with it';
  return undefined;
}

/** The rules granting `verbs` of a policy's scope in one mode. */
function scopeRules(name: PolicyName, mode: string, extraGroups: string[]): PolicyRule[] {
  const on = (verbs: string[]): string[] => verbs.map((v) => `impersonate-on:${mode}:${v}`);
  if (name === 'full')
    return [
      { apiGroups: ['*'], resources: ['*'], verbs: on(RESOURCE_VERBS) },
      { nonResourceURLs: ['*'], verbs: on(NON_RESOURCE_VERBS) },
    ];
  // Every verb by name, list and watch too: a list can name a subresource (`pods//exec` with a field selector
  // naming the pod is a list of pods/exec to the API server's request parsing), so no verb is safe on `*`.
  const verbs = on(name === 'read-only' ? READ_VERBS : RESOURCE_VERBS);
  return [
    { apiGroups: [''], resources: CORE_RESOURCES, verbs },
    { apiGroups: [...BUILTIN_GROUPS, ...extraGroups], resources: ['*'], verbs },
    {
      nonResourceURLs: ['*'],
      verbs: on(name === 'read-only' ? NON_RESOURCE_READ_VERBS : NON_RESOURCE_VERBS),
    },
  ];
}

/**
 * The ClusterRole rules of a built-in policy: impersonating each identity kind it lists, and doing what the policy
 * allows while doing so. Undefined for `clusterrole:<name>`, which is the admin's to write.
 */
export function forwardingRules(policy: ForwardingPolicy): PolicyRule[] | undefined {
  if (policy.legacy)
    return [
      { apiGroups: [''], resources: ['users', 'groups', 'serviceaccounts'], verbs: ['impersonate'] },
      // RBAC matches `*/subresource` but not `resource/*`, so userextras/<key> for every key needs `*` here; within
      // authentication.k8s.io that adds only uids, and only for impersonation.
      { apiGroups: ['authentication.k8s.io'], resources: ['*'], verbs: ['impersonate'] },
    ];
  if (policy.name.startsWith('clusterrole:')) return undefined;
  const name = policy.name as PolicyName;
  const identities: Record<IdentityKind, PolicyRule> = {
    // users, groups, uids and userextras/<key>: `*`, as above; the verb itself only applies to those four.
    users: { apiGroups: ['authentication.k8s.io'], resources: ['*'], verbs: ['impersonate:user-info'] },
    serviceaccounts: {
      apiGroups: ['authentication.k8s.io'],
      resources: ['serviceaccounts'],
      verbs: ['impersonate:serviceaccount'],
    },
    nodes: {
      apiGroups: ['authentication.k8s.io'],
      resources: ['nodes'],
      verbs: ['impersonate:arbitrary-node'],
    },
  };
  return policy.identities.flatMap((kind) => [
    identities[kind],
    ...scopeRules(name, MODES[kind], policy.apiGroups),
  ]);
}

/** A policy from its flags (`--policy`, `--identities`, `--api-groups`, `--legacy-impersonation`); throws on a problem. */
export function parsePolicy(flags: {
  policy?: string;
  identities?: string;
  apiGroups?: string;
  legacyImpersonation?: boolean;
}): ForwardingPolicy {
  const list = (text: string | undefined): string[] =>
    (text ?? '')
      .split(',')
      .map((s) => s.trim())
      .filter(Boolean);
  const identities = list(flags.identities);
  const policy: ForwardingPolicy = {
    name: (flags.policy || DEFAULT_POLICY.name) as ForwardingPolicy['name'],
    identities: (identities.length > 0 ? identities : DEFAULT_POLICY.identities) as IdentityKind[],
    apiGroups: list(flags.apiGroups),
    legacy: flags.legacyImpersonation === true,
  };
  const problem = policyProblem(policy);
  if (problem) throw new Error(problem);
  return policy;
}

/** The policy as one line of text, as the agent reports it and `kubectl get clusters -o wide` shows it. */
export function describePolicy(policy: ForwardingPolicy): string {
  const more = [
    ...(policy.identities.length > 1 ? [`+${policy.identities.filter((k) => k !== 'users').join('+')}`] : []),
    ...(policy.apiGroups.length > 0 ? [`(+${policy.apiGroups.join(',')})`] : []),
    ...(policy.legacy ? ['(legacy)'] : []),
  ];
  return `${policy.name}${more.join('')}`;
}
