// The tunnel's WebSocket stream on a real WebSocket on port 0: a corked batch of writes goes as one message.
import type { AddressInfo } from 'node:net';
import { WebSocket, WebSocketServer } from 'ws';
import { afterEach, describe, expect, it } from '@jest/globals';
import { eventually } from '../../dev/eventually.ts';
import { MESSAGE_BYTES, messagesOf, webSocketStream } from './websocket.ts';

const cleanups: (() => void)[] = [];
afterEach(() => cleanups.splice(0).forEach((c) => c()));

/** A client WebSocket wrapped as the tunnel wraps it, and the messages its server end receives. */
async function pair(): Promise<{ stream: ReturnType<typeof webSocketStream>; received: Buffer[] }> {
  const wss = new WebSocketServer({ port: 0, host: '127.0.0.1' });
  await new Promise<void>((done) => wss.once('listening', done));
  const received: Buffer[] = [];
  wss.on('connection', (ws) => ws.on('message', (data) => received.push(data as Buffer)));
  const ws = new WebSocket(`ws://127.0.0.1:${(wss.address() as AddressInfo).port}`);
  await new Promise<void>((done) => ws.once('open', () => done()));
  cleanups.push(() => {
    ws.terminate();
    wss.close();
  });
  return { stream: webSocketStream(ws), received };
}

describe('webSocketStream', () => {
  it('sends a corked batch of writes as one message', async () => {
    const { stream, received } = await pair();
    stream.cork();
    stream.write(Buffer.from('head'));
    stream.write(Buffer.from('-payload'));
    stream.write(Buffer.from('-more'));
    stream.uncork();
    // Messages arrive in order: once this one is in, everything before it is.
    stream.write(Buffer.from('end'));
    await eventually(() => expect(received.at(-1)?.toString()).toBe('end'));
    expect(received.map((b) => b.toString())).toEqual(['head-payload-more', 'end']);
  });
});

describe('messagesOf', () => {
  it('joins chunks up to MESSAGE_BYTES and keeps a larger chunk alone', () => {
    const small = Buffer.alloc(MESSAGE_BYTES / 4, 1);
    const large = Buffer.alloc(MESSAGE_BYTES + 1, 2);
    const messages = messagesOf([small, small, small, small, small, large, small]);
    expect(messages.map((m) => m.length)).toEqual([
      MESSAGE_BYTES,
      MESSAGE_BYTES / 4,
      MESSAGE_BYTES + 1,
      MESSAGE_BYTES / 4,
    ]);
    expect(
      Buffer.concat(messages).equals(Buffer.concat([small, small, small, small, small, large, small])),
    ).toBe(true);
  });
});
