import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { once } from 'node:events';
import { connect, createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { eventually } from '../../dev/eventually.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { newMemoryBudget } from '../http2/memory-budget.ts';
import { join } from './join.ts';

// Each test joins two real TCP connections: the client's (`user` ⇄ `client`) and the upstream's (`upstream` ⇄
// `target`); `join(client, upstream)` is under test, `user` and `target` are the far ends the test drives.
let server: Server;
const accepted: Socket[] = [];
const opened: Socket[] = [];

beforeAll(async () => {
  server = createServer({ allowHalfOpen: true }, (s) => void accepted.push(s)).listen(0, '127.0.0.1');
  await once(server, 'listening');
});
afterAll(() => void server.close());
afterEach(() => {
  for (const s of opened.splice(0)) s.destroy();
});

/** A connected pair of sockets, both allowing half-open connections: [dialing end, accepted end]. */
async function pair(): Promise<[Socket, Socket]> {
  const before = accepted.length;
  const near = connect({
    port: (server.address() as AddressInfo).port,
    host: '127.0.0.1',
    allowHalfOpen: true,
  });
  opened.push(near);
  await once(near, 'connect');
  await eventually(() => expect(accepted.length).toBeGreaterThan(before));
  const far = accepted[before]!;
  opened.push(far);
  return [near, far];
}

/** Two pairs, joined in the middle. */
async function joined(opts: Parameters<typeof join>[2] = {}) {
  const [user, client] = await pair();
  const [upstream, target] = await pair();
  let closed = 0;
  join(client, upstream, { ...opts, closed: () => void closed++ });
  return { user, client, upstream, target, closed: () => closed };
}

/** Everything `socket` sends until it ends. */
async function readAll(socket: Socket): Promise<string> {
  const chunks: Buffer[] = [];
  socket.on('data', (c: Buffer) => chunks.push(c));
  await once(socket, 'end');
  return Buffer.concat(chunks).toString();
}

describe('join', () => {
  it('carries bytes both ways, and passes a half-close on: the side that ended still reads the answer', async () => {
    const { user, target, closed } = await joined();
    const atTarget = readAll(target);
    user.end('question');
    expect(await atTarget).toBe('question');
    const atUser = readAll(user);
    target.write('answer, ');
    target.end('after the end');
    expect(await atUser).toBe('answer, after the end');
    await eventually(() => expect(closed()).toBe(1));
  });

  it('passes a half-close from the upstream side on too, and the client still sends', async () => {
    const { user, target, closed } = await joined();
    const atUser = readAll(user);
    target.end('bye');
    expect(await atUser).toBe('bye');
    const atTarget = readAll(target);
    user.end('still talking');
    expect(await atTarget).toBe('still talking');
    await eventually(() => expect(closed()).toBe(1));
  });

  it.each(['client', 'upstream'] as const)('destroys both when the %s side fails', async (side) => {
    const { client, upstream, closed } = await joined();
    (side === 'client' ? client : upstream).destroy(new Error('broken'));
    await eventually(() => expect(closed()).toBe(1));
    expect(client.destroyed && upstream.destroyed).toBe(true);
  });

  it.each(['client', 'upstream'] as const)(
    'destroys the other side when the %s side is destroyed',
    async (side) => {
      const { client, upstream, user, target, closed } = await joined();
      (side === 'client' ? client : upstream).destroy();
      await eventually(() => expect(closed()).toBe(1));
      expect(client.destroyed && upstream.destroyed).toBe(true);
      // Both far ends see their connection go.
      for (const far of [user, target]) far.on('error', () => {}).resume();
      await eventually(() =>
        expect([user, target].map((s) => s.readableEnded || s.destroyed)).toEqual([true, true]),
      );
    },
  );

  it('destroys both at once when one side was gone before it was joined', async () => {
    const [, client] = await pair();
    const [upstream] = await pair();
    client.destroy();
    let closed = 0;
    join(client, upstream, { closed: () => void closed++ });
    await eventually(() => expect(closed).toBe(1));
    expect(upstream.destroyed).toBe(true);
  });

  it('counts the bytes each way', async () => {
    const counts = { sent: 0, received: 0 };
    const { user, target, closed } = await joined({ counts });
    const atTarget = readAll(target);
    user.end('12345');
    await atTarget;
    const atUser = readAll(user);
    target.end('123');
    await atUser;
    await eventually(() => expect(closed()).toBe(1));
    expect(counts).toEqual({ sent: 5, received: 3 });
  });

  it('closes a connection with no byte either way for the idle time, and not one that talks', async () => {
    const clock = fakeClock();
    const { user, target, client, upstream, closed } = await joined({ idle: { ms: 1000, clock } });
    clock.advance(600);
    user.write('x');
    await once(target, 'data');
    // 1,100 ms since the start, 500 since the last byte: still open.
    clock.advance(500);
    expect(client.destroyed || upstream.destroyed).toBe(false);
    clock.advance(500);
    await eventually(() => expect(closed()).toBe(1));
    expect(clock.pending()).toEqual([]);
  });

  it('cuts both when the client takes nothing of what the upstream sent for the deadline', async () => {
    const clock = fakeClock();
    const { user, target, closed } = await joined({ deadline: { ms: 5000, clock } });
    user.pause();
    // Far more than the sockets' buffers: the relay to the client stalls and its deadline runs.
    const big = Buffer.alloc(1 << 20);
    const write = (): void => void (target.write(big) && setImmediate(write));
    target.on('error', () => {});
    user.on('error', () => {});
    write();
    await eventually(() => expect(clock.pending()).toEqual([5000]));
    clock.advance(5000);
    await eventually(() => expect(closed()).toBe(1));
  });

  it("charges what the client leaves unread to the user's budget, and drops the charge when it closes", async () => {
    const budget = newMemoryBudget({ perUserBytes: 64 << 20, totalBytes: 64 << 20 });
    const { user, target, client, closed } = await joined({ account: { budget, user: 'alice' } });
    user.pause();
    const big = Buffer.alloc(1 << 20);
    const write = (): void => void (target.write(big) && setImmediate(write));
    target.on('error', () => {});
    user.on('error', () => {});
    write();
    await eventually(() => expect(budget.held('alice')).toBeGreaterThan(0));
    client.destroy();
    await eventually(() => expect(closed()).toBe(1));
    expect(budget.held('alice')).toBe(0);
  });
});
