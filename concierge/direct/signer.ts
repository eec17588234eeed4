// TokenCredentialRequest certificates for the direct path, signed by the cluster through the CSR API
// (lib/kube/cluster-certificates.ts). The cluster signs only a request made with the key it certifies, and the
// subject is the concierge's to decide, so a client's own key cannot be used: the key is made here and handed back
// with the certificate, as Pinniped's concierge does. The certificate cannot carry the authenticator binding the
// proxy's own certificates have (the API server would ignore it), nor the caller's reason (the CSR API drops every
// extension a request asks for; the plugin sees its absence and says so), nor live less than the signer's minimum.
import { ALLOWED_SYSTEM_GROUP } from '../../lib/authn/system-names.ts';
import {
  MIN_EXPIRATION_SECONDS,
  type ClusterCertificateIssuer,
} from '../../lib/kube/cluster-certificates.ts';
import type { RequestHeaderConfig } from '../../lib/kube/request-header.ts';
import { signedByAny } from '../../lib/pki/pem.ts';
import type { ClientCertSigner } from '../proxy/credentials.ts';

/**
 * `frontProxy`: the API server's request-header settings. A certificate the API server would also take as its front
 * proxy's (a name it allows, from the CA it trusts for that) could claim any identity in X-Remote-* headers: none is
 * asked for such a name, and none signed by that CA is handed out (the direct-login controller also keeps the path
 * off on such a cluster, from its probe).
 */
export function newClusterCertSigner(
  issuer: () => ClusterCertificateIssuer | undefined,
  frontProxy: () => RequestHeaderConfig | undefined,
): ClientCertSigner {
  return {
    async issue(user, { lifetimeMs, allowSystemNames }) {
      const current = issuer();
      const settings = frontProxy();
      if (!current || !settings) return undefined;
      if (settings.allowedNames.includes(user.username))
        throw new Error(`${user.username} is a name the API server allows its front proxy`);
      // The API server adds system:authenticated to every user it authenticates; the certificate need not say it.
      const groups = user.groups.filter((g) => g !== ALLOWED_SYSTEM_GROUP);
      const issued = await current.issue(
        { username: user.username, groups },
        Math.max(MIN_EXPIRATION_SECONDS, Math.ceil(lifetimeMs / 1000)),
        { allowSystemNames: allowSystemNames === true },
      );
      if (signedByAny(issued.certPem, settings.caPem))
        throw new Error("the cluster signed it with its front proxy's CA: not handed out");
      return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.notAfter };
    },
  };
}
