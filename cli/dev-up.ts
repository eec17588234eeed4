// `sealion dev up` (`npm start`): brings up the local setup and keeps it running until Ctrl-C.
import { startCluster, type Cluster } from '../integration/harness/cluster.ts';

export async function devUp(): Promise<void> {
  const log = (line: string): void => console.error(`[dev] ${line}`);
  const started = Date.now();
  const clusters: Cluster[] = [];
  let stopping = false;
  const shutdown = (): void => {
    if (stopping) return;
    stopping = true;
    log('stopping');
    Promise.all(clusters.map((c) => c.stop())).then(
      () => process.exit(0),
      (err: unknown) => {
        console.error(err);
        process.exit(1);
      },
    );
  };
  process.on('SIGINT', shutdown);
  process.on('SIGTERM', shutdown);

  clusters.push(await startCluster({ name: 'sealion-dev', log }));
  const hub = clusters[0]!;
  console.log(`
Local cluster ready in ${((Date.now() - started) / 1000).toFixed(1)}s: ${hub.url}

Try it (admin access):
  kubectl --kubeconfig ${hub.kubeconfigPath} get namespaces

Not built yet: the concierge, the demo user and the agent-backed second cluster.
Press Ctrl-C to stop; everything started here is removed.`);
}
