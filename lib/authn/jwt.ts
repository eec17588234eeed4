// JWT (OIDC ID token) authentication for one issuer and audience. Discovery and the key set are fetched through
// the authenticator's own CA bundle; keys are cached, refreshed when the authenticators' controller asks (every
// JWKS_REFRESH_INTERVAL_MS, jittered) and on an unknown `kid` (rate-limited), and the last good keys keep serving
// while the issuer is down. jws.ts checks signatures and registered claims, with keys imported once per key set.
import type { JSONWebKeySet, JWTPayload } from 'jose';
import { httpsJSON } from '../https-client.ts';
import { SYSTEM_NAMES_ALLOWED_NOTE, SYSTEM_PREFIX, systemNameProblem } from './system-names.ts';
import { fail, oversized, type AuthResult, type TokenAuthenticator, type UserInfo } from './types.ts';
import { mapClaims, type JWTMapping } from './jwt-mapping.ts';
import { ALLOWED_ALGORITHMS, VerificationKeys, verifyJWT, type Verified } from './jws.ts';

export { ALLOWED_ALGORITHMS };

/**
 * Clock skew tolerated, as the API server's OIDC authenticator tolerates it: none on exp (an expired token is
 * refused the moment it expires), five minutes on nbf (an issuer whose clock runs ahead).
 */
export const EXPIRY_LEEWAY_SECONDS = 0;
export const NOT_BEFORE_LEEWAY_SECONDS = 300;
/** Providers rotate keys rarely and publish new ones ahead of use; five minutes picks them up in time. */
export const JWKS_REFRESH_INTERVAL_MS = 5 * 60_000;
/** Each refresh comes this fraction of the interval early or late, so replicas and authenticators do not fetch in lockstep. */
const JWKS_REFRESH_JITTER = 0.1;
/** A token with an unknown `kid` triggers a refresh at most this often, so garbage tokens cannot hammer the issuer. */
export const UNKNOWN_KID_COOLDOWN_MS = 30_000;
/**
 * kubectl sends the same token with every request; a verified token's answer says it may be reused this long
 * (never past its exp), and the AuthenticatorCache keeps it so, so the proxy pays for a signature check once per
 * token rather than once per request. Kubernetes caches token authentication the same way.
 */
export const VERIFIED_TOKEN_TTL_MS = 60_000;
export const DEFAULT_USERNAME_CLAIM = 'username';
/** The extra the API server gives a user whose token has a jti: `JTI=<jti>`, naming the credential, not the user. */
export const CREDENTIAL_ID_EXTRA = 'authentication.kubernetes.io/credential-id';
export const DEFAULT_GROUPS_CLAIM = 'groups';

export interface JWTSettings {
  /** Exact issuer; must equal the tokens' `iss` and the discovery document's `issuer`. */
  issuer: string;
  audience: string;
  /** Default: `username`. */
  usernameClaim?: string;
  /** Default: `groups`. */
  groupsClaim?: string;
  /** Put before the username claim's value (say `oidc:`), before the system-name check. Default: none. */
  usernamePrefix?: string;
  /** Put before each group, before the system-name check. Default: none. */
  groupsPrefix?: string;
  /** Accept usernames and groups that start with `system:` (see system-names.ts). Default: false. */
  allowSystemNames?: boolean;
  /** PEM CA bundle for the issuer. Default: system roots. */
  caBundlePem?: string;
  /**
   * Kubernetes' structured authentication for this issuer (jwt-mapping.ts): its audiences, discovery URL, rules and
   * mappings, which take the place of audience, the claims and the prefixes above.
   */
  mapping?: JWTMapping;
  /** What is wrong with the structured configuration, when it could not be compiled into a mapping. */
  mappingProblem?: string;
}

export interface JWTDependencies {
  /** Fetches JSON over HTTPS; replaceable in tests. Default: httpsJSON. */
  fetchJSON?: (url: string, caBundlePem: string | undefined, signal?: AbortSignal) => Promise<unknown>;
  /** Milliseconds since the epoch. Default: Date.now. */
  now?: () => number;
  /** Receives non-fatal problems (a failed background refresh). Default: ignore. */
  warn?: (message: string, fields: Record<string, unknown>) => void;
}

