import { describe, expect, it } from '@jest/globals';
import { crds } from './crds.ts';
import {
  DEFAULT_POLICY,
  forwardingRules,
  policyProblem,
  WORKLOAD_ACCESS,
  type ForwardingPolicy,
} from './forwarding-policy.ts';
import {
  agentManifests,
  agentSettingsManifests,
  CONCIERGE_TERMINATION_GRACE_SECONDS,
  conciergeManifests,
  DEFAULT_INSTALL,
  REACH_READ_RULES,
} from './install.ts';
import { AGENT_HEALTH_PORT, IMPERSONATOR_SERVICE_ACCOUNT } from '../apis/install.ts';

type Obj = {
  kind: string;
  apiVersion: string;
  metadata: { name: string; namespace?: string };
  [k: string]: unknown;
};
type Rule = {
  apiGroups?: string[];
  resources?: string[];
  verbs: string[];
  resourceNames?: string[];
  nonResourceURLs?: string[];
};

/** Whether `rules` grant `verb` on `resource` (with its subresource) in `group`, as RBAC matches them. */
function grants(rules: Rule[], verb: string, group: string, resource: string): boolean {
  const sub = resource.includes('/') ? resource.slice(resource.indexOf('/') + 1) : undefined;
  return rules.some(
    (r) =>
      (r.verbs.includes(verb) || r.verbs.includes('*')) &&
      (r.apiGroups ?? []).some((g) => g === '*' || g === group) &&
      (r.resources ?? []).some((x) => x === '*' || x === resource || (sub !== undefined && x === `*/${sub}`)),
  );
}
const isImpersonation = (verb: string): boolean =>
  verb.startsWith('impersonate:') || verb.startsWith('impersonate-on:');

