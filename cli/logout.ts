// `sealion logout [--all]`: forgets what the login plugins cached and revokes the OIDC refresh token at its issuer,
// so that the next kubectl run asks for a login. By default it is the login of the kubeconfig's current context (its
// user's `sealion login` arguments say which session and certificates are its); with --all, every cached one.
import { readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { Command } from 'commander';
import { withKubeconfig } from './options.ts';
import {
  configDir,
  exchangeTarget,
  readCache,
  tokenOf,
  withFileLock,
  type OIDCLoginFlags,
  type StaticLoginFlags,
} from './exec-credential.ts';
import { loginCommand } from './login.ts';
import type { Session } from './login-oidc.ts';
import { UserError } from './errors.ts';
import { printable } from './printable.ts';
import { clearReason, currentReason } from './reason.ts';

export interface LogoutFlags {
  kubeconfig: string;
  /** The context whose login to forget; '' or absent: the current one. */
  context?: string;
  all: boolean;
}

/** What a logout did, line by line; `failed` when a refresh token could not be revoked. */
export interface LogoutResult {
  lines: string[];
  failed: boolean;
}

/** The `sealion login` a kubeconfig user runs: which plugin, with the flags it parses to, and its environment. */
interface PluginRun {
  plugin: 'oidc' | 'static';
  flags: OIDCLoginFlags | StaticLoginFlags;
  env: NodeJS.ProcessEnv;
}

/**
 * The flags of a `sealion login oidc|static` command line, parsed by the very commands the plugin runs, so that
 * logout reads the same session and cache keys; undefined for a command line that is no such plugin.
 */
async function pluginRunOf(args: string[]): Promise<Omit<PluginRun, 'env'> | undefined> {
  const at = args.findIndex((a, i) => a === 'login' && (args[i + 1] === 'oidc' || args[i + 1] === 'static'));
  if (at < 0) return undefined;
  const login = loginCommand();
  let parsed: Omit<PluginRun, 'env'> | undefined;
  for (const command of [login, ...login.commands]) {
    command.exitOverride().configureOutput({ writeErr: () => {}, writeOut: () => {} });
    if (command !== login)
      command.action((flags: OIDCLoginFlags | StaticLoginFlags) => {
        parsed = { plugin: command.name() as PluginRun['plugin'], flags };
      });
  }
  try {
    await login.parseAsync(args.slice(at + 1), { from: 'user' });
  } catch (err) {
    throw new Error(
      `the kubeconfig's login plugin has arguments sealion does not take: ${(err as Error).message}`,
      {
        cause: err,
      },
    );
  }
  return parsed;
}

/**
 * The current context's plugin run, from its kubeconfig, with the environment kubectl gives it: `env` and the exec
 * entry's env, and the cluster (provideClusterInfo), where the exchange goes unless the flags name it.
 */
async function currentPlugin(flags: LogoutFlags, env: NodeJS.ProcessEnv): Promise<PluginRun> {
  const { loadKubeconfig } = await import('./whoami.ts');
  const config = await loadKubeconfig(flags, env);
  const user = config.getCurrentUser();
  const exec = user?.exec as { args?: string[]; env?: { name: string; value: string }[] | null } | undefined;
  const run = exec?.args ? await pluginRunOf(exec.args) : undefined;
  if (!run)
    throw new UserError(
      `nothing to log out of for context ${config.getCurrentContext()}: its user ${user?.name ?? '(none)'} does not log in with sealion login; pass --context, or --all to forget every cached login`,
    );
  const cluster = config.getCurrentCluster()?.server;
  return {
    ...run,
    env: {
      ...env,
      ...Object.fromEntries((exec?.env ?? []).map((e) => [e.name, e.value])),
      ...(cluster
        ? { KUBERNETES_EXEC_INFO: JSON.stringify({ spec: { cluster: { server: cluster } } }) }
        : {}),
    },
  };
}

/** Removes a cache file, answering whether there was one. */
const remove = (file: string): boolean => {
  try {
    rmSync(file);
    return true;
  } catch {
    return false;
  }
};

/**
 * Revokes a session's refresh token (when it has one) and deletes the session, under the session's lock: a plugin
 * refreshing it at this moment would otherwise write a new session after the delete, with a refresh token nobody
 * revoked. The local copy goes whatever the issuer answers: logging out must work offline too, and the user is told
 * when the token stays valid at the issuer.
 */
async function forgetSession(
  file: string,
  issuer: Pick<OIDCLoginFlags, 'issuer' | 'clientId' | 'caBundleData'> | undefined,
  result: LogoutResult,
): Promise<Session | undefined> {
  return withFileLock(file, async () => {
    const session = readCache<Session>(file);
    if (!session) return undefined;
    const whom =
      issuer ??
      (session.issuer && session.clientId
        ? {
            issuer: session.issuer,
            clientId: session.clientId,
            caBundleData: session.caBundleData ?? '',
          }
        : undefined);
    const at = whom ? `${printable(whom.issuer)} (client ${printable(whom.clientId)})` : 'an unknown issuer';
    try {
      if (!session.refreshToken) result.lines.push(`Logged out of ${at}: the session had no refresh token.`);
      else if (!whom) {
        result.failed = true;
        result.lines.push(
          `Logged out of ${at}: the session was cached by an older sealion, which did not keep its issuer, so its refresh token could not be revoked.`,
        );
      } else {
        const { revokeRefreshToken } = await import('./login-oidc.ts');
        result.lines.push(
          (await revokeRefreshToken(whom, session.refreshToken))
            ? `Logged out of ${at}: its refresh token is revoked.`
            : `Logged out of ${at}: the issuer offers no revocation endpoint, so its refresh token stays valid there until it expires (only the copy here is deleted).`,
        );
      }
    } catch (err) {
      result.failed = true;
      result.lines.push(
        `Logged out of ${at} here, but its refresh token could not be revoked: ${(err as Error).message.replace(/^login: /, '')}`,
      );
    } finally {
      remove(file);
    }
    return session;
  });
}

/**
 * Logs out of the current context's login, or with `all` of every cached one, and clears the reason set (sealion
 * login --reason): whoever logs in next states their own. `env` stands for process.env.
 */
export async function logout(flags: LogoutFlags, env: NodeJS.ProcessEnv): Promise<LogoutResult> {
  const result = await forgetLogins(flags, env);
  if (clearReason(env)) result.lines.push('Cleared the reason.');
  return result;
}

async function forgetLogins(flags: LogoutFlags, env: NodeJS.ProcessEnv): Promise<LogoutResult> {
  const result: LogoutResult = { lines: [], failed: false };
  if (flags.all) {
    const dir = configDir(env);
    const files = (kind: string): string[] => {
      try {
        return readdirSync(join(dir, kind))
          .filter((f) => f.endsWith('.json'))
          .map((f) => join(dir, kind, f));
      } catch {
        return [];
      }
    };
    for (const file of files('sessions')) await forgetSession(file, undefined, result);
    const certificates = files('credentials').filter(remove).length;
    if (certificates > 0) result.lines.push(`Deleted ${certificates} cached client certificate(s).`);
    if (result.lines.length === 0) result.lines.push('No cached logins.');
    return result;
  }

  const run = await currentPlugin(flags, env);
  const pluginEnv = run.env;
  const reason = currentReason(env)?.reason;
  /** Removes the certificates cached for `token` under the plugin's exchange flags: without a reason, and with it. */
  const forgetCertificate = (token: string): void => {
    const files = [
      ...(run.flags.exchange ? [exchangeTarget(token, run.flags, pluginEnv)?.file] : []),
      ...(reason !== undefined && run.flags.authenticatorName
        ? [exchangeTarget(token, run.flags, pluginEnv, reason)?.file]
        : []),
    ];
    const removed = files.filter((file) => file !== undefined && remove(file)).length;
    if (removed > 0)
      result.lines.push(
        `Deleted ${removed === 1 ? 'the' : removed} cached client certificate${removed === 1 ? '' : 's'}.`,
      );
  };
  if (run.plugin === 'oidc') {
    const oidc = run.flags as OIDCLoginFlags;
    const { sessionFile } = await import('./login-oidc.ts');
    const session = await forgetSession(sessionFile(oidc, pluginEnv), oidc, result);
    if (!session) result.lines.push(`No cached session for ${printable(oidc.issuer)}.`);
    else forgetCertificate(session.idToken);
  } else {
    let token: string | undefined;
    try {
      token = tokenOf(run.flags as StaticLoginFlags, pluginEnv, () => {});
    } catch {
      // The token is not at hand (its variable unset here): its certificate cannot be named, --all removes it.
    }
    if (token) forgetCertificate(token);
    result.lines.push(
      token
        ? 'A static token has nothing to revoke; its cached certificate, if any, is deleted.'
        : 'A static token has nothing to revoke, and it is not at hand to find its cached certificate: use --all to delete every cached certificate.',
    );
  }
  return result;
}

export function logoutCommand(): Command {
  return withKubeconfig(
    new Command('logout').description(
      "forget the current context's cached login and revoke its refresh token at the issuer; the next kubectl run logs in again",
    ),
    "the context whose login to forget (default: the kubeconfig's current one)",
  )
    .option('--all', 'forget every cached login and certificate, revoking every refresh token', false)
    .addHelpText(
      'after',
      `
The refresh token is revoked where the issuer's discovery document names a revocation endpoint (RFC 7009); where it
names none, logout says so, and the token stays valid at the issuer until it expires. The local copy is deleted in
every case, and the command fails when a token could not be revoked.

Examples:
  sealion logout --kubeconfig me.kubeconfig
  sealion logout --all`,
    )
    .action(async (flags: LogoutFlags) => {
      const result = await logout(flags, process.env);
      process.stdout.write(`${result.lines.join('\n')}\n`);
      const { closeHttpsPools } = await import('../lib/https-client.ts');
      await closeHttpsPools();
      if (result.failed) process.exitCode = 1;
    });
}
