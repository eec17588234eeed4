import { afterEach, describe, expect, it } from '@jest/globals';
import { Agent, request } from 'node:http';
import { createServer as createHttpsServer } from 'node:https';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { issueCert, newCA } from '../lib/pki.ts';
import { newLocalProxy } from './local-proxy.ts';

const cleanups: (() => void)[] = [];
afterEach(() => cleanups.splice(0).forEach((c) => c()));

describe("the agent's local proxy", () => {
  it('keeps its connections to the API server for the next requests, at a concurrency of 32', async () => {
    // The API server: HTTPS, counting the TLS connections it accepts.
    const ca = await newCA('local-proxy-test');
    const serving = await issueCert(ca, { commonName: 'apiserver', hosts: ['127.0.0.1'], usage: 'server' });
    let connections = 0;
    const apiserver = createHttpsServer({ cert: serving.certPem, key: serving.keyPem }, (_req, res) => {
      res.setHeader('content-type', 'application/json');
      res.end('{"kind":"Status"}');
    });
    apiserver.on('secureConnection', () => connections++);
    await new Promise<void>((done) => apiserver.listen(0, '127.0.0.1', done));
    const proxy = newLocalProxy({
      url: new URL(`https://127.0.0.1:${(apiserver.address() as AddressInfo).port}`),
      caPem: ca.certPem,
      token: () => 'agent-token',
    });
    // The tunnel's streams, as plain TCP connections here: each one handed to the proxy.
    const streams = createNetServer((socket) => proxy.accept(socket));
    await new Promise<void>((done) => streams.listen(0, '127.0.0.1', done));
    const client = new Agent({ keepAlive: true, maxSockets: 32 });
    cleanups.push(() => {
      client.destroy();
      proxy.close();
      streams.close();
      apiserver.close();
    });
    const port = (streams.address() as AddressInfo).port;
    const get = (): Promise<number> =>
      new Promise((done, fail) => {
        request({ host: '127.0.0.1', port, path: '/api', agent: client }, (res) => {
          res.resume();
          res.on('end', () => done(res.statusCode!));
        })
          .on('error', fail)
          .end();
      });
    const burst = (): Promise<number[]> => Promise.all(Array.from({ length: 32 }, get));

    // The first bursts open the connections that 32 requests in flight need.
    for (let i = 0; i < 3; i++) expect(await burst()).toEqual(Array(32).fill(200));
    const opened = connections;
    expect(opened).toBeGreaterThan(16);
    // Every request of the later bursts goes out on one of them.
    for (let i = 0; i < 3; i++) expect(await burst()).toEqual(Array(32).fill(200));
    expect(connections).toBe(opened);
  });
});
