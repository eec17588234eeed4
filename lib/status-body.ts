// The Kubernetes Status object that every error Sealion makes itself carries (the proxy's and the agent's), as
// kubectl and client-go expect.
import { STATUS_CODES } from 'node:http';

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

/** A Status body for an HTTP status code. */
export function statusBody(code: number, message: string, details?: object): string {
  return JSON.stringify({
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message,
    reason: REASONS[code] ?? 'Unknown',
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