const defaultFetch = async (
  url: string,
  caBundlePem: string | undefined,
  signal?: AbortSignal,
): Promise<unknown> =>
  (
    await httpsJSON(url, {
      ...(caBundlePem === undefined ? {} : { caBundlePem }),
      ...(signal ? { signal } : {}),
    })
  ).json;

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

/** Keys usable for signature checks: asymmetric, and marked for signatures or not marked (as jose takes them). */
export function usableKeys(jwks: unknown): JSONWebKeySet {
  if (!isRecord(jwks) || !Array.isArray(jwks['keys'])) throw new Error('the JWKS has no "keys" list');
  const keys = (jwks['keys'] as unknown[]).filter(
    (k): k is JSONWebKeySet['keys'][number] =>
      isRecord(k) &&
      ['RSA', 'EC', 'OKP'].includes(k['kty'] as string) &&
      (k['use'] === undefined || k['use'] === 'sig'),
  );
  if (keys.length === 0) throw new Error('the JWKS holds no RSA, EC or OKP signing key');
  return { keys };
}

/** The issuer's key set with refresh and last-good retention. */
export class IssuerKeys {
  /** The keys tokens are verified with now: replaced whole by a fetch that succeeds. */
  current: VerificationKeys;
  private fetchedAt: number;
  /**
   * When an unknown kid last caused a fetch. Loads on a timer or at start do not count: a key rotated in just after
   * one must not be refused for the cooldown, while garbage kids still cost the issuer one fetch per cooldown.
   */
  private lastUnknownKidFetch = Number.NEGATIVE_INFINITY;
  private inflight: Promise<boolean> | undefined;
  /** When the next scheduled refresh is due: the interval, jittered, after the last fetch that succeeded. */
  private nextRefreshAt: number;
  private readonly jwksURL: string;
  private readonly load: () => Promise<unknown>;
  private readonly now: () => number;
  private readonly warn: (message: string, fields: Record<string, unknown>) => void;

  constructor(
    jwksURL: string,
    initial: JSONWebKeySet,
    load: () => Promise<unknown>,
    now: () => number,
    warn: (message: string, fields: Record<string, unknown>) => void,
  ) {
    this.jwksURL = jwksURL;
    this.load = load;
    this.now = now;
    this.warn = warn;
    this.current = new VerificationKeys(initial);
    this.fetchedAt = now();
    this.nextRefreshAt = this.scheduleAfter(this.fetchedAt);
  }

  private scheduleAfter(fetchedAt: number): number {
    return (
      fetchedAt +
      JWKS_REFRESH_INTERVAL_MS * (1 - JWKS_REFRESH_JITTER + Math.random() * 2 * JWKS_REFRESH_JITTER)
    );
  }

  /**
   * Fetches the key set again; on failure the current keys stay. Concurrent callers share one fetch. Resolves to
   * whether it fetched usable keys.
   */
  refresh(): Promise<boolean> {
    this.inflight ??= (async () => {
      try {
        this.current = new VerificationKeys(usableKeys(await this.load()));
        this.fetchedAt = this.now();
        this.nextRefreshAt = this.scheduleAfter(this.fetchedAt);
        return true;
      } catch (err) {
        this.warn('jwks refresh failed; keeping the last good keys', {
          jwksURL: this.jwksURL,
          keysAgeMs: this.now() - this.fetchedAt,
          error: (err as Error).message,
        });
        return false;
      } finally {
        this.inflight = undefined;
      }
    })();
    return this.inflight;
  }

  /**
   * The scheduled refresh, for the controller that holds the authenticator (controllers/authenticators.ts) to call
   * each time its key comes round: fetches when the keys are due, and resolves to how long until they are due again,
   * for the controller to come back then. A failed fetch rejects, so that the controller retries with its backoff;
   * the last good keys keep serving meanwhile.
   */
  async refreshIfDue(): Promise<number> {
    const wait = this.nextRefreshAt - this.now();
    if (wait > 0) return wait;
    if (!(await this.refresh())) throw new Error(`jwks refresh from ${this.jwksURL} failed`);
    return Math.max(0, this.nextRefreshAt - this.now());
  }

