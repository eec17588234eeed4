// The Helm charts, rendered from install.ts as the kustomize folders are, so the two cannot drift: each object is
// rendered once with a hole for every setting a chart's values choose (the namespace, the image, the replicas, ...)
// and the holes become template actions. What install.ts computes from a setting in a way a hole cannot carry, the
// forwarding policy's rules, is rendered here for every policy and identity kind and put together by the template.
// The same values also render through install.ts (`sealion manifests --values`), and a test holds `helm template`
// to that, object by object.
import { isDeepStrictEqual } from 'node:util';
import { Document, isMap, parseDocument, stringify } from 'yaml';
import * as z from 'zod';
import { DEFAULT_GROUP_SUFFIX, isValidGroupSuffix, MAX_GROUP_SUFFIX_LENGTH } from '../apis/groups.ts';
import {
  CONFIG_KEY,
  CONFIG_MAP_NAME,
  DEFAULT_AUDIT_POLICY_YAML,
  DEFAULT_CONFIG_YAML,
} from '../apis/install.ts';
import { AUDIT_CONFIG_MAP_NAME, AUDIT_POLICY_KEY } from '../apis/install.ts';
import packageJson from '../package.json' with { type: 'json' };
import { DEFAULT_SHUTDOWN_DELAY_SECONDS, DEFAULT_SHUTDOWN_GRACE_SECONDS } from '../concierge/drain.ts';
import { crds, loadKindSchemas, type KindSchemas } from './crds.ts';
import {
  DEFAULT_POLICY,
  forwardingRules,
  IDENTITY_KINDS,
  POLICY_NAMES,
  policyProblem,
  type ForwardingPolicy,
  type IdentityKind,
} from './forwarding-policy.ts';
import {
  agentManifests,
  agentSettingsManifests,
  conciergeManifests,
  DEFAULT_AGENT_POD,
  DEFAULT_CONCIERGE_POD,
  DEFAULT_IMAGE,
  DEFAULT_INSTALL,
  POLICY_ANNOTATION,
  TERMINATION_GRACE_MARGIN_SECONDS,
  type InstallOptions,
  type PodSettings,
} from './install.ts';
import { FILE_BY_KIND, yamlText } from './render.ts';

type Obj = Record<string, unknown>;
export type ChartName = 'sealion-concierge' | 'sealion-agent';
export const CHARTS: readonly ChartName[] = ['sealion-concierge', 'sealion-agent'];

/** Kept by `helm uninstall`: deleting a CRD deletes every object of its kind, authenticators and clusters included. */
export const KEEP_ANNOTATION = { 'helm.sh/resource-policy': 'keep' };

// ---- Values: one schema for the charts (values.schema.json) and for `sealion manifests --values`.

const dnsLabel = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
const podSchema = {
  image: z.string().min(1).describe('The container image.'),
  imagePullPolicy: z.enum(['', 'Always', 'IfNotPresent', 'Never']).optional(),
  imagePullSecrets: z.array(z.strictObject({ name: z.string().regex(dnsLabel) })).optional(),
  resources: z.record(z.string(), z.unknown()).nullish(),
  nodeSelector: z.record(z.string(), z.string()).nullish(),
  tolerations: z.array(z.record(z.string(), z.unknown())).nullish(),
  affinity: z.record(z.string(), z.unknown()).nullish(),
  topologySpreadConstraints: z.array(z.record(z.string(), z.unknown())).nullish(),
  priorityClassName: z.string().optional(),
};
const policySchema = z.strictObject({
  name: z.union([z.enum(POLICY_NAMES), z.string().regex(/^clusterrole:[a-z0-9]([-a-z0-9.:]*[a-z0-9])?$/)]),
  identities: z
    .array(z.enum(IDENTITY_KINDS))
    .min(1)
    .refine((kinds) => new Set(kinds).size === kinds.length, 'an identity kind is listed twice')
    .meta({ uniqueItems: true }),
  apiGroups: z.array(z.string().regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$/)),
  legacy: z.boolean(),
});
const serviceSchema = z.strictObject({
  type: z.enum(['ClusterIP', 'NodePort', 'LoadBalancer']),
  annotations: z.record(z.string(), z.string()).nullish(),
});
/** Helm gives every chart `global` (shared with subcharts); nothing here reads it. */
const global = z.record(z.string(), z.unknown()).optional();

