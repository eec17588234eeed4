// SSH_MSG_USERAUTH_BANNER (RFC 4252 section 5.4): text the server may send at any moment before authentication
// succeeds, which OpenSSH prints on stderr, BatchMode or not. It is the one way to tell a client that does no
// keyboard-interactive (a script in BatchMode) why its key was refused, and to tell everyone until when a device
// login bound their key. ssh2 sends only a fixed banner once per connection, so this writes the message through its
// protocol object as that fixed banner is written: encrypted at once, or queued behind a key exchange under way.
import type { AuthContext } from 'ssh2';

const USERAUTH_BANNER = 53;
/** A banner longer than this is cut: it is a line or two for a terminal. */
const MAX_BANNER_CHARS = 1024;

/**
 * Text as one line a terminal shows as it is: control and format characters (a line break, an escape sequence, a
 * bidirectional override) become spaces. What the door tells a client may quote a cluster's or an issuer's text.
 */
export const oneLine = (text: string): string => text.replace(/[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]+/gu, ' ');

/** The parts of ssh2's protocol object a banner is written with (ssh2 1.x: lib/protocol/Protocol.js). */
interface Wire {
  _packetRW?: {
    write?: { allocStart: number; alloc(size: number): Buffer; finalize(packet: Buffer): Buffer };
  };
  _kexinit?: unknown;
  _queue?: Buffer[];
  _cipher?: { encrypt(packet: Buffer): void };
}

/**
 * Sends `text` (printable characters only; a line break is added) as a banner on the connection of `ctx`. Does
 * nothing when ssh2's protocol object is not as expected: a banner is help, never a reason to fail a login.
 */
export function sendBanner(ctx: AuthContext, text: string): void {
  const wire = (ctx as unknown as { _protocol?: Wire })._protocol;
  const writer = wire?._packetRW?.write;
  const cipher = wire?._cipher;
  if (!wire || !writer || !cipher) return;
  const line = oneLine(text).slice(0, MAX_BANNER_CHARS);
  const body = Buffer.from(`${line}\r\n`);
  try {
    let at = writer.allocStart;
    const packet = writer.alloc(1 + 4 + body.length + 4);
    packet[at] = USERAUTH_BANNER;
    packet.writeUInt32BE(body.length, ++at);
    body.copy(packet, (at += 4));
    // The language tag: empty.
    packet.writeUInt32BE(0, at + body.length);
    const finalized = writer.finalize(packet);
    if (wire._kexinit !== undefined) (wire._queue ??= []).push(finalized);
    else cipher.encrypt(finalized);
  } catch {
    // A connection going away as the banner is written: it has nobody to tell.
  }
}
