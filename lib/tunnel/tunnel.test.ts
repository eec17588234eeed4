import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { Readable, type Duplex } from 'node:stream';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { createServer as createHttpsServer } from 'node:https';
import { constants, performServerHandshake } from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import { connect as tlsConnect, createServer as createTLSServer, type TLSSocket } from 'node:tls';
import { createWebSocketStream, WebSocket, WebSocketServer } from 'ws';
import { eventually } from '../../dev/eventually.ts';
import { issueCert, newCA } from '../pki/pki.ts';
import { STREAM_WINDOW_BYTES } from '../http2/pool.ts';
import { newTunnelClient, serveTunnel, TunnelBusyError, type TunnelClient } from './tunnel.ts';

// Both ends on real sockets, the agent's end serving a plain HTTP/1.1 server on its streams: over a WebSocket (on
// plain TCP, or TLS when asked), or `direct`, on a TLS connection itself as agents dial by default.
const cleanups: (() => void)[] = [];
afterEach(() => cleanups.splice(0).forEach((c) => c()));

type Transport = 'websocket' | 'direct';

/** A serving certificate for 127.0.0.1 and the CA that issued it. */
async function serving(): Promise<{ caPem: string; cert: string; key: string }> {
  const ca = await newCA('tunnel-test');
  const issued = await issueCert(ca, { commonName: 'tunnel', hosts: ['127.0.0.1'], usage: 'server' });
  return { caPem: ca.certPem, cert: issued.certPem, key: issued.keyPem };
}

/** Both ends of a TLS connection, once each side's writes are done (lib/tunnel/tunnel.ts writesDone). */
async function directPair(): Promise<{ concierge: Duplex; agent: Duplex; close: () => void }> {
  const tls = await serving();
  const server = createTLSServer({ cert: tls.cert, key: tls.key });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const accepted = new Promise<TLSSocket>((done) => server.once('secureConnection', done));
  const agent = tlsConnect({
    host: '127.0.0.1',
    port: (server.address() as AddressInfo).port,
    ca: tls.caPem,
  });
  await new Promise<void>((done) => agent.once('secureConnect', () => done()));
  return { concierge: await accepted, agent, close: () => server.close() };
}

async function tunnelTo(
  handler: (req: IncomingMessage, res: ServerResponse) => void,
  opts: { maxStreams?: number; tls?: boolean; transport?: Transport } = {},
): Promise<{ client: TunnelClient; local: Server; dropAgent: () => void }> {
  const local = createServer(handler);
  if (opts.transport === 'direct') {
    const pair = await directPair();
    const agentEnd = serveTunnel(pair.agent, { connect: (stream) => local.emit('connection', stream) });
    const client = newTunnelClient(pair.concierge, opts);
    cleanups.push(() => {
      client.close();
      agentEnd.close();
      pair.close();
    });
    return { client, local, dropAgent: () => pair.agent.destroy() };
  }
  // Over TLS, as agents dial, when asked: the transport's writes then complete later than over plain TCP.
  const tls = opts.tls
    ? await serving().then((s) => ({ ...s, server: createHttpsServer({ cert: s.cert, key: s.key }) }))
    : undefined;
  if (tls) await new Promise<void>((done) => tls.server.listen(0, '127.0.0.1', done));
  const wss = tls
    ? new WebSocketServer({ server: tls.server })
    : new WebSocketServer({ port: 0, host: '127.0.0.1' });
  if (!tls) await new Promise<void>((done) => wss.once('listening', done));
  const accepted = new Promise<Duplex>((done) =>
    wss.once('connection', (ws) => done(createWebSocketStream(ws))),
  );
  const address = ((tls ? tls.server : wss).address() as AddressInfo).port;
  const ws = tls
    ? new WebSocket(`wss://127.0.0.1:${address}`, { ca: tls.caPem })
    : new WebSocket(`ws://127.0.0.1:${address}`);
  await new Promise<void>((done) => ws.once('open', () => done()));
  const agentEnd = serveTunnel(createWebSocketStream(ws), {
    connect: (stream) => local.emit('connection', stream),
  });
  const client = newTunnelClient(await accepted, opts);
  cleanups.push(() => {
    client.close();
    agentEnd.close();
    ws.terminate();
    wss.close();
    tls?.server.close();
  });
  return { client, local, dropAgent: () => ws.terminate() };
}

function get(client: TunnelClient, path: string): Promise<IncomingMessage> {
  return new Promise((done, fail) => {
    request({ host: 'cluster', path, agent: client.agent }, done).on('error', fail).end();
  });
}

