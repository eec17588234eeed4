// What the exec credential plugins print and keep: the token a user supplies, its exchange through
// TokenCredentialRequest for a short-lived client certificate, and the cache of both under the user's config folder
// (0600, written whole and renamed into place, under a file lock so that concurrent kubectl processes exchange once,
// reused until shortly before they expire). The commands are in login.ts; OIDC sessions in login-oidc.ts.
import { createHash, createPrivateKey, X509Certificate } from 'node:crypto';
import { mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { basename, join } from 'node:path';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Kind, Resource, VERSION } from '../apis/groups.ts';
import { REASON_EXTENSION_OID, type ClusterCredential, type TokenCredentialRequest } from '../apis/login.ts';
import type * as HttpsClient from '../lib/https-client.ts';
import { AlreadySaid, fileError, originOf, unreachableError, UserError } from './errors.ts';
import { printable } from './printable.ts';
import { currentReason, type StoredReason } from './reason.ts';

/**
 * The HTTPS client (undici, dozens of modules) loads only when a request is made: kubectl runs this plugin for every
 * command, and most runs answer from the cache.
 */
let https: typeof HttpsClient | undefined;
const httpsClient = async (): Promise<typeof HttpsClient> =>
  (https ??= await import('../lib/https-client.ts'));
/** Ends the keep-alive connections of any request made, so the plugin exits as soon as it has answered. */
export const closeHttpsPools = async (): Promise<void> => https?.closeHttpsPools();

export const EXEC_API_VERSION = 'client.authentication.k8s.io/v1';
/** A cached certificate is replaced this long before it expires, so kubectl never presents an expired one. */
const REFRESH_BEFORE_EXPIRY_MS = 60_000;

export interface ExecCredential {
  apiVersion: string;
  kind: 'ExecCredential';
  status: {
    token?: string;
    clientCertificateData?: string;
    clientKeyData?: string;
    expirationTimestamp?: string;
  };
}

/**
 * What kubectl passes in KUBERNETES_EXEC_INFO: whether a person can answer (`interactive`: with the kubeconfig's
 * interactiveMode IfAvailable, whether kubectl's standard input is a terminal it does not need itself), and the
 * cluster when the kubeconfig sets provideClusterInfo (with the cluster's exec extension as `config`).
 */
export interface ExecInfo {
  spec?: {
    interactive?: boolean;
    cluster?: { server?: string; 'certificate-authority-data'?: string; config?: { context?: unknown } };
  };
}

/** KUBERNETES_EXEC_INFO, read; undefined when the plugin was not run by kubectl (or a client that says nothing). */
export function execInfo(env: NodeJS.ProcessEnv): ExecInfo | undefined {
  const text = env['KUBERNETES_EXEC_INFO'];
  if (text === undefined || text === '') return undefined;
  try {
    const info = JSON.parse(text) as unknown;
    if (typeof info === 'object' && info !== null) return info;
  } catch {
    // Said below.
  }
  throw new UserError(
    'KUBERNETES_EXEC_INFO is not an ExecCredential; unset it, or run this from a kubeconfig with kubectl',
  );
}

/**
 * Whether a person may be asked to log in: kubectl says so (`interactive`); without its word (run by hand, or by a
 * client that says nothing) the run is taken as a person's, as before kubectl said it.
 */
export const interactiveRun = (env: NodeJS.ProcessEnv): boolean => execInfo(env)?.spec?.interactive !== false;

/**
 * What a failed login names: kubectl's context when the kubeconfig's cluster passes it (its exec extension), else
 * the agent-backed cluster its server's path names, else the server.
 */
export function sessionPlace(env: NodeJS.ProcessEnv): string | undefined {
  const cluster = execInfo(env)?.spec?.cluster;
  const context = cluster?.config?.context;
  if (typeof context === 'string' && context) return `context ${printable(context)}`;
  if (!cluster?.server) return undefined;
  try {
    const url = new URL(cluster.server);
    const name = /\/clusters\/([^/]+)\/?$/.exec(url.pathname)?.[1];
    return name ? `cluster ${printable(decodeURIComponent(name))}` : printable(url.origin);
  } catch {
    return undefined;
  }
}

