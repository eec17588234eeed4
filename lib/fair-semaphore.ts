// A counting semaphore shared fairly among keys (for a tunnel: users). Each key may hold at most `perKey` permits,
// and all keys together at most `capacity`. A request that cannot have a permit now waits in its key's FIFO, and
// freed permits go round-robin to the keys that are waiting and under their own cap, so a key that asks for many
// permits gets its share and no more while others wait. Waiting is bounded in count (per key and in all) and in
// time. Everything is O(1) per acquire, release, cancel and timeout (intrusive linked lists, no scans), except
// configure(), which visits each key once.
import { systemClock, type Clock } from './clock.ts';
import { SealionError } from './errors.ts';

export interface FairLimits {
  /** Permits held at once by all keys together. */
  capacity: number;
  /** Permits one key may hold at once. */
  perKey: number;
  /** Requests waiting at once, all keys together; 0: refuse instead of waiting. */
  maxQueued: number;
  /** Requests one key may have waiting at once. */
  maxQueuedPerKey: number;
  /** How long a request waits for its permit before it is refused. */
  maxWaitMs: number;
}

/** The key's own share is used up: its permits are all held and its queue is full, or it waited past its cap. */
export const KEY_LIMIT = 'SEALION_FAIR_KEY_LIMIT';
/** Everyone's share is used up: the permits are all held and the queue is full, or the wait timed out. */
export const BUSY = 'SEALION_FAIR_BUSY';
/** The semaphore was closed while the request waited, or before it asked. */
export const CLOSED = 'SEALION_FAIR_CLOSED';

export class FairRefusal extends SealionError {
  /** Whether the request waited (and timed out) rather than being refused at once. */
  readonly waited: boolean;

  constructor(code: typeof KEY_LIMIT | typeof BUSY | typeof CLOSED, message: string, waited: boolean) {
    super(code, message);
    this.name = 'FairRefusal';
    this.waited = waited;
  }
}

export interface FairSemaphore {
  /**
   * Asks for a permit for `key`. `granted` gets the permit's release (idempotent), at once when a permit is free
   * (before acquire returns) or later in turn; `refused` gets why there is none. Exactly one of them is called,
   * unless the returned cancel is called first: a caller that gives up while waiting calls it (after a grant or a
   * refusal it does nothing).
   */
  acquire(
    key: string,
    granted: (release: () => void) => void,
    refused: (why: FairRefusal) => void,
  ): () => void;
  /** Takes new limits: a raised limit grants waiting requests at once; a lowered one revokes no permit. */
  configure(limits: FairLimits): void;
  /** Refuses every waiting request and every later one; held permits stay valid until released. */
  close(): void;
  /** Permits held and requests waiting, in all and for one key. */
  held(key?: string): number;
  waiting(key?: string): number;
  /** Keys with a permit or a waiting request: what the semaphore remembers (it forgets idle keys). */
  keys(): number;
}

interface Waiter {
  key: KeyState;
  granted: (release: () => void) => void;
  refused: (why: FairRefusal) => void;
  timer: unknown;
  /** Granted, refused or cancelled: out of its FIFO for good. */
  done: boolean;
  prev: Waiter | undefined;
  next: Waiter | undefined;
}

interface KeyState {
  name: string;
  held: number;
  waiting: number;
  /** The key's FIFO: head waits longest. */
  head: Waiter | undefined;
  tail: Waiter | undefined;
  /** Whether the key is in the ready ring, where `prevReady` and `nextReady` link it. */
  inRing: boolean;
  prevReady: KeyState | undefined;
  nextReady: KeyState | undefined;
}

