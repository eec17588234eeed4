// The agents' listener: TLS on its own port. POST /register trades a bootstrap token and a CSR for a client
// certificate (anyone may ask, so at a bounded rate per source address and overall, with 429 beyond); GET /connect
// (mutual TLS, an Upgrade) is the tunnel; POST /renew (mutual TLS) re-issues the certificate before it expires
// (enrollment.ts). The tunnel runs on the TLS connection itself after an Upgrade to TUNNEL_UPGRADE, or inside a
// WebSocket for agents behind proxies that pass only those (connect.ts, lib/tunnel/dial.ts). A certificate is bound
// to one Cluster object and one generation of its agent certificates (binding.ts), and that binding is checked
// against the Cluster registry on every connection and renewal: a Cluster deleted from the registry, or deleted and
// created again, or whose agentGeneration was raised, refuses the certificate, and its open tunnel is closed at once.
// A tunnel also closes when the certificate it was opened with expires (held-tunnels.ts). Connects and disconnects
// are announced to onTunnelChange, which publishes them in the Cluster's status (cluster-status.ts). TLS is the
// proxy's: 1.2 and up, AEAD suites only, no renegotiation. Connections reach the TLS server through a handshake
// queue (handshake-queue.ts).
import { randomUUID } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer, type Server } from 'node:https';
import {
  createServer as createNetServer,
  type AddressInfo,
  type Server as NetServer,
  type Socket,
} from 'node:net';
import type { TLSSocket } from 'node:tls';
import { WebSocketServer } from 'ws';
import type { AgentBinding } from '../../apis/agent-binding.ts';
import { TUNNEL_CA_SECRET } from '../../apis/install.ts';
import type { Cluster } from '../../apis/tunnel.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';
import type { Controller } from '../../lib/controller/controller.ts';
import { periodic } from '../../lib/controller/periodic.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import type { BootstrapTokenStore } from '../../lib/kube/bootstrap.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import type { KubeClients } from '../../lib/kube/kube.ts';
import { rawStatusResponse, writeStatus } from '../../lib/kube/status.ts';
import type { Logger } from '../../lib/log.ts';
import { ensureSecretCA } from '../../lib/pki/ca-secret.ts';
import { issueCert, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { REPLICA_HEADER } from '../../lib/tunnel/dial.ts';
import { ANNOTATIONS, preciseNow, type Auditor, type RequestAudit } from '../audit/audit.ts';
import { CIPHERS, CLIENT_SIGALGS } from '../proxy/server.ts';
import type { Route } from '../proxy/route.ts';
import { peerBinding, type VerifiedPeer } from './binding.ts';
import type { HeldTunnel } from './cluster-status.ts';
import { PROTOCOL_FIELD, serveConnect, type ConnectDoor } from './connect.ts';
import { json, serveRegister, serveRenew, type Enrollment } from './enrollment.ts';
import {
  HANDSHAKE_SWEEP_MS,
  handshakeQueue,
  MAX_HANDSHAKES,
  MAX_WAIT_MS,
  MAX_WAITING,
  type HandshakeQueue,
} from './handshake-queue.ts';
import { HeldTunnels } from './held-tunnels.ts';
import { DEFAULT_REGISTRATION_LIMITS, newRateLimiter, type RateLimitOptions } from './rate-limit.ts';

export { AGENT_CERT_VALIDITY_MS } from './enrollment.ts';
export { HANDSHAKE_SWEEP_MS, MAX_HANDSHAKES, MAX_WAITING } from './handshake-queue.ts';

/**
 * Connections the listener holds at once: one per agent (an idle tunnel costs the concierge under 200 KiB), with
 * room above the 10,000 agents a replica is meant to carry.
 */
const MAX_TUNNEL_CONNECTIONS = 16_384;
/** The handshake queue's controller (handshakeSweep). */
export const HANDSHAKE_SWEEP = 'tunnel-handshake-sweep';
/**
 * The TLS settings the serving certificate is served with, at start and after setHosts. Agents' keys and the
 * serving key are P-256: no stranger's RSA signature is ever checked (CLIENT_SIGALGS).
 */
const TLS_SETTINGS = {
  minVersion: 'TLSv1.2',
  ciphers: CIPHERS,
  honorCipherOrder: true,
  sigalgs: CLIENT_SIGALGS,
} as const;

export interface TunnelListenerOptions {
  clients: KubeClients;
  namespace: string;
  host: string;
  port: number;
  /** Names and addresses agents dial; they go into the listener's certificate. */
  hosts: string[];
  clusters: Informer<Cluster>;
  /** The unredeemed bootstrap tokens, from a cache: registration asks the API server nothing before a token is proven. */
  bootstrapTokens: BootstrapTokenStore;
  /** How often strangers may ask to register, per address and all together. Default: DEFAULT_REGISTRATION_LIMITS. */
  registrationLimits?: RateLimitOptions;
  /**
   * The Cluster as the API server has it now, undefined when there is none. Certificates are issued against this
   * rather than the cache, so one issued just after its agentGeneration was raised carries the new generation.
   */
  readCluster(name: string): Promise<Cluster | undefined>;
  /** This replica's tunnel to `cluster` came or went (see held()). */
  onTunnelChange(cluster: string): void;
  /**
   * This replica refused `cluster`'s agent, whose certificate it accepted, for its tunnel protocol (the skew policy,
   * lib/tunnel/protocol.ts); `problem` says why in one line. Default: only logged.
   */
  onProtocolRefused?(cluster: string, problem: string): void;
  /** This replica's name, told to each agent that connects (an agent holding several tunnels keeps them apart). */
  identity: string;
  log: Logger;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). */
  budget?: MemoryBudget;
  /** Times the handshake queue's waits and the tunnels' certificate expiry. Default: systemClock. */
  clock?: Clock;
  /** Audit events for /register, /renew and /connect. Default: none. */
  auditor?: Auditor;
  /**
   * Withdraws this replica's published tunnel facts (cluster-status.ts withdraw), so that peers stop choosing it for
   * new requests: the second step of handOver. Default: nothing to withdraw.
   */
  withdraw?(): Promise<void>;
  /** How long handOver waits for the agents to move (HANDOVER_BOUND_MS). */
  handOverBoundMs?: number;
}

