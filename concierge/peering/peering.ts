// Proxy peering: any replica serves any cluster. An agent's tunnel lands on one replica (or a few); a request for
// that cluster that reaches another replica is authenticated and its impersonation decided where it landed, then
// sent over a peer link to a replica that holds the tunnel, which forwards it into the tunnel as its own (its fair
// queue, its limits). The holder never sends a peer's request on to a third replica: a stale route ends in a Status.
//
// A peer link is one mutual-TLS connection per pair of replicas, dialed on demand and reused, carrying every request
// between them on one HTTP/2 session: lib/tunnel/tunnel.ts's multiplexer, the same one agents' tunnels run on (plain
// requests as HTTP/2 requests, upgrades as HTTP/1.1 on CONNECT streams, per-stream flow control, pings from the
// listening end). Its certificates come from a peer CA of its own, kept in a Secret: the peer port refuses, at the
// handshake, any certificate the peer CA did not issue (users' and agents' among them), and then any that does not
// name a replica. Where a replica is reached is a fact it publishes on its Lease (cluster-status.ts), next to the
// tunnels it holds.
//
// This module makes the peer CA's credentials and puts the two ends together: the peer port (holder.ts) and the
// routes over links this replica dials (route.ts).
import type { Registry } from 'prom-client';
import { PEER_CA_SECRET, PEER_URI_PREFIX } from '../../apis/install.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import type { KubeClients } from '../../lib/kube/kube.ts';
import type { Logger } from '../../lib/log.ts';
import { ensureSecretCA } from '../../lib/pki/ca-secret.ts';
import { issueCert, type CertificateAuthority } from '../../lib/pki/pki.ts';
import type { Route } from '../proxy/route.ts';
import type { RemoteHolder } from '../tunnel/cluster-status.ts';
import { servePeerPort } from './holder.ts';
import { peerMetrics } from './link.ts';
import { newPeerRoutes, type PeerRoutes } from './route.ts';
import type { Readable } from 'node:stream';
import type { RecordingInfo, Recordings, ReplicasPage } from '../recording/session.ts';
import { checkedInfo, filterQuery, type RecordingFilter } from '../recording/listing.ts';
import { RECORDINGS_PATH } from './link.ts';

/** How long a replica has to send its list of recordings. */
const LIST_TIMEOUT_MS = 10_000;
/** A replica's list of recordings: at most MAX_LIST_ITEMS of about 500 bytes (listing.ts). */
const MAX_LIST_BYTES = 8 * 1024 * 1024;

export { PEER_USER_STREAMS } from './link.ts';

/**
 * Peer certificates live a week and are issued again every day (a replica's own, in memory), by the controller
 * controllers/peer-certificate.ts, which calls reissue().
 */
const PEER_CERT_VALIDITY_MS = 7 * 24 * 3600 * 1000;
export const PEER_CERT_RENEW_MS = 24 * 3600 * 1000;
export interface PeeringOptions {
  clients: KubeClients;
  namespace: string;
  identity: string;
  /** Where the peer listener listens. */
  host: string;
  port: number;
  /** The host (an address, or a name in the certificate) other replicas dial; the listener's port is added. */
  advertise: string;
  /** The route through a tunnel this replica holds, if it holds `cluster`'s. */
  local(cluster: string): Route | undefined;
  /** The other replicas holding `cluster`'s tunnel, in the order to try them. */
  holders(cluster: string): RemoteHolder[];
  /** Whether `address` (an IP) is one a replica publishes: the only sources the peer port takes connections from. */
  knownSource(address: string): boolean;
  /** The other live replicas. */
  replicas(): RemoteHolder[];
  /** This replica's recorded sessions, served to the others. */
  recordings?: Recordings;
  registry: Registry;
  log: Logger;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). */
  budget?: MemoryBudget;
  /** Times the dials, the links' certificate expiry and the memory of failed dials. Default: systemClock. */
  clock?: Clock;
}

export interface Peering {
  /** host:port other replicas reach this one at, for its Lease. */
  address: string;
  /** The route through a peer that holds `cluster`'s tunnel, or undefined when no live replica does. */
  route(cluster: string): Route | undefined;
  /**
   * The recordings every other live replica holds (a replica that does not answer is left out, and named in
   * `unreachable`), and one recording, from whichever replica has it.
   */
  peerRecordings(filter: RecordingFilter): Promise<ReplicasPage>;
  peerRecording(id: string): Promise<Readable | undefined>;
  /** When this replica's peer certificate was issued (ms since the epoch). */
  issuedAt(): number;
  /** Issues this replica a new peer certificate, served and dialed with from now on. */
  reissue(): Promise<void>;
  stop(): Promise<void>;
}

/** A peer certificate for this replica, from the peer CA: it names the replica, and the host the others dial. */
async function issuePeerCertificate(
  ca: CertificateAuthority,
  identity: string,
  advertise: string,
): Promise<{ cert: string; key: string }> {
  const issued = await issueCert(ca, {
    commonName: 'sealion-peer',
    hosts: [advertise],
    uris: [`${PEER_URI_PREFIX}${encodeURIComponent(identity)}`],
    usage: 'server+client',
    validityMs: PEER_CERT_VALIDITY_MS,
  });
  return { cert: issued.certPem, key: issued.keyPem };
}

