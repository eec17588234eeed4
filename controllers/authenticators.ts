// The JWTAuthenticator and WebhookAuthenticator controllers: validate each authenticator and keep the
// authenticator cache in step (every replica), and write phase and conditions (the leader). An authenticator that turns invalid leaves the
// cache before its status says so; a valid one is validated again only when its spec (or CA) changes.
import { compileJWTConfiguration, compileUserRules } from '../lib/authn/jwt-mapping.ts';
import { createHash } from 'node:crypto';
import type {
  AuthenticatorStatus,
  CertificateAuthorityDataSource,
  JWTAuthenticator,
  TLSSpec,
  WebhookAuthenticator,
} from '../apis/authentication.ts';
import type { AuthenticatorCache, AuthenticatorKind, IssuerProvider } from '../lib/authn/cache.ts';
import { validateJWT, type Check, type JWTDependencies, type JWTSettings } from '../lib/authn/jwt.ts';
import { SYSTEM_NAMES_ALLOWED_NOTE } from '../lib/authn/system-names.ts';
import { jwtTrustDigest, webhookTrustDigest } from '../lib/authn/trust.ts';
import { WebhookAuthenticator as WebhookClient } from '../lib/authn/webhook.ts';
import type { Logger } from '../lib/log.ts';
import { decodeCABundle } from '../lib/pki/pem.ts';
import { mergeConditions, readyCondition, sameIgnoringTimes } from '../lib/controller/conditions.ts';
import type { Controller, Watch } from '../lib/controller/controller.ts';
import type { Informer, KubeObject } from '../lib/kube/informer.ts';
import type { SyncResult } from '../lib/controller/queue.ts';
import type { StatusWriter } from '../lib/kube/status-writer.ts';

export interface AuthenticatorControllerDeps<T> {
  informer: Informer<T & { metadata: { name?: string } }>;
  cache: AuthenticatorCache;
  status: StatusWriter<AuthenticatorStatus>;
  log: Logger;
  /** The validator found something about authenticator `name`: the status writer `controller` should look. */
  validated?: (controller: string, name: string) => void;
  /** Default: () => new Date(). */
  now?: () => Date;
  /**
   * The Secrets and ConfigMaps of the concierge's namespace, where tls.certificateAuthorityDataSource points: watched,
   * so that a rotated CA applies at once. Default: none (such a spec fails its TLS check).
   */
  caSources?: CASources;
}

export interface CASources {
  namespace: string;
  secrets: Informer<KubeObject & { data?: Record<string, string> }>;
  configMaps: Informer<KubeObject & { data?: Record<string, string> }>;
}

/**
 * The PEM bundle a tls.certificateAuthorityDataSource names, or why there is none. A Secret's data is base64, a
 * ConfigMap's the text itself.
 */
function sourcedCA(
  source: CertificateAuthorityDataSource,
  sources: CASources | undefined,
): { pem?: string; problem?: string } {
  const where = `${source.kind} ${sources?.namespace ?? ''}/${source.name}`;
  if (!sources) return { problem: `${where} cannot be read here` };
  const informer = source.kind === 'Secret' ? sources.secrets : sources.configMaps;
  const obj = informer.get(source.name, sources.namespace);
  const value = obj?.data?.[source.key];
  if (!obj) return { problem: `${where} does not exist` };
  if (value === undefined || value === '') return { problem: `${where} has no key ${source.key}` };
  const pem = source.kind === 'Secret' ? Buffer.from(value, 'base64').toString('utf8') : value;
  return caProblem(Buffer.from(pem).toString('base64'));
}

/**
 * The CA bundle a spec trusts, inline (`inlineBase64`, at `inlineField`) or from its source, or why it cannot be used
 * (naming the field).
 */
function specCA(
  tls: TLSSpec | undefined,
  inlineBase64: string | undefined,
  sources: CASources | undefined,
  inlineField = 'spec.tls.certificateAuthorityData',
): { pem?: string; problem?: string } {
  const source = tls?.certificateAuthorityDataSource;
  const found = source ? sourcedCA(source, sources) : caProblem(inlineBase64);
  const field = source ? 'spec.tls.certificateAuthorityDataSource' : inlineField;
  return found.problem ? { problem: `${field}: ${found.problem}` } : found;
}

