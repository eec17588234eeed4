// The access requests' parts of one replica, made once by the composition root (concierge.ts): the informer-backed
// store (the grants the pipeline asks), the local APIs, word of changes (audit, the optional webhook), and the
// leader's expiry controller, given the manager's leader-only writes.
import type { AccessRequest } from '../../apis/access.ts';
import { Resource, VERSION, type ApiGroups } from '../../apis/groups.ts';
import type { ClusterSpec } from '../../apis/tunnel.ts';
import type { Clock } from '../../lib/clock.ts';
import type { Controller } from '../../lib/controller/controller.ts';
import type { KubeClients, KubeInformers, Reviewer } from '../../lib/kube/kube.ts';
import type { Logger } from '../../lib/log.ts';
import type { Auditor } from '../audit/audit.ts';
import { newWebhookClient } from '../audit/sinks.ts';
import type { LocalAPI } from '../proxy/local-apis.ts';
import { accessAPIs } from './api.ts';
import { newAccessRequestClient, type AccessRequestClient } from './client.ts';
import { accessExpiryController } from './expiry.ts';
import { newAccessNotifier } from './notify.ts';
import {
  clusterUIDsOf,
  newAccessStore,
  policyLookup,
  type AccessSettings,
  type AccessStore,
} from './store.ts';

export interface AccessPartsOptions {
  clients: KubeClients;
  informers: KubeInformers;
  groups: ApiGroups;
  reviewer: Reviewer;
  /** A Cluster's spec by name (the tunnel parts' informer); undefined: none. */
  clusterSpec: (name: string) => ClusterSpec | undefined;
  /** A Cluster's uid by name; undefined: none. */
  clusterUID: (name: string) => string | undefined;
  /** The config's accessRequests in effect. */
  settings: () => AccessSettings;
  /** This replica's name, in the audit events it writes. */
  replica: string;
  auditor?: Auditor;
  /** A kubeconfig-format file naming the access webhook (`--access-webhook-config-file`); undefined: none. */
  webhookConfigFile?: string;
  clock: Clock;
  log: Logger;
}

export interface AccessParts {
  /** The grants (concierge/access/grants.ts AccessGrants) and the caller's own requests. */
  store: AccessStore;
  /** The local API entries, mounted at the hub's URLs (proxy/hub-apis.ts). */
  apis: LocalAPI[];
  /** The leader's expiry controller, writing through `leaderOnly` (the manager's). */
  expiry(leaderOnly: <W extends object>(writer: W) => W): Controller;
  /** Stops the store's timers and the webhook. Idempotent. */
  close(): Promise<void>;
}

export async function newAccessParts(opts: AccessPartsOptions): Promise<AccessParts> {
  const { groups, clock } = opts;
  const log = opts.log.child({ component: 'access' });
  const requests = opts.informers.customResource<AccessRequest>({
    group: groups.access,
    version: VERSION,
    plural: Resource.AccessRequest,
  });
  const webhook = opts.webhookConfigFile
    ? await newWebhookClient({ kubeconfigPath: opts.webhookConfigFile }, 'access webhook')
    : undefined;
  const notify = newAccessNotifier({
    groups,
    replica: opts.replica,
    ...(opts.auditor ? { auditor: opts.auditor } : {}),
    ...(webhook ? { webhook } : {}),
    log,
    now: () => clock.now(),
  });
  const store = newAccessStore({
    requests,
    clusterSpec: opts.clusterSpec,
    clusterUID: opts.clusterUID,
    settings: opts.settings,
    clock,
    log,
  });
  const client: AccessRequestClient = newAccessRequestClient(opts.clients, groups);
  const apis = accessAPIs({
    groups,
    store,
    client,
    reviewer: opts.reviewer,
    policyOf: policyLookup(opts.settings, opts.clusterSpec),
    clusterUIDs: clusterUIDsOf(opts.settings, opts.clusterSpec, opts.clusterUID),
    notify,
    clock,
    log,
  });
  let closed: Promise<void> | undefined;
  return {
    store,
    apis,
    expiry: (leaderOnly) =>
      accessExpiryController({ requests, client: leaderOnly(client), notify, clock, log }),
    close() {
      closed ??= (async () => {
        store.close();
        await notify.close();
      })();
      return closed;
    },
  };
}
