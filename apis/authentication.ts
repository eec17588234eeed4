// authentication.concierge.<suffix>/v1alpha1: JWTAuthenticator and WebhookAuthenticator, cluster-scoped.
// The JSDoc here becomes the CRDs' OpenAPI schema (config/generate.ts): it is what `kubectl explain` shows.
import type { Condition, ObjectMeta } from './meta.ts';

/** Lifecycle of an authenticator: Pending until first validated, then Ready or Error. */
export type AuthenticatorPhase = 'Pending' | 'Ready' | 'Error';

export const Phase = {
  Pending: 'Pending',
  Ready: 'Ready',
  Error: 'Error',
} as const satisfies Record<AuthenticatorPhase, AuthenticatorPhase>;

/** A Secret or ConfigMap, in the concierge's namespace, that holds a PEM CA bundle under a key. */
export interface CertificateAuthorityDataSource {
  /** Secret or ConfigMap. */
  kind: 'Secret' | 'ConfigMap';
  /**
   * Its name.
   * @minLength 1
   */
  name: string;
  /**
   * The key whose value is the PEM bundle.
   * @minLength 1
   */
  key: string;
}

/**
 * How to trust a TLS server: a CA bundle given inline, or read from a Secret or ConfigMap (watched, so a rotation
 * applies at once), not both.
 * @validation !(has(self.certificateAuthorityData) && has(self.certificateAuthorityDataSource)) :: give certificateAuthorityData or certificateAuthorityDataSource, not both
 */
export interface TLSSpec {
  /**
   * Base64-encoded PEM bundle of the CA certificates to trust. Empty: the system's trusted roots.
   * @format byte
   */
  certificateAuthorityData?: string;
  /** Where the PEM bundle of the CA certificates to trust is kept, instead of certificateAuthorityData. */
  certificateAuthorityDataSource?: CertificateAuthorityDataSource;
}

/**
 * Which claims of a token name the user and their groups, and what goes before those names. `username` and
 * `groups` name claims (as in Pinniped); the prefixes are what Kubernetes' structured authentication config calls
 * claimMappings.username.prefix and claimMappings.groups.prefix.
 */
export interface JWTClaims {
  /**
   * The claim that holds the username. Default: username.
   * @minLength 1
   */
  username?: string;
  /**
   * The claim that holds the user's groups, as a string or a list of strings. Default: groups.
   * @minLength 1
   */
  groups?: string;
  /**
   * Put before the username claim's value, for example `oidc:`, so that this issuer's users cannot be mistaken for
   * users from elsewhere. Applied before the check for `system:` names, so a prefix also makes a claimed
   * `system:admin` harmless (`oidc:system:admin`). Default: none.
   * @maxLength 256
   */
  usernamePrefix?: string;
  /**
   * Put before each group, for example `oidc:`. Applied before the check for `system:` names, so a prefix also
   * makes a claimed `system:masters` harmless. Default: none.
   * @maxLength 256
   */
  groupsPrefix?: string;
}

/**
 * Kubernetes' structured authentication, a `jwt` entry of AuthenticationConfiguration (apiserver.config.k8s.io/v1) as
 * kube-apiserver reads it from --authentication-config: paste one here as it is, and Sealion takes it as the API
 * server would (integration/structured-authn.test.ts compares the two).
 */
export interface JWTConfiguration {
  /** Where tokens come from and whom they are for. */
  issuer: JWTIssuer;
  /**
   * Checks on the token's claims, each a claim that must hold a value or a CEL expression over `claims` that must be
   * true; a token failing one is refused.
   */
  claimValidationRules?: ClaimValidationRule[];
  /** How the claims become the user: username, groups, uid and extra, each a claim or a CEL expression. */
  claimMappings: ClaimMappings;
  /** Checks on the mapped user, CEL expressions over `user` that must be true; a user failing one is refused. */
  userValidationRules?: UserValidationRule[];
}

export interface JWTIssuer {
  /**
   * The issuer URL: https, equal to the tokens' iss claim.
   * @pattern ^https://[^?#]+$
   * @maxLength 2048
   */
  url: string;
  /**
   * Where the discovery document is fetched from, when not at <url>/.well-known/openid-configuration (its issuer must
   * still be url). Must differ from url.
   * @pattern ^https://[^?#]+$
   * @maxLength 2048
   */
  discoveryURL?: string;
  /**
   * The audiences, at least one; a token must name one of them (MatchAny).
   * @minItems 1
   */
  audiences: string[];
  /** MatchAny; required with more than one audience. */
  audienceMatchPolicy?: 'MatchAny';
  /** PEM CA bundle to trust for the issuer. Default: the system's roots. */
  certificateAuthority?: string;
}

