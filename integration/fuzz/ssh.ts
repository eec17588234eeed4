// The SSH family: hostile clients of the SSH door (concierge/ssh/server.ts) through a real transport (ssh-wire.ts),
// from ssh-cases.ts's cases: clients that stop at every stage (mid version exchange, at the server's KEXINIT, at its
// key exchange reply, after the exchange, at each authentication method, at the device login's prompt, at a channel's
// open, mid-exec, mid-SFTP) by a FIN, a reset or by holding the connection without reading; authentication requests
// of every kind and recipe, certificates signed and wrong in every field, keys of odd types and sizes, bursts of
// signed requests with the largest RSA keys, messages malformed and oversized after the key exchange, channels opened
// and never read; and crowds of connections from one address beside a well-behaved user from there.
//
// The oracle, per case: the door never signs in a credential that must not (`accepted-forgery`), always signs in the
// one that must (`wrong-answer`), refuses with the one answer (the same methods, never a partial success); it answers
// what it owes (the version, the key exchange, the service, each authentication request, channel opens and requests)
// within the deadline (`hang`) while the case has sent nothing malformed; a well-behaved user from the crowd's address
// is served (`unserved`). Across cases the runner watches the process: alive, its memory and event loop within the
// README's bounds. The positive control signs in with a certificate and asks for an exec that the API server refuses,
// naming the user: an answer from the cluster, through the whole pipeline.
import { connect } from 'node:net';
import { approveDevice } from '../../dev/browser.ts';
import type { Family, LaneContext } from './family.ts';
import { FindingError, type FindingKind } from './oracle.ts';
import {
  authPayload,
  deviceRequest,
  infoResponse,
  oddKey,
  sftpAnswers,
  sftpBytes,
  SFTP_VERSION,
  type LaneKeys,
} from './ssh-build.ts';
import {
  methodGrant,
  sshCase,
  VALID_CERT,
  type CrowdCase,
  type KeyChoice,
  type SessionCase,
  type SshCase,
  type Step,
} from './ssh-cases.ts';
import { ecdsaKey, ed25519Key, rsaKey, str, u32 } from './ssh-keys.ts';
import { MSG, newChannel, SshWire, type Channel } from './ssh-wire.ts';
import { FUZZ_USER } from './target.ts';
import { MAX_AUTH_TRIES } from '../../concierge/ssh/sign-in.ts';

/** The controls' address, which `shared` cases share with them. */
const SHARED = '127.0.0.1';
/** The methods every refusal names: the door offers keys and certificates, and the device login. */
const METHODS = 'publickey,keyboard-interactive';
/** The pod the well-behaved user execs into; there is none. */
const CONTROL_POD = 'fuzz-control';
/**
 * The API server's answer to the well-behaved user's exec: NotFound, which it gives only once RBAC let the exec
 * through, and it did so only for the group the certificate names (without it: Forbidden). The identity reached the
 * cluster, and the cluster answered.
 */
const SERVED = `pods "${CONTROL_POD}" not found`;
/** What a case may take beyond the deadline: an exec through the pipeline, an approved device login. */
const SLOW = 4;
/**
 * How long a case waits for an answer the door does not owe (to a client that gave it no room to write, to a case that
 * already broke the protocol): only tallied, so waiting the deadline for it would only make such cases last it.
 */
const UNOWED_MS = 2_000;
/** Channel requests whose whole body is nothing (RFC 4254 and OpenSSH's), and one of a type nobody knows. */
const BODILESS_REQUESTS: ReadonlySet<string> = new Set([
  'x',
  'auth-agent-req@openssh.com',
  'eow@openssh.com',
  'shell',
]);

interface SshLane {
  keys: LaneKeys;
  /** Addresses handed out: each `own` case comes from a loopback address no case used before it. */
  next: number;
}

function laneOf(ctx: LaneContext): SshLane {
  const existing = ctx.state['ssh'] as SshLane | undefined;
  if (existing) return existing;
  const made: SshLane = {
    keys: {
      bindable: ed25519Key(),
      others: { 'ssh-ed25519': ed25519Key(), 'ecdsa-sha2-nistp256': ecdsaKey(), 'ssh-rsa': rsaKey(2048) },
    },
    next: 0,
  };
  ctx.state['ssh'] = made;
  return made;
}

/**
 * The fuzzer's keys a device login may have bound: recorded before the login is approved, so that no lane sees the
 * binding before the record. The lane's own key (`bindable`) may always be.
 */
const BOUND = new Set<Extract<KeyChoice, string>>();

/** Where a case connects from: the controls' address, or a fresh one in the lane's own 127.x/16. */
function address(from: 'shared' | 'own', ctx: LaneContext): string {
  if (from === 'shared') return SHARED;
  const lane = laneOf(ctx);
  const n = (lane.next++ % 65_000) + 1;
  return `127.${20 + ctx.lane}.${n >> 8}.${n & 255 || 1}`;
}

