// The retry for a port that must be known before its server starts, against a real port another server holds.
import { describe, expect, it } from '@jest/globals';
import { createServer, type AddressInfo, type Server } from 'node:net';
import { retryWhileAddressInUse } from './ports.ts';

/** A server listening on `port`, or the listen's error (Node's own, from outside the test's realm). */
const listening = (port: number): Promise<Server> =>
  new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(port, '127.0.0.1', () => done(server));
  });

describe('retryWhileAddressInUse', () => {
  it('starts once the port another server held is free', async () => {
    const holder = await listening(0);
    const { port } = holder.address() as AddressInfo;
    let tries = 0;
    setTimeout(() => holder.close(), 1_000);
    const server = await retryWhileAddressInUse(() => {
      tries++;
      return listening(port);
    });
    server.close();
    expect(tries).toBeGreaterThan(1);
  });

  it('gives up at once on any other failure, and on EADDRINUSE once its time is up', async () => {
    let tries = 0;
    const other = retryWhileAddressInUse(() => {
      tries++;
      return Promise.reject(new Error('not a port problem'));
    });
    await expect(other).rejects.toThrow('not a port problem');
    expect(tries).toBe(1);
    const holder = await listening(0);
    const { port } = holder.address() as AddressInfo;
    try {
      await expect(retryWhileAddressInUse(() => listening(port), 600)).rejects.toMatchObject({
        code: 'EADDRINUSE',
      });
    } finally {
      holder.close();
    }
  });
});
