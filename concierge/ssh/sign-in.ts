// How a connection signs in to the SSH door: with a user certificate from a CA the admin trusts, with a key that an
// earlier device login bound, or with a device login at a JWTAuthenticator's issuer (which binds the key the client
// proved it holds). Everything here runs for strangers, so what it costs is bounded before any work is done:
// - at most MAX_AUTH_TRIES refusals per connection, then it is disconnected, as sshd's MaxAuthTries does; requests the
//   client sent ahead of their answers are refused without a look;
// - a signature is checked only when the key could sign the connection in: a bound key, the first plain key while a
//   device login may bind one, a certificate that a trusted CA really signed. A stranger's unbound keys are refused
//   at the question "would this key do?", before the client signs anything;
// - a certificate is checked once per connection, whether the client asks with it first or signs at once;
// - a bound key whose login's ID token expired is renewed at the issuer (renewal.ts) only after its signature was
//   checked, one renewal per binding at a time, within a deadline;
// - device logins hold fair places (lib/fair-places.ts), the poll's promise is owned where it is made, and its place
//   is given back on every path, a client that leaves at the prompt included.
// Identities from certificates pass the checks every other identity passes: names a header can carry unchanged, and
// no `system:` names unless the config allows them (ssh.allowSystemNames).
import type { AuthContext } from 'ssh2';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import { identityProblem } from '../../lib/authn/identity.ts';
import { systemNameProblem } from '../../lib/authn/system-names.ts';
import type { Clock } from '../../lib/clock.ts';
import type { FairPlaces } from '../../lib/fair-places.ts';
import type { Logger } from '../../lib/log.ts';
import {
  checkUserCertificate,
  fingerprint,
  isCertificateAlgorithm,
  verifyKeySignature,
  type AuthorizedKey,
} from '../../lib/ssh/keys.ts';
import { sendBanner } from './banner.ts';
import { bindingName, type BoundKey, type KeyBindings } from './bindings.ts';
import {
  DEVICE_LOGIN_MAX_MS,
  startDeviceLogin,
  type DeviceLoginSettings,
  type LoginOutcome,
} from './device-login.ts';
import type { CertificateVerdict, DoorConnection } from './door-connection.ts';
import { newRenewals, renewLogin, type RenewalOutcome } from './renewal.ts';

/** sshd's MaxAuthTries default: refusals a connection gets before it is disconnected. */
export const MAX_AUTH_TRIES = 6;

/** How long a device login's connection may stay past the login itself (the client reads the answer). */
const DEVICE_LOGIN_SLACK_MS = 30_000;

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
  /** Certificates may name `system:` users and groups. Default: false. */
  allowSystemNames?: boolean;
  /** How long a device login keeps a key bound at most, renewals included (ssh.maxBindingLifetime). */
  maxBindingMs?: number;
}

/** ssh.maxBindingLifetime's default, 12h: see apis/install.ts. */
export const DEFAULT_MAX_BINDING_MS = 12 * 3600_000;

export interface SignInOptions {
  settings: () => SshSettings;
  cache: Pick<AuthenticatorCache, 'providerOf' | 'authenticateWith' | 'holds'>;
  bindings: KeyBindings;
  /** The device logins' places, one per login, fair among source addresses. */
  deviceLogins: FairPlaces<DoorConnection>;
  /** How long a connection may take to sign in, counted again after a device login that did not sign it in. */
  loginGraceMs: number;
  clock: Clock;
  log: Logger;
}

type Method = 'publickey' | 'keyboard-interactive';
type PublicKeyContext = AuthContext & { method: 'publickey' };
type KeyboardContext = AuthContext & { method: 'keyboard-interactive' };

/**
 * Decides authentication requests. `disconnect` ends the connection with an SSH disconnect, for one that has had its
 * tries.
 */
export type SignIn = (ctx: AuthContext, conn: DoorConnection, disconnect: () => void) => void;

