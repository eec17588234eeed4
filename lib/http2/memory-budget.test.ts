import { afterEach, describe, expect, it } from '@jest/globals';
import {
  connect,
  createServer,
  type ClientHttp2Session,
  type Http2Server,
  type ServerHttp2Stream,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import { PassThrough, Writable } from 'node:stream';
import { eventually } from '../../dev/eventually.ts';
import { STREAM_WINDOW_BYTES, UNCOUNTED_SESSION_MEMORY_MB } from './pool.ts';
import { H2Response } from './request.ts';
import { newMemoryBudget, relay } from './memory-budget.ts';

const KiB = 1024;

describe('the budget', () => {
  const stall = (user: string, log: string[], name = user) => ({
    user,
    bytes: 0,
    cut: () => void log.push(name),
  });

  it("cuts the user's answer left unread longest when their share is used up, and nobody else's", () => {
    const cut: string[] = [];
    const budget = newMemoryBudget({ perUserBytes: 300 * KiB, totalBytes: 10_000 * KiB });
    const [a1, a2, a3, b1] = [
      stall('a', cut, 'a1'),
      stall('a', cut, 'a2'),
      stall('a', cut, 'a3'),
      stall('b', cut),
    ];
    budget.charge(a1, 100 * KiB);
    budget.charge(b1, 250 * KiB);
    budget.charge(a2, 100 * KiB);
    budget.charge(a3, 100 * KiB);
    expect(cut).toEqual([]);
    // a1 charged again (it stalled again): it is now the most recently stalled.
    budget.charge(a1, 100 * KiB);
    budget.charge(stall('a', cut, 'a4'), 100 * KiB);
    expect(cut).toEqual(['a2']);
    expect(budget.held('a')).toBe(300 * KiB);
    expect(budget.held('b')).toBe(250 * KiB);
    expect(budget.cuts()).toBe(1);
  });

  it('cuts the answers of whoever holds most when the process is over its total', () => {
    const cut: string[] = [];
    const budget = newMemoryBudget({ perUserBytes: 500 * KiB, totalBytes: 600 * KiB });
    budget.charge(stall('big', cut, 'big1'), 200 * KiB);
    budget.charge(stall('big', cut, 'big2'), 200 * KiB);
    budget.charge(stall('small', cut), 100 * KiB);
    budget.charge(stall('new', cut), 150 * KiB);
    expect(cut).toEqual(['big1']);
    expect(budget.held()).toBe(450 * KiB);
  });

  it('drops a charge once its answer is read, and cuts an answer larger than a share at once', () => {
    const cut: string[] = [];
    const budget = newMemoryBudget({ perUserBytes: 100 * KiB, totalBytes: 1000 * KiB });
    const s = stall('a', cut);
    budget.charge(s, 80 * KiB);
    budget.discharge(s);
    expect(budget.held()).toBe(0);
    budget.charge(stall('a', cut, 'huge'), 200 * KiB);
    expect(cut).toEqual(['huge']);
    expect(budget.held()).toBe(0);
  });
});

describe('relaying to a client that left', () => {
  it('charges nothing: the response closed before the answer stalled on it', () => {
    const budget = newMemoryBudget({ perUserBytes: 1024 * KiB, totalBytes: 4096 * KiB });
    // An HTTP/1.1 response whose client dropped: destroyed, its 'close' emitted, every write refused.
    const gone = new Writable({ write: (_chunk, _encoding, next) => next() });
    gone.destroy();
    const answer = new PassThrough();
    relay(answer, gone, { account: { budget, user: 'pat' } });
    answer.write(Buffer.alloc(64 * KiB));
    expect(budget.held()).toBe(0);
  });
});

describe('relaying to a reader that catches up', () => {
  it('drops the charge once all is taken, though nothing more comes (an idle shell after a burst)', async () => {
    const budget = newMemoryBudget({ perUserBytes: 1024 * KiB, totalBytes: 4096 * KiB });
    const from = new PassThrough();
    // A reader that takes nothing until told to.
    let take: (() => void) | undefined;
    const to = new Writable({ highWaterMark: KiB, write: (_chunk, _encoding, next) => void (take = next) });
    relay(from, to, { account: { budget, user: 'pat' } });
    from.write(Buffer.alloc(4 * KiB));
    // A socket's relay is charged what waits to be written (its source holds what it read, here nothing).
    await eventually(() => expect(budget.held('pat')).toBe(4 * KiB));
    take!();
    await eventually(() => expect(budget.held('pat')).toBe(0));
    from.destroy();
    to.destroy();
  });
});

describe('relaying answers a client leaves unread', () => {
  const closers: (() => void)[] = [];
  afterEach(() => {
    for (const close of closers.splice(0)) close();
  });

  const listen = async (server: Http2Server): Promise<number> => {
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    closers.push(() => server.close());
    return (server.address() as AddressInfo).port;
  };
  const session = (port: number, windowBytes?: number): ClientHttp2Session => {
    const s = connect(`http://127.0.0.1:${port}`, {
      settings:
        windowBytes === undefined
          ? { initialWindowSize: STREAM_WINDOW_BYTES }
          : { initialWindowSize: windowBytes },
    });
    s.on('error', () => {});
    closers.push(() => s.destroy());
    return s;
  };

  it("holds no more than the user's share however many answers they leave unread, and serves others", async () => {
    // The upstream: 2 MiB for every request, far more than a stream window.
    // (Node's default limit on a session's memory would refuse streams once a few bodies are queued.)
    const upstream = createServer({ maxSessionMemory: UNCOUNTED_SESSION_MEMORY_MB });
    upstream.on('stream', (stream: ServerHttp2Stream) => {
      stream.on('error', () => {});
      stream.respond({ ':status': 200 });
      stream.end(Buffer.alloc(2 << 20, 'u'));
    });
    const toUpstream = session(await listen(upstream));
    const share = 4 << 20;
    const budget = newMemoryBudget({ perUserBytes: share, totalBytes: 64 << 20 });
    // The hop under test: each request relayed to the upstream, charged to the user its path names.
    const hop = createServer();
    hop.on('stream', (stream: ServerHttp2Stream, headers) => {
      stream.on('error', () => {});
      const res = new H2Response(stream);
      const up = toUpstream.request({ ':path': '/' });
      up.on('error', () => {});
      up.on('response', () => {
        res.writeHead(200);
        relay(up, res, { account: { budget, user: String(headers[':path']) } });
      });
      stream.on('close', () => up.close());
    });
    const port = await listen(hop);

    // A client that never reads: its window is zero.
    const attacker = session(port, 0);
    const cutsSeen: number[] = [];
    for (let i = 0; i < 60; i++) {
      const s = attacker.request({ ':path': '/mallory' });
      s.on('error', () => {});
      s.on('close', () => cutsSeen.push(i));
    }
    await eventually(() => expect(budget.cuts()).toBeGreaterThan(30));
    expect(budget.held('/mallory')).toBeLessThanOrEqual(share);
    expect(budget.held()).toBe(budget.held('/mallory'));

    // Another user reads all of their answer meanwhile.
    const reader = session(port);
    const got = await new Promise<number>((done, fail) => {
      let bytes = 0;
      const s = reader.request({ ':path': '/pat' });
      s.on('data', (chunk: Buffer) => (bytes += chunk.length));
      s.on('end', () => done(bytes));
      s.on('error', fail);
    });
    expect(got).toBe(2 << 20);
    expect(budget.held('/pat')).toBe(0);
    expect(cutsSeen.length).toBe(budget.cuts());
  });
});
