// Kubernetes' structured authentication for one issuer (a `jwt` entry of AuthenticationConfiguration): the entry checked
// as the API server checks it when it loads --authentication-config, its expressions compiled once (cel.ts), and a
// verified token's claims turned into a user as the API server turns them (k8s.io/apiserver's oidc authenticator):
// claim validation rules, then username, uid, groups and extra, then user validation rules.
import type { JWTConfiguration, UserValidationRule } from '../../apis/authentication.ts';
import {
  compileExpression,
  evaluateAll,
  evaluationProblem,
  ExpressionError,
  stringsResult,
  type CompiledExpression,
  type ExpressionKind,
} from './cel.ts';
import type { UserInfo } from './types.ts';

type Source = { claim: string; prefix: string } | { expression: CompiledExpression };

/** A jwt entry, checked and compiled. */
export interface JWTMapping {
  issuer: string;
  audiences: string[];
  discoveryURL?: string;
  caBundlePem?: string;
  claimRules: (
    { claim: string; requiredValue: string } | { expression: CompiledExpression; message: string }
  )[];
  username: Source;
  groups?: Source;
  uid?: { claim: string } | { expression: CompiledExpression };
  extra: { key: string; expression: CompiledExpression }[];
  userRules: UserRules;
}

const FIELD = 'spec.jwt';
/** Keys of extra attributes are domain-prefixed paths in lower case, with Kubernetes' own domains reserved. */
const EXTRA_KEY = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+\/[\x21-\x7e]+$/;
const RESERVED_DOMAIN = /^([^/]*\.)?(kubernetes\.io|k8s\.io)\//;

function httpsURL(value: string | undefined): boolean {
  if (!value || !URL.canParse(value)) return false;
  const url = new URL(value);
  return url.protocol === 'https:' && !url.username && !url.password && !url.search && !url.hash;
}

/**
 * The entry checked and compiled, or every problem with it, each naming its field (and, for an expression, the line
 * and column), as the API server refuses such a configuration.
 */
export function compileJWTConfiguration(config: JWTConfiguration): JWTMapping | { problems: string[] } {
  const problems: string[] = [];
  const compile = expressionCompiler(problems);
  const issuer = config.issuer;
  const audiences = issuer?.audiences ?? [];
  checkIssuer(issuer, problems);
  const caBundlePem = issuer?.certificateAuthority;
  const claimRules = compileClaimRules(config.claimValidationRules ?? [], compile, problems);
  const mappings = config.claimMappings;
  const username = compileSource('username', mappings?.username, config, compile, problems);
  if (!mappings?.username) problems.push(`${FIELD}.claimMappings.username: required`);
  const groups = compileSource('groups', mappings?.groups, config, compile, problems);
  const uid = compileUid(mappings?.uid, compile, problems);
  const extra = compileExtra(mappings?.extra ?? [], compile, problems);
  const userRules = compileUserRules(config.userValidationRules, `${FIELD}.userValidationRules`, problems);

  if (problems.length > 0 || !username) return { problems };
  return {
    issuer: issuer.url,
    audiences,
    ...(issuer.discoveryURL ? { discoveryURL: issuer.discoveryURL } : {}),
    ...(caBundlePem ? { caBundlePem } : {}),
    claimRules,
    username,
    ...(groups ? { groups } : {}),
    ...(uid ? { uid } : {}),
    extra,
    userRules,
  };
}

type Compile = (kind: ExpressionKind, expression: string, field: string) => CompiledExpression | undefined;

/** Compiles a CEL expression, or adds why it does not compile (naming `field`) to `problems`. */
function expressionCompiler(problems: string[]): Compile {
  return (kind, expression, field) => {
    try {
      return compileExpression(kind, expression);
    } catch (err) {
      problems.push(`${field}: ${err instanceof ExpressionError ? err.message : (err as Error).message}`);
      return undefined;
    }
  };
}

