// Access-request grants as the proxy applies them, against an in-memory AccessGrants: the groups and extras on what is
// forwarded, the reserved extras dropped, the reason refusal, nothing added for workloads, service accounts or the
// identity a caller impersonates, and what a grant's requests relay ended with a message when it ends.
import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, request as httpRequest, type IncomingMessage, type Server } from 'node:http';
import {
  createServer as createHttp2Server,
  connect as connectHttp2,
  type ServerHttp2Stream,
} from 'node:http2';
import { connect, type AddressInfo, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { apiGroups } from '../../apis/groups.ts';
import { ACCESS_REQUEST_EXTRA, REASON_EXTRA } from '../../apis/access.ts';
import { eventually } from '../../dev/eventually.ts';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { systemClock } from '../../lib/clock.ts';
import { V5_PROTOCOL } from '../../lib/kube/exec-channels.ts';
import type { Request } from '../../lib/http2/request.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import type { Reacher } from '../../lib/reach/dialer.ts';
import { newLogger } from '../../lib/log.ts';
import type { AccessGrants, Grant } from '../access/grants.ts';
import type { Identity } from './authenticate.ts';
import { newClientCertSigner } from './credentials.ts';
import { newDecider, type Authenticated, type Target } from './decide.ts';
import { newRequestContext, type Refusal } from './exchange.ts';
import { grantEndedMessage, newGrantSessions } from './grant-sessions.ts';
import { newProxyHandler } from './handler.ts';
import { newHubRoute, type HubRoute } from './hub-route.ts';
import { newProxyMetrics } from './metrics.ts';
import type { OwnCall, Route } from './route.ts';
import { closingBytes, webSocketFrame } from './session-close.ts';
import { transport, type ForwardPlan, type Hop } from './transport.ts';

const REASON_HEADER = 'impersonate-extra-sealion.dev%2Freason';
const GRANT_HEADER = 'impersonate-extra-sealion.dev%2Faccess-request';
const ORIGINAL = 'impersonation-proxy.concierge.sealion.dev/original-user-info';
const ORIGINAL_HEADER = 'impersonate-extra-impersonation-proxy.concierge.sealion.dev%2Foriginal-user-info';

/** Grants held in memory: set per user and cluster, ended by the test. */
function memoryGrants() {
  const held = new Map<string, Grant[]>();
  const requiring = new Set<string>();
  const listeners = new Set<(name: string, why: string) => void>();
  const grants: AccessGrants = {
    active: (username, cluster) => held.get(JSON.stringify([username, cluster])) ?? [],
    reasonRequired: (cluster) => requiring.has(cluster),
    onEnded(ended) {
      listeners.add(ended);
      return () => void listeners.delete(ended);
    },
  };
  return {
    grants,
    listeners,
    give(username: string, cluster: string, grant: Grant) {
      const key = JSON.stringify([username, cluster]);
      held.set(key, [grant, ...(held.get(key) ?? [])]);
    },
    require: (cluster: string) => void requiring.add(cluster),
    /** The grant ends: gone from every user and cluster, and the listeners told. */
    end(name: string, why: string) {
      for (const [key, list] of held)
        held.set(
          key,
          list.filter((g) => g.name !== name),
        );
      for (const ended of [...listeners]) ended(name, why);
    },
  };
}

const HOUR = 3_600_000;
const ONCALL: Grant = { name: 'oncall-1', groups: ['oncall'], reason: 'INC-1', expiresAt: Date.now() + HOUR };
const DBA: Grant = { name: 'dba-2', groups: ['dba', 'oncall'], expiresAt: Date.now() + HOUR };

const ALICE: UserInfo = {
  username: 'alice',
  groups: ['dev'],
  extra: {
    'example.com/team': ['blue'],
    [REASON_EXTRA]: ['forged'],
    'Sealion.dev/Access-Request': ['forged'],
  },
};
const alice: Identity = { kind: 'user', user: ALICE, via: 'jwt' };

/** A cluster whose reviews are answered here, and what it was asked (SubjectAccessReviews' specs). */
function clusterRoute(allowed: (spec: Record<string, unknown>, kind: string) => boolean = () => true) {
  const asked: Record<string, unknown>[] = [];
  const route: Route = {
    kind: 'tunnel',
    forward: () => Promise.resolve(),
    call(request: OwnCall) {
      const review = JSON.parse(request.body.toString('utf8')) as {
        kind: string;
        spec: Record<string, unknown>;
      };
      if (review.kind === 'SubjectAccessReview') asked.push(review.spec);
      return Promise.resolve({
        status: 201,
        body: Buffer.from(
          JSON.stringify({ ...review, status: { allowed: allowed(review.spec, review.kind) } }),
        ),
      });
    },
  };
  return { route, asked };
}

const reviewer: Reviewer = {
  tokenReview: () => Promise.resolve({ authenticated: false }),
  allowed: () => Promise.resolve(true),
};

function decider(
  grants: AccessGrants,
  route: Route,
  specs: Record<string, { workloads?: { usernamePrefix: string } }> = {},
) {
  return newDecider({
    groups: apiGroups(),
    reviewer,
    router: { route: () => route },
    clusterSpec: (name) => specs[name],
    grants,
    log: newLogger({ level: 'silent' }),
  });
}

const request = (headers: Record<string, string> = {}): Request => {
  const rawHeaders = Object.entries(headers).flat();
  return { method: 'GET', url: '/api/v1/namespaces', headers, rawHeaders } as unknown as Request;
};

/** The plan for `identity` on `cluster`, or the refusal. */
async function planFor(
  d: ReturnType<typeof decider>,
  cluster: string,
  identity: Authenticated,
  headers: Record<string, string> = {},
) {
  const target = d.target(cluster, identity);
  if ('status' in target) return { refusal: target };
  const context = newRequestContext();
  const plan = await d.plan(request(headers), identity, false, target, context);
  if ('status' in plan) return { refusal: plan, context };
  return { plan, context, target };
}

describe('what a user with grants is forwarded as', () => {
  it('adds the active grants’ groups and both extras on that cluster, the credential’s reason first, and drops forged ones', async () => {
    const g = memoryGrants();
    g.give('alice', 'edge', DBA);
    g.give('alice', 'edge', ONCALL);
    const d = decider(g.grants, clusterRoute().route);
    const withGrants = await planFor(d, 'edge', alice);
    expect(withGrants.plan?.headers['impersonate-group']).toEqual([
      'dev',
      'oncall',
      'dba',
      'system:authenticated',
    ]);
    // The newest grant with a reason gives it; both grants are named.
    expect(withGrants.plan?.headers[REASON_HEADER]).toEqual(['INC-1']);
    expect(withGrants.plan?.headers[GRANT_HEADER]).toEqual(['oncall-1', 'dba-2']);
    expect(withGrants.plan?.headers['impersonate-extra-example.com%2Fteam']).toEqual(['blue']);
    expect(
      Object.keys(withGrants.plan!.headers).filter((h) => h.startsWith('impersonate-extra-')),
    ).toHaveLength(3);
    expect(withGrants.context?.grants).toEqual(['oncall-1', 'dba-2']);
    expect(withGrants.context?.decision).toBe('user-info');

    // The credential's own reason wins over a grant's.
    const ownReason = await planFor(d, 'edge', { ...alice, reason: 'CHG-7' });
    expect(ownReason.plan?.headers[REASON_HEADER]).toEqual(['CHG-7']);

    // Another cluster: no grant there, the forged extras dropped all the same, nothing held.
    const elsewhere = await planFor(d, 'other', alice);
    expect(elsewhere.plan?.headers['impersonate-group']).toEqual(['dev', 'system:authenticated']);
    expect(Object.keys(elsewhere.plan!.headers).filter((h) => h.startsWith('impersonate-extra-'))).toEqual([
      'impersonate-extra-example.com%2Fteam',
    ]);
    expect(elsewhere.context?.grants).toBeUndefined();
  });

  it('forwards a user with nothing to add or drop as authenticated, with no object of its own', () => {
    const g = memoryGrants();
    const d = decider(g.grants, clusterRoute().route);
    const plain: Identity = { kind: 'user', user: { username: 'bob', groups: [], extra: {} }, via: 'jwt' };
    const target = d.target('edge', plain) as Target;
    expect(target.forwarded).toBeUndefined();
    expect(target.grants).toBeUndefined();
  });

  it('builds one forwarded user per user and grants, so the impersonation headers are built once, and a new one when the grants change', () => {
    const g = memoryGrants();
    g.give('alice', 'edge', ONCALL);
    const d = decider(g.grants, clusterRoute().route);
    const first = (d.target('edge', alice) as Target).forwarded;
    expect(first).toBeDefined();
    expect((d.target('edge', alice) as Target).forwarded).toBe(first);
    g.give('alice', 'edge', DBA);
    const second = (d.target('edge', alice) as Target).forwarded;
    expect(second).not.toBe(first);
    // The newest grant first.
    expect(second?.groups).toEqual(['dev', 'dba', 'oncall']);
    expect(second?.extra[ACCESS_REQUEST_EXTRA]).toEqual(['dba-2', 'oncall-1']);
  });

  it('asks the cluster about the user with the grants’ groups, never taking an answer kept for the user without them', async () => {
    const g = memoryGrants();
    // The cluster lets members of oncall impersonate bob, nobody else.
    const edge = clusterRoute(
      (spec, kind) => kind !== 'SubjectAccessReview' || (spec['groups'] as string[]).includes('oncall'),
    );
    const d = decider(g.grants, edge.route);
    const asBob = { 'impersonate-user': 'bob' };
    const before = await planFor(d, 'edge', alice, asBob);
    expect(before.refusal?.status).toBe(403);
    g.give('alice', 'edge', ONCALL);
    const after = await planFor(d, 'edge', alice, asBob);
    if (!after.plan) throw new Error(after.refusal?.message);
    // The impersonated identity as decided: bob, none of alice's grants or extras.
    expect(after.plan.headers['impersonate-user']).toBe('bob');
    expect(after.plan.headers['impersonate-group']).toEqual(['system:authenticated']);
    expect(after.plan.headers[REASON_HEADER]).toBeUndefined();
    expect(after.plan.headers[GRANT_HEADER]).toBeUndefined();
    // Who asked goes along as forwarded: with the grant's group and its reason.
    const original = JSON.parse(String(after.plan.headers[ORIGINAL_HEADER])) as UserInfo;
    expect(original).toEqual({
      username: 'alice',
      groups: ['dev', 'oncall'],
      extra: {
        'example.com/team': ['blue'],
        [REASON_EXTRA]: ['INC-1'],
        [ACCESS_REQUEST_EXTRA]: ['oncall-1'],
      },
    });
    expect(original.extra[ORIGINAL]).toBeUndefined();
    // Asked with the grant's group, as forwarded.
    expect(edge.asked.at(-1)?.['groups']).toEqual(['dev', 'oncall', 'system:authenticated']);
    expect(after.context?.grants).toEqual(['oncall-1']);
  });

  it('gives a workload and a service account nothing, whatever is held under their names', async () => {
    const g = memoryGrants();
    const sa: UserInfo = {
      username: 'system:serviceaccount:ci:deployer',
      groups: ['system:serviceaccounts'],
      extra: {},
    };
    for (const cluster of ['', 'edge']) g.give(sa.username, cluster, ONCALL);
    const d = decider(g.grants, clusterRoute().route, { edge: { workloads: { usernamePrefix: 'hub:' } } });
    const workload = await planFor(d, 'edge', { kind: 'workload', user: sa });
    if (!workload.plan) throw new Error(workload.refusal?.message);
    expect(workload.plan.headers['impersonate-group']).toEqual([
      'hub:system:serviceaccounts',
      'system:authenticated',
    ]);
    expect(workload.plan.headers[REASON_HEADER]).toBeUndefined();
    expect(workload.plan.headers[GRANT_HEADER]).toBeUndefined();
    expect(workload.context?.grants).toBeUndefined();
    const passthrough = await planFor(d, '', { kind: 'serviceaccount', user: sa, token: 't' });
    expect(passthrough.plan?.passthrough).toBe(true);
    expect(Object.keys(passthrough.plan!.headers).some((h) => h.startsWith('impersonate-'))).toBe(false);
    expect(passthrough.context?.grants).toBeUndefined();
  });

  it('refuses a grant’s group behind the prefix reserved for hub workloads there', () => {
    const g = memoryGrants();
    g.give('alice', 'edge', {
      name: 'sneaky',
      groups: ['hub:system:serviceaccounts'],
      expiresAt: Date.now() + HOUR,
    });
    const d = decider(g.grants, clusterRoute().route, { edge: { workloads: { usernamePrefix: 'hub:' } } });
    const refused = d.target('edge', alice) as Refusal;
    expect(refused.status).toBe(403);
    expect(refused.message).toContain('is reserved for hub workloads');
  });
});

describe('a cluster that requires a reason', () => {
  it.each<[string, string]>([
    [
      'edge',
      'cluster edge requires a reason for every request: run sealion login --reason "<why>" (or use an approved access request with a reason)',
    ],
    [
      '',
      'the hub requires a reason for every request: run sealion login --reason "<why>" (or use an approved access request with a reason)',
    ],
  ])('%j refuses a request without one, saying how to give one', async (cluster, message) => {
    const g = memoryGrants();
    g.require(cluster);
    const d = decider(g.grants, clusterRoute().route);
    const refused = await planFor(d, cluster, alice);
    expect(refused.refusal).toEqual({ status: 403, message });
  });

  it.each<[string, Authenticated, string]>([
    [
      'a hub workload',
      { kind: 'workload', user: { username: 'system:serviceaccount:ci:deployer', groups: [], extra: {} } },
      'edge',
    ],
    [
      'a service account, passed through',
      {
        kind: 'serviceaccount',
        user: { username: 'system:serviceaccount:ci:deployer', groups: [], extra: {} },
        token: 't',
      },
      '',
    ],
  ])(
    'refuses %s, which cannot carry one, saying the cluster takes only people’s requests with a reason',
    async (_, identity, cluster) => {
      const g = memoryGrants();
      g.require(cluster);
      const edge = clusterRoute();
      const d = decider(g.grants, edge.route, { edge: { workloads: { usernamePrefix: 'hub:' } } });
      const refused = await planFor(d, cluster, identity);
      const where = cluster ? `cluster ${cluster}` : 'the hub';
      const who = identity.kind === 'workload' ? 'a hub workload' : "a service account's token";
      expect(refused.refusal).toEqual({
        status: 403,
        message: `${where} takes only requests with a reason, from people: ${who} cannot carry one; sign in as yourself with sealion login --reason "<why>"`,
      });
      expect(edge.asked).toEqual([]);
      // Where no reason is required, the same caller goes on.
      const elsewhere = await planFor(
        decider(memoryGrants().grants, edge.route, { edge: { workloads: { usernamePrefix: 'hub:' } } }),
        cluster,
        identity,
      );
      expect(elsewhere.plan).toBeDefined();
    },
  );

  it('serves discovery without one, so kubectl prints the refusal of the command’s own request', async () => {
    const g = memoryGrants();
    g.require('edge');
    const d = decider(g.grants, clusterRoute().route);
    const target = d.target('edge', alice);
    if ('status' in target) throw new Error(target.message);
    for (const url of ['/api', '/apis', '/apis/apps/v1', '/version', '/openapi/v3']) {
      const req = { method: 'GET', url, headers: {}, rawHeaders: [] } as unknown as Request;
      const plan = await d.plan(req, alice, false, target, newRequestContext());
      expect([url, 'status' in plan ? plan.message : 'forwarded']).toEqual([url, 'forwarded']);
    }
    for (const [method, url] of [
      ['GET', '/api/v1/namespaces'],
      ['GET', '/metrics'],
      ['POST', '/apis'],
    ] as const) {
      const req = { method, url, headers: {}, rawHeaders: [] } as unknown as Request;
      const plan = await d.plan(req, alice, false, target, newRequestContext());
      expect([url, 'status' in plan ? plan.status : 'forwarded']).toEqual([url, 403]);
    }
  });

  it('takes the caller’s own reason for whom they impersonate, and refuses them without one', async () => {
    const g = memoryGrants();
    g.require('edge');
    const d = decider(g.grants, clusterRoute().route);
    const asBob = { 'impersonate-user': 'bob' };
    expect((await planFor(d, 'edge', alice, asBob)).refusal?.message).toContain(
      'cluster edge requires a reason for every request',
    );
    const withReason = await planFor(d, 'edge', { ...alice, reason: 'CHG-7' }, asBob);
    if (!withReason.plan) throw new Error(withReason.refusal?.message);
    expect(withReason.plan.headers['impersonate-user']).toBe('bob');
    const original = JSON.parse(String(withReason.plan.headers[ORIGINAL_HEADER])) as UserInfo;
    expect(original.extra[REASON_EXTRA]).toEqual(['CHG-7']);
  });

  it('takes the credential’s reason, or an active grant’s', async () => {
    const g = memoryGrants();
    g.require('edge');
    const d = decider(g.grants, clusterRoute().route);
    const own = await planFor(d, 'edge', { ...alice, reason: 'CHG-7' });
    expect(own.plan?.headers[REASON_HEADER]).toEqual(['CHG-7']);
    g.give('alice', 'edge', DBA);
    expect((await planFor(d, 'edge', alice)).refusal?.status).toBe(403);
    g.give('alice', 'edge', ONCALL);
    expect((await planFor(d, 'edge', alice)).plan?.headers[REASON_HEADER]).toEqual(['INC-1']);
  });
});

describe('the extras only Sealion sets', () => {
  it.each<[string, string]>([
    ['impersonate-extra-sealion.dev%2Freason', 'sealion.dev/reason'],
    ['Impersonate-Extra-Sealion.dev%2fReason', 'sealion.dev/reason'],
    ['impersonate-extra-sealion.dev%2Faccess-request', 'sealion.dev/access-request'],
    ['IMPERSONATE-EXTRA-SEALION.DEV%2FACCESS-REQUEST', 'sealion.dev/access-request'],
  ])('refuses whoever asks to impersonate someone with %s, before any review', async (header, key) => {
    const g = memoryGrants();
    g.give('alice', 'edge', ONCALL);
    const edge = clusterRoute();
    const d = decider(g.grants, edge.route);
    const message = `the extra ${key} is set by Sealion only: impersonate without it (sealion login --reason gives your own requests a reason)`;
    const nested = await planFor(d, 'edge', alice, {
      'impersonate-user': 'alice',
      [header]: 'approved by security',
    });
    expect(nested.refusal).toEqual({ status: 403, message });
    expect(edge.asked).toEqual([]);
    // A service account's impersonation goes to the hub's API server as sent: refused all the same.
    const sa: Authenticated = {
      kind: 'serviceaccount',
      user: { username: 'system:serviceaccount:ci:deployer', groups: [], extra: {} },
      token: 't',
    };
    const passthrough = await planFor(d, '', sa, { 'impersonate-user': 'bob', [header]: 'INC-0' });
    expect(passthrough.refusal).toEqual({ status: 403, message });
  });

  it('lets other extras be impersonated as the cluster decides', async () => {
    const d = decider(memoryGrants().grants, clusterRoute().route);
    const other = await planFor(d, 'edge', alice, {
      'impersonate-user': 'bob',
      'impersonate-extra-example.com%2Freason': 'mine',
    });
    expect(other.plan?.headers['impersonate-extra-example.com%2Freason']).toEqual(['mine']);
  });
});

describe('the grant sessions', () => {
  it('ends what each grant holds once, with its message, and lets go of what closed', () => {
    const g = memoryGrants();
    const sessions = newGrantSessions(g.grants);
    const ended: string[] = [];
    const releaseBoth = sessions.add(['a', 'b'], (m) => ended.push(`both: ${m}`));
    const releaseA = sessions.add(['a'], (m) => ended.push(`a: ${m}`));
    sessions.add(['c'], (m) => ended.push(`c: ${m}`))();
    expect(sessions.size()).toBe(2);
    g.end('c', 'expired');
    expect(ended).toEqual([]);
    g.end('a', 'was withdrawn');
    expect(ended).toEqual([
      `both: ${grantEndedMessage('a', 'was withdrawn')}`,
      `a: ${grantEndedMessage('a', 'was withdrawn')}`,
    ]);
    expect(grantEndedMessage('a', 'was withdrawn')).toBe(
      'sealion: access request a was withdrawn; your access through it has ended',
    );
    releaseA();
    releaseA();
    releaseBoth();
    expect(sessions.size()).toBe(0);
    g.end('b', 'expired');
    expect(ended).toHaveLength(2);
    sessions.close();
    expect(g.listeners.size).toBe(0);
  });
});

describe('the handler, when a grant ends', () => {
  const closers: (() => void)[] = [];
  afterEach(() => {
    for (const close of closers.splice(0)) close();
  });

  const listening = async (server: Server | ReturnType<typeof createHttp2Server>): Promise<number> => {
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    return (server.address() as AddressInfo).port;
  };

  /**
   * The pipeline on plain HTTP, `alice` (with grant oncall-1 on edge) and `bob` (without) its users; edge's route
   * carries requests to an HTTP/2 upstream that answers watches with one event, and to an HTTP/1.1 one that upgrades
   * execs to WebSocket v5.
   */
  async function pipeline({
    turn = () => Promise.resolve(),
    review = () => Promise.resolve(),
    reacher,
  }: {
    /** What a request waits for before the route carries it (its turn on a shared hop). Default: nothing. */
    turn?: () => Promise<void>;
    /** What each question to edge waits for before it is answered (a slow tunnel). Default: nothing. */
    review?: () => Promise<void>;
    /** What dials the hub's own reach connections: the hub's route is served, with alice's grant on it too. */
    reacher?: Reacher;
  } = {}) {
    const g = memoryGrants();
    g.give('alice', 'edge', ONCALL);
    let hub: HubRoute | undefined;
    if (reacher) {
      g.give('alice', '', ONCALL);
      // The hub's own route, its reviews answered as edge's are; nothing here reaches its API server.
      hub = newHubRoute({ url: new URL('https://127.0.0.1:9'), credentials: {} }, undefined, () => reacher);
      hub.call = clusterRoute().route.call;
      closers.push(() => hub!.close());
    }
    const watches: ServerHttp2Stream[] = [];
    const h2 = createHttp2Server();
    h2.on('stream', (stream) => {
      watches.push(stream);
      stream.respond({ ':status': 200, 'content-type': 'application/json' });
      stream.write('{"type":"ADDED","object":{"n":1}}\n');
    });
    h2.on('session', (s) => closers.push(() => s.destroy()));
    closers.push(() => h2.close());
    const upgrades: Socket[] = [];
    const h1 = createServer();
    h1.on('upgrade', (_req, s: Socket) => {
      s.write(
        'HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n' +
          `Sec-WebSocket-Protocol: ${V5_PROTOCOL}\r\n\r\n`,
      );
      upgrades.push(s);
      closers.push(() => s.destroy());
    });
    closers.push(() => {
      h1.closeAllConnections();
      h1.close();
    });
    const [h2Port, h1Port] = [await listening(h2), await listening(h1)];
    const session = connectHttp2(`http://127.0.0.1:${h2Port}`);
    session.on('error', () => {});
    closers.push(() => session.destroy());
    const hop: Hop = {
      headers: (plan) => ({ ...plan.headers }),
      pathPrefix: '',
      open: (headers, endStream) => session.request(headers, { endStream }),
      send: (method, path, headers) =>
        httpRequest({ host: '127.0.0.1', port: h1Port, method, path, headers }),
      statusPrefix: 'cluster edge: ',
      failure: (err) => ({ status: 502, message: err.message }),
      shortTimeoutMs: 10_000,
      clock: systemClock,
    };
    const edge = clusterRoute();
    const answer = edge.route.call.bind(edge.route);
    edge.route.call = async (request) => {
      await review();
      return answer(request);
    };
    const plans: ForwardPlan[] = [];
    edge.route.forward = async (exchange, plan) => {
      plans.push(plan);
      await turn();
      transport(exchange, hop, plan);
    };
    const cache = new AuthenticatorCache();
    const users: Record<string, Identity> = {
      'Bearer alice': alice,
      'Bearer bob': { kind: 'user', user: { username: 'bob', groups: [], extra: {} }, via: 'jwt' },
    };
    const handler = newProxyHandler({
      groups: apiGroups(),
      authenticator: {
        authenticate: (req) =>
          Promise.resolve(
            users[String(req.headers['authorization'])] ?? { kind: 'anonymous', reason: 'unknown' },
          ),
      },
      cache,
      reviewer,
      router: { route: (name) => (name === 'edge' ? edge.route : name === '' ? hub : undefined) },
      signer: newClientCertSigner(() => undefined),
      metrics: newProxyMetrics(),
      log: newLogger({ level: 'silent' }),
      ready: () => true,
      serving: () => true,
      grants: g.grants,
    });
    const server = createServer(handler.request);
    server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) =>
      handler.upgrade(req, socket, head),
    );
    const port = await listening(server);
    closers.push(() => {
      handler.close();
      cache.close();
      server.closeAllConnections();
      server.close();
    });
    const post = (path: string, user: string, body: string) =>
      new Promise<{ status: number; body: string }>((done, fail) => {
        const req = httpRequest(
          {
            host: '127.0.0.1',
            port,
            path,
            method: 'POST',
            agent: false,
            headers: { authorization: `Bearer ${user}`, 'content-type': 'application/json' },
          },
          (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () => done({ status: res.statusCode ?? 0, body: text }));
          },
        );
        req.on('error', fail);
        req.end(body);
      });
    const get = (path: string, user: string) =>
      new Promise<{ status: number; body: string }>((done, fail) => {
        const req = httpRequest(
          { host: '127.0.0.1', port, path, agent: false, headers: { authorization: `Bearer ${user}` } },
          (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () => done({ status: res.statusCode ?? 0, body: text }));
          },
        );
        req.on('error', fail);
        req.end();
        closers.push(() => req.destroy());
      });
    return { g, port, plans, watches, upgrades, post, get };
  }

  /** A watch as `user`: its text so far, and how it ended. */
  function watch(port: number, user: string) {
    let text = '';
    const ended = new Promise<{ text: string; complete: boolean }>((done, fail) => {
      const req = httpRequest(
        {
          host: '127.0.0.1',
          port,
          path: '/clusters/edge/api/v1/configmaps?watch=1',
          agent: false,
          headers: { authorization: `Bearer ${user}` },
        },
        (res) => {
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.once('end', () => done({ text, complete: res.complete }));
          res.once('error', fail);
        },
      );
      req.once('error', fail);
      req.end();
      closers.push(() => req.destroy());
    });
    // A watch left open is cut by the cleanup: its end is then no test's business.
    ended.catch(() => {});
    return { ended, text: () => text };
  }

  /** An exec over WebSocket as `user`: what it received after the 101's head, and how its connection ended. */
  function exec(port: number, user: string) {
    const socket = connect(port, '127.0.0.1');
    closers.push(() => socket.destroy());
    socket.write(
      'GET /clusters/edge/api/v1/namespaces/default/pods/p/exec?command=sh&stdout=1 HTTP/1.1\r\nHost: x\r\n' +
        `Authorization: Bearer ${user}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n` +
        `Sec-WebSocket-Protocol: ${V5_PROTOCOL}\r\n\r\n`,
    );
    const chunks: Buffer[] = [];
    socket.on('data', (c: Buffer) => chunks.push(c));
    const received = (): Buffer => {
      const bytes = Buffer.concat(chunks);
      const head = bytes.indexOf('\r\n\r\n');
      return head < 0 ? Buffer.alloc(0) : bytes.subarray(head + 4);
    };
    const ended = new Promise<{ clean: boolean }>((done) => {
      let clean = false;
      socket.once('end', () => (clean = true));
      socket.once('error', () => {});
      socket.once('close', () => done({ clean }));
    });
    return { received, ended, head: () => Buffer.concat(chunks).toString('latin1') };
  }

  it('ends the grant’s open exec with the message on its error channel, and its watch cleanly, and nobody else’s', async () => {
    const p = await pipeline();
    // One at a time, so that the upstream's n-th watch and upgrade are the n-th opened here: alice's, then bob's.
    const aliceWatch = watch(p.port, 'alice');
    await eventually(() => expect(aliceWatch.text()).toContain('"n":1'));
    const bobWatch = watch(p.port, 'bob');
    await eventually(() => expect(bobWatch.text()).toContain('"n":1'));
    const aliceExec = exec(p.port, 'alice');
    await eventually(() => expect(p.upgrades).toHaveLength(1));
    const bobExec = exec(p.port, 'bob');
    await eventually(() => expect(p.upgrades).toHaveLength(2));
    const output = webSocketFrame(2, Buffer.concat([Buffer.of(1), Buffer.from('hello')]));
    for (const s of p.upgrades) s.write(output);
    await eventually(() => {
      expect(aliceExec.received()).toEqual(output);
      expect(bobExec.received()).toEqual(output);
    });
    // alice's requests carried the grant.
    expect(p.plans.filter((plan) => plan.user === 'alice').every((plan) => plan.headers[GRANT_HEADER])).toBe(
      true,
    );

    p.g.end('oncall-1', 'expired');
    const message = grantEndedMessage('oncall-1', 'expired');
    expect(await aliceExec.ended).toEqual({ clean: true });
    expect(aliceExec.received()).toEqual(
      Buffer.concat([output, closingBytes('websocket', V5_PROTOCOL, message)]),
    );
    expect(aliceExec.received().toString()).toContain(message);
    expect(await aliceWatch.ended).toEqual({ text: '{"type":"ADDED","object":{"n":1}}\n', complete: true });

    // bob's go on: more reaches them after alice's ended.
    const more = webSocketFrame(2, Buffer.concat([Buffer.of(1), Buffer.from('still here')]));
    p.upgrades[1]!.write(more);
    p.watches[1]!.write('{"type":"ADDED","object":{"n":2}}\n');
    await eventually(() => expect(bobExec.received()).toEqual(Buffer.concat([output, more])));
    await eventually(() => expect(bobWatch.text()).toContain('"n":2'));
  });

  it('ends the grant’s reach connection that the hub dials itself', async () => {
    const dialed: Duplex[] = [];
    const reacher: Reacher = {
      serve(_request, socket) {
        dialed.push(socket);
        socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n');
      },
      open: () => dialed.length,
      close: () => dialed.forEach((s) => s.destroy()),
    };
    const p = await pipeline({ reacher });
    const socket = connect(p.port, '127.0.0.1');
    closers.push(() => socket.destroy());
    let received = '';
    socket.on('data', (c: Buffer) => (received += c.toString('latin1')));
    const closed = new Promise<void>((done) => {
      socket.once('error', () => {});
      socket.once('close', () => done());
    });
    socket.write(
      `POST /apis/${apiGroups().reach}/v1alpha1/namespaces/team/services/echo/connect?port=80 HTTP/1.1\r\n` +
        'Host: x\r\nAuthorization: Bearer alice\r\nConnection: Upgrade\r\nUpgrade: tcp\r\nContent-Length: 0\r\n\r\n',
    );
    await eventually(() => expect(received).toContain('101 Switching Protocols'));
    expect(dialed).toHaveLength(1);

    p.g.end('oncall-1', 'expired');
    await closed;
  });

  it('answers WhoAmI on the hub with the user as forwarded to the hub, and on a cluster as forwarded there', async () => {
    const p = await pipeline();
    p.g.give('alice', '', DBA);
    const whoami = '/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests';
    const body = JSON.stringify({
      apiVersion: 'identity.concierge.sealion.dev/v1alpha1',
      kind: 'WhoAmIRequest',
    });
    const seen = async (path: string) => {
      const answer = await p.post(path, 'alice', body);
      expect(answer.status).toBe(201);
      return (JSON.parse(answer.body) as { status: { kubernetesUserInfo: { user: UserInfo } } }).status
        .kubernetesUserInfo.user;
    };
    expect(await seen(whoami)).toEqual({
      username: 'alice',
      groups: ['dev', 'dba', 'oncall', 'system:authenticated'],
      extra: { 'example.com/team': ['blue'], [ACCESS_REQUEST_EXTRA]: ['dba-2'] },
    });
    expect(await seen(`/clusters/edge${whoami}`)).toEqual({
      username: 'alice',
      groups: ['dev', 'oncall', 'system:authenticated'],
      extra: {
        'example.com/team': ['blue'],
        [REASON_EXTRA]: ['INC-1'],
        [ACCESS_REQUEST_EXTRA]: ['oncall-1'],
      },
    });
    expect(p.plans).toHaveLength(0);
  });

  it('ends a session whose grant ended while it waited for its turn on the hop, once it is upgraded', async () => {
    let letThrough: () => void = () => {};
    const waiting = new Promise<void>((done) => (letThrough = done));
    let asked = false;
    const p = await pipeline({
      turn: () => {
        asked = true;
        return waiting;
      },
    });
    const aliceExec = exec(p.port, 'alice');
    await eventually(() => expect(asked).toBe(true));
    p.g.end('oncall-1', 'was withdrawn');
    letThrough();
    expect(await aliceExec.ended).toEqual({ clean: true });
    expect(aliceExec.received()).toEqual(
      closingBytes('websocket', V5_PROTOCOL, grantEndedMessage('oncall-1', 'was withdrawn')),
    );
  });

  it.each(['a watch', 'a short request', 'an exec'])(
    'refuses %s whose grant ended while it was decided, with the grant’s message, and relays nothing',
    async (kind) => {
      let answerNow: () => void = () => {};
      const answering = new Promise<void>((done) => (answerNow = done));
      let asked = false;
      const p = await pipeline({
        review: () => {
          asked = true;
          return answering;
        },
      });
      const sent =
        kind === 'an exec'
          ? exec(p.port, 'alice')
          : p.get(`/clusters/edge/api/v1/configmaps${kind === 'a watch' ? '?watch=1' : ''}`, 'alice');
      await eventually(() => expect(asked).toBe(true));
      // The grant ends (withdrawn) while edge is asked about the request.
      p.g.end('oncall-1', 'was withdrawn');
      answerNow();
      const message = grantEndedMessage('oncall-1', 'was withdrawn');
      if ('head' in sent) {
        await sent.ended;
        expect(sent.head()).toMatch(/^HTTP\/1\.1 403 /);
        expect(sent.head()).toContain(message);
      } else {
        const answer = await sent;
        expect(answer.status).toBe(403);
        expect((JSON.parse(answer.body) as { message: string }).message).toBe(message);
      }
      expect(p.plans).toEqual([]);
    },
  );
});
