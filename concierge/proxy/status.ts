// Errors the proxy makes itself are Kubernetes Status objects, as kubectl and client-go expect.
import { rawStatusResponse, statusBody } from '../../lib/status-body.ts';
import type { OutgoingHttpHeaders } from 'node:http';
import { H2Response, type Response } from './exchange.ts';

export { rawStatusResponse, statusBody };

/**
 * Sends a complete response with a body (HTTP/1 and HTTP/2 responses alike). The proxy answers some requests
 * without reading their bodies (a refusal, a body over its limit or too slow): such a request ends with the answer,
 * so a client cannot keep the connection busy with a body nobody reads. HTTP/1.1 has no way to stop one request's
 * body but closing the connection; HTTP/2 resets just the stream.
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
export const UNAUTHORIZED = 'Unauthorized';
