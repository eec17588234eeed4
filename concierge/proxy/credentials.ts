// Client certificates for TokenCredentialRequest: ECDSA keys and signatures from native crypto, signed by the
// proxy's current signer CA, which the proxy itself trusts for client authentication.
import type { UserInfo } from '../../lib/authn/types.ts';
import { issueCert, type CertificateAuthority } from '../../lib/pki.ts';

export interface IssuedCredential {
  certPem: string;
  keyPem: string;
  notAfter: Date;
}

export interface ClientCertSigner {
  /** Undefined when no signer CA is loaded yet (TokenCredentialRequest then fails closed). */
  issue(user: UserInfo, lifetimeMs: number): Promise<IssuedCredential | undefined>;
}

export function newClientCertSigner(currentCA: () => CertificateAuthority | undefined): ClientCertSigner {
  return {
    async issue(user, lifetimeMs) {
      const ca = currentCA();
      if (!ca) return undefined;
      const issued = await issueCert(ca, {
        commonName: user.username,
        organizations: user.groups,
        usage: 'client',
        validityMs: lifetimeMs,
      });
      return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.cert.notAfter };
    },
  };
}
