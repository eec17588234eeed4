// login.concierge.<suffix>/v1alpha1: TokenCredentialRequest, served by the impersonation proxy itself.
// Wire format as Pinniped's: an anonymous create answered with HTTP 201 either way.
import type { ObjectMeta, TypedLocalObjectReference } from './meta.ts';

export interface TokenCredentialRequestSpec {
  /** The user's token (an OIDC ID token or a webhook token). Required. */
  token: string;
  /** The JWTAuthenticator or WebhookAuthenticator to validate it with. */
  authenticator: TypedLocalObjectReference;
  /**
   * A PEM certificate signing request (PKCS #10, ECDSA P-256) for a key the client made and keeps. Its signature
   * proves the client holds the key; the certificate is issued for that key, and no private key crosses the wire.
   * Only the key is taken from it: the subject comes from the token. Sealion's own; Pinniped's clients leave it out
   * and get a key made for them.
   */
  certificateSigningRequest?: string;
  /**
   * Why the user works now (`sealion login --reason`), written into the certificate (REASON_EXTENSION_OID) so that
   * every request made with it carries the reason on (apis/access.ts reasonProblem says what may be one). Sealion's
   * own; a certificate the cluster signs (the direct path, through its CSR API) cannot carry it.
   */
  reason?: string;
}

/** A short-lived client credential. */
export interface ClusterCredential {
  /** When the credential expires (RFC 3339). */
  expirationTimestamp: string;
  /** PEM client certificate (CN = username, O = groups), signed by the proxy's signer CA. */
  clientCertificateData: string;
  /** PEM private key of the client certificate; empty when the request carried a CSR (the client has the key). */
  clientKeyData?: string;
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
/** Lifetime of an issued client certificate unless the authenticator's spec.credentialLifetimeSeconds says. */
export const DEFAULT_CREDENTIAL_LIFETIME_SECONDS = 5 * 60;
/** The bounds of spec.credentialLifetimeSeconds (the CRD checks them too). */
export const CREDENTIAL_LIFETIME_BOUNDS = { min: 120, max: 24 * 3600 } as const;
/** A P-256 CSR is about 500 bytes as PEM; this bounds what the parser is given. */
export const MAX_CSR_BYTES = 4 * 1024;

/**
 * The certificate extension that carries a TokenCredentialRequest's spec.reason: non-critical (a verifier that does not
 * know it, the API server's, ignores it), its value a DER UTF8String. An OID of our own, made from a UUID generated
 * once (4ef27a28-5162-4ab9-8b32-23bebf0d4b66) under the arc Microsoft publishes for OIDs made from GUIDs without
 * registration (1.2.840.113556.1.8000.2554, the GUID's hex cut into 4,4,4,4,4,6,6 digits), so it collides with nobody's.
 * Not 2.25.<the UUID as one integer> (X.667): Go's X.509 parser takes no arc past 2^63 and refuses the whole
 * certificate ("x509: malformed extension OID field"), so kubectl could not use one that carried it.
 */
export const REASON_EXTENSION_OID = '1.2.840.113556.1.8000.2554.20210.31272.20834.19129.35634.2342591.871270';