async function text(res: IncomingMessage): Promise<string> {
  let body = '';
  for await (const chunk of res) body += (chunk as Buffer).toString();
  return body;
}

describe.each(['direct', 'websocket'] as const)('the tunnel multiplexer (%s)', (transport) => {
  it('carries many concurrent HTTP requests to the agent’s local server', async () => {
    const { client } = await tunnelTo((req, res) => res.end(`you asked for ${req.url}`), { transport });
    const answers = await Promise.all(
      Array.from({ length: 50 }, async (_, i) => text(await get(client, `/item/${i}`))),
    );
    expect(answers).toEqual(Array.from({ length: 50 }, (_, i) => `you asked for /item/${i}`));
  });

  it('delivers every request head and body intact when each opens its own stream', async () => {
    // Writes with a declared length, each on a fresh stream: Node's HTTP client writes the head as a string, which
    // Node's HTTP/2 core over a JavaScript transport once sent from memory it had already freed.
    const { client } = await tunnelTo(
      (req, res) => {
        const chunks: Buffer[] = [];
        req.on('data', (c: Buffer) => chunks.push(c));
        req.on('end', () => res.end(`${req.method} ${req.url} ${Buffer.concat(chunks).toString()}`));
      },
      { tls: true, transport },
    );
    const post = (i: number): Promise<string> =>
      new Promise((done, fail) => {
        const body = JSON.stringify({ kind: 'ConfigMap', metadata: { name: `item-${i}` } });
        const req = request(
          {
            host: 'cluster',
            method: 'POST',
            path: `/api/v1/namespaces/demo/configmaps?item=${i}`,
            agent: client.agent,
            headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) },
          },
          (res) => void text(res).then(done, fail),
        );
        req.on('error', fail);
        // As the proxy pipes a client's body: the head waits for it, then both go out in one writev.
        setImmediate(() => {
          req.write(body);
          req.end();
        });
      });
    const answers = await Promise.all(Array.from({ length: 80 }, (_, i) => post(i)));
    expect(answers).toEqual(
      Array.from(
        { length: 80 },
        (_, i) =>
          `POST /api/v1/namespaces/demo/configmaps?item=${i} {"kind":"ConfigMap","metadata":{"name":"item-${i}"}}`,
      ),
    );
  });

  it('does not let a slow reader on one stream stall another, and bounds what the slow one buffers', async () => {
    let bigWritten = 0;
    const { client } = await tunnelTo(
      (req, res) => {
        if (req.url !== '/big') return void res.end('small');
        const chunk = Buffer.alloc(64 * 1024);
        const pump = (): void => {
          while (bigWritten < 256 * 1024 * 1024) {
            bigWritten += chunk.length;
            if (!res.write(chunk)) return void res.once('drain', pump);
          }
          res.end();
        };
        pump();
      },
      { transport },
    );
    const big = await get(client, '/big');
    big.pause(); // nobody reads it
    const small = await text(await get(client, '/small'));
    expect(small).toBe('small');
    // Flow control held the producer back: what it wrote is bounded by the stream window plus socket buffers.
    await new Promise((r) => setTimeout(r, 200));
    expect(bigWritten).toBeLessThan(STREAM_WINDOW_BYTES * 8);
    big.destroy();
  });

  it('passes 1 GiB through one stream with bounded memory', async () => {
    const total = 1024 * 1024 * 1024;
    const { client } = await tunnelTo(
      (_req, res) => {
        const chunk = Buffer.alloc(256 * 1024, 7);
        let sent = 0;
        const pump = (): void => {
          while (sent < total) {
            sent += chunk.length;
            if (!res.write(chunk)) return void res.once('drain', pump);
          }
          res.end();
        };
        pump();
      },
      { transport },
    );
    // Live memory, not garbage a busy machine has not collected yet: a full collection before each sample.
    setFlagsFromString('--expose-gc');
    const gc = runInNewContext('gc') as () => void;
    gc();
    const before = process.memoryUsage();
    let received = 0;
    let peak = 0;
    for await (const chunk of await get(client, '/gig')) {
      received += (chunk as Buffer).length;
      if ((received & 0x3ffffff) < (chunk as Buffer).length) {
        gc();
        const now = process.memoryUsage();
        peak = Math.max(peak, now.heapUsed + now.arrayBuffers - before.heapUsed - before.arrayBuffers);
      }
    }
    expect(received).toBe(total);
    expect(peak).toBeLessThan(128 * 1024 * 1024);
  }, 120_000);

  it('refuses streams beyond its limit', async () => {
    const { client } = await tunnelTo(() => {}, { maxStreams: 2, transport });
    await client.open();
    await client.open();
    await expect(client.open()).rejects.toBeInstanceOf(TunnelBusyError);
  });

  it('opens a stream at once in place of one just closed, at its limit', async () => {
    const { client } = await tunnelTo(() => {}, { maxStreams: 3, transport });
    const streams = await Promise.all([client.open(), client.open(), client.open()]);
    for (const gone of streams.slice(0, 2)) {
      gone.destroy();
      await new Promise((done) => gone.once('close', done));
    }
    // The agent's end still holds the closed streams until its next event-loop turn; these must not be refused.
    const replacements = await Promise.all([client.open(), client.open()]);
    expect(replacements).toHaveLength(2);
    expect(client.active()).toBe(3);
  });

  it('ends the agent’s request when the concierge destroys its stream, though the agent’s server has stopped reading', async () => {
    let ended = false;
    let held = false;
    const { client } = await tunnelTo(
      (_req, res) => {
        // An answer the concierge's side does not read: the agent's server waits to write more, and reads nothing.
        res.once('close', () => (ended = true));
        const chunk = Buffer.alloc(64 << 10);
        const pump = (): void => {
          while (!res.destroyed)
            if (!res.write(chunk)) {
              held = true;
              return void res.once('drain', pump);
            }
        };
        pump();
      },
      { transport },
    );
    const req = request({ host: 'cluster', path: '/big', agent: client.agent });
    req.on('error', () => {});
    const answer = await new Promise<IncomingMessage>((done) => req.once('response', done).end());
    answer.pause();
    await eventually(() => expect(held).toBe(true));
    req.destroy();
    await eventually(() => expect(ended).toBe(true));
    expect(client.active()).toBe(0);
  });

  it('reports the tunnel closed when the agent goes away, and fails new streams', async () => {
    const { client, dropAgent } = await tunnelTo((_req, res) => res.end('ok'), { transport });
    expect(await text(await get(client, '/'))).toBe('ok');
    dropAgent();
    await client.closed;
    await expect(client.open()).rejects.toThrow(/closed/);
  });

  it('gives up on an agent that sends no pings', async () => {
    // An agent's end that answers pings but sends none of its own (the real one pings every PING_INTERVAL_MS, well
    // within SILENCE_LIMIT_MS).
    const pair = await directPair();
    cleanups.push(pair.close);
    const silent = performServerHandshake(pair.agent as unknown as Socket);
    silent.on('error', () => {});
    const client = newTunnelClient(pair.concierge, { silenceLimitMs: 300 });
    cleanups.push(() => client.close());
    await client.closed;
    await expect(client.open()).rejects.toThrow(/closed/);
  });
});

