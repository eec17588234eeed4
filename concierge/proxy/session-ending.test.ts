// How the transport ends what it relays when a draining replica asks (context.end): real sockets both sides, an
// upstream that stops in the middle of an event or a frame, and what the client receives.
import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, request, type IncomingMessage } from 'node:http';
import {
  connect as connectHttp2,
  createServer as createHttp2Server,
  type ServerHttp2Stream,
} from 'node:http2';
import { connect, type AddressInfo, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { systemClock } from '../../lib/clock.ts';
import { V5_PROTOCOL } from '../../lib/kube/exec-channels.ts';
import { SHUTDOWN_MESSAGE } from '../drain.ts';
import { newRequestContext, type RequestContext } from './exchange.ts';
import { closingBytes, webSocketFrame } from './session-close.ts';
import { transport, type ForwardPlan, type Hop } from './transport.ts';
import { newProxyServer } from './server.ts';
import { issueCert, newCA } from '../../lib/pki/pki.ts';

const closers: (() => void)[] = [];
afterEach(() => {
  for (const close of closers.splice(0)) close();
});

/** What listens: an HTTP/1.1 or an HTTP/2 server. */
interface Listener {
  listen(port: number, host: string, listening: () => void): unknown;
  address(): AddressInfo | string | null;
  close(): unknown;
}

const listening = async (server: Listener): Promise<number> => {
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  closers.push(() => void server.close());
  return (server.address() as AddressInfo).port;
};

const PLAN: ForwardPlan = { headers: {}, longRunning: true, passthrough: false, user: 'u' };

/** A hop to an HTTP/2 upstream (plain requests) and an HTTP/1.1 one (upgrades) on loopback. */
function hopTo(h2Port: number, h1Port: number): Hop {
  const session = connectHttp2(`http://127.0.0.1:${h2Port}`);
  session.on('error', () => {});
  closers.push(() => session.destroy());
  return {
    headers: (plan) => ({ ...plan.headers }),
    pathPrefix: '',
    open: (headers, endStream) => session.request(headers, { endStream }),
    send: (method, path, headers) => request({ host: '127.0.0.1', port: h1Port, method, path, headers }),
    statusPrefix: '',
    failure: (err) => ({ status: 502, message: err.message }),
    shortTimeoutMs: 10_000,
    clock: systemClock,
  };
}

/** The front: each request and upgrade goes through transport(); `contexts` are theirs, in order of arrival. */
async function front(hop: Hop, contexts: RequestContext[]): Promise<number> {
  const server = createServer((req, res) => {
    const context = newRequestContext();
    contexts.push(context);
    transport({ kind: 'plain', req, res, context }, hop, PLAN);
  });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    const context = newRequestContext();
    contexts.push(context);
    transport({ kind: 'upgrade', req, socket, head, context }, hop, PLAN);
  });
  closers.push(() => server.closeAllConnections());
  return listening(server);
}

/** An upstream that switches to `upgrade` (and WebSocket protocol `protocol`), then hands over its socket. */
async function upgradingUpstream(
  upgrade: string,
  protocol: string,
): Promise<{ port: number; socket: Promise<Socket> }> {
  let give: (s: Socket) => void = () => {};
  const socket = new Promise<Socket>((done) => (give = done));
  const server = createServer();
  server.on('upgrade', (_req, s: Socket) => {
    s.write(
      `HTTP/1.1 101 Switching Protocols\r\nUpgrade: ${upgrade}\r\nConnection: Upgrade\r\n` +
        (protocol ? `Sec-WebSocket-Protocol: ${protocol}\r\n` : '') +
        '\r\n',
    );
    give(s);
  });
  closers.push(() => server.closeAllConnections());
  return { port: await listening(server), socket };
}

/** A client that upgrades at `port` and collects all it receives until its connection ends. */
function upgradingClient(port: number, upgrade: string) {
  const socket = connect(port, '127.0.0.1');
  closers.push(() => socket.destroy());
  socket.write(`GET /exec HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: ${upgrade}\r\n\r\n`);
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  const ended = new Promise<{ clean: boolean; bytes: Buffer }>((done) => {
    let clean = false;
    socket.once('end', () => (clean = true));
    socket.once('error', () => {});
    socket.once('close', () => done({ clean, bytes: Buffer.concat(chunks) }));
  });
  const received = (): Buffer => Buffer.concat(chunks);
  return { ended, received };
}

const until = async (check: () => boolean): Promise<void> => {
  while (!check()) await new Promise((done) => setTimeout(done, 5));
};

/** What follows the 101 answer's head in `bytes`. */
const afterHead = (bytes: Buffer): Buffer => bytes.subarray(bytes.indexOf('\r\n\r\n') + 4);

/** The front over HTTP/2 (TLS, as the proxy's listener serves it): each request goes through transport(). */
async function http2Front(hop: Hop, contexts: RequestContext[]): Promise<{ port: number; ca: string }> {
  const ca = await newCA('session-ending');
  const serving = await issueCert(ca, { commonName: 'front', hosts: ['127.0.0.1'], usage: 'server' });
  const server = newProxyServer(
    { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [] },
    (req, res) => {
      const context = newRequestContext();
      contexts.push(context);
      transport({ kind: 'plain', req, res, context }, hop, PLAN);
    },
    (_req, socket) => socket.destroy(),
  );
  closers.push(() => void server.close());
  return { port: await server.listen(0, '127.0.0.1'), ca: ca.certPem };
}

