// The agents' listener: TLS on its own port. POST /register trades a bootstrap token and a CSR for a client
// certificate; GET /connect (mutual TLS, a WebSocket) is the tunnel; POST /renew (mutual TLS) re-issues the
// certificate before it expires. A cluster's identity is its certificate's CN, checked against the Cluster
// registry on every connection: a Cluster deleted from the registry is refused even with a valid certificate,
// and its open tunnel is closed. A tunnel also closes when the certificate it was opened with expires. Connects and
// disconnects are written to the Cluster's status as they happen.
import { createServer, type Server } from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { TLSSocket } from 'node:tls';
import { createWebSocketStream, WebSocketServer } from 'ws';
import type { Cluster, ClusterStatus } from '../../apis/tunnel.ts';
import { redeemBootstrapToken, RedeemError } from '../../lib/bootstrap.ts';
import type { Informer } from '../../lib/informer.ts';
import { apiStatusCode, readSecretData, type KubeClients } from '../../lib/kube.ts';
import type { Logger } from '../../lib/log.ts';
import { issueCert, loadCA, newCA, publicKeyFromCSR, type CertificateAuthority } from '../../lib/pki.ts';
import { rawStatusResponse } from '../../lib/status-body.ts';
import type { StatusWriter } from '../../lib/status-writer.ts';
import { newTunnelClient, type TunnelClient } from '../../lib/tunnel.ts';
import type { Forwarder } from '../proxy/forward.ts';
import { newTunnelForwarder, tunnelLimits, type TunnelForwarder } from './forwarder.ts';

export const TUNNEL_CA_SECRET = 'sealion-tunnel-ca';
/** Agent certificates live 90 days and are renewed over the tunnel at two thirds of that. */
export const AGENT_CERT_VALIDITY_MS = 90 * 24 * 3600 * 1000;
/** Registration and renewal bodies are a CSR and a token: a few KiB. */
const MAX_BODY_BYTES = 64 * 1024;
/** The one answer to every failed registration; the reason goes to the log. */
const REJECTED = 'registration rejected';
const DNS_LABEL = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;

export interface TunnelListenerOptions {
  clients: KubeClients;
  namespace: string;
  host: string;
  port: number;
  /** Names and addresses agents dial; they go into the listener's certificate. */
  hosts: string[];
  clusters: Informer<Cluster>;
  status: StatusWriter<ClusterStatus>;
  /** This replica's name, recorded as the tunnel's holder. */
  replica: string;
  log: Logger;
}

export interface TunnelListener {
  port: number;
  /** The CA agents trust and are issued from (PEM). */
  caPem: string;
  /** The forwarder of a connected cluster, or undefined. */
  forwarder(cluster: string): Forwarder | undefined;
  stop(): Promise<void>;
}

/** The tunnel CA: created once (by whichever replica comes first) and kept in a Secret. */
async function ensureTunnelCA(clients: KubeClients, namespace: string): Promise<CertificateAuthority> {
  const read = async (): Promise<CertificateAuthority | undefined> => {
    const data = await readSecretData(clients, namespace, TUNNEL_CA_SECRET);
    return data ? loadCA(data['tls.crt'] ?? '', data['tls.key'] ?? '') : undefined;
  };
  const existing = await read();
  if (existing) return existing;
  const ca = await newCA('sealion tunnel CA');
  try {
    await clients.core.createNamespacedSecret({
      namespace,
      body: {
        metadata: { name: TUNNEL_CA_SECRET, namespace, labels: { 'app.kubernetes.io/part-of': 'sealion' } },
        type: 'kubernetes.io/tls',
        stringData: { 'tls.crt': ca.certPem, 'tls.key': ca.keyPem },
      },
    });
    return ca;
  } catch (err) {
    // Another replica won the race: use its CA.
    if (apiStatusCode(err) === 409) return (await read())!;
    throw err;
  }
}

function readBody(req: IncomingMessage): Promise<unknown> {
  return new Promise((done, fail) => {
    let size = 0;
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) return void req.destroy(new Error('body too large'));
      chunks.push(chunk);
    });
    req.on('end', () => {
      try {
        done(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        fail(new Error('the body is not JSON'));
      }
    });
    req.on('error', fail);
  });
}

