// A Kubernetes audit Policy (audit.k8s.io/v1, the file kube-apiserver reads with --audit-policy-file), read and
// evaluated as the API server does (k8s.io/apiserver/pkg/audit/policy): the first rule that matches a request
// gives its level and the stages to leave out; a request no rule matches is not audited. One policy file serves
// Sealion and the clusters behind it, so an admin writes the rules once.
import { parseDocument } from 'yaml';
import { z } from 'zod';
import { SealionError } from '../../lib/errors.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';
import { AUDIT_API_VERSION, type Level, type Stage } from './types.ts';

/** A real policy is a few KiB (kube-up's own, with every rule it has, is 6); this keeps a huge file out of memory. */
const MAX_POLICY_BYTES = 1024 * 1024;

const LEVELS = ['None', 'Metadata', 'Request', 'RequestResponse'] as const;
const STAGES = ['RequestReceived', 'ResponseStarted', 'ResponseComplete', 'Panic'] as const;

const GroupResources = z.strictObject({
  group: z.string().optional(),
  resources: z.array(z.string()).optional(),
  resourceNames: z.array(z.string()).optional(),
});

const PolicyRule = z
  .strictObject({
    level: z.enum(LEVELS),
    users: z.array(z.string()).optional(),
    userGroups: z.array(z.string()).optional(),
    verbs: z.array(z.string()).optional(),
    resources: z.array(GroupResources).optional(),
    namespaces: z.array(z.string()).optional(),
    nonResourceURLs: z.array(z.string()).optional(),
    omitStages: z.array(z.enum(STAGES)).optional(),
    omitManagedFields: z.boolean().optional(),
  })
  .superRefine((rule, ctx) => {
    // The API server's validation: a rule is about resources or about non-resource URLs, never both.
    if ((rule.resources?.length || rule.namespaces?.length) && rule.nonResourceURLs?.length)
      ctx.addIssue({
        code: 'custom',
        message: 'rules cannot apply to both regular resources and non-resource URLs',
      });
    for (const url of rule.nonResourceURLs ?? [])
      if (url !== '*' && !url.startsWith('/'))
        ctx.addIssue({
          code: 'custom',
          message: `non-resource URL ${JSON.stringify(url)} must start with /`,
        });
    for (const url of rule.nonResourceURLs ?? [])
      if (url.slice(0, -1).includes('*'))
        ctx.addIssue({ code: 'custom', message: `${JSON.stringify(url)}: * is allowed only at the end` });
  });

const PolicyDocument = z.strictObject({
  apiVersion: z.literal(AUDIT_API_VERSION),
  kind: z.literal('Policy'),
  metadata: z.record(z.string(), z.unknown()).optional(),
  rules: z.array(PolicyRule),
  omitStages: z.array(z.enum(STAGES)).optional(),
  omitManagedFields: z.boolean().optional(),
});

type Rule = z.infer<typeof PolicyRule>;

export class PolicyError extends SealionError {
  constructor(message: string) {
    super('InvalidAuditPolicy', `load audit policy: ${message}`);
    this.name = 'PolicyError';
  }
}

/** What the policy says of one request. */
export interface RequestAuditConfig {
  level: Level;
  omitStages: ReadonlySet<Stage>;
  omitManagedFields: boolean;
}

export interface AuditPolicy {
  /** The config for a request by `user` (undefined: nobody was authenticated). */
  evaluate(
    attributes: RequestAttributes,
    user?: { username: string; groups: readonly string[] },
  ): RequestAuditConfig;
  /** Whether some rule can audit at a level above None: a policy that cannot is as good as no audit. */
  readonly auditsAnything: boolean;
}

/** Parses and checks a policy file's text; throws PolicyError naming every problem. */
export function loadPolicy(text: string): AuditPolicy {
  if (Buffer.byteLength(text) > MAX_POLICY_BYTES)
    throw new PolicyError(`larger than ${MAX_POLICY_BYTES} bytes`);
  const doc = parseDocument(text, { uniqueKeys: true });
  if (doc.errors.length > 0) throw new PolicyError(doc.errors.map((e) => e.message).join('; '));
  // Aliases can blow a small document up exponentially; a policy needs few.
  const parsed = PolicyDocument.safeParse(doc.toJS({ maxAliasCount: 50 }));
  if (!parsed.success)
    throw new PolicyError(
      parsed.error.issues.map((i) => `${i.path.map(String).join('.') || 'policy'}: ${i.message}`).join('; '),
    );
  return newPolicy(parsed.data.rules, parsed.data.omitStages ?? [], parsed.data.omitManagedFields ?? false);
}

function newPolicy(rules: Rule[], omitStages: Stage[], omitManagedFields: boolean): AuditPolicy {
  const compiled = rules.map((rule) => ({
    rule,
    config: {
      level: rule.level,
      omitStages: new Set([...omitStages, ...(rule.omitStages ?? [])]),
      omitManagedFields: rule.omitManagedFields ?? omitManagedFields,
    } satisfies RequestAuditConfig,
  }));
  const none: RequestAuditConfig = { level: 'None', omitStages: new Set(omitStages), omitManagedFields };
  return {
    auditsAnything: rules.some((r) => r.level !== 'None'),
    evaluate(attributes, user) {
      for (const { rule, config } of compiled) if (ruleMatches(rule, attributes, user)) return config;
      return none;
    },
  };
}

function ruleMatches(
  rule: Rule,
  attributes: RequestAttributes,
  user: { username: string; groups: readonly string[] } | undefined,
): boolean {
  if (rule.users?.length && (!user || !rule.users.includes(user.username))) return false;
  if (rule.userGroups?.length && (!user || !user.groups.some((g) => rule.userGroups!.includes(g))))
    return false;
  if (rule.verbs?.length && !rule.verbs.includes(attributes.verb)) return false;
  if (rule.namespaces?.length || rule.resources?.length) return resourceMatches(rule, attributes);
  if (rule.nonResourceURLs?.length)
    return (
      !attributes.resourceRequest && rule.nonResourceURLs.some((spec) => pathMatches(attributes.path, spec))
    );
  return true;
}

function pathMatches(path: string, spec: string): boolean {
  if (spec === '*' || spec === path) return true;
  return spec.endsWith('*') && path.startsWith(spec.replace(/\*+$/, ''));
}

function resourceMatches(rule: Rule, attributes: RequestAttributes): boolean {
  if (!attributes.resourceRequest) return false;
  // Cluster-scoped resources are in the namespace "".
  if (rule.namespaces?.length && !rule.namespaces.includes(attributes.namespace)) return false;
  if (!rule.resources?.length) return true;
  const { group, resource, subresource, name } = attributes;
  const combined = subresource ? `${resource}/${subresource}` : resource;
  for (const gr of rule.resources) {
    if ((gr.group ?? '') !== group && gr.group !== '*') continue;
    if (!gr.resources?.length) return true;
    if (gr.resourceNames?.length && !gr.resourceNames.includes(name)) continue;
    for (const r of gr.resources) {
      if (r === combined || r === '*') return true;
      if (subresource && r.startsWith('*/') && r.slice(2) === subresource) return true;
      if (r.endsWith('/*') && r.slice(0, -2) === resource) return true;
    }
  }
  return false;
}
