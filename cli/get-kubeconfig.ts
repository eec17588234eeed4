// `sealion get kubeconfig`: from an admin's kubeconfig, finds the authenticator and how users reach the cluster (its
// strategies' status): the cluster's own API server, which serves TokenCredentialRequest as an aggregated API and
// trusts certificates the cluster signs (direct), or the impersonation proxy. Prints a kubeconfig whose user is the
// `sealion login` exec plugin.
import { writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { Command, Option } from 'commander';
import { parse, stringify } from 'yaml';
import { REJECTED_EDIT, type ConciergeStrategy, type EndpointConfig } from '../apis/authentication.ts';
import type { CredentialIssuerSpec } from '../apis/config.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import { DEFAULT_SSH_HUB_NAME } from '../apis/install.ts';
import { isDNSLabel } from '../apis/names.ts';
import type { Cluster } from '../apis/tunnel.ts';
import type { KubeClients } from '../lib/kube/kube.ts';
import { DEFAULT_OIDC_CLIENT_ID, EXEC_API_VERSION, readTokenFile } from './exec-credential.ts';
import { takesNames } from './completion.ts';
import { withResourceGet } from './get.ts';
import { printable } from './printable.ts';
import { installHint, selfCommand } from './self.ts';

const POLL_MS = 2_000;

/** direct: the cluster's API server with certificates the cluster signs; proxy: the impersonation proxy. */
export type KubeconfigMode = 'direct' | 'proxy';
const MODES: readonly KubeconfigMode[] = ['direct', 'proxy'];

export interface GetKubeconfigFlags {
  kubeconfig: string;
  groupSuffix: string;
  authenticatorType: '' | 'jwt' | 'webhook';
  authenticatorName: string;
  /** Refused: a token in the kubeconfig's exec arguments is in the process list of every kubectl run. */
  staticToken: string;
  staticTokenEnv: string;
  /** A token file only its owner may read; the kubeconfig names it by its absolute path. */
  staticTokenFile: string;
  /** OIDC login (the default for a JWTAuthenticator without a static token). Empty: from the authenticator. */
  oidcIssuer: string;
  oidcClientId: string;
  oidcScopes: string;
  oidcCaBundleData: string;
  oidcSkipBrowser: boolean;
  exchangeCredential: boolean;
  /** Seconds to wait for a Pending proxy. */
  timeout: string;
  /**
   * yaml (default, also when empty) or json. Any other value is the file the older `-o FILE` named: written there,
   * with a deprecation warning.
   */
  output: string;
  /** Write here (mode 0600) instead of standard output; empty: standard output. */
  outputFile?: string;
  /** The context of the admin's kubeconfig that reaches the hub; empty: its current context. */
  context?: string;
  /** A cluster reached through its agent (`/clusters/<name>` on the proxy); empty: the proxy's own cluster. */
  cluster: string;
  /** A context for the proxy's own cluster and one for each connected agent-backed cluster, sharing one user. */
  allClusters: boolean;
  /** The OIDC login uses the device authorization grant. */
  oidcDevice: boolean;
  /**
   * Where kubectl goes. Default (empty or absent): direct when the authenticator's TokenCredentialRequestAPI strategy
   * is Success and neither --cluster nor --all-clusters is given (agent-backed clusters are reached only through the
   * proxy), else proxy.
   */
  mode?: '' | KubeconfigMode;
}

interface Found {
  type: 'jwt' | 'webhook';
  name: string;
  /** A JWTAuthenticator's issuer and CA, for the OIDC login. */
  issuer?: string;
  caData?: string;
  strategies: ConciergeStrategy[];
}

async function listAuthenticators(clients: KubeClients, suffix: string): Promise<Found[]> {
  const group = apiGroups(suffix).authentication;
  const found: Found[] = [];
  for (const [type, plural] of [
    ['jwt', Resource.JWTAuthenticator],
    ['webhook', Resource.WebhookAuthenticator],
  ] as const) {
    const list = (await clients.customObjects.listClusterCustomObject({
      group,
      version: VERSION,
      plural,
    })) as {
      items: {
        metadata: { name: string };
        spec?: {
          issuer?: string;
          tls?: { certificateAuthorityData?: string };
          jwt?: { issuer?: { url?: string; certificateAuthority?: string } };
        };
        status?: { conciergeStrategies?: ConciergeStrategy[] };
      }[];
    };
    for (const item of list.items) {
      // The issuer and its CA, said the older way or in the structured form (spec.jwt, whose CA is PEM).
      const issuer = item.spec?.jwt?.issuer?.url ?? item.spec?.issuer;
      const structuredCA = item.spec?.jwt?.issuer?.certificateAuthority;
      const caData = structuredCA
        ? Buffer.from(structuredCA).toString('base64')
        : item.spec?.tls?.certificateAuthorityData;
      found.push({
        type,
        name: item.metadata.name,
        ...(issuer ? { issuer } : {}),
        ...(caData ? { caData } : {}),
        strategies: item.status?.conciergeStrategies ?? [],
      });
    }
  }
  return found;
}

function choose(all: Found[], flags: GetKubeconfigFlags): Found {
  const matching = all.filter(
    (a) =>
      (!flags.authenticatorType || a.type === flags.authenticatorType) &&
      (!flags.authenticatorName || a.name === flags.authenticatorName),
  );
  const names = all.map((a) => `${a.type}/${printable(a.name)}`).join(', ') || 'none';
  if (matching.length === 1) return matching[0]!;
  if (all.length === 0)
    throw new Error(
      'no JWTAuthenticator or WebhookAuthenticator on the cluster: create one first (see the README), or check --kubeconfig, --context and --group-suffix',
    );
  if (matching.length === 0) {
    const type = flags.authenticatorType ? `${flags.authenticatorType}/` : '';
    const wanted = flags.authenticatorName
      ? `no authenticator ${type}${printable(flags.authenticatorName)}`
      : `no ${flags.authenticatorType} authenticator`;
    throw new Error(`${wanted}; known: ${names}`);
  }
  throw new Error(`several authenticators match (${names}); choose one with --authenticator-name`);
}

/** What the kubeconfig points kubectl at, and the authenticator its plugin names. */
export interface Frontend {
  authenticator: Found;
  mode: KubeconfigMode;
  endpoint: EndpointConfig;
}

/** A strategy in words for a message; its status, reason and message are the cluster's text. */
const described = (s: ConciergeStrategy): string =>
  `${printable(String(s.status))} (${printable(String(s.reason))}): ${printable(String(s.message))}`;

/**
 * Where the kubeconfig sends kubectl, once the chosen way in is usable: the mode asked for, or without one the direct
 * path when it works, else the proxy. Waits while the proxy is Pending (or nothing is published yet) and explains
 * anything else.
 */
export async function findFrontend(
  clients: KubeClients,
  flags: GetKubeconfigFlags,
  say: (line: string) => void,
): Promise<Frontend> {
  const deadline = Date.now() + Number(flags.timeout) * 1000;
  // Agent-backed clusters are routes of the proxy: the cluster's own API server knows nothing of them.
  const throughAgents = Boolean(flags.cluster || flags.allClusters);
  let lastMessage = '';
  for (;;) {
    const authenticator = choose(await listAuthenticators(clients, flags.groupSuffix), flags);
    const direct = authenticator.strategies.find((s) => s.type === 'TokenCredentialRequestAPI');
    const directConfig = direct?.status === 'Success' ? direct.tokenCredentialRequestConfig : undefined;
    let waitingFor: string;
    if (flags.mode === 'direct' || (!flags.mode && !throughAgents && directConfig)) {
      if (directConfig) return { authenticator, mode: 'direct', endpoint: directConfig };
      if (direct) throw new Error(`the TokenCredentialRequest API is ${described(direct)}`);
      // A concierge that publishes strategies but not this one does not know the direct path; one that publishes
      // none has not decided yet.
      if (authenticator.strategies.length > 0)
        throw new Error(
          `the concierge publishes no TokenCredentialRequestAPI strategy for ${authenticator.type}/${printable(authenticator.name)}: it offers no direct path (try --mode proxy)`,
        );
      waitingFor = 'the concierge has not published a status yet';
    } else {
      const strategy = authenticator.strategies.find((s) => s.type === 'ImpersonationProxy');
      if (strategy?.status === 'Success' && strategy.impersonationProxyConfig) {
        // The proxy serves, by the last good configuration: usable, and the admin's broken edit worth a word.
        if (String(strategy.message).includes(REJECTED_EDIT))
          say(`warning: the impersonation proxy serves, but ${printable(String(strategy.message))}`);
        return { authenticator, mode: 'proxy', endpoint: strategy.impersonationProxyConfig };
      }
      const pending = !strategy || strategy.reason === 'Pending';
      if (!pending) {
        // Chosen for want of a working direct path: why that one does not work either belongs in the same message.
        const alsoDirect =
          !flags.mode && !throughAgents && direct
            ? `; the TokenCredentialRequest API is ${described(direct)}`
            : '';
        throw new Error(`the impersonation proxy is ${described(strategy)}${alsoDirect}`);
      }
      // The strategy's words are the cluster's text: whoever may write the authenticator's status wrote them.
      waitingFor =
        strategy?.message === undefined
          ? 'the concierge has not published a status yet'
          : printable(String(strategy.message));
    }
    if (Date.now() > deadline)
      throw new Error(
        `gave up waiting for ${flags.mode === 'direct' ? 'the TokenCredentialRequest API' : 'the impersonation proxy'}: ${waitingFor}`,
      );
    if (waitingFor !== lastMessage) say(`waiting: ${waitingFor}`);
    lastMessage = waitingFor;
    await new Promise((r) => setTimeout(r, POLL_MS));
  }
}

/** The kubeconfig `sealion get kubeconfig` prints. `given`: the admin kubeconfig's clients, made here by default. */
export async function getKubeconfig(
  flags: GetKubeconfigFlags,
  say: (line: string) => void,
  given?: KubeClients,
): Promise<string> {
  if (!Number.isFinite(Number(flags.timeout))) throw new Error('--timeout must be a number of seconds');
  if (flags.cluster && flags.allClusters) throw new Error('give --cluster or --all-clusters, not both');
  if (flags.mode && !MODES.includes(flags.mode))
    throw new Error(`--mode must be direct or proxy, not ${JSON.stringify(flags.mode)}`);
  if (flags.mode === 'direct' && (flags.cluster || flags.allClusters))
    throw new Error(
      `${flags.cluster ? '--cluster' : '--all-clusters'} needs the impersonation proxy, which reaches agent-backed clusters; the cluster's own API server (--mode direct) knows none: leave out --mode or give --mode proxy`,
    );
  // Checked before the cluster is asked anything. The exec plugin's arguments are public: every local user reads them
  // in the process list (ps, /proc/<pid>/cmdline) each time kubectl runs it, so the token goes where only the user
  // reads it, an environment variable or a private file, and the kubeconfig names where.
  if (flags.staticToken)
    throw new Error(
      '--static-token would put the token in the arguments of every kubectl run, where other local users read it: give --static-token-env NAME (an environment variable holding it) or --static-token-file PATH (a file only you may read)',
    );
  if (flags.staticTokenEnv && flags.staticTokenFile)
    throw new Error('give --static-token-env or --static-token-file, not both');
  // Absolute, as kubectl runs the plugin from wherever kubectl runs; read now, so that a file others may read (or
  // none at all) is found before a kubeconfig is written that fails on every run.
  const tokenFile = flags.staticTokenFile ? resolve(flags.staticTokenFile) : '';
  if (tokenFile) readTokenFile(tokenFile);
  const clients =
    given ??
    (await import('../lib/kube/kube.ts')).newKubeClients(
      flags.kubeconfig ? { path: flags.kubeconfig } : { default: true },
      flags.context,
    );
  const { hub, clusters, cluster } = await checkNames(clients, flags, say);
  const { authenticator, mode, endpoint } = await findFrontend(clients, { ...flags, cluster }, say);
  const direct = mode === 'direct';
  const staticToken = Boolean(flags.staticTokenEnv || tokenFile);
  if (!staticToken && authenticator.type !== 'jwt')
    throw new Error(
      `webhook authenticator ${authenticator.name} checks static tokens: give --static-token-env or --static-token-file`,
    );
  const oidcIssuer = flags.oidcIssuer || authenticator.issuer;
  if (!staticToken && !oidcIssuer) throw new Error(`JWTAuthenticator ${authenticator.name} names no issuer`);
  const oidcCA = flags.oidcCaBundleData || authenticator.caData || '';
  const login = staticToken
    ? ['static', ...(tokenFile ? ['--token-file', tokenFile] : ['--token-env', flags.staticTokenEnv])]
    : [
        'oidc',
        '--issuer',
        oidcIssuer!,
        '--client-id',
        flags.oidcClientId,
        '--scopes',
        flags.oidcScopes,
        ...(oidcCA ? ['--ca-bundle-data', oidcCA] : []),
        ...(flags.oidcSkipBrowser ? ['--skip-browser'] : []),
        ...(flags.oidcDevice ? ['--device'] : []),
      ];
  const self = selfCommand(process.env);
  const args = [
    ...self.args,
    'login',
    ...login,
    // The API server knows the certificates its cluster signs, never the token, so the direct path always exchanges;
    // through the proxy, with --exchange-credential. The rest is written always: the plugin also exchanges while a
    // reason is set (sealion login --reason), which only a certificate carries.
    ...(direct || flags.exchangeCredential ? ['--exchange'] : []),
    // The cluster's CSR API signs only a request made with the key it certifies, for the subject in it, and the
    // subject is the concierge's to choose: a key of the plugin's own cannot be certified there, so the concierge
    // makes one and returns it with the certificate (said up front, so the plugin sends no CSR and warns of nothing).
    ...(direct ? ['--no-proof-of-possession'] : []),
    '--authenticator-type',
    authenticator.type,
    '--authenticator-name',
    authenticator.name,
    // The endpoint is named explicitly too: not every client passes KUBERNETES_EXEC_INFO (client-node does not).
    '--concierge-endpoint',
    endpoint.endpoint,
    '--concierge-ca-bundle-data',
    endpoint.certificateAuthorityData,
    ...(flags.groupSuffix === DEFAULT_GROUP_SUFFIX ? [] : ['--group-suffix', flags.groupSuffix]),
  ];
  const contexts = contextsFor(
    endpoint.endpoint,
    { hub, cluster, clusters, allClusters: flags.allClusters },
    say,
  );
  // One user for every context: the same plugin command, so one login (and one certificate, which the proxy's
  // endpoint issues for all its clusters) serves them all. The direct path has one context, the API server's.
  const user = `${new URL(endpoint.endpoint).host}/${authenticator.type}/${authenticator.name}`;
  return stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: contexts.map((c) => ({
      name: c.name,
      cluster: {
        server: c.server,
        'certificate-authority-data': endpoint.certificateAuthorityData,
        // kubectl hands this to the login plugin (provideClusterInfo), which names the context in what it says.
        extensions: [{ name: 'client.authentication.k8s.io/exec', extension: { context: c.name } }],
      },
    })),
    users: [
      {
        name: user,
        user: {
          exec: {
            apiVersion: EXEC_API_VERSION,
            // This very CLI: the installed command, or the executable (or Node and the sources) running now.
            command: self.command,
            args,
            provideClusterInfo: true,
            // A static token needs nobody; an OIDC login may need a person at a browser.
            interactiveMode: staticToken ? 'Never' : 'IfAvailable',
            installHint: installHint(self),
          },
        },
      },
    ],
    contexts: contexts.map((c) => ({ name: c.name, context: { cluster: c.name, user } })),
    'current-context': contexts[0]!.name,
  });
}

