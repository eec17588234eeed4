// The proxy's listener and the client signatures it takes: the certificate each kind of client gets to present, as
// the request path reads it, and how a signature of a kind the listener did not ask for is refused.
import { afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import type { ServerResponse } from 'node:http';
import { request } from 'node:https';
import {
  connect,
  type ClientHttp2Session,
  type ClientHttp2Stream,
  type IncomingHttpHeaders,
  type Settings,
} from 'node:http2';
import { answerSwitched } from '../../lib/http2/upgrade.ts';
import { refuseConnection } from '../../lib/kube/status.ts';
import { webcrypto } from 'node:crypto';
import type { SecureVersion, TLSSocket } from 'node:tls';
import { rsaCertificate, signWithRSAAnyway } from '../../dev/hostile-tls.ts';
import {
  issueCert,
  newCA,
  privateKeyToPem,
  type CertificateAuthority,
  type KeyPairPem,
} from '../../lib/pki/pki.ts';
import { newProxyServer, type ProxyServer, type ProxyTLS, type RequestHandler } from './server.ts';

let servingCA: CertificateAuthority;
let clientCA: CertificateAuthority;
let ecdsaServing: KeyPairPem;
let rsaServing: KeyPairPem;
let ecdsaClient: KeyPairPem;
let rsaClient: KeyPairPem;

beforeAll(async () => {
  servingCA = await newCA('serving-ca');
  clientCA = await newCA('client-ca');
  ecdsaServing = await issueCert(servingCA, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
  // As an admin's own certificate in tls.secretName may be.
  rsaServing = await rsaCertificate(servingCA, 'proxy', 'server', ['127.0.0.1']);
  ecdsaClient = await issueCert(clientCA, { commonName: 'p256-user', usage: 'client' });
  rsaClient = await rsaCertificate(clientCA, 'rsa-user', 'client');
});

/** Answers with the common name of the verified client certificate on the request's connection, or none. */
const peerName: RequestHandler = (req, res) => {
  const socket = req.socket as TLSSocket;
  const name = socket.authorized ? (socket.getPeerCertificate().subject?.CN ?? '') : '';
  (res as ServerResponse).end(name || '(none)');
};

const servers: ProxyServer[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
});

/** A listener serving `serving`, trusting the client CA; its TLS errors' codes go to `errors`. */
async function listen(
  serving: KeyPairPem,
  extra: Partial<ProxyTLS> = {},
  errors: string[] = [],
): Promise<number> {
  const server = newProxyServer(
    { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [clientCA.certPem], ...extra },
    peerName,
    (_req, socket) => socket.destroy(),
    (err: Error & { code?: string }) => errors.push(err.code ?? err.message),
  );
  servers.push(server);
  return server.listen(0, '127.0.0.1');
}

/** The name the listener at `port` saw for a client presenting `credential`. */
const nameSeen = (
  port: number,
  credential: KeyPairPem,
  maxVersion: SecureVersion = 'TLSv1.3',
): Promise<string> =>
  new Promise((done, fail) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path: '/',
        ca: servingCA.certPem,
        cert: credential.certPem,
        key: credential.keyPem,
        maxVersion,
        agent: false,
      },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => (body += chunk));
        res.on('end', () => done(body));
      },
    );
    req.on('error', fail);
    req.end();
  });