  /**
   * `verify` with the current keys; when no key fits the token (an unknown kid), once more after a refresh, which is
   * rate-limited: a refresh already under way is waited for, and a new one starts only when the cooldown has passed.
   */
  async verifyWithRefresh(verify: (keys: VerificationKeys) => Verified): Promise<Verified> {
    // The check is synchronous (jws.ts); it runs on a later turn of the event loop, not inside the read of the HTTP/2
    // session the request came on. Run inside it, a burst of first verifications (4,000 watches opened at once on
    // five connections, all with one new token: `BENCH_ONLY=none npm run bench -- proxy`) made nghttp2 fail sessions
    // with a protocol error, and 600 to 900 of the watches with them; with this turn, every one opened.
    await new Promise((turn) => setImmediate(turn));
    const first = verify(this.current);
    if (first.ok || first.code !== 'ERR_JWKS_NO_MATCHING_KEY') return first;
    if (!this.inflight) {
      if (this.now() - this.lastUnknownKidFetch < UNKNOWN_KID_COOLDOWN_MS) return first;
      this.lastUnknownKidFetch = this.now();
    }
    await this.refresh();
    return verify(this.current);
  }
}

/** One check of the validation, in the shape of a status condition. */
export interface Check {
  type: string;
  status: 'True' | 'False' | 'Unknown';
  reason: string;
  message: string;
}

export interface JWTValidation {
  checks: Check[];
  /** Present only when every check passed. */
  authenticator?: JWTAuthenticator;
}

function issuerURLProblem(issuer: string): string | undefined {
  let url: URL;
  try {
    url = new URL(issuer);
  } catch {
    return `spec.issuer ${JSON.stringify(issuer)} is not a URL`;
  }
  if (url.protocol !== 'https:') return `spec.issuer must use https, not ${url.protocol.replace(':', '')}`;
  if (url.search || url.hash) return 'spec.issuer must not have a query or a fragment';
  if (url.username || url.password) return 'spec.issuer must not contain credentials';
  if (url.pathname.includes('/.well-known/'))
    return 'spec.issuer must be the issuer itself, without /.well-known/openid-configuration';
  return undefined;
}

/** A prefix that makes every name a system name would refuse every token: say so rather than go Ready. */
function systemPrefixProblem(settings: JWTSettings): string | undefined {
  if (settings.allowSystemNames) return undefined;
  for (const [field, prefix] of [
    ['usernamePrefix', settings.usernamePrefix],
    ['groupsPrefix', settings.groupsPrefix],
  ] as const) {
    if (prefix?.startsWith(SYSTEM_PREFIX))
      return `spec.claims.${field} ${JSON.stringify(prefix)} makes every name start with ${SYSTEM_PREFIX}, which is refused unless spec.allowSystemNames is true`;
  }
  return undefined;
}

/** A claim of the payload itself, never one inherited from Object.prototype (a claim named `constructor`). */
function claim(payload: JWTPayload, name: string): unknown {
  return Object.hasOwn(payload, name) ? payload[name] : undefined;
}

/**
 * Runs the checks of a JWTAuthenticator in order (issuer URL, discovery, JWKS URL, JWKS fetch) and builds the
 * authenticator when all pass. Checks after a failed one are Unknown. Never throws. `signal` cuts the first fetches
 * short (the caller stopped); the key refreshes after are the authenticator's own.
 */
