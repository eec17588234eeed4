// Structured JWT authentication, differentially: the real kube-apiserver is the oracle. It runs with
// --authentication-config holding one `jwt` entry per configuration below (each its own local issuer, since the API
// server routes a token by its iss claim and wants every issuer URL once), and the concierge holds one
// JWTAuthenticator per configuration whose spec.jwt is the very same entry. Each token of the corpus, minted or signed
// by each configuration's issuer, is sent to both as a SelfSubjectReview: the API server answers who the token makes
// the user, the proxy answers who it impersonated. Both must name the same user (username, uid, groups, extra), or
// both refuse. Where Sealion differs on purpose (system: names unless spec.allowSystemNames; names an impersonation
// header cannot carry) the row is named below with the difference it must show; any other difference fails the test
// and is printed with the token's claims, the configuration and both answers. A second test does the same for
// configurations: which entries the API server's reload takes, and which Sealion takes.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, readFileSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { Agent, createServer, request, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import type { JWTPayload } from 'jose';
import { newLogger } from '../lib/log.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type MintOptions, type SigningKey, type TestIssuer } from '../dev/oidc-issuer.ts';

const GROUP = 'authentication.concierge.sealion.dev';
const SSR_PATH = '/apis/authentication.k8s.io/v1/selfsubjectreviews';
const SSR_BODY = JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'SelfSubjectReview' });
/** The audience every configuration lists first, and the one tokens carry unless a row says otherwise. */
const AUDIENCE = 'sealion';
/** Requests in flight at once, per side: enough to be quick, few enough not to trip either server's limits. */
const PARALLEL = 16;
/** The API server and the concierge each fetch every issuer's discovery and keys once they start. */
const READY_TIMEOUT_MS = 60_000;

/** A `jwt` entry of AuthenticationConfiguration without its issuer, which each configuration's own issuer fills in. */
interface JWTRules {
  claimValidationRules?: { claim?: string; requiredValue?: string; expression?: string; message?: string }[];
  claimMappings: {
    username: { claim?: string; prefix?: string; expression?: string };
    groups?: { claim?: string; prefix?: string; expression?: string };
    uid?: { claim?: string; expression?: string };
    extra?: { key: string; valueExpression: string }[];
  };
  userValidationRules?: { expression: string; message?: string }[];
}

interface Configuration {
  name: string;
  /** Default: [AUDIENCE]. */
  audiences?: string[];
  /** Serve discovery from another server and name it in issuer.discoveryURL. */
  discoveryElsewhere?: boolean;
  /** The JWTAuthenticator's spec.allowSystemNames (Sealion's own field, beside spec.jwt). Default: false. */
  allowSystemNames?: boolean;
  rules: JWTRules;
}

/** What every configuration's rules let through: the token each configuration must accept, on both sides. */
const BASE: JWTPayload = {
  sub: 'u-1001',
  username: 'pat',
  email: 'pat@example.com',
  email_verified: true,
  groups: ['dev', 'ops'],
  roles: ['admin', 'logs-reader', 'pods-reader'],
  dept: 'eng',
  uid: 'a1b2c3',
  org: { team: 'blue', site: 'lyon' },
  tags: ['on-call', 'emea'],
};

const claimUser = (claim: string, prefix = ''): JWTRules['claimMappings'] => ({
  username: { claim, prefix },
  groups: { claim: 'groups', prefix: '' },
});

const CONFIGURATIONS: Configuration[] = [
  { name: 'username', rules: { claimMappings: claimUser('username') } },
  {
    name: 'prefixed',
    rules: {
      claimMappings: {
        username: { claim: 'username', prefix: 'oidc:' },
        groups: { claim: 'groups', prefix: 'oidc:' },
      },
    },
  },
  { name: 'email', rules: { claimMappings: claimUser('email') } },
  { name: 'email-prefixed', rules: { claimMappings: claimUser('email', 'mail:') } },
  { name: 'sub', rules: { claimMappings: { username: { claim: 'sub', prefix: '' } } } },
  {
    name: 'groups-map',
    rules: {
      claimMappings: {
        username: { claim: 'username', prefix: '' },
        groups: { expression: "dyn(claims.groups).map(g, 'x:' + g)" },
      },
    },
  },
  {
    name: 'roles-filter',
    rules: {
      claimMappings: {
        username: { expression: "'u:' + claims.sub" },
        groups: { expression: "dyn(claims.roles).filter(r, r.endsWith('-reader'))" },
      },
    },
  },
  {
    name: 'string-group',
    rules: {
      claimMappings: { username: { claim: 'username', prefix: '' }, groups: { claim: 'dept', prefix: 'd:' } },
    },
  },
  {
    name: 'uid-claim',
    rules: { claimMappings: { ...claimUser('username'), uid: { claim: 'uid' } } },
  },
  {
    name: 'uid-expression',
    rules: {
      claimMappings: { ...claimUser('username'), uid: { expression: "claims.sub + '@' + claims.dept" } },
    },
  },
  {
    name: 'extra',
    rules: {
      claimMappings: {
        ...claimUser('username'),
        extra: [
          { key: 'example.com/team', valueExpression: 'claims.org.team' },
          { key: 'example.com/tags', valueExpression: 'claims.tags' },
          { key: 'example.com/site', valueExpression: "claims.?org.site.orValue('')" },
          { key: 'example.com/none', valueExpression: 'null' },
          { key: 'example.com/nick', valueExpression: "claims.?nick.orValue('')" },
        ],
      },
    },
  },
  {
    // Apart from the rest of the extras, so that Sealion's typing of these leaves the others' rows comparable.
    name: 'extra-empty',
    rules: {
      claimMappings: {
        ...claimUser('username'),
        extra: [
          { key: 'example.com/empty', valueExpression: '[]' },
          { key: 'example.com/empty-string', valueExpression: "''" },
          { key: 'example.com/roles', valueExpression: "dyn(claims.roles).filter(r, r != '')" },
        ],
      },
    },
  },
  {
    name: 'username-expression',
    rules: {
      claimMappings: {
        username: { expression: "'u:' + claims.sub" },
        groups: { claim: 'groups', prefix: 'g:' },
      },
    },
  },
  {
    name: 'email-local-part',
    rules: {
      // The API server insists that an expression reading claims.email also read claims.email_verified.
      claimValidationRules: [{ expression: 'claims.email_verified == true', message: 'email not verified' }],
      claimMappings: { username: { expression: "claims.email.split('@')[0]" } },
    },
  },
  {
    name: 'nick-or-sub',
    rules: {
      claimMappings: {
        username: { expression: "claims.?nick.orValue('s:' + claims.sub)" },
        groups: { expression: "has(claims.groups) ? claims.groups : ['none']" },
      },
    },
  },
  {
    name: 'claim-rules',
    rules: {
      claimValidationRules: [
        { claim: 'dept', requiredValue: 'eng' },
        { expression: "has(claims.org) && claims.org.team == 'blue'", message: 'blue team only' },
      ],
      claimMappings: claimUser('username'),
    },
  },
  {
    name: 'nested-rule',
    rules: {
      claimValidationRules: [{ expression: "claims.org.team == 'blue'" }],
      claimMappings: { username: { expression: "claims.username + '@' + claims.org.site" } },
    },
  },
  {
    name: 'user-rules',
    rules: {
      claimMappings: claimUser('username'),
      userValidationRules: [
        { expression: "!user.username.startsWith('system:')", message: 'no system usernames' },
        { expression: "user.groups.all(g, !g.startsWith('system:'))", message: 'no system groups' },
      ],
    },
  },
  {
    name: 'audiences',
    audiences: ['other-client', AUDIENCE],
    rules: { claimMappings: claimUser('username') },
  },
  {
    // Where Sealion lets system: names through as the API server does: its one deliberate difference switched off.
    name: 'system-names-allowed',
    allowSystemNames: true,
    rules: { claimMappings: claimUser('username') },
  },
  {
    name: 'discovery-url',
    discoveryElsewhere: true,
    rules: { claimMappings: claimUser('username', 'd:') },
  },
];

