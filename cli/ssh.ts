// `sealion ssh config`: what plain `ssh` needs to use the SSH door, for anyone signed in. The door publishes where
// it listens and its host key at the impersonation proxy (`GET /apis/identity.concierge.<suffix>/v1alpha1/sshdoor`,
// concierge/proxy/hub-apis.ts), which any signed-in user may read, through any cluster's URL of the proxy; this prints
// it as an ~/.ssh/config Host block, or as known_hosts lines that pin the key. Nothing is written to the user's
// files: `>> ~/.ssh/config` is theirs to type. The answer is the server's text and ends up in files ssh reads as
// configuration, so every field is checked against what it may be (a host name, a port, a key) before it is printed:
// a newline in a host name would otherwise add any option, a ProxyCommand among them.
import { existsSync } from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import { Command, Option } from 'commander';
import { withKubeconfig } from './options.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, VERSION } from '../apis/groups.ts';
import type { SSHDoor } from '../apis/identity.ts';
import { closeHttpsPools } from '../lib/https-client.ts';
import { parsePublicKeyLine } from '../lib/ssh/keys.ts';
import { failureOf } from './exec-credential.ts';
import { printable } from './printable.ts';
import { loginFirst, requestAsKubeconfig } from './whoami.ts';

export interface SshConfigFlags {
  kubeconfig: string;
  context: string;
  groupSuffix: string;
  /** The Host name the block gives the door, and the name its key is pinned under. */
  alias: string;
  /** The block's User; empty: none (keys and device logins ignore it; a certificate needs one of its principals). */
  loginName: string;
  /** Print the known_hosts lines instead of the Host block. */
  knownHosts: boolean;
  /** The block names this file as UserKnownHostsFile; empty: ssh's own (~/.ssh/known_hosts). */
  knownHostsFile: string;
  output?: 'json' | 'yaml';
}

/** What `ssh` needs to reach the door, as printed with -o json|yaml. */
export interface SshDoorConfig {
  alias: string;
  hostName: string;
  port: number;
  hostKeyAlias: string;
  user?: string;
  userKnownHostsFile?: string;
  /** known_hosts lines: the alias (never the server's address), then the key. */
  knownHosts: string[];
  hostKeys: { algorithm: string; publicKey: string; fingerprint: string }[];
  /** What targets call the hub's own cluster. */
  hubName: string;
  deviceLogin: boolean;
}

/** The names people give a Host entry: no spaces, no patterns, nothing ssh_config would read as more. */
const ALIAS = /^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$/;
/** A login name ssh passes on as it is: the characters user names and certificate principals use. */
const LOGIN_NAME = /^[A-Za-z0-9._@+-]{1,128}$/;
const HOSTNAME =
  /^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*$/;
const IPV6 = /^[0-9A-Fa-f:.]{2,45}$/;
const PUBLIC_KEY = /^([a-z0-9][a-z0-9@.-]{0,63}) ([A-Za-z0-9+/]{16,16384}={0,3})$/;
const FINGERPRINT = /^SHA256:[A-Za-z0-9+/]{43}$/;
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

/** `host:port` or `[v6]:port` as its parts, or undefined when it is neither. */
export function splitEndpoint(endpoint: string): { host: string; port: number } | undefined {
  const match = /^(?:\[([^\]]+)\]|([^:[\]]+)):([0-9]{1,5})$/.exec(endpoint);
  if (!match) return undefined;
  const host = match[1] ?? match[2]!;
  const port = Number(match[3]);
  if (port < 1 || port > 65535) return undefined;
  if (match[1] !== undefined ? !IPV6.test(host) || !host.includes(':') : !HOSTNAME.test(host))
    return undefined;
  return { host, port };
}

/**
 * What ssh needs from the door's answer, every field checked; throws with what is wrong (the server's text is
 * hostile until checked). `from` names the server, for the messages.
 */