export interface ClaimValidationRule {
  /** A claim that must be present and a string equal to requiredValue. Give claim or expression. */
  claim?: string;
  /** The value claim must hold. */
  requiredValue?: string;
  /** A CEL expression over `claims` that must evaluate to true. */
  expression?: string;
  /** What a failed expression means, for the log. */
  message?: string;
}

export interface PrefixedClaimOrExpression {
  /** A claim holding the value. Give claim (with prefix) or expression. */
  claim?: string;
  /** Put before the claim's value; required with claim (it may be ""). */
  prefix?: string;
  /** A CEL expression over `claims`. */
  expression?: string;
}

export interface ClaimOrExpression {
  /** A claim holding the value. Give claim or expression. */
  claim?: string;
  /** A CEL expression over `claims`. */
  expression?: string;
}

export interface ExtraMapping {
  /** The extra attribute's key: a domain-prefixed path in lower case, such as example.com/team. */
  key: string;
  /** A CEL expression over `claims` giving a string or a list of strings (null or empty: none). */
  valueExpression: string;
}

export interface ClaimMappings {
  username: PrefixedClaimOrExpression;
  groups?: PrefixedClaimOrExpression;
  uid?: ClaimOrExpression;
  /**
   * @listType map
   * @listMapKeys key
   */
  extra?: ExtraMapping[];
}

export interface UserValidationRule {
  /** A CEL expression over `user` (username, uid, groups, extra) that must evaluate to true. */
  expression: string;
  /** What a failure means, for the log. */
  message?: string;
}

/**
 * Trust OIDC ID tokens (JWTs) from one issuer: either `issuer` and `audience` (with `claims` and `tls`), or `jwt`, the
 * structured form Kubernetes' own --authentication-config takes, never both.
 * With jwt, tls may only name where the CA is kept (certificateAuthorityDataSource), in place of
 * jwt.issuer.certificateAuthority.
 * @validation has(self.jwt) ? !has(self.issuer) && !has(self.audience) && !has(self.claims) && (!has(self.tls) || !has(self.tls.certificateAuthorityData) && !has(self.jwt.issuer.certificateAuthority)) : has(self.issuer) && has(self.audience) :: give either jwt or issuer and audience (with claims and tls), not both; with jwt, the CA inline (jwt.issuer.certificateAuthority) or from tls.certificateAuthorityDataSource
 */
export interface JWTAuthenticatorSpec {
  /**
   * The issuer URL. It must use https, match the iss claim of tokens exactly, and serve OIDC discovery at
   * <issuer>/.well-known/openid-configuration.
   * @pattern ^https://[^?#]+$
   * @minLength 9
   * @maxLength 2048
   */
  issuer?: string;
  /**
   * The audience that tokens must name in their aud claim, usually the OIDC client ID.
   * @minLength 1
   * @maxLength 1024
   */
  audience?: string;
  /** Kubernetes' structured authentication for this issuer, instead of issuer, audience, claims and tls. */
  jwt?: JWTConfiguration;
  /** Which claims name the user and their groups, and the prefixes put before those names. */
  claims?: JWTClaims;
  /** How to trust the issuer's TLS certificate. */
  tls?: TLSSpec;
  /**
   * Accept tokens whose username or groups (after any prefix) start with `system:`. Kubernetes reserves those
   * names and its RBAC trusts them (`system:masters` is cluster-admin), so by default such a token is refused as
   * if it were invalid; the group `system:authenticated`, which every user has anyway, is always accepted. Set
   * it only for an issuer you trust as much as the cluster's own components. Default: false.
   */
  allowSystemNames?: boolean;
  /**
   * How long client certificates from TokenCredentialRequest last when this authenticator checked the token, in
   * seconds: from 2 minutes (the CLI renews a certificate a minute before it expires) to 1 day. A longer life spares
   * tools that hold connections open (k9s, IDEs) a login every few minutes, but a certificate outlives the token it
   * was issued for, and ends early only when this authenticator is deleted or edited to trust otherwise (its issuer,
   * audience, claims, CA bundle or allowSystemNames), for every user at once, so keep it as short as your users bear.
   * Editing this field leaves certificates already issued as they are. Default: 300.
   * @asType integer
   * @minimum 120
   * @maximum 86400
   */
  credentialLifetimeSeconds?: number;
}