describe('install manifests', () => {
  it("names Pinniped's exact groups under the pinniped.dev suffix", () => {
    const names = crds('pinniped.dev').map((c) => (c as Obj).metadata.name);
    expect(names).toEqual([
      'jwtauthenticators.authentication.concierge.pinniped.dev',
      'webhookauthenticators.authentication.concierge.pinniped.dev',
      'credentialissuers.config.concierge.pinniped.dev',
      'clusters.tunnel.concierge.pinniped.dev',
      'accessrequests.access.concierge.pinniped.dev',
    ]);
  });

  it('gives two installations no cluster-scoped name in common', () => {
    const a = conciergeManifests(DEFAULT_INSTALL) as Obj[];
    const b = conciergeManifests({
      ...DEFAULT_INSTALL,
      groupSuffix: 'pinniped.dev',
      namespace: 'pinniped-concierge',
    }) as Obj[];
    const clusterScoped = (objs: Obj[]): string[] =>
      objs.filter((o) => !o.metadata.namespace).map((o) => `${o.kind}/${o.metadata.name}`);
    const shared = clusterScoped(a).filter((n) => clusterScoped(b).includes(n));
    expect(shared).toEqual([]);
    // Namespaced objects live in the installation's namespace, but for the bindings that let it read what the API
    // server publishes elsewhere (the front proxy's settings, cluster-info), which carry the namespace in their names.
    for (const o of b.filter((o) => o.metadata.namespace && o.metadata.namespace !== 'pinniped-concierge')) {
      expect([o.metadata.namespace, o.kind, o.metadata.name.startsWith('pinniped-concierge-')]).toEqual([
        expect.stringMatching(/^kube-(system|public)$/),
        expect.stringMatching(/^(Role|RoleBinding)$/),
        true,
      ]);
    }
    const inKubeNamespaces = (objs: Obj[]): string[] =>
      objs
        .filter((o) => o.metadata.namespace?.startsWith('kube-'))
        .map((o) => `${o.kind}/${o.metadata.name}`);
    expect(inKubeNamespaces(a).filter((n) => inKubeNamespaces(b).includes(n))).toEqual([]);
  });

  it('lets the forwarding identity do nothing but impersonate', () => {
    const objs = conciergeManifests(DEFAULT_INSTALL) as Obj[];
    const binding = objs.find(
      (o) =>
        o.kind === 'ClusterRoleBinding' &&
        (o['subjects'] as { name: string }[])[0]?.name === IMPERSONATOR_SERVICE_ACCOUNT,
    );
    const role = objs.find(
      (o) => o.kind === 'ClusterRole' && o.metadata.name === (binding?.['roleRef'] as { name: string }).name,
    );
    const verbs = new Set((role?.['rules'] as Rule[]).flatMap((r) => r.verbs));
    // Constrained impersonation only: never the legacy verb, which could impersonate system:masters.
    expect([...verbs].every(isImpersonation)).toBe(true);
    expect(verbs).toContain('impersonate:user-info');
    // And it is bound nowhere else.
    const bound = objs.filter((o) =>
      (o['subjects'] as { name: string }[] | undefined)?.some((s) => s.name === IMPERSONATOR_SERVICE_ACCOUNT),
    );
    expect(bound).toHaveLength(1);
  });

  it('lets the concierge mint tokens only for the forwarding identity, and read no Secrets cluster-wide', () => {
    const objs = conciergeManifests(DEFAULT_INSTALL) as Obj[];
    const rules = objs
      .filter((o) => o.kind === 'Role' || o.kind === 'ClusterRole')
      .flatMap((o) => o['rules'] as Rule[]);
    const tokenRule = rules.find((r) => r.resources?.includes('serviceaccounts/token'));
    expect(tokenRule?.resourceNames).toEqual([IMPERSONATOR_SERVICE_ACCOUNT]);
    const clusterRules = objs.filter((o) => o.kind === 'ClusterRole').flatMap((o) => o['rules'] as Rule[]);
    expect(
      clusterRules.some(
        (r) =>
          r.resources?.includes('secrets') ||
          r.verbs.includes('*') ||
          // Wildcards only in impersonation: what the forwarding identity may impersonate, and do while it does.
          ((r.resources?.includes('*') || r.nonResourceURLs?.includes('*')) &&
            !r.verbs.every(isImpersonation)),
      ),
    ).toBe(false);
  });

  it('runs the agent without rights outside reviews, reading what reach dials, its settings and its credentials Secret', () => {
    const objs = agentManifests(DEFAULT_INSTALL) as Obj[];
    const rules = objs
      .filter((o) => o.kind === 'Role' || o.kind === 'ClusterRole')
      .flatMap((o) => o['rules'] as Rule[]);
    for (const rule of rules) {
      if (rule.resources?.includes('secrets')) {
        expect(rule.verbs.includes('create') || rule.resourceNames?.length === 1).toBe(true);
        expect(rule.verbs).not.toContain('list');
      } else if (rule.resources?.includes('configmaps')) {
        // Its own ConfigMap, read only.
        expect(rule).toMatchObject({ verbs: ['get'], resourceNames: ['sealion-agent-config'] });
      } else if (rule.apiGroups?.includes('authorization.k8s.io')) {
        // Asking its cluster whether a user may do something; forwarding comes with its policy (its settings).
        expect(rule).toEqual({
          apiGroups: ['authorization.k8s.io'],
          resources: ['subjectaccessreviews'],
          verbs: ['create'],
        });
      } else {
        // Finding the address of what a reach connection names: reads, never a list of pods or Services.
        expect(REACH_READ_RULES).toContainEqual(rule);
        expect(rule.verbs).not.toContain('watch');
      }
    }
  });

  const settings = { clusterName: 'edge', hubURL: 'https://hub', caPin: 'sha256:00', bootstrapToken: 't' };
  const policy = (more: Partial<ForwardingPolicy>): ForwardingPolicy => ({ ...DEFAULT_POLICY, ...more });
  const agentRules = (p: ForwardingPolicy): Rule[] =>
    (agentSettingsManifests({ ...settings, policy: p }) as Obj[])
      .filter((o) => o.kind === 'ClusterRole')
      .flatMap((o) => o['rules'] as Rule[]);

  it.each<[string, ForwardingPolicy, Record<string, boolean>]>([
    [
      'full',
      policy({}),
      {
        'create pods/exec': true,
        'get pods/exec': true,
        'patch pods/ephemeralcontainers': true,
        'create configmaps': true,
        'get widgets': true,
      },
    ],
    [
      'no-exec',
      policy({ name: 'no-exec' }),
      {
        'create pods/exec': false,
        'get pods/exec': false,
        // kubectl debug: a command of the caller's in a running pod, beside (and sharing processes with) its containers.
        'patch pods/ephemeralcontainers': false,
        'update pods/ephemeralcontainers': false,
        'create configmaps': true,
        // What no-exec still allows, as the README says: pods run what they are created with, and logs are reads.
        'create pods': true,
        'get pods/log': true,
        'list widgets': false,
      },
    ],
    [
      'read-only',
      policy({ name: 'read-only' }),
      {
        'get pods': true,
        'watch pods': true,
        'get pods/exec': false,
        'create configmaps': false,
        'delete pods': false,
        'get secrets': true,
        'get pods/log': true,
      },
    ],
  ])("renders the agent's %s policy so that its cluster's RBAC enforces it", (_name, p, wanted) => {
    const rules = agentRules(p);
    for (const [what, allowed] of Object.entries(wanted)) {
      const [verb, resource] = what.split(' ') as [string, string];
      const group = resource === 'widgets' ? 'example.com' : '';
      expect([what, grants(rules, `impersonate-on:user-info:${verb}`, group, resource)]).toEqual([
        what,
        allowed,
      ]);
    }
    // Users only, in the constrained mode: service accounts, nodes and system:masters are refused by the API server.
    expect(rules.flatMap((r) => r.verbs).every(isImpersonation)).toBe(true);
    expect(rules.some((r) => r.verbs.some((v) => /serviceaccount|node/.test(v)))).toBe(false);
  });

  it('never grants what reaches into workloads under read-only or no-exec, for any verb', () => {
    for (const name of ['read-only', 'no-exec'] as const) {
      const rules = agentRules(policy({ name, apiGroups: ['example.com'] }));
      for (const resource of WORKLOAD_ACCESS)
        // List and watch too: the API server reads `pods//exec?fieldSelector=metadata.name=x` as a list of pods/exec.
        for (const verb of ['get', 'list', 'watch', 'create', 'update', 'patch', 'delete'])
          expect([
            name,
            resource,
            verb,
            grants(rules, `impersonate-on:user-info:${verb}`, '', resource),
          ]).toEqual([name, resource, verb, false]);
      expect(grants(rules, 'impersonate-on:user-info:get', 'example.com', 'widgets')).toBe(true);
    }
  });

  it('adds service accounts and nodes only when the policy lists them', () => {
    const rules = forwardingRules(policy({ identities: ['users', 'serviceaccounts'] }))!;
    expect(grants(rules, 'impersonate:serviceaccount', 'authentication.k8s.io', 'serviceaccounts')).toBe(
      true,
    );
    expect(grants(rules, 'impersonate-on:serviceaccount:get', '', 'pods')).toBe(true);
    expect(grants(rules, 'impersonate:arbitrary-node', 'authentication.k8s.io', 'nodes')).toBe(false);
  });

  it("binds an admin's own ClusterRole as it is, and renders legacy impersonation for full only", () => {
    const objs = agentSettingsManifests({
      ...settings,
      policy: policy({ name: 'clusterrole:edge-sealion' }),
    }) as Obj[];
    expect(objs.filter((o) => o.kind === 'ClusterRole')).toEqual([]);
    expect(objs.find((o) => o.kind === 'ClusterRoleBinding')?.['roleRef']).toMatchObject({
      kind: 'ClusterRole',
      name: 'edge-sealion',
    });
    expect(policyProblem(policy({ name: 'read-only', legacy: true }))).toContain('only the full policy');
    expect(policyProblem(policy({ name: 'clusterrole:' }))).toContain('must be one of');
    expect(policyProblem(policy({ identities: ['serviceaccounts'] }))).toContain('users are always');
    expect(
      policyProblem(policy({ name: 'no-exec', identities: ['users', 'nodes'], apiGroups: ['example.com'] })),
    ).toBeUndefined();
  });
});

