// The agent's local proxy against a stand-in API server (HTTPS with HTTP/2, as the real one), fed both ways the
// tunnel hands it requests: HTTP/2 requests, and HTTP/1.1 on byte streams (plain TCP connections here).
import { HOP_FIELDS } from '../lib/http2/hop-by-hop.test.ts';
import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { Agent, request } from 'node:http';
import {
  connect as http2Connect,
  constants,
  createSecureServer,
  createServer as createH2cServer,
  type IncomingHttpHeaders,
  type ServerHttp2Stream,
} from 'node:http2';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { newLocalProxy, type LocalProxy } from './local-proxy.ts';

const cleanups: (() => void)[] = [];
afterEach(() => cleanups.splice(0).forEach((c) => c()));

/** What the API server saw of each request. */
let seen: IncomingHttpHeaders[];
/** TLS connections the API server accepted. */
let connections: number;
let proxy: LocalProxy;
/** Where the proxy takes HTTP/1.1 byte streams, and where it takes HTTP/2 requests. */
let http1Port: number;
let http2Port: number;

/** The API server: echoes nothing, refuses /too-large at once as the real one does (413, then NO_ERROR). */
function apiserver(stream: ServerHttp2Stream, headers: IncomingHttpHeaders): void {
  seen.push(headers);
  stream.on('error', () => {});
  if (headers[':path'] === '/too-large') {
    stream.respond({ ':status': 413, 'content-type': 'application/json' });
    stream.end('{"kind":"Status","code":413}', () => stream.close(constants.NGHTTP2_NO_ERROR));
    return;
  }
  stream.resume();
  stream.on('end', () => {
    stream.respond({ ':status': 200, 'content-type': 'application/json' });
    stream.end('{"kind":"Status"}');
  });
}

beforeEach(async () => {
  seen = [];
  connections = 0;
  const ca = await newCA('local-proxy-test');
  const serving = await issueCert(ca, { commonName: 'apiserver', hosts: ['127.0.0.1'], usage: 'server' });
  const server = createSecureServer({ cert: serving.certPem, key: serving.keyPem });
  server.on('stream', apiserver);
  server.on('secureConnection', () => connections++);
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  proxy = newLocalProxy({
    url: new URL(`https://127.0.0.1:${(server.address() as AddressInfo).port}`),
    caPem: ca.certPem,
    token: () => 'agent-token',
  });
  const http1 = createNetServer((socket) => proxy.accept(socket));
  await new Promise<void>((done) => http1.listen(0, '127.0.0.1', done));
  const http2 = createH2cServer();
  http2.on('stream', (stream, headers, _flags, rawHeaders) => proxy.serve(stream, headers, rawHeaders));
  await new Promise<void>((done) => http2.listen(0, '127.0.0.1', done));
  http1Port = (http1.address() as AddressInfo).port;
  http2Port = (http2.address() as AddressInfo).port;
  cleanups.push(() => {
    proxy.close();
    http1.close();
    http2.close();
    server.close();
  });
});

type Answer = { status: number; body: string };

function http1Request(
  agent: Agent,
  path: string,
  headers: Record<string, string | string[]> = {},
  body?: Buffer,
): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = request(
      { host: '127.0.0.1', port: http1Port, path, agent, method: body ? 'POST' : 'GET', headers },
      (res) => {
        let text = '';
        res.setEncoding('utf8');
        res.on('data', (c: string) => (text += c));
        res.on('end', () => done({ status: res.statusCode!, body: text }));
      },
    );
    req.on('error', fail);
    req.end(body);
  });
}

function http2Request(
  headers: Record<string, string | string[]>,
  body?: Buffer,
): Promise<Answer & { code: number }> {
  // Node's client holds at most maxSessionMemory (10 MB by default) of unsent data; the body here is larger.
  const session = http2Connect(`http://127.0.0.1:${http2Port}`, { maxSessionMemory: 64 });
  cleanups.push(() => session.destroy());
  return new Promise((done, fail) => {
    const stream = session.request(headers, { endStream: !body });
    let status = 0;
    let text = '';
    stream.setEncoding('utf8');
    stream.on('response', (h) => (status = Number(h[':status'])));
    stream.on('data', (c: string) => (text += c));
    stream.on('error', () => {});
    stream.on('close', () =>
      status ? done({ status, body: text, code: stream.rstCode }) : fail(new Error('no answer')),
    );
    if (body) stream.end(body);
  });
}

const AS_ALICE = { 'impersonate-user': 'alice' };

const callerHeaders = {
  authorization: 'Bearer the-hubs-token',
  'impersonate-user': 'alice',
  'impersonate-group': ['devs', 'ops'],
  'x-forwarded-for': '10.0.0.1',
  accept: 'application/json',
};

