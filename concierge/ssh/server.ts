// The SSH front door: `ssh` to the concierge's Service for a shell or a command in any cluster's pods, sftp and scp
// into containers, and `-L` forwards to Services and pods. Signing in (sign-in.ts) makes an identity exactly as
// kubectl's token would, or takes it from a key an earlier login bound or a certificate from an SSH CA the admin
// trusts; after that every channel is one or more requests through the proxy's pipeline as that identity
// (channels.ts), so the target cluster decides, and audit and recording apply.
//
// What strangers hold is bounded and shared fairly. Connections that have not signed in hold places among
// `unauthenticated`, at most `unauthenticatedPerAddress` per source address, and a newcomer who finds them taken gets
// one back from whoever holds the most (its connection that has made no progress for longest gives it up: see
// door-connection.ts), so idle connections from one address cannot lock anyone out. A connection has
// `handshakeMs` to say its version and finish its key exchange, and `loginGraceMs` from its accept to sign in (a
// device login, waiting for a person, gets DEVICE_LOGIN_MAX_MS). Device logins hold fair places of their own.
import { createServer, isIPv4, type AddressInfo, type Server, type Socket } from 'node:net';
import ipaddr from 'ipaddr.js';
import ssh2 from 'ssh2';
import type { Algorithms, AuthContext, Connection } from 'ssh2';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';
import { newFairPlaces, type FairPlaces } from '../../lib/fair-places.ts';
import type { Logger } from '../../lib/log.ts';
import type { Recordings } from '../recording/session.ts';
import type { KeyBindings } from './bindings.ts';
import { serveSignedIn } from './channels.ts';
import { DoorConnection, Stage, stageName } from './door-connection.ts';
import type { InProcessDoor } from './in-process.ts';
import { newSignIn, type SignIn, type SshSettings } from './sign-in.ts';

export type { SshSettings } from './sign-in.ts';

export interface SshServerOptions {
  /** The host keys (OpenSSH private key format). */
  hostKeys: readonly string[];
  settings: () => SshSettings;
  door: InProcessDoor;
  cache: Pick<AuthenticatorCache, 'providerOf' | 'authenticateWith' | 'holds'>;
  bindings: KeyBindings;
  groupSuffix: string;
  /** The Cluster objects' names. */
  clusterNames: () => string[];
  /** Where sftp sessions are recorded, each as one recording of its operations. Default: not recorded. */
  recordings?: Pick<Recordings, 'openOperations'>;
  log: Logger;
  limits?: Partial<SshLimits>;
  /** Deadlines' clock. Default: the system's. */
  clock?: Clock;
}

export interface SshLimits {
  /** Connections at once, signed in or not. */
  connections: number;
  /** Connections not signed in yet, from all addresses together. */
  unauthenticated: number;
  /** Connections not signed in yet, per source address. */
  unauthenticatedPerAddress: number;
  /** Signed-in connections per user. */
  connectionsPerUser: number;
  /** Channels (sessions and forwards) at once per connection. */
  channelsPerConnection: number;
  /** Device logins under way at once, and per source address. */
  deviceLogins: number;
  deviceLoginsPerAddress: number;
  /** How long a connection may take to say its version and finish the key exchange, from its accept. */
  handshakeMs: number;
  /** How long a connection may take to sign in, from its accept (a device login gets DEVICE_LOGIN_MAX_MS). */
  loginGraceMs: number;
}

export const DEFAULT_SSH_LIMITS: SshLimits = {
  connections: 1024,
  unauthenticated: 256,
  unauthenticatedPerAddress: 16,
  connectionsPerUser: 32,
  channelsPerConnection: 32,
  deviceLogins: 64,
  deviceLoginsPerAddress: 4,
  // A key exchange is two round trips and a few milliseconds of work: 10 s is ample on any link, as the proxy's
  // TLS handshake deadline is.
  handshakeMs: 10_000,
  // OpenSSH's LoginGraceTime.
  loginGraceMs: 120_000,
};

/** A counter per key, for the bound per user. */
class Tally {
  private readonly counts = new Map<string, number>();
  take(key: string, limit: number): boolean {
    const n = this.counts.get(key) ?? 0;
    if (n >= limit) return false;
    this.counts.set(key, n + 1);
    return true;
  }
  give(key: string): void {
    const n = (this.counts.get(key) ?? 1) - 1;
    if (n <= 0) this.counts.delete(key);
    else this.counts.set(key, n);
  }
}

