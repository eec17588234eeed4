// `sealion version`: what this CLI is (its version, the commit it was built from, the Node it runs on), and, as
// `kubectl version` does, what it talks to: the API server of the kubeconfig's context, the versions the concierge's
// live replicas run, and each agent's. Every part is asked on its own with a short deadline: one that is forbidden,
// absent or unreachable is reported as unknown, with why, and the rest still prints.
//
// The concierge and the agents are asked of the hub: for a context through the proxy to an agent-backed cluster
// (…/clusters/<name>), the proxy's own address without that suffix, with the same credentials. The API server's
// version is the context's own cluster's, as kubectl's is.
import { fileURLToPath } from 'node:url';
import { isSea } from 'node:sea';
import { Command } from 'commander';
import { withKubeconfig } from './options.ts';
import { apiGroups, DEFAULT_GROUP_SUFFIX, Resource, VERSION } from '../apis/groups.ts';
import {
  CONCIERGE_VERSIONS_CONFIG_MAP,
  CONCIERGE_VERSIONS_KEY,
  CONCIERGE_VERSIONS_OBSERVED_KEY,
  DEFAULT_NAMESPACE,
  type ConciergeVersion,
} from '../apis/install.ts';
import { AGENT_PROTOCOL_CONDITION, type Cluster } from '../apis/tunnel.ts';
import { closeHttpsPools, HttpsError, httpsText } from '../lib/https-client.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { statusMessageOf } from '../lib/kube/status.ts';
import {
  CURRENT_PROTOCOL,
  formatProtocol,
  parseProtocol,
  supportedRange,
  withinSkew,
} from '../lib/tunnel/protocol.ts';
import { describeCheckout, embeddedBuild, SEALION_VERSION } from '../lib/version.ts';
import { AlreadySaid, errorLine, oneLine, systemReason, UserError } from './errors.ts';
import { printable, printableJSON } from './printable.ts';
import { kubeconfigAccess, loadKubeconfig, loginFirst, printableDeep, requestError } from './whoami.ts';

/** What this CLI is. */
export interface ClientVersion {
  /** package.json's version. */
  version: string;
  /** The commit it was built from; absent when that cannot be known. */
  gitCommit?: string;
  /** `dirty`: built from changes not committed; `unknown`: no commit known. */
  gitTreeState: 'clean' | 'dirty' | 'unknown';
  nodeVersion: string;
  /** os/arch, as Node names them (linux/x64). */
  platform: string;
  /** Whether it runs as a standalone executable (a Node single executable application). */
  standalone: boolean;
  /**
   * The tunnel protocol this release's agent and concierge speak, and the protocols they talk to (the skew policy,
   * lib/tunnel/protocol.ts): `2.1 (2.0 to 2.2)`.
   */
  tunnelProtocol: string;
}

/** An agent as its Cluster's status says. */
export interface AgentVersion {
  /** '' when the agent never said (it has not connected yet). */
  version: string;
  connected: boolean;
  /**
   * Why the concierge refused the agent for its tunnel protocol, outside the skew policy (its Cluster's
   * AgentProtocolSupported condition is False); absent while the agent is within it.
   */
  protocolRefused?: string;
}

/** What `sealion version` found; a part that could not be read is absent, and `errors` says why. */
export interface VersionReport {
  clientVersion: ClientVersion;
  /** The API server's /version, as it answered (gitVersion, major, minor, …). */
  serverVersion?: Record<string, unknown>;
  /** The versions the concierge's live replicas run, and how many run each. */
  conciergeVersions?: ConciergeVersion[];
  /** When the concierge's leader last confirmed conciergeVersions (RFC 3339). */
  conciergeVersionsObservedAt?: string;
  /** Each agent-backed cluster's agent, by cluster name. */
  agents?: Record<string, AgentVersion>;
  /**
   * Where this CLI's release and the concierge's are outside the tunnel protocol's skew policy: the agents this CLI
   * installs (`sealion cluster add`, `sealion manifests`) run its release, and such a concierge would refuse them.
   * Absent when there is none.
   */
  skew?: string[];
  /** Why a part is absent: serverVersion, conciergeVersions or agents. */
  errors?: Partial<Record<'serverVersion' | 'conciergeVersions' | 'agents', string>>;
}

