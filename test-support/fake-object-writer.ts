// An ObjectWriter over an in-memory informer that keeps the API server's rules a caller relies on: each write gives
// the object a new resourceVersion, and a server-side apply that names a resourceVersion is refused with a conflict
// when the stored object has another one or none (it never creates the object then); a delete that names one, when
// the object has another.
import type { KubeObject, MemoryInformer } from '../lib/kube/informer.ts';
import type { ObjectWriter } from '../lib/kube/kube.ts';

export function fakeObjectWriter<T extends KubeObject>(objects: MemoryInformer<T>): ObjectWriter {
  let version = 0;
  return {
    // Decided a turn later, as a request answers after the caller went on: what the caller does meanwhile (a
    // delete) happens first.
    async apply(obj) {
      await Promise.resolve();
      const wanted = (obj.metadata as { resourceVersion?: string }).resourceVersion;
      const held = objects.get(obj.metadata.name, obj.metadata.namespace);
      if (wanted !== undefined && held?.metadata?.resourceVersion !== wanted)
        throw new Error('Conflict: the object has been modified or is gone');
      objects.put({
        ...obj,
        metadata: { ...obj.metadata, resourceVersion: String(++version) },
      } as unknown as T);
    },
    create: () => Promise.resolve(true),
    async delete(_kind, namespace, name, resourceVersion) {
      await Promise.resolve();
      const held = objects.get(name, namespace || undefined);
      if (held && resourceVersion !== undefined && held.metadata?.resourceVersion !== resourceVersion)
        throw new Error('Conflict: the object has been modified');
      objects.remove(name, namespace || undefined);
    },
  };
}