/** Trust bearer tokens that a TokenReview webhook accepts. */
export interface WebhookAuthenticatorSpec {
  /**
   * The https URL that receives TokenReview (authentication.k8s.io/v1) requests.
   * @pattern ^https://[^#]+$
   * @minLength 9
   * @maxLength 2048
   */
  endpoint: string;
  /** How to trust the webhook's TLS certificate. */
  tls?: TLSSpec;
  /**
   * Accept users whose username or groups start with `system:`. Kubernetes reserves those names and its RBAC
   * trusts them (`system:masters` is cluster-admin), so by default such an answer is refused as if the webhook
   * had said no; the group `system:authenticated`, which every user has anyway, is always accepted. Needed, for
   * example, to use the API server's own TokenReview API as the webhook (service-account users are
   * `system:serviceaccount:…`). Default: false.
   */
  allowSystemNames?: boolean;
  /**
   * Checks on the user the webhook answers with, CEL expressions over `user` (username, uid, groups, extra) that must
   * all be true, as Kubernetes' structured authentication has them for JWTs; a user failing one is refused.
   */
  userValidationRules?: UserValidationRule[];
  /**
   * How long client certificates from TokenCredentialRequest last when this authenticator checked the token, in
   * seconds: from 2 minutes (the CLI renews a certificate a minute before it expires) to 1 day. A longer life spares
   * tools that hold connections open (k9s, IDEs) a login every few minutes, but a certificate outlives the token it
   * was issued for, and ends early only when this authenticator is deleted or edited to trust otherwise (its endpoint,
   * CA bundle or allowSystemNames), for every user at once, so keep it as short as your users bear. Editing this
   * field leaves certificates already issued as they are. Default: 300.
   * @asType integer
   * @minimum 120
   * @maximum 86400
   */
  credentialLifetimeSeconds?: number;
}

/** A way for clients to reach the concierge: through the impersonation proxy or the TokenCredentialRequest API. */
export type StrategyType = 'ImpersonationProxy' | 'TokenCredentialRequestAPI';
export type StrategyStatus = 'Success' | 'Error' | 'NotAvailable';
export type StrategyReason =
  | 'Listening'
  | 'Pending'
  | 'Disabled'
  | 'DisabledByDefault'
  | 'ErrorDuringSetup'
  | 'FetchedKey'
  | 'CouldNotFetchKey'
  | 'CouldNotGetClusterInfo'
  | 'ClusterSigns'
  | 'ClusterDoesNotSign'
  | 'SharedFrontProxyCA'
  | 'APIServiceUnavailable';

export const StrategyTypes = {
  ImpersonationProxy: 'ImpersonationProxy',
  TokenCredentialRequestAPI: 'TokenCredentialRequestAPI',
} as const satisfies Record<StrategyType, StrategyType>;

export const StrategyStatuses = {
  Success: 'Success',
  Error: 'Error',
  NotAvailable: 'NotAvailable',
} as const satisfies Record<StrategyStatus, StrategyStatus>;

export const StrategyReasons = {
  Listening: 'Listening',
  Pending: 'Pending',
  Disabled: 'Disabled',
  DisabledByDefault: 'DisabledByDefault',
  ErrorDuringSetup: 'ErrorDuringSetup',
  FetchedKey: 'FetchedKey',
  CouldNotFetchKey: 'CouldNotFetchKey',
  CouldNotGetClusterInfo: 'CouldNotGetClusterInfo',
  ClusterSigns: 'ClusterSigns',
  ClusterDoesNotSign: 'ClusterDoesNotSign',
  SharedFrontProxyCA: 'SharedFrontProxyCA',
  APIServiceUnavailable: 'APIServiceUnavailable',
} as const satisfies Record<StrategyReason, StrategyReason>;

/**
 * What a strategy's message says when the ConfigMap's latest edit was rejected while the last good configuration keeps
 * the frontend serving: the strategy reports what serves (Success), and clients warn with the message.
 */
