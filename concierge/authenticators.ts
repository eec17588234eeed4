// Wires the authenticator controllers to the API server: informers on both kinds, the one AuthenticatorCache the
// proxy asks, validators on every replica and status writers on the leader (through the controller manager).
import { apiGroups, Resource, VERSION } from '../apis/groups.ts';
import type { AuthenticatorStatus, JWTAuthenticator, WebhookAuthenticator } from '../apis/authentication.ts';
import {
  newJWTAuthenticatorControllers,
  newWebhookAuthenticatorControllers,
  type AuthenticatorControllers,
} from '../controllers/authenticators.ts';
import type { ControllerManager } from '../lib/controller/manager.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import { newClusterStatusWriter, newCustomResourceInformer, type KubeClients } from '../lib/kube/kube.ts';
import type { Informer } from '../lib/kube/informer.ts';
import type { Logger } from '../lib/log.ts';

export interface Authenticators {
  cache: AuthenticatorCache;
  jwt: Informer<JWTAuthenticator>;
  webhook: Informer<WebhookAuthenticator>;
  /** Stops the informers and empties the cache (the manager stops the controllers). */
  stop(): Promise<void>;
}

export function addAuthenticators(
  manager: ControllerManager,
  clients: KubeClients,
  groupSuffix: string,
  log: Logger,
): Authenticators {
  const group = apiGroups(groupSuffix).authentication;
  const jwtResource = { group, version: VERSION, plural: Resource.JWTAuthenticator };
  const webhookResource = { group, version: VERSION, plural: Resource.WebhookAuthenticator };
  const cache = new AuthenticatorCache();
  const jwt = newCustomResourceInformer<JWTAuthenticator>(clients, jwtResource, log);
  const webhook = newCustomResourceInformer<WebhookAuthenticator>(clients, webhookResource, log);
  const add = (controllers: AuthenticatorControllers): void => {
    manager.run(controllers.validator);
    manager.runWhileLeading(controllers.status);
  };
  const validated = (controller: string, name: string): void => manager.enqueue(controller, name);
  add(
    newJWTAuthenticatorControllers({
      informer: jwt,
      cache,
      status: manager.leaderOnly(newClusterStatusWriter<AuthenticatorStatus>(clients, jwtResource)),
      validated,
      log,
    }),
  );
  add(
    newWebhookAuthenticatorControllers({
      informer: webhook,
      cache,
      status: manager.leaderOnly(newClusterStatusWriter<AuthenticatorStatus>(clients, webhookResource)),
      validated,
      log,
    }),
  );
  return {
    cache,
    jwt,
    webhook,
    async stop() {
      await Promise.all([jwt.stop(), webhook.stop()]);
      cache.close();
    },
  };
}
