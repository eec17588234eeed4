import { afterEach, describe, expect, it } from '@jest/globals';
import {
  connect,
  createServer,
  type ClientHttp2Session,
  type Http2Session,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from 'node:http2';
import { connect as connectTcp, createServer as createTcpServer, type AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { eventually } from '../../dev/eventually.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { newMemoryBudget, relay } from './memory-budget.ts';
import { MAX_STREAM_WINDOW_BYTES, sizeWindows, STREAM_WINDOW_BYTES, windowOf } from './window.ts';

/** A session whose pings and SETTINGS the test answers: `answerPing(err?)`, `ackSettings()`. */
function scriptedSession() {
  const pings: ((err: Error | null) => void)[] = [];
  const settings: { initialWindowSize: number; ack: () => void }[] = [];
  const session = {
    destroyed: false,
    connecting: false,
    ping(cb: (err: Error | null) => void) {
      pings.push(cb);
      return true;
    },
    settings(s: { initialWindowSize: number }, ack: () => void) {
      settings.push({ initialWindowSize: s.initialWindowSize, ack });
    },
  };
  return {
    session: session as unknown as Http2Session,
    pings,
    settings,
    answerPing: (err: Error | null = null) => pings.shift()!(err),
  };
}

describe('sizing stream windows to the path', () => {
  it('doubles the window when a round trip brings in two thirds of it, up to the most, and tells the peer', () => {
    const s = scriptedSession();
    const window = sizeWindows(s.session, { clock: fakeClock() });
    const recharged: number[] = [];
    window.onGrow(() => recharged.push(window.bytes));
    expect(window.bytes).toBe(STREAM_WINDOW_BYTES);

    // One ping per round trip, however many chunks come meanwhile.
    window.received(64 * 1024);
    window.received(64 * 1024);
    expect(s.pings).toHaveLength(1);
    // 128 KiB in a round trip: half the window, the sender was not held back.
    s.answerPing();
    expect(s.settings).toEqual([]);

    window.received(100 * 1024);
    window.received(100 * 1024);
    s.answerPing();
    // 200 KiB of 256: the window doubles, charged before the peer hears of it.
    expect(window.bytes).toBe(2 * STREAM_WINDOW_BYTES);
    expect(recharged).toEqual([2 * STREAM_WINDOW_BYTES]);
    expect(s.settings.map((x) => x.initialWindowSize)).toEqual([2 * STREAM_WINDOW_BYTES]);

    // No other change until the peer has acknowledged it.
    window.received(1 << 20);
    s.answerPing();
    expect(s.settings).toHaveLength(1);
    s.settings[0]!.ack();
    for (let i = 0; i < 10; i++) {
      window.received(MAX_STREAM_WINDOW_BYTES);
      s.answerPing();
      s.settings.at(-1)!.ack();
    }
    expect(window.bytes).toBe(MAX_STREAM_WINDOW_BYTES);
    expect(s.settings.at(-1)!.initialWindowSize).toBe(MAX_STREAM_WINDOW_BYTES);
  });

  it('goes back to the first window after a quiet second, counting the larger one until the peer acknowledges', () => {
    const s = scriptedSession();
    const clock = fakeClock();
    const window = sizeWindows(s.session, { clock });
    window.received(STREAM_WINDOW_BYTES);
    s.answerPing();
    s.settings[0]!.ack();
    expect(window.bytes).toBe(2 * STREAM_WINDOW_BYTES);

    clock.advance(500);
    window.received(1);
    s.answerPing();
    expect(s.settings).toHaveLength(1);
    clock.advance(1000);
    window.received(1);
    expect(s.settings.at(-1)!.initialWindowSize).toBe(STREAM_WINDOW_BYTES);
    expect(window.bytes).toBe(2 * STREAM_WINDOW_BYTES);
    s.settings.at(-1)!.ack();
    expect(window.bytes).toBe(STREAM_WINDOW_BYTES);
  });

  it('grows nothing on a round trip during which a relay stalled (its reader did not keep up)', () => {
    const s = scriptedSession();
    const window = sizeWindows(s.session, { clock: fakeClock() });
    window.received(STREAM_WINDOW_BYTES);
    window.stalled();
    s.answerPing();
    expect(s.settings).toEqual([]);
    // The next round, read throughout, grows it.
    window.received(STREAM_WINDOW_BYTES);
    s.answerPing();
    expect(s.settings.map((x) => x.initialWindowSize)).toEqual([2 * STREAM_WINDOW_BYTES]);
  });

  it('neither counts nor grows when a ping fails', () => {
    const s = scriptedSession();
    const window = sizeWindows(s.session, { clock: fakeClock() });
    window.received(STREAM_WINDOW_BYTES);
    s.answerPing(new Error('gone'));
    expect(s.settings).toEqual([]);
    expect(window.bytes).toBe(STREAM_WINDOW_BYTES);
  });
});

describe('a grown window and the memory budget', () => {
  const closers: (() => void)[] = [];
  afterEach(() => {
    for (const close of closers.splice(0)) close();
  });

  /** A TCP hop to `port` that passes each chunk on `ms` later, both ways: a path with a round trip of 2 × `ms`. */
  async function slowPath(port: number, ms: number): Promise<number> {
    const hop = createTcpServer((a) => {
      const b = connectTcp(port, '127.0.0.1');
      for (const [from, to] of [
        [a, b],
        [b, a],
      ] as const) {
        from.on('data', (chunk: Buffer) => void setTimeout(() => to.destroyed || to.write(chunk), ms));
        from.on('error', () => to.destroy());
        from.on('close', () => setTimeout(() => to.destroy(), ms));
      }
    });
    await new Promise<void>((done) => hop.listen(0, '127.0.0.1', done));
    closers.push(() => hop.close());
    return (hop.address() as AddressInfo).port;
  }

  /** A client session to a server that sizes its windows; `onStream` gets the server's streams. */
  async function pair(onStream: (stream: ServerHttp2Stream) => void, delayMs?: number) {
    const server = createServer({ settings: { initialWindowSize: STREAM_WINDOW_BYTES } });
    const sessions: ServerHttp2Session[] = [];
    server.on('session', (session: ServerHttp2Session) => {
      // As every connection Sealion opens: a connection's window with room for a grown stream window.
      session.once('connect', () => session.setLocalWindowSize(16 << 20));
      sizeWindows(session);
      sessions.push(session);
    });
    server.on('stream', onStream);
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    let port = (server.address() as AddressInfo).port;
    if (delayMs !== undefined) port = await slowPath(port, delayMs);
    const client: ClientHttp2Session = connect(`http://127.0.0.1:${port}`);
    client.on('error', () => {});
    closers.push(() => {
      client.destroy();
      server.close();
    });
    return { client, sessions };
  }

  /** A sink that takes nothing: every relay into it stalls at once. */
  const stuck = (): Writable => new Writable({ highWaterMark: 1, write: () => {} }).on('error', () => {});

  it('charges a stalled relay the grown window before the peer may send it, and cuts what goes over a share', async () => {
    // A share of 16 windows: the windows may grow to 4 (a quarter of it).
    const budget = newMemoryBudget({ perUserBytes: 16 * STREAM_WINDOW_BYTES, totalBytes: 64 << 20 });
    const cut: number[] = [];
    const { client, sessions } = await pair((stream) => {
      stream.on('error', () => {});
      relay(stream, stuck(), { account: { budget, user: 'pat' }, cut: () => void cut.push(stream.id!) });
    });
    for (let i = 0; i < 8; i++) {
      const s = client.request({ ':method': 'POST', ':path': '/' });
      s.on('error', () => {});
      s.write(Buffer.alloc(1024));
    }
    // Each charged its window and the chunk that waits to be written.
    await eventually(() => expect(budget.held('pat')).toBe(8 * (STREAM_WINDOW_BYTES + 1024)));

    // Another stream of the connection is read fast: a round trip brings in a whole window, and it grows.
    const window = windowOf(sessions[0])!;
    window.received(STREAM_WINDOW_BYTES);
    await eventually(() => expect(window.bytes).toBe(2 * STREAM_WINDOW_BYTES));
    // Each stalled relay is now charged the grown window: eight would be over the share, so one goes.
    expect(cut).toHaveLength(1);
    expect(budget.held('pat')).toBe(7 * (2 * STREAM_WINDOW_BYTES + 1024));
    await eventually(() => expect(client.remoteSettings.initialWindowSize).toBe(2 * STREAM_WINDOW_BYTES));
  });

  it('grows on a path with a round trip while one stream is read as fast as it comes, and carries every byte', async () => {
    let got = 0;
    const { client, sessions } = await pair((stream) => {
      stream.on('error', () => {});
      relay(
        stream,
        new Writable({ write: (chunk: Buffer, _e, done) => void ((got += chunk.length), done()) }),
      );
      stream.on('end', () => stream.respond({ ':status': 200 }, { endStream: true }));
    }, 5);
    const total = 16 << 20;
    const s = client.request({ ':method': 'POST', ':path': '/' });
    s.on('error', () => {});
    const piece = Buffer.alloc(1 << 20);
    for (let sent = 0; sent < total; sent += piece.length) {
      if (!s.write(piece)) await new Promise((done) => s.once('drain', done));
    }
    s.end();
    await new Promise((done) => s.once('response', done));
    expect(got).toBe(total);
    expect(windowOf(sessions[0])!.bytes).toBeGreaterThan(STREAM_WINDOW_BYTES);
    expect(client.remoteSettings.initialWindowSize).toBeGreaterThan(STREAM_WINDOW_BYTES);
  });
});
