// Reads what an exec or attach session carries out of the two byte streams of its upgraded connection, for the
// recorder (asciicast.ts). It is passive: it is handed the chunks the splice (lib/http2/upgrade.ts) forwards, after
// or beside forwarding them, and never changes, holds back or answers anything, so a bug or a hostile peer here can
// cost the recording and never the session. When the bytes stop making sense it says so in `failure` and reads no
// more; whether the session goes on unrecorded is the caller's decision.
//
// Two framings carry Kubernetes' remote-command channels:
// - WebSocket (RFC 6455) with the channel protocols (`v5.channel.k8s.io` … `channel.k8s.io`, and the `base64.`
//   variants): each message's first byte names its channel (0 stdin, 1 stdout, 2 stderr, 3 error, 4 resize; v5 adds
//   255, "close channel").
// - SPDY/3.1 (moby/spdystream, what kubectl uses when WebSockets are off): the client opens one stream per channel
//   with a SYN_STREAM whose compressed headers say its `streamtype`, and data frames then carry the bytes.
//
// Only the directions a terminal is made of are reported: stdin and resize from the client, stdout, stderr and
// error from the server. The same channel in the other direction is not part of the session and is dropped.
import { constants, inflateRawSync, inflateSync } from 'node:zlib';
import { SPDY3_DICTIONARY } from './spdy-dictionary.ts';
import { EXEC_CHANNELS, type ExecChannel } from '../../lib/kube/exec-channels.ts';

export type Channel = ExecChannel;

export interface StreamEvents {
  /**
   * Bytes of one channel, in the order they were sent. stdin, stdout and stderr come in pieces as they arrive
   * (a piece may be a view of the chunk handed in: copy it to keep it). error comes once per message (WebSocket) or
   * data frame (SPDY), as the server wrote it (a `Status` JSON from v4 on, text before); resize once per size, its
   * JSON `{"Width":…,"Height":…}`.
   */
  data(channel: Channel, bytes: Buffer): void;
}

export interface StreamDecoder {
  /** Bytes the client sent, in order, from the first byte after its request's headers. */
  fromClient(chunk: Buffer): void;
  /** Bytes the server sent, in order, from the first byte after its 101 answer's headers. */
  fromServer(chunk: Buffer): void;
  /** Set when the bytes could not be decoded; decoding stops. */
  readonly failure?: string;
}

/**
 * A frame longer than this stops decoding. Payloads are passed on as they arrive, never held, so this is not about
 * memory: the kubelet, the API server and kubectl write what one read of a pipe or a terminal gave, tens of KiB, and
 * a frame of many MiB on a terminal's connection says it is not the connection this decoder thinks it is.
 */
const MAX_FRAME_BYTES = 16 * 1024 * 1024;
/**
 * An error or resize message is held until it ends, so that it is reported whole; past this much the rest is
 * dropped (the report is then cut). A Status is a few hundred bytes, a size about 30.
 */
const MAX_HELD_BYTES = 64 * 1024;
/** A SPDY control frame with a header block is held whole to inflate it; kubectl's are about 100 bytes. */
const MAX_HEADER_FRAME_BYTES = 64 * 1024;
/** What one header block may inflate to: zlib reaches 1000:1, and a small frame must not become a large buffer. */
const MAX_HEADER_BLOCK_BYTES = 256 * 1024;
/** SPDY streams a client may open before decoding stops: exec opens five (error, stdin, stdout, stderr, resize). */
const MAX_STREAMS = 64;
/** zlib's largest window, and the window Go's and Node's deflaters use: how far back a header block may refer. */
const ZLIB_WINDOW_BYTES = 32 * 1024;

/** The remote-command channels by number, in both framings of WebSocket. */
const CLIENT_CHANNELS: ReadonlySet<Channel> = new Set(['stdin', 'resize']);
/** The channels reported per message rather than as they arrive. */
const HELD_CHANNELS: ReadonlySet<Channel> = new Set(['error', 'resize']);

/** Thrown inside the decoder; its message becomes `failure`. */
class Undecodable extends Error {}

/**
 * `protocol` is what the upstream's 101 answer negotiated: for WebSocket its Sec-WebSocket-Protocol, for SPDY (an
 * `upgrade` of `SPDY/3.1`) its X-Stream-Protocol-Version (empty when a server that predates it answered). Undefined
 * for an upgrade this cannot decode (port-forward's protocols among them).
 */