export async function validateJWT(
  settings: JWTSettings,
  tlsProblem: string | undefined,
  deps: JWTDependencies = {},
  signal?: AbortSignal,
): Promise<JWTValidation> {
  const fetchJSON = deps.fetchJSON ?? defaultFetch;
  const checks: Check[] = [];
  const order = [
    'TLSConfigurationValid',
    'IssuerURLValid',
    'DiscoveryURLValid',
    'JWKSURLValid',
    'JWKSFetchValid',
    'AuthenticatorValid',
  ];
  const failAt = (type: string, reason: string, message: string): JWTValidation => {
    checks.push({ type, status: 'False', reason, message });
    for (const later of order.slice(order.indexOf(type) + 1)) {
      checks.push({
        type: later,
        status: 'Unknown',
        reason: 'UnableToValidate',
        message: 'unable to validate; see other conditions for details',
      });
    }
    return { checks };
  };
  const pass = (type: string, message: string): void => {
    checks.push({ type, status: 'True', reason: 'Success', message });
  };

  if (tlsProblem) return failAt('TLSConfigurationValid', 'InvalidTLSConfiguration', tlsProblem);
  pass(
    'TLSConfigurationValid',
    settings.caBundlePem ? 'the CA bundle is valid' : 'no CA bundle given: trusting the system roots',
  );

  const urlProblem = issuerURLProblem(settings.issuer);
  if (urlProblem) return failAt('IssuerURLValid', 'InvalidIssuerURL', urlProblem);
  pass('IssuerURLValid', 'issuer is a valid https URL');

  const discoveryURL =
    settings.mapping?.discoveryURL ??
    `${settings.issuer.replace(/\/$/, '')}/.well-known/openid-configuration`;
  let discovery: unknown;
  try {
    discovery = await fetchJSON(discoveryURL, settings.caBundlePem, signal);
  } catch (err) {
    return failAt(
      'DiscoveryURLValid',
      'InvalidDiscoveryProbe',
      `could not fetch ${discoveryURL}: ${(err as Error).message}`,
    );
  }
  if (!isRecord(discovery) || discovery['issuer'] !== settings.issuer) {
    const found = isRecord(discovery) ? JSON.stringify(discovery['issuer']) : 'no document';
    return failAt(
      'DiscoveryURLValid',
      'InvalidDiscoveryProbe',
      `the discovery document at ${discoveryURL} names issuer ${found}, not ${JSON.stringify(settings.issuer)}; spec.issuer must match it exactly (including any trailing slash)`,
    );
  }
  pass('DiscoveryURLValid', 'discovery document fetched and names this issuer');

  const jwksURL = discovery['jwks_uri'];
  if (typeof jwksURL !== 'string' || !jwksURL.startsWith('https://') || !URL.canParse(jwksURL)) {
    return failAt(
      'JWKSURLValid',
      'InvalidProviderJWKSURL',
      `the discovery document's jwks_uri ${JSON.stringify(jwksURL)} is not an https URL`,
    );
  }
  pass('JWKSURLValid', 'jwks_uri is a valid https URL');

  const load = (): Promise<unknown> => fetchJSON(jwksURL, settings.caBundlePem);
  let keys: JSONWebKeySet;
  try {
    keys = usableKeys(await fetchJSON(jwksURL, settings.caBundlePem, signal));
  } catch (err) {
    return failAt(
      'JWKSFetchValid',
      'InvalidCouldNotFetchJWKS',
      `could not use the key set at ${jwksURL}: ${(err as Error).message}`,
    );
  }
  pass('JWKSFetchValid', `fetched ${keys.keys.length} signing key(s)`);

  const prefixProblem = settings.mappingProblem ?? systemPrefixProblem(settings);
  if (prefixProblem) return failAt('AuthenticatorValid', 'InvalidAuthenticator', prefixProblem);
  const issuerKeys = new IssuerKeys(jwksURL, keys, load, deps.now ?? Date.now, deps.warn ?? (() => {}));
  pass(
    'AuthenticatorValid',
    settings.allowSystemNames
      ? `authenticator initialized; ${SYSTEM_NAMES_ALLOWED_NOTE}`
      : 'authenticator initialized',
  );
  return { checks, authenticator: new JWTAuthenticator(settings, issuerKeys) };
}

/** Verifies tokens with cached keys. Build it with validateJWT. */
export class JWTAuthenticator implements TokenAuthenticator {
  readonly issuer: string;
  private readonly usernameClaim: string;
  private readonly groupsClaim: string;
  private readonly settings: JWTSettings;
  /** The token's aud must name one of these. */
  private readonly audiences: readonly string[];
  readonly keys: IssuerKeys;

  constructor(settings: JWTSettings, keys: IssuerKeys) {
    this.settings = settings;
    this.keys = keys;
    this.issuer = settings.issuer;
    this.usernameClaim = settings.usernameClaim ?? DEFAULT_USERNAME_CLAIM;
    this.groupsClaim = settings.groupsClaim ?? DEFAULT_GROUPS_CLAIM;
    const audiences = settings.mapping?.audiences ?? settings.audience;
    this.audiences = typeof audiences === 'string' ? [audiences] : audiences;
  }

