import { afterEach, describe, expect, it } from '@jest/globals';
import { once } from 'node:events';
import { createServer, connect, type AddressInfo, type Server, type Socket } from 'node:net';
import { constants, createDeflate, deflateSync, type Deflate } from 'node:zlib';
import { WebSocket, WebSocketServer } from 'ws';
import { SPDY3_DICTIONARY } from './spdy-dictionary.ts';
import { LIMITS, newStreamDecoder, type Channel, type StreamDecoder } from './terminal-streams.ts';

type Event = [Channel, string];
type Side = 'client' | 'server';
type Step = [Side, Buffer];

/**
 * A decoder and what it reported: `events()` as text, each streamed channel's adjacent pieces joined, of the
 * channels `only` admits (default: all).
 */
function decoding(
  upgrade: string,
  protocol: string,
): { decoder: StreamDecoder; events: (only?: (channel: Channel) => boolean) => Event[] } {
  const reported: [Channel, Buffer][] = [];
  const decoder = newStreamDecoder(
    { upgrade, protocol },
    { data: (channel, bytes) => reported.push([channel, Buffer.from(bytes)]) },
  );
  if (!decoder) throw new Error(`no decoder for ${upgrade} ${protocol}`);
  return { decoder, events: (only = () => true) => joined(reported.filter(([channel]) => only(channel))) };
}

/**
 * Adjacent pieces of one streamed channel joined, before they are read as UTF-8: how a stream is cut into pieces is
 * the chunks' doing, not the sender's, and a cut may fall inside a character.
 */
function joined(reported: [Channel, Buffer][]): Event[] {
  const out: [Channel, Buffer][] = [];
  for (const [channel, bytes] of reported) {
    const prev = out.at(-1);
    if (prev && prev[0] === channel && ['stdin', 'stdout', 'stderr'].includes(channel))
      prev[1] = Buffer.concat([prev[1], bytes]);
    else out.push([channel, bytes]);
  }
  return out.map(([channel, bytes]) => [channel, bytes.toString('utf8')]);
}

/** Feeds each side's bytes cut into chunks at `cuts` (offsets into that side's concatenated bytes). */
function feed(
  decoder: StreamDecoder,
  steps: Step[],
  cuts: (side: Side, length: number) => number[] = () => [],
) {
  for (const side of ['client', 'server'] as const) {
    const bytes = Buffer.concat(steps.filter(([s]) => s === side).map(([, b]) => b));
    let from = 0;
    for (const cut of [...cuts(side, bytes.length), bytes.length]) {
      const chunk = bytes.subarray(from, cut);
      if (side === 'client') decoder.fromClient(chunk);
      else decoder.fromServer(chunk);
      from = cut;
    }
  }
}

// ---- WebSocket frames, built by hand (RFC 6455 5.2) ----

let maskSeed = 0;

function wsFrame(
  opcode: number,
  payload: Buffer | string,
  opts: { fin?: boolean; masked?: boolean; rsv1?: boolean; length?: number } = {},
): Buffer {
  const data = Buffer.from(payload);
  const length = opts.length ?? data.length;
  const b0 = ((opts.fin ?? true) ? 0x80 : 0) | (opts.rsv1 ? 0x40 : 0) | opcode;
  const maskBit = opts.masked ? 0x80 : 0;
  let head: Buffer;
  if (length < 126) head = Buffer.from([b0, maskBit | length]);
  else if (length < 65536) {
    head = Buffer.from([b0, maskBit | 126, 0, 0]);
    head.writeUInt16BE(length, 2);
  } else {
    head = Buffer.from([b0, maskBit | 127, 0, 0, 0, 0, 0, 0, 0, 0]);
    head.writeUInt32BE(Math.floor(length / 2 ** 32), 2);
    head.writeUInt32BE(length % 2 ** 32, 6);
  }
  if (!opts.masked) return Buffer.concat([head, data]);
  // A different mask per frame, none of them zero, so that unmasking is really exercised.
  const mask = Buffer.from([0x9d, 0x3a, 0x51, 0xe7].map((b) => ((b + maskSeed++ * 37) & 0xff) | 1));
  return Buffer.concat([head, mask, Buffer.from(data.map((b, i) => b ^ mask[i & 3]!))]);
}

