// What a draining replica writes to end each kind of session, and how it finds the boundaries it may write at.
import { describe, expect, it } from '@jest/globals';
import { V4_PROTOCOL, V5_PROTOCOL } from '../../lib/kube/exec-channels.ts';
import {
  closingBytes,
  GOING_AWAY,
  NORMAL_CLOSURE,
  watchBoundary,
  webSocketBoundary,
  webSocketClose,
  webSocketFrame,
} from './session-close.ts';

const MESSAGE = 'sealion: this gateway replica is shutting down for an upgrade; run the command again';

/** Reads unmasked server frames back: opcode and payload of each. */
function frames(bytes: Buffer): { opcode: number; payload: Buffer }[] {
  const out: { opcode: number; payload: Buffer }[] = [];
  let i = 0;
  while (i < bytes.length) {
    const opcode = bytes[i]! & 0x0f;
    let length = bytes[i + 1]! & 0x7f;
    i += 2;
    if (length === 126) {
      length = bytes.readUInt16BE(i);
      i += 2;
    } else if (length === 127) {
      length = Number(bytes.readBigUInt64BE(i));
      i += 8;
    }
    out.push({ opcode, payload: bytes.subarray(i, i + length) });
    i += length;
  }
  return out;
}

describe('closing a session', () => {
  it.each([V5_PROTOCOL, V4_PROTOCOL])(
    'an exec or attach over %s gets a Status on its error channel, then a close',
    (protocol) => {
      const [error, close] = frames(closingBytes('websocket', protocol, MESSAGE));
      expect(error!.opcode).toBe(2);
      expect(error!.payload[0]).toBe(3);
      expect(JSON.parse(error!.payload.subarray(1).toString())).toMatchObject({
        kind: 'Status',
        status: 'Failure',
        code: 503,
        message: MESSAGE,
      });
      expect(close!.opcode).toBe(8);
      expect(close!.payload.readUInt16BE(0)).toBe(NORMAL_CLOSURE);
    },
  );

  it('a port-forward over WebSocket gets a close frame with the message as its reason', () => {
    const [close] = frames(closingBytes('websocket', 'SPDY/3.1+portforward.k8s.io', MESSAGE));
    expect(close!.opcode).toBe(8);
    expect(close!.payload.readUInt16BE(0)).toBe(GOING_AWAY);
    expect(close!.payload.subarray(2).toString()).toBe(MESSAGE);
  });

  it('a reach connection or a SPDY session ends cleanly with nothing more', () => {
    expect(closingBytes('sealion-reach', '', MESSAGE)).toHaveLength(0);
    expect(closingBytes('SPDY/3.1', '', MESSAGE)).toHaveLength(0);
  });

  it('cuts a close reason to 123 bytes on a character', () => {
    const close = webSocketClose(GOING_AWAY, 'é'.repeat(100));
    const [frame] = frames(close);
    expect(frame!.payload.length).toBeLessThanOrEqual(125);
    expect(frame!.payload.subarray(2).toString()).toBe('é'.repeat(61));
  });
});

describe('boundaries', () => {
  it('a WebSocket stream is at a boundary only between frames, however it is cut into chunks', () => {
    const stream = Buffer.concat([
      webSocketFrame(2, Buffer.alloc(10, 1)),
      webSocketFrame(2, Buffer.alloc(300, 2)),
      webSocketFrame(2, Buffer.alloc(70_000, 3)),
    ]);
    const ends = new Set([12, 12 + 304, stream.length]);
    for (const size of [1, 3, 7, 1000]) {
      const boundary = webSocketBoundary();
      for (let i = 0; i < stream.length; i += size) {
        const chunk = stream.subarray(i, Math.min(i + size, stream.length));
        boundary.feed(chunk);
        const at = i + chunk.length;
        expect([at, boundary.atBoundary()]).toEqual([at, ends.has(at)]);
      }
    }
  });

  it('a JSON watch is at a boundary after each event line', () => {
    const boundary = watchBoundary('application/json');
    expect(boundary.atBoundary()).toBe(true);
    boundary.feed(Buffer.from('{"type":"ADDED","object":'));
    expect(boundary.atBoundary()).toBe(false);
    boundary.feed(Buffer.from('{}}\n'));
    expect(boundary.atBoundary()).toBe(true);
  });

  it('a protobuf watch is at a boundary after each length-prefixed frame', () => {
    const boundary = watchBoundary('application/vnd.kubernetes.protobuf;stream=watch');
    const frame = Buffer.concat([Buffer.of(0, 0, 0, 5), Buffer.from('abcde')]);
    boundary.feed(frame.subarray(0, 2));
    expect(boundary.atBoundary()).toBe(false);
    boundary.feed(frame.subarray(2, 7));
    expect(boundary.atBoundary()).toBe(false);
    boundary.feed(Buffer.concat([frame.subarray(7), frame.subarray(0, 4)]));
    expect(boundary.atBoundary()).toBe(false);
    boundary.feed(frame.subarray(4));
    expect(boundary.atBoundary()).toBe(true);
  });
});
