import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { once } from 'node:events';
import { connect, createServer, Socket, type AddressInfo, type Server } from 'node:net';
import { eventually } from '../../dev/eventually.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import type { CallAnswer } from '../http2/forward.ts';
import { newLogger } from '../log.ts';
import {
  addressProblem,
  newReacher,
  refused,
  type EndpointSliceObject,
  type PodObject,
  type ReacherDeps,
  type ReachFacts,
  type ReachReads,
  type ServiceObject,
} from './dialer.ts';
import { reachPath, type ReachTarget } from './target.ts';

const POD_IP = '10.244.1.7';
const NODE_IP = '192.168.50.2';
const APISERVER_IP = '192.168.50.1';

const runningPod = (more: Partial<PodObject> = {}): PodObject => ({
  metadata: { uid: 'u1' },
  spec: { containers: [{ ports: [{ name: 'echo', containerPort: 9000 }] }] },
  status: { phase: 'Running', podIPs: [{ ip: POD_IP }], hostIPs: [{ ip: NODE_IP }] },
  ...more,
});

const slice = (
  ip: string,
  targetRef?: { kind: string; name: string; uid?: string },
): EndpointSliceObject => ({
  addressType: 'IPv4',
  ports: [{ name: 'echo', port: 9000 }],
  endpoints: [{ addresses: [ip], conditions: { ready: true }, ...(targetRef ? { targetRef } : {}) }],
});

/** A cluster's objects as the dialer reads them: one pod `echo`, and Services by name. */
function reads(objects: {
  pods?: Record<string, PodObject>;
  services?: Record<string, ServiceObject>;
  slices?: Record<string, EndpointSliceObject[]>;
}): ReachReads {
  const pods: Record<string, PodObject> = { echo: runningPod(), ...objects.pods };
  const services: Record<string, ServiceObject> = {
    kubernetes: { spec: { clusterIPs: ['10.96.0.1'], ports: [{ port: 443 }] } },
    ...objects.services,
  };
  const slices: Record<string, EndpointSliceObject[]> = {
    kubernetes: [{ addressType: 'IPv4', endpoints: [{ addresses: [APISERVER_IP] }] }],
    ...objects.slices,
  };
  const missing = (what: string) => refused(404, `${what} not found`);
  return {
    pod: async (_ns, name) => pods[name] ?? Promise.reject(missing(`pods "${name}"`)),
    service: async (_ns, name) => services[name] ?? Promise.reject(missing(`services "${name}"`)),
    endpointSlices: async (_ns, name) => slices[name] ?? [],
  };
}

const allowed = (yes: boolean): CallAnswer => ({
  status: 201,
  body: Buffer.from(JSON.stringify({ status: { allowed: yes } })),
});

let echo: Server;
let echoPort: number;
/** What each dial asked for: the host and port the dialer chose. */
const dialed: string[] = [];
const open: Socket[] = [];

beforeAll(async () => {
  // Echoes, and ends its side once the client ended its own: a half-close passes through.
  echo = createServer({ allowHalfOpen: true }, (s) => s.pipe(s));
  echo.listen(0, '127.0.0.1');
  await once(echo, 'listening');
  echoPort = (echo.address() as AddressInfo).port;
});
afterAll(() => void echo.close());
afterEach(() => {
  for (const s of open.splice(0)) s.destroy();
  dialed.length = 0;
});

