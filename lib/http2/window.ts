// Stream windows sized to the path's bandwidth-delay product. A stream moves at most one window per round trip: at
// STREAM_WINDOW_BYTES and the few milliseconds a busy process takes to answer, one stream through the tunnel stops
// near 50 MiB/s, whatever the wire could carry. A window as large as the fastest path needs would let every stream a
// client leaves unread hold that much in each process on the way (lib/http2/memory-budget.ts charges it).
//
// Node's HTTP/2 sizes windows per connection only: SETTINGS_INITIAL_WINDOW_SIZE (every stream's window, the open ones
// included) and the connection's own window; nothing sizes one stream's window apart from the others'. So the
// window grows per connection, as gRPC's BDP estimator does: while bytes are relayed off the connection's streams (a
// relay takes them only while its reader keeps up), a PING is sent and the bytes received until its answer are
// counted. When one round trip brought in two thirds of the window or more, and no relay off the connection stalled
// meanwhile (its reader kept up), the sender was held back by the window: it doubles, up to MAX_STREAM_WINDOW_BYTES
// (a quarter of a user's share, lib/http2/memory-budget.ts USER_UNREAD_BYTES, so that a share always holds four
// stalled streams at the largest window). After a quiet second it goes back to STREAM_WINDOW_BYTES.
//
// What it costs: a PING each round trip while bytes flow, and a larger charge for every stream that stalls on a
// connection whose window has grown (its relays are charged anew the moment it grows, so the bytes held for unread
// streams still never exceed the budget; a user's share holds fewer stalled streams while the window is large).
import type { Http2Session } from 'node:http2';
import { systemClock, type Clock } from '../clock.ts';

/**
 * Every stream's window to begin with, on every HTTP/2 connection Sealion opens (the API server's, the tunnels', the
 * peer links'): HTTP/2's default (64 KiB) lets a few concurrent LISTs stall each other; 256 KiB keeps a loopback or
 * LAN hop at full speed, and a user's share of unread answers (lib/http2/memory-budget.ts) worth 64 streams.
 */
export const STREAM_WINDOW_BYTES = 256 * 1024;
/**
 * The most a connection's stream window grows to: 16 times the first, 4 MiB a round trip (400 MiB/s at 10 ms), and
 * still within each connection's own window (16 MiB for a tunnel, 32 MiB for the API server's).
 */
export const MAX_STREAM_WINDOW_BYTES = 4 << 20;
/** The share of a window that, received within one round trip, shows the sender was waiting on the window. */
const GROW_AT = 2 / 3;
/** A window goes back to STREAM_WINDOW_BYTES once its connection has relayed nothing for this long. */
const QUIET_MS = 1000;

export interface StreamWindow {
  /** The most one stream of the connection may hold unread now: the larger of the windows its peer may be using. */
  readonly bytes: number;
  /** Counts `n` bytes relayed off one of the connection's streams. */
  received(n: number): void;
  /** A relay off one of the connection's streams stalled: its reader did not keep up, so this round grows nothing. */
  stalled(): void;
  /**
   * Calls `recharge` each time the window grows, before the peer hears of it (a stalled relay's charge must cover the
   * larger window). Returns the function that stops it.
   */
  onGrow(recharge: () => void): () => void;
}

const windows = new WeakMap<Http2Session, StreamWindow>();

/** The window of `session`, if its windows are sized here. */
export const windowOf = (session: Http2Session | undefined): StreamWindow | undefined =>
  session && windows.get(session);

/**
 * Sizes the stream windows of `session` (whose SETTINGS said STREAM_WINDOW_BYTES) to what its streams move in a
 * round trip, as above. `clock` tells the quiet time (default: systemClock).
 */
export function sizeWindows(
  session: Http2Session,
  { clock = systemClock }: { clock?: Clock } = {},
): StreamWindow {
  let bytes = STREAM_WINDOW_BYTES;
  /** A SETTINGS change is on its way: no other is made until it is acknowledged. */
  let changing = false;
  /** Bytes counted since the PING in flight was sent, if one is. */
  let counted: number | undefined;
  /** A relay stalled during the round in flight. */
  let spoiled = false;
  let lastRound = clock.now();
  const recharges = new Set<() => void>();

  const change = (next: number): void => {
    changing = true;
    const growing = next > bytes;
    if (growing) {
      bytes = next;
      for (const recharge of recharges) recharge();
    }
    try {
      session.settings({ initialWindowSize: next }, () => {
        changing = false;
        // A smaller window counts once the peer has acknowledged it: until then it may send to the larger one.
        if (!growing) bytes = next;
      });
    } catch {
      changing = false; // the session is closing
    }
  };

  const roundTrip = (err: Error | null): void => {
    const sample = counted ?? 0;
    const grows = !spoiled && sample >= bytes * GROW_AT;
    counted = undefined;
    spoiled = false;
    lastRound = clock.now();
    if (err || changing || session.destroyed) return;
    const next = Math.min(bytes * 2, MAX_STREAM_WINDOW_BYTES);
    if (grows && next > bytes) change(next);
  };

  const window: StreamWindow = {
    get bytes() {
      return bytes;
    },
    received(n) {
      if (counted !== undefined) return void (counted += n);
      if (session.destroyed || session.connecting) return;
      if (bytes > STREAM_WINDOW_BYTES && !changing && clock.now() - lastRound >= QUIET_MS)
        change(STREAM_WINDOW_BYTES);
      counted = n;
      spoiled = false;
      try {
        if (!session.ping(roundTrip)) counted = undefined;
      } catch {
        counted = undefined; // the session is closing
      }
    },
    stalled() {
      if (counted !== undefined) spoiled = true;
    },
    onGrow(recharge) {
      recharges.add(recharge);
      return () => void recharges.delete(recharge);
    },
  };
  windows.set(session, window);
  return window;
}