/**
 * Every name the flags give, checked before anything is waited for or written: the authenticator (choose), then the
 * cluster, which may be the hub's own name (its own cluster, as over SSH: no agent, no /clusters/ prefix). Returns the
 * hub's name, the agent-backed clusters, and the cluster to write ('' for the hub's own).
 */
async function checkNames(
  clients: KubeClients,
  flags: GetKubeconfigFlags,
  say: (line: string) => void,
): Promise<{ hub: string; clusters: ClusterName[]; cluster: string }> {
  choose(await listAuthenticators(clients, flags.groupSuffix), flags);
  const hub = await hubNameOf(clients, flags.groupSuffix);
  const clusters = flags.cluster || flags.allClusters ? await listClusters(clients, flags.groupSuffix) : [];
  const cluster = flags.cluster === hub ? '' : flags.cluster;
  if (!cluster) return { hub, clusters, cluster };
  const found = clusters.find((c) => c.name === cluster);
  if (!found) {
    const known = [hub, ...clusters.map((c) => c.name).filter((n) => n !== hub)].sort();
    throw new Error(`no cluster ${printable(cluster)}; known: ${known.map((n) => printable(n)).join(', ')}`);
  }
  if (!found.connected)
    say(`note: cluster ${printable(cluster)} is not connected now; the kubeconfig works once its agent is`);
  return { hub, clusters, cluster };
}

