// The agent's identity in a Secret of its own cluster: written on registration and renewal, read at start, so a
// restarted agent reconnects without a new bootstrap token.
import { apiStatusCode, readSecretData, type KubeClients } from '../lib/kube/kube.ts';
import type { AgentCredentials, CredentialStore } from './agent.ts';

export function newSecretCredentialStore(
  clients: KubeClients,
  namespace: string,
  name: string,
): CredentialStore {
  return {
    async load() {
      const data = await readSecretData(clients, namespace, name);
      const [certPem, keyPem, caPem] = [data?.['tls.crt'], data?.['tls.key'], data?.['ca.crt']];
      return certPem && keyPem && caPem ? { certPem, keyPem, caPem } : undefined;
    },
    async save(credentials: AgentCredentials) {
      const body = {
        metadata: { name, namespace, labels: { 'app.kubernetes.io/part-of': 'sealion' } },
        type: 'kubernetes.io/tls',
        stringData: {
          'tls.crt': credentials.certPem,
          'tls.key': credentials.keyPem,
          'ca.crt': credentials.caPem,
        },
      };
      try {
        await clients.core.replaceNamespacedSecret({ name, namespace, body });
      } catch (err) {
        if (apiStatusCode(err) !== 404) throw err;
        await clients.core.createNamespacedSecret({ namespace, body });
      }
    },
  };
}
