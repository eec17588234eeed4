// How a replica that drains ends what it relays without cutting it (concierge/drain.ts): a watch at an event's
// boundary, its response complete, as the API server ends a watch at its timeout; an upgraded session with a message
// its client shows. Both wait for the boundary of what the upstream sends (an event, a WebSocket frame), since
// anything written into the middle of one would break the client's reading of it.
import { CHANNEL, V4_PROTOCOL, V5_PROTOCOL } from '../../lib/kube/exec-channels.ts';
import { statusBody } from '../../lib/kube/status.ts';

/** Follows a byte stream's framing: whether what has gone by so far ends on a boundary. */
export interface Boundary {
  feed(chunk: Buffer): void;
  atBoundary(): boolean;
}

/**
 * A watch's event boundaries by its content type: JSON events are one line each; protobuf ones are each prefixed with
 * their length (4 bytes, big-endian). Other types (none the API server sends for watches) are taken to be at a
 * boundary between chunks.
 */
export function watchBoundary(contentType: string | string[] | undefined): Boundary {
  const type = String(contentType ?? '');
  if (type.startsWith('application/vnd.kubernetes.protobuf')) return lengthPrefixed();
  if (type.startsWith('application/json')) {
    let last = 0x0a;
    return {
      feed: (chunk) => void (chunk.length > 0 && (last = chunk[chunk.length - 1]!)),
      atBoundary: () => last === 0x0a,
    };
  }
  return { feed() {}, atBoundary: () => true };
}

/**
 * Frames of a header, then a payload of the length the header says: `headerLength` says how long the header is from
 * what of it has come (its first bytes), `payloadLength` reads the whole header.
 */
function framed(
  headerLength: (header: number[]) => number,
  payloadLength: (header: Buffer) => number,
): Boundary {
  /** The current frame's header bytes read so far; empty between frames and while its payload goes by. */
  let header: number[] = [];
  /** Bytes of the current frame's payload still to come. */
  let remaining = 0;
  return {
    feed(chunk) {
      let i = 0;
      while (i < chunk.length) {
        if (remaining > 0) {
          const take = Math.min(remaining, chunk.length - i);
          remaining -= take;
          i += take;
          continue;
        }
        header.push(chunk[i++]!);
        if (header.length === headerLength(header)) {
          remaining = payloadLength(Buffer.from(header));
          header = [];
        }
      }
    },
    atBoundary: () => remaining === 0 && header.length === 0,
  };
}

/** Frames of a 4-byte big-endian length, then that many bytes. */
const lengthPrefixed = (): Boundary =>
  framed(
    () => 4,
    (header) => header.readUInt32BE(0),
  );

/** The frames a WebSocket server sends (RFC 6455, unmasked): whether the bytes so far end on a frame's end. */
export const webSocketBoundary = (): Boundary =>
  framed(
    // 2, 4 or 10 bytes by the length's first byte (a masked frame adds 4), known once the first two are in.
    (header) => {
      if (header.length < 2) return 2;
      const len = header[1]! & 0x7f;
      return 2 + (len === 126 ? 2 : len === 127 ? 8 : 0) + (header[1]! & 0x80 ? 4 : 0);
    },
    (header) => {
      const len = header[1]! & 0x7f;
      if (len === 126) return header.readUInt16BE(2);
      // A payload over 2^53 bytes is not one anybody relays; Number() keeps the arithmetic simple.
      if (len === 127) return Number(header.readBigUInt64BE(2));
      return len;
    },
  );

/** One unmasked WebSocket frame from a server, final, with `opcode` (2: binary, 8: close). */
export function webSocketFrame(opcode: number, payload: Buffer): Buffer {
  const length = payload.length;
  const head =
    length < 126
      ? Buffer.of(0x80 | opcode, length)
      : length < 65536
        ? Buffer.of(0x80 | opcode, 126, length >> 8, length & 0xff)
        : (() => {
            const b = Buffer.alloc(10);
            b[0] = 0x80 | opcode;
            b[1] = 127;
            b.writeBigUInt64BE(BigInt(length), 2);
            return b;
          })();
  return Buffer.concat([head, payload]);
}

/** WebSocket close code 1001: the endpoint is going away (a server going down). */
export const GOING_AWAY = 1001;
/**
 * WebSocket close code 1000: a normal closure. client-go reads an exec's channels until a close, and takes only this
 * code for their end: any other is an error of its own, printed instead of the Status that says why.
 */
export const NORMAL_CLOSURE = 1000;

/** A close frame with `code` and a reason of at most 123 bytes, as RFC 6455 allows. */
export function webSocketClose(code: number, reason: string): Buffer {
  let text = Buffer.from(reason, 'utf8');
  // Cut on a character, not inside one: the reason must be valid UTF-8.
  if (text.length > 123)
    text = Buffer.from(
      text
        .subarray(0, 123)
        .toString('utf8')
        .replace(/\uFFFD+$/, ''),
      'utf8',
    );
  const payload = Buffer.alloc(2 + text.length);
  payload.writeUInt16BE(code, 0);
  text.copy(payload, 2);
  return webSocketFrame(8, payload);
}

/** The exec and attach protocols whose error channel carries a Status the client prints. */
const CHANNEL_PROTOCOLS = new Set([V5_PROTOCOL, V4_PROTOCOL]);

/**
 * The last bytes a draining replica writes to an upgraded session, by its protocol: for exec and attach over
 * WebSocket (v4, v5), a Status on the error channel (kubectl prints its message; the SSH door, which runs commands
 * the same way, prints it on stderr), then a normal close; for any other WebSocket (port-forward), a close frame whose
 * reason is the message; for the rest (SPDY, reach), nothing: the connection ends cleanly, not with a reset.
 */
export function closingBytes(upgrade: string, protocol: string, message: string): Buffer {
  if (upgrade.toLowerCase() !== 'websocket') return Buffer.alloc(0);
  if (CHANNEL_PROTOCOLS.has(protocol)) {
    const status = Buffer.from(statusBody(503, message), 'utf8');
    return Buffer.concat([
      webSocketFrame(2, Buffer.concat([Buffer.of(CHANNEL.error), status])),
      webSocketClose(NORMAL_CLOSURE, ''),
    ]);
  }
  return webSocketClose(GOING_AWAY, message);
}
