// Runs a concierge in its own process for the proxy benchmark, so the load generator does not share its event
// loop. Arguments: the harness cluster's folder, its URL, the kubectl binary, and `audit` for one that audits every
// request at Metadata (the install's default policy) into a file, as a concierge in a cluster writes its audit
// events to its standard output. Prints one JSON line
// {url, servingCA} when ready; answers serve-commands.ts's commands on stdin.
import { join } from 'node:path';
import { newLogger } from '../lib/log.ts';
import { DEFAULT_AUDIT_POLICY_YAML } from '../apis/install.ts';
import { loadPolicy } from '../concierge/audit/policy.ts';
import { clusterInDir, startLocalConcierge } from '../dev/concierge.ts';
import { answerBenchCommands } from './serve-commands.ts';

const [dir, url, kubectl, mode] = process.argv.slice(2) as [string, string, string, string?];
const audited = mode === 'audit';
// Forwarding with a service-account token and logging a line per request (to a file here, stdout being taken),
// as a concierge in a cluster does.
const proxy = await startLocalConcierge(await clusterInDir(dir, url, kubectl), {
  log: newLogger({ buffered: true, file: join(dir, audited ? 'concierge-audited.log' : 'concierge.log') }),
  ...(audited
    ? {
        audit: {
          policy: loadPolicy(DEFAULT_AUDIT_POLICY_YAML),
          log: { path: join(dir, 'sealion-audit.log'), maxSizeMiB: 100, maxBackups: 1 },
        },
      }
    : {}),
});
console.log(JSON.stringify({ url: proxy.url, servingCA: proxy.servingCA.certPem }));
answerBenchCommands();