const finding = (kind: FindingKind, message: string): FindingError => new FindingError({ kind, message });
const sleep = (ms: number): Promise<void> => new Promise((done) => setTimeout(done, ms));
const serviceRequest = (name: string): Buffer => Buffer.concat([Buffer.of(MSG.SERVICE_REQUEST), str(name)]);

/** Why a connection ended, for a message. */
function ending(wire: SshWire): string {
  if (!wire.closed) return 'still open';
  const parts = ['closed'];
  if (wire.disconnect)
    parts.push(`disconnect ${wire.disconnect.reason} ${JSON.stringify(wire.disconnect.description)}`);
  if (wire.error) parts.push(`(${wire.error})`);
  // Where this client itself gave up, for whoever reads the finding.
  if (wire.failedAt)
    parts.push(
      `[${wire.failedAt
        .split('\n')
        .slice(1, 4)
        .map((l) => l.trim())
        .join(' < ')}]`,
    );
  return parts.join(' ');
}

/**
 * A well-behaved user from `from`: signs in with a valid certificate and asks, on a session, for an exec that the API
 * server refuses by name. Served when the cluster's refusal comes back as the exec's error.
 */
async function wellBehaved(ctx: LaneContext, from: string): Promise<string | undefined> {
  const { ssh } = ctx.target;
  const wire = new SshWire({ port: ssh.port, localAddress: from });
  const wait = async (what: string, done: () => boolean, ms = ctx.deadlineMs): Promise<void> => {
    const how = await wire.until(done, ms);
    if (how === 'timeout') throw new Error(`${what}: no answer within ${ms} ms`);
    if (how === 'closed') throw new Error(`${what}: ${ending(wire)}`);
  };
  try {
    await wait('key exchange', () => wire.kexDone);
    wire.send(serviceRequest('ssh-userauth'));
    await wait('service', () => wire.serviceAccepted.length > 0);
    const { payload } = authPayload(
      wire,
      FUZZ_USER,
      { m: 'cert', cert: VALID_CERT, signing: 'good' },
      ssh,
      laneOf(ctx).keys,
    );
    wire.authRequest('publickey', payload);
    await wait('certificate sign-in', () => wire.auth.success || wire.auth.failures.length > 0);
    if (!wire.auth.success) throw new Error('certificate sign-in: refused');
    const chan = wire.openChannel('session', 1 << 20, 32_768, Buffer.alloc(0), true);
    await wait('session', () => chan.state !== 'opening');
    if (chan.state !== 'open') throw new Error(`session: ${chan.state}`);
    wire.channelRequest(chan, 'exec', false, str(`hub/${ctx.target.tunnelNamespace}/${CONTROL_POD} -- true`));
    await wait('exec', () => chan.exitStatus !== undefined || chan.state === 'closed', SLOW * ctx.deadlineMs);
    const stderr = Buffer.concat(chan.stderr).toString('utf8');
    if (!stderr.includes(SERVED))
      throw new Error(`exec: exit status ${chan.exitStatus}, stderr ${JSON.stringify(stderr.slice(0, 300))}`);
    return undefined;
  } catch (err) {
    return (err as Error).message;
  } finally {
    await wire.end('close', ctx.deadlineMs);
  }
}

/**
 * Whether the concierge process as a whole has stopped answering: the run asks its event loop every second, and an
 * answer older than STALLED_MS means the loop has not turned since. A case's unanswered request is then no finding of
 * its own; the run's event-loop bound and its stall report are.
 */
const stalled = (ctx: LaneContext): boolean => Date.now() - ctx.target.concierge.answeredAt() > STALLED_MS;
const STALLED_MS = 2_000;

/** Whether the door has room to answer on a channel: a reading client that gave it a usual window and packet size. */
const roomy = (chan: Channel): boolean => chan.reads && chan.granted >= 64 * 1024 && chan.maxPacket >= 1024;

/** One session case as it runs: the connection, and what the oracle has learned of it. */
class SessionRun {
  readonly wire: SshWire;
  /** Nothing malformed or oversized sent yet: the door owes answers. */
  clean = true;
  /** Every authentication request so far was answered before the next was sent. */
  inSync = true;
  /** Authentication requests sent. */
  authSent = 0;
  /** The user name of the last authentication request: a server may disconnect when it changes (RFC 4252 5). */
  lastUser: string | undefined;
  /** A credential that may or must sign in was sent (or a device login approved). */
  maySignIn = false;
  /** The channel the channel steps act on: the last one opened. */
  chan: Channel | undefined;
  /** The first key the fuzzer holds that this connection proved with a good signature: a login would bind it. */
  provedKey: Extract<KeyChoice, string> | undefined;
  /** Channels this client sent EOF or close on. */
  readonly ended = new Set<number>();
  /**
   * Channels that run something (a shell, a command, a subsystem): ssh2 answers no request that wants a reply on such
   * a channel after (its accept and reject do nothing once a session runs), so none is owed there.
   */
  readonly running = new Set<number>();
  sftpId = 0;
  /** The case ended the connection at a stage (walked away at the device prompt). */
  walkedAway = false;
  readonly reached = new Set<string>();
  readonly c: SessionCase;
  readonly ctx: LaneContext;

