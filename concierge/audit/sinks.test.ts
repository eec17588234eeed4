// The log sink against real files in a temporary folder, and the webhook sink against a real HTTPS receiver on port 0
// whose certificate lib/pki issued, named by a kubeconfig written beside it.
import { afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:https';
import type { IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Writable } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { Registry } from 'prom-client';
import { stringify } from 'yaml';
import { eventually } from '../../dev/eventually.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { newLogger } from '../../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority, type KeyPairPem } from '../../lib/pki/pki.ts';
import {
  AUDIT_CLOSED,
  AUDIT_CONFIG,
  AUDIT_REJECTED,
  AUDIT_UNAVAILABLE,
  newAuditBackend,
  type AuditSink,
} from './backend.ts';
import { newLogSink, newWebhookSink } from './sinks.ts';
import type { AuditEvent } from './types.ts';
import { sampleEvent } from './sample-event.ts';

const auditEvent = (i: number, padding = ''): AuditEvent =>
  sampleEvent(i, padding ? { annotations: { padding } } : {});

const events = (from: number, to: number, padding = ''): AuditEvent[] =>
  Array.from({ length: to - from }, (_, i) => auditEvent(from + i, padding));

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function tempFolder(): Promise<string> {
  const folder = await mkdtemp(join(tmpdir(), 'sealion-audit-'));
  cleanups.push(() => rm(folder, { recursive: true, force: true }));
  return folder;
}

function closing<T extends AuditSink>(sink: T): T {
  cleanups.push(() => sink.close());
  return sink;
}

const parseLines = (text: string): unknown[] =>
  text
    .split('\n')
    .filter((line) => line !== '')
    .map((line) => JSON.parse(line) as unknown);

