// The Helm charts against the kustomize install, with the real Helm (built from its Go module) and kubectl's
// kustomize: for each set of values, `helm template` and `sealion manifests --values` (written as kustomize folders,
// then `kubectl kustomize`) give the same objects. Both render install.ts, so a row that differs is a template that
// says something else than the code it came from. Every row runs with Helm 4 and with Helm 3, which most clusters are
// still driven by: the charts lint, render the same objects and refuse the same values with both.
import { beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parseAllDocuments, stringify } from 'yaml';
import { ensureBinaries, ensureHelm, HELM_MAJORS, REPO_ROOT, type HelmMajor } from '../dev/build.ts';
import { KEEP_ANNOTATION } from '../manifests/chart.ts';

const run = promisify(execFile);
type Obj = Record<string, unknown>;
const CHARTS = join(REPO_ROOT, 'config/charts');
/** The ConfigMap keys that hold YAML: compared as what they say, since Helm's toYaml writes it its own way. */
const YAML_DATA = new Set(['config.yaml', 'policy.yaml']);

/** The helm command of each major. */
const helms = new Map<HelmMajor, string>();
let kubectl: string;
let scratch: string;

beforeAll(async () => {
  ({ kubectl } = await ensureBinaries());
  // One after the other: two Go builds on two cores only slow each other down.
  for (const major of HELM_MAJORS) helms.set(major, await ensureHelm(() => {}, major));
  scratch = mkdtempSync(join(tmpdir(), 'sealion-helm-chart-'));
  return () => rmSync(scratch, { recursive: true, force: true });
}, 1_200_000);

/** Runs `helm` of `major`. */
const helm = (major: HelmMajor, args: string[]): Promise<{ stdout: string; stderr: string }> =>
  run(helms.get(major)!, args, { encoding: 'utf8', maxBuffer: 64 << 20 });

let rows = 0;
/** A values file: an object written as YAML, or YAML text as a person wrote it. */
function valuesFile(values: Obj | string): string {
  const file = join(scratch, `values-${rows++}.yaml`);
  writeFileSync(file, typeof values === 'string' ? values : stringify(values));
  return file;
}

/** Objects by kind/namespace/name, as an API server would hold them apart. */
function byIdentity(yaml: string, { helmOnly }: { helmOnly: boolean }): Map<string, Obj> {
  const out = new Map<string, Obj>();
  for (const doc of parseAllDocuments(yaml)) {
    const obj = doc.toJS() as Obj | null;
    if (!obj) continue;
    const metadata = obj['metadata'] as { name: string; namespace?: string; annotations?: Obj };
    if (helmOnly && metadata.annotations) {
      for (const key of Object.keys(KEEP_ANNOTATION)) delete metadata.annotations[key];
      if (Object.keys(metadata.annotations).length === 0) delete metadata.annotations;
    }
    // Helm installs into a namespace it is told to make (--create-namespace); kustomize makes it.
    if (obj['kind'] === 'Namespace') continue;
    if (obj['kind'] === 'ConfigMap') {
      const data = obj['data'] as Record<string, string>;
      for (const key of Object.keys(data))
        if (YAML_DATA.has(key)) data[key] = parseAllDocuments(data[key]!)[0]!.toJS() as never;
    }
    const id = `${obj['kind'] as string}/${metadata.namespace ?? ''}/${metadata.name}`;
    if (out.has(id)) throw new Error(`${id} twice`);
    out.set(id, obj);
  }
  return out;
}

/** What each Helm major's `helm template` makes of `chart` with `values`, by Helm major. */
async function helmTemplates(
  chart: string,
  namespace: string,
  values: Obj | string,
): Promise<Map<HelmMajor, Map<string, Obj>>> {
  const file = valuesFile(values);
  const rendered = await Promise.all(
    HELM_MAJORS.map(async (major) => {
      const args = ['template', 'x', join(CHARTS, chart), '--namespace', namespace, '-f', file];
      const { stdout } = await helm(major, args);
      return [major, byIdentity(stdout, { helmOnly: true })] as const;
    }),
  );
  return new Map(rendered);
}

async function kustomize(
  component: 'concierge' | 'agent',
  namespace: string,
  values: Obj | string,
): Promise<Map<string, Obj>> {
  const dir = mkdtempSync(join(scratch, 'out-'));
  const flag = component === 'agent' ? '--agent-namespace' : '--namespace';
  await run(process.execPath, [
    join(REPO_ROOT, 'bin/sealion.js'),
    'manifests',
    component,
    flag,
    namespace,
    '--values',
    valuesFile(values),
    '--output-dir',
    dir,
  ]);
  const { stdout } = await run(kubectl, ['kustomize', join(dir, component)], { maxBuffer: 64 << 20 });
  return byIdentity(stdout, { helmOnly: false });
}

