// The agent's choice of transport against a hub on real sockets: direct by default, and WebSocket where the way to
// the hub answers the direct upgrade with anything but a switch (here a listener that knows only WebSockets, as
// one of an earlier release, or a proxy that passes only those).
import { afterEach, describe, expect, it } from '@jest/globals';
import { request, type IncomingMessage } from 'node:http';
import { createServer, type Server } from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { createWebSocketStream, WebSocketServer } from 'ws';
import { eventually } from '../dev/eventually.ts';
import { fakeClock } from '../test-support/fake-clock.ts';
import type { Clock } from '../lib/clock.ts';
import { newLogger, silentLogger, type Logger } from '../lib/log.ts';
import { Writable } from 'node:stream';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import {
  newTunnelClient,
  TUNNEL_PROTOCOL_HEADER,
  TUNNEL_VERSION_HEADER,
  TUNNEL_UPGRADE,
  writesDone,
  type TunnelClient,
} from '../lib/tunnel/tunnel.ts';
import { DRAINING_HEADER } from '../lib/tunnel/dial.ts';
import { newAgent, type Agent } from './agent.ts';

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

/** A hub that takes WebSocket tunnels, and direct ones too when `direct`, with an agent dialing it. */
async function hub(
  direct: boolean,
  clock?: Clock,
  /** The protocol the hub states in its switch (none, as hubs before 2.1), and where the agent logs. */
  more: { protocol?: string; log?: Logger; draining?: () => boolean } = {},
): Promise<{ tunnels: TunnelClient[]; transports: string[]; agent: Agent }> {
  const ca = await newCA('hub test CA');
  const serving = await issueCert(ca, { commonName: 'hub', hosts: ['127.0.0.1'], usage: 'server' });
  const client = await issueCert(ca, { commonName: 'edge', usage: 'client' });
  const tunnels: TunnelClient[] = [];
  const transports: string[] = [];
  const wss = new WebSocketServer({ noServer: true });
  const stated = more.protocol === undefined ? '' : `${TUNNEL_VERSION_HEADER}: ${more.protocol}\r\n`;
  if (stated) wss.on('headers', (headers) => headers.push(stated.trim()));
  const server: Server = createServer({
    cert: serving.certPem,
    key: serving.keyPem,
    ca: ca.certPem,
    requestCert: true,
  });
  server.on('upgrade', (req: IncomingMessage, socket: Socket, head: Buffer) => {
    if (more.draining?.())
      return void socket.end(
        `HTTP/1.1 503 Service Unavailable\r\n${TUNNEL_VERSION_HEADER}: 2.1\r\n${DRAINING_HEADER}: replica-b\r\n` +
          'Connection: close\r\nContent-Length: 0\r\n\r\n',
      );
    // A hub that states no protocol is one of 2.0, which serves only agents that say exactly `2` in this header.
    if (!stated && req.headers[TUNNEL_PROTOCOL_HEADER] !== '2')
      return void socket.end(
        'HTTP/1.1 426 Upgrade Required\r\nConnection: close\r\nContent-Length: 0\r\n\r\n',
      );
    if (req.headers.upgrade === 'websocket')
      return wss.handleUpgrade(req, socket, head, (ws) => {
        transports.push('websocket');
        tunnels.push(newTunnelClient(createWebSocketStream(ws)));
      });
    if (!direct || req.headers.upgrade !== TUNNEL_UPGRADE)
      return void socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n');
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${TUNNEL_UPGRADE}\r\n${stated}\r\n`,
    );
    void writesDone(socket).then(() => {
      transports.push('direct');
      tunnels.push(newTunnelClient(socket));
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const url = new URL(`https://127.0.0.1:${(server.address() as AddressInfo).port}`);
  const agent = newAgent({
    // One hub replica here: one tunnel.
    tunnels: 1,
    cluster: 'edge',
    hub: url,
    trust: { caPem: ca.certPem },
    bootstrapToken: () => undefined,
    store: {
      load: () => Promise.resolve({ certPem: client.certPem, keyPem: client.keyPem, caPem: ca.certPem }),
      save: () => Promise.resolve(),
    },
    // Nothing listens there: a request through the tunnel gets the agent's own 502.
    upstream: { url: new URL('https://127.0.0.1:9') },
    version: 'test',
    log: more.log ?? silentLogger(),
    ...(clock ? { clock } : {}),
  });
  cleanups.push(
    () => {
      server.closeAllConnections();
      server.close();
    },
    () => agent.stop(),
  );
  await agent.start();
  return { tunnels, transports, agent };
}

/** The agent's answer to a request sent through `tunnel`: it proves the tunnel carries requests both ways. */
async function throughTunnel(tunnel: TunnelClient): Promise<number> {
  return new Promise((done, fail) =>
    request(
      { host: 'cluster', path: '/version', agent: tunnel.agent, headers: { 'impersonate-user': 'alice' } },
      (res) => {
        res.resume();
        done(res.statusCode ?? 0);
      },
    )
      .on('error', fail)
      .end(),
  );
}

describe('the agent’s tunnel transport', () => {
  it('dials direct when the hub switches to it, and a hub of 2.0 serves it', async () => {
    const { tunnels, transports, agent } = await hub(true);
    await eventually(() => expect(agent.connected()).toBe(true));
    await eventually(() => expect(transports).toEqual(['direct']));
    expect(await throughTunnel(tunnels[0]!)).toBe(502);
  });

  it('falls back to WebSocket when the direct upgrade is answered with anything but a switch', async () => {
    const { tunnels, transports, agent } = await hub(false);
    await eventually(() => expect(agent.connected()).toBe(true));
    await eventually(() => expect(transports).toEqual(['websocket']));
    expect(await throughTunnel(tunnels[0]!)).toBe(502);
  });
});

describe('the agent’s pauses', () => {
  it('dials again after a closed tunnel only once its clock has moved past the pause', async () => {
    const clock = fakeClock();
    const { tunnels, agent } = await hub(true, clock);
    await eventually(() => expect(agent.connected()).toBe(true));
    // Only the renewal check is armed while the tunnel is up.
    expect(clock.pending()).toHaveLength(1);
    tunnels[0]!.close();
    await eventually(() => expect(agent.connected()).toBe(false));
    // The pause before the next dial is armed, and nothing but the clock ends it.
    await eventually(() => expect(clock.pending()).toHaveLength(2));
    expect(tunnels).toHaveLength(1);
    clock.advance(30_000);
    await eventually(() => expect(agent.connected()).toBe(true));
    expect(tunnels).toHaveLength(2);
  });

  it('stops at any time, more than once, and cannot be started again', async () => {
    const { agent } = await hub(true, fakeClock());
    await eventually(() => expect(agent.connected()).toBe(true));
    await Promise.all([agent.stop(), agent.stop()]);
    expect(agent.connected()).toBe(false);
    await expect(agent.start()).rejects.toThrow('started already');
  });
});

/** A logger whose lines are kept, parsed. */
function recordingLogger(): { log: Logger; lines: () => Record<string, unknown>[] } {
  let text = '';
  const destination = new Writable({
    write(chunk: Buffer, _enc, next) {
      text += chunk.toString();
      next();
    },
  });
  return {
    log: newLogger({ destination }),
    lines: () =>
      text
        .split('\n')
        .filter(Boolean)
        .map((line) => JSON.parse(line) as Record<string, unknown>),
  };
}

describe('the agent and a hub outside the tunnel protocol’s skew policy', () => {
  it.each([true, false])(
    'refuses the hub’s switch (direct: %s), says why in one line, and dials again after its pause',
    async (direct) => {
      const clock = fakeClock();
      const recorded = recordingLogger();
      const { transports, agent } = await hub(direct, clock, { protocol: '3.0', log: recorded.log });
      const refused = () => recorded.lines().filter((l) => l.msg === 'tunnel refused');
      await eventually(() => expect(refused()).toHaveLength(1));
      expect(refused()[0]!.problem).toBe(
        'the agent speaks tunnel protocol 2.1 and the hub 3.0, which serves agents of 3.0 to 3.1: upgrade the agent',
      );
      expect(agent.connected()).toBe(false);
      // Not taken for a way that does not pass the direct upgrade: the same transport again, once the clock says.
      await eventually(() => expect(clock.pending()).toHaveLength(2));
      clock.advance(30_000);
      await eventually(() => expect(refused()).toHaveLength(2));
      expect(transports).toEqual(direct ? ['direct', 'direct'] : ['websocket', 'websocket']);
      expect(agent.connected()).toBe(false);
    },
  );

  it('talks to a hub a minor behind', async () => {
    const { tunnels, agent } = await hub(true, undefined, { protocol: '2.0' });
    await eventually(() => expect(agent.connected()).toBe(true));
    expect(await throughTunnel(tunnels[0]!)).toBe(502);
  });
});

describe('the agent and a hub replica that drains', () => {
  /** The pauses armed now that are a move's (1 to 3 s), not a backoff's nor the renewal check's. */
  const movePauses = (clock: ReturnType<typeof fakeClock>): number[] =>
    clock.pending().filter((ms) => ms >= 1_000 && ms <= 3_000);

  it.each([true, false])(
    'asked to move (direct: %s), says so in one line and dials another within seconds',
    async (direct) => {
      const clock = fakeClock();
      const recorded = recordingLogger();
      const { tunnels, agent } = await hub(direct, clock, { protocol: '2.1', log: recorded.log });
      await eventually(() => expect(agent.connected()).toBe(true));
      tunnels[0]!.goAway();
      await eventually(() => expect(agent.connected()).toBe(false));
      const moved = recorded
        .lines()
        .filter((l) => l.msg === 'hub replica asked this tunnel to move; dialing another');
      expect(moved).toHaveLength(1);
      await eventually(() => expect(movePauses(clock)).toHaveLength(1));
      clock.advance(3_000);
      await eventually(() => expect(agent.connected()).toBe(true));
      expect(tunnels).toHaveLength(2);
      // The hub closes the moved tunnel once it is idle; the new one carries requests.
      await tunnels[0]!.closed;
      expect(await throughTunnel(tunnels[1]!)).toBe(502);
    },
  );

  it('refused by a draining replica, says so in one line and dials again within seconds, not after a backoff', async () => {
    const clock = fakeClock();
    const recorded = recordingLogger();
    let draining = true;
    const { tunnels, agent } = await hub(true, clock, {
      protocol: '2.1',
      log: recorded.log,
      draining: () => draining,
    });
    const said = () => recorded.lines().filter((l) => l.msg === 'hub replica draining; dialing again soon');
    await eventually(() => expect(said()).toHaveLength(1));
    expect(said()[0]).toMatchObject({ replica: 'replica-b' });
    // Not a skew, not a refused certificate, not a proxy in the way.
    expect(recorded.lines().filter((l) => l.level !== 30)).toEqual([]);
    await eventually(() => expect(movePauses(clock)).toHaveLength(1));
    draining = false;
    clock.advance(3_000);
    await eventually(() => expect(agent.connected()).toBe(true));
    expect(tunnels).toHaveLength(1);
  });
});

describe('the agent that drains', () => {
  it.each([true, false])(
    '(direct: %s) tells the hub it leaves, lets the request in flight end, dials nothing again and stops',
    async (direct) => {
      const recorded = recordingLogger();
      const { tunnels, agent } = await hub(direct, undefined, { protocol: '2.1', log: recorded.log });
      await eventually(() => expect(agent.connected()).toBe(true));
      const tunnel = tunnels[0]!;
      let left = false;
      void tunnel.leaving.then(() => (left = true));
      const draining = agent.drain();
      await tunnel.leaving;
      expect(left).toBe(true);
      await expect(tunnel.open()).rejects.toThrow(/closed|moving/);
      await tunnel.closed;
      await draining;
      expect(agent.connected()).toBe(false);
      expect(tunnels).toHaveLength(1);
      expect(recorded.lines().map((l) => l.msg)).toEqual(
        expect.arrayContaining(['draining: told the hub this agent leaves', 'drained']),
      );
      expect(recorded.lines().find((l) => l.msg === 'drained')).toMatchObject({ outcome: 'closed' });
    },
  );
});