export function newStreamDecoder(
  upgrade: { upgrade: string; protocol: string },
  events: StreamEvents,
): StreamDecoder | undefined {
  const kind = upgrade.upgrade.trim().toLowerCase();
  if (kind === 'websocket') {
    const protocol = webSocketProtocol(upgrade.protocol.trim());
    if (!protocol) return undefined;
    return guarded((emit) => {
      const client = newWebSocketReader(true, protocol, emit);
      const server = newWebSocketReader(false, protocol, emit);
      return { client, server };
    }, events);
  }
  if (kind === 'spdy/3.1' && isSpdyProtocol(upgrade.protocol.trim())) return guarded(newSpdyReaders, events);
  return undefined;
}

type Emit = (channel: Channel, bytes: Buffer) => void;
type Reader = (chunk: Buffer) => void;

/** Runs the readers so that nothing they throw (nor the events) leaves the decoder: it becomes `failure`. */
function guarded(
  make: (emit: Emit) => { client: Reader; server: Reader },
  events: StreamEvents,
): StreamDecoder {
  let failure: string | undefined;
  const emit: Emit = (channel, bytes) => {
    try {
      events.data(channel, bytes);
    } catch (err) {
      throw new Undecodable(`events: ${(err as Error).message}`);
    }
  };
  const { client, server } = make(emit);
  const run = (read: Reader, chunk: Buffer): void => {
    if (failure !== undefined) return;
    try {
      read(chunk);
    } catch (err) {
      failure = err instanceof Error ? err.message : String(err);
    }
  };
  return {
    fromClient: (chunk) => run(client, chunk),
    fromServer: (chunk) => run(server, chunk),
    get failure() {
      return failure;
    },
  };
}

/** The channel a message or stream carries, when it is one of the terminal's in this direction. */
function terminalChannel(channel: Channel | undefined, fromClient: boolean): Channel | undefined {
  return channel && CLIENT_CHANNELS.has(channel) === fromClient ? channel : undefined;
}

/** Bytes held until their message ends, bounded by MAX_HELD_BYTES. */
function newHeld(): { push(bytes: Buffer): void; take(): Buffer } {
  let parts: Buffer[] = [];
  let size = 0;
  return {
    push(bytes) {
      const room = MAX_HELD_BYTES - size;
      if (room <= 0 || bytes.length === 0) return;
      // Copied: a view would keep the caller's whole chunk alive, and it may be reused.
      const kept = Buffer.from(bytes.subarray(0, room));
      parts.push(kept);
      size += kept.length;
    },
    take() {
      const all = Buffer.concat(parts);
      parts = [];
      size = 0;
      return all;
    },
  };
}

// ---- WebSocket ----

interface WebSocketProtocol {
  /** The `base64.` variants: text messages, the channel as an ASCII digit, the rest base64. */
  base64: boolean;
}

/** The channel protocols; empty, when the server chose none, is the first of them (binary) as wsstream reads it. */
function webSocketProtocol(protocol: string): WebSocketProtocol | undefined {
  if (protocol === '') return { base64: false };
  const match = /^(?:v([2-5])\.)?(base64\.)?channel\.k8s\.io$/.exec(protocol);
  if (!match) return undefined;
  const base64 = match[2] !== undefined;
  // v5 was defined binary only: a server that answers v5.base64 speaks something else.
  if (match[1] === '5' && base64) return undefined;
  return { base64 };
}

/** Base64 text decoded as it arrives: a run of characters is decoded up to its last whole group of four. */
function newBase64Stream(): { write(text: Buffer): Buffer; end(): Buffer } {
  let rest = '';
  return {
    write(text) {
      const all = rest + text.toString('latin1');
      const whole = all.length - (all.length % 4);
      rest = all.slice(whole);
      return Buffer.from(all.slice(0, whole), 'base64');
    },
    end() {
      const last = Buffer.from(rest, 'base64');
      rest = '';
      return last;
    },
  };
}

/** One data message (a first frame and its continuations) of one direction. */
interface Message {
  push(payload: Buffer): void;
  end(): void;
}