export const REJECTED_EDIT =
  'the latest configuration edit was rejected, and the last good configuration stays in effect';

/** Where a client connects, and which CA it trusts there. */
export interface EndpointConfig {
  /**
   * The https URL to point kubectl at.
   * @pattern ^https://
   */
  endpoint: string;
  /**
   * Base64-encoded PEM bundle of the CA that signed the endpoint's serving certificate.
   * @format byte
   */
  certificateAuthorityData: string;
}

/** How the concierge currently exposes this authenticator, one entry per strategy. */
export interface ConciergeStrategy {
  /** The strategy: ImpersonationProxy or TokenCredentialRequestAPI. */
  type: StrategyType;
  /** Success (usable now), Error (should work but does not; see message) or NotAvailable (not offered here). */
  status: StrategyStatus;
  /** A machine-readable reason for the status, for example Listening, Pending or Disabled. */
  reason: StrategyReason;
  /** What happened and, when something is wrong, what to do about it. */
  message: string;
  /**
   * When this entry last changed.
   * @format date-time
   */
  lastUpdateTime: string;
  /** Set only when type is ImpersonationProxy and status is Success: how to reach the impersonation proxy. */
  impersonationProxyConfig?: EndpointConfig;
  /** Set only when type is TokenCredentialRequestAPI and status is Success: how to reach that API. */
  tokenCredentialRequestConfig?: EndpointConfig;
}

/** Observed state, written by the concierge only. */
export interface AuthenticatorStatus {
  /** Pending until validated, then Ready or Error. */
  phase?: AuthenticatorPhase;
  /**
   * Detailed checks; Ready is True only when all others are.
   * @listType map
   * @listMapKeys type
   */
  conditions?: Condition[];
  /**
   * How clients reach the concierge, mirrored onto every authenticator so that `kubectl get` shows it.
   * @listType map
   * @listMapKeys type
   */
  conciergeStrategies?: ConciergeStrategy[];
}

/** Authenticates users by OIDC ID tokens (JWTs) from one issuer. */
export interface JWTAuthenticator {
  apiVersion: string;
  kind: 'JWTAuthenticator';
  metadata: ObjectMeta;
  spec: JWTAuthenticatorSpec;
  status?: AuthenticatorStatus;
}

/** Authenticates users by bearer tokens that a TokenReview webhook accepts. */
export interface WebhookAuthenticator {
  apiVersion: string;
  kind: 'WebhookAuthenticator';
  metadata: ObjectMeta;
  spec: WebhookAuthenticatorSpec;
  status?: AuthenticatorStatus;
}

/** Condition types of a JWTAuthenticator. */
export const JWTConditionType = {
  Ready: 'Ready',
  IssuerURLValid: 'IssuerURLValid',
  DiscoveryURLValid: 'DiscoveryURLValid',
  JWKSURLValid: 'JWKSURLValid',
  JWKSFetchValid: 'JWKSFetchValid',
  AuthenticatorValid: 'AuthenticatorValid',
  TLSConfigurationValid: 'TLSConfigurationValid',
} as const;

/** Condition types of a WebhookAuthenticator. */
export const WebhookConditionType = {
  Ready: 'Ready',
  EndpointURLValid: 'EndpointURLValid',
  WebhookConnectionValid: 'WebhookConnectionValid',
  AuthenticatorValid: 'AuthenticatorValid',
  TLSConfigurationValid: 'TLSConfigurationValid',
} as const;

/** Reasons used in authenticator conditions. */
export const ConditionReason = {
  Success: 'Success',
  NotReady: 'NotReady',
  UnableToValidate: 'UnableToValidate',
  InvalidIssuerURL: 'InvalidIssuerURL',
  InvalidIssuerURLScheme: 'InvalidIssuerURLScheme',
  InvalidDiscoveryProbe: 'InvalidDiscoveryProbe',
  InvalidProviderJWKSURL: 'InvalidProviderJWKSURL',
  InvalidCouldNotFetchJWKS: 'InvalidCouldNotFetchJWKS',
  InvalidEndpointURL: 'InvalidEndpointURL',
  UnableToDialServer: 'UnableToDialServer',
  InvalidTLSConfiguration: 'InvalidTLSConfiguration',
  InvalidAuthenticator: 'InvalidAuthenticator',
} as const;