export function newSignIn(opts: SignInOptions): SignIn {
  const { log } = opts;
  const renewals = newRenewals(opts.clock);

  return (ctx, conn, disconnect) => {
    const state = conn.signIn;
    // The client's first question is "none", to learn the methods: not a try, as sshd counts.
    const counted = !(ctx.method === 'none' && state.requests === 0);
    state.requests++;
    conn.progress();
    const settings = opts.settings();
    const methods: Method[] = settings.login ? ['publickey', 'keyboard-interactive'] : ['publickey'];
    if (state.failures >= MAX_AUTH_TRIES) return void answer(() => ctx.reject(methods), disconnect);
    const refuse = (): void => {
      if (counted) state.failures++;
      ctx.reject(methods);
      if (state.failures < MAX_AUTH_TRIES) return;
      log.info({ ip: conn.ip }, 'ssh connection ended: too many authentication failures');
      disconnect();
    };
    const inside = (err: unknown): void => {
      log.warn({ ip: conn.ip, err: (err as Error).message }, 'ssh authentication failed inside the door');
      answer(refuse, disconnect);
    };
    try {
      if (ctx.method === 'publickey')
        return void publicKey({ ...opts, renewals }, ctx, conn, settings, refuse)?.catch(inside);
      if (ctx.method === 'keyboard-interactive' && settings.login)
        return void deviceLogin(opts, ctx, conn, settings.login, refuse).catch(inside);
      refuse();
    } catch (err) {
      // ssh2 throws when its own bookkeeping disagrees with the answer (a key asked about after a device login the
      // client abandoned): the request is refused as any other, and a connection that cannot even be refused ends.
      inside(err);
    }
  };
}

/** Gives an answer, or ends the connection when even that throws. */
function answer(give: () => void, disconnect: () => void): void {
  try {
    give();
  } catch {
    disconnect();
  }
}

type KeyOptions = SignInOptions & { renewals: ReturnType<typeof newRenewals> };

/** Decides a public key or certificate; a promise while a bound key's login is renewed. */
function publicKey(
  opts: KeyOptions,
  ctx: PublicKeyContext,
  conn: DoorConnection,
  settings: SshSettings,
  refuse: () => void,
): Promise<void> | void {
  const state = conn.signIn;
  const { key, signature } = ctx;
  if (isCertificateAlgorithm(key.algo)) {
    const verdict = certificateVerdict(opts, conn, key.data, ctx.username, settings);
    if (!verdict.ok) {
      opts.log.info({ ip: conn.ip, reason: verdict.reason }, 'ssh certificate refused');
      return refuse();
    }
    // A question: the client signs next.
    if (!signature) return ctx.accept();
    if (!verifyKeySignature(ctx)) return refuse();
    state.identity = verdict.identity;
    state.permits = verdict.permits;
    opts.log.info({ ip: conn.ip, keyId: verdict.keyId, serial: verdict.serial }, 'ssh certificate accepted');
    return ctx.accept();
  }
  const print = fingerprint(key.data);
  const bound = boundKey(opts, key.data, print, settings);
  // Only a bound key signs in, and only the first proven key is bound by a login: any other is refused at the
  // question, before its signature costs anything.
  const bindable = settings.login !== undefined && state.provenKey === undefined;
  if (!bound && !bindable) return refuse();
  if (!signature) return ctx.accept();
  if (!verifyKeySignature(ctx)) return refuse();
  if (bound && (bound.expires ?? 0) > opts.clock.now()) {
    state.identity = { ...bound.identity, via: 'ssh/key' };
    return ctx.accept();
  }
  if (bound && settings.login) return renewBoundKey(opts, ctx, conn, settings.login, bound, refuse);
  unbound(ctx, conn, key.data, print, refuse);
}

/**
 * A proven key that is not enough: the client goes on (a certificate may follow), then the login, which binds this
 * key. A client that cannot show a device login (BatchMode, a script) is refused at once: the banner says what to do.
 */
