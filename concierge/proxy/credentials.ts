// Client certificates for TokenCredentialRequest: ECDSA keys and signatures from native crypto, signed by the
// proxy's current signer CA, which the proxy itself trusts for client authentication. The key is the client's own
// when it sent a CSR, else one made here and handed back with the certificate.
import type { webcrypto } from 'node:crypto';
import type { UserInfo } from '../../lib/authn/types.ts';
import { issueCert, type CertificateAuthority } from '../../lib/pki.ts';

export interface IssuedCredential {
  certPem: string;
  /** Empty when the certificate is for the caller's public key. */
  keyPem: string;
  notAfter: Date;
}

export interface ClientCertSigner {
  /** Undefined when no signer CA is loaded yet (TokenCredentialRequest then fails closed). */
  /** `authenticatorUid`: the authenticator the token was checked with, which the certificate is bound to. */
  issue(
    user: UserInfo,
    lifetimeMs: number,
    publicKey?: webcrypto.CryptoKey,
    authenticatorUid?: string,
  ): Promise<IssuedCredential | undefined>;
}

export function newClientCertSigner(currentCA: () => CertificateAuthority | undefined): ClientCertSigner {
  return {
    async issue(user, lifetimeMs, publicKey, authenticatorUid) {
      const ca = currentCA();
      if (!ca) return undefined;
      const issued = await issueCert(ca, {
        commonName: user.username,
        organizations: user.groups,
        usage: 'client',
        validityMs: lifetimeMs,
        ...(publicKey ? { publicKey } : {}),
        ...(authenticatorUid ? { uris: [authenticatorBinding(authenticatorUid)] } : {}),
      });
      return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.cert.notAfter };
    },
  };
}

/**
 * The URI SAN that binds a certificate to the authenticator whose word it was issued on: the proxy honours the
 * certificate only while that very object (by uid) is loaded, so deleting an authenticator, or breaking it, ends the
 * certificates it vouched for at once instead of when they expire.
 */
export const AUTHENTICATOR_URI_PREFIX = 'urn:sealion:authenticator:';
export const authenticatorBinding = (uid: string): string =>
  `${AUTHENTICATOR_URI_PREFIX}${encodeURIComponent(uid)}`;
