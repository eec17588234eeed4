// A load balancer for clusters without a cloud, as tests and `npm start` need one. Each LoadBalancer
// Service gets a loopback address of its own (its loadBalancerIP when that is a loopback address, else a free
// one in 127.64.0.0/10), a listener there on each of its TCP ports, and its address in
// status.loadBalancer.ingress, as a cloud's controller would write it. Connections go to the backend the caller
// names for the Service: here there are no pods, so the caller knows where the "pod" listens.
import { createServer, connect, isIP, type Server } from 'node:net';
import { newControllerManager } from '../controllers/lib/manager.ts';
import type { KubeObject } from '../lib/informer.ts';
import { newCoreInformer, patchServiceLoadBalancer, type KubeClients } from '../lib/kube.ts';
import { silentLogger, type Logger } from '../lib/log.ts';

export interface LoadBalancedService extends KubeObject {
  metadata: { name: string; namespace: string; uid?: string };
  spec?: {
    type?: string;
    loadBalancerIP?: string;
    ports?: { name?: string; port: number; protocol?: string }[];
    selector?: Record<string, string>;
  };
  status?: { loadBalancer?: { ingress?: { ip?: string; hostname?: string }[] } };
}

export interface LocalLoadBalancerOptions {
  clients: KubeClients;
  /** Where a connection to the Service's port goes; undefined: nowhere (the connection is closed). */
  backend(service: LoadBalancedService, port: number): { host: string; port: number } | undefined;
  log?: Logger;
}

export interface LocalLoadBalancer {
  /** The address given to a Service, once it has one. */
  addressOf(namespace: string, name: string): string | undefined;
  stop(): Promise<void>;
}

interface Balanced {
  ip: string;
  servers: Map<number, Server>;
}

/** How many addresses to try before giving up on a Service (another process may hold some). */
const ADDRESS_ATTEMPTS = 20;

function randomLoopback(): string {
  const byte = (lo: number, hi: number): number => lo + Math.floor(Math.random() * (hi - lo + 1));
  return `127.${byte(64, 127)}.${byte(0, 255)}.${byte(1, 254)}`;
}

const isLoopback = (ip: string | undefined): ip is string =>
  Boolean(ip && isIP(ip) === 4 && ip.startsWith('127.'));

function listen(server: Server, ip: string, port: number): Promise<void> {
  return new Promise((done, fail) => {
    server.once('error', fail);
    server.listen(port, ip, () => {
      server.off('error', fail);
      done();
    });
  });
}

const closeAll = (servers: Iterable<Server>): Promise<void[]> =>
  Promise.all([...servers].map((s) => new Promise<void>((done) => s.close(() => done()))));

export async function startLocalLoadBalancer(opts: LocalLoadBalancerOptions): Promise<LocalLoadBalancer> {
  const log = opts.log ?? silentLogger();
  const services = newCoreInformer<LoadBalancedService>(opts.clients, 'services', '', log);
  const balanced = new Map<string, Balanced>();
  const keyOf = (namespace: string, name: string): string => `${namespace}/${name}`;

  function serverFor(namespace: string, name: string, port: number): Server {
    return createServer((socket) => {
      const service = services.get(name, namespace);
      const target = service && opts.backend(service, port);
      if (!target) return void socket.destroy();
      const upstream = connect(target.port, target.host);
      socket.pipe(upstream).pipe(socket);
      const end = (): void => {
        socket.destroy();
        upstream.destroy();
      };
      socket.on('error', end).on('close', end);
      upstream.on('error', end).on('close', end);
    });
  }

  /** Listens on every port of the Service at one address; tries other addresses when one is taken. */
  async function bind(service: LoadBalancedService, ports: number[]): Promise<Balanced> {
    const { namespace, name } = service.metadata;
    const wanted = service.spec?.loadBalancerIP;
    const candidates = isLoopback(wanted)
      ? [wanted]
      : Array.from({ length: ADDRESS_ATTEMPTS }, randomLoopback);
    let lastError: Error | undefined;
    for (const ip of candidates) {
      const servers = new Map<number, Server>();
      try {
        for (const port of ports) {
          const server = serverFor(namespace, name, port);
          servers.set(port, server);
          await listen(server, ip, port);
        }
        return { ip, servers };
      } catch (err) {
        await closeAll(servers.values());
        lastError = err as Error;
        if ((err as NodeJS.ErrnoException).code === 'EACCES')
          throw new Error(
            `listening on ${ip}:${ports.join(',')} needs root or CAP_NET_BIND_SERVICE ` +
              '(or sysctl net.ipv4.ip_unprivileged_port_start=0)',
            { cause: err },
          );
      }
    }
    throw new Error(`no free loopback address for ${namespace}/${name}: ${lastError?.message}`);
  }

  // A cloud's controller: no leader election, a single writer.
  const running = newControllerManager({ log });
  running.run({
    name: 'local-load-balancer',
    watches: [
      {
        informer: services,
        key: (s: LoadBalancedService) => keyOf(s.metadata.namespace, s.metadata.name),
      },
    ],
    // Addresses that cannot be bound are logged and retried with backoff, as a cloud would keep trying.
    async sync(key) {
      const [namespace, name] = key.split('/') as [string, string];
      const service = services.get(name, namespace);
      const ports = (service?.spec?.ports ?? [])
        .filter((p) => (p.protocol ?? 'TCP') === 'TCP')
        .map((p) => p.port);
      let current = balanced.get(key);
      if (!service || service.spec?.type !== 'LoadBalancer' || ports.length === 0) {
        if (!current) return;
        balanced.delete(key);
        await closeAll(current.servers.values());
        if (service) await patchServiceLoadBalancer(opts.clients, namespace, name, []);
        return;
      }
      const samePorts =
        current && current.servers.size === ports.length && ports.every((p) => current!.servers.has(p));
      if (current && !samePorts) {
        balanced.delete(key);
        await closeAll(current.servers.values());
        current = undefined;
      }
      if (!current) {
        current = await bind(service, ports);
        balanced.set(key, current);
        log.info({ service: key, ip: current.ip, ports }, 'load balancer address assigned');
      }
      const ingress = service.status?.loadBalancer?.ingress;
      if (ingress?.length !== 1 || ingress[0]?.ip !== current.ip)
        await patchServiceLoadBalancer(opts.clients, namespace, name, [{ ip: current.ip }]);
    },
  });
  await running.start();

  return {
    addressOf: (namespace, name) => balanced.get(keyOf(namespace, name))?.ip,
    async stop() {
      await running.stop();
      await services.stop();
      await closeAll([...balanced.values()].flatMap((b) => [...b.servers.values()]));
      balanced.clear();
    },
  };
}
