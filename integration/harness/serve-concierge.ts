// A concierge in a process of its own, for tests that must see it as users do: whether it crashes, and what it
// costs in memory. Arguments: the harness cluster's folder, its URL, the kubectl binary, and optionally a JSON
// object of options (`{"tunnel": {"port": 0, "namespace": "..."}}` runs the agents' tunnel listener; `identity`
// names the replica; `signer` is the CA of users' client certificates, so that replicas can share it; `audit`, a
// policy file and where its events go; `metrics` serves the metrics on a loopback port). Prints one
// JSON line
// (ConciergeProcessInfo) when ready; answers "mem" on stdin with process.memoryUsage() after a GC. Exits when its
// stdin closes, so it never outlives the test that started it.
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { loadPolicy } from '../../concierge/audit/policy.ts';
import type { RateLimitOptions } from '../../concierge/tunnel/rate-limit.ts';
import { silentLogger } from '../../lib/log.ts';
import { handleProcessErrors } from '../../lib/process-errors.ts';
import { loadCA } from '../../lib/pki/pki.ts';
import { clusterInDir, startLocalConcierge } from '../../dev/concierge.ts';
import { processErrorLine } from './process-errors.ts';

const [dir, url, kubectl, options] = process.argv.slice(2) as [string, string, string, string?];
const { tunnel, identity, signer, audit, metrics } = JSON.parse(options ?? '{}') as {
  tunnel?: { port: number; namespace: string; registrationLimits?: RateLimitOptions };
  identity?: string;
  signer?: { certPem: string; keyPem: string };
  audit?: { policyFile: string; logPath: string };
  metrics?: boolean;
};
// As production handles errors nothing handled (lib/process-errors.ts), and each reported to the test that started
// this process (process-errors.ts), which fails for it.
handleProcessErrors({
  log: silentLogger(),
  seen: (kind, err) => process.stderr.write(processErrorLine(kind, err)),
});
const proxy = await startLocalConcierge(await clusterInDir(dir, url, kubectl), {
  log: silentLogger(),
  ...(tunnel ? { tunnel } : {}),
  ...(identity ? { identity } : {}),
  ...(metrics ? { metrics } : {}),
  ...(signer ? { signerCA: await loadCA(signer.certPem, signer.keyPem) } : {}),
  ...(audit
    ? { audit: { policy: loadPolicy(readFileSync(audit.policyFile, 'utf8')), log: { path: audit.logPath } } }
    : {}),
});
console.log(
  JSON.stringify({
    url: proxy.url,
    servingCA: proxy.servingCA.certPem,
    signer: { certPem: proxy.signerCA.certPem, keyPem: proxy.signerCA.keyPem },
    ...(proxy.concierge.tunnel ? { tunnel: proxy.concierge.tunnel } : {}),
    ...(proxy.concierge.metricsPort === undefined ? {} : { metricsPort: proxy.concierge.metricsPort }),
  }),
);
createInterface({ input: process.stdin })
  .on('line', (line) => {
    if (line !== 'mem') return;
    // Twice: a collection frees dead Buffers' memory on a background thread, and may return before it is done (on a
    // busy machine tens of MiB of them were still counted); the second waits for it and finds little new to free.
    globalThis.gc?.();
    globalThis.gc?.();
    console.log(JSON.stringify(process.memoryUsage()));
  })
  .on('close', () => process.exit(0));
