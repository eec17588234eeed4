// The agent's probes, on a small plain-HTTP port of their own (`--health-listen`): GET /healthz answers 200 while the
// process serves at all (the liveness probe), GET /readyz 200 only while at least one tunnel to the hub is up, 503
// otherwise (the readiness probe: a rollout of the agent waits for the new pod to hold a tunnel before it stops an old
// one). Nothing else is answered on this port (404, or 405 for another method), and nothing about the tunnels is said
// beyond up or not: the kubelet is its only client, and whoever else reaches the port learns no more than that.
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import { listenOn } from '../lib/listen.ts';
import type { Logger } from '../lib/log.ts';

export interface HealthOptions {
  host: string;
  port: number;
  /** Whether at least one tunnel is up now (Agent's connected). */
  ready(): boolean;
  log: Logger;
}

export interface HealthListener {
  port: number;
  close(): Promise<void>;
}

/** `host:port` (`:8081` for every address) as the flag takes it. */
export function healthAddress(value: string): { host: string; port: number } {
  const i = value.lastIndexOf(':');
  const portText = value.slice(i + 1);
  const port = Number(portText);
  if (i < 0 || !/^\d{1,5}$/.test(portText) || port > 65535)
    throw new Error(`--health-listen: ${JSON.stringify(value)} is not host:port`);
  return { host: value.slice(0, i).replace(/^\[|\]$/g, '') || '0.0.0.0', port };
}

function answer(res: ServerResponse, status: number, text: string): void {
  res.writeHead(status, { 'content-type': 'text/plain; charset=utf-8', 'cache-control': 'no-store' });
  res.end(`${text}\n`);
}

function probe(opts: HealthOptions, req: IncomingMessage, res: ServerResponse): void {
  const path = (req.url ?? '').split('?')[0];
  if (path !== '/healthz' && path !== '/readyz') return answer(res, 404, 'not found');
  if (req.method !== 'GET' && req.method !== 'HEAD') return answer(res, 405, 'method not allowed');
  if (path === '/healthz') return answer(res, 200, 'ok');
  if (opts.ready()) return answer(res, 200, 'ok: a tunnel to the hub is up');
  answer(res, 503, 'no tunnel to the hub is up');
}

export async function serveHealth(opts: HealthOptions): Promise<HealthListener> {
  const server = createServer(
    // A probe sends a few headers and no body; anything slower or larger is not a probe.
    { headersTimeout: 5_000, requestTimeout: 5_000, maxHeaderSize: 8 * 1024 },
    (req, res) => {
      probe(opts, req, res);
      // A body sent anyway is read and dropped, within the request's deadline.
      req.resume();
    },
  );
  // A bound on what the port can hold, high enough that a pod of the cluster holding connections open (each lives
  // 5 s at most without a request) must hold a thousand of them to crowd the kubelet's probes out.
  server.maxConnections = 1024;
  const port = await listenOn(server, opts.port, opts.host);
  opts.log.info({ host: opts.host, port }, 'health probes listening');
  return {
    port,
    close: () =>
      new Promise<void>((done) => {
        server.closeAllConnections();
        server.close(() => done());
      }),
  };
}