const BINARY = 0x2;
const TEXT = 0x1;
const CONTINUATION = 0x0;
const CLOSE = 0x8;
const PING = 0x9;
const PONG = 0xa;

/** One whole binary channel message: the server's unmasked, the client's masked. */
function message(side: Side, channel: number, data: Buffer | string): Step {
  return [
    side,
    wsFrame(BINARY, Buffer.concat([Buffer.from([channel]), Buffer.from(data)]), {
      masked: side === 'client',
    }),
  ];
}

const STATUS_SUCCESS = '{"metadata":{},"status":"Success"}';

/** A v5 session: sizes and input from the client, output, a Status and control frames from the server. */
function v5Session(): { steps: Step[]; want: Event[] } {
  const steps: Step[] = [
    message('client', 4, '{"Width":80,"Height":24}'),
    message('server', 1, 'sh-5.2$ '),
    message('client', 0, 'ls -l\n'),
    ['client', wsFrame(PING, 'hb', { masked: true })],
    ['server', wsFrame(PONG, 'hb')],
    message('server', 1, 'total 0\r\n'),
    message('server', 2, 'ls: warning\n'),
    message('client', 4, '{"Width":132,"Height":43}'),
    // v5's close of stdin: no terminal content.
    ['client', wsFrame(BINARY, Buffer.from([255, 0]), { masked: true })],
    message('server', 3, STATUS_SUCCESS),
    ['server', wsFrame(CLOSE, Buffer.from([0x03, 0xe8]))],
    ['client', wsFrame(CLOSE, Buffer.from([0x03, 0xe8]), { masked: true })],
  ];
  // Fed client side first, then the server's (feed()): each side's order is what counts.
  const want: Event[] = [
    ['resize', '{"Width":80,"Height":24}'],
    ['stdin', 'ls -l\n'],
    ['resize', '{"Width":132,"Height":43}'],
    ['stdout', 'sh-5.2$ total 0\r\n'],
    ['stderr', 'ls: warning\n'],
    ['error', STATUS_SUCCESS],
  ];
  return { steps, want };
}

describe('newStreamDecoder', () => {
  it.each([
    ['websocket', 'v5.channel.k8s.io'],
    ['WebSocket', 'v4.channel.k8s.io'],
    ['websocket', 'v3.channel.k8s.io'],
    ['websocket', 'v2.channel.k8s.io'],
    ['websocket', 'channel.k8s.io'],
    ['websocket', ''],
    ['websocket', 'v4.base64.channel.k8s.io'],
    ['websocket', 'base64.channel.k8s.io'],
    ['SPDY/3.1', 'v4.channel.k8s.io'],
    ['spdy/3.1', 'channel.k8s.io'],
    ['SPDY/3.1', ''],
  ])('decodes %s with %j', (upgrade, protocol) => {
    expect(newStreamDecoder({ upgrade, protocol }, { data: () => {} })).toBeDefined();
  });

  it.each([
    ['websocket', 'v5.base64.channel.k8s.io'],
    ['websocket', 'portforward.k8s.io'],
    ['websocket', 'v6.channel.k8s.io'],
    ['SPDY/3.1', 'portforward.k8s.io'],
    ['SPDY/3.1', 'v5.channel.k8s.io'],
    ['SPDY/3', 'v4.channel.k8s.io'],
    ['h2c', 'v4.channel.k8s.io'],
  ])('declines %s with %j', (upgrade, protocol) => {
    expect(newStreamDecoder({ upgrade, protocol }, { data: () => {} })).toBeUndefined();
  });
});