/** The issuer: its URL and discovery URL, audiences and their policy, CA bundle. */
function checkIssuer(issuer: JWTConfiguration['issuer'] | undefined, problems: string[]): void {
  if (!httpsURL(issuer?.url))
    problems.push(`${FIELD}.issuer.url: must be an https URL without query or fragment`);
  if (issuer?.discoveryURL !== undefined) {
    if (!httpsURL(issuer.discoveryURL))
      problems.push(`${FIELD}.issuer.discoveryURL: must be an https URL without query or fragment`);
    else if (issuer.discoveryURL === issuer.url)
      problems.push(`${FIELD}.issuer.discoveryURL: must differ from issuer.url`);
  }
  const audiences = issuer?.audiences ?? [];
  if (audiences.length === 0) problems.push(`${FIELD}.issuer.audiences: at least one is required`);
  if (audiences.some((a) => a === '')) problems.push(`${FIELD}.issuer.audiences: must not be empty`);
  if (new Set(audiences).size !== audiences.length)
    problems.push(`${FIELD}.issuer.audiences: duplicate values`);
  if (audiences.length > 1 && issuer!.audienceMatchPolicy !== 'MatchAny')
    problems.push(`${FIELD}.issuer.audienceMatchPolicy: must be MatchAny with more than one audience`);
  if (issuer?.audienceMatchPolicy !== undefined && issuer.audienceMatchPolicy !== 'MatchAny')
    problems.push(`${FIELD}.issuer.audienceMatchPolicy: must be MatchAny`);
  const caBundlePem = issuer?.certificateAuthority;
  if (caBundlePem !== undefined && !caBundlePem.includes('-----BEGIN CERTIFICATE-----'))
    problems.push(`${FIELD}.issuer.certificateAuthority: must be a PEM bundle of CA certificates`);
}

/** claimValidationRules: each a required claim value or an expression, claims named once. */
function compileClaimRules(
  rules: NonNullable<JWTConfiguration['claimValidationRules']>,
  compile: Compile,
  problems: string[],
): JWTMapping['claimRules'] {
  const claimRules: JWTMapping['claimRules'] = [];
  const ruleClaims = new Set<string>();
  rules.forEach((rule, i) => {
    const field = `${FIELD}.claimValidationRules[${i}]`;
    const hasClaim = rule.claim !== undefined && rule.claim !== '';
    const hasExpression = rule.expression !== undefined && rule.expression !== '';
    if (hasClaim === hasExpression)
      return void problems.push(`${field}: give exactly one of claim or expression`);
    if (hasClaim) {
      if (rule.message !== undefined) problems.push(`${field}.message: only with expression`);
      if (ruleClaims.has(rule.claim!)) problems.push(`${field}.claim: duplicate value`);
      ruleClaims.add(rule.claim!);
      claimRules.push({ claim: rule.claim!, requiredValue: rule.requiredValue ?? '' });
    } else {
      if (rule.requiredValue !== undefined) problems.push(`${field}.requiredValue: only with claim`);
      const expression = compile('claimValidation', rule.expression!, `${field}.expression`);
      if (expression) claimRules.push({ expression, message: rule.message ?? '' });
    }
  });
  return claimRules;
}

/** claimMappings.username or .groups: a claim with its prefix, or an expression. */
function compileSource(
  kind: 'username' | 'groups',
  value: { claim?: string; prefix?: string; expression?: string } | undefined,
  config: JWTConfiguration,
  compile: Compile,
  problems: string[],
): Source | undefined {
  const field = `${FIELD}.claimMappings.${kind}`;
  if (!value) return undefined;
  const hasClaim = value.claim !== undefined && value.claim !== '';
  const hasExpression = value.expression !== undefined && value.expression !== '';
  if (hasClaim === hasExpression) {
    // An empty groups mapping is no mapping; a username needs one.
    if (kind === 'groups' && !hasClaim && value.prefix === undefined) return undefined;
    problems.push(`${field}: give exactly one of claim or expression`);
    return undefined;
  }
  if (hasClaim) {
    if (value.prefix === undefined) problems.push(`${field}.prefix: required with claim (it may be "")`);
    return { claim: value.claim!, prefix: value.prefix ?? '' };
  }
  if (value.prefix !== undefined && value.prefix !== '') problems.push(`${field}.prefix: only with claim`);
  const expression = compile(kind, value.expression!, `${field}.expression`);
  // As the API server: an email used as the username must come with a look at whether it is verified.
  if (
    kind === 'username' &&
    /\bclaims\.email\b(?!_)/.test(value.expression!) &&
    !/\bclaims\.email_verified\b/.test(value.expression!) &&
    !(config.claimValidationRules ?? []).some((r) => r.expression?.includes('claims.email_verified'))
  )
    problems.push(
      `${field}.expression: claims.email_verified must be used in claimMappings.username.expression or claimValidationRules[].expression when claims.email is used in the username`,
    );
  return expression ? { expression } : undefined;
}

/** claimMappings.uid: a claim or an expression, not both. */
function compileUid(
  uid: { claim?: string; expression?: string } | undefined,
  compile: Compile,
  problems: string[],
): JWTMapping['uid'] {
  if (!uid) return undefined;
  const field = `${FIELD}.claimMappings.uid`;
  const hasClaim = uid.claim !== undefined && uid.claim !== '';
  const hasExpression = uid.expression !== undefined && uid.expression !== '';
  if (hasClaim && hasExpression) problems.push(`${field}: give claim or expression, not both`);
  else if (hasClaim) return { claim: uid.claim! };
  else if (hasExpression) {
    const expression = compile('uid', uid.expression!, `${field}.expression`);
    if (expression) return { expression };
  }
  return undefined;
}