function newMessage(fromClient: boolean, protocol: WebSocketProtocol, emit: Emit): Message {
  /** Undefined until the message's first payload byte; null for a message that is not the terminal's. */
  let channel: Channel | null | undefined;
  const base64 = protocol.base64 ? newBase64Stream() : undefined;
  const held = newHeld();
  const deliver = (bytes: Buffer): void => {
    if (!channel || bytes.length === 0) return;
    if (HELD_CHANNELS.has(channel)) held.push(bytes);
    else emit(channel, bytes);
  };
  return {
    push(payload) {
      if (payload.length === 0) return;
      if (channel === undefined) {
        // v5's close-channel messages (255) and numbers past resize name no channel, and are skipped.
        const id = payload[0]! - (protocol.base64 ? 0x30 : 0);
        channel = terminalChannel(EXEC_CHANNELS[id], fromClient) ?? null;
        payload = payload.subarray(1);
      }
      if (!channel) return;
      deliver(base64 ? base64.write(payload) : payload);
    },
    end() {
      if (base64) deliver(base64.end());
      if (channel && HELD_CHANNELS.has(channel)) {
        const whole = held.take();
        if (whole.length > 0) emit(channel, whole);
      }
    },
  };
}

const OPCODE_CONTINUATION = 0x0;
const OPCODE_TEXT = 0x1;
const OPCODE_BINARY = 0x2;
const OPCODE_CLOSE = 0x8;
const OPCODE_PONG = 0xa;
/** RFC 6455 5.5: control frames carry at most this much, unfragmented. */
const MAX_CONTROL_PAYLOAD = 125;
/** The longest frame header: 2 bytes, a 64-bit length, a 4-byte mask. */
const MAX_FRAME_HEADER = 14;

/** A complete frame header's opcode, payload length and mask; refuses reserved bits and frames past the limit. */
function frameHeader(
  head: Buffer,
  side: string,
): { opcode: number; length: number; masked: Buffer | undefined } {
  const b0 = head[0]!;
  const b1 = head[1]!;
  const length7 = b1 & 0x7f;
  let at = 2;
  let length = length7;
  if (length7 === 126) {
    length = head.readUInt16BE(2);
    at = 4;
  } else if (length7 === 127) {
    // Read as two halves: a high half at or past 2^21 is past 2^53 and exact in no number, and past the limit.
    const high = head.readUInt32BE(2);
    length = high >= 2 ** 21 ? Infinity : high * 2 ** 32 + head.readUInt32BE(6);
    at = 10;
  }
  if (b0 & 0x70)
    throw new Undecodable(`${side}: a frame has reserved bits set (an extension this decoder does not read)`);
  if (length > MAX_FRAME_BYTES)
    throw new Undecodable(`${side}: a frame of ${length} bytes is longer than ${MAX_FRAME_BYTES}`);
  // Masks are honoured whichever side sent them: the splice does not judge RFC 6455's rule, so neither does this.
  const masked = b1 & 0x80 ? Buffer.from(head.subarray(at, at + 4)) : undefined;
  return { opcode: b0 & 0x0f, length, masked };
}