export interface SshServer {
  listen(port: number, host: string): Promise<number>;
  /**
   * Stops listening, for a draining replica: the connections open go on (their commands run through the proxy's
   * pipeline, where the drain closes them with a message); close() ends them.
   */
  stopAccepting(): void;
  /** Stops listening and ends every connection. */
  close(): Promise<void>;
}

/**
 * The key a source address is counted under: the address, or for IPv6 its /64, which one holder usually has whole
 * (counting single IPv6 addresses would give one attacker billions of allowances).
 */
export function addressKey(ip: string): string {
  const plain = ip.replace(/^::ffff:(?=[0-9.]+$)/, '');
  if (isIPv4(plain)) return plain;
  try {
    const parts = ipaddr.IPv6.parse(plain).parts;
    return `${parts
      .slice(0, 4)
      .map((p) => p.toString(16))
      .join(':')}::/64`;
  } catch {
    return plain;
  }
}

/**
 * What the door negotiates.
 * - Ciphers: AES in GCM or CTR mode, OpenSSL's through node:crypto. Not chacha20-poly1305, OpenSSH's first choice:
 *   without ssh2's optional native binding, its Poly1305 MACs run in WebAssembly on a stack of 5 MiB, and one packet
 *   larger than that throws and leaves the module's stack pointer behind, so that every later MAC of the process
 *   throws too. One connection that had the door write a large packet (a client may ask for packets of any size)
 *   would cut every chacha20 user off until a restart. OpenSSH's clients take AES instead.
 * - No compression: it would let a stranger's small packets inflate before anything bounds them, and ssh2 throws when
 *   a channel writes after the connection's compressor is gone.
 */
const ALGORITHMS: Algorithms = {
  cipher: ['aes128-gcm@openssh.com', 'aes256-gcm@openssh.com', 'aes128-ctr', 'aes192-ctr', 'aes256-ctr'],
  compress: ['none'],
};

/** What ssh2 tells of a connection once its version is read. */
interface VersionInfo {
  ip: string;
  port: number;
  header?: { versions?: { software?: string } };
}

export function newSshServer(opts: SshServerOptions): SshServer {
  const door = new SshDoor(opts);
  return {
    listen: (port, host) => door.listen(port, host),
    stopAccepting: () => door.stopAccepting(),
    close: () => door.close(),
  };
}

/** Strangers' places: a newcomer may take the place of the connection that has made least progress. */
function strangerPlaces(limits: SshLimits, log: Logger): FairPlaces<DoorConnection> {
  return newFairPlaces<DoorConnection>({
    capacity: limits.unauthenticated,
    perHolder: limits.unauthenticatedPerAddress,
    rank: (conn) => conn.rank(),
    evict: (conn) => {
      log.info({ ip: conn.ip, stage: stageName(conn.stage) }, 'ssh connection given up for a newcomer');
      conn.drop();
    },
  });
}

/** Device logins' places: a newcomer may take the place of the oldest login. */
function deviceLoginPlaces(limits: SshLimits, log: Logger): FairPlaces<DoorConnection> {
  return newFairPlaces<DoorConnection>({
    capacity: limits.deviceLogins,
    perHolder: limits.deviceLoginsPerAddress,
    rank: (conn) => conn.deviceLoginSince,
    evict: (conn) => {
      log.info({ ip: conn.ip }, 'ssh device login given up for a newcomer');
      conn.drop();
    },
  });
}

/** The door's listener, its connections on their way in, and the bounds they are held to. */
class SshDoor {
  private readonly opts: SshServerOptions;
  private readonly limits: SshLimits;
  private readonly log: Logger;
  private readonly clock: Clock;
  private readonly perUser = new Tally();
  private readonly strangers: FairPlaces<DoorConnection>;
  private readonly signIn: SignIn;
  /** Every TCP connection by its remote address and port, which is how ssh2 names it to onVersion. */
  private readonly accepted = new Map<string, DoorConnection>();
  private readonly tcp: Server;
  private readonly server: ssh2.Server;

