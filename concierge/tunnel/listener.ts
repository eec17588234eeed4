// The agents' listener: TLS on its own port. POST /register trades a bootstrap token and a CSR for a client
// certificate (anyone may ask, so at a bounded rate per source address and overall, with 429 beyond); GET /connect
// (mutual TLS, an Upgrade) is the tunnel; POST /renew (mutual TLS) re-issues the certificate before it expires. The
// tunnel runs on the TLS connection itself after an Upgrade to TUNNEL_UPGRADE,
// or inside a WebSocket for agents behind proxies that pass only those (lib/tunnel/dial.ts). A certificate is bound to one Cluster object and one generation of its agent
// certificates (binding.ts), and that binding is checked against the Cluster registry on every connection and
// renewal: a Cluster deleted from the registry, or deleted and created again, or whose agentGeneration was
// raised, refuses the certificate, and its open tunnel is closed at once. A tunnel also closes when the
// certificate it was opened with expires. Connects and disconnects are announced to onTunnelChange, which
// publishes them in the Cluster's status (cluster-status.ts). TLS is the proxy's: 1.2 and up, AEAD suites only, no renegotiation.
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { createServer as createNetServer, type AddressInfo, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import type { TLSSocket } from 'node:tls';
import { createWebSocketStream, WebSocketServer } from 'ws';
import type { Cluster } from '../../apis/tunnel.ts';
import { redeemBootstrapToken, RedeemError, type BootstrapTokenStore } from '../../lib/kube/bootstrap.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import type { KubeClients } from '../../lib/kube/kube.ts';
import { ensureSecretCA } from '../../lib/pki/ca-secret.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';
import type { Logger } from '../../lib/log.ts';
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import { certificateURIs, issueCert, publicKeyFromCSR } from '../../lib/pki/pki.ts';
import { rawStatusResponse, UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';
import type { HeldTunnel } from './cluster-status.ts';
import {
  newTunnelClient,
  TUNNEL_PROTOCOL,
  TUNNEL_PROTOCOL_HEADER,
  TUNNEL_UPGRADE,
  type TunnelClient,
} from '../../lib/tunnel/tunnel.ts';
import {
  AGENT_IMPERSONATION_HEADER,
  AGENT_POLICY_HEADER,
  ALREADY_HELD,
  AVOID_REPLICAS_HEADER,
  REPLICA_HEADER,
} from '../../lib/tunnel/dial.ts';
import type { Route } from '../proxy/route.ts';
import { ANNOTATIONS, preciseNow, type Auditor, type RequestAudit } from '../audit/audit.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { randomUUID } from 'node:crypto';
import { CIPHERS, CLIENT_SIGALGS } from '../proxy/server.ts';
import {
  BINDING_URI_PREFIX,
  bindingURI,
  parseBindingURI,
  type AgentBinding,
} from '../../apis/agent-binding.ts';
import { bindingProblem, currentBinding } from './binding.ts';
import { TUNNEL_CA_SECRET } from '../../apis/install.ts';
import { newTunnelRoute, tunnelLimits, type TunnelRoute } from './route.ts';
import { DEFAULT_REGISTRATION_LIMITS, newRateLimiter, type RateLimitOptions } from './rate-limit.ts';
import { isDNSLabel } from '../../apis/names.ts';

/** Agent certificates live 90 days and are renewed over the tunnel at two thirds of that. */
export const AGENT_CERT_VALIDITY_MS = 90 * 24 * 3600 * 1000;
/** Registration and renewal bodies are a CSR and a token: a few KiB. */
const MAX_BODY_BYTES = 64 * 1024;
/**
 * Connections the listener holds at once: one per agent (an idle tunnel costs the concierge under 200 KiB), with
 * room above the 10,000 agents a replica is meant to carry.
 */
const MAX_TUNNEL_CONNECTIONS = 16_384;
/**
 * TLS handshakes in progress at once. One takes about a millisecond of CPU; this many finish well within the
 * handshake timeout even on a busy core.
 */
export const MAX_HANDSHAKES = 256;
/**
 * Connections waiting for a handshake slot, and for how long: less than an agent's dial timeout (10 s), so that an
 * agent is either served or told to back off before it gives up on its own.
 */
export const MAX_WAITING = 8192;
const MAX_WAIT_MS = 8_000;
/** How often connections that have waited too long are looked for, when no finished handshake frees a slot. */
const SWEEP_MS = 1_000;
/** What the log says of every failed registration; the caller gets the listener's one 401, whatever failed. */
const REJECTED = 'registration rejected';

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
  /** This replica's name, told to each agent that connects (an agent holding several tunnels keeps them apart). */
  identity: string;
  log: Logger;
  /** Where answers left unread are charged, per user (lib/http2/memory-budget.ts). */
  budget?: MemoryBudget;
  /** Times the handshake queue's waits and the tunnels' certificate expiry. Default: systemClock. */
  clock?: Clock;
  /** Audit events for /register, /renew and /connect. Default: none. */
  auditor?: Auditor;
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
  stop(): Promise<void>;
}

function readBody(req: IncomingMessage): Promise<unknown> {
  return new Promise((done, fail) => {
    let size = 0;
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) return void req.destroy(new Error('body too large'));
      chunks.push(chunk);
    });
    req.on('end', () => {
      try {
        done(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        fail(new Error('the body is not JSON'));
      }
    });
    req.on('error', fail);
  });
}