/** claimMappings.extra: domain-prefixed keys, none reserved or repeated, each with its value expression. */
function compileExtra(
  mappings: NonNullable<NonNullable<JWTConfiguration['claimMappings']>['extra']>,
  compile: Compile,
  problems: string[],
): JWTMapping['extra'] {
  const extra: JWTMapping['extra'] = [];
  const keys = new Set<string>();
  mappings.forEach((mapping, i) => {
    const field = `${FIELD}.claimMappings.extra[${i}]`;
    if (!EXTRA_KEY.test(mapping.key ?? '') || mapping.key !== mapping.key.toLowerCase())
      problems.push(`${field}.key: must be a domain-prefixed path in lower case, such as example.com/team`);
    else if (RESERVED_DOMAIN.test(mapping.key))
      problems.push(`${field}.key: kubernetes.io and k8s.io are reserved`);
    if (keys.has(mapping.key)) problems.push(`${field}.key: duplicate value`);
    keys.add(mapping.key);
    if (!mapping.valueExpression) return void problems.push(`${field}.valueExpression: required`);
    const expression = compile('extra', mapping.valueExpression, `${field}.valueExpression`);
    if (expression) extra.push({ key: mapping.key, expression });
  });
  return extra;
}

/**
 * The user a verified token's claims make, or why it makes none (for the log only). Mirrors the API server: every
 * claim validation rule must hold; the username is a non-empty string (an email claim only when email_verified, if
 * present, is true); uid a string; groups and extra values strings or lists of strings, empty ones dropped; then every
 * user validation rule must hold.
 */
export function mapClaims(
  mapping: JWTMapping,
  claims: Record<string, unknown>,
): UserInfo | { reason: string } {
  const expressions: CompiledExpression[] = [];
  const slot = (e: CompiledExpression): number => expressions.push(e) - 1;
  const slots: Slots = {
    rules: mapping.claimRules.map((r) => ('expression' in r ? slot(r.expression) : -1)),
    username: 'expression' in mapping.username ? slot(mapping.username.expression) : -1,
    uid: mapping.uid && 'expression' in mapping.uid ? slot(mapping.uid.expression) : -1,
    groups: mapping.groups && 'expression' in mapping.groups ? slot(mapping.groups.expression) : -1,
    extra: mapping.extra.map((e) => slot(e.expression)),
  };
  let results: unknown[];
  try {
    results = evaluateAll(expressions, { claims });
  } catch (err) {
    return { reason: (err as Error).message };
  }
  const evaluated: Evaluated = {
    claims,
    value: (i) => results[i],
    failed: (i) => (results[i] instanceof Error ? evaluationProblem(expressions[i]!, results[i]) : undefined),
  };

  const ruleFailed = claimRulesProblem(mapping, evaluated, slots.rules);
  if (ruleFailed) return { reason: ruleFailed };
  const username = mappedUsername(mapping.username, evaluated, slots.username);
  if (username instanceof Refused) return { reason: username.reason };
  if (username === '') return { reason: 'the username is empty' };
  const uid = mappedUid(mapping.uid, evaluated, slots.uid);
  if (uid instanceof Refused) return { reason: uid.reason };
  const groups = mappedGroups(mapping.groups, evaluated, slots.groups);
  if (groups instanceof Refused) return { reason: groups.reason };
  const extra = mappedExtra(mapping.extra, evaluated, slots.extra);
  if (extra instanceof Refused) return { reason: extra.reason };

  const user: UserInfo = { username, ...(uid ? { uid } : {}), groups, extra };
  const refused = userRulesProblem(mapping.userRules, user);
  if (refused) return { reason: refused };
  return user;
}

/** Where each expression's result is among those evaluated together (-1: no expression). */
interface Slots {
  rules: number[];
  username: number;
  uid: number;
  groups: number;
  extra: number[];
}

/** A token's claims, and the results of the mapping's expressions on them. */
interface Evaluated {
  claims: Record<string, unknown>;
  value(slot: number): unknown;
  /** Why the expression in `slot` failed, if it did. */
  failed(slot: number): string | undefined;
}

/** Why a token's claims make no user (a class, so that no mapped value is ever taken for one). */
class Refused {
  readonly reason: string;
  constructor(reason: string) {
    this.reason = reason;
  }
}

/** Why a claim validation rule does not hold, if one does not. */
function claimRulesProblem(mapping: JWTMapping, evaluated: Evaluated, slots: number[]): string | undefined {
  for (const [i, rule] of mapping.claimRules.entries()) {
    if ('claim' in rule) {
      const got = evaluated.claims[rule.claim];
      if (typeof got !== 'string' || got !== rule.requiredValue)
        return `claim ${rule.claim} does not hold its required value`;
    } else {
      const problem = evaluated.failed(slots[i]!);
      if (problem) return problem;
      if (evaluated.value(slots[i]!) !== true)
        return `claim validation rule failed: ${rule.message || rule.expression.expression}`;
    }
  }
  return undefined;
}

