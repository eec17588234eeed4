// The agent's identity in a Secret of its own cluster: written on registration and renewal, read at start, so a
// restarted agent reconnects without a new bootstrap token.
import { apiStatusCode, type KubeClients } from '../lib/kube.ts';
import type { AgentCredentials, CredentialStore } from './agent.ts';

export function newSecretCredentialStore(
  clients: KubeClients,
  namespace: string,
  name: string,
): CredentialStore {
  return {
    async load() {
      try {
        const secret = await clients.core.readNamespacedSecret({ name, namespace });
        const field = (k: string): string => Buffer.from(secret.data?.[k] ?? '', 'base64').toString('utf8');
        if (!field('tls.crt') || !field('tls.key') || !field('ca.crt')) return undefined;
        return { certPem: field('tls.crt'), keyPem: field('tls.key'), caPem: field('ca.crt') };
      } catch (err) {
        if (apiStatusCode(err) === 404) return undefined;
        throw err;
      }
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
