// A concierge in a process of its own, for tests that must see it as users do: whether it crashes, and what it
// costs in memory and event-loop time. Arguments: the harness cluster's folder, its URL, the kubectl binary, and
// optionally a JSON object of options (`{"tunnel": {"port": 0, "namespace": "..."}}` runs the agents' tunnel listener;
// `identity` names the replica; `signer` is the CA of users' client certificates, so that replicas can share it;
// `audit`, a policy file and where its events go; `metrics` serves the metrics on a loopback port; `controlled`, the
// controllers on as in an install: see below).
// Prints one JSON line (ConciergeProcess's info) when ready; answers "mem" on stdin with process.memoryUsage() after
// a GC, "loop" with the event loop's delays since the last "loop" (ms: p50, p99, max, mean; samples), "loop total" with
// them since the last "loop reset" (which answers {}). Exits when its
// stdin closes, so it never outlives the test that started it.
//
// `controlled: {config, ssh}`: the controllers manage the proxy, as installed (no fixed TLS files): the ConfigMap is
// written with `config` and the proxy enabled at this process's own port, the proxy's CA and signer are read from the
// Secrets the controllers make, and with `ssh` the SSH door listens on a port of its own choosing once the config turns
// it on (as installed, the door exists only with the controllers). Ready once the proxy serves with its CA's
// certificate and the door, if any, sends its identification.
import { readFileSync } from 'node:fs';
import { connect } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { createHistogram, performance, type RecordableHistogram } from 'node:perf_hooks';
import { createInterface } from 'node:readline';
import { stringify as toYAML } from 'yaml';
import { CONFIG_KEY, CONFIG_MAP_NAME } from '../../apis/install.ts';
import { loadPolicy } from '../../concierge/audit/policy.ts';
import type { RateLimitOptions } from '../../concierge/tunnel/rate-limit.ts';
import { CA_SECRET, SIGNER_SECRET } from '../../controllers/impersonation-proxy.ts';
import { newKubeClients, readSecretData } from '../../lib/kube/kube.ts';
import { silentLogger } from '../../lib/log.ts';
import { handleProcessErrors } from '../../lib/process-errors.ts';
import { loadCA } from '../../lib/pki/pki.ts';
import { eventually } from '../../dev/eventually.ts';
import {
  clusterInDir,
  startControlledConcierge,
  startLocalConcierge,
  type ClusterForConcierge,
} from '../../dev/concierge.ts';
import { processErrorLine } from './process-errors.ts';

const [dir, url, kubectl, options] = process.argv.slice(2) as [string, string, string, string?];
const { tunnel, identity, signer, audit, metrics, controlled } = JSON.parse(options ?? '{}') as {
  tunnel?: { port: number; namespace: string; registrationLimits?: RateLimitOptions };
  identity?: string;
  signer?: { certPem: string; keyPem: string };
  audit?: { policyFile: string; logPath: string };
  metrics?: boolean;
  controlled?: { config: Record<string, unknown>; ssh?: boolean };
};
// As production handles errors nothing handled (lib/process-errors.ts), and each reported to the test that started
// this process (process-errors.ts), which fails for it.
handleProcessErrors({
  log: silentLogger(),
  seen: (kind, err) => process.stderr.write(processErrorLine(kind, err)),
});
const cluster = await clusterInDir(dir, url, kubectl);

/** What the parent reads from the first line. */
interface Info {
  url: string;
  servingCA: string;
  signer: { certPem: string; keyPem: string };
  tunnel?: { port: number; caPem: string };
  metricsPort?: number;
  ssh?: { port: number };
}

async function startFixed(): Promise<Info> {
  const proxy = await startLocalConcierge(cluster, {
    log: silentLogger(),
    ...(tunnel ? { tunnel } : {}),
    ...(identity ? { identity } : {}),
    ...(metrics ? { metrics } : {}),
    ...(signer ? { signerCA: await loadCA(signer.certPem, signer.keyPem) } : {}),
    ...(audit
      ? {
          audit: { policy: loadPolicy(readFileSync(audit.policyFile, 'utf8')), log: { path: audit.logPath } },
        }
      : {}),
  });
  return {
    url: proxy.url,
    servingCA: proxy.servingCA.certPem,
    signer: { certPem: proxy.signerCA.certPem, keyPem: proxy.signerCA.keyPem },
    ...(proxy.concierge.tunnel ? { tunnel: proxy.concierge.tunnel } : {}),
    ...(proxy.concierge.metricsPort === undefined ? {} : { metricsPort: proxy.concierge.metricsPort }),
  };
}

/** Whether the proxy at `port` shows a certificate for 127.0.0.1 from `caPem` (not the placeholder it starts with). */
function servesWith(port: number, caPem: string): Promise<boolean> {
  return new Promise((done) => {
    const socket = tlsConnect({ host: '127.0.0.1', port, ca: caPem, ALPNProtocols: ['h2'] }, () => {
      socket.destroy();
      done(true);
    });
    socket.once('error', () => done(false));
  });
}

/** Resolves with the first line the SSH door sends (its identification), within 10 s. */
function sshIdentification(port: number): Promise<string> {
  return new Promise((done, fail) => {
    let text = '';
    const socket = connect({ host: '127.0.0.1', port, timeout: 10_000 });
    socket.once('timeout', () => socket.destroy(new Error('the ssh door sent nothing in 10 s')));
    socket.setEncoding('latin1');
    socket.on('data', (chunk: string) => {
      text += chunk;
      if (!text.includes('\n')) return;
      socket.destroy();
      done(text.slice(0, text.indexOf('\n')).trim());
    });
    socket.once('error', fail);
    socket.once('close', () => fail(new Error(`the ssh door closed after ${JSON.stringify(text)}`)));
  });
}

