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

const noop = (): void => {};

const newKeyState = (name: string): KeyState => ({
  name,
  held: 0,
  waiting: 0,
  head: undefined,
  tail: undefined,
  inRing: false,
  prevReady: undefined,
  nextReady: undefined,
});

/** The ready ring, a FIFO of keys linked through their `prevReady` and `nextReady`. */
class ReadyRing {
  head: KeyState | undefined;
  private tail: KeyState | undefined;

  push(key: KeyState): void {
    if (key.inRing) return;
    key.inRing = true;
    key.prevReady = this.tail;
    key.nextReady = undefined;
    if (this.tail) this.tail.nextReady = key;
    else this.head = key;
    this.tail = key;
  }

  remove(key: KeyState): void {
    if (!key.inRing) return;
    key.inRing = false;
    if (key.prevReady) key.prevReady.nextReady = key.nextReady;
    else this.head = key.nextReady;
    if (key.nextReady) key.nextReady.prevReady = key.prevReady;
    else this.tail = key.prevReady;
    key.prevReady = key.nextReady = undefined;
  }
}

class Semaphore implements FairSemaphore {
  private limits: FairLimits;
  private readonly clock: Clock;
  private closed = false;
  private heldCount = 0;
  private waitingCount = 0;
  /** Invariant: a key is here while it holds a permit, has a waiter, or is in the ring; then only. */
  private readonly keyStates = new Map<string, KeyState>();
  /**
   * Invariant: a key is in the ring if and only if it has a waiter and holds fewer than perKey permits; and while
   * the ring is not empty, every permit is held.
   */
  private readonly ring = new ReadyRing();
  private dispatching = false;

  constructor(limits: FairLimits, clock: Clock) {
    this.limits = limits;
    this.clock = clock;
  }

  acquire(
    name: string,
    granted: (release: () => void) => void,
    refused: (why: FairRefusal) => void,
  ): () => void {
    if (this.closed) {
      refused(new FairRefusal(CLOSED, 'closed', false));
      return noop;
    }
    let key = this.keyStates.get(name);
    if (!key) this.keyStates.set(name, (key = newKeyState(name)));
    // A free permit means no eligible key waits (the ring's invariant): only this key's own FIFO can be ahead.
    if (this.heldCount < this.limits.capacity && key.held < this.limits.perKey && key.head === undefined) {
      granted(this.permit(key));
      return noop;
    }
    const ownQueueFull = key.waiting >= this.limits.maxQueuedPerKey;
    if (ownQueueFull || this.waitingCount >= this.limits.maxQueued) {
      // The key's own fault when its own requests are why it cannot have or wait for a permit.
      const why =
        ownQueueFull && key.waiting > 0 && key.held < this.limits.perKey
          ? new FairRefusal(KEY_LIMIT, `${key.waiting} requests of this user wait already`, false)
          : this.refusal(key, false);
      this.forgetIfIdle(key);
      refused(why);
      return noop;
    }
    return this.wait(key, granted, refused);
  }

  /** Queues a request at the back of its key's FIFO, for at most maxWaitMs; returns its cancel. */
  private wait(
    key: KeyState,
    granted: (release: () => void) => void,
    refused: (why: FairRefusal) => void,
  ): () => void {
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
    this.waitingCount++;
    this.placeReady(key);
    w.timer = this.clock.setTimeout(() => {
      if (w.done) return;
      this.unlink(w);
      this.forgetIfIdle(key);
      w.refused(this.refusal(key, true));
    }, this.limits.maxWaitMs);
    return () => {
      if (w.done) return;
      this.unlink(w);
      this.forgetIfIdle(key);
    };
  }

  configure(next: FairLimits): void {
    this.limits = next;
    // A changed per-key cap moves keys into the ring or out of it.
    for (const key of this.keyStates.values()) this.placeReady(key);
    this.dispatch();
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    for (const key of this.keyStates.values()) {
      while (key.head) {
        const w = key.head;
        this.unlink(w);
        w.refused(new FairRefusal(CLOSED, 'closed while waiting', true));
      }
      this.forgetIfIdle(key);
    }
  }

  held(name?: string): number {
    return name === undefined ? this.heldCount : (this.keyStates.get(name)?.held ?? 0);
  }

  waiting(name?: string): number {
    return name === undefined ? this.waitingCount : (this.keyStates.get(name)?.waiting ?? 0);
  }

  keys(): number {
    return this.keyStates.size;
  }

  private forgetIfIdle(key: KeyState): void {
    if (key.held === 0 && key.head === undefined && !key.inRing) this.keyStates.delete(key.name);
  }

  /** Puts the key in the ring or takes it out, as the ring's invariant says. */
  private placeReady(key: KeyState): void {
    if (key.head && key.held < this.limits.perKey) this.ring.push(key);
    else this.ring.remove(key);
  }

  /** Takes a waiter out of its key's FIFO for good. */
  private unlink(w: Waiter): void {
    const key = w.key;
    w.done = true;
    if (w.prev) w.prev.next = w.next;
    else key.head = w.next;
    if (w.next) w.next.prev = w.prev;
    else key.tail = w.prev;
    w.prev = w.next = undefined;
    key.waiting--;
    this.waitingCount--;
    this.clock.clearTimeout(w.timer);
    if (!key.head) this.ring.remove(key);
  }

  /** A permit for `key`, counted now; its release is idempotent and hands the permit on. */
  private permit(key: KeyState): () => void {
    this.heldCount++;
    key.held++;
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.heldCount--;
      key.held--;
      this.placeReady(key);
      this.forgetIfIdle(key);
      this.dispatch();
    };
  }

  /** Hands free permits to waiting keys in ring order, one per key per turn. */
  private dispatch(): void {
    // A grant's callback may release or acquire at once; the loop below then carries on with the new state.
    if (this.dispatching) return;
    this.dispatching = true;
    try {
      while (this.heldCount < this.limits.capacity) {
        const key = this.ring.head;
        if (!key) break;
        // The ring's invariant: the key has a waiter and room under its cap. Its turn passes to the back.
        this.ring.remove(key);
        const w = key.head!;
        this.unlink(w);
        const release = this.permit(key);
        this.placeReady(key);
        w.granted(release);
      }
    } finally {
      this.dispatching = false;
    }
  }

  private refusal(key: KeyState, waited: boolean): FairRefusal {
    const mine = key.held >= this.limits.perKey;
    const why = waited ? `waited ${this.limits.maxWaitMs} ms` : 'the queue is full';
    return mine
      ? new FairRefusal(KEY_LIMIT, `${key.held} requests of this user in flight already; ${why}`, waited)
      : new FairRefusal(BUSY, `all ${this.limits.capacity} permits in use; ${why}`, waited);
  }
}

export function newFairSemaphore(initial: FairLimits, clock: Clock = systemClock): FairSemaphore {
  return new Semaphore(initial, clock);
}
