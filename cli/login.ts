// `sealion login static`: the kubectl exec credential plugin for static tokens. It prints an ExecCredential with
// the token, or, with --exchange, trades the token through TokenCredentialRequest for a short-lived client
// certificate. Certificates are cached under the user's config folder (0600, written whole and renamed into
// place, under a file lock so that concurrent kubectl processes exchange once) and reused until shortly before
// they expire.
import { createHash } from 'node:crypto';
import { mkdirSync, readFileSync, renameSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { Command } from 'commander';
import lockfile from 'proper-lockfile';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Kind, Resource, VERSION } from '../apis/groups.ts';
import type { ClusterCredential, TokenCredentialRequest } from '../apis/login.ts';

export const EXEC_API_VERSION = 'client.authentication.k8s.io/v1';
/** A cached certificate is replaced this long before it expires, so kubectl never presents an expired one. */
const REFRESH_BEFORE_EXPIRY_MS = 60_000;

interface ExecCredential {
  apiVersion: string;
  kind: 'ExecCredential';
  status: {
    token?: string;
    clientCertificateData?: string;
    clientKeyData?: string;
    expirationTimestamp?: string;
  };
}

/** The cluster kubectl passes in KUBERNETES_EXEC_INFO when the kubeconfig sets provideClusterInfo. */
interface ExecInfo {
  spec?: { cluster?: { server?: string; 'certificate-authority-data'?: string } };
}

export interface StaticLoginFlags {
  token: string;
  tokenEnv: string;
  exchange: boolean;
  authenticatorType: 'jwt' | 'webhook';
  authenticatorName: string;
  groupSuffix: string;
  /** Where TokenCredentialRequest goes; default: the cluster kubectl names. */
  conciergeEndpoint: string;
  conciergeCaBundleData: string;
}

/** The folder for cached credentials: $XDG_CONFIG_HOME/sealion or ~/.config/sealion. */
export function configDir(env: NodeJS.ProcessEnv): string {
  return join(env['XDG_CONFIG_HOME'] || join(homedir(), '.config'), 'sealion');
}

function tokenOf(flags: StaticLoginFlags, env: NodeJS.ProcessEnv): string {
  if (flags.token && flags.tokenEnv) throw new Error('give --token or --token-env, not both');
  if (flags.token) return flags.token;
  if (!flags.tokenEnv) throw new Error('give --token or --token-env');
  const token = env[flags.tokenEnv];
  if (!token) throw new Error(`environment variable ${flags.tokenEnv} is empty or not set`);
  return token;
}

/** POSTs a TokenCredentialRequest to the proxy; the answer carries a certificate or "authentication failed". */
function exchange(
  endpoint: string,
  caPem: string | undefined,
  body: TokenCredentialRequest,
  path: string,
): Promise<ClusterCredential> {
  return new Promise((done, fail) => {
    const url = new URL(path, endpoint.endsWith('/') ? endpoint : `${endpoint}/`);
    const req = request(
      url,
      { method: 'POST', headers: { 'content-type': 'application/json' }, ...(caPem ? { ca: caPem } : {}) },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (text += chunk));
        res.on('end', () => {
          let answer: TokenCredentialRequest | undefined;
          try {
            answer = JSON.parse(text) as TokenCredentialRequest;
          } catch {
            return fail(new Error(`exchange token: HTTP ${res.statusCode} with a body that is not JSON`));
          }
          const credential = answer.status?.credential;
          if (credential) return done(credential);
          fail(new Error(`exchange token: ${answer.status?.message ?? `HTTP ${res.statusCode}`}`));
        });
      },
    );
    req.on('error', (err) => fail(new Error(`exchange token: ${err.message}`, { cause: err })));
    req.end(JSON.stringify(body));
  });
}

function readCached(file: string, now: number): ExecCredential | undefined {
  try {
    const cached = JSON.parse(readFileSync(file, 'utf8')) as ExecCredential;
    const expires = Date.parse(cached.status.expirationTimestamp ?? '');
    return expires - REFRESH_BEFORE_EXPIRY_MS > now ? cached : undefined;
  } catch {
    return undefined;
  }
}

