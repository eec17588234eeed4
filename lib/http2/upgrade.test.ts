import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { createServer as createHttpServer, request } from 'node:http';
import {
  connect as http2Connect,
  constants,
  createServer as createH2Server,
  type ServerHttp2Stream,
} from 'node:http2';
import {
  connect as netConnect,
  createServer as createNetServer,
  type AddressInfo,
  type Socket,
} from 'node:net';
import { duplexPair, PassThrough, type Duplex } from 'node:stream';
import { eventually } from '../../dev/eventually.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { refuseConnection } from '../kube/status.ts';
import { newMemoryBudget } from './memory-budget.ts';
import { STREAM_WINDOW_BYTES } from './pool.ts';
import { endAndClose, forwardUpgrade, LAST_WRITE_MS } from './upgrade.ts';

describe('forwardUpgrade', () => {
  it('fails an upgrade whose headers Node refuses only when it writes them, instead of throwing', () => {
    // Nothing listens there: the request never gets as far as connecting.
    const send = () =>
      request({
        host: '127.0.0.1',
        port: 9,
        method: 'PUT',
        path: '/api',
        // A Trailer on a request with a Content-Length: Node throws ERR_HTTP_TRAILER_INVALID at end().
        headers: { trailer: 'x', 'content-length': '2', connection: 'Upgrade', upgrade: 'websocket' },
      });
    const failures: string[] = [];
    const socket = new PassThrough();
    expect(() =>
      forwardUpgrade(socket, Buffer.alloc(0), {
        send,
        fail: (err: Error & { code?: string }) => failures.push(err.code ?? err.message),
      }),
    ).not.toThrow();
    expect(failures).toEqual(['ERR_HTTP_TRAILER_INVALID']);
    socket.destroy();
  });
});

describe('an upgraded connection whose target does not read', () => {
  const closers: (() => void)[] = [];
  afterEach(() => {
    for (const close of closers.splice(0)) close();
  });

  it("is charged the client's stream window, and is cut at the target once that stream is reset", async () => {
    // The target: switches protocols, then reads nothing and writes nothing.
    const target = createHttpServer();
    target.on('upgrade', (_req, conn: Duplex) => {
      conn.on('error', () => {});
      conn.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n');
      conn.pause();
    });
    await new Promise<void>((done) => target.listen(0, '127.0.0.1', done));
    closers.push(() => target.close());
    const targetPort = (target.address() as AddressInfo).port;
    // The hop: each HTTP/2 stream it is sent is the client's side of an upgrade to the target (as a tunnel's or a
    // peer link's stream is).
    const budget = newMemoryBudget({ perUserBytes: 64 << 20, totalBytes: 64 << 20 });
    let toTarget: Duplex | undefined;
    const hop = createH2Server();
    hop.on('stream', (stream: ServerHttp2Stream) => {
      stream.on('error', () => {});
      stream.respond({ ':status': 200 });
      forwardUpgrade(stream, Buffer.alloc(0), {
        send() {
          const sent = request({
            host: '127.0.0.1',
            port: targetPort,
            headers: { connection: 'Upgrade', upgrade: 'tcp' },
          });
          sent.once('socket', (s: Duplex) => (toTarget = s));
          return sent;
        },
        fail: () => stream.destroy(),
        account: { budget, user: 'pat' },
      });
    });
    await new Promise<void>((done) => hop.listen(0, '127.0.0.1', done));
    closers.push(() => hop.close());
    const session = http2Connect(`http://127.0.0.1:${(hop.address() as AddressInfo).port}`);
    session.on('error', () => {});
    closers.push(() => session.destroy());
    const client = session.request({ ':method': 'POST', ':path': '/' });
    client.on('error', () => {});
    // Far more than the target's socket buffers take: the rest waits in the hop's stream, a window at most.
    const piece = Buffer.alloc(1 << 20);
    const send = (): void => {
      while (!client.destroyed && client.write(piece));
    };
    client.on('drain', send);
    send();
    await eventually(() => expect(budget.held('pat')).toBeGreaterThanOrEqual(STREAM_WINDOW_BYTES));
    expect(budget.held('pat')).toBeLessThan(2 * STREAM_WINDOW_BYTES);
    // The client resets its stream: its side is cut short, so the target's is too (it was ended only, and held its
    // bytes, before), and nothing stays charged.
    client.close(constants.NGHTTP2_CANCEL);
    await eventually(() => {
      expect(toTarget?.destroyed).toBe(true);
      expect(budget.held('pat')).toBe(0);
    });
  });
});

