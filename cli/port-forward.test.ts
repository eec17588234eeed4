// `sealion port-forward`: its arguments, and the whole client path against a stand-in server of the reach protocol
// (HTTPS with the project's own certificates, a kubeconfig with a bearer token): the upgrade request it sends, the
// bytes both ways, half-close in either order, refusals reported per connection, many connections at once.
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Agent, createServer, type Server } from 'node:https';
import { connect, createServer as createTcpServer, type AddressInfo, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { closeHttpsPools } from '../lib/https-client.ts';
import { loadKubeConfig } from '../lib/kube/kube.ts';
import { rawStatusResponse, statusBody } from '../lib/kube/status.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import {
  openReach,
  parseAddresses,
  parsePort,
  parseResource,
  reachPath,
  startPortForward,
  type Forward,
  type PortForwardFlags,
} from './port-forward.ts';
import { kubeconfigAccess } from './whoami.ts';

const TOKEN = 'the-forwarding-token';
/** Escape sequences, a carriage return, a bidi override: a Status message that must reach the terminal escaped. */
const HOSTILE = '\u001b]0;owned\u0007\rforged\u202eevil';
/** A control or an invisible format character. */
const UNSAFE = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}]/u;
const REACH =
  /^\/(?:clusters\/([^/]+)\/)?apis\/reach\.concierge\.sealion\.dev\/v1alpha1\/namespaces\/([^/]+)\/(pods|services)\/([^/]+)\/connect\?port=([^&]+)$/;

/** What the stand-in server saw of each upgrade request. */
interface Seen {
  method: string;
  url: string;
  headers: Record<string, string | string[] | undefined>;
  resumed: boolean;
}

let dir: string;
let kubeconfig: string;
/** A local port nothing listens on. */
let closedPort: number;
let server: Server;
const seen: Seen[] = [];
/** Every upgraded socket of the server's, closed at the end. */
const upgraded = new Set<Socket>();
/** What the server read from a connection whose target ended its side first, by connection. */
const readAfterServerEnd: Promise<string>[] = [];
/** Forwards a test started, closed after it. */
const forwards: Forward[] = [];

/** Refuses an upgrade with a Status, as the concierge does on a raw socket. */
const refuse = (socket: Socket, code: number, message: string): void => {
  socket.end(rawStatusResponse(code, message));
};

/** Reads a socket to its end. */
const readAll = (socket: Socket): Promise<Buffer> =>
  new Promise((done, fail) => {
    const chunks: Buffer[] = [];
    socket.on('data', (chunk: Buffer) => chunks.push(chunk));
    socket.once('end', () => done(Buffer.concat(chunks)));
    socket.once('error', fail);
  });

/** The stand-in server's side of one accepted connection, by the target's name. */
function target(name: string, socket: Socket): void {
  socket.write('HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\n');
  if (name === 'echo') return void socket.pipe(socket);
  if (name === 'reply-after-end') {
    // Reads until the client's end, then answers: the client's half-close must leave it able to read.
    void readAll(socket).then((got) => socket.end(`got ${got.length} bytes after "${got.toString()}"`));
    return;
  }
  if (name === 'ends-first') {
    // Ends its own side at once, and keeps reading what the client still sends.
    socket.end('hello, and goodbye');
    readAfterServerEnd.push(readAll(socket).then(String));
  }
}

/** The plain requests the stand-in API answered: method and URL. */
const asked: { method: string; url: string; body: string }[] = [];

/** An answer: a JSON object, or a Status. */
const answer = (res: ServerResponse, code: number, body: object | string): void => {
  const text = typeof body === 'string' ? statusBody(code, body) : JSON.stringify(body);
  res.writeHead(code, { 'content-type': 'application/json' }).end(text);
};

