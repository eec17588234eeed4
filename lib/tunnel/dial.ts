// Dialing the hub's /connect, over either of the tunnel's transports. Both are mutual TLS to the tunnel listener
// and an HTTP/1.1 Upgrade; they differ in what runs on the connection afterwards:
//   - direct (`Upgrade: sealion-tunnel-h2`): the tunnel's HTTP/2 runs on the TLS socket itself, so both ends'
//     HTTP/2 reads and writes the socket in native code;
//   - websocket: the HTTP/2 runs inside WebSocket frames, through a JavaScript stream on both ends. It is the
//     fallback for networks whose proxies pass WebSocket upgrades and nothing else.
// `auto` tries direct first and falls back to WebSocket when the answer shows that something on the way does not
// pass the direct upgrade (any answer other than the listener's 101 or its 401).
import { request as httpsRequest } from 'node:https';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { createSecureContext, type SecureContext, type TLSSocket } from 'node:tls';
import { WebSocket } from 'ws';
import {
  CURRENT_PROTOCOL,
  formatProtocol,
  parseProtocol,
  skewProblem,
  UNSTATED_HUB_PROTOCOL,
  type ProtocolVersion,
} from './protocol.ts';
import { TUNNEL_PROTOCOL_HEADER, TUNNEL_UPGRADE, TUNNEL_VERSION_HEADER, writesDone } from './tunnel.ts';
import { webSocketStream } from './websocket.ts';

export type TunnelTransport = 'direct' | 'websocket';
export type TransportChoice = 'auto' | TunnelTransport;

export interface DialOptions {
  /** The hub's tunnel listener, https://host:port. */
  hub: URL;
  /**
   * The hub's CA and the agent's certificate and key, as a TLS context (tlsContext): making one parses them all,
   * which costs about as much as the rest of a dial that the hub turns away, so an agent makes it once.
   */
  tls: SecureContext;
  /** Sent as x-sealion-agent-version. */
  version: string;
  /**
   * What the agent may forward as, as it found on its cluster: the policy its RBAC was rendered from, and which
   * impersonation it holds (`constrained`, `legacy`, `none`). Sent as x-sealion-agent-policy and
   * x-sealion-agent-impersonation; the hub shows them in the Cluster's status.
   */
  forwarding?: AgentForwarding;
  /** Until the tunnel is up. Default: 10 s. */
  timeoutMs?: number;
  /** Replicas that already hold a tunnel of this agent: one of them refuses this dial (409) rather than take it. */
  avoid?: string[];
  /**
   * The tunnel protocol to state (protocol.ts). Default: CURRENT_PROTOCOL. Another is for tests only: an agent
   * that claims a protocol it does not speak breaks its own tunnel.
   */
  protocol?: ProtocolVersion;
}

/** The listener's answer to an agent that already holds a tunnel to its replica (see DialOptions.avoid). */
export const ALREADY_HELD = 409;
/** Sent by the agent: the replicas it holds tunnels to, each URI-encoded, comma-separated. */
export const AVOID_REPLICAS_HEADER = 'x-sealion-avoid-replicas';
/** Sent by the listener with its 101: the replica that took the tunnel, URI-encoded. */
export const REPLICA_HEADER = 'x-sealion-replica';
/**
 * The listener's answer to a dial while its replica hands its tunnels over (it is shutting down): 503, with a Status,
 * its protocol and DRAINING_HEADER naming the replica, URI-encoded. Dial again soon: another replica takes it.
 */
export const REPLICA_DRAINING = 503;
export const DRAINING_HEADER = 'x-sealion-replica-draining';

/** What an agent reports of what it may forward as (DialOptions.forwarding). */
export interface AgentForwarding {
  policy: string;
  impersonation: 'constrained' | 'legacy' | 'none';
}

export const AGENT_POLICY_HEADER = 'x-sealion-agent-policy';
export const AGENT_IMPERSONATION_HEADER = 'x-sealion-agent-impersonation';

function dialHeaders(opts: DialOptions): Record<string, string> {
  return {
    'x-sealion-agent-version': opts.version,
    ...(opts.forwarding
      ? {
          [AGENT_POLICY_HEADER]: encodeURIComponent(opts.forwarding.policy),
          [AGENT_IMPERSONATION_HEADER]: opts.forwarding.impersonation,
        }
      : {}),
    [TUNNEL_PROTOCOL_HEADER]: String((opts.protocol ?? CURRENT_PROTOCOL).major),
    [TUNNEL_VERSION_HEADER]: formatProtocol(opts.protocol ?? CURRENT_PROTOCOL),
    ...(opts.avoid?.length ? { [AVOID_REPLICAS_HEADER]: opts.avoid.map(encodeURIComponent).join(',') } : {}),
  };
}