/** How a token becomes a credential: as it is, or exchanged for a client certificate. */
export interface ExchangeFlags {
  exchange: boolean;
  /**
   * Send a CSR for a key made here, so that the private key never crosses the wire (Sealion's concierge); false:
   * the concierge makes the key, as Pinniped's does. Default: true.
   */
  proofOfPossession?: boolean;
  authenticatorType: 'jwt' | 'webhook';
  authenticatorName: string;
  groupSuffix: string;
  /** Where TokenCredentialRequest goes; default: the cluster kubectl names. */
  conciergeEndpoint: string;
  conciergeCaBundleData: string;
}

/** The client ID `sealion get kubeconfig` writes unless told otherwise; register it with the issuer. */
export const DEFAULT_OIDC_CLIENT_ID = 'sealion-cli';
/** The scopes `sealion login oidc` asks for unless told otherwise. */
export const DEFAULT_OIDC_SCOPES = 'openid offline_access email profile groups';

export interface OIDCLoginFlags extends ExchangeFlags {
  issuer: string;
  clientId: string;
  scopes: string;
  caBundleData: string;
  listenPort: string;
  skipBrowser: boolean;
  /** Log in with the device authorization grant: a code entered on another device, no browser here. */
  device?: boolean;
}

export interface StaticLoginFlags extends ExchangeFlags {
  /** The token itself: seen by every local user in the process list, so only for a command typed once. */
  token: string;
  tokenEnv: string;
  /** A file that only its owner may read or write, holding the token. */
  tokenFile?: string;
}

/** The folder for cached credentials: $XDG_CONFIG_HOME/sealion or ~/.config/sealion. */
export function configDir(env: NodeJS.ProcessEnv): string {
  return join(env['XDG_CONFIG_HOME'] || join(homedir(), '.config'), 'sealion');
}

/**
 * The token in `file`, which must be a regular file that only its owner may read or write (as ssh asks of a key):
 * a token another local user can read is not the user's alone, and one they can write lets them choose whom this
 * user becomes. Windows has no such mode bits to check.
 */
export function readTokenFile(file: string): string {
  const fix = 'check the path, or write the token there';
  let stat;
  try {
    stat = statSync(file);
  } catch (err) {
    throw fileError(err, 'token file', file, fix);
  }
  if (!stat.isFile()) throw new UserError(`cannot read token file ${file}: it is not a regular file; ${fix}`);
  if (process.platform !== 'win32' && (stat.mode & 0o077) !== 0)
    throw new Error(
      `token file ${file} is open to other users (mode ${(stat.mode & 0o777).toString(8).padStart(4, '0')}): run chmod 600 on it`,
    );
  const token = readFileSync(file, 'utf8').trim();
  if (!token) throw new Error(`token file ${file} is empty`);
  return token;
}

export function tokenOf(
  flags: StaticLoginFlags,
  env: NodeJS.ProcessEnv,
  say: (line: string) => void,
): string {
  const given = [
    flags.token && '--token',
    flags.tokenEnv && '--token-env',
    flags.tokenFile && '--token-file',
  ];
  const named = given.filter(Boolean);
  if (named.length > 1)
    throw new Error(`give one of --token, --token-env and --token-file, not ${named.join(' and ')}`);
  if (flags.token) {
    // A process's arguments are public on most systems (ps, /proc/<pid>/cmdline): a kubeconfig that passes the token
    // this way shows it to every local user each time kubectl runs. kubectl sets KUBERNETES_EXEC_INFO for its
    // plugins, so this is said there, where it repeats, and not to someone typing the command once. Such
    // kubeconfigs keep working (older versions of get kubeconfig wrote them).
    if (env['KUBERNETES_EXEC_INFO'] !== undefined)
      say(
        'warning: this kubeconfig passes the token with --token, which shows it to every local user in the process list; write it again with sealion get kubeconfig --static-token-env or --static-token-file',
      );
    return flags.token;
  }
  if (flags.tokenFile) return readTokenFile(flags.tokenFile);
  if (!flags.tokenEnv) throw new Error('give --token-env, --token-file or --token');
  const token = env[flags.tokenEnv];
  if (!token) throw new Error(`environment variable ${flags.tokenEnv} is empty or not set`);
  return token;
}

