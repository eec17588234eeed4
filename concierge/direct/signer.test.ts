import { describe, expect, it } from '@jest/globals';
import type { ClusterCertificateIssuer } from '../../lib/kube/cluster-certificates.ts';
import type { RequestHeaderConfig } from '../../lib/kube/request-header.ts';
import { issueCert, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { newClusterCertSigner } from './signer.ts';

/** An issuer that signs with `ca`, as a cluster's controller-manager would, and remembers what it was asked. */
function issuerWith(
  ca: CertificateAuthority,
  asked: { username: string; groups: string[]; seconds: number }[],
) {
  return {
    issue: async (identity: { username: string; groups: string[] }, seconds: number) => {
      asked.push({ ...identity, seconds });
      const issued = await issueCert(ca, {
        commonName: identity.username,
        organizations: identity.groups,
        usage: 'client',
        validityMs: seconds * 1000,
      });
      return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.cert.notAfter };
    },
    approveOwn: () => Promise.resolve(),
  } satisfies ClusterCertificateIssuer;
}

const settings = (caPem: string): RequestHeaderConfig => ({
  caPem,
  allowedNames: ['front-proxy-client'],
  usernameHeaders: ['x-remote-user'],
  uidHeaders: [],
  groupHeaders: ['x-remote-group'],
  extraHeaderPrefixes: ['x-remote-extra-'],
});

describe('certificates the cluster signs', () => {
  it('live at least the signer’s minimum, without system:authenticated', async () => {
    const [clusterCA, frontProxyCA] = [await newCA('cluster'), await newCA('front-proxy')];
    const asked: { username: string; groups: string[]; seconds: number }[] = [];
    const signer = newClusterCertSigner(
      () => issuerWith(clusterCA, asked),
      () => settings(frontProxyCA.certPem),
    );
    const issued = await signer.issue(
      { username: 'dana', groups: ['demo', 'system:authenticated'], extra: {} },
      { lifetimeMs: 300_000 },
    );
    expect(issued?.keyPem).toContain('PRIVATE KEY');
    expect(asked).toEqual([{ username: 'dana', groups: ['demo'], seconds: 600 }]);
  });

  it('are never for a name the API server allows its front proxy, nor signed by its CA', async () => {
    const [clusterCA, frontProxyCA] = [await newCA('cluster'), await newCA('front-proxy')];
    const asked: { username: string; groups: string[]; seconds: number }[] = [];
    const user = { username: 'front-proxy-client', groups: [], extra: {} };
    const separate = newClusterCertSigner(
      () => issuerWith(clusterCA, asked),
      () => settings(frontProxyCA.certPem),
    );
    await expect(separate.issue(user, { lifetimeMs: 600_000 })).rejects.toThrow(/allows its front proxy/);
    expect(asked).toEqual([]);
    // A cluster that signs client certificates with the front proxy's CA: nothing it signs is handed out.
    const shared = newClusterCertSigner(
      () => issuerWith(clusterCA, asked),
      () => settings(clusterCA.certPem),
    );
    await expect(
      shared.issue({ username: 'dana', groups: [], extra: {} }, { lifetimeMs: 600_000 }),
    ).rejects.toThrow(/front proxy's CA/);
  });

  it('are not issued before the front proxy’s settings are known', async () => {
    const clusterCA = await newCA('cluster');
    const signer = newClusterCertSigner(
      () => issuerWith(clusterCA, []),
      () => undefined,
    );
    expect(
      await signer.issue({ username: 'dana', groups: [], extra: {} }, { lifetimeMs: 600_000 }),
    ).toBeUndefined();
  });
});