/**
 * The recordings a replica's list names, each checked: the list is another process's word. A replica older than
 * filtered lists answers every recording as a plain array (ids, sizes and times), which is taken as it is.
 */
export function parseRecordingList(
  body: Buffer,
  replica: string,
): { found: (RecordingInfo & { replica: string })[]; remaining: number } {
  const answer: unknown = JSON.parse(body.toString('utf8'));
  const page = Array.isArray(answer)
    ? { items: answer, remaining: 0 }
    : (answer as { items?: unknown; remaining?: unknown });
  if (!Array.isArray(page?.items)) throw new Error('the answer is not a list');
  const found: (RecordingInfo & { replica: string })[] = [];
  for (const item of page.items as unknown[]) {
    const info = checkedInfo(item);
    if (info) found.push({ ...info, replica });
  }
  const remaining =
    Number.isSafeInteger(page.remaining) && (page.remaining as number) > 0 ? (page.remaining as number) : 0;
  return { found, remaining };
}

/** The recordings every one of `replicas` holds; a replica that does not answer is named in `unreachable`. */
async function listPeerRecordings(
  routes: PeerRoutes,
  replicas: RemoteHolder[],
  filter: RecordingFilter,
  log: Logger,
): Promise<ReplicasPage> {
  const found: (RecordingInfo & { replica: string })[] = [];
  const unreachable: string[] = [];
  let remaining = 0;
  await Promise.all(
    replicas.map(async (holder) => {
      try {
        // A small answer, bounded in size and time, as the concierge's own calls over any hop are.
        // Filtered and cut where the recordings are: the answer is what this list needs, never the whole folder.
        const answer = await routes.call(holder, `${RECORDINGS_PATH}?${filterQuery(filter).toString()}`, {
          timeoutMs: LIST_TIMEOUT_MS,
          maxBytes: MAX_LIST_BYTES,
        });
        if (answer.status === 404) return;
        if (answer.status !== 200) throw new Error(`status ${answer.status}`);
        const page = parseRecordingList(answer.body, holder.replica);
        found.push(...page.found);
        remaining += page.remaining;
      } catch (err) {
        log.warn({ peer: holder.replica, err: (err as Error).message }, 'a peer did not list its recordings');
        unreachable.push(holder.replica);
      }
    }),
  );
  return { found, remaining, unreachable };
}

/** The recording `id`, from the first of `replicas` that has it. */
async function fetchPeerRecording(
  routes: PeerRoutes,
  replicas: RemoteHolder[],
  id: string,
): Promise<Readable | undefined> {
  for (const holder of replicas) {
    try {
      const answer = await routes.get(holder, `${RECORDINGS_PATH}/${encodeURIComponent(id)}`);
      if (answer.status === 200) return answer.body;
      answer.body.resume();
    } catch {
      // The next replica.
    }
  }
  return undefined;
}

export async function startPeering(opts: PeeringOptions): Promise<Peering> {
  const { log, identity } = opts;
  const clock = opts.clock ?? systemClock;
  const ca = await ensureSecretCA(opts.clients, opts.namespace, PEER_CA_SECRET, 'sealion peer CA');
  let issuedAt = clock.now();
  let own = await issuePeerCertificate(ca, identity, opts.advertise);
  const credentials = { caPem: ca.certPem, own: () => own };
  let stopped = false;
  const metrics = peerMetrics(opts.registry, () => routes.links());
  const routes = newPeerRoutes({
    credentials,
    metrics,
    clock,
    log,
    ...(opts.budget ? { budget: opts.budget } : {}),
  });
  const port = await servePeerPort({
    host: opts.host,
    port: opts.port,
    identity,
    credentials,
    local: (cluster) => opts.local(cluster),
    knownSource: (address) => opts.knownSource(address),
    ...(opts.recordings ? { recordings: opts.recordings } : {}),
    metrics,
    clock,
    log,
  });
  const address = `${opts.advertise.includes(':') ? `[${opts.advertise}]` : opts.advertise}:${port.port}`;
  log.info({ address }, 'peers reach this replica at its address');

  return {
    address,
    route(cluster) {
      if (stopped) return undefined;
      const holders = opts.holders(cluster);
      return holders.length > 0 ? routes.route(cluster, holders) : undefined;
    },
    peerRecordings: (filter) => listPeerRecordings(routes, opts.replicas(), filter, log),
    peerRecording: (id) => fetchPeerRecording(routes, opts.replicas(), id),
    issuedAt: () => issuedAt,
    async reissue() {
      const at = clock.now();
      own = await issuePeerCertificate(ca, identity, opts.advertise);
      issuedAt = at;
      port.reloadCredentials();
    },
    async stop() {
      stopped = true;
      routes.stop();
      await port.stop();
    },
  };
}
