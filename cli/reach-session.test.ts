// `sealion port-forward`'s HTTP/2 path against stand-in servers: one session carries every connection as an extended
// CONNECT stream with the credentials on each, bytes and half-closes pass both ways, a refusal is that stream's
// alone, a renewed client certificate opens a new session, and a server that announces no extended CONNECT is
// answered with the upgrade fallback.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomBytes } from 'node:crypto';
import {
  createSecureServer,
  type Http2SecureServer,
  type IncomingHttpHeaders,
  type ServerHttp2Session,
  type ServerHttp2Stream,
} from 'node:http2';
import type { AddressInfo } from 'node:net';
import { createServer as createTLSServer, type TLSSocket } from 'node:tls';
import { PassThrough, type Duplex } from 'node:stream';
import { statusBody } from '../lib/kube/status.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { newReachSessions, ReachError, type ReachSessions } from './reach-session.ts';
import type { KubeconfigAccess } from './whoami.ts';

const PATH = 'apis/reach.concierge.sealion.dev/v1alpha1/namespaces/team/services/echo/connect?port=80';

/** What a stand-in server saw: each stream's headers, and its sessions. */
interface StandIn {
  server: Http2SecureServer;
  access: KubeconfigAccess;
  streams: IncomingHttpHeaders[];
  sessions: ServerHttp2Session[];
}

