import { describe, expect, it } from '@jest/globals';
import { request } from 'node:http';
import { PassThrough } from 'node:stream';
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
