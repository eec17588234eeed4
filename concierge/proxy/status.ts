// Errors the proxy makes itself are Kubernetes Status objects, as kubectl and client-go expect.
import { rawStatusResponse, statusBody } from '../../lib/status-body.ts';
import type { Response } from './exchange.ts';

export { rawStatusResponse, statusBody };

/** Sends a complete response with a body (HTTP/1 and HTTP/2 responses alike). */
export function send(res: Response, code: number, contentType: string, body: string): void {
  res.writeHead(code, {
    'content-type': contentType,
    'content-length': Buffer.byteLength(body),
  });
  res.end(body);
}

/** Answers with a Status, unless the response has already started (then it can only be cut short). */
export function writeStatus(res: Response, code: number, message: string, details?: object): void {
  if (res.headersSent) {
    res.destroy();
    return;
  }
  send(res, code, 'application/json', statusBody(code, message, details));
}

/** The one answer to every failed authentication, whatever failed; the reason goes to the log only. */
export const UNAUTHORIZED = 'Unauthorized';
