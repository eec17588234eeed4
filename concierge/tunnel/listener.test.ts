// The tunnel listener on real sockets, with the registry, the bootstrap tokens and the CA Secret in memory: its TLS
// (the proxy's AEAD suites, no renegotiation), registration (one answer for every failure, a bounded rate) and the
// binding of agent certificates to one Cluster object and its agentGeneration.
import { TUNNEL_CA_SECRET } from '../../apis/install.ts';
import { afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { randomUUID, X509Certificate } from 'node:crypto';
import { connect as netConnect, type Socket } from 'node:net';
import { request as httpsRequest } from 'node:https';
import { connect, type ConnectionOptions, type TLSSocket } from 'node:tls';
import type { Duplex } from 'node:stream';
import {
  dialDirect,
  DialRefused,
  dialWebSocket,
  directNotPassed,
  DRAINING_HEADER,
  ProtocolSkew,
  ReplicaDraining,
  tlsContext,
  type TunnelTransport,
} from '../../lib/tunnel/dial.ts';
import type { ServerHttp2Stream } from 'node:http2';
import type { Cluster } from '../../apis/tunnel.ts';
import { postRegister, type RegisterAnswer } from '../../dev/register.ts';
import { rsaCertificate, signWithRSAAnyway } from '../../dev/hostile-tls.ts';
import { eventually } from '../../dev/eventually.ts';
import { fakeBootstrapToken, memoryTokenStore } from '../../test-support/fake-bootstrap-tokens.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import { statusBody } from '../../lib/kube/status.ts';
import type { KubeClients } from '../../lib/kube/kube.ts';
import type { Clock } from '../../lib/clock.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { silentLogger } from '../../lib/log.ts';
import { certificateURIs, issueCert, newCA, newCSR, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { CURRENT_PROTOCOL } from '../../lib/tunnel/protocol.ts';
import {
  MOVE_REASON,
  serveTunnel,
  TUNNEL_PROTOCOL_HEADER,
  TUNNEL_VERSION,
  TUNNEL_VERSION_HEADER,
  TUNNEL_UPGRADE,
} from '../../lib/tunnel/tunnel.ts';
import { bindingURI } from '../../apis/agent-binding.ts';
import { HANDOVER_BOUND_MS } from './held-tunnels.ts';
import {
  HANDSHAKE_SWEEP_MS,
  handshakeSweep,
  MAX_HANDSHAKES,
  startTunnelListener,
  type TunnelListener,
} from './listener.ts';
import { DEFAULT_REGISTRATION_LIMITS, type RateLimitOptions } from './rate-limit.ts';

const NAME = 'edge';

const clusterObject = (uid: string, agentGeneration?: number): Cluster => ({
  apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
  kind: 'Cluster',
  metadata: { name: NAME, uid },
  spec: agentGeneration === undefined ? {} : { agentGeneration },
});

let ca: CertificateAuthority;
let clusters: MemoryInformer<Cluster>;
let tokens: ReturnType<typeof memoryTokenStore>;
let listener: TunnelListener;
/** What the listener said it refused for the tunnel protocol, as `cluster: problem`. */
let protocolRefusals: string[] = [];
/** What a handover did, in order, as the test sees it: `withdrawn` when the listener withdrew the replica's facts. */
let handOverSteps: string[] = [];

beforeAll(async () => {
  ca = await newCA('test tunnel CA');
});

/** Starts the listener under test, with the default registration limits and the system clock unless told otherwise. */
async function start(
  registrationLimits: RateLimitOptions = DEFAULT_REGISTRATION_LIMITS,
  clock?: Clock,
  port = 0,
): Promise<void> {
  clusters = new MemoryInformer<Cluster>();
  tokens = memoryTokenStore();
  // Only the CA Secret is read from the API server on start; nothing else here reaches it.
  const clients = {
    core: {
      readNamespacedSecret: ({ name }: { name: string }) => {
        if (name !== TUNNEL_CA_SECRET) throw new Error(`unexpected read of Secret ${name}`);
        return Promise.resolve({
          data: {
            'tls.crt': Buffer.from(ca.certPem).toString('base64'),
            'tls.key': Buffer.from(ca.keyPem).toString('base64'),
          },
        });
      },
    },
  } as unknown as KubeClients;
  listener = await startTunnelListener({
    clients,
    namespace: 'sealion',
    host: '127.0.0.1',
    port,
    hosts: ['127.0.0.1'],
    clusters,
    bootstrapTokens: tokens,
    registrationLimits,
    readCluster: (name) => Promise.resolve(clusters.get(name)),
    onTunnelChange: () => {},
    onProtocolRefused: (cluster, problem) => protocolRefusals.push(`${cluster}: ${problem}`),
    withdraw: () => {
      handOverSteps.push('withdrawn');
      return Promise.resolve();
    },
    identity: 'replica-under-test',
    log: silentLogger(),
    ...(clock ? { clock } : {}),
  });
}

beforeEach(() => start());

afterEach(async () => {
  await listener.stop();
});

/** Handshakes with the listener; resolves with the open socket or rejects with the handshake's error. */
const handshake = (options: ConnectionOptions): Promise<TLSSocket> =>
  new Promise((done, fail) => {
    const socket = connect({ host: '127.0.0.1', port: listener.port, ca: ca.certPem, ...options });
    socket.once('secureConnect', () => done(socket));
    socket.once('error', fail);
  });

describe('the tunnel listener’s port', () => {
  it('fails to start, with EADDRINUSE, on a port another server holds, and starts on it once it is free', async () => {
    const taken = listener.port;
    const running = listener;
    await expect(start(DEFAULT_REGISTRATION_LIMITS, undefined, taken)).rejects.toMatchObject({
      code: 'EADDRINUSE',
    });
    await running.stop();
    await start(DEFAULT_REGISTRATION_LIMITS, undefined, taken);
    expect(listener.port).toBe(taken);
  });
});

describe('the tunnel listener’s TLS', () => {
  it('holds connections beyond MAX_HANDSHAKES in progress unread, and starts them as those finish', async () => {
    // Connections that never send a ClientHello: each is a handshake in progress until it closes.
    const open = async (): Promise<Socket> => {
      const socket = netConnect(listener.port, '127.0.0.1');
      await new Promise((done) => socket.once('connect', done));
      return socket;
    };
    const stalled = await Promise.all(Array.from({ length: MAX_HANDSHAKES }, open));
    let secure = false;
    const waiting = handshake({}).then((socket) => {
      secure = true;
      return socket;
    });
    // Nothing can start it while every slot is taken: this wait only gives a wrong queue the chance to.
    await new Promise((r) => setTimeout(r, 300));
    expect(secure).toBe(false);

    stalled[0]!.destroy();
    (await waiting).destroy();
    stalled.forEach((socket) => socket.destroy());
  });

  it('closes a connection that waited for a handshake slot longer than its clock allows', async () => {
    await listener.stop();
    const clock = fakeClock();
    await start(DEFAULT_REGISTRATION_LIMITS, clock);
    const open = async (): Promise<Socket> => {
      const socket = netConnect(listener.port, '127.0.0.1');
      socket.on('error', () => {});
      await new Promise((done) => socket.once('connect', done));
      return socket;
    };
    const stalled = await Promise.all(Array.from({ length: MAX_HANDSHAKES }, open));
    const waiting = await open();
    let closed = false;
    waiting.once('close', () => (closed = true));
    // Eight seconds is the longest a connection waits; the sweep after that (which the concierge's manager runs
    // every HANDSHAKE_SWEEP_MS) closes it though no slot freed. The clock moves on until then, since the listener
    // may take the connection a moment after it connected here.
    await eventually(() => {
      clock.advance(9_000);
      listener.sweep();
      expect(closed).toBe(true);
    });
    stalled.forEach((socket) => socket.destroy());
  });

  it('speaks TLS 1.2 with an AEAD suite', async () => {
    const socket = await handshake({ maxVersion: 'TLSv1.2', ciphers: 'ECDHE-ECDSA-AES128-GCM-SHA256' });
    expect(socket.getCipher().name).toBe('ECDHE-ECDSA-AES128-GCM-SHA256');
    socket.destroy();
  });

  it('refuses a client that offers only a CBC suite with SHA-1', async () => {
    await expect(
      handshake({ maxVersion: 'TLSv1.2', ciphers: 'ECDHE-ECDSA-AES128-SHA' }).then((s) => s.destroy()),
    ).rejects.toThrow();
  });

  it('refuses an RSA client signature for its kind, before checking it (agents’ keys are P-256)', async () => {
    const rsa = await rsaCertificate(ca, NAME, 'client');
    // A listener that checked it would answer decrypt_error: the signature cannot verify (dev/hostile-tls.ts).
    expect(await signWithRSAAnyway(listener.port, rsa)).toBe('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE');
  });

  it('refuses renegotiation', async () => {
    // TLS 1.3 has no renegotiation to refuse.
    const socket = await handshake({ maxVersion: 'TLSv1.2' });
    // Flowing, so the client sees the server hang up.
    socket.resume();
    const outcome = await new Promise<Error | null>((done) => {
      socket.once('error', done);
      socket.once('close', () => done(new Error('closed')));
      socket.renegotiate({ rejectUnauthorized: true }, (err) => done(err ?? null));
    });
    socket.destroy();
    expect(outcome).toBeInstanceOf(Error);
  });
});

/** POST /register with `body` (JSON unless a string); the answer's status, Retry-After and body. */
const register = (body: object | string): Promise<RegisterAnswer> =>
  postRegister(listener.port, ca.certPem, body);

describe('registration', () => {
  it('answers an unknown cluster, an unknown token id, a wrong secret and a malformed token alike, asking the API server nothing', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const real = await fakeBootstrapToken(NAME);
    tokens.put(real.secret);
    const { csrPem } = await newCSR(NAME);
    const id = real.token.split('.')[0]!;
    const attempts: object[] = [
      { cluster: 'nobody-has-this', token: 'abcdefgh.whatever', csr: csrPem },
      { cluster: NAME, token: 'abcdefgh.whatever', csr: csrPem },
      { cluster: 'nobody-has-this', token: `${id}.wrong`, csr: csrPem },
      { cluster: NAME, token: `${id}.wrong`, csr: csrPem },
      { cluster: NAME, token: 'not a token', csr: csrPem },
      { cluster: NAME, csr: csrPem },
    ];
    for (const attempt of attempts) {
      const gets = tokens.gets;
      expect(await register(attempt)).toEqual({ status: 401, body: statusBody(401, 'Unauthorized') });
      // The same work for each, known cluster or not: one look in the cache, then the one comparison.
      expect(tokens.gets - gets).toBe(1);
    }
    expect(tokens.burns).toEqual([]);
    // The real token was not spent by any of that.
    const registered = await register({ cluster: NAME, token: real.token, csr: csrPem });
    expect(registered.status).toBe(200);
    const { certificate } = JSON.parse(registered.body) as { certificate: string };
    expect(certificateURIs(new X509Certificate(certificate).raw)).toEqual([
      bindingURI({ cluster: NAME, uid, generation: 0 }),
    ]);
    expect(tokens.burns).toEqual([real.secret.metadata!.name]);
    // Once: burned, it is gone.
    expect((await register({ cluster: NAME, token: real.token, csr: csrPem })).status).toBe(401);
  });

  it('refuses a stranger beyond their share with 429, Retry-After and a Status, before reading the request', async () => {
    await listener.stop();
    // No refill to speak of during the test: the burst is all there is.
    await start({ ...DEFAULT_REGISTRATION_LIMITS, perAddressBurst: 3, perAddressPerSecond: 0.001 });
    const answers = await Promise.all(
      Array.from({ length: 20 }, () => register({ cluster: NAME, token: 'abcdefgh.whatever' })),
    );
    expect(answers.filter((a) => a.status === 401)).toHaveLength(3);
    const refused = answers.filter((a) => a.status === 429);
    expect(refused).toHaveLength(17);
    for (const answer of refused) {
      expect(Number(answer.retryAfter)).toBeGreaterThanOrEqual(1);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 429, reason: 'TooManyRequests' });
    }
    // Only the three admitted ones were looked up.
    expect(tokens.gets).toBe(3);
  });

  it('bounds all strangers together', async () => {
    await listener.stop();
    await start({ ...DEFAULT_REGISTRATION_LIMITS, overallBurst: 4, overallPerSecond: 0.001 });
    const answers = await Promise.all(
      Array.from({ length: 10 }, () => register({ cluster: NAME, token: 'abcdefgh.whatever' })),
    );
    expect(answers.map((a) => a.status).sort()).toEqual([401, 401, 401, 401, 429, 429, 429, 429, 429, 429]);
  });
});

