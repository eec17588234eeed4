// What answers and upgraded connections nobody reads may hold of a process's memory, per user and in all.
//
// Every hop relays an answer from an HTTP/2 stream (the API server's, a tunnel's, a peer link's) to the client that
// asked, and takes no more from the stream than the client takes (relay, below). An upgraded connection (exec, attach,
// port-forward, a reach connection) is two such relays, one each way, between the client's connection and the
// upstream's, which through a tunnel or a peer link is an HTTP/2 stream too. But HTTP/2 flow control lets the
// sender send a whole stream window before it hears that nobody reads: a client that opens many requests or upgrades
// and never reads makes every process on the way hold a window of bytes for each. Node's HTTP/2 offers no way to size
// one stream's window apart from the others' (only the connection's, which lib/http2/window.ts grows while its
// streams are read fast), so a window cannot be small for a stalled stream and large for a fast one. The budget
// therefore works on what a stalled stream can hold at most: when a side
// stops taking what is relayed to it, the relay is charged the most its source can come to hold (for an HTTP/2
// stream its connection's stream window as it is now: what is already buffered for it plus what its sender may still
// send; charged anew whenever that window grows; for a socket what it has read) and what waits to be written, to the
// user who asked; the charge is dropped once the buffers are empty
// again. When a charge would take a user over their share, or the process over its total, a relay is cut (with the
// answer or the upgraded connection it carries): the user's that has gone unread longest (when the process is over
// its total, of the user who holds most). So the bytes held for stalled answers and upgrades never exceed the
// limits, and what one user leaves unread costs nobody else anything. One thing another user can do is make a
// share hold fewer stalled streams: a window grows per connection (window.ts), and a connection to the API server or a
// tunnel carries many users, so one user's fast transfer raises the charge of every stalled stream on it, up to
// MAX_STREAM_WINDOW_BYTES each (four to a share). The bytes held never exceed the limits.
//
// "Unread longest" is the charge that has stood longest. A relay that is read at full speed still stalls for a moment
// now and then (a write waits on the one before it), and each stall charges it anew, at the back of the line; so a
// relay nobody reads is always cut before it. Two relays nobody reads go in the order their buffers filled (a client
// that stops reading takes a chunk at a time until the kernel's buffers are full), which may not be the order they
// stopped in: either way one of the stopped ones goes. Ordering by when a reader first stopped instead cut a relay
// read at full speed, charged once long ago, before the stopped ones.
//
// A relay that is being read holds at most what its reader has not yet taken of the last chunk (below the
// writable's high-water mark, or it would have stalled); those bytes are not charged.
import type { Readable } from 'node:stream';
import type { Clock } from '../clock.ts';
import type { Http2Stream } from 'node:http2';
import { STREAM_WINDOW_BYTES, windowOf, type StreamWindow } from './window.ts';

export interface MemoryLimits {
  /** What one user's unread answers and upgrades may hold in this process. */
  perUserBytes: number;
  /** What all users' unread answers and upgrades may hold in this process. */
  totalBytes: number;
}

/**
 * One user's share: 64 unread answers or upgrades at a first stream window (lib/http2/window.ts STREAM_WINDOW_BYTES),
 * many more than kubectl or a controller leaves unread at once, and a small part of any replica's or agent's memory
 * limit; 4 at the largest window, on a connection whose streams are being read at full speed.
 */
export const USER_UNREAD_BYTES = 16 * 1024 * 1024;
/** The concierge's total: half its memory limit (512 MiB). */
export const CONCIERGE_UNREAD_BYTES = 256 * 1024 * 1024;
/** The agent's total: well within its memory limit (256 MiB), beside what the agent itself needs. */
export const AGENT_UNREAD_BYTES = 96 * 1024 * 1024;

/** One relay's charge while its reader does not take it. */
interface Stall {
  user: string;
  bytes: number;
  cut(): void;
}

interface Holder {
  bytes: number;
  /** The user's stalled relays, in the order they stalled: the first has gone unread longest. */
  stalls: Set<Stall>;
}

