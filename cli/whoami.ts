// `sealion whoami`: asks the impersonation proxy who it takes the caller to be (WhoAmIRequest), with whatever
// credentials the kubeconfig gives, exec plugins included. And what every command that calls a cluster shares: the
// kubeconfig read as kubectl finds it (with errors that name the file), the login plugin run with the terminal, the
// credentials, and a failed request in one line.
import { X509Certificate } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import { Command } from 'commander';
import { outputOption, withKubeconfig } from './options.ts';
import { REASON_EXTRA } from '../apis/access.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import type { KubernetesUserInfo, WhoAmIRequest } from '../apis/identity.ts';
import { closeHttpsPools, HttpsError, httpsText } from '../lib/https-client.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import {
  AlreadySaid,
  errorLine,
  fileError,
  oneLine,
  originOf,
  systemReason,
  unreachableError,
  UserError,
} from './errors.ts';
import { failureOf } from './exec-credential.ts';
import { printable, printableJSON } from './printable.ts';

/** The kubeconfig a command uses: --kubeconfig, else $KUBECONFIG's files, else ~/.kube/config; --context switches. */
export interface KubeconfigFlags {
  kubeconfig: string;
  /** A context to use instead of the current one; '' or absent: the current one. */
  context?: string;
}

/** What to do when the default kubeconfig cannot be read. */
const DEFAULT_KUBECONFIG_FIX = 'set KUBECONFIG or pass --kubeconfig';

/**
 * The files a command reads its kubeconfig from, as kubectl finds them: --kubeconfig; else $KUBECONFIG's files
 * (those that exist, as kubectl skips the others); else ~/.kube/config. With none to read, says so and what to run,
 * rather than let client-node fall back to an http://localhost:8080 that no Sealion server is.
 */
export function kubeconfigFiles(flags: KubeconfigFlags, env: NodeJS.ProcessEnv = process.env): string[] {
  if (flags.kubeconfig) return [flags.kubeconfig];
  const listed = (env['KUBECONFIG'] ?? '').split(delimiter).filter(Boolean);
  if (listed.length > 0) {
    const present = listed.filter((file) => existsSync(file));
    if (present.length === 0)
      throw new UserError(
        `no kubeconfig: KUBECONFIG names ${listed.join(delimiter)}, and ${listed.length === 1 ? 'it does' : 'none of them does'} not exist; ${NO_KUBECONFIG_FIX}`,
      );
    return present;
  }
  const home = join(env['HOME'] || homedir(), '.kube', 'config');
  if (!existsSync(home))
    throw new UserError(
      `no kubeconfig: KUBECONFIG is not set and ${home} does not exist; ${NO_KUBECONFIG_FIX}`,
    );
  return [home];
}

/** What to do with no kubeconfig at all: name one, or get one written. */
const NO_KUBECONFIG_FIX =
  'pass --kubeconfig, set KUBECONFIG, or write one with sealion get kubeconfig (it needs an admin kubeconfig)';

/** One kubeconfig file, read and parsed, or a one-line UserError naming the file, the line and what is wrong. */
async function readKubeconfigFile(file: string, fix: string): Promise<KubeConfig> {
  let text: string;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw fileError(err, 'kubeconfig', file, fix);
  }
  const { loadKubeConfig } = await import('../lib/kube/kube.ts');
  const bad = (why: string, err?: unknown): UserError =>
    new UserError(`cannot read kubeconfig ${file}: ${why}; fix the file, or ${fix}`, { cause: err });
  if (text.trim() === '') throw bad('it is empty');
  let config: KubeConfig;
  try {
    config = loadKubeConfig({ yaml: text });
  } catch (err) {
    // js-yaml (client-node's parser) says where: its mark counts lines and columns from 0.
    const { name, reason, mark } = err as {
      name?: string;
      reason?: string;
      mark?: { line: number; column: number };
    };
    if (name === 'YAMLException' && reason)
      throw bad(mark ? `line ${mark.line + 1}, column ${mark.column + 1}: ${reason}` : reason, err);
    // A file that is YAML but no mapping (empty, a list, a word) fails client-node with a TypeError.
    if (err instanceof TypeError) throw bad('it is not a kubeconfig (no clusters, contexts or users)', err);
    throw bad(oneLine(err), err);
  }
  // YAML that is no mapping (a list, a word) or a mapping of something else reads as an empty kubeconfig.
  if (config.getClusters().length + config.getContexts().length + config.getUsers().length === 0)
    throw bad('it is not a kubeconfig (no clusters, contexts or users)');
  // Paths in a kubeconfig (a CA file, a client certificate) are relative to the file, as kubectl reads them.
  config.makePathsAbsolute(dirname(file));
  return config;
}