/**
 * One `jwt` entry the API server may or may not take, tried alone next to the configurations above: the API server's
 * verdict is its reload of the file (success or failure), Sealion's is the JWTAuthenticator refused at apply, or its
 * phase, Ready or Error.
 */
interface Candidate {
  name: string;
  /** Changes to the issuer block (url, discoveryURL, audiences, audienceMatchPolicy, certificateAuthority). */
  issuer?: Record<string, unknown>;
  /** The rest of the entry. Default: username and groups by claim, no prefixes. */
  rules?: Partial<JWTRules>;
}

const mapped = (mappings: Partial<JWTRules['claimMappings']>): Partial<JWTRules> => ({
  claimMappings: { ...claimUser('username'), ...mappings },
});
const withExtra = (key: string, valueExpression: string): Partial<JWTRules> =>
  mapped({ extra: [{ key, valueExpression }] });

const CANDIDATES: Candidate[] = [
  { name: 'plain' },
  {
    name: 'email-verified-read',
    rules: mapped({ username: { expression: 'claims.email_verified ? claims.email : claims.sub' } }),
  },
  { name: 'email-verified-unread', rules: mapped({ username: { expression: 'claims.email' } }) },
  { name: 'map-over-dyn-claim', rules: mapped({ groups: { expression: "claims.groups.map(g, 'x:' + g)" } }) },
  { name: 'prefix-missing', rules: mapped({ username: { claim: 'username' } }) },
  {
    name: 'claim-and-expression',
    rules: mapped({ username: { claim: 'username', prefix: '', expression: 'claims.sub' } }),
  },
  { name: 'username-empty-mapping', rules: mapped({ username: {} }) },
  { name: 'expression-with-prefix', rules: mapped({ username: { expression: 'claims.sub', prefix: 'x:' } }) },
  { name: 'groups-prefix-missing', rules: mapped({ groups: { claim: 'groups' } }) },
  { name: 'uid-claim-and-expression', rules: mapped({ uid: { claim: 'uid', expression: 'claims.sub' } }) },
  { name: 'extra-upper-case-key', rules: withExtra('Example.com/team', "'blue'") },
  { name: 'extra-key-without-domain', rules: withExtra('team', "'blue'") },
  { name: 'extra-key-kubernetes-io', rules: withExtra('kubernetes.io/team', "'blue'") },
  { name: 'extra-key-k8s-io', rules: withExtra('k8s.io/team', "'blue'") },
  { name: 'extra-key-subdomain-k8s-io', rules: withExtra('team.k8s.io/x', "'blue'") },
  {
    name: 'extra-duplicate-key',
    rules: mapped({
      extra: [
        { key: 'example.com/team', valueExpression: "'a'" },
        { key: 'example.com/team', valueExpression: "'b'" },
      ],
    }),
  },
  { name: 'extra-empty-expression', rules: withExtra('example.com/team', '') },
  { name: 'extra-reads-user', rules: withExtra('example.com/team', 'user.username') },
  { name: 'extra-number', rules: withExtra('example.com/team', '1') },
  { name: 'two-audiences-no-policy', issuer: { audiences: [AUDIENCE, 'other'] } },
  {
    name: 'duplicate-audiences',
    issuer: { audiences: [AUDIENCE, AUDIENCE], audienceMatchPolicy: 'MatchAny' },
  },
  { name: 'no-audiences', issuer: { audiences: [] } },
  { name: 'empty-audience', issuer: { audiences: [''] } },
  { name: 'one-audience-match-any', issuer: { audiences: [AUDIENCE], audienceMatchPolicy: 'MatchAny' } },
  {
    name: 'audience-policy-unknown',
    issuer: { audiences: [AUDIENCE, 'other'], audienceMatchPolicy: 'MatchAll' },
  },
  { name: 'issuer-http', issuer: { url: 'http://127.0.0.1:1' } },
  { name: 'issuer-query', issuer: { url: '{url}?tenant=1' } },
  { name: 'issuer-fragment', issuer: { url: '{url}#f' } },
  { name: 'issuer-user-info', issuer: { url: 'https://someone@{host}' } },
  { name: 'issuer-service-accounts', issuer: { url: 'https://kubernetes.default.svc.cluster.local' } },
  { name: 'issuer-duplicate', issuer: { url: '{other}' } },
  { name: 'discovery-equal-url', issuer: { discoveryURL: '{url}' } },
  { name: 'discovery-http', issuer: { discoveryURL: 'http://{host}/.well-known/openid-configuration' } },
  { name: 'certificate-authority-garbage', issuer: { certificateAuthority: 'not a certificate' } },
  {
    name: 'claim-rule-claim-and-expression',
    rules: {
      ...mapped({}),
      claimValidationRules: [{ claim: 'dept', requiredValue: 'eng', expression: 'true' }],
    },
  },
  {
    name: 'claim-rule-value-without-claim',
    rules: { ...mapped({}), claimValidationRules: [{ requiredValue: 'eng' }] },
  },
  {
    name: 'claim-rule-claim-without-value',
    rules: { ...mapped({}), claimValidationRules: [{ claim: 'dept' }] },
  },
  {
    name: 'claim-rule-duplicate-claim',
    rules: {
      ...mapped({}),
      claimValidationRules: [
        { claim: 'dept', requiredValue: 'eng' },
        { claim: 'dept', requiredValue: 'ops' },
      ],
    },
  },
  { name: 'claim-rule-string', rules: { ...mapped({}), claimValidationRules: [{ expression: "'yes'" }] } },
  {
    name: 'claim-rule-dyn',
    rules: { ...mapped({}), claimValidationRules: [{ expression: 'claims.email_verified' }] },
  },
  {
    name: 'user-rule-reads-claims',
    rules: { ...mapped({}), userValidationRules: [{ expression: "claims.sub == 'x'" }] },
  },
  {
    name: 'user-rule-string',
    rules: { ...mapped({}), userValidationRules: [{ expression: 'user.username' }] },
  },
  {
    name: 'user-rule-extra',
    rules: { ...mapped({}), userValidationRules: [{ expression: "!('example.com/x' in user.extra)" }] },
  },
  { name: 'username-type-error', rules: mapped({ username: { expression: "'u:' + 1" } }) },
  { name: 'username-list', rules: mapped({ username: { expression: "['a']" } }) },
  { name: 'groups-number', rules: mapped({ groups: { expression: '1' } }) },
  { name: 'groups-string', rules: mapped({ groups: { expression: "'solo'" } }) },
  { name: 'uid-number', rules: mapped({ uid: { expression: '1' } }) },
  { name: 'unknown-function', rules: mapped({ username: { expression: 'claims.sub.shout()' } }) },
  { name: 'syntax-error', rules: mapped({ username: { expression: 'claims.sub +' } }) },
  { name: 'unknown-variable', rules: mapped({ username: { expression: 'request.sub' } }) },
  { name: 'optional-syntax', rules: mapped({ username: { expression: "claims.?nick.orValue('x')" } }) },
  { name: 'strings-lower-ascii', rules: mapped({ username: { expression: 'claims.sub.lowerAscii()' } }) },
  { name: 'strings-replace', rules: mapped({ username: { expression: "claims.sub.replace('-', '_')" } }) },
  { name: 'strings-format', rules: mapped({ username: { expression: "'%s-%d'.format([claims.sub, 1])" } }) },
  { name: 'strings-join', rules: mapped({ username: { expression: "['a', 'b'].join('-')" } }) },
  {
    name: 'regex-matches',
    rules: { ...mapped({}), claimValidationRules: [{ expression: "claims.sub.matches('^u-')" }] },
  },
  { name: 'regex-find', rules: mapped({ username: { expression: "claims.sub.find('[0-9]+')" } }) },
  {
    name: 'lists-is-sorted',
    rules: { ...mapped({}), claimValidationRules: [{ expression: '[1, 2].isSorted()' }] },
  },
  {
    name: 'sets-contains',
    rules: { ...mapped({}), claimValidationRules: [{ expression: "sets.contains(['a', 'b'], ['a'])" }] },
  },
  { name: 'url-host', rules: mapped({ username: { expression: "url('https://example.com/x').getHost()" } }) },
  { name: 'base64', rules: mapped({ username: { expression: "base64.encode(b'pat')" } }) },
  {
    name: 'math-greatest',
    rules: { ...mapped({}), claimValidationRules: [{ expression: 'math.greatest(1, 2) == 2' }] },
  },
  {
    name: 'timestamp-exp',
    rules: {
      ...mapped({}),
      claimValidationRules: [{ expression: 'timestamp(int(claims.exp)) > timestamp(0)' }],
    },
  },
  {
    name: 'ip-family',
    rules: { ...mapped({}), claimValidationRules: [{ expression: "ip('10.0.0.1').family() == 4" }] },
  },
];