/** A client certificate from the tunnel CA, bound as given (or not at all: only a CN, as before bindings). */
async function agentCert(binding?: {
  uid: string;
  generation: number;
}): Promise<{ cert: string; key: string }> {
  const issued = await issueCert(ca, {
    commonName: NAME,
    usage: 'client',
    ...(binding ? { uris: [bindingURI({ cluster: NAME, ...binding })] } : {}),
  });
  return { cert: issued.certPem, key: issued.keyPem };
}

/** Dials /connect over `transport`; resolves with the tunnel's stream, or with the HTTP status of the refusal. */
const dial = async (
  transport: TunnelTransport,
  client: { cert: string; key: string },
): Promise<Duplex | number> => {
  const hub = new URL(`https://127.0.0.1:${listener.port}`);
  const options = { hub, tls: tlsContext(ca.certPem, client.cert, client.key), version: 'test' };
  try {
    return (await (transport === 'direct' ? dialDirect : dialWebSocket)(options).done).stream;
  } catch (err) {
    if (err instanceof DialRefused) return err.status;
    throw err;
  }
};

/** Resolves once the listener has dropped the cluster's tunnel (it notices the close a moment after the agent). */
async function forgotten(): Promise<void> {
  while (listener.route(NAME)) await new Promise((r) => setTimeout(r, 10));
}