export interface TunnelListener {
  port: number;
  /** The CA agents trust and are issued from (PEM). */
  caPem: string;
  /** The route through a connected cluster's tunnel, or undefined. */
  route(cluster: string): Route | undefined;
  /** The tunnel to `cluster`'s agent this replica holds, if any. */
  held(cluster: string): HeldTunnel | undefined;
  /**
   * Serves a certificate for these names and addresses from now on (a load balancer's address, learnt after
   * start). Connections already open keep theirs.
   */
  setHosts(hosts: string[]): Promise<void>;
  /**
   * Closes connections that waited for a handshake slot longer than they may, though no slot freed: the caller runs
   * it every HANDSHAKE_SWEEP_MS (the concierge through handshakeSweep(), a controller of its manager).
   */
  sweep(): void;
  /**
   * Hands this replica's tunnels over to the other replicas, for a drain: refuses new dials at once (503, a Status and
   * DRAINING_HEADER: the agent dials again soon, elsewhere), withdraws the published facts (`withdraw`), then asks
   * every agent to move (held-tunnels.ts) and resolves when all have moved or the bound has passed, with how many
   * tunnels it handed over (for the drain's log). Requests in flight on the tunnels go on; stop() closes what is left.
   * Calling it again waits for the same handover.
   */
  handOver(): Promise<number>;
  stop(): Promise<void>;
}

const NOT_AUDITED = "the request could not be audited, and this concierge's audit is blocking; retry later";

/** How an agent appears in audit events: the cluster its certificate is bound to. */
export const agentUser = (cluster: string): UserInfo => ({
  username: `sealion:agent:${cluster}`,
  groups: ['sealion:agents'],
  extra: {},
});

/**
 * The audit of one request to the listener: by the agent its certificate names, or by nobody yet (registration, a
 * refused certificate).
 */
function auditListenerRequest(
  auditor: Auditor | undefined,
  req: IncomingMessage,
  binding: AgentBinding | undefined,
): RequestAudit | undefined {
  if (!auditor) return undefined;
  const path = (req.url ?? '/').split('?')[0]!;
  return auditor.begin(
    {
      auditID: randomUUID(),
      requestURI: req.url ?? '/',
      attributes: { resourceRequest: false, verb: (req.method ?? 'GET').toLowerCase(), path },
      ...(req.socket.remoteAddress ? { sourceIP: req.socket.remoteAddress.replace(/^::ffff:/, '') } : {}),
      ...(typeof req.headers['user-agent'] === 'string' ? { userAgent: req.headers['user-agent'] } : {}),
      receivedMs: preciseNow(),
    },
    binding ? agentUser(binding.cluster) : undefined,
    binding ? { [ANNOTATIONS.cluster]: binding.cluster } : {},
  );
}

/**
 * What runs the audit's blocking mode: in it nothing goes on before its event is written (`serve` once it is,
 * `unavailable` when it cannot be); otherwise `serve` at once.
 */
