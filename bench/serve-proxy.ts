// Runs a concierge in its own process for the proxy benchmark, so the load generator does not share its event
// loop. Arguments: the harness cluster's folder, its URL, the kubectl binary. Prints one JSON line
// {url, servingCA} when ready; answers "mem" on stdin with process.memoryUsage() after a GC, and
// "profile <file>" ... "profile-end" with a CPU profile of what happened in between, written to <file>.
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { newLogger } from '../lib/log.ts';
import { clusterInDir, startLocalConcierge } from '../dev/concierge.ts';

const [dir, url, kubectl] = process.argv.slice(2) as [string, string, string];
// Forwarding with a service-account token and logging a line per request (to a file here, stdout being taken),
// as a concierge in a cluster does.
const proxy = await startLocalConcierge(await clusterInDir(dir, url, kubectl), {
  log: newLogger({ buffered: true, file: join(dir, 'concierge.log') }),
});
console.log(JSON.stringify({ url: proxy.url, servingCA: proxy.servingCA.certPem }));
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
// A clean exit on SIGTERM, so --cpu-prof gets to write its profile.
process.once('SIGTERM', () => process.exit(0));
