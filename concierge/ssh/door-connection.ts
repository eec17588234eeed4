// One TCP connection to the SSH door, from its accept on: how far it has come, its deadline, the place it holds while
// it has not signed in, and what ends with it. Strangers' connections share their places fairly (lib/fair-places.ts),
// and when room must be made the one given up is the one that has made no progress for longest (a stage reached, an
// authentication request: a handful per connection, which its deadlines and its six tries bound); a connection
// waiting for a person to approve a device login is never given up for room (device logins have fair places of their
// own).
import type { Socket } from 'node:net';
import type { Clock } from '../../lib/clock.ts';
import type { Place } from '../../lib/fair-places.ts';
import type { SignedIn } from './in-process.ts';

/** How far a connection has come, in the order connections are given up to make room. */
export const Stage = {
  /** Accepted; no SSH version string yet. */
  Connected: 0,
  /** Its version said; the key exchange under way. */
  KeyExchange: 1,
  /** Keys exchanged; authenticating. */
  SigningIn: 2,
} as const;
export type Stage = (typeof Stage)[keyof typeof Stage];

/** A stage's name, for the log. */
export const stageName = (stage: Stage): string =>
  Object.keys(Stage).find((name) => Stage[name as keyof typeof Stage] === stage) ?? String(stage);

/** What a connection has shown so far while signing in. */
export interface SignInState {
  /** A plain key whose signature checked out but that no binding holds: bound once a device login succeeds. */
  provenKey?: { blob: Buffer; fingerprint: string };
  identity?: SignedIn;
  permits: { pty: boolean; portForwarding: boolean };
  /** Authentication requests refused so far (sshd's MaxAuthTries counts the same). */
  failures: number;
  /** Authentication requests so far, refused or not. */
  requests: number;
  /**
   * The last certificate checked, for the login name asked, and its verdict: a client asks with it, then signs with
   * it, and it is checked once.
   */
  certificate?: { blob: Buffer; loginName: string; verdict: CertificateVerdict };
}

/** A certificate's verdict, with the identity it makes when it is good. */
export type CertificateVerdict =
  | {
      ok: true;
      identity: SignedIn;
      permits: { pty: boolean; portForwarding: boolean };
      keyId: string;
      serial: string;
    }
  | { ok: false; reason: string };

export class DoorConnection {
  readonly socket: Socket;
  /** The client's address as the door names it (the socket's, or the one a PROXY protocol header gave). */
  readonly ip: string;
  /** The key its address is counted under (addressKey). */
  readonly address: string;
  /** When it was accepted: its login grace counts from then. */
  readonly acceptedAt: number;
  stage: Stage = Stage.Connected;
  /** When it last came further (a stage, an authentication request): its rank among the same stage's. */
  progressAt: number;
  /** When its device login began, while one is under way. */
  deviceLoginSince: number | undefined;
  /** The user it signed in as, once it has. */
  user: string | undefined;
  /** Its place among the connections not signed in yet; given back when it signs in or closes. */
  place: Place | undefined;
  readonly signIn: SignInState = {
    permits: { pty: true, portForwarding: true },
    failures: 0,
    requests: 0,
  };
  /** Ends what its sessions hold (execs, forwards, menus, a device login) when the connection goes. */
  private readonly cleanups = new Set<() => void>();
  private deadline: unknown;
  private readonly clock: Clock;

  constructor(socket: Socket, ip: string, address: string, clock: Clock) {
    this.socket = socket;
    this.ip = ip;
    this.address = address;
    this.clock = clock;
    this.acceptedAt = clock.now();
    this.progressAt = this.acceptedAt;
    socket.once('close', () => {
      this.clock.clearTimeout(this.deadline);
      this.place?.release();
      for (const cleanup of this.cleanups) cleanup();
      this.cleanups.clear();
    });
  }

  /**
   * How expendable it is when room must be made (lowest first): the time of its last progress, so that the one that
   * has made none for longest goes. Not its stage: a stranger finishes key exchanges as cheaply as anyone, and idle
   * connections past theirs would then outrank a real client still in its own. Undefined: never given up for room.
   */
  rank(): number | undefined {
    if (this.deviceLoginSince !== undefined || this.user !== undefined) return undefined;
    return this.progressAt;
  }

  /** It came further: to `stage`, or by another authentication request. */
  progress(stage?: Stage): void {
    if (stage !== undefined && stage > this.stage) this.stage = stage;
    this.progressAt = this.clock.now();
  }

  /** Ends it at `at` (milliseconds since the epoch), or never; replaces the deadline it had. */
  endAt(at: number | undefined): void {
    this.clock.clearTimeout(this.deadline);
    this.deadline =
      at === undefined
        ? undefined
        : this.clock.setTimeout(() => this.drop(), Math.max(0, at - this.clock.now()));
  }

  /** Runs `cleanup` when the connection closes (at once if it has); the returned function cancels that. */
  onClose(cleanup: () => void): () => void {
    if (this.socket.destroyed) {
      cleanup();
      return () => {};
    }
    this.cleanups.add(cleanup);
    return () => void this.cleanups.delete(cleanup);
  }

  /** Ends it now, without a word: a connection over a bound, past its deadline, or given up for room. */
  drop(): void {
    this.socket.destroy();
  }
}