export interface MemoryBudget {
  readonly limits: MemoryLimits;
  /** Bytes charged for `user`'s stalled relays, or for everyone's. */
  held(user?: string): number;
  /** Relays (answers and upgraded connections) cut to keep within the limits, since the budget was made. */
  cuts(): number;
  /** Charges `bytes` to `stall` (anew if it was charged before), cutting relays as the limits require. */
  charge(stall: Stall, bytes: number): void;
  /** Drops `stall`'s charge. */
  discharge(stall: Stall): void;
}

export function newMemoryBudget(limits: MemoryLimits, onCut?: (user: string) => void): MemoryBudget {
  const holders = new Map<string, Holder>();
  let total = 0;
  let cuts = 0;

  const discharge = (stall: Stall): void => {
    const holder = holders.get(stall.user);
    if (!holder?.stalls.delete(stall)) return;
    holder.bytes -= stall.bytes;
    total -= stall.bytes;
    if (holder.stalls.size === 0) holders.delete(stall.user);
  };

  const cut = (victim: Stall): void => {
    discharge(victim);
    cuts++;
    onCut?.(victim.user);
    victim.cut();
  };

  /** The user with the most charged, whose longest-unread answer goes when the process is over its total. */
  const largest = (): Holder | undefined => {
    let found: Holder | undefined;
    for (const holder of holders.values()) if (!found || holder.bytes > found.bytes) found = holder;
    return found;
  };

  return {
    limits,
    held: (user) => (user === undefined ? total : (holders.get(user)?.bytes ?? 0)),
    cuts: () => cuts,
    charge(stall, bytes) {
      discharge(stall);
      // The answer that has gone unread longest goes first; when the process is over its total, the one of the user
      // who holds most.
      let own = holders.get(stall.user);
      while (own && own.bytes + bytes > limits.perUserBytes) {
        cut(own.stalls.values().next().value!);
        own = holders.get(stall.user);
      }
      let richest: Holder | undefined;
      while (total + bytes > limits.totalBytes && (richest = largest()))
        cut(richest.stalls.values().next().value!);
      if (bytes > limits.perUserBytes || bytes > limits.totalBytes) {
        // This answer alone is more than a share.
        cuts++;
        onCut?.(stall.user);
        return stall.cut();
      }
      own = holders.get(stall.user);
      if (!own) holders.set(stall.user, (own = { bytes: 0, stalls: new Set() }));
      own.stalls.add(stall);
      own.bytes += bytes;
      total += bytes;
      stall.bytes = bytes;
    },
    discharge,
  };
}

/** What a relay's bytes are charged to: a budget and the user who asked. */
export interface Account {
  budget: MemoryBudget;
  user: string;
}

export interface RelayOptions {
  /** Where the relay's unread bytes are charged while its reader does not take them. */
  account?: Account;
  /** Cuts the relay when its reader has taken nothing of what is buffered for `ms`. */
  deadline?: { ms: number; clock: Clock };
  /** Counts the bytes as they are relayed. */
  tally?: { bytes: number };
  /**
   * How the budget or the deadline cuts the relay. Default: destroys `to` (the caller's 'close' handling then cancels
   * `from`); an upgraded connection destroys both sides.
   */
  cut?: () => void;
}

/** Where a relay writes: an HTTP response, or one side of an upgraded connection (a socket, a tunnel's stream). */
export interface Sink {
  write(chunk: Buffer): boolean;
  end(): void;
  destroy(): void;
  readonly destroyed: boolean;
  /** Bytes written and not yet sent. */
  readonly writableLength: number;
  once(event: 'close' | 'drain', listener: () => void): unknown;
}

/** The window of `from`'s HTTP/2 connection, when `from` is an HTTP/2 stream (a Node core stream has a reset code). */
const windowOfStream = (from: Readable): StreamWindow | undefined =>
  'rstCode' in from ? (windowOf((from as Http2Stream).session) ?? FIRST_WINDOW) : undefined;
/** The window of a connection whose windows are not sized (lib/http2/window.ts): the first, for good. */
const FIRST_WINDOW: StreamWindow = {
  bytes: STREAM_WINDOW_BYTES,
  received: () => {},
  stalled: () => {},
  onGrow: () => () => {},
};

