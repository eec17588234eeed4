// Forwarding to the API server. Requests go over HTTP/2 connections that open another only when the API server's
// stream limit is reached (h2-pool.ts), so a thousand watches share a handful of connections. Bodies stream both ways (watch events reach the client as the API server writes them); short
// requests are bounded by a deadline and long-running ones are not. Upgrades (exec, attach, port-forward; SPDY
// or WebSocket) need HTTP/1.1 and are piped through by http-proxy-middleware.
import { Agent } from 'node:https';
import { constants as http2, type ClientHttp2Stream } from 'node:http2';
import { CANCEL, newH2Pool } from './h2-pool.ts';
import { createSecureContext } from 'node:tls';
import type { IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import { isIP, type Socket } from 'node:net';
import { createProxyMiddleware, proxyEventsPlugin, type RequestHandler } from 'http-proxy-middleware';
import { H2Response, relayBody, type Request, type Response } from './exchange.ts';
import { rawStatusResponse, writeStatus } from './status.ts';
import { clientCertChain } from '../../lib/pem.ts';

/**
 * The API server ends its own short requests after 60 s; the proxy waits a little longer so the API server's
 * timeout, with its own Status, is what clients normally see.
 */
export const SHORT_REQUEST_TIMEOUT_MS = 65_000;
/** Idle pooled HTTP/1.1 connections (upgrades) to the API server. */
const MAX_FREE_SOCKETS = 16;
/** Hop-by-hop or HTTP/2-illegal headers never copied from the API server's answer. */
const RESPONSE_HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'proxy-connection',
]);

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
  /**
   * The authenticated user's name, before any nested impersonation: whose request this is, for limits kept per
   * user (a tunnel's fair share). Impersonating others does not give a caller more shares.
   */
  user: string;
}

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

/** Whether the caller sent a request body (possibly empty) that must be streamed on. */
export function hasBody(req: Request): boolean {
  if ('stream' in req) return !req.stream.endAfterHeaders;
  const length = req.headers['content-length'];
  return (length !== undefined && length !== '0') || req.headers['transfer-encoding'] !== undefined;
}