/** Each request's deadline: a version must not hang on a server that does not answer. */
const REQUEST_TIMEOUT_MS = 5_000;
/** The Cluster list's size limit: a hub with thousands of clusters answers a few MiB. */
const CLUSTER_LIST_MAX_BYTES = 16 * 1024 * 1024;
/**
 * How old a confirmation of the concierge's versions may be before they are called stale: the leader confirms them
 * every minute (controllers/concierge-versions.ts), and the time is the leader's clock against this machine's, so
 * there is room for a few minutes of skew.
 */
export const STALE_AFTER_MS = 5 * 60_000;

/**
 * This CLI's version. A bundle knows its commit from when it was built; run from the checkout, git is asked (here
 * only: `sealion login` never pays for it).
 */
export async function clientVersion(): Promise<ClientVersion> {
  const embedded = embeddedBuild();
  const build =
    embedded === undefined ? await describeCheckout(fileURLToPath(new URL('..', import.meta.url))) : embedded;
  return {
    version: SEALION_VERSION,
    ...(build ? { gitCommit: build.commit } : {}),
    gitTreeState: build?.treeState ?? 'unknown',
    nodeVersion: process.version,
    platform: `${process.platform}/${process.arch}`,
    standalone: isSea(),
    tunnelProtocol: `${formatProtocol(CURRENT_PROTOCOL)} (${supportedRange(CURRENT_PROTOCOL)})`,
  };
}

/** Why a request failed, in a few words and the server's own (made printable). */
export function failureText(err: unknown): string {
  if (err instanceof HttpsError) {
    const said = statusMessageOf(err.body);
    const detail = said === undefined ? '' : `: ${printable(said)}`;
    if (err.code === 'BadStatus') {
      const what =
        err.status === 401
          ? 'unauthorized'
          : err.status === 403
            ? 'forbidden'
            : err.status === 404
              ? 'not found'
              : err.status === 503
                ? 'unavailable'
                : `HTTP ${err.status}`;
      return `${what}${detail}`;
    }
    if (err.code === 'Timeout') return 'no answer in time';
    if (err.code === 'Network') return `unreachable: ${systemReason(err) ?? printable(oneLine(err))}`;
  }
  return printable(err instanceof Error ? err.message : String(err));
}

/** The proxy's own address for a context that reaches an agent-backed cluster through it; else `base` itself. */
export function hubBase(base: string): string {
  const url = new URL(base);
  url.pathname = url.pathname.replace(/\/clusters\/[^/]+\/?$/, '/');
  return url.toString();
}

/** The concierge's published versions, from its ConfigMap as the API server returns it. */
export function parseConciergeVersions(configMap: unknown): {
  versions: ConciergeVersion[];
  observedAt?: string;
} {
  const data = (configMap as { data?: Record<string, unknown> } | null)?.data ?? {};
  const text = data[CONCIERGE_VERSIONS_KEY];
  if (typeof text !== 'string')
    throw new Error('not published yet (the concierge may be older than versions)');
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new Error('the published versions are not JSON');
  }
  const valid =
    Array.isArray(parsed) &&
    parsed.every(
      (v: { version?: unknown; replicas?: unknown } | null) =>
        typeof v?.version === 'string' && Number.isInteger(v.replicas),
    );
  if (!valid) throw new Error('the published versions are not a list of versions and counts');
  const observedAt = data[CONCIERGE_VERSIONS_OBSERVED_KEY];
  return {
    versions: (parsed as ConciergeVersion[]).map(({ version, replicas, tunnelProtocol }) => ({
      version,
      replicas,
      ...(typeof tunnelProtocol === 'string' ? { tunnelProtocol } : {}),
    })),
    ...(typeof observedAt === 'string' ? { observedAt } : {}),
  };
}