function newWebSocketReader(fromClient: boolean, protocol: WebSocketProtocol, emit: Emit): Reader {
  const side = fromClient ? 'websocket from the client' : 'websocket from the server';
  const head = Buffer.alloc(MAX_FRAME_HEADER);
  let headLength = 0;
  /** Invariant: `inPayload` exactly while a frame's header is read and `remaining` of its payload is not. */
  let inPayload = false;
  let remaining = 0;
  let control = false;
  let fin = false;
  let mask: Buffer | undefined;
  let maskAt = 0;
  let message: Message | undefined;

  /** The header's full length, known once its first two bytes are. */
  const headerLength = (): number => {
    if (headLength < 2) return 2;
    const length7 = head[1]! & 0x7f;
    const extended = length7 === 126 ? 2 : length7 === 127 ? 8 : 0;
    return 2 + extended + (head[1]! & 0x80 ? 4 : 0);
  };

  const startFrame = (): void => {
    const { opcode, length, masked } = frameHeader(head, side);
    mask = masked;
    maskAt = 0;
    fin = (head[0]! & 0x80) !== 0;
    control = opcode >= OPCODE_CLOSE;
    if (control) {
      if (opcode > OPCODE_PONG) throw new Undecodable(`${side}: reserved opcode ${opcode}`);
      if (!fin || length > MAX_CONTROL_PAYLOAD)
        throw new Undecodable(`${side}: a control frame is fragmented or longer than ${MAX_CONTROL_PAYLOAD}`);
    } else if (opcode === OPCODE_CONTINUATION) {
      if (!message) throw new Undecodable(`${side}: a continuation frame with no message to continue`);
    } else if (opcode === OPCODE_TEXT || opcode === OPCODE_BINARY) {
      if (message) throw new Undecodable(`${side}: a new message before the last one ended`);
      message = newMessage(fromClient, protocol, emit);
    } else throw new Undecodable(`${side}: reserved opcode ${opcode}`);
    headLength = 0;
    inPayload = true;
    remaining = length;
  };

  const endFrame = (): void => {
    inPayload = false;
    if (control || !fin) return;
    message!.end();
    message = undefined;
  };

  const payload = (bytes: Buffer): void => {
    if (control) return;
    if (mask) {
      // Unmasked into a copy: the chunk is the splice's, on its way to the server as it is.
      const plain = Buffer.allocUnsafe(bytes.length);
      for (let i = 0; i < bytes.length; i++) plain[i] = bytes[i]! ^ mask[(maskAt + i) & 3]!;
      maskAt = (maskAt + bytes.length) & 3;
      bytes = plain;
    }
    message!.push(bytes);
  };

  return (chunk) => {
    let at = 0;
    while (at < chunk.length) {
      if (!inPayload) {
        const n = Math.min(headerLength() - headLength, chunk.length - at);
        chunk.copy(head, headLength, at, at + n);
        headLength += n;
        at += n;
        // Two bytes in, the header may turn out longer: go round again before starting the frame.
        if (headLength < headerLength()) continue;
        startFrame();
        if (remaining === 0) endFrame();
        continue;
      }
      const n = Math.min(remaining, chunk.length - at);
      payload(chunk.subarray(at, at + n));
      at += n;
      remaining -= n;
      if (remaining === 0) endFrame();
    }
  };
}

// ---- SPDY/3.1 ----

/** X-Stream-Protocol-Version answers of remote command (v5 is WebSocket only); empty from servers before it. */
function isSpdyProtocol(protocol: string): boolean {
  return protocol === '' || /^(?:v[2-4]\.)?channel\.k8s\.io$/.test(protocol);
}

// A SPDY/3 frame's 24-bit length keeps every frame under MAX_FRAME_BYTES already.
const SPDY_VERSION = 3;
const SPDY_FRAME_HEADER = 8;
const SYN_STREAM = 1;
const SYN_REPLY = 2;
const HEADERS = 8;
/** What precedes the header block in each control frame that has one (SPDY/3 2.6.1, 2.6.2, 2.6.7). */
const HEADER_BLOCK_OFFSET: ReadonlyMap<number, number> = new Map([
  [SYN_STREAM, 10],
  [SYN_REPLY, 4],
  [HEADERS, 4],
]);

/** A stream the client opened, and how its data frames are read. */
interface SpdyStream {
  channel: Channel;
  read(bytes: Buffer): void;
  /** At the end of each data frame. */
  endFrame(): void;
}

/**
 * The client's header blocks inflated one at a time, synchronously. All blocks of a direction form one zlib stream
 * (its first block starts with the zlib header naming the SPDY dictionary) and each ends with a sync flush, so a
 * block is whole deflate blocks that may refer back up to a window into what the earlier ones inflated to. The
 * first is inflated with the dictionary; each later one as raw deflate with the window it may refer to, the last
 * 32 KiB of dictionary and earlier output, given as its dictionary. Node's streaming inflate is asynchronous and
 * would make every data frame after a SYN_STREAM wait in a queue (in both directions, to keep their order) until
 * the SYN_STREAM's type is known; this way the type is known before the next byte is read, in order and with
 * nothing queued, for a copy of at most 32 KiB per header block, of which there are a handful.
 */