describe("the agent's local proxy", () => {
  it('sends on no field that belongs to the hub’s connection, nor any its Connection field names', async () => {
    const agent = new Agent();
    cleanups.push(() => agent.destroy());
    const answer = await http1Request(agent, '/api', { ...callerHeaders, ...HOP_FIELDS });
    expect(answer.status).toBe(200);
    const sent = Object.keys(seen.at(-1)!).filter((name) => !name.startsWith(':'));
    expect(sent.filter((name) => name in HOP_FIELDS)).toEqual([]);
  });

  it.each(['HTTP/1.1', 'HTTP/2'])(
    'sends its own credential and the impersonation, each group apart, and nothing else of the caller’s (%s)',
    async (protocol) => {
      const agent = new Agent();
      cleanups.push(() => agent.destroy());
      const answer =
        protocol === 'HTTP/2'
          ? await http2Request({ ':path': '/api', ...callerHeaders })
          : await http1Request(agent, '/api', callerHeaders);
      expect(answer.status).toBe(200);
      const headers = seen[0]!;
      expect(headers['authorization']).toBe('Bearer agent-token');
      expect(headers['impersonate-user']).toBe('alice');
      expect(headers['x-forwarded-for']).toBeUndefined();
      expect(headers['accept']).toBe('application/json');
      // Node joins repeated fields on receipt; two groups arrive as two fields, so joined with ", ".
      expect(headers['impersonate-group']).toBe('devs, ops');
    },
  );

  it.each(['HTTP/1.1', 'HTTP/2'])(
    'sends nothing as itself but SubjectAccessReviews: a request that impersonates nobody is refused (%s)',
    async (protocol) => {
      const agent = new Agent();
      cleanups.push(() => agent.destroy());
      const send = (path: string, method: string, headers: Record<string, string | string[]> = {}) =>
        protocol === 'HTTP/2'
          ? http2Request(
              { ':path': path, ':method': method, ...headers },
              method === 'POST' ? Buffer.from('{}') : undefined,
            )
          : http1Request(agent, path, headers, method === 'POST' ? Buffer.from('{}') : undefined);
      const cases: [string, string, Record<string, string | string[]>][] = [
        ['/api/v1/secrets', 'GET', {}],
        ['/api/v1/secrets', 'GET', { 'impersonate-user': '' }],
        // The API server reads the first one: nobody.
        ['/api/v1/secrets', 'GET', { 'impersonate-user': ['', 'alice'] }],
        ['/apis/authorization.k8s.io/v1/subjectaccessreviews', 'GET', {}],
        ['/apis/authorization.k8s.io/v1/subjectaccessreviews?x=1', 'POST', {}],
      ];
      for (const [path, method, headers] of cases) {
        const answer = await send(path, method, headers);
        expect(answer.status).toBe(403);
        expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status', code: 403 });
      }
      expect(seen).toHaveLength(0);
      const review = await send('/apis/authorization.k8s.io/v1/subjectaccessreviews', 'POST');
      expect(review.status).toBe(200);
      expect(seen[0]!['authorization']).toBe('Bearer agent-token');
    },
  );

  it('carries 32 concurrent requests on one connection to the API server', async () => {
    const client = new Agent({ keepAlive: true, maxSockets: 32 });
    cleanups.push(() => client.destroy());
    const burst = (): Promise<Answer[]> =>
      Promise.all(Array.from({ length: 32 }, () => http1Request(client, '/api', AS_ALICE)));
    for (let i = 0; i < 3; i++) expect((await burst()).map((a) => a.status)).toEqual(Array(32).fill(200));
    expect(connections).toBe(1);
  });

  it('relays an answer that came before the body was read, and keeps an HTTP/1.1 connection for the next request', async () => {
    const body = Buffer.alloc(10 << 20, 'x');
    const client = new Agent({ keepAlive: true, maxSockets: 1 });
    cleanups.push(() => client.destroy());
    for (let i = 0; i < 3; i++) {
      expect(
        await http1Request(
          client,
          '/too-large',
          { ...AS_ALICE, 'content-length': String(body.length) },
          body,
        ),
      ).toMatchObject({ status: 413 });
      expect(await http1Request(client, '/api', AS_ALICE)).toMatchObject({ status: 200 });
    }
    const h2 = await http2Request({ ':path': '/too-large', ':method': 'POST', ...AS_ALICE }, body);
    expect(h2).toMatchObject({ status: 413, code: constants.NGHTTP2_NO_ERROR });
    expect(JSON.parse(h2.body)).toMatchObject({ code: 413 });
  });
});