/**
 * Why agents of this CLI's release (tunnel protocol `ours`) would be refused by concierge replicas that run
 * `versions`, one line for each version outside the policy; replicas that state no protocol are not judged.
 */
export function skewWarnings(versions: readonly ConciergeVersion[], ours = CURRENT_PROTOCOL): string[] {
  const warnings: string[] = [];
  for (const v of versions) {
    const hub = parseProtocol(v.tunnelProtocol);
    if (!hub || withinSkew(hub, ours)) continue;
    const upgrade = hub.major < ours.major || (hub.major === ours.major && hub.minor < ours.minor);
    warnings.push(
      `this CLI's release speaks tunnel protocol ${formatProtocol(ours)} and concierge ${printable(v.version) || 'unreported'} ` +
        `serves agents of ${supportedRange(hub)}: agents this CLI installs would be refused; ` +
        (upgrade ? 'upgrade the concierge first' : "use a CLI of the concierge's release"),
    );
  }
  return warnings;
}

/** Each agent's version and whether it is connected, from a Cluster list. */
export function parseAgents(list: unknown): Record<string, AgentVersion> {
  const items = (list as { items?: unknown } | null)?.items;
  if (!Array.isArray(items)) throw new Error('the answer is not a list of clusters');
  const agents: Record<string, AgentVersion> = {};
  for (const cluster of items as Partial<Cluster>[]) {
    const name = cluster.metadata?.name;
    if (typeof name !== 'string') continue;
    const conditions = Array.isArray(cluster.status?.conditions) ? cluster.status.conditions : [];
    const refused = conditions.find((c) => c?.type === AGENT_PROTOCOL_CONDITION && c.status === 'False');
    agents[name] = {
      version: typeof cluster.status?.agentVersion === 'string' ? cluster.status.agentVersion : '',
      connected: cluster.status?.connected === true,
      ...(refused ? { protocolRefused: typeof refused.message === 'string' ? refused.message : '' } : {}),
    };
  }
  return agents;
}

export interface VersionFlags {
  kubeconfig: string;
  context: string;
  groupSuffix: string;
  conciergeNamespace: string;
  output: 'text' | 'json' | 'yaml';
  client: boolean;
}

/**
 * What the kubeconfig's context says of the servers; each part that cannot be read goes into `errors`. `failure` is
 * the one line to print when the server itself could not be asked (the kubeconfig, the login, the connection) or did
 * not say its version: kubectl version then exits non-zero too.
 */