  async authenticate(token: string): Promise<AuthResult> {
    const tooLarge = oversized(token);
    if (tooLarge) return tooLarge;
    // A token without a kid may fit several keys (during a rotation): each is tried, as the API server tries them.
    const verified = await this.keys.verifyWithRefresh((keys) =>
      verifyJWT(token, keys, {
        issuer: this.settings.issuer,
        audiences: this.audiences,
        notBeforeLeewaySeconds: NOT_BEFORE_LEEWAY_SECONDS,
        expiryLeewaySeconds: EXPIRY_LEEWAY_SECONDS,
        now: Date.now() / 1000,
      }),
    );
    if (!verified.ok) return fail(`jwt rejected: ${verified.code}: ${verified.message}`);
    const result = this.userOf(verified.payload);
    if (!result.ok) return result;
    // exp was required and checked: remember the user until it (plus the leeway) or the TTL, whichever is first.
    const now = Date.now();
    const until = Math.min(
      now + VERIFIED_TOKEN_TTL_MS,
      verified.payload.exp! * 1000 + EXPIRY_LEEWAY_SECONDS * 1000,
    );
    return until <= now ? result : { ...result, reusableUntil: until };
  }

  /** The user a verified payload names, by the claim rules and mappings of the spec. */
  private userOf(payload: JWTPayload): AuthResult {
    // The API server reads sub as a string, and refuses a token whose sub is anything else.
    if (payload.sub !== undefined && typeof payload.sub !== 'string')
      return fail('claim sub is not a string');
    const mapped = this.settings.mapping
      ? mapClaims(this.settings.mapping, payload)
      : this.legacyUser(payload);
    if ('reason' in mapped) return fail(mapped.reason);
    // As the API server: a token with a jti is named in the user's extra, so audit can tell its uses apart.
    const jti = payload.jti;
    const user =
      typeof jti === 'string' && jti !== ''
        ? { ...mapped, extra: { ...mapped.extra, [CREDENTIAL_ID_EXTRA]: [`JTI=${jti}`] } }
        : mapped;
    if (!this.settings.allowSystemNames) {
      const problem = systemNameProblem(user);
      if (problem) return fail(`${problem}; refused unless spec.allowSystemNames is true`);
    }
    return { ok: true, user, authenticator: this.settings.issuer };
  }

  /** The user by the claims and prefixes the spec names (the structured form's claim mappings, said the old way). */
  private legacyUser(payload: JWTPayload): UserInfo | { reason: string } {
    const claimed = claim(payload, this.usernameClaim);
    if (typeof claimed !== 'string' || claimed === '')
      return { reason: `claim ${this.usernameClaim} is missing or not a string` };
    // As Kubernetes does: an email username counts only when email_verified, if the token has it, is the boolean
    // true. Anything else there (false, "false", 0, "yes", null) is a provider saying something we cannot trust.
    if (this.usernameClaim === 'email' && Object.hasOwn(payload, 'email_verified')) {
      const verified = payload['email_verified'];
      if (typeof verified !== 'boolean')
        return { reason: 'claim email_verified is present but not a boolean' };
      if (!verified) return { reason: 'email is not verified' };
    }
    const rawGroups = claim(payload, this.groupsClaim);
    let claimedGroups: string[];
    if (rawGroups === undefined) claimedGroups = [];
    else if (typeof rawGroups === 'string') claimedGroups = [rawGroups];
    else if (Array.isArray(rawGroups) && rawGroups.every((g) => typeof g === 'string'))
      claimedGroups = rawGroups;
    else return { reason: `claim ${this.groupsClaim} is neither a string nor a list of strings` };
    // Prefixes first, so that a prefix such as `oidc:` makes a claimed `system:masters` harmless.
    return {
      username: (this.settings.usernamePrefix ?? '') + claimed,
      groups: claimedGroups.map((g) => (this.settings.groupsPrefix ?? '') + g),
      extra: {},
    };
  }

  /** Nothing to release: its keys are refreshed by the controller that holds it, on no timer of its own. */
  close(): void {}
}
