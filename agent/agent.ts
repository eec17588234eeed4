// The agent without its command line: registers once (bootstrap token + CSR → client certificate, persisted by
// the caller's store), then holds a mutual-TLS connection to the hub's tunnel listener (lib/tunnel/dial.ts: HTTP/2
// on the TLS socket, or inside a WebSocket where only that passes) and serves the tunnel's streams with its local
// proxy. It reconnects on its own with jittered exponential backoff (1 s → 30 s) and renews its certificate over
// mutual TLS once two thirds of its lifetime have passed. When the hub refuses its certificate
// (revoked, or its Cluster was created anew) and it was given a bootstrap token it has not used yet, it registers
// again with that token.
import { AGENT_DRAIN_SECONDS } from '../apis/install.ts';
import { X509Certificate } from 'node:crypto';
import { connect as tlsConnect, type SecureContext, type TLSSocket } from 'node:tls';
import { exponentialBackoff } from '../lib/backoff.ts';
import { systemClock, type Clock } from '../lib/clock.ts';
import { HttpsError, httpsJSON } from '../lib/https-client.ts';
import { newLifecycle, type Lifecycle } from '../lib/lifecycle.ts';
import type { Logger } from '../lib/log.ts';
import { peerChain } from '../lib/pki/pem.ts';
import { newCSR, spkiPin } from '../lib/pki/pki.ts';
import type { ProtocolVersion } from '../lib/tunnel/protocol.ts';
import { serveTunnel, type TunnelServer } from '../lib/tunnel/tunnel.ts';
import {
  ALREADY_HELD,
  dialDirect,
  DialRefused,
  dialWebSocket,
  directNotPassed,
  ProtocolSkew,
  ReplicaDraining,
  tlsContext,
  type Dialed,
  type AgentForwarding,
  type TransportChoice,
  type TunnelTransport,
} from '../lib/tunnel/dial.ts';
import { newLocalProxy, type LocalProxy, type LocalUpstream } from './local-proxy.ts';

export interface AgentCredentials {
  certPem: string;
  keyPem: string;
  /** The hub's tunnel CA. */
  caPem: string;
}

/** Where the agent keeps its identity (a Secret in its cluster), so a restart does not register again. */
export interface CredentialStore {
  load(): Promise<AgentCredentials | undefined>;
  save(credentials: AgentCredentials): Promise<void>;
}

export interface AgentOptions {
  cluster: string;
  /** The hub's tunnel listener, https://host:port. */
  hub: URL;
  /** How to trust the hub before registration: its CA bundle, or an SPKI pin of its CA (`sha256:<hex>`). */
  trust: { caPem: string } | { pin: string };
  /** The one-time bootstrap token (only needed until registered). */
  bootstrapToken: () => string | undefined;
  store: CredentialStore;
  upstream: LocalUpstream;
  version: string;
  /** What the agent may forward as, reported to the hub at every dial. */
  forwarding?: AgentForwarding;
  log: Logger;
  /** Times the pauses between dials and the renewal checks, and says when renewal is due. Default: systemClock. */
  clock?: Clock;
  /** Which tunnel transport to dial (lib/tunnel/dial.ts). Default: auto. */
  transport?: TransportChoice;
  /**
   * Tunnels to hold, each to another hub replica behind the one address (DEFAULT_TUNNELS). More than one lets the
   * cluster stay reachable while a replica restarts; each costs a connection on both ends.
   */
  tunnels?: number;
  /**
   * How long drain() lets the streams in flight end after telling the hub this agent leaves. Default:
   * DEFAULT_DRAIN_MS.
   */
  drainMs?: number;
  /**
   * The tunnel protocol to claim. Default: the one this build speaks (lib/tunnel/protocol.ts). Tests only: no flag
   * or setting of `sealion agent` reaches it, and an agent claiming a protocol it does not speak breaks its tunnel.
   */
  protocol?: ProtocolVersion;
}

/**
 * Two tunnels, each to another replica where there are two: a replica that dies (or restarts in a rollout) leaves
 * every cluster reachable through its other tunnel. Measured (`npm run bench -- peering`, failover): with one
 * tunnel, the clusters whose only tunnel was on a killed replica came back to routing over seconds to tens of seconds
 * as their agents dialed again; with two, none was lost. Two connections per agent, whatever the number of replicas,
 * so the port exhaustion one tunnel per replica brings (RFD 69) does not come back.
 */