export async function serverVersions(
  flags: VersionFlags,
): Promise<{ report: Omit<VersionReport, 'clientVersion'>; failure?: UserError }> {
  let config: KubeConfig;
  let access: Awaited<ReturnType<typeof kubeconfigAccess>>;
  try {
    config = await loadKubeconfig(flags);
    // A login the plugin needs shows its prompt; one that fails is reported by the credentials' own error, next,
    // unless the plugin said why already (sealion's own login does).
    await loginFirst(config).catch((err: unknown) => {
      if (err instanceof AlreadySaid) throw err;
    });
    access = await kubeconfigAccess(config);
  } catch (err) {
    const failure = err instanceof UserError ? err : new UserError(errorLine(err), { cause: err });
    const why = errorLine(failure);
    return { report: { errors: { serverVersion: why, conciergeVersions: why, agents: why } }, failure };
  }
  const get = async (url: URL, maxBytes?: number): Promise<unknown> => {
    const { text } = await httpsText(
      url.toString(),
      {
        method: 'GET',
        timeoutMs: REQUEST_TIMEOUT_MS,
        ...(maxBytes ? { maxBytes } : {}),
        ...(access.caPem ? { caBundlePem: access.caPem } : {}),
        ...(access.clientCert ? { clientCert: access.clientCert } : {}),
        headers: access.headers,
      },
      'application/json',
    );
    return JSON.parse(text) as unknown;
  };
  const hub = hubBase(access.base);
  const ns = encodeURIComponent(flags.conciergeNamespace);
  const [server, concierge, clusters] = await Promise.allSettled([
    get(new URL('version', access.base)),
    get(new URL(`api/v1/namespaces/${ns}/configmaps/${CONCIERGE_VERSIONS_CONFIG_MAP}`, hub)).then(
      parseConciergeVersions,
    ),
    get(
      new URL(`apis/${apiGroups(flags.groupSuffix).tunnel}/${VERSION}/${Resource.Cluster}`, hub),
      CLUSTER_LIST_MAX_BYTES,
    ).then(parseAgents),
  ]);
  const errors: NonNullable<VersionReport['errors']> = {};
  const report: Omit<VersionReport, 'clientVersion'> = {};
  let failure: UserError | undefined;
  if (server.status === 'fulfilled' && typeof server.value === 'object' && server.value !== null)
    report.serverVersion = server.value as Record<string, unknown>;
  else {
    errors.serverVersion =
      server.status === 'rejected' ? failureText(server.reason) : 'the answer is not a version';
    failure =
      server.status === 'rejected'
        ? await requestError(server.reason, config, 'cannot read the server version')
        : new UserError(
            `cannot read the server version on ${hubBase(access.base)}: the answer is not a version; is the kubeconfig's server a Kubernetes API server?`,
          );
  }
  if (concierge.status === 'fulfilled') {
    report.conciergeVersions = concierge.value.versions;
    const skew = skewWarnings(concierge.value.versions);
    if (skew.length > 0) report.skew = skew;
    if (concierge.value.observedAt) report.conciergeVersionsObservedAt = concierge.value.observedAt;
  } else errors.conciergeVersions = failureText(concierge.reason);
  if (clusters.status === 'fulfilled') report.agents = clusters.value;
  else errors.agents = failureText(clusters.reason);
  return {
    report: Object.keys(errors).length > 0 ? { ...report, errors } : report,
    ...(failure ? { failure } : {}),
  };
}

/** "2 replicas", "1 replica". */
const replicasText = (n: number): string => `${n} ${n === 1 ? 'replica' : 'replicas'}`;

/** A duration in the largest whole unit, as kubectl prints ages. */
function ageText(ms: number): string {
  const s = Math.floor(ms / 1000);
  if (s < 120) return `${s}s`;
  if (s < 2 * 3600) return `${Math.floor(s / 60)}m`;
  if (s < 2 * 86400) return `${Math.floor(s / 3600)}h`;
  return `${Math.floor(s / 86400)}d`;
}

/**
 * The human text, kubectl's `Client Version: …` lines and Sealion's own. Every server string is made printable;
 * `now` judges how old the concierge's confirmation is.
 */
