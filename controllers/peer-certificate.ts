// A replica's peer certificate (concierge/peering/) lives a week and is issued again once it is a day old, in
// memory: nothing is written to the API server. The sync reissues a certificate past its renewal point and asks to
// come back when the next one is due, so one timer of the work queue stands in for an interval of its own.
import type { Clock } from '../lib/clock.ts';
import type { Controller } from '../lib/controller/controller.ts';

/** The one key: this replica's peer certificate. */
export const PEER_CERTIFICATE_KEY = 'peer-certificate';

export interface PeerCertificateDeps {
  /** When the certificate served now was issued, in ms since the epoch. */
  issuedAt(): number;
  /** Issues a new certificate and serves it (and dials with it). */
  reissue(): Promise<void>;
  /** How old a certificate may grow before it is reissued. */
  renewAfterMs: number;
  clock: Clock;
}

export function newPeerCertificateController(deps: PeerCertificateDeps): Controller {
  return {
    name: 'peer-certificate',
    watches: [],
    initialKeys: [PEER_CERTIFICATE_KEY],
    // A certificate that cannot be issued throws and is retried with backoff; the one served lasts days more.
    async sync() {
      const due = deps.issuedAt() + deps.renewAfterMs - deps.clock.now();
      if (due > 0) return { requeueAfterMs: due };
      await deps.reissue();
      return { requeueAfterMs: deps.renewAfterMs };
    },
  };
}
