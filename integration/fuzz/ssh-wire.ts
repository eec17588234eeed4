// An SSH client that does as it is told, for the SSH family: ssh2's transport (its internal Protocol class: the
// version exchange, the key exchange, the ciphers and MACs, compression, and the parsing of what the server sends),
// with every message after the key exchange built here, byte by byte.
//
// Why not ssh2's Client: it answers the door's device prompt by itself (no prompt to show, so it replies at once, and
// a client cannot walk away at the prompt), refuses to send a key it cannot parse (an RSA key of 100,000 bits, a point
// off its curve), cannot sign in with an OpenSSH certificate, sends one authentication request at a time, and always
// reads its channels. Writing garbage on the socket after ssh2's Client has finished its key exchange would reach the
// server's decryption and nothing behind it; here a malformed message is encrypted and authenticated as a good one,
// so it reaches the parser of the layer it is aimed at. What it costs: Protocol is not ssh2's public API, so an ssh2
// upgrade may break this file (the positive controls then fail, loudly).
import { createRequire } from 'node:module';
import { connect, type Socket } from 'node:net';
import { bool, str, u32 } from './ssh-keys.ts';

const require = createRequire(import.meta.url);

/** The parts of ssh2's Protocol this file uses. */
interface Protocol {
  start?: () => void;
  parse(chunk: Buffer, start: number, end: number): void;
  cleanup(): void;
  rekey(): void;
  _kex?: { sessionID?: Buffer };
  _authsQueue: string[];
  _packetRW: { write: { allocStart: number; alloc(size: number): Buffer; finalize(packet: Buffer): Buffer } };
}
type ProtocolConstructor = new (config: Record<string, unknown>) => Protocol;
const Protocol = require('ssh2/lib/protocol/Protocol.js') as ProtocolConstructor;
const { sendPacket } = require('ssh2/lib/protocol/utils.js') as {
  sendPacket: (proto: Protocol, packet: Buffer) => boolean;
};

export const MSG = {
  DISCONNECT: 1,
  IGNORE: 2,
  UNIMPLEMENTED: 3,
  DEBUG: 4,
  SERVICE_REQUEST: 5,
  KEXINIT: 20,
  USERAUTH_REQUEST: 50,
  USERAUTH_INFO_RESPONSE: 61,
  GLOBAL_REQUEST: 80,
  CHANNEL_OPEN: 90,
  CHANNEL_WINDOW_ADJUST: 93,
  CHANNEL_DATA: 94,
  CHANNEL_EXTENDED_DATA: 95,
  CHANNEL_EOF: 96,
  CHANNEL_CLOSE: 97,
  CHANNEL_REQUEST: 98,
} as const;

/** The algorithms a client offers, each list in order of preference. */
export interface Offer {
  kex: string[];
  serverHostKey: string[];
  cipher: string[];
  mac: string[];
  compress: string[];
}

/** A channel this client opened, as far as the server said. */
export interface Channel {
  local: number;
  remote?: number;
  state: 'opening' | 'open' | 'refused' | 'closed';
  /** How many bytes the server lets this client send. */
  window: number;
  /** What the server sent on it (the first 64 KiB), and on its stderr. */
  data: Buffer[];
  stderr: Buffer[];
  received: number;
  /** Data messages received, empty ones included. */
  messages: number;
  exitStatus?: number;
  eof: boolean;
  /** Answers to requests sent with want-reply, in order. */
  replies: boolean[];
  /** Whether this client gives the server window back as it reads (false: it never reads the channel). */
  reads: boolean;
  /** The window this client gave the server when it opened the channel, and the largest packet it takes. */
  granted: number;
  maxPacket: number;
}

/** A channel as it starts: nothing received, nothing answered, no window from the server yet. */
export function newChannel(
  fields: Pick<Channel, 'local' | 'state' | 'reads' | 'granted' | 'maxPacket'> & { remote?: number },
): Channel {
  return { window: 0, data: [], stderr: [], received: 0, messages: 0, eof: false, replies: [], ...fields };
}

/** What the server sent in the authentication layer. */
export interface AuthAnswers {
  success: boolean;
  failures: Array<{ methods: string[]; partial: boolean }>;
  pkOk: number;
  prompts: Array<{ name: string; instructions: string; prompts: number }>;
}

const KEEP = 64 * 1024;