/** The names of the authenticators whose CA is kept in `obj` (a Secret or ConfigMap of `kind`). */
function referringTo<T extends JWTAuthenticator | WebhookAuthenticator>(
  informer: Informer<T>,
  kind: 'Secret' | 'ConfigMap',
  name: string | undefined,
): string[] {
  return informer
    .list()
    .filter((a) => {
      const source = a.spec.tls?.certificateAuthorityDataSource;
      return source?.kind === kind && source.name === name;
    })
    .map((a) => a.metadata.name ?? '');
}

type Validated = {
  checks: Check[];
  authenticator?: { authenticate: WebhookClient['authenticate']; close?: () => void };
  issuer?: string;
  provider?: IssuerProvider;
  /**
   * The authenticator's scheduled upkeep (a JWT issuer's keys): resolves to how long until it is due again, rejects
   * when it failed (retried with backoff). Called at each sync of a loaded authenticator.
   */
  refresh?: () => Promise<number>;
};

function caProblem(data: string | undefined): { pem?: string; problem?: string } {
  if (!data) return {};
  try {
    return { pem: decodeCABundle(data) };
  } catch (err) {
    return { problem: (err as Error).message };
  }
}

function specHash(spec: unknown): string {
  return createHash('sha256').update(JSON.stringify(spec)).digest('hex');
}

/**
 * The two controllers of one kind. The validator runs on every replica: it validates each authenticator and keeps
 * the cache in step. The status writer runs on the leader only: it writes what the validator found.
 */
export interface AuthenticatorControllers {
  validator: Controller;
  status: Controller;
}

/**
 * Checks that judge the spec alone. A spec that fails one stays wrong until it is edited, and the edit wakes the
 * validator; anything else (an issuer or webhook that is down or answers wrongly) may pass, and is retried.
 */
const SPEC_CHECKS = new Set([
  'TLSConfigurationValid',
  'IssuerURLValid',
  'EndpointURLValid',
  'AuthenticatorValid',
]);

/** What the validator found, shared with the status writer of the same kind. */
interface Findings {
  /** The spec hash and checks of each authenticator in the cache: validated again only when its spec changes. */
  validated: Map<string, { hash: string; checks: Check[]; refresh?: () => Promise<number> }>;
  /** What the latest validation of each authenticator found, for the status writer. */
  found: Map<string, { ok: boolean; checks: Check[] }>;
}

/** Shared by both kinds; `validate` is what differs. */
function newAuthenticatorControllers<T extends JWTAuthenticator | WebhookAuthenticator>(
  kind: AuthenticatorKind,
  deps: AuthenticatorControllerDeps<T>,
  /** What certificates issued on its word are bound to besides its uid (lib/authn/trust.ts). */
  trustDigest: (spec: T['spec']) => string,
  validate: (obj: T, signal: AbortSignal) => Promise<Validated>,
): AuthenticatorControllers {
  const findings: Findings = { validated: new Map(), found: new Map() };
  const log = deps.log.child({ kind });
  return {
    validator: cacheFiller(kind, deps, log, findings, trustDigest, validate),
    status: statusWriter(kind, deps, log, findings),
  };
}

/** The validator's watches: its authenticators, and the Secrets and ConfigMaps that hold their CAs. */
function validatorWatches<T extends JWTAuthenticator | WebhookAuthenticator>(
  deps: AuthenticatorControllerDeps<T>,
): Watch[] {
  const sources = deps.caSources;
  return [
    { informer: deps.informer },
    // A rotated CA in a Secret or ConfigMap that an authenticator names: that authenticator is validated again.
    ...(sources
      ? (['Secret', 'ConfigMap'] as const).map((sourceKind) => ({
          informer: sourceKind === 'Secret' ? sources.secrets : sources.configMaps,
          filter: (o: KubeObject) => o.metadata?.namespace === sources.namespace,
          key: (o: KubeObject) => referringTo(deps.informer as Informer<T>, sourceKind, o.metadata?.name),
        }))
      : []),
  ];
}

/**
 * What an authenticator's validation depends on: the object's uid with its spec (one deleted and made again under
 * the same name between two looks is another authenticator, and certificates issued on the old one's word must not
 * pass for the new one's), and the CA a source holds (a rotation makes it another authenticator).
 */
