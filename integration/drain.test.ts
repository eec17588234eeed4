// A concierge told to stop (SIGTERM), as the kubelet tells a pod: the real `sealion concierge` in a process of its own
// with short --shutdown-delay and --shutdown-grace, a real API server with a real node, and real kubectl. While a slow
// plain request, a watch, an exec and a port-forward are open: /readyz turns 503 and requests are still answered during
// the delay; the slow request completes; the watch's response completes and a client resuming from its last
// resourceVersion misses no event written during the drain; the exec and the port-forward end (the exec with the
// message kubectl prints), neither hangs; the process exits 0 and its log says `draining` and `drained` with counts.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request, type RequestOptions } from 'node:https';
import type { IncomingMessage } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { SHUTDOWN_MESSAGE } from '../concierge/drain.ts';
import { REPO_ROOT } from '../dev/build.ts';
import { runKubectl, startCluster, type Cluster } from '../dev/cluster.ts';
import { prepareConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { DEMO_IMAGE, ensureDemoImage } from '../dev/image.ts';
import { kubeconfigYaml } from '../dev/kubeconfig.ts';
import { dieWithParent, stopChild, waitForOutput } from '../dev/processes.ts';
import { issueCert, newCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';

const NAMESPACE = 'drain';
const POD = 'demo';
const USER = 'drain-user';
/** Short, so the test is quick; the delay long enough that requests sent once /readyz says 503 come inside it. */
const DELAY_SECONDS = 8;
const GRACE_SECONDS = 4;

let cluster: Cluster;
let dir: string;
let servingCA: CertificateAuthority;
let user: { certPem: string; keyPem: string };
let userKubeconfig: string;
let concierge: ChildProcessByStdio<null, Readable, Readable>;
let url: URL;
/** The concierge's log lines (JSON), as it writes them. */
const lines: Record<string, unknown>[] = [];
const exited = { code: undefined as number | null | undefined };

/** Starts `sealion concierge` as the install runs it, but with fixed certificates, on a port it picks. */
async function startConcierge(): Promise<void> {
  servingCA = await newCA('drain-test-serving');
  const signer = await newCA('drain-test-signer');
  const serving = await issueCert(servingCA, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
  user = await issueCert(signer, { commonName: USER, organizations: ['drain-group'], usage: 'client' });
  const file = (name: string, text: string): string => {
    writeFileSync(join(dir, name), text, { mode: 0o600 });
    return join(dir, name);
  };
  const namespace = DEFAULT_INSTALL.namespace;
  const own = file('concierge.kubeconfig', await prepareConcierge(cluster, namespace));
  const [command, argv] = dieWithParent(process.execPath, [
    join(REPO_ROOT, 'bin/sealion.js'),
    'concierge',
    `--kubeconfig=${own}`,
    `--namespace=${namespace}`,
    '--listen=127.0.0.1:0',
    `--tls-cert-file=${file('tls.crt', serving.certPem)}`,
    `--tls-key-file=${file('tls.key', serving.keyPem)}`,
    `--signer-cert-file=${file('signer.crt', signer.certPem)}`,
    `--signer-key-file=${file('signer.key', signer.keyPem)}`,
    '--tunnel-listen=',
    '--peer-listen=',
    `--shutdown-delay=${DELAY_SECONDS}`,
    `--shutdown-grace=${GRACE_SECONDS}`,
  ]);
  concierge = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  concierge.once('exit', (code) => (exited.code = code));
  const { match } = await waitForOutput(concierge, /"port":(\d+)[^\n]*impersonation proxy listening/);
  url = new URL(`https://127.0.0.1:${match[1]}`);
  let rest = '';
  concierge.stdout.on('data', (chunk: string) => {
    const all = rest + chunk;
    const parts = all.split('\n');
    rest = parts.pop()!;
    for (const line of parts)
      if (line.startsWith('{')) lines.push(JSON.parse(line) as Record<string, unknown>);
  });
  userKubeconfig = file(
    'user.kubeconfig',
    kubeconfigYaml('drain', url.toString(), servingCA.certPem, { name: USER, ...user }),
  );
}

/** A request to the proxy as the test's user, on a connection of its own. */
function toProxy(method: string, path: string, headers: Record<string, string | number> = {}) {
  const options: RequestOptions = {
    host: '127.0.0.1',
    port: url.port,
    method,
    path,
    ca: servingCA.certPem,
    cert: user.certPem,
    key: user.keyPem,
    agent: false,
    headers,
  };
  return request(options);
}

/** Sends `method path` with `body` and resolves with the status and the body of the answer. */
function answer(method: string, path: string, body?: string): Promise<{ status: number; body: string }> {
  return new Promise((done, fail) => {
    const req = toProxy(method, path, body ? { 'content-type': 'application/json' } : {});
    req.once('response', (res: IncomingMessage) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (text += c));
      res.once('end', () => done({ status: res.statusCode ?? 0, body: text }));
    });
    req.once('error', fail);
    req.end(body);
  });
}

const configMap = (name: string): string =>
  JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name, namespace: NAMESPACE } });