describe.each(['direct', 'websocket'] as const)('agent certificates bound to a Cluster (%s)', (transport) => {
  it('admits the certificate of the current Cluster and generation, and closes its tunnel when either changes', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const stream = await dial(transport, await agentCert({ uid, generation: 0 }));
    if (typeof stream === 'number') throw new Error(`refused: ${stream}`);
    const agentEnd = serveTunnel(stream, { connect: (s) => s.destroy() });
    await eventually(() => expect(listener.route(NAME)).toBeDefined());

    // A change that keeps the binding (a new description) keeps the tunnel.
    clusters.put({ ...clusterObject(uid), spec: { description: 'renamed' } });
    expect(listener.route(NAME)).toBeDefined();

    clusters.put(clusterObject(uid, 1));
    await agentEnd.closed;
    await forgotten();
  });

  it('refuses a certificate of an earlier Cluster of the same name, of an earlier generation, or without binding', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid, 2));
    expect(await dial(transport, await agentCert({ uid: randomUUID(), generation: 2 }))).toBe(401);
    expect(await dial(transport, await agentCert({ uid, generation: 1 }))).toBe(401);
    expect(await dial(transport, await agentCert())).toBe(401);
  });

  it('closes the tunnel when the Cluster is deleted and created again under its name', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const stream = await dial(transport, await agentCert({ uid, generation: 0 }));
    if (typeof stream === 'number') throw new Error(`refused: ${stream}`);
    const agentEnd = serveTunnel(stream, { connect: (s) => s.destroy() });
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    clusters.put(clusterObject(randomUUID()));
    await agentEnd.closed;
    await forgotten();
  });
});