/**
 * The kubeconfig `flags` name (kubeconfigFiles), merged as kubectl merges several, and switched to --context. Every
 * failure is one line that names the file and what to do.
 */
/**
 * Adds what `other` names and `into` does not: the clusters, users and contexts of the same name in two files are
 * the first file's, as kubectl merges KUBECONFIG's files (the client library's own merge refuses a repeated name).
 */
function mergeFirstWins(into: KubeConfig, other: KubeConfig): void {
  const taken = (names: { name: string }[]) => new Set(names.map((n) => n.name));
  const clusters = taken(into.getClusters());
  const users = taken(into.getUsers());
  const contexts = taken(into.getContexts());
  for (const c of other.getClusters()) if (!clusters.has(c.name)) into.addCluster(c);
  for (const u of other.getUsers()) if (!users.has(u.name)) into.addUser(u);
  for (const c of other.getContexts()) if (!contexts.has(c.name)) into.addContext(c);
}

export async function loadKubeconfig(
  flags: KubeconfigFlags,
  env: NodeJS.ProcessEnv = process.env,
  opts: {
    /** Whether the kubeconfig must have a current context (or --context); false for a command over all of them. */
    current?: boolean;
  } = {},
): Promise<KubeConfig> {
  const files = kubeconfigFiles(flags, env);
  const fix = flags.kubeconfig ? 'check the path given to --kubeconfig' : DEFAULT_KUBECONFIG_FIX;
  const [first, ...rest] = await Promise.all(files.map((file) => readKubeconfigFile(file, fix)));
  // The first file wins for each name and for the current context, as in kubectl.
  for (const other of rest) mergeFirstWins(first!, other);
  const config = first!;
  const where = files.join(delimiter);
  const known = (): string =>
    config
      .getContexts()
      .map((c) => c.name)
      .join(', ') || 'none';
  if (flags.context) {
    if (!config.getContexts().some((c) => c.name === flags.context))
      throw new UserError(`no context ${flags.context} in kubeconfig ${where}; known: ${known()}`);
    config.setCurrentContext(flags.context);
  } else if (opts.current !== false && !config.getCurrentCluster())
    throw new UserError(
      config.getContexts().length === 0
        ? `kubeconfig ${where} has no contexts; write one with sealion get kubeconfig`
        : `kubeconfig ${where} has no current context${config.getCurrentContext() ? ` (${config.getCurrentContext()} is not one of its contexts, or names no cluster)` : ''}; pass --context (known: ${known()}) or run kubectl config use-context`,
    );
  return config;
}

/**
 * The exec plugin of the current user, with the environment kubectl would give it; undefined for a user without one.
 */
function currentExec(
  config: KubeConfig,
): { command: string; args: string[]; env: NodeJS.ProcessEnv; provideClusterInfo: boolean } | undefined {
  const exec = config.getCurrentUser()?.exec as
    | {
        command?: string;
        args?: string[];
        env?: { name: string; value: string }[] | null;
        provideClusterInfo?: boolean;
      }
    | undefined;
  if (!exec?.command) return undefined;
  return {
    command: exec.command,
    args: exec.args ?? [],
    env: { ...process.env, ...Object.fromEntries((exec.env ?? []).map((e) => [e.name, e.value])) },
    provideClusterInfo: exec.provideClusterInfo === true,
  };
}