/** Where a static token comes from, in words, for an error that names it. */
export function tokenSource(flags: StaticLoginFlags): string {
  if (flags.tokenFile) return `the token in file ${flags.tokenFile}`;
  if (flags.tokenEnv && !flags.token) return `the token in environment variable ${flags.tokenEnv}`;
  return 'the token given with --token';
}

/**
 * When a token that is a JWT says it expires (ms since the epoch); undefined for any other token. Read, not
 * verified: it only lets the CLI say "expired" before the server says only "authentication failed".
 */
export function jwtExpiry(token: string): number | undefined {
  const parts = token.split('.');
  if (parts.length !== 3) return undefined;
  try {
    const exp = (JSON.parse(Buffer.from(parts[1]!, 'base64url').toString('utf8')) as { exp?: unknown }).exp;
    return typeof exp === 'number' && Number.isFinite(exp) ? exp * 1000 : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The concierge answered a TokenCredentialRequest without a credential. Its 401 and its message are the same for
 * every failure (an expired, a forged or an unknown token), so the refusal names what the CLI knows: which
 * authenticator the kubeconfig asked, where, and (from the caller) which token.
 */
export class ExchangeRefused extends UserError {
  readonly authenticator: string;
  readonly origin: string;
  /** The server's message, escaped. */
  readonly said: string;
  constructor(authenticator: string, origin: string, said: string) {
    super(`${authenticator} refused the token on ${origin}: ${said}`);
    this.name = 'ExchangeRefused';
    this.authenticator = authenticator;
    this.origin = origin;
    this.said = said;
  }

  /** The refusal as one line, naming the token and what to do. */
  explained(token: string, fix: string): UserError {
    return new UserError(`${this.authenticator} refused ${token} on ${this.origin}: ${this.said}; ${fix}`, {
      cause: this,
    });
  }
}

/**
 * Trades `token` for a client certificate: a TokenCredentialRequest to the proxy at `endpoint`, naming the
 * authenticator to check it with, and with `csrPem` the certificate request for the caller's own key. The answer
 * (201 either way) carries a certificate or a message.
 */
export async function exchange(
  endpoint: string,
  caPem: string | undefined,
  token: string,
  authenticator: { kind: Kind; name: string },
  groupSuffix = DEFAULT_GROUP_SUFFIX,
  csrPem?: string,
  reason?: string,
): Promise<ClusterCredential> {
  const groups = apiGroups(groupSuffix);
  const body: TokenCredentialRequest = {
    apiVersion: `${groups.login}/${VERSION}`,
    kind: 'TokenCredentialRequest',
    spec: {
      token,
      authenticator: { apiGroup: groups.authentication, ...authenticator },
      ...(csrPem ? { certificateSigningRequest: csrPem } : {}),
      ...(reason !== undefined ? { reason } : {}),
    },
  };
  const path = `apis/${groups.login}/${VERSION}/${Resource.TokenCredentialRequest}`;
  let answer: TokenCredentialRequest;
  const url = new URL(path, endpoint.endsWith('/') ? endpoint : `${endpoint}/`).toString();
  try {
    answer = (
      await (
        await httpsClient()
      ).httpsJSON(url, { method: 'POST', body, ...(caPem ? { caBundlePem: caPem } : {}) })
    ).json as TokenCredentialRequest;
  } catch (err) {
    throw (
      unreachableError(err, url, 'is the concierge running, and is the kubeconfig right?') ??
      new UserError(`cannot exchange the token on ${originOf(url)}: ${await failureOf(err)}`, { cause: err })
    );
  }
  if (answer.status?.credential) return answer.status.credential;
  // The message is the server's text, shown on the terminal of whoever runs kubectl.
  if (answer.status?.message === undefined)
    throw new UserError(`cannot exchange the token on ${originOf(url)}: the answer has no credential`);
  throw new ExchangeRefused(
    `${authenticator.kind} ${authenticator.name}`,
    originOf(url),
    printable(String(answer.status.message)),
  );
}

/**
 * A failed request in words: what the HTTPS client says, and for an error answer the message of the Kubernetes
 * Status it carries (the server's text, so made printable). Exported for whoami.
 */
export async function failureOf(err: unknown): Promise<string> {
  const body = (err as { body?: unknown }).body;
  // Loaded only on failure: the path that answers from the cache never needs it.
  const said =
    typeof body === 'string' ? (await import('../lib/kube/status.ts')).statusMessageOf(body) : undefined;
  const message = printable((err as Error).message);
  return said === undefined ? message : `${message}: ${printable(said)}`;
}

/** Whether something expiring at `expires` (an RFC 3339 time or ms) is still good enough to hand out. */
export function freshUntil(expires: string | number | undefined, now = Date.now()): boolean {
  const at = typeof expires === 'number' ? expires : Date.parse(expires ?? '');
  return at - REFRESH_BEFORE_EXPIRY_MS > now;
}

/** A cache file's JSON, or undefined when it is missing or unreadable (then it is simply rebuilt). */
export function readCache<T>(file: string): T | undefined {
  try {
    return JSON.parse(readFileSync(file, 'utf8')) as T;
  } catch {
    return undefined;
  }
}

/** Writes whole then renames: a reader sees the old entry or the new one, never half of one. */
export function writeCache(file: string, value: unknown): void {
  const partial = `${file}.${process.pid}.tmp`;
  writeFileSync(partial, JSON.stringify(value), { mode: 0o600 });
  renameSync(partial, file);
}

/** The cache file for a key (hashed: the key may hold a token), its folder created 0700. */
export function cacheFile(
  env: NodeJS.ProcessEnv,
  kind: 'credentials' | 'sessions' | 'failures',
  key: unknown[],
): string {
  const dir = join(configDir(env), kind);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  return join(dir, `${createHash('sha256').update(JSON.stringify(key)).digest('hex')}.json`);
}

/**
 * Runs `fn` holding the file's lock, so that concurrent plugin processes do the work once. The lock is refreshed
 * while held (an interactive login may take minutes) and taken over when its holder died.
 */
export async function withFileLock<T>(file: string, fn: () => Promise<T>): Promise<T> {
  // Loaded here, not at start: a cached credential is read without a lock.
  const { default: lockfile } = await import('proper-lockfile');
  const release = await lockfile.lock(file, {
    realpath: false,
    lockfilePath: `${file}.lock`,
    retries: { retries: 600, minTimeout: 50, maxTimeout: 1000 },
    stale: 15_000,
  });
  try {
    return await fn();
  } finally {
    await release();
  }
}

const readCached = (file: string): ExecCredential | undefined => {
  const cached = readCache<ExecCredential>(file);
  return cached && freshUntil(cached.status.expirationTimestamp) ? cached : undefined;
};

/**
 * Where an exchange of `token` goes and where its certificate is cached; undefined when no endpoint is known.
 * Exported for logout, which removes the cache file.
 */
export function exchangeTarget(
  token: string,
  flags: ExchangeFlags,
  env: NodeJS.ProcessEnv,
  reason?: string,
): { file: string; endpoint: string; caPem: string | undefined; kind: Kind } | undefined {
  const info = execInfo(env)?.spec?.cluster;
  const endpoint = flags.conciergeEndpoint || info?.server;
  if (!endpoint) return undefined;
  const caData = flags.conciergeCaBundleData || info?.['certificate-authority-data'];
  const caPem = caData ? Buffer.from(caData, 'base64').toString('utf8') : undefined;
  const kind = flags.authenticatorType === 'jwt' ? Kind.JWTAuthenticator : Kind.WebhookAuthenticator;
  // One cache entry per token, authenticator, cluster and reason: a new token, another cluster or a new reason never
  // reuses one (a certificate carries the reason it was issued with). Without a reason the key is as it always was.
  const file = cacheFile(env, 'credentials', [
    token,
    kind,
    flags.authenticatorName,
    flags.groupSuffix,
    endpoint,
    ...(reason !== undefined ? [{ reason }] : []),
  ]);
  return { file, endpoint, caPem, kind };
}

/**
 * Whether a token is traded for a certificate: when the kubeconfig says --exchange, or while a reason is set (only a
 * certificate can carry it). A reason set for a kubeconfig that cannot exchange (it names no authenticator, or no
 * endpoint is known: written by an older get kubeconfig) leaves the token as it is, and says so once per run.
 */
function exchangeWanted(
  flags: ExchangeFlags,
  env: NodeJS.ProcessEnv,
  reason: StoredReason | undefined,
  say: (line: string) => void,
): boolean {
  if (flags.exchange || !reason) return flags.exchange;
  if (flags.authenticatorName && exchangeTarget('', flags, env)) return true;
  say(
    'warning: a reason is set (sealion login --reason), but this kubeconfig cannot trade its token for a certificate that carries it, so requests carry no reason: write the kubeconfig again with sealion get kubeconfig',
  );
  return false;
}

/**
 * The ExecCredential for a token: the token itself (with its expiry, when known, so kubectl asks again in time),
 * or a client certificate it was exchanged for, carrying the reason set now (sealion login --reason), if any.
 */
export async function credentialFor(
  token: string,
  flags: ExchangeFlags,
  env: NodeJS.ProcessEnv,
  tokenExpiry?: string,
  say: (line: string) => void = (line) => process.stderr.write(`${line}\n`),
): Promise<ExecCredential> {
  const reason = currentReason(env);
  if (!exchangeWanted(flags, env, reason, say))
    return {
      apiVersion: EXEC_API_VERSION,
      kind: 'ExecCredential',
      status: { token, ...(tokenExpiry ? { expirationTimestamp: tokenExpiry } : {}) },
    };

  const target = exchangeTarget(token, flags, env, reason?.reason);
  if (!target)
    throw new UserError(
      'cannot exchange the token: no endpoint; pass --concierge-endpoint, or set provideClusterInfo: true in the kubeconfig',
    );
  const { file, endpoint, caPem, kind } = target;
  const fresh = readCached(file);
  if (fresh) return fresh;
  return withFileLock(file, async () => {
    // Another process may have exchanged while this one waited for the lock.
    const meanwhile = readCached(file);
    if (meanwhile) return meanwhile;
    // The key is made here only when needed: its modules cost startup time that a cached credential never pays.
    const own = flags.proofOfPossession === false ? undefined : await ownKey();
    const credential = await exchange(
      endpoint,
      caPem,
      token,
      { kind, name: flags.authenticatorName },
      flags.groupSuffix,
      own?.csrPem,
      reason?.reason,
    );
    if (reason) await checkCarriesReason(credential, reason.reason, say);
    const result: ExecCredential = {
      apiVersion: EXEC_API_VERSION,
      kind: 'ExecCredential',
      status: {
        clientCertificateData: credential.clientCertificateData,
        clientKeyData: keyFor(credential, own),
        // Not past the reason's end: a client that keeps the credential (client-go does, until it expires) asks
        // again then, and gets one without it.
        expirationTimestamp: reason
          ? earliest(credential.expirationTimestamp, reason.expiresAt)
          : credential.expirationTimestamp,
      },
    };
    writeCache(file, result);
    return result;
  });
}

/** The earlier of two RFC 3339 times (the first when the second cannot be read). */
const earliest = (a: string, b: string): string => (Date.parse(b) < Date.parse(a) ? b : a);

/**
 * Says so when the certificate issued does not carry the reason: the cluster signed it (a kubeconfig for its own API
 * server, the direct path, whose CSR API drops every extension a request asks for), or the concierge is one that
 * does not know reasons. Either way requests made with it carry none, and the way to one is the proxy.
 */
async function checkCarriesReason(
  credential: ClusterCredential,
  reason: string,
  say: (line: string) => void,
): Promise<void> {
  // Loaded only after an exchange with a reason: a cached credential never pays for the X.509 modules.
  const { certificateText } = await import('../lib/pki/pki.ts');
  let carried: string | undefined;
  try {
    carried = certificateText(
      new X509Certificate(credential.clientCertificateData).raw,
      REASON_EXTENSION_OID,
    );
  } catch {
    // Unreadable is not carried.
  }
  if (carried !== reason)
    say(
      "warning: the certificate issued does not carry your reason, so requests made with it carry none: this kubeconfig reaches the cluster's own API server, whose CSR API drops Sealion's extension (or the concierge does not take reasons); for the reason to travel, write a kubeconfig for the proxy with sealion get kubeconfig --mode proxy",
    );
}

/** A fresh key pair and a CSR for it; the private key stays in this process and the 0600 cache. */
async function ownKey(): Promise<{ csrPem: string; keyPem: string }> {
  const { newCSR } = await import('../lib/pki/pki.ts');
  // The subject is the concierge's to decide (it takes only the key), so the CSR names nobody.
  return newCSR('sealion-login');
}

/**
 * The private key that goes with the issued certificate: ours when we sent a CSR, after checking the certificate
 * is for our key; the concierge's when it made one (Pinniped's concierge, or a request without a CSR).
 */
function keyFor(credential: ClusterCredential, own: { keyPem: string } | undefined): string {
  const keyPem = credential.clientKeyData || own?.keyPem;
  if (!keyPem) throw new Error('exchange token: the concierge returned a certificate without its key');
  let matches = false;
  try {
    matches = new X509Certificate(credential.clientCertificateData).checkPrivateKey(createPrivateKey(keyPem));
  } catch {
    // An unreadable certificate or key matches nothing.
  }
  if (!matches)
    throw new Error(
      `exchange token: the concierge returned a certificate for a key other than ${credential.clientKeyData ? 'the one it sent' : 'ours'}`,
    );
  // A concierge that ignores the CSR (Pinniped's) made the key itself and sent it over the wire.
  if (own && credential.clientKeyData)
    process.stderr.write(
      'warning: the concierge ignored the CSR and sent a private key with the certificate\n',
    );
  return keyPem;
}

/** What `sealion login static` prints. Exported for tests; `env` stands for process.env, `say` for stderr. */
export async function staticLogin(
  flags: StaticLoginFlags,
  env: NodeJS.ProcessEnv,
  say: (line: string) => void = () => {},
): Promise<ExecCredential> {
  const token = tokenOf(flags, env, say);
  const source = tokenSource(flags);
  // The server would refuse an expired token with the words it has for every refusal; the CLI can say which.
  const expires = jwtExpiry(token);
  if (expires !== undefined && expires <= Date.now())
    throw new UserError(`${source} expired at ${new Date(expires).toISOString()}; put a current token there`);
  try {
    return await credentialFor(token, flags, env, undefined, say);
  } catch (err) {
    if (err instanceof ExchangeRefused)
      throw err.explained(source, 'check that it is current and meant for this cluster');
    throw err;
  }
}

/** How long a failed plugin run stays said for the kubectl process that ran it: its retries come within a second. */
const FAILURE_SAID_MS = 10_000;

/** The process that runs this plugin, as onceForCaller sees it: its pid and a reader of /proc (tests give theirs). */
export interface Caller {
  pid: number;
  readProc: (path: string) => string;
}

const parentProcess: Caller = { pid: process.ppid, readProc: (path) => readFileSync(path, 'utf8') };

/**
 * Whether the process is kubectl: on Linux its /proc comm is `kubectl`, or its argv0's file name starts with
 * `kubectl` (kubectl1.30, a renamed copy). Elsewhere, or when /proc cannot be read, it is not taken for kubectl.
 */
export function isKubectl(caller: Caller): boolean {
  try {
    if (caller.readProc(`/proc/${caller.pid}/comm`).trim() === 'kubectl') return true;
    const argv0 = caller.readProc(`/proc/${caller.pid}/cmdline`).split('\0')[0] ?? '';
    return basename(argv0).startsWith('kubectl');
  } catch {
    return false;
  }
}

/**
 * The kubectl process that runs this plugin, as a key: its pid and its start time (a pid is reused). Undefined
 * when the caller is not kubectl: a long-lived client-go host (k9s, Lens, a controller run with an exec
 * kubeconfig) runs the plugin for every credential it needs for hours, and one failure remembered would fail all
 * its requests for FAILURE_SAID_MS with nothing printed. The cost: such a host shows each failure as many times as
 * it asks, and a kubectl not recognised (another OS, a wrapper in between) does too.
 */
function callerKey(env: NodeJS.ProcessEnv, caller: Caller): unknown[] | undefined {
  if (env['KUBERNETES_EXEC_INFO'] === undefined || !isKubectl(caller)) return undefined;
  let started = '';
  try {
    // Field 22 of /proc/<pid>/stat, counted after the command's name in parentheses (which may hold spaces).
    const stat = caller.readProc(`/proc/${caller.pid}/stat`);
    started = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19] ?? '';
  } catch {
    // The pid alone, for the few seconds a failure is remembered.
  }
  return [caller.pid, started, process.argv.slice(2), env['KUBERNETES_EXEC_INFO']];
}

/**
 * Runs a plugin's `run`, saying a failure once to the kubectl process that runs it. kubectl runs the plugin again
 * for each request it makes until one gets a credential (discovery retries, then the command's own), and shows
 * each run's standard error: one failure printed six times. A failure is remembered for a few seconds under the
 * caller's key (callerKey), and the same caller's next runs fail at once, silently, without asking any server
 * again. A new kubectl command, or the same one after a while, tries afresh. Only kubectl's runs are remembered
 * (callerKey says why).
 */
export async function onceForCaller<T>(
  env: NodeJS.ProcessEnv,
  run: () => Promise<T>,
  caller: Caller = parentProcess,
): Promise<T> {
  const key = callerKey(env, caller);
  const file = key ? cacheFile(env, 'failures', key) : undefined;
  const said = file ? readCache<{ at: number }>(file) : undefined;
  if (said && Date.now() - said.at < FAILURE_SAID_MS && said.at <= Date.now())
    throw new AlreadySaid('this plugin failed moments ago for the same kubectl process');
  try {
    return await run();
  } catch (err) {
    if (file) {
      forgetOldFailures(file);
      writeCache(file, { at: Date.now() });
    }
    throw err;
  }
}

/** Removes the failure marks older than a minute, so that the folder never grows. */
function forgetOldFailures(file: string): void {
  const dir = join(file, '..');
  try {
    for (const name of readdirSync(dir)) {
      const path = join(dir, name);
      if (Date.now() - statSync(path).mtimeMs > 60_000) rmSync(path, { force: true });
    }
  } catch {
    // Another plugin run removed it first.
  }
}