describe('log sink', () => {
  it("writes one JSON line per event to '-'", async () => {
    const out = new PassThrough();
    let text = '';
    out.on('data', (chunk: Buffer) => (text += chunk.toString('utf8')));
    const sink = closing(newLogSink({ path: '-', stdout: out }));
    expect(sink.name).toBe('log');
    await sink.write(events(0, 2));
    await sink.write(events(2, 3));
    expect(text.endsWith('\n')).toBe(true);
    expect(parseLines(text)).toEqual(events(0, 3));
  });

  it('resolves a write only once its stream took it, so a slow output slows the writes', async () => {
    const held: (() => void)[] = [];
    const out = new Writable({
      highWaterMark: 1,
      write(_chunk, _encoding, callback) {
        held.push(() => callback());
      },
    });
    const sink = closing(newLogSink({ path: '-', stdout: out }));
    let written = false;
    const writing = sink.write(events(0, 1)).then(() => (written = true));
    await eventually(() => expect(held).toHaveLength(1));
    await new Promise((resolve) => setImmediate(resolve));
    expect(written).toBe(false);
    held[0]!();
    await writing;
  });

  it('creates the file (and its folder) with mode 0600 and appends to what is there', async () => {
    const path = join(await tempFolder(), 'audit', 'audit.log');
    const first = newLogSink({ path });
    await first.write(events(0, 2));
    await first.close();
    expect((await stat(path)).mode & 0o777).toBe(0o600);

    const second = closing(newLogSink({ path }));
    await second.write(events(2, 4));
    await second.close();
    expect(parseLines(await readFile(path, 'utf8'))).toEqual(events(0, 4));
    await expect(second.write(events(4, 5))).rejects.toMatchObject({ code: AUDIT_CLOSED });
    await second.close();
  });

  // A file ends with the chunk of lines that reaches the limit: a chunk is a tenth of the limit here, or one line
  // when a line is longer.
  it.each([
    ['a line', 2_000, 40],
    ['several lines', 20_000, 250],
  ])(
    'rotates at the size limit, a chunk of %s at a time, and keeps the newest maxBackups',
    async (_, limit, count) => {
      const folder = await tempFolder();
      const path = join(folder, 'audit.log');
      const sink = closing(newLogSink({ path, maxSizeMiB: limit / (1024 * 1024), maxBackups: 2 }));
      const line = JSON.stringify(auditEvent(10, 'x'.repeat(200))).length + 1;
      const chunk = Math.max(line, limit / 10);
      const all = events(0, count, 'x'.repeat(200));
      for (let i = 0; i < all.length; i += 5) await sink.write(all.slice(i, i + 5));
      await sink.close();

      const files = (await readdir(folder)).sort();
      const backups = files.filter((f) => f !== 'audit.log');
      expect(files).toContain('audit.log');
      expect(backups).toHaveLength(2);
      for (const backup of backups) {
        expect(backup).toMatch(/^audit-\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}\.\d{3}\.log$/);
        const { size, mode } = await stat(join(folder, backup));
        expect(size).toBeGreaterThanOrEqual(limit);
        expect(size).toBeLessThan(limit + chunk);
        expect(mode & 0o777).toBe(0o600);
      }
      // Oldest backup, newer backup, current file: together the newest events, in order, each whole.
      let kept: unknown[] = [];
      for (const file of [...backups, 'audit.log'])
        kept = kept.concat(parseLines(await readFile(join(folder, file), 'utf8')));
      expect(kept.length).toBeGreaterThan(0);
      expect(kept).toEqual(all.slice(all.length - kept.length));
    },
  );

  it('removes backups older than maxAgeDays, and no other file', async () => {
    const folder = await tempFolder();
    const path = join(folder, 'audit.log');
    const old = 'audit-2000-01-01T00-00-00.000.log';
    await writeFile(join(folder, old), '{}\n');
    await writeFile(join(folder, 'audit-notes.log'), 'mine\n');
    const sink = closing(newLogSink({ path, maxSizeMiB: 1_000 / (1024 * 1024), maxAgeDays: 1 }));
    await sink.write(events(0, 10, 'x'.repeat(200)));

    const files = await readdir(folder);
    expect(files).not.toContain(old);
    expect(files).toContain('audit-notes.log');
    expect(files.filter((f) => /^audit-\d{4}-/.test(f)).length).toBeGreaterThan(0);
  });

  it.each([
    ['an empty path', { path: '' }],
    ['a size of 0', { path: '-', maxSizeMiB: 0 }],
    ['negative backups', { path: '-', maxBackups: -1 }],
    ['a fraction of a backup', { path: '-', maxBackups: 1.5 }],
    ['a negative age', { path: '-', maxAgeDays: -1 }],
  ])('refuses %s', (_, opts) => {
    expect(() => newLogSink(opts)).toThrow(expect.objectContaining({ code: AUDIT_CONFIG }));
  });
});

