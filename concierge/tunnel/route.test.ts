// Clusters behind real tunnels (both ends of lib/tunnel/tunnel.ts over a real WebSocket on port 0, the agent's end serving
// a handler that stands in for its local proxy and the cluster's API server), reached through the real proxy
// handler and server over HTTP/2, as kubectl connects. One user reading discovery documents slowly must not starve
// another, and a request that makes no progress is cut.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { createServer, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import {
  connect as http2Connect,
  constants,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
  type ServerHttp2Stream,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import type { Duplex } from 'node:stream';
import { createWebSocketStream, WebSocket, WebSocketServer } from 'ws';
import { apiGroups } from '../../apis/groups.ts';
import { eventually } from '../../dev/eventually.ts';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { AuthResult, TokenAuthenticator } from '../../lib/authn/types.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { silentLogger } from '../../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { newTunnelClient, serveTunnel } from '../../lib/tunnel/tunnel.ts';
import { newRequestAuthenticator } from '../proxy/authenticate.ts';
import { newClientCertSigner } from '../proxy/credentials.ts';
import { newSessionRegistry } from '../drain.ts';
import { AGENT_RETURN_MS, newClusterRouter, type Route } from '../proxy/route.ts';
import { newProxyHandler } from '../proxy/handler.ts';
import { newProxyMetrics } from '../proxy/metrics.ts';
import { newProxyServer, type ProxyServer } from '../proxy/server.ts';
import type { Clock } from '../../lib/clock.ts';
import { newTunnelRoute, tunnelLimits, type TunnelLimits, type TunnelRoute } from './route.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { newMemoryBudget, type MemoryBudget } from '../../lib/http2/memory-budget.ts';
import { STREAM_WINDOW_BYTES } from '../../lib/http2/pool.ts';

const USERS = ['alice', 'bob', 'carol'];
const TOKENS: Record<string, AuthResult> = Object.fromEntries(
  USERS.map((name) => [
    `${name}-token`,
    { ok: true, authenticator: 'test', user: { username: name, groups: [], extra: {} } },
  ]),
);
/** A user whose name is under the prefix that a cluster taking hub workloads reserves for them. */
TOKENS['mallory-token'] = {
  ok: true,
  authenticator: 'test',
  user: { username: 'hub:mallory', groups: [], extra: {} },
};
const staticTokens: TokenAuthenticator = {
  authenticate: (token) => Promise.resolve(TOKENS[token] ?? { ok: false, reason: 'unknown static token' }),
};
const reviewer: Reviewer = {
  tokenReview: () => Promise.resolve({ authenticated: false }),
  allowed: () => Promise.resolve(false),
};

/** A discovery document large enough that a client that does not read it holds its stream. */
const DISCOVERY_BYTES = 8 << 20;
/** Requests each user has at the agent now, the most each has had at once, and bodies received. */
const inFlight = new Map<string, number>();
const mostInFlight = new Map<string, number>();
let uploaded = 0;
/** Upgraded connections the agent has seen end. */
let upgradesEnded = 0;
/** Watches the agent holds open, to send events on. */
const watches: ServerHttp2Stream[] = [];

/**
 * The agent's local proxy and the cluster's API server in one, for plain requests (HTTP/2 requests through the
 * tunnel): it sees the impersonated user of each request.
 */
function agentRequest(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): void {
  const path = headers[':path'];
  stream.on('error', () => {});
  if (path === '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews') {
    // The cluster's forwarding policy: everything.
    stream.respond({ ':status': 201, 'content-type': 'application/json' });
    return void stream.end('{"status":{"allowed":true}}');
  }
  const user = String(headers['impersonate-user']);
  inFlight.set(user, (inFlight.get(user) ?? 0) + 1);
  mostInFlight.set(user, Math.max(mostInFlight.get(user) ?? 0, inFlight.get(user)!));
  stream.once('close', () => inFlight.set(user, inFlight.get(user)! - 1));
  stream.on('error', () => {});
  if (path === '/api') {
    stream.respond({ ':status': 200, 'content-type': 'application/json' });
    const chunk = Buffer.alloc(64 << 10, ' ');
    let sent = 0;
    const pump = (): void => {
      while (sent < DISCOVERY_BYTES) {
        sent += chunk.length;
        if (!stream.write(chunk)) return void stream.once('drain', pump);
      }
      stream.end();
    };
    return pump();
  }
  if (path?.includes('watch=1')) {
    stream.respond({ ':status': 200, 'content-type': 'application/json' });
    return void watches.push(stream);
  }
  if (path === '/upload') {
    stream.on('data', (c: Buffer) => (uploaded += c.length));
    stream.on('end', () => stream.respond({ ':status': 201 }, { endStream: true }));
    return;
  }
  stream.respond({ ':status': 200, 'content-type': 'application/json' });
  stream.end('{"kind":"Status","status":"Success"}');
}