export function sshDoorConfig(door: unknown, flags: SshConfigFlags, from: string): SshDoorConfig {
  const status = (door as Partial<SSHDoor> | undefined)?.status;
  const malformed = (what: string): Error =>
    new Error(`ssh config on ${from}: the SSH door's answer has ${what}; is this a Sealion proxy?`);
  if (!status || typeof status !== 'object') throw malformed('no status');
  if (status.endpoint === undefined)
    throw new Error(
      `ssh config on ${from}: the SSH door has no address yet (the proxy's Service waits for one); retry in a minute`,
    );
  const endpoint = typeof status.endpoint === 'string' ? splitEndpoint(status.endpoint) : undefined;
  if (!endpoint) throw malformed('an endpoint that is no host:port');
  const keys = Array.isArray(status.hostKeys) ? status.hostKeys : [];
  if (keys.length === 0) throw malformed('no host key');
  const hostKeys = keys.map((key) => hostKeyOf(key, malformed));
  if (typeof status.hubName !== 'string' || !DNS_LABEL.test(status.hubName)) throw malformed('no hub name');
  return {
    alias: flags.alias,
    hostName: endpoint.host,
    port: endpoint.port,
    hostKeyAlias: flags.alias,
    ...(flags.loginName ? { user: flags.loginName } : {}),
    ...(flags.knownHostsFile ? { userKnownHostsFile: flags.knownHostsFile } : {}),
    // Under the alias only: the Host block's HostKeyAlias makes ssh look the key up by it. The address is the
    // server's word; a line pinning the key under it too would make ssh trust this key for whatever host the
    // server named (github.com:22), for any ssh run without the block.
    knownHosts: hostKeys.map((k) => `${flags.alias} ${k.publicKey}`),
    hostKeys,
    hubName: status.hubName,
    deviceLogin: status.deviceLogin === true,
  };
}

/**
 * One host key of the door's answer, its fingerprint computed here from the key's blob (the one the answer gives
 * is the server's word, printed only when it agrees), and the type written in the blob the algorithm named.
 */
function hostKeyOf(
  key: unknown,
  malformed: (what: string) => Error,
): { algorithm: string; publicKey: string; fingerprint: string } {
  const { algorithm, publicKey, fingerprint } = (key ?? {}) as Record<string, unknown>;
  const match = typeof publicKey === 'string' ? PUBLIC_KEY.exec(publicKey) : null;
  if (!match || match[1] !== algorithm) throw malformed('a host key that is no OpenSSH public key');
  const named = match[1]!;
  const inside = blobType(Buffer.from(match[2]!, 'base64'));
  if (inside !== undefined && inside !== named)
    throw malformed(`a host key named ${named} whose blob holds ${printable(inside, 64)}`);
  const parsed = parsePublicKeyLine(match[0]);
  if (!parsed.ok) throw malformed('a host key that is no OpenSSH public key');
  if (typeof fingerprint !== 'string' || !FINGERPRINT.test(fingerprint))
    throw malformed('a host key fingerprint that is no SHA256:…');
  if (fingerprint !== parsed.key.fingerprint)
    throw malformed(`a host key fingerprint that is not its key's (${parsed.key.fingerprint})`);
  return { algorithm: named, publicKey: match[0], fingerprint: parsed.key.fingerprint };
}

/** The key type an SSH public key blob starts with, or undefined when it is too short to hold one. */
function blobType(blob: Buffer): string | undefined {
  if (blob.length < 4) return undefined;
  const length = blob.readUInt32BE(0);
  return length <= blob.length - 4 && length <= 64
    ? blob.subarray(4, 4 + length).toString('latin1')
    : undefined;
}

/** A path as ssh_config reads one: quoted when it has spaces; none may hold a quote or a line break. */
function configPath(path: string): string {
  return /\s/.test(path) ? `"${path}"` : path;
}

/** The ~/.ssh/config Host block, with comments saying where it goes and how to pin the key. */
export function sshConfigText(config: SshDoorConfig): string {
  const fingerprints = config.hostKeys.map((k) => k.fingerprint).join(', ');
  const lines = [
    `# Sealion's SSH door: append to ~/.ssh/config (sealion ssh config >> ~/.ssh/config), and pin its host key`,
    `# ${fingerprints} with sealion ssh config --known-hosts >> ${config.userKnownHostsFile ?? '~/.ssh/known_hosts'}`,
    `# Then: ssh -t ${config.alias} ${config.hubName}/<namespace>/<pod>, or ssh -t ${config.alias} for a menu.`,
    `Host ${config.alias}`,
    `  HostName ${config.hostName}`,
    `  Port ${config.port}`,
    `  HostKeyAlias ${config.hostKeyAlias}`,
    ...(config.userKnownHostsFile ? [`  UserKnownHostsFile ${configPath(config.userKnownHostsFile)}`] : []),
    config.user
      ? `  User ${config.user}`
      : '  # User <principal>   (only SSH certificates read it: one of their principals)',
  ];
  return `${lines.join('\n')}\n`;
}

/** The keys ssh tries by default (ssh_config's IdentityFile defaults, the kinds the door takes). */
const DEFAULT_KEYS = ['id_ed25519', 'id_ecdsa', 'id_rsa', 'id_ed25519_sk', 'id_ecdsa_sk'];