function unbound(
  ctx: PublicKeyContext,
  conn: DoorConnection,
  blob: Buffer,
  print: string,
  refuse: () => void,
): void {
  if (conn.signIn.provenKey === undefined) conn.signIn.provenKey = { blob, fingerprint: print };
  sendBanner(ctx, unboundKeyNotice(print));
  refuse();
}

/**
 * A bound key past its ID token's expiry, its signature checked: the login is renewed with the binding's refresh
 * token. A renewal signs the connection in and keeps the binding; the issuer's refusal ends the binding, and the
 * key is then as unbound (a device login binds it again); no answer from the issuer refuses this sign-in only.
 */
async function renewBoundKey(
  opts: KeyOptions,
  ctx: PublicKeyContext,
  conn: DoorConnection,
  login: DeviceLoginSettings,
  bound: BoundKey,
  refuse: () => void,
): Promise<void> {
  const { key } = ctx;
  const print = fingerprint(key.data);
  // The renewal and what it stores are one step: a sign-in that comes while it runs waits for both, so that nobody
  // reads a refresh token the issuer has already rotated away.
  const outcome = await opts.renewals(bindingName(key.data), () =>
    renewAndKeep(opts, login, key.data, print, bound),
  );
  if (outcome.ok) {
    conn.signIn.identity = { ...outcome.identity, via: 'ssh/key' };
    return ctx.accept();
  }
  opts.log.info({ ip: conn.ip, fingerprint: print, reason: outcome.reason }, 'ssh bound key refused');
  if (!outcome.ended) {
    sendBanner(ctx, unreachableIssuerNotice(print));
    return refuse();
  }
  sendBanner(ctx, endedSessionNotice(print));
  unbound(ctx, conn, key.data, print, refuse);
}

/** Renews the binding's login, and keeps the renewal in the binding, or ends the binding when the issuer refused. */
async function renewAndKeep(
  opts: KeyOptions,
  login: DeviceLoginSettings,
  blob: Buffer,
  print: string,
  bound: BoundKey,
): Promise<RenewalOutcome> {
  const { refreshToken } = bound;
  const username = bound.identity.user.username;
  const outcome: RenewalOutcome = refreshToken
    ? await renewLogin(opts.cache, login, { username, refreshToken }, opts.clock)
    : { ok: false, ended: true, reason: 'the login gave no refresh token' };
  if (outcome.ok) {
    // A binding deleted (revoked) or renewed elsewhere while this renewal ran is not overwritten, and this sign-in
    // is refused: after a revocation nothing may sign in with the key, and after another replica's renewal the next
    // sign-in finds that one's fresh login.
    const kept = await opts.bindings.renew(blob, print, outcome, bound.version).then(
      () => true,
      (err: unknown) => {
        opts.log.warn(
          { fingerprint: print, err: (err as Error).message },
          'ssh key binding renewal not stored',
        );
        return false;
      },
    );
    if (!kept) return { ok: false, ended: false, reason: 'the binding changed while it was renewed' };
    opts.log.info({ fingerprint: print }, 'ssh key binding renewed');
  } else if (outcome.ended) {
    // Only the binding as this sign-in found it: when a renewal stored a newer login meanwhile (here or on another
    // replica), the refusal of this older refresh token ends nothing, and this sign-in alone is refused.
    const ended = await opts.bindings.end(blob, bound.version).then(
      () => true,
      (err: unknown) => {
        opts.log.warn({ fingerprint: print, err: (err as Error).message }, 'ssh key binding not ended');
        return false;
      },
    );
    if (!ended) return { ok: false, ended: false, reason: 'the binding changed while it was renewed' };
    opts.log.info({ fingerprint: print, reason: outcome.reason }, 'ssh key binding ended');
  }
  return outcome;
}

