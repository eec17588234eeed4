// Who the impersonation proxy forwards requests as. In a cluster: TokenRequest tokens of a service account that may
// only impersonate, renewed long before they expire. Outside one: the identity a kubeconfig names.
import {
  clusterAccess,
  loadKubeConfig,
  requestServiceAccountToken,
  type KubeClients,
} from '../lib/kube/kube.ts';
import type { KubeconfigSource } from '../lib/kube/kube.ts';
import type { Clock } from '../lib/clock.ts';
import type { Logger } from '../lib/log.ts';
import type { Upstream } from './proxy/hub-route.ts';

/** A kubeconfig's identity, or tokens of a service account in the concierge's namespace. */
export type ForwardingIdentity = { kubeconfig: KubeconfigSource } | { serviceAccount: string };

/** Forwarding tokens live an hour and are renewed at 80% of that, so a failed renewal has minutes to recover. */
const TOKEN_SECONDS = 3600;
const RENEW_AT = 0.8;
/** After a failed renewal, and the shortest wait between renewals. */
const RETRY_MS = 10_000;

export interface ForwardingUpstream {
  upstream: Upstream;
  stop(): void;
}

/**
 * The API server `clients` talk to, reached as `identity`. With a service account, resolves once the first token
 * is in hand and keeps renewing it until stopped.
 */
export async function forwardingUpstream(
  clients: KubeClients,
  identity: ForwardingIdentity,
  namespace: string,
  clock: Clock,
  log: Logger,
): Promise<ForwardingUpstream> {
  if ('kubeconfig' in identity) {
    const access = clusterAccess(loadKubeConfig(identity.kubeconfig));
    const token = access.token;
    return {
      upstream: {
        url: access.server,
        credentials: {
          ...(access.caPem ? { caPem: access.caPem } : {}),
          ...(access.certPem ? { certPem: access.certPem, keyPem: access.keyPem } : {}),
          ...(token ? { token: () => token } : {}),
        },
      },
      stop: () => {},
    };
  }
  if (!namespace) throw new Error('forwarding as a service account needs the concierge namespace');
  const serviceAccount = `${namespace}/${identity.serviceAccount}`;
  const access = clusterAccess(clients.config);
  let token: string | undefined;
  let timer: unknown;
  let stopped = false;
  const renew = async (): Promise<void> => {
    let next = RETRY_MS;
    try {
      const answer = await requestServiceAccountToken(
        clients,
        namespace,
        identity.serviceAccount,
        TOKEN_SECONDS,
      );
      token = answer.token;
      next = Math.max(RETRY_MS, (answer.expiresAt.getTime() - clock.now()) * RENEW_AT);
      log.info({ serviceAccount, expires: answer.expiresAt.toISOString() }, 'forwarding token renewed');
    } catch (err) {
      // The first token is awaited below; later failures keep the current token until it expires.
      if (token === undefined) throw err;
      log.error(
        { serviceAccount, err: (err as Error).message },
        'forwarding token renewal failed; retrying in 10 s',
      );
    }
    if (!stopped) timer = clock.setTimeout(() => void renew().catch(() => {}), next);
  };
  await renew();
  return {
    upstream: {
      url: access.server,
      credentials: { ...(access.caPem ? { caPem: access.caPem } : {}), token: () => token },
    },
    stop() {
      stopped = true;
      clock.clearTimeout(timer);
    },
  };
}