/**
 * The contexts to write, the current one first: the hub's own cluster or `cluster`, and with `allClusters` every
 * connected agent-backed cluster; those left out are named on stderr.
 */
function contextsFor(
  endpoint: string,
  names: { hub: string; cluster: string; clusters: ClusterName[]; allClusters: boolean },
  say: (line: string) => void,
): { name: string; server: string }[] {
  const proxy = endpoint.replace(/\/$/, '');
  const { hub, cluster } = names;
  const contexts = [
    {
      name: contextName(endpoint, cluster || hub),
      server: cluster ? `${proxy}/clusters/${encodeURIComponent(cluster)}` : endpoint,
    },
  ];
  if (!names.allClusters) return contexts;
  for (const { name: other } of names.clusters.filter((c) => c.connected)) {
    // The hub's name is the hub's own cluster everywhere: a Cluster object that has it is left out, as over SSH.
    if (other === hub) {
      say(`left out: cluster ${printable(other)}, which has the hub's own name`);
      continue;
    }
    contexts.push({
      name: contextName(endpoint, other),
      server: `${proxy}/clusters/${encodeURIComponent(other)}`,
    });
  }
  const left = names.clusters.filter((c) => !c.connected).map((c) => printable(c.name));
  if (left.length > 0) say(`left out, not connected now: ${left.join(', ')}`);
  return contexts;
}

