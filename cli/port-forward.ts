// `sealion port-forward`: local ports that lead to a pod's or a service's port, as `kubectl port-forward`, over
// Sealion's reach protocol instead of SPDY. Each local connection is one request to the kubeconfig's cluster for
// .../<pods|services>/<name>/connect?port=<port>, which the server answers only once it has connected to the target:
// an extended CONNECT stream of the one HTTP/2 session the forward keeps (reach-session.ts), answered 200; or, with a
// server that takes none, an HTTP/1.1 upgrade (POST, `Upgrade: tcp`) on a TLS connection of its own, answered 101.
// The connection then carries the raw bytes both ways, each side's end passed on as a half-close. A refusal is the
// answer's Kubernetes Status, reported for that connection alone: the forward keeps serving the others.
import { Agent, request, type RequestOptions } from 'node:https';
import { createServer, isIP, type Server, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { Command, Option } from 'commander';
import { withKubeconfig } from './options.ts';
import { DEFAULT_GROUP_SUFFIX, isValidGroupSuffix } from '../apis/groups.ts';
import { closeHttpsPools } from '../lib/https-client.ts';
import { isDNSLabel, isDNSSubdomain, isPortName } from '../apis/names.ts';
import { reachPath as serverReachPath, REACH_UPGRADE } from '../lib/reach/target.ts';
import type { KubeConfig } from '../lib/kube/kube.ts';
import { takesNames } from './completion.ts';
import { checkForward } from './port-forward-check.ts';
import { printable } from './printable.ts';
import {
  failWithRefusal,
  newAttempt,
  newReachSessions,
  ReachError,
  type ReachSessions,
} from './reach-session.ts';

export { ReachError };
import { kubeconfigAccess, loginFirst, type KubeconfigAccess } from './whoami.ts';

export interface PortForwardFlags {
  kubeconfig: string;
  context: string;
  /** A cluster reached through its agent: `/clusters/<name>` before the path. Empty: the server's own cluster. */
  cluster: string;
  /** Empty: the context's namespace, else `default`. */
  namespace: string;
  /** Comma-separated addresses to listen on; `localhost` is 127.0.0.1 and ::1. */
  address: string;
  groupSuffix: string;
}

/** What a connection can lead to. */
export type ReachResource = 'pods' | 'services';

/** Where one upgraded connection leads. */
export interface ReachTarget {
  /** A cluster reached through its agent; undefined: the server's own. */
  cluster?: string;
  groupSuffix: string;
  namespace: string;
  resource: ReachResource;
  name: string;
  /** A port number (1-65535) or a port's name. */
  port: string;
}

/** One `[LOCAL:]REMOTE` argument: the local port (0: any free one) and the remote port, a number or a name. */
export interface PortSpec {
  local: number;
  remote: string;
}

/**
 * An address to listen on. `optional` addresses come from `localhost`, which needs only one of 127.0.0.1 and ::1 to
 * listen (a host without IPv6 has no ::1); an address named on its own must listen, as kubectl has it.
 */
export interface ListenAddress {
  host: string;
  optional: boolean;
}

/** How long a connection waits for the server's 101 before it gives up. */
export const REACH_TIMEOUT_MS = 30_000;
/** A reported error is cut after this many characters. */
const MAX_MESSAGE_LENGTH = 1000;

/** The resource types kubectl takes for port-forward, by every name it takes them. */
const RESOURCE_TYPES: Record<string, ReachResource> = {
  pod: 'pods',
  pods: 'pods',
  po: 'pods',
  svc: 'services',
  service: 'services',
  services: 'services',
};

/** `TYPE/NAME`, or a bare `NAME` (a pod, as kubectl reads it). */
export function parseResource(arg: string): { resource: ReachResource; name: string } {
  const slash = arg.indexOf('/');
  const type = slash < 0 ? 'pod' : arg.slice(0, slash);
  const name = slash < 0 ? arg : arg.slice(slash + 1);
  const resource = Object.hasOwn(RESOURCE_TYPES, type) ? RESOURCE_TYPES[type] : undefined;
  if (!resource)
    throw new Error(
      `${JSON.stringify(arg)}: port-forward reaches pods (pod/NAME, or NAME) and services (svc/NAME), not ${JSON.stringify(type)}`,
    );
  if (resource === 'pods' && !isDNSSubdomain(name))
    throw new Error(
      `${JSON.stringify(arg)}: ${JSON.stringify(name)} is not a pod name (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.')`,
    );
  if (resource === 'services' && !isDNSLabel(name))
    throw new Error(
      `${JSON.stringify(arg)}: ${JSON.stringify(name)} is not a service name (a DNS-1123 label: at most 63 lower-case letters, digits and '-')`,
    );
  return { resource, name };
}

/** A port number in `min`..65535 written in digits, or undefined. */
function portNumber(text: string, min: number): number | undefined {
  if (!/^[0-9]{1,5}$/.test(text)) return undefined;
  const port = Number(text);
  return port >= min && port <= 65535 ? port : undefined;
}

/**
 * `[LOCAL:]REMOTE`: `8080:80`, `80` (the same port here), `:80` (any free port here). REMOTE is a number or a port's
 * name; a name needs a local port, since there is no number to take for it (kubectl's rule).
 */
export function parsePort(arg: string): PortSpec {
  const parts = arg.split(':');
  if (parts.length > 2) throw new Error(`port ${JSON.stringify(arg)}: write it as [LOCAL:]REMOTE`);
  const remoteText = parts.at(-1)!;
  const localText = parts.length === 2 ? parts[0]! : undefined;
  const remoteNumber = portNumber(remoteText, 1);
  if (remoteNumber === undefined && !isPortName(remoteText))
    throw new Error(
      `port ${JSON.stringify(arg)}: the remote port ${JSON.stringify(remoteText)} is neither a number from 1 to 65535 nor a port name (at most 15 lower-case letters, digits and '-', with a letter)`,
    );
  if (localText === undefined) {
    if (remoteNumber === undefined)
      throw new Error(
        `port ${JSON.stringify(arg)}: a named remote port needs a local port: LOCAL:${remoteText}, or :${remoteText} for any free one`,
      );
    return { local: remoteNumber, remote: String(remoteNumber) };
  }
  const local = localText === '' ? 0 : portNumber(localText, 0);
  if (local === undefined)
    throw new Error(
      `port ${JSON.stringify(arg)}: the local port ${JSON.stringify(localText)} is not a number from 0 to 65535`,
    );
  return { local, remote: remoteNumber === undefined ? remoteText : String(remoteNumber) };
}

/** `--address`: IP addresses and `localhost`, comma-separated, each listened on once. */
export function parseAddresses(value: string): ListenAddress[] {
  const found = new Map<string, boolean>();
  const add = (host: string, optional: boolean): void => {
    // An address both named and implied by localhost must listen.
    found.set(host, (found.get(host) ?? true) && optional);
  };
  for (const entry of value.split(',').map((a) => a.trim())) {
    if (entry === 'localhost') {
      add('127.0.0.1', true);
      add('::1', true);
    } else if (isIP(entry)) add(entry, false);
    else
      throw new Error(
        `--address: ${JSON.stringify(entry)} is neither an IP address nor localhost (addresses are comma-separated)`,
      );
  }
  return [...found].map(([host, optional]) => ({ host, optional }));
}

/** The request's path, relative to the server's URL (kubeconfigAccess' `base`). */
export function reachPath(target: ReachTarget): string {
  const prefix = target.cluster ? `clusters/${encodeURIComponent(target.cluster)}/` : '';
  const { namespace, resource, name, port } = target;
  return prefix + serverReachPath(target.groupSuffix, { namespace, kind: resource, name, port }).slice(1);
}

/**
 * Opens one connection to `target`: an upgrade request to the server of `access` through `agent`. Resolves with the
 * upgraded socket once the server answered 101 (its side is connected then); rejects with a ReachError on any other
 * answer, a network error, after `timeoutMs` without an answer, or when `signal` aborts. The socket ends its writing
 * side only when told to (half-open), has Nagle's algorithm off, and has no error listener: the caller adds one at
 * once. `agent` should be shared by every connection (keepAlive false), so that each resumes the TLS session of the
 * ones before it.
 */
export function openReach(
  access: KubeconfigAccess,
  agent: Agent,
  target: ReachTarget,
  options: { timeoutMs?: number; signal?: AbortSignal } = {},
): Promise<Socket> {
  const url = new URL(reachPath(target), access.base);
  if (url.protocol !== 'https:')
    return Promise.reject(new ReachError(`the cluster's server ${printable(url.origin)} is not https`));
  const timeoutMs = options.timeoutMs ?? REACH_TIMEOUT_MS;
  const { signal } = options;
  if (signal?.aborted) return Promise.reject(new ReachError('cancelled'));
  return new Promise((resolve, reject) => {
    const requestOptions: RequestOptions & { allowHalfOpen: boolean } = {
      method: 'POST',
      agent,
      minVersion: 'TLSv1.2',
      ...(access.caPem ? { ca: access.caPem } : {}),
      ...(access.clientCert ? { cert: access.clientCert.certPem, key: access.clientCert.keyPem } : {}),
      // Passed on to tls.connect: otherwise the socket ends its writing side as soon as the server ends its own,
      // and a client still sending would lose the rest.
      allowHalfOpen: true,
      headers: {
        ...access.headers,
        connection: 'Upgrade',
        upgrade: REACH_UPGRADE,
        // No body: after the headers, every byte is the target's. (Node says so too for a POST ended empty.)
        'content-length': '0',
      },
    };
    const req = request(url, requestOptions);
    // The handshake's and the request's small writes go at once, not after the next ACK.
    req.setNoDelay(true);
    const attempt = newAttempt(
      timeoutMs,
      `the server did not switch protocols within ${timeoutMs / 1000} s`,
      signal,
      () => req.destroy(),
      reject,
    );
    req.on('error', (err) => attempt.fail(new ReachError(`cannot reach ${url.host}: ${err.message}`)));
    req.on('upgrade', (res, socket: Socket, head: Buffer) => {
      if (attempt.settled) return void socket.destroy();
      const protocol = res.headers.upgrade ?? '';
      if (protocol.toLowerCase() !== REACH_UPGRADE) {
        socket.destroy();
        return attempt.fail(
          new ReachError(`the server switched to ${JSON.stringify(printable(protocol))}, not tcp`),
        );
      }
      attempt.settle();
      socket.setNoDelay(true);
      // Bytes the target sent right behind the 101, read with it.
      if (head.length > 0) socket.unshift(head);
      resolve(socket);
    });
    req.on('response', (res) => failWithRefusal(attempt, res.statusCode ?? 0, res));
    req.end();
  });
}

/**
 * Pipes two sockets into each other until both directions are done. A side's end is passed on as the other's end
 * (pipe ends its destination), and neither ends on its own (both are half-open), so each direction finishes
 * separately. An error on either side, or a side closed before both its directions finished (cut off), destroys
 * both. `aPiped`: `a` is piped into `b` already (its first bytes went before the server answered).
 */
export function splice(a: Duplex, b: Duplex, aPiped = false): void {
  const cut = (): void => {
    a.destroy();
    b.destroy();
  };
  for (const [from, to] of [
    [a, b],
    [b, a],
  ] as const) {
    if (from !== a || !aPiped) from.pipe(to);
    from.on('error', cut);
    from.on('close', () => {
      if (!from.readableEnded || !from.writableFinished) to.destroy();
    });
  }
}

/** Where a running forward writes: kubectl's lines on `out`, each connection's failure on `err`. */
export interface ForwardOutput {
  out: (line: string) => void;
  err: (line: string) => void;
}

/**
 * Opens the connection for one accepted local connection `local`, to `port` on the forward's target: an upgraded
 * socket or an HTTP/2 stream, with no error listener (the caller adds one at once); `sending` when `local` is piped
 * into it already.
 */
export type ReachOpener = (
  port: string,
  signal: AbortSignal,
  local: Socket,
) => Promise<{ upstream: Duplex; sending: boolean }>;

/** A running forward. */
export interface Forward {
  /** Every listener: its address, the local port it got, and the remote port. */
  listeners: { host: string; port: number; remote: string }[];
  /** Stops listening, cancels the connections being opened and closes the open ones. */
  close(): Promise<void>;
}

/** `host:port`, with an IPv6 address in brackets. */
const hostPort = (host: string, port: number): string =>
  isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;

/** Listens on `host:port`; the server, or why not. */
function listen(host: string, port: number, onConnection: (socket: Socket) => void): Promise<Server> {
  // allowHalfOpen: a client that ends its writing side still reads what the target sends after.
  const server = createServer({ allowHalfOpen: true, noDelay: true }, onConnection);
  return new Promise((done, fail) => {
    server.once('error', fail);
    server.listen({ host, port }, () => {
      server.off('error', fail);
      done(server);
    });
  });
}

/** Stops a server listening; its open connections are closed by whoever holds them. */
const stopListening = (server: Server): Promise<void> => new Promise((done) => server.close(() => done()));

/**
 * Listens on every address for every port, as kubectl does: a port's first listener fixes a free port where it
 * asked for any (`:80`), and the others listen on the same. Each accepted connection is joined to the one `open`
 * makes for it, or closed with the reason on `output.err`. Fails, with nothing left listening, when a port has no
 * listener or an address named on its own would not listen.
 */
export async function forward(
  addresses: ListenAddress[],
  ports: PortSpec[],
  open: ReachOpener,
  output: ForwardOutput,
): Promise<Forward> {
  const servers: Server[] = [];
  const sockets = new Set<Duplex>();
  const pending = new Set<AbortController>();
  const listeners: Forward['listeners'] = [];
  const track = (socket: Duplex): void => {
    sockets.add(socket);
    socket.once('close', () => sockets.delete(socket));
  };

  const accept = (local: Socket, localPort: number, remote: string): void => {
    output.out(`Handling connection for ${localPort}`);
    track(local);
    local.setNoDelay(true);
    const cancel = new AbortController();
    pending.add(cancel);
    // Until the connection is open, a local client that goes away cancels it; an error on it closes it.
    local.on('error', () => local.destroy());
    local.once('close', () => cancel.abort());
    open(remote, cancel.signal, local).then(
      ({ upstream: upgraded, sending }) => {
        pending.delete(cancel);
        track(upgraded);
        if (local.destroyed) return void upgraded.destroy();
        splice(local, upgraded, sending);
      },
      (err: unknown) => {
        pending.delete(cancel);
        if (!cancel.signal.aborted)
          output.err(
            `error: forwarding ${localPort} -> ${printable(remote)}: ${printable((err as Error).message, MAX_MESSAGE_LENGTH)}`,
          );
        local.destroy();
      },
    );
  };

  const close = async (): Promise<void> => {
    for (const cancel of pending) cancel.abort();
    for (const socket of sockets) socket.destroy();
    await Promise.all(servers.map(stopListening));
  };

  try {
    for (const spec of ports) {
      let port = spec.local;
      let listening = 0;
      const failures: string[] = [];
      for (const { host, optional } of addresses) {
        try {
          const server = await listen(host, port, (socket) => accept(socket, port, spec.remote));
          servers.push(server);
          port = (server.address() as { port: number }).port;
          listeners.push({ host, port, remote: spec.remote });
          listening++;
          output.out(`Forwarding from ${hostPort(host, port)} -> ${spec.remote}`);
        } catch (err) {
          // Node's message names the address and the port.
          if (!optional)
            throw new Error(`cannot forward to port ${spec.remote}: ${(err as Error).message}`, {
              cause: err,
            });
          failures.push((err as Error).message);
        }
      }
      if (listening === 0) throw new Error(`cannot forward to port ${spec.remote}: ${failures.join('; ')}`);
      for (const failure of failures)
        output.err(`note: one address of localhost does not listen: ${failure}`);
    }
  } catch (err) {
    await close();
    throw err;
  }
  return { listeners, close };
}

/**
 * One kubeconfigAccess at a time: connections opened together share the run (and an exec plugin's, when its
 * credential expired), and those after ask again, so that a renewed credential is used.
 */
function sharedAccess(config: KubeConfig): () => Promise<KubeconfigAccess> {
  let running: Promise<KubeconfigAccess> | undefined;
  return () =>
    (running ??= kubeconfigAccess(config).finally(() => {
      running = undefined;
    }));
}

/**
 * Starts `sealion port-forward`: checks every argument before anything goes over the network, logs in once (an exec
 * plugin's prompt shows on the terminal), then listens. Each connection asks the kubeconfig for its credentials, so
 * that one expiring in a long forward is renewed.
 */
export async function startPortForward(
  flags: PortForwardFlags,
  resourceArg: string,
  portArgs: string[],
  output: ForwardOutput,
): Promise<Forward> {
  const { resource, name } = parseResource(resourceArg);
  const ports = portArgs.map(parsePort);
  const locals = ports.map((p) => p.local).filter((p) => p !== 0);
  const twice = locals.find((p, i) => locals.indexOf(p) !== i);
  if (twice !== undefined) throw new Error(`local port ${twice} is given twice`);
  const addresses = parseAddresses(flags.address);
  if (flags.cluster && !isDNSSubdomain(flags.cluster))
    throw new Error(
      `--cluster: ${JSON.stringify(flags.cluster)} is not a cluster name (a DNS-1123 subdomain)`,
    );
  if (!isValidGroupSuffix(flags.groupSuffix))
    throw new Error(
      `--group-suffix: ${JSON.stringify(flags.groupSuffix)} is not a DNS subdomain like sealion.dev`,
    );

  const config = (await import('../lib/kube/kube.ts')).loadKubeConfigFlags(flags);
  const namespace =
    flags.namespace || config.getContextObject(config.getCurrentContext())?.namespace || 'default';
  if (!isDNSLabel(namespace))
    throw new Error(`namespace ${JSON.stringify(namespace)} is not a namespace name (a DNS-1123 label)`);
  await loginFirst(config);
  const access = sharedAccess(config);
  // The kubeconfig's faults (no cluster, a plugin that fails) are the command's, not each connection's.
  const first = await access();
  if (new URL(first.base).protocol !== 'https:')
    throw new Error(`the cluster's server ${printable(first.base)} is not https`);
  // Checked before anything listens, as kubectl reads the pod first: a wrong name, port or permission is the
  // command's failure, not each connection's.
  await checkForward(
    first,
    { cluster: flags.cluster, namespace, resource, name },
    ports.map((p) => p.remote),
  );

  // One HTTP/2 session for every connection, where the server takes extended CONNECT (reach-session.ts); else one
  // agent for every upgrade: it keeps the TLS sessions, so that each connection resumes one.
  const sessions: ReachSessions = newReachSessions();
  const agent = new Agent({ keepAlive: false });
  const target = {
    ...(flags.cluster ? { cluster: flags.cluster } : {}),
    groupSuffix: flags.groupSuffix,
    namespace,
    resource,
    name,
  };
  const open: ReachOpener = async (port, signal, local) => {
    const current = await access();
    const to = { ...target, port };
    // The local connection's bytes go on the stream before the answer (reach-session.ts openStream); an HTTP/1.1
    // upgrade takes them only once switched.
    const opened = await sessions.open(current, reachPath(to), REACH_TIMEOUT_MS, signal, local);
    return 'stream' in opened
      ? { upstream: opened.stream, sending: true }
      : { upstream: await openReach(current, agent, to, { signal }), sending: false };
  };
  const stop = (): void => {
    sessions.close();
    agent.destroy();
  };
  try {
    const running = await forward(addresses, ports, open, output);
    return {
      listeners: running.listeners,
      close: async () => {
        await running.close();
        stop();
      },
    };
  } catch (err) {
    stop();
    throw err;
  }
}

/** Resolves on the first SIGINT or SIGTERM, which then no longer end the process: the forward closes itself. */
function untilStopped(): Promise<void> {
  return new Promise((done) => {
    const stop = (): void => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      done();
    };
    process.on('SIGINT', stop);
    process.on('SIGTERM', stop);
  });
}