describe('a tunnel’s certificate', () => {
  it('closes the tunnel when it expires by the listener’s clock', async () => {
    await listener.stop();
    const clock = fakeClock();
    clock.advance(Date.now());
    await start(DEFAULT_REGISTRATION_LIMITS, clock);
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const issued = await issueCert(ca, {
      commonName: NAME,
      usage: 'client',
      uris: [bindingURI({ cluster: NAME, uid, generation: 0 })],
      validityMs: 3_600_000,
    });
    const stream = await dial('direct', { cert: issued.certPem, key: issued.keyPem });
    if (typeof stream === 'number') throw new Error(`refused: ${stream}`);
    const agentEnd = serveTunnel(stream, { connect: (s) => s.destroy() });
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    // Certificates count whole seconds: a minute past the hour is past its end, whatever the rounding.
    clock.advance(3_660_000);
    await agentEnd.closed;
    await forgotten();
  });
});

describe.each(['direct', 'websocket'] as const)('agents holding several tunnels (%s)', (transport) => {
  it('are told which replica took a tunnel, and refused (409) by a replica they already hold one on', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const client = await agentCert({ uid, generation: 0 });
    const hub = new URL(`https://127.0.0.1:${listener.port}`);
    const tls = tlsContext(ca.certPem, client.cert, client.key);
    const open = (avoid: string[]) =>
      (transport === 'direct' ? dialDirect : dialWebSocket)({ hub, tls, version: 'test', avoid }).done;
    const dialed = await open(['another-replica']);
    expect(dialed.replica).toBe('replica-under-test');
    const agentEnd = serveTunnel(dialed.stream, { connect: (s) => s.destroy() });
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const refusal = await open(['another-replica', 'replica-under-test']).catch((err: unknown) => err);
    expect(refusal).toBeInstanceOf(DialRefused);
    expect((refusal as DialRefused).status).toBe(409);
    // The tunnel it holds is untouched by the refused dial.
    expect(listener.route(NAME)).toBeDefined();
    agentEnd.close();
    await forgotten();
  });
});

