// `npm run cluster`: starts one real cluster with a node, prints how to reach it, and takes it down on Ctrl-C.
import { startCluster } from './cluster.ts';
import { stopOnSignal } from './processes.ts';

const log = (line: string): void => console.error(`[cluster] ${line}`);
const started = Date.now();
const cluster = await startCluster({ name: 'dev', log, node: {} });
console.log(`cluster ready in ${((Date.now() - started) / 1000).toFixed(1)}s at ${cluster.url}`);
console.log(
  `  node ${cluster.node!.name}: its pods reach the API server as kubernetes.default, and Services by name`,
);
console.log(`export KUBECONFIG=${cluster.kubeconfigPath}`);
console.log(`kubectl --kubeconfig ${cluster.kubeconfigPath} get nodes`);
console.log('Press Ctrl-C to stop.');

stopOnSignal(() => cluster.stop(), log);
