// Two connections joined both ways: a client's upgraded connection and its upstream (lib/http2/upgrade.ts), a reach
// connection and its target (lib/reach/dialer.ts), an SSH `-L` channel and its reach connection (the SSH door). One
// set of rules for all of them:
//
// - Each way is a relay (lib/http2/memory-budget.ts): it takes from one side no faster than the other takes it, and
//   what a side leaves unread is charged to the user's memory budget.
// - A side that ends its writing has its end passed on to the other, and still reads what comes back (for a side that
//   allows half-open connections; one that does not ends both its ways itself).
// - An error on either side, or a cut (the budget, a deadline, an idle connection), destroys both.
// - A side that closes after ending both ways leaves the other to finish writing what it was given, then close (both
//   its ways have ended too by then). A side that closes cut short has nothing more to give or take: the other is
//   destroyed, or it would go on holding what it read, and its place, for a side that is gone.
//
// Not `stream.pipeline(a, b)` and `pipeline(b, a)` (or `pump`, which does the same): they join with half-close and
// destroy both on an error, but a pipe takes from its source what the destination's buffer takes, with no charge to a
// budget for a side that stops reading, no stall deadline, and half a dozen listeners a way. `duplexify` makes one
// duplex out of a readable and a writable, which is not this.
import type { Duplex } from 'node:stream';
import type { Clock } from '../clock.ts';
import { relay, type Account } from '../http2/memory-budget.ts';

export interface JoinOptions {
  /** Where what either side leaves unread is charged (lib/http2/memory-budget.ts). Default: nowhere. */
  account?: Account;
  /**
   * Destroys both when `client` has taken nothing of what `upstream` sent for `ms`. A connection with nothing pending
   * is never cut by it. Default: no deadline.
   */
  deadline?: { ms: number; clock: Clock };
  /** Destroys both when no byte has gone either way for `ms`. Default: never. */
  idle?: { ms: number; clock: Clock };
  /** Counted as the bytes go by: `sent` from `client` to `upstream`, `received` back. Default: not counted. */
  counts?: { sent: number; received: number };
  /** Told once both sides have closed. */
  closed?: () => void;
}

/** Joins `client` and `upstream` both ways, by the rules above, until both have closed. */
export function join(client: Duplex, upstream: Duplex, opts: JoinOptions = {}): void {
  const destroy = (): void => {
    client.destroy();
    upstream.destroy();
  };
  client.on('error', destroy);
  upstream.on('error', destroy);
  const idle = opts.idle && idleCut(opts.idle, destroy);
  if (opts.counts || idle) countBytes(client, upstream, opts.counts, idle);
  let open = 2;
  const closed = (side: Duplex, other: Duplex) => (): void => {
    closeAfter(side, other);
    if (--open > 0) return;
    idle?.stop();
    opts.closed?.();
  };
  whenClosed(client, closed(client, upstream));
  whenClosed(upstream, closed(upstream, client));
  if (client.destroyed || upstream.destroyed) return destroy();
  const account = opts.account ? { account: opts.account } : {};
  relay(upstream, client, {
    ...account,
    ...(opts.deadline ? { deadline: opts.deadline } : {}),
    cut: destroy,
  });
  relay(client, upstream, { ...account, cut: destroy });
}

/** Ends `other` when `side` closed after ending both ways, and destroys it when `side` was cut short. */
function closeAfter(side: Duplex, other: Duplex): void {
  if (!(side.readableEnded && side.writableFinished)) return void other.destroy();
  // Ending a side that has ended or gone already only makes an error nobody reads (and its stack, per connection).
  if (!other.destroyed && !other.writableEnded) other.end();
}

/** Calls `fire` once `side` has closed, now or later. */
function whenClosed(side: Duplex, fire: () => void): void {
  if (side.closed) process.nextTick(fire);
  else side.once('close', fire);
}

interface IdleCut {
  /** A byte went by. */
  touch(): void;
  stop(): void;
}

/**
 * Cuts after `ms` without a byte either way. A byte only notes the time; the one timer, when it fires early, waits for
 * the rest: cheaper than re-arming a timer for every chunk.
 */
function idleCut({ ms, clock }: { ms: number; clock: Clock }, cut: () => void): IdleCut {
  let last = clock.now();
  let timer: unknown;
  const check = (): void => {
    const quiet = clock.now() - last;
    if (quiet >= ms) return cut();
    timer = clock.setTimeout(check, ms - quiet);
  };
  timer = clock.setTimeout(check, ms);
  return {
    touch: () => void (last = clock.now()),
    stop: () => clock.clearTimeout(timer),
  };
}

function countBytes(
  client: Duplex,
  upstream: Duplex,
  counts: { sent: number; received: number } | undefined,
  idle: IdleCut | undefined,
): void {
  client.on('data', (chunk: Buffer) => {
    if (counts) counts.sent += chunk.length;
    idle?.touch();
  });
  upstream.on('data', (chunk: Buffer) => {
    if (counts) counts.received += chunk.length;
    idle?.touch();
  });
}