/** A pod as the stand-in API has it: Running with a named container port, but `pending`. */
const pod = (name: string): object => ({
  kind: 'Pod',
  metadata: { name },
  spec: {
    containers: [{ ports: [{ name: 'metrics', containerPort: 9090 }, { containerPort: 8080 }] }],
    ...(name === 'on-node' ? { hostNetwork: true } : {}),
  },
  status: { phase: name === 'pending' ? 'Pending' : 'Running' },
});
/** A Service as the stand-in API has it. */
const service = (name: string): object => ({
  kind: 'Service',
  metadata: { name },
  spec: {
    ...(name === 'outside' ? { type: 'ExternalName', externalName: 'example.com' } : {}),
    ports: [
      { name: 'http', port: 80 },
      { name: 'https', port: 443 },
      { name: 'forbidden', port: 81 },
      { name: 'dns', port: 53, protocol: 'UDP' },
    ],
  },
});
const OBJECT =
  /^\/(?:clusters\/([^/]+)\/)?api\/v1\/namespaces\/([^/]+)\/(pods|services)(?:\/([^/?]+))?(?:\?.*)?$/;
const REVIEW = /^\/(?:clusters\/([^/]+)\/)?apis\/authorization\.k8s\.io\/v1\/selfsubjectaccessreviews$/;

/**
 * The API the checks before listening read, as a cluster behind the proxy answers them: the user `me` everywhere;
 * `stranger` here but not on upgrades (a credential refused after the checks); anyone else 401. Cluster `nope` is not
 * connected; `missing` exists nowhere; `hidden` may not be read but may be reached; names with `denied` may not be
 * reached.
 */
function standInAPI(req: IncomingMessage, res: ServerResponse): void {
  const chunks: Buffer[] = [];
  req.on('data', (c: Buffer) => chunks.push(c));
  req.on('end', () => {
    const url = req.url ?? '';
    asked.push({ method: req.method ?? '', url, body: Buffer.concat(chunks).toString() });
    if (![`Bearer ${TOKEN}`, 'Bearer not-the-token'].includes(req.headers['authorization'] ?? ''))
      return answer(res, 401, 'Unauthorized');
    const cluster = OBJECT.exec(url)?.[1] ?? REVIEW.exec(url)?.[1];
    if (cluster === 'nope')
      return answer(
        res,
        503,
        'cluster nope is not connected: its agent holds no tunnel to any concierge replica',
      );
    const review = REVIEW.exec(url);
    if (review && req.method === 'POST') {
      const spec = (
        JSON.parse(Buffer.concat(chunks).toString()) as { spec: { resourceAttributes: { name: string } } }
      ).spec;
      const allowed = !spec.resourceAttributes.name.includes('denied');
      return answer(res, 201, {
        kind: 'SelfSubjectAccessReview',
        spec,
        status: { allowed, ...(allowed ? {} : { reason: 'no RBAC rule allows it' }) },
      });
    }
    const object = OBJECT.exec(url);
    if (!object || req.method !== 'GET')
      return answer(res, 404, 'the server could not find the requested resource');
    const [, , , resource, name] = object;
    if (!name)
      return answer(res, 200, { items: ['web', 'echo', 'db'].map((n) => ({ metadata: { name: n } })) });
    if (name === 'missing') return answer(res, 404, `${resource} "${name}" not found`);
    if (name === 'hidden') return answer(res, 403, `${resource} "${name}" is forbidden`);
    return answer(res, 200, resource === 'pods' ? pod(name) : service(name));
  });
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-port-forward-'));
  const ca = await newCA('reach-ca');
  const cert = await issueCert(ca, { commonName: 'reach', hosts: ['127.0.0.1'], usage: 'server' });
  // Half-open, as the concierge's upgraded sockets must be: a target's answer may follow the client's end.
  server = createServer({ cert: cert.certPem, key: cert.keyPem, allowHalfOpen: true }, standInAPI);
  server.on('upgrade', (req: { method: string; url: string; headers: Seen['headers'] }, socket: Socket) => {
    upgraded.add(socket);
    socket.once('close', () => upgraded.delete(socket));
    socket.on('error', () => socket.destroy());
    seen.push({
      method: req.method,
      url: req.url,
      headers: req.headers,
      resumed: (socket as unknown as { isSessionReused(): boolean }).isSessionReused(),
    });
    const route = REACH.exec(req.url);
    if (req.headers['authorization'] !== `Bearer ${TOKEN}`) return refuse(socket, 401, 'Unauthorized');
    if (req.method !== 'POST' || !route || req.headers['upgrade'] !== 'tcp')
      return refuse(socket, 400, `not a reach request: ${req.method} ${req.url}`);
    const [, , , , name, port] = route;
    if (port === 'forbidden')
      return refuse(socket, 403, `services "${name}" is forbidden: port ${port}${HOSTILE}`);
    // A target the server never reaches: no answer at all.
    if (name === 'silent') return;
    target(name!, socket);
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
  // A port nothing listens on any more.
  const gone = createTcpServer();
  await new Promise<void>((done) => gone.listen(0, '127.0.0.1', done));
  closedPort = (gone.address() as AddressInfo).port;
  await new Promise((done) => gone.close(done));
  kubeconfig = join(dir, 'kubeconfig');
  writeFileSync(
    kubeconfig,
    stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [
        {
          name: 'hub',
          cluster: {
            server: endpoint,
            'certificate-authority-data': Buffer.from(ca.certPem).toString('base64'),
          },
        },
        { name: 'closed', cluster: { server: `https://127.0.0.1:${closedPort}` } },
      ],
      users: [
        { name: 'me', user: { token: TOKEN } },
        { name: 'stranger', user: { token: 'not-the-token' } },
        { name: 'nobody', user: { token: 'unknown' } },
      ],
      contexts: [
        { name: 'hub', context: { cluster: 'hub', user: 'me', namespace: 'team' } },
        { name: 'stranger', context: { cluster: 'hub', user: 'stranger' } },
        { name: 'nobody', context: { cluster: 'hub', user: 'nobody' } },
        { name: 'closed', context: { cluster: 'closed', user: 'me' } },
      ],
      'current-context': 'hub',
    }),
  );
});

