// Turns the concierge's flags and environment into its options (concierge.ts builds and runs everything from
// them). Nothing else in concierge/ reads process.env.
import { TUNNEL_SERVICE } from '../apis/install.ts';
import { hostname } from 'node:os';
import { newConcierge, type ConciergeOptions } from './concierge.ts';
import { existsSync, readFileSync } from 'node:fs';
import { newLogger, type Logger } from '../lib/log.ts';
import { handleProcessErrors } from '../lib/process-errors.ts';
import type { Running } from '../lib/lifecycle.ts';
import { loadPolicy } from './audit/policy.ts';

export interface ConciergeFlags {
  groupSuffix: string;
  /** host:port of the proxy. */
  listen: string;
  /** host:port of /metrics; empty: off. */
  metricsListen: string;
  aggregatedApiListen: string;
  /** host:port of the SSH door (when the config turns it on); empty: no door. */
  sshListen: string;
  aggregatedApiService: string;
  /** Kubeconfig of the concierge's own identity; empty: in-cluster. */
  kubeconfig: string;
  /** Kubeconfig of the forwarding identity; empty: TokenRequest tokens for impersonatorServiceAccount. */
  upstreamKubeconfig: string;
  impersonatorServiceAccount: string;
  tlsCertFile: string;
  tlsKeyFile: string;
  clientCAFiles: string[];
  signerCertFile: string;
  signerKeyFile: string;
  /** The concierge's namespace (ConfigMap, Leases, the proxy's Service and Secrets); empty: POD_NAMESPACE. */
  namespace: string;
  /** The ConfigMap with config.yaml. */
  configMap: string;
  /** host:port of the agents' tunnel listener; empty: off. */
  tunnelListen: string;
  /** Names and addresses agents dial the tunnel listener at, beyond its Service's (its certificate's SANs). */
  tunnelHosts: string[];
  /** host:port of the peer listener (with the tunnel listener only); empty: off. */
  peerListen: string;
  /** The host other replicas dial the peer listener at; empty: POD_IP, else the listen host. */
  peerAdvertise: string;
  logLevel: string;
  /** The audit Policy file; empty, or a file that is not there: no audit. */
  auditPolicyFile: string;
  /** Where the audit log goes: a file, '-' for standard output; empty: none. */
  auditLogPath: string;
  auditLogMaxsize: string;
  auditLogMaxbackup: string;
  auditLogMaxage: string;
  /** A kubeconfig-format file naming the audit webhook; empty: none. */
  auditWebhookConfigFile: string;
  auditMode: string;
  /** Whether operational log lines name users (audit events always do). */
  logUsernames: boolean;
  /** Where exec and attach sessions are recorded; empty: not recorded. */
  recordingsDir: string;
  recordingStdin: boolean;
  recordingRequired: boolean;
  recordingMaxSize: string;
  /** A kubeconfig-format file naming where finished recordings are also sent; empty: nowhere. */
  recordingWebhookConfigFile: string;
  /** A kubeconfig-format file naming where each access request's change is sent; empty: nowhere. */
  accessWebhookConfigFile: string;
  /** Seconds the replica serves on after SIGTERM with readiness off (concierge/drain.ts). */
  shutdownDelay: string;
  /** Seconds long sessions may go on once the replica stops taking connections, before each is closed. */
  shutdownGrace: string;
}

export function count(flag: string, value: string): number {
  // Number('') is 0: an empty value is refused, not taken for zero.
  const n = value.trim() === '' ? NaN : Number(value);
  if (!Number.isInteger(n) || n < 0)
    throw new Error(`--${flag}: ${JSON.stringify(value)} is not a whole number`);
  return n;
}

/**
 * The audit options from the flags. The install mounts the policy from an optional ConfigMap, so a missing file means
 * audit is off (said in the log); a file that is there but wrong stops the start: an admin who wrote a policy wants it.
 */
function auditOptions(flags: ConciergeFlags, log: Logger): ConciergeOptions['audit'] {
  if (!flags.auditPolicyFile) return undefined;
  if (!existsSync(flags.auditPolicyFile)) {
    log.warn({ file: flags.auditPolicyFile }, 'no audit policy file: audit is off');
    return undefined;
  }
  if (flags.auditMode !== 'batch' && flags.auditMode !== 'blocking')
    throw new Error(`--audit-mode: must be batch or blocking, not ${JSON.stringify(flags.auditMode)}`);
  return {
    policy: loadPolicy(readFileSync(flags.auditPolicyFile, 'utf8')),
    mode: flags.auditMode,
    ...(flags.auditLogPath
      ? {
          log: {
            path: flags.auditLogPath,
            maxSizeMiB: count('audit-log-maxsize', flags.auditLogMaxsize),
            maxBackups: count('audit-log-maxbackup', flags.auditLogMaxbackup),
            maxAgeDays: count('audit-log-maxage', flags.auditLogMaxage),
          },
        }
      : {}),
    ...(flags.auditWebhookConfigFile ? { webhook: { kubeconfigPath: flags.auditWebhookConfigFile } } : {}),
  };
}

function hostPort(value: string): { host: string; port: number } {
  const i = value.lastIndexOf(':');
  const port = Number(value.slice(i + 1));
  if (i < 0 || !Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`${JSON.stringify(value)} is not host:port`);
  return { host: value.slice(0, i).replace(/^\[|\]$/g, '') || '0.0.0.0', port };
}