async function standIn(enableConnectProtocol: boolean): Promise<StandIn> {
  const ca = await newCA('reach-ca');
  const cert = await issueCert(ca, { commonName: 'reach', hosts: ['127.0.0.1'], usage: 'server' });
  const server = createSecureServer({
    cert: cert.certPem,
    key: cert.keyPem,
    settings: { enableConnectProtocol },
  });
  const seen: StandIn = { server, access: undefined!, streams: [], sessions: [] };
  server.on('session', (s: ServerHttp2Session) => seen.sessions.push(s));
  server.on('stream', (stream: ServerHttp2Stream, headers: IncomingHttpHeaders) => {
    seen.streams.push(headers);
    stream.on('error', () => {});
    if (headers['authorization'] !== 'Bearer the-token') {
      stream.respond({ ':status': 401, 'content-type': 'application/json' });
      return void stream.end(statusBody(401, 'Unauthorized'));
    }
    if (String(headers[':path']).includes('speaks-last')) {
      // A server that answers only once the client's first bytes are in (as a dialer whose target the client speaks
      // to first): it answers a client that waits for the answer before it sends never.
      return void stream.once('data', (first: Buffer) => {
        stream.respond({ ':status': 200 });
        stream.end(first);
      });
    }
    if (String(headers[':path']).includes('forbidden')) {
      stream.respond({ ':status': 403, 'content-type': 'application/json' });
      return void stream.end(statusBody(403, 'services "forbidden" is forbidden'));
    }
    stream.respond({ ':status': 200 });
    // The target: echoes what comes, and ends its side after the client's end, with a line of its own.
    stream.on('data', (chunk: Buffer) => stream.write(chunk));
    stream.on('end', () => stream.end('bye'));
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  seen.access = {
    base: `https://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    caPem: ca.certPem,
    headers: { Authorization: 'Bearer the-token' },
  };
  return seen;
}

/** Sends `data`, ends, and reads the stream to its end. */
function roundTrip(stream: Duplex, data: Buffer | string): Promise<Buffer> {
  return new Promise((done, fail) => {
    const chunks: Buffer[] = [];
    stream.on('data', (c: Buffer) => chunks.push(c));
    stream.once('end', () => done(Buffer.concat(chunks)));
    stream.once('error', fail);
    stream.end(data);
  });
}

let h2: StandIn;
let old: StandIn;
let sessions: ReachSessions;

beforeAll(async () => {
  [h2, old] = await Promise.all([standIn(true), standIn(false)]);
  sessions = newReachSessions();
});

afterAll(async () => {
  sessions.close();
  for (const s of [h2, old]) {
    for (const session of s.sessions) session.destroy();
    await new Promise((done) => s.server.close(done));
  }
});

const opened = async (access: KubeconfigAccess, path = PATH): Promise<Duplex> => {
  const result = await sessions.open(access, path, 5_000);
  if (!('stream' in result)) throw new Error('expected a stream');
  return result.stream;
};

describe('reach over HTTP/2', () => {
  it('carries every connection as an extended CONNECT stream of one session, with the credentials on each', async () => {
    const from = h2.streams.length;
    const large = randomBytes(1 << 20);
    const streams = await Promise.all(Array.from({ length: 20 }, () => opened(h2.access)));
    const answers = await Promise.all(streams.map((s, i) => roundTrip(s, i === 0 ? large : `#${i}`)));
    expect(answers[0]!.equals(Buffer.concat([large, Buffer.from('bye')]))).toBe(true);
    answers.slice(1).forEach((a, i) => expect(a.toString()).toBe(`#${i + 1}bye`));
    expect(h2.sessions).toHaveLength(1);
    expect(h2.streams.slice(from)).toHaveLength(20);
    expect(h2.streams.at(-1)).toEqual(
      expect.objectContaining({
        ':method': 'CONNECT',
        ':protocol': 'tcp',
        ':scheme': 'https',
        ':path': `/${PATH}`,
        authorization: 'Bearer the-token',
      }),
    );
  });

  it('passes the half-close on both ways: the client ends, still reads, and sees the end', async () => {
    const stream = await opened(h2.access);
    // The stand-in writes 'bye' only after it read the client's END_STREAM.
    expect((await roundTrip(stream, 'ping')).toString()).toBe('pingbye');
  });

  it("sends what the local connection has sent at once, before the server's answer, and nothing twice", async () => {
    const local = new PassThrough();
    local.write('first');
    const result = await sessions.open(
      h2.access,
      PATH.replace('echo', 'speaks-last'),
      5_000,
      undefined,
      local,
    );
    if (!('stream' in result)) throw new Error('expected a stream');
    expect((await roundTrip(result.stream, '')).toString()).toBe('first');
    // A refused stream lets go of the local connection: it is the caller's to close.
    const refusedLocal = new PassThrough();
    await expect(
      sessions.open(h2.access, PATH.replace('echo', 'forbidden'), 5_000, undefined, refusedLocal),
    ).rejects.toMatchObject({ status: 403 });
    expect(refusedLocal.listenerCount('data')).toBe(0);
  });

  it("rejects one stream with the refusal's Status and keeps the session for the others", async () => {
    await expect(sessions.open(h2.access, PATH.replace('echo', 'forbidden'), 5_000)).rejects.toEqual(
      new ReachError('the server answered 403 Forbidden: services "forbidden" is forbidden', 403),
    );
    const stranger = { ...h2.access, headers: { authorization: 'Bearer another' } };
    await expect(sessions.open(stranger, PATH, 5_000)).rejects.toMatchObject({ status: 401 });
    expect((await roundTrip(await opened(h2.access), 'still')).toString()).toBe('stillbye');
    expect(h2.sessions).toHaveLength(1);
  });

  it('opens a new session when the one it had went away', async () => {
    // GOAWAY, then the connection's end: the client has read both once the server's side has closed.
    const first = h2.sessions[0]!;
    await new Promise((done) => first.close(() => done(undefined)));
    expect((await roundTrip(await opened(h2.access), 'again')).toString()).toBe('againbye');
    expect(h2.sessions).toHaveLength(2);
  });

  it('answers { upgrade: true } for a server that announces no extended CONNECT, and remembers it', async () => {
    expect(await sessions.open(old.access, PATH, 5_000)).toEqual({ upgrade: true });
    expect(await sessions.open(old.access, PATH, 5_000)).toEqual({ upgrade: true });
    expect(old.streams).toEqual([]);
    expect(old.sessions).toHaveLength(1);
  });

  it('gives up on a server that never sends its SETTINGS, and goes as an upgrade', async () => {
    const ca = await newCA('silent-ca');
    const cert = await issueCert(ca, { commonName: 'silent', hosts: ['127.0.0.1'], usage: 'server' });
    // Negotiates h2, then says nothing at all.
    const sockets: TLSSocket[] = [];
    const silent = createTLSServer(
      { cert: cert.certPem, key: cert.keyPem, ALPNProtocols: ['h2'] },
      (socket) => {
        sockets.push(socket);
        socket.on('error', () => {});
      },
    );
    await new Promise<void>((done) => silent.listen(0, '127.0.0.1', done));
    const quick = newReachSessions(300);
    try {
      const access = {
        base: `https://127.0.0.1:${(silent.address() as AddressInfo).port}/`,
        caPem: ca.certPem,
        headers: {},
      };
      expect(await quick.open(access, PATH, 60_000)).toEqual({ upgrade: true });
    } finally {
      quick.close();
      for (const socket of sockets) socket.destroy();
      await new Promise((done) => silent.close(done));
    }
  });
});