function validationHash<T extends JWTAuthenticator | WebhookAuthenticator>(
  obj: T,
  sources?: CASources,
): string {
  const source = obj.spec.tls?.certificateAuthorityDataSource;
  const sourced = source ? specHash(sourcedCA(source, sources)) : '';
  return `${obj.metadata.uid ?? ''}/${specHash(obj.spec)}/${sourced}`;
}

/** The authenticator `result` built, into the cache under `name`, with what its object says about its use. */
function loadIntoCache<T extends JWTAuthenticator | WebhookAuthenticator>(
  kind: AuthenticatorKind,
  cache: AuthenticatorCache,
  obj: T,
  result: Validated & { authenticator: NonNullable<Validated['authenticator']> },
  trustDigest: (spec: T['spec']) => string,
): void {
  cache.set(kind, obj.metadata.name ?? '', result.authenticator, {
    ...(result.issuer === undefined ? {} : { issuer: result.issuer }),
    ...(result.provider ? { provider: result.provider } : {}),
    ...(obj.spec.credentialLifetimeSeconds === undefined
      ? {}
      : { credentialLifetimeSeconds: obj.spec.credentialLifetimeSeconds }),
    // Certificates issued on its word from now on hold while it is loaded with a spec that trusts the same.
    ...(obj.metadata.uid ? { binding: { uid: obj.metadata.uid, trust: trustDigest(obj.spec) } } : {}),
    ...(obj.spec.allowSystemNames === true ? { allowSystemNames: true } : {}),
  });
}

/** Every replica: validates each authenticator whose spec changed and keeps the cache in step. */
function cacheFiller<T extends JWTAuthenticator | WebhookAuthenticator>(
  kind: AuthenticatorKind,
  deps: AuthenticatorControllerDeps<T>,
  log: Logger,
  { validated, found }: Findings,
  trustDigest: (spec: T['spec']) => string,
  validate: (obj: T, signal: AbortSignal) => Promise<Validated>,
): Controller {
  const statusName = `${kind}-status`;
  return {
    name: `${kind}-cache-filler`,
    watches: validatorWatches(deps),
    // What is wrong with an authenticator becomes its conditions (the status writer's). A mistake in the spec is not
    // retried; a failure of the issuer or webhook is, with backoff, since it may come back. A loaded authenticator
    // with keys to refresh comes back when they are due; a refresh that fails is retried with backoff too.
    async sync(name: string, signal: AbortSignal): Promise<SyncResult> {
      const obj = deps.informer.get(name);
      if (!obj) {
        deps.cache.delete(kind, name);
        validated.delete(name);
        found.delete(name);
        return;
      }
      const hash = validationHash(obj, deps.caSources);
      let result: Validated | undefined;
      const known = validated.get(name);
      const ready = known?.hash === hash && deps.cache.has(kind, name);
      if (!ready) {
        result = await validate(obj, signal);
        // Stopped meanwhile: what a cut-short validation found says nothing about the authenticator.
        signal.throwIfAborted();
        if (result.authenticator) {
          loadIntoCache(
            kind,
            deps.cache,
            obj,
            { ...result, authenticator: result.authenticator },
            trustDigest,
          );
          validated.set(name, {
            hash,
            checks: result.checks,
            ...(result.refresh ? { refresh: result.refresh } : {}),
          });
          // Once per loaded spec: an opt-out of a safety default should never go unnoticed in the log.
          if (obj.spec.allowSystemNames === true)
            log.warn(
              { name },
              'authenticator loaded with spec.allowSystemNames: it may authenticate users named system:* or in system:* groups',
            );
        } else {
          // Out of the cache first: from this moment no request is authenticated by a broken authenticator.
          deps.cache.delete(kind, name);
          validated.delete(name);
        }
      }
      const ok = ready || Boolean(result?.authenticator);
      found.set(name, { ok, checks: result ? result.checks : known!.checks });
      deps.validated?.(statusName, name);
      const failed = (result?.checks ?? []).find((c) => c.status === 'False');
      if (!ok) return failed && SPEC_CHECKS.has(failed.type) ? undefined : { retry: true };
      const refresh = validated.get(name)?.refresh;
      return refresh ? { requeueAfterMs: await refresh() } : undefined;
    },
  };
}

