// Runs a concierge with its tunnel listener in its own process for the tunnel benchmark. Arguments: the harness
// cluster's folder, its URL, the kubectl binary, the concierge namespace, the tunnel listener's port (default:
// any) and the replica's name (default: local). Prints one JSON line {url, servingCA, tunnelPort, tunnelCA} when ready;
// answers serve-commands.ts's commands on stdin.
import { clusterInDir, startLocalConcierge } from '../dev/concierge.ts';
import { answerBenchCommands } from './serve-commands.ts';

const [dir, url, kubectl, namespace, tunnelPort = '0', identity = 'local'] = process.argv.slice(2) as [
  string,
  string,
  string,
  string,
  string?,
  string?,
];
const proxy = await startLocalConcierge(
  await clusterInDir(dir, url, kubectl),
  // Forwarding with a service-account token, as a concierge in a cluster does.
  { tunnel: { port: Number(tunnelPort), namespace }, identity },
);
console.log(
  JSON.stringify({
    url: proxy.url,
    servingCA: proxy.servingCA.certPem,
    tunnelPort: proxy.concierge.tunnel!.port,
    tunnelCA: proxy.concierge.tunnel!.caPem,
  }),
);
answerBenchCommands();
