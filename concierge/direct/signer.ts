// TokenCredentialRequest certificates for the direct path, signed by the cluster through the CSR API
// (lib/kube/cluster-certificates.ts). The cluster signs only a request made with the key it certifies, and the
// subject is the concierge's to decide, so a client's own key cannot be used: the key is made here and handed back
// with the certificate, as Pinniped's concierge does. The certificate cannot carry the authenticator binding the
// proxy's own certificates have (the API server would ignore it), nor live less than the signer's minimum.
import { ALLOWED_SYSTEM_GROUP } from '../../lib/authn/system-names.ts';
import {
  MIN_EXPIRATION_SECONDS,
  type ClusterCertificateIssuer,
} from '../../lib/kube/cluster-certificates.ts';
import type { ClientCertSigner } from '../proxy/credentials.ts';

export function newClusterCertSigner(issuer: () => ClusterCertificateIssuer | undefined): ClientCertSigner {
  return {
    async issue(user, { lifetimeMs, allowSystemNames }) {
      const current = issuer();
      if (!current) return undefined;
      // The API server adds system:authenticated to every user it authenticates; the certificate need not say it.
      const groups = user.groups.filter((g) => g !== ALLOWED_SYSTEM_GROUP);
      const issued = await current.issue(
        { username: user.username, groups },
        Math.max(MIN_EXPIRATION_SECONDS, Math.ceil(lifetimeMs / 1000)),
        { allowSystemNames: allowSystemNames === true },
      );
      return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.notAfter };
    },
  };
}
