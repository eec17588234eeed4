import { describe, expect, it } from '@jest/globals';
import { fakeClock, type FakeClock } from '../../test-support/fake-clock.ts';
import type { Exchange } from './exchange.ts';
import {
  AGENT_RETURN_MS,
  MAX_WAITING_PER_USER,
  newRouteWaits,
  type Route,
  type RouteWaitOptions,
} from './route.ts';

const route: Route = {
  kind: 'tunnel',
  forward: () => Promise.resolve(),
  call: () => Promise.reject(new Error('not called')),
};

/** A client's side of an exchange, which the test may make go. */
const client = (): Exchange & { res: { destroyed: boolean } } =>
  ({ kind: 'plain', res: { destroyed: false } }) as unknown as Exchange & { res: { destroyed: boolean } };

/** Route waits over a world the test changes: which clusters are routed, when each was last connected. */
function world(clock: FakeClock = fakeClock()) {
  const routed = new Set<string>();
  const seen = new Map<string, number>();
  const state = { throwing: false };
  const opts: RouteWaitOptions = {
    router: {
      route(cluster) {
        if (state.throwing) throw new Error('lookup failed');
        return routed.has(cluster) ? route : undefined;
      },
    },
    lastConnected: (cluster) => seen.get(cluster),
    clock,
  };
  return { clock, routed, seen, state, waits: newRouteWaits(opts) };
}

/** Whether `wait` has resolved, after letting its callbacks run. */
async function resolved(wait: Promise<unknown>): Promise<boolean> {
  let done = false;
  void wait.then(() => (done = true));
  await new Promise((next) => setImmediate(next));
  return done;
}

describe('requests waiting for a cluster between tunnels', () => {
  it('do not wait for a routed cluster, one never seen connected, one gone longer, or when the lookup throws', async () => {
    const w = world();
    w.clock.advance(60_000);
    w.routed.add('routed');
    w.seen.set('routed', w.clock.now());
    w.seen.set('long-gone', w.clock.now() - AGENT_RETURN_MS);
    for (const cluster of ['routed', 'never', 'long-gone'])
      expect(await resolved(w.waits.until(cluster, 'alice', client()))).toBe(true);
    w.seen.set('moving', w.clock.now());
    w.state.throwing = true;
    expect(await resolved(w.waits.until('moving', 'alice', client()))).toBe(true);
    expect(w.waits.waiting()).toBe(0);
    expect(w.clock.pending()).toEqual([]);
  });

  it('end once the route is back, and the timer stops when none waits', async () => {
    const w = world();
    w.seen.set('moving', w.clock.now());
    const waits = [w.waits.until('moving', 'alice', client()), w.waits.until('moving', 'bob', client())];
    for (let looked = 0; looked < 30; looked++) w.clock.advance(100);
    expect(await resolved(Promise.race(waits))).toBe(false);
    expect(w.waits.waiting()).toBe(2);
    w.routed.add('moving');
    w.clock.advance(100);
    expect(await resolved(Promise.all(waits))).toBe(true);
    expect(w.waits.waiting()).toBe(0);
    expect(w.clock.pending()).toEqual([]);
  });

  it('end AGENT_RETURN_MS after the agent was last seen, counted on the timer whatever the wall clock does', async () => {
    const fake = fakeClock();
    let wall = 1_000_000;
    const w = world({ ...fake, now: () => wall });
    w.seen.set('gone', wall - 4_000);
    const wait = w.waits.until('gone', 'alice', client());
    // The wall clock steps back an hour: the wait still ends 6 s on, as its timer counts.
    wall -= 3_600_000;
    for (let looked = 0; looked < 59; looked++) fake.advance(100);
    expect(await resolved(wait)).toBe(false);
    fake.advance(100);
    expect(await resolved(wait)).toBe(true);
  });

  it('end for a client that has gone, and when no wait can help any more', async () => {
    const w = world();
    for (const cluster of ['a', 'b']) w.seen.set(cluster, w.clock.now());
    const leaving = client();
    const left = w.waits.until('a', 'alice', leaving);
    const stays = w.waits.until('a', 'alice', client());
    leaving.res.destroyed = true;
    w.clock.advance(100);
    expect(await resolved(left)).toBe(true);
    expect(await resolved(stays)).toBe(false);
    // Another live replica took the tunnel (lastConnected says no wait can bring a route).
    const helpless = w.waits.until('b', 'alice', client());
    w.seen.delete('b');
    w.clock.advance(100);
    expect(await resolved(helpless)).toBe(true);
    w.routed.add('a');
    w.clock.advance(100);
    expect(await resolved(stays)).toBe(true);
  });

  it('end when the lookup throws, and later waits are served as before', async () => {
    const w = world();
    w.seen.set('moving', w.clock.now());
    const first = w.waits.until('moving', 'alice', client());
    w.state.throwing = true;
    w.clock.advance(100);
    expect(await resolved(first)).toBe(true);
    w.state.throwing = false;
    const second = w.waits.until('moving', 'alice', client());
    w.routed.add('moving');
    w.clock.advance(100);
    expect(await resolved(second)).toBe(true);
  });

  it('are bounded per user: past the share a request does not wait, and another user still does', async () => {
    const w = world();
    w.seen.set('moving', w.clock.now());
    const held = Array.from({ length: MAX_WAITING_PER_USER }, () =>
      w.waits.until('moving', 'mallory', client()),
    );
    expect(await resolved(w.waits.until('moving', 'mallory', client()))).toBe(true);
    const bob = w.waits.until('moving', 'bob', client());
    expect(await resolved(bob)).toBe(false);
    expect(w.waits.waiting()).toBe(MAX_WAITING_PER_USER + 1);
    w.routed.add('moving');
    w.clock.advance(100);
    expect(await resolved(Promise.all([...held, bob]))).toBe(true);
    expect(w.waits.waiting()).toBe(0);
  });
});
