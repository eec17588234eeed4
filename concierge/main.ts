// The concierge's composition root: reads flags and environment, builds the Kubernetes clients, the forwarding
// credentials and the TLS material, and starts everything. Nothing else in concierge/ reads process.env.
import { readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import {
  clusterAccess,
  loadKubeConfig,
  newKubeClients,
  requestServiceAccountToken,
  type KubeClients,
} from '../lib/kube.ts';
import { newLogger, type Logger } from '../lib/log.ts';
import { loadCA, type CertificateAuthority } from '../lib/pki.ts';
import { startConcierge } from './concierge.ts';
import type { UpstreamCredentials, Upstream } from './proxy/forward.ts';
import type { ProxyTLS } from './proxy/server.ts';

export interface ConciergeFlags {
  groupSuffix: string;
  /** host:port of the proxy. */
  listen: string;
  /** host:port of /metrics; empty: off. */
  metricsListen: string;
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
  /** The concierge's namespace (ConfigMap, Lease, the proxy's Service and Secrets); empty: POD_NAMESPACE. */
  namespace: string;
  /** The ConfigMap with config.yaml. */
  configMap: string;
  /** host:port of the agents' tunnel listener; empty: off. */
  tunnelListen: string;
  /** Names and addresses agents dial the tunnel listener at, beyond its Service's (its certificate's SANs). */
  tunnelHosts: string[];
  logLevel: string;
}

/** The Service in front of the tunnel listener (see the install manifests). */
const TUNNEL_SERVICE = 'sealion-concierge-tunnel';
/** Forwarding tokens live an hour and are renewed at 80% of that, so a failed renewal has minutes to recover. */
const FORWARDING_TOKEN_SECONDS = 3600;
const FORWARDING_TOKEN_RENEW_AT = 0.8;
/** How often TLS files are checked for changes (certificates rotate on the scale of hours). */
const TLS_FILE_POLL_MS = 10_000;

function hostPort(value: string): { host: string; port: number } {
  const i = value.lastIndexOf(':');
  const port = Number(value.slice(i + 1));
  if (i < 0 || !Number.isInteger(port) || port < 0 || port > 65535)
    throw new Error(`${JSON.stringify(value)} is not host:port`);
  return { host: value.slice(0, i).replace(/^\[|\]$/g, '') || '0.0.0.0', port };
}

/** Keeps a TokenRequest token for the forwarding service account fresh. */
function forwardingTokens(
  clients: KubeClients,
  namespace: string,
  serviceAccount: string,
  log: Logger,
): { token: () => string | undefined; ready: Promise<void>; stop: () => void } {
  let token: string | undefined;
  let timer: NodeJS.Timeout | undefined;
  const renew = async (): Promise<void> => {
    try {
      const answer = await requestServiceAccountToken(
        clients,
        namespace,
        serviceAccount,
        FORWARDING_TOKEN_SECONDS,
      );
      token = answer.token;
      const lifetime = answer.expiresAt.getTime() - Date.now();
      timer = setTimeout(() => void renew(), Math.max(10_000, lifetime * FORWARDING_TOKEN_RENEW_AT));
      log.info(
        { serviceAccount: `${namespace}/${serviceAccount}`, expires: answer.expiresAt.toISOString() },
        'forwarding token renewed',
      );
    } catch (err) {
      log.error({ err: (err as Error).message }, 'forwarding token renewal failed; retrying in 10 s');
      timer = setTimeout(() => void renew(), 10_000);
    }
  };
  return { token: () => token, ready: renew(), stop: () => clearTimeout(timer) };
}

/** Fixed TLS material from files, for running without the controllers' certificates. */
async function loadTLS(flags: ConciergeFlags): Promise<{ tls: ProxyTLS; signer: CertificateAuthority }> {
  const signer = await loadCA(
    readFileSync(flags.signerCertFile, 'utf8'),
    readFileSync(flags.signerKeyFile, 'utf8'),
  );
  return {
    signer,
    tls: {
      certPem: readFileSync(flags.tlsCertFile, 'utf8'),
      keyPem: readFileSync(flags.tlsKeyFile, 'utf8'),
      clientCAPems: [signer.certPem, ...flags.clientCAFiles.map((f) => readFileSync(f, 'utf8'))],
    },
  };
}

export async function runConcierge(flags: ConciergeFlags): Promise<() => Promise<void>> {
  const log = newLogger({ level: flags.logLevel, buffered: true });
  const source = flags.kubeconfig ? { path: flags.kubeconfig } : { inCluster: true as const };
  const clients = newKubeClients(source);
  const stops: (() => void)[] = [];
  const namespace = flags.namespace || process.env['POD_NAMESPACE'] || '';
  let credentials: UpstreamCredentials;
  let server: URL;
  if (flags.upstreamKubeconfig) {
    const access = clusterAccess(loadKubeConfig({ path: flags.upstreamKubeconfig }));
    server = access.server;
    credentials = {
      ...(access.caPem ? { caPem: access.caPem } : {}),
      ...(access.certPem ? { certPem: access.certPem, keyPem: access.keyPem } : {}),
      ...(access.token ? { token: () => access.token } : {}),
    };
  } else {
    if (!namespace)
      throw new Error(
        'POD_NAMESPACE is not set; in a cluster the Deployment sets it, elsewhere pass --upstream-kubeconfig',
      );
    const access = clusterAccess(clients.config);
    server = access.server;
    const tokens = forwardingTokens(clients, namespace, flags.impersonatorServiceAccount, log);
    await tokens.ready;
    stops.push(tokens.stop);
    credentials = { ...(access.caPem ? { caPem: access.caPem } : {}), token: tokens.token };
  }
  const upstream: Upstream = { url: server, credentials };
  const fixedTLS = Boolean(flags.tlsCertFile);
  if (flags.tunnelListen && !namespace)
    throw new Error(
      'the tunnel listener needs a namespace for its CA: pass --namespace or set POD_NAMESPACE',
    );
  const identity = process.env['POD_NAME'] || `${hostname()}-${process.pid}`;
  if (fixedTLS && !(flags.tlsKeyFile && flags.signerCertFile && flags.signerKeyFile))
    throw new Error('--tls-cert-file needs --tls-key-file, --signer-cert-file and --signer-key-file');
  if (!fixedTLS && !namespace)
    throw new Error('the controllers need a namespace: pass --namespace or set POD_NAMESPACE');
  const listen = hostPort(flags.listen);
  const concierge = await startConcierge({
    clients,
    upstream,
    groupSuffix: flags.groupSuffix,
    host: listen.host,
    port: listen.port,
    ...(fixedTLS
      ? await loadTLS(flags)
      : {
          control: {
            namespace,
            configMap: flags.configMap,
            // The pod name in a cluster; elsewhere unique enough among replicas on one network.
            identity,
          },
        }),
    ...(flags.metricsListen ? { metrics: hostPort(flags.metricsListen) } : {}),
    ...(flags.tunnelListen
      ? {
          tunnel: {
            ...hostPort(flags.tunnelListen),
            // The tunnel Service's names answer inside the cluster; a load balancer's come from the flag.
            hosts: [
              ...flags.tunnelHosts,
              `${TUNNEL_SERVICE}.${namespace}.svc`,
              `${TUNNEL_SERVICE}.${namespace}.svc.cluster.local`,
              'localhost',
              '127.0.0.1',
            ],
            namespace,
            replica: identity,
          },
        }
      : {}),
    log,
  });
  if (fixedTLS) {
    log.warn('serving fixed TLS files: the controllers do not manage the impersonation proxy');
    // Certificates rotate underneath us (a mounted Secret, cert-manager): pick up changes without a restart.
    // Compare the files' bytes first: parsing certificates and importing the signer key every 10 s is wasted work.
    const files = [
      flags.tlsCertFile,
      flags.tlsKeyFile,
      flags.signerCertFile,
      flags.signerKeyFile,
      ...flags.clientCAFiles,
    ];
    const snapshot = (): string => files.map((f) => readFileSync(f, 'utf8')).join('\0');
    let last = snapshot();
    const poll = setInterval(() => {
      let current: string;
      try {
        current = snapshot();
      } catch (err) {
        return log.error(
          { err: (err as Error).message },
          'reading TLS files failed; keeping the current ones',
        );
      }
      if (current === last) return;
      loadTLS(flags).then(
        (next) => {
          last = current;
          concierge.updateTLS(next.tls, next.signer);
        },
        (err: unknown) =>
          log.error({ err: (err as Error).message }, 'reloading TLS files failed; keeping the current ones'),
      );
    }, TLS_FILE_POLL_MS);
    stops.push(() => clearInterval(poll));
  }
  return async () => {
    for (const stop of stops) stop();
    await concierge.stop();
  };
}