export const DEFAULT_TUNNELS = 2;
/** AGENT_DRAIN_SECONDS (apis/install.ts says why). */
export const DEFAULT_DRAIN_MS = AGENT_DRAIN_SECONDS * 1000;
export const MAX_TUNNELS = 8;

/**
 * start() begins dialing and resolves at once: a hub that cannot be reached yet is dialed again and again, never a
 * failed start. stop() closes the tunnels and waits for them. drain() first tells the hub on each tunnel that this
 * agent leaves (the hub sends new requests by the tunnels of the agent's other pod, or a peer's), lets the streams in
 * flight end for up to `drainMs`, then stops.
 */
export interface Agent extends Lifecycle<void> {
  /** Whether at least one tunnel is up. */
  connected(): boolean;
  /** The replicas holding this agent's tunnels now. */
  replicas(): string[];
  /** Renews the certificate now (normally done at two thirds of its lifetime). */
  renew(): Promise<void>;
}

const MIN_BACKOFF_MS = 1_000;
const MAX_BACKOFF_MS = 30_000;
/** A connection that stayed up this long resets the backoff. */
const STABLE_MS = 30_000;
/** After a dial lands on a replica that holds another of our tunnels: 15 s, doubling up to 5 min, half jittered. */
const TAKEN_BACKOFF_MS = 15_000;
const MAX_TAKEN_BACKOFF_MS = 300_000;
/**
 * After a hub replica asked a tunnel to move, or refused a dial because it drains: 1 to 3 s, jittered. The replica is
 * leaving (a rolling upgrade, a node drain), and the cluster has one tunnel fewer until this dial lands elsewhere; the
 * jitter spreads a replica's agents over two seconds rather than one burst of handshakes at the others.
 */
const MOVE_DIAL_MS = 1_000;
const MOVE_JITTER_MS = 2_000;
/**
 * Dials after a move that may land on a replica holding another of our tunnels (409) and still come back quickly: in
 * a rollout the replacement replica is up already (surge first), and the address picks a replica at random, so a few
 * quick dials find it. Past these, the 409 backoff above (fewer replicas than tunnels is no emergency). With two
 * replicas to land on, one of them ours, four dials all missed one time in 16: that tunnel then waited 7.5 to 15 s,
 * and when the rollout moved our other tunnel meanwhile the cluster had none (a rolling upgrade under load saw its
 * edge unreachable for 4.5 s). Eleven miss one time in 2,000, and a dial that lands ends them.
 */
const MOVE_QUICK_DIALS = 10;
/** How long the other tunnels wait for the first to come up before they dial anyway. */
const FIRST_DIAL_WAIT_MS = 10_000;
const RENEW_CHECK_MS = 60 * 60 * 1000;
const RENEW_AT_FRACTION = 2 / 3;

/** The hub answered 401 to our certificate: it is revoked, or its Cluster is gone or was created anew. */
class CertificateRefused extends Error {}

const isRefusal = (err: unknown): boolean =>
  err instanceof CertificateRefused || (err instanceof HttpsError && err.status === 401);

class OldHub extends Error {}

/** One of the tunnels the agent holds, and how to stop it. */
interface Slot {
  /** Resolves once this slot's first dial has ended, either way: the next slot waits for it. */
  dialedOnce: Promise<void>;
  markDialed: () => void;
  /** The replica it is up to, once up. */
  replica?: string;
  connected: boolean;
  cancelDial?: () => void;
  tunnel?: TunnelServer;
  wake?: () => void;
}

/** The chain the server sent, leaf first, as PEM. */
function chainOf(socket: TLSSocket): string[] {
  return peerChain(socket.getPeerCertificate(true)).map(
    (cert) => `-----BEGIN CERTIFICATE-----\n${cert.raw.toString('base64')}\n-----END CERTIFICATE-----\n`,
  );
}

/**
 * The CA a pin names, taken from the chain the hub sends: the chain must hold a certificate with the pinned key
 * that signed the leaf. The caller then trusts that CA with ordinary verification (host name included), so
 * nothing is sent on the strength of the pin alone.
 */