describe('the WebSocket decoder', () => {
  it('reports each side’s channels in order, and skips control frames and v5’s close-channel message', () => {
    const { steps, want } = v5Session();
    const { decoder, events } = decoding('websocket', 'v5.channel.k8s.io');
    feed(decoder, steps);
    expect(events()).toEqual(want);
    expect(decoder.failure).toBeUndefined();
  });

  it('reports the same whatever byte each side’s bytes are cut at', () => {
    const { steps, want } = v5Session();
    const lengths = { client: 0, server: 0 };
    for (const [side, bytes] of steps) lengths[side] += bytes.length;
    for (const side of ['client', 'server'] as const) {
      for (let cut = 1; cut < lengths[side]; cut++) {
        const { decoder, events } = decoding('websocket', 'v5.channel.k8s.io');
        feed(decoder, steps, (s) => (s === side ? [cut] : []));
        expect({ side, cut, events: events() }).toEqual({ side, cut, events: want });
      }
    }
  });

  it('reports the same when every byte comes alone', () => {
    const { steps, want } = v5Session();
    const { decoder, events } = decoding('websocket', 'v5.channel.k8s.io');
    feed(decoder, steps, (_side, length) => Array.from({ length: length - 1 }, (_, i) => i + 1));
    expect(events()).toEqual(want);
  });

  it('reads a fragmented message’s channel from its first byte, with control frames between the fragments', () => {
    const { decoder, events } = decoding('websocket', 'v4.channel.k8s.io');
    feed(decoder, [
      // The first fragment empty: the channel is the message's first byte, in the second.
      ['server', wsFrame(BINARY, '', { fin: false })],
      ['server', wsFrame(CONTINUATION, Buffer.from([1, 0x68, 0x65]), { fin: false })],
      ['server', wsFrame(PING, 'x')],
      // A continuation's first byte is data, not a channel.
      ['server', wsFrame(CONTINUATION, Buffer.from([2, 0x6c, 0x6c, 0x6f]))],
      ['client', wsFrame(BINARY, Buffer.from([0, 0x61]), { masked: true, fin: false })],
      ['client', wsFrame(PONG, 'x', { masked: true })],
      ['client', wsFrame(CONTINUATION, 'bc', { masked: true, fin: false })],
      ['client', wsFrame(CONTINUATION, '\n', { masked: true })],
    ]);
    expect(events()).toEqual([
      ['stdin', 'abc\n'],
      ['stdout', 'he\x02llo'],
    ]);
  });

  it('reads 16- and 64-bit lengths, and holds an error message whole up to its cap', () => {
    const medium = 'm'.repeat(300);
    const large = 'L'.repeat(70_000);
    const huge = 'E'.repeat(LIMITS.MAX_HELD_BYTES + 10);
    const { decoder, events } = decoding('websocket', 'v4.channel.k8s.io');
    feed(
      decoder,
      [
        message('server', 1, medium),
        message('server', 2, large),
        message('server', 3, huge),
        message('client', 0, large),
      ],
      (_side, length) => [3, 5000, length - 7],
    );
    expect(events()).toEqual([
      ['stdin', large],
      ['stdout', medium],
      ['stderr', large],
      ['error', huge.slice(0, LIMITS.MAX_HELD_BYTES)],
    ]);
  });

  it('drops a channel sent the wrong way (stdout from the client, stdin from the server) and unknown channels', () => {
    const { decoder, events } = decoding('websocket', 'v4.channel.k8s.io');
    feed(decoder, [
      message('client', 1, 'not output'),
      message('client', 3, 'not an error'),
      message('server', 0, 'not input'),
      message('server', 4, '{"Width":1,"Height":1}'),
      message('server', 9, 'channel nine'),
      message('server', 255, 'v4 has no close'),
      message('server', 1, 'out'),
    ]);
    expect(events()).toEqual([['stdout', 'out']]);
  });

  it('decodes the base64 protocols: text messages, the channel a digit, base64 cut anywhere across fragments', () => {
    const { decoder, events } = decoding('websocket', 'v4.base64.channel.k8s.io');
    const out = `1${Buffer.from('héllo wörld\r\n').toString('base64')}`;
    feed(decoder, [
      ['server', wsFrame(TEXT, out.slice(0, 4), { fin: false })],
      ['server', wsFrame(CONTINUATION, out.slice(4, 11), { fin: false })],
      ['server', wsFrame(CONTINUATION, out.slice(11))],
      ['server', wsFrame(TEXT, `3${Buffer.from(STATUS_SUCCESS).toString('base64')}`)],
      ['client', wsFrame(TEXT, `0${Buffer.from('exit\n').toString('base64')}`, { masked: true })],
      [
        'client',
        wsFrame(TEXT, `4${Buffer.from('{"Width":80,"Height":24}').toString('base64')}`, { masked: true }),
      ],
    ]);
    expect(events()).toEqual([
      ['stdin', 'exit\n'],
      ['resize', '{"Width":80,"Height":24}'],
      ['stdout', 'héllo wörld\r\n'],
      ['error', STATUS_SUCCESS],
    ]);
  });

  it.each([
    {
      name: 'a compressed frame (RSV1: permessage-deflate)',
      bytes: wsFrame(BINARY, 'xx', { rsv1: true }),
      failure: /reserved bits/,
    },
    {
      name: 'a frame longer than the limit, failed on its header alone',
      bytes: wsFrame(BINARY, '', { length: LIMITS.MAX_FRAME_BYTES + 1 }).subarray(0, 10),
      failure: /longer than 16777216/,
    },
    {
      name: 'a 64-bit length past 2^53',
      bytes: Buffer.from([0x82, 127, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]),
      failure: /longer than/,
    },
    { name: 'a continuation with no message', bytes: wsFrame(CONTINUATION, 'x'), failure: /no message/ },
    {
      name: 'a new message inside a fragmented one',
      bytes: Buffer.concat([wsFrame(BINARY, '\x01a', { fin: false }), wsFrame(BINARY, '\x01b')]),
      failure: /before the last one ended/,
    },
    {
      name: 'a fragmented control frame',
      bytes: wsFrame(PING, 'x', { fin: false }),
      failure: /control frame/,
    },
    { name: 'a reserved opcode', bytes: wsFrame(0x3, 'x'), failure: /reserved opcode 3/ },
  ])('fails on $name, and then reads nothing more', ({ bytes, failure }) => {
    const { decoder, events } = decoding('websocket', 'v5.channel.k8s.io');
    decoder.fromServer(bytes);
    expect(decoder.failure).toMatch(failure);
    const before = events();
    decoder.fromServer(message('server', 1, 'after')[1]);
    decoder.fromClient(message('client', 0, 'after')[1]);
    expect(events()).toEqual(before);
  });

  it('fails instead of throwing when the events throw', () => {
    const decoder = newStreamDecoder(
      { upgrade: 'websocket', protocol: 'v5.channel.k8s.io' },
      {
        data: () => {
          throw new Error('disk on fire');
        },
      },
    )!;
    expect(() => decoder.fromServer(message('server', 1, 'x')[1])).not.toThrow();
    expect(decoder.failure).toBe('events: disk on fire');
  });

  describe('between real ws peers', () => {
    const closers: (() => Promise<unknown>)[] = [];
    afterEach(async () => {
      for (const close of closers.splice(0).reverse()) await close();
    });

    /** A TCP relay that hands the decoder each side's bytes after its HTTP head, as the proxy's splice would. */
    async function relay(target: number, decoder: StreamDecoder): Promise<number> {
      const afterHead = (read: (chunk: Buffer) => void): ((chunk: Buffer) => void) => {
        let head: Buffer | undefined = Buffer.alloc(0);
        return (chunk) => {
          if (!head) return read(chunk);
          head = Buffer.concat([head, chunk]);
          const end = head.indexOf('\r\n\r\n');
          if (end < 0) return;
          const rest = head.subarray(end + 4);
          head = undefined;
          if (rest.length > 0) read(rest);
        };
      };
      const sockets: Socket[] = [];
      const server: Server = createServer((client) => {
        const upstream = connect(target, '127.0.0.1');
        sockets.push(client, upstream);
        client.on(
          'data',
          afterHead((c) => decoder.fromClient(c)),
        );
        upstream.on(
          'data',
          afterHead((c) => decoder.fromServer(c)),
        );
        client.pipe(upstream).pipe(client);
        client.on('error', () => upstream.destroy());
        upstream.on('error', () => client.destroy());
      });
      server.listen(0, '127.0.0.1');
      await once(server, 'listening');
      closers.push(async () => {
        for (const s of sockets) s.destroy();
        server.close();
      });
      return (server.address() as AddressInfo).port;
    }

    it('decodes a v5 session between a ws client and a ws server, fragments, pings and 64-bit lengths included', async () => {
      const wss = new WebSocketServer({
        port: 0,
        host: '127.0.0.1',
        perMessageDeflate: false,
        handleProtocols: () => 'v5.channel.k8s.io',
      });
      await once(wss, 'listening');
      closers.push(() => new Promise((resolve) => wss.close(resolve)));
      const large = Buffer.alloc(70_000, 'x');
      const serverDone = new Promise<void>((resolve) => {
        wss.on('connection', (ws) => {
          ws.send(Buffer.concat([Buffer.from([1]), Buffer.from('$ ')]));
          ws.on('message', (data: Buffer) => {
            if (data[0] !== 255) return;
            // stdin closed: the command's output, its Status, and the end.
            ws.send(Buffer.concat([Buffer.from([1]), large]));
            ws.send(Buffer.concat([Buffer.from([2]), Buffer.from('done\n')]));
            ws.send(Buffer.concat([Buffer.from([3]), Buffer.from(STATUS_SUCCESS)]));
            ws.close(1000);
            resolve();
          });
        });
      });
      const { decoder, events } = decoding('websocket', 'v5.channel.k8s.io');
      const port = await relay((wss.address() as AddressInfo).port, decoder);
      const client = new WebSocket(`ws://127.0.0.1:${port}/exec`, ['v5.channel.k8s.io'], {
        perMessageDeflate: false,
      });
      await once(client, 'open');
      client.send(Buffer.from([4, ...Buffer.from('{"Width":80,"Height":24}')]));
      client.send(Buffer.from([0, ...Buffer.from('cat <<EOF\n')]), { fin: false });
      client.ping('keepalive');
      client.send(Buffer.from('héllo\n'), { fin: false });
      client.send(Buffer.from('EOF\n'));
      client.send(Buffer.from([255, 0]));
      const closed = once(client, 'close');
      await serverDone;
      await closed;
      expect(decoder.failure).toBeUndefined();
      const fromClient = events((c) => c === 'stdin' || c === 'resize');
      const fromServer = events((c) => c !== 'stdin' && c !== 'resize');
      expect(fromClient).toEqual([
        ['resize', '{"Width":80,"Height":24}'],
        ['stdin', 'cat <<EOF\nhéllo\nEOF\n'],
      ]);
      expect(fromServer).toEqual([
        ['stdout', `$ ${large.toString()}`],
        ['stderr', 'done\n'],
        ['error', STATUS_SUCCESS],
      ]);
    });
  });
});

