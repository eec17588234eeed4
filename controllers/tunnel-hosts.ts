// The tunnel listener's certificate names the hosts agents dial: those configured, and the addresses a load balancer
// gives the tunnel's Service, which come later and may change. This controller reissues the certificate when that
// set changes. It runs on every replica, each for its own listener, and writes nothing to the API server.
import type { Controller } from '../lib/controller/controller.ts';
import type { Informer } from '../lib/kube/informer.ts';
import type { ServiceLike } from './impersonation-proxy.ts';

/** The controller's name, and its one key: the listener's hosts. */
export const TUNNEL_HOSTS = 'tunnel-hosts';
export const TUNNEL_HOSTS_KEY = 'tunnel-hosts';

export interface TunnelHostsDeps {
  /** The Services of the concierge's namespace. */
  services: Informer<ServiceLike>;
  namespace: string;
  /** The tunnel's Service. */
  service: string;
  /** The hosts the listener was started with (its first certificate's), always kept. */
  configured: readonly string[];
  /**
   * The listener, once it runs (it starts after the controllers do, and the key is queued then); `setHosts` issues
   * it a certificate for `hosts` and serves it.
   */
  listener(): { setHosts(hosts: string[]): Promise<void> } | undefined;
}

/** The addresses and names a load balancer published for a Service. */
export function loadBalancerAddresses(service: ServiceLike | undefined): string[] {
  return (service?.status?.loadBalancer?.ingress ?? []).flatMap(
    (i) => [i.ip, i.hostname].filter((h) => !!h) as string[],
  );
}

export function newTunnelHostsController(deps: TunnelHostsDeps): Controller {
  /** The hosts of the certificate the listener serves. */
  let served = deps.configured.join(',');
  return {
    name: TUNNEL_HOSTS,
    watches: [
      {
        informer: deps.services,
        filter: (s: ServiceLike) => s.metadata?.name === deps.service,
        key: () => TUNNEL_HOSTS_KEY,
      },
    ],
    initialKeys: [TUNNEL_HOSTS_KEY],
    // Nothing here is a user's to fix: a certificate that cannot be issued throws and is retried.
    async sync() {
      const listener = deps.listener();
      if (!listener) return;
      const hosts = [
        ...deps.configured,
        ...loadBalancerAddresses(deps.services.get(deps.service, deps.namespace)),
      ];
      if (hosts.join(',') === served) return;
      await listener.setHosts(hosts);
      served = hosts.join(',');
    },
  };
}
