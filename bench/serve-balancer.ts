// The failover benchmark's load balancer in a process of its own (dev/tcp-balancer.ts), so that the benchmark's own
// work (its probes) does not slow the connections it carries. Arguments: the local ports to balance over. Prints
// its port when ready; exits when its input closes.
import { createInterface } from 'node:readline';
import { startTcpBalancer } from '../dev/tcp-balancer.ts';

const ports = process.argv.slice(2).map(Number);
const balancer = await startTcpBalancer(() => ports);
console.log(balancer.port);
createInterface({ input: process.stdin }).once('close', () => process.exit(0));
process.once('SIGTERM', () => process.exit(0));