// ---- SPDY/3.1 ----

/**
 * Bytes of a real SPDY/3.1 session: two moby/spdystream v0.5.1 connections (what client-go and the kubelet use)
 * with a relay between them that kept what each side wrote. The client opened the streams of an exec with a
 * terminal as client-go does (error, stdin, stdout, stderr, resize; a `streamType` header each), wrote two sizes
 * with a json.Encoder and `echo héllo\n` on stdin; the server answered each stream and wrote `héllo\r\n` on stdout,
 * `warning\n` on stderr and a Success Status on the error stream.
 */
const SPDYSTREAM_CLIENT = Buffer.from(
  '80030001000000290000000100000000000078f9e3c6a7c26260606004a7b392a2d4c45c6851c29a0a0a6800000000ffff8003000100000017' +
    '00000003000000000000c22e555c92929907000000ffff800300010000001900000005000000000000c22ac5565c92925f5a02000000ffff80' +
    '0300010000001500000007000000000000c229975a5404000000ffff800300010000001800000009000000000000c22e57945a9c59950a0000' +
    '00ffff00000009000000197b22486569676874223a32342c225769647468223a38307d0a000000030000000c6563686f2068c3a96c6c6f0a00' +
    '0000090000001a7b22486569676874223a34332c225769647468223a3133327d0a',
  'hex',
);
const SPDYSTREAM_SERVER = Buffer.from(
  '80030002000000140000000178f9e3c6a7c26260606000000000ffff800300020000000c00000003026100000000ffff800300020000000c00' +
    '000005026100000000ffff800300020000000c00000007026100000000ffff800300020000000c00000009026100000000ffff000000050000' +
    '000868c3a96c6c6f0d0a00000007000000087761726e696e670a00000001000000227b226d65746164617461223a7b7d2c22737461747573' +
    '223a2253756363657373227d',
  'hex',
);
const SPDYSTREAM_EVENTS: Event[] = [
  ['resize', '{"Height":24,"Width":80}'],
  ['stdin', 'echo héllo\n'],
  ['resize', '{"Height":43,"Width":132}'],
  ['stdout', 'héllo\r\n'],
  ['stderr', 'warning\n'],
  ['error', STATUS_SUCCESS],
];