/**
 * Runs the current user's exec plugin once with the terminal before any request, so that a login it needs can show
 * its prompt (a URL to open, a device code): client-node captures a plugin's standard error and shows it only when
 * the plugin fails. The plugin caches what it gets, so the request's own run answers from the cache. Answers when
 * the credential it gave expires (RFC 3339), when it says; nothing to do for a user without a plugin.
 *
 * The plugin's standard error is passed through as it comes. When it fails having said why there (as sealion's
 * login does, in the one error style), that line is the error: the AlreadySaid thrown prints nothing more.
 */
export async function loginFirst(config: KubeConfig): Promise<string | undefined> {
  const exec = currentExec(config);
  if (!exec) return undefined;
  const { spawn } = await import('node:child_process');
  return new Promise<string | undefined>((done, fail) => {
    const child = spawn(exec.command, exec.args, { env: exec.env, stdio: ['inherit', 'pipe', 'pipe'] });
    let stdout = '';
    let said = false;
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => (stdout += chunk));
    child.stderr.on('data', (chunk: Buffer) => {
      said = true;
      process.stderr.write(chunk);
    });
    child.once('error', (err) =>
      fail(
        new UserError(
          `cannot run the kubeconfig's login plugin ${exec.command}: ${systemReason(err) ?? oneLine(err)}; install it or fix the kubeconfig's exec command`,
          { cause: err },
        ),
      ),
    );
    child.once('close', (code) => {
      if (code !== 0)
        return fail(
          said
            ? new AlreadySaid(`the kubeconfig's login plugin ${exec.command} exited with ${code}`)
            : new UserError(
                `the kubeconfig's login plugin ${exec.command} exited with ${code}, saying nothing`,
              ),
        );
      try {
        const expires = (JSON.parse(stdout) as { status?: { expirationTimestamp?: unknown } }).status
          ?.expirationTimestamp;
        done(typeof expires === 'string' ? expires : undefined);
      } catch {
        // client-node's own run of the plugin reports an answer that is not an ExecCredential.
        done(undefined);
      }
    });
  });
}

/** Where the current cluster of a kubeconfig is, and what a request to it carries. */
export interface KubeconfigAccess {
  /** The cluster's server URL, ending in '/' so that a relative path joins under it (a `/clusters/<name>` too). */
  base: string;
  /** The CA to trust instead of the system roots, when the kubeconfig names one. */
  caPem?: string;
  /** The client certificate, from the kubeconfig or its exec plugin. */
  clientCert?: { certPem: string; keyPem: string };
  /** The credentials' headers: a bearer token, Impersonate-User. */
  headers: Record<string, string>;
}

/**
 * Marks the current user's exec plugin as run without a terminal (KUBERNETES_EXEC_INFO's `interactive: false`, as
 * kubectl says it), with the cluster when the kubeconfig provides it: client-node runs plugins with their output
 * captured, where a login prompt would wait unseen. loginFirst is the run with the terminal.
 */
function withoutTerminal(config: KubeConfig): void {
  const exec = config.getCurrentUser()?.exec as
    { env?: { name: string; value: string }[] | null; provideClusterInfo?: boolean } | undefined;
  if (!exec || exec.env?.some((e) => e.name === 'KUBERNETES_EXEC_INFO')) return;
  const cluster = config.getCurrentCluster();
  const info = {
    apiVersion: 'client.authentication.k8s.io/v1',
    kind: 'ExecCredential',
    spec: {
      interactive: false,
      ...(exec.provideClusterInfo && cluster
        ? { cluster: { server: cluster.server, 'certificate-authority-data': cluster.caData ?? '' } }
        : {}),
    },
  };
  exec.env = [...(exec.env ?? []), { name: 'KUBERNETES_EXEC_INFO', value: JSON.stringify(info) }];
}

/**
 * The current cluster of `config` and the credentials it gives: its CA, and a client certificate or token, running
 * the exec plugin when it names one (client-node keeps the plugin's credential until it expires), without a
 * terminal: a login that needs a person happens in loginFirst.
 */
