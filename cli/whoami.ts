// `sealion whoami`: asks the impersonation proxy who it takes the caller to be (WhoAmIRequest), with whatever
// credentials the kubeconfig gives, exec plugins included.
import { Command, Option } from 'commander';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import type { KubernetesUserInfo, WhoAmIRequest } from '../apis/identity.ts';
import { closeHttpsPools, HttpsError, httpsText } from '../lib/https-client.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { failureOf } from './exec-credential.ts';
import { printable, printableJSON } from './printable.ts';

export interface WhoamiFlags {
  kubeconfig: string;
  groupSuffix: string;
  output: 'text' | 'json';
}

/**
 * Runs the current user's exec plugin once with the terminal's standard error before any request, so that a login
 * it needs can show its prompt (a URL to open, a device code): client-node captures a plugin's standard error and
 * shows it only when the plugin fails. The plugin caches what it gets, so the request's own run answers from the
 * cache. Nothing to do for a user without a plugin.
 */
export async function loginFirst(config: KubeConfig): Promise<void> {
  const exec = config.getCurrentUser()?.exec as
    { command?: string; args?: string[]; env?: { name: string; value: string }[] | null } | undefined;
  if (!exec?.command) return;
  const env = { ...process.env, ...Object.fromEntries((exec.env ?? []).map((e) => [e.name, e.value])) };
  const { spawn } = await import('node:child_process');
  await new Promise<void>((done, fail) => {
    const child = spawn(exec.command!, exec.args ?? [], { env, stdio: ['inherit', 'ignore', 'inherit'] });
    child.once('error', (err) =>
      fail(new Error(`the kubeconfig's login plugin ${exec.command}: ${err.message}`)),
    );
    child.once('exit', (code) =>
      code === 0
        ? done()
        : fail(new Error(`the kubeconfig's login plugin ${exec.command} exited with ${code}`)),
    );
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
 * The current cluster of `config` and the credentials it gives: its CA, and a client certificate or token, running
 * the exec plugin when it names one (client-node keeps the plugin's credential until it expires).
 */
export async function kubeconfigAccess(config: KubeConfig): Promise<KubeconfigAccess> {
  const server = config.getCurrentCluster()?.server;
  if (!server) throw new Error('the kubeconfig has no current cluster');
  const tls: { ca?: unknown; cert?: unknown; key?: unknown; headers?: Record<string, string> } = {};
  await config.applyToHTTPSOptions(tls as never);
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
        ...(access.caPem ? { caBundlePem: access.caPem } : {}),
        ...(access.clientCert ? { clientCert: access.clientCert } : {}),
        headers: access.headers,
      },
      opts.accept ?? 'application/json',
    )
  ).text;
}

/** POSTs `body` to `path` on the current cluster of `config` (see requestAsKubeconfig) and parses the JSON answer. */
export async function postAsKubeconfig(config: KubeConfig, path: string, body: unknown): Promise<unknown> {
  const text = await requestAsKubeconfig(config, path, { method: 'POST', body });
  try {
    return JSON.parse(text) as unknown;
  } catch (err) {
    throw new HttpsError('BadJSON', 'response is not valid JSON', undefined, err);
  }
}

export async function whoami(flags: WhoamiFlags): Promise<KubernetesUserInfo> {
  const { loadKubeConfig } = await import('../lib/kube/kube.ts');
  const config = loadKubeConfig(flags.kubeconfig ? { path: flags.kubeconfig } : { default: true });
  await loginFirst(config);
  const group = apiGroups(flags.groupSuffix).identity;
  const body: WhoAmIRequest = { apiVersion: `${group}/${VERSION}`, kind: 'WhoAmIRequest', spec: {} };
  const answer = (await postAsKubeconfig(
    config,
    `apis/${group}/${VERSION}/${Resource.WhoAmIRequest}`,
    body,
  ).catch(async (err: unknown) => {
    throw new Error(`whoami: ${await failureOf(err)}`, { cause: err });
  })) as WhoAmIRequest;
  if (!answer.status?.kubernetesUserInfo)
    throw new Error('whoami: the answer names no user; is this a Sealion proxy?');
  return answer.status.kubernetesUserInfo;
}

/**
 * What `sealion whoami` prints: every name is the server's text (an authenticator's username, groups or extras can
 * hold anything but C0 controls), so each is made printable; JSON keeps its values, with the same escapes.
 */
export function whoamiOutput(info: KubernetesUserInfo, output: WhoamiFlags['output']): string {
  if (output === 'json') return `${printableJSON(info)}\n`;
  const p = (text: string): string => printable(text, Infinity);
  const lines = [
    `Username: ${p(info.user.username)}`,
    `Groups:   ${(info.user.groups ?? []).map(p).join(', ')}`,
  ];
  for (const [key, values] of Object.entries(info.user.extra ?? {}))
    lines.push(`Extra:    ${p(key)}=${values.map(p).join(',')}`);
  return `${lines.join('\n')}\n`;
}

export function whoamiCommand(): Command {
  return new Command('whoami')
    .description('show the user and groups the impersonation proxy sees for your kubeconfig')
    .option('--kubeconfig <path>', 'kubeconfig (default: $KUBECONFIG or ~/.kube/config)', '')
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .addOption(new Option('-o, --output <format>', 'text or json').choices(['text', 'json']).default('text'))
    .addHelpText(
      'after',
      '\nExamples:\n  sealion whoami --kubeconfig me.kubeconfig\n  sealion whoami -o json\n',
    )
    .action(async (flags: WhoamiFlags) => {
      const info = await whoami(flags);
      await closeHttpsPools();
      process.stdout.write(whoamiOutput(info, flags.output));
    });
}