function newHeaderInflater(): (block: Buffer) => Buffer {
  let window: Buffer | undefined;
  return (block) => {
    // Nothing to inflate, and no step of the zlib stream: the first block with bytes still holds its header.
    if (block.length === 0) return block;
    const options = { finishFlush: constants.Z_SYNC_FLUSH, maxOutputLength: MAX_HEADER_BLOCK_BYTES };
    const inflated =
      window === undefined
        ? inflateSync(block, { ...options, dictionary: SPDY3_DICTIONARY })
        : inflateRawSync(block, { ...options, dictionary: window });
    window = Buffer.concat([window ?? SPDY3_DICTIONARY, inflated]);
    if (window.length > ZLIB_WINDOW_BYTES) window = Buffer.from(window.subarray(-ZLIB_WINDOW_BYTES));
    return inflated;
  };
}

/** A header block's name/value pairs (SPDY/3 2.6.10: 32-bit counts and lengths, names lower case). */
function headerValue(block: Buffer, wanted: string): string | undefined {
  const fail = (): never => {
    throw new Undecodable('spdy: a header block is malformed');
  };
  if (block.length < 4) fail();
  const pairs = block.readUInt32BE(0);
  let at = 4;
  const field = (): Buffer => {
    if (at + 4 > block.length) fail();
    const length = block.readUInt32BE(at);
    if (at + 4 + length > block.length) fail();
    at += 4 + length;
    return block.subarray(at - length, at);
  };
  let found: string | undefined;
  for (let i = 0; i < pairs; i++) {
    const name = field().toString('latin1').toLowerCase();
    const value = field().toString('latin1');
    if (name !== wanted) continue;
    // The kubelet reads the first of repeated fields, and spdystream splits a value at NUL into several: a stream
    // whose type is not one plain value could be read as another type here than there, so it is undecodable.
    if (found !== undefined || value.includes('\0'))
      throw new Undecodable(`spdy: a stream's ${wanted} is not one plain value`);
    found = value;
  }
  return found;
}

/**
 * JSON objects out of a byte stream, as client-go writes terminal sizes to SPDY's resize stream (one
 * `json.Encoder` per stream, which the server reads with a streaming decoder): an object may span data frames, and
 * objects need no separator. Only object braces and strings are tracked; what lies between objects is skipped, and
 * an object longer than MAX_HELD_BYTES, no terminal size, is dropped as soon as it is that long.
 */
function newJsonObjects(emit: (object: Buffer) => void): (bytes: Buffer) => void {
  /** The current object's bytes from earlier chunks; `depth` > 0 exactly while an object is open. */
  let held: Buffer[] = [];
  let heldBytes = 0;
  let depth = 0;
  let inString = false;
  let escaped = false;
  const drop = (): void => {
    held = [];
    heldBytes = 0;
    depth = 0;
    inString = false;
    escaped = false;
  };
  return (bytes) => {
    let start = 0;
    for (let i = 0; i < bytes.length; i++) {
      const byte = bytes[i]!;
      if (depth === 0) {
        if (byte === 0x7b) {
          depth = 1;
          start = i;
        }
        continue;
      }
      if (heldBytes + (i - start) >= MAX_HELD_BYTES) {
        drop();
        continue;
      }
      if (inString) {
        if (escaped) escaped = false;
        else if (byte === 0x5c) escaped = true;
        else if (byte === 0x22) inString = false;
      } else if (byte === 0x22) inString = true;
      else if (byte === 0x7b) depth++;
      else if (byte === 0x7d && --depth === 0) {
        const object = Buffer.concat([...held, bytes.subarray(start, i + 1)]);
        drop();
        emit(object);
      }
    }
    if (depth > 0) {
      // Copied: a view would keep the caller's whole chunk alive.
      const tail = Buffer.from(bytes.subarray(start));
      held.push(tail);
      heldBytes += tail.length;
    }
  };
}

function newSpdyStream(channel: Channel, emit: Emit): SpdyStream {
  if (channel === 'resize') {
    const read = newJsonObjects((object) => emit('resize', object));
    return { channel, read, endFrame: () => {} };
  }
  if (channel === 'error') {
    const held = newHeld();
    return {
      channel,
      read: (bytes) => held.push(bytes),
      endFrame() {
        const whole = held.take();
        if (whole.length > 0) emit('error', whole);
      },
    };
  }
  return { channel, read: (bytes) => bytes.length > 0 && emit(channel, bytes), endFrame: () => {} };
}

const STREAM_TYPES: ReadonlySet<string> = new Set(EXEC_CHANNELS);

