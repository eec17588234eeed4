import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer as createHttpServer, request } from 'node:http';
import {
  connect as http2Connect,
  constants,
  createServer as createH2Server,
  type ServerHttp2Stream,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import { PassThrough, type Duplex } from 'node:stream';
import { eventually } from '../../dev/eventually.ts';
import { newMemoryBudget } from './memory-budget.ts';
import { STREAM_WINDOW_BYTES } from './pool.ts';
import { forwardUpgrade } from './upgrade.ts';

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