/** Every Helm major's objects are kustomize's. */
function expectSame(byHelm: Map<HelmMajor, Map<string, Obj>>, kustomizeObjects: Map<string, Obj>): void {
  expect([...byHelm.keys()]).toEqual([...HELM_MAJORS]);
  for (const [major, helmObjects] of byHelm) {
    expect({ helm: major, ids: [...helmObjects.keys()].sort() }).toEqual({
      helm: major,
      ids: [...kustomizeObjects.keys()].sort(),
    });
    for (const [id, obj] of helmObjects)
      expect({ helm: major, id, obj }).toEqual({ helm: major, id, obj: kustomizeObjects.get(id) });
  }
}

const CONCIERGE_ROWS: [string, string, Obj | string][] = [
  ['the defaults', 'sealion-concierge', {}],
  [
    "Pinniped's groups, every pod and Service setting, a policy with custom resources, and a config of one's own",
    'pinniped-concierge',
    {
      groupSuffix: 'pinniped.dev',
      image: 'registry.example.com/sealion@sha256:' + 'a'.repeat(64),
      imagePullPolicy: 'Always',
      imagePullSecrets: [{ name: 'my-registry' }],
      replicas: 3,
      shutdownDelaySeconds: 5,
      shutdownGraceSeconds: 7,
      resources: { requests: { cpu: '1', memory: '1Gi' } },
      nodeSelector: { 'kubernetes.io/os': 'linux', 'example.com/pool': 'gateways' },
      tolerations: [{ key: 'dedicated', operator: 'Equal', value: 'gateway', effect: 'NoSchedule' }],
      affinity: null,
      topologySpreadConstraints: [
        { maxSkew: 1, topologyKey: 'topology.kubernetes.io/zone', whenUnsatisfiable: 'DoNotSchedule' },
      ],
      priorityClassName: 'system-cluster-critical',
      services: {
        tunnel: {
          type: 'LoadBalancer',
          annotations: { 'service.beta.kubernetes.io/aws-load-balancer-type': 'nlb' },
        },
        proxy: { annotations: { 'example.com/note': 'a: "quoted" value\nwith a newline' } },
      },
      forwardingPolicy: {
        name: 'no-exec',
        identities: ['users', 'serviceaccounts'],
        apiGroups: ['example.com', 'x.y.z'],
      },
      config: { impersonationProxy: { mode: 'disabled' }, kubeCertAgent: { mode: 'enabled' } },
      auditPolicy: { apiVersion: 'audit.k8s.io/v1', kind: 'Policy', rules: [{ level: 'RequestResponse' }] },
    },
  ],
  [
    "an admin's own ClusterRole",
    'sealion-concierge',
    { forwardingPolicy: { name: 'clusterrole:my-forwarding' } },
  ],
  [
    // Helm reads values as YAML 1.1 (off is false, 022 is 18), and so must the kustomize way; strings that either
    // YAML would read as something else are written quoted.
    'values a person wrote, with words and numbers YAML 1.1 reads its own way',
    'sealion-concierge',
    `config:
  ssh:
    mode: off
    port: 022
  impersonationProxy:
    service:
      annotations: {y: yes, n: "no", octal: "0o17", binary: "0b11", under: "1_0"}
nodeSelector: {on: "on", "0b11": "0x1F"}
services:
  tunnel:
    annotations: {example.com/flag: "true", example.com/count: "1e3"}
affinity: {nodeAffinity: null}
topologySpreadConstraints: null
`,
  ],
  [
    'the legacy verb',
    'sealion-concierge',
    { forwardingPolicy: { legacy: true, identities: ['users', 'nodes'] } },
  ],
  ...(['read-only', 'no-exec', 'full'] as const).flatMap((name) =>
    [['users'], ['users', 'nodes'], ['nodes', 'users', 'serviceaccounts']].map(
      (identities): [string, string, Obj] => [
        `${name} for ${identities.join(', ')}`,
        'sealion-concierge',
        { forwardingPolicy: { name, identities } },
      ],
    ),
  ),
];

const AGENT_ROWS: [string, string, Obj | string][] = [
  ['the defaults (settings applied apart)', 'sealion-agent', {}],
  [
    "a cluster's settings, with a read-only policy and pod settings",
    'edge-agent',
    {
      cluster: {
        name: 'edge-1',
        hubURL: 'https://hub.example.com:8444',
        caPin: `sha256:${'0123456789abcdef'.repeat(4)}`,
        bootstrapToken: 'abcdef.0123456789abcdef',
      },
      forwardingPolicy: { name: 'read-only', identities: ['users', 'nodes'], apiGroups: ['example.com'] },
      nodeSelector: { 'kubernetes.io/os': 'linux' },
      resources: null,
    },
  ],
  [
    'a cluster named like a YAML 1.1 boolean, and a token like a number',
    'sealion-agent',
    `cluster: {name: "yes", hubURL: "https://hub.example", caPin: "sha256:${'0'.repeat(64)}", bootstrapToken: "0b101"}
affinity: {podAffinity: null}
`,
  ],
  [
    "a cluster's settings with its admin's ClusterRole",
    'sealion-agent',
    {
      cluster: {
        name: 'edge-2',
        hubURL: 'https://10.0.0.1',
        caPin: `sha256:${'f'.repeat(64)}`,
        bootstrapToken: 't',
      },
      forwardingPolicy: { name: 'clusterrole:edge-forwarding' },
    },
  ],
];

