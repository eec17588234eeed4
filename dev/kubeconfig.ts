// The kubeconfigs the development clusters hand out: one context, every credential embedded.
import { stringify } from 'yaml';

/** Credentials of a kubeconfig user: a client certificate, a bearer token, or both. */
export interface KubeconfigUser {
  name: string;
  certPem?: string;
  keyPem?: string;
  token?: string;
}

/** A one-context kubeconfig with embedded data, as kubectl and client-node read it. */
export function kubeconfigYaml(name: string, url: string, caPem: string, user: KubeconfigUser): string {
  const b64 = (s: string): string => Buffer.from(s).toString('base64');
  return stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name, cluster: { server: url, 'certificate-authority-data': b64(caPem) } }],
    users: [
      {
        name: user.name,
        user: {
          ...(user.token ? { token: user.token } : {}),
          ...(user.certPem
            ? { 'client-certificate-data': b64(user.certPem), 'client-key-data': b64(user.keyPem ?? '') }
            : {}),
        },
      },
    ],
    contexts: [{ name, context: { cluster: name, user: user.name } }],
    'current-context': name,
  });
}
