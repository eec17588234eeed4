// What one signed-in SSH session does in the clusters, always as its user and always through the proxy's pipeline
// (in-process.ts): commands in containers are execs over WebSocket (the v5 channel protocol kubectl speaks), the
// menu's lists are plain GETs and SelfSubjectAccessReviews, and `-L` forwards are reach upgrades. Each is a request
// of its own, so each is decided by the cluster it is for, routed, audited and (an exec) recorded like kubectl's.
import { request as httpRequest, type IncomingMessage } from 'node:http';
import type { Duplex } from 'node:stream';
import { Readable, Writable } from 'node:stream';
import WebSocket from 'ws';
import { statusMessageOf } from '../../lib/kube/status.ts';
import { CHANNEL, CLOSE_CHANNEL, V4_PROTOCOL, V5_PROTOCOL } from '../../lib/kube/exec-channels.ts';
import { reachPath, REACH_UPGRADE, type ReachTarget } from '../../lib/reach/target.ts';
import type { Containers, ContainerRef, Running, Terminal } from './containers.ts';

/** The exec protocols offered, newest first: v5 can close stdin alone, which sftp's uploads need. */
const EXEC_PROTOCOLS = [V5_PROTOCOL, V4_PROTOCOL];

/** A list's answers, and the namespaces asked about for the menu: enough to choose from, bounded per session. */
const MAX_LISTED = 500;
/** SelfSubjectAccessReviews under way at once for one menu. */
const REVIEWS_AT_ONCE = 8;
/** A list or review that takes longer than this is given up. */
const CALL_TIMEOUT_MS = 15_000;
/** Bytes of a Status or list body read at most. */
const MAX_BODY_BYTES = 8 << 20;

export interface ClusterAccessOptions {
  /** Aborts when the SSH connection ends: every exec and reach connection it started ends with it. */
  signal: AbortSignal;
  /** A new connection into the pipeline as the session's user. */
  connect: () => Duplex;
  /** The name the hub's own cluster goes by in targets. */
  hubName: string;
  /** The other clusters' names (the Cluster objects'). */
  clusterNames: () => string[];
  /** Sealion's API group suffix, for reach paths. */
  groupSuffix: string;
  /** The SSH client's software, sent as the requests' User-Agent (for audit). */
  userAgent: string;
}

export interface ClusterAccess extends Containers {
  /** Opens a reach connection (what `-L` forwards through); rejects with the Status's message when refused. */
  reach(cluster: string, target: ReachTarget): Promise<Duplex>;
}

/** A user's word for why a call failed: the Status's message when there is one. */
export class Refused extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.name = 'Refused';
    this.status = status;
  }
}

function readBody(res: IncomingMessage): Promise<string> {
  return new Promise((done, fail) => {
    const chunks: Buffer[] = [];
    let size = 0;
    res.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) return void res.destroy(new Error('answer too large'));
      chunks.push(chunk);
    });
    res.once('end', () => done(Buffer.concat(chunks).toString('utf8')));
    res.once('error', fail);
  });
}

const refusedBy = (status: number, body: string): Refused =>
  new Refused(status, statusMessageOf(body) ?? `the cluster answered ${status}`);

/** The exit status an exec's closing Status gives: 0 on Success, the command's code on NonZeroExitCode. */
export function exitCodeOf(status: string): number | Refused {
  let parsed: {
    status?: string;
    message?: string;
    code?: number;
    reason?: string;
    details?: { causes?: { reason?: string; message?: string }[] };
  };
  try {
    parsed = JSON.parse(status) as typeof parsed;
  } catch {
    return new Refused(500, 'the exec ended with an unreadable status');
  }
  if (parsed.status === 'Success') return 0;
  const cause = parsed.details?.causes?.find((c) => c.reason === 'ExitCode');
  if (parsed.reason === 'NonZeroExitCode' && cause?.message && /^[0-9]{1,3}$/.test(cause.message))
    return Number(cause.message);
  return new Refused(parsed.code ?? 500, parsed.message ?? 'the exec failed');
}