interface TokenCase {
  name: string;
  /** Claims on top of (or, where undefined, taken out of) BASE. */
  claims: Record<string, unknown>;
  /** Given this configuration's issuer and the others, how to mint it. Default: the issuer's key, iss and AUDIENCE. */
  mint?: (issuer: TestIssuer, ctx: { otherIssuer: TestIssuer }) => Promise<MintOptions> | MintOptions;
  /**
   * Sign this instead, with the issuer's current key: a header and a payload text, made from what `mint` would sign
   * (`standard`: iss, aud, iat, exp) and the claims. For what `mint` cannot make: claims it sets itself, odd headers,
   * payloads that are not what JSON.stringify writes.
   */
  raw?: (standard: Record<string, unknown>, claims: JWTPayload, issuer: TestIssuer) => RawToken;
}

interface RawToken {
  /** Default: alg ES256, typ JWT, the key's kid. */
  header?: Record<string, unknown>;
  payload: string;
}

/** Standard claims and the rest, with `changes` (undefined removes a claim), as a payload text. */
const payload = (
  standard: Record<string, unknown>,
  claims: JWTPayload,
  changes: Record<string, unknown> = {},
): RawToken => {
  const all: Record<string, unknown> = { ...claims, ...standard };
  for (const [key, value] of Object.entries(changes)) {
    if (value === undefined) delete all[key];
    else all[key] = value;
  }
  return { payload: JSON.stringify(all) };
};

/** A compact JWS over `token` with an ES256 key, built by hand so that header and payload are exactly as given. */
async function signRaw(key: SigningKey, token: RawToken): Promise<string> {
  const b64 = (text: string): string => Buffer.from(text).toString('base64url');
  const header = token.header ?? { alg: 'ES256', typ: 'JWT', kid: key.kid };
  const input = `${b64(JSON.stringify(header))}.${b64(token.payload)}`;
  if (header['alg'] === 'none') return `${input}.`;
  const signature = await crypto.subtle.sign(
    { name: 'ECDSA', hash: 'SHA-256' },
    key.privateKey,
    Buffer.from(input),
  );
  return `${input}.${Buffer.from(signature).toString('base64url')}`;
}

