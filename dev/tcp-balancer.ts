// A TCP load balancer on loopback in front of several local ports, as a Service's load balancer stands in front of
// its pods: each connection goes to the next port in turn, and on to the one after when a port refuses. For tests
// and benchmarks whose concierge replicas run as processes, with agents dialing them all through one address.
import { connect, createServer, type Socket } from 'node:net';

export interface TcpBalancer {
  port: number;
  stop(): Promise<void>;
}

/** Balances over the ports `backends()` names at each new connection. */
export async function startTcpBalancer(backends: () => number[]): Promise<TcpBalancer> {
  let next = 0;
  const open = new Set<Socket>();
  // Half-open: a client that ends its side still reads the answer.
  const server = createServer({ allowHalfOpen: true, noDelay: true }, (client: Socket) => {
    client.pause();
    client.on('error', () => client.destroy());
    open.add(client);
    client.once('close', () => open.delete(client));
    const ports = backends();
    const attempt = (tried: number): void => {
      if (tried >= ports.length || client.destroyed) return void client.destroy();
      const upstream = connect({
        port: ports[next++ % ports.length]!,
        host: '127.0.0.1',
        allowHalfOpen: true,
        noDelay: true,
      });
      upstream.once('error', () => attempt(tried + 1));
      upstream.once('connect', () => {
        upstream.removeAllListeners('error');
        upstream.on('error', () => client.destroy());
        upstream.once('close', () => client.destroy());
        client.once('close', () => upstream.destroy());
        client.pipe(upstream).pipe(client);
        client.resume();
      });
    };
    attempt(0);
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  return {
    port: (server.address() as { port: number }).port,
    stop() {
      for (const socket of open) socket.destroy();
      return new Promise((done) => server.close(() => done()));
    },
  };
}
