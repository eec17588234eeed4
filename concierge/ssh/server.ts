// The SSH front door: `ssh` to the concierge's Service for a shell or a command in any cluster's pods, sftp and scp
// into containers, and `-L` forwards to Services and pods. Signing in makes an identity exactly as kubectl's token
// would (device-login.ts), or takes it from a key bound by an earlier login (bindings.ts) or a certificate from an SSH
// CA the admin trusts (keys.ts); after that every channel is one or more requests through the proxy's pipeline as
// that identity (in-process.ts, cluster-access.ts), so the target cluster decides, and audit and recording apply.
// What a stranger or a signed-in user can hold is bounded: connections, logins in flight, channels, time to sign in.
import { createServer, isIPv4, type AddressInfo, type Socket } from 'node:net';
import { finished } from 'node:stream/promises';
import ipaddr from 'ipaddr.js';
import type { Duplex } from 'node:stream';
import ssh2 from 'ssh2';
import type { AuthContext, Connection, ServerChannel, Session } from 'ssh2';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { Logger } from '../../lib/log.ts';
import { newClusterAccess, type ClusterAccess } from './cluster-access.ts';
import type { Terminal } from './containers.ts';
import { startDeviceLogin, DEVICE_LOGIN_MAX_MS, type DeviceLoginSettings } from './device-login.ts';
import type { InProcessDoor, SignedIn } from './in-process.ts';
import type { KeyBindings } from './bindings.ts';
import { chooseContainer } from './menu.ts';
import { serveSftp } from './sftp.ts';
import { parseExecCommand, parseForward } from './target.ts';
import type { ContainerRef } from './containers.ts';
import {
  checkUserCertificate,
  fingerprint,
  isCertificateAlgorithm,
  verifyKeySignature,
  type AuthorizedKey,
} from '../../lib/ssh/keys.ts';

/** The door's settings in effect (from the concierge's config). */
export interface SshSettings {
  /** The name the hub's own cluster goes by in targets. */
  hubName: string;
  /** The device login; none: only bound keys and certificates sign in. */
  login?: DeviceLoginSettings;
  /** The SSH CAs whose user certificates sign in. */
  certificateAuthorities: readonly AuthorizedKey[];
  /** The certificate extension whose value lists the user's groups. */
  groupsExtension: string;
}

export interface SshServerOptions {
  /** The host keys (OpenSSH private key format). */
  hostKeys: readonly string[];
  settings: () => SshSettings;
  door: InProcessDoor;
  cache: AuthenticatorCache;
  bindings: KeyBindings;
  groupSuffix: string;
  /** The Cluster objects' names. */
  clusterNames: () => string[];
  log: Logger;
  limits?: Partial<SshLimits>;
}

export interface SshLimits {
  /** Connections at once, signed in or not. */
  connections: number;
  /** Connections not signed in yet, per source address. */
  unauthenticatedPerAddress: number;
  /** Signed-in connections per user. */
  connectionsPerUser: number;
  /** Channels (sessions and forwards) at once per connection. */
  channelsPerConnection: number;
  /** Device logins under way at once, and per source address. */
  deviceLogins: number;
  deviceLoginsPerAddress: number;
  /** How long a connection may take to sign in (a device login gets DEVICE_LOGIN_MAX_MS). */
  loginGraceMs: number;
}

export const DEFAULT_SSH_LIMITS: SshLimits = {
  connections: 1024,
  unauthenticatedPerAddress: 16,
  connectionsPerUser: 32,
  channelsPerConnection: 32,
  deviceLogins: 64,
  deviceLoginsPerAddress: 4,
  // OpenSSH's LoginGraceTime.
  loginGraceMs: 120_000,
};

/** The shell started when the user names no command: bash where the image has it. */
const SHELL = ['/bin/sh', '-c', 'if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi'];

const USAGE =
  'Sealion: name a container, as in\r\n' +
  '  ssh -t <user>@<this host> <cluster>/<namespace>/<pod>[/<container>]\r\n' +
  '  ssh <user>@<this host> <cluster>/<namespace>/<pod>[/<container>] -- <command> [args]\r\n' +
  'or connect with a terminal (ssh -t) for a menu.\r\n';

