// Runs a concierge with its tunnel listener in its own process for the tunnel benchmark. Arguments: the harness
// cluster's folder, its URL, the kubectl binary, the concierge namespace, the tunnel listener's port (default:
// any) and the replica's name (default: local). Prints one JSON line {url, servingCA, tunnelPort, tunnelCA} when ready;
// answers "mem" on stdin with process.memoryUsage() after a GC, and "profile <file>" ... "profile-end" with a CPU
// profile of what happened in between, written to <file> (each answered with one line).
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { createInterface } from 'node:readline';
import { clusterInDir, startLocalConcierge } from '../dev/concierge.ts';

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
const inspector = new Session();
let profileFile: string | undefined;
createInterface({ input: process.stdin }).on('line', (line) => {
  void (async () => {
    if (line === 'mem') {
      globalThis.gc?.();
      console.log(JSON.stringify(process.memoryUsage()));
    } else if (line.startsWith('profile ')) {
      profileFile = line.slice('profile '.length);
      inspector.connect();
      await inspector.post('Profiler.enable');
      await inspector.post('Profiler.start');
      console.log('{}');
    } else if (line === 'profile-end' && profileFile) {
      const { profile } = await inspector.post('Profiler.stop');
      writeFileSync(profileFile, JSON.stringify(profile));
      inspector.disconnect();
      console.log('{}');
    }
  })();
});
process.once('SIGTERM', () => process.exit(0));
