// `npm run bench -- proxy`: GET and LIST latency and throughput through four paths to one real API server, in
// one run: direct (admin certificate), `kubectl proxy` (the peer), Sealion with a JWT bearer token, and Sealion
// with a TokenCredentialRequest certificate. Then the proxy's memory while holding 1,000 idle watches.
import { spawn, type ChildProcess } from 'node:child_process';
import { Agent as HttpAgent, request as httpRequest, type OutgoingHttpHeaders } from 'node:http';
import { connect as http2Connect } from 'node:http2';
import { Agent as HttpsAgent, request as httpsRequest } from 'node:https';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { issueCert } from '../lib/pki.ts';
import { startCluster } from '../integration/harness/cluster.ts';
import { applyJWTAuthenticator, FORWARDING_USER } from '../integration/harness/concierge.ts';
import { eventually } from '../integration/harness/eventually.ts';
import { startOIDCIssuer } from '../integration/harness/oidc-issuer.ts';
import { measure, saveResults, type Measurement } from './measure.ts';

const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 3);
const WATCHES = 1000;
const CONFIGMAPS = 100;

interface Target {
  name: string;
  get: (path: string) => Promise<number>;
}

function fetcher(
  name: string,
  base: string,
  agent: HttpAgent | HttpsAgent,
  headers: OutgoingHttpHeaders = {},
): Target {
  const url = new URL(base);
  const send = url.protocol === 'https:' ? httpsRequest : httpRequest;
  return {
    name,
    get: (path) =>
      new Promise((done, fail) => {
        const req = send(
          {
            host: url.hostname,
            port: url.port,
            path,
            agent,
            headers: { accept: 'application/json', ...headers },
          },
          (res) => {
            res.resume();
            res.on('end', () =>
              res.statusCode === 200 ? done(200) : fail(new Error(`${name} ${path}: HTTP ${res.statusCode}`)),
            );
          },
        );
        req.on('error', fail);
        req.end();
      }),
  };
}

function lines(child: ChildProcess): AsyncIterator<string> {
  return createInterface({ input: child.stdout! })[Symbol.asyncIterator]();
}

