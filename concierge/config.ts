// The concierge's configuration: the `config.yaml` key of its ConfigMap, reloaded live. loadConfig parses it,
// fills defaults, reports every problem at once with its field path, and returns a frozen object. A caller
// that gets an error keeps serving with the last good config.
import { X509Certificate } from 'node:crypto';
import { isIP } from 'node:net';
import { parseDocument } from 'yaml';
import { z } from 'zod';
import {
  DEFAULT_GROUPS_EXTENSION,
  DEFAULT_KUBE_CERT_AGENT_MODE,
  DEFAULT_PROXY_MODE,
  DEFAULT_SERVICE_TYPE,
  DEFAULT_EXTERNAL_TRAFFIC_POLICY,
  DEFAULT_SSH_HUB_NAME,
  DEFAULT_SSH_MAX_BINDING_LIFETIME,
  DEFAULT_SSH_SCOPES,
  DEFAULT_SSH_SERVICE_PORT,
} from '../apis/install.ts';
import {
  DEFAULT_ACCESS_HUB_NAME,
  DEFAULT_MAX_DURATION_SECONDS,
  MAX_DURATION_SECONDS,
  reasonProblem,
} from '../apis/access.ts';
import { parseDuration } from '../lib/duration.ts';
import { SealionError } from '../lib/errors.ts';
import { isDNSLabel, isDNSSubdomain } from '../apis/names.ts';
import { parseTrustedCAKeys } from '../lib/ssh/keys.ts';

/**
 * A hand-written config is a few hundred bytes; 64 KiB leaves room for many annotations while keeping the YAML
 * parser (and anyone who can edit the ConfigMap) from spending much memory on it.
 */
export const MAX_CONFIG_BYTES = 64 * 1024;
/** YAML aliases can blow a small document up exponentially ("billion laughs"); a real config needs none. */
const MAX_YAML_ALIASES = 50;

export const ProxyModes = ['auto', 'enabled', 'disabled'] as const;
export const ServiceTypes = ['LoadBalancer', 'ClusterIP', 'None'] as const;
export const ExternalTrafficPolicies = ['Local', 'Cluster'] as const;
export const KubeCertAgentModes = ['auto', 'enabled', 'disabled'] as const;
export const SshModes = ['enabled', 'disabled'] as const;

export type ConfigProblemCode =
  | 'TooLarge'
  | 'InvalidYAML'
  | 'InvalidType'
  | 'UnknownField'
  | 'InvalidEnum'
  | 'InvalidValue'
  | 'Required'
  | 'Conflict';

export interface ConfigProblem {
  code: ConfigProblemCode;
  /** Dotted field path, e.g. `impersonationProxy.service.type`; empty for the whole document. */
  path: string;
  message: string;
}

export class ConfigError extends SealionError {
  readonly problems: readonly ConfigProblem[];
  /** Every problem with its field path, for a status message. */
  readonly summary: string;

  constructor(problems: ConfigProblem[]) {
    const summary = problems.map((p) => (p.path ? `${p.path}: ${p.message}` : p.message)).join('; ');
    super('InvalidConfig', `load config: ${summary}`);
    this.name = 'ConfigError';
    this.problems = problems;
    this.summary = summary;
  }
}

const QUALIFIED_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$/;

function custom(ctx: z.RefinementCtx, code: ConfigProblemCode, message: string): void {
  ctx.addIssue({ code: 'custom', message, params: { code } });
}

const endpointSchema = z.string().transform((value, ctx) => {
  if (value === '') return '';
  const withScheme = value.includes('://') ? value : `https://${value}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    custom(ctx, 'InvalidValue', 'must be host[:port] or https://host[:port]');
    return value;
  }
  if (url.protocol !== 'https:') custom(ctx, 'InvalidValue', 'must use https');
  else if (
    url.username ||
    url.password ||
    url.search ||
    url.hash ||
    (url.pathname !== '/' && url.pathname !== '')
  ) {
    custom(
      ctx,
      'InvalidValue',
      'must be host[:port] or https://host[:port], without path, query or credentials',
    );
  } else if (withScheme.replace(/\/$/, '').endsWith(':')) custom(ctx, 'InvalidValue', 'has an empty port');
  return `https://${url.host}`;
});