/** The leader: writes phase and conditions from what the validator found. */
function statusWriter<T extends JWTAuthenticator | WebhookAuthenticator>(
  kind: AuthenticatorKind,
  deps: AuthenticatorControllerDeps<T>,
  log: Logger,
  { found }: Findings,
): Controller {
  const now = deps.now ?? (() => new Date());
  return {
    name: `${kind}-status`,
    watches: [{ informer: deps.informer }],
    // Failed writes throw and retry.
    async sync(name: string): Promise<SyncResult> {
      const obj = deps.informer.get(name);
      const latest = found.get(name);
      if (!obj || !latest) return;
      const checks = [...latest.checks, readyCondition(latest.checks, kind)];
      const wanted: AuthenticatorStatus = {
        phase: latest.ok ? 'Ready' : 'Error',
        conditions: mergeConditions(
          obj.status?.conditions,
          checks,
          now(),
          (obj.metadata as { generation?: number }).generation,
        ),
      };
      const current = { phase: obj.status?.phase, conditions: obj.status?.conditions };
      if (sameIgnoringTimes(current, wanted)) return;
      await deps.status.patchStatus(name, wanted);
      log.info(
        {
          name,
          phase: wanted.phase,
          failed: checks.filter((c) => c.status === 'False').map((c) => `${c.type}: ${c.message}`),
        },
        'authenticator status changed',
      );
    },
  };
}

export function newJWTAuthenticatorControllers(
  deps: AuthenticatorControllerDeps<JWTAuthenticator>,
  jwtDeps: JWTDependencies = {},
): AuthenticatorControllers {
  const warn = (message: string, fields: Record<string, unknown>): void => deps.log.warn(fields, message);
  return newAuthenticatorControllers('JWTAuthenticator', deps, jwtTrustDigest, async (obj, signal) => {
    const settings = jwtSettings(obj.spec);
    const inline = obj.spec.jwt
      ? obj.spec.jwt.issuer.certificateAuthority &&
        Buffer.from(obj.spec.jwt.issuer.certificateAuthority).toString('base64')
      : obj.spec.tls?.certificateAuthorityData;
    const ca = specCA(
      obj.spec.tls,
      inline || undefined,
      deps.caSources,
      obj.spec.jwt ? 'spec.jwt.issuer.certificateAuthority' : undefined,
    );
    if (ca.pem) settings.caBundlePem = ca.pem;
    const validation = await validateJWT(settings, ca.problem, { warn, ...jwtDeps }, signal);
    const authenticator = validation.authenticator;
    return {
      checks: validation.checks,
      ...(authenticator
        ? {
            authenticator,
            // The issuer's keys, fetched again when due: this controller comes back for them (JWKS_REFRESH_INTERVAL_MS).
            refresh: () => authenticator.keys.refreshIfDue(),
            issuer: settings.issuer,
            provider: {
              issuer: settings.issuer,
              audience: settings.audience,
              ...(settings.caBundlePem ? { caBundlePem: settings.caBundlePem } : {}),
            },
          }
        : {}),
    };
  });
}

/**
 * The JWT authenticator's settings from its spec: the structured form (spec.jwt) compiled, or the claims and prefixes
 * of the older fields. Either way the spec says each thing once: the CRD refuses both at once.
 */
function jwtSettings(spec: JWTAuthenticator['spec']): JWTSettings {
  const common = { ...(spec.allowSystemNames === true ? { allowSystemNames: true } : {}) };
  if (spec.jwt) {
    const mapping = compileJWTConfiguration(spec.jwt);
    return {
      issuer: spec.jwt.issuer?.url ?? '',
      audience: spec.jwt.issuer?.audiences?.[0] ?? '',
      ...common,
      ...('problems' in mapping ? { mappingProblem: mapping.problems.join('; ') } : { mapping }),
    };
  }
  const claims = spec.claims;
  return {
    issuer: spec.issuer ?? '',
    audience: spec.audience ?? '',
    ...(claims?.username ? { usernameClaim: claims.username } : {}),
    ...(claims?.groups ? { groupsClaim: claims.groups } : {}),
    ...(claims?.usernamePrefix ? { usernamePrefix: claims.usernamePrefix } : {}),
    ...(claims?.groupsPrefix ? { groupsPrefix: claims.groupsPrefix } : {}),
    ...common,
  };
}

