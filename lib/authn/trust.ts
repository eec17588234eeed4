// What a TokenCredentialRequest certificate is bound to besides its authenticator's uid: a digest of the part of
// that authenticator's spec that decides whom it trusts and what identity it gives them. A certificate vouches for an
// answer its authenticator gave under one spec; once an edit changes that part (another issuer, CA, audience, claim
// or prefix, webhook), the proxy honours the certificate no more, where binding to the uid alone kept it valid for
// the rest of its life (up to a day). Edits that change nothing of it (labels, annotations, status, the lifetime of
// certificates issued from now on) leave certificates valid.
//
// The digest is SHA-256 over a canonical JSON of the fields' values (object keys sorted at every level), each value
// as the authenticator reads it (defaults filled in, an empty string read as absent), so that writing out a default
// changes nothing. It is computed from the parsed spec, never from text something else parses again.
import { createHash } from 'node:crypto';
// JSON with the keys of every object sorted, so that one value has one text whatever order it was built in.
import canonicalJSON from 'safe-stable-stringify';
import type { JWTAuthenticatorSpec, TLSSpec, WebhookAuthenticatorSpec } from '../../apis/authentication.ts';
import { DEFAULT_GROUPS_CLAIM, DEFAULT_USERNAME_CLAIM } from './jwt.ts';

/** For each field of a spec: its value as the digest takes it, or null when the field is not in the digest. */
type TrustFields<Spec> = { [Field in keyof Required<Spec>]: ((spec: Spec) => unknown) | null };

/**
 * The CA bundle an authenticator trusts, as the controllers read it: empty (or absent) is the system's roots; or the
 * Secret or ConfigMap it is kept in (the bundle there may rotate: the same place is the same trust).
 */
const caBundle = (spec: { tls?: TLSSpec }): unknown => {
  const source = spec.tls?.certificateAuthorityDataSource;
  return source
    ? { kind: source.kind, name: source.name, key: source.key }
    : spec.tls?.certificateAuthorityData || '';
};
/** Read as the controllers read it: only `true` allows system names. */
const systemNames = (spec: { allowSystemNames?: boolean }): boolean => spec.allowSystemNames === true;
/**
 * Not whom an authenticator trusts but how long the certificates it vouches for live; one already issued keeps the
 * expiry written in it. Editing it must not log everyone out.
 */
const LIFETIME = null;

/**
 * Every field of a JWTAuthenticator's spec, and which decide trust. The type lists every field of the spec, so a field
 * added there without a line here does not compile: none is left out of the digest by oversight.
 */
export const JWT_TRUST_FIELDS: TrustFields<JWTAuthenticatorSpec> = {
  // Whose tokens are taken, and where the keys that check them come from.
  issuer: (spec) => spec.issuer,
  // Which client's tokens are taken.
  audience: (spec) => spec.audience,
  // Which claims become the username and the groups, and what is put before them.
  claims: (spec) => ({
    username: spec.claims?.username || DEFAULT_USERNAME_CLAIM,
    groups: spec.claims?.groups || DEFAULT_GROUPS_CLAIM,
    usernamePrefix: spec.claims?.usernamePrefix || '',
    groupsPrefix: spec.claims?.groupsPrefix || '',
  }),
  // Which servers may serve the discovery document and the keys.
  tls: caBundle,
  // The structured form says all of the above and the rules and mappings: all of it decides trust. Absent (the older
  // fields) it adds nothing, so those specs' digests are what they were.
  jwt: (spec) => spec.jwt,
  // Whether names Kubernetes reserves may come out.
  allowSystemNames: systemNames,
  credentialLifetimeSeconds: LIFETIME,
};

/** Every field of a WebhookAuthenticator's spec, and which decide trust (see JWT_TRUST_FIELDS). */
export const WEBHOOK_TRUST_FIELDS: TrustFields<WebhookAuthenticatorSpec> = {
  // Who is asked, and so whose answers are believed.
  endpoint: (spec) => spec.endpoint,
  // Which of its answers are taken (absent: every one, and the digest is what it was).
  userValidationRules: (spec) => spec.userValidationRules,
  // Which servers may answer at that endpoint.
  tls: caBundle,
  // Whether names Kubernetes reserves may come out.
  allowSystemNames: systemNames,
  credentialLifetimeSeconds: LIFETIME,
};

function digest<Spec>(kind: string, fields: TrustFields<Spec>, spec: Spec): string {
  const taken: Record<string, unknown> = {};
  for (const [field, read] of Object.entries<((spec: Spec) => unknown) | null>(fields))
    if (read) taken[field] = read(spec);
  return createHash('sha256')
    .update(canonicalJSON({ kind, spec: taken })!)
    .digest('base64url');
}

/** The digest of what a JWTAuthenticator's spec trusts: 43 characters of base64url. */
export const jwtTrustDigest = (spec: JWTAuthenticatorSpec): string =>
  digest('JWTAuthenticator', JWT_TRUST_FIELDS, spec);

/** The digest of what a WebhookAuthenticator's spec trusts: 43 characters of base64url. */
export const webhookTrustDigest = (spec: WebhookAuthenticatorSpec): string =>
  digest('WebhookAuthenticator', WEBHOOK_TRUST_FIELDS, spec);