const annotationKey = z.string().refine(
  (key) => {
    const [prefix, name, extra] = key.includes('/') ? key.split('/') : [undefined, key];
    return (
      extra === undefined &&
      (prefix === undefined || isDNSSubdomain(prefix)) &&
      QUALIFIED_NAME.test(name ?? '')
    );
  },
  { message: 'annotation keys must be [prefix/]name, as in Kubernetes', params: { code: 'InvalidValue' } },
);

const serviceSchema = z
  .strictObject({
    type: z.enum(ServiceTypes).default(DEFAULT_SERVICE_TYPE),
    annotations: z.record(annotationKey, z.string()).default({}),
    loadBalancerIP: z
      .string()
      .default('')
      .refine((ip) => ip === '' || isIP(ip) !== 0, {
        message: 'must be an IP address',
        params: { code: 'InvalidValue' },
      }),
    externalTrafficPolicy: z.enum(ExternalTrafficPolicies).default(DEFAULT_EXTERNAL_TRAFFIC_POLICY),
  })
  .prefault({});

const caDataSchema = z
  .string()
  .default('')
  .refine(
    (data) => {
      if (data === '') return true;
      const pem = Buffer.from(data, 'base64').toString('utf8');
      try {
        new X509Certificate(pem);
        return pem.includes('-----BEGIN CERTIFICATE-----');
      } catch {
        return false;
      }
    },
    { message: 'must be a base64-encoded PEM certificate bundle', params: { code: 'InvalidValue' } },
  );

const tlsSchema = z
  .strictObject({
    certificateAuthorityData: caDataSchema,
    secretName: z
      .string()
      .default('')
      .refine((name) => name === '' || isDNSSubdomain(name), {
        message: 'must be a Secret name (a DNS subdomain)',
        params: { code: 'InvalidValue' },
      }),
  })
  .prefault({});

const nameSchema = (what: string, valid: (name: string) => boolean) =>
  z.string().refine(valid, { message: `must be ${what}`, params: { code: 'InvalidValue' } });

/** The bounds of ssh.maxBindingLifetime: a few minutes (less is a login per command), a week. */
export const MIN_BINDING_LIFETIME_MS = 5 * 60_000;
export const MAX_BINDING_LIFETIME_MS = 168 * 3600_000;

export { parseDuration };

const durationSchema = (min: number, max: number) =>
  z.string().refine(
    (text) => {
      const ms = parseDuration(text);
      return ms !== undefined && ms >= min && ms <= max;
    },
    {
      message: `must be a duration such as 12h or 1h30m, from ${min / 60_000}m to ${max / 3600_000}h`,
      params: { code: 'InvalidValue' },
    },
  );

/** The SSH door (concierge/ssh/): off unless turned on. */
const sshSchema = z
  .strictObject({
    mode: z.enum(SshModes).default('disabled'),
    /** The port of the proxy's Service that SSH clients connect to. */
    port: z.number().int().min(1).max(65535).default(DEFAULT_SSH_SERVICE_PORT),
    /** What targets call the hub's own cluster. */
    hubName: nameSchema('a DNS label', isDNSLabel).default(DEFAULT_SSH_HUB_NAME),
    /** The device login at a JWTAuthenticator's issuer; absent: only bound keys and certificates sign in. */
    login: z
      .strictObject({
        authenticator: nameSchema('a JWTAuthenticator name', isDNSSubdomain),
        clientID: z.string().max(256).default(''),
        scopes: z
          .array(
            z
              .string()
              .regex(/^[\x21\x23-\x5b\x5d-\x7e]+$/)
              .max(128),
          )
          .max(20)
          .default([...DEFAULT_SSH_SCOPES]),
      })
      .optional(),
    /** Trusted user-certificate CAs, one public key each, as in authorized_keys. */
    certificateAuthorities: z
      .array(z.string().max(16 * 1024))
      .max(32)
      .default([])
      .superRefine((lines, ctx) => {
        const { problems } = parseTrustedCAKeys(lines);
        for (const { line, problem } of problems) custom(ctx, 'InvalidValue', `entry ${line}: ${problem}`);
      }),
    /** The certificate extension whose value is the user's groups, comma-separated. */
    groupsExtension: z.string().min(1).max(128).default(DEFAULT_GROUPS_EXTENSION),
    /** Certificates may name `system:` users and groups. */
    allowSystemNames: z.boolean().default(false),
    /** How long a device login keeps a key bound at most, renewals included. */
    maxBindingLifetime: durationSchema(MIN_BINDING_LIFETIME_MS, MAX_BINDING_LIFETIME_MS).default(
      DEFAULT_SSH_MAX_BINDING_LIFETIME,
    ),
  })
  .prefault({});