export async function kubeconfigAccess(config: KubeConfig): Promise<KubeconfigAccess> {
  const server = config.getCurrentCluster()?.server;
  if (!server)
    throw new UserError(
      `the kubeconfig's context ${config.getCurrentContext() || '(none)'} names no cluster; pass --context or fix the kubeconfig`,
    );
  if (!server.startsWith('https://'))
    throw new UserError(
      `the server of context ${config.getCurrentContext()} is ${server}: sealion talks to servers over https only; fix the kubeconfig's server`,
    );
  withoutTerminal(config);
  const tls: { ca?: unknown; cert?: unknown; key?: unknown; headers?: Record<string, string> } = {};
  try {
    await config.applyToHTTPSOptions(tls as never);
  } catch (err) {
    throw credentialsError(err, config);
  }
  // client-node hands PEM over as strings or Buffers.
  const pem = (v: unknown): string | undefined =>
    Buffer.isBuffer(v) ? v.toString('utf8') : typeof v === 'string' ? v : undefined;
  const caPem = pem(tls.ca);
  const certPem = pem(tls.cert);
  const keyPem = pem(tls.key);
  return {
    base: server.endsWith('/') ? server : `${server}/`,
    ...(caPem ? { caPem } : {}),
    ...(certPem && keyPem ? { clientCert: { certPem, keyPem } } : {}),
    headers: tls.headers ?? {},
  };
}

/**
 * Why the kubeconfig's credentials could not be had, as one line. client-node rejects a failed plugin with the
 * plugin's standard error as the message: sealion's own says `sealion: <line>`, which is the line. A file the
 * kubeconfig names (a CA, a certificate) that cannot be read is said with its path.
 */
function credentialsError(err: unknown, config: KubeConfig): UserError {
  const message = err instanceof Error ? err.message : String(err);
  const own = /^sealion: (.+)$/m.exec(message)?.[1];
  if (own) return new UserError(own, { cause: err });
  const path = (err as { path?: unknown }).path;
  if (typeof path === 'string')
    return fileError(err, 'a file the kubeconfig names,', path, 'fix the kubeconfig or the file');
  return new UserError(
    `cannot get the credentials of context ${config.getCurrentContext()}: ${oneLine(err)}; check the kubeconfig's user`,
    { cause: err },
  );
}

/** What the current user presents, in words, for a refusal: which login and which authenticator it names. */
export function credentialSource(config: KubeConfig): string {
  const exec = currentExec(config);
  const user = config.getCurrentUser();
  if (!exec)
    return user?.certData || user?.certFile
      ? 'the client certificate of the kubeconfig'
      : user?.token || user?.authProvider
        ? 'the token of the kubeconfig'
        : 'no credentials (the kubeconfig names none)';
  const flag = (name: string): string | undefined => {
    const at = exec.args.indexOf(name);
    return at >= 0 ? exec.args[at + 1] : undefined;
  };
  const login = exec.args.includes('oidc')
    ? `the ID token from ${flag('--issuer') ?? 'the issuer'}`
    : exec.args.includes('static')
      ? flag('--token-env')
        ? `the token in environment variable ${flag('--token-env')}`
        : flag('--token-file')
          ? `the token in file ${flag('--token-file')}`
          : 'the static token'
      : `the credential of plugin ${exec.command}`;
  const name = flag('--authenticator-name');
  const kind = flag('--authenticator-type') === 'jwt' ? 'JWTAuthenticator' : 'WebhookAuthenticator';
  return exec.args.includes('--exchange') && name
    ? `the certificate ${kind} ${name} issued for ${login}`
    : login;
}

/**
 * A failed request to the current cluster as one line: cannot reach it (and why), no answer in time, or the answer
 * that refused (the Status message, escaped); for a 401, what credential was refused and what to do.
 */
