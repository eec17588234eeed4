// One request as every stage of the pipeline sees it (handler.ts: route → authenticate → decide → a route → the
// transport). A plain request and an upgrade (exec, attach, port-forward) differ in how they are answered and how
// their bytes travel, and in nothing else: the stages take an Exchange, and only the transport (transport.ts) and
// the few lines below look at which kind it is.
import { randomUUID } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { H2Request, Request, Response } from '../../lib/http2/request.ts';
import { refuseConnection, writeStatus, type Refusal } from '../../lib/kube/status.ts';
import type { RequestAudit } from '../audit/audit.ts';
import type { ReachTally } from '../../lib/reach/dialer.ts';
import type { SessionRecording } from '../recording/session.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';

/** Where a request went: the hub's own API server, a tunnel this replica holds, or a peer replica that holds one. */
export type RouteKind = 'local' | 'tunnel' | 'peer';

/** What the stages learn about a request, for the stages after them, the log line and the metrics. */
export interface RequestContext {
  /**
   * Unique per request: its audit ID, set as the Audit-ID of what is forwarded (so the target API server's audit
   * events carry it too), and in its log line.
   */
  readonly id: string;
  /** When it arrived (process.hrtime.bigint()). */
  readonly started: bigint;
  /** The cluster it is for, '' for the hub's own API server. */
  cluster: string;
  /** The authenticated user's name; '' until someone is authenticated. */
  user: string;
  /** Whom it is forwarded as, when the caller asked to impersonate someone. */
  impersonated?: UserInfo;
  /**
   * How the request was decided: `passthrough` (a service account's own token), or the mode the cluster lets the
   * forwarding identity impersonate this kind of identity in (`user-info`, `serviceaccount`, `arbitrary-node`,
   * `legacy`).
   */
  decision?: string;
  route?: RouteKind;
  /**
   * The status of an upgrade's answer: the upstream's (101 when it switched protocols), or that of the Status Sealion
   * answered with; unset (logged as 0) when the client left before any answer. A plain request's is its response's.
   */
  status?: number;
  /** Bytes of the answer relayed to the client. */
  bytes: number;
  /** A health check (local-apis.ts): no log line when it is answered 200. */
  probe?: boolean;
  /** The message of the Status Sealion answered with itself, if it did. */
  message?: string;
  /** The request's audit, when the policy audits it. */
  audit?: RequestAudit;
  /** The recording of an exec or attach session, when sessions are recorded. */
  recording?: SessionRecording;
  /** A reach connection's status and bytes both ways, while it lasts (concierge/reach). */
  reach?: ReachTally;
  /**
   * The access requests whose grants the request uses (decide.ts): what it relays ends when the first of them ends
   * (grant-sessions.ts).
   */
  grants?: readonly string[];
  /** What the request does, as the API server authorizes it (set by the pipeline's first stage). */
  attributes?: RequestAttributes;
  /**
   * Ends what the transport relays for a draining replica (concierge/drain.ts): a long-running answer at an event's
   * boundary, its response complete; an upgraded session with `message`, by its protocol's means. Set by the transport
   * once it relays; until then there is nothing to end but the connection, which the stop cuts.
   */
  end?: (message: string) => void;
}

/** A new request's context; `id` is the audit ID a peer replica already gave it, if any. */
export function newRequestContext(id?: string): RequestContext {
  return { id: id ?? randomUUID(), started: process.hrtime.bigint(), cluster: '', user: '', bytes: 0 };
}

export type { Refusal };

export interface PlainExchange {
  kind: 'plain';
  req: Request;
  res: Response;
  context: RequestContext;
}

export interface UpgradeExchange {
  kind: 'upgrade';
  /**
   * An HTTP/1.1 upgrade, or an HTTP/2 extended CONNECT read as one (a reach connection: lib/http2/request.ts
   * serveConnect). What carries it is `socket` below, whatever `req.socket` says: use that one.
   */
  req: IncomingMessage | H2Request;
  /**
   * What carries the connection: a TLS socket at the proxy's port, but a CONNECT stream (HTTP/2) when the upgrade came
   * over a peer link, the client's own extended CONNECT stream (answered in HTTP/2: lib/http2/upgrade.ts), and one end
   * of a stream pair from the in-process door (SSH sessions). Only what every Duplex
   * has, so that nothing calls a net.Socket method (destroySoon, setNoDelay, setTimeout) on the others.
   */
  socket: Duplex;
  /** What the client sent after the request's head. */
  head: Buffer;
  context: RequestContext;
}

export type Exchange = PlainExchange | UpgradeExchange;

/**
 * Answers with a refusal's Status; an upgrade's connection closes once it is written, whatever carries it (a socket,
 * a peer link's CONNECT stream, the in-process door's stream pair).
 */
export function refuse(exchange: Exchange, refusal: Refusal): void {
  exchange.context.status = refusal.status;
  exchange.context.message = refusal.message;
  if (exchange.kind === 'upgrade') return refuseConnection(exchange.socket, refusal);
  const { status, message, retryAfterSeconds } = refusal;
  writeStatus(
    exchange.res,
    status,
    message,
    retryAfterSeconds === undefined ? undefined : { retryAfterSeconds },
  );
}

/** The exchange when it is a plain request (the local APIs answer only those), else undefined. */
export function asPlain(exchange: Exchange): PlainExchange | undefined {
  return exchange.kind === 'plain' ? exchange : undefined;
}

/** The exchange when it is an upgrade (a session to record, a reach connection), else undefined. */
export function asUpgrade(exchange: Exchange): UpgradeExchange | undefined {
  return exchange.kind === 'upgrade' ? exchange : undefined;
}

/**
 * The status the exchange was answered with: a plain request's response's; an upgrade's (context.status) or its reach
 * connection's; 0 when the client left before any answer.
 */
export function answerStatus(exchange: Exchange): number {
  const { context } = exchange;
  return exchange.kind === 'plain' ? exchange.res.statusCode : (context.status ?? context.reach?.status ?? 0);
}

/** Calls `then` once, when the client's side of the exchange closes. */
export function onClose(exchange: Exchange, then: () => void): void {
  (exchange.kind === 'plain' ? exchange.res : exchange.socket).once('close', then);
}

/** Whether the client has gone: nothing is worth doing for the exchange any more. */
export function gone(exchange: Exchange): boolean {
  return exchange.kind === 'plain' ? exchange.res.destroyed : exchange.socket.destroyed;
}

/** Calls `then` once the client's side of the exchange closes; the returned function cancels that. */
export function whenClosed(exchange: Exchange, then: () => void): () => void {
  const emitter = exchange.kind === 'plain' ? exchange.res : exchange.socket;
  emitter.once('close', then);
  return () => void emitter.off('close', then);
}
