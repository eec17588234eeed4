// A load balancer for clusters without a cloud, as tests and `npm start` need one. Each LoadBalancer
// Service gets an address of its own, a listener there on each of its TCP ports, and its address in
// status.loadBalancer.ingress, as a cloud's controller would write it. Addresses are loopback ones (its
// loadBalancerIP when that is a loopback address, else a free one in 127.64.0.0/10), or, for clusters with nodes
// whose pods must reach them too, addresses in 10.202.0.0/16 added to the machine's loopback interface (a local
// address, which nodes' traffic reaches through their veth pairs; this VM's kernel has no dummy interfaces). Connections go
// to the Service's ready pods (its EndpointSlices), or to a backend the caller names for Services without pods.
import { execFile } from 'node:child_process';
import { createServer, connect, isIP, type Server, type Socket } from 'node:net';
import { promisify } from 'node:util';
import { newControllerManager } from '../lib/controller/manager.ts';
import type { KubeObject } from '../lib/kube/informer.ts';
import { newCoreInformer, patchServiceLoadBalancer, type KubeClients } from '../lib/kube/kube.ts';
import { silentLogger, type Logger } from '../lib/log.ts';
import { isAlive } from './processes.ts';

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

type Backend = { host: string; port: number } | undefined;

export interface LocalLoadBalancerOptions {
  clients: KubeClients;
  /**
   * Where a connection to the Service's port goes; undefined: nowhere (the connection is closed). Default: one
   * of the Service's ready endpoints (podBackend).
   */
  backend?: (service: LoadBalancedService, port: number) => Backend | Promise<Backend>;
  /** Addresses pods on nodes can reach too (on a dummy interface, needs root), not loopback ones. */
  reachableFromPods?: boolean;
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

const exec = promisify(execFile);
/** Where the reachable addresses go. */
const MACHINE_INTERFACE = 'lo';

/** Where listeners go: loopback addresses, or machine addresses that pods' traffic reaches. */
interface AddressPool {
  candidates(wanted: string | undefined): string[];
  /** Makes the address exist on the machine; false when another holder has it. */
  claim(ip: string): Promise<boolean>;
  release(ip: string): Promise<void>;
}

const loopbackPool: AddressPool = {
  candidates: (wanted) =>
    isLoopback(wanted) ? [wanted] : Array.from({ length: ADDRESS_ATTEMPTS }, randomLoopback),
  claim: () => Promise.resolve(true),
  release: () => Promise.resolve(),
};

async function ipCommand(args: string[]): Promise<void> {
  try {
    await exec('ip', args);
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim() || (err as Error).message;
    throw new Error(`ip ${args.join(' ')}: ${stderr}`, { cause: err });
  }
}

/** Each address is labelled with its owner's pid, so that those of a process that died are removed. */
const LABEL_PREFIX = `${MACHINE_INTERFACE}:s`;

async function sweepStaleAddresses(): Promise<void> {
  const { stdout } = await exec('ip', ['-o', '-4', 'addr', 'show', 'dev', MACHINE_INTERFACE]);
  for (const line of stdout.split('\n')) {
    const match = new RegExp(`inet (10\\.202\\.[\\d.]+/32) .*${LABEL_PREFIX}(\\d+)`).exec(line);
    if (match && !isAlive(Number(match[2]))) {
      await ipCommand(['addr', 'del', match[1]!, 'dev', MACHINE_INTERFACE]).catch(() => {});
    }
  }
}

function machinePool(): AddressPool {
  let swept: Promise<void> | undefined;
  const random = (): string =>
    `10.202.${Math.floor(Math.random() * 256)}.${1 + Math.floor(Math.random() * 254)}`;
  return {
    candidates: () => Array.from({ length: ADDRESS_ATTEMPTS }, random),
    async claim(ip) {
      swept ??= sweepStaleAddresses();
      await swept;
      try {
        // The kernel refuses an address twice: adding it is the lock between load balancers.
        const label = `${LABEL_PREFIX}${process.pid}`;
        await ipCommand(['addr', 'add', `${ip}/32`, 'dev', MACHINE_INTERFACE, 'label', label]);
        return true;
      } catch (err) {
        if ((err as Error).message.includes('File exists')) return false;
        throw err;
      }
    },
    async release(ip) {
      await ipCommand(['addr', 'del', `${ip}/32`, 'dev', MACHINE_INTERFACE]).catch(() => {});
    },
  };
}

interface EndpointSliceLike {
  ports?: { name?: string; port?: number; protocol?: string }[] | null;
  endpoints: { addresses: string[]; conditions?: { ready?: boolean } }[];
}

/** One of the Service's ready endpoints for `port`, chosen at random, as a cloud's balancer spreads load. */
export async function podBackend(
  clients: KubeClients,
  service: LoadBalancedService,
  port: number,
): Promise<Backend> {
  const portName = service.spec?.ports?.find((p) => p.port === port)?.name ?? '';
  const slices = (await clients.objects.list(
    'discovery.k8s.io/v1',
    'EndpointSlice',
    service.metadata.namespace,
    undefined,
    undefined,
    undefined,
    undefined,
    `kubernetes.io/service-name=${service.metadata.name}`,
  )) as unknown as { items: EndpointSliceLike[] };
  const targets: Backend[] = [];
  for (const slice of slices.items) {
    const target = slice.ports?.find((p) => (p.name ?? '') === portName && (p.protocol ?? 'TCP') === 'TCP');
    if (!target?.port) continue;
    for (const endpoint of slice.endpoints) {
      if (endpoint.conditions?.ready === false) continue;
      for (const address of endpoint.addresses) targets.push({ host: address, port: target.port });
    }
  }
  return targets[Math.floor(Math.random() * targets.length)];
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

/** Connections each listener carries, which closing it must end (a tunnel through it lives for hours). */
const connections = new WeakMap<Server, Set<Socket>>();

const closeAll = (servers: Iterable<Server>): Promise<void[]> =>
  Promise.all(
    [...servers].map(
      (s) =>
        new Promise<void>((done) => {
          s.close(() => done());
          for (const socket of connections.get(s) ?? []) socket.destroy();
        }),
    ),
  );

export async function startLocalLoadBalancer(opts: LocalLoadBalancerOptions): Promise<LocalLoadBalancer> {
  const log = opts.log ?? silentLogger();
  const pool = opts.reachableFromPods ? machinePool() : loopbackPool;
  const backend =
    opts.backend ?? ((service: LoadBalancedService, port: number) => podBackend(opts.clients, service, port));
  const services = newCoreInformer<LoadBalancedService>(opts.clients, 'services', '', log);
  const balanced = new Map<string, Balanced>();
  const keyOf = (namespace: string, name: string): string => `${namespace}/${name}`;

  function serverFor(namespace: string, name: string, port: number): Server {
    const open = new Set<Socket>();
    // Half-open, as a cloud's TCP load balancer is: a client that ends its side still reads the answer.
    const server = createServer({ allowHalfOpen: true, noDelay: true }, (socket) => {
      open.add(socket);
      socket.on('close', () => open.delete(socket));
      socket.on('error', () => socket.destroy());
      const service = services.get(name, namespace);
      // Held while the backend is looked up; the client's first bytes wait in the socket.
      socket.pause();
      void Promise.resolve(service && backend(service, port))
        .catch((err: unknown) => {
          log.warn({ err, service: `${namespace}/${name}` }, 'no backend');
          return undefined;
        })
        .then((target) => {
          if (!target || socket.destroyed) return void socket.destroy();
          const upstream = connect({
            port: target.port,
            host: target.host,
            allowHalfOpen: true,
            noDelay: true,
          });
          socket.pipe(upstream).pipe(socket);
          socket.resume();
          const end = (): void => {
            socket.destroy();
            upstream.destroy();
          };
          socket.on('close', end);
          upstream.on('error', end).on('close', end);
        });
    });
    connections.set(server, open);
    return server;
  }

  /** Listens on every port of the Service at one address; tries other addresses when one is taken. */
  async function bind(service: LoadBalancedService, ports: number[]): Promise<Balanced> {
    const { namespace, name } = service.metadata;
    let lastError: Error | undefined;
    for (const ip of pool.candidates(service.spec?.loadBalancerIP)) {
      const servers = new Map<number, Server>();
      if (!(await pool.claim(ip))) continue;
      try {
        for (const port of ports) {
          const server = serverFor(namespace, name, port);
          servers.set(port, server);
          await listen(server, ip, port);
        }
        return { ip, servers };
      } catch (err) {
        await closeAll(servers.values());
        await pool.release(ip);
        lastError = err as Error;
        if ((err as NodeJS.ErrnoException).code === 'EACCES')
          throw new Error(
            `listening on ${ip}:${ports.join(',')} needs root or CAP_NET_BIND_SERVICE ` +
              '(or sysctl net.ipv4.ip_unprivileged_port_start=0)',
            { cause: err },
          );
      }
    }
    throw new Error(`no free address for ${namespace}/${name}: ${lastError?.message ?? 'all taken'}`);
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
        await pool.release(current.ip);
        if (service) await patchServiceLoadBalancer(opts.clients, namespace, name, []);
        return;
      }
      if (current) {
        // Ports added or removed keep the address, as a cloud's balancer does: clients that know it keep working.
        const kept = current;
        for (const [port, server] of [...kept.servers]) {
          if (ports.includes(port)) continue;
          kept.servers.delete(port);
          await closeAll([server]);
        }
        try {
          for (const port of ports.filter((p) => !kept.servers.has(p))) {
            const server = serverFor(namespace, name, port);
            kept.servers.set(port, server);
            await listen(server, kept.ip, port);
          }
        } catch (err) {
          // The address cannot take the new port: the Service moves to a new address whole.
          log.warn({ service: key, err: (err as Error).message }, 'load balancer port could not be added');
          balanced.delete(key);
          await closeAll(kept.servers.values());
          await pool.release(kept.ip);
          current = undefined;
        }
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
      for (const b of balanced.values()) await pool.release(b.ip);
      balanced.clear();
    },
  };
}