afterEach(async () => {
  await Promise.all(forwards.splice(0).map((f) => f.close()));
});

afterAll(async () => {
  await closeHttpsPools();
  for (const socket of upgraded) socket.destroy();
  server.closeAllConnections();
  await new Promise((done) => server.close(done));
  rmSync(dir, { recursive: true, force: true });
});

const flags = (over: Partial<PortForwardFlags> = {}): PortForwardFlags => ({
  kubeconfig,
  context: '',
  cluster: '',
  namespace: '',
  address: '127.0.0.1',
  groupSuffix: 'sealion.dev',
  ...over,
});

/** Starts a forward (closed after the test), with what it prints. */
async function forwarding(
  resource: string,
  ports: string[],
  over: Partial<PortForwardFlags> = {},
): Promise<{ forward: Forward; out: string[]; err: string[] }> {
  const out: string[] = [];
  const err: string[] = [];
  const forward = await startPortForward(flags(over), resource, ports, {
    out: (line) => out.push(line),
    err: (line) => err.push(line),
  });
  forwards.push(forward);
  return { forward, out, err };
}

/** A half-open connection to a local port. */
const dial = (port: number): Promise<Socket> =>
  new Promise((done, fail) => {
    const socket = connect({ host: '127.0.0.1', port, allowHalfOpen: true }, () => done(socket));
    socket.once('error', fail);
  });

/** Sends `data`, ends the writing side, and reads the answer to its end. */
async function roundTrip(port: number, data: Buffer | string): Promise<Buffer> {
  const socket = await dial(port);
  const answer = readAll(socket);
  socket.end(data);
  return answer;
}

