// Who the impersonation proxy forwards requests as. In a cluster: TokenRequest tokens of a service account that may
// only impersonate, renewed long before they expire by a periodic controller the process's manager runs. Outside
// one: the identity a kubeconfig names.
import {
  clusterAccess,
  loadKubeConfig,
  requestServiceAccountToken,
  type KubeClients,
} from '../lib/kube/kube.ts';
import type { KubeconfigSource } from '../lib/kube/kube.ts';
import type { Clock } from '../lib/clock.ts';
import type { Controller } from '../lib/controller/controller.ts';
import { periodic } from '../lib/controller/periodic.ts';
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
  /** The token's renewal, for the process's controller manager to run; none for a kubeconfig's identity. */
  renewal?: Controller;
}

/** The name of the renewal's controller. */
export const FORWARDING_TOKEN_RENEWAL = 'forwarding-token';

/**
 * The API server `clients` talk to, reached as `identity`. With a service account, resolves once the first token
 * is in hand (a failure there fails the start: nothing can be forwarded without it); the renewals after are the
 * `renewal` controller's, which the manager runs once it starts.
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
    };
  }
  if (!namespace) throw new Error('forwarding as a service account needs the concierge namespace');
  const access = clusterAccess(clients.config);
  const tokens = serviceAccountTokens(clients, namespace, identity.serviceAccount, clock, log);
  await tokens.renew();
  return {
    upstream: {
      url: access.server,
      credentials: { ...(access.caPem ? { caPem: access.caPem } : {}), token: () => tokens.current() },
    },
    renewal: periodic(FORWARDING_TOKEN_RENEWAL, RETRY_MS, () => tokens.renewWhenDue()),
  };
}

/**
 * TokenRequest tokens of one service account: `renew()` gets one (and throws when it cannot); `renewWhenDue()` renews
 * once the current one is RENEW_AT through its life and returns how long until it should be asked again. A failed
 * renewal is logged and tried again in RETRY_MS, the current token serving until it expires.
 */
function serviceAccountTokens(
  clients: KubeClients,
  namespace: string,
  name: string,
  clock: Clock,
  log: Logger,
): { current(): string | undefined; renew(): Promise<void>; renewWhenDue(): Promise<number> } {
  const serviceAccount = `${namespace}/${name}`;
  let token: string | undefined;
  /** When the token in hand is due for renewal (the manager's resync may ask sooner: it is then not renewed). */
  let dueAt = 0;
  const renew = async (): Promise<void> => {
    const answer = await requestServiceAccountToken(clients, namespace, name, TOKEN_SECONDS);
    token = answer.token;
    dueAt = clock.now() + Math.max(RETRY_MS, (answer.expiresAt.getTime() - clock.now()) * RENEW_AT);
    log.info({ serviceAccount, expires: answer.expiresAt.toISOString() }, 'forwarding token renewed');
  };
  return {
    current: () => token,
    renew,
    async renewWhenDue() {
      if (clock.now() < dueAt) return dueAt - clock.now();
      try {
        await renew();
        return dueAt - clock.now();
      } catch (err) {
        log.error(
          { serviceAccount, err: (err as Error).message },
          'forwarding token renewal failed; retrying in 10 s',
        );
        return RETRY_MS;
      }
    },
  };
}
