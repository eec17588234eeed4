import { describe, expect, it } from '@jest/globals';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { silentLogger } from '../log.ts';
import { newControllerManager } from './manager.ts';
import { periodic, PERIODIC_KEY } from './periodic.ts';

const settle = async (): Promise<void> => {
  for (let i = 0; i < 10; i++) await new Promise((done) => setImmediate(done));
};

describe('periodic work under the controller manager', () => {
  it('runs at start, then on the clock, at the delay the work asks for, and not after the manager stops', async () => {
    const clock = fakeClock();
    const manager = newControllerManager({ log: silentLogger(), clock });
    const runs: number[] = [];
    manager.run(
      periodic('poll', 1_000, () => {
        runs.push(clock.now());
        return Promise.resolve(runs.length === 2 ? 5_000 : undefined);
      }),
    );
    await manager.start();
    await settle();
    expect(runs).toEqual([0]);
    clock.advance(1_000);
    await settle();
    expect(runs).toEqual([0, 1_000]);
    clock.advance(1_000);
    await settle();
    expect(runs).toEqual([0, 1_000]);
    clock.advance(4_000);
    await settle();
    expect(runs).toEqual([0, 1_000, 6_000]);
    manager.enqueue('poll', PERIODIC_KEY);
    await settle();
    expect(runs).toEqual([0, 1_000, 6_000, 6_000]);
    await manager.stop();
    clock.advance(60_000);
    await settle();
    expect(runs).toHaveLength(4);
  });

  it('retries a failed run with backoff, sooner than the next turn', async () => {
    const clock = fakeClock();
    const manager = newControllerManager({ log: silentLogger(), clock });
    let calls = 0;
    manager.run(
      periodic('flaky', 60_000, () => {
        calls++;
        return calls === 1 ? Promise.reject(new Error('issuer down')) : Promise.resolve();
      }),
    );
    await manager.start();
    await settle();
    expect(calls).toBe(1);
    clock.advance(100);
    await settle();
    expect(calls).toBe(2);
    await manager.stop();
  });
});