/** An upgrade to /connect stating `protocol` (none when undefined): the answer's status, protocol and body. */
function rawConnect(
  client: { cert: string; key: string },
  protocol: string | undefined,
  /** The whole version, as agents of 2.1 on send it beside the major. */
  version?: string,
): Promise<{ status: number; hubProtocol: unknown; body: string }> {
  return new Promise((done, fail) => {
    const req = httpsRequest({
      host: '127.0.0.1',
      port: listener.port,
      path: '/connect',
      ca: ca.certPem,
      cert: client.cert,
      key: client.key,
      headers: {
        connection: 'Upgrade',
        upgrade: TUNNEL_UPGRADE,
        ...(protocol === undefined ? {} : { [TUNNEL_PROTOCOL_HEADER]: protocol }),
        ...(version === undefined ? {} : { [TUNNEL_VERSION_HEADER]: version }),
      },
    });
    req.once('upgrade', (res, socket: Socket) => {
      socket.destroy();
      done({ status: 101, hubProtocol: res.headers[TUNNEL_VERSION_HEADER], body: '' });
    });
    req.once('response', (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () =>
        done({ status: res.statusCode ?? 0, hubProtocol: res.headers[TUNNEL_VERSION_HEADER], body }),
      );
    });
    req.once('error', fail);
    req.end();
  });
}

describe('agents outside the tunnel protocol’s skew policy', () => {
  it.each([
    // What an agent of the first protocol sent: the upgrade without the protocol's version.
    [undefined, 'upgrade the agent'],
    ['1.9', 'upgrade the agent'],
    ['3.0', 'upgrade the hub'],
    [`${CURRENT_PROTOCOL.major}.${CURRENT_PROTOCOL.minor + 2}`, 'upgrade the hub'],
    ['two', 'does not parse'],
  ])(
    'stating %j are told why, with 426, a Status and the hub’s protocol, and hold no tunnel',
    async (protocol, why) => {
      const uid = randomUUID();
      clusters.put(clusterObject(uid));
      protocolRefusals = [];
      const answer = await rawConnect(await agentCert({ uid, generation: 0 }), protocol);
      expect(answer.status).toBe(426);
      expect(answer.hubProtocol).toBe(TUNNEL_VERSION);
      const status = JSON.parse(answer.body) as { kind: string; code: number; message: string };
      expect(status).toMatchObject({ kind: 'Status', code: 426 });
      expect(status.message).toContain(why);
      expect(listener.route(NAME)).toBeUndefined();
      // Said for the Cluster's status, with the reason the agent was answered.
      expect(protocolRefusals).toEqual([`${NAME}: ${status.message}`]);
    },
  );

  it('are judged by the whole version where they send it, beside the major that hubs of 2.0 read', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const answer = await rawConnect(await agentCert({ uid, generation: 0 }), '2', '2.3');
    expect(answer.status).toBe(426);
    expect(answer.body).toContain('upgrade the hub');
  });

  it('are not taken for a proxy that does not pass the direct upgrade: the agent does not fall back', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const client = await agentCert({ uid, generation: 0 });
    const hub = new URL(`https://127.0.0.1:${listener.port}`);
    const tls = tlsContext(ca.certPem, client.cert, client.key);
    const refusal = await dialDirect({
      hub,
      tls,
      version: 'test',
      protocol: { major: 3, minor: 0 },
    }).done.catch((err: unknown) => err);
    expect(refusal).toBeInstanceOf(ProtocolSkew);
    expect((refusal as Error).message).toContain('upgrade the hub');
    expect(directNotPassed(refusal)).toBe(false);
  });
});

