// Wires the authenticator controllers to the API server: informers on both kinds, status writers, and the one
// AuthenticatorCache the proxy asks.
import { apiGroups, Resource, VERSION } from '../apis/groups.ts';
import type { AuthenticatorStatus, JWTAuthenticator, WebhookAuthenticator } from '../apis/authentication.ts';
import {
  newJWTAuthenticatorController,
  newWebhookAuthenticatorController,
} from '../controllers/authenticators.ts';
import { runController, type RunningController } from '../controllers/lib/controller.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import { newClusterStatusWriter, newCustomResourceInformer, type KubeClients } from '../lib/kube.ts';
import type { Informer } from '../lib/informer.ts';
import type { Logger } from '../lib/log.ts';

export interface Authenticators {
  cache: AuthenticatorCache;
  jwt: Informer<JWTAuthenticator>;
  webhook: Informer<WebhookAuthenticator>;
  /** Looks at every authenticator again (a new leader writes the status its predecessor left). */
  resync(): void;
  stop(): Promise<void>;
}

/** Every replica validates and caches; only one for which isLeader() holds writes status. */
export async function startAuthenticators(
  clients: KubeClients,
  groupSuffix: string,
  log: Logger,
  isLeader: () => boolean = () => true,
): Promise<Authenticators> {
  const group = apiGroups(groupSuffix).authentication;
  const jwtResource = { group, version: VERSION, plural: Resource.JWTAuthenticator };
  const webhookResource = { group, version: VERSION, plural: Resource.WebhookAuthenticator };
  const cache = new AuthenticatorCache();
  const jwtInformer = newCustomResourceInformer<JWTAuthenticator>(clients, jwtResource, log);
  const webhookInformer = newCustomResourceInformer<WebhookAuthenticator>(clients, webhookResource, log);
  const running: RunningController[] = await Promise.all([
    runController(
      newJWTAuthenticatorController({
        informer: jwtInformer,
        cache,
        status: newClusterStatusWriter<AuthenticatorStatus>(clients, jwtResource),
        isLeader,
        log,
      }),
      { log },
    ),
    runController(
      newWebhookAuthenticatorController({
        informer: webhookInformer,
        cache,
        status: newClusterStatusWriter<AuthenticatorStatus>(clients, webhookResource),
        isLeader,
        log,
      }),
      { log },
    ),
  ]);
  return {
    cache,
    jwt: jwtInformer,
    webhook: webhookInformer,
    resync: () => running.forEach((r) => r.resync()),
    async stop() {
      await Promise.all(running.map((r) => r.stop()));
      await Promise.all([jwtInformer.stop(), webhookInformer.stop()]);
      cache.close();
    },
  };
}
