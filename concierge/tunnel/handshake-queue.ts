// The door in front of the tunnel listener's TLS server. When every agent dials at once (after a restart), handshakes
// beyond what the CPU finishes in time would all time out, each after using its share of the CPU, and their agents
// would dial again into the same crowd. So at most MAX_HANDSHAKES run at once; later connections wait, unread and in
// arrival order, for a slot (MAX_WAITING of them for at most MAX_WAIT_MS; past either they are closed, which costs
// nothing, and their agents back off).
import type { Socket } from 'node:net';
import type { Clock } from '../../lib/clock.ts';

/**
 * TLS handshakes in progress at once. One takes about a millisecond of CPU; this many finish well within the
 * handshake timeout even on a busy core.
 */
export const MAX_HANDSHAKES = 256;
/**
 * Connections waiting for a handshake slot, and for how long: less than an agent's dial timeout (10 s), so that an
 * agent is either served or told to back off before it gives up on its own.
 */
export const MAX_WAITING = 8192;
export const MAX_WAIT_MS = 8_000;
/** How often connections that have waited too long are looked for (sweep()), when no finished handshake frees a slot. */
export const HANDSHAKE_SWEEP_MS = 1_000;

export interface HandshakeLimits {
  max: number;
  maxWaiting: number;
  waitMs: number;
}

export interface HandshakeQueue {
  /** Takes a new connection: starts its handshake now, queues it, or closes it when the queue is full. */
  admit(socket: Socket): void;
  /** A handshake finished: its secure socket, matched to its connection by their addresses, which the two share. */
  done(socket: Socket): void;
  /** Closes waiting connections whose time is up, though no slot freed: the owner calls it every HANDSHAKE_SWEEP_MS. */
  sweep(): void;
  close(): void;
}

const connectionKey = (socket: Socket): string =>
  `${socket.remoteAddress}|${socket.remotePort}|${socket.localAddress}|${socket.localPort}`;

/** `start` hands a connection to the TLS server. */
export function handshakeQueue(
  start: (socket: Socket) => void,
  limits: HandshakeLimits,
  clock: Clock,
): HandshakeQueue {
  /** The release of each handshake in progress, by its connection's addresses. */
  const inProgress = new Map<string, () => void>();
  /** Connections waiting, in arrival order; those before `head` have left already. */
  const waiting: { socket: Socket; since: number }[] = [];
  let head = 0;

  const begin = (socket: Socket): void => {
    const id = connectionKey(socket);
    const release = (): void => {
      if (inProgress.get(id) !== release) return;
      inProgress.delete(id);
      next();
    };
    inProgress.set(id, release);
    socket.once('close', release);
    start(socket);
  };
  /** Starts waiting connections while there are slots; drops those that waited too long or went away. */
  const next = (): void => {
    while (head < waiting.length && inProgress.size < limits.max) {
      const { socket, since } = waiting[head++]!;
      if (socket.destroyed) continue;
      if (clock.now() - since > limits.waitMs) socket.destroy();
      else begin(socket);
    }
    // The queue's front is dropped now and then rather than shifted one by one.
    if (head > 1024 && head * 2 > waiting.length) {
      waiting.splice(0, head);
      head = 0;
    }
  };

  return {
    admit(socket) {
      socket.on('error', () => socket.destroy());
      if (inProgress.size < limits.max) return begin(socket);
      if (waiting.length - head >= limits.maxWaiting) return void socket.destroy();
      waiting.push({ socket, since: clock.now() });
    },
    done(socket) {
      inProgress.get(connectionKey(socket))?.();
    },
    sweep() {
      const now = clock.now();
      for (let i = head; i < waiting.length && now - waiting[i]!.since > limits.waitMs; i++)
        waiting[i]!.socket.destroy();
    },
    close() {
      for (let i = head; i < waiting.length; i++) waiting[i]!.socket.destroy();
      waiting.length = head = 0;
    },
  };
}