/** What `sealion login static` prints. Exported for tests; `env` stands for process.env. */
export async function staticLogin(flags: StaticLoginFlags, env: NodeJS.ProcessEnv): Promise<ExecCredential> {
  const token = tokenOf(flags, env);
  if (!flags.exchange) return { apiVersion: EXEC_API_VERSION, kind: 'ExecCredential', status: { token } };

  const info = env['KUBERNETES_EXEC_INFO']
    ? (JSON.parse(env['KUBERNETES_EXEC_INFO']) as ExecInfo).spec?.cluster
    : undefined;
  const endpoint = flags.conciergeEndpoint || info?.server;
  if (!endpoint)
    throw new Error('--exchange needs --concierge-endpoint, or provideClusterInfo: true in the kubeconfig');
  const caData = flags.conciergeCaBundleData || info?.['certificate-authority-data'];
  const caPem = caData ? Buffer.from(caData, 'base64').toString('utf8') : undefined;
  const groups = apiGroups(flags.groupSuffix);
  const kind = flags.authenticatorType === 'jwt' ? Kind.JWTAuthenticator : Kind.WebhookAuthenticator;

  // One cache entry per token, authenticator and cluster: a new token or another cluster never reuses one.
  const key = createHash('sha256')
    .update(JSON.stringify([token, kind, flags.authenticatorName, flags.groupSuffix, endpoint]))
    .digest('hex');
  const dir = join(configDir(env), 'credentials');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const file = join(dir, `${key}.json`);
  const fresh = readCached(file, Date.now());
  if (fresh) return fresh;

  const release = await lockfile.lock(dir, {
    lockfilePath: `${file}.lock`,
    retries: { retries: 50, minTimeout: 50, maxTimeout: 500 },
    stale: 15_000,
  });
  try {
    // Another process may have exchanged while this one waited for the lock.
    const meanwhile = readCached(file, Date.now());
    if (meanwhile) return meanwhile;
    const credential = await exchange(
      endpoint,
      caPem,
      {
        apiVersion: `${groups.login}/${VERSION}`,
        kind: 'TokenCredentialRequest',
        spec: {
          token,
          authenticator: { apiGroup: groups.authentication, kind, name: flags.authenticatorName },
        },
      },
      `apis/${groups.login}/${VERSION}/${Resource.TokenCredentialRequest}`,
    );
    const result: ExecCredential = {
      apiVersion: EXEC_API_VERSION,
      kind: 'ExecCredential',
      status: {
        clientCertificateData: credential.clientCertificateData,
        clientKeyData: credential.clientKeyData,
        expirationTimestamp: credential.expirationTimestamp,
      },
    };
    // Whole file then rename: a reader sees the old entry or the new one, never half of one.
    const partial = `${file}.${process.pid}.tmp`;
    writeFileSync(partial, JSON.stringify(result), { mode: 0o600 });
    renameSync(partial, file);
    return result;
  } finally {
    await release();
  }
}

export function loginCommand(): Command {
  const login = new Command('login').description('kubectl exec credential plugins (used from kubeconfigs)');
  login
    .command('static')
    .description('print an ExecCredential for a static token, optionally exchanged for a client certificate')
    .option('--token <token>', 'the token', '')
    .option('--token-env <name>', 'read the token from this environment variable', '')
    .option('--exchange', 'trade the token for a 5-minute client certificate (TokenCredentialRequest)', false)
    .option('--authenticator-type <type>', 'jwt or webhook: which kind checks the token', 'webhook')
    .option('--authenticator-name <name>', 'the authenticator that checks the token (with --exchange)', '')
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .option('--concierge-endpoint <url>', "the proxy's URL (default: the cluster kubectl names)", '')
    .option('--concierge-ca-bundle-data <base64>', "the proxy's CA (default: the cluster's)", '')
    .addHelpText(
      'after',
      `
Examples (kubectl runs these from a kubeconfig; see sealion get kubeconfig):
  sealion login static --token-env MY_TOKEN
  sealion login static --token-env MY_TOKEN --exchange --authenticator-type jwt --authenticator-name corp`,
    )
    .action(async (flags: StaticLoginFlags) => {
      if (flags.authenticatorType !== 'jwt' && flags.authenticatorType !== 'webhook')
        throw new Error(
          `--authenticator-type must be jwt or webhook, not ${JSON.stringify(flags.authenticatorType)}`,
        );
      if (flags.exchange && !flags.authenticatorName)
        throw new Error('--exchange needs --authenticator-name');
      process.stdout.write(`${JSON.stringify(await staticLogin(flags, process.env))}\n`);
    });
  return login;
}