/** Who may ask for what through an access request (apis/access.ts AccessPolicy). */
const accessPolicySchema = z
  .strictObject({
    groups: z
      .array(
        z
          .string()
          .min(1)
          .max(256)
          .refine((group) => reasonProblem(group) === undefined, {
            message: 'must be a group name without control characters',
            params: { code: 'InvalidValue' },
          }),
      )
      .max(64)
      .default([]),
    maxDurationSeconds: z
      .number()
      .int()
      .min(60)
      .max(MAX_DURATION_SECONDS)
      .default(DEFAULT_MAX_DURATION_SECONDS),
    approvals: z.number().int().min(1).max(16).default(1),
    requireReason: z.boolean().default(false),
  })
  .prefault({});

/** Access requests: what they call the hub, and the hub's own policy (a Cluster's is on its spec.access). */
const accessRequestsSchema = z
  .strictObject({
    hubName: nameSchema('a DNS label', isDNSLabel).default(DEFAULT_ACCESS_HUB_NAME),
    hub: accessPolicySchema,
  })
  .prefault({});

const configSchema = z
  .strictObject({
    impersonationProxy: z
      .strictObject({
        mode: z.enum(ProxyModes).default(DEFAULT_PROXY_MODE),
        endpoint: z.string().default('').pipe(endpointSchema),
        service: serviceSchema,
        tls: tlsSchema,
      })
      .prefault({}),
    kubeCertAgent: z
      .strictObject({ mode: z.enum(KubeCertAgentModes).default(DEFAULT_KUBE_CERT_AGENT_MODE) })
      .prefault({}),
    ssh: sshSchema,
    accessRequests: accessRequestsSchema,
  })
  .prefault({});

export type SealionConfig = DeepReadonly<z.output<typeof configSchema>>;
type DeepReadonly<T> = T extends object ? { readonly [K in keyof T]: DeepReadonly<T[K]> } : T;

function formatPath(path: readonly PropertyKey[]): string {
  return path.map(String).join('.');
}

function fromZod(issue: z.core.$ZodIssue): ConfigProblem[] {
  const path = formatPath(issue.path);
  switch (issue.code) {
    case 'unrecognized_keys':
      return issue.keys.map((key) => ({
        code: 'UnknownField' as const,
        path: path ? `${path}.${key}` : key,
        message: 'unknown field',
      }));
    case 'invalid_value':
      return [
        { code: 'InvalidEnum', path, message: `must be one of ${issue.values.map(String).join(', ')}` },
      ];
    case 'invalid_type':
      return [
        {
          code: 'InvalidType',
          path,
          message: `must be ${issue.expected === 'record' ? 'a mapping' : `a ${issue.expected}`}`,
        },
      ];
    case 'invalid_key':
      // The issue's path already ends in the offending key.
      return issue.issues.flatMap((inner) => fromZod({ ...inner, path: issue.path }));
    case 'custom': {
      const code = (issue.params as { code?: ConfigProblemCode } | undefined)?.code ?? 'InvalidValue';
      return [{ code, path, message: issue.message }];
    }
    default:
      return [{ code: 'InvalidValue', path, message: issue.message }];
  }
}