const TOKENS: TokenCase[] = [
  { name: 'base', claims: {} },
  { name: 'email-unverified', claims: { email_verified: false } },
  { name: 'email-verified-string', claims: { email_verified: 'true' } },
  { name: 'email-verified-missing', claims: { email_verified: undefined } },
  { name: 'email-missing', claims: { email: undefined } },
  { name: 'email-number', claims: { email: 12 } },
  { name: 'username-system', claims: { username: 'system:admin' } },
  { name: 'username-system-email', claims: { email: 'system:admin@example.com' } },
  { name: 'sub-system', claims: { sub: 'system:node:n1' } },
  { name: 'groups-system', claims: { groups: ['dev', 'system:masters'] } },
  { name: 'groups-authenticated', claims: { groups: ['system:authenticated', 'dev'] } },
  { name: 'groups-string', claims: { groups: 'solo' } },
  { name: 'groups-object', claims: { groups: { a: 'b' } } },
  { name: 'groups-numbers', claims: { groups: [1, 2] } },
  { name: 'groups-mixed', claims: { groups: ['dev', 3] } },
  { name: 'groups-empty', claims: { groups: [] } },
  { name: 'groups-null', claims: { groups: null } },
  { name: 'groups-missing', claims: { groups: undefined } },
  { name: 'groups-duplicates', claims: { groups: ['dev', 'dev'] } },
  { name: 'groups-empty-string', claims: { groups: ['', 'dev'] } },
  { name: 'username-number', claims: { username: 42 } },
  { name: 'username-empty', claims: { username: '' } },
  { name: 'username-missing', claims: { username: undefined } },
  { name: 'username-list', claims: { username: ['pat'] } },
  { name: 'non-ascii', claims: { username: 'José', groups: ['東京', 'équipe'], email: 'josé@例え.jp' } },
  { name: 'spaces-and-commas', claims: { username: 'a b,c', groups: ['x, y'] } },
  { name: 'roles-readers-only', claims: { roles: ['logs-reader'] } },
  { name: 'roles-missing', claims: { roles: undefined } },
  { name: 'roles-number', claims: { roles: 7 } },
  { name: 'dept-other', claims: { dept: 'sales' } },
  { name: 'dept-number', claims: { dept: 1 } },
  { name: 'dept-missing', claims: { dept: undefined } },
  { name: 'uid-number', claims: { uid: 99 } },
  { name: 'uid-missing', claims: { uid: undefined } },
  { name: 'uid-empty', claims: { uid: '' } },
  { name: 'org-red', claims: { org: { team: 'red', site: 'oslo' } } },
  { name: 'org-missing', claims: { org: undefined } },
  { name: 'org-string', claims: { org: 'blue' } },
  { name: 'org-deep', claims: { org: { team: 'blue', site: { city: 'lyon' } } } },
  { name: 'tags-empty', claims: { tags: [] } },
  { name: 'tags-string', claims: { tags: 'single' } },
  { name: 'tags-numbers', claims: { tags: [1] } },
  { name: 'nick', claims: { nick: 'patty' } },
  { name: 'nick-null', claims: { nick: null } },
  { name: 'nick-system', claims: { nick: 'system:kube-scheduler' } },
  { name: 'jti', claims: { jti: 'token-7' } },
  { name: 'audience-wrong', claims: {}, mint: () => ({ audience: 'someone-else' }) },
  { name: 'audience-list', claims: {}, mint: () => ({ audience: ['someone-else', AUDIENCE] }) },
  { name: 'audience-other-listed', claims: {}, mint: () => ({ audience: 'other-client' }) },
  { name: 'expired', claims: {}, mint: () => ({ expiresIn: -600 }) },
  // Inside the leeway some verifiers allow for clocks apart, outside others': a boundary the two may disagree on.
  { name: 'expired-just', claims: {}, mint: () => ({ expiresIn: -20 }) },
  { name: 'not-yet-valid', claims: {}, mint: () => ({ notBefore: 600 }) },
  { name: 'not-yet-valid-just', claims: {}, mint: () => ({ notBefore: 60 }) },
  { name: 'issuer-unknown', claims: {}, mint: () => ({ issuer: 'https://127.0.0.1:1/nobody' }) },
  // Another configured issuer's iss, signed with this issuer's key: routed to that issuer, whose keys refuse it.
  { name: 'issuer-other', claims: {}, mint: (_issuer, ctx) => ({ issuer: ctx.otherIssuer.url }) },
  { name: 'key-unpublished', claims: {}, mint: async (issuer) => ({ signingKey: await issuer.newKey() }) },
  { name: 'sub-number', claims: { sub: 5 } },
  // HTTP trims a header value's ends and cannot carry a line break: what impersonation headers do to such names.
  { name: 'username-padded', claims: { username: ' pat ', groups: [' dev '] } },
  { name: 'username-tab', claims: { username: 'pat\tx' } },
  { name: 'username-newline', claims: { username: 'pat\nx', groups: ['a\r\nb'] } },
  { name: 'groups-nested', claims: { groups: [['dev']] } },
  {
    name: 'exp-missing',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { exp: undefined }),
  },
  {
    name: 'exp-string',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { exp: String(standard['exp']) }),
  },
  {
    name: 'exp-fraction',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { exp: Number(standard['exp']) + 0.5 }),
  },
  {
    name: 'iat-future',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { iat: Number(standard['iat']) + 3600 }),
  },
  { name: 'iat-string', claims: {}, raw: (standard, claims) => payload(standard, claims, { iat: 'now' }) },
  {
    name: 'nbf-string',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { nbf: String(standard['iat']) }),
  },
  {
    name: 'aud-missing',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { aud: undefined }),
  },
  { name: 'aud-number', claims: {}, raw: (standard, claims) => payload(standard, claims, { aud: 7 }) },
  {
    name: 'iss-missing',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { iss: undefined }),
  },
  {
    name: 'iss-trailing-slash',
    claims: {},
    raw: (standard, claims) => payload(standard, claims, { iss: `${String(standard['iss'])}/` }),
  },
  {
    name: 'kid-missing',
    claims: {},
    raw: (standard, claims) => ({ header: { alg: 'ES256', typ: 'JWT' }, ...payload(standard, claims) }),
  },
  {
    name: 'typ-access-token',
    claims: {},
    raw: (standard, claims, issuer) => ({
      header: { alg: 'ES256', typ: 'at+jwt', kid: issuer.currentJWK().kid },
      ...payload(standard, claims),
    }),
  },
  {
    name: 'crit-header',
    claims: {},
    raw: (standard, claims, issuer) => ({
      header: { alg: 'ES256', kid: issuer.currentJWK().kid, crit: ['x-policy'], 'x-policy': 1 },
      ...payload(standard, claims),
    }),
  },
  {
    name: 'alg-none',
    claims: {},
    raw: (standard, claims) => ({ header: { alg: 'none' }, ...payload(standard, claims) }),
  },
  {
    // Two username members: JSON parsers keep the last one, Go's and JavaScript's alike.
    name: 'duplicate-username',
    claims: {},
    raw: (standard, claims) => ({
      payload: `{"username":"pat",${payload(standard, claims).payload.slice(1, -1)},"username":"sam"}`,
    }),
  },
  {
    name: 'duplicate-iss',
    claims: {},
    raw: (standard, claims) => ({
      payload: `{"iss":"https://127.0.0.1:1/nobody",${payload(standard, claims).payload.slice(1)}`,
    }),
  },
  { name: 'payload-array', claims: {}, raw: () => ({ payload: '[1,2]' }) },
];

/** A name the API server makes of a token and Sealion refuses, with the status of its refusal (default: 401). */
type RefusedName = ({ username: string } | { group: string }) & { status?: number };

/**
 * The rows where Sealion answers otherwise on purpose, each with the name the API server makes of the token and
 * Sealion refuses (with the 401 any bad token gets), by reason.
 */