/** A watch's answer read over HTTP/1.1 or HTTP/2; `onText` is told the text so far after each chunk. */
function readWatch(
  protocol: 'HTTP/1.1' | 'HTTP/2',
  at: { port: number; ca?: string },
  onText: (text: string) => void,
): Promise<{ text: string; complete: boolean }> {
  return new Promise((done, fail) => {
    let text = '';
    const take = (c: string): void => {
      text += c;
      onText(text);
    };
    if (protocol === 'HTTP/1.1') {
      request({ host: '127.0.0.1', port: at.port, path: '/api/v1/configmaps?watch=1' }, (res) => {
        res.setEncoding('utf8');
        res.on('data', take);
        res.once('end', () => done({ text, complete: res.complete }));
        res.once('error', fail);
      })
        .once('error', fail)
        .end();
      return;
    }
    const session = connectHttp2(`https://127.0.0.1:${at.port}`, { ca: at.ca! });
    closers.push(() => session.destroy());
    session.on('error', fail);
    const stream = session.request({ ':path': '/api/v1/configmaps?watch=1' }, { endStream: true });
    stream.setEncoding('utf8');
    stream.on('data', take);
    // An HTTP/2 answer is complete when its stream ends (END_STREAM), not reset.
    stream.once('end', () => done({ text, complete: stream.rstCode === undefined || stream.rstCode === 0 }));
    stream.once('error', fail);
  });
}

describe('a watch a draining replica ends', () => {
  it.each(['HTTP/1.1', 'HTTP/2'] as const)(
    'over %s: ends after the event under way, never in its middle, and the response is complete',
    async (protocol) => {
      let upstream: ServerHttp2Stream | undefined;
      const h2 = createHttp2Server();
      h2.on('stream', (stream) => {
        upstream = stream;
        stream.respond({ ':status': 200, 'content-type': 'application/json' });
        stream.write('{"type":"ADDED","object":{"n":1}}\n{"type":"ADDED",');
      });
      closers.push(() => h2.close());
      const contexts: RequestContext[] = [];
      const hop = hopTo(await listening(h2), 1);
      const at =
        protocol === 'HTTP/1.1' ? { port: await front(hop, contexts) } : await http2Front(hop, contexts);
      let asked = false;
      const body = await readWatch(protocol, at, (text) => {
        // Asked to end while the second event is half sent; the rest of it comes after.
        if (asked || !text.includes('"object":{"n":1}}\n{"type"')) return;
        asked = true;
        contexts[0]!.end!('');
        upstream!.write('"object":{"n":2}}\n');
      });
      expect(body).toEqual({
        text: '{"type":"ADDED","object":{"n":1}}\n{"type":"ADDED","object":{"n":2}}\n',
        complete: true,
      });
    },
  );
});

describe('a session a draining replica closes', () => {
  it('an exec over WebSocket: after the frame under way, a Status on the error channel, then a close', async () => {
    const up = await upgradingUpstream('websocket', V5_PROTOCOL);
    const contexts: RequestContext[] = [];
    const port = await front(hopTo(1, up.port), contexts);
    const client = upgradingClient(port, 'websocket');
    const upstream = await up.socket;
    const output = webSocketFrame(2, Buffer.concat([Buffer.of(1), Buffer.from('hello')]));
    // Half a frame of output, then the close is asked for, then the frame's other half.
    upstream.write(output.subarray(0, 3));
    await until(() => afterHead(client.received()).length === 3);
    contexts[0]!.end!(SHUTDOWN_MESSAGE);
    upstream.write(output.subarray(3));
    const { clean, bytes } = await client.ended;
    expect(clean).toBe(true);
    expect(afterHead(bytes)).toEqual(
      Buffer.concat([output, closingBytes('websocket', V5_PROTOCOL, SHUTDOWN_MESSAGE)]),
    );
  });

  it.each([['SPDY/3.1'], ['tcp']])('a %s session ends cleanly, not with a reset', async (upgrade) => {
    const up = await upgradingUpstream(upgrade, '');
    const contexts: RequestContext[] = [];
    const port = await front(hopTo(1, up.port), contexts);
    const client = upgradingClient(port, upgrade);
    const upstream = await up.socket;
    upstream.write('some bytes');
    await until(() => afterHead(client.received()).length === 10);
    contexts[0]!.end!(SHUTDOWN_MESSAGE);
    const { clean, bytes } = await client.ended;
    expect(clean).toBe(true);
    expect(afterHead(bytes).toString()).toBe('some bytes');
  });

  it('a session asked to end before the upstream switched protocols ends with the message once it has', async () => {
    let answer: (() => void) | undefined;
    const switched = new Promise<Socket>((done) => {
      const server = createServer();
      server.on('upgrade', (_req, s: Socket) => {
        answer = () => {
          s.write(
            'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
              `Sec-WebSocket-Protocol: ${V5_PROTOCOL}\r\n\r\n`,
          );
          done(s);
        };
      });
      closers.push(() => server.closeAllConnections());
      void listening(server).then((port) => (upstreamPort = port));
    });
    let upstreamPort = 0;
    await until(() => upstreamPort !== 0);
    const contexts: RequestContext[] = [];
    const port = await front(hopTo(1, upstreamPort), contexts);
    const client = upgradingClient(port, 'websocket');
    // Asked once the upstream has the request, before it answers.
    await until(() => answer !== undefined && contexts[0]?.end !== undefined);
    contexts[0]!.end!(SHUTDOWN_MESSAGE);
    answer!();
    await switched;
    const { clean, bytes } = await client.ended;
    expect(clean).toBe(true);
    expect(afterHead(bytes)).toEqual(closingBytes('websocket', V5_PROTOCOL, SHUTDOWN_MESSAGE));
  });
});