/** An agent-backed cluster: its Cluster object's name, and whether its agent holds a tunnel now. */
interface ClusterName {
  name: string;
  connected: boolean;
}

/**
 * A context's name: the address kubectl goes to, which tells two hubs apart when kubeconfigs are merged (kubectl
 * keeps the first of two contexts with one name), then the cluster's name as every other command takes it (the hub's
 * own is its ssh.hubName): `proxy.example.com/hub`, `proxy.example.com/edge-1`. A `/` is in no host and no cluster
 * name, so the name splits one way only.
 */
export function contextName(endpoint: string, cluster: string): string {
  return `${new URL(endpoint).host}/${cluster}`;
}

/**
 * What the hub calls its own cluster: the ssh.hubName of the settings in effect, which the concierge mirrors into the
 * CredentialIssuer's spec (the singleton: the first one listed). Its default when there is none or it cannot be read
 * (a concierge older than the setting, or an admin kubeconfig that may not read it).
 */
async function hubNameOf(clients: KubeClients, groupSuffix: string): Promise<string> {
  try {
    const list = (await clients.customObjects.listClusterCustomObject({
      group: apiGroups(groupSuffix).config,
      version: VERSION,
      plural: Resource.CredentialIssuer,
    })) as { items?: { spec?: CredentialIssuerSpec }[] };
    const name = list.items?.[0]?.spec?.ssh?.hubName;
    // Checked as the concierge's config checks it: the name goes into context names and messages.
    return name && isDNSLabel(name) ? name : DEFAULT_SSH_HUB_NAME;
  } catch {
    return DEFAULT_SSH_HUB_NAME;
  }
}