export function newClusterAccess(opts: ClusterAccessOptions): ClusterAccess {
  return {
    run: (ref, argv, tty) => runExec(opts, execPath(opts, ref, argv, tty), tty),
    clusters: () =>
      Promise.resolve([
        opts.hubName,
        ...opts
          .clusterNames()
          .filter((n) => n !== opts.hubName)
          .sort(),
      ]),
    namespaces: (cluster) => execNamespaces(opts, cluster),
    async pods(cluster, namespace) {
      const items = await list(
        opts,
        cluster,
        `/api/v1/namespaces/${encodeURIComponent(namespace)}/pods?fieldSelector=status.phase%3DRunning`,
      );
      return items.map((p) => p.metadata.name).sort();
    },
    containers: (cluster, namespace, pod) => containersOf(opts, cluster, namespace, pod),
    reach: (cluster, target) => openReach(opts, cluster, target),
  };
}

/** The path prefix that routes a request to `cluster`: none for the hub. */
function prefix(opts: ClusterAccessOptions, cluster: string): string {
  return cluster === opts.hubName ? '' : `/clusters/${encodeURIComponent(cluster)}`;
}

function baseHeaders(opts: ClusterAccessOptions): Record<string, string> {
  return { host: 'sealion', 'user-agent': opts.userAgent };
}

/** One plain request into the pipeline, its answer read whole (up to MAX_BODY_BYTES). */
function call(
  opts: ClusterAccessOptions,
  method: string,
  path: string,
  body?: object,
): Promise<{ status: number; body: string }> {
  return new Promise((done, fail) => {
    const payload = body ? JSON.stringify(body) : undefined;
    const req = httpRequest(
      {
        method,
        path,
        createConnection: () => opts.connect(),
        headers: {
          ...baseHeaders(opts),
          accept: 'application/json',
          ...(payload ? { 'content-type': 'application/json' } : {}),
        },
        timeout: CALL_TIMEOUT_MS,
      },
      (res) => void readBody(res).then((text) => done({ status: res.statusCode ?? 0, body: text }), fail),
    );
    req.once('timeout', () => req.destroy(new Error(`${method} ${path} took too long`)));
    req.once('error', fail);
    req.end(payload);
  });
}

async function list(
  opts: ClusterAccessOptions,
  cluster: string,
  path: string,
): Promise<{ metadata: { name: string } }[]> {
  const answer = await call(opts, 'GET', `${prefix(opts, cluster)}${path}`);
  if (answer.status !== 200) throw refusedBy(answer.status, answer.body);
  const items = (JSON.parse(answer.body) as { items?: { metadata: { name: string } }[] }).items ?? [];
  return items.slice(0, MAX_LISTED);
}

/** Whether the cluster lets the user exec into pods of `namespace` (a SelfSubjectAccessReview, answered there). */
async function mayExec(opts: ClusterAccessOptions, cluster: string, namespace: string): Promise<boolean> {
  const answer = await call(
    opts,
    'POST',
    `${prefix(opts, cluster)}/apis/authorization.k8s.io/v1/selfsubjectaccessreviews`,
    {
      apiVersion: 'authorization.k8s.io/v1',
      kind: 'SelfSubjectAccessReview',
      spec: { resourceAttributes: { namespace, verb: 'create', resource: 'pods', subresource: 'exec' } },
    },
  );
  if (answer.status !== 201 && answer.status !== 200) return false;
  return (JSON.parse(answer.body) as { status?: { allowed?: boolean } }).status?.allowed === true;
}

/** The namespaces of `cluster` whose pods the user may exec into, asked REVIEWS_AT_ONCE at a time. */
async function execNamespaces(opts: ClusterAccessOptions, cluster: string): Promise<string[]> {
  const names = (await list(opts, cluster, '/api/v1/namespaces')).map((n) => n.metadata.name);
  const allowed: string[] = [];
  for (let i = 0; i < names.length; i += REVIEWS_AT_ONCE) {
    if (opts.signal.aborted) throw new Refused(499, 'the connection ended');
    const batch = names.slice(i, i + REVIEWS_AT_ONCE);
    const answers = await Promise.all(batch.map((ns) => mayExec(opts, cluster, ns).catch(() => false)));
    batch.forEach((ns, j) => answers[j] && allowed.push(ns));
  }
  return allowed;
}