describe.each(['direct', 'websocket'] as const)('agents within the skew policy (%s)', (transport) => {
  it.each([
    { major: CURRENT_PROTOCOL.major, minor: CURRENT_PROTOCOL.minor - 1 },
    CURRENT_PROTOCOL,
    { major: CURRENT_PROTOCOL.major, minor: CURRENT_PROTOCOL.minor + 1 },
  ])('stating %j hold a tunnel, and are told the hub’s protocol', async (protocol) => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const client = await agentCert({ uid, generation: 0 });
    const hub = new URL(`https://127.0.0.1:${listener.port}`);
    const tls = tlsContext(ca.certPem, client.cert, client.key);
    const dialed = await (transport === 'direct' ? dialDirect : dialWebSocket)({
      hub,
      tls,
      version: 'test',
      protocol,
    }).done;
    const agentEnd = serveTunnel(dialed.stream, { connect: (s) => s.destroy() });
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    agentEnd.close();
    await forgotten();
  });
});

it('serves agents from before protocols had a minor, which state `2`, and states its own in the switch', async () => {
  const uid = randomUUID();
  clusters.put(clusterObject(uid));
  const answer = await rawConnect(await agentCert({ uid, generation: 0 }), '2');
  expect(answer).toMatchObject({ status: 101, hubProtocol: TUNNEL_VERSION });
  await forgotten();
});

/**
 * An agent's end of a tunnel that holds each plain request until the test answers it: `held` resolves with the
 * first one's stream.
 */
function holdingAgent(stream: Duplex): {
  end: ReturnType<typeof serveTunnel>;
  held: Promise<ServerHttp2Stream>;
} {
  let hold: (s: ServerHttp2Stream) => void = () => {};
  const held = new Promise<ServerHttp2Stream>((done) => (hold = done));
  const end = serveTunnel(stream, { connect: (s) => s.destroy(), request: (s) => hold(s) });
  return { end, held };
}

/** A request of the concierge's own through the cluster's tunnel here, in flight until the agent answers. */
function inFlight(): Promise<{ status: number; body: string }> {
  const route = listener.route(NAME);
  if (!route) throw new Error('no tunnel');
  return route
    .call({ method: 'GET', path: '/in-flight', body: Buffer.alloc(0), user: 'alice' })
    .then((a) => ({ status: a.status, body: a.body.toString() }));
}

describe.each(['direct', 'websocket'] as const)('a replica that hands its tunnels over (%s)', (transport) => {
  it('refuses new dials as draining, withdraws its facts, asks its agent to move and lets the request in flight end', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    handOverSteps = [];
    const client = await agentCert({ uid, generation: 0 });
    const stream = await dial(transport, client);
    if (typeof stream === 'number') throw new Error(`refused: ${stream}`);
    const agent = holdingAgent(stream);
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const answer = inFlight();
    const request = await agent.held;

    const handingOver = listener.handOver();
    const reason = await agent.end.moveRequested;
    handOverSteps.push('asked to move');
    expect(reason).toBe(MOVE_REASON);
    expect(handOverSteps).toEqual(['withdrawn', 'asked to move']);
    // No new request takes the moving tunnel; a new dial is told the replica drains, not refused for its certificate.
    expect(listener.route(NAME)).toBeUndefined();
    const hub = new URL(`https://127.0.0.1:${listener.port}`);
    const refusal = await (transport === 'direct' ? dialDirect : dialWebSocket)({
      hub,
      tls: tlsContext(ca.certPem, client.cert, client.key),
      version: 'test',
    }).done.catch((err: unknown) => err);
    expect(refusal).toBeInstanceOf(ReplicaDraining);
    expect(refusal).toMatchObject({ status: 503, replica: 'replica-under-test' });
    expect(directNotPassed(refusal)).toBe(false);

    // The request in flight is not cut by the move; the tunnel closes once it has ended, and the handover with it.
    request.respond({ ':status': 200 });
    request.end('answered after the move');
    expect(await answer).toEqual({ status: 200, body: 'answered after the move' });
    await agent.end.closed;
    expect(await handingOver).toBe(1);
    await forgotten();
  });
});

