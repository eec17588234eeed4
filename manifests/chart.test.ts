// The charts' values as `sealion manifests --values` reads them: merged over the defaults as Helm merges, checked by
// the schema the charts carry. (integration/helm-chart.test.ts holds the real Helm, 4 and 3, to the same rendering.)
import { describe, expect, it } from '@jest/globals';
import { agentObjects, chartFiles, conciergeInstall, mergeValues } from './chart.ts';
import {
  CONCIERGE_TERMINATION_GRACE_SECONDS,
  conciergeManifests,
  DEFAULT_INSTALL,
  TERMINATION_GRACE_MARGIN_SECONDS,
} from './install.ts';

describe('values', () => {
  it('merge as Helm merges: maps key by key, lists whole, null removes a default', () => {
    expect(
      mergeValues({ a: { b: 1, c: [1, 2] }, d: 'x', e: { f: 1 } }, { a: { c: [3] }, d: null, e: { g: 2 } }),
    ).toEqual({ a: { b: 1, c: [3] }, e: { f: 1, g: 2 } });
  });

  it('left at their defaults, give the kustomize install but the ConfigMaps, which are written from them', () => {
    const fromValues = conciergeManifests(conciergeInstall({}));
    const plain = conciergeManifests(DEFAULT_INSTALL);
    const withoutConfig = (objects: Record<string, unknown>[]): unknown[] =>
      objects.filter((o) => o['kind'] !== 'ConfigMap');
    expect(withoutConfig(fromValues)).toEqual(withoutConfig(plain));
  });

  it('refuse what the schema or the policy rules refuse, naming the setting', () => {
    expect(() => conciergeInstall({ replicas: 'two' })).toThrow(/replicas/);
    expect(() => conciergeInstall({ forwardingPolicy: { identities: ['nodes'] } })).toThrow(/users/);
    expect(() => agentObjects({ cluster: { hubURL: 'http://plain.example' } })).toThrow(/hubURL/);
  });

  it("an agent's settings come only with a cluster's name", () => {
    const kinds = (objects: Record<string, unknown>[]): string[] => objects.map((o) => o['kind'] as string);
    expect(kinds(agentObjects({}))).not.toContain('Secret');
    expect(
      kinds(
        agentObjects({
          cluster: {
            name: 'edge',
            hubURL: 'https://hub.example',
            caPin: `sha256:${'a'.repeat(64)}`,
            bootstrapToken: 't',
          },
        }),
      ),
    ).toContain('Secret');
  });
});

describe('availability values', () => {
  const find = (objects: Record<string, unknown>[], kind: string): Record<string, Record<string, unknown>> =>
    objects.find((o) => o['kind'] === kind) as Record<string, Record<string, unknown>>;
  const podSpec = (deployment: Record<string, Record<string, unknown>>): Record<string, unknown> =>
    (deployment['spec']!['template'] as { spec: Record<string, unknown> }).spec;

  it('keep one replica evictable, and the spread can be turned off or replaced', () => {
    const one = conciergeManifests(conciergeInstall({ replicas: 1 }));
    expect(find(one, 'PodDisruptionBudget')['spec']).toMatchObject({ maxUnavailable: 1 });
    const none = conciergeManifests(conciergeInstall({ topologySpreadConstraints: null }));
    expect(podSpec(find(none, 'Deployment'))).not.toHaveProperty('topologySpreadConstraints');
    const zonesOnly = [
      { maxSkew: 1, topologyKey: 'topology.kubernetes.io/zone', whenUnsatisfiable: 'DoNotSchedule' },
    ];
    const own = conciergeManifests(conciergeInstall({ topologySpreadConstraints: zonesOnly }));
    expect(podSpec(find(own, 'Deployment'))['topologySpreadConstraints']).toEqual(zonesOnly);
    expect(() => conciergeInstall({ topologySpreadConstraints: 'zones' })).toThrow(
      /topologySpreadConstraints/,
    );
  });
});

describe('the shutdown delay and grace values', () => {
  interface PodSpec {
    containers: { args: string[] }[];
    terminationGracePeriodSeconds: number;
  }
  const podSpec = (objects: Record<string, unknown>[]): PodSpec =>
    (objects.find((o) => o['kind'] === 'Deployment') as { spec: { template: { spec: PodSpec } } }).spec
      .template.spec;
  const container = (objects: Record<string, unknown>[]): { args: string[] } =>
    podSpec(objects).containers[0]!;
  const grace = (objects: Record<string, unknown>[]): number =>
    podSpec(objects).terminationGracePeriodSeconds;

  it("set the concierge's --shutdown-delay and --shutdown-grace, and its termination grace holds both", () => {
    const short = conciergeManifests(conciergeInstall({ shutdownDelaySeconds: 2 }));
    expect(container(short).args).toContain('--shutdown-delay=2');
    expect(container(short).args).toContain('--shutdown-grace=30');
    expect(grace(short)).toBe(CONCIERGE_TERMINATION_GRACE_SECONDS - 13);
    const long = conciergeManifests(conciergeInstall({ shutdownDelaySeconds: 120 }));
    expect(grace(long)).toBe(CONCIERGE_TERMINATION_GRACE_SECONDS + 105);
    const both = conciergeManifests(conciergeInstall({ shutdownDelaySeconds: 3, shutdownGraceSeconds: 4 }));
    expect(container(both).args).toEqual(
      expect.arrayContaining(['--shutdown-delay=3', '--shutdown-grace=4']),
    );
    expect(grace(both)).toBe(3 + 4 + TERMINATION_GRACE_MARGIN_SECONDS);
    // Left alone, they are the install's defaults.
    expect(container(conciergeManifests(conciergeInstall({}))).args).toEqual(
      expect.arrayContaining(['--shutdown-delay=15', '--shutdown-grace=30']),
    );
  });

  it('are refused when they are no whole number of seconds from 0 to an hour', () => {
    for (const name of ['shutdownDelaySeconds', 'shutdownGraceSeconds']) {
      for (const bad of [-1, 1.5, '5', 3601, null])
        expect(() => conciergeInstall({ [name]: bad })).toThrow(new RegExp(name));
      expect(() => conciergeInstall({ [name]: 0 })).not.toThrow();
    }
  });
});

describe('the charts', () => {
  it("give the concierge's pods the drain's termination grace, as the kustomize install does", () => {
    const template = chartFiles('sealion-concierge').get('templates/deployment.yaml')!;
    // The delay and the grace are values; the margin is the install's, added by the template.
    expect(template).toContain(
      `terminationGracePeriodSeconds: {{ add $.Values.shutdownDelaySeconds $.Values.shutdownGraceSeconds ${TERMINATION_GRACE_MARGIN_SECONDS} | toJson }}\n`,
    );
    expect(template).toMatch(
      /"--shutdown-delay=" \(\$\.Values\.shutdownDelaySeconds\)[\s\S]*"--shutdown-grace=" \(\$\.Values\.shutdownGraceSeconds\)/,
    );
  });

  it('leave no stand-in behind, and write every value with toJson or toYaml', () => {
    for (const chart of ['sealion-concierge', 'sealion-agent'] as const)
      for (const [file, text] of chartFiles(chart)) {
        expect(`${file}: ${text}`).not.toMatch(/zzhole|zzmark/);
        // A value printed bare could be YAML of its own: every action in an object's field ends in toJson.
        for (const action of text.matchAll(/: (\{\{[^}]*\}\})$/gm))
          expect(`${file}: ${action[1]}`).toMatch(
            /(toJson|toJson \.) \}\}$|include "sealion\.policyRules" \$ \}\}$/,
          );
      }
  });
});