function endpointProblem(endpoint: string): string | undefined {
  if (!URL.canParse(endpoint)) return `spec.endpoint ${JSON.stringify(endpoint)} is not a URL`;
  const url = new URL(endpoint);
  if (url.protocol !== 'https:') return `spec.endpoint must use https, not ${url.protocol.replace(':', '')}`;
  if (url.username || url.password) return 'spec.endpoint must not contain credentials';
  return undefined;
}

export function newWebhookAuthenticatorControllers(
  deps: AuthenticatorControllerDeps<WebhookAuthenticator>,
): AuthenticatorControllers {
  return newAuthenticatorControllers('WebhookAuthenticator', deps, webhookTrustDigest, (obj) =>
    validateWebhook(obj, deps.caSources),
  );
}

/** The webhook's checks, in order; after a failed one, the rest are Unknown. */
const WEBHOOK_CHECKS = [
  'TLSConfigurationValid',
  'EndpointURLValid',
  'WebhookConnectionValid',
  'AuthenticatorValid',
] as const;

const passed = (type: string, message: string): Check => ({
  type,
  status: 'True',
  reason: 'Success',
  message,
});

/** `checks` ended by a failed `type`, and every later check Unknown. */
function failedAt(
  checks: Check[],
  type: (typeof WEBHOOK_CHECKS)[number],
  reason: string,
  message: string,
): Check[] {
  const later = WEBHOOK_CHECKS.slice(WEBHOOK_CHECKS.indexOf(type) + 1);
  return [
    ...checks,
    { type, status: 'False', reason, message },
    ...later.map((unknown): Check => ({
      type: unknown,
      status: 'Unknown',
      reason: 'UnableToValidate',
      message: 'unable to validate; see other conditions for details',
    })),
  ];
}

/**
 * A WebhookAuthenticator's checks (its CA, its endpoint, a verified TLS connection to it, its user validation rules)
 * and, when all pass, its client.
 */
async function validateWebhook(
  obj: WebhookAuthenticator,
  sources: CASources | undefined,
): Promise<Validated> {
  const checks: Check[] = [];
  const ca = specCA(obj.spec.tls, obj.spec.tls?.certificateAuthorityData, sources);
  if (ca.problem)
    return { checks: failedAt(checks, 'TLSConfigurationValid', 'InvalidTLSConfiguration', ca.problem) };
  checks.push(
    passed(
      'TLSConfigurationValid',
      ca.pem ? 'the CA bundle is valid' : 'no CA bundle given: trusting the system roots',
    ),
  );
  const problem = endpointProblem(obj.spec.endpoint);
  if (problem) return { checks: failedAt(checks, 'EndpointURLValid', 'InvalidEndpointURL', problem) };
  checks.push(passed('EndpointURLValid', 'endpoint is a valid https URL'));
  const allowSystemNames = obj.spec.allowSystemNames === true;
  const ruleProblems: string[] = [];
  const userRules = compileUserRules(obj.spec.userValidationRules, 'spec.userValidationRules', ruleProblems);
  const client = new WebhookClient({
    endpoint: obj.spec.endpoint,
    ...(ca.pem ? { caBundlePem: ca.pem } : {}),
    ...(allowSystemNames ? { allowSystemNames } : {}),
    ...(userRules.length > 0 ? { userRules } : {}),
  });
  try {
    await client.probe();
  } catch (err) {
    const message = `cannot open a verified TLS connection to ${obj.spec.endpoint}: ${(err as Error).message}`;
    return { checks: failedAt(checks, 'WebhookConnectionValid', 'UnableToDialServer', message) };
  }
  checks.push(passed('WebhookConnectionValid', 'TLS connection to the webhook verified'));
  if (ruleProblems.length > 0)
    return {
      checks: failedAt(checks, 'AuthenticatorValid', 'InvalidAuthenticator', ruleProblems.join('; ')),
    };
  checks.push(
    passed(
      'AuthenticatorValid',
      allowSystemNames
        ? `authenticator initialized; ${SYSTEM_NAMES_ALLOWED_NOTE}`
        : 'authenticator initialized',
    ),
  );
  return { checks, authenticator: client };
}