const REFUSED_ON_PURPOSE: Record<string, RefusedName> = {
  // `system:` names: the API server takes them from a JWT issuer (unless a userValidationRule refuses them); Sealion
  // refuses them unless the JWTAuthenticator sets spec.allowSystemNames, which these do not.
  'username/username-system': { username: 'system:admin' },
  'username/groups-system': { group: 'system:masters' },
  'email/username-system-email': { username: 'system:admin@example.com' },
  'email/groups-system': { group: 'system:masters' },
  'email-prefixed/groups-system': { group: 'system:masters' },
  'sub/sub-system': { username: 'system:node:n1' },
  'groups-map/username-system': { username: 'system:admin' },
  'string-group/username-system': { username: 'system:admin' },
  'uid-claim/username-system': { username: 'system:admin' },
  'uid-claim/groups-system': { group: 'system:masters' },
  'uid-expression/username-system': { username: 'system:admin' },
  'uid-expression/groups-system': { group: 'system:masters' },
  'extra/username-system': { username: 'system:admin' },
  'extra/groups-system': { group: 'system:masters' },
  'email-local-part/username-system-email': { username: 'system:admin' },
  'nick-or-sub/groups-system': { group: 'system:masters' },
  'nick-or-sub/nick-system': { username: 'system:kube-scheduler' },
  'claim-rules/username-system': { username: 'system:admin' },
  'claim-rules/groups-system': { group: 'system:masters' },
  'nested-rule/username-system': { username: 'system:admin@lyon' },
  'audiences/username-system': { username: 'system:admin' },
  'audiences/groups-system': { group: 'system:masters' },
  'discovery-url/groups-system': { group: 'system:masters' },
  'extra-empty/username-system': { username: 'system:admin' },
  'extra-empty/groups-system': { group: 'system:masters' },
  // With spec.allowSystemNames, Sealion takes system:masters from the token, and the cluster refuses its forwarding
  // identity to impersonate that group: only the legacy impersonate verb can, which Sealion's policy does not grant.
  'system-names-allowed/groups-system': { group: 'system:masters', status: 403 },
  // The empty username, which the API server takes from a claim (it refuses it from an expression only): the proxy acts
  // for a user by impersonating them, and an empty Impersonate-User impersonates nobody.
  'username/username-empty': { username: '' },
  'groups-map/username-empty': { username: '' },
  'string-group/username-empty': { username: '' },
  'uid-claim/username-empty': { username: '' },
  'uid-expression/username-empty': { username: '' },
  'extra/username-empty': { username: '' },
  'claim-rules/username-empty': { username: '' },
  'user-rules/username-empty': { username: '' },
  'audiences/username-empty': { username: '' },
  'extra-empty/username-empty': { username: '' },
  'system-names-allowed/username-empty': { username: '' },
  // Names that an impersonation header cannot carry as they are: HTTP trims a value's ends and has no line breaks.
  'username/username-padded': { username: ' pat ' },
  'username/username-newline': { username: 'pat\nx' },
  'prefixed/username-padded': { username: 'oidc: pat ' },
  'prefixed/username-newline': { username: 'oidc:pat\nx' },
  'email/username-padded': { group: ' dev ' },
  'email/username-newline': { group: 'a\r\nb' },
  'email-prefixed/username-padded': { group: ' dev ' },
  'email-prefixed/username-newline': { group: 'a\r\nb' },
  'groups-map/username-padded': { username: ' pat ' },
  'groups-map/username-newline': { username: 'pat\nx' },
  'string-group/username-padded': { username: ' pat ' },
  'string-group/username-newline': { username: 'pat\nx' },
  'uid-claim/username-padded': { username: ' pat ' },
  'uid-claim/username-newline': { username: 'pat\nx' },
  'uid-expression/username-padded': { username: ' pat ' },
  'uid-expression/username-newline': { username: 'pat\nx' },
  'extra/username-padded': { username: ' pat ' },
  'extra/username-newline': { username: 'pat\nx' },
  'extra-empty/username-padded': { username: ' pat ' },
  'extra-empty/username-newline': { username: 'pat\nx' },
  'username-expression/username-padded': { group: 'g: dev ' },
  'username-expression/username-newline': { group: 'g:a\r\nb' },
  'nick-or-sub/username-padded': { group: ' dev ' },
  'nick-or-sub/username-newline': { group: 'a\r\nb' },
  'claim-rules/username-padded': { username: ' pat ' },
  'claim-rules/username-newline': { username: 'pat\nx' },
  'nested-rule/username-padded': { username: ' pat @lyon' },
  'nested-rule/username-newline': { username: 'pat\nx@lyon' },
  'user-rules/username-padded': { username: ' pat ' },
  'user-rules/username-newline': { username: 'pat\nx' },
  'audiences/username-padded': { username: ' pat ' },
  'audiences/username-newline': { username: 'pat\nx' },
  'system-names-allowed/username-padded': { username: ' pat ' },
  'system-names-allowed/username-newline': { username: 'pat\nx' },
  'discovery-url/username-padded': { username: 'd: pat ' },
  'discovery-url/username-newline': { username: 'd:pat\nx' },
};

type Answer =
  | { kind: 'user'; username: string; uid: string; groups: string[]; extra: Record<string, string[]> }
  | { kind: 'refused'; status: number; body: string };

/**
 * Tokens Sealion answers otherwise on purpose, whatever the configuration, each with why and what both must say.
 */
const TOKENS_ON_PURPOSE: Record<string, { why: string; holds: (api: Answer, sealion: Answer) => boolean }> = {
  // Go's JSON reader takes a number written as a string for exp and nbf; jose and RFC 7519 (NumericDate) do not.
  'exp-string': {
    why: 'exp as a string is not a NumericDate: refused',
    holds: (api, sealion) => api.kind === 'user' && sealion.kind === 'refused' && sealion.status === 401,
  },
  'nbf-string': {
    why: 'nbf as a string is not a NumericDate: refused',
    holds: (api, sealion) => api.kind === 'user' && sealion.kind === 'refused' && sealion.status === 401,
  },
  // Sealion refuses names with control characters (lib/authn/identity.ts): they split or end headers elsewhere, and
  // one name must stay one name on every hop.
  'username-tab': {
    why: 'a tab in the username: refused',
    holds: (api, sealion) =>
      api.kind === 'user' &&
      api.username.includes('\t') &&
      sealion.kind === 'refused' &&
      sealion.status === 401,
  },
  // An empty group is no group: dropped, where the API server keeps "" from a claim (it drops it from an expression).
  'groups-empty-string': {
    why: 'an empty group from a claim: dropped',
    holds: (api, sealion) =>
      api.kind === 'user' &&
      sealion.kind === 'user' &&
      JSON.stringify({ ...api, groups: api.groups.filter((g) => !/^([a-z]+:)?$/.test(g)) }) ===
        JSON.stringify({ ...sealion, groups: sealion.groups.filter((g) => !/^([a-z]+:)?$/.test(g)) }) &&
      api.groups.length > sealion.groups.length,
  },
};

/**
 * Configurations Sealion judges otherwise, by name, with why: CEL libraries of the API server's environment that
 * Sealion's CEL has not (yet), and one type check Sealion's checker does not make. (Its strings, regex and lists
 * functions, which the candidates strings-replace, regex-find and lists-is-sorted use, it has.)
 */
const CONFIGURATIONS_OTHERWISE: Record<string, string> = {
  'map-over-dyn-claim':
    "taken: Sealion's checker lets a comprehension range over a claim of type dyn, cel-go's not",
  'sets-contains': "refused: the sets extension is not in Sealion's CEL yet",
  'url-host': "refused: the Kubernetes URL library is not in Sealion's CEL yet",
  'ip-family': "refused: the Kubernetes IP library is not in Sealion's CEL yet",
};

interface Row {
  name: string;
  configuration: Configuration;
  token: TokenCase;
  claims: JWTPayload;
  jwt: string;
}

/** The claims of a row's token: BASE with the case's changes (undefined removes a claim). */
function claimsOf(token: TokenCase): JWTPayload {
  const claims: Record<string, unknown> = { ...BASE };
  for (const [key, value] of Object.entries(token.claims)) {
    if (value === undefined) delete claims[key];
    else claims[key] = value;
  }
  return claims;
}

/** One SelfSubjectReview with a bearer token: the user it answers, or the refusal. */
function review(url: string, agent: Agent, token: string): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = request(
      new URL(SSR_PATH, url),
      {
        method: 'POST',
        agent,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk));
        res.on('end', () => {
          if (res.statusCode !== 201) return done({ kind: 'refused', status: res.statusCode ?? 0, body });
          const info = (
            JSON.parse(body) as {
              status: {
                userInfo: {
                  username?: string;
                  uid?: string;
                  groups?: string[];
                  extra?: Record<string, string[]>;
                };
              };
            }
          ).status.userInfo;
          done({
            kind: 'user',
            username: info.username ?? '',
            uid: info.uid ?? '',
            groups: info.groups ?? [],
            // Sorted keys, so that two answers compare equal whatever order each server wrote them in.
            extra: Object.fromEntries(
              Object.entries(info.extra ?? {}).sort(([a], [b]) => a.localeCompare(b)),
            ),
          });
        });
      },
    );
    req.on('error', fail);
    req.end(SSR_BODY);
  });
}

