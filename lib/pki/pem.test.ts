import { describe, expect, it } from '@jest/globals';
import { X509Certificate } from 'node:crypto';
import { connect as netConnect, createServer as netServer, type AddressInfo, type Server } from 'node:net';
import { connect as tlsConnect, createServer as tlsServer } from 'node:tls';
import { clientCertChain } from './pem.ts';
import { issueCert, newCA, type CertificateAuthority } from './pki.ts';

/**
 * The bytes a TLS 1.2 client sends while it completes a handshake presenting `cert`, trusting `ca`. In TLS 1.2
 * the client's Certificate message travels in the clear, so the certificates it sends can be found in them.
 */
async function clientHandshakeBytes(ca: CertificateAuthority, cert: string, key: string): Promise<Buffer> {
  const server = await issueCert(ca, { commonName: 'server', hosts: ['127.0.0.1'], usage: 'server' });
  const tls = tlsServer(
    { cert: server.certPem, key: server.keyPem, ca: ca.certPem, requestCert: true, maxVersion: 'TLSv1.2' },
    (socket) => socket.end(),
  );
  const captured: Buffer[] = [];
  // A relay in front of the TLS server that keeps a copy of what the client sends.
  const relay = netServer((inbound) => {
    const outbound = netConnect((tls.address() as AddressInfo).port, '127.0.0.1');
    inbound.on('data', (chunk: Buffer) => captured.push(chunk));
    inbound.pipe(outbound).pipe(inbound);
    inbound.on('error', () => outbound.destroy());
    outbound.on('error', () => inbound.destroy());
  });
  const listen = (s: Server): Promise<void> => new Promise((r) => s.listen(0, '127.0.0.1', r));
  await listen(tls);
  await listen(relay);
  try {
    await new Promise<void>((done, fail) => {
      const socket = tlsConnect({
        host: '127.0.0.1',
        port: (relay.address() as AddressInfo).port,
        ca: ca.certPem,
        cert,
        key,
        maxVersion: 'TLSv1.2',
      });
      socket.on('secureConnect', () => {
        expect(socket.authorized).toBe(true);
        socket.end();
        done();
      });
      socket.on('error', fail);
    });
  } finally {
    relay.close();
    tls.close();
  }
  return Buffer.concat(captured);
}

describe('clientCertChain', () => {
  it('keeps OpenSSL from sending the trusted CA along with a lone client certificate', async () => {
    const ca = await newCA('client-and-server-ca');
    const client = await issueCert(ca, { commonName: 'forwarder', usage: 'client' });
    const caDer = new X509Certificate(ca.certPem).raw;
    const leafDer = new X509Certificate(client.certPem).raw;

    // Without it, Node's TLS completes the chain from the trust store: the CA goes along.
    const plain = await clientHandshakeBytes(ca, client.certPem, client.keyPem);
    expect(plain.includes(leafDer)).toBe(true);
    expect(plain.includes(caDer)).toBe(true);

    const sent = await clientHandshakeBytes(ca, clientCertChain(client.certPem), client.keyPem);
    expect(sent.includes(leafDer)).toBe(true);
    expect(sent.includes(caDer)).toBe(false);
  });

  it('leaves a chain given explicitly as it is', async () => {
    const ca = await newCA('root');
    const client = await issueCert(ca, { commonName: 'forwarder', usage: 'client' });
    const chain = client.certPem + ca.certPem;
    expect(clientCertChain(chain)).toBe(chain);
  });
});