describe('webhook sink', () => {
  let ca: CertificateAuthority;
  let serving: KeyPairPem;
  let client: KeyPairPem;
  let otherCA: CertificateAuthority;

  beforeAll(async () => {
    ca = await newCA('audit receiver CA');
    otherCA = await newCA('someone else');
    serving = await issueCert(ca, { commonName: 'receiver', hosts: ['127.0.0.1'], usage: 'server' });
    client = await issueCert(ca, { commonName: 'sealion-audit', usage: 'client' });
  });

  interface Received {
    method: string | undefined;
    url: string | undefined;
    headers: IncomingHttpHeaders;
    body: unknown;
    clientName: string | undefined;
  }

  interface Receiver {
    server: string;
    requests: Received[];
  }

  /**
   * An HTTPS receiver. `answers` are the statuses of the first requests, in order ('reset' closes the connection
   * without an answer); then it answers 200.
   */
  async function receiver(
    answers: (number | 'reset')[] = [],
    opts: { mutualTLS?: boolean } = {},
  ): Promise<Receiver> {
    const requests: Received[] = [];
    const server: Server = createServer(
      {
        key: serving.keyPem,
        cert: serving.certPem,
        ...(opts.mutualTLS ? { requestCert: true, rejectUnauthorized: true, ca: ca.certPem } : {}),
      },
      (req, res) => {
        const chunks: Buffer[] = [];
        req.on('data', (chunk: Buffer) => chunks.push(chunk));
        req.on('end', () => {
          const peer = (req.socket as TLSSocket).getPeerCertificate();
          requests.push({
            method: req.method,
            url: req.url,
            headers: req.headers,
            body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown,
            clientName: peer?.subject?.CN as string | undefined,
          });
          const answer = answers.shift() ?? 200;
          if (answer === 'reset') req.socket.destroy();
          else res.writeHead(answer, { 'content-type': 'application/json' }).end('{"kind":"Status"}');
        });
      },
    );
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    cleanups.push(async () => {
      server.closeAllConnections();
      await new Promise((resolve) => server.close(resolve));
    });
    return { server: `https://127.0.0.1:${(server.address() as AddressInfo).port}/audit`, requests };
  }

  const base64 = (text: string): string => Buffer.from(text).toString('base64');

  /** A kubeconfig with one cluster and one user, and no current context unless `extra` adds one. */
  async function kubeconfig(
    cluster: Record<string, unknown>,
    user: Record<string, unknown> = {},
    extra: Record<string, unknown> = {},
  ): Promise<string> {
    const folder = await tempFolder();
    const path = join(folder, 'kubeconfig');
    await writeFile(
      path,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'receiver', cluster }],
        users: [{ name: 'sealion', user }],
        ...extra,
      }),
    );
    return path;
  }

  async function webhook(
    kubeconfigPath: string,
    opts: { maxRetries?: number; initialBackoffMs?: number } = {},
  ): Promise<AuditSink> {
    return closing(await newWebhookSink({ kubeconfigPath, initialBackoffMs: 1, ...opts }));
  }

  const eventList = (items: AuditEvent[]): unknown => ({
    kind: 'EventList',
    apiVersion: 'audit.k8s.io/v1',
    metadata: {},
    items,
  });

  it('POSTs each batch as an EventList of exactly its events, with the bearer token', async () => {
    const r = await receiver();
    const sink = await webhook(
      await kubeconfig(
        { server: r.server, 'certificate-authority-data': base64(ca.certPem) },
        { token: 't0ken' },
      ),
    );
    expect(sink.name).toBe('webhook');
    await sink.write(events(0, 3));
    await sink.write(events(3, 4));
    expect(r.requests).toHaveLength(2);
    expect(r.requests[0]).toMatchObject({ method: 'POST', url: '/audit', body: eventList(events(0, 3)) });
    expect(r.requests[0]!.headers).toMatchObject({
      'content-type': 'application/json',
      authorization: 'Bearer t0ken',
    });
    expect(r.requests[1]!.body).toEqual(eventList(events(3, 4)));
  });

  it('retries 5xx, 429 and a dropped connection with backoff, then succeeds', async () => {
    const r = await receiver([503, 'reset', 429, 500]);
    const sink = await webhook(
      await kubeconfig({ server: r.server, 'certificate-authority-data': base64(ca.certPem) }),
    );
    await sink.write(events(0, 2));
    expect(r.requests).toHaveLength(5);
    for (const req of r.requests) expect(req.body).toEqual(eventList(events(0, 2)));
  });

  it('waits for each retry on its clock, and a close ends the wait', async () => {
    const r = await receiver([503, 503]);
    const clock = fakeClock();
    const path = await kubeconfig({ server: r.server, 'certificate-authority-data': base64(ca.certPem) });
    const sink = closing(await newWebhookSink({ kubeconfigPath: path, initialBackoffMs: 1_000, clock }));
    const written = sink.write(events(0, 1));
    await eventually(() => expect(clock.pending()).toHaveLength(1));
    expect(r.requests).toHaveLength(1);
    // The first pause: the initial backoff, and at most a fifth more.
    expect(clock.pending()[0]).toBeGreaterThanOrEqual(1_000);
    expect(clock.pending()[0]).toBeLessThanOrEqual(1_200);
    clock.advance(1_200);
    await eventually(() => expect(clock.pending()).toHaveLength(1));
    expect(r.requests).toHaveLength(2);
    const refused = expect(written).rejects.toMatchObject({ code: AUDIT_CLOSED });
    await sink.close();
    await refused;
    expect(clock.pending()).toHaveLength(0);
    expect(r.requests).toHaveLength(2);
  });

  it('gives up after maxRetries', async () => {
    const r = await receiver([503, 503, 503, 503]);
    const sink = await webhook(
      await kubeconfig({ server: r.server, 'certificate-authority-data': base64(ca.certPem) }),
      {
        maxRetries: 2,
      },
    );
    await expect(sink.write(events(0, 1))).rejects.toMatchObject({ code: AUDIT_UNAVAILABLE, status: 503 });
    expect(r.requests).toHaveLength(3);
  });

  it('does not retry 400; through the backend the batch is dropped and counted', async () => {
    const r = await receiver([400, 400]);
    const sink = await webhook(
      await kubeconfig({ server: r.server, 'certificate-authority-data': base64(ca.certPem) }),
    );
    await expect(sink.write(events(0, 1))).rejects.toMatchObject({ code: AUDIT_REJECTED, status: 400 });
    expect(r.requests).toHaveLength(1);

    const registry = new Registry();
    const lines: string[] = [];
    const backend = newAuditBackend({
      sinks: [sink],
      registry,
      log: newLogger({ destination: { write: (line: string) => void lines.push(line) } }),
    });
    for (const event of events(1, 3)) await backend.emit(event);
    await backend.close();
    expect(r.requests).toHaveLength(2);
    expect(r.requests[1]!.body).toEqual(eventList(events(1, 3)));
    expect(await registry.getSingleMetricAsString('sealion_audit_events_dropped_total')).toContain(
      'sealion_audit_events_dropped_total{sink="webhook"} 2',
    );
    expect(lines.join('')).toContain('HTTP 400');
    expect(lines.join('')).not.toContain('alice');
  });

  it('presents its client certificate and trusts the CA file, both named relative to the kubeconfig, in its current context', async () => {
    const r = await receiver([], { mutualTLS: true });
    const path = await kubeconfig(
      { server: 'https://127.0.0.1:1/not-this-one', 'certificate-authority-data': base64(ca.certPem) },
      { token: 'not this one' },
      {
        clusters: [
          { name: 'decoy', cluster: { server: 'https://127.0.0.1:1/' } },
          { name: 'receiver', cluster: { server: r.server, 'certificate-authority': 'pki/ca.crt' } },
        ],
        users: [
          { name: 'decoy', user: { token: 'not this one' } },
          {
            name: 'sealion',
            user: { 'client-certificate': 'pki/client.crt', 'client-key': 'pki/client.key' },
          },
        ],
        contexts: [{ name: 'audit', context: { cluster: 'receiver', user: 'sealion' } }],
        'current-context': 'audit',
      },
    );
    const pki = join(path, '..', 'pki');
    await mkdir(pki);
    await writeFile(join(pki, 'ca.crt'), ca.certPem);
    await writeFile(join(pki, 'client.crt'), client.certPem);
    await writeFile(join(pki, 'client.key'), client.keyPem);

    const sink = await webhook(path);
    await sink.write(events(0, 1));
    expect(r.requests).toHaveLength(1);
    expect(r.requests[0]!.clientName).toBe('sealion-audit');
    expect(r.requests[0]!.headers.authorization).toBeUndefined();
  });

  it('sends nothing to a receiver its CA did not sign', async () => {
    const r = await receiver();
    const sink = await webhook(
      await kubeconfig({ server: r.server, 'certificate-authority-data': base64(otherCA.certPem) }),
      { maxRetries: 0 },
    );
    await expect(sink.write(events(0, 1))).rejects.toMatchObject({ code: AUDIT_UNAVAILABLE });
    expect(r.requests).toHaveLength(0);
  });

  it('close() ends a write waiting to retry, and later writes', async () => {
    const r = await receiver([503, 503]);
    const sink = await webhook(
      await kubeconfig({ server: r.server, 'certificate-authority-data': base64(ca.certPem) }),
      {
        initialBackoffMs: 3_600_000,
      },
    );
    const writing = sink.write(events(0, 1));
    await eventually(() => expect(r.requests).toHaveLength(1));
    const refused = expect(writing).rejects.toMatchObject({ code: AUDIT_CLOSED });
    await sink.close();
    await refused;
    await expect(sink.write(events(1, 2))).rejects.toMatchObject({ code: AUDIT_CLOSED });
    await sink.close();
    expect(r.requests).toHaveLength(1);
  });

  const ok = { server: 'https://127.0.0.1:1/', 'certificate-authority-data': '' };
  it.each<[string, Record<string, unknown>, Record<string, unknown>?, Record<string, unknown>?]>([
    ['an http server', { server: 'http://127.0.0.1:1/' }],
    ['a server with credentials', { server: 'https://u:p@127.0.0.1:1/' }],
    ['no server', {}],
    ['insecure-skip-tls-verify', { ...ok, 'insecure-skip-tls-verify': true }],
    ['a CA as file and data', { ...ok, 'certificate-authority': 'ca.crt' }],
    ['a CA file that is missing', { server: ok.server, 'certificate-authority': 'missing.crt' }],
    ['CA data that is no certificate', { server: ok.server, 'certificate-authority-data': base64('hello') }],
    ['a client certificate without its key', ok, { 'client-certificate-data': 'Y2VydA==' }],
    ['an exec credential plugin', ok, { exec: { command: 'get-token' } }],
    ['a token file', ok, { tokenFile: '/var/run/token' }],
    ['a token with its newline', ok, { token: 't0ken\n' }],
    ['a current context that is missing', ok, {}, { 'current-context': 'nowhere' }],
    [
      'two clusters and no current context',
      ok,
      {},
      {
        clusters: [
          { name: 'a', cluster: ok },
          { name: 'b', cluster: ok },
        ],
      },
    ],
    ['clusters that are not a list', ok, {}, { clusters: { a: ok } }],
  ])('refuses a kubeconfig with %s', async (_, cluster, user = {}, extra = {}) => {
    const withCA =
      cluster['certificate-authority-data'] === ''
        ? { ...cluster, 'certificate-authority-data': base64(ca.certPem) }
        : cluster;
    await expect(
      newWebhookSink({ kubeconfigPath: await kubeconfig(withCA, user, extra) }),
    ).rejects.toMatchObject({
      code: AUDIT_CONFIG,
    });
  });

  it('reports every problem of a kubeconfig at once, and no key material', async () => {
    const path = await kubeconfig(
      { server: 'http://127.0.0.1:1/', 'insecure-skip-tls-verify': true },
      {
        exec: { command: 'x' },
        'client-certificate-data': base64(client.certPem),
        'client-key-data': base64('not a key'),
      },
    );
    const refused = newWebhookSink({ kubeconfigPath: path });
    await expect(refused).rejects.toMatchObject({ code: AUDIT_CONFIG });
    const message = await refused.catch((err: Error) => err.message);
    for (const field of ['server', 'insecure-skip-tls-verify', 'exec', 'client-key'])
      expect(message).toContain(field);
    expect(message).not.toContain('not a key');
  });

  it('refuses a kubeconfig it cannot read or parse, and bad options', async () => {
    const folder = await tempFolder();
    await expect(newWebhookSink({ kubeconfigPath: join(folder, 'missing') })).rejects.toMatchObject({
      code: AUDIT_CONFIG,
    });
    await writeFile(join(folder, 'list'), '- a\n- b\n');
    await expect(newWebhookSink({ kubeconfigPath: join(folder, 'list') })).rejects.toMatchObject({
      code: AUDIT_CONFIG,
    });
    await writeFile(join(folder, 'broken'), 'clusters: [\n');
    await expect(newWebhookSink({ kubeconfigPath: join(folder, 'broken') })).rejects.toMatchObject({
      code: AUDIT_CONFIG,
    });
    await expect(
      newWebhookSink({ kubeconfigPath: join(folder, 'list'), maxRetries: -1 }),
    ).rejects.toMatchObject({
      code: AUDIT_CONFIG,
    });
  });
});