function caMatchingPin(hub: URL, pin: string): Promise<string> {
  return new Promise((done, fail) => {
    const socket = tlsConnect({
      host: hub.hostname,
      port: Number(hub.port || 443),
      rejectUnauthorized: false,
      ALPNProtocols: ['http/1.1'],
    });
    socket.once('secureConnect', () => {
      const [leafPem, ...rest] = chainOf(socket);
      socket.destroy();
      const anchor = rest.find((pem) => spkiPin(pem) === pin);
      if (!leafPem || !anchor || !new X509Certificate(leafPem).verify(new X509Certificate(anchor).publicKey))
        return fail(new Error(`the hub's certificate does not match the pin ${pin}`));
      done(anchor);
    });
    socket.once('error', fail);
  });
}

export function newAgent(opts: AgentOptions): Agent {
  const clock = opts.clock ?? systemClock;
  const agent: Holding = {
    opts,
    log: opts.log,
    clock,
    slots: newSlots(opts.tunnels),
    stopped: false,
    leaving: new Set(),
  };
  const identity = newIdentity(opts, clock);
  const dial = newDialer(agent);
  let started = false;
  const lifecycle = newLifecycle('agent', opts.log, (onStop, onDrain) => {
    if (started) throw new Error('the agent was started already');
    started = true;
    // The local proxy serves the tunnels' streams; it is closed after they are.
    const local = newLocalProxy(opts.upstream);
    onStop(() => local.close());
    const renewal = checkRenewal(identity, clock, opts.log);
    onStop(() => renewal.cancel());
    const loop = Promise.all(
      agent.slots.map((slot, index) => holdTunnel(agent, slot, index, { identity, dial, local })),
    );
    onStop(() => closeTunnels(agent, loop));
    onDrain((signal) => leaveHub(agent, opts.drainMs ?? DEFAULT_DRAIN_MS, signal));
    return Promise.resolve();
  });

  return {
    ...lifecycle,
    connected: () => agent.slots.some((s) => s.connected),
    replicas: () => agent.slots.flatMap((s) => (s.connected && s.replica ? [s.replica] : [])),
    renew: () => identity.renew(),
  };
}

/** What the tunnels of one agent share. */
interface Holding {
  opts: AgentOptions;
  log: Logger;
  clock: Clock;
  slots: Slot[];
  /** Set once stop() began: nothing dials again. */
  stopped: boolean;
  /** Tunnels a hub replica asked to move, serving their streams in flight until they close. */
  leaving: Set<TunnelServer>;
}

/** The slots for the tunnels to hold: DEFAULT_TUNNELS, at least one and at most MAX_TUNNELS. */
function newSlots(tunnels: number | undefined): Slot[] {
  const count = Math.min(Math.max(Math.trunc(tunnels ?? DEFAULT_TUNNELS), 1), MAX_TUNNELS);
  return Array.from({ length: count }, () => {
    let markDialed: () => void = () => {};
    const dialedOnce = new Promise<void>((done) => (markDialed = done));
    return { connected: false, dialedOnce, markDialed };
  });
}

/**
 * The agent's drain: nothing dials again, each tunnel tells the hub this agent leaves (TunnelServer's leave), and the
 * tunnels close as their streams in flight end, within `boundMs`; the stop that follows closes what is left.
 */
async function leaveHub(agent: Holding, boundMs: number, signal: AbortSignal): Promise<void> {
  const { log, clock } = agent;
  agent.stopped = true;
  const tunnels = [...agent.slots.flatMap((s) => (s.tunnel ? [s.tunnel] : [])), ...agent.leaving];
  for (const slot of agent.slots) {
    if (!slot.tunnel) slot.cancelDial?.();
    slot.wake?.();
  }
  for (const tunnel of tunnels) tunnel.leave();
  log.info(
    { tunnels: tunnels.length, boundSeconds: boundMs / 1000 },
    'draining: told the hub this agent leaves',
  );
  let timer: unknown;
  const outcome = await Promise.race([
    Promise.all(tunnels.map((t) => t.closed)).then(() => 'closed' as const),
    new Promise<'bound'>((done) => (timer = clock.setTimeout(() => done('bound'), boundMs))),
    new Promise<'cut'>((done) => signal.addEventListener('abort', () => done('cut'), { once: true })),
  ]);
  clock.clearTimeout(timer);
  log.info({ outcome }, 'drained');
}

/** Stops holding: closes each tunnel (or its dial under way), wakes each pause, and waits for every slot to end. */
async function closeTunnels(agent: Holding, loop: Promise<unknown>): Promise<void> {
  agent.stopped = true;
  for (const slot of agent.slots) {
    // Through the tunnel's stream: see lib/tunnel/tunnel.ts on closing.
    if (slot.tunnel) slot.tunnel.close();
    else slot.cancelDial?.();
    slot.wake?.();
  }
  for (const tunnel of agent.leaving) tunnel.close();
  await loop;
  await Promise.all([...agent.leaving].map((t) => t.closed));
}