export class SshWire {
  readonly socket: Socket;
  private readonly proto: Protocol;
  /** Everything that changed state, for waiters. */
  private readonly waiters = new Set<() => void>();
  closed = false;
  /** Writes nothing more: a case stopped at a stage, where the transport would answer what arrived. */
  frozen = false;
  /** Why the transport failed on this side, if it did (a server message it could not parse, a MAC that failed). */
  error: string | undefined;
  /**
   * Where this client itself failed, if it did: the stack ssh2 threw from, reading what the server sent or writing a
   * packet of its own.
   */
  failedAt: string | undefined;
  serverIdent: string | undefined;
  /** Packets received (the server's KEXINIT is the first). */
  inbound = 0;
  kexDone = false;
  serviceAccepted: string[] = [];
  disconnect: { reason: number; description: string } | undefined;
  readonly auth: AuthAnswers = { success: false, failures: [], pkOk: 0, prompts: [] };
  readonly channels = new Map<number, Channel>();
  readonly globalReplies: boolean[] = [];
  /** Called on each inbound packet, before it is handled (a case stops at a stage from here). */
  onInbound: ((n: number) => void) | undefined;
  /** Called on the server's version, before this client starts its key exchange. */
  onIdent: (() => void) | undefined;

  constructor(opts: { port: number; localAddress: string; ident?: Buffer; offer?: Offer }) {
    this.socket = connect({ host: '127.0.0.1', port: opts.port, localAddress: opts.localAddress });
    this.socket.setNoDelay(true);
    const changed = (): void => {
      for (const waiter of this.waiters) waiter();
    };
    this.proto = new Protocol({
      ...(opts.ident ? { ident: opts.ident } : {}),
      ...(opts.offer
        ? {
            offer: {
              kex: opts.offer.kex,
              serverHostKey: opts.offer.serverHostKey,
              cs: { cipher: opts.offer.cipher, mac: opts.offer.mac, compress: opts.offer.compress, lang: [] },
              sc: { cipher: opts.offer.cipher, mac: opts.offer.mac, compress: opts.offer.compress, lang: [] },
            },
          }
        : {}),
      onWrite: (data: Buffer) => {
        if (!this.closed && !this.frozen && this.socket.writable) this.socket.write(data);
      },
      onError: (err: Error) => {
        this.error ??= err.message;
        this.failedAt ??= err.stack;
        this.socket.destroy();
      },
      onHeader: (header: { identRaw: string }) => {
        this.serverIdent = header.identRaw;
        this.onIdent?.();
        changed();
      },
      onPacket: () => {
        this.inbound++;
        this.onInbound?.(this.inbound);
        changed();
      },
      onHandshakeComplete: () => {
        this.kexDone = true;
        changed();
      },
      messageHandlers: this.handlers(changed),
    });
    this.socket.on('connect', () => this.proto.start?.());
    this.socket.on('data', (chunk: Buffer) => {
      if (this.closed) return;
      try {
        this.proto.parse(chunk, 0, chunk.length);
      } catch (err) {
        this.error ??= (err as Error).message;
        this.failedAt ??= (err as Error).stack ?? String(err);
        this.socket.destroy();
      }
    });
    this.socket.on('error', (err) => (this.error ??= err.message));
    this.socket.once('close', () => {
      this.closed = true;
      this.proto.cleanup();
      changed();
    });
  }

  private channelOf(local: number): Channel | undefined {
    return this.channels.get(local);
  }