export function newFairSemaphore(initial: FairLimits, clock: Clock = systemClock): FairSemaphore {
  let limits = initial;
  let closed = false;
  let held = 0;
  let waiting = 0;
  /** Invariant: a key is here while it holds a permit, has a waiter, or is in the ring; then only. */
  const keys = new Map<string, KeyState>();
  // The ready ring, a FIFO of keys. Invariant: a key is in it if and only if it has a waiter and holds fewer than
  // perKey permits; and while it is not empty, every permit is held.
  let ringHead: KeyState | undefined;
  let ringTail: KeyState | undefined;
  let dispatching = false;

  const forgetIfIdle = (key: KeyState): void => {
    if (key.held === 0 && key.head === undefined && !key.inRing) keys.delete(key.name);
  };

  const pushReady = (key: KeyState): void => {
    if (key.inRing) return;
    key.inRing = true;
    key.prevReady = ringTail;
    key.nextReady = undefined;
    if (ringTail) ringTail.nextReady = key;
    else ringHead = key;
    ringTail = key;
  };

  const removeReady = (key: KeyState): void => {
    if (!key.inRing) return;
    key.inRing = false;
    if (key.prevReady) key.prevReady.nextReady = key.nextReady;
    else ringHead = key.nextReady;
    if (key.nextReady) key.nextReady.prevReady = key.prevReady;
    else ringTail = key.prevReady;
    key.prevReady = key.nextReady = undefined;
  };

  /** Puts the key in the ring or takes it out, as the ring's invariant says. */
  const placeReady = (key: KeyState): void => {
    if (key.head && key.held < limits.perKey) pushReady(key);
    else removeReady(key);
  };

  const unlink = (w: Waiter): void => {
    const key = w.key;
    w.done = true;
    if (w.prev) w.prev.next = w.next;
    else key.head = w.next;
    if (w.next) w.next.prev = w.prev;
    else key.tail = w.prev;
    w.prev = w.next = undefined;
    key.waiting--;
    waiting--;
    clock.clearTimeout(w.timer);
    if (!key.head) removeReady(key);
  };

  const permit = (key: KeyState): (() => void) => {
    held++;
    key.held++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      held--;
      key.held--;
      placeReady(key);
      forgetIfIdle(key);
      dispatch();
    };
  };

  /** Hands free permits to waiting keys in ring order, one per key per turn. */
  function dispatch(): void {
    // A grant's callback may release or acquire at once; the loop below then carries on with the new state.
    if (dispatching) return;
    dispatching = true;
    try {
      while (held < limits.capacity) {
        const key = ringHead;
        if (!key) break;
        // The ring's invariant: the key has a waiter and room under its cap. Its turn passes to the back.
        removeReady(key);
        const w = key.head!;
        unlink(w);
        const release = permit(key);
        placeReady(key);
        w.granted(release);
      }
    } finally {
      dispatching = false;
    }
  }

  const refusal = (key: KeyState, waited: boolean): FairRefusal => {
    const mine = key.held >= limits.perKey;
    const why = waited ? `waited ${limits.maxWaitMs} ms` : 'the queue is full';
    return mine
      ? new FairRefusal(KEY_LIMIT, `${key.held} requests of this user in flight already; ${why}`, waited)
      : new FairRefusal(BUSY, `all ${limits.capacity} permits in use; ${why}`, waited);
  };

  const noop = (): void => {};

  return {
    acquire(name, granted, refused) {
      if (closed) {
        refused(new FairRefusal(CLOSED, 'closed', false));
        return noop;
      }
      let key = keys.get(name);
      if (!key) {
        key = {
          name,
          held: 0,
          waiting: 0,
          head: undefined,
          tail: undefined,
          inRing: false,
          prevReady: undefined,
          nextReady: undefined,
        };
        keys.set(name, key);
      }
      // A free permit means no eligible key waits (the ring's invariant): only this key's own FIFO can be ahead.
      if (held < limits.capacity && key.held < limits.perKey && key.head === undefined) {
        granted(permit(key));
        return noop;
      }
      const ownQueueFull = key.waiting >= limits.maxQueuedPerKey;
      if (ownQueueFull || waiting >= limits.maxQueued) {
        // The key's own fault when its own requests are why it cannot have or wait for a permit.
        const why =
          ownQueueFull && key.waiting > 0 && key.held < limits.perKey
            ? new FairRefusal(KEY_LIMIT, `${key.waiting} requests of this user wait already`, false)
            : refusal(key, false);
        forgetIfIdle(key);
        refused(why);
        return noop;
      }
      const w: Waiter = {
        key,
        granted,
        refused,
        timer: undefined,
        done: false,
        prev: key.tail,
        next: undefined,
      };
      if (key.tail) key.tail.next = w;
      else key.head = w;
      key.tail = w;
      key.waiting++;
      waiting++;
      placeReady(key);
      const owner = key;
      w.timer = clock.setTimeout(() => {
        if (w.done) return;
        unlink(w);
        forgetIfIdle(owner);
        w.refused(refusal(owner, true));
      }, limits.maxWaitMs);
      return () => {
        if (w.done) return;
        unlink(w);
        forgetIfIdle(owner);
      };
    },

    configure(next) {
      limits = next;
      // A changed per-key cap moves keys into the ring or out of it.
      for (const key of keys.values()) placeReady(key);
      dispatch();
    },

    close() {
      if (closed) return;
      closed = true;
      for (const key of keys.values()) {
        while (key.head) {
          const w = key.head;
          unlink(w);
          w.refused(new FairRefusal(CLOSED, 'closed while waiting', true));
        }
        forgetIfIdle(key);
      }
    },

    held: (name) => (name === undefined ? held : (keys.get(name)?.held ?? 0)),
    waiting: (name) => (name === undefined ? waiting : (keys.get(name)?.waiting ?? 0)),
    keys: () => keys.size,
  };
}
