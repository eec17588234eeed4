// The informers every controller reads from, against a real API server: an informer is synced once a list has
// succeeded, never on a refused one, so controllers never start on an empty cache that only looks complete.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { newCoreInformer, newKubeClients } from '../lib/kube/kube.ts';
import { newLogger } from '../lib/log.ts';

let cluster: Cluster;

beforeAll(async () => {
  cluster = await startCluster({ name: 'informer', controllerManager: false });
}, 120_000);

afterAll(async () => {
  await cluster?.stop();
});

describe('an informer', () => {
  it('is not synced while its lists are refused, and is once one succeeds', async () => {
    await cluster.kubectl(['create', 'configmap', 'present', '-n', 'default', '--from-literal=a=b']);
    // A user with no rights yet: its lists are answered 403, as a controller's are before its RBAC lands.
    const clients = newKubeClients({ path: await cluster.userKubeconfig('watcher') });
    const lines: string[] = [];
    const log = newLogger({ destination: { write: (line: string) => void lines.push(line) } });
    const informer = newCoreInformer<{ metadata: { name: string } }>(clients, 'configmaps', 'default', log);
    try {
      let synced = false;
      void informer.synced().then(() => (synced = true));
      await eventually(() => expect(lines.some((line) => line.includes('watch failed'))).toBe(true), 30_000);
      expect(synced).toBe(false);
      await cluster.kubectl([
        'create',
        'role',
        'cm-reader',
        '--verb=list,watch',
        '--resource=configmaps',
        '-n',
        'default',
      ]);
      await cluster.kubectl([
        'create',
        'rolebinding',
        'cm-reader',
        '--role=cm-reader',
        '--user=watcher',
        '-n',
        'default',
      ]);
      await eventually(() => expect(synced).toBe(true), 60_000);
      expect(informer.list().map((o) => o.metadata.name)).toContain('present');
    } finally {
      await informer.stop();
    }
  }, 120_000);
});