function adler32(bytes: Buffer): number {
  let a = 1;
  let b = 0;
  for (const byte of bytes) {
    a = (a + byte) % 65521;
    b = (b + a) % 65521;
  }
  return ((b << 16) | a) >>> 0;
}

/** SPDY/3 frames, header blocks deflated with the dictionary by one zlib stream, as a SPDY endpoint does. */
class SpdyWriter {
  private readonly deflate: Deflate = createDeflate({ dictionary: SPDY3_DICTIONARY });

  /** A header block (SPDY/3 2.6.10), compressed and flushed. */
  async headers(pairs: [string, string][]): Promise<Buffer> {
    const fields: Buffer[] = [u32(pairs.length)];
    for (const [name, value] of pairs)
      fields.push(u32(name.length), Buffer.from(name), u32(value.length), Buffer.from(value));
    return this.compress(Buffer.concat(fields));
  }

  async compress(raw: Buffer): Promise<Buffer> {
    const out: Buffer[] = [];
    const collect = (chunk: Buffer): number => out.push(chunk);
    this.deflate.on('data', collect);
    this.deflate.write(raw);
    await new Promise<void>((resolve) => this.deflate.flush(constants.Z_SYNC_FLUSH, () => resolve()));
    this.deflate.off('data', collect);
    return Buffer.concat(out);
  }