describe('helm lint', () => {
  it.each(
    HELM_MAJORS.flatMap((major) =>
      ['sealion-concierge', 'sealion-agent'].map((chart) => [major, chart] as const),
    ),
  )('Helm %i finds nothing wrong with %s', async (major, chart) => {
    const { stdout } = await helm(major, ['lint', '--strict', join(CHARTS, chart)]);
    expect(stdout).toMatch(/1 chart\(s\) linted, 0 chart\(s\) failed/);
  });
});

describe('helm template and kustomize give the same objects', () => {
  it.each(CONCIERGE_ROWS)('concierge: %s', async (_name, namespace, values) => {
    const [fromHelm, fromKustomize] = await Promise.all([
      helmTemplates('sealion-concierge', namespace, values),
      kustomize('concierge', namespace, values),
    ]);
    expectSame(fromHelm, fromKustomize);
  });

  it.each(AGENT_ROWS)('agent: %s', async (_name, namespace, values) => {
    const [fromHelm, fromKustomize] = await Promise.all([
      helmTemplates('sealion-agent', namespace, values),
      kustomize('agent', namespace, values),
    ]);
    expectSame(fromHelm, fromKustomize);
  });
});

describe('values that would install something else than meant are refused, by both', () => {
  const BAD: [string, Obj, RegExp][] = [
    ['a negative replica count', { replicas: -1 }, /replicas/],
    ['a shutdown delay past an hour', { shutdownDelaySeconds: 3601 }, /shutdownDelaySeconds/],
    ['a negative shutdown grace', { shutdownGraceSeconds: -1 }, /shutdownGraceSeconds/],
    ['a policy of no known name', { forwardingPolicy: { name: 'everything' } }, /forwardingPolicy/],
    [
      'a policy without users',
      { forwardingPolicy: { identities: ['nodes'] } },
      /users are always among them/,
    ],
    ['legacy with a narrower policy', { forwardingPolicy: { name: 'no-exec', legacy: true } }, /legacy/],
    [
      'an API group that is no custom resource group',
      { forwardingPolicy: { apiGroups: ['apps'] } },
      /apiGroups/,
    ],
    ['a group suffix that is no DNS subdomain', { groupSuffix: 'Not A Suffix' }, /groupSuffix/],
    ['a misspelt setting', { replica: 3 }, /replica/],
    [
      "an admin's own ClusterRole, without users",
      { forwardingPolicy: { name: 'clusterrole:mine', identities: ['serviceaccounts'] } },
      /users are always among them/,
    ],
    ['an identity kind twice', { forwardingPolicy: { identities: ['users', 'users'] } }, /identit/],
    ['a null where a string goes', { nodeSelector: { 'kubernetes.io/os': null } }, /nodeSelector/],
    [
      'a group suffix too long for the CRDs named from it',
      { groupSuffix: `${'a'.repeat(60)}.${'b'.repeat(60)}.${'c'.repeat(60)}.${'d'.repeat(20)}.dev` },
      /groupSuffix/,
    ],
  ];
  const AGENT_BAD: [string, Obj, RegExp][] = [
    [
      'a hub that is no https URL',
      {
        cluster: {
          name: 'e',
          hubURL: 'http://hub.example',
          caPin: `sha256:${'0'.repeat(64)}`,
          bootstrapToken: 't',
        },
      },
      /hubURL/,
    ],
    [
      'a policy without users, before any cluster is named',
      { forwardingPolicy: { identities: ['nodes'] } },
      /users/,
    ],
  ];
  /** Every Helm major refuses `file` for `chart`, saying `message`. */
  const refusedByHelm = async (chart: string, file: string, message: RegExp): Promise<void> => {
    for (const major of HELM_MAJORS)
      await expect(helm(major, ['template', 'x', join(CHARTS, chart), '-f', file])).rejects.toMatchObject({
        cmd: expect.stringContaining(helms.get(major)!) as unknown,
        stderr: expect.stringMatching(message) as unknown,
      });
  };

  it.each(AGENT_BAD)('agent: %s', async (_name, values, message) => {
    const file = valuesFile(values);
    await refusedByHelm('sealion-agent', file, message);
    await expect(
      run(process.execPath, [join(REPO_ROOT, 'bin/sealion.js'), 'manifests', 'agent', '--values', file]),
    ).rejects.toMatchObject({ stderr: expect.stringMatching(message) as unknown });
  });

  it.each(BAD)('%s', async (_name, values, message) => {
    const file = valuesFile(values);
    await refusedByHelm('sealion-concierge', file, message);
    await expect(
      run(process.execPath, [join(REPO_ROOT, 'bin/sealion.js'), 'manifests', 'concierge', '--values', file]),
    ).rejects.toMatchObject({ stderr: expect.stringMatching(message) as unknown });
  });
});