/** What a client whose key is not bound is told, before a device login or a refusal. */
export const unboundKeyNotice = (print: string): string =>
  `Sealion: the key ${print} is not bound to a login yet; a device login binds it, which needs ssh without ` +
  'BatchMode (once: ssh -t <host>).';

/**
 * What a client is told once its key is bound: until when it needs no login, at the latest, and (with a refresh
 * token) that the issuer may end it sooner.
 */
export const boundKeyNotice = (print: string, username: string, until: Date, renewed = false): string =>
  `Sealion: the key ${print} is bound to ${username} until ${utcMinute(until)}.` +
  (renewed ? ' It stays bound while the issuer renews the login; signing out there ends it sooner.' : '');

/** What a client whose binding the issuer ended is told, before the notice that a device login binds the key. */
export const endedSessionNotice = (print: string): string =>
  `Sealion: the login that bound the key ${print} has ended at its issuer (signed out, disabled or expired).`;

/** What a client is told when the issuer could not renew its key's login: the binding stays. */
export const unreachableIssuerNotice = (print: string): string =>
  `Sealion: the login that bound the key ${print} could not be renewed: the issuer did not answer; try again later.`;

/** `2026-11-29 10:00 UTC`. */
export const utcMinute = (at: Date): string => `${at.toISOString().slice(0, 16).replace('T', ' ')} UTC`;

/**
 * A key's binding, while the login that made it could make it again: the login configured is still that
 * JWTAuthenticator's, the very object (by uid) is loaded with a spec that trusts what it trusted then, and the
 * session is within the cap in effect now (an admin who lowers it shortens the sessions under way).
 */
function boundKey(
  opts: SignInOptions,
  blob: Buffer,
  print: string,
  settings: SshSettings,
): BoundKey | undefined {
  const found = opts.bindings.find(blob, print);
  const login = settings.login;
  if (!found || !login || found.identity.via !== `ssh/JWTAuthenticator/${login.authenticator}`)
    return undefined;
  if (!opts.cache.holds(found.authenticator)) return undefined;
  const cap = settings.maxBindingMs ?? DEFAULT_MAX_BINDING_MS;
  if (found.since !== undefined && found.since + cap <= opts.clock.now()) return undefined;
  return found;
}

/** The certificate's verdict for this login name, worked out once per connection. */
function certificateVerdict(
  opts: SignInOptions,
  conn: DoorConnection,
  blob: Buffer,
  loginName: string,
  settings: SshSettings,
): CertificateVerdict {
  const last = conn.signIn.certificate;
  if (last && last.loginName === loginName && last.blob.equals(blob)) return last.verdict;
  const verdict = judgeCertificate(opts, blob, loginName, conn.ip, settings);
  conn.signIn.certificate = { blob, loginName, verdict };
  return verdict;
}

function judgeCertificate(
  opts: SignInOptions,
  blob: Buffer,
  loginName: string,
  ip: string,
  settings: SshSettings,
): CertificateVerdict {
  const checked = checkUserCertificate(blob, {
    cas: settings.certificateAuthorities,
    loginName,
    now: new Date(opts.clock.now()),
    sourceIP: ip,
    groupsExtension: settings.groupsExtension,
  });
  if (!checked.ok) return checked;
  const user = { username: checked.principal, groups: checked.groups, extra: {} };
  // The rules every identity passes, whichever door it came through.
  const problem = identityProblem(user) ?? (settings.allowSystemNames ? undefined : systemNameProblem(user));
  if (problem) return { ok: false, reason: problem };
  return {
    ok: true,
    identity: { kind: 'user', user, via: 'ssh/certificate' },
    permits: checked.permits,
    keyId: checked.keyId,
    serial: checked.serial,
  };
}

/**
 * The device login: instructions shown with no prompt to answer, then the token polled for. Holds a device-login
 * place, and the connection a longer deadline, for as long as it runs; both are given back however it ends.
 */