/** Runs `fn` over `items`, at most `limit` at once, keeping the order. */
async function inBatches<T, R>(items: T[], limit: number, fn: (item: T) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array<R>(items.length);
  let next = 0;
  const worker = async (): Promise<void> => {
    while (next < items.length) {
      const i = next++;
      results[i] = await fn(items[i] as T);
    }
  };
  await Promise.all(Array.from({ length: limit }, worker));
  return results;
}

/**
 * A server that answers an issuer's discovery document at a path of its own, with a certificate from a CA of its
 * own, as a provider behind a separate discovery endpoint does: issuer.discoveryURL points here.
 */
async function startDiscoveryMirror(
  issuer: TestIssuer,
): Promise<{ url: string; caPem: string; stop(): Promise<void> }> {
  const document = await new Promise<string>((done, fail) => {
    const req = request(`${issuer.url}/.well-known/openid-configuration`, { ca: issuer.caPem }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () =>
        res.statusCode === 200 ? done(body) : fail(new Error(`discovery: ${res.statusCode}`)),
      );
    });
    req.on('error', fail);
    req.end();
  });
  const ca = await newCA('discovery-mirror-ca');
  const serving = await issueCert(ca, {
    commonName: 'discovery-mirror',
    hosts: ['127.0.0.1'],
    usage: 'server',
  });
  const server: Server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
    if (req.url === '/elsewhere/discovery.json')
      res.writeHead(200, { 'content-type': 'application/json' }).end(document);
    else res.writeHead(404).end();
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return {
    url: `https://127.0.0.1:${(server.address() as AddressInfo).port}/elsewhere/discovery.json`,
    caPem: ca.certPem,
    stop: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}