describe('client signatures', () => {
  it('takes a P-256 client certificate, and asks for nothing an RSA one can sign, so a client holding one stays anonymous', async () => {
    const port = await listen(ecdsaServing);
    expect(await nameSeen(port, ecdsaClient)).toBe('p256-user');
    expect(await nameSeen(port, rsaClient)).toBe('(none)');
  });

  it('refuses an RSA signature sent anyway for its kind, before checking it', async () => {
    const errors: string[] = [];
    const port = await listen(ecdsaServing, {}, errors);
    expect(await signWithRSAAnyway(port, rsaClient)).toBe('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE');
    expect(errors).toEqual(['ERR_SSL_WRONG_SIGNATURE_TYPE']);
  });

  it('with an RSA key of its own takes RSA client signatures too, as it must sign with RSA itself', async () => {
    const errors: string[] = [];
    const port = await listen(rsaServing, {}, errors);
    expect(await nameSeen(port, rsaClient)).toBe('rsa-user');
    expect(await nameSeen(port, ecdsaClient)).toBe('p256-user');
    // A hostile client's RSA signature is checked there (and found bad: the transcripts differ).
    expect(await signWithRSAAnyway(port, rsaClient)).toBe('ERR_SSL_TLSV1_ALERT_DECRYPT_ERROR');
    expect(errors).toEqual(['ERR_SSL_BAD_SIGNATURE']);
  });

  it.each([
    ['P-384', { name: 'ECDSA', namedCurve: 'P-384' }],
    ['Ed25519', { name: 'Ed25519' }],
  ])(
    'serves with an admin’s %s key over TLS 1.2 and 1.3, and takes P-256 client certificates',
    async (_kind, algorithm) => {
      const keys = (await webcrypto.subtle.generateKey(algorithm, true, [
        'sign',
        'verify',
      ])) as webcrypto.CryptoKeyPair;
      const cert = await issueCert(servingCA, {
        commonName: 'proxy',
        hosts: ['127.0.0.1'],
        usage: 'server',
        publicKey: keys.publicKey,
      });
      const port = await listen({ certPem: cert.certPem, keyPem: await privateKeyToPem(keys.privateKey) });
      for (const maxVersion of ['TLSv1.2', 'TLSv1.3'] as const)
        expect(await nameSeen(port, ecdsaClient, maxVersion)).toBe('p256-user');
    },
  );

  it('takes every kind of client signature when told to, as the aggregated APIs must from the front proxy', async () => {
    const port = await listen(ecdsaServing, { anyClientKey: true, requireClientCertificate: true });
    expect(await nameSeen(port, rsaClient)).toBe('rsa-user');
    expect(await nameSeen(port, ecdsaClient)).toBe('p256-user');
  });

  it('asks for P-256 signatures only with a swapped certificate too', async () => {
    const errors: string[] = [];
    const server = newProxyServer(
      { certPem: ecdsaServing.certPem, keyPem: ecdsaServing.keyPem, clientCAPems: [clientCA.certPem] },
      peerName,
      (_req, socket) => socket.destroy(),
      (err: Error & { code?: string }) => errors.push(err.code ?? err.message),
    );
    servers.push(server);
    const port = await server.listen(0, '127.0.0.1');
    const next = await issueCert(servingCA, { commonName: 'proxy-2', hosts: ['127.0.0.1'], usage: 'server' });
    server.updateTLS({ certPem: next.certPem, keyPem: next.keyPem, clientCAPems: [clientCA.certPem] });
    expect(await nameSeen(port, rsaClient)).toBe('(none)');
    expect(await signWithRSAAnyway(port, rsaClient)).toBe('ERR_SSL_SSL/TLS_ALERT_HANDSHAKE_FAILURE');
    expect(errors).toEqual(['ERR_SSL_WRONG_SIGNATURE_TYPE']);
  });
});

describe('a listener told to stop taking connections (a drain)', () => {
  it('refuses new connections, closes idle HTTP/1.1 ones and busy ones after their answer, sends GOAWAY on HTTP/2, and lets what is under way finish', async () => {
    const { connect } = await import('node:http2');
    const { Agent } = await import('node:https');
    let release: () => void = () => {};
    const held = new Promise<void>((done) => (release = done));
    let arrivals = 0;
    let arrived: () => void = () => {};
    // The slow request over HTTP/2 and the one over HTTP/1.1.
    const slowArrived = new Promise<void>((done) => (arrived = () => void (++arrivals === 2 && done())));
    const server = newProxyServer(
      { certPem: ecdsaServing.certPem, keyPem: ecdsaServing.keyPem, clientCAPems: [] },
      (req, res) => {
        if (req.url !== '/slow') return void (res as ServerResponse).end('quick');
        arrived();
        void held.then(() => (res as ServerResponse).end('slow done'));
      },
      (_req, socket) => socket.destroy(),
    );
    servers.push(server);
    const port = await server.listen(0, '127.0.0.1');
    // An HTTP/2 connection with a stream under way.
    const session = connect(`https://127.0.0.1:${port}`, { ca: servingCA.certPem });
    session.on('error', () => {});
    const goaway = new Promise<void>((done) => session.once('goaway', () => done()));
    const slow = session.request({ ':path': '/slow' });
    let slowBody = '';
    slow.setEncoding('utf8');
    slow.on('data', (c: string) => (slowBody += c));
    const slowEnded = new Promise<void>((done) => slow.once('end', () => done()));
    // An HTTP/1.1 connection kept alive between requests.
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const http1 = (): Promise<{ body: string; connection: string | undefined }> =>
      new Promise((done, fail) => {
        const req = request({ host: '127.0.0.1', port, path: '/', ca: servingCA.certPem, agent }, (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (body += c));
          res.once('end', () => done({ body, connection: res.headers.connection }));
        });
        req.once('error', fail);
        req.end();
      });
    expect(await http1()).toEqual({ body: 'quick', connection: 'keep-alive' });
    // An HTTP/1.1 request under way on a connection meant to be kept alive.
    const busyAgent = new Agent({ keepAlive: true, maxSockets: 1 });
    const busy = new Promise<{ connection: string | undefined; closed: Promise<void> }>((done, fail) => {
      const req = request(
        { host: '127.0.0.1', port, path: '/slow', ca: servingCA.certPem, agent: busyAgent },
        (res) => {
          const closed = new Promise<void>((c) => res.socket.once('close', () => c()));
          res.resume();
          res.once('end', () => done({ connection: res.headers.connection, closed }));
        },
      );
      req.once('error', fail);
      req.end();
    });
    await slowArrived;

    server.stopAccepting();
    await goaway;
    // The idle HTTP/1.1 connection was closed: the agent's next request opens a new one, which is refused.
    await expect(http1()).rejects.toThrow(/ECONNREFUSED/);
    release();
    await slowEnded;
    expect(slowBody).toBe('slow done');
    const answered = await busy;
    expect(answered.connection).toBe('close');
    await answered.closed;
    session.close();
    agent.destroy();
    busyAgent.destroy();
  });
});