/** Starts a kubectl with the user's kubeconfig; its output so far, and how it exited. */
function kubectl(args: string[]) {
  const [command, argv] = dieWithParent(cluster.binaries.kubectl, [
    `--kubeconfig=${userKubeconfig}`,
    ...args,
  ]);
  const child = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stdout.on('data', (c: Buffer) => (stdout += c.toString('utf8')));
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString('utf8')));
  const ended = new Promise<{ code: number | null; stderr: string }>((done) =>
    child.once('exit', (code) => done({ code, stderr })),
  );
  return { child, ended, stdout: () => stdout, stderr: () => stderr };
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-drain-'));
  cluster = await startCluster({ name: 'drain', node: { images: [await ensureDemoImage()] } });
  const admin = async (args: string[]): Promise<void> => {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  };
  await admin(['create', 'namespace', NAMESPACE]);
  await admin([
    'create',
    'clusterrolebinding',
    'drain-admin',
    '--clusterrole=cluster-admin',
    `--user=${USER}`,
  ]);
  // The namespace's default service account comes a moment after the namespace.
  await eventually(
    () => admin(['run', POD, '-n', NAMESPACE, `--image=${DEMO_IMAGE}`, '--command', '--', 'sleep', '3600']),
    30_000,
  );
  await admin(['wait', '--for=condition=Ready', `pod/${POD}`, '-n', NAMESPACE, '--timeout=240s']);
  await startConcierge();
}, 400_000);