/** What a client that never ends its own side reads before the server closes the connection. */
function readUntilClosed(stream: Duplex): Promise<string> {
  return new Promise((done, fail) => {
    let got = '';
    stream.setEncoding('utf8');
    stream.on('data', (chunk: string) => (got += chunk));
    stream.once('error', fail);
    stream.once('close', () => done(got));
  });
}

/**
 * Each kind of Duplex an upgrade reaches the pipeline on: a TCP (or TLS) socket at the proxy's port, a CONNECT stream
 * of a peer link (HTTP/2), and the in-process door's stream pair. Made with the server's end and the client's.
 */
const CARRIERS: Array<[string, () => Promise<{ server: Duplex; client: Duplex; close(): void }>]> = [
  [
    'a TCP socket',
    async () => {
      const server = createNetServer();
      const accepted = new Promise<Socket>((done) => server.once('connection', done));
      await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
      const client = netConnect((server.address() as AddressInfo).port, '127.0.0.1');
      return { server: await accepted, client, close: () => server.close() };
    },
  ],
  [
    "a peer link's CONNECT stream (HTTP/2)",
    async () => {
      const server = createH2Server();
      const accepted = new Promise<ServerHttp2Stream>((done) =>
        server.once('stream', (stream) => {
          stream.respond({ ':status': 200 });
          done(stream);
        }),
      );
      await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
      const session = http2Connect(`http://127.0.0.1:${(server.address() as AddressInfo).port}`);
      const client = session.request({ ':method': 'CONNECT', ':authority': 'cluster.tunnel:443' });
      return {
        server: await accepted,
        client,
        close() {
          session.close();
          server.close();
        },
      };
    },
  ],
  [
    "the in-process door's stream pair",
    () => {
      const [client, server] = duplexPair();
      // As the door pairs them: a pair's end closes only when the other ends, so a closed end takes the other along.
      server.once('close', () => client.destroy());
      return Promise.resolve({ server, client, close() {} });
    },
  ],
];

describe('refuseConnection', () => {
  it.each(CARRIERS)(
    'writes the Status and closes %s, though the client never ends its side',
    async (_name, make) => {
      const { server, client, close } = await make();
      try {
        const read = readUntilClosed(client);
        const serverClosed = new Promise<void>((done) => server.once('close', done));
        refuseConnection(server, { status: 429, message: 'your share is full', retryAfterSeconds: 1 });
        const got = await read;
        await serverClosed;
        expect(got).toMatch(/^HTTP\/1\.1 429 Too Many Requests\r\n/);
        expect(got).toContain('retry-after: 1\r\n');
        expect(JSON.parse(got.slice(got.indexOf('\r\n\r\n') + 4))).toMatchObject({
          kind: 'Status',
          code: 429,
          message: 'your share is full',
          details: { retryAfterSeconds: 1 },
        });
      } finally {
        client.destroy();
        close();
      }
    },
  );

  it('cuts a connection whose client reads nothing once the last write has had its time', () => {
    jest.useFakeTimers({ doNotFake: ['nextTick', 'setImmediate', 'queueMicrotask'] });
    try {
      // A stream pair's end finishes only once the other end has read everything: this client reads nothing.
      const [client, server] = duplexPair();
      refuseConnection(server, { status: 503, message: 'not now' });
      expect(server.destroyed).toBe(false);
      jest.advanceTimersByTime(LAST_WRITE_MS);
      expect(server.destroyed).toBe(true);
      client.destroy();
    } finally {
      jest.useRealTimers();
    }
  });

  it('cuts it on the clock it is given', () => {
    const clock = fakeClock();
    const [client, server] = duplexPair();
    endAndClose(server, 'HTTP/1.1 503 Service Unavailable\r\n\r\n', clock);
    expect(clock.pending()).toEqual([LAST_WRITE_MS]);
    clock.advance(LAST_WRITE_MS - 1);
    expect(server.destroyed).toBe(false);
    clock.advance(1);
    expect(server.destroyed).toBe(true);
    client.destroy();
  });

  it('closes a connection its client already ended without writing to it', async () => {
    const [client, server] = duplexPair();
    const ended = new Promise<void>((done) => server.once('end', done));
    server.resume();
    client.end();
    await ended;
    // A socket that allows no half-open connection is no longer writable once its client ends.
    server.end();
    const errors: Error[] = [];
    server.on('error', (err) => errors.push(err));
    refuseConnection(server, { status: 503, message: 'not now' });
    await new Promise<void>((done) => (server.closed ? done() : server.once('close', done)));
    expect(errors).toEqual([]);
  });
});
