// `npm run cluster`: starts one real cluster, prints how to reach it, and takes it down on Ctrl-C.
import { startCluster } from './cluster.ts';
import { stopOnSignal } from './processes.ts';

const log = (line: string): void => console.error(`[cluster] ${line}`);
const started = Date.now();
const cluster = await startCluster({ name: 'dev', log });
console.log(`cluster ready in ${((Date.now() - started) / 1000).toFixed(1)}s at ${cluster.url}`);
console.log(`export KUBECONFIG=${cluster.kubeconfigPath}`);
console.log(`kubectl --kubeconfig ${cluster.kubeconfigPath} get ns`);
console.log('Press Ctrl-C to stop.');

stopOnSignal(() => cluster.stop(), log);