export async function benchProxy(): Promise<void> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const cluster = await startCluster({ name: 'bench', controllerManager: false, log });
  const issuer = await startOIDCIssuer({ audience: 'sealion-bench' });
  const children: ChildProcess[] = [];
  try {
    // The concierge in its own process, so the load generator does not share its event loop.
    const server = spawn(
      process.execPath,
      [
        '--expose-gc',
        // BENCH_PROFILE_DIR=dir writes a CPU profile of the concierge there, for chrome://inspect or speedscope.
        ...(process.env['BENCH_PROFILE_DIR']
          ? ['--cpu-prof', `--cpu-prof-dir=${process.env['BENCH_PROFILE_DIR']}`]
          : []),
        fileURLToPath(new URL('./serve-proxy.ts', import.meta.url)),
        cluster.dir,
        cluster.url,
        cluster.binaries.kubectl,
      ],
      {
        stdio: ['pipe', 'pipe', 'inherit'],
      },
    );
    children.push(server);
    const serverLines = lines(server);
    log('waiting for the concierge');
    const { url: proxyURL, servingCA } = JSON.parse((await serverLines.next()).value as string) as {
      url: string;
      servingCA: string;
    };
    const memory = async (): Promise<{ rss: number; heapUsed: number; external: number }> => {
      server.stdin.write('mem\n');
      return JSON.parse((await serverLines.next()).value as string) as {
        rss: number;
        heapUsed: number;
        external: number;
      };
    };

    await applyJWTAuthenticator(cluster, 'bench', issuer, 'sealion-bench');
    await cluster.kubectl(['create', 'namespace', 'bench']);
    await cluster.kubectl([
      'create',
      'clusterrolebinding',
      'bench-admin',
      '--clusterrole=cluster-admin',
      '--group=bench',
    ]);
    await Promise.all(
      Array.from({ length: CONFIGMAPS }, (_, i) =>
        cluster.kubectl(['create', 'configmap', `cm-${i}`, '-n', 'bench', '--from-literal=k=v']),
      ),
    );
    const token = await issuer.mint({ username: 'bench-user', groups: ['bench'] }, { expiresIn: 3600 });

    // kubectl proxy, the peer: plain HTTP on loopback, forwarding with the admin's credentials.
    const kubectlProxy = spawn(
      cluster.binaries.kubectl,
      ['--kubeconfig', cluster.kubeconfigPath, 'proxy', '--port=0'],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    children.push(kubectlProxy);
    const started = (await lines(kubectlProxy).next()).value as string;
    const kubectlProxyURL = `http://${/Starting to serve on (\S+)/.exec(started)![1]}`;
    log(`kubectl proxy at ${kubectlProxyURL}`);

    const admin = await issueCert(cluster.ca, {
      commonName: 'bench-admin',
      organizations: ['system:masters'],
      usage: 'client',
    });
    const forwarding = await issueCert(cluster.ca, { commonName: FORWARDING_USER, usage: 'client' });
    const proxyAgent = (extra: object = {}): HttpsAgent =>
      new HttpsAgent({ keepAlive: true, maxSockets: 64, ca: servingCA, ...extra });
    const targets: Target[] = [
      fetcher(
        'direct',
        cluster.url,
        new HttpsAgent({
          keepAlive: true,
          maxSockets: 64,
          ca: cluster.ca.certPem,
          cert: admin.certPem,
          key: admin.keyPem,
        }),
      ),
      // The floor for any impersonating proxy: the API server's own cost of authorizing impersonation, paid by
      // a direct client that sends the same Impersonate-* headers Sealion sends.
      fetcher(
        'direct impersonating',
        cluster.url,
        new HttpsAgent({
          keepAlive: true,
          maxSockets: 64,
          ca: cluster.ca.certPem,
          cert: forwarding.certPem,
          key: forwarding.keyPem,
        }),
        { 'impersonate-user': 'bench-user', 'impersonate-group': ['bench', 'system:authenticated'] },
      ),
      fetcher('kubectl proxy', kubectlProxyURL, new HttpAgent({ keepAlive: true, maxSockets: 64 })),
      fetcher('sealion (JWT)', proxyURL, proxyAgent(), { authorization: `Bearer ${token}` }),
    ];
    const tcr = await new Promise<{ clientCertificateData: string; clientKeyData: string }>((done, fail) => {
      const req = httpsRequest(
        `${proxyURL}/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests`,
        { method: 'POST', ca: servingCA, headers: { 'content-type': 'application/json' } },
        (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () =>
            done(
              (
                JSON.parse(body) as {
                  status: { credential: { clientCertificateData: string; clientKeyData: string } };
                }
              ).status.credential,
            ),
          );
        },
      );
      req.on('error', fail);
      req.end(
        JSON.stringify({
          apiVersion: 'login.concierge.sealion.dev/v1alpha1',
          kind: 'TokenCredentialRequest',
          spec: {
            token,
            authenticator: {
              apiGroup: 'authentication.concierge.sealion.dev',
              kind: 'JWTAuthenticator',
              name: 'bench',
            },
          },
        }),
      );
    });
    targets.push(
      fetcher(
        'sealion (certificate)',
        proxyURL,
        proxyAgent({ cert: tcr.clientCertificateData, key: tcr.clientKeyData }),
      ),
    );
    for (const t of targets) await eventually(() => t.get('/api/v1/namespaces/bench'), 30_000);
    log('all targets answer; measuring');

    const rows: Measurement[] = [];
    for (const [op, path] of [
      ['GET', '/api/v1/namespaces/bench'],
      ['LIST', `/api/v1/namespaces/bench/configmaps`],
    ] as const) {
      for (const concurrency of [1, 32]) {
        for (const t of targets) {
          const m = await measure(`${op} c=${concurrency} ${t.name}`, () => t.get(path), {
            seconds: SECONDS,
            concurrency,
          });
          rows.push({ ...m, op, concurrency, target: t.name });
          log(`${m.name}: ${Math.round(m.perSecond)} req/s`);
        }
      }
    }

    // Idle watches: one HTTP/2 connection to the proxy carries them all; the proxy holds one upstream request each.
    const before = await memory();
    // Several connections, each below the proxy's limit of concurrent HTTP/2 streams.
    const sessions = Array.from({ length: 5 }, () => http2Connect(proxyURL, { ca: servingCA }));
    const streams = [];
    for (let i = 0; i < WATCHES; i++) {
      const stream = sessions[i % sessions.length]!.request({
        ':path': `/api/v1/namespaces/bench/configmaps?watch=true&fieldSelector=metadata.name%3Dnone-${i}`,
        authorization: `Bearer ${token}`,
      });
      stream.on('data', () => {});
      streams.push(
        new Promise<boolean>((done) => {
          stream.once('response', (headers) => done(headers[':status'] === 200));
          stream.once('error', () => done(false));
          setTimeout(() => done(false), 30_000).unref();
        }),
      );
    }
    const opened = (await Promise.all(streams)).filter(Boolean).length;
    log(`${opened} of ${WATCHES} watches open`);
    await new Promise((r) => setTimeout(r, 2000));
    const after = await memory();
    for (const session of sessions) session.destroy();
    const watchMemory = {
      watches: opened,
      rssPerWatchKiB: (after.rss - before.rss) / 1024 / opened,
      heapPerWatchKiB: (after.heapUsed - before.heapUsed) / 1024 / opened,
      externalPerWatchKiB: (after.external - before.external) / 1024 / opened,
      rssBeforeMiB: before.rss / 1024 / 1024,
      rssAfterMiB: after.rss / 1024 / 1024,
    };

    report(rows, watchMemory);
    console.log(`saved ${saveResults('proxy', { rows, watchMemory })}`);
  } finally {
    for (const child of children) child.kill();
    await issuer.stop();
    await cluster.stop();
  }
}

