// A backend at a non-loopback address, for tests in which a real kube-apiserver proxies to it: the API server
// refuses to proxy (services/proxy, pods/proxy) to loopback addresses. The backend runs in a network namespace
// of our own, joined to the root namespace by a veth pair on a private /30 of 10.200.0.0/16, so no traffic
// ever leaves this machine. Needs root and iproute2. Linux only.
import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { eventually } from '../../dev/eventually.ts';
import { dieWithParent, isAlive } from '../../dev/processes.ts';

export interface NetnsBackend {
  /** IPv4 address of the backend inside the namespace (the veth peer), e.g. 10.200.3.2 */
  ip: string;
  /** TCP port the backend listens on inside the namespace */
  port: number;
  /** Name of the network namespace (as `ip netns list` shows it). */
  netns: string;
  /** Name of the veth end in the root namespace. */
  hostInterface: string;
  /** How many `GET /hang` requests have reached the backend (and are held, unanswered). */
  held(): number;
  /** Removes the backend process, the veth pair and the namespace. Idempotent. */
  stop(): Promise<void>;
}

const run = promisify(execFile);

const NETNS_PREFIX = 'slt-';
const DIR_PREFIX = 'sealion-netns-';
// The namespace is ours alone, so a fixed port cannot clash with anything.
const PORT = 8080;
// 10.200.0.0/16 holds 16384 /30 subnets; subnet i gets the veth pair slh-<i>/slp-<i>.
const SUBNETS = 16384;
const MAX_SUBNET_ATTEMPTS = 256;
const READY_TIMEOUT_MS = 10_000;
const OUTPUT_LIMIT = 8_192;

// Plain JavaScript: it runs outside the repository, with no type stripping and no node_modules nearby,
// hence the absolute URL of `ws`.
const SERVER_SCRIPT = `
import { createServer } from 'node:http';
const [port, ip, wsUrl] = process.argv.slice(2);
const ws = await import(wsUrl);
// ws's ESM wrapper exports the class by name; its CommonJS entry only as a property of the default export.
const WebSocketServer = ws.WebSocketServer ?? ws.default.WebSocketServer;
const server = createServer((req, res) => {
  const path = new URL(req.url ?? '/', 'http://backend').pathname;
  if (req.method === 'GET' && path.endsWith('/hello')) {
    res.writeHead(200, { 'content-type': 'text/plain' }).end('hello from ' + ip);
    return;
  }
  // Never answers: a request in flight for as long as the test needs one. Said on stdout, so a test can wait for
  // the request to arrive rather than guess how long that takes.
  if (req.method === 'GET' && path.endsWith('/hang')) return void console.log('holding ' + path);
  // Zeros without end, as fast as the client takes them: a sender that never waits for its reader.
  if (req.method === 'GET' && path.endsWith('/zeros')) {
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    const chunk = Buffer.alloc(64 * 1024);
    const pump = () => {
      while (!res.destroyed && res.write(chunk));
    };
    res.on('drain', pump);
    res.on('error', () => {});
    return pump();
  }
  res.writeHead(404, { 'content-type': 'text/plain' }).end('not found');
});
const wss = new WebSocketServer({ server });
wss.on('connection', (socket) => {
  // A client that goes away mid-message must not bring the server down for the next test.
  socket.on('error', () => {});
  socket.on('message', (data, isBinary) => socket.send(data, { binary: isBinary }));
});
server.listen(Number(port), '0.0.0.0', () => console.log('listening ' + port));
`;

interface Unrefable {
  unref(): void;
}

interface Live {
  netns: string;
  hostInterface?: string;
  child?: ChildProcess;
  dir?: string;
  /** `GET /hang` requests the backend holds. */
  held?: number;
}

/** Everything this process set up, for the last-resort cleanup when a test forgets stop(). */
const live = new Set<Live>();
let exitHookInstalled = false;
let swept = false;
let started = 0;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  // 'exit' handlers must be synchronous, hence execFileSync.
  process.once('exit', () => {
    for (const entry of live) {
      if (entry.child && isRunning(entry.child)) entry.child.kill('SIGKILL');
      if (entry.hostInterface) ipSyncQuiet(['link', 'del', entry.hostInterface]);
      ipSyncQuiet(['netns', 'del', entry.netns]);
      if (entry.dir) rmSync(entry.dir, { recursive: true, force: true });
    }
  });
}

function ipSyncQuiet(args: string[]): void {
  try {
    execFileSync('ip', args, { stdio: 'ignore' });
  } catch {
    // Already gone, or the namespace died with its last process.
  }
}

async function ip(args: string[]): Promise<string> {
  try {
    return (await run('ip', args)).stdout;
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim() || (err as Error).message;
    throw new Error(`ip ${args.join(' ')} failed: ${stderr}`, { cause: err });
  }
}

/** Like ip(), but an object that is already gone is not an error: teardown must be idempotent. */
async function ipUnlessGone(args: string[]): Promise<void> {
  try {
    await ip(args);
  } catch (err) {
    if (!/Cannot find device|does not exist|No such file or directory/.test((err as Error).message))
      throw err;
  }
}