  constructor(c: SessionCase, ctx: LaneContext, from: string) {
    this.c = c;
    this.ctx = ctx;
    const offer = c.offer
      ? {
          kex: [c.offer.kex],
          serverHostKey: ['ssh-ed25519', 'ecdsa-sha2-nistp256', 'rsa-sha2-512', 'rsa-sha2-256'],
          cipher: [c.offer.cipher],
          mac: [c.offer.mac],
          compress: [c.offer.compress],
        }
      : undefined;
    this.wire = new SshWire({
      port: ctx.target.ssh.port,
      localAddress: from,
      ...(c.ident === null ? {} : { ident: Buffer.from(c.ident, 'latin1') }),
      ...(offer ? { offer } : {}),
    });
  }

  private get d(): number {
    return this.ctx.deadlineMs;
  }

  /** Authentication answers so far; each request gets at least one. */
  private answers(): number {
    const a = this.wire.auth;
    return a.failures.length + a.pkOk + a.prompts.length + (a.success ? 1 : 0);
  }

  /**
   * Waits for `done`. When the door owes the answer (`owed`, and nothing malformed was sent), no answer in time is a
   * hang, and a connection closed instead of answering is a finding too unless `closeOk` (a request whose fields may
   * not parse), and only for an address of the case's own (the controls' address may be over its bound).
   */
  async owe(
    what: string,
    done: () => boolean,
    owed: boolean,
    ms = this.d,
    closeOk = false,
  ): Promise<'ok' | 'closed' | 'timeout'> {
    if (!owed || !this.clean) return this.wire.until(done, Math.min(ms, UNOWED_MS));
    const how = await this.wire.until(done, ms);
    if (how === 'timeout' && stalled(this.ctx)) {
      // The whole process stopped answering (the run reports the stall, with every case in flight then).
      this.count('no answer: the process stalled');
      return how;
    }
    if (how === 'timeout') throw finding('hang', `${what}: no answer within ${ms} ms (${this.describe()})`);
    // ssh2's own chacha20-poly1305 (without its native binding: poly1305 in WebAssembly) now and then throws on what
    // this client decrypts or encrypts: it could not read the answer or send its request, which says nothing of the
    // door.
    if (how === 'closed' && this.wire.failedAt?.includes('/ssh2/lib/protocol/crypto')) {
      this.count('this client failed in its cipher');
      return how;
    }
    if (how === 'closed' && this.c.from === 'own' && !closeOk)
      throw finding(
        'unanswered',
        `${what}: the door ${ending(this.wire)} instead of answering (${this.describe()})`,
      );
    return how;
  }

  describe(): string {
    const a = this.wire.auth;
    return `kex ${this.wire.kexDone ? 'done' : 'not done'}, ${a.failures.length} refusals, ${a.pkOk} key queries answered, ${a.prompts.length} prompts, ${a.success ? 'signed in' : 'not signed in'}`;
  }

  /** The oracle on what the authentication layer said so far. */
  judgeAuth(): void {
    const a = this.wire.auth;
    if (a.success && !this.maySignIn)
      throw finding(
        'accepted-forgery',
        `signed in without a credential that may sign in (${this.describe()})`,
      );
    // Requests sent after the connection ran out of tries are refused unread, without the methods.
    for (const [i, f] of a.failures.entries())
      if ((f.methods.join(',') !== METHODS && i < MAX_AUTH_TRIES) || f.partial)
        throw finding(
          'bad-refusal',
          `a refusal naming ${JSON.stringify(f.methods)}${f.partial ? ' with partial success' : ''}, not ${METHODS}`,
        );
  }

  count(what: string): void {
    if (this.reached.has(what)) return;
    this.reached.add(what);
    this.ctx.count(what);
  }

