// The agent's local reverse proxy: an HTTP/1.1 server fed with the tunnel's streams (it listens on no port), that
// forwards to this cluster's API server as the agent. It always overwrites Authorization with the agent's own
// credential (whatever the other end sent), keeps Impersonate-* (the hub's impersonation is the point), strips
// X-Forwarded-*, streams responses as they come (watches), and passes upgrades (exec, port-forward) through.
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { Agent } from 'node:https';
import type { Duplex } from 'node:stream';
import { createProxyMiddleware, proxyEventsPlugin } from 'http-proxy-middleware';
import { clientCertChain } from '../lib/pem.ts';
import { rawStatusResponse, statusBody } from '../lib/status-body.ts';

export interface LocalUpstream {
  url: URL;
  caPem?: string;
  /** A client certificate, when the agent's identity is one (out of a cluster). */
  certPem?: string;
  keyPem?: string;
  /** The agent's bearer token, read per request (projected service-account tokens rotate). */
  token?: () => string | undefined;
}

export interface LocalProxy {
  /** Serves HTTP on one tunnel stream. */
  accept(stream: Duplex): void;
  close(): void;
}

const FORWARDED = /^x-forwarded-|^forwarded$/;

export function newLocalProxy(upstream: LocalUpstream): LocalProxy {
  // Keep-alive, with Node's default of 256 idle connections. A pool smaller than the concurrency the tunnel carries
  // closes connections that the next requests must open again, each with a TLS handshake.
  const agent = new Agent({
    keepAlive: true,
    ...(upstream.caPem ? { ca: upstream.caPem } : {}),
    ...(upstream.certPem ? { cert: clientCertChain(upstream.certPem), key: upstream.keyPem } : {}),
  });
  const rewrite = (req: IncomingMessage): void => {
    for (const name of Object.keys(req.headers)) {
      if (name === 'authorization' || FORWARDED.test(name)) delete req.headers[name];
    }
    // Node joins repeated header fields with ", ", which would turn Impersonate-Group: a and Impersonate-Group: b
    // into one group "a, b": the impersonation headers are rebuilt from the raw fields, one value each.
    const repeated: Record<string, string[]> = {};
    for (let i = 0; i < req.rawHeaders.length; i += 2) {
      const name = req.rawHeaders[i]!.toLowerCase();
      if (name.startsWith('impersonate-')) (repeated[name] ??= []).push(req.rawHeaders[i + 1]!);
    }
    Object.assign(req.headers, repeated);
    const token = upstream.token?.();
    if (token) req.headers['authorization'] = `Bearer ${token}`;
  };
  const proxy = createProxyMiddleware<IncomingMessage>({
    target: upstream.url.origin,
    changeOrigin: true,
    secure: true,
    agent,
    xfwd: false,
    ws: false,
    ejectPlugins: true,
    plugins: [proxyEventsPlugin],
    on: {
      proxyReq(proxyReq) {
        proxyReq.setNoDelay(true);
      },
      proxyRes(_proxyRes, _req, res) {
        // A watch with no events yet has nothing to write: send the headers now (the proxy copies them right after
        // this event), so the client sees the watch established.
        process.nextTick(() => {
          if (!res.headersSent && !res.destroyed) res.flushHeaders();
        });
      },
      error(err, _req, res) {
        const message = `this cluster's API server could not be reached through the agent: ${(err as NodeJS.ErrnoException).code ?? err.message}`;
        const body = statusBody(502, message);
        if ('writeHead' in res) {
          // Once the headers went out, a failure can only cut the body short.
          if (res.headersSent) return void res.destroy();
          res.writeHead(502, {
            'content-type': 'application/json',
            'content-length': Buffer.byteLength(body),
          });
          res.end(body);
        } else if (!res.destroyed) {
          res.end(rawStatusResponse(502, message));
        }
      },
    },
  });
  const server: Server = createServer((req, res) => {
    rewrite(req);
    void proxy(req, res, () => res.writeHead(404).end());
  });
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    rewrite(req);
    socket.on('error', () => socket.destroy());
    proxy.upgrade(req, socket as never, head);
  });
  server.on('clientError', (_err, socket: Duplex) => socket.destroy());
  return {
    accept: (stream) => void server.emit('connection', stream),
    close() {
      server.closeAllConnections();
      agent.destroy();
    },
  };
}