/** What a connection has shown so far while signing in: the key it proved it holds, what its certificate permits. */
interface Connecting {
  ip: string;
  /** A plain key whose signature checked out but that no binding holds: bound once a device login succeeds. */
  provenKey?: { blob: Buffer; fingerprint: string };
  identity?: SignedIn;
  permits: { pty: boolean; portForwarding: boolean };
}

/** A counter per key, for the bounds per address and per user. */
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

/** One TCP connection, from its accept on: what it holds, and how it ends. */
interface Accepted {
  socket: Socket;
  address: string;
  grace: NodeJS.Timeout;
  /** The user it signed in as, once it has. */
  user?: string;
  /** Ends what its sessions hold (execs, forwards, menus) when the connection goes. */
  cleanups: Set<() => void>;
}

export function newSshServer(opts: SshServerOptions): SshServer {
  const limits = { ...DEFAULT_SSH_LIMITS, ...opts.limits };
  const { log } = opts;
  const unauthenticated = new Tally();
  const perUser = new Tally();
  const deviceLogins = new Tally();
  /** Every TCP connection by its remote address and port, which is how ssh2 names it to the handler below. */
  const accepted = new Map<string, Accepted>();
  const dropAfter = (entry: Accepted, ms: number): void => {
    clearTimeout(entry.grace);
    entry.grace = setTimeout(() => entry.socket.destroy(), ms);
  };

  // Connections are counted and timed from the TCP accept, before a byte of SSH: one that never speaks is dropped at
  // its grace time too, and one over a bound is destroyed at once (a half-close would leave it to the peer).
  const tcp = createServer({ noDelay: true }, (socket) => {
    const address = addressKey(socket.remoteAddress ?? '');
    const key = `${socket.remoteAddress}:${socket.remotePort}`;
    if (!unauthenticated.take(address, limits.unauthenticatedPerAddress)) {
      log.info({ ip: socket.remoteAddress }, 'ssh connection refused: too many from this address');
      return void socket.destroy();
    }
    const entry: Accepted = { socket, address, grace: setTimeout(() => {}, 0), cleanups: new Set() };
    dropAfter(entry, limits.loginGraceMs);
    accepted.set(key, entry);
    socket.once('close', () => {
      clearTimeout(entry.grace);
      accepted.delete(key);
      for (const cleanup of entry.cleanups) cleanup();
      if (entry.user === undefined) unauthenticated.give(address);
      else perUser.give(entry.user);
    });
    socket.on('error', () => socket.destroy());
    server.injectSocket(socket);
  });
  tcp.maxConnections = limits.connections;

  const server = new ssh2.Server(
    { hostKeys: [...opts.hostKeys], ident: 'Sealion' },
    (
      client: Connection,
      info: { ip: string; port: number; header?: { versions?: { software?: string } } },
    ) => {
      const entry = accepted.get(`${info.ip}:${info.port}`);
      if (!entry) return void client.end();
      const ip = info.ip;
      const state: Connecting = { ip, permits: { pty: true, portForwarding: true } };
      // Printable only: it goes into a request's User-Agent (for audit) and the log.
      const software = (info.header?.versions?.software ?? 'unknown')
        .replace(/[^\x21-\x7e]/g, '')
        .slice(0, 64);
      client.on('error', (err: Error) => log.debug({ ip, err: err.message }, 'ssh connection error'));
      client.on('authentication', (ctx: AuthContext) => {
        authenticate(ctx, state, entry).catch((err: unknown) => {
          log.warn({ ip, err: (err as Error).message }, 'ssh authentication failed inside the door');
          ctx.reject();
        });
      });
      client.once('ready', () => {
        clearTimeout(entry.grace);
        const identity = state.identity!;
        if (!perUser.take(identity.user.username, limits.connectionsPerUser)) {
          log.info({ ip }, 'ssh connection refused: too many for this user');
          return void entry.socket.destroy();
        }
        unauthenticated.give(entry.address);
        entry.user = identity.user.username;
        log.info({ ip, via: identity.via, client: software }, 'ssh signed in');
        serveConnection(client, state, identity, software, entry.cleanups);
      });
    },
  );
  server.on('error', (err: Error) => log.warn({ err: err.message }, 'ssh listener error'));

  /** Decides one authentication request of the connection `entry`. */
  async function authenticate(ctx: AuthContext, state: Connecting, entry: Accepted): Promise<void> {
    const settings = opts.settings();
    const methods: ('publickey' | 'keyboard-interactive')[] = settings.login
      ? ['publickey', 'keyboard-interactive']
      : ['publickey'];
    if (ctx.method === 'publickey') {
      const { key, signature } = ctx;
      if (isCertificateAlgorithm(key.algo)) {
        const checked = checkUserCertificate(key.data, {
          cas: settings.certificateAuthorities,
          loginName: ctx.username,
          now: new Date(),
          sourceIP: state.ip,
          groupsExtension: settings.groupsExtension,
        });
        if (!checked.ok) {
          log.info({ ip: state.ip, reason: checked.reason }, 'ssh certificate refused');
          return ctx.reject(methods);
        }
        // A query: the client signs next.
        if (!signature) return ctx.accept();
        if (!verifyKeySignature(ctx)) return ctx.reject(methods);
        state.identity = {
          kind: 'user',
          user: { username: checked.principal, groups: checked.groups, extra: {} },
          via: 'ssh/certificate',
        };
        state.permits = checked.permits;
        log.info({ ip: state.ip, keyId: checked.keyId, serial: checked.serial }, 'ssh certificate accepted');
        return ctx.accept();
      }
      // A plain key: the client is asked to sign, then it is the key of a binding, or (with a device login to come)
      // the key to bind.
      if (!signature) return ctx.accept();
      if (!verifyKeySignature(ctx)) return ctx.reject(methods);
      const print = fingerprint(key.data);
      const bound = opts.bindings.find(key.data, print);
      // A binding holds while the login that made it could make it again: its JWTAuthenticator is still the one
      // configured, and loaded (deleting it, or taking the login away, ends every key it bound).
      const boundBy = bound?.via.replace(/^ssh\/JWTAuthenticator\//, '');
      if (bound && boundBy && boundBy === settings.login?.authenticator && opts.cache.providerOf(boundBy)) {
        state.identity = { ...bound, via: 'ssh/key' };
        return ctx.accept();
      }
      if (!settings.login) return ctx.reject(methods);
      // Proven but not enough: the client goes on to its other keys (a certificate may follow), then the login, which
      // binds the first key proven here.
      state.provenKey ??= { blob: key.data, fingerprint: print };
      return ctx.reject(methods);
    }
    if (ctx.method === 'keyboard-interactive' && settings.login) {
      if (!deviceLogins.take('', limits.deviceLogins)) return ctx.reject(methods);
      if (!deviceLogins.take(entry.address, limits.deviceLoginsPerAddress)) {
        deviceLogins.give('');
        return ctx.reject(methods);
      }
      // This attempt's own end: a new attempt on the connection (ssh2 aborts this one), or the connection's close.
      const attempt = new AbortController();
      const end = (): void => attempt.abort();
      ctx.once('abort', end);
      entry.cleanups.add(end);
      if (entry.user === undefined) dropAfter(entry, DEVICE_LOGIN_MAX_MS + 30_000);
      try {
        await deviceLogin(ctx, state, settings.login, methods, attempt.signal);
      } finally {
        entry.cleanups.delete(end);
        deviceLogins.give('');
        deviceLogins.give(entry.address);
        if (entry.user === undefined && !state.identity) dropAfter(entry, limits.loginGraceMs);
      }
      return;
    }
    return ctx.reject(methods);
  }

  /** The device login: instructions shown with no prompt to answer, then the token polled for. */
  async function deviceLogin(
    ctx: AuthContext & { method: 'keyboard-interactive' },
    state: Connecting,
    settings: DeviceLoginSettings,
    methods: ('publickey' | 'keyboard-interactive')[],
    signal: AbortSignal,
  ): Promise<void> {
    let started;
    try {
      started = await startDeviceLogin(opts.cache, settings, signal);
    } catch (err) {
      log.warn({ ip: state.ip, err: (err as Error).message }, 'ssh device login could not start');
      return signal.aborted ? undefined : ctx.reject(methods);
    }
    // Whoever approves the code signs this connection in and binds its key: the key is named, so that a person
    // handed someone else's code sees it is not their own ssh asking.
    const key = state.provenKey
      ? `This signs in, and binds for the login's lifetime, the SSH key ${state.provenKey.fingerprint}.\n`
      : '';
    // No prompts: the client shows the instructions and answers at once; the answer to this request waits for the
    // person to approve the code.
    await new Promise<void>((shown) => ctx.prompt([], 'Sealion', started.instructions + key, () => shown()));
    let result;
    try {
      result = await started.done;
    } catch (err) {
      log.info({ ip: state.ip, err: (err as Error).message }, 'ssh device login failed');
      return signal.aborted ? undefined : ctx.reject(methods);
    }
    if (signal.aborted) return;
    state.identity = result.identity;
    if (state.provenKey) {
      const { blob, fingerprint: print } = state.provenKey;
      await opts.bindings.bind(blob, print, result.identity, result.expires).then(
        () => log.info({ ip: state.ip, fingerprint: print }, 'ssh key bound'),
        (err: unknown) => log.warn({ err: (err as Error).message }, 'ssh key binding could not be stored'),
      );
    }
    ctx.accept();
  }

  function serveConnection(
    client: Connection,
    state: Connecting,
    identity: SignedIn,
    software: string,
    cleanups: Set<() => void>,
  ): void {
    // Everything the connection started ends with it: execs, forwards, the menu's lookups.
    const ended = new AbortController();
    cleanups.add(() => ended.abort());
    const access = newClusterAccess({
      signal: ended.signal,
      connect: () => opts.door.connect(identity, state.ip),
      hubName: opts.settings().hubName,
      clusterNames: opts.clusterNames,
      groupSuffix: opts.groupSuffix,
      userAgent: `sealion-ssh (${software})`,
    });
    let channels = 0;
    const take = (): boolean => (channels < limits.channelsPerConnection ? (channels++, true) : false);
    const give = (): void => void channels--;
    /** Sessions' stderr, for what a refused forward cannot say itself (SSH's open failure carries no text). */
    const notices = new Set<ServerChannel>();
    const notify = (line: string): void => {
      for (const channel of notices) channel.stderr.write(`sealion: ${line}\r\n`);
    };

    client.on('session', (accept, reject) => {
      if (!take()) return reject();
      const session = accept();
      serveSession(session, access, state, identity, notices);
      session.once('close', give);
    });
    client.on('tcpip', (accept, reject, info) => {
      if (!state.permits.portForwarding) return reject();
      const dest = parseForward(info.destIP, info.destPort);
      if ('problem' in dest) {
        notify(`-L ${info.destIP}:${info.destPort}: ${dest.problem}`);
        return reject();
      }
      if (!take()) return reject();
      access.reach(dest.cluster, dest.target).then(
        (socket) => {
          // The client may have gone while the cluster decided.
          const channel = ended.signal.aborted ? undefined : accept();
          if (!channel) {
            give();
            return void socket.destroy();
          }
          bridge(channel, socket);
          channel.once('close', give);
        },
        (err: unknown) => {
          give();
          notify(`-L ${info.destIP}:${info.destPort}: ${(err as Error).message}`);
          reject();
        },
      );
    });
    // -R would put a listener inside a cluster fed from the client: see the README for why the door has none.
    client.on('request', (_accept, reject) => reject?.());
  }

  function serveSession(
    session: Session,
    access: ClusterAccess,
    state: Connecting,
    identity: SignedIn,
    notices: Set<ServerChannel>,
  ): void {
    let pty: Terminal | undefined;
    let resize: ((size: { cols: number; rows: number }) => void) | undefined;
    /** A session runs one thing (a shell, a command or sftp); a second request for one is refused. */
    let started = false;
    const begin = (accept: (() => ServerChannel | undefined) | undefined): ServerChannel | undefined => {
      if (started || !accept) return undefined;
      started = true;
      const channel = accept();
      if (channel) {
        notices.add(channel);
        channel.once('close', () => notices.delete(channel));
      }
      return channel;
    };
    session.on('pty', (accept, reject, info) => {
      if (!state.permits.pty) return reject?.();
      pty = { cols: info.cols, rows: info.rows, term: info.term };
      accept?.();
    });
    session.on('window-change', (accept, _reject, info) => {
      if (pty) Object.assign(pty, { cols: info.cols, rows: info.rows });
      resize?.({ cols: info.cols, rows: info.rows });
      accept?.();
    });
    session.on('env', (_accept, reject) => reject?.());
    session.on('shell', (accept, reject) => {
      const channel = begin(accept);
      if (!channel) return reject?.();
      if (!pty) return fail(channel, USAGE, 2);
      chooseContainer(channel, access, `Sealion: signed in as ${identity.user.username}.`).then(
        (target) => {
          if (channel.destroyed) return;
          if (!target) return fail(channel, '', 0);
          channel.write(
            `\r\nConnecting to ${target.cluster}/${target.namespace}/${target.pod}/${target.container}…\r\n`,
          );
          runIn(channel, access, target, [], pty, (r) => (resize = r));
        },
        (err: unknown) => fail(channel, `${(err as Error).message}\r\n`, 1),
      );
    });
    session.on('exec', (accept, reject, info) => {
      const channel = begin(accept);
      if (!channel) return reject?.();
      const parsed = parseExecCommand(info.command);
      if ('problem' in parsed) {
        const legacyScp = /^scp( |$)/.test(info.command);
        return fail(
          channel,
          legacyScp
            ? 'sealion: scp runs over sftp here (the default since OpenSSH 9.0): drop -O\r\n'
            : `sealion: ${parsed.problem}\r\n${USAGE}`,
          2,
        );
      }
      runIn(channel, access, parsed.target, parsed.argv, pty, (r) => (resize = r));
    });
    session.on('sftp', (accept, reject) => {
      if (started || !accept) return reject?.();
      started = true;
      const sftp = accept();
      if (sftp) serveSftp(sftp, access, { log });
    });
    session.on('subsystem', (_accept, reject) => reject?.());
  }

  return {
    listen(port, host) {
      return new Promise((done, fail) => {
        tcp.once('error', fail);
        tcp.listen(port, host, () => {
          tcp.off('error', fail);
          tcp.on('error', (err: Error) => log.warn({ err: err.message }, 'ssh listener error'));
          done((tcp.address() as AddressInfo).port);
        });
      });
    },
    close() {
      return new Promise((done) => {
        tcp.close(() => done());
        for (const entry of accepted.values()) entry.socket.destroy();
      });
    },
  };
}

/** Ends a channel with a message on stderr and an exit status. */
function fail(channel: ServerChannel, message: string, code: number): void {
  if (message) channel.stderr.write(message);
  channel.exit(code);
  channel.end();
}

/**
 * Runs a command (or, with no argv, a shell) in the container and ties it to the channel: input, output, terminal
 * size, and the exit status. A refusal (a Status) is written on stderr, as kubectl prints it.
 */
function runIn(
  channel: ServerChannel,
  access: ClusterAccess,
  target: ContainerRef,
  argv: string[],
  pty: Terminal | undefined,
  onResize: (resize: (size: { cols: number; rows: number }) => void) => void,
): void {
  const running = access.run(target, argv.length > 0 ? argv : SHELL, pty);
  onResize((size) => running.resize(size));
  channel.pipe(running.stdin);
  channel.resume();
  running.stdout.pipe(channel, { end: false });
  running.stderr.pipe(channel.stderr, { end: false });
  channel.once('close', () => running.kill());
  running.exit.then(
    async (code) => {
      await Promise.all([finished(running.stdout), finished(running.stderr)]).catch(() => {});
      channel.exit(code);
      channel.end();
    },
    (err: unknown) => fail(channel, `sealion: ${(err as Error).message}\r\n`, 1),
  );
}

/** Bytes both ways between a forward's channel and its reach connection, each end passed on as a half-close. */
function bridge(channel: Duplex, socket: Duplex): void {
  channel.pipe(socket);
  socket.pipe(channel);
  const destroy = (): void => {
    channel.destroy();
    socket.destroy();
  };
  channel.once('error', destroy);
  socket.once('error', destroy);
  // A channel gone has nobody left to answer. A reach connection that closes is ended on the channel, after what it
  // sent is written (destroying it at once would drop what the channel still holds), as lib/http2/upgrade.ts does.
  channel.once('close', () => socket.destroy());
  socket.once('close', () => channel.end());
}