  /** The transport up to the case's stop; false when the case ends there. */
  async transport(): Promise<boolean> {
    const { c, wire } = this;
    const stopAt = c.stop === 'server kexinit' ? 1 : c.stop === 'kex reply' ? 2 : 0;
    if (stopAt)
      wire.onInbound = (n) => {
        if (n >= stopAt) wire.freeze();
      };
    // The door sends its version at once; the key exchange is owed when the client offers what the door takes.
    await this.owe('version', () => wire.serverIdent !== undefined, true);
    if (wire.serverIdent !== undefined) this.count('ident');
    if (stopAt) {
      await wire.until(() => wire.frozen, Math.min(this.d, UNOWED_MS));
      if (wire.frozen) this.count('aim reached');
      return false;
    }
    // ssh2 hashes the client's version as it reads it, re-encoded as UTF-8: a version that is not printable ASCII (as
    // RFC 4253 4.2 wants it) fails the exchange, harmlessly.
    const asciiIdent = c.ident === null || /^[\x21-\x7e]+( [\x20-\x7e]*)?$/.test(c.ident);
    await this.owe('key exchange', () => wire.kexDone, c.offer === null && asciiIdent);
    if (!wire.kexDone) return false;
    this.count('kex done');
    if (c.aim === 'transport' || c.aim === 'malformed') this.count('aim reached');
    return c.aim !== 'transport';
  }

  async step(s: Step): Promise<void> {
    const { wire } = this;
    switch (s.t) {
      case 'service': {
        wire.send(serviceRequest(s.name));
        const before = wire.serviceAccepted.length;
        await this.owe(
          'service ssh-userauth',
          () => wire.serviceAccepted.length > before,
          s.name === 'ssh-userauth',
        );
        return;
      }
      case 'auth':
        return this.auth(s);
      case 'burst':
        return this.burst(s);
      case 'device':
        return this.device(s.then);
      case 'raw':
        this.clean = false;
        wire.send(Buffer.concat([Buffer.of(s.type), Buffer.from(s.body, 'latin1')]));
        return;
      case 'oversized':
        this.clean = false;
        wire.send(Buffer.concat([Buffer.of(s.type), Buffer.alloc(s.size - 1, 0x61)]));
        return;
      case 'garbage':
        this.clean = false;
        wire.writeRaw(Buffer.from(s.bytes, 'latin1'));
        return;
      case 'ignore': {
        // Without compression a payload past the packet limit is malformed; with it, a few KiB inflate to MiBs.
        const compressed =
          this.c.offer?.compress === 'zlib' ||
          (this.c.offer?.compress === 'zlib@openssh.com' && wire.auth.success);
        if (s.size > 34_000 && !compressed) this.clean = false;
        wire.send(Buffer.concat([Buffer.of(MSG.IGNORE), str(Buffer.alloc(s.size))]));
        return;
      }
      case 'rekey':
        wire.rekey();
        return;
      case 'pause':
        await sleep(s.ms);
        return;
      default:
        return this.channelStep(s);
    }
  }

  private async auth(s: Extract<Step, { t: 'auth' }>): Promise<void> {
    const { wire } = this;
    const grant = methodGrant(s.how, s.user, (key) => typeof key === 'string' && BOUND.has(key));
    if (grant === 'never' && s.how.m === 'key' && s.how.signing === 'good' && typeof s.how.key === 'string')
      this.provedKey ??= s.how.key;
    if (grant !== 'never') this.maySignIn = true;
    const { method, payload } = authPayload(wire, s.user, s.how, this.ctx.target.ssh, laneOf(this.ctx).keys);
    const synced = this.inSync && !wire.auth.success;
    // Authentication after success breaks RFC 4252 (ssh2 disconnects): nothing is owed after it.
    if (wire.auth.success) this.clean = false;
    const sameUser = this.lastUser === undefined || this.lastUser === s.user;
    this.lastUser = s.user;
    // Past MAX_AUTH_TRIES refusals the door refuses everything and disconnects, as sshd does (one fewer here: the
    // first "none" is not a try).
    const triesLeft = wire.auth.failures.length < MAX_AUTH_TRIES - 1;
    wire.authRequest(method, payload);
    this.authSent++;
    if (!s.wait) {
      this.inSync = false;
      return;
    }
    const wanted = this.answers() + 1;
    // An unknown method name is the protocol error ssh2 disconnects for; every known one is answered, though a
    // signature or method data that does not parse may end the connection instead.
    const known = ['none', 'password', 'publickey', 'hostbased'].includes(method);
    const parses =
      sameUser &&
      triesLeft &&
      (s.how.m === 'none' ||
        s.how.m === 'password' ||
        (s.how.m === 'cert' && ['good', 'query'].includes(s.how.signing)) ||
        (s.how.m === 'key' && typeof s.how.key === 'string' && ['good', 'query'].includes(s.how.signing)));
    await this.owe(
      `authentication (${method})`,
      () => this.answers() >= wanted,
      known && synced,
      this.d,
      !parses,
    );
    if (this.answers() > 0) this.count('auth answered');
    this.judgeAuth();
    if (grant === 'must' && synced && triesLeft && this.clean && !wire.auth.success && !wire.closed)
      throw finding(
        'wrong-answer',
        `a valid certificate, correctly signed, was refused (${this.describe()})`,
      );
  }

