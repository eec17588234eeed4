import { describe, expect, it } from '@jest/globals';
// eslint-disable-next-line no-restricted-imports -- the test drives client-node's own request path
import { HttpMethod, RequestContext } from '@kubernetes/client-node';
import { loadKubeConfig } from './kube.ts';
import { issueCert, newCA } from '../pki/pki.ts';

/** A kubeconfig for one cluster with a client certificate. */
async function kubeconfig(): Promise<string> {
  const ca = await newCA('kube test CA');
  const user = await issueCert(ca, { commonName: 'someone', usage: 'client' });
  const b64 = (pem: string): string => Buffer.from(pem).toString('base64');
  return JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: 'c',
        cluster: { server: 'https://127.0.0.1:6443', 'certificate-authority-data': b64(ca.certPem) },
      },
    ],
    users: [
      {
        name: 'u',
        user: { 'client-certificate-data': b64(user.certPem), 'client-key-data': b64(user.keyPem) },
      },
    ],
    contexts: [{ name: 'x', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'x',
  });
}

/** The dispatcher (connection pool) client-node gives a request. */
async function dispatcherOf(config: ReturnType<typeof loadKubeConfig>): Promise<unknown> {
  const context = new RequestContext('https://127.0.0.1:6443/api', HttpMethod.GET);
  await config.applySecurityAuthentication(context);
  return context.getDispatcher();
}

describe('API clients', () => {
  it('send every call through one connection pool, not a new one per call', async () => {
    const config = loadKubeConfig({ yaml: await kubeconfig() });
    const first = await dispatcherOf(config);
    expect(first).toBeDefined();
    expect(await dispatcherOf(config)).toBe(first);
  });

  it('keep a pool per set of credentials', async () => {
    const [a, b] = [
      loadKubeConfig({ yaml: await kubeconfig() }),
      loadKubeConfig({ yaml: await kubeconfig() }),
    ];
    expect(await dispatcherOf(a)).not.toBe(await dispatcherOf(b));
  });
});
