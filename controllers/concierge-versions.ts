// Publishes which versions the concierge's live replicas run, for `sealion version`: the leader writes them into a
// ConfigMap of their own (CONCIERGE_VERSIONS_CONFIG_MAP), which the install lets every signed-in user read, as the API
// server's /version is readable by all.
//
// The list is derived from facts, not pushed: each replica names its version on its own Lease, and the live set is
// the replicas whose Lease still renews (concierge/tunnel/cluster-status.ts judges that, as for tunnels). A rolling
// upgrade shows two versions while both run; a replica that crashed drops out once its Lease lapses, one that stops
// cleanly at once (it deletes its Lease). Counts only, no pod names or addresses: the readers are every user.
//
// Should every replica die, nobody is left to correct the list: the leader confirms it every REFRESH_MS even when
// nothing changed (observedAt), so a reader can tell a list nobody keeps from a current one.
import {
  CONCIERGE_VERSIONS_CONFIG_MAP,
  CONCIERGE_VERSIONS_KEY,
  CONCIERGE_VERSIONS_OBSERVED_KEY,
  type ConciergeVersion,
} from '../apis/install.ts';
import type { Clock } from '../lib/clock.ts';
import type { Controller } from '../lib/controller/controller.ts';
import type { SyncResult } from '../lib/controller/queue.ts';
import type { Informer } from '../lib/kube/informer.ts';
import type { Logger } from '../lib/log.ts';
import type { ConfigMapLike } from './direct-login.ts';

/** How often the live set is looked at: a Lease that lapses makes no event, and replicas renew every 2 s. */
export const CHECK_MS = 2_000;
/** How often an unchanged list is confirmed: one small write a minute, and a reader calls it stale after a few. */
export const REFRESH_MS = 60_000;
/** The controller's name, and its one key. */
export const CONCIERGE_VERSIONS = 'concierge-versions';

/**
 * The versions of `replicas` and the tunnel protocol each serves, with how many run each: most replicas first, then
 * by version.
 */
export function summarizeVersions(
  replicas: readonly { version: string; tunnelProtocol?: string }[],
): ConciergeVersion[] {
  const counts = new Map<string, ConciergeVersion>();
  for (const { version, tunnelProtocol } of replicas) {
    const key = JSON.stringify([version, tunnelProtocol ?? null]);
    const seen = counts.get(key);
    if (seen) seen.replicas++;
    else
      counts.set(key, { version, replicas: 1, ...(tunnelProtocol === undefined ? {} : { tunnelProtocol }) });
  }
  return [...counts.values()].sort(
    (a, b) =>
      b.replicas - a.replicas ||
      a.version.localeCompare(b.version) ||
      (a.tunnelProtocol ?? '').localeCompare(b.tunnelProtocol ?? ''),
  );
}

export interface ConciergeVersionsDeps {
  /**
   * The live replicas, this one included, with the version each runs ('' when one says none) and the tunnel protocol
   * it serves (absent when it says none).
   */
  replicas: () => readonly { replica: string; version: string; tunnelProtocol?: string }[];
  /** The ConfigMaps of the concierge's namespace: what is published now. */
  configMaps: Informer<ConfigMapLike>;
  namespace: string;
  /** Writes the ConfigMap's data (a server-side apply, leader-only). */
  publish: (data: Record<string, string>) => Promise<void>;
  clock: Clock;
  log: Logger;
}

/** Writes only: the controller manager runs it on the leader, with a leader-only writer. */
export function newConciergeVersionsPublisher(deps: ConciergeVersionsDeps): Controller {
  return {
    name: CONCIERGE_VERSIONS,
    initialKeys: [CONCIERGE_VERSIONS],
    // Someone edited or deleted the ConfigMap: it is put right at once.
    watches: [
      {
        informer: deps.configMaps,
        filter: (c: ConfigMapLike) => c.metadata?.name === CONCIERGE_VERSIONS_CONFIG_MAP,
        key: () => CONCIERGE_VERSIONS,
      },
    ],
    // Nothing here is a user error: a failed write throws and is retried with backoff.
    async sync(): Promise<SyncResult> {
      const live = deps.replicas();
      // A replica on its way out knows no live set: it leaves the list to the next leader.
      if (live.length === 0) return { requeueAfterMs: CHECK_MS };
      const versions = JSON.stringify(summarizeVersions(live));
      const data = deps.configMaps.get(CONCIERGE_VERSIONS_CONFIG_MAP, deps.namespace)?.data ?? {};
      const observed = Date.parse(data[CONCIERGE_VERSIONS_OBSERVED_KEY] ?? '');
      const now = deps.clock.now();
      // NaN (absent, unreadable) is never fresh.
      const fresh = now - observed < REFRESH_MS && observed <= now;
      if (data[CONCIERGE_VERSIONS_KEY] !== versions || !fresh) {
        await deps.publish({
          [CONCIERGE_VERSIONS_KEY]: versions,
          [CONCIERGE_VERSIONS_OBSERVED_KEY]: new Date(now).toISOString(),
        });
        if (data[CONCIERGE_VERSIONS_KEY] !== versions)
          deps.log.info({ versions }, 'concierge versions published');
      }
      return { requeueAfterMs: CHECK_MS };
    },
  };
}