  private async burst(s: Extract<Step, { t: 'burst' }>): Promise<void> {
    const { wire } = this;
    if (wire.auth.success) this.clean = false;
    const key = oddKey(s.key);
    const head = (user: string): Buffer =>
      Buffer.concat([Buffer.of(MSG.USERAUTH_REQUEST), str(user), str('ssh-connection'), str('publickey')]);
    const before = this.answers();
    // One message built once and sent n times: each costs the door a key parse and (signed) a modular exponentiation.
    const query = s.signing === 'query';
    const payload = Buffer.concat([
      head(FUZZ_USER),
      Buffer.of(query ? 0 : 1),
      str(key.algo),
      str(key.blob),
      ...(query ? [] : [str(key.signature)]),
    ]);
    for (let i = 0; i < s.n; i++) wire.authRequest('publickey', payload);
    this.authSent += s.n;
    this.inSync = false;
    await wire.until(() => this.answers() >= before + s.n, SLOW * this.d);
    if (this.answers() > before) this.count('pipeline answered');
    this.judgeAuth();
  }

  private async device(then: Extract<Step, { t: 'device' }>['then']): Promise<void> {
    const { wire, ctx } = this;
    if (wire.auth.success) this.clean = false;
    const prompts = wire.auth.prompts.length;
    const failures = wire.auth.failures.length;
    // A server may disconnect when the user name changes between attempts (RFC 4252 5).
    const synced =
      this.inSync &&
      !wire.auth.success &&
      (this.lastUser ?? FUZZ_USER) === FUZZ_USER &&
      wire.auth.failures.length < MAX_AUTH_TRIES - 1;
    this.lastUser = FUZZ_USER;
    wire.authRequest('keyboard-interactive', deviceRequest(FUZZ_USER));
    this.authSent++;
    await this.owe(
      'device login',
      () => wire.auth.prompts.length > prompts || wire.auth.failures.length > failures || wire.auth.success,
      synced,
    );
    this.judgeAuth();
    const prompt = wire.auth.prompts[prompts];
    if (!prompt) return;
    this.count('device prompt');
    if (this.c.aim === 'device prompt') this.count('aim reached');
    switch (then) {
      case 'walk away':
        this.walkedAway = true;
        return;
      case 'answer':
      case 'wait':
        wire.send(infoResponse([]));
        this.inSync = false;
        return;
      case 'answer wrongly':
        wire.send(infoResponse(['y', '\0', 'x'.repeat(5000)]));
        this.inSync = false;
        return;
      case 'abort':
        // A new request aborts the login under way (RFC 4252 5); ssh2 says so to the door, which must let it go.
        wire.authRequest(
          'none',
          Buffer.concat([
            Buffer.of(MSG.USERAUTH_REQUEST),
            str(FUZZ_USER),
            str('ssh-connection'),
            str('none'),
          ]),
        );
        this.authSent++;
        // The door owes this request its answer (the abandoned login gets none): waited for, or the next request
        // would take this one's refusal for its own answer.
        await this.owe(
          'a request after an abandoned device login',
          () => wire.auth.failures.length > failures || wire.auth.success,
          synced,
        );
        this.judgeAuth();
        return;
      case 'approve': {
        // The login binds the first key this connection proved: from now on it may sign in.
        if (this.provedKey) BOUND.add(this.provedKey);
        wire.send(infoResponse([]));
        const complete = /or open (\S+)/.exec(prompt.instructions)?.[1];
        const start = /open (\S+) and enter the code (\S+)/.exec(prompt.instructions);
        if (!complete && !start)
          throw finding(
            'wrong-answer',
            `a device prompt without a code: ${JSON.stringify(prompt.instructions)}`,
          );
        this.maySignIn = true;
        await approveDevice(complete ?? { verificationUri: start![1]!, userCode: start![2]! }, {
          caPem: ctx.target.issuer.caPem,
        });
        const how = await this.owe(
          'approved device login',
          () => wire.auth.success || wire.auth.failures.length > failures,
          synced,
          SLOW * this.d,
        );
        if (wire.auth.success) this.count('device login approved');
        if (how === 'ok' && !wire.auth.success && synced && this.clean)
          throw finding('wrong-answer', `an approved device login was refused (${this.describe()})`);
        return;
      }
    }
  }