/** A pod's containers, the one kubectl would choose (its default-container annotation) first. */
async function containersOf(
  opts: ClusterAccessOptions,
  cluster: string,
  namespace: string,
  pod: string,
): Promise<string[]> {
  const answer = await call(
    opts,
    'GET',
    `${prefix(opts, cluster)}/api/v1/namespaces/${encodeURIComponent(namespace)}/pods/${encodeURIComponent(pod)}`,
  );
  if (answer.status !== 200) throw refusedBy(answer.status, answer.body);
  const parsed = JSON.parse(answer.body) as {
    metadata?: { annotations?: Record<string, string> };
    spec?: { containers?: { name: string }[] };
  };
  const names = (parsed.spec?.containers ?? []).map((c) => c.name);
  const preferred = parsed.metadata?.annotations?.['kubectl.kubernetes.io/default-container'];
  return preferred && names.includes(preferred)
    ? [preferred, ...names.filter((n) => n !== preferred)]
    : names;
}

/** Ends `stream` when the session's signal aborts (at once if it has), and stops listening once it closes. */
function endWithSession(
  signal: AbortSignal,
  stream: { once(event: 'close', f: () => void): unknown },
  end: () => void,
): void {
  signal.addEventListener('abort', end, { once: true });
  stream.once('close', () => signal.removeEventListener('abort', end));
  if (signal.aborted) end();
}

/** A refusal from a non-upgrade answer: the Status's message, or the code when the body cannot be read. */
function refuseWith(res: IncomingMessage, fail: (err: Refused) => void): void {
  readBody(res).then(
    (body) => fail(refusedBy(res.statusCode ?? 0, body)),
    () => fail(new Refused(res.statusCode ?? 0, `the cluster answered ${res.statusCode}`)),
  );
}

/** A reach upgrade: the connection `-L` forwards through, ended with the session. */
function openReach(opts: ClusterAccessOptions, cluster: string, target: ReachTarget): Promise<Duplex> {
  return new Promise((done, fail) => {
    const req = httpRequest({
      method: 'GET',
      path: `${prefix(opts, cluster)}${reachPath(opts.groupSuffix, target)}`,
      createConnection: () => opts.connect(),
      headers: { ...baseHeaders(opts), connection: 'Upgrade', upgrade: REACH_UPGRADE },
    });
    req.once('upgrade', (_res, socket: Duplex, head: Buffer) => {
      if (head.length > 0) socket.unshift(head);
      endWithSession(opts.signal, socket, () => void socket.destroy());
      done(socket);
    });
    req.once('response', (res) => refuseWith(res, fail));
    req.once('error', fail);
    req.end();
  });
}

/** The exec request's path: the command's words, the container, and a terminal or a separate stderr. */
function execPath(
  opts: ClusterAccessOptions,
  ref: ContainerRef,
  argv: readonly string[],
  tty: Terminal | undefined,
): string {
  const query = new URLSearchParams();
  for (const arg of argv) query.append('command', arg);
  if (ref.container) query.set('container', ref.container);
  query.set('stdin', 'true');
  query.set('stdout', 'true');
  if (tty) query.set('tty', 'true');
  else query.set('stderr', 'true');
  return (
    `${prefix(opts, ref.cluster)}/api/v1/namespaces/${encodeURIComponent(ref.namespace)}/pods/` +
    `${encodeURIComponent(ref.pod)}/exec?${query.toString()}`
  );
}

/** Starts the exec at `path` over WebSocket; what it gives is running at once, and frames wait for the handshake. */
function runExec(opts: ClusterAccessOptions, path: string, tty: Terminal | undefined): Running {
  const ws = new WebSocket(`ws://sealion${path}`, EXEC_PROTOCOLS, {
    createConnection: () => opts.connect(),
    headers: { 'user-agent': opts.userAgent },
    perMessageDeflate: false,
    handshakeTimeout: CALL_TIMEOUT_MS,
  });
  endWithSession(opts.signal, ws, () => ws.terminate());
  const exec = new ExecStreams(ws);
  // The terminal's size from the start: full-screen programs read it before any window change.
  if (tty) exec.send(CHANNEL.resize, JSON.stringify({ Width: tty.cols, Height: tty.rows }));
  return {
    stdin: exec.stdin,
    stdout: exec.stdout,
    stderr: exec.stderr,
    exit: exec.exit,
    resize: ({ cols, rows }) => {
      if (tty) exec.send(CHANNEL.resize, JSON.stringify({ Width: cols, Height: rows }));
    },
    kill: () => ws.terminate(),
  };
}