/** The agent's end of an upgrade (a port-forward over WebSocket, say) that sends without end, as fast as it is taken. */
function agentUpgrade(_req: IncomingMessage, socket: Duplex): void {
  socket.on('error', () => {});
  socket.once('close', () => upgradesEnded++);
  socket.write('HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n');
  const chunk = Buffer.alloc(64 << 10, 'p');
  const pump = (): void => {
    while (!socket.destroyed) if (!socket.write(chunk)) return void socket.once('drain', pump);
  };
  pump();
}

const cleanups: (() => void)[] = [];
const routes: Record<string, TunnelRoute> = {};
let proxyCA: CertificateAuthority;
let server: ProxyServer;
let port: number;
const clock = fakeClock();
const LONG = 600_000;
/** What the drain counts. */
const registry = newSessionRegistry();
/** When each cluster's agent was last seen connected, as the Clusters' status tells a replica. */
const connectedAt: Record<string, number> = {};
/** A share that holds one stalled tunnel stream's window, not two. */
const budget = newMemoryBudget({
  perUserBytes: 1.5 * STREAM_WINDOW_BYTES,
  totalBytes: 64 * STREAM_WINDOW_BYTES,
});

/** A cluster behind a real tunnel, forwarded with these limits (and charging unread bytes to `budget`). */
async function connectCluster(
  name: string,
  limits: TunnelLimits,
  withClock?: Clock,
  budget?: MemoryBudget,
): Promise<void> {
  const wss = new WebSocketServer({ port: 0, host: '127.0.0.1' });
  await new Promise<void>((done) => wss.once('listening', done));
  const local = createServer();
  local.on('upgrade', agentUpgrade);
  const accepted = new Promise<Duplex>((done) =>
    wss.once('connection', (ws) => done(createWebSocketStream(ws))),
  );
  const ws = new WebSocket(`ws://127.0.0.1:${(wss.address() as AddressInfo).port}`);
  await new Promise<void>((done) => ws.once('open', () => done()));
  const agentEnd = serveTunnel(createWebSocketStream(ws), {
    connect: (stream) => local.emit('connection', stream),
    request: agentRequest,
  });
  const tunnel = newTunnelClient(await accepted, { maxStreams: limits.capacity });
  routes[name] = newTunnelRoute(name, tunnel, {
    limits,
    ...(withClock ? { clock: withClock } : {}),
    ...(budget ? { budget } : {}),
  });
  cleanups.push(() => {
    routes[name]!.close();
    agentEnd.close();
    ws.terminate();
    wss.close();
    local.closeAllConnections();
  });
}

/** One HTTP/2 connection per user, as one kubectl each. */
const sessions = new Map<string, ClientHttp2Session>();
function session(user: string): ClientHttp2Session {
  let s = sessions.get(user);
  if (!s) {
    s = http2Connect(`https://127.0.0.1:${port}`, { ca: proxyCA.certPem });
    s.on('error', () => {});
    sessions.set(user, s);
  }
  return s;
}

interface Call {
  stream: ClientHttp2Stream;
  /** The response headers, once they came. */
  headers?: IncomingHttpHeaders;
  /** The whole body, read (unless paused) to its end. */
  body: Promise<string>;
  /** How the stream ended: 'end' for a whole response, 'cut' when it was reset. */
  ended: Promise<'end' | 'cut'>;
}

/** A request as `user`; with `paused`, nothing of the answer is read, as a client reading very slowly. */
function call(
  user: string,
  path: string,
  opts: { paused?: boolean; body?: string; headers?: OutgoingHttpHeaders } = {},
): Call {
  const stream = session(user).request(
    { ':path': path, authorization: `Bearer ${user}-token`, ...opts.headers },
    { endStream: opts.body === undefined },
  );
  const result: Call = { stream, body: Promise.resolve(''), ended: Promise.resolve('end') };
  stream.on('response', (h) => (result.headers = h));
  result.ended = new Promise((done) => {
    stream.once('end', () => done('end'));
    stream.once('error', () => done('cut'));
    stream.once('close', () => done(stream.rstCode === 0 ? 'end' : 'cut'));
  });
  if (opts.paused) stream.pause();
  else {
    let text = '';
    stream.setEncoding('utf8');
    stream.on('data', (c: string) => (text += c));
    result.body = result.ended.then(() => text);
  }
  if (opts.body !== undefined) stream.write(opts.body);
  return result;
}

