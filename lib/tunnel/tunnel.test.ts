import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { getDefaultHighWaterMark, Readable, type Duplex } from 'node:stream';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { createServer as createHttpsServer } from 'node:https';
import { constants, performServerHandshake, type ClientHttp2Stream } from 'node:http2';
import type { AddressInfo, Socket } from 'node:net';
import { connect as tlsConnect, createServer as createTLSServer, type TLSSocket } from 'node:tls';
import { WebSocket, WebSocketServer } from 'ws';
import { webSocketStream } from './websocket.ts';
import { eventually } from '../../dev/eventually.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { issueCert, newCA } from '../pki/pki.ts';
import { HeadersTooLarge } from '../http2/header-block.ts';
import { STREAM_WINDOW_BYTES } from '../http2/pool.ts';
import {
  CONNECTION_WINDOW_BYTES,
  newTunnelClient,
  serveTunnel,
  SILENCE_LIMIT_MS,
  TunnelBusyError,
  TunnelClosedError,
  type TunnelClient,
  type TunnelServer,
} from './tunnel.ts';

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
): Promise<{ client: TunnelClient; local: Server; dropAgent: () => void; agentEnd: TunnelServer }> {
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
    return { client, local, dropAgent: () => pair.agent.destroy(), agentEnd };
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
  const accepted = new Promise<Duplex>((done) => wss.once('connection', (ws) => done(webSocketStream(ws))));
  const address = ((tls ? tls.server : wss).address() as AddressInfo).port;
  const ws = tls
    ? new WebSocket(`wss://127.0.0.1:${address}`, { ca: tls.caPem })
    : new WebSocket(`ws://127.0.0.1:${address}`);
  await new Promise<void>((done) => ws.once('open', () => done()));
  const agentEnd = serveTunnel(webSocketStream(ws), {
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
  return { client, local, dropAgent: () => ws.terminate(), agentEnd };
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

/** What the agent's server writes at a time in the test below. */
const WRITE_BYTES = 256 * 1024;
/** Every stream buffer on the way keeps taking writes until it holds this much (Node's default high-water mark). */
const HWM = getDefaultHighWaterMark(false);
/**
 * The most one answer's bytes can take of the process's Buffers on their way through the tunnel, both ends counted
 * (they share this process), by the configuration:
 * - the agent's server: the chunk it writes, which its tunnel stream takes whole past the stream's high-water mark;
 * - between the two HTTP/2 ends, what the agent's end may send before the concierge's end has taken it: the stream's
 *   window (for one stream the connection's, 16 MiB, never binds). Over a WebSocket a byte on its way can be in three
 *   Buffers at once (the sending session's output, its masked frame, and the read or the message it arrived in), so
 *   three windows; over TLS those wait in the kernel and in Node's native buffers, outside the Buffers;
 * - the concierge's HTTP/2 stream: its high-water mark, and what it took of the window before it stopped reading;
 * - the answer being read: its high-water mark and the chunk that crossed it.
 * 1.5 MiB in all. What holds more than its share (a stream window of 16 MiB held 16 MiB; a stream that took writes
 * without waiting for the ones before held 230 MiB at the first stall) fails at the first stall.
 */
const PATH_HOLDS_BYTES =
  WRITE_BYTES +
  HWM +
  3 * Math.min(STREAM_WINDOW_BYTES, CONNECTION_WINDOW_BYTES) +
  HWM +
  STREAM_WINDOW_BYTES +
  2 * HWM;
/** The answer: more than a hundred times what the path may hold (1.5 MiB), so a path that kept even a percent fails. */
const ANSWER_BYTES = 256 * 1024 * 1024;
/** How often the reader stops, lets the path fill up, and measures what it holds: 7 times. */
const STALL_EVERY_BYTES = 32 * 1024 * 1024;

/**
 * The Buffers this process holds alive: after a full collection, and a second one, since the first frees the memory
 * of dead Buffers on a background thread and may not be done when it returns (it showed tens of MiB of them); the
 * second waits for it, and finds nothing new to free. The Buffers are where the bytes are; the heap holds their
 * handles, and moves by megabytes either way as the compiler works, whatever the stream holds.
 */
const liveBuffers = (() => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  return (): number => {
    gc();
    gc();
    return process.memoryUsage().arrayBuffers;
  };
})();

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

  it('passes 256 MiB through one stream holding no more than its window and buffers', async () => {
    const { client } = await tunnelTo(
      (_req, res) => {
        let sent = 0;
        const pump = (): void => {
          while (sent < ANSWER_BYTES) {
            // A Buffer of its own each time: a chunk queued anywhere on the way is memory held, not a reference to
            // one Buffer written over and over.
            const chunk = Buffer.alloc(WRITE_BYTES, 7);
            sent += chunk.length;
            if (!res.write(chunk)) return void res.once('drain', pump);
          }
          res.end();
        };
        pump();
      },
      { transport },
    );
    const before = liveBuffers();
    const answer = await get(client, '/large');
    // The tunnel stream the answer comes on: its window left is what the agent's end may still send.
    const stream = answer.socket as unknown as ClientHttp2Stream;
    let received = 0;
    let peak = 0;
    for await (const chunk of answer) {
      received += (chunk as Buffer).length;
      // Past each multiple of STALL_EVERY_BYTES but the last, which is the end.
      if (received % STALL_EVERY_BYTES >= (chunk as Buffer).length || received === ANSWER_BYTES) continue;
      // A reader that stops: everything on the way fills up until the agent's end has sent the whole window.
      await eventually(() => expect(stream.state.localWindowSize).toBe(0));
      peak = Math.max(peak, liveBuffers() - before);
    }
    expect(received).toBe(ANSWER_BYTES);
    expect(peak).toBeLessThan(PATH_HOLDS_BYTES);
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

  it('asked to move, lets the request in flight end, opens no new stream and closes once none is left', async () => {
    let answer: (() => void) | undefined;
    const { client } = await tunnelTo(
      (req, res) => {
        if (req.url === '/now') return void res.end('at once');
        answer = () => res.end('after the move');
      },
      { transport },
    );
    // A stream kept for reuse does not hold the moving tunnel open.
    expect(await text(await get(client, '/now'))).toBe('at once');
    const inFlight = get(client, '/held');
    await eventually(() => expect(answer).toBeDefined());
    client.goAway();
    await expect(client.open()).rejects.toThrow(/moving/);
    answer!();
    expect(await text(await inFlight)).toBe('after the move');
    await client.closed;
  });

  it('told the agent leaves, lets the request in flight end, opens no new stream and closes once none is left', async () => {
    let answer: (() => void) | undefined;
    const { client, agentEnd } = await tunnelTo(
      (req, res) => {
        if (req.url === '/now') return void res.end('at once');
        answer = () => res.end('after the leave');
      },
      { transport },
    );
    expect(await text(await get(client, '/now'))).toBe('at once');
    const inFlight = get(client, '/held');
    await eventually(() => expect(answer).toBeDefined());
    let left = false;
    void client.leaving.then(() => (left = true));
    agentEnd.leave();
    await client.leaving;
    expect(left).toBe(true);
    await expect(client.open()).rejects.toThrow(TunnelClosedError);
    answer!();
    expect(await text(await inFlight)).toBe('after the leave');
    await client.closed;
    await agentEnd.closed;
  });

  it('retired, lets the request in flight end without telling the agent to move, and closes once none is left', async () => {
    let answer: (() => void) | undefined;
    const { client, agentEnd } = await tunnelTo((_req, res) => (answer = () => res.end('done')), {
      transport,
    });
    let moveAsked = false;
    void agentEnd.moveRequested.then(() => (moveAsked = true));
    const inFlight = get(client, '/held');
    await eventually(() => expect(answer).toBeDefined());
    client.retire();
    await expect(client.open()).rejects.toThrow(/moving/);
    answer!();
    expect(await text(await inFlight)).toBe('done');
    await client.closed;
    expect(moveAsked).toBe(false);
  });

  it('asked to move, still carries both ways what a stream in flight sends after the GOAWAY', async () => {
    const { client } = await tunnelTo(
      (req, res) => {
        let got = 0;
        req.on('data', (c: Buffer) => (got += c.length));
        req.on('end', () => res.end(`got ${got}`));
      },
      { transport },
    );
    const stream = await client.open();
    const size = 4 * STREAM_WINDOW_BYTES;
    stream.write(`POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: ${size}\r\n\r\n`);
    stream.write(Buffer.alloc(size / 2));
    client.goAway();
    // The rest of the body goes after the GOAWAY on the wire, past the stream's window: the agent's end must go on
    // reading it and granting window.
    stream.write(Buffer.alloc(size / 2));
    let answer = '';
    stream.on('data', (c: Buffer) => (answer += c.toString()));
    await eventually(() => expect(answer).toContain(`got ${size}`));
    stream.destroy();
    await client.closed;
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

  it('watches for pings on its clock', async () => {
    const pair = await directPair();
    cleanups.push(pair.close);
    const silent = performServerHandshake(pair.agent as unknown as Socket);
    silent.on('error', () => {});
    const clock = fakeClock();
    const client = newTunnelClient(pair.concierge, { clock });
    cleanups.push(() => client.close());
    let closed = false;
    void client.closed.then(() => (closed = true));
    // Up to the limit the silence is allowed; the look after it ends the tunnel.
    clock.advance(SILENCE_LIMIT_MS / 2);
    clock.advance(SILENCE_LIMIT_MS / 2);
    await new Promise((r) => setImmediate(r));
    expect(closed).toBe(false);
    clock.advance(SILENCE_LIMIT_MS / 2);
    await client.closed;
  });
});

describe('plain requests through a tunnel', () => {
  it('carries a request with a field for each of a user’s 800 groups (Node’s default server refuses past 128)', async () => {
    const pair = await directPair();
    const agentEnd = serveTunnel(pair.agent, {
      connect: (stream) => stream.destroy(),
      request(stream, _headers, raw) {
        stream.respond({ ':status': 200 });
        stream.end(String(raw.filter((field, i) => i % 2 === 0 && field === 'impersonate-group').length));
      },
    });
    const client = newTunnelClient(pair.concierge);
    cleanups.push(() => {
      client.close();
      agentEnd.close();
      pair.close();
    });
    const groupsOf = (count: number, length: number): string[] =>
      Array.from({ length: count }, (_, i) => `group-${i}`.padEnd(length, '-'));
    const ask = async (groups: string[]): Promise<string> => {
      const stream = client.request({ ':path': '/api', 'impersonate-group': groups }, true);
      stream.setEncoding('utf8');
      let body = '';
      stream.on('data', (c: string) => (body += c));
      await new Promise((done, fail) => stream.on('end', done).on('error', fail));
      return body;
    };
    expect(await ask(groupsOf(800, 40))).toBe('800');
    // A block Node would refuse to send, and close the tunnel after: refused before a stream opens.
    expect(() => client.request({ ':path': '/api', 'impersonate-group': groupsOf(5000, 1) }, true)).toThrow(
      HeadersTooLarge,
    );
    expect(await ask(groupsOf(10, 40))).toBe('10');
  });

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
