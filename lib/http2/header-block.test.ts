import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { connect, createServer, type Http2Server, type OutgoingHttpHeaders } from 'node:http2';
import { createServer as createHttp1Server, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { forwardOverHttp2 } from './forward.ts';
import {
  blockBound,
  FORWARDED_HEADER_LIMITS,
  FORWARDED_HTTP1_LIMITS,
  upgradeHeadTooLarge,
  headersTooLarge,
  HeadersTooLarge,
  MAX_SEND_HEADER_BLOCK_BYTES,
} from './header-block.ts';
import { newH2Pool } from './pool.ts';
import type { Request, Response } from './request.ts';

/** A request as the proxy forwards it for a user in `groups` groups of `length` bytes each. */
const impersonating = (groups: number, length: number): OutgoingHttpHeaders => ({
  ':method': 'GET',
  ':path': '/api/v1/namespaces/default/pods?limit=500',
  'impersonate-user': 'alice@example.com',
  'impersonate-group': Array.from({ length: groups }, (_, i) => `${i}`.padStart(length, 'g')),
});

/** The most groups of `length` bytes a request may carry within the bound. */
function mostGroups(length: number): number {
  let [lo, hi] = [0, MAX_SEND_HEADER_BLOCK_BYTES];
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (headersTooLarge(impersonating(mid, length))) hi = mid - 1;
    else lo = mid;
  }
  return lo;
}

let server: Http2Server;
let origin: string;

beforeAll(async () => {
  // As the agent's end of a tunnel takes forwarded requests.
  server = createServer({
    maxHeaderListPairs: FORWARDED_HEADER_LIMITS.maxHeaderListPairs,
    settings: { maxHeaderListSize: FORWARDED_HEADER_LIMITS.maxHeaderListSize },
  });
  server.on('stream', (stream, _headers, _flags, raw: string[]) => {
    let groups = 0;
    for (let i = 0; i < raw.length; i += 2) if (raw[i] === 'impersonate-group') groups++;
    stream.respond({ ':status': 200 });
    stream.end(String(groups));
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(() => void server.close());

/** Sends `headers` on a session of their own: what the server answered, or how the stream failed. */
function send(headers: OutgoingHttpHeaders): Promise<string> {
  const session = connect(origin);
  session.on('error', () => {});
  return new Promise<string>((done) => {
    const stream = session.request(headers);
    let body = '';
    stream.setEncoding('utf8');
    stream.on('data', (c: string) => (body += c));
    stream.on('frameError', () => done('not sent'));
    stream.on('error', (err: Error & { code?: string }) => done(err.message));
    stream.on('end', () => done(body));
  }).finally(() => session.destroy());
}

describe('the header block a request may send', () => {
  it.each([1, 40, 200])(
    'is sent whole, and taken, whenever the bound allows it (groups of %i bytes)',
    async (length) => {
      const most = mostGroups(length);
      // Within the bound, Node sends the block and a server set as the tunnel's takes every field.
      expect(await send(impersonating(most, length))).toBe(String(most));
      // Past it, Node would refuse to send it and close the session: the bound is never far above what is refused.
      expect(await send(impersonating(Math.ceil(most * 1.05) + 2, length))).toBe('not sent');
    },
  );

  it('holds a user in hundreds of groups, which a server with Node’s defaults refused past 128 fields', () => {
    expect(mostGroups(40)).toBeGreaterThan(800);
    expect(blockBound(impersonating(800, 40))).toBeLessThanOrEqual(MAX_SEND_HEADER_BLOCK_BYTES);
  });

  it('is refused with 431 before any stream opens, so the connection it would go on stays up', async () => {
    let sessions = 0;
    const counting = (): void => void sessions++;
    server.on('session', counting);
    const pool = newH2Pool(origin, {});
    try {
      const answered = (): Promise<string> =>
        new Promise((done, fail) => {
          const stream = pool.request({ ':path': '/' }, true);
          let body = '';
          stream.setEncoding('utf8');
          stream.on('data', (c: string) => (body += c));
          stream.on('end', () => done(body)).on('error', fail);
        });
      expect(await answered()).toBe('0');
      const failures: Error[] = [];
      const stream = forwardOverHttp2(
        { headers: {} } as unknown as Request,
        {} as Response,
        impersonating(5000, 1),
        {
          open: (h, endStream) => pool.request(h, endStream),
          fail: (err) => failures.push(err),
        },
      );
      expect(stream).toBeUndefined();
      expect(failures).toHaveLength(1);
      expect(failures[0]).toBeInstanceOf(HeadersTooLarge);
      expect((failures[0] as HeadersTooLarge).status).toBe(431);
      expect(failures[0]!.message).toMatch(
        /^the request's header fields, .* come to \d+ bytes .*, over 65536: /,
      );
      // The same connection serves the next request: nothing was sent that would have closed it.
      expect(await answered()).toBe('0');
      expect(sessions).toBe(1);
    } finally {
      pool.close();
      server.off('session', counting);
    }
  });
});

describe('the head of a forwarded upgrade', () => {
  it('is read whole by a server set as the agent’s and the peer port’s whenever the bound allows it', async () => {
    const http1 = createHttp1Server({ maxHeaderSize: FORWARDED_HTTP1_LIMITS.maxHeaderSize }, (req, res) => {
      res.end(String(req.rawHeaders.filter((f, i) => i % 2 === 0 && f === 'impersonate-group').length));
    });
    http1.maxHeadersCount = FORWARDED_HTTP1_LIMITS.maxHeadersCount;
    await new Promise<void>((done) => http1.listen(0, '127.0.0.1', done));
    const port = (http1.address() as AddressInfo).port;
    const get = (headers: OutgoingHttpHeaders): Promise<string> =>
      new Promise((done) => {
        const req = httpRequest({ host: '127.0.0.1', port, path: PATH, headers }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (body += c));
          res.on('end', () => done(res.statusCode === 200 ? body : `status ${res.statusCode}`));
        });
        req.on('error', (err) => done(err.message));
        req.end();
      });
    const PATH = '/api/v1/namespaces/default/pods/p/exec?command=sh&stdin=true';
    const fields = (n: number): OutgoingHttpHeaders => {
      const headers: OutgoingHttpHeaders = {
        ...impersonating(n, 1),
        connection: 'Upgrade',
        upgrade: 'websocket',
      };
      delete headers[':method'];
      delete headers[':path'];
      return headers;
    };
    try {
      let [lo, hi] = [0, FORWARDED_HTTP1_LIMITS.maxHeaderSize];
      while (lo < hi) {
        const mid = Math.ceil((lo + hi) / 2);
        if (upgradeHeadTooLarge('GET', PATH, fields(mid))) hi = mid - 1;
        else lo = mid;
      }
      // Ten thousand one-letter groups: every one read, none dropped (Node drops fields past 2,000 by default).
      expect(lo).toBeGreaterThan(10_000);
      expect(await get(fields(lo))).toBe(String(lo));
    } finally {
      http1.close();
    }
  });
});
