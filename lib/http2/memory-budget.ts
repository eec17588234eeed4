// What answers nobody reads may hold of a process's memory, per user and in all.
//
// Every hop relays an answer from an HTTP/2 stream (the API server's, a tunnel's, a peer link's) to the client that
// asked, and takes no more from the stream than the client takes (relay, below). But HTTP/2 flow control lets the
// sender send a whole stream window before it hears that nobody reads: a client that opens many requests and never
// reads makes every process on the way hold a window of bytes per request. Node's HTTP/2 offers no way to size one
// stream's window apart from the others' (only the connection's), so a window cannot be small for a stalled stream
// and large for a fast one. The budget therefore works on what a stalled stream can hold at most: when a client stops
// taking an answer, the answer is charged the most it can come to hold (a stream window: what is already buffered for
// it plus what its sender may still send) and what waits for the client, to the user who asked; the charge is dropped
// once the answer's buffers are empty again. When a charge would take a user over their share, or the process over its total, an answer is cut: the user's
// answer that has gone unread longest (when the process is over its total, of the user who holds most). So the bytes
// held for stalled answers never exceed the limits, and one user's unread answers cost nobody else anything.
//
// An answer that is being read holds at most what its client has not yet taken of the last chunk (below the
// response's high-water mark, or it would have stalled); those bytes are not charged.
import type { Readable } from 'node:stream';
import type { Clock } from '../clock.ts';
import { STREAM_WINDOW_BYTES } from './pool.ts';
import type { Response } from './request.ts';

export interface MemoryLimits {
  /** What one user's unread answers may hold in this process. */
  perUserBytes: number;
  /** What all users' unread answers may hold in this process. */
  totalBytes: number;
}

/**
 * One user's share: 64 unread answers at a full stream window (lib/http2/pool.ts STREAM_WINDOW_BYTES), many more than
 * kubectl or a controller leaves unread at once, and a small part of any replica's or agent's memory limit.
 */
export const USER_UNREAD_BYTES = 16 * 1024 * 1024;
/** The concierge's total: half its memory limit (512 MiB). */
export const CONCIERGE_UNREAD_BYTES = 256 * 1024 * 1024;
/** The agent's total: well within its memory limit (256 MiB), beside what the agent itself needs. */
export const AGENT_UNREAD_BYTES = 96 * 1024 * 1024;

/** One answer's charge while its client does not take it. */
interface Stall {
  user: string;
  bytes: number;
  cut(): void;
}

interface Holder {
  bytes: number;
  /** The user's stalled answers, in the order they stalled: the first has gone unread longest. */
  stalls: Set<Stall>;
}

export interface MemoryBudget {
  readonly limits: MemoryLimits;
  /** Bytes charged for `user`'s stalled answers, or for everyone's. */
  held(user?: string): number;
  /** Answers cut to keep within the limits, since the budget was made. */
  cuts(): number;
  /** Charges `bytes` to `stall` (anew if it was charged before), cutting answers as the limits require. */
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

/** What a relayed answer's bytes are charged to: a budget and the user who asked. */
export interface Account {
  budget: MemoryBudget;
  user: string;
}

export interface RelayOptions {
  /** Where the answer's unread bytes are charged while its client does not take them. */
  account?: Account;
  /** Cuts the answer when the client has taken nothing of what is buffered for `ms`. */
  deadline?: { ms: number; clock: Clock };
  /** Counts the answer's bytes as they are relayed. */
  tally?: { bytes: number };
}

/**
 * The most a paused stream can come to hold: a stream window (every stream a hop reads from is an HTTP/2 stream with
 * that window: what it has buffered and what its sender may still send add up to no more), or what it holds already
 * if that is more. Cheaper than reading the stream's state from the HTTP/2 session, and never less.
 */
const mostHeld = (from: Readable): number => Math.max(from.readableLength, STREAM_WINDOW_BYTES);

/**
 * Streams `from` into the response and ends it when `from` ends, taking from `from` no faster than the client takes
 * the response: what pipe() does, minus its half-dozen listeners per request. While the client does not take what
 * is written, the answer is charged to `account` (see above) and the deadline runs; either may cut the answer, which
 * destroys the response (the caller's 'close' handling then cancels `from`). Errors are the caller's to handle.
 *
 * What a stall needs (its charge, its timer, the listeners that end them) is made when the answer first stalls: most
 * answers never do, and an idle watch, which writes nothing, would keep it for as long as it stays open.
 */
export function relay(from: Readable, res: Response, opts: RelayOptions = {}): void {
  let stalled: Stalled | undefined;
  const { tally } = opts;
  from.on('data', (chunk: Buffer) => {
    if (tally) tally.bytes += chunk.length;
    if (res.write(chunk)) {
      // Everything buffered for the client has gone: the answer holds nothing worth charging.
      if (stalled?.stall?.bytes && from.readableLength === 0) opts.account!.budget.discharge(stalled.stall);
      return;
    }
    stalled ??= newStalled(from, res, opts);
    stalled.wait();
  });
  from.on('end', () => res.end());
}

/** An answer whose client has stopped taking it, at least once: its charge and its deadline. */
interface Stalled {
  /** Pauses `from` until the client takes what is written, charging the answer and running its deadline meanwhile. */
  wait(): void;
  stall: Stall | undefined;
}

function newStalled(from: Readable, res: Response, { account, deadline }: RelayOptions): Stalled {
  let waiting = false;
  let timer: unknown;
  const stall: Stall | undefined = account && { user: account.user, bytes: 0, cut: () => res.destroy() };
  const resume = (): void => {
    waiting = false;
    if (deadline) deadline.clock.clearTimeout(timer);
    from.resume();
  };
  res.once('close', () => {
    if (deadline) deadline.clock.clearTimeout(timer);
    if (stall) account!.budget.discharge(stall);
  });
  return {
    stall,
    wait() {
      // A response already gone (its client left) stalls nothing: its 'close', which discharges, has come.
      if (waiting || res.destroyed) return;
      waiting = true;
      from.pause();
      if (stall) account!.budget.charge(stall, mostHeld(from) + res.writableLength);
      if (deadline) timer = deadline.clock.setTimeout(() => res.destroy(), deadline.ms);
      res.once('drain', resume);
    },
  };
}