/** The agent's certificate: loaded, registered, renewed, and registered again after a refusal. */
interface Identity {
  /** The credentials to dial with: loaded, registered or renewed once for all slots that ask at the same time. */
  ensure(): Promise<AgentCredentials>;
  renew(): Promise<void>;
  /** Whether the credentials in use are two thirds through their life. */
  renewalDue(): boolean;
  /**
   * After the hub refused our certificate: registers with the bootstrap token if there is one we have not sent
   * yet (an admin ran `sealion cluster add` again and restarted us with its token). Otherwise the certificate is
   * kept, since the refusal may be a replica that has not yet seen our Cluster's latest state. True when it
   * registered.
   */
  registerAgain(): Promise<boolean>;
}

function newIdentity(opts: AgentOptions, clock: Clock): Identity {
  const log = opts.log;
  let credentials: AgentCredentials | undefined;
  /** The last token sent to /register: tokens work once, so a refused certificate never sends it again. */
  let spentToken: string | undefined;
  let ensuring: Promise<AgentCredentials> | undefined;

  const register = async (): Promise<AgentCredentials> => {
    const token = opts.bootstrapToken();
    if (!token) throw new Error('not registered yet, and no bootstrap token was given');
    spentToken = token;
    return registerWithHub(opts, token);
  };
  const due = (c: AgentCredentials): boolean => {
    const cert = new X509Certificate(c.certPem);
    const from = Date.parse(cert.validFrom);
    return clock.now() >= from + (Date.parse(cert.validTo) - from) * RENEW_AT_FRACTION;
  };
  const renew = async (): Promise<void> => {
    const current = credentials ?? (await opts.store.load());
    if (!current) throw new Error('nothing to renew: not registered');
    credentials = await renewWithHub(opts, current);
    await opts.store.save(credentials);
    log.info(
      { cluster: opts.cluster, expires: new X509Certificate(credentials.certPem).validTo },
      'certificate renewed',
    );
  };

  return {
    ensure() {
      ensuring ??= (async () => {
        credentials ??= (await opts.store.load()) ?? (await register());
        if (due(credentials)) await renew();
        return credentials;
      })().finally(() => (ensuring = undefined));
      return ensuring;
    },
    renew,
    renewalDue: () => credentials !== undefined && due(credentials),
    async registerAgain() {
      const token = opts.bootstrapToken();
      if (!token || token === spentToken) return false;
      try {
        credentials = await register();
        return true;
      } catch (err) {
        log.warn({ err: (err as Error).message }, 'registering again failed');
        return false;
      }
    },
  };
}

/** Trades the bootstrap token and a CSR for a certificate, trusting the hub by its CA bundle or pin; saves it. */
async function registerWithHub(opts: AgentOptions, token: string): Promise<AgentCredentials> {
  const { csrPem, keyPem } = await newCSR(opts.cluster);
  const caBundlePem =
    'caPem' in opts.trust ? opts.trust.caPem : await caMatchingPin(opts.hub, opts.trust.pin);
  const answer = (
    await httpsJSON(new URL('/register', opts.hub).toString(), {
      method: 'POST',
      body: { cluster: opts.cluster, token, csr: csrPem },
      caBundlePem,
    })
  ).json as { certificate: string; caBundle: string };
  const registered = { certPem: answer.certificate, keyPem, caPem: answer.caBundle };
  await opts.store.save(registered);
  opts.log.info({ cluster: opts.cluster }, 'registered with the hub');
  return registered;
}

/** A new certificate for a new key, asked for over mutual TLS with the current one. */
async function renewWithHub(opts: AgentOptions, current: AgentCredentials): Promise<AgentCredentials> {
  const { csrPem, keyPem } = await newCSR(opts.cluster);
  const answer = (
    await httpsJSON(new URL('/renew', opts.hub).toString(), {
      method: 'POST',
      body: { csr: csrPem },
      caBundlePem: current.caPem,
      clientCert: { certPem: current.certPem, keyPem: current.keyPem },
    })
  ).json as { certificate: string; caBundle: string };
  return { certPem: answer.certificate, keyPem, caPem: answer.caBundle };
}