/** Rules that tie fields together. They read the raw input so they report even when other fields are wrong. */
function crossFieldProblems(raw: unknown): ConfigProblem[] {
  const get = (obj: unknown, key: string): unknown =>
    obj !== null && typeof obj === 'object' && !Array.isArray(obj)
      ? (obj as Record<string, unknown>)[key]
      : undefined;
  const proxy = get(raw, 'impersonationProxy');
  const service = get(proxy, 'service');
  const tls = get(proxy, 'tls');
  const type = get(service, 'type') ?? DEFAULT_SERVICE_TYPE;
  const nonEmpty = (v: unknown): boolean => typeof v === 'string' && v !== '';
  const problems: ConfigProblem[] = [];
  if (type === 'None' && !nonEmpty(get(proxy, 'endpoint'))) {
    problems.push({
      code: 'Required',
      path: 'impersonationProxy.endpoint',
      message: 'required when impersonationProxy.service.type is None (clients need an address)',
    });
  }
  if (type !== 'LoadBalancer' && nonEmpty(get(service, 'loadBalancerIP'))) {
    problems.push({
      code: 'Conflict',
      path: 'impersonationProxy.service.loadBalancerIP',
      message: `only applies to service type LoadBalancer, not ${JSON.stringify(type)}`,
    });
  }
  if (type === 'None' && Object.keys((get(service, 'annotations') as object | undefined) ?? {}).length > 0) {
    problems.push({
      code: 'Conflict',
      path: 'impersonationProxy.service.annotations',
      message: 'service type None creates no Service to annotate',
    });
  }
  if (nonEmpty(get(tls, 'certificateAuthorityData')) && !nonEmpty(get(tls, 'secretName'))) {
    problems.push({
      code: 'Required',
      path: 'impersonationProxy.tls.secretName',
      message:
        "required when tls.certificateAuthorityData is set (the CA describes that Secret's certificate)",
    });
  }
  return problems;
}

function deepFreeze<T>(value: T): T {
  if (value !== null && typeof value === 'object') {
    for (const child of Object.values(value)) deepFreeze(child);
    Object.freeze(value);
  }
  return value;
}

/** Parses and validates `config.yaml`. Empty text gives the defaults. Throws ConfigError listing every problem. */
export function loadConfig(text: string): SealionConfig {
  const size = Buffer.byteLength(text, 'utf8');
  if (size > MAX_CONFIG_BYTES) {
    throw new ConfigError([
      { code: 'TooLarge', path: '', message: `${size} bytes is over the limit of ${MAX_CONFIG_BYTES}` },
    ]);
  }
  const doc = parseDocument(text, { uniqueKeys: true, prettyErrors: false });
  if (doc.errors.length > 0) {
    throw new ConfigError(
      doc.errors.map((e) => ({
        code: 'InvalidYAML' as const,
        path: '',
        message: `invalid YAML at line ${e.linePos?.[0]?.line ?? '?'}: ${e.message.split('\n')[0]}`,
      })),
    );
  }
  let raw: unknown;
  try {
    raw = doc.toJS({ maxAliasCount: MAX_YAML_ALIASES }) ?? {};
  } catch (err) {
    throw new ConfigError([{ code: 'InvalidYAML', path: '', message: (err as Error).message }]);
  }
  return configFromObject(raw);
}

/** Validates a configuration already parsed (from YAML, or read back from the API). Throws ConfigError. */
export function configFromObject(raw: unknown): SealionConfig {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new ConfigError([{ code: 'InvalidType', path: '', message: 'the document must be a mapping' }]);
  }
  const result = configSchema.safeParse(raw);
  const problems = [
    ...(result.success ? [] : result.error.issues.flatMap(fromZod)),
    ...crossFieldProblems(raw),
  ];
  if (problems.length > 0 || !result.success) throw new ConfigError(problems);
  return deepFreeze(result.data);
}

/** The configuration in effect, and why the latest edit was rejected when it was. */
export interface ConfigState {
  config: SealionConfig;
  /** The rejected edit's problems, each with its field path; absent when the latest edit is in effect. */
  problem?: string;
}

/**
 * Level-triggered view of the ConfigMap's `config.yaml`: every call parses the current text (memoized on the
 * text), and a text that fails keeps the last good configuration in effect. A missing ConfigMap or key is the
 * defaults, since deleting the configuration is a deliberate act, unlike a typo. `lastGood` is the configuration
 * that was in effect before this process started (kept in the API), for a start during a bad edit.
 */
export function newConfigSource(
  text: () => string | undefined,
  onRejected: (problem: string) => void,
  lastGood?: SealionConfig,
): () => ConfigState {
  let lastText: string | undefined;
  let state: ConfigState = { config: lastGood ?? loadConfig('') };
  return () => {
    const current = text() ?? '';
    if (current === lastText) return state;
    lastText = current;
    try {
      state = { config: loadConfig(current) };
    } catch (err) {
      if (!(err instanceof ConfigError)) throw err;
      state = { config: state.config, problem: err.summary };
      onRejected(err.summary);
    }
    return state;
  };
}
