// The agent's probes on a real socket: /healthz while the process serves, /readyz only while a tunnel is up, and
// nothing else on the port.
import { afterEach, describe, expect, it } from '@jest/globals';
import { request } from 'node:http';
import { silentLogger } from '../lib/log.ts';
import { healthAddress, serveHealth, type HealthListener } from './health.ts';

let listener: HealthListener | undefined;
afterEach(async () => {
  await listener?.close();
  listener = undefined;
});

/** One request to the probe port: its status and body. */
const ask = (port: number, path: string, method = 'GET'): Promise<{ status: number; body: string }> =>
  new Promise((done, fail) => {
    const req = request({ host: '127.0.0.1', port, path, method, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (c: string) => (body += c));
      res.on('end', () => done({ status: res.statusCode ?? 0, body }));
    });
    req.on('error', fail);
    req.end();
  });

describe('the agent’s probes', () => {
  it('answers /readyz 200 only while a tunnel is up, and /healthz 200 either way', async () => {
    let up = false;
    listener = await serveHealth({ host: '127.0.0.1', port: 0, ready: () => up, log: silentLogger() });
    expect(await ask(listener.port, '/readyz')).toMatchObject({ status: 503 });
    expect(await ask(listener.port, '/healthz')).toMatchObject({ status: 200 });
    up = true;
    expect(await ask(listener.port, '/readyz')).toMatchObject({ status: 200 });
    expect(await ask(listener.port, '/readyz?verbose')).toMatchObject({ status: 200 });
    up = false;
    expect(await ask(listener.port, '/readyz')).toMatchObject({ status: 503 });
  });

  it.each([
    ['/', 'GET', 404],
    ['/metrics', 'GET', 404],
    ['/readyz/../healthz', 'GET', 404],
    ['/clusters/edge/api', 'GET', 404],
    ['/readyz', 'POST', 405],
    ['/healthz', 'DELETE', 405],
  ])('answers nothing else: %s by %s gets %i', async (path, method, status) => {
    listener = await serveHealth({ host: '127.0.0.1', port: 0, ready: () => true, log: silentLogger() });
    expect((await ask(listener.port, path, method)).status).toBe(status);
  });

  it.each([
    [':8081', { host: '0.0.0.0', port: 8081 }],
    ['127.0.0.1:0', { host: '127.0.0.1', port: 0 }],
    ['[::1]:8081', { host: '::1', port: 8081 }],
  ])('takes %j as the address to listen on', (value, address) => {
    expect(healthAddress(value)).toEqual(address);
  });

  it.each(['8081', 'host:', 'host:port', ':65536', ':-1', ':8081.5'])('refuses %j at start', (value) => {
    expect(() => healthAddress(value)).toThrow('--health-listen');
  });
});