function replicaOf(res: IncomingMessage, header = REPLICA_HEADER): string | undefined {
  try {
    return decodeURIComponent(String(res.headers[header] ?? '')).slice(0, 253) || undefined;
  } catch {
    return undefined;
  }
}

/**
 * The hub answered the upgrade with `status` instead of switching protocols. `hubProtocol` is the protocol the
 * answer stated: only the tunnel listener states one, so a refusal with it is the listener's own, not a proxy's.
 */
export class DialRefused extends Error {
  readonly status: number;
  readonly hubProtocol: string | undefined;
  constructor(status: number, hubProtocol?: string) {
    super(`the hub refused the tunnel: HTTP ${status}`);
    this.status = status;
    this.hubProtocol = hubProtocol;
  }
}

/** The hub's protocol and ours are outside the skew policy (protocol.ts); the message says which to upgrade. */
export class ProtocolSkew extends Error {}

/**
 * The replica the dial landed on is draining (REPLICA_DRAINING): not a skew, not a revoked certificate, nothing to
 * back off from; another replica behind the same address takes the next dial.
 */
export class ReplicaDraining extends DialRefused {
  /** The draining replica, as it named itself. */
  readonly replica: string;
  constructor(hubProtocol: string, replica: string) {
    super(REPLICA_DRAINING, hubProtocol);
    this.replica = replica;
    this.message = `hub replica ${replica} is draining`;
  }
}

/** The protocol the hub's answer states, as sent, or undefined when it states none. */
const statedProtocol = (res: IncomingMessage): string | undefined => {
  const value = res.headers[TUNNEL_VERSION_HEADER];
  return typeof value === 'string' ? value : undefined;
};

/**
 * Why we may not talk to the hub that answered `res`, as a ProtocolSkew, or undefined when we may. An answer that
 * states no protocol is a hub's from before hubs stated theirs (UNSTATED_HUB_PROTOCOL); one that states a protocol
 * that does not parse is outside any policy.
 */
function hubSkew(opts: DialOptions, res: IncomingMessage): ProtocolSkew | undefined {
  const stated = statedProtocol(res);
  const ours = opts.protocol ?? CURRENT_PROTOCOL;
  const hub = stated === undefined ? UNSTATED_HUB_PROTOCOL : parseProtocol(stated);
  if (!hub)
    return new ProtocolSkew('the hub states a tunnel protocol that does not parse: upgrade the agent');
  const problem = skewProblem(hub, ours);
  return problem ? new ProtocolSkew(problem) : undefined;
}

/**
 * The error for an answer other than the upgrade: the skew when the listener refused for it (426, stating its
 * protocol), else DialRefused. Another refusal keeps its own meaning (401: our certificate; 409: a replica we hold).
 */
function refusal(opts: DialOptions, res: IncomingMessage): Error {
  const stated = statedProtocol(res);
  const status = res.statusCode ?? 0;
  if (stated === undefined) return new DialRefused(status);
  if (status === REPLICA_DRAINING && res.headers[DRAINING_HEADER] !== undefined)
    return new ReplicaDraining(stated, replicaOf(res, DRAINING_HEADER) ?? 'unnamed');
  return (status === 426 ? hubSkew(opts, res) : undefined) ?? new DialRefused(status, stated);
}

export interface Dialed {
  /** The byte stream the tunnel's HTTP/2 runs on. */
  stream: Duplex;
  transport: TunnelTransport;
  /** The replica that took the tunnel, as it said. */
  replica?: string;
}

/** A dial in progress: `cancel` ends it (and the tunnel, once it is up). */
export interface Dial {
  done: Promise<Dialed>;
  cancel(): void;
}

const DEFAULT_TIMEOUT_MS = 10_000;

/** The TLS context for dialing: trusting `caPem`, presenting `certPem` with `keyPem`. */
export function tlsContext(caPem: string, certPem: string, keyPem: string): SecureContext {
  return createSecureContext({ ca: caPem, cert: certPem, key: keyPem });
}

