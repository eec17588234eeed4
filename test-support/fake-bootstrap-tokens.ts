// Bootstrap tokens without an API server, for tests: made by createBootstrapToken itself, kept in a store that
// counts what it is asked.
import {
  createBootstrapToken,
  type BootstrapSecret,
  type BootstrapTokenStore,
} from '../lib/kube/bootstrap.ts';
import type { KubeClients } from '../lib/kube/kube.ts';

/**
 * A token made by createBootstrapToken, and its Secret as a watch would deliver it (stringData turned into data, a
 * uid and a resourceVersion added).
 */
export async function fakeBootstrapToken(
  cluster: string,
  created = new Date(),
): Promise<{ token: string; secret: BootstrapSecret }> {
  let secret: BootstrapSecret | undefined;
  const clients = {
    core: {
      createNamespacedSecret: ({
        body,
      }: {
        body: BootstrapSecret & { stringData: Record<string, string> };
      }): Promise<object> => {
        const { stringData, ...rest } = body;
        secret = {
          ...rest,
          metadata: { ...rest.metadata, uid: `uid-${rest.metadata!.name!}`, resourceVersion: '7' },
          data: Object.fromEntries(
            Object.entries(stringData).map(([k, v]) => [k, Buffer.from(v).toString('base64')]),
          ),
        };
        return Promise.resolve(secret);
      },
    },
  } as unknown as KubeClients;
  const { token } = await createBootstrapToken(clients, 'sealion', cluster, created);
  return { token, secret: secret! };
}

/** A store over `secrets` that counts what it is asked; burning removes the Secret, as the API server's delete does. */
export function memoryTokenStore(secrets: BootstrapSecret[] = []): BootstrapTokenStore & {
  gets: number;
  burns: string[];
  put(secret: BootstrapSecret): void;
} {
  const byName = new Map(secrets.map((s) => [s.metadata!.name!, s]));
  const store = {
    gets: 0,
    burns: [] as string[],
    put(secret: BootstrapSecret) {
      byName.set(secret.metadata!.name!, secret);
    },
    get(name: string) {
      store.gets++;
      return byName.get(name);
    },
    burn(name: string, uid: string, resourceVersion: string) {
      store.burns.push(name);
      const current = byName.get(name);
      const matches = current?.metadata?.uid === uid && current.metadata.resourceVersion === resourceVersion;
      if (matches) byName.delete(name);
      return Promise.resolve(matches);
    },
  };
  return store;
}
