// API groups, versions and kinds. Every group ends in a suffix chosen at install time, so that
// `pinniped.dev` yields Pinniped's exact groups and two installations can live side by side.

/** The suffix used when none is configured. */
export const DEFAULT_GROUP_SUFFIX = 'sealion.dev';
/** The only version of every Sealion API so far. */
export const VERSION = 'v1alpha1';

export interface ApiGroups {
  /** JWTAuthenticator, WebhookAuthenticator. */
  authentication: string;
  /** CredentialIssuer. */
  config: string;
  /** TokenCredentialRequest (served by the impersonation proxy). */
  login: string;
  /** WhoAmIRequest (served by the impersonation proxy). */
  identity: string;
  /** Cluster (clusters reached through an agent). */
  tunnel: string;
  /** SessionRecording (recorded exec and attach sessions, served by the impersonation proxy). */
  recordings: string;
  /** The connect subresource of pods and services, a TCP stream to them (`sealion port-forward`). */
  reach: string;
  /** AccessRequest (groups on clusters for a while, approved on the hub). */
  access: string;
}

const DNS_SUBDOMAIN = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+$/;

/** A group suffix must be a DNS subdomain with at least two labels, like `sealion.dev`. */
/**
 * The longest suffix: the longest name built from it, a CRD's (webhookauthenticators.authentication.concierge.<suffix>),
 * must still be a DNS subdomain.
 */
export const MAX_GROUP_SUFFIX_LENGTH = 253 - 'webhookauthenticators.authentication.concierge.'.length;

export function isValidGroupSuffix(suffix: string): boolean {
  return DNS_SUBDOMAIN.test(suffix) && suffix.length <= MAX_GROUP_SUFFIX_LENGTH;
}

export function apiGroups(suffix: string = DEFAULT_GROUP_SUFFIX): ApiGroups {
  if (!isValidGroupSuffix(suffix)) {
    throw new Error(`api group suffix ${JSON.stringify(suffix)}: must be a DNS subdomain like sealion.dev`);
  }
  return {
    authentication: `authentication.concierge.${suffix}`,
    config: `config.concierge.${suffix}`,
    login: `login.concierge.${suffix}`,
    identity: `identity.concierge.${suffix}`,
    tunnel: `tunnel.concierge.${suffix}`,
    recordings: `recordings.concierge.${suffix}`,
    reach: `reach.concierge.${suffix}`,
    access: `access.concierge.${suffix}`,
  };
}

/** The suffix `groups` were made from (apiGroups' inverse). */
export const groupSuffixOf = (groups: ApiGroups): string => groups.login.slice('login.concierge.'.length);

export const Kind = {
  JWTAuthenticator: 'JWTAuthenticator',
  WebhookAuthenticator: 'WebhookAuthenticator',
  CredentialIssuer: 'CredentialIssuer',
  TokenCredentialRequest: 'TokenCredentialRequest',
  WhoAmIRequest: 'WhoAmIRequest',
  Cluster: 'Cluster',
  SessionRecording: 'SessionRecording',
  AccessRequest: 'AccessRequest',
} as const;
export type Kind = (typeof Kind)[keyof typeof Kind];

/** Plural resource names, as they appear in URLs and RBAC rules. */
export const Resource = {
  JWTAuthenticator: 'jwtauthenticators',
  WebhookAuthenticator: 'webhookauthenticators',
  CredentialIssuer: 'credentialissuers',
  TokenCredentialRequest: 'tokencredentialrequests',
  WhoAmIRequest: 'whoamirequests',
  Cluster: 'clusters',
  SessionRecording: 'sessionrecordings',
  AccessRequest: 'accessrequests',
} as const satisfies Record<Kind, string>;

/** `apiVersion` of a kind under a suffix, e.g. `authentication.concierge.sealion.dev/v1alpha1`. */
export function apiVersionOf(kind: Kind, suffix: string = DEFAULT_GROUP_SUFFIX): string {
  const groups = apiGroups(suffix);
  const group: Record<Kind, string> = {
    JWTAuthenticator: groups.authentication,
    WebhookAuthenticator: groups.authentication,
    CredentialIssuer: groups.config,
    TokenCredentialRequest: groups.login,
    WhoAmIRequest: groups.identity,
    Cluster: groups.tunnel,
    SessionRecording: groups.recordings,
    AccessRequest: groups.access,
  };
  return `${group[kind]}/${VERSION}`;
}