function report(
  rows: (Measurement & { op?: string; concurrency?: number; target?: string })[],
  watchMemory: Record<string, number>,
): void {
  const fmt = (n: number, digits = 0): string =>
    n.toLocaleString('en-US', { maximumFractionDigits: digits, minimumFractionDigits: digits });
  console.log(
    '\nImpersonation proxy vs direct access and kubectl proxy (one real kube-apiserver, 2 cores shared by all)',
  );
  const header = ['op', 'c', 'target', 'req/s', 'p50 ms', 'p99 ms', '× direct req/s', '+p50 ms vs direct'];
  const table = [header];
  for (const r of rows) {
    const direct = rows.find(
      (d) => d.op === r.op && d.concurrency === r.concurrency && d.target === 'direct',
    )!;
    table.push([
      r.op!,
      String(r.concurrency),
      r.target!,
      fmt(r.perSecond),
      fmt(r.p50us / 1000, 2),
      fmt(r.p99us / 1000, 2),
      (r.perSecond / direct.perSecond).toFixed(2),
      fmt((r.p50us - direct.p50us) / 1000, 2),
    ]);
  }
  const widths = header.map((_, c) => Math.max(...table.map((row) => row[c]!.length)));
  for (const row of table)
    console.log(
      row.map((cell, c) => (c < 3 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  '),
    );
  console.log(
    `\n${watchMemory['watches']} idle watches held by the proxy: ${fmt(watchMemory['rssPerWatchKiB']!, 1)} KiB RSS per watch ` +
      `(${fmt(watchMemory['heapPerWatchKiB']!, 1)} KiB heap, ${fmt(watchMemory['externalPerWatchKiB']!, 1)} KiB external); ` +
      `RSS ${fmt(watchMemory['rssBeforeMiB']!, 1)} → ${fmt(watchMemory['rssAfterMiB']!, 1)} MiB`,
  );
}