/** Checks every RENEW_CHECK_MS whether renewal is due, until `cancel`. */
function checkRenewal(identity: Identity, clock: Clock, log: Logger): { cancel(): void } {
  let timer: unknown;
  const check = (): void => {
    if (identity.renewalDue())
      identity
        .renew()
        .catch((err: unknown) => log.warn({ err: (err as Error).message }, 'renewal failed; retrying later'));
    timer = clock.setTimeout(check, RENEW_CHECK_MS);
  };
  timer = clock.setTimeout(check, RENEW_CHECK_MS);
  return { cancel: () => clock.clearTimeout(timer) };
}

type Dial = (c: AgentCredentials, slot: Slot) => Promise<Dialed>;

/**
 * Dials one tunnel with the given credentials, asking for a replica none of the other slots holds. The transport:
 * `auto` starts with direct and stays on WebSocket once direct did not pass.
 */
function newDialer(agent: Holding): Dial {
  const { opts, log } = agent;
  let transport: TunnelTransport = opts.transport === 'websocket' ? 'websocket' : 'direct';
  /** Each set of credentials' TLS context, made at its first dial. */
  const contexts = new WeakMap<AgentCredentials, SecureContext>();

  return async (c, slot) => {
    let tls = contexts.get(c);
    if (!tls) contexts.set(c, (tls = tlsContext(c.caPem, c.certPem, c.keyPem)));
    const avoid = agent.slots.flatMap((s) => (s !== slot && s.connected && s.replica ? [s.replica] : []));
    const options = {
      hub: opts.hub,
      tls,
      version: opts.version,
      avoid,
      ...(opts.forwarding ? { forwarding: opts.forwarding } : {}),
      ...(opts.protocol ? { protocol: opts.protocol } : {}),
    };
    const attempt = async (): Promise<Dialed> => {
      const current = (transport === 'direct' ? dialDirect : dialWebSocket)(options);
      slot.cancelDial = () => current.cancel();
      try {
        return await current.done;
      } catch (err) {
        if (err instanceof DialRefused && err.status === 401) throw new CertificateRefused(err.message);
        throw err;
      }
    };
    try {
      return await attempt();
    } catch (err) {
      if (
        (opts.transport ?? 'auto') !== 'auto' ||
        transport !== 'direct' ||
        !directNotPassed(err) ||
        agent.stopped
      )
        throw err;
      log.warn(
        { err: (err as Error).message },
        'the way to the hub does not pass the direct tunnel; using WebSocket from now on',
      );
      transport = 'websocket';
      return attempt();
    }
  };
}

/** What holding a tunnel takes besides the agent's state. */
interface TunnelParts {
  identity: Identity;
  dial: Dial;
  local: LocalProxy;
}

/**
 * One tunnel, from dial to close. Resolves when it closes (`closed`), or when its replica asked it to move (`moved`):
 * then it goes on serving its streams in flight, in `agent.leaving`, while the slot dials another. Rejects when it
 * could not be opened.
 */
async function connectOnce(
  agent: Holding,
  c: AgentCredentials,
  slot: Slot,
  parts: TunnelParts,
): Promise<'closed' | 'moved'> {
  const { log } = agent;
  const dialed = await parts.dial(c, slot);
  if (agent.stopped) {
    dialed.stream.destroy();
    return 'closed';
  }
  if (slot !== agent.slots[0] && !dialed.replica) {
    // A hub from before replicas said who they are: it keeps one tunnel per agent, and a second would replace the
    // first, again and again.
    dialed.stream.destroy();
    throw new OldHub('the hub does not name its replicas: holding one tunnel only');
  }
  slot.connected = true;
  if (dialed.replica) slot.replica = dialed.replica;
  slot.markDialed();
  log.info({ hub: agent.opts.hub.origin, transport: dialed.transport, replica: dialed.replica }, 'tunnel up');
  const current = serveTunnel(dialed.stream, {
    connect: (stream) => parts.local.accept(stream),
    request: (stream, headers, rawHeaders) => parts.local.serve(stream, headers, rawHeaders),
  });
  slot.tunnel = current;
  const ended = await Promise.race([
    current.closed.then(() => 'closed' as const),
    current.moveRequested.then((reason) => reason),
  ]);
  slot.tunnel = undefined;
  slot.connected = false;
  delete slot.replica;
  if (ended === 'closed') {
    log.info({ replica: dialed.replica }, 'tunnel down');
    return 'closed';
  }
  // Its streams in flight end here; new ones come through the tunnel the slot dials now.
  agent.leaving.add(current);
  void current.closed.then(() => {
    agent.leaving.delete(current);
    log.info({ replica: dialed.replica }, 'moved tunnel down');
  });
  // The hub's answer to this agent's own leave (its GOAWAY in return) is no request to move.
  if (agent.stopped) return 'closed';
  log.info(
    { replica: dialed.replica, reason: ended },
    'hub replica asked this tunnel to move; dialing another',
  );
  return 'moved';
}

