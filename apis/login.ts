// login.concierge.<suffix>/v1alpha1: TokenCredentialRequest, served by the impersonation proxy itself.
// Wire format as Pinniped's: an anonymous create answered with HTTP 201 either way.
import type { ObjectMeta, TypedLocalObjectReference } from './meta.ts';

export interface TokenCredentialRequestSpec {
  /** The user's token (an OIDC ID token or a webhook token). Required. */
  token: string;
  /** The JWTAuthenticator or WebhookAuthenticator to validate it with. */
  authenticator: TypedLocalObjectReference;
}

/** A short-lived client credential. */
export interface ClusterCredential {
  /** When the credential expires (RFC 3339). */
  expirationTimestamp: string;
  /** PEM client certificate (CN = username, O = groups), signed by the proxy's signer CA. */
  clientCertificateData: string;
  /** PEM private key of the client certificate. */
  clientKeyData: string;
  /** Unused; present for Pinniped compatibility. */
  token?: string;
}

export interface TokenCredentialRequestStatus {
  credential?: ClusterCredential;
  /** Set instead of credential when the token was not accepted: always "authentication failed". */
  message?: string;
}

export interface TokenCredentialRequest {
  apiVersion: string;
  kind: 'TokenCredentialRequest';
  metadata?: ObjectMeta;
  spec: TokenCredentialRequestSpec;
  status?: TokenCredentialRequestStatus;
}

/** The one message every failed TokenCredentialRequest carries, whatever the reason (which goes to the log). */
export const AUTHENTICATION_FAILED = 'authentication failed';
/** Lifetime of an issued client certificate. */
export const CREDENTIAL_LIFETIME_MS = 5 * 60 * 1000;