function isRunning(child: ChildProcess): boolean {
  return child.exitCode === null && child.signalCode === null;
}

/**
 * Deletes namespaces (and script folders) left by processes that died without cleaning up (e.g. killed with
 * SIGKILL); a namespace would otherwise keep its veth pair and subnet forever. The owner's pid is in the names.
 */
async function sweepStale(): Promise<void> {
  if (swept) return;
  swept = true;
  for (const name of readdirSync(tmpdir())) {
    const owner = new RegExp(`^${DIR_PREFIX}(\\d+)-`).exec(name)?.[1];
    if (owner && !isAlive(Number(owner))) rmSync(join(tmpdir(), name), { recursive: true, force: true });
  }
  let list: string;
  try {
    list = await ip(['netns', 'list']);
  } catch {
    return;
  }
  for (const line of list.split('\n')) {
    const name = line.split(' ')[0] ?? '';
    const owner = new RegExp(`^${NETNS_PREFIX}(\\d+)-`).exec(name)?.[1];
    if (owner && !isAlive(Number(owner))) await ipUnlessGone(['netns', 'del', name]);
  }
}

function subnet(index: number): { hostIp: string; peerIp: string } {
  const third = index >> 6;
  const base = (index & 63) << 2;
  return { hostIp: `10.200.${third}.${base + 1}`, peerIp: `10.200.${third}.${base + 2}` };
}

/**
 * Claims a /30 and its veth pair. The kernel refuses a second interface with the same name, so creating
 * slh-<i> is an atomic lock on subnet i across processes: on "File exists" someone else holds it.
 */
async function claimSubnet(entry: Live): Promise<{ hostInterface: string; hostIp: string; peerIp: string }> {
  // Different processes start in different places, so concurrent test workers rarely even contend.
  const start = (process.pid * 64 + started++) % SUBNETS;
  for (let attempt = 0; attempt < MAX_SUBNET_ATTEMPTS; attempt++) {
    const index = (start + attempt) % SUBNETS;
    const hostInterface = `slh-${index}`;
    const peer = `slp-${index}`;
    try {
      // The peer is born inside our namespace, so only the host name can clash.
      await ip(['link', 'add', hostInterface, 'type', 'veth', 'peer', 'name', peer, 'netns', entry.netns]);
    } catch (err) {
      if ((err as Error).message.includes('File exists')) continue;
      throw err;
    }
    entry.hostInterface = hostInterface;
    const { hostIp, peerIp } = subnet(index);
    await ip(['addr', 'add', `${hostIp}/30`, 'dev', hostInterface]);
    await ip(['link', 'set', hostInterface, 'up']);
    await ip(['-n', entry.netns, 'addr', 'add', `${peerIp}/30`, 'dev', peer]);
    await ip(['-n', entry.netns, 'link', 'set', 'lo', 'up']);
    await ip(['-n', entry.netns, 'link', 'set', peer, 'up']);
    // Traffic may go only to namespaces of our own: if something else on this machine routes the subnet
    // (an equal or longer prefix elsewhere), give it up rather than send a single packet there.
    const route = await ip(['-o', '-4', 'route', 'get', peerIp]);
    if (new RegExp(`\\bdev ${hostInterface}\\b`).test(route)) return { hostInterface, hostIp, peerIp };
    await ipUnlessGone(['link', 'del', hostInterface]);
    entry.hostInterface = undefined;
  }
  throw new Error(`no free /30 in 10.200.0.0/16 after ${MAX_SUBNET_ATTEMPTS} attempts`);
}

async function createNamespace(): Promise<string> {
  for (;;) {
    const netns = `${NETNS_PREFIX}${process.pid}-${randomBytes(3).toString('hex')}`;
    try {
      await ip(['netns', 'add', netns]);
      return netns;
    } catch (err) {
      if (!(err as Error).message.includes('File exists')) throw err;
    }
  }
}

function startServer(entry: Live, peerIp: string): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), `${DIR_PREFIX}${process.pid}-`));
  entry.dir = dir;
  const script = join(dir, 'backend.mjs');
  writeFileSync(script, SERVER_SCRIPT);
  const command = ['ip', 'netns', 'exec', entry.netns, process.execPath, script];
  // The kernel kills the server when the process that started it dies, even by SIGKILL: `ip netns exec` execs
  // the command rather than forking, so the death signal reaches the server itself.
  const [cmd, argv] = dieWithParent(command[0]!, [
    ...command.slice(1),
    String(PORT),
    peerIp,
    import.meta.resolve('ws'),
  ]);
  const child = spawn(cmd, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  entry.child = child;
  let output = '';
  /** The part of stdout after its last line break, and the requests held so far. */
  let partial = '';
  const collect = (chunk: Buffer): void => {
    output = (output + chunk.toString()).slice(-OUTPUT_LIMIT);
  };
  child.stdout.on('data', (chunk: Buffer) => {
    const lines = (partial + chunk.toString()).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) if (line.startsWith('holding ')) entry.held = (entry.held ?? 0) + 1;
  });
  child.stdout.on('data', collect);
  child.stderr.on('data', collect);
  return new Promise((done, fail) => {
    const onData = (): void => {
      if (!/^listening \d+$/m.test(output)) return;
      child.stdout.off('data', onData);
      child.off('exit', onExit);
      child.off('error', onError);
      done();
    };
    const onExit = (code: number | null, signal: string | null): void =>
      fail(new Error(`netns backend exited (${signal ?? code}) before listening:\n${output}`));
    const onError = (err: Error): void =>
      fail(
        new Error(`cannot start the netns backend (${command.join(' ')}): ${err.message}`, { cause: err }),
      );
    child.stdout.on('data', onData);
    child.once('exit', onExit);
    child.once('error', onError);
  });
}

