import { describe, expect, it, jest } from '@jest/globals';
import { request } from 'node:http';
import {
  connect as http2Connect,
  createServer as createHttp2Server,
  type ServerHttp2Stream,
} from 'node:http2';
import {
  connect as netConnect,
  createServer as createNetServer,
  type AddressInfo,
  type Socket,
} from 'node:net';
import { duplexPair, PassThrough, type Duplex } from 'node:stream';
import { refuseConnection } from '../kube/status.ts';
import { forwardUpgrade, LAST_WRITE_MS } from './upgrade.ts';

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
      const server = createHttp2Server();
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