export function newForwarder(upstream: Upstream): Forwarder {
  // One secure context per identity, built once: otherwise every new upstream connection parses the CA and key again.
  const ca = upstream.credentials.caPem ? { ca: upstream.credentials.caPem } : {};
  const identity = upstream.credentials.certPem
    ? { cert: clientCertChain(upstream.credentials.certPem), key: upstream.credentials.keyPem }
    : {};
  const contexts = {
    withIdentity: createSecureContext({ ...ca, ...identity }),
    anonymous: createSecureContext(ca),
  };
  const shortTimeout = upstream.shortRequestTimeoutMs ?? SHORT_REQUEST_TIMEOUT_MS;

  const servername = isIP(upstream.url.hostname.replace(/^\[|\]$/g, ''))
    ? {}
    : { servername: upstream.url.hostname };
  const pools = {
    withIdentity: newH2Pool(upstream.url.origin, { secureContext: contexts.withIdentity, ...servername }),
    anonymous: newH2Pool(upstream.url.origin, { secureContext: contexts.anonymous, ...servername }),
  };

  // Upgrades only: HTTP/1.1 connections with the same identities.
  const newAgent = (secureContext: ReturnType<typeof createSecureContext>, withCert: boolean): Agent =>
    new Agent({
      keepAlive: true,
      maxFreeSockets: MAX_FREE_SOCKETS,
      ...ca,
      ...(withCert ? identity : {}),
      secureContext,
    });
  const agents = {
    withIdentity: newAgent(contexts.withIdentity, true),
    anonymous: newAgent(contexts.anonymous, false),
  };

  const upstreamHeaders = (plan: ForwardPlan): Record<string, string | string[]> => {
    const headers = plan.headers as Record<string, string | string[]>;
    // Host and Expect are already gone: cleanHeaders, which builds every plan's headers, leaves them out.
    const token = plan.passthrough ? undefined : upstream.credentials.token?.();
    if (token) headers['authorization'] = `Bearer ${token}`;
    return headers;
  };

  const newUpgradeProxy = (agent: Agent): RequestHandler =>
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
        proxyReq(proxyReq) {
          proxyReq.setNoDelay(true);
        },
        error(err, _req, res) {
          const { code, message } = errorStatus(err);
          if ('writeHead' in res) writeStatus(res, code, message);
          else if (!res.destroyed) {
            // A failed upgrade: answer on the raw socket, then close it.
            res.end(rawStatusResponse(code, message));
          }
        },
      },
    });
  const upgrades = {
    withIdentity: newUpgradeProxy(agents.withIdentity),
    anonymous: newUpgradeProxy(agents.anonymous),
  };

  return {
    web(req, res, plan) {
      return new Promise<void>((done) => {
        const fail = (err: Error & { code?: string }): void => {
          if (!res.headersSent) {
            const { code, message } = errorStatus(err);
            writeStatus(res, code, message);
          } else if (!res.destroyed) res.destroy();
        };
        const headers: OutgoingHttpHeaders = upstreamHeaders(plan);
        headers[':method'] = req.method ?? 'GET';
        headers[':path'] = req.url ?? '/';
        const body = hasBody(req);
        let stream: ClientHttp2Stream;
        try {
          stream = (plan.passthrough ? pools.anonymous : pools.withIdentity).request(headers, !body);
        } catch (err) {
          fail(err as Error);
          return done();
        }
        let answered = false;
        stream.on('response', (answer) => {
          answered = true;
          const out: OutgoingHttpHeaders = {};
          for (const name in answer) {
            const value = answer[name];
            if (value !== undefined && name.charCodeAt(0) !== 58 /* ':' */ && !RESPONSE_HOP_BY_HOP.has(name))
              out[name] = value;
          }
          const status = Number(answer[':status']);
          // Not from a conforming API server; never handed to writeHead, which throws on it.
          if (!(status >= 200 && status <= 599)) {
            stream.close(CANCEL);
            return fail(new Error(`the API server answered with status ${answer[':status']}`));
          }
          res.writeHead(status, out);
          // A watch with no events yet has nothing to write: send the headers now, as the API server did, so the
          // client sees the watch established. (An HTTP/2 response sends its headers in writeHead already.)
          if (plan.longRunning && 'flushHeaders' in res) res.flushHeaders();
          // The close, abort and error handling pipe() would add is below.
          relayBody(stream, res);
        });
        stream.on('error', fail);
        // The stream closed while the body was still going up. With NO_ERROR, the API server answered before it read
        // the whole body (a refused or oversized write) and asks for no more of it: its answer still arrives in full,
        // so the rest of the client's body goes nowhere and, on HTTP/2, is refused once the answer is out. Any other
        // code cut the answer off mid-body (a reset stream, a lost connection): the client must see a broken
        // response, not a short one. (Each of these events comes once per stream, so plain listeners do.)
        stream.on('aborted', () => {
          if (stream.rstCode !== http2.NGHTTP2_NO_ERROR) return void res.destroy();
          req.unpipe(stream);
          if (res instanceof H2Response)
            stream.once('end', () => setImmediate(() => res.refuseRestOfRequest()));
        });
        stream.on('close', () => {
          if (!answered) fail(new Error(`stream closed by the API server (HTTP/2 code ${stream.rstCode})`));
        });
        if (!plan.longRunning) {
          stream.setTimeout(shortTimeout, () => {
            fail(new TimeoutError('upstream timeout'));
            stream.close(CANCEL);
          });
        }
        res.on('close', () => {
          if (!stream.closed) stream.close(CANCEL);
          done();
        });
        if (body) req.pipe(stream);
      });
    },
    upgrade(req, socket, head, plan) {
      const headers = req.headers as Record<string, unknown>;
      for (const name of Object.keys(headers)) delete headers[name];
      Object.assign(headers, plan.headers);
      const token = plan.passthrough ? undefined : upstream.credentials.token?.();
      if (token) headers['authorization'] = `Bearer ${token}`;
      (plan.passthrough ? upgrades.anonymous : upgrades.withIdentity).upgrade(req, socket, head);
    },
    close() {
      pools.withIdentity.close();
      pools.anonymous.close();
      agents.withIdentity.destroy();
      agents.anonymous.destroy();
    },
  };
}