const json = (res: ServerResponse, code: number, body: object): void =>
  void res.writeHead(code, { 'content-type': 'application/json' }).end(JSON.stringify(body));

/** The cluster a verified client certificate names, or why there is none. */
function peerCluster(socket: TLSSocket): { cluster: string } | { problem: string } {
  if (!socket.authorized)
    return { problem: `no valid client certificate (${String(socket.authorizationError)})` };
  const cert = socket.getPeerX509Certificate();
  if (!cert) return { problem: 'no client certificate' };
  if (!cert.keyUsage?.includes('1.3.6.1.5.5.7.3.2'))
    return { problem: 'the certificate is not for client authentication' };
  const cn = /(?:^|\n)CN=([^\n]+)/.exec(cert.subject)?.[1];
  if (!cn) return { problem: 'the certificate names no cluster' };
  return { cluster: cn };
}

/** The longest delay a Node timer takes (about 24.8 days); agent certificates live longer. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** Calls `fire` at `when` (epoch ms), however far off that is. */
function atTime(when: number, fire: () => void): { cancel(): void } {
  let timer: NodeJS.Timeout | undefined;
  const arm = (): void => {
    const left = when - Date.now();
    if (left <= 0) return fire();
    timer = setTimeout(arm, Math.min(left, MAX_TIMER_MS));
    timer.unref();
  };
  arm();
  return { cancel: () => clearTimeout(timer) };
}

interface Connected {
  tunnel: TunnelClient;
  forwarder: TunnelForwarder;
  since: Date;
}