export const conciergeValuesSchema = z.strictObject({
  ...podSchema,
  groupSuffix: z
    .string()
    .max(MAX_GROUP_SUFFIX_LENGTH)
    .refine(isValidGroupSuffix)
    .regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$/),
  replicas: z.int().min(0),
  // An hour at most: a longer delay would hold every rollout and node drain for longer than anyone waits.
  shutdownDelaySeconds: z.int().min(0).max(3600),
  shutdownGraceSeconds: z.int().min(0).max(3600),
  services: z.strictObject({ proxy: serviceSchema, tunnel: serviceSchema }),
  forwardingPolicy: policySchema,
  config: z.record(z.string(), z.unknown()).nullish(),
  auditPolicy: z.record(z.string(), z.unknown()).nullish(),
  global,
});
export const agentValuesSchema = z.strictObject({
  ...podSchema,
  cluster: z.strictObject({
    name: z.union([z.literal(''), z.string().regex(dnsLabel)]),
    // A pattern the schema can carry (Helm checks no format), and a URL that parses.
    hubURL: z.union([
      z.literal(''),
      z
        .string()
        .regex(/^https:\/\/[^\s/?#@]+(\/\S*)?$/)
        .refine((url) => URL.canParse(url), 'not a URL'),
    ]),
    caPin: z.union([z.literal(''), z.string().regex(/^sha256:[0-9a-f]{64}$/)]),
    bootstrapToken: z.string(),
  }),
  forwardingPolicy: policySchema,
  global,
});
export type ConciergeValues = z.infer<typeof conciergeValuesSchema>;
export type AgentValues = z.infer<typeof agentValuesSchema>;

/** The concierge chart's default values: the kustomize install's settings. */
export function defaultConciergeValues(): ConciergeValues {
  return {
    image: DEFAULT_IMAGE,
    imagePullPolicy: '',
    imagePullSecrets: [],
    groupSuffix: DEFAULT_GROUP_SUFFIX,
    replicas: DEFAULT_CONCIERGE_POD.replicas,
    shutdownDelaySeconds: DEFAULT_SHUTDOWN_DELAY_SECONDS,
    shutdownGraceSeconds: DEFAULT_SHUTDOWN_GRACE_SECONDS,
    resources: DEFAULT_CONCIERGE_POD.resources,
    nodeSelector: {},
    tolerations: [],
    affinity: {},
    topologySpreadConstraints: DEFAULT_CONCIERGE_POD.topologySpreadConstraints,
    priorityClassName: '',
    services: {
      proxy: { type: 'ClusterIP', annotations: {} },
      tunnel: { type: 'ClusterIP', annotations: {} },
    },
    forwardingPolicy: { ...DEFAULT_POLICY },
    config: parseDocument(DEFAULT_CONFIG_YAML).toJS() as Obj,
    auditPolicy: parseDocument(DEFAULT_AUDIT_POLICY_YAML).toJS() as Obj,
  };
}

export function defaultAgentValues(): AgentValues {
  return {
    image: DEFAULT_IMAGE,
    imagePullPolicy: '',
    imagePullSecrets: [],
    resources: DEFAULT_AGENT_POD.resources,
    nodeSelector: {},
    tolerations: [],
    affinity: {},
    topologySpreadConstraints: [],
    priorityClassName: '',
    cluster: { name: '', hubURL: '', caPin: '', bootstrapToken: '' },
    forwardingPolicy: { ...DEFAULT_POLICY },
  };
}

/**
 * Values as Helm combines them: what the user gives, over the chart's defaults. Maps merge key by key, anything
 * else replaces, and a null removes a default (a null where there is none stays, as Helm keeps it).
 */
export function mergeValues(defaults: Obj, given: Obj): Obj {
  const out: Obj = { ...defaults };
  for (const [key, value] of Object.entries(given)) {
    const base = out[key];
    if (value === null && Object.hasOwn(out, key)) delete out[key];
    else if (isPlainObject(value) && isPlainObject(base)) out[key] = mergeValues(base, value);
    else out[key] = value;
  }
  return out;
}

function isPlainObject(value: unknown): value is Obj {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function checkedPolicy(values: z.infer<typeof policySchema>): ForwardingPolicy {
  const policy = values as ForwardingPolicy;
  const problem = policyProblem(policy);
  if (problem) throw new Error(`forwardingPolicy: ${problem}`);
  return policy;
}

function parseValues<T>(schema: z.ZodType<T>, values: Obj, chart: ChartName): T {
  const result = schema.safeParse(values);
  if (!result.success)
    throw new Error(
      `${chart} values: ${result.error.issues.map((i) => `${i.path.join('.') || '(top)'}: ${i.message}`).join('; ')}`,
    );
  return result.data;
}

function podSettings(values: z.infer<z.ZodObject<typeof podSchema>>): PodSettings {
  return {
    resources: values.resources ?? {},
    nodeSelector: values.nodeSelector ?? {},
    tolerations: values.tolerations ?? [],
    affinity: values.affinity ?? {},
    topologySpreadConstraints: values.topologySpreadConstraints ?? [],
    priorityClassName: values.priorityClassName ?? '',
    imagePullPolicy: values.imagePullPolicy ?? '',
    imagePullSecrets: values.imagePullSecrets ?? [],
  };
}

/** The install a concierge chart's values (over its defaults) stand for, in `namespace`. */
export function conciergeInstall(given: Obj, namespace = DEFAULT_INSTALL.namespace): InstallOptions {
  const values = parseValues(
    conciergeValuesSchema,
    mergeValues(defaultConciergeValues() as Obj, given),
    'sealion-concierge',
  );
  return {
    ...DEFAULT_INSTALL,
    namespace,
    groupSuffix: values.groupSuffix,
    image: values.image,
    forwardingPolicy: checkedPolicy(values.forwardingPolicy),
    concierge: {
      ...podSettings(values),
      replicas: values.replicas,
      shutdownDelaySeconds: values.shutdownDelaySeconds,
      shutdownGraceSeconds: values.shutdownGraceSeconds,
    },
    services: {
      proxy: { type: values.services.proxy.type, annotations: values.services.proxy.annotations ?? {} },
      tunnel: { type: values.services.tunnel.type, annotations: values.services.tunnel.annotations ?? {} },
    },
    config: values.config ?? {},
    auditPolicy: values.auditPolicy ?? {},
  };
}

/** The agent an agent chart's values stand for, in `namespace`: its objects, and its settings' when a cluster is named. */
export function agentObjects(given: Obj, namespace = DEFAULT_INSTALL.agentNamespace): Obj[] {
  const values = parseValues(
    agentValuesSchema,
    mergeValues(defaultAgentValues() as Obj, given),
    'sealion-agent',
  );
  // Checked whether or not a cluster is named yet, as the chart checks it.
  const policy = checkedPolicy(values.forwardingPolicy);
  const opts: InstallOptions = {
    ...DEFAULT_INSTALL,
    agentNamespace: namespace,
    image: values.image,
    agent: podSettings(values),
  };
  const settings = values.cluster.name
    ? agentSettingsManifests(
        {
          clusterName: values.cluster.name,
          hubURL: values.cluster.hubURL,
          caPin: values.cluster.caPin,
          bootstrapToken: values.cluster.bootstrapToken,
          policy,
        },
        opts,
      )
    : [];
  return [...agentManifests(opts), ...settings.filter((o) => o['kind'] !== 'Namespace')];
}

// ---- Holes: settings left open in a rendered object, and the template text that fills each.

interface Hole {
  /** A template pipeline giving the setting's value (from `$`, the chart's root). */
  expr: string;
  /** Leave the field out when the value is empty, as install.ts does. */
  optional?: boolean;
  /** Template text writing the value's YAML itself, instead of `expr | toJson`. */
  raw?: string;
}

// A stand-in is a DNS subdomain, which the group suffix must be.
const TOKENS = /zzhole\d+\.invalid/g;
const TOKEN = /zzhole\d+\.invalid/;
const MARKS = /zzmark\d+zz/g;
const MARK = /zzmark\d+zz/;

class Holes {
  private readonly holes = new Map<string, Hole>();
  private readonly marks = new Map<string, Hole>();

  /** A stand-in for a setting: a string the rendering carries along, which becomes the hole. */
  open(hole: Hole): string {
    const token = `zzhole${this.holes.size}.invalid`;
    this.holes.set(token, hole);
    return token;
  }

  private mark(hole: Hole): string {
    const mark = `zzmark${this.marks.size}zz`;
    this.marks.set(mark, hole);
    return mark;
  }

  /** Template text for a string that holes make up in part: print puts the pieces together. */
  stringTemplate(text: string): string {
    const pieces: string[] = [];
    let at = 0;
    for (const m of text.matchAll(TOKENS)) {
      if (m.index > at) pieces.push(JSON.stringify(text.slice(at, m.index)));
      const hole = this.holes.get(m[0])!;
      if (hole.raw || hole.optional) throw new Error(`a hole inside "${text}" must be a plain value`);
      pieces.push(`(${hole.expr})`);
      at = m.index + m[0].length;
    }
    if (at < text.length) pieces.push(JSON.stringify(text.slice(at)));
    return `{{ print ${pieces.join(' ')} | toJson }}`;
  }

  /** Replaces every hole in `value` with a mark that stringify leaves as it is. */
  fill(value: unknown): unknown {
    if (typeof value === 'string') {
      const whole = this.holes.get(value);
      if (whole) return this.mark(whole);
      if (TOKEN.test(value)) return this.mark({ expr: '', raw: this.stringTemplate(value) });
      return value;
    }
    if (Array.isArray(value)) return value.map((v) => this.fill(v));
    if (isPlainObject(value))
      return Object.fromEntries(
        Object.entries(value).map(([k, v]) => {
          if (TOKEN.test(k)) throw new Error(`a hole in the key ${k}`);
          return [k, this.fill(v)];
        }),
      );
    return value;
  }

  /** The template text of one object, holes filled, shown only when `condition` holds. */
  template(object: Obj, condition?: string): string {
    const text = yamlText(this.fill(object));
    const lines = text.split('\n').map((line) => {
      const marks = line.match(MARKS);
      if (!marks) return line;
      const hole = this.marks.get(marks[0])!;
      if (hole.optional) {
        const field = /^(\s*)([A-Za-z][\w.-]*): (zzmark\d+zz)$/.exec(line);
        if (!field || marks.length > 1)
          throw new Error(`an optional hole must be a field of its own: ${line}`);
        return `{{- with ${hole.expr} }}\n${field[1]}${field[2]}: {{ toJson . }}\n{{- end }}`;
      }
      return line.replace(MARKS, (mark) => {
        const h = this.marks.get(mark)!;
        return h.raw ?? `{{ ${h.expr} | toJson }}`;
      });
    });
    const out = lines.join('\n');
    if (TOKEN.test(out) || MARK.test(out)) throw new Error(`a hole is left in\n${out}`);
    return condition ? `{{- if ${condition} }}\n${out}{{- end }}\n` : out;
  }
}

// ---- The forwarding policy, rendered for every policy and identity kind.

const POLICY = '$.Values.forwardingPolicy';
const OWN_ROLE = `hasPrefix "clusterrole:" ${POLICY}.name`;
const API_GROUPS_SPLICE = 'zzapigroupszz';

/** The template that writes a policy's rules as JSON, from rules rendered by forwardingRules for each part. */
function policyHelpers(): string {
  const rulesJSON = (policy: ForwardingPolicy): string => {
    const text = JSON.stringify(forwardingRules(policy));
    // The custom resources' API groups join the built-in ones (never an empty list, so a comma goes first).
    const spliced = text.replaceAll(
      `,"${API_GROUPS_SPLICE}"]`,
      `{{ range ${POLICY}.apiGroups }},{{ toJson . }}{{ end }}]`,
    );
    if (
      spliced.includes(API_GROUPS_SPLICE) ||
      (policy.apiGroups.length > 0 && policy.name !== 'full' && spliced === text)
    )
      throw new Error(`${policy.name}: the custom resources' groups are not where the template puts them`);
    return spliced;
  };
  // The template puts a policy's rules together kind by kind, as forwardingRules does; this holds it to that.
  for (const name of POLICY_NAMES)
    for (const identities of identitySets()) {
      const whole = forwardingRules({ name, identities, apiGroups: ['x.example'], legacy: false });
      const parts = identities.flatMap((kind) =>
        forwardingRules({ name, identities: [kind], apiGroups: ['x.example'], legacy: false })!,
      );
      if (!isDeepStrictEqual(whole, parts))
        throw new Error(`${name} ${identities.join(',')}: rules are not per kind`);
    }
  const defines = [
    `{{- define "sealion.policyRules.legacy" -}}\n${rulesJSON({ ...DEFAULT_POLICY, legacy: true })}\n{{- end }}`,
    ...POLICY_NAMES.flatMap((name) =>
      IDENTITY_KINDS.map((kind) => {
        const policy = { name, identities: [kind], apiGroups: [API_GROUPS_SPLICE], legacy: false };
        return `{{- define "sealion.policyRules.${name}.${kind}" -}}\n${rulesJSON(policy)}\n{{- end }}`;
      }),
    ),
  ];
  return `{{/* Generated by \`npm run generate\` from manifests/forwarding-policy.ts; do not edit by hand. */}}

{{/* What the schema cannot say of a policy (policyProblem); templates/checks.yaml runs it on every render. */}}
{{- define "sealion.checkPolicy" -}}
{{- $p := ${POLICY} -}}
{{- if not (has "users" $p.identities) }}{{ fail "forwardingPolicy.identities: users are always among them" }}{{ end -}}
{{- if and $p.legacy (ne $p.name "full") }}{{ fail "forwardingPolicy: legacy impersonation cannot limit verbs or resources: only the full policy can be rendered with it" }}{{ end -}}
{{- end }}

{{/* The forwarding ClusterRole's rules, as JSON: each identity kind's, in the order given (legacy: the one set). */}}
{{- define "sealion.policyRules" -}}
{{- $p := ${POLICY} -}}
{{- $rules := list -}}
{{- if $p.legacy -}}
{{- $rules = include "sealion.policyRules.legacy" $ | fromJsonArray -}}
{{- else -}}
{{- range $kind := $p.identities -}}
{{- $rules = concat $rules (include (printf "sealion.policyRules.%s.%s" $p.name $kind) $ | fromJsonArray) -}}
{{- end -}}
{{- end -}}
{{- toJson $rules -}}
{{- end }}

{{/* The policy as one line (describePolicy): what the agent reports and the ClusterRole's annotation says. */}}
{{- define "sealion.describePolicy" -}}
{{- $p := ${POLICY} -}}
{{- $p.name -}}
{{- if gt (len $p.identities) 1 }}+{{ without $p.identities "users" | join "+" }}{{ end -}}
{{- if $p.apiGroups }}(+{{ join "," $p.apiGroups }}){{ end -}}
{{- if $p.legacy }}(legacy){{ end -}}
{{- end }}

${defines.join('\n\n')}
`;
}

/** Every set of identity kinds a policy may list (users always), in IDENTITY_KINDS' order. */
function identitySets(): IdentityKind[][] {
  const others = IDENTITY_KINDS.filter((k) => k !== 'users');
  return [[], [others[0]!], [others[1]!], others].map((more) => ['users', ...more]);
}

// ---- The charts.

const CHART_HEADER = '# Generated by `npm run generate` from manifests/; do not edit by hand.\n';

/** The holes every pod's settings leave, for values at the chart's top level. */
function podHoles(holes: Holes): PodSettings {
  const optional = (name: string): string => holes.open({ expr: `$.Values.${name}`, optional: true });
  return {
    resources: optional('resources') as unknown as Obj,
    nodeSelector: optional('nodeSelector') as unknown as Record<string, string>,
    tolerations: optional('tolerations') as unknown as Obj[],
    affinity: optional('affinity') as unknown as Obj,
    topologySpreadConstraints: optional('topologySpreadConstraints') as unknown as Obj[],
    priorityClassName: optional('priorityClassName'),
    imagePullPolicy: optional('imagePullPolicy'),
    imagePullSecrets: optional('imagePullSecrets') as unknown as { name: string }[],
  };
}

/**
 * Makes the forwarding ClusterRole (marked by its description's hole) appear only for a built-in policy, and its
 * binding name the admin's own ClusterRole otherwise.
 */
function forwardingTemplates(
  holes: Holes,
  objects: Obj[],
  description: string,
  condition?: string,
): string[] {
  const role = objects.find(
    (o) => (o['metadata'] as { annotations?: Obj }).annotations?.[POLICY_ANNOTATION] === description,
  );
  if (!role) throw new Error('no forwarding ClusterRole');
  const roleName = (role['metadata'] as { name: string }).name;
  return objects.map((o) => {
    if (o === role)
      return holes.template(o, condition ? `and ${condition} (not (${OWN_ROLE}))` : `not (${OWN_ROLE})`);
    const roleRef = o['roleRef'] as { name: string } | undefined;
    if (o['kind'] === 'ClusterRoleBinding' && roleRef?.name === roleName) {
      const ref = holes.open({
        expr: '',
        raw: `{{ if ${OWN_ROLE} }}{{ trimPrefix "clusterrole:" ${POLICY}.name | toJson }}{{ else }}${holes.stringTemplate(roleName)}{{ end }}`,
      });
      return holes.template({ ...o, roleRef: { ...roleRef, name: ref } }, condition);
    }
    return holes.template(o, condition);
  });
}

/** Template files by name: the objects grouped as the kustomize folders group them. */
function templateFiles(entries: { object: Obj; text: string }[]): Map<string, string> {
  const files = new Map<string, string[]>();
  for (const { object, text } of entries) {
    const kind = object['kind'] as string;
    const file = kind === 'CustomResourceDefinition' ? 'crds.yaml' : (FILE_BY_KIND[kind] ?? 'other.yaml');
    files.set(file, [...(files.get(file) ?? []), text]);
  }
  return new Map(
    [...files].map(([file, texts]) => [`templates/${file}`, CHART_HEADER + texts.join('---\n')]),
  );
}

function chartYaml(name: ChartName, description: string): string {
  return (
    CHART_HEADER +
    stringify({
      apiVersion: 'v2',
      name,
      description,
      type: 'application',
      version: packageJson.version,
      appVersion: packageJson.version,
      home: 'https://github.com/sealion-dev/sealion',
      keywords: ['kubernetes', 'authentication', 'impersonation', 'kubectl', 'tunnel'],
    })
  );
}

/** values.yaml: the defaults with a comment on each setting (and the ConfigMap's own comments). */
function valuesYaml(
  values: Obj,
  comments: Record<string, string>,
  nested: Record<string, string> = {},
): string {
  const doc = new Document(values);
  for (const [key, text] of Object.entries(comments)) {
    const pair = isMap(doc.contents) ? doc.contents.items.find((p) => String(p.key) === key) : undefined;
    if (!pair) throw new Error(`values have no ${key}`);
    (pair.key as { commentBefore?: string }).commentBefore = text
      .split('\n')
      .map((l) => ` ${l}`)
      .join('\n');
    // Settings kept as YAML of their own keep that YAML's comments.
    const source = nested[key];
    if (source) pair.value = parseDocument(source).contents;
  }
  return CHART_HEADER + doc.toString({ lineWidth: 0 });
}

const POD_COMMENTS: Record<string, string> = {
  image: 'The image (npm run image builds it); the concierge and the agent run the same one.',
  imagePullPolicy: 'Empty: Kubernetes decides (IfNotPresent, or Always for :latest).',
  imagePullSecrets: 'Secrets to pull the image with, by name: [{name: my-registry}].',
  resources: "The container's requests and limits.",
  nodeSelector: 'Where the pods may run.',
  tolerations: 'Taints the pods tolerate.',
  affinity: 'Pod affinity and anti-affinity.',
  topologySpreadConstraints:
    'How replicas spread over nodes and zones (the concierge: by both, where it can; null: not at all).',
  priorityClassName: "The pods' PriorityClass.",
};
const POLICY_COMMENT = `What the forwarding identity may do on this cluster, which its API server enforces: name is full, no-exec,
read-only or clusterrole:<name> (a ClusterRole of your own, bound as it is); identities are users (always), and
serviceaccounts and nodes if listed; apiGroups are custom resources' groups that read-only and no-exec cover too;
legacy renders the old impersonate verb, for clusters before Kubernetes 1.36 (full only).`;

function conciergeChart(schemas: KindSchemas): Map<string, string> {
  const holes = new Holes();
  const suffix = holes.open({ expr: '$.Values.groupSuffix' });
  const description = holes.open({ expr: '', raw: '{{ include "sealion.describePolicy" $ | toJson }}' });
  const rules = holes.open({ expr: '', raw: '{{ include "sealion.policyRules" $ }}' });
  const opts: InstallOptions = {
    groupSuffix: suffix,
    namespace: holes.open({ expr: '$.Release.Namespace' }),
    agentNamespace: DEFAULT_INSTALL.agentNamespace,
    image: holes.open({ expr: '$.Values.image' }),
    concierge: {
      ...podHoles(holes),
      replicas: holes.open({ expr: '$.Values.replicas' }) as unknown as number,
      shutdownDelaySeconds: holes.open({ expr: '$.Values.shutdownDelaySeconds' }) as unknown as number,
      shutdownGraceSeconds: holes.open({ expr: '$.Values.shutdownGraceSeconds' }) as unknown as number,
    },
    services: {
      proxy: {
        type: holes.open({ expr: '$.Values.services.proxy.type' }),
        annotations: holes.open({ expr: '$.Values.services.proxy.annotations', optional: true }) as never,
      },
      tunnel: {
        type: holes.open({ expr: '$.Values.services.tunnel.type' }),
        annotations: holes.open({ expr: '$.Values.services.tunnel.annotations', optional: true }) as never,
      },
    },
    renderPolicy: () => ({ rules: rules as never, description, ownRole: undefined }),
  };
  const objects = conciergeManifests(opts).filter((o) => o['kind'] !== 'Namespace');
  // The pod's termination grace is a sum of the two, which a hole cannot carry: the template adds them.
  const deployment = objects.find((o) => o['kind'] === 'Deployment');
  if (!deployment) throw new Error('no concierge Deployment');
  const podSpec = (deployment['spec'] as { template: { spec: Obj } }).template.spec;
  podSpec['terminationGracePeriodSeconds'] = holes.open({
    expr: `add $.Values.shutdownDelaySeconds $.Values.shutdownGraceSeconds ${TERMINATION_GRACE_MARGIN_SECONDS}`,
  });
  // The ConfigMaps' YAML is written from the values as they are.
  for (const o of objects) {
    const name = (o['metadata'] as { name: string }).name;
    if (o['kind'] !== 'ConfigMap') continue;
    if (name === CONFIG_MAP_NAME)
      o['data'] = {
        [CONFIG_KEY]: holes.open({ expr: '', raw: '{{ toYaml ($.Values.config | default dict) | toJson }}' }),
      };
    else if (name === AUDIT_CONFIG_MAP_NAME)
      o['data'] = {
        [AUDIT_POLICY_KEY]: holes.open({
          expr: '',
          raw: '{{ toYaml ($.Values.auditPolicy | default dict) | toJson }}',
        }),
      };
  }
  const definitions = crds(suffix, schemas).map((crd) => {
    const metadata = crd['metadata'] as Obj;
    return {
      ...crd,
      metadata: { ...metadata, annotations: { ...(metadata['annotations'] as Obj), ...KEEP_ANNOTATION } },
    };
  });
  const texts = forwardingTemplates(holes, objects, description);
  const files = templateFiles([
    ...definitions.map((object) => ({ object, text: holes.template(object) })),
    ...objects.map((object, i) => ({ object, text: texts[i]! })),
  ]);
  const defaults = defaultConciergeValues() as Obj;
  return new Map([
    [
      'Chart.yaml',
      chartYaml(
        'sealion-concierge',
        'Sealion concierge: authenticates kubectl users and impersonates them to each cluster, whose RBAC decides',
      ),
    ],
    [
      'values.yaml',
      valuesYaml(
        defaults,
        {
          ...POD_COMMENTS,
          groupSuffix: "API group suffix (pinniped.dev gives Pinniped's groups, for Pinniped's CLI).",
          replicas: 'Every replica serves the proxy and the tunnels; a Lease picks the one that writes.',
          shutdownDelaySeconds:
            "How long a replica told to stop serves on, unready, while Endpoints and load balancers forget it (--shutdown-delay);\nthe default waits out a cloud load balancer's health checks. The pods' termination grace follows it.",
          shutdownGraceSeconds:
            "Then, taking no new connections, how long exec, attach, port-forward, reach and SSH sessions may go on before each is\nclosed with a message (--shutdown-grace). The pods' termination grace follows it.",
          services:
            "The Services this chart makes. The proxy's published Service is the controllers' (config.impersonationProxy.service);\nset tunnel's type to LoadBalancer where agents dial in from outside the cluster.",
          forwardingPolicy: POLICY_COMMENT,
          config:
            'The ConfigMap sealion-concierge-config: edits apply live, and a bad edit keeps the last good one serving.',
          auditPolicy:
            "The audit policy (kube-apiserver's --audit-policy-file schema), read when a concierge starts.",
        },
        { config: DEFAULT_CONFIG_YAML, auditPolicy: DEFAULT_AUDIT_POLICY_YAML },
      ),
    ],
    [
      'values.schema.json',
      `${JSON.stringify(z.toJSONSchema(conciergeValuesSchema, { io: 'input' }), null, 2)}\n`,
    ],
    ['templates/_policy.tpl', policyHelpers()],
    ['templates/checks.yaml', CHECKS],
    ...files,
    ['templates/NOTES.txt', CONCIERGE_NOTES],
  ]);
}

function agentChart(): Map<string, string> {
  const holes = new Holes();
  const description = holes.open({ expr: '', raw: '{{ include "sealion.describePolicy" $ | toJson }}' });
  const rules = holes.open({ expr: '', raw: '{{ include "sealion.policyRules" $ }}' });
  const opts: InstallOptions = {
    ...DEFAULT_INSTALL,
    agentNamespace: holes.open({ expr: '$.Release.Namespace' }),
    image: holes.open({ expr: '$.Values.image' }),
    agent: podHoles(holes),
    renderPolicy: () => ({ rules: rules as never, description, ownRole: undefined }),
  };
  const agent = agentManifests(opts).filter((o) => o['kind'] !== 'Namespace');
  const settings = agentSettingsManifests(
    {
      clusterName: holes.open({ expr: '$.Values.cluster.name' }),
      hubURL: holes.open({ expr: '$.Values.cluster.hubURL' }),
      caPin: holes.open({ expr: '$.Values.cluster.caPin' }),
      bootstrapToken: holes.open({ expr: '$.Values.cluster.bootstrapToken' }),
    },
    opts,
  ).filter((o) => o['kind'] !== 'Namespace');
  const settingsTexts = forwardingTemplates(holes, settings, description, '$.Values.cluster.name');
  const files = templateFiles([
    ...agent.map((object) => ({ object, text: holes.template(object) })),
    ...settings.map((object, i) => ({ object, text: settingsTexts[i]! })),
  ]);
  return new Map([
    [
      'Chart.yaml',
      chartYaml(
        'sealion-agent',
        'Sealion agent: carries a cluster the concierge cannot reach through a tunnel it dials to the hub',
      ),
    ],
    [
      'values.yaml',
      valuesYaml(defaultAgentValues(), {
        ...POD_COMMENTS,
        cluster: `Which cluster this is and how to reach the hub: \`sealion cluster add <name> --hub <url> --helm-values\` prints these
(the bootstrap token is spent at the agent's first start). Empty: apply \`--agent-manifests\` instead.`,
        forwardingPolicy: POLICY_COMMENT,
      }),
    ],
    [
      'values.schema.json',
      `${JSON.stringify(z.toJSONSchema(agentValuesSchema, { io: 'input' }), null, 2)}\n`,
    ],
    ['templates/_policy.tpl', policyHelpers()],
    ['templates/checks.yaml', CHECKS],
    ...files,
    ['templates/NOTES.txt', AGENT_NOTES],
  ]);
}

/** Renders nothing, on every render: the checks the values schema cannot make. */
const CHECKS = `${CHART_HEADER}{{- include "sealion.checkPolicy" $ }}\n`;

const CONCIERGE_NOTES = `The Sealion concierge is installed in {{ .Release.Namespace }}.

  kubectl -n {{ .Release.Namespace }} rollout status deployment/sealion-concierge
  kubectl get credentialissuers

Next, create a JWTAuthenticator or WebhookAuthenticator; users then run \`sealion get kubeconfig\`.
\`helm uninstall\` keeps the CRDs (and so every authenticator and Cluster): delete them with kubectl to remove those.
`;
const AGENT_NOTES = `The Sealion agent is installed in {{ .Release.Namespace }}.
{{- if .Values.cluster.name }} It dials {{ .Values.cluster.hubURL }} as cluster {{ .Values.cluster.name }}.{{ else }}
Its settings are not in the values: apply \`sealion cluster add <name> --hub <url> --agent-manifests\` to this cluster.{{ end }}

  kubectl -n {{ .Release.Namespace }} rollout status deployment/sealion-agent
`;

/** The files of a chart, by path within its folder. */
export function chartFiles(chart: ChartName, schemas: KindSchemas = loadKindSchemas()): Map<string, string> {
  return chart === 'sealion-concierge' ? conciergeChart(schemas) : agentChart();
}