  close(): void {
    this.deflate.close();
  }
}

function u32(n: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
}

function control(type: number, payload: Buffer, opts: { flags?: number; version?: number } = {}): Buffer {
  const head = Buffer.alloc(8);
  head.writeUInt16BE(0x8000 | (opts.version ?? 3), 0);
  head.writeUInt16BE(type, 2);
  head.writeUInt32BE(payload.length, 4);
  head[4] = opts.flags ?? 0;
  return Buffer.concat([head, payload]);
}

function synStream(id: number, block: Buffer): Buffer {
  // Stream id, associated stream id, priority and slot, then the header block.
  return control(1, Buffer.concat([u32(id), u32(0), Buffer.from([0, 0]), block]));
}

function dataFrame(id: number, data: Buffer | string, fin = false): Buffer {
  const payload = Buffer.from(data);
  const head = Buffer.alloc(8);
  head.writeUInt32BE(id & 0x7fffffff, 0);
  head.writeUInt32BE(payload.length, 4);
  head[4] = fin ? 1 : 0;
  return Buffer.concat([head, payload]);
}

const SYN_REPLY = 2;
const RST_STREAM = 3;
const SETTINGS = 4;
const PING_FRAME = 6;
const HEADERS_FRAME = 8;
const WINDOW_UPDATE = 9;