export function portForwardCommand(): Command {
  return withKubeconfig(
    new Command('port-forward')
      .description(
        "forward local ports to a pod's or a service's ports through Sealion (as kubectl port-forward)",
      )
      .argument('<TYPE/NAME>', 'pod/NAME (po, pods), svc/NAME (service, services), or NAME for a pod')
      .argument('<[LOCAL:]REMOTE...>', 'ports: 8080:80, 80 (the same port here), :80 (any free port here)'),
  )
    .addOption(
      takesNames(
        'cluster',
        new Option(
          '--cluster <name>',
          'a cluster reached through its agent (/clusters/<name> on the proxy)',
        ).default(''),
      ),
    )
    .option(
      '-n, --namespace <namespace>',
      "the target's namespace (default: the context's, else default)",
      '',
    )
    .option('--address <addresses>', 'addresses to listen on, comma-separated IPs or localhost', 'localhost')
    .option('--group-suffix <suffix>', 'API group suffix', DEFAULT_GROUP_SUFFIX)
    .addHelpText(
      'after',
      `
Before it listens it checks with the cluster, as kubectl does, that the pod or service exists, that each remote port
is one of its ports, and that you may open connections to it (the cluster the forward goes to answers); any miss
is one line and exit 1. Every local connection then opens a connection of its own to the target, with the
kubeconfig's credentials, as a stream of one HTTP/2 connection to the server (or, with a server that takes no
extended CONNECT, an HTTP/1.1 upgrade); a refused one is reported and closed, and the others go on. Runs until interrupted
(Ctrl-C).

Examples:
  sealion port-forward svc/web 8080:80
  sealion port-forward -n shop pod/db-0 :5432
  sealion port-forward --address localhost,10.0.0.5 svc/api 8443:https
  sealion port-forward --kubeconfig me.kubeconfig --cluster edge-1 web-7d4b9 9090 9091:metrics`,
    )
    .action(async (resourceArg: string, portArgs: string[], flags: PortForwardFlags) => {
      const running = await startPortForward(flags, resourceArg, portArgs, {
        out: (line) => process.stdout.write(`${line}\n`),
        err: (line) => process.stderr.write(`${line}\n`),
      });
      // The checks' connections are idle from here on; closed so that nothing but the forward keeps the process.
      await closeHttpsPools();
      await untilStopped();
      await running.close();
    });
}
