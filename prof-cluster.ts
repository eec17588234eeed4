import { startCluster } from './integration/harness/cluster.ts';
const cluster = await startCluster({ name: 'prof', controllerManager: false, apiserverArgs: ['--profiling=true'], log: () => {} });
console.log(cluster.dir, cluster.url);
process.on('SIGINT', () => void cluster.stop().then(() => process.exit(0)));
