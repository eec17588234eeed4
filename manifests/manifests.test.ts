import { describe, expect, it } from '@jest/globals';
import { crds } from './crds.ts';
import {
  agentManifests,
  conciergeManifests,
  DEFAULT_INSTALL,
  IMPERSONATOR_SERVICE_ACCOUNT,
} from './install.ts';

type Obj = {
  kind: string;
  apiVersion: string;
  metadata: { name: string; namespace?: string };
  [k: string]: unknown;
};
type Rule = { apiGroups: string[]; resources: string[]; verbs: string[]; resourceNames?: string[] };

describe('install manifests', () => {
  it("names Pinniped's exact groups under the pinniped.dev suffix", () => {
    const names = crds('pinniped.dev').map((c) => (c as Obj).metadata.name);
    expect(names).toEqual([
      'jwtauthenticators.authentication.concierge.pinniped.dev',
      'webhookauthenticators.authentication.concierge.pinniped.dev',
      'credentialissuers.config.concierge.pinniped.dev',
      'clusters.tunnel.concierge.pinniped.dev',
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
    expect(
      b.filter((o) => o.metadata.namespace).every((o) => o.metadata.namespace === 'pinniped-concierge'),
    ).toBe(true);
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
    expect([...verbs]).toEqual(['impersonate']);
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
    const tokenRule = rules.find((r) => r.resources.includes('serviceaccounts/token'));
    expect(tokenRule?.resourceNames).toEqual([IMPERSONATOR_SERVICE_ACCOUNT]);
    const clusterRules = objs.filter((o) => o.kind === 'ClusterRole').flatMap((o) => o['rules'] as Rule[]);
    expect(
      clusterRules.some(
        (r) =>
          r.resources.includes('secrets') ||
          r.verbs.includes('*') ||
          // The one wildcard: every userextras/<key> to impersonate, which RBAC cannot name otherwise.
          (r.resources.includes('*') &&
            !(r.verbs.join() === 'impersonate' && r.apiGroups.join() === 'authentication.k8s.io')),
      ),
    ).toBe(false);
  });

  it('runs the agent without rights outside impersonation, its settings and its own credentials Secret', () => {
    const objs = agentManifests(DEFAULT_INSTALL) as Obj[];
    const rules = objs
      .filter((o) => o.kind === 'Role' || o.kind === 'ClusterRole')
      .flatMap((o) => o['rules'] as Rule[]);
    for (const rule of rules) {
      if (rule.resources.includes('secrets')) {
        expect(rule.verbs.includes('create') || rule.resourceNames?.length === 1).toBe(true);
        expect(rule.verbs).not.toContain('list');
      } else if (rule.resources.includes('configmaps')) {
        // Its own ConfigMap, read only.
        expect(rule).toMatchObject({ verbs: ['get'], resourceNames: ['sealion-agent-config'] });
      } else {
        expect(rule.verbs).toEqual(['impersonate']);
      }
    }
  });
});