/** The agent-backed clusters (the Cluster objects), by name, and whether each one's agent holds a tunnel now. */
async function listClusters(clients: KubeClients, groupSuffix: string): Promise<ClusterName[]> {
  const list = (await clients.customObjects.listClusterCustomObject({
    group: apiGroups(groupSuffix).tunnel,
    version: VERSION,
    plural: Resource.Cluster,
  })) as { items: Pick<Cluster, 'metadata' | 'status'>[] };
  return list.items
    .flatMap((c) =>
      c.metadata.name ? [{ name: c.metadata.name, connected: Boolean(c.status?.connected) }] : [],
    )
    .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
}

/** How the kubeconfig is written: its format, and the file (empty: standard output). */
export function outputOf(
  flags: Pick<GetKubeconfigFlags, 'output' | 'outputFile'>,
  say: (line: string) => void,
): { format: 'yaml' | 'json'; file: string } {
  const file = flags.outputFile ?? '';
  if (flags.output === '' || flags.output === 'yaml' || flags.output === 'json')
    return { format: flags.output === 'json' ? 'json' : 'yaml', file };
  // `-o FILE` from before -o took a format: still written there for this release, with a warning.
  if (file)
    throw new Error(
      `-o takes json or yaml, not ${JSON.stringify(flags.output)}; give the file with --output-file`,
    );
  say(
    `warning: -o FILE is deprecated and goes in the next release: write --output-file ${flags.output} (-o takes json or yaml)`,
  );
  return { format: 'yaml', file: flags.output };
}