describe.each(['direct', 'websocket'] as const)('an agent that leaves (%s)', (transport) => {
  const tunnelOf = async (uid: string): Promise<ReturnType<typeof holdingAgent>> => {
    const stream = await dial(transport, await agentCert({ uid, generation: 0 }));
    if (typeof stream === 'number') throw new Error(`refused: ${stream}`);
    return holdingAgent(stream);
  };

  it('takes its tunnel out of service here, says it no longer holds the cluster, and lets the request in flight end', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const agent = await tunnelOf(uid);
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const answer = inFlight();
    const request = await agent.held;
    agent.end.leave();
    await eventually(() => expect(listener.route(NAME)).toBeUndefined());
    expect(listener.held(NAME)).toBeUndefined();
    request.respond({ ':status': 200 });
    request.end('answered after it left');
    expect(await answer).toEqual({ status: 200, body: 'answered after it left' });
    await agent.end.closed;
  });

  it('replaced by another tunnel of the cluster (its new pod), carries its request in flight to the end, then closes', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const old = await tunnelOf(uid);
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const answer = inFlight();
    const request = await old.held;
    const first = listener.held(NAME);
    const replacement = await tunnelOf(uid);
    await eventually(() => expect(listener.held(NAME)).not.toBe(first));
    let moveAsked = false;
    void old.end.moveRequested.then(() => (moveAsked = true));
    request.respond({ ':status': 200 });
    request.end('answered on the replaced tunnel');
    expect(await answer).toEqual({ status: 200, body: 'answered on the replaced tunnel' });
    await old.end.closed;
    expect(moveAsked).toBe(false);
    // New requests take the new tunnel.
    const next = inFlight();
    const nextRequest = await replacement.held;
    nextRequest.respond({ ':status': 200 });
    nextRequest.end('on the new one');
    expect(await next).toEqual({ status: 200, body: 'on the new one' });
    replacement.end.close();
  });

  it('replaced, and still carrying a request, is closed with the new one when the agent is revoked', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const old = await tunnelOf(uid);
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const answer = inFlight().catch((err: unknown) => err);
    await old.held;
    const first = listener.held(NAME);
    const replacement = await tunnelOf(uid);
    await eventually(() => expect(listener.held(NAME)).not.toBe(first));
    clusters.put(clusterObject(uid, 1));
    await Promise.all([old.end.closed, replacement.end.closed]);
    expect(await answer).toBeInstanceOf(Error);
  });
});

/** An upgrade as agents of 2.0 sent it (the major alone, no whole version): the tunnel's socket. */
function dialAsAgentOf20(client: { cert: string; key: string }): Promise<Duplex> {
  return new Promise((done, fail) => {
    const req = httpsRequest({
      host: '127.0.0.1',
      port: listener.port,
      path: '/connect',
      ca: ca.certPem,
      cert: client.cert,
      key: client.key,
      headers: { connection: 'Upgrade', upgrade: TUNNEL_UPGRADE, [TUNNEL_PROTOCOL_HEADER]: '2' },
    });
    req.once('upgrade', (_res, socket: Socket, head: Buffer) => {
      if (head.length > 0) socket.unshift(head);
      done(socket);
    });
    req.once('response', (res) => fail(new Error(`refused: ${res.statusCode}`)));
    req.once('error', fail);
    req.end();
  });
}