function afterAudit(
  auditor: Auditor | undefined,
  audit: RequestAudit | undefined,
  serve: () => void,
  unavailable: () => void,
): void {
  if (audit && auditor?.backend.mode === 'blocking') return void audit.received().then(serve, unavailable);
  if (audit) void audit.received().catch(() => {});
  serve();
}

/** The listener's serving certificate for `hosts`, issued by its CA. */
async function servingContext(
  ca: CertificateAuthority,
  hosts: string[],
): Promise<{ cert: string; key: string }> {
  const serving = await issueCert(ca, { commonName: 'sealion-tunnel', hosts, usage: 'server' });
  // The chain includes the CA, so agents that pin the CA's key (before they have it) can check it.
  return { cert: serving.certPem + ca.certPem, key: serving.keyPem };
}

/** The TLS server, fed connections by the handshake queue; `onRequest` gets its plain requests. */
function newTlsServer(
  context: { cert: string; key: string },
  ca: CertificateAuthority,
  onRequest: (req: IncomingMessage, res: ServerResponse) => void,
): Server {
  return createServer(
    {
      ...context,
      ...TLS_SETTINGS,
      ca: ca.certPem,
      requestCert: true,
      // Registration has no client certificate yet; /connect and /renew check theirs themselves.
      rejectUnauthorized: false,
      // Anyone can reach this port: what a connection that never becomes a tunnel may hold is bounded. A
      // handshake takes milliseconds; registration and renewal send a few KiB at once.
      handshakeTimeout: 10_000,
      headersTimeout: 30_000,
      requestTimeout: 30_000,
    },
    onRequest,
  );
}

/** A plain request: /register or /renew, audited first. */
function onRequest(
  auditor: Auditor | undefined,
  enrollment: Enrollment,
  req: IncomingMessage,
  res: ServerResponse,
): void {
  const path = (req.url ?? '/').split('?')[0];
  const verified = peerBinding(req.socket as TLSSocket);
  const audit = auditListenerRequest(auditor, req, 'binding' in verified ? verified.binding : undefined);
  if (audit) res.once('close', () => audit.complete(res.statusCode));
  afterAudit(
    auditor,
    audit,
    () => {
      if (req.method === 'POST' && path === '/register') return serveRegister(enrollment, req, res, audit);
      if (req.method === 'POST' && path === '/renew') return serveRenew(enrollment, req, res, verified);
      json(res, 404, { message: 'not found' });
    },
    () => writeStatus(res, 503, NOT_AUDITED, { retryAfterSeconds: 1 }),
  );
}

/** An upgrade: the tunnel (connect.ts), audited first. */
function onUpgrade(
  auditor: Auditor | undefined,
  door: ConnectDoor,
  req: IncomingMessage,
  socket: Socket,
  head: Buffer,
): void {
  socket.on('error', () => socket.destroy());
  const verified: VerifiedPeer = peerBinding(socket as TLSSocket);
  const audit = auditListenerRequest(auditor, req, 'binding' in verified ? verified.binding : undefined);
  /** The status the connection was answered with: 101 once it is a tunnel. */
  let answered = 0;
  if (audit) socket.once('close', () => audit.complete(answered));
  afterAudit(
    auditor,
    audit,
    () => serveConnect(door, req, socket, head, verified, audit, (code) => (answered = code)),
    () => {
      answered = 503;
      socket.end(rawStatusResponse(503, NOT_AUDITED));
    },
  );
}

/**
 * Listens on the door. A port in use (EADDRINUSE) fails the start: without the handler the server would throw it
 * as an uncaught error and the start would wait for ever.
 */
function listen(door: NetServer, port: number, host: string): Promise<void> {
  return new Promise<void>((done, fail) => {
    door.once('error', fail);
    door.listen(port, host, () => {
      door.off('error', fail);
      done();
    });
  });
}

/** The listening door in front of `server`: its connections go through the handshake queue. */
async function openDoor(
  opts: TunnelListenerOptions,
  server: Server,
  clock: Clock,
): Promise<{ door: NetServer; handshakes: HandshakeQueue }> {
  const handshakes = handshakeQueue(
    (socket) => server.emit('connection', socket),
    { max: MAX_HANDSHAKES, maxWaiting: MAX_WAITING, waitMs: MAX_WAIT_MS },
    clock,
  );
  // Renegotiation is a client-driven, expensive handshake that nothing here needs.
  server.on('secureConnection', (socket: TLSSocket) => {
    socket.disableRenegotiation();
    handshakes.done(socket);
  });
  const door = createNetServer({ pauseOnConnect: true }, (socket) => handshakes.admit(socket));
  // Each agent holds one connection; past this many, new ones are dropped at accept rather than exhausting memory.
  door.maxConnections = MAX_TUNNEL_CONNECTIONS;
  try {
    await listen(door, opts.port, opts.host);
  } catch (err) {
    handshakes.close();
    throw err;
  }
  // The TLS server is fed connections and never listens itself; Node runs its header and request deadlines only
  // for a server that has emitted 'listening'.
  server.emit('listening');
  return { door, handshakes };
}