  private handlers(changed: () => void): Record<string, (...args: never[]) => void> {
    const keep = (list: Buffer[], chan: Channel, data: Buffer): void => {
      // Empty messages are kept as nothing: a server can send them without end.
      if (chan.received < KEEP && data.length > 0) list.push(data.subarray(0, KEEP - chan.received));
      chan.received += data.length;
      chan.messages++;
      // A reading client gives the window back; one that never reads lets it run out.
      if (chan.reads && chan.remote !== undefined)
        this.send(Buffer.concat([Buffer.of(MSG.CHANNEL_WINDOW_ADJUST), u32(chan.remote), u32(data.length)]));
    };
    const on =
      <A extends unknown[]>(fn: (...args: A) => void) =>
      (_p: unknown, ...args: A): void => {
        fn(...args);
        changed();
      };
    return {
      DISCONNECT: on((reason: number, description: string) => {
        this.disconnect = { reason, description: String(description ?? '') };
      }),
      SERVICE_ACCEPT: on((name: string) => void this.serviceAccepted.push(String(name))),
      USERAUTH_SUCCESS: on(() => void (this.auth.success = true)),
      USERAUTH_FAILURE: on((methods: string[], partial: boolean) => {
        this.auth.failures.push({ methods: [...(methods ?? [])], partial: !!partial });
      }),
      USERAUTH_PK_OK: on(() => void this.auth.pkOk++),
      USERAUTH_INFO_REQUEST: on((name: string, instructions: string, prompts: unknown[]) => {
        this.auth.prompts.push({
          name: String(name ?? ''),
          instructions: String(instructions ?? ''),
          prompts: prompts?.length ?? 0,
        });
      }),
      GLOBAL_REQUEST: on((_name: string, wantReply: boolean) => {
        if (wantReply) this.send(Buffer.of(82));
      }),
      REQUEST_SUCCESS: on(() => void this.globalReplies.push(true)),
      REQUEST_FAILURE: on(() => void this.globalReplies.push(false)),
      CHANNEL_OPEN: on((info: { sender: number }) => {
        // The door opens nothing towards a client; refuse whatever comes.
        this.send(Buffer.concat([Buffer.of(92), u32(info.sender), u32(1), str(''), str('')]));
      }),
      CHANNEL_OPEN_CONFIRMATION: on((info: { recipient: number; sender: number; window: number }) => {
        const chan = this.channelOf(info.recipient);
        if (!chan) return;
        chan.remote = info.sender;
        chan.window = info.window;
        chan.state = 'open';
      }),
      CHANNEL_OPEN_FAILURE: on((recipient: number) => {
        const chan = this.channelOf(recipient);
        if (chan) chan.state = 'refused';
      }),
      CHANNEL_WINDOW_ADJUST: on((recipient: number, bytes: number) => {
        const chan = this.channelOf(recipient);
        if (chan) chan.window += bytes;
      }),
      CHANNEL_DATA: on((recipient: number, data: Buffer) => {
        const chan = this.channelOf(recipient);
        if (chan) keep(chan.data, chan, data);
      }),
      CHANNEL_EXTENDED_DATA: on((recipient: number, data: Buffer) => {
        const chan = this.channelOf(recipient);
        if (chan) keep(chan.stderr, chan, data);
      }),
      CHANNEL_EOF: on((recipient: number) => {
        const chan = this.channelOf(recipient);
        if (chan) chan.eof = true;
      }),
      CHANNEL_CLOSE: on((recipient: number) => {
        const chan = this.channelOf(recipient);
        if (!chan) return;
        if (chan.state !== 'closed' && chan.remote !== undefined)
          this.send(Buffer.concat([Buffer.of(MSG.CHANNEL_CLOSE), u32(chan.remote)]));
        chan.state = 'closed';
      }),
      CHANNEL_REQUEST: on((recipient: number, type: string, wantReply: boolean, data: unknown) => {
        const chan = this.channelOf(recipient);
        if (chan && type === 'exit-status' && typeof data === 'number') chan.exitStatus = data;
        if (wantReply && chan?.remote !== undefined)
          this.send(Buffer.concat([Buffer.of(100), u32(chan.remote)]));
      }),
      CHANNEL_SUCCESS: on((recipient: number) => void this.channelOf(recipient)?.replies.push(true)),
      CHANNEL_FAILURE: on((recipient: number) => void this.channelOf(recipient)?.replies.push(false)),
    };
  }

  /** The session identifier (the first exchange hash), which publickey signatures cover. */
  get sessionId(): Buffer {
    return this.proto._kex?.sessionID ?? Buffer.alloc(0);
  }

  /**
   * Sends one message as a packet: encrypted, authenticated and (when negotiated) compressed as the transport does
   * every packet, whatever the payload holds. Before the key exchange ends, ssh2 holds it until it does.
   */
  send(payload: Buffer): void {
    if (this.closed || this.frozen) return;
    const writer = this.proto._packetRW.write;
    const packet = writer.alloc(payload.length);
    packet.set(payload, writer.allocStart);
    try {
      sendPacket(this.proto, writer.finalize(packet));
    } catch (err) {
      // The transport is gone (ssh2 makes a failed instance throw on every write).
      this.error ??= (err as Error).message;
      this.failedAt ??= (err as Error).stack;
      this.socket.destroy();
    }
  }

  /** Bytes on the socket as they are, past the transport: framing, MACs and ciphers see them as the stream. */
  writeRaw(bytes: Buffer): void {
    if (!this.closed && !this.frozen && this.socket.writable) this.socket.write(bytes);
  }