describe('structured JWT authentication, Sealion against the API server', () => {
  let dir: string;
  let cluster: Cluster | undefined;
  let concierge: LocalConcierge | undefined;
  const issuers = new Map<string, TestIssuer>();
  const mirrors: { stop(): Promise<void> }[] = [];
  const jwtEntries = new Map<string, object>();
  /** Each configuration's issuer signs with this key, which mint() uses too. */
  const keys = new Map<string, SigningKey>();
  const agents: Agent[] = [];
  let logText = '';
  let authenticationConfig: string;
  /** Issuers a test started, stopped with the rest. */
  const stopLater: TestIssuer[] = [];

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-structured-authn-'));
    for (const configuration of CONFIGURATIONS) {
      const issuer = await startOIDCIssuer({ audience: AUDIENCE });
      issuers.set(configuration.name, issuer);
      // A key of our own, published before anyone fetches the keys, so that raw tokens can be signed with it.
      const key = await issuer.newKey();
      issuer.rotate(key);
      keys.set(configuration.name, key);
      let certificateAuthority = issuer.caPem;
      let discoveryURL: string | undefined;
      if (configuration.discoveryElsewhere) {
        const mirror = await startDiscoveryMirror(issuer);
        mirrors.push(mirror);
        discoveryURL = mirror.url;
        certificateAuthority = `${issuer.caPem}${mirror.caPem}`;
      }
      const audiences = configuration.audiences ?? [AUDIENCE];
      jwtEntries.set(configuration.name, {
        issuer: {
          url: issuer.url,
          ...(discoveryURL ? { discoveryURL } : {}),
          audiences,
          ...(audiences.length > 1 ? { audienceMatchPolicy: 'MatchAny' } : {}),
          certificateAuthority,
        },
        ...configuration.rules,
      });
    }
    authenticationConfig = join(dir, 'authentication-config.yaml');
    writeFileSync(authenticationConfig, authenticationConfigText([...jwtEntries.values()]));
    cluster = await startCluster({
      name: 'structured',
      controllerManager: false,
      apiserverArgs: [`--authentication-config=${authenticationConfig}`],
    });
    const log = newLogger({
      level: 'debug',
      destination: new Writable({
        write(chunk: Buffer, _enc, next) {
          logText += chunk.toString();
          next();
        },
      }),
    });
    concierge = await startLocalConcierge(cluster, { log });
  }, 180_000);

  afterAll(async () => {
    for (const agent of agents) agent.destroy();
    await concierge?.stop();
    await cluster?.stop();
    await Promise.all([...issuers.values()].map((issuer) => issuer.stop()));
    await Promise.all(stopLater.map((issuer) => issuer.stop()));
    await Promise.all(mirrors.map((mirror) => mirror.stop()));
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('answers every token under every configuration as the API server does', async () => {
    if (!cluster || !concierge) throw new Error('not started');
    const apiAgent = new Agent({ keepAlive: true, ca: cluster.ca.certPem, maxSockets: PARALLEL });
    const proxyAgent = new Agent({ keepAlive: true, ca: concierge.servingCA.certPem, maxSockets: PARALLEL });
    agents.push(apiAgent, proxyAgent);
    const apiURL = cluster.url;
    const proxyURL = concierge.url;

    // The JWTAuthenticators, one per configuration, each with the API server's entry as it is.
    const applyProblems: string[] = [];
    for (const configuration of CONFIGURATIONS) {
      const applied = await cluster.kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({
          apiVersion: `${GROUP}/v1alpha1`,
          kind: 'JWTAuthenticator',
          metadata: { name: configuration.name },
          spec: {
            jwt: jwtEntries.get(configuration.name),
            ...(configuration.allowSystemNames ? { allowSystemNames: true } : {}),
          },
        }),
      });
      if (applied.code !== 0) applyProblems.push(`${configuration.name}: ${applied.stderr.trim()}`);
    }

    // Every configuration's own base token, until each side takes it: the API server fetches discovery and keys in
    // the background after it starts, the concierge after each JWTAuthenticator appears.
    const baseTokens = new Map<string, string>();
    for (const configuration of CONFIGURATIONS) {
      baseTokens.set(configuration.name, await (issuers.get(configuration.name) as TestIssuer).mint(BASE));
    }
    await eventually(async () => {
      for (const [name, token] of baseTokens) {
        const answer = await review(apiURL, apiAgent, token);
        if (answer.kind !== 'user')
          throw new Error(`the API server refuses ${name}'s base token: ${answer.body}`);
      }
    }, READY_TIMEOUT_MS);
    // Each JWTAuthenticator out of Pending; one that turns Error is reported with its failed conditions, and its
    // rows run all the same (Sealion refuses them all then, which the rows show).
    const notReady: string[] = [];
    if (applyProblems.length === 0) {
      const c = cluster;
      await eventually(async () => {
        const listed = await c.kubectl(['get', `jwtauthenticators.${GROUP}`, '-o', 'json']);
        const items = (
          JSON.parse(listed.stdout) as {
            items: {
              metadata: { name: string };
              status?: { phase?: string; conditions?: { type: string; status: string; message: string }[] };
            }[];
          }
        ).items;
        const settled = items.filter(
          (item) => item.status?.phase === 'Ready' || item.status?.phase === 'Error',
        );
        if (settled.length < CONFIGURATIONS.length) throw new Error('JWTAuthenticators still Pending');
        notReady.length = 0;
        for (const item of settled) {
          if (item.status?.phase === 'Ready') continue;
          const failed = (item.status?.conditions ?? []).filter((condition) => condition.status === 'False');
          notReady.push(`${item.metadata.name}: ${failed.map((f) => `${f.type}: ${f.message}`).join('; ')}`);
        }
      }, READY_TIMEOUT_MS);
    }

    const rows: Row[] = [];
    for (const [index, configuration] of CONFIGURATIONS.entries()) {
      const issuer = issuers.get(configuration.name) as TestIssuer;
      const otherIssuer = issuers.get(
        (CONFIGURATIONS[(index + 1) % CONFIGURATIONS.length] as Configuration).name,
      ) as TestIssuer;
      for (const token of TOKENS) {
        const claims = claimsOf(token);
        const now = Math.floor(Date.now() / 1000);
        const jwt = token.raw
          ? await signRaw(
              keys.get(configuration.name) as SigningKey,
              token.raw({ iss: issuer.url, aud: AUDIENCE, iat: now, exp: now + 300 }, claims, issuer),
            )
          : await issuer.mint(claims, await token.mint?.(issuer, { otherIssuer }));
        rows.push({ name: `${configuration.name}/${token.name}`, configuration, token, claims, jwt });
      }
    }

    const answers = await inBatches(rows, PARALLEL, async (row) => ({
      row,
      api: await review(apiURL, apiAgent, row.jwt),
      sealion: await review(proxyURL, proxyAgent, row.jwt),
    }));

    const comparable = (answer: Answer): object =>
      answer.kind === 'user' ? answer : { kind: 'refused', unauthorized: answer.status === 401 };
    const differences: string[] = [];
    /** Differing rows by token, for a summary before the details. */
    const byToken = new Map<string, string[]>();
    const intended: string[] = [];
    let intendedByToken = 0;
    let accepted = 0;
    for (const { row, api, sealion } of answers) {
      if (api.kind === 'user') accepted++;
      const same = JSON.stringify(comparable(api)) === JSON.stringify(comparable(sealion));
      const refused = REFUSED_ON_PURPOSE[row.name];
      const onPurpose = TOKENS_ON_PURPOSE[row.token.name];
      if (onPurpose && refused === undefined) {
        // Where the configuration reads nothing of what is odd about the token, both agree.
        if (same) continue;
        if (onPurpose.holds(api, sealion)) intendedByToken++;
        else differences.push(describe_(row, api, sealion, `expected: ${onPurpose.why}`));
      } else if (refused !== undefined) {
        // The API server makes the user with that name; Sealion refuses the token (with the 401 any bad token gets).
        const named =
          api.kind === 'user' &&
          ('username' in refused ? api.username === refused.username : api.groups.includes(refused.group));
        if (named && sealion.kind === 'refused' && sealion.status === (refused.status ?? 401))
          intended.push(row.name);
        else
          differences.push(
            describe_(row, api, sealion, `expected: Sealion refuses ${JSON.stringify(refused)}`),
          );
      } else if (!same) {
        differences.push(describe_(row, api, sealion));
        byToken.set(row.token.name, [...(byToken.get(row.token.name) ?? []), row.configuration.name]);
      }
    }
    console.log(
      `structured authentication: ${rows.length} rows (${CONFIGURATIONS.length} configurations × ${TOKENS.length} tokens), ` +
        `${accepted} accepted by the API server, ${intended.length} refused by Sealion on purpose, ` +
        `${intendedByToken} answered otherwise on purpose for their token (${Object.keys(TOKENS_ON_PURPOSE).join(', ')}), ` +
        `${differences.length} differing` +
        [...byToken].map(([token, configurations]) => `\n  ${token}: ${configurations.join(' ')}`).join('') +
        (applyProblems.length ? `\nJWTAuthenticators not applied:\n${applyProblems.join('\n')}` : '') +
        (notReady.length ? `\nJWTAuthenticators in Error:\n${notReady.join('\n')}` : '') +
        (differences.length ? `\n\n${differences.join('\n\n')}` : ''),
    );
    if (differences.length > 0) {
      // Why Sealion refused each token is in its log only (the 401 says nothing): kept for whoever reads the failure.
      const kept = join(tmpdir(), 'sealion-structured-authn.log');
      writeFileSync(kept, logText);
      console.log(`the concierge's log: ${kept}`);
    }
    expect(applyProblems).toEqual([]);
    expect(notReady).toEqual([]);
    expect(differences).toEqual([]);
    expect(intended.sort()).toEqual(Object.keys(REFUSED_ON_PURPOSE).sort());
  }, 300_000);

  it('takes and refuses the configurations the API server takes and refuses', async () => {
    if (!cluster) throw new Error('not started');
    const c = cluster;
    // Each candidate its own issuer: the API server wants every issuer URL once in a file, and Sealion may too.
    const candidateIssuers = await Promise.all(CANDIDATES.map(() => startOIDCIssuer({ audience: AUDIENCE })));
    candidateIssuers.forEach((issuer) => stopLater.push(issuer));
    const firstURL = (candidateIssuers[0] as TestIssuer).url;
    const entries = CANDIDATES.map((candidate, index) => {
      const issuer = candidateIssuers[index] as TestIssuer;
      const fill = (value: unknown): unknown =>
        typeof value === 'string'
          ? value
              .replaceAll('{url}', issuer.url)
              .replaceAll('{host}', new URL(issuer.url).host)
              .replaceAll('{other}', firstURL)
          : value;
      return {
        issuer: Object.fromEntries(
          Object.entries({
            url: issuer.url,
            audiences: [AUDIENCE],
            certificateAuthority: issuer.caPem,
            ...candidate.issuer,
          }).map(([key, value]) => [key, fill(value)]),
        ),
        ...(candidate.rules ?? mapped({})),
      };
    });

    const api = await apiServerVerdicts(c, authenticationConfig, entries);
    const sealion = await sealionVerdicts(c, entries);
    const verdicts: string[] = [];
    const differences: string[] = [];
    for (const [index, candidate] of CANDIDATES.entries()) {
      const a = api[index] as Verdict;
      const b = sealion[index] as Verdict;
      const line = `${candidate.name}: API server ${a.accepted ? 'takes it' : 'refuses it'}, Sealion ${b.accepted ? 'takes it' : 'refuses it'}`;
      verdicts.push(a.accepted ? line : `${line} (${a.detail.slice(0, 160)})`);
      const otherwise = CONFIGURATIONS_OTHERWISE[candidate.name];
      if (otherwise !== undefined) {
        // Named: Sealion must judge it otherwise, as said, or the name is stale.
        if (a.accepted === b.accepted || (b.accepted ? 'taken' : 'refused') !== otherwise.split(':')[0])
          differences.push(`${line}: expected Sealion ${otherwise}`);
        continue;
      }
      if (a.accepted !== b.accepted) {
        const entry = JSON.stringify(entries[index], (key, value: unknown) =>
          key === 'certificateAuthority' && typeof value === 'string' && value.includes('BEGIN')
            ? '<PEM>'
            : value,
        );
        differences.push(
          [line, `  entry:      ${entry}`, `  API server: ${a.detail}`, `  Sealion:    ${b.detail}`].join(
            '\n',
          ),
        );
      }
    }
    console.log(
      `structured authentication configurations: ${CANDIDATES.length}, ${differences.length} judged otherwise by Sealion\n` +
        verdicts.join('\n') +
        (differences.length ? `\n\n${differences.join('\n\n')}` : ''),
    );
    expect(differences).toEqual([]);
  }, 300_000);
});

interface Verdict {
  accepted: boolean;
  detail: string;
}

