// Forwarding to a cluster through its agent's tunnel: HTTP/1.1 over tunnel streams (lib/tunnel.ts), to the agent's
// local proxy, which adds the agent's own credential. The hub's forwarding credential never goes into a tunnel:
// the agent sees the impersonation headers and nothing else of the hub's.
import { request, type IncomingMessage, type OutgoingHttpHeaders } from 'node:http';
import type { Socket } from 'node:net';
import { createProxyMiddleware, proxyEventsPlugin } from 'http-proxy-middleware';
import type { TunnelClient } from '../../lib/tunnel.ts';
import { hasBody, SHORT_REQUEST_TIMEOUT_MS, type ForwardPlan, type Forwarder } from '../proxy/forward.ts';
import { relayBody } from '../proxy/exchange.ts';
import { rawStatusResponse, writeStatus } from '../proxy/status.ts';

/** Never copied either way: hop-by-hop, HTTP/2 pseudo-headers, and credentials. */
const DROPPED = new Set([
  'connection',
  'keep-alive',
  'transfer-encoding',
  'upgrade',
  'proxy-connection',
  'te',
  'host',
]);
const TUNNEL_HOST = 'cluster.tunnel';

function failure(cluster: string, err: Error & { code?: string }): { code: number; message: string } {
  if (err.code === 'SEALION_TUNNEL_BUSY')
    return {
      code: 503,
      message: `cluster ${cluster}: the tunnel carries as many streams as it may; retry later`,
    };
  if (err.code === 'SEALION_UPSTREAM_TIMEOUT')
    return { code: 504, message: `cluster ${cluster}: the API server did not answer in time` };
  return { code: 502, message: `cluster ${cluster}: the agent's tunnel failed: ${err.code ?? err.message}` };
}

function upstreamHeaders(plan: ForwardPlan): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = {};
  for (const [name, value] of Object.entries(plan.headers)) {
    if (value === undefined || name.startsWith(':') || DROPPED.has(name) || name === 'authorization')
      continue;
    headers[name] = value;
  }
  headers['host'] = TUNNEL_HOST;
  return headers;
}

export function newTunnelForwarder(cluster: string, tunnel: TunnelClient): Forwarder {
  const upgradeProxy = createProxyMiddleware<IncomingMessage>({
    target: `http://${TUNNEL_HOST}`,
    agent: tunnel.agent,
    xfwd: false,
    ejectPlugins: true,
    plugins: [proxyEventsPlugin],
    on: {
      error(err, _req, socket) {
        const { code, message } = failure(cluster, err);
        if ('writeHead' in socket) return void writeStatus(socket, code, message);
        if (!socket.destroyed) socket.end(rawStatusResponse(code, message));
      },
    },
  });

  return {
    web(req, res, plan) {
      return new Promise<void>((done) => {
        const fail = (err: Error & { code?: string }): void => {
          if (!res.headersSent) {
            const { code, message } = failure(cluster, err);
            writeStatus(res, code, message);
          } else if (!res.destroyed) res.destroy();
        };
        const body = hasBody(req);
        const upstream = request({
          agent: tunnel.agent,
          host: TUNNEL_HOST,
          method: req.method ?? 'GET',
          path: req.url ?? '/',
          headers: upstreamHeaders(plan),
        });
        upstream.on('response', (answer: IncomingMessage) => {
          const out: OutgoingHttpHeaders = {};
          for (const [name, value] of Object.entries(answer.headers))
            if (value !== undefined && !DROPPED.has(name)) out[name] = value;
          res.writeHead(answer.statusCode ?? 502, out);
          if (plan.longRunning && 'flushHeaders' in res) res.flushHeaders();
          relayBody(answer, res);
          // Cut off mid-body (the agent went away): the client must see a broken response, not a short one.
          answer.once('aborted', () => res.destroy());
        });
        upstream.on('error', fail);
        if (!plan.longRunning) {
          upstream.setTimeout(SHORT_REQUEST_TIMEOUT_MS, () => {
            fail(Object.assign(new Error('upstream timeout'), { code: 'SEALION_UPSTREAM_TIMEOUT' }));
            upstream.destroy();
          });
        }
        res.once('close', () => {
          if (!upstream.writableFinished || !res.writableFinished) upstream.destroy();
          done();
        });
        if (body) req.pipe(upstream);
        else upstream.end();
      });
    },
    upgrade(req, socket: Socket, head, plan) {
      const headers = upstreamHeaders(plan);
      for (const name of Object.keys(req.headers)) delete req.headers[name];
      Object.assign(req.headers, headers, { connection: 'Upgrade', upgrade: plan.headers['upgrade'] });
      upgradeProxy.upgrade(req, socket, head);
    },
    close() {
      tunnel.close();
    },
  };
}