export async function startTunnelListener(opts: TunnelListenerOptions): Promise<TunnelListener> {
  const log = opts.log;
  const ca = await ensureTunnelCA(opts.clients, opts.namespace);
  const serving = await issueCert(ca, { commonName: 'sealion-tunnel', hosts: opts.hosts, usage: 'server' });
  const connected = new Map<string, Connected>();
  const wss = new WebSocketServer({ noServer: true, maxPayload: 4 * 1024 * 1024 });

  const issue = async (cluster: string, csrPem: unknown): Promise<object> => {
    if (typeof csrPem !== 'string') throw new Error('the body has no csr');
    const cert = await issueCert(ca, {
      commonName: cluster,
      usage: 'client',
      validityMs: AGENT_CERT_VALIDITY_MS,
      publicKey: await publicKeyFromCSR(csrPem),
    });
    return { certificate: cert.certPem, caBundle: ca.certPem, expires: cert.cert.notAfter.toISOString() };
  };

  const writeStatus = (cluster: string, status: ClusterStatus): void => {
    opts.status
      .patchStatus(cluster, status)
      .catch((err: unknown) =>
        log.warn({ cluster, err: (err as Error).message }, 'writing the Cluster status failed'),
      );
  };

  const server: Server = createServer(
    {
      // The chain includes the CA, so agents that pin the CA's key (before they have it) can check it.
      cert: serving.certPem + ca.certPem,
      key: serving.keyPem,
      ca: ca.certPem,
      requestCert: true,
      // Registration has no client certificate yet; /connect and /renew check theirs themselves.
      rejectUnauthorized: false,
      minVersion: 'TLSv1.2',
    },
    (req, res) => {
      const path = (req.url ?? '/').split('?')[0];
      if (req.method === 'POST' && path === '/register') {
        void (async () => {
          let cluster = '';
          try {
            const body = (await readBody(req)) as { cluster?: unknown; token?: unknown; csr?: unknown };
            if (typeof body.cluster !== 'string' || !DNS_LABEL.test(body.cluster))
              throw new RedeemError('Malformed', 'the body names no valid cluster');
            cluster = body.cluster;
            if (!opts.clusters.get(cluster))
              throw new RedeemError('Unknown', `no Cluster ${cluster} is registered`);
            await redeemBootstrapToken(
              opts.clients,
              opts.namespace,
              typeof body.token === 'string' ? body.token : '',
              cluster,
            );
            json(res, 200, await issue(cluster, body.csr));
            log.info({ cluster }, 'agent registered');
          } catch (err) {
            log.warn({ cluster, reason: (err as RedeemError).reason, err: (err as Error).message }, REJECTED);
            json(res, 401, { message: REJECTED });
          }
        })();
        return;
      }
      if (req.method === 'POST' && path === '/renew') {
        const peer = peerCluster(req.socket as TLSSocket);
        if (!('cluster' in peer) || !opts.clusters.get(peer.cluster)) {
          log.warn({ problem: 'problem' in peer ? peer.problem : 'not registered' }, 'renewal refused');
          return json(res, 401, { message: 'renewal rejected' });
        }
        readBody(req)
          .then((body) => issue(peer.cluster, (body as { csr?: unknown }).csr))
          .then(
            (answer) => {
              json(res, 200, answer);
              log.info({ cluster: peer.cluster }, 'agent certificate renewed');
            },
            (err: unknown) => {
              log.warn({ cluster: peer.cluster, err: (err as Error).message }, 'renewal refused');
              json(res, 400, { message: (err as Error).message });
            },
          );
        return;
      }
      json(res, 404, { message: 'not found' });
    },
  );

  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    socket.on('error', () => socket.destroy());
    const refuse = (code: number, problem: string): void => {
      log.warn({ problem }, 'tunnel refused');
      // The same answer for every refusal; the reason goes to the log.
      socket.end(rawStatusResponse(code, code === 404 ? 'not found' : 'Unauthorized'));
    };
    if ((req.url ?? '').split('?')[0] !== '/connect') return refuse(404, `no tunnel at ${req.url}`);
    const peer = peerCluster(socket as TLSSocket);
    if (!('cluster' in peer)) return refuse(401, peer.problem);
    const registered = opts.clusters.get(peer.cluster);
    if (!registered) return refuse(401, `cluster ${peer.cluster} is not in the registry`);
    const cluster = peer.cluster;
    const agentVersion = String(req.headers['x-sealion-agent-version'] ?? 'unknown');
    const expires = new Date((socket as TLSSocket).getPeerX509Certificate()!.validTo);
    const certificateExpiry = expires.toISOString();
    wss.handleUpgrade(req, socket, head, (ws) => {
      const limits = tunnelLimits(registered.spec ?? {});
      const tunnel = newTunnelClient(createWebSocketStream(ws), { maxStreams: limits.capacity });
      const previous = connected.get(cluster);
      const since = new Date();
      const entry: Connected = { tunnel, forwarder: newTunnelForwarder(cluster, tunnel, { limits }), since };
      connected.set(cluster, entry);
      previous?.tunnel.close();
      log.info({ cluster, agentVersion }, 'agent connected');
      // TLS checked the certificate once, at the handshake; the tunnel must not outlive it. The agent renews its
      // certificate long before, and dials again with the new one when this tunnel closes.
      const expiry = atTime(expires.getTime(), () => {
        log.info({ cluster, certificateExpiry }, 'tunnel closed: the certificate it was opened with expired');
        tunnel.close();
      });
      writeStatus(cluster, {
        connected: true,
        connectedSince: since.toISOString(),
        tunnels: [{ replica: opts.replica, connectedSince: since.toISOString() }],
        agentVersion,
        certificateExpiry,
      });
      // Pushed, not polled: the status changes the moment the tunnel closes.
      void tunnel.closed.then(() => {
        expiry.cancel();
        if (connected.get(cluster) !== entry) return;
        connected.delete(cluster);
        log.info({ cluster }, 'agent disconnected');
        writeStatus(cluster, { connected: false, tunnels: [] });
      });
    });
  });

  // A Cluster removed from the registry loses its tunnel at once, not at the agent's next reconnect; an edited one
  // has its limits applied to the open tunnel.
  opts.clusters.onChange((obj) => {
    const name = obj.metadata.name ?? '';
    const current = opts.clusters.get(name);
    if (!current) return connected.get(name)?.tunnel.close();
    connected.get(name)?.forwarder.configure(tunnelLimits(current.spec ?? {}));
  });

  await new Promise<void>((done) => server.listen(opts.port, opts.host, done));
  const port = (server.address() as AddressInfo).port;
  log.info({ host: opts.host, port }, 'tunnel listener listening');
  return {
    port,
    caPem: ca.certPem,
    forwarder: (cluster) => connected.get(cluster)?.forwarder,
    async stop() {
      for (const entry of connected.values()) entry.tunnel.close();
      connected.clear();
      server.closeAllConnections();
      await new Promise<void>((done) => server.close(() => done()));
    },
  };
}