describe('availability during drains and rollouts', () => {
  type Spec = Record<string, unknown>;
  const spec = (o: Obj | undefined): Spec => (o?.['spec'] ?? {}) as Spec;
  const podLabels = (deployment: Obj): Record<string, string> =>
    ((spec(deployment)['template'] as Spec)['metadata'] as { labels: Record<string, string> }).labels;
  const podSpec = (deployment: Obj): Spec => (spec(deployment)['template'] as Spec)['spec'] as Spec;
  const selects = (selector: Spec, labels: Record<string, string>): boolean =>
    Object.entries(selector['matchLabels'] as Record<string, string>).every(([k, v]) => labels[k] === v);
  const concierge = conciergeManifests(DEFAULT_INSTALL) as Obj[];
  const deployment = concierge.find((o) => o.kind === 'Deployment')!;

  it("lets voluntary disruptions take one concierge replica at a time, and never the last one's drain", () => {
    const budgets = concierge.filter((o) => o.kind === 'PodDisruptionBudget');
    expect(budgets).toHaveLength(1);
    const budget = spec(budgets[0]);
    // maxUnavailable, not minAvailable: with one replica, a drain may still evict it.
    expect(budget).toEqual({
      maxUnavailable: 1,
      selector: spec(deployment)['selector'],
      unhealthyPodEvictionPolicy: 'AlwaysAllow',
    });
    expect(selects(budget['selector'] as Spec, podLabels(deployment))).toBe(true);
    expect(budgets[0]?.metadata.namespace).toBe(DEFAULT_INSTALL.namespace);
  });

  it('rolls the concierge and the agent out by starting a new pod before stopping an old one', () => {
    const agent = (agentManifests(DEFAULT_INSTALL) as Obj[]).find((o) => o.kind === 'Deployment')!;
    for (const d of [deployment, agent])
      expect(spec(d)['strategy']).toEqual({
        type: 'RollingUpdate',
        rollingUpdate: { maxUnavailable: 0, maxSurge: 1 },
      });
    // The agent is one replica holding two tunnels: a budget would guard nothing or block every drain.
    expect(spec(agent)['replicas']).toBe(1);
    expect((agentManifests(DEFAULT_INSTALL) as Obj[]).map((o) => o.kind)).not.toContain(
      'PodDisruptionBudget',
    );
  });

  it("gives the concierge's drain its whole time before the kubelet kills it: delay + grace + a margin", () => {
    const container = (podSpec(deployment)['containers'] as Spec[])[0]!;
    const flag = (name: string): number =>
      Number((container['args'] as string[]).find((a) => a.startsWith(`--${name}=`))!.split('=')[1]);
    const budget = podSpec(deployment)['terminationGracePeriodSeconds'] as number;
    expect(budget).toBe(CONCIERGE_TERMINATION_GRACE_SECONDS);
    expect(flag('shutdown-delay') + flag('shutdown-grace')).toBeLessThan(budget - 10);
  });

  it("spreads the concierge's replicas over nodes and zones without ever leaving one unscheduled", () => {
    const spread = podSpec(deployment)['topologySpreadConstraints'] as Spec[];
    expect(spread.map((c) => c['topologyKey'])).toEqual([
      'kubernetes.io/hostname',
      'topology.kubernetes.io/zone',
    ]);
    for (const constraint of spread) {
      expect(constraint).toMatchObject({
        maxSkew: 1,
        whenUnsatisfiable: 'ScheduleAnyway',
        matchLabelKeys: ['pod-template-hash'],
      });
      expect(selects(constraint['labelSelector'] as Spec, podLabels(deployment))).toBe(true);
    }
    // The spread replaces the node anti-affinity it would duplicate.
    expect(podSpec(deployment)['affinity']).toBeUndefined();
  });

  it('probes the agent on its health port: ready only while a tunnel is up, which a rollout waits for', () => {
    const agent = (agentManifests(DEFAULT_INSTALL) as Obj[]).find((o) => o.kind === 'Deployment')!;
    const [container] = podSpec(agent)['containers'] as Spec[];
    // The flag turns the port on, at the address the probes name (agent/health.ts answers them).
    expect(container!['args']).toContain(`--health-listen=0.0.0.0:${AGENT_HEALTH_PORT}`);
    expect(container!['ports']).toEqual([
      { name: 'health', containerPort: AGENT_HEALTH_PORT, protocol: 'TCP' },
    ]);
    expect(container!['readinessProbe']).toMatchObject({ httpGet: { path: '/readyz', port: 'health' } });
    expect(container!['livenessProbe']).toMatchObject({ httpGet: { path: '/healthz', port: 'health' } });
  });
});