  constructor(opts: SshServerOptions) {
    this.opts = opts;
    const limits = (this.limits = { ...DEFAULT_SSH_LIMITS, ...opts.limits });
    const log = (this.log = opts.log);
    this.clock = opts.clock ?? systemClock;
    this.strangers = strangerPlaces(limits, log);
    this.signIn = newSignIn({
      settings: opts.settings,
      cache: opts.cache,
      bindings: opts.bindings,
      deviceLogins: deviceLoginPlaces(limits, log),
      loginGraceMs: limits.loginGraceMs,
      clock: this.clock,
      log,
    });
    this.tcp = createServer({ noDelay: true }, (socket: Socket) => this.accept(socket));
    this.tcp.maxConnections = limits.connections;
    this.server = new ssh2.Server(
      { hostKeys: [...opts.hostKeys], ident: 'Sealion', algorithms: ALGORITHMS },
      (client: Connection, info: VersionInfo) => this.onVersion(client, info),
    );
    this.server.on('error', (err: Error) => log.warn({ err: err.message }, 'ssh listener error'));
  }

  listen(port: number, host: string): Promise<number> {
    const tcp = this.tcp;
    return new Promise((done, fail) => {
      tcp.once('error', fail);
      tcp.listen(port, host, () => {
        tcp.off('error', fail);
        tcp.on('error', (err: Error) => this.log.warn({ err: err.message }, 'ssh listener error'));
        done((tcp.address() as AddressInfo).port);
      });
    });
  }

  stopAccepting(): void {
    if (this.tcp.listening) this.tcp.close();
  }

  close(): Promise<void> {
    return new Promise((done) => {
      this.tcp.close(() => done());
      for (const conn of this.accepted.values()) conn.drop();
    });
  }

  // Connections are counted and timed from the TCP accept, before a byte of SSH: one that never speaks is dropped at
  // its deadline too, and one that no room can be made for is destroyed at once (a half-close would leave it to the
  // peer).
  private accept(socket: Socket): void {
    socket.on('error', () => socket.destroy());
    const ip = socket.remoteAddress ?? '';
    const conn = new DoorConnection(socket, ip, addressKey(ip), this.clock);
    conn.place = this.strangers.take(conn.address, conn);
    if (!conn.place) {
      this.log.info({ ip }, 'ssh connection refused: no room for this address');
      return void socket.destroy();
    }
    const key = `${ip}:${socket.remotePort}`;
    this.accepted.set(key, conn);
    socket.once('close', () => {
      this.accepted.delete(key);
      if (conn.user !== undefined) this.perUser.give(conn.user);
    });
    conn.endAt(conn.acceptedAt + this.limits.handshakeMs);
    this.server.injectSocket(socket);
  }

  /** A connection said its version: its key exchange, sign-in and, once signed in, its channels. */
  private onVersion(client: Connection, info: VersionInfo): void {
    // First, before any return: a connection whose socket has gone meanwhile still parses what it had read, and a
    // failed key exchange then errors on it; unheard, that error stopped the concierge.
    client.on('error', (err: Error) =>
      this.log.debug({ ip: info.ip, err: err.message }, 'ssh connection error'),
    );
    const conn = this.accepted.get(`${info.ip}:${info.port}`);
    if (!conn) return void client.end();
    conn.progress(Stage.KeyExchange);
    // Printable only: it goes into a request's User-Agent (for audit) and the log.
    const software = (info.header?.versions?.software ?? 'unknown').replace(/[^\x21-\x7e]/g, '').slice(0, 64);
    client.once('handshake', () => {
      conn.progress(Stage.SigningIn);
      if (conn.deviceLoginSince === undefined) conn.endAt(conn.acceptedAt + this.limits.loginGraceMs);
    });
    const disconnect = (): void => {
      client.end();
      conn.socket.destroySoon();
    };
    client.on('authentication', (ctx: AuthContext) => this.signIn(ctx, conn, disconnect));
    client.once('ready', () => this.onSignedIn(client, conn, software));
  }

  /** Signed in: counted against its user (or refused there), out of the strangers' places, and served. */
  private onSignedIn(client: Connection, conn: DoorConnection, software: string): void {
    const { limits, log, opts } = this;
    conn.endAt(undefined);
    const identity = conn.signIn.identity!;
    if (!this.perUser.take(identity.user.username, limits.connectionsPerUser)) {
      log.info({ ip: conn.ip }, 'ssh connection refused: too many for this user');
      return conn.drop();
    }
    conn.user = identity.user.username;
    conn.place?.release();
    log.info({ ip: conn.ip, via: identity.via, client: software }, 'ssh signed in');
    serveSignedIn(client, conn, identity, software, {
      door: opts.door,
      hubName: () => opts.settings().hubName,
      clusterNames: opts.clusterNames,
      groupSuffix: opts.groupSuffix,
      channelsPerConnection: limits.channelsPerConnection,
      ...(opts.recordings ? { recordings: opts.recordings } : {}),
      log,
    });
  }
}
