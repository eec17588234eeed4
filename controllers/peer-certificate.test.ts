import { describe, expect, it } from '@jest/globals';
import { newControllerManager } from '../lib/controller/manager.ts';
import { fakeClock } from '../test-support/fake-clock.ts';
import { silentLogger } from '../lib/log.ts';
import { newPeerCertificateController, PEER_CERTIFICATE_KEY } from './peer-certificate.ts';

const never = new AbortController().signal;
const DAY = 24 * 3600 * 1000;

function world(issuedAt: number, fail = 0) {
  const clock = fakeClock();
  const state = { issuedAt, reissues: 0, failures: fail };
  const controller = newPeerCertificateController({
    issuedAt: () => state.issuedAt,
    reissue: () => {
      if (state.failures-- > 0) return Promise.reject(new Error('the CA is unavailable'));
      state.reissues++;
      state.issuedAt = clock.now();
      return Promise.resolve();
    },
    renewAfterMs: DAY,
    clock,
  });
  return { clock, state, controller };
}

const settle = async (): Promise<void> => {
  for (let i = 0; i < 10; i++) await new Promise((done) => setImmediate(done));
};

describe('the peer certificate renewal', () => {
  it.each([
    ['just issued', 0, 0, DAY],
    ['issued an hour ago', -3600_000, 0, DAY - 3600_000],
    ['past its renewal point', -DAY, 1, DAY],
    ['long past it', -5 * DAY, 1, DAY],
  ])(
    'with a certificate %s, reissues %d time(s) and comes back in %d ms',
    async (_case, at, reissues, after) => {
      const w = world(at);
      expect(await w.controller.sync(PEER_CERTIFICATE_KEY, never)).toEqual({ requeueAfterMs: after });
      expect(w.state.reissues).toBe(reissues);
    },
  );

  it('reissues once a day under the manager, and retries a reissue that failed', async () => {
    const w = world(0, 1);
    const manager = newControllerManager({ log: silentLogger(), clock: w.clock, resyncMs: 7 * DAY });
    manager.add({ controller: w.controller, runs: 'every-replica' });
    await manager.start();
    await settle();
    expect(w.state.reissues).toBe(0);
    w.clock.advance(DAY);
    await settle();
    // The first reissue failed; its retry, milliseconds later, succeeds.
    expect(w.state.reissues).toBe(0);
    w.clock.advance(1000);
    await settle();
    expect(w.state.reissues).toBe(1);
    w.clock.advance(DAY);
    await settle();
    expect(w.state.reissues).toBe(2);
    await manager.stop();
  });
});