describe('arguments', () => {
  it('reads TYPE/NAME as kubectl does, and refuses other types and invalid names', () => {
    for (const [arg, resource] of [
      ['svc/web', 'services'],
      ['service/web', 'services'],
      ['services/web', 'services'],
      ['pod/web-0', 'pods'],
      ['pods/web-0', 'pods'],
      ['po/web-0', 'pods'],
      ['web-0.shard', 'pods'],
    ])
      expect(parseResource(arg!)).toEqual({ resource, name: arg!.split('/').at(-1) });
    expect(() => parseResource('deploy/web')).toThrow(/reaches pods .* and services .*, not "deploy"/);
    expect(() => parseResource('svc/web.shard')).toThrow(/is not a service name \(a DNS-1123 label/);
    expect(() => parseResource(`svc/${'a'.repeat(64)}`)).toThrow(/is not a service name/);
    expect(() => parseResource(`pod/${'a'.repeat(254)}`)).toThrow(/is not a pod name/);
    for (const bad of ['Web', 'pod/', 'svc/a/b', 'pod/-web', 'pod/web_0', 'pod/%2e%2e', ''])
      expect(() => parseResource(bad)).toThrow();
  });

  it('reads [LOCAL:]REMOTE as kubectl does', () => {
    expect(parsePort('8080:80')).toEqual({ local: 8080, remote: '80' });
    expect(parsePort('80')).toEqual({ local: 80, remote: '80' });
    expect(parsePort(':80')).toEqual({ local: 0, remote: '80' });
    expect(parsePort('0:80')).toEqual({ local: 0, remote: '80' });
    expect(parsePort('8443:https')).toEqual({ local: 8443, remote: 'https' });
    expect(parsePort(':metrics-2')).toEqual({ local: 0, remote: 'metrics-2' });
    expect(() => parsePort('https')).toThrow(/a named remote port needs a local port: LOCAL:https/);
    for (const bad of [
      '0',
      '65536',
      '8080:0',
      '70000:80',
      'x:80',
      '1:2:3',
      '80:',
      '-1:80',
      '80:Http',
      '80:a--b',
      '80:-ab',
      '80:averyveryverylongname',
    ])
      expect(() => parsePort(bad)).toThrow();
  });

  it('reads --address: localhost is 127.0.0.1 and ::1, either enough; a named address must listen', () => {
    expect(parseAddresses('localhost')).toEqual([
      { host: '127.0.0.1', optional: true },
      { host: '::1', optional: true },
    ]);
    expect(parseAddresses('localhost,10.0.0.5,::1')).toEqual([
      { host: '127.0.0.1', optional: true },
      { host: '::1', optional: false },
      { host: '10.0.0.5', optional: false },
    ]);
    expect(() => parseAddresses('example.com')).toThrow(/neither an IP address nor localhost/);
    expect(() => parseAddresses('127.0.0.1,')).toThrow();
  });

  it('builds the request path, each part encoded, under /clusters/NAME for --cluster', () => {
    const target = {
      groupSuffix: 'example.org',
      namespace: 'team',
      resource: 'services' as const,
      name: 'web',
      port: 'https',
    };
    expect(reachPath(target)).toBe(
      'apis/reach.concierge.example.org/v1alpha1/namespaces/team/services/web/connect?port=https',
    );
    expect(reachPath({ ...target, cluster: 'edge-1', namespace: 'a/b?', port: '80&x=1' })).toBe(
      'clusters/edge-1/apis/reach.concierge.example.org/v1alpha1/namespaces/a%2Fb%3F/services/web/connect?port=80%26x%3D1',
    );
  });

  it('refuses bad arguments before reading the kubeconfig or calling the server', async () => {
    const nowhere = { kubeconfig: join(dir, 'missing') };
    const output = { out: () => {}, err: () => {} };
    for (const [resource, ports, over, error] of [
      ['svc/Web', ['80'], {}, /not a service name/],
      ['svc/web', ['http'], {}, /named remote port needs a local port/],
      ['svc/web', ['8080:80', '8080:81'], {}, /local port 8080 is given twice/],
      ['svc/web', ['80'], { address: 'anywhere' }, /--address/],
      ['svc/web', ['80'], { cluster: 'Edge_1' }, /--cluster: "Edge_1" is not a cluster name/],
      ['svc/web', ['80'], { groupSuffix: 'dev' }, /--group-suffix/],
    ] as const)
      await expect(
        startPortForward(flags({ ...nowhere, ...over }), resource, [...ports], output),
      ).rejects.toThrow(error);
    await expect(startPortForward(flags({ context: 'nope' }), 'svc/web', ['80'], output)).rejects.toThrow(
      /--context: the kubeconfig has no context "nope"/,
    );
  });
});

describe('checks before listening', () => {
  /** Starts a forward that must fail: its error, and that it printed nothing (nothing listened). */
  async function refused(
    resource: string,
    ports: string[],
    over: Partial<PortForwardFlags> = {},
  ): Promise<string> {
    const out: string[] = [];
    const started = startPortForward(flags(over), resource, ports, {
      out: (l) => out.push(l),
      err: (l) => out.push(l),
    });
    const err = await started.then(
      (f) => {
        forwards.push(f);
        return new Error('it started');
      },
      (e: unknown) => e as Error,
    );
    expect(out).toEqual([]);
    return err.message;
  }

  it.each([
    [
      'a service that does not exist',
      'svc/missing',
      ['80'],
      {},
      'no service missing in namespace team; known: db, echo, web',
    ],
    [
      'a pod that does not exist, on a cluster',
      'pod/missing',
      ['80'],
      { cluster: 'edge-1' },
      'no pod missing in namespace team on cluster edge-1; known: db, echo, web',
    ],
    [
      'a port the service does not have',
      'svc/echo',
      ['8080:8080'],
      {},
      'service team/echo has no TCP port 8080; its ports: 80 (http), 443 (https), 81 (forbidden)',
    ],
    [
      'a UDP port of the service',
      'svc/echo',
      ['5353:dns'],
      {},
      'service team/echo has no TCP port dns; its ports: 80 (http), 443 (https), 81 (forbidden)',
    ],
    [
      'a port name the pod does not have',
      'pod/echo',
      ['9091:nope'],
      {},
      'pod team/echo has no TCP container port named nope; its named ports: 9090 (metrics)',
    ],
    [
      'a pod that is not running',
      'pod/pending',
      ['80'],
      {},
      'pod team/pending is Pending, not Running; wait until it runs (kubectl get pod shows why not)',
    ],
    [
      "a pod on its node's network",
      'pod/on-node',
      ['10250'],
      {},
      "pod team/on-node uses its node's network, and a node's addresses are never dialed; forward to a pod on the pod network",
    ],
    [
      'an ExternalName service',
      'svc/outside',
      ['443'],
      {},
      'service team/outside is an ExternalName, a host outside the cluster, which port-forward never reaches',
    ],
    [
      'a service the user may not reach',
      'svc/denied',
      [':https'],
      {},
      'forbidden: you may not create services/proxy "denied:https" in namespace team (no RBAC rule allows it); port-forward needs it, ask the cluster\'s admin to grant it',
    ],
    [
      'a pod the user may not reach, on a cluster',
      'pod/denied',
      ['80'],
      { cluster: 'edge-1' },
      'forbidden: you may not create pods/portforward "denied" in namespace team on cluster edge-1 (no RBAC rule allows it); port-forward needs it, ask the cluster\'s admin to grant it',
    ],
    [
      'a cluster the hub does not reach',
      'svc/echo',
      ['80'],
      { cluster: 'nope' },
      'cannot forward to cluster nope: cluster nope is not connected: its agent holds no tunnel to any concierge replica; sealion clusters shows which clusters answer you',
    ],
    [
      'credentials the server refuses',
      'svc/echo',
      ['80'],
      { context: 'nobody' },
      'the server refused the credentials (401 Unauthorized): Unauthorized; log in again (sealion logout, then retry)',
    ],
  ] as const)('%s: one line, and nothing listens', async (_, resource, ports, over, message) => {
    expect(await refused(resource, [...ports], over)).toBe(message);
  });

  it('a server nothing answers on: one line, and nothing listens', async () => {
    expect(await refused('svc/echo', ['80'], { context: 'closed' })).toBe(
      `cannot reach 127.0.0.1:${closedPort}: nothing listens there (connection refused); check the server in your kubeconfig`,
    );
  });

  it('asks the cluster the forward goes to what its dialer asks, for each port of a service', async () => {
    const from = asked.length;
    await forwarding('svc/echo', [':80', ':https'], { cluster: 'edge-1', namespace: 'shop' });
    const reviews = asked.slice(from).filter((a) => a.method === 'POST');
    expect(asked.slice(from).map((a) => `${a.method} ${a.url}`)).toEqual([
      'GET /clusters/edge-1/api/v1/namespaces/shop/services/echo',
      'POST /clusters/edge-1/apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
      'POST /clusters/edge-1/apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
    ]);
    expect(reviews.map((r) => (JSON.parse(r.body) as { spec: unknown }).spec)).toEqual(
      ['echo:80', 'echo:https'].map((name) => ({
        resourceAttributes: {
          verb: 'create',
          group: '',
          version: 'v1',
          resource: 'services',
          subresource: 'proxy',
          namespace: 'shop',
          name,
        },
      })),
    );
  });

  it('forwards to an object the user may reach but not read: the cluster decides', async () => {
    const { forward } = await forwarding('svc/hidden', [':80']);
    expect(forward.listeners).toHaveLength(1);
  });
});

describe('forwarding', () => {
  it('sends the upgrade request with the credentials, and carries bytes both ways (1 MiB too)', async () => {
    const { forward, out, err } = await forwarding('svc/echo', [':80']);
    const [listener] = forward.listeners;
    expect(forward.listeners).toEqual([{ host: '127.0.0.1', port: expect.any(Number), remote: '80' }]);
    expect(out).toEqual([`Forwarding from 127.0.0.1:${listener!.port} -> 80`]);
    const from = seen.length;

    expect((await roundTrip(listener!.port, 'hello')).toString()).toBe('hello');
    const large = randomBytes(1024 * 1024);
    expect((await roundTrip(listener!.port, large)).equals(large)).toBe(true);

    expect(seen.slice(from)).toEqual([
      expect.objectContaining({
        method: 'POST',
        // The context's namespace.
        url: '/apis/reach.concierge.sealion.dev/v1alpha1/namespaces/team/services/echo/connect?port=80',
        headers: expect.objectContaining({
          authorization: `Bearer ${TOKEN}`,
          connection: 'Upgrade',
          upgrade: 'tcp',
          'content-length': '0',
        }),
      }),
      expect.objectContaining({ method: 'POST' }),
    ]);
    // The second connection resumed the TLS session of the first, through the shared agent.
    expect(seen.at(-1)!.resumed).toBe(true);
    expect(out.slice(1)).toEqual([
      `Handling connection for ${listener!.port}`,
      `Handling connection for ${listener!.port}`,
    ]);
    expect(err).toEqual([]);
  });

  it('passes the client half-close on: the target sees the end and still answers, then the client sees its end', async () => {
    const { forward } = await forwarding('pod/reply-after-end', [':8080']);
    const answer = await roundTrip(forward.listeners[0]!.port, 'ping');
    expect(answer.toString()).toBe('got 4 bytes after "ping"');
  });

  it("passes the target's half-close on: the client reads the end and can still send", async () => {
    const { forward } = await forwarding('pod/ends-first', [':8080']);
    const socket = await dial(forward.listeners[0]!.port);
    expect((await readAll(socket)).toString()).toBe('hello, and goodbye');
    // The local side is still open for writing after the target's end.
    socket.end('written after the end');
    expect(await readAfterServerEnd.at(-1)).toBe('written after the end');
  });

  it('reports a refusal with its Status message (escaped) and closes that connection, serving the others', async () => {
    const { forward, out, err } = await forwarding('svc/echo', [':80', ':forbidden']);
    const [open, refused] = forward.listeners;
    expect(refused!.remote).toBe('forbidden');
    expect(out.slice(0, 2)).toEqual([
      `Forwarding from 127.0.0.1:${open!.port} -> 80`,
      `Forwarding from 127.0.0.1:${refused!.port} -> forbidden`,
    ]);

    expect((await roundTrip(refused!.port, 'anyone there?')).length).toBe(0);
    expect(err).toHaveLength(1);
    expect(err[0]).toMatch(
      new RegExp(
        `^error: forwarding ${refused!.port} -> forbidden: the server answered 403 Forbidden: services "echo" is forbidden: port forbidden\\\\u001b\\]0;owned`,
      ),
    );
    expect(err[0]).not.toMatch(UNSAFE);
    expect((await roundTrip(open!.port, 'still here')).toString()).toBe('still here');
    expect((await roundTrip(refused!.port, 'again')).length).toBe(0);
    expect(err).toHaveLength(2);
  });

  it('says when the server refused the credentials', async () => {
    const { forward, err } = await forwarding('svc/echo', [':80'], { context: 'stranger' });
    expect((await roundTrip(forward.listeners[0]!.port, 'x')).length).toBe(0);
    expect(err).toEqual([
      `error: forwarding ${forward.listeners[0]!.port} -> 80: the server refused the credentials (401 Unauthorized): Unauthorized`,
    ]);
  });

  it('goes to /clusters/NAME for --cluster, in the namespace -n names', async () => {
    const { forward } = await forwarding('echo', [':9090'], { cluster: 'edge-1', namespace: 'shop' });
    expect((await roundTrip(forward.listeners[0]!.port, 'via the agent')).toString()).toBe('via the agent');
    expect(seen.at(-1)!.url).toBe(
      '/clusters/edge-1/apis/reach.concierge.sealion.dev/v1alpha1/namespaces/shop/pods/echo/connect?port=9090',
    );
  });

  it('carries 50 connections at once', async () => {
    const { forward, err } = await forwarding('svc/echo', [':80']);
    const port = forward.listeners[0]!.port;
    const payloads = Array.from({ length: 50 }, (_, i) =>
      Buffer.concat([Buffer.from(`#${i}:`), randomBytes(64 * 1024)]),
    );
    const answers = await Promise.all(payloads.map((p) => roundTrip(port, p)));
    answers.forEach((answer, i) => expect(answer.equals(payloads[i]!)).toBe(true));
    expect(err).toEqual([]);
  });

  it('listens on localhost where it can', async () => {
    const { forward, out } = await forwarding('svc/echo', [':80'], { address: 'localhost' });
    const port = forward.listeners[0]!.port;
    expect(forward.listeners[0]).toEqual({ host: '127.0.0.1', port, remote: '80' });
    // ::1 listens on the same port where the host has IPv6; where not, that alone is no failure.
    expect(forward.listeners.every((l) => l.port === port)).toBe(true);
    expect(out[0]).toBe(`Forwarding from 127.0.0.1:${port} -> 80`);
    expect((await roundTrip(port, 'local')).toString()).toBe('local');
  });

  it('fails with the reason when a port cannot listen, leaving nothing listening', async () => {
    const taken = createTcpServer();
    await new Promise<void>((done) => taken.listen(0, '127.0.0.1', done));
    const port = (taken.address() as AddressInfo).port;
    const out: string[] = [];
    try {
      await expect(
        startPortForward(flags(), 'svc/echo', [':81', `${port}:80`], {
          out: (l) => out.push(l),
          err: () => {},
        }),
      ).rejects.toThrow(
        new RegExp(`cannot forward to port 80: listen EADDRINUSE: address already in use 127.0.0.1:${port}`),
      );
    } finally {
      await new Promise((done) => taken.close(done));
    }
    // The port that did listen listens no more.
    const opened = /^Forwarding from 127\.0\.0\.1:(\d+) -> 81$/.exec(out[0] ?? '');
    expect(opened).not.toBeNull();
    await expect(dial(Number(opened![1]))).rejects.toThrow(/ECONNREFUSED/);
  });

  it('closes open connections both ways and stops listening when closed', async () => {
    const { forward } = await forwarding('svc/echo', [':80']);
    const port = forward.listeners[0]!.port;
    const socket = await dial(port);
    socket.write('ping');
    await new Promise((done) => socket.once('data', done));
    const serverSide = [...upgraded].at(-1)!;
    const ended = new Promise((done) => socket.once('end', done));
    const cut = new Promise((done) => serverSide.once('close', done));
    await forward.close();
    await Promise.all([ended, cut]);
    socket.destroy();
    await expect(dial(port)).rejects.toThrow(/ECONNREFUSED/);
  });
});

describe('openReach', () => {
  it('gives up on a server that does not answer, and when cancelled', async () => {
    const access = await kubeconfigAccess(loadKubeConfig({ path: kubeconfig }));
    const agent = new Agent({ keepAlive: false });
    const target = {
      groupSuffix: 'sealion.dev',
      namespace: 'team',
      resource: 'pods' as const,
      name: 'silent',
      port: '80',
    };
    try {
      await expect(openReach(access, agent, target, { timeoutMs: 50 })).rejects.toThrow(
        'the server did not switch protocols within 0.05 s',
      );
      const cancel = new AbortController();
      const opening = openReach(access, agent, target, { signal: cancel.signal });
      cancel.abort();
      await expect(opening).rejects.toThrow('cancelled');
    } finally {
      agent.destroy();
    }
  });
});