/** A session built here: control frames spdystream sends too, a HEADERS frame, the server's own header blocks. */
async function spdySession(): Promise<{ steps: Step[]; want: Event[] }> {
  const client = new SpdyWriter();
  const server = new SpdyWriter();
  const types = ['error', 'stdin', 'stdout', 'stderr', 'resize'];
  const steps: Step[] = [['client', control(SETTINGS, Buffer.concat([u32(1), u32(0x01000004), u32(1000)]))]];
  for (const [i, type] of types.entries()) {
    const id = 2 * i + 1;
    const headers: [string, string][] = [['streamtype', type]];
    if (type === 'stdin') headers.push(['x-padding', 'p'.repeat(40)]);
    steps.push(['client', synStream(id, await client.headers(headers))]);
    steps.push([
      'server',
      control(SYN_REPLY, Buffer.concat([u32(id), await server.headers([['x-reply', type]])])),
    ]);
  }
  steps.push(
    ['client', dataFrame(9, '{"Width":80,')],
    ['client', control(PING_FRAME, u32(1))],
    ['client', dataFrame(9, '"Height":24}\n{"Width":81,"Height":25}\n')],
    ['server', dataFrame(5, 'tötal 0\r\n')],
    ['client', control(HEADERS_FRAME, Buffer.concat([u32(3), await client.headers([['x-more', 'm']])]))],
    ['client', dataFrame(3, 'ls\n')],
    ['server', control(WINDOW_UPDATE, Buffer.concat([u32(3), u32(65536)]))],
    ['server', dataFrame(7, 'warn\n')],
    // Written the wrong way: nothing of the terminal's.
    ['server', dataFrame(3, 'not input')],
    ['client', dataFrame(5, 'not output')],
    ['client', dataFrame(11, 'no such stream')],
    ['client', dataFrame(3, '', true)],
    ['server', dataFrame(1, STATUS_SUCCESS, true)],
    ['server', control(RST_STREAM, Buffer.concat([u32(5), u32(5)]))],
  );
  client.close();
  server.close();
  return {
    steps,
    want: [
      ['resize', '{"Width":80,"Height":24}'],
      ['resize', '{"Width":81,"Height":25}'],
      ['stdin', 'ls\n'],
      ['stdout', 'tötal 0\r\n'],
      ['stderr', 'warn\n'],
      ['error', STATUS_SUCCESS],
    ],
  };
}