afterAll(async () => {
  if (concierge) await stopChild(concierge);
  await cluster?.stop();
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

describe('a concierge told to stop (SIGTERM)', () => {
  it('turns unready, serves on through the delay, ends the watch cleanly and the sessions with a message, and exits 0', async () => {
    const listed = await answer('GET', `/api/v1/namespaces/${NAMESPACE}/configmaps`);
    expect(listed.status).toBe(200);
    const listRV = (JSON.parse(listed.body) as { metadata: { resourceVersion: string } }).metadata
      .resourceVersion;

    // A watch from the list's resourceVersion, read by hand to see its response complete.
    const events: { type: string; object: { metadata: { name: string; resourceVersion: string } } }[] = [];
    let watchCompleted: boolean | undefined;
    const watch = toProxy(
      'GET',
      `/api/v1/namespaces/${NAMESPACE}/configmaps?watch=1&resourceVersion=${listRV}`,
    );
    watch.once('response', (res: IncomingMessage) => {
      let rest = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => {
        const parts = (rest + c).split('\n');
        rest = parts.pop()!;
        for (const p of parts) if (p) events.push(JSON.parse(p) as (typeof events)[number]);
      });
      res.once('end', () => (watchCompleted = res.complete && rest === ''));
      res.once('error', () => (watchCompleted = false));
    });
    watch.once('error', () => (watchCompleted = false));
    watch.end();

    // A plain request slow in flight: its body comes in two halves, the second once the drain has begun.
    const body = configMap('slow');
    const slow = toProxy('POST', `/api/v1/namespaces/${NAMESPACE}/configmaps`, {
      'content-type': 'application/json',
      'content-length': Buffer.byteLength(body),
    });
    const slowStatus = new Promise<number>((done, fail) => {
      slow.once('response', (res: IncomingMessage) => {
        res.resume();
        res.once('end', () => done(res.statusCode ?? 0));
      });
      slow.once('error', fail);
    });
    slow.write(body.slice(0, 10));

    const exec = kubectl(['exec', POD, '-n', NAMESPACE, '--', 'sh', '-c', 'echo running; exec sleep 600']);
    const forward = kubectl(['port-forward', '-n', NAMESPACE, `pod/${POD}`, ':8080']);
    try {
      await eventually(() => expect(exec.stdout()).toContain('running'), 60_000);
      await eventually(() => expect(forward.stdout()).toMatch(/Forwarding from/), 60_000);
      await eventually(() => expect(watchCompleted).toBeUndefined(), 10_000);

      concierge.kill('SIGTERM');
      // a. Unready at once; b. still serving: a new request is answered, and the watch sees what it writes.
      await eventually(async () => expect((await answer('GET', '/readyz')).status).toBe(503), 10_000);
      expect(
        (await answer('POST', `/api/v1/namespaces/${NAMESPACE}/configmaps`, configMap('during-delay')))
          .status,
      ).toBe(201);
      expect((await answer('GET', '/healthz')).status).toBe(200);
      slow.end(body.slice(10));
      expect(await slowStatus).toBe(201);

      // e. The watch's response completes, and it saw every event before its end.
      await eventually(() => expect(watchCompleted).toBe(true), 60_000);
      expect(events.map((e) => `${e.type} ${e.object.metadata.name}`)).toEqual([
        'ADDED during-delay',
        'ADDED slow',
      ]);
      // Written after the watch ended, while the replica drains: a client resuming from its last resourceVersion
      // (at another replica; here the API server itself) sees it.
      const written = await cluster.kubectl(['create', 'configmap', 'after-watch', '-n', NAMESPACE]);
      expect(written.code).toBe(0);
      const lastRV = events.at(-1)!.object.metadata.resourceVersion;
      const resumed = await runKubectl(cluster.binaries.kubectl, cluster.kubeconfigPath, [
        'get',
        '--raw',
        `/api/v1/namespaces/${NAMESPACE}/configmaps?watch=1&resourceVersion=${lastRV}&timeoutSeconds=2`,
      ]);
      expect(resumed.code).toBe(0);
      const after = resumed.stdout
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as (typeof events)[number]);
      expect(after.map((e) => `${e.type} ${e.object.metadata.name}`)).toEqual(['ADDED after-watch']);

      // f. The exec ends with the message kubectl prints; the port-forward ends too; neither hangs.
      const execEnd = await exec.ended;
      expect(execEnd.code).not.toBe(0);
      expect(execEnd.stderr).toContain(SHUTDOWN_MESSAGE);
      const forwardEnd = await forward.ended;
      expect(forwardEnd.code).not.toBeNull();

      // g. The process exits 0, its log saying what it did.
      await eventually(() => expect(exited.code).toBe(0), 60_000);
    } finally {
      await Promise.all([stopChild(exec.child), stopChild(forward.child)]);
    }
    const draining = lines.find((l) => l['msg'] === 'draining');
    expect(draining).toMatchObject({ delaySeconds: DELAY_SECONDS, graceSeconds: GRACE_SECONDS });
    const drained = lines.find((l) => l['msg'] === 'drained');
    expect(drained).toMatchObject({
      watchesEnded: 1,
      sessionsClosed: 2,
      requestsCut: 0,
      tunnelsHandedOver: 0,
    });
    // The slow request and the one sent during the delay, at least (kubectl's own discovery requests may add some).
    expect(drained!['requestsFinished']).toBeGreaterThanOrEqual(2);
    expect(JSON.stringify([draining, drained])).not.toContain(USER);
  }, 300_000);
});