describe('plain requests through a tunnel', () => {
  it('carries a thousand answers that came before their bodies were all sent', async () => {
    // Node counts a chunk still queued on a stream the peer resets against the session's memory limit for good,
    // though the memory itself is freed. With the default limit, about 160 early answers to bodies still being
    // sent made the session refuse every new stream (ENHANCE_YOUR_CALM).
    const pair = await directPair();
    const agentEnd = serveTunnel(pair.agent, {
      connect: (stream) => stream.destroy(),
      request(stream) {
        stream.on('error', () => {});
        stream.respond({ ':status': 413 });
        stream.end('{"kind":"Status","code":413}', () => stream.close(constants.NGHTTP2_NO_ERROR));
      },
    });
    const client = newTunnelClient(pair.concierge);
    cleanups.push(() => {
      client.close();
      agentEnd.close();
      pair.close();
    });
    const chunk = Buffer.alloc(64 << 10, 'x');
    const send = (): Promise<string> =>
      new Promise((done) => {
        const stream = client.request({ ':method': 'POST', ':path': '/too-large' }, false);
        let sent = 0;
        const body = new Readable({
          read() {
            this.push(sent++ < 16 ? chunk : null);
          },
        });
        let status = '';
        stream.on('response', (headers) => (status = String(headers[':status'])));
        stream.on('error', (err: Error & { code?: string }) => done(err.code ?? err.message));
        stream.on('close', () => {
          body.unpipe(stream);
          done(status);
        });
        stream.resume();
        body.pipe(stream);
      });
    const answers: Record<string, number> = {};
    for (let round = 0; round < 250; round++)
      for (const answer of await Promise.all([send(), send(), send(), send()]))
        answers[answer] = (answers[answer] ?? 0) + 1;
    expect(answers).toEqual({ '413': 1000 });
  }, 60_000);
});