/**
 * The most a paused `from` can come to hold. An HTTP/2 stream (every stream a hop reads from: an answer's, and a
 * tunnel's or peer link's that carries an upgrade) holds what it has buffered and what its sender may still send, no
 * more than its connection's stream window together, or what it holds already if that is more; cheaper than reading
 * the stream's state from the HTTP/2 session, and never less. A socket holds only what it has read: while it is
 * paused, what its peer sends waits in the kernel, outside the process.
 */
const mostHeld = (from: Readable, window: StreamWindow | undefined): number =>
  window ? Math.max(from.readableLength, window.bytes) : from.readableLength;

/**
 * Streams `from` into `to` and ends `to` when `from` ends, taking from `from` no faster than `to` takes it: what
 * pipe() does, minus its half-dozen listeners per request. While `to` does not take what is written, the relay is
 * charged to `account` (see above) and the deadline runs; either may cut it (`cut`). Errors are the caller's to
 * handle.
 *
 * What a stall needs (its charge, its timer, the listeners that end them) is made when the relay first stalls: most
 * never do, and an idle watch, which writes nothing, would keep it for as long as it stays open.
 */
export function relay(from: Readable, to: Sink, opts: RelayOptions = {}): void {
  let stalled: Stalled | undefined;
  const { tally } = opts;
  const window = windowOfStream(from);
  from.on('data', (chunk: Buffer) => {
    if (tally) tally.bytes += chunk.length;
    // Taken while the reader keeps up: what sizes the connection's windows.
    window?.received(chunk.length);
    if (to.write(chunk)) {
      // Everything buffered for the reader has gone: the relay holds nothing worth charging.
      if (from.readableLength === 0) stalled?.release();
      return;
    }
    stalled ??= newStalled(from, to, window, opts);
    stalled.wait();
  });
  from.on('end', () => to.end());
}

/** A relay whose reader has stopped taking it, at least once: its charge and its deadline. */
interface Stalled {
  /** Pauses `from` until `to` takes what is written, charging the relay and running its deadline meanwhile. */
  wait(): void;
  /** Drops the relay's charge: it holds nothing worth charging. */
  release(): void;
}

function newStalled(
  from: Readable,
  to: Sink,
  window: StreamWindow | undefined,
  { account, deadline, cut }: RelayOptions,
): Stalled {
  let waiting = false;
  let timer: unknown;
  const cutShort = cut ?? (() => to.destroy());
  /** Whether `stall` is charged now. */
  let charged = false;
  const stall: Stall | undefined = account && {
    user: account.user,
    bytes: 0,
    cut: () => {
      charged = false;
      cutShort();
    },
  };
  const charge = (): void => {
    charged = true;
    account!.budget.charge(stall!, mostHeld(from, window) + to.writableLength);
  };
  const release = (): void => {
    if (!charged) return;
    charged = false;
    account!.budget.discharge(stall!);
  };
  // A charged relay's sender may send up to the grown window: it is charged for that before the sender hears of it.
  const stopRecharging = stall && window?.onGrow(() => charged && charge());
  const resume = (): void => {
    waiting = false;
    if (deadline) deadline.clock.clearTimeout(timer);
    // All that was written has gone and nothing waits in `from`: nothing is held (an idle shell after a burst of
    // output keeps no charge for as long as it stays open). What `from` still buffers is discharged as it goes.
    if (from.readableLength === 0) release();
    from.resume();
  };
  to.once('close', () => {
    if (deadline) deadline.clock.clearTimeout(timer);
    stopRecharging?.();
    release();
  });
  return {
    release,
    wait() {
      // A sink already gone (its client left) stalls nothing: its 'close', which discharges, has come.
      if (waiting || to.destroyed) return;
      waiting = true;
      window?.stalled();
      from.pause();
      if (stall) charge();
      if (deadline) timer = deadline.clock.setTimeout(cutShort, deadline.ms);
      to.once('drain', resume);
    },
  };
}