/** The pause before a dial that replaces a tunnel asked to move or refused by a draining replica. */
const moveDelay = (): number => MOVE_DIAL_MS + MOVE_JITTER_MS * Math.random();

// Between dials nothing else may keep the process up (no tunnel, no socket): the pause does, until stop wakes it.
const sleep = (clock: Clock, slot: Slot, ms: number): Promise<void> =>
  new Promise((done) => {
    const timer = clock.setTimeout(done, ms, { keepAlive: true });
    slot.wake = () => {
      clock.clearTimeout(timer);
      done();
    };
  });

/** Holds one tunnel: dials, serves it until it closes, and dials again after a jittered backoff. */
async function holdTunnel(agent: Holding, slot: Slot, index: number, parts: TunnelParts): Promise<void> {
  const { log, clock, slots } = agent;
  // Each slot dials once the one before it knows its replica, so that it can ask for another.
  if (index > 0) await Promise.race([slots[index - 1]!.dialedOnce, sleep(clock, slot, FIRST_DIAL_WAIT_MS)]);
  let failures = 0;
  /** Dials in a row that landed on a replica holding another of our tunnels. */
  let landedTaken = 0;
  /** Dials left that come back quickly after landing on a replica we hold (MOVE_QUICK_DIALS). */
  let quickDials = 0;
  while (!agent.stopped) {
    const started = clock.now();
    try {
      const ended = await connectOnce(agent, await parts.identity.ensure(), slot, parts);
      landedTaken = 0;
      quickDials = 0;
      if (ended === 'moved') {
        quickDials = MOVE_QUICK_DIALS;
        await sleep(clock, slot, moveDelay());
        continue;
      }
    } catch (err) {
      slot.markDialed();
      if (err instanceof OldHub) return log.warn(err.message);
      if (err instanceof ReplicaDraining) {
        log.info({ replica: err.replica }, 'hub replica draining; dialing again soon');
        await sleep(clock, slot, moveDelay());
        continue;
      }
      if (err instanceof DialRefused && err.status === ALREADY_HELD && quickDials > 0) {
        quickDials--;
        log.debug({ err: err.message }, 'landed on a replica that holds another tunnel; dialing again soon');
        await sleep(clock, slot, moveDelay());
        continue;
      }
      if (err instanceof DialRefused && err.status === ALREADY_HELD) {
        // Fewer replicas answer than we want tunnels (one is down, or there are few): the cluster is reachable
        // through our other tunnels, so this one comes back slowly. Each dial costs the hub a TLS handshake, and
        // a thousand agents dialing fast while a replica is away would be the herd that slows its return.
        log.debug({ err: err.message }, 'landed on a replica that holds another tunnel');
        const delay = exponentialBackoff(++landedTaken, TAKEN_BACKOFF_MS, MAX_TAKEN_BACKOFF_MS);
        await sleep(clock, slot, delay / 2 + (delay / 2) * Math.random());
        continue;
      }
      // A hub outside the skew policy stays so until one end is upgraded: dialed again with the usual backoff (a
      // hub rolled forward or back meanwhile takes the agent at once), and said in one line of what to upgrade.
      if (err instanceof ProtocolSkew) log.warn({ problem: err.message }, 'tunnel refused');
      else log.warn({ err: (err as Error).message }, 'tunnel failed');
      // A new certificate dials at once; the token is spent then, so this cannot repeat without a pause.
      if (isRefusal(err) && !agent.stopped && (await parts.identity.registerAgain())) continue;
    }
    if (agent.stopped) break;
    failures = clock.now() - started > STABLE_MS ? 0 : failures + 1;
    const delay = exponentialBackoff(failures, MIN_BACKOFF_MS, MAX_BACKOFF_MS);
    // Full jitter: anywhere up to the delay, so that agents dropped together (a hub replica restarting) come back
    // spread over it rather than in waves.
    await sleep(clock, slot, delay * Math.random());
  }
}