/** An exec's channels over its WebSocket: stdin out, stdout and stderr in, and the closing Status as its exit. */
class ExecStreams {
  private readonly ws: WebSocket;
  /** Whether the handshake completed. */
  private opened = false;
  private readonly whenOpen: Promise<void>;
  /** The error channel's text so far: the closing Status. */
  private statusText: string | undefined;
  readonly stdout: Readable;
  readonly stderr: Readable;
  readonly stdin: Writable;
  readonly exit: Promise<number>;

  constructor(ws: WebSocket) {
    this.ws = ws;
    this.whenOpen = new Promise<void>((done) => ws.once('open', () => ((this.opened = true), done())));
    // Reads the cluster sends faster than the SSH client takes them pause the WebSocket.
    this.stdout = new Readable({ read: () => void ws.resume() });
    this.stderr = new Readable({ read: () => void ws.resume() });
    this.stdin = this.newStdin();
    this.exit = this.awaitExit();
    this.exit.catch(() => this.endOutput());
  }

  /** Sends a frame on `channel` once the exec is open; `done` hears whether it went. */
  send(channel: number, data: Buffer | string, done?: (err?: Error) => void): void {
    const frame = Buffer.concat([Buffer.of(channel), Buffer.from(data)]);
    const ws = this.ws;
    this.whenOpen.then(
      () =>
        ws.readyState === WebSocket.OPEN
          ? ws.send(frame, (err) => done?.(err ?? undefined))
          : done?.(new Error('the exec has ended')),
      () => {},
    );
  }

  private newStdin(): Writable {
    const stdin = new Writable({
      write: (chunk: Buffer, _enc, done) => this.send(CHANNEL.stdin, chunk, done),
      final: (done) => {
        // v4 cannot close stdin alone: the command then reads until the exec ends.
        if (this.ws.protocol === V5_PROTOCOL || !this.opened)
          this.send(CLOSE_CHANNEL, Buffer.of(CHANNEL.stdin));
        done();
      },
    });
    stdin.on('error', () => {});
    return stdin;
  }

  private endOutput(): void {
    this.stdout.push(null);
    this.stderr.push(null);
  }

  /** The command's exit code from the closing Status; a refusal when the exec was refused, failed or had none. */
  private awaitExit(): Promise<number> {
    const ws = this.ws;
    return new Promise<number>((done, fail) => {
      ws.on('message', (data: Buffer, isBinary) => this.receive(data, isBinary));
      ws.once('unexpected-response', (_req, res: IncomingMessage) => refuseWith(res, fail));
      ws.once('error', (err) => fail(new Refused(502, `the exec failed: ${err.message}`)));
      ws.once('close', () => {
        this.endOutput();
        if (this.statusText === undefined) {
          if (this.opened) fail(new Refused(502, 'the exec ended without an exit status'));
          return;
        }
        const code = exitCodeOf(this.statusText);
        if (typeof code === 'number') done(code);
        else fail(code);
      });
    });
  }

  /** One frame from the cluster: output to its stream (pausing the socket when that is full), or the Status. */
  private receive(data: Buffer, isBinary: boolean): void {
    if (!isBinary || data.length === 0) return;
    const channel = data[0];
    const payload = data.subarray(1);
    if (channel === CHANNEL.stdout) {
      if (!this.stdout.push(payload)) this.ws.pause();
    } else if (channel === CHANNEL.stderr) {
      if (!this.stderr.push(payload)) this.ws.pause();
    } else if (channel === CHANNEL.error)
      this.statusText = (this.statusText ?? '') + payload.toString('utf8');
  }
}
