// GET /connect (mutual TLS, an Upgrade): the tunnel. It runs on the TLS connection itself after an Upgrade to
// TUNNEL_UPGRADE, or inside a WebSocket for agents behind proxies that pass only those (lib/tunnel/dial.ts). The
// certificate's binding is checked against the Cluster registry before the answer, and again as the tunnel is taken
// (held-tunnels.ts).
import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import type { WebSocketServer } from 'ws';
import type { AgentBinding } from '../../apis/agent-binding.ts';
import type { Cluster } from '../../apis/tunnel.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import { rawStatusResponse } from '../../lib/kube/status.ts';
import type { Logger } from '../../lib/log.ts';
import {
  AGENT_IMPERSONATION_HEADER,
  AGENT_POLICY_HEADER,
  ALREADY_HELD,
  AVOID_REPLICAS_HEADER,
  DRAINING_HEADER,
  REPLICA_DRAINING,
} from '../../lib/tunnel/dial.ts';
import { CURRENT_PROTOCOL, parseProtocol, skewProblem, supportedRange } from '../../lib/tunnel/protocol.ts';
import {
  TUNNEL_PROTOCOL_HEADER,
  TUNNEL_UPGRADE,
  TUNNEL_VERSION,
  TUNNEL_VERSION_HEADER,
} from '../../lib/tunnel/tunnel.ts';
import { webSocketStream } from '../../lib/tunnel/websocket.ts';
import type { RequestAudit } from '../audit/audit.ts';
import { bindingProblem, type VerifiedPeer } from './binding.ts';
import type { AgentReport, HeldTunnels } from './held-tunnels.ts';

export interface ConnectDoor {
  clusters: Informer<Cluster>;
  /** This replica's name, told to each agent that connects. */
  identity: string;
  /** The answer's header field that names this replica. */
  replicaField: string;
  wss: WebSocketServer;
  tunnels: HeldTunnels;
  log: Logger;
  /** A verified agent was refused for its tunnel protocol: the Cluster's status says so (cluster-status.ts). */
  onProtocolRefused(cluster: string, problem: string): void;
  /** Set when this replica hands its tunnels over (listener.ts handOver): it takes no new tunnel. */
  draining: boolean;
}

/** A refusal of the upgrade: the status, what the agent is told, what the log says and any fields to add. */
interface ConnectRefusal {
  code: number;
  message: string;
  problem?: string;
  headers?: Record<string, string>;
}

/** Why the connection may not become a tunnel, or the binding it becomes one for. */
function connectRefusal(
  door: ConnectDoor,
  req: IncomingMessage,
  verified: VerifiedPeer,
): ConnectRefusal | { binding: AgentBinding } {
  // The same answer for every refusal of the certificate; the reason goes to the log.
  const unauthorized = (problem: string): ConnectRefusal => ({ code: 401, message: 'Unauthorized', problem });
  if ((req.url ?? '').split('?')[0] !== '/connect')
    return { code: 404, message: 'not found', problem: `no tunnel at ${req.url}` };
  if (!('binding' in verified)) return unauthorized(verified.problem);
  const { binding } = verified;
  const problem = bindingProblem(binding, door.clusters.get(binding.cluster));
  if (problem) return unauthorized(problem);
  const skew = agentSkew(req.headers[TUNNEL_VERSION_HEADER] ?? req.headers[TUNNEL_PROTOCOL_HEADER]);
  if (skew) {
    door.log.warn({ cluster: binding.cluster, problem: skew }, 'tunnel refused');
    door.onProtocolRefused(binding.cluster, skew);
    return { code: 426, message: skew };
  }
  // After the skew: an agent that no replica serves is told that rather than sent from one to the next.
  if (door.draining)
    return {
      code: REPLICA_DRAINING,
      message: `replica ${door.identity} is draining and takes no new tunnel; dial again: another replica takes it`,
      headers: { [DRAINING_HEADER]: encodeURIComponent(door.identity), 'retry-after': '1' },
    };
  // An agent that holds tunnels to several replicas wants each on another one.
  const avoid = String(req.headers[AVOID_REPLICAS_HEADER] ?? '').split(',');
  if (avoid.includes(encodeURIComponent(door.identity)))
    return {
      code: ALREADY_HELD,
      message: `replica ${door.identity} already holds a tunnel of this agent`,
    };
  return { binding };
}

/**
 * Why an agent that states `stated` as its protocol is not served (the skew policy, lib/tunnel/protocol.ts), or
 * undefined when it is. An agent that states none speaks the first protocol, from before the version was sent.
 */
function agentSkew(stated: string | string[] | undefined): string | undefined {
  if (stated === undefined)
    return (
      `the agent speaks tunnel protocol 1 and the hub ${TUNNEL_VERSION}, which serves agents of ` +
      `${supportedRange(CURRENT_PROTOCOL)}: upgrade the agent`
    );
  const agent = parseProtocol(stated);
  if (!agent)
    return `the agent states a tunnel protocol that does not parse; the hub serves agents of ${supportedRange(CURRENT_PROTOCOL)}`;
  return skewProblem(CURRENT_PROTOCOL, agent);
}

/** Every answer to /connect states the hub's protocol: the agent tells the listener's refusals from a proxy's. */
export const PROTOCOL_FIELD = `${TUNNEL_VERSION_HEADER}: ${TUNNEL_VERSION}`;

/** What the agent says of itself goes into the status: printable, and short. */
const printable = (value: string): string => value.replace(/[^\x20-\x7e]/g, '').slice(0, 64) || 'unknown';

/** What the agent says of itself in its request, and when the certificate it dialed with expires. */
function agentReport(req: IncomingMessage, socket: Socket): AgentReport {
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
  return { agentVersion, certificateExpiry: expires.toISOString(), policy, impersonation };
}

/** Serves an upgrade; `answer` is told the status the connection was answered with (101 once it is a tunnel). */
export function serveConnect(
  door: ConnectDoor,
  req: IncomingMessage,
  socket: Socket,
  head: Buffer,
  verified: VerifiedPeer,
  audit: RequestAudit | undefined,
  answer: (code: number) => void,
): void {
  const refusal = connectRefusal(door, req, verified);
  if (!('binding' in refusal)) {
    answer(refusal.code);
    if (refusal.problem !== undefined) door.log.warn({ problem: refusal.problem }, 'tunnel refused');
    return void socket.end(
      rawStatusResponse(refusal.code, refusal.message, {
        headers: { ...refusal.headers, [TUNNEL_VERSION_HEADER]: TUNNEL_VERSION },
      }),
    );
  }
  const { binding } = refusal;
  const report = agentReport(req, socket);
  if (String(req.headers.upgrade ?? '').toLowerCase() === TUNNEL_UPGRADE) {
    // The agent waits for this answer before it sends anything more, so `head` is empty; the tunnel's pings
    // watch the connection from here on. HTTP/2 may take the socket only once the answer is written (writesDone).
    if (head.length > 0) socket.unshift(head);
    socket.setTimeout(0);
    socket.setNoDelay(true);
    answer(101);
    audit?.responseStarted(101);
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${TUNNEL_UPGRADE}\r\n${door.replicaField}\r\n${PROTOCOL_FIELD}\r\n\r\n`,
      (err) => {
        if (err || socket.destroyed) return void socket.destroy();
        door.tunnels.accept(binding, socket, 'direct', report, () => socket.destroy());
      },
    );
    return;
  }
  door.wss.handleUpgrade(req, socket, head, (ws) => {
    answer(101);
    audit?.responseStarted(101);
    door.tunnels.accept(binding, webSocketStream(ws), 'websocket', report, () => ws.terminate());
  });
}
