// Client certificates for TokenCredentialRequest: ECDSA keys and signatures from native crypto, signed by the
// proxy's current signer CA, which the proxy itself trusts for client authentication. The key is the client's own
// when it sent a CSR, else one made here and handed back with the certificate.
import { AUTHENTICATOR_URI_PREFIX } from '../../apis/install.ts';
import { REASON_EXTENSION_OID } from '../../apis/login.ts';
import type { webcrypto } from 'node:crypto';
import type { AuthenticatorBinding } from '../../lib/authn/cache.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { issueCert, type CertificateAuthority } from '../../lib/pki/pki.ts';

export interface IssuedCredential {
  certPem: string;
  /** Empty when the certificate is for the caller's public key. */
  keyPem: string;
  notAfter: Date;
}

/** What a certificate is issued with besides its user. */
export interface IssueOptions {
  lifetimeMs: number;
  /** The client's own key (from its CSR); a signer that cannot use it makes a key and hands it back instead. */
  publicKey?: webcrypto.CryptoKey;
  /** The authenticator the token was checked with, and what its spec trusted then, which the certificate is bound to. */
  binding?: AuthenticatorBinding;
  /** The authenticator opted in to `system:` names (spec.allowSystemNames). */
  allowSystemNames?: boolean;
  /**
   * The caller's reason (checked by reasonProblem), written into the certificate (REASON_EXTENSION_OID). A signer
   * that cannot write extensions (the cluster's) leaves it out; the client sees that in the certificate.
   */
  reason?: string;
}

export interface ClientCertSigner {
  /**
   * Undefined when no signer is ready (TokenCredentialRequest then fails closed); rejects when this user's certificate
   * is refused.
   */
  issue(user: UserInfo, opts: IssueOptions): Promise<IssuedCredential | undefined>;
}

export function newClientCertSigner(currentCA: () => CertificateAuthority | undefined): ClientCertSigner {
  return {
    async issue(user, { lifetimeMs, publicKey, binding, reason }) {
      const ca = currentCA();
      if (!ca) return undefined;
      const issued = await issueCert(ca, {
        commonName: user.username,
        organizations: user.groups,
        usage: 'client',
        validityMs: lifetimeMs,
        ...(publicKey ? { publicKey } : {}),
        ...(binding ? { uris: [authenticatorBindingURI(binding)] } : {}),
        ...(reason !== undefined ? { texts: { [REASON_EXTENSION_OID]: reason } } : {}),
      });
      return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.cert.notAfter };
    },
  };
}

/**
 * The URI SAN that binds a certificate to the authenticator whose word it was issued on,
 * urn:sealion:authenticator:<uid>:<trust>: the proxy honours the certificate only while that very object (by uid) is
 * loaded with a spec that trusts what it trusted then (the digest, lib/authn/trust.ts), so deleting an authenticator,
 * breaking it, or changing whom it trusts ends the certificates it vouched for at once instead of when they expire.
 * The uid is percent-encoded and the digest is base64url, so neither holds a ':' and the URI splits back into exactly
 * those two parts.
 */
const TRUST_DIGEST = /^[A-Za-z0-9_-]{43}$/;

export function authenticatorBindingURI(binding: AuthenticatorBinding): string {
  if (!TRUST_DIGEST.test(binding.trust)) throw new Error('an authenticator binding needs a SHA-256 digest');
  return `${AUTHENTICATOR_URI_PREFIX}${encodeURIComponent(binding.uid)}:${binding.trust}`;
}

/**
 * The binding a URI SAN names, or undefined when it is not exactly one of ours. A certificate from before bindings
 * named the digest (`urn:sealion:authenticator:<uid>`) names none: it is bound to nothing that can hold.
 */
export function parseAuthenticatorBinding(uri: string): AuthenticatorBinding | undefined {
  if (!uri.startsWith(AUTHENTICATOR_URI_PREFIX)) return undefined;
  const parts = uri.slice(AUTHENTICATOR_URI_PREFIX.length).split(':');
  if (parts.length !== 2) return undefined;
  const [encoded, trust] = parts as [string, string];
  if (!TRUST_DIGEST.test(trust)) return undefined;
  try {
    const uid = decodeURIComponent(encoded);
    return uid === '' ? undefined : { uid, trust };
  } catch {
    return undefined;
  }
}