async function startControlled(c: ClusterForConcierge, opts: NonNullable<typeof controlled>): Promise<Info> {
  if (!tunnel) throw new Error('controlled: the harness needs the tunnel option (its namespace)');
  if (signer || audit || metrics)
    throw new Error('controlled: signer, audit and metrics are for fixed TLS files');
  const namespace = tunnel.namespace;
  const started = await startControlledConcierge(c, {
    namespace,
    configMap: CONFIG_MAP_NAME,
    identity: identity ?? 'local',
    log: silentLogger(),
    tunnelPort: tunnel.port,
    ...(tunnel.registrationLimits ? { registrationLimits: tunnel.registrationLimits } : {}),
    ...(opts.ssh ? { ssh: { host: '127.0.0.1', port: 0 } } : {}),
  });
  const proxyConfig = (opts.config['impersonationProxy'] ?? {}) as Record<string, unknown>;
  const config = {
    ...opts.config,
    impersonationProxy: { ...proxyConfig, mode: 'enabled', endpoint: `127.0.0.1:${started.port}` },
  };
  const applied = await c.kubectl(['apply', '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'v1',
      kind: 'ConfigMap',
      metadata: { name: CONFIG_MAP_NAME, namespace },
      data: { [CONFIG_KEY]: toYAML(config) },
    }),
  });
  if (applied.code !== 0) throw new Error(`applying the concierge's ConfigMap: ${applied.stderr}`);
  const clients = newKubeClients({ path: c.kubeconfigPath });
  const [ca, signing] = await eventually(async () => {
    const found = await Promise.all(
      [CA_SECRET, SIGNER_SECRET].map((s) => readSecretData(clients, namespace, s)),
    );
    if (!found[0]?.['tls.crt'] || !found[1]?.['tls.key'])
      throw new Error("the proxy's CA and signer are not made yet");
    return found as [Record<string, string>, Record<string, string>];
  }, 60_000);
  const servingCA = ca['tls.crt']!;
  await eventually(async () => {
    if (!(await servesWith(started.port, servingCA)))
      throw new Error('the proxy does not serve its certificate yet');
  }, 60_000);
  let sshPort: number | undefined;
  if (opts.ssh) {
    sshPort = await eventually(() => {
      const port = started.concierge.sshPort?.();
      if (port === undefined) throw new Error('the ssh door does not listen yet');
      return port;
    }, 60_000);
    const ident = await sshIdentification(sshPort);
    if (!ident.startsWith('SSH-2.0-')) throw new Error(`the ssh door identified as ${JSON.stringify(ident)}`);
  }
  return {
    url: `https://127.0.0.1:${started.port}`,
    servingCA,
    signer: { certPem: signing['tls.crt']!, keyPem: signing['tls.key']! },
    ...(started.concierge.tunnel ? { tunnel: started.concierge.tunnel } : {}),
    ...(sshPort === undefined ? {} : { ssh: { port: sshPort } }),
  };
}

const info = controlled ? await startControlled(cluster, controlled) : await startFixed();
console.log(
  JSON.stringify({
    url: info.url,
    servingCA: info.servingCA,
    signer: info.signer,
    ...(info.tunnel ? { tunnel: info.tunnel } : {}),
    ...(info.metricsPort === undefined ? {} : { metricsPort: info.metricsPort }),
    ...(info.ssh ? { ssh: info.ssh } : {}),
  }),
);

// The event loop's delay: how late a 10 ms timer fires, which is what every client of this process waits on top of
// its own work. Measured here rather than with monitorEventLoopDelay, whose reset drops the next interval (a stall
// just after a reading would go unseen); its cost is one timer callback per 10 ms. Two histograms: one since the last
// "loop" (a window), one since the last "loop reset" (a run).
const TICK_MS = 10;
const windowDelays = createHistogram();
const runDelays = createHistogram();
let last = performance.now();
setInterval(() => {
  const now = performance.now();
  // In microseconds (the histograms take integers of at least 1).
  const late = Math.max(1, Math.round((now - last - TICK_MS) * 1000));
  windowDelays.record(late);
  runDelays.record(late);
  last = now;
}, TICK_MS).unref();
const stats = (h: RecordableHistogram): object => {
  const ms = (us: number): number => (h.count ? Math.round(us) / 1000 : 0);
  return {
    p50: ms(h.percentile(50)),
    p99: ms(h.percentile(99)),
    max: ms(h.max),
    mean: ms(h.mean),
    samples: h.count,
  };
};

createInterface({ input: process.stdin })
  .on('line', (line) => {
    if (line === 'mem') {
      // Twice: a collection frees dead Buffers' memory on a background thread, and may return before it is done (on
      // a busy machine tens of MiB of them were still counted); the second waits for it and finds little new to free.
      globalThis.gc?.();
      globalThis.gc?.();
      console.log(JSON.stringify(process.memoryUsage()));
    } else if (line === 'loop') {
      console.log(JSON.stringify(stats(windowDelays)));
      windowDelays.reset();
    } else if (line === 'loop total') {
      console.log(JSON.stringify(stats(runDelays)));
    } else if (line === 'loop reset') {
      windowDelays.reset();
      runDelays.reset();
      console.log('{}');
    }
  })
  .on('close', () => process.exit(0));