const json = (res: ServerResponse, code: number, body: object): void =>
  void res.writeHead(code, { 'content-type': 'application/json' }).end(JSON.stringify(body));

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

/** The binding a verified client certificate carries, or why there is none. */
function peerBinding(socket: TLSSocket): { binding: AgentBinding } | { problem: string } {
  if (!socket.authorized)
    return { problem: `no valid client certificate (${String(socket.authorizationError)})` };
  const cert = socket.getPeerX509Certificate();
  if (!cert) return { problem: 'no client certificate' };
  if (!cert.keyUsage?.includes('1.3.6.1.5.5.7.3.2'))
    return { problem: 'the certificate is not for client authentication' };
  // Certificates from before bindings existed name the cluster only in their subject: they are refused, since
  // nothing in them tells one Cluster of a name from a later one.
  const uris = certificateURIs(cert.raw).filter((uri) => uri.startsWith(BINDING_URI_PREFIX));
  if (uris.length !== 1) return { problem: 'the certificate carries no single cluster binding' };
  const binding = parseBindingURI(uris[0]!);
  if (!binding) return { problem: 'the certificate carries a malformed cluster binding' };
  return { binding };
}

/**
 * The door in front of the TLS server. When every agent dials at once (after a restart), handshakes beyond what the
 * CPU finishes in time would all time out, each after using its share of the CPU, and their agents would dial
 * again into the same crowd. So at most `max` handshakes run at once; later connections wait, unread and in arrival
 * order, for a slot (`maxWaiting` of them for at most `waitMs`; past either they are closed, which costs nothing,
 * and their agents back off). `start` hands a connection to the TLS server; `done` is told of each finished
 * handshake's secure socket, matched to its connection by their addresses, which the two share.
 */
function handshakeQueue(
  start: (socket: Socket) => void,
  limits: { max: number; maxWaiting: number; waitMs: number },
  clock: Clock,
): { admit(socket: Socket): void; done(socket: Socket): void; close(): void } {
  const inProgress = new Map<string, () => void>();
  const waiting: { socket: Socket; since: number }[] = [];
  let head = 0;
  const key = (socket: Socket): string =>
    `${socket.remoteAddress}|${socket.remotePort}|${socket.localAddress}|${socket.localPort}`;

  const begin = (socket: Socket): void => {
    const id = key(socket);
    const release = (): void => {
      if (inProgress.get(id) !== release) return;
      inProgress.delete(id);
      next();
    };
    inProgress.set(id, release);
    socket.once('close', release);
    start(socket);
  };
  /** Starts waiting connections while there are slots; drops those that waited too long or went away. */
  const next = (): void => {
    while (head < waiting.length && inProgress.size < limits.max) {
      const { socket, since } = waiting[head++]!;
      if (socket.destroyed) continue;
      if (clock.now() - since > limits.waitMs) socket.destroy();
      else begin(socket);
    }
    // The queue's front is dropped now and then rather than shifted one by one.
    if (head > 1024 && head * 2 > waiting.length) {
      waiting.splice(0, head);
      head = 0;
    }
  };
  // Waiting connections whose time is up are closed even when no slot frees: checked every second until close.
  let sweep: unknown;
  const sweepEverySecond = (): void => {
    const now = clock.now();
    for (let i = head; i < waiting.length && now - waiting[i]!.since > limits.waitMs; i++)
      waiting[i]!.socket.destroy();
    sweep = clock.setTimeout(sweepEverySecond, SWEEP_MS);
  };
  sweep = clock.setTimeout(sweepEverySecond, SWEEP_MS);

  return {
    admit(socket) {
      socket.on('error', () => socket.destroy());
      if (inProgress.size < limits.max) return begin(socket);
      if (waiting.length - head >= limits.maxWaiting) return void socket.destroy();
      waiting.push({ socket, since: clock.now() });
    },
    done(socket) {
      inProgress.get(key(socket))?.();
    },
    close() {
      clock.clearTimeout(sweep);
      for (let i = head; i < waiting.length; i++) waiting[i]!.socket.destroy();
      waiting.length = head = 0;
    },
  };
}