/** The rest of a paused stream's body. */
function readAll(stream: ClientHttp2Stream): Promise<string> {
  return new Promise((done) => {
    let text = '';
    stream.on('data', (c: Buffer) => (text += c.toString()));
    stream.once('end', () => done(text));
    stream.resume();
  });
}

const statusOf = (c: Call): number | undefined => (c.headers ? Number(c.headers[':status']) : undefined);

beforeAll(async () => {
  proxyCA = await newCA('proxy-ca');
  const serving = await issueCert(proxyCA, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
  const cache = new AuthenticatorCache();
  cache.set('WebhookAuthenticator', 'static', staticTokens);
  const noHub: Route = {
    kind: 'local',
    forward: () => Promise.reject(new Error('not for the hub')),
    call: () => Promise.reject(new Error('not for the hub')),
  };
  const handler = newProxyHandler({
    groups: apiGroups(),
    authenticator: newRequestAuthenticator(cache, reviewer, () => server.trustedClientCAs()),
    cache,
    reviewer,
    router: newClusterRouter(noHub, (name) => routes[name]),
    lastConnected: (name) => connectedAt[name],
    sessions: registry,
    clusterSpec: (name) =>
      name === 'takes-workloads' ? { workloads: { usernamePrefix: 'hub:' } } : undefined,
    signer: newClientCertSigner(() => undefined),
    metrics: newProxyMetrics(),
    log: silentLogger(),
    ready: () => true,
    serving: () => true,
  });
  server = newProxyServer(
    { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [] },
    handler.request,
    handler.upgrade,
  );
  port = await server.listen(0, '127.0.0.1');
  // Room for four requests, two per user; two more of a user's may wait. Nothing here waits for a deadline.
  await connectCluster('edge', {
    capacity: 4,
    perKey: 2,
    maxQueued: 4,
    maxQueuedPerKey: 2,
    maxWaitMs: LONG,
    progressTimeoutMs: LONG,
  });
  // One request at a time and no queue, to see upgrades refused.
  await connectCluster('tiny', {
    capacity: 1,
    perKey: 1,
    maxQueued: 0,
    maxQueuedPerKey: 0,
    maxWaitMs: LONG,
    progressTimeoutMs: LONG,
  });
  // One request at a time, on the fake clock, so the test decides when the progress deadline passes.
  await connectCluster(
    'stall',
    { capacity: 1, perKey: 1, maxQueued: 4, maxQueuedPerKey: 4, maxWaitMs: LONG, progressTimeoutMs: 1000 },
    clock,
  );
  // Unread bytes charged to a small budget; no deadline cuts anything.
  await connectCluster(
    'budgeted',
    { capacity: 4, perKey: 4, maxQueued: 0, maxQueuedPerKey: 0, maxWaitMs: LONG, progressTimeoutMs: LONG },
    undefined,
    budget,
  );
});

afterAll(async () => {
  for (const s of sessions.values()) s.destroy();
  cleanups.splice(0).forEach((c) => c());
  await server.close();
});

jest.setTimeout(30_000);

describe('a tunnel shared by several users', () => {
  it('serves another user while one holds slow discovery reads, and refuses the one beyond its share', async () => {
    // alice asks for six discovery documents and reads none of them.
    const slow = Array.from({ length: 6 }, () => call('alice', '/clusters/edge/api', { paused: true }));
    // Her requests hold what they may of the tunnel, and are answered or refused beyond that.
    await eventually(() => {
      expect(slow.filter((c) => statusOf(c) === 200).length).toBeGreaterThanOrEqual(2);
      expect(
        slow.filter((c) => statusOf(c) !== undefined && statusOf(c) !== 200).length,
      ).toBeGreaterThanOrEqual(2);
    });

    const bob = call('bob', '/clusters/edge/version');
    expect(await bob.ended).toBe('end');
    expect(statusOf(bob)).toBe(200);
    expect(JSON.parse(await bob.body)).toMatchObject({ status: 'Success' });

    // Two hold her share, two wait for it, two are refused: her share and her queue are full.
    expect(slow.map(statusOf).sort()).toEqual([200, 200, 429, 429, undefined, undefined]);
    const refused = slow.filter((c) => statusOf(c) !== undefined && statusOf(c) !== 200);
    for (const r of refused) {
      expect(statusOf(r)).toBe(429);
      expect(r.headers!['retry-after']).toBe('1');
      expect(JSON.parse(await readAll(r.stream))).toMatchObject({
        kind: 'Status',
        code: 429,
        reason: 'TooManyRequests',
        details: { retryAfterSeconds: 1 },
      });
    }
    expect(mostInFlight.get('alice')).toBe(2);

    // Her waiting requests get their turn as her others end.
    for (const c of slow.filter((c) => statusOf(c) === 200)) c.stream.close(constants.NGHTTP2_CANCEL);
    await eventually(() => expect(slow.filter((c) => statusOf(c) === 200)).toHaveLength(4));
    for (const c of slow) c.stream.close(constants.NGHTTP2_CANCEL);
  });
  it('counts upgrades too, refusing them with a Status and a Retry-After', async () => {
    const slow = call('alice', '/clusters/tiny/api', { paused: true });
    await eventually(() => expect(statusOf(slow)).toBe(200));
    /** An upgrade request as `user` over HTTP/1.1: the status line and headers of what comes back, and the body. */
    const upgrade = (user: string): Promise<{ status: number; retryAfter?: string; body: string }> =>
      new Promise((done, fail) => {
        const req = httpsRequest({
          host: '127.0.0.1',
          port,
          path: '/clusters/tiny/api/v1/namespaces/default/pods/p/exec?command=sh',
          ca: proxyCA.certPem,
          headers: { authorization: `Bearer ${user}-token`, connection: 'Upgrade', upgrade: 'websocket' },
        });
        req.on('response', (res) => {
          let body = '';
          res.on('data', (c: Buffer) => (body += c.toString()));
          res.on('end', () =>
            done({ status: res.statusCode ?? 0, retryAfter: res.headers['retry-after'], body }),
          );
        });
        req.on('upgrade', () => fail(new Error('upgraded past the limit')));
        req.on('error', fail);
        req.end();
      });
    // alice's one place is taken; the tunnel's only place is taken, and nobody may wait.
    for (const [user, code] of [
      ['alice', 429],
      ['bob', 503],
    ] as const) {
      const answer = await upgrade(user);
      expect(answer).toMatchObject({ status: code, retryAfter: '1' });
      expect(JSON.parse(answer.body)).toMatchObject({
        kind: 'Status',
        code,
        details: { retryAfterSeconds: 1 },
      });
    }
    slow.stream.close(constants.NGHTTP2_CANCEL);
  });
});

describe('requests that make no progress', () => {
  it('cuts an answer the client does not read once the deadline passes, and frees its place', async () => {
    const watch = call('carol', '/clusters/stall/api/v1/namespaces?watch=1');
    await eventually(() => expect(statusOf(watch)).toBe(200));
    // The watch holds the cluster's only place: the others wait for it, so let it go first.
    watch.stream.close(constants.NGHTTP2_CANCEL);
    await eventually(() => expect(inFlight.get('carol')).toBe(0));

    const stalled = call('alice', '/clusters/stall/api', { paused: true });
    const waiting = call('bob', '/clusters/stall/version');
    // The answer fills every buffer on its way, and the proxy waits for the client to take some: the deadline runs.
    await eventually(() => expect(clock.pending()).toContain(1000));
    expect(statusOf(waiting)).toBeUndefined();
    clock.advance(1000);
    expect(await stalled.ended).toBe('cut');
    expect(await waiting.ended).toBe('end');
    expect(statusOf(waiting)).toBe(200);
  });

  it('never cuts a watch that has no events to send', async () => {
    const watch = call('carol', '/clusters/stall/api/v1/namespaces?watch=1');
    await eventually(() => expect(statusOf(watch)).toBe(200));
    await eventually(() => expect(watches.length).toBeGreaterThan(1));
    clock.advance(10 * 1000);
    watches.at(-1)!.write('{"type":"ADDED"}\n');
    let seen = '';
    watch.stream.on('data', (c: string) => (seen += c));
    await eventually(() => expect(seen).toContain('ADDED'));
    watch.stream.close(constants.NGHTTP2_CANCEL);
    await eventually(() => expect(inFlight.get('carol')).toBe(0));
  });

  it('answers 408 to a request whose body stops arriving, and frees its place', async () => {
    const upload = call('alice', '/clusters/stall/upload', {
      body: 'x'.repeat(100),
      headers: { ':method': 'POST', 'content-length': '1000' },
    });
    await eventually(() => expect(uploaded).toBe(100));
    const waiting = call('bob', '/clusters/stall/version');
    // The first deadline sees the 100 bytes as progress; the next sees none.
    clock.advance(1000);
    clock.advance(1000);
    expect(await upload.ended).toBe('end');
    expect(statusOf(upload)).toBe(408);
    expect(JSON.parse(await upload.body)).toMatchObject({ kind: 'Status', code: 408 });
    expect(await waiting.ended).toBe('end');
    expect(statusOf(waiting)).toBe(200);
  });
  it('cuts an upgraded connection whose client does not read, and frees its place', async () => {
    const socket = await new Promise<Duplex>((done, fail) => {
      const req = httpsRequest({
        host: '127.0.0.1',
        port,
        path: '/clusters/stall/api/v1/namespaces/default/pods/p/portforward',
        ca: proxyCA.certPem,
        headers: { authorization: 'Bearer alice-token', connection: 'Upgrade', upgrade: 'websocket' },
      });
      req.on('upgrade', (_res, upgraded: Duplex) => done(upgraded));
      req.on('response', (res) => fail(new Error(`upgrade refused: ${res.statusCode}`)));
      req.on('error', fail);
      req.end();
    });
    socket.on('error', () => {});
    socket.pause();
    const waiting = call('bob', '/clusters/stall/version');
    // Once what the agent sends fills every buffer up to the client, the deadline runs; then it passes, and the
    // connection ends all the way to the agent.
    await eventually(() => {
      clock.advance(1000);
      expect(upgradesEnded).toBe(1);
    });
    // The client sees its connection end once it reads what was sent before.
    socket.resume();
    await new Promise((done) => socket.once('close', done));
    expect(await waiting.ended).toBe('end');
    expect(statusOf(waiting)).toBe(200);
  });

  it("charges an upgraded connection its client leaves unread to the user's budget, and cuts at the share", async () => {
    const upgrade = (): Promise<Duplex> =>
      new Promise<Duplex>((done, fail) => {
        const req = httpsRequest({
          host: '127.0.0.1',
          port,
          path: '/clusters/budgeted/api/v1/namespaces/default/pods/p/portforward',
          ca: proxyCA.certPem,
          headers: { authorization: 'Bearer alice-token', connection: 'Upgrade', upgrade: 'websocket' },
        });
        req.on('upgrade', (_res, upgraded: Duplex) => {
          upgraded.on('error', () => {});
          upgraded.pause();
          done(upgraded);
        });
        req.on('response', (res) => fail(new Error(`upgrade refused: ${res.statusCode}`)));
        req.on('error', fail);
        req.end();
      });
    const endedBefore = upgradesEnded;
    const first = await upgrade();
    // Nothing read: the tunnel stream's window fills, and the connection is charged at least that window.
    await eventually(() => expect(budget.held('alice')).toBeGreaterThanOrEqual(STREAM_WINDOW_BYTES));
    expect(budget.cuts()).toBe(0);
    const second = await upgrade();
    // Two windows are more than her share: one is cut, all the way to the agent. Which one: the relay whose charge has
    // stood longest, and a client that stops reading still takes a chunk at a time until the kernel's buffers are
    // full, each time charged anew; so either may be, as each filled its buffers.
    await eventually(() => {
      expect(budget.cuts()).toBe(1);
      expect(upgradesEnded).toBe(endedBefore + 1);
    });
    expect(budget.held('alice')).toBeLessThanOrEqual(budget.limits.perUserBytes);
    // The other's window may still be filling when the one is cut.
    await eventually(() => expect(budget.held('alice')).toBeGreaterThanOrEqual(STREAM_WINDOW_BYTES));
    expect(budget.held('alice')).toBeLessThanOrEqual(budget.limits.perUserBytes);
    // The one cut ends once its client reads what was sent before; the other goes on, and is read from now on.
    const closes = (socket: Duplex): Promise<Duplex> =>
      new Promise((done) => socket.once('close', () => done(socket)));
    first.resume();
    second.resume();
    const cut = await Promise.race([closes(first), closes(second)]);
    const kept = cut === first ? second : first;
    expect(kept.destroyed).toBe(false);
    const bob = call('bob', '/clusters/budgeted/version');
    expect(await bob.ended).toBe('end');
    expect(statusOf(bob)).toBe(200);
    // Read, the other holds nothing charged; closed, it ends at the agent too.
    await eventually(() => expect(budget.held('alice')).toBe(0));
    kept.destroy();
    await eventually(() => expect(upgradesEnded).toBe(endedBefore + 2));
  });
});

describe('a cluster between tunnels', () => {
  const limits = {
    capacity: 4,
    perKey: 2,
    maxQueued: 0,
    maxQueuedPerKey: 0,
    maxWaitMs: LONG,
    progressTimeoutMs: LONG,
  };

  it('serves a request that came while its agent moved, once the tunnel is back', async () => {
    // Its agent was connected a moment ago, and has no tunnel now (moving from a draining replica).
    connectedAt['moving'] = Date.now();
    const inFlight = registry.open().requests;
    const waiting = call('alice', '/clusters/moving/version');
    let answered = false;
    void waiting.ended.then(() => (answered = true));
    // The drain counts it a plain request in flight: a replica that stops meanwhile gives it its grace.
    await eventually(() => expect(registry.open().requests).toBe(inFlight + 1));
    // And it waits: no answer comes while the cluster has no tunnel.
    await new Promise((done) => setTimeout(done, 300));
    expect(answered).toBe(false);
    await connectCluster('moving', limits);
    expect(await waiting.ended).toBe('end');
    expect(statusOf(waiting)).toBe(200);
  });

  it('refuses at once a request it would refuse with a route too', async () => {
    connectedAt['takes-workloads'] = Date.now();
    const refused = call('mallory', '/clusters/takes-workloads/version');
    expect(await refused.ended).toBe('end');
    expect(statusOf(refused)).toBe(403);
    expect(JSON.parse(await refused.body)).toMatchObject({
      message: expect.stringContaining('hub:mallory') as unknown,
    });
  });

  it('refuses at once a request for a cluster whose agent left longer ago, or was never seen', async () => {
    connectedAt['gone'] = Date.now() - AGENT_RETURN_MS;
    for (const name of ['gone', 'never']) {
      const refused = call('alice', `/clusters/${name}/version`);
      expect(await refused.ended).toBe('end');
      expect(statusOf(refused)).toBe(503);
      expect(JSON.parse(await refused.body)).toMatchObject({
        message: `cluster ${name} is not connected: its agent holds no tunnel to any concierge replica`,
      });
    }
  });
});

describe('a Cluster’s tunnel limits', () => {
  it.each([
    {
      name: 'defaults: a quarter of the default 1000 streams per user, who may queue as many',
      spec: {},
      want: {
        capacity: 1000,
        perKey: 250,
        maxQueued: 1000,
        maxQueuedPerKey: 250,
        maxWaitMs: 15_000,
        progressTimeoutMs: 60_000,
      },
    },
    {
      name: 'the per-user default follows the tunnel’s limit, rounded up',
      spec: { maxConcurrentStreams: 10 },
      want: { capacity: 10, perKey: 3, maxQueuedPerKey: 3 },
    },
    {
      name: 'a one-stream tunnel still lets a user have its one request',
      spec: { maxConcurrentStreams: 1 },
      want: { capacity: 1, perKey: 1 },
    },
    {
      name: 'every field set',
      spec: {
        maxConcurrentStreams: 50,
        maxRequestsPerUser: 5,
        maxQueuedRequests: 0,
        queueTimeoutSeconds: 2,
        progressTimeoutSeconds: 30,
      },
      want: {
        capacity: 50,
        perKey: 5,
        maxQueued: 0,
        maxQueuedPerKey: 5,
        maxWaitMs: 2000,
        progressTimeoutMs: 30_000,
      },
    },
    {
      name: 'values the schema forbids fall back to the defaults',
      spec: {
        maxConcurrentStreams: 0,
        maxRequestsPerUser: 2.5,
        maxQueuedRequests: -1,
        queueTimeoutSeconds: 61,
      },
      want: { capacity: 1000, perKey: 250, maxQueued: 1000, maxWaitMs: 15_000 },
    },
  ])('$name', ({ spec, want }) => {
    expect(tunnelLimits(spec)).toMatchObject(want);
  });
});