describe('an agent of 2.0, which knows nothing of moving', () => {
  it('moves all the same: its tunnel closes once the request in flight has ended, and the handover resolves', async () => {
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const agent = holdingAgent(await dialAsAgentOf20(await agentCert({ uid, generation: 0 })));
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const answer = inFlight();
    const request = await agent.held;
    const handingOver = listener.handOver();
    await eventually(() => expect(listener.route(NAME)).toBeUndefined());
    // Its HTTP/2 ends the tunnel after the GOAWAY by itself, once the stream in flight is done: an agent of 2.0 then
    // dials again, as after any closed tunnel, and another replica takes it.
    request.respond({ ':status': 200 });
    request.end('done');
    expect(await answer).toEqual({ status: 200, body: 'done' });
    await agent.end.closed;
    await handingOver;
  });
});

describe('a handover with nothing left to wait for', () => {
  it('resolves at its bound while a stream stays open, and cuts nothing: stop() closes what is left', async () => {
    await listener.stop();
    const clock = fakeClock();
    clock.advance(Date.now());
    await start(DEFAULT_REGISTRATION_LIMITS, clock);
    const uid = randomUUID();
    clusters.put(clusterObject(uid));
    const stream = await dial('direct', await agentCert({ uid, generation: 0 }));
    if (typeof stream === 'number') throw new Error(`refused: ${stream}`);
    const agent = holdingAgent(stream);
    await eventually(() => expect(listener.route(NAME)).toBeDefined());
    const answer = inFlight().catch((err: unknown) => err);
    await agent.held;
    const handingOver = listener.handOver();
    await agent.end.moveRequested;
    let done = false;
    void handingOver.then(() => (done = true));
    clock.advance(HANDOVER_BOUND_MS);
    await handingOver;
    expect(done).toBe(true);
    // Still up: the request in flight was not cut by the bound.
    expect(await Promise.race([answer, Promise.resolve('pending')])).toBe('pending');
    await listener.stop();
    await agent.end.closed;
    await answer;
  });
});

it('names the draining replica in a header of the refusal, with Retry-After and a Status', async () => {
  const uid = randomUUID();
  clusters.put(clusterObject(uid));
  await listener.handOver();
  const answer = await new Promise<{ status: number; headers: Record<string, unknown>; body: string }>(
    (done, fail) => {
      void agentCert({ uid, generation: 0 }).then((client) => {
        const req = httpsRequest({
          host: '127.0.0.1',
          port: listener.port,
          path: '/connect',
          ca: ca.certPem,
          cert: client.cert,
          key: client.key,
          headers: {
            connection: 'Upgrade',
            upgrade: TUNNEL_UPGRADE,
            [TUNNEL_PROTOCOL_HEADER]: '2',
            [TUNNEL_VERSION_HEADER]: TUNNEL_VERSION,
          },
        });
        req.once('response', (res) => {
          let body = '';
          res.setEncoding('utf8').on('data', (c: string) => (body += c));
          res.on('end', () => done({ status: res.statusCode ?? 0, headers: res.headers, body }));
        });
        req.once('upgrade', () => fail(new Error('took a tunnel while draining')));
        req.once('error', fail);
        req.end();
      }, fail);
    },
  );
  expect(answer.status).toBe(503);
  expect(answer.headers[DRAINING_HEADER]).toBe('replica-under-test');
  expect(answer.headers['retry-after']).toBe('1');
  expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 503 });
  expect((JSON.parse(answer.body) as { message: string }).message).toContain('is draining');
});

describe('handshakeSweep', () => {
  it('sweeps the running listener every HANDSHAKE_SWEEP_MS, and nothing before it runs', async () => {
    let swept = 0;
    let running: { sweep(): void } | undefined = undefined;
    const controller = handshakeSweep(() => running);
    const signal = new AbortController().signal;
    expect(await controller.sync(controller.initialKeys![0]!, signal)).toEqual({
      requeueAfterMs: HANDSHAKE_SWEEP_MS,
    });
    running = { sweep: () => void swept++ };
    await controller.sync(controller.initialKeys![0]!, signal);
    expect(swept).toBe(1);
  });
});