describe('the SPDY decoder', () => {
  it('names the SPDY/3 dictionary that spdystream’s zlib header names', () => {
    // The client's first header block starts, after the frame's 18 bytes, with zlib's header and the DICTID.
    expect(SPDYSTREAM_CLIENT.subarray(18, 20).toString('hex')).toBe('78f9');
    expect(SPDYSTREAM_CLIENT.readUInt32BE(20)).toBe(adler32(SPDY3_DICTIONARY));
    expect(SPDY3_DICTIONARY).toHaveLength(1423);
  });

  it('decodes a session spdystream wrote', () => {
    const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
    feed(decoder, [
      ['client', SPDYSTREAM_CLIENT],
      ['server', SPDYSTREAM_SERVER],
    ]);
    expect(decoder.failure).toBeUndefined();
    expect(events()).toEqual(SPDYSTREAM_EVENTS);
  });

  it('decodes spdystream’s session the same whatever byte each side is cut at', () => {
    for (const [side, bytes] of [
      ['client', SPDYSTREAM_CLIENT],
      ['server', SPDYSTREAM_SERVER],
    ] as const) {
      for (let cut = 1; cut < bytes.length; cut++) {
        const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
        feed(
          decoder,
          [
            ['client', SPDYSTREAM_CLIENT],
            ['server', SPDYSTREAM_SERVER],
          ],
          (s) => (s === side ? [cut] : []),
        );
        expect({ side, cut, events: events() }).toEqual({ side, cut, events: SPDYSTREAM_EVENTS });
      }
    }
  });

  it('reads streams and data frames in order, skipping other frames and the server’s header blocks', async () => {
    const { steps, want } = await spdySession();
    const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
    feed(decoder, steps);
    expect(decoder.failure).toBeUndefined();
    expect(events()).toEqual(want);
  });

  it('reads the same when every byte comes alone, and in the order the two sides interleave', async () => {
    const { steps, want } = await spdySession();
    const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
    for (const [side, bytes] of steps)
      for (const byte of bytes) {
        const one = Buffer.from([byte]);
        if (side === 'client') decoder.fromClient(one);
        else decoder.fromServer(one);
      }
    expect(decoder.failure).toBeUndefined();
    // As fed: a server frame after the client's SYN_STREAM finds the stream's type known at once.
    const order = events().map(([channel]) => channel);
    expect(order).toEqual(['resize', 'resize', 'stdout', 'stdin', 'stderr', 'error']);
    expect(events().sort()).toEqual([...want].sort());
  });

  it('skips streams that are not a terminal’s', async () => {
    const client = new SpdyWriter();
    const { decoder, events } = decoding('SPDY/3.1', '');
    feed(decoder, [
      [
        'client',
        synStream(
          1,
          await client.headers([
            ['streamtype', 'data'],
            ['port', '80'],
          ]),
        ),
      ],
      ['client', synStream(3, await client.headers([['other', 'x']]))],
      ['client', synStream(5, await client.headers([['streamType', 'STDIN']]))],
      ['client', dataFrame(1, 'GET / HTTP/1.1\r\n')],
      ['client', dataFrame(3, 'x')],
      ['client', dataFrame(5, 'y')],
    ]);
    client.close();
    expect(events()).toEqual([['stdin', 'y']]);
  });

  it('drops a resize object too long to be a size, then reads the next', async () => {
    const client = new SpdyWriter();
    const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
    const long = `{"x":"${'a'.repeat(LIMITS.MAX_HELD_BYTES)}"}`;
    feed(decoder, [
      ['client', synStream(1, await client.headers([['streamtype', 'resize']]))],
      ['client', dataFrame(1, long.slice(0, 1000))],
      ['client', dataFrame(1, long.slice(1000))],
      ['client', dataFrame(1, '{"Width":10,"Height":5,"Note":"a } in a \\" string"}')],
    ]);
    client.close();
    expect(events()).toEqual([['resize', '{"Width":10,"Height":5,"Note":"a } in a \\" string"}']]);
  });

  it.each([
    {
      name: 'a control frame of another SPDY version',
      frames: async () => [control(SETTINGS, u32(0), { version: 2 })],
      failure: /version 2/,
    },
    {
      name: 'a header block compressed with another dictionary',
      frames: async () => [synStream(1, deflateSync(u32(0), { dictionary: Buffer.from('not SPDY’s') }))],
      failure: /does not inflate: Bad dictionary/,
    },
    {
      name: 'a header block that is not zlib',
      frames: async () => [synStream(1, Buffer.from('not zlib at all'))],
      failure: /does not inflate/,
    },
    {
      name: 'a header block that inflates past its limit',
      frames: async () => {
        const writer = new SpdyWriter();
        const bomb = await writer.compress(Buffer.alloc(LIMITS.MAX_HEADER_BLOCK_BYTES + 1));
        writer.close();
        return [synStream(1, bomb)];
      },
      failure: /does not inflate/,
    },
    {
      name: 'a header block whose pairs run past its end',
      frames: async () => {
        const writer = new SpdyWriter();
        const block = await writer.compress(Buffer.concat([u32(2), u32(1), Buffer.from('a'), u32(9)]));
        writer.close();
        return [synStream(1, block)];
      },
      failure: /malformed/,
    },
    {
      name: 'a header frame longer than its limit, failed on its header alone',
      frames: async () => [
        control(SYN_REPLY, Buffer.alloc(LIMITS.MAX_HEADER_FRAME_BYTES + 1)).subarray(0, 8),
      ],
      failure: /longer than 65536/,
    },
    {
      name: 'too many streams',
      frames: async () => {
        const writer = new SpdyWriter();
        const frames: Buffer[] = [];
        for (let i = 0; i <= LIMITS.MAX_STREAMS; i++)
          frames.push(synStream(2 * i + 1, await writer.headers([['streamtype', 'stdin']])));
        writer.close();
        return frames;
      },
      failure: /more than 64 streams/,
    },
  ])('fails on $name, and then reads nothing more', async ({ frames, failure }) => {
    const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
    for (const frame of await frames()) decoder.fromClient(frame);
    expect(decoder.failure).toMatch(failure);
    decoder.fromClient(dataFrame(1, 'after'));
    decoder.fromServer(dataFrame(1, 'after'));
    expect(events()).toEqual([]);
  });

  it('skips the server’s control frames unread, however long', () => {
    const { decoder, events } = decoding('SPDY/3.1', 'v4.channel.k8s.io');
    decoder.fromServer(control(SETTINGS, Buffer.alloc(LIMITS.MAX_HEADER_FRAME_BYTES * 2)));
    decoder.fromClient(SPDYSTREAM_CLIENT);
    decoder.fromServer(SPDYSTREAM_SERVER);
    expect(decoder.failure).toBeUndefined();
    expect(events()).toEqual(SPDYSTREAM_EVENTS);
  });
});