  private async channelStep(s: Step): Promise<void> {
    const { wire } = this;
    const chan = this.chan;
    switch (s.t) {
      case 'open':
        return this.open(s);
      case 'channels':
        return this.openMany(s.n);
      case 'exec':
        return this.exec(s.command);
      case 'pty':
        wire.channelRequest(
          chan ?? this.stray(),
          'pty-req',
          true,
          Buffer.concat([
            str(Buffer.from(s.term, 'latin1')),
            u32(s.cols),
            u32(s.rows),
            u32(0),
            u32(0),
            str(Buffer.from(s.modes, 'latin1')),
          ]),
        );
        // Terminal modes are opcodes and values (RFC 4254 8): random ones may not parse, and ssh2 disconnects then.
        return this.reply('pty', true, s.modes !== '');
      case 'shell':
        wire.channelRequest(chan ?? this.stray(), 'shell', true, Buffer.alloc(0));
        return this.reply('shell', true, false, true);
      case 'subsystem':
        wire.channelRequest(chan ?? this.stray(), 'subsystem', true, str(s.name));
        await this.reply(`subsystem ${JSON.stringify(s.name)}`, true, false, true);
        // A channel given to SFTP carries SFTP only: ssh2 answers no request on it after.
        if (chan?.replies[chan.replies.length - 1] === true) this.ended.add(chan.local);
        return;
      case 'sftp':
        return this.sftp(s.ops);
      case 'request':
        // Random data after a request's name is malformed for most (ssh2 disconnects then), and so is nothing where
        // the request has fields (env's name and value, exec's command, a signal's name...).
        if (s.body !== '' || !BODILESS_REQUESTS.has(s.name)) this.clean = false;
        wire.channelRequest(chan ?? this.stray(), s.name, s.wantReply, Buffer.from(s.body, 'latin1'));
        // Owed only where an empty body is the whole request (an unknown type, agent forwarding).
        if (s.wantReply)
          return this.reply(`request ${s.name}`, ['x', 'auth-agent-req@openssh.com'].includes(s.name));
        return;
      case 'data':
        // Data after this client's EOF breaks RFC 4254 5.3.
        if (chan && this.ended.has(chan.local)) this.clean = false;
        if (chan) wire.channelData(chan, Buffer.from(s.bytes, 'latin1'));
        return;
      case 'window':
        wire.send(
          Buffer.concat([Buffer.of(MSG.CHANNEL_WINDOW_ADJUST), u32(chan?.remote ?? 0xfff), u32(s.n)]),
        );
        return;
      case 'eof':
      case 'close channel':
        if (chan) this.ended.add(chan.local);
        wire.send(
          Buffer.concat([
            Buffer.of(s.t === 'eof' ? MSG.CHANNEL_EOF : MSG.CHANNEL_CLOSE),
            u32(chan?.remote ?? 0xfff),
          ]),
        );
        return;
      case 'global':
        return this.global(s);
      default:
        return;
    }
  }

  /**
   * Waits for the answer to a request on the current channel: owed (`owed`) while the connection is signed in and the
   * channel is open, read, and neither ended by this client nor given to SFTP.
   */
  private async reply(what: string, owed: boolean, closeOk = false, runs = false): Promise<void> {
    const chan = this.chan;
    if (!chan) return;
    const open =
      chan.state === 'open' && chan.reads && !this.ended.has(chan.local) && !this.running.has(chan.local);
    const before = chan.replies.length;
    const done = (): boolean => chan.replies.length > before || chan.state === 'closed';
    await this.owe(what, done, owed && open && this.wire.auth.success, this.d, closeOk);
    if (runs && chan.replies.length > before && chan.replies[chan.replies.length - 1] === true)
      this.running.add(chan.local);
  }

  private async open(s: Extract<Step, { t: 'open' }>): Promise<void> {
    const extra =
      s.kind === 'direct-tcpip'
        ? Buffer.concat([str(Buffer.from(s.dest, 'latin1')), u32(s.port), str('127.0.0.1'), u32(40_000)])
        : Buffer.alloc(0);
    const made = this.wire.openChannel(s.kind, s.window, s.maxPacket, extra, s.reads);
    this.chan = made;
    const owed = this.wire.auth.success && (s.kind === 'session' || s.kind === 'direct-tcpip');
    // A forward's open waits for the cluster to decide and dial.
    const ms = s.kind === 'direct-tcpip' ? SLOW * this.d : this.d;
    await this.owe(`channel open (${s.kind})`, () => made.state !== 'opening', owed, ms);
    if (made.state === 'open') this.opened();
  }

  /** Opens `n` sessions at once, beyond the door's bound per connection when n > 32: each is answered. */
  private async openMany(n: number): Promise<void> {
    const made = Array.from({ length: n }, () =>
      this.wire.openChannel('session', 1 << 20, 32_768, Buffer.alloc(0), true),
    );
    const answered = (): boolean => made.every((m) => m.state !== 'opening');
    await this.owe(`${n} channel opens`, answered, this.wire.auth.success);
    if (made.some((m) => m.state === 'open')) this.opened();
    this.chan = made[made.length - 1];
  }

  private opened(): void {
    this.count('channel open');
    if (this.c.aim === 'channel') this.count('aim reached');
  }