describe('reach connections as HTTP/2 extended CONNECT streams', () => {
  /**
   * A listener whose upgrade handler stands in for the pipeline: a reach path is refused (its Status) when its port is
   * `forbidden`, else switched and echoed, with a line of its own after the client's end.
   */
  async function connectListener(seen: { method: string; url: string; upgrade: string }[]): Promise<number> {
    const server = newProxyServer(
      { certPem: ecdsaServing.certPem, keyPem: ecdsaServing.keyPem, clientCAPems: [clientCA.certPem] },
      peerName,
      (req, socket) => {
        seen.push({ method: req.method ?? '', url: req.url ?? '', upgrade: String(req.headers['upgrade']) });
        if ((req.url ?? '').endsWith('forbidden'))
          return refuseConnection(socket, { status: 429, message: 'too many', retryAfterSeconds: 1 });
        answerSwitched(socket, 'HTTP/1.1 101 Switching Protocols\r\n\r\n');
        socket.on('data', (chunk: Buffer) => socket.write(chunk));
        socket.on('end', () => socket.end('bye'));
      },
    );
    servers.push(server);
    return server.listen(0, '127.0.0.1');
  }

  const open = (session: ClientHttp2Session, path: string): ClientHttp2Stream =>
    session.request({
      ':method': 'CONNECT',
      ':protocol': 'tcp',
      ':scheme': 'https',
      ':path': path,
      ':authority': 'proxy',
    });

  const answer = (stream: ClientHttp2Stream): Promise<{ status: number; headers: object; body: string }> =>
    new Promise((done, fail) => {
      let head: IncomingHttpHeaders = {};
      const chunks: Buffer[] = [];
      stream.once('response', (h) => (head = h));
      stream.on('data', (c: Buffer) => chunks.push(c));
      stream.once('end', () =>
        done({ status: Number(head[':status']), headers: head, body: Buffer.concat(chunks).toString() }),
      );
      stream.once('error', fail);
    });

  it('announces extended CONNECT, hands each stream on as the upgrade it stands for, and answers it in HTTP/2', async () => {
    const seen: { method: string; url: string; upgrade: string }[] = [];
    const port = await connectListener(seen);
    const session = connect(`https://127.0.0.1:${port}`, { ca: servingCA.certPem });
    try {
      const settings = await new Promise<Settings>((done) => session.once('remoteSettings', done));
      expect(settings.enableConnectProtocol).toBe(true);

      // Switched: 200, then the bytes both ways; the client's END_STREAM reaches the target, which still answers.
      const echoed = open(
        session,
        '/apis/reach.concierge.sealion.dev/v1alpha1/namespaces/a/pods/b/connect?port=80',
      );
      const switched = answer(echoed);
      echoed.end('ping');
      expect(await switched).toMatchObject({ status: 200, body: 'pingbye' });

      // Refused: the Status, with its status and Retry-After as HTTP/2 headers; the session serves on.
      const refused = answer(open(session, '/apis/reach.concierge.sealion.dev/v1alpha1/x?port=forbidden'));
      const got = await refused;
      expect(got).toMatchObject({
        status: 429,
        headers: expect.objectContaining({ 'content-type': 'application/json', 'retry-after': '1' }),
      });
      expect(JSON.parse(got.body)).toMatchObject({ kind: 'Status', code: 429, message: 'too many' });
      expect(seen).toEqual([
        {
          method: 'POST',
          url: '/apis/reach.concierge.sealion.dev/v1alpha1/namespaces/a/pods/b/connect?port=80',
          upgrade: 'tcp',
        },
        {
          method: 'POST',
          url: '/apis/reach.concierge.sealion.dev/v1alpha1/x?port=forbidden',
          upgrade: 'tcp',
        },
      ]);
    } finally {
      session.destroy();
    }
  });
});