export async function startTunnelListener(opts: TunnelListenerOptions): Promise<TunnelListener> {
  const { log } = opts;
  const clock = opts.clock ?? systemClock;
  const ca = await ensureSecretCA(opts.clients, opts.namespace, TUNNEL_CA_SECRET, 'sealion tunnel CA');
  const tunnels = new HeldTunnels({
    clusters: opts.clusters,
    onTunnelChange: (cluster) => opts.onTunnelChange(cluster),
    ...(opts.budget ? { budget: opts.budget } : {}),
    clock,
    log,
  });
  const enrollment: Enrollment = {
    ca,
    clusters: opts.clusters,
    bootstrapTokens: opts.bootstrapTokens,
    registrations: newRateLimiter(opts.registrationLimits ?? DEFAULT_REGISTRATION_LIMITS),
    readCluster: (name) => opts.readCluster(name),
    log,
  };
  const replicaField = `${REPLICA_HEADER}: ${encodeURIComponent(opts.identity)}`;
  const wss = new WebSocketServer({ noServer: true, maxPayload: 4 * 1024 * 1024 });
  wss.on('headers', (headers) => headers.push(replicaField, PROTOCOL_FIELD));
  const door: ConnectDoor = {
    clusters: opts.clusters,
    identity: opts.identity,
    replicaField,
    wss,
    tunnels,
    log,
    onProtocolRefused: (cluster, problem) => opts.onProtocolRefused?.(cluster, problem),
    draining: false,
  };

  const server = newTlsServer(await servingContext(ca, opts.hosts), ca, (req, res) =>
    onRequest(opts.auditor, enrollment, req, res),
  );
  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) =>
    onUpgrade(opts.auditor, door, req, socket, head),
  );
  opts.clusters.onChange((obj) => tunnels.registryChanged(obj.metadata.name ?? ''));
  const listening = await openDoor(opts, server, clock);
  const port = (listening.door.address() as AddressInfo).port;
  log.info({ host: opts.host, port }, 'tunnel listener listening');
  let handingOver: Promise<number> | undefined;
  return {
    port,
    caPem: ca.certPem,
    route: (cluster) => tunnels.route(cluster),
    held: (cluster) => tunnels.held(cluster),
    async setHosts(hosts) {
      server.setSecureContext({ ...(await servingContext(ca, hosts)), ca: ca.certPem, ...TLS_SETTINGS });
      log.info({ hosts }, 'tunnel serving certificate reissued');
    },
    sweep: () => listening.handshakes.sweep(),
    handOver: () => (handingOver ??= handOver(door, tunnels, opts)),
    async stop() {
      tunnels.closeAll();
      listening.handshakes.close();
      server.closeAllConnections();
      await new Promise<void>((done) => listening.door.close(() => done()));
    },
  };
}

/**
 * The handover (TunnelListener.handOver), in its order: no new tunnel from the moment it begins; the facts peers route
 * by withdrawn before the agents are asked to move, so that a peer's request meanwhile still finds the tunnel here.
 */
async function handOver(
  door: ConnectDoor,
  tunnels: HeldTunnels,
  opts: TunnelListenerOptions,
): Promise<number> {
  door.draining = true;
  opts.log.info({ replica: opts.identity }, 'tunnel listener draining: new tunnels are refused');
  try {
    await opts.withdraw?.();
  } catch (err) {
    // Withdrawing bounds its own wait; should it fail, the Lease lapses and the peers forget this replica anyway.
    opts.log.warn({ err: (err as Error).message }, "withdrawing this replica's tunnel facts failed");
  }
  return tunnels.handOver(opts.handOverBoundMs);
}

/**
 * The listener's periodic sweep as a controller of the process's manager, which runs it on its clock: `listener`
 * is the running listener, or undefined before it starts (the manager starts first) and then nothing is swept.
 */
export function handshakeSweep(listener: () => Pick<TunnelListener, 'sweep'> | undefined): Controller {
  return periodic(HANDSHAKE_SWEEP, HANDSHAKE_SWEEP_MS, () => {
    listener()?.sweep();
    return Promise.resolve();
  });
}