function newSpdyReaders(emit: Emit): { client: Reader; server: Reader } {
  const streams = new Map<number, SpdyStream>();
  let opened = 0;
  const inflate = newHeaderInflater();

  const onHeaderFrame = (type: number, frame: Buffer): void => {
    const offset = HEADER_BLOCK_OFFSET.get(type)!;
    if (frame.length < offset) throw new Undecodable('spdy: a control frame is shorter than its fields');
    let block: Buffer;
    try {
      // Every block is inflated, those of SYN_REPLY and HEADERS too: the zlib stream runs through them all.
      block = inflate(frame.subarray(offset));
    } catch (err) {
      throw new Undecodable(`spdy: a header block does not inflate: ${(err as Error).message}`);
    }
    if (type !== SYN_STREAM) return;
    if (++opened > MAX_STREAMS)
      throw new Undecodable(`spdy: the client opened more than ${MAX_STREAMS} streams`);
    const id = frame.readUInt32BE(0) & 0x7fffffff;
    const streamType = headerValue(block, 'streamtype')?.toLowerCase();
    // Streams of other types (port-forward's data, say) are not a terminal's: their frames are skipped.
    if (streamType !== undefined && STREAM_TYPES.has(streamType))
      streams.set(id, newSpdyStream(streamType as Channel, emit));
    else streams.delete(id);
  };

  const newReader = (fromClient: boolean): Reader => {
    const head = Buffer.alloc(SPDY_FRAME_HEADER);
    let headLength = 0;
    /** The frame being read: its payload is skipped, passed to a stream, or held for its header block. */
    let frame:
      | { remaining: number; stream?: SpdyStream; held?: { type: number; bytes: Buffer; filled: number } }
      | undefined;

    const startFrame = (): void => {
      const length = head.readUIntBE(5, 3);
      if (head[0]! & 0x80) {
        const version = head.readUInt16BE(0) & 0x7fff;
        if (version !== SPDY_VERSION) throw new Undecodable(`spdy: a control frame of version ${version}`);
        const type = head.readUInt16BE(2);
        // The server's header blocks are its own zlib stream, and say nothing this needs: skipped unread.
        if (fromClient && HEADER_BLOCK_OFFSET.has(type)) {
          if (length > MAX_HEADER_FRAME_BYTES)
            throw new Undecodable(
              `spdy: a header frame of ${length} bytes is longer than ${MAX_HEADER_FRAME_BYTES}`,
            );
          frame = { remaining: length, held: { type, bytes: Buffer.allocUnsafe(length), filled: 0 } };
        } else frame = { remaining: length };
      } else {
        const stream = streams.get(head.readUInt32BE(0) & 0x7fffffff);
        const ours = stream && terminalChannel(stream.channel, fromClient) ? stream : undefined;
        frame = ours ? { remaining: length, stream: ours } : { remaining: length };
      }
      headLength = 0;
    };

    const endFrame = (): void => {
      const done = frame!;
      frame = undefined;
      if (done.held) onHeaderFrame(done.held.type, done.held.bytes);
      done.stream?.endFrame();
    };

    return (chunk) => {
      let at = 0;
      while (at < chunk.length) {
        if (!frame) {
          const n = Math.min(SPDY_FRAME_HEADER - headLength, chunk.length - at);
          chunk.copy(head, headLength, at, at + n);
          headLength += n;
          at += n;
          if (headLength < SPDY_FRAME_HEADER) continue;
          startFrame();
          if (frame!.remaining === 0) endFrame();
          continue;
        }
        const n = Math.min(frame.remaining, chunk.length - at);
        const bytes = chunk.subarray(at, at + n);
        at += n;
        frame.remaining -= n;
        if (frame.held) {
          bytes.copy(frame.held.bytes, frame.held.filled);
          frame.held.filled += n;
        } else frame.stream?.read(bytes);
        if (frame.remaining === 0) endFrame();
      }
    };
  };

  return { client: newReader(true), server: newReader(false) };
}

/** Exported for the tests. */
export const LIMITS = {
  MAX_FRAME_BYTES,
  MAX_HELD_BYTES,
  MAX_HEADER_FRAME_BYTES,
  MAX_HEADER_BLOCK_BYTES,
  MAX_STREAMS,
};