/** Serves one reach request with a reacher made of `deps` over a real socket pair; returns the client's end. */
async function reach(
  deps: Partial<ReacherDeps>,
  target: ReachTarget,
  headers: string[] = ['Impersonate-User', 'alice', 'Impersonate-Group', 'devs'],
): Promise<{ client: Socket; reacher: ReturnType<typeof newReacher>; close: () => void }> {
  const reacher = newReacher({
    reads: reads({}),
    review: async () => allowed(true),
    checkPolicy: false,
    log: newLogger({ level: 'silent' }),
    connect: (host, port) => {
      dialed.push(`${host}:${port}`);
      return connect({ host: '127.0.0.1', port: echoPort, allowHalfOpen: true });
    },
    ...deps,
  });
  const server = createServer({ allowHalfOpen: true }, (socket) => {
    open.push(socket);
    reacher.serve(
      { url: reachPath('sealion.dev', target), upgrade: 'tcp', rawImpersonation: headers },
      socket,
      Buffer.alloc(0),
    );
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const client = connect({
    port: (server.address() as AddressInfo).port,
    host: '127.0.0.1',
    allowHalfOpen: true,
  });
  open.push(client);
  return { client, reacher, close: () => server.close() };
}

/** A server whose every connection `reacher` serves as a request for `target` by alice; its port. */
async function serving(
  reacher: ReturnType<typeof newReacher>,
  target: ReachTarget,
  before: (socket: Socket) => void = () => {},
): Promise<{ port: number; server: Server }> {
  const server = createServer((socket) => {
    open.push(socket);
    before(socket);
    reacher.serve(
      {
        url: reachPath('sealion.dev', target),
        upgrade: 'tcp',
        rawImpersonation: ['Impersonate-User', 'alice'],
      },
      socket,
      Buffer.alloc(0),
    );
  }).listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { port: (server.address() as AddressInfo).port, server };
}

/** Everything the client reads until the other side ends. */
async function readAll(client: Socket): Promise<string> {
  const chunks: Buffer[] = [];
  client.on('data', (c: Buffer) => chunks.push(c));
  await once(client, 'end');
  return Buffer.concat(chunks).toString('utf8');
}

const pod = (name = 'echo', port: number | string = 9000): ReachTarget => ({
  namespace: 'demo',
  kind: 'pods',
  name,
  port,
});
const service = (name: string, port: number | string = 'echo'): ReachTarget => ({
  namespace: 'demo',
  kind: 'services',
  name,
  port,
});

describe('the reach dialer', () => {
  it('connects an allowed pod, and passes bytes and a half-close both ways', async () => {
    const { client, close } = await reach({}, pod('echo', 'echo'));
    client.write('hello');
    client.end();
    const answer = await readAll(client);
    expect(answer).toBe(
      'HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: tcp\r\n\r\nhello',
    );
    expect(dialed).toEqual([`${POD_IP}:9000`]);
    close();
  });

  it('asks the cluster as the impersonated user, and refuses with its answer', async () => {
    const asked: { body: unknown; headers: unknown }[] = [];
    const { client, close } = await reach(
      {
        review: async (body, headers) => {
          asked.push({ body: JSON.parse(body.toString('utf8')), headers });
          return allowed(false);
        },
      },
      service('web'),
    );
    const answer = await readAll(client);
    expect(answer).toMatch(/^HTTP\/1\.1 403/);
    expect(answer).toContain(
      'services \\"web:echo\\" is forbidden: User \\"alice\\" cannot create resource \\"services/proxy\\"',
    );
    expect(asked).toEqual([
      {
        body: expect.objectContaining({
          kind: 'SelfSubjectAccessReview',
          spec: {
            resourceAttributes: {
              verb: 'create',
              group: '',
              version: 'v1',
              resource: 'services',
              subresource: 'proxy',
              namespace: 'demo',
              name: 'web:echo',
            },
          },
        }),
        headers: { 'impersonate-user': 'alice', 'impersonate-group': 'devs' },
      },
    ]);
    expect(dialed).toEqual([]);
    close();
  });

  it('says so when the cluster refuses the impersonation itself', async () => {
    const { client, close } = await reach(
      {
        review: async () => ({
          status: 403,
          body: Buffer.from(
            JSON.stringify({ kind: 'Status', message: 'users "alice" is forbidden: cannot impersonate' }),
          ),
        }),
      },
      pod(),
    );
    expect(await readAll(client)).toContain("this cluster's policy for Sealion refuses acting as this user");
    close();
  });

  it('asks the forwarding policy first where it must (the agent)', async () => {
    const asked: string[] = [];
    const { client, close } = await reach(
      {
        checkPolicy: true,
        review: async (body, headers) => {
          const review = JSON.parse(body.toString('utf8')) as {
            spec: { resourceAttributes: { verb: string } };
          };
          asked.push(
            `${Object.keys(headers).length === 0 ? 'self' : 'user'} ${review.spec.resourceAttributes.verb}`,
          );
          return allowed(false);
        },
      },
      pod(),
    );
    const answer = await readAll(client);
    expect(answer).toContain(
      'policy for Sealion refuses this request: Sealion may not create pods/portforward there for users',
    );
    expect(asked).toEqual([
      'self impersonate-on:user-info:create',
      'self impersonate-on:user-info:create',
      'self impersonate',
    ]);
    close();
  });

  it.each([
    [
      "a pod on its node's network",
      { pods: { echo: runningPod({ spec: { hostNetwork: true } }) } },
      pod(),
      /node's network/,
    ],
    [
      "a pod whose address is its node's",
      {
        pods: {
          echo: runningPod({
            status: { phase: 'Running', podIPs: [{ ip: NODE_IP }], hostIPs: [{ ip: NODE_IP }] },
          }),
        },
      },
      pod(),
      /node's address/,
    ],
    [
      'a pod at a loopback address',
      { pods: { echo: runningPod({ status: { phase: 'Running', podIPs: [{ ip: '127.0.0.1' }] } }) } },
      pod(),
      /loopback/,
    ],
    [
      'an ExternalName Service',
      { services: { ext: { spec: { type: 'ExternalName' } } } },
      service('ext'),
      /ExternalName/,
    ],
    [
      'a Service endpoint that names no pod',
      {
        services: { bare: { spec: { ports: [{ name: 'echo', port: 9000 }] } } },
        slices: { bare: [slice(NODE_IP)] },
      },
      service('bare'),
      /no ready pod/,
    ],
    [
      "a Service endpoint that is not its pod's address",
      {
        services: { lie: { spec: { ports: [{ name: 'echo', port: 9000 }] } } },
        slices: { lie: [slice('10.244.9.9', { kind: 'Pod', name: 'echo', uid: 'u1' })] },
      },
      service('lie'),
      /10\.244\.9\.9 is not its address/,
    ],
    [
      "a Service endpoint at the API server's address",
      {
        services: { api: { spec: { ports: [{ name: 'echo', port: 9000 }] } } },
        pods: { echo: runningPod({ status: { phase: 'Running', podIPs: [{ ip: APISERVER_IP }] } }) },
        slices: { api: [slice(APISERVER_IP, { kind: 'Pod', name: 'echo', uid: 'u1' })] },
      },
      service('api'),
      /the API server's address/,
    ],
    [
      'a port the Service does not have',
      { services: { web: { spec: { ports: [{ port: 80 }] } } } },
      service('web', 81),
      /no TCP port 81/,
    ],
  ])('refuses %s, dialing nothing', async (_what, objects, target, message) => {
    const { client, close } = await reach({ reads: reads(objects) }, target);
    const answer = await readAll(client);
    expect(answer).not.toMatch(/^HTTP\/1\.1 101/);
    expect(answer).toMatch(message);
    expect(dialed).toEqual([]);
    close();
  });

  it("dials a Service's endpoint, checked against its pod", async () => {
    const { client, close } = await reach(
      {
        reads: reads({
          services: { web: { spec: { ports: [{ name: 'echo', port: 80 }] } } },
          slices: { web: [slice(POD_IP, { kind: 'Pod', name: 'echo', uid: 'u1' })] },
        }),
      },
      service('web', 80),
    );
    client.end('x');
    expect(await readAll(client)).toMatch(/101 Switching Protocols[\s\S]*x$/);
    expect(dialed).toEqual([`${POD_IP}:9000`]);
    close();
  });

  it('refuses a request that names no user, and a user over their share', async () => {
    const nobody = await reach({}, pod(), []);
    expect(await readAll(nobody.client)).toMatch(/^HTTP\/1\.1 403[\s\S]*must name the one user/);
    nobody.close();

    const first = await reach({ limits: { perUser: 1 } }, pod());
    await once(first.client, 'data');
    // The same reacher, the same user, a second connection.
    const { port, server } = await serving(first.reacher, pod());
    const second = connect({ port, host: '127.0.0.1' });
    open.push(second);
    expect(await readAll(second)).toMatch(/^HTTP\/1\.1 429/);
    expect(first.reacher.open()).toBe(1);
    server.close();
    first.close();
  });
});

describe('connections that end', () => {
  it('closes a refused connection once its Status is written, though the client keeps its side open', async () => {
    const { client, reacher, close } = await reach({ review: async () => allowed(false) }, pod());
    client.on('data', () => undefined);
    // The client reads the Status and never ends its side; the dialer's side closes anyway, so it holds no place.
    await once(client, 'end');
    while (reacher.open() > 0) await new Promise((r) => setTimeout(r, 10));
    expect(client.destroyed).toBe(false);
    close();
  });

  it('takes no place for a client that left before its turn', async () => {
    const reacher = newReacher({
      reads: reads({}),
      review: async () => allowed(true),
      checkPolicy: false,
      log: newLogger({ level: 'silent' }),
    });
    const { port, server } = await serving(reacher, pod(), (socket) => socket.destroy());
    const client = connect({ port, host: '127.0.0.1' });
    client.on('error', () => undefined);
    await once(client, 'close');
    expect(reacher.open()).toBe(0);
    server.close();
  });

  it('closes a connection that carries no byte either way for the idle time, and says what it carried', async () => {
    const clock = fakeClock();
    const ended: ReachFacts[] = [];
    const { client, reacher, close } = await reach(
      { clock, limits: { idleMs: 60_000 }, ended: (facts) => ended.push(facts) },
      pod('echo', 'echo'),
    );
    const answer = readAll(client);
    client.write('hello');
    await eventually(() => expect(reacher.open()).toBe(1));
    await eventually(() => expect(clock.pending()).toContain(60_000));
    clock.advance(60_000);
    expect(await answer).toMatch(/\r\n\r\nhello$/);
    await eventually(() => expect(ended).toHaveLength(1));
    expect(ended[0]).toMatchObject({
      user: 'alice',
      endpoint: `${POD_IP}:9000`,
      sent: 5,
      received: 5,
      ms: 60_000,
    });
    expect(reacher.open()).toBe(0);
    close();
  });

  it('refuses with 504 a target that does not accept within the time to connect', async () => {
    const clock = fakeClock();
    const { client, close } = await reach(
      // A socket that is never connected: it neither connects nor fails.
      { clock, limits: { connectMs: 10_000 }, connect: () => new Socket() },
      pod('echo', 'echo'),
    );
    const answer = readAll(client);
    await eventually(() => expect(clock.pending()).toContain(10_000));
    clock.advance(10_000);
    expect(await answer).toMatch(/^HTTP\/1\.1 504 [^]*did not accept within 10000 ms/);
    close();
  });

  it("compares the API server's addresses as addresses, whatever their spelling", async () => {
    const { client, close } = await reach(
      {
        reads: reads({
          pods: { echo: runningPod({ status: { phase: 'Running', podIPs: [{ ip: 'fd00:10::1' }] } }) },
          services: { kubernetes: { spec: { clusterIPs: ['fd00:0010:0:0::1'] } } },
        }),
      },
      pod(),
    );
    expect(await readAll(client)).toMatch(/the API server's address/);
    close();
  });
});

describe('addresses never dialed', () => {
  it.each([
    ['127.0.0.1', true],
    ['::1', true],
    ['::ffff:127.0.0.1', true],
    ['169.254.169.254', true],
    ['fe80::1', true],
    ['0.0.0.0', true],
    ['224.0.0.1', true],
    ['::ffff:a00:1', true],
    ['64:ff9b::a00:1', true],
    ['::10.0.0.1', true],
    ['2002:a00:1::1', true],
    ['100.100.100.200', true],
    ['fd00:ec2::254', true],
    ['10.244.0.5', false],
    ['fd00::5', false],
    ['not-an-ip', true],
  ])('%s', (ip, never) => {
    expect(addressProblem(ip) !== undefined).toBe(never);
  });
});