/** The username: a claim with its prefix (an email only when verified) or the expression's string. */
function mappedUsername(source: Source, evaluated: Evaluated, slot: number): string | Refused {
  const { claims } = evaluated;
  if ('claim' in source) {
    const got = claims[source.claim];
    if (typeof got !== 'string') return new Refused(`claim ${source.claim} is missing or not a string`);
    if (source.claim === 'email' && Object.hasOwn(claims, 'email_verified')) {
      const verified = claims['email_verified'];
      if (typeof verified !== 'boolean')
        return new Refused('claim email_verified is present but not a boolean');
      if (!verified) return new Refused('email is not verified');
    }
    return source.prefix + got;
  }
  const problem = evaluated.failed(slot);
  if (problem) return new Refused(problem);
  const got = evaluated.value(slot);
  if (typeof got !== 'string') return new Refused('the username expression did not give a string');
  return got;
}

/** The uid, when mapped: a string, or none when empty. */
function mappedUid(
  source: JWTMapping['uid'],
  evaluated: Evaluated,
  slot: number,
): string | undefined | Refused {
  if (!source) return undefined;
  let got: unknown;
  if ('claim' in source) {
    got = evaluated.claims[source.claim];
    if (got === undefined) return new Refused(`claim ${source.claim} is missing`);
  } else {
    const problem = evaluated.failed(slot);
    if (problem) return new Refused(problem);
    got = evaluated.value(slot);
  }
  if (got !== undefined && typeof got !== 'string') return new Refused('the uid is not a string');
  return got || undefined;
}

/** The groups: a claim's string or strings with its prefix, or the expression's. */
function mappedGroups(source: Source | undefined, evaluated: Evaluated, slot: number): string[] | Refused {
  if (!source) return [];
  if ('claim' in source) {
    const got = evaluated.claims[source.claim];
    const list = got === undefined ? [] : stringsResult(got);
    if (!list) return new Refused(`claim ${source.claim} is neither a string nor a list of strings`);
    return list.map((g) => source.prefix + g);
  }
  const problem = evaluated.failed(slot);
  if (problem) return new Refused(problem);
  const list = stringsResult(evaluated.value(slot));
  if (!list) return new Refused('the groups expression did not give a string or a list of strings');
  return list;
}

/** The extra attributes, each a string or strings; empty ones left out. */
function mappedExtra(
  mappings: JWTMapping['extra'],
  evaluated: Evaluated,
  slots: number[],
): Record<string, string[]> | Refused {
  const extra: Record<string, string[]> = {};
  for (const [i, extraMapping] of mappings.entries()) {
    const problem = evaluated.failed(slots[i]!);
    if (problem) return new Refused(problem);
    const list = stringsResult(evaluated.value(slots[i]!));
    if (!list) return new Refused(`extra ${extraMapping.key} did not give a string or a list of strings`);
    if (list.length > 0) extra[extraMapping.key] = list;
  }
  return extra;
}

export type UserRules = { expression: CompiledExpression; message: string }[];

/** userValidationRules compiled, each problem (naming `field`[i]) pushed onto `problems`. */
export function compileUserRules(
  rules: readonly UserValidationRule[] | undefined,
  field: string,
  problems: string[],
): UserRules {
  const compiled: UserRules = [];
  (rules ?? []).forEach((rule, i) => {
    if (!rule.expression) return void problems.push(`${field}[${i}].expression: required`);
    try {
      compiled.push({
        expression: compileExpression('userValidation', rule.expression),
        message: rule.message ?? '',
      });
    } catch (err) {
      problems.push(`${field}[${i}].expression: ${(err as Error).message}`);
    }
  });
  return compiled;
}

/** Why `user` fails one of `rules` (each must be true), or undefined when it passes them all. */
export function userRulesProblem(rules: UserRules, user: UserInfo): string | undefined {
  if (rules.length === 0) return undefined;
  let checked: unknown[];
  try {
    checked = evaluateAll(
      rules.map((r) => r.expression),
      { user: { username: user.username, uid: user.uid ?? '', groups: user.groups, extra: user.extra } },
    );
  } catch (err) {
    return (err as Error).message;
  }
  for (const [i, rule] of rules.entries()) {
    const got = checked[i];
    if (got instanceof Error) return evaluationProblem(rule.expression, got);
    if (got !== true) return `user validation rule failed: ${rule.message || rule.expression.expression}`;
  }
  return undefined;
}