/** A renewal refused for a reason the agent is not told. */
class Refused extends Error {}

/** The longest delay a Node timer takes (about 24.8 days); agent certificates live longer. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Calls `fire` at `when` (epoch ms, as `clock` tells it), however far off that is. */
function atTime(clock: Clock, when: number, fire: () => void): { cancel(): void } {
  let timer: unknown;
  const arm = (): void => {
    const left = when - clock.now();
    if (left <= 0) return fire();
    timer = clock.setTimeout(arm, Math.min(left, MAX_TIMER_MS));
  };
  arm();
  return { cancel: () => clock.clearTimeout(timer) };
}

interface Connected {
  /** What the tunnel's certificate is bound to; the tunnel closes when the registry stops matching it. */
  binding: AgentBinding;
  tunnel: TunnelClient;
  route: TunnelRoute;
  held: HeldTunnel;
}

export async function startTunnelListener(opts: TunnelListenerOptions): Promise<TunnelListener> {
  const log = opts.log;
  const clock = opts.clock ?? systemClock;
  const ca = await ensureSecretCA(opts.clients, opts.namespace, TUNNEL_CA_SECRET, 'sealion tunnel CA');
  const servingContext = async (hosts: string[]): Promise<{ cert: string; key: string }> => {
    const serving = await issueCert(ca, { commonName: 'sealion-tunnel', hosts, usage: 'server' });
    // The chain includes the CA, so agents that pin the CA's key (before they have it) can check it.
    return { cert: serving.certPem + ca.certPem, key: serving.keyPem };
  };
  const context = await servingContext(opts.hosts);
  const connected = new Map<string, Connected>();
  const wss = new WebSocketServer({ noServer: true, maxPayload: 4 * 1024 * 1024 });
  const replicaField = `${REPLICA_HEADER}: ${encodeURIComponent(opts.identity)}`;
  const registrations = newRateLimiter(opts.registrationLimits ?? DEFAULT_REGISTRATION_LIMITS);
  wss.on('headers', (headers) => headers.push(replicaField));

  /** A certificate for the agent of `cluster` (read from the API server just before), bound to it as it is. */
  const issue = async (cluster: Cluster, csrPem: unknown): Promise<object> => {
    if (typeof csrPem !== 'string') throw new Error('the body has no csr');
    const binding = currentBinding(cluster);
    const cert = await issueCert(ca, {
      // For people reading the certificate; the binding below is what the listener checks.
      commonName: binding.cluster,
      uris: [bindingURI(binding)],
      usage: 'client',
      validityMs: AGENT_CERT_VALIDITY_MS,
      publicKey: await publicKeyFromCSR(csrPem),
    });
    return { certificate: cert.certPem, caBundle: ca.certPem, expires: cert.cert.notAfter.toISOString() };
  };

  /** Closes the tunnel of `cluster` if the registry no longer matches the certificate it was opened with. */
  function closeIfUnbound(cluster: string): void {
    const entry = connected.get(cluster);
    if (!entry) return;
    const problem = bindingProblem(entry.binding, opts.clusters.get(cluster));
    if (!problem) return;
    log.info({ cluster, problem }, 'tunnel closed: its certificate no longer matches the Cluster');
    entry.tunnel.close();
  }

  const server: Server = createServer(
    {
      ...context,
      ca: ca.certPem,
      requestCert: true,
      // Registration has no client certificate yet; /connect and /renew check theirs themselves.
      rejectUnauthorized: false,
      minVersion: 'TLSv1.2',
      ciphers: CIPHERS,
      honorCipherOrder: true,
      // Agents' keys and the serving key are P-256: no stranger's RSA signature is ever checked (CLIENT_SIGALGS).
      sigalgs: CLIENT_SIGALGS,
      // Anyone can reach this port: what a connection that never becomes a tunnel may hold is bounded. A
      // handshake takes milliseconds; registration and renewal send a few KiB at once.
      handshakeTimeout: 10_000,
      headersTimeout: 30_000,
      requestTimeout: 30_000,
    },
    (req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      const verified = peerBinding(req.socket as TLSSocket);
      const audit = auditListenerRequest(
        opts.auditor,
        req,
        'binding' in verified ? verified.binding : undefined,
      );
      if (audit) res.once('close', () => audit.complete(res.statusCode));
      // In blocking mode nothing goes on before its event is written.
      if (audit && opts.auditor?.backend.mode === 'blocking')
        return void audit.received().then(
          () => serveListenerRequest(req, res, path, verified, audit),
          () => writeStatus(res, 503, NOT_AUDITED, { retryAfterSeconds: 1 }),
        );
      if (audit) void audit.received().catch(() => {});
      serveListenerRequest(req, res, path, verified, audit);
    },
  );

  function serveListenerRequest(
    req: IncomingMessage,
    res: ServerResponse,
    path: string | undefined,
    verified: ReturnType<typeof peerBinding>,
    audit: RequestAudit | undefined,
  ): void {
    if (req.method === 'POST' && path === '/register') {
      // Counted before the body is read, so that a refused request costs no more than its headers. Not logged: a
      // flood would otherwise become a flood of log lines.
      const wait = registrations.take(req.socket.remoteAddress ?? '');
      if (wait !== undefined)
        return writeStatus(res, 429, 'too many registrations; try again later', {
          retryAfterSeconds: wait,
        });
      void (async () => {
        let cluster = '';
        try {
          const body = (await readBody(req)) as { cluster?: unknown; token?: unknown; csr?: unknown };
          if (typeof body.cluster !== 'string' || !isDNSLabel(body.cluster))
            throw new RedeemError('Malformed', 'the body names no valid cluster');
          cluster = body.cluster;
          audit?.annotate(ANNOTATIONS.cluster, cluster);
          // Whether the cluster exists is not asked first: an unknown cluster's answer would then come sooner than
          // a known one's. The token decides (it names its cluster), and the Cluster is read once it is redeemed.
          await redeemBootstrapToken(
            opts.bootstrapTokens,
            typeof body.token === 'string' ? body.token : '',
            cluster,
          );
          const current = await opts.readCluster(cluster);
          if (!current) throw new RedeemError('Unknown', `Cluster ${cluster} was removed`);
          json(res, 200, await issue(current, body.csr));
          log.info({ cluster }, 'agent registered');
        } catch (err) {
          log.warn({ cluster, reason: (err as RedeemError).reason, err: (err as Error).message }, REJECTED);
          writeStatus(res, 401, UNAUTHORIZED);
        }
      })();
      return;
    }
    if (req.method === 'POST' && path === '/renew') {
      const refuse = (problem: string, cluster?: string): void => {
        log.warn({ cluster, problem }, 'renewal refused');
        json(res, 401, { message: 'renewal rejected' });
      };
      const peer = verified;
      if (!('binding' in peer)) return refuse(peer.problem);
      const { binding } = peer;
      // The cache turns away most stale certificates without a call to the API server.
      const cached = bindingProblem(binding, opts.clusters.get(binding.cluster));
      if (cached) return refuse(cached, binding.cluster);
      readBody(req)
        .then(async (body) => {
          const current = await opts.readCluster(binding.cluster);
          const problem = bindingProblem(binding, current);
          if (problem) throw new Refused(problem);
          return issue(current!, (body as { csr?: unknown }).csr);
        })
        .then(
          (answer) => {
            json(res, 200, answer);
            log.info({ cluster: binding.cluster }, 'agent certificate renewed');
          },
          (err: unknown) => {
            if (err instanceof Refused) return refuse(err.message, binding.cluster);
            log.warn({ cluster: binding.cluster, err: (err as Error).message }, 'renewal refused');
            json(res, 400, { message: (err as Error).message });
          },
        );
      return;
    }
    json(res, 404, { message: 'not found' });
  }

  // Renegotiation is a client-driven, expensive handshake that nothing here needs.
  server.on('secureConnection', (socket: TLSSocket) => {
    socket.disableRenegotiation();
    handshakes.done(socket);
  });

  // Agents reach the TLS server through the handshake queue, which owns the listening socket.
  const handshakes = handshakeQueue(
    (socket) => server.emit('connection', socket),
    { max: MAX_HANDSHAKES, maxWaiting: MAX_WAITING, waitMs: MAX_WAIT_MS },
    clock,
  );
  const door = createNetServer({ pauseOnConnect: true }, (socket) => handshakes.admit(socket));

  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    const verified = peerBinding(socket as TLSSocket);
    const audit = auditListenerRequest(
      opts.auditor,
      req,
      'binding' in verified ? verified.binding : undefined,
    );
    /** The status the connection was answered with: 101 once it is a tunnel. */
    let answered = 0;
    if (audit) socket.once('close', () => audit.complete(answered));
    if (audit && opts.auditor?.backend.mode === 'blocking')
      return void audit.received().then(
        () => serveConnect(req, socket, head, verified, audit, (code) => (answered = code)),
        () => {
          answered = 503;
          socket.end(rawStatusResponse(503, NOT_AUDITED));
        },
      );
    if (audit) void audit.received().catch(() => {});
    serveConnect(req, socket, head, verified, audit, (code) => (answered = code));
  });

  function serveConnect(
    req: IncomingMessage,
    socket: Socket,
    head: Buffer,
    verified: ReturnType<typeof peerBinding>,
    audit: RequestAudit | undefined,
    answer: (code: number) => void,
  ): void {
    const refuse = (code: number, problem: string): void => {
      answer(code);
      log.warn({ problem }, 'tunnel refused');
      // The same answer for every refusal; the reason goes to the log.
      socket.end(rawStatusResponse(code, code === 404 ? 'not found' : 'Unauthorized'));
    };
    if ((req.url ?? '').split('?')[0] !== '/connect') return refuse(404, `no tunnel at ${req.url}`);
    const peer = verified;
    if (!('binding' in peer)) return refuse(401, peer.problem);
    const { binding } = peer;
    const cluster = binding.cluster;
    const problem = bindingProblem(binding, opts.clusters.get(cluster));
    if (problem) return refuse(401, problem);
    if (req.headers[TUNNEL_PROTOCOL_HEADER] !== TUNNEL_PROTOCOL) {
      log.warn({ cluster }, 'tunnel refused: the agent is too old for this hub');
      const message = `this hub needs an agent that speaks tunnel protocol ${TUNNEL_PROTOCOL}: upgrade the agent`;
      answer(426);
      return void socket.end(rawStatusResponse(426, message));
    }
    // An agent that holds tunnels to several replicas wants each on another one.
    const avoid = String(req.headers[AVOID_REPLICAS_HEADER] ?? '').split(',');
    if (avoid.includes(encodeURIComponent(opts.identity))) {
      answer(ALREADY_HELD);
      return void socket.end(
        rawStatusResponse(ALREADY_HELD, `replica ${opts.identity} already holds a tunnel of this agent`),
      );
    }
    // What the agent says of itself goes into the status: printable, and short.
    const printable = (value: string): string => value.replace(/[^\x20-\x7e]/g, '').slice(0, 64) || 'unknown';
    const agentVersion = printable(String(req.headers['x-sealion-agent-version'] ?? ''));
    let policy = 'unknown';
    try {
      policy = printable(decodeURIComponent(String(req.headers[AGENT_POLICY_HEADER] ?? '')));
    } catch {
      // Not percent-encoding: said to be unknown.
    }
    const reported = String(req.headers[AGENT_IMPERSONATION_HEADER] ?? '');
    const impersonation = (['constrained', 'legacy', 'none'] as const).find((m) => m === reported) ?? 'none';
    const expires = new Date((socket as TLSSocket).getPeerX509Certificate()!.validTo);
    const certificateExpiry = expires.toISOString();
    /** Makes `stream` the cluster's tunnel, in place of any it had; `drop` ends the connection instead. */
    const accept = (stream: Duplex, transport: 'direct' | 'websocket', drop: () => void): void => {
      // The registry may have changed while the upgrade completed. From this check until the tunnel is in
      // `connected` nothing yields, so any later change reaches it through onChange.
      const registered = opts.clusters.get(cluster);
      const changed = bindingProblem(binding, registered);
      if (!registered || changed) {
        log.warn({ problem: changed }, 'tunnel refused');
        return drop();
      }
      const limits = tunnelLimits(registered.spec ?? {});
      const tunnel = newTunnelClient(stream, { maxStreams: limits.capacity });
      const previous = connected.get(cluster);
      const since = new Date(clock.now());
      const entry: Connected = {
        binding,
        tunnel,
        route: newTunnelRoute(cluster, tunnel, {
          limits,
          ...(opts.budget ? { budget: opts.budget } : {}),
        }),
        held: {
          connectedSince: since.toISOString(),
          transport,
          agentVersion,
          certificateExpiry,
          policy,
          impersonation,
        },
      };
      connected.set(cluster, entry);
      previous?.tunnel.close();
      log.info({ cluster, agentVersion, transport }, 'agent connected');
      // TLS checked the certificate once, at the handshake; the tunnel must not outlive it. The agent renews its
      // certificate long before, and dials again with the new one when this tunnel closes.
      const expiry = atTime(clock, expires.getTime(), () => {
        log.info({ cluster, certificateExpiry }, 'tunnel closed: the certificate it was opened with expired');
        tunnel.close();
      });
      opts.onTunnelChange(cluster);
      // Announced, not polled: the status changes the moment the tunnel closes.
      void tunnel.closed.then(() => {
        expiry.cancel();
        if (connected.get(cluster) !== entry) return;
        connected.delete(cluster);
        log.info({ cluster }, 'agent disconnected');
        opts.onTunnelChange(cluster);
      });
    };
    if (String(req.headers.upgrade ?? '').toLowerCase() === TUNNEL_UPGRADE) {
      // The agent waits for this answer before it sends anything more, so `head` is empty; the tunnel's pings
      // watch the connection from here on. HTTP/2 may take the socket only once the answer is written (writesDone).
      if (head.length > 0) socket.unshift(head);
      socket.setTimeout(0);
      socket.setNoDelay(true);
      answer(101);
      audit?.responseStarted(101);
      socket.write(
        `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${TUNNEL_UPGRADE}\r\n${replicaField}\r\n\r\n`,
        (err) => {
          if (err || socket.destroyed) return void socket.destroy();
          accept(socket, 'direct', () => socket.destroy());
        },
      );
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      answer(101);
      audit?.responseStarted(101);
      accept(createWebSocketStream(ws), 'websocket', () => ws.terminate());
    });
  }

  // A Cluster removed from the registry, created again, or with its agentGeneration raised loses its tunnel at
  // once, not at the agent's next reconnect; an edited one has its limits applied to the open tunnel.
  opts.clusters.onChange((obj) => {
    const name = obj.metadata.name ?? '';
    closeIfUnbound(name);
    const current = opts.clusters.get(name);
    if (current) connected.get(name)?.route.configure(tunnelLimits(current.spec ?? {}));
  });

  // Each agent holds one connection; past this many, new ones are dropped at accept rather than exhausting memory.
  door.maxConnections = MAX_TUNNEL_CONNECTIONS;
  // A port in use (EADDRINUSE) fails the start: without the handler the server would throw it as an uncaught error
  // and the start would wait for ever.
  try {
    await new Promise<void>((done, fail) => {
      door.once('error', fail);
      door.listen(opts.port, opts.host, () => {
        door.off('error', fail);
        done();
      });
    });
  } catch (err) {
    handshakes.close();
    throw err;
  }
  // The TLS server is fed connections and never listens itself; Node runs its header and request deadlines only
  // for a server that has emitted 'listening'.
  server.emit('listening');
  const port = (door.address() as AddressInfo).port;
  log.info({ host: opts.host, port }, 'tunnel listener listening');
  return {
    port,
    caPem: ca.certPem,
    route: (cluster) => connected.get(cluster)?.route,
    held: (cluster) => connected.get(cluster)?.held,
    async setHosts(hosts) {
      server.setSecureContext({
        ...(await servingContext(hosts)),
        ca: ca.certPem,
        minVersion: 'TLSv1.2',
        ciphers: CIPHERS,
        honorCipherOrder: true,
        sigalgs: CLIENT_SIGALGS,
      });
      log.info({ hosts }, 'tunnel serving certificate reissued');
    },
    async stop() {
      for (const entry of connected.values()) entry.tunnel.close();
      connected.clear();
      handshakes.close();
      server.closeAllConnections();
      await new Promise<void>((done) => door.close(() => done()));
    },
  };
}
