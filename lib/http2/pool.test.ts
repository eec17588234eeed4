import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, type Http2Server, type ServerHttp2Stream } from 'node:http2';
import type { AddressInfo } from 'node:net';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { eventually } from '../../dev/eventually.ts';
import { callOverHttp2, CallFailed } from './forward.ts';
import { newH2Pool, type H2Pool } from './pool.ts';

/** A cleartext HTTP/2 server that answers what `answer` says, or holds the stream open when it says nothing. */
async function serve(
  answer: (stream: ServerHttp2Stream) => void,
): Promise<{ server: Http2Server; origin: string }> {
  const server = createServer();
  server.on('stream', (stream) => {
    // A connection the pool drops resets what it held: nothing to do here.
    stream.on('error', () => {});
    answer(stream);
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return { server, origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}` };
}

const PING_INTERVAL_MS = 30_000;
const PING_TIMEOUT_MS = 15_000;

describe('newH2Pool on an injected clock', () => {
  let pool: H2Pool | undefined;
  let server: Http2Server | undefined;
  afterEach(async () => {
    pool?.close();
    pool = undefined;
    await new Promise((done) => (server ? server.close(done) : done(undefined)));
    server = undefined;
  });

  it('drops a busy connection whose ping goes unanswered past the deadline, failing the streams on it', async () => {
    let origin: string;
    ({ server, origin } = await serve(() => {}));
    const clock = fakeClock();
    pool = newH2Pool(origin, {}, { clock });
    const stream = pool.request({ ':method': 'GET', ':path': '/watch' }, true);
    const closed = new Promise<number>((done) => stream.on('close', () => done(stream.rstCode)));
    stream.on('error', () => {});
    await new Promise((done) => stream.once('ready', done));
    expect(clock.pending()).toEqual([PING_INTERVAL_MS]);
    // The ping goes out; its answer needs the event loop, which the deadline, moved at once, does not wait for.
    clock.advance(PING_INTERVAL_MS);
    expect(clock.pending().sort()).toEqual([PING_TIMEOUT_MS, PING_INTERVAL_MS].sort());
    clock.advance(PING_TIMEOUT_MS);
    await closed;
    // A new request opens a new connection.
    const next = pool.request({ ':method': 'GET', ':path': '/again' }, true);
    next.on('error', () => {});
    await new Promise((done) => next.once('ready', done));
    expect(next.session).not.toBe(stream.session);
  });

  it('keeps a busy connection whose ping is answered, and pings it again at the next interval', async () => {
    let origin: string;
    ({ server, origin } = await serve(() => {}));
    const clock = fakeClock();
    pool = newH2Pool(origin, {}, { clock });
    const stream = pool.request({ ':method': 'GET', ':path': '/watch' }, true);
    stream.on('error', () => {});
    await new Promise((done) => stream.once('ready', done));
    clock.advance(PING_INTERVAL_MS);
    // The answer clears the deadline: only the next interval's timer is left.
    await eventually(() => expect(clock.pending()).toEqual([PING_INTERVAL_MS]));
    clock.advance(PING_TIMEOUT_MS);
    expect(stream.closed).toBe(false);
    expect(pool.request({ ':method': 'GET', ':path': '/more' }, true).session).toBe(stream.session);
  });
});

describe('callOverHttp2 on an injected clock', () => {
  let pool: H2Pool | undefined;
  let server: Http2Server | undefined;
  afterEach(async () => {
    pool?.close();
    pool = undefined;
    await new Promise((done) => (server ? server.close(done) : done(undefined)));
    server = undefined;
  });

  it('fails a call that has no answer when its clock reaches the timeout, and cancels its stream', async () => {
    const served: ServerHttp2Stream[] = [];
    let origin: string;
    ({ server, origin } = await serve((stream) => void served.push(stream)));
    const clock = fakeClock();
    pool = newH2Pool(origin, {}, { clock });
    const call = callOverHttp2(
      (h, endStream) => pool!.request(h, endStream),
      { ':method': 'GET', ':path': '/slow' },
      undefined,
      { timeoutMs: 10_000, maxBytes: 1024, clock },
    );
    await eventually(() => expect(served).toHaveLength(1));
    clock.advance(9_999);
    clock.advance(1);
    await expect(call).rejects.toThrow(CallFailed);
    await expect(call).rejects.toThrow('no answer within 10000 ms');
    await eventually(() => expect(served[0]!.closed).toBe(true));
  });

  it('answers a call before its timeout and leaves no timer behind', async () => {
    let origin: string;
    ({ server, origin } = await serve((stream) => {
      stream.respond({ ':status': 200 });
      stream.end('{"ok":true}');
    }));
    const clock = fakeClock();
    pool = newH2Pool(origin, {}, { clock });
    const answer = await callOverHttp2(
      (h, endStream) => pool!.request(h, endStream),
      { ':method': 'GET', ':path': '/fast' },
      undefined,
      { timeoutMs: 10_000, maxBytes: 1024, clock },
    );
    expect(answer.status).toBe(200);
    expect(answer.body.toString()).toBe('{"ok":true}');
    // Only the pool's ping interval is armed: the call's deadline went with its answer.
    expect(clock.pending()).toEqual([PING_INTERVAL_MS]);
  });
});