export function versionText(report: VersionReport, now = Date.now()): string {
  const p = (text: string): string => printable(text);
  const c = report.clientVersion;
  const lines = [
    `Client Version: ${c.version}`,
    `Client Build: ${c.gitCommit ? `${c.gitCommit}${c.gitTreeState === 'dirty' ? ' (dirty)' : ''}` : 'unknown'}`,
    `Node Version: ${c.nodeVersion}`,
    `Platform: ${c.platform}${c.standalone ? ' (standalone executable)' : ''}`,
    `Tunnel Protocol: ${p(c.tunnelProtocol)}`,
  ];
  const errors = report.errors ?? {};
  const unknown = (why: string | undefined): string => `unknown${why ? ` (${why})` : ''}`;
  // The server parts only when they were asked for (not with --client).
  if (!('serverVersion' in report) && !('serverVersion' in errors)) return `${lines.join('\n')}\n`;

  // With no server version the command fails, saying why once on standard error: a part unknown for that same
  // reason is left out here rather than said again.
  const serverFailed = !report.serverVersion;
  const repeats = (why: string | undefined): boolean => serverFailed && why === errors.serverVersion;
  const gitVersion = report.serverVersion?.['gitVersion'];
  if (!serverFailed)
    lines.push(`Server Version: ${typeof gitVersion === 'string' ? p(gitVersion) : unknown(undefined)}`);

  if (report.conciergeVersions) {
    const versions = report.conciergeVersions
      .map(
        (v) =>
          `${v.version ? p(v.version) : 'unreported'} (${replicasText(v.replicas)}${
            v.tunnelProtocol ? `, tunnel protocol ${p(v.tunnelProtocol)}` : ''
          })`,
      )
      .join(', ');
    const observed = Date.parse(report.conciergeVersionsObservedAt ?? '');
    const stale = Number.isNaN(observed) || now - observed > STALE_AFTER_MS;
    lines.push(
      `Concierge Version: ${versions || 'none running'}${
        stale
          ? Number.isNaN(observed)
            ? ' (not confirmed: the concierge may not be running)'
            : ` (not confirmed for ${ageText(now - observed)}: the concierge may not be running)`
          : ''
      }`,
    );
  } else if (!repeats(errors.conciergeVersions))
    lines.push(`Concierge Version: ${unknown(errors.conciergeVersions)}`);

  if (report.agents) {
    const names = Object.keys(report.agents).sort();
    if (names.length === 0) lines.push('Agent Versions: none (no agent-backed clusters)');
    else {
      lines.push('Agent Versions:');
      for (const name of names) {
        const agent = report.agents[name]!;
        const refused =
          agent.protocolRefused === undefined
            ? ''
            : ` (refused, outside the tunnel protocol's skew policy: ${p(agent.protocolRefused)})`;
        lines.push(
          `  ${p(name)}: ${agent.version ? p(agent.version) : 'unknown'}${agent.connected ? '' : ' (not connected)'}${refused}`,
        );
      }
    }
  } else if (!repeats(errors.agents)) lines.push(`Agent Versions: ${unknown(errors.agents)}`);
  for (const warning of report.skew ?? []) lines.push(`Warning: ${p(warning)}`);
  return `${lines.join('\n')}\n`;
}

export async function versionOutput(report: VersionReport, output: VersionFlags['output']): Promise<string> {
  if (output === 'json') return `${printableJSON(report)}\n`;
  if (output === 'yaml') return (await import('yaml')).stringify(printableDeep(report));
  return versionText(report);
}

export function versionCommand(): Command {
  return withKubeconfig(
    new Command('version').description(
      'show the versions of this CLI, the API server, the concierge and the agents',
    ),
  )
    .option('--client', 'show the CLI alone, asking no server', false)
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .option('--concierge-namespace <name>', "the concierge's namespace", DEFAULT_NAMESPACE)
    .option('-o, --output <format>', 'text, json or yaml', 'text')
    .addHelpText(
      'after',
      `
Like kubectl version, with the concierge's live replicas (two versions while a rolling upgrade runs) and each
agent. A part that cannot be read (forbidden, absent, no answer within a few seconds) shows as unknown, with why.
For a context through the proxy to an agent-backed cluster, the server is that cluster's; the concierge and the
agents are asked of the proxy.

Examples:
  sealion version
  sealion version --client -o json
  sealion --version                       # the CLI's version alone`,
    )
    .action(async (flags: VersionFlags) => {
      if (!['text', 'json', 'yaml'].includes(flags.output))
        throw new Error(`--output: must be text, json or yaml, not ${JSON.stringify(flags.output)}`);
      const [client, servers]: [ClientVersion, Awaited<ReturnType<typeof serverVersions>>] =
        await Promise.all([
          clientVersion(),
          flags.client ? Promise.resolve({ report: {} }) : serverVersions(flags),
        ]);
      await closeHttpsPools();
      process.stdout.write(await versionOutput({ clientVersion: client, ...servers.report }, flags.output));
      // As kubectl version: the client's part is printed, and the command fails when the server's could not be read.
      if (servers.failure) throw servers.failure;
    });
}