export async function requestError(err: unknown, config: KubeConfig, what: string): Promise<UserError> {
  if (err instanceof UserError) return err;
  const server = config.getCurrentCluster()?.server ?? '';
  const sealionLogin = currentExec(config)?.args.includes('login') ?? false;
  const reach = unreachableError(
    err,
    server,
    sealionLogin
      ? "is the concierge running, and is the kubeconfig's server right?"
      : "is the server running, and is the kubeconfig's server right?",
  );
  if (reach) return reach;
  const status = (err as { status?: unknown }).status;
  const origin = originOf(server);
  if (status === 401)
    return new UserError(
      `${what} on ${origin}: the server refused ${credentialSource(config)} (401 Unauthorized); ${
        currentExec(config)?.args.includes('oidc')
          ? 'log in again (sealion logout, then run this again), or ask your admin whether the authenticator takes it'
          : `check the credentials of context ${config.getCurrentContext()}`
      }`,
      { cause: err },
    );
  if (status === 403)
    return new UserError(`${what} on ${origin}: ${await failureOf(err)}; ask your admin for access`, {
      cause: err,
    });
  return new UserError(`${what} on ${origin}: ${await failureOf(err)}`, { cause: err });
}

/**
 * Sends a request to `path` on the current cluster of `config` with the credentials it gives (kubeconfigAccess).
 * Returns the answer's body as text.
 */
export async function requestAsKubeconfig(
  config: KubeConfig,
  path: string,
  opts: {
    method?: 'GET' | 'POST';
    body?: unknown;
    maxBytes?: number;
    timeoutMs?: number;
    accept?: string;
    /** Ends the request early (a deadline over several requests). */
    signal?: AbortSignal;
  } = {},
): Promise<string> {
  const access = await kubeconfigAccess(config);
  return (
    await httpsText(
      new URL(path, access.base).toString(),
      {
        method: opts.method ?? 'GET',
        ...(opts.body === undefined ? {} : { body: opts.body }),
        ...(opts.maxBytes === undefined ? {} : { maxBytes: opts.maxBytes }),
        ...(opts.timeoutMs === undefined ? {} : { timeoutMs: opts.timeoutMs }),
        ...(opts.signal ? { signal: opts.signal } : {}),
        ...(access.caPem ? { caBundlePem: access.caPem } : {}),
        ...(access.clientCert ? { clientCert: access.clientCert } : {}),
        headers: access.headers,
      },
      opts.accept ?? 'application/json',
    )
  ).text;
}

/** POSTs `body` to `path` on the current cluster of `config` (see requestAsKubeconfig) and parses the JSON answer. */
export async function postAsKubeconfig(
  config: KubeConfig,
  path: string,
  body: unknown,
  signal?: AbortSignal,
): Promise<unknown> {
  const text = await requestAsKubeconfig(config, path, {
    method: 'POST',
    body,
    ...(signal ? { signal } : {}),
  });
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new HttpsError('BadJSON', 'response is not valid JSON', undefined, err);
  }
}

export interface WhoamiFlags extends KubeconfigFlags {
  context: string;
  groupSuffix: string;
  output: 'table' | 'json' | 'yaml';
}

/** An approved access request in force: the groups it adds on its clusters, until when. */
export interface ActiveGrant {
  name: string;
  groups: string[];
  clusters: string[];
  /** When it ends (RFC 3339). */
  expiresAt: string;
}

/**
 * What `sealion whoami` found: where the kubeconfig points, whom the proxy takes the caller for, until when, why
 * (the reason every request carries), and the access requests in force.
 */
export interface Whoami {
  context: string;
  /** The kubeconfig's name for the context's cluster (Sealion's kubeconfigs name it as the context). */
  cluster: string;
  server: string;
  user: KubernetesUserInfo['user'];
  /** When the credential presented expires (RFC 3339), when known. */
  expirationTimestamp?: string;
  /** The reason the hub sees on the caller's requests (`sealion login --reason`, or a grant's), when there is one. */
  reason?: string;
  /** The caller's access requests in force now; absent when the hub serves none (a concierge without them). */
  grants?: ActiveGrant[];
}