/** The file kube-apiserver's --authentication-config reads. */
function authenticationConfigText(jwt: object[]): string {
  return JSON.stringify({
    apiVersion: 'apiserver.config.k8s.io/v1',
    kind: 'AuthenticationConfiguration',
    jwt,
  });
}

/** kube-apiserver's reloads of the authentication config so far, by outcome, from its metrics. */
async function reloads(cluster: Cluster): Promise<{ success: number; failure: number }> {
  const metrics = await cluster.kubectl(['get', '--raw', '/metrics']);
  if (metrics.code !== 0) throw new Error(`reading metrics: ${metrics.stderr}`);
  const count = (status: string): number =>
    metrics.stdout
      .split('\n')
      .filter(
        (line) =>
          line.startsWith('apiserver_authentication_config_controller_automatic_reloads_total{') &&
          line.includes(`status="${status}"`),
      )
      .reduce((sum, line) => sum + Number(line.slice(line.lastIndexOf(' ') + 1)), 0);
  return { success: count('success'), failure: count('failure') };
}

/** Entries in one file at most: kube-apiserver takes 64. */
const ENTRIES_PER_RELOAD = 32;

/**
 * Which entries kube-apiserver takes, from a few reloads of files holding many: it validates every entry and names
 * each one it refuses (`jwt[<index>]…`) in one logged error, so the entries it does not name are those it takes. Not
 * one reload per entry, because a reload that passes validation waits 10 s for its issuers (its first health check
 * comes before any discovery answer). The first entry goes into every file, so that an entry may name its issuer URL
 * (a duplicate). Each file replaces the last in one rename: a write in place could be read half done, which is a
 * failed reload of its own. Should every entry of a file be valid, the reload succeeds.
 */
async function apiServerVerdicts(cluster: Cluster, path: string, jwt: object[]): Promise<Verdict[]> {
  const verdicts: Verdict[] = [];
  for (let start = 0; start < jwt.length; start += ENTRIES_PER_RELOAD) {
    const chunk = jwt.slice(start, start + ENTRIES_PER_RELOAD);
    const first = start === 0 ? [] : jwt.slice(0, 1);
    const answers = await reloadVerdicts(cluster, path, [...first, ...chunk]);
    verdicts.push(...answers.slice(first.length));
  }
  return verdicts;
}

async function reloadVerdicts(cluster: Cluster, path: string, jwt: object[]): Promise<Verdict[]> {
  const before = await reloads(cluster);
  const logPath = join(cluster.dir, 'kube-apiserver.log');
  const logBefore = readFileSync(logPath, 'utf8').length;
  writeFileSync(`${path}.next`, authenticationConfigText(jwt));
  renameSync(`${path}.next`, path);
  const after = await eventually(async () => {
    const now = await reloads(cluster);
    if (now.success === before.success && now.failure === before.failure) throw new Error('not reloaded yet');
    return now;
  }, 90_000);
  if (after.success > before.success) return jwt.map(() => ({ accepted: true, detail: 'reloaded' }));
  const log = readFileSync(logPath, 'utf8').slice(logBefore);
  const at = log.indexOf('failed to validate authentication config');
  if (at < 0) throw new Error(`the reload failed before validation:\n${log.slice(-2000)}`);
  const reasons = log.slice(at).replace(/\s+/g, ' ');
  if (!/jwt\[\d+\]\./.test(reasons))
    throw new Error(`the failed reload names no entry: ${reasons.slice(0, 3000)}`);
  return jwt.map((_, index) => {
    const named = reasons.indexOf(`jwt[${index}].`);
    return named < 0
      ? { accepted: true, detail: 'valid (not named by the failed reload)' }
      : { accepted: false, detail: reasons.slice(named, named + 400) };
  });
}

/**
 * Which entries Sealion takes: each a JWTAuthenticator of its own, all at once; refused at apply, or its phase once
 * it leaves Pending (Ready: taken; Error: refused, the failed conditions saying why). Deleted afterwards.
 */
async function sealionVerdicts(cluster: Cluster, entries: object[]): Promise<Verdict[]> {
  const resource = `jwtauthenticators.${GROUP}`;
  const name = (index: number): string => `candidate-${index}`;
  const verdicts: (Verdict | undefined)[] = await Promise.all(
    entries.map(async (jwt, index) => {
      const applied = await cluster.kubectl(['apply', '-f', '-'], {
        input: JSON.stringify({
          apiVersion: `${GROUP}/v1alpha1`,
          kind: 'JWTAuthenticator',
          metadata: { name: name(index), labels: { 'structured-authn-test': 'candidate' } },
          spec: { jwt },
        }),
      });
      return applied.code === 0
        ? undefined
        : { accepted: false, detail: `apply: ${applied.stderr.trim().replace(/\s+/g, ' ').slice(0, 400)}` };
    }),
  );
  interface Listed {
    metadata: { name: string };
    status?: { phase?: string; conditions?: { type: string; status: string; message: string }[] };
  }
  try {
    await eventually(async () => {
      const listed = await cluster.kubectl([
        'get',
        resource,
        '-l',
        'structured-authn-test=candidate',
        '-o',
        'json',
      ]);
      const items = new Map(
        (JSON.parse(listed.stdout) as { items: Listed[] }).items.map((item) => [item.metadata.name, item]),
      );
      const pending: string[] = [];
      for (const index of entries.keys()) {
        if (verdicts[index]?.detail.startsWith('apply:')) continue;
        const status = items.get(name(index))?.status;
        if (status?.phase !== 'Ready' && status?.phase !== 'Error') {
          pending.push(name(index));
          continue;
        }
        const failed = (status.conditions ?? []).filter((condition) => condition.status === 'False');
        verdicts[index] = {
          accepted: status.phase === 'Ready',
          detail: `${status.phase}${failed.length ? `: ${failed.map((f) => `${f.type}: ${f.message}`).join('; ')}` : ''}`,
        };
      }
      if (pending.length > 0) throw new Error(`still Pending: ${pending.join(', ')}`);
    }, READY_TIMEOUT_MS);
  } catch (err) {
    for (const index of entries.keys())
      verdicts[index] ??= { accepted: false, detail: `never Ready nor Error: ${(err as Error).message}` };
  } finally {
    await cluster.kubectl(['delete', resource, '-l', 'structured-authn-test=candidate', '--wait']);
  }
  return verdicts.map((verdict) => verdict ?? { accepted: false, detail: 'no verdict' });
}

/** A difference, with all it takes to reproduce it. */
function describe_(row: Row, api: Answer, sealion: Answer, note = ''): string {
  const show = (answer: Answer): string =>
    answer.kind === 'user'
      ? JSON.stringify({
          username: answer.username,
          uid: answer.uid,
          groups: answer.groups,
          extra: answer.extra,
        })
      : `${answer.status} ${answer.body.slice(0, 300).replace(/\s+/g, ' ')}`;
  return [
    `${row.name}${note ? ` (${note})` : ''}`,
    `  claims:     ${JSON.stringify(row.claims)}`,
    ...(row.token.mint || row.token.raw
      ? [`  signed:     ${row.token.name} (${row.jwt.split('.')[0]})`]
      : []),
    `  rules:      ${JSON.stringify(row.configuration.rules)}`,
    `  API server: ${show(api)}`,
    `  Sealion:    ${show(sealion)}`,
  ].join('\n');
}