  private async exec(command: string): Promise<void> {
    const chan = this.chan;
    const ran = chan !== undefined && this.running.has(chan.local);
    this.wire.channelRequest(chan ?? this.stray(), 'exec', true, str(Buffer.from(command, 'latin1')));
    await this.reply('exec', true, false, true);
    if (!chan || chan.state !== 'open' || this.ended.has(chan.local)) return;
    // The exec goes through the pipeline; an agent cluster's fake agents may never answer one, and a client that
    // gave no room to write in cannot be told why it failed. Its result is owed only for the channel's one run.
    const owed = !command.startsWith('fuzz-agent') && roomy(chan) && !ran && chan.replies.at(-1) === true;
    const ended = (): boolean => chan.exitStatus !== undefined || chan.state === 'closed';
    await this.owe('exec result', ended, owed, SLOW * this.d);
    if (chan.exitStatus !== undefined || chan.stderr.length > 0) {
      this.count('exec answered');
      if (this.c.aim === 'exec') this.count('aim reached');
    }
  }

  private async global(s: Extract<Step, { t: 'global' }>): Promise<void> {
    const { wire } = this;
    // Only a few global requests take no data; random data is malformed for every one.
    if (s.body !== '' || !['no-more-sessions@openssh.com', 'keepalive@openssh.com', 'x'].includes(s.name))
      this.clean = false;
    const before = wire.globalReplies.length;
    wire.send(
      Buffer.concat([
        Buffer.of(MSG.GLOBAL_REQUEST),
        str(s.name),
        Buffer.of(s.wantReply ? 1 : 0),
        Buffer.from(s.body, 'latin1'),
      ]),
    );
    if (s.wantReply)
      await this.owe(`global request ${s.name}`, () => wire.globalReplies.length > before, false);
  }

  /** A channel the door never opened, for requests sent without one: malformed. */
  private stray(): Channel {
    this.clean = false;
    return newChannel({ local: -1, remote: 0xfff, state: 'open', reads: false, granted: 0, maxPacket: 0 });
  }

  private async sftp(ops: Extract<Step, { t: 'sftp' }>['ops']): Promise<void> {
    const { wire } = this;
    const chan = this.chan;
    if (!chan || chan.state !== 'open' || chan.replies[chan.replies.length - 1] !== true) return;
    for (const op of ops) {
      if (op.op === 'packet' || op.op === 'lying length') this.clean = false;
      const { handle } = sftpAnswers(Buffer.concat(chan.data));
      wire.channelData(chan, sftpBytes(op, ++this.sftpId, handle ?? Buffer.from('h')));
      if (op.op === 'init') {
        const owed = roomy(chan) && op.version === 3 && this.sftpId === 1;
        await this.owe(
          'sftp version',
          () => sftpAnswers(Buffer.concat(chan.data)).types.includes(SFTP_VERSION) || chan.state === 'closed',
          owed,
        );
      }
    }
    if (chan.reads)
      await wire.until(() => sftpAnswers(Buffer.concat(chan.data)).types.length >= ops.length, this.d / 5);
    if (sftpAnswers(Buffer.concat(chan.data)).types.length > 0) {
      this.count('sftp answered');
      if (this.c.aim === 'sftp') this.count('aim reached');
    }
  }

  /** Ends the connection as the case says. */
  async finish(): Promise<void> {
    const { c, wire } = this;
    if (!wire.closed) this.count('ended by the case');
    else if (!this.walkedAway) this.count('closed by the door');
    if (c.end === 'hold') {
      wire.stopReading();
      await wire.until(() => false, c.holdMs);
      await wire.end('reset', 0);
    } else await wire.end(c.end, this.d);
  }
}

async function runSession(c: SessionCase, ctx: LaneContext): Promise<void> {
  const run = new SessionRun(c, ctx, address(c.from, ctx));
  try {
    if (await run.transport())
      for (const step of c.steps) {
        if (run.wire.closed || run.walkedAway) break;
        await run.step(step);
        run.judgeAuth();
        // Requests sent ahead of a sign-in arrive after it, which ssh2 disconnects for: nothing is owed after.
        if (run.wire.auth.success && !run.inSync) run.clean = false;
      }
    run.judgeAuth();
    if (run.wire.auth.success) run.count('signed in');
    if (run.wire.auth.failures.some((f) => f.methods.includes('keyboard-interactive')))
      run.count('keyboard-interactive offered');
    if (c.aim === 'sign-in' && run.reached.has('auth answered')) run.count('aim reached');
  } finally {
    await run.finish();
  }
}