/** The expiry of a client certificate the kubeconfig holds itself (no plugin), when it holds one. */
function certificateExpiry(config: KubeConfig): string | undefined {
  const user = config.getCurrentUser();
  try {
    const pem = user?.certData
      ? Buffer.from(user.certData, 'base64').toString('utf8')
      : user?.certFile
        ? readFileSync(user.certFile, 'utf8')
        : undefined;
    return pem ? new Date(new X509Certificate(pem).validTo).toISOString() : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The caller's access requests in force, from the hub's selfaccessrequests (which needs no RBAC); undefined when the
 * hub serves none (404: a concierge without access requests). Any other failure is said through `warn`, and whoami
 * goes on without them.
 */
async function activeGrants(
  config: KubeConfig,
  groupSuffix: string,
  warn: (line: string) => void,
): Promise<ActiveGrant[] | undefined> {
  const { hubOf, ownRequests, isActive, hubFailure } = await import('./request.ts');
  const hub = await hubOf(config, groupSuffix);
  try {
    const now = Date.now();
    return (await ownRequests(hub))
      .filter((r) => isActive(r, now))
      .map((r) => ({
        name: r.metadata.name ?? '',
        groups: r.spec.groups,
        clusters: r.spec.clusters,
        expiresAt: r.status!.expiresAt!,
      }));
  } catch (err) {
    if ((err as { status?: unknown }).status !== 404)
      warn(errorLine(await hubFailure(err, hub, 'cannot list your access requests', {})));
    return undefined;
  }
}

/**
 * Who the hub's proxy takes the caller for (its WhoAmIRequest, at the hub's URL even when the context names a
 * cluster behind it: the reason and grants are the hub's to say), and the caller's access requests in force.
 */
export async function whoami(
  flags: WhoamiFlags,
  warn: (line: string) => void = (line) => void process.stderr.write(`sealion: ${line}\n`),
): Promise<Whoami> {
  const config = await loadKubeconfig(flags);
  const expires = (await loginFirst(config)) ?? certificateExpiry(config);
  const group = apiGroups(flags.groupSuffix).identity;
  const body: WhoAmIRequest = { apiVersion: `${group}/${VERSION}`, kind: 'WhoAmIRequest', spec: {} };
  const { hubBase } = await import('./version.ts');
  const url = new URL(
    `apis/${group}/${VERSION}/${Resource.WhoAmIRequest}`,
    hubBase((await kubeconfigAccess(config)).base),
  ).toString();
  const asked = postAsKubeconfig(config, url, body).catch(async (err: unknown) => {
    throw await requestError(err, config, 'cannot ask who you are');
  });
  const [answer, grants] = await Promise.all([
    asked as Promise<WhoAmIRequest>,
    // Asked only of a server that answered who you are: a refusal or no answer is said once, by the question above.
    asked.then(
      () => activeGrants(config, flags.groupSuffix, warn),
      () => undefined,
    ),
  ]);
  const server = config.getCurrentCluster()!.server;
  if (!answer.status?.kubernetesUserInfo)
    throw new UserError(
      `cannot ask who you are on ${originOf(server)}: the answer names no user; is the kubeconfig's server a Sealion proxy?`,
    );
  const contextName = config.getCurrentContext();
  const user = answer.status.kubernetesUserInfo.user;
  const reason = user.extra?.[REASON_EXTRA]?.[0];
  return {
    context: contextName,
    cluster: config.getContextObject(contextName)?.cluster ?? '',
    server,
    user,
    ...(expires ? { expirationTimestamp: expires } : {}),
    ...(reason ? { reason } : {}),
    ...(grants ? { grants } : {}),
  };
}

/** "in 4m", "5m ago": how far `at` is from `now`, in the largest whole unit. */
export function relativeTime(at: number, now = Date.now()): string {
  const s = Math.round(Math.abs(at - now) / 1000);
  const span =
    s < 120
      ? `${s}s`
      : s < 2 * 3600
        ? `${Math.floor(s / 60)}m`
        : s < 2 * 86400
          ? `${Math.floor(s / 3600)}h`
          : `${Math.floor(s / 86400)}d`;
  return at >= now ? `in ${span}` : `${span} ago`;
}

/**
 * What `sealion whoami` prints: as `kubectl auth whoami`, an ATTRIBUTE/VALUE table, or JSON or YAML. Every name is
 * the server's or the kubeconfig's text (an authenticator's username, groups or extras can hold anything but C0
 * controls), so each is made printable; JSON and YAML keep their values, with the same escapes.
 */
export async function whoamiOutput(
  info: Whoami,
  output: WhoamiFlags['output'],
  now = Date.now(),
): Promise<string> {
  if (output === 'json')
    return `${printableJSON(info)}
`;
  if (output === 'yaml') return (await import('yaml')).stringify(printableDeep(info));
  const p = (text: string): string => printable(text, Infinity);
  const expires = info.expirationTimestamp ? Date.parse(info.expirationTimestamp) : NaN;
  const rows = [
    ['ATTRIBUTE', 'VALUE'],
    ['Context', p(info.context)],
    ['Cluster', p(info.cluster)],
    ['Server', p(info.server)],
    ['Username', p(info.user.username)],
    ['Groups', (info.user.groups ?? []).map(p).join(', ')],
    // The reason has a row of its own (below).
    ...Object.entries(info.user.extra ?? {})
      .filter(([key]) => !(key === REASON_EXTRA && info.reason !== undefined))
      .map(([key, values]) => [`Extra: ${p(key)}`, values.map(p).join(', ')]),
    [
      'Expires',
      Number.isNaN(expires)
        ? 'unknown'
        : `${new Date(expires).toISOString()} (${relativeTime(expires, now)})`,
    ],
    ...(info.reason !== undefined ? [['Reason', p(info.reason)]] : []),
    ...(info.grants ?? []).map((g) => {
      const ends = Date.parse(g.expiresAt);
      return [
        `Grant: ${p(g.name)}`,
        `groups ${g.groups.map(p).join(', ')} on ${g.clusters.map(p).join(', ')}, ends ${
          Number.isNaN(ends) ? 'unknown' : `${new Date(ends).toISOString()} (${relativeTime(ends, now)})`
        }`,
      ];
    }),
  ];
  return table(rows);
}

/** Every string in `value` made printable, for YAML, whose plain scalars would print control characters raw. */
export function printableDeep(value: unknown): unknown {
  if (typeof value === 'string') return printable(value, Infinity);
  if (Array.isArray(value)) return value.map(printableDeep);
  if (typeof value === 'object' && value !== null)
    return Object.fromEntries(
      Object.entries(value).map(([k, v]) => [printable(k, Infinity), printableDeep(v)]),
    );
  return value;
}

/** Columns padded to their widest cell, as kubectl prints tables. */
export function table(rows: string[][]): string {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? '').length)));
  return (
    rows
      .map((r) =>
        r
          .map((cell, i) => cell.padEnd(widths[i]!))
          .join('   ')
          .trimEnd(),
      )
      .join('\n') + '\n'
  );
}

export function whoamiCommand(): Command {
  return withKubeconfig(
    new Command('whoami').description(
      'show the user and groups the impersonation proxy sees for your kubeconfig, until when, why, and your grants',
    ),
  )
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .addOption(outputOption())
    .addHelpText(
      'after',
      `
Expires is when the credential presented now expires: a login plugin renews it (with the session's refresh token)
without asking, until the session itself ends. Reason is what the hub sees on your requests (sealion login --reason,
or that of an access request in force); each Grant is an approved access request in force: the groups it adds on its
clusters, and when it ends (sealion request list shows them all).

Examples:
  sealion whoami --kubeconfig me.kubeconfig
  sealion whoami --context edge -o yaml`,
    )
    .action(async (flags: WhoamiFlags) => {
      const info = await whoami(flags);
      await closeHttpsPools();
      process.stdout.write(await whoamiOutput(info, flags.output));
    });
}