  /** Writes nothing from now on (the socket stays open): the client stops at the stage it is at. */
  freeze(): void {
    this.frozen = true;
  }

  /** Starts a second key exchange. */
  rekey(): void {
    try {
      this.proto.rekey();
    } catch (err) {
      this.error ??= (err as Error).message;
    }
  }

  /** An authentication request, with what ssh2 needs to read the answer (a 60 means PK_OK or INFO_REQUEST by it). */
  authRequest(method: string, payload: Buffer): void {
    this.proto._authsQueue.push(method);
    this.send(payload);
  }

  /** Opens a channel of `type` with `extra` after the standard fields; the server's answer lands in `channels`. */
  openChannel(type: string, window: number, maxPacket: number, extra: Buffer, reads: boolean): Channel {
    const local = this.channels.size;
    const chan = newChannel({ local, state: 'opening', reads, granted: window, maxPacket });
    this.channels.set(local, chan);
    this.send(
      Buffer.concat([Buffer.of(MSG.CHANNEL_OPEN), str(type), u32(local), u32(window), u32(maxPacket), extra]),
    );
    return chan;
  }

  /** A request on a channel (exec, subsystem, pty-req, ...): `data` follows its type and want-reply. */
  channelRequest(chan: Channel, type: string, wantReply: boolean, data: Buffer): void {
    if (chan.remote === undefined) return;
    this.send(
      Buffer.concat([Buffer.of(MSG.CHANNEL_REQUEST), u32(chan.remote), str(type), bool(wantReply), data]),
    );
  }

  /** Data on a channel, cut to the window the server gave (what it did not give is not sent). */
  channelData(chan: Channel, data: Buffer): void {
    if (chan.remote === undefined || chan.state !== 'open') return;
    const allowed = data.subarray(0, Math.max(0, chan.window));
    for (let at = 0; at < allowed.length; at += 32 * 1024) {
      const piece = allowed.subarray(at, at + 32 * 1024);
      chan.window -= piece.length;
      this.send(Buffer.concat([Buffer.of(MSG.CHANNEL_DATA), u32(chan.remote), str(piece)]));
    }
  }

  /** Resolves once `done()` holds ('ok'), the connection closes first ('closed'), or `ms` pass ('timeout'). */
  until(done: () => boolean, ms: number): Promise<'ok' | 'closed' | 'timeout'> {
    if (done()) return Promise.resolve('ok');
    if (this.closed) return Promise.resolve('closed');
    return new Promise((resolve) => {
      const check = (): void => {
        if (done()) finish('ok');
        else if (this.closed) finish('closed');
      };
      const timer = setTimeout(() => finish('timeout'), ms);
      const finish = (how: 'ok' | 'closed' | 'timeout'): void => {
        clearTimeout(timer);
        this.waiters.delete(check);
        resolve(how);
      };
      this.waiters.add(check);
    });
  }

  /** Stops reading the socket: what the server writes piles up in its buffers and the kernel's. */
  stopReading(): void {
    this.socket.pause();
    for (const chan of this.channels.values()) chan.reads = false;
  }

  /** Ends the connection: `close` sends a FIN and waits for the server's, `reset` destroys it at once. */
  async end(how: 'close' | 'reset', ms: number): Promise<void> {
    if (this.closed) return;
    if (how === 'reset') this.socket.resetAndDestroy();
    else {
      this.socket.end();
      this.socket.resume();
      await this.until(() => false, ms);
    }
    this.socket.destroy();
  }
}

/** The payload of a USERAUTH_REQUEST up to its method-specific fields. */
export const authHead = (user: Buffer | string, method: string, service = 'ssh-connection'): Buffer =>
  Buffer.concat([Buffer.of(MSG.USERAUTH_REQUEST), str(user), str(service), str(method)]);

/** A publickey request: a query without a signature, or signed as RFC 4252 7 says (session id, then the request). */
export function publickeyRequest(
  wire: SshWire,
  user: Buffer | string,
  algo: string,
  blob: Buffer,
  signature: ((data: Buffer) => Buffer) | Buffer | undefined,
): Buffer {
  const head = Buffer.concat([
    authHead(user, 'publickey'),
    bool(signature !== undefined),
    str(algo),
    str(blob),
  ]);
  if (signature === undefined) return head;
  const sig = Buffer.isBuffer(signature) ? signature : signature(Buffer.concat([str(wire.sessionId), head]));
  return Buffer.concat([head, str(sig)]);
}