function peerOptions(flags: ConciergeFlags, env: NodeJS.ProcessEnv): ConciergeOptions['peer'] {
  const listen = hostPort(flags.peerListen);
  const advertise = flags.peerAdvertise || env['POD_IP'] || listen.host;
  if (advertise === '0.0.0.0' || advertise === '::')
    throw new Error(
      'the peer listener needs an address replicas can dial: set POD_IP or pass --peer-advertise',
    );
  return { ...listen, advertise };
}

export function conciergeOptions(flags: ConciergeFlags, env: NodeJS.ProcessEnv): ConciergeOptions {
  const namespace = flags.namespace || env['POD_NAMESPACE'] || '';
  if (!flags.upstreamKubeconfig && !namespace)
    throw new Error(
      'POD_NAMESPACE is not set; in a cluster the Deployment sets it, elsewhere pass --upstream-kubeconfig',
    );
  if (flags.tlsCertFile && !(flags.tlsKeyFile && flags.signerCertFile && flags.signerKeyFile))
    throw new Error('--tls-cert-file needs --tls-key-file, --signer-cert-file and --signer-key-file');
  if (!flags.tlsCertFile && !namespace)
    throw new Error('the controllers need a namespace: pass --namespace or set POD_NAMESPACE');
  if (flags.tunnelListen && !namespace)
    throw new Error(
      'the tunnel listener needs a namespace for its CA: pass --namespace or set POD_NAMESPACE',
    );
  // Audit events on standard output take it for themselves: the log goes to standard error then. Two writers of one
  // pipe interleave what they write past the pipe's atomic size, which would break lines of both.
  const auditToStdout =
    flags.auditLogPath === '-' && !!flags.auditPolicyFile && existsSync(flags.auditPolicyFile);
  const log = newLogger({ level: flags.logLevel, buffered: true, ...(auditToStdout ? { fd: 2 } : {}) });
  const audit = auditOptions(flags, log);
  return {
    kubeconfig: flags.kubeconfig ? { path: flags.kubeconfig } : { inCluster: true },
    forwardAs: flags.upstreamKubeconfig
      ? { kubeconfig: { path: flags.upstreamKubeconfig } }
      : { serviceAccount: flags.impersonatorServiceAccount },
    groupSuffix: flags.groupSuffix,
    namespace,
    // The pod name in a cluster; elsewhere unique enough among replicas on one network.
    identity: env['POD_NAME'] || `${hostname()}-${process.pid}`,
    proxy: hostPort(flags.listen),
    ...(flags.tlsCertFile
      ? {
          tlsFiles: {
            certFile: flags.tlsCertFile,
            keyFile: flags.tlsKeyFile,
            signerCertFile: flags.signerCertFile,
            signerKeyFile: flags.signerKeyFile,
            clientCAFiles: flags.clientCAFiles,
          },
        }
      : {}),
    configMap: flags.configMap,
    ...(flags.tunnelListen
      ? {
          tunnel: {
            ...hostPort(flags.tunnelListen),
            // The tunnel Service's names answer inside the cluster; its load balancer's addresses are added as
            // they come, and other names (an Ingress's) come from the flag.
            service: TUNNEL_SERVICE,
            hosts: [
              ...flags.tunnelHosts,
              `${TUNNEL_SERVICE}.${namespace}.svc`,
              `${TUNNEL_SERVICE}.${namespace}.svc.cluster.local`,
              'localhost',
              '127.0.0.1',
            ],
          },
        }
      : {}),
    ...(flags.tunnelListen && flags.peerListen ? { peer: peerOptions(flags, env) } : {}),
    ...(flags.metricsListen ? { metrics: hostPort(flags.metricsListen) } : {}),
    ...(flags.sshListen && !flags.tlsCertFile ? { ssh: hostPort(flags.sshListen) } : {}),
    ...(flags.aggregatedApiListen && !flags.tlsCertFile
      ? { aggregatedApi: { ...hostPort(flags.aggregatedApiListen), service: flags.aggregatedApiService } }
      : {}),
    ...(audit ? { audit } : {}),
    ...(flags.recordingsDir
      ? {
          recording: {
            dir: flags.recordingsDir,
            stdin: flags.recordingStdin,
            required: flags.recordingRequired,
            maxBytes: count('recording-max-size', flags.recordingMaxSize) * 1024 * 1024,
            ...(flags.recordingWebhookConfigFile
              ? { webhookConfigFile: flags.recordingWebhookConfigFile }
              : {}),
          },
        }
      : {}),
    ...(flags.accessWebhookConfigFile ? { accessWebhookConfigFile: flags.accessWebhookConfigFile } : {}),
    logUsernames: flags.logUsernames,
    drain: {
      delayMs: count('shutdown-delay', flags.shutdownDelay) * 1000,
      graceMs: count('shutdown-grace', flags.shutdownGrace) * 1000,
    },
    log,
  };
}

/** How a running concierge is ended: drained (SIGTERM) or stopped at once. */
export type RunningConcierge = Running;

/**
 * Runs the concierge as the process's one occupant (`sealion concierge`): errors nothing handled are this process's
 * to log and count (lib/process-errors.ts says what it does with each), from before anything starts. Returns what
 * drains and stops it.
 */
export async function runConcierge(flags: ConciergeFlags, env: NodeJS.ProcessEnv): Promise<RunningConcierge> {
  const options = conciergeOptions(flags, env);
  handleProcessErrors({ log: options.log });
  const concierge = newConcierge(options);
  await concierge.start();
  // The log is buffered: what the drain and the stop wrote (`drained` among it) is written out before the exit.
  const flushed = (): Promise<void> => new Promise((done) => options.log.flush(() => done()));
  return {
    drain: () => concierge.drain().then(flushed),
    stop: () => concierge.stop().then(flushed),
  };
}
