// `sealion login static` and `sealion login oidc`: the kubectl exec credential plugins' commands. They print an
// ExecCredential with the token, or, with --exchange, trade the token through TokenCredentialRequest for a
// short-lived client certificate (exec-credential.ts, which also caches both; OIDC sessions in login-oidc.ts).
import { Command } from 'commander';
import { DEFAULT_GROUP_SUFFIX } from '../apis/groups.ts';
import {
  closeHttpsPools,
  DEFAULT_OIDC_CLIENT_ID,
  DEFAULT_OIDC_SCOPES,
  onceForCaller,
  staticLogin,
  type ExecCredential,
  type ExchangeFlags,
  type OIDCLoginFlags,
  type StaticLoginFlags,
} from './exec-credential.ts';
import { printable } from './printable.ts';
import type { LoginReasonFlags } from './reason.ts';

/** The --exchange options both plugins share. */
function exchangeOptions(command: Command): Command {
  return command
    .option(
      '--exchange',
      'trade the token for a short-lived client certificate (TokenCredentialRequest)',
      false,
    )
    .option(
      '--no-proof-of-possession',
      "with --exchange, let the concierge make the certificate's key (as Pinniped does) instead of sending a CSR",
    )
    .option('--authenticator-type <type>', 'jwt or webhook: which kind checks the token', 'webhook')
    .option('--authenticator-name <name>', 'the authenticator that checks the token (with --exchange)', '')
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .option('--concierge-endpoint <url>', "the proxy's URL (default: the cluster kubectl names)", '')
    .option('--concierge-ca-bundle-data <base64>', "the proxy's CA (default: the cluster's)", '');
}

/**
 * What a plugin run prints: the ExecCredential kubectl reads; or, run by a person in a terminal (no
 * KUBERNETES_EXEC_INFO, standard output a terminal), a line saying the login worked, which keeps the credential
 * off the screen.
 */
function printCredential(credential: ExecCredential, what: string): void {
  if (process.stdout.isTTY && process.env['KUBERNETES_EXEC_INFO'] === undefined) {
    const expires = credential.status.expirationTimestamp;
    process.stdout.write(`${what}${expires ? `; the credential expires at ${expires}` : ''}\n`);
  } else process.stdout.write(`${JSON.stringify(credential)}\n`);
}

function checkExchangeFlags(flags: ExchangeFlags): void {
  if (flags.authenticatorType !== 'jwt' && flags.authenticatorType !== 'webhook')
    throw new Error(
      `--authenticator-type must be jwt or webhook, not ${JSON.stringify(flags.authenticatorType)}`,
    );
  if (flags.exchange && !flags.authenticatorName) throw new Error('--exchange needs --authenticator-name');
}

export function loginCommand(): Command {
  const login = new Command('login')
    .description(
      'set the reason you work under (--reason), carried with every request; and the kubectl exec credential plugins (used from kubeconfigs)',
    )
    .option(
      '--reason <why>',
      'why you work now (an incident, a ticket): every request through a kubeconfig from sealion get kubeconfig carries it',
    )
    .option('--reason-for <duration>', 'how long the reason lasts, as 4h or 90m (default: 12h)')
    .option('--clear-reason', 'forget the reason set (sealion logout does too)', false)
    .addHelpText(
      'after',
      `
A reason is kept under the CLI's config folder (reason.json) until it expires. While one is set, the login plugins
trade the token for a certificate that carries it, and Sealion passes it on as the impersonated extra
sealion.dev/reason, so each cluster's own audit log shows it. A cluster whose policy requires a reason refuses
requests without one.

Examples:
  sealion login --reason "INC-123: orders database full"
  sealion login --reason "CHG-42" --reason-for 4h
  sealion login                     # the reason set now
  sealion login --clear-reason`,
    )
    .action(async (flags: LoginReasonFlags) => {
      const { loginReason } = await import('./reason.ts');
      process.stdout.write(
        `${loginReason(flags, process.env)
          .map((l) => printable(l, Infinity))
          .join('\n')}\n`,
      );
    });
  exchangeOptions(
    login
      .command('static')
      .description(
        'print an ExecCredential for a static token, optionally exchanged for a client certificate',
      )
      .option('--token-env <name>', 'read the token from this environment variable', '')
      .option('--token-file <path>', 'read the token from this file (readable by its owner only)', '')
      .option(
        '--token <token>',
        'the token itself (every local user sees it in the process list: prefer --token-env or --token-file)',
        '',
      ),
  )
    .addHelpText(
      'after',
      `
Examples (kubectl runs these from a kubeconfig; see sealion get kubeconfig):
  sealion login static --token-env MY_TOKEN
  sealion login static --token-file ~/.config/my-token      # chmod 600
  sealion login static --token-env MY_TOKEN --exchange --authenticator-type webhook --authenticator-name corp`,
    )
    .action(async (flags: StaticLoginFlags) => {
      checkExchangeFlags(flags);
      const credential = await onceForCaller(process.env, () =>
        staticLogin(flags, process.env, (line) => process.stderr.write(`${line}\n`)),
      ).finally(closeHttpsPools);
      printCredential(credential, 'The token is usable');
    });
  exchangeOptions(
    login
      .command('oidc')
      .description('log in with OpenID Connect (authorization code with PKCE) and print an ExecCredential')
      .requiredOption('--issuer <url>', 'the OIDC issuer')
      .option('--client-id <id>', 'the OAuth client ID registered for the CLI', DEFAULT_OIDC_CLIENT_ID)
      .option('--scopes <list>', 'space- or comma-separated scopes', DEFAULT_OIDC_SCOPES)
      .option('--ca-bundle-data <base64>', "the issuer's CA bundle (default: the system roots)", '')
      .option('--listen-port <port>', 'port of the localhost callback (0: any free one)', '0')
      .option('--skip-browser', 'print the login URL instead of opening a browser', false)
      .option(
        '--device',
        'log in on another device with a code (device authorization grant), for machines without a browser',
        false,
      ),
  )
    .addHelpText(
      'after',
      `
Sessions (ID and refresh tokens) are cached per issuer, client and scopes; a cached ID token is used until shortly
before it expires, then refreshed without a browser when the issuer gave a refresh token. Only when the refresh
fails (the refresh token expired or was revoked) does the browser open again, or with --device a code is printed.

Examples:
  sealion login oidc --issuer https://dex.example.com --client-id sealion-cli
  sealion login oidc --issuer https://dex.example.com --device     # on a machine without a browser
  sealion login oidc --issuer https://dex.example.com --skip-browser --exchange \\
    --authenticator-type jwt --authenticator-name corp`,
    )
    .action(async (flags: OIDCLoginFlags) => {
      checkExchangeFlags(flags);
      const { oidcLogin } = await import('./login-oidc.ts');
      const credential = await onceForCaller(process.env, () =>
        oidcLogin(flags, process.env, (line) => process.stderr.write(`${line}\n`)),
      ).finally(closeHttpsPools);
      printCredential(credential, `Logged in to ${flags.issuer}`);
    });
  return login;
}
