// Forwarding to the API server with http-proxy-middleware: one keep-alive connection pool, bodies streamed both
// ways (watch events reach the client as the API server writes them), upgrades (exec, attach, port-forward;
// SPDY or WebSocket) piped through, short requests bounded by a deadline and long-running ones not.
import { Agent } from 'node:https';
import { createSecureContext } from 'node:tls';
import type { IncomingMessage, ServerResponse, OutgoingHttpHeaders } from 'node:http';
import type { Socket } from 'node:net';
import { createProxyMiddleware, proxyEventsPlugin, type RequestHandler } from 'http-proxy-middleware';
import type { Request } from './authenticate.ts';
import { statusBody, writeStatus, type Response } from './status.ts';

/**
 * The API server ends its own short requests after 60 s; the proxy waits a little longer so the API server's
 * timeout, with its own Status, is what clients normally see.
 */
export const SHORT_REQUEST_TIMEOUT_MS = 65_000;
/** Idle pooled connections to the API server; enough for bursts from many kubectl processes. */
const MAX_FREE_SOCKETS = 256;

export interface UpstreamCredentials {
  /** PEM CA bundle for the API server. */
  caPem?: string;
  /** Client certificate and key, when the forwarding identity is a certificate (out of cluster). */
  certPem?: string;
  keyPem?: string;
  /** Bearer token of the forwarding identity, read per request so a refreshed token is used at once. */
  token?: () => string | undefined;
}

export interface Upstream {
  url: URL;
  credentials: UpstreamCredentials;
  /** Deadline for short (not long-running) requests. Default: SHORT_REQUEST_TIMEOUT_MS. */
  shortRequestTimeoutMs?: number;
}

/** Per-request forwarding decisions made by the handler before the request is handed over. */
export interface ForwardPlan {
  headers: OutgoingHttpHeaders;
  longRunning: boolean;
  /**
   * The request carries the caller's own token for the API server (a service account): it goes over connections
   * without the proxy's client certificate, which the API server would otherwise prefer over the token.
   */
  passthrough: boolean;
}

const PLAN = Symbol('sealion.forwardPlan');
type Planned = Request & { [PLAN]?: ForwardPlan };

class TimeoutError extends Error {
  readonly code = 'SEALION_UPSTREAM_TIMEOUT';
}

function errorStatus(err: Error & { code?: string }): { code: number; message: string } {
  if (err instanceof TimeoutError || err.code === 'ETIMEDOUT' || err.code === 'ESOCKETTIMEDOUT') {
    return { code: 504, message: 'the Kubernetes API server did not answer in time' };
  }
  return { code: 502, message: `the Kubernetes API server could not be reached: ${err.code ?? err.message}` };
}

export interface Forwarder {
  web(req: Request, res: Response, plan: ForwardPlan): Promise<void>;
  upgrade(req: IncomingMessage, socket: Socket, head: Buffer, plan: ForwardPlan): void;
  close(): void;
}

export function newForwarder(upstream: Upstream): Forwarder {
  // One secure context per identity, built once: otherwise every new upstream connection parses the CA and key again.
  const ca = upstream.credentials.caPem ? { ca: upstream.credentials.caPem } : {};
  const identity = upstream.credentials.certPem
    ? { cert: upstream.credentials.certPem, key: upstream.credentials.keyPem }
    : {};
  const withIdentity = new Agent({
    keepAlive: true,
    maxFreeSockets: MAX_FREE_SOCKETS,
    ...ca,
    ...identity,
    secureContext: createSecureContext({ ...ca, ...identity }),
  });
  const anonymous = new Agent({
    keepAlive: true,
    maxFreeSockets: MAX_FREE_SOCKETS,
    ...ca,
    secureContext: createSecureContext(ca),
  });

  const applyPlan = (req: Planned, plan: ForwardPlan): void => {
    req[PLAN] = plan;
    // Replace the caller's headers in place (an HTTP/2 request's header object cannot be swapped).
    const headers = req.headers as Record<string, unknown>;
    for (const name of Object.keys(headers)) if (!name.startsWith(':')) delete headers[name];
    Object.assign(headers, plan.headers);
    const token = plan.passthrough ? undefined : upstream.credentials.token?.();
    if (token) headers['authorization'] = `Bearer ${token}`;
  };

  const newProxy = (agent: Agent): RequestHandler =>
    createProxyMiddleware({
      target: upstream.url.origin,
      changeOrigin: true,
      secure: true,
      agent,
      xfwd: false,
      // Our own error answers and request logs replace the defaults; the events plugin wires up `on`.
      ejectPlugins: true,
      plugins: [proxyEventsPlugin],
      on: {
        proxyReq(proxyReq, req) {
          // No Nagle delay towards the API server either: request heads and small bodies leave at once.
          proxyReq.setNoDelay(true);
          const plan = (req as unknown as Planned)[PLAN];
          if (plan && !plan.longRunning) {
            proxyReq.setTimeout(upstream.shortRequestTimeoutMs ?? SHORT_REQUEST_TIMEOUT_MS, () =>
              proxyReq.destroy(new TimeoutError('upstream timeout')),
            );
          }
        },
        proxyRes(_proxyRes, req, res) {
          // A watch with no events yet has no body to write, and headers wait for the first write: send them now,
          // as the API server did, so clients see the watch established.
          if ((req as unknown as Planned)[PLAN]?.longRunning) {
            setImmediate(() => {
              if (!res.headersSent && !res.destroyed) res.flushHeaders();
            });
          }
        },
        error(err, _req, res) {
          const { code, message } = errorStatus(err);
          if ('writeHead' in res) writeStatus(res, code, message);
          else if (!res.destroyed) {
            // A failed upgrade: answer on the raw socket, then close it.
            const body = statusBody(code, message);
            res.end(
              `HTTP/1.1 ${code} ${code === 504 ? 'Gateway Timeout' : 'Bad Gateway'}\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
            );
          }
        },
      },
    });
  const impersonating = newProxy(withIdentity);
  const passthrough = newProxy(anonymous);

  return {
    async web(req, res, plan) {
      applyPlan(req, plan);
      const proxy = plan.passthrough ? passthrough : impersonating;
      await proxy(req as unknown as IncomingMessage, res as unknown as ServerResponse);
    },
    upgrade(req, socket, head, plan) {
      applyPlan(req, plan);
      (plan.passthrough ? passthrough : impersonating).upgrade(req, socket, head);
    },
    close() {
      withIdentity.destroy();
      anonymous.destroy();
    },
  };
}
