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
  const compile = (
    kind: ExpressionKind,
    expression: string,
    field: string,
  ): CompiledExpression | undefined => {
    try {
      return compileExpression(kind, expression);
    } catch (err) {
      problems.push(`${field}: ${err instanceof ExpressionError ? err.message : (err as Error).message}`);
      return undefined;
    }
  };
  const issuer = config.issuer;
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
  if (audiences.length > 1 && issuer.audienceMatchPolicy !== 'MatchAny')
    problems.push(`${FIELD}.issuer.audienceMatchPolicy: must be MatchAny with more than one audience`);
  if (issuer?.audienceMatchPolicy !== undefined && issuer.audienceMatchPolicy !== 'MatchAny')
    problems.push(`${FIELD}.issuer.audienceMatchPolicy: must be MatchAny`);
  const caBundlePem = issuer?.certificateAuthority;
  if (caBundlePem !== undefined && !caBundlePem.includes('-----BEGIN CERTIFICATE-----'))
    problems.push(`${FIELD}.issuer.certificateAuthority: must be a PEM bundle of CA certificates`);

  const claimRules: JWTMapping['claimRules'] = [];
  const ruleClaims = new Set<string>();
  (config.claimValidationRules ?? []).forEach((rule, i) => {
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

  const mappings = config.claimMappings;
  const source = (
    kind: 'username' | 'groups',
    value: { claim?: string; prefix?: string; expression?: string } | undefined,
  ): Source | undefined => {
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
  };
  const username = source('username', mappings?.username);
  if (!mappings?.username) problems.push(`${FIELD}.claimMappings.username: required`);
  const groups = source('groups', mappings?.groups);

  let uid: JWTMapping['uid'];
  if (mappings?.uid) {
    const field = `${FIELD}.claimMappings.uid`;
    const hasClaim = mappings.uid.claim !== undefined && mappings.uid.claim !== '';
    const hasExpression = mappings.uid.expression !== undefined && mappings.uid.expression !== '';
    if (hasClaim && hasExpression) problems.push(`${field}: give claim or expression, not both`);
    else if (hasClaim) uid = { claim: mappings.uid.claim! };
    else if (hasExpression) {
      const expression = compile('uid', mappings.uid.expression!, `${field}.expression`);
      if (expression) uid = { expression };
    }
  }

  const extra: JWTMapping['extra'] = [];
  const keys = new Set<string>();
  (mappings?.extra ?? []).forEach((mapping, i) => {
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
  const ruleSlots = mapping.claimRules.map((r) => ('expression' in r ? slot(r.expression) : -1));
  const usernameSlot = 'expression' in mapping.username ? slot(mapping.username.expression) : -1;
  const uidSlot = mapping.uid && 'expression' in mapping.uid ? slot(mapping.uid.expression) : -1;
  const groupsSlot = mapping.groups && 'expression' in mapping.groups ? slot(mapping.groups.expression) : -1;
  const extraSlots = mapping.extra.map((e) => slot(e.expression));
  let results: unknown[];
  try {
    results = evaluateAll(expressions, { claims });
  } catch (err) {
    return { reason: (err as Error).message };
  }
  const value = (i: number): unknown => results[i];
  const failed = (i: number): string | undefined =>
    results[i] instanceof Error ? evaluationProblem(expressions[i]!, results[i]) : undefined;

  for (const [i, rule] of mapping.claimRules.entries()) {
    if ('claim' in rule) {
      const got = claims[rule.claim];
      if (typeof got !== 'string' || got !== rule.requiredValue)
        return { reason: `claim ${rule.claim} does not hold its required value` };
    } else {
      const problem = failed(ruleSlots[i]!);
      if (problem) return { reason: problem };
      if (value(ruleSlots[i]!) !== true)
        return { reason: `claim validation rule failed: ${rule.message || rule.expression.expression}` };
    }
  }

  let username: string;
  if ('claim' in mapping.username) {
    const got = claims[mapping.username.claim];
    if (typeof got !== 'string')
      return { reason: `claim ${mapping.username.claim} is missing or not a string` };
    if (mapping.username.claim === 'email' && Object.hasOwn(claims, 'email_verified')) {
      const verified = claims['email_verified'];
      if (typeof verified !== 'boolean')
        return { reason: 'claim email_verified is present but not a boolean' };
      if (!verified) return { reason: 'email is not verified' };
    }
    username = mapping.username.prefix + got;
  } else {
    const problem = failed(usernameSlot);
    if (problem) return { reason: problem };
    const got = value(usernameSlot);
    if (typeof got !== 'string') return { reason: 'the username expression did not give a string' };
    username = got;
  }
  if (username === '') return { reason: 'the username is empty' };

  let uid: string | undefined;
  if (mapping.uid) {
    let got: unknown;
    if ('claim' in mapping.uid) {
      got = claims[mapping.uid.claim];
      if (got === undefined) return { reason: `claim ${mapping.uid.claim} is missing` };
    } else {
      const problem = failed(uidSlot);
      if (problem) return { reason: problem };
      got = value(uidSlot);
    }
    if (got !== undefined && typeof got !== 'string') return { reason: 'the uid is not a string' };
    if (got) uid = got;
  }

  let groups: string[] = [];
  if (mapping.groups) {
    if ('claim' in mapping.groups) {
      const got = claims[mapping.groups.claim];
      const list = got === undefined ? [] : stringsResult(got);
      if (!list) return { reason: `claim ${mapping.groups.claim} is neither a string nor a list of strings` };
      const prefix = mapping.groups.prefix;
      groups = list.map((g) => prefix + g);
    } else {
      const problem = failed(groupsSlot);
      if (problem) return { reason: problem };
      const list = stringsResult(value(groupsSlot));
      if (!list) return { reason: 'the groups expression did not give a string or a list of strings' };
      groups = list;
    }
  }

  const extra: Record<string, string[]> = {};
  for (const [i, extraMapping] of mapping.extra.entries()) {
    const problem = failed(extraSlots[i]!);
    if (problem) return { reason: problem };
    const list = stringsResult(value(extraSlots[i]!));
    if (!list) return { reason: `extra ${extraMapping.key} did not give a string or a list of strings` };
    if (list.length > 0) extra[extraMapping.key] = list;
  }

  const user: UserInfo = { username, ...(uid ? { uid } : {}), groups, extra };
  const refused = userRulesProblem(mapping.userRules, user);
  if (refused) return { reason: refused };
  return user;
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