/** IPv6 literals come out of URL.hostname in brackets, which the socket layer does not take. */
const hostOf = (url: URL): string => url.hostname.replace(/^\[(.*)\]$/, '$1');

/** Dials with the direct transport: an HTTP/1.1 Upgrade to TUNNEL_UPGRADE, then the TLS socket is the tunnel's. */
export function dialDirect(opts: DialOptions): Dial {
  let socket: TLSSocket | undefined;
  const req = httpsRequest({
    host: hostOf(opts.hub),
    port: Number(opts.hub.port || 443),
    path: '/connect',
    // Taken by the TLS layer; Node's HTTPS types leave it out.
    ...({ secureContext: opts.tls } as object),
    agent: false,
    headers: { connection: 'Upgrade', upgrade: TUNNEL_UPGRADE, ...dialHeaders(opts) },
    timeout: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS,
  });
  const done = new Promise<Dialed>((resolve, reject) => {
    req.once('timeout', () => req.destroy(new Error('the hub did not answer the tunnel upgrade in time')));
    req.once('error', reject);
    req.once('response', (res: IncomingMessage) => {
      res.resume();
      req.destroy();
      reject(refusal(opts, res));
    });
    req.once('upgrade', (res: IncomingMessage, upgraded: TLSSocket, head: Buffer) => {
      socket = upgraded;
      if (String(res.headers.upgrade ?? '').toLowerCase() !== TUNNEL_UPGRADE) {
        upgraded.destroy();
        return reject(new DialRefused(res.statusCode ?? 0));
      }
      const skew = hubSkew(opts, res);
      if (skew) {
        upgraded.destroy();
        return reject(skew);
      }
      // The tunnel's pings watch the connection from here on; the dial's deadline no longer applies.
      upgraded.setTimeout(0);
      upgraded.setNoDelay(true);
      // Bytes that came with the 101 are the hub's first HTTP/2 frames: the session reads them from the buffer.
      if (head.length > 0) upgraded.unshift(head);
      const replica = replicaOf(res);
      void writesDone(upgraded).then(() =>
        resolve({ stream: upgraded, transport: 'direct', ...(replica ? { replica } : {}) }),
      );
    });
    req.end();
  });
  return {
    done,
    cancel() {
      req.destroy();
      socket?.destroy();
    },
  };
}

/** Dials with the WebSocket transport. */
export function dialWebSocket(opts: DialOptions): Dial {
  const url = new URL('/connect', opts.hub);
  url.protocol = 'wss:';
  const ws = new WebSocket(url, {
    // Passed on to the TLS layer; the WebSocket library's types leave it out.
    ...({ secureContext: opts.tls } as object),
    headers: dialHeaders(opts),
    handshakeTimeout: opts.timeoutMs ?? DEFAULT_TIMEOUT_MS,
    // The tunnel carries HTTP/2, whose headers are compressed already and whose bodies the API server compresses
    // when asked: deflating every message again would cost both ends CPU and a compressor's memory per tunnel.
    perMessageDeflate: false,
  });
  const done = new Promise<Dialed>((resolve, reject) => {
    ws.once('unexpected-response', (_req, res: IncomingMessage) => {
      ws.terminate();
      reject(refusal(opts, res));
    });
    ws.once('error', reject);
    let replica: string | undefined;
    let skew: ProtocolSkew | undefined;
    ws.once('upgrade', (res: IncomingMessage) => {
      replica = replicaOf(res);
      skew = hubSkew(opts, res);
    });
    ws.once('open', () => {
      if (!skew)
        return resolve({
          stream: webSocketStream(ws),
          transport: 'websocket',
          ...(replica ? { replica } : {}),
        });
      ws.terminate();
      reject(skew);
    });
  });
  return { done, cancel: () => ws.terminate() };
}

/**
 * Whether a failed direct dial says that the way to the hub does not pass the direct upgrade: any answer but the
 * listener's 401 or 409, or one that states the listener's protocol (a proxy's 400 or 426 for an upgrade it does
 * not know, a 101 to something else). A connection that failed or timed out says nothing about the transport, nor
 * does a refusal for the protocol's skew (ProtocolSkew, not a DialRefused).
 */
export const directNotPassed = (err: unknown): boolean =>
  err instanceof DialRefused &&
  err.status !== 401 &&
  err.status !== ALREADY_HELD &&
  err.hubProtocol === undefined;