/** A hint for a user with none of ssh's default keys, who could only sign in by a certificate; else undefined. */
export function missingKeyHint(home: string): string | undefined {
  const dir = join(home, '.ssh');
  if (DEFAULT_KEYS.some((name) => existsSync(join(dir, name)))) return undefined;
  return `sealion: no SSH key in ${dir} (${DEFAULT_KEYS.slice(0, 3).join(', ')}); make one with ssh-keygen -t ed25519, then ssh binds it at your first login`;
}

/** The door's answer, read as the kubeconfig's user. */
async function fetchSshDoor(flags: SshConfigFlags): Promise<{ door: unknown; from: string }> {
  const { loadKubeConfigFlags } = await import('../lib/kube/kube.ts');
  const config = loadKubeConfigFlags(flags);
  const from = printable(config.getCurrentCluster()?.server ?? 'the kubeconfig');
  await loginFirst(config);
  const group = apiGroups(flags.groupSuffix).identity;
  let text: string;
  try {
    text = await requestAsKubeconfig(config, `apis/${group}/${VERSION}/sshdoor`, { maxBytes: 256 * 1024 });
  } catch (err) {
    throw new Error(`ssh config on ${from}: ${await doorFailure(err)}`, { cause: err });
  }
  try {
    return { door: JSON.parse(text) as unknown, from };
  } catch {
    throw new Error(`ssh config on ${from}: the answer is not JSON; is this a Sealion proxy?`);
  }
}

/** Why the door could not be read, with what to do: a 404 from anything but the proxy means another server. */
async function doorFailure(err: unknown): Promise<string> {
  const status = (err as { status?: number }).status;
  const said = await failureOf(err);
  if (status === 404 && !said.includes('SSH door'))
    return 'no SSH door is published here; use a context that goes through the Sealion proxy';
  if (status === 404) return said.replace(/^.*?: (?=the SSH door)/, '');
  return said;
}

export async function sshConfig(flags: SshConfigFlags): Promise<string> {
  if (!ALIAS.test(flags.alias))
    throw new Error(
      `--alias ${JSON.stringify(printable(flags.alias, 64))}: use letters, digits, '.', '_' or '-', as a Host name`,
    );
  if (flags.loginName && !LOGIN_NAME.test(flags.loginName))
    throw new Error(`--login-name ${JSON.stringify(printable(flags.loginName, 64))}: not a login name`);
  if (/["\r\n]/.test(flags.knownHostsFile))
    throw new Error('--known-hosts-file: a path with a quote or a line break cannot go into ssh_config');
  const { door, from } = await fetchSshDoor(flags);
  await closeHttpsPools();
  const config = sshDoorConfig(door, flags, from);
  if (flags.output === 'json') return `${JSON.stringify(config, null, 2)}\n`;
  if (flags.output === 'yaml') return (await import('yaml')).stringify(config);
  if (flags.knownHosts) return `${config.knownHosts.join('\n')}\n`;
  return sshConfigText(config);
}

export function sshCommand(): Command {
  const config = withKubeconfig(
    new Command('config').description(
      "print an ~/.ssh/config Host block for Sealion's SSH door, or its known_hosts lines",
    ),
  )
    .option('--alias <name>', 'the Host name to give the door, under which its key is pinned', 'sealion')
    .addOption(
      new Option(
        '--login-name <name>',
        'the User line (SSH certificates only: one of their principals)',
      ).default('', 'none'),
    )
    .option(
      '--known-hosts',
      'print known_hosts lines that pin the host key, instead of the Host block',
      false,
    )
    .addOption(
      new Option(
        '--known-hosts-file <path>',
        'name this file as the UserKnownHostsFile in the Host block',
      ).default('', "ssh's own"),
    )
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .addOption(
      new Option('-o, --output <format>', 'print as json or yaml instead of the Host block').choices([
        'json',
        'yaml',
      ]),
    )
    .addHelpText(
      'after',
      `
Any signed-in user may run it. Nothing is written: redirect the output where you want it.

Examples:
  sealion ssh config >> ~/.ssh/config
  sealion ssh config --known-hosts >> ~/.ssh/known_hosts
  ssh -t sealion hub/default/web-1
  sealion ssh config --context edge --alias sealion-prod -o json`,
    )
    .action(async (flags: SshConfigFlags) => {
      const text = await sshConfig(flags);
      process.stdout.write(text);
      const hint = flags.knownHosts || flags.output ? undefined : missingKeyHint(homedir());
      if (hint) process.stderr.write(`${hint}\n`);
    });
  return new Command('ssh').description("set up plain ssh for Sealion's SSH door").addCommand(config);
}