/** Why a file could not be written, in words. */
function writeProblem(err: NodeJS.ErrnoException): string {
  switch (err.code) {
    case 'ENOENT':
      return 'its folder does not exist';
    case 'EISDIR':
      return 'it is a folder';
    case 'EACCES':
    case 'EPERM':
      return 'permission denied';
    case 'EROFS':
      return 'the file system is read-only';
    default:
      return err.code ?? err.message;
  }
}

/**
 * `sealion get kubeconfig`: checks the output flags, makes the kubeconfig (getKubeconfig), and writes it in the
 * format asked for, to the file or to standard output. Nothing is written unless all of it succeeded.
 */
export async function runGetKubeconfig(
  flags: GetKubeconfigFlags,
  say: (line: string) => void,
  given?: KubeClients,
): Promise<void> {
  const { format, file } = outputOf(flags, say);
  const yaml = await getKubeconfig(flags, say, given);
  const text = format === 'json' ? `${JSON.stringify(parse(yaml), null, 2)}\n` : yaml;
  if (!file) return void process.stdout.write(text);
  try {
    writeFileSync(file, text, { mode: 0o600 });
  } catch (err) {
    throw new Error(
      `cannot write the kubeconfig to ${printable(file)}: ${writeProblem(err as NodeJS.ErrnoException)}; give another --output-file`,
      { cause: err },
    );
  }
}