/** The stops before the transport takes over: the bytes of a version exchange gone wrong, on a plain socket. */
async function runRawStop(c: SessionCase, ctx: LaneContext): Promise<void> {
  const from = address(c.from, ctx);
  const socket = connect({ host: '127.0.0.1', port: ctx.target.ssh.port, localAddress: from });
  let received = '';
  let closed = false;
  socket.setEncoding('latin1');
  socket.on('data', (chunk: string) => (received = (received + chunk).slice(0, 4096)));
  socket.on('error', () => {});
  const gone = new Promise<void>((done) => socket.once('close', () => ((closed = true), done())));
  try {
    await Promise.race([new Promise((done) => socket.once('connect', done)), gone]);
    const bytes =
      c.stop === 'partial ident'
        ? `SSH-2.0-${(c.ident ?? 'fuzz').slice(0, 10)}`
        : c.stop === 'bad ident'
          ? c.preBytes
          : c.stop === 'ident then garbage'
            ? `SSH-2.0-fuzz\r\n${c.preBytes}`
            : '';
    if (bytes && !closed) socket.write(Buffer.from(bytes, 'latin1'));
    // The door sends its version first, whatever the client does.
    const deadline = Date.now() + ctx.deadlineMs;
    while (!received.includes('\n') && !closed && Date.now() < deadline) await sleep(10);
    if (received.startsWith('SSH-2.0-')) {
      ctx.count('ident');
      ctx.count('aim reached');
    } else if (!closed && stalled(ctx)) ctx.count('no answer: the process stalled');
    else if (!closed) throw finding('hang', `no version from the door within ${ctx.deadlineMs} ms`);
    else if (c.from === 'own')
      throw finding('unanswered', `the door closed without its version: ${JSON.stringify(received)}`);
  } finally {
    if (c.end === 'hold' && !closed) {
      socket.pause();
      await Promise.race([sleep(c.holdMs), gone]);
    } else if (c.end === 'close' && !closed) {
      socket.end();
      socket.resume();
      await Promise.race([sleep(ctx.deadlineMs), gone]);
    }
    socket.destroy();
  }
}

/** One connection held at `stage`; resolves once it is there (or the door closed it). */
async function crowdMember(stage: CrowdCase['stage'], from: string, ctx: LaneContext): Promise<SshWire> {
  const wire = new SshWire({ port: ctx.target.ssh.port, localAddress: from });
  if (stage === 'connected') {
    wire.freeze();
    await wire.until(() => wire.socket.readyState === 'open', ctx.deadlineMs);
    return wire;
  }
  if (stage === 'ident') wire.onIdent = () => wire.freeze();
  await wire.until(() => (stage === 'ident' ? wire.serverIdent !== undefined : wire.kexDone), ctx.deadlineMs);
  if (stage === 'failed sign-in' && wire.kexDone) {
    wire.send(serviceRequest('ssh-userauth'));
    wire.authRequest(
      'none',
      Buffer.concat([Buffer.of(MSG.USERAUTH_REQUEST), str('nobody'), str('ssh-connection'), str('none')]),
    );
    await wire.until(() => wire.auth.failures.length > 0, ctx.deadlineMs);
  }
  return wire;
}

async function runCrowd(c: CrowdCase, ctx: LaneContext): Promise<void> {
  const from = address(c.from, ctx);
  const crowd: SshWire[] = [];
  try {
    for (let i = 0; i < c.count; i++) crowd.push(await crowdMember(c.stage, from, ctx));
    const held = crowd.filter((w) => !w.closed).length;
    ctx.count(`crowd held ${held === c.count ? 'whole' : 'in part'}`);
    const problem = await wellBehaved(ctx, from);
    if (problem !== undefined && stalled(ctx)) return ctx.count('no answer: the process stalled');
    if (problem !== undefined)
      throw finding(
        'unserved',
        `a well-behaved user from ${c.from === 'shared' ? "the controls' address" : 'an address'} was not served while ${held} connections from it were held (${c.stage}): ${problem}`,
      );
    ctx.count('user served beside a crowd');
    ctx.count('aim reached');
  } finally {
    await Promise.all(crowd.map((w) => w.end('reset', 0)));
  }
}

export const sshFamily: Family<SshCase> = {
  name: 'ssh',
  weight: 30,
  arbitrary: sshCase,
  async run(c, ctx) {
    if (c.aim === 'crowd') return runCrowd(c, ctx);
    if (['silent', 'partial ident', 'bad ident', 'ident then garbage'].includes(c.stop))
      return runRawStop(c, ctx);
    return runSession(c, ctx);
  },
  async control(ctx) {
    const problem = await wellBehaved(ctx, SHARED);
    // A process that stopped answering altogether is the run's finding (its stall), not this control's.
    if (problem !== undefined && stalled(ctx)) return 'undecided';
    if (problem !== undefined)
      throw finding('control-failed', `a certificate sign-in and an exec from ${SHARED}: ${problem}`);
  },
  reach: 'aim reached',
  alsoReach: [
    'kex done',
    'keyboard-interactive offered',
    'device prompt',
    'signed in',
    'channel open',
    'exec answered',
    'sftp answered',
    'pipeline answered',
    'user served beside a crowd',
  ],
  answersHttp: false,
};
