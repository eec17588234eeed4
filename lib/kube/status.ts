// The Kubernetes Status object that every error Sealion makes itself carries (the proxy's and the agent's), as
// kubectl and client-go expect, and the answers that carry one.
import { STATUS_CODES, type OutgoingHttpHeaders } from 'node:http';
import type { Duplex } from 'node:stream';
import { H2Response, type Response } from '../http2/request.ts';
import { answerRefused } from '../http2/upgrade.ts';

const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  403: 'Forbidden',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  408: 'Timeout',
  413: 'RequestEntityTooLarge',
  422: 'Invalid',
  429: 'TooManyRequests',
  431: 'RequestHeaderFieldsTooLarge',
  500: 'InternalError',
  502: 'BadGateway',
  503: 'ServiceUnavailable',
  504: 'Timeout',
};

/** The reason a Status with this code carries. */
export const reasonOf = (code: number): string => REASONS[code] ?? 'Unknown';

/** The message of a Kubernetes Status in an answer's body, when it is one. */
export function statusMessageOf(body: string | undefined): string | undefined {
  try {
    const status = JSON.parse(body ?? '') as { kind?: unknown; message?: unknown };
    return status.kind === 'Status' && typeof status.message === 'string' ? status.message : undefined;
  } catch {
    return undefined;
  }
}

export function statusBody(code: number, message: string, details?: object): string {
  return JSON.stringify({
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason: reasonOf(code),
    ...(details ? { details } : {}),
    code,
  });
}

/**
 * A whole HTTP/1.1 response carrying a Status, for a raw socket: an upgrade refused or failed, or a request too
 * malformed to reach an HTTP handler. The connection closes after it.
 */
export function rawStatusResponse(
  code: number,
  message: string,
  extra?: { details?: object; headers?: Record<string, string> },
): string {
  const body = statusBody(code, message, extra?.details);
  let fields = '';
  for (const [name, value] of Object.entries(extra?.headers ?? {})) fields += `${name}: ${value}\r\n`;
  return (
    `HTTP/1.1 ${code} ${STATUS_CODES[code] ?? 'Error'}\r\ncontent-type: application/json\r\n${fields}` +
    `content-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`
  );
}

/**
 * Sends a complete response with a body (HTTP/1 and HTTP/2 responses alike). Sealion answers some requests without
 * reading their bodies (a refusal, a body over its limit or too slow): such a request ends with the answer, so a
 * client cannot keep the connection busy with a body nobody reads. HTTP/1.1 has no way to stop one request's body
 * but closing the connection; HTTP/2 resets just the stream.
 */
export function send(
  res: Response,
  code: number,
  contentType: string,
  body: string,
  extraHeaders: OutgoingHttpHeaders = {},
): void {
  const headers: OutgoingHttpHeaders = {
    ...extraHeaders,
    'content-type': contentType,
    'content-length': Buffer.byteLength(body),
  };
  const http1Unread = 'req' in res && !res.req.complete;
  if (http1Unread) headers['connection'] = 'close';
  res.writeHead(code, headers);
  res.end(body);
  if (res instanceof H2Response) res.refuseRestOfRequest();
}

/**
 * Answers with a Status, unless the response has already started (then it can only be cut short). A
 * `retryAfterSeconds` in the details also goes out as Retry-After, which client-go waits for before it retries.
 */
export function writeStatus(
  res: Response,
  code: number,
  message: string,
  details?: { retryAfterSeconds?: number; [field: string]: unknown },
): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  const retry = details?.retryAfterSeconds;
  send(
    res,
    code,
    'application/json',
    statusBody(code, message, details),
    retry === undefined ? {} : { 'retry-after': String(retry) },
  );
}

/** The one answer to every failed authentication, whatever failed; the reason goes to the log only. */
/** A Status to answer with instead of forwarding. */
export interface Refusal {
  status: number;
  message: string;
  /** Set when the refusal mends by itself: clients (client-go) wait this long and retry. */
  retryAfterSeconds?: number;
}

export const UNAUTHORIZED = 'Unauthorized';

/**
 * Answers a connection that is no longer an HTTP response's (an upgrade, a reach connection) with a refusal's Status,
 * and closes it once written. Any Duplex (lib/http2/upgrade.ts `endAndClose`): upgrades come over TLS sockets, peer
 * links' and tunnels' CONNECT streams, the in-process door's stream pairs and the proxy's extended CONNECT streams alike.
 */
export function refuseConnection(socket: Duplex, refusal: Refusal): void {
  const retry = refusal.retryAfterSeconds;
  const extra =
    retry === undefined
      ? undefined
      : { details: { retryAfterSeconds: retry }, headers: { 'retry-after': String(retry) } };
  // An extended CONNECT's stream (lib/http2/upgrade.ts) takes the status and fields as HTTP/2 headers.
  answerRefused(
    socket,
    refusal.status,
    { 'content-type': 'application/json', ...extra?.headers },
    Buffer.from(statusBody(refusal.status, refusal.message, extra?.details)),
    () => rawStatusResponse(refusal.status, refusal.message, extra),
  );
}