export function getCommand(): Command {
  const get = new Command('get').description(
    'list a resource on every cluster at once (--all-clusters), or write a kubeconfig (get kubeconfig)',
  );
  get
    .command('kubeconfig')
    .description(
      'write a kubeconfig for the cluster: its own API server with certificates the cluster signs, or the impersonation proxy',
    )
    .option('--kubeconfig <path>', "the admin's kubeconfig (default: $KUBECONFIG or ~/.kube/config)", '')
    .addOption(
      takesNames(
        'context',
        new Option(
          '--context <name>',
          "the context of the admin's kubeconfig that reaches the hub (default: its current context)",
        ).default(''),
      ),
    )
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .addOption(
      new Option('--authenticator-type <type>', 'jwt or webhook (default: whichever exists)')
        .choices(['jwt', 'webhook'])
        .default(''),
    )
    .addOption(
      takesNames(
        'authenticator',
        new Option('--authenticator-name <name>', 'which authenticator (default: the only one)').default(''),
      ),
    )
    .option('--static-token-env <name>', 'the environment variable the plugin reads the token from', '')
    .option(
      '--static-token-file <path>',
      'a file only you may read (chmod 600) that the plugin reads the token from',
      '',
    )
    .option(
      '--static-token <token>',
      'refused: the token would be in the process list of every kubectl run; use --static-token-env or --static-token-file',
      '',
    )
    .option('--oidc-issuer <url>', "OIDC issuer (default: the JWTAuthenticator's)", '')
    .option('--oidc-client-id <id>', 'OAuth client ID of the CLI at the issuer', DEFAULT_OIDC_CLIENT_ID)
    .option('--oidc-scopes <list>', 'scopes to ask for', 'openid offline_access email profile groups')
    .option('--oidc-ca-bundle-data <base64>', "the issuer's CA bundle (default: the JWTAuthenticator's)", '')
    .option('--oidc-skip-browser', 'have the plugin print the login URL instead of opening a browser', false)
    .option(
      '--exchange-credential',
      "through the proxy, have the plugin trade the token for short-lived client certificates for a key it keeps (the authenticator's spec.credentialLifetimeSeconds); the direct path always exchanges",
      false,
    )
    .addOption(
      new Option(
        '--mode <mode>',
        "direct (the cluster's API server) or proxy (the impersonation proxy); default: direct when the authenticator's status says it works, else proxy",
      )
        .choices(MODES)
        .default(''),
    )
    .option(
      '--timeout <seconds>',
      'how long to wait while the proxy is Pending, or while the concierge has published nothing',
      '300',
    )
    .addOption(
      takesNames(
        'cluster',
        new Option(
          '--cluster <name>',
          'a cluster reached through its agent (see sealion cluster add); proxy only',
        ).default(''),
      ),
    )
    .option(
      '--all-clusters',
      "a context for the proxy's own cluster and for each connected agent-backed cluster, sharing one login; proxy only",
      false,
    )
    .option('--oidc-device', 'have the plugin log in with a code on another device (no browser here)', false)
    .option('-o, --output <format>', 'yaml or json (default: yaml)', '')
    .option('--output-file <path>', 'write the kubeconfig here (mode 0600) instead of standard output', '')
    .addHelpText(
      'after',
      `
Two ways in (--mode):
  direct  kubectl talks to the cluster's own API server, whose RBAC answers it. The concierge serves the token
          exchange there (TokenCredentialRequest as an aggregated API) and the cluster signs short-lived client
          certificates, so the plugin always exchanges the token, and the concierge makes the certificate's key.
          Offered on self-hosted clusters (the authenticator's TokenCredentialRequestAPI strategy).
  proxy   kubectl talks to the impersonation proxy; the only way to agent-backed clusters (--cluster, --all-clusters).
Without --mode: direct when the authenticator's status says it works (Success), else the proxy, waiting while it is
Pending; with --cluster or --all-clusters, the proxy.

With a JWTAuthenticator and no static token, the kubeconfig logs in with OIDC (sealion login oidc).

Contexts are named <server>/<cluster>: the address kubectl goes to (the proxy's, or the API server's on the direct
path), which keeps two hubs apart in merged kubeconfigs, then the cluster's name as --cluster and ssh take it; the
hub's own cluster goes by the concierge's ssh.hubName (default hub), and --cluster with that name is the hub's.

Examples:
  sealion get kubeconfig > me.kubeconfig                       # OIDC login with the only JWTAuthenticator
  sealion get kubeconfig --mode direct > me.kubeconfig         # the API server itself, or an error saying why not
  sealion get kubeconfig --mode proxy > me.kubeconfig          # the impersonation proxy even where direct works
  sealion get kubeconfig --static-token-env MY_TOKEN > me.kubeconfig
  sealion get kubeconfig --static-token-file ~/.config/my-token > me.kubeconfig   # chmod 600 my-token
  sealion get kubeconfig --cluster edge-1 > edge-1.kubeconfig     # through that cluster's agent
  sealion get kubeconfig --all-clusters --output-file me.kubeconfig   # every cluster; see sealion clusters
  sealion get kubeconfig -o json > me.kubeconfig.json             # the same kubeconfig, as JSON
  sealion get kubeconfig --kubeconfig admin.kubeconfig --context prod-admin --authenticator-name corp \\
    --static-token-env MY_TOKEN --exchange-credential --output-file me.kubeconfig`,
    )
    .action(async (flags: GetKubeconfigFlags) => {
      await runGetKubeconfig(flags, (line) => console.error(line));
    });
  return withResourceGet(get);
}