function hello(url: string): Promise<string> {
  return new Promise((done, fail) => {
    const req = get(url, { timeout: 1_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () =>
        res.statusCode === 200 ? done(body) : fail(new Error(`GET ${url}: status ${res.statusCode}`)),
      );
      res.on('error', fail);
    });
    req.on('timeout', () => req.destroy(new Error(`GET ${url}: no answer within 1 s`)));
    req.on('error', fail);
  });
}

async function teardown(entry: Live): Promise<void> {
  const { child } = entry;
  // No pid: the spawn itself failed, so there is no exit to wait for.
  if (child?.pid !== undefined && isRunning(child)) {
    const exited = new Promise((done) => child.once('exit', done));
    // Unreferenced once ready; without this the caller could exit while stop() waits for the backend to die.
    child.ref();
    child.kill('SIGKILL');
    await exited;
  }
  // Deleting the namespace destroys the peer, and with it the pair, but only once the kernel gets round to
  // it; deleting the host end first makes the interface and its route go away now.
  if (entry.hostInterface) await ipUnlessGone(['link', 'del', entry.hostInterface]);
  await ipUnlessGone(['netns', 'del', entry.netns]);
  if (entry.dir) rmSync(entry.dir, { recursive: true, force: true });
  live.delete(entry);
}

/**
 * Creates a netns + veth pair and starts, inside the namespace, an HTTP server on 0.0.0.0:<port> that:
 *  - answers `GET /hello` (any path ending in /hello) with 200, content-type text/plain, body `hello from <ip>`;
 *  - never answers `GET /hang` (any path ending in /hang);
 *  - answers `GET /zeros` (any path ending in /zeros) with zeros without end, as fast as the client takes them;
 *  - accepts WebSocket upgrades on any path and echoes every message back (text stays text, binary stays binary).
 * Resolves once the server answers from the root namespace.
 */
export async function startNetnsBackend(): Promise<NetnsBackend> {
  await sweepStale();
  const netns = await createNamespace();
  const entry: Live = { netns };
  live.add(entry);
  installExitHook();
  let stopping: Promise<void> | undefined;
  const stop = (): Promise<void> => (stopping ??= teardown(entry));
  try {
    const { hostInterface, peerIp } = await claimSubnet(entry);
    await startServer(entry, peerIp);
    const url = `http://${peerIp}:${PORT}/hello`;
    await eventually(async () => {
      if (entry.child && !isRunning(entry.child)) throw new Error('netns backend exited');
      const body = await hello(url);
      if (body !== `hello from ${peerIp}`) throw new Error(`GET ${url}: unexpected body ${body}`);
    }, READY_TIMEOUT_MS).catch((err: Error) => {
      throw new Error(`netns backend not reachable from the root namespace: ${err.message}`, { cause: err });
    });
    // From here on the backend must not keep the caller alive: the exit hook and setpriv clean up after it.
    const { child } = entry;
    if (child)
      for (const handle of [child, child.stdout, child.stderr] as unknown as Unrefable[]) handle.unref();
    return { ip: peerIp, port: PORT, netns, hostInterface, held: () => entry.held ?? 0, stop };
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
}

/**
 * A Pod object named `name` in `namespace` whose status points at `backend`, so that the API server's pod proxy
 * reaches it (no kubelet runs the Pod: its status is written directly). `kubectl` runs as the cluster's admin.
 */
export async function podAtBackend(
  kubectl: (args: string[], opts?: { input?: string }) => Promise<{ code: number; stderr: string }>,
  namespace: string,
  name: string,
  backend: Pick<NetnsBackend, 'ip'>,
): Promise<void> {
  const pod = await kubectl(['apply', '-n', namespace, '-f', '-'], {
    input: JSON.stringify({
      apiVersion: 'v1',
      kind: 'Pod',
      metadata: { name },
      spec: { containers: [{ name, image: `${name}:none` }], automountServiceAccountToken: false },
    }),
  });
  if (pod.code !== 0) throw new Error(`creating the Pod ${name}: ${pod.stderr}`);
  const status = { status: { phase: 'Running', podIP: backend.ip, podIPs: [{ ip: backend.ip }] } };
  const patched = await kubectl([
    'patch',
    'pod',
    name,
    '-n',
    namespace,
    '--subresource=status',
    '--type=merge',
    '-p',
    JSON.stringify(status),
  ]);
  if (patched.code !== 0) throw new Error(`writing the status of the Pod ${name}: ${patched.stderr}`);
}