async function deviceLogin(
  opts: SignInOptions,
  ctx: KeyboardContext,
  conn: DoorConnection,
  login: DeviceLoginSettings,
  refuse: () => void,
): Promise<void> {
  const place = opts.deviceLogins.take(conn.address, conn);
  if (!place) return refuse();
  // This attempt's own end: a new request on the connection (ssh2 aborts this one), or the connection's close.
  const attempt = new AbortController();
  const end = (): void => attempt.abort();
  ctx.once('abort', end);
  const cancel = conn.onClose(end);
  conn.deviceLoginSince = opts.clock.now();
  conn.endAt(opts.clock.now() + DEVICE_LOGIN_MAX_MS + DEVICE_LOGIN_SLACK_MS);
  try {
    const outcome = await runDeviceLogin(opts, ctx, conn, login, attempt.signal);
    // Gone or superseded: nobody to answer.
    if (attempt.signal.aborted) return;
    if (!outcome.ok) {
      opts.log.info({ ip: conn.ip, err: outcome.reason }, 'ssh device login failed');
      return refuse();
    }
    conn.signIn.identity = outcome.identity;
    const until = await bindProvenKey(opts, conn, outcome);
    if (attempt.signal.aborted) return;
    const proven = conn.signIn.provenKey;
    if (until && proven) {
      const username = outcome.identity.user.username;
      sendBanner(
        ctx,
        boundKeyNotice(proven.fingerprint, username, until, outcome.refreshToken !== undefined),
      );
    }
    ctx.accept();
  } finally {
    ctx.off('abort', end);
    cancel();
    place.release();
    conn.deviceLoginSince = undefined;
    if (!conn.signIn.identity) conn.endAt(opts.clock.now() + opts.loginGraceMs);
  }
}

/** Starts the login, shows its instructions, and waits for its outcome, or for the attempt's end. */
async function runDeviceLogin(
  opts: SignInOptions,
  ctx: KeyboardContext,
  conn: DoorConnection,
  login: DeviceLoginSettings,
  signal: AbortSignal,
): Promise<LoginOutcome> {
  let started;
  try {
    started = await startDeviceLogin(opts.cache, login, signal);
  } catch (err) {
    return { ok: false, reason: `could not start: ${(err as Error).message}` };
  }
  // The outcome never rejects, and settles by itself once the attempt ends (its poll is aborted too).
  if (signal.aborted) return started.outcome;
  // Whoever approves the code signs this connection in and binds its key: the key is named, so that a person handed
  // someone else's code sees it is not their own ssh asking.
  const proven = conn.signIn.provenKey;
  const key = proven
    ? `This signs in, and binds for the login's lifetime, the SSH key ${proven.fingerprint}.\n`
    : '';
  // No prompts: the client shows the instructions and answers at once; the answer to this request waits for the
  // person to approve the code. A client that never answers, or leaves, ends the wait with the attempt.
  await new Promise<void>((shown) => {
    signal.addEventListener('abort', () => shown(), { once: true });
    ctx.prompt([], 'Sealion', started.instructions + key, () => shown());
  });
  return started.outcome;
}

/**
 * Binds the key the connection proved it holds, if any, to the login's identity, and gives until when; a failure to
 * store is logged (the connection is signed in all the same, and the next one logs in again).
 */
async function bindProvenKey(
  opts: SignInOptions,
  conn: DoorConnection,
  outcome: LoginOutcome & { ok: true },
): Promise<Date | undefined> {
  const proven = conn.signIn.provenKey;
  if (!proven) return undefined;
  try {
    const maxLifetimeMs = opts.settings().maxBindingMs ?? DEFAULT_MAX_BINDING_MS;
    const until = await opts.bindings.bind(proven.blob, proven.fingerprint, { ...outcome, maxLifetimeMs });
    opts.log.info({ ip: conn.ip, fingerprint: proven.fingerprint }, 'ssh key bound');
    return until;
  } catch (err) {
    opts.log.warn({ err: (err as Error).message }, 'ssh key binding could not be stored');
    return undefined;
  }
}
