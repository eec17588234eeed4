// @peculiar/x509 needs the Reflect polyfill before it loads (pki.ts loads it too, but jest may load x509 first).
import 'reflect-metadata';
import { describe, expect, it } from '@jest/globals';
import * as x509 from '@peculiar/x509';
import { X509Certificate, createPrivateKey, createPublicKey } from 'node:crypto';
import type { AddressInfo } from 'node:net';
import { connect as tlsConnect, createServer as createTLSServer } from 'node:tls';
import {
  CertificateNameError,
  certificateURIs,
  fingerprint,
  issueCert,
  loadCA,
  newCA,
  newCSR,
  newKeyPair,
  publicKeyFromCSR,
  spkiPin,
} from './pki.ts';

describe('pki', () => {
  it('makes a CA that signs server certificates with the requested SANs', async () => {
    const ca = await newCA('test-ca');
    const caCert = new X509Certificate(ca.certPem);
    expect(caCert.ca).toBe(true);
    expect(caCert.subject).toBe('CN=test-ca');

    const server = await issueCert(ca, {
      commonName: 'proxy',
      hosts: ['127.0.0.1', 'proxy.example.com'],
      usage: 'server',
    });
    const cert = new X509Certificate(server.certPem);
    expect(cert.ca).toBe(false);
    expect(cert.verify(caCert.publicKey)).toBe(true);
    expect(cert.checkIssued(caCert)).toBe(true);
    expect(cert.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(cert.checkHost('proxy.example.com')).toBe('proxy.example.com');
    expect(cert.checkHost('other.example.com')).toBeUndefined();
    expect(cert.keyUsage).toEqual(['1.3.6.1.5.5.7.3.1']);
    // The returned key belongs to the certificate.
    expect(cert.checkPrivateKey(createPrivateKey(server.keyPem))).toBe(true);
  });

  it('puts groups into O= and the user into CN= of client certificates', async () => {
    const ca = await newCA('test-ca');
    const client = await issueCert(ca, {
      commonName: 'alice',
      organizations: ['dev', 'ops'],
      usage: 'client',
    });
    const cert = new X509Certificate(client.certPem);
    expect(cert.subject.split('\n').sort()).toEqual(['CN=alice', 'O=dev', 'O=ops']);
    expect(cert.keyUsage).toEqual(['1.3.6.1.5.5.7.3.2']);
  });

  it('signs a public key it did not generate and returns no private key for it', async () => {
    const ca = await newCA('test-ca');
    const keys = await newKeyPair();
    const issued = await issueCert(ca, {
      commonName: 'agent',
      usage: 'client',
      publicKey: keys.publicKey,
      validityMs: 60_000,
    });
    expect(issued.keyPem).toBe('');
    const cert = new X509Certificate(issued.certPem);
    const spki = Buffer.from(await globalThis.crypto.subtle.exportKey('spki', keys.publicKey));
    expect(cert.publicKey.export({ type: 'spki', format: 'der' })).toEqual(spki);
    const lifetime = Date.parse(cert.validTo) - Date.now();
    expect(lifetime).toBeLessThanOrEqual(60_000);
    expect(lifetime).toBeGreaterThan(0);
  });

  it('reloads a CA from PEM and keeps signing with the same identity', async () => {
    const ca = await newCA('persisted-ca');
    const again = await loadCA(ca.certPem, ca.keyPem);
    expect(fingerprint(again.certPem)).toBe(fingerprint(ca.certPem));
    const leaf = await issueCert(again, { commonName: 'x', usage: 'client' });
    expect(new X509Certificate(leaf.certPem).verify(createPublicKey(ca.certPem))).toBe(true);
  });
});

/** DER of a UTF8String "kubernetes-admin", hex: what an RFC 4514 parser makes of a value that starts with `#`. */
const ADMIN_AS_DER_HEX = '0c10' + Buffer.from('kubernetes-admin').toString('hex');

/** Names an identity provider might let a user choose, each of which must come out of a certificate unchanged. */
const HOSTILE_NAMES: [string, string][] = [
  ['a leading # (hex-encoded DER to a parser)', `#${ADMIN_AS_DER_HEX}`],
  ['a forged extra attribute', 'mallory, O=system:masters'],
  ['a multi-valued RDN', 'mallory+O=system:masters'],
  ['every special character', ',+"\\<>;=#'],
  ['a trailing backslash', 'trailing\\'],
  ['leading and trailing spaces', '  spaced  '],
  ['non-ASCII letters', 'José 東京 ų 🦭'],
  ['a lone =', '='],
];

/** What a peer that presents `client` looks like to a Node TLS server: getPeerCertificate's subject. */
async function subjectSeenOverTLS(
  ca: Awaited<ReturnType<typeof newCA>>,
  client: { certPem: string; keyPem: string },
): Promise<{ CN?: string | string[]; O?: string | string[] }> {
  const serving = await issueCert(ca, { commonName: 'server', hosts: ['127.0.0.1'], usage: 'server' });
  return new Promise((done, fail) => {
    const server = createTLSServer(
      {
        cert: serving.certPem,
        key: serving.keyPem,
        ca: ca.certPem,
        requestCert: true,
        rejectUnauthorized: true,
      },
      (socket) => {
        done(socket.getPeerCertificate().subject);
        socket.end();
        server.close();
      },
    );
    server.listen(0, '127.0.0.1', () => {
      const socket = tlsConnect({
        host: '127.0.0.1',
        port: (server.address() as AddressInfo).port,
        ca: ca.certPem,
        cert: client.certPem,
        key: client.keyPem,
      });
      socket.on('error', fail);
      socket.resume();
    });
  });
}

describe('certificate subjects from hostile names', () => {
  it.each(HOSTILE_NAMES)('keeps a name with %s exactly as given', async (_what, name) => {
    const ca = await newCA('test-ca');
    const client = await issueCert(ca, { commonName: name, organizations: [name, 'dev'], usage: 'client' });
    // The certificate's own attributes, read by an ASN.1 parser: one CN and the two O values, verbatim.
    const parsed = new x509.X509Certificate(client.certPem).subjectName;
    expect(parsed.getField('CN')).toEqual([name]);
    expect(parsed.getField('O')).toEqual([name, 'dev']);
    // What Node's TLS server reports for the peer, which is how the proxy reads a client certificate.
    const seen = await subjectSeenOverTLS(ca, client);
    expect(seen.CN).toBe(name);
    expect(seen.O).toEqual([name, 'dev']);
  });

  it.each([
    ['a newline', 'alice\nO=system:masters'],
    ['a NUL', 'alice\u0000admin'],
    ['a carriage return', 'alice\r'],
    ['a DEL', 'alice\u007f'],
    ['a lone surrogate', 'alice\ud800'],
  ])('refuses a name with %s', async (_what, name) => {
    const ca = await newCA('test-ca');
    await expect(issueCert(ca, { commonName: name, usage: 'client' })).rejects.toBeInstanceOf(
      CertificateNameError,
    );
    await expect(
      issueCert(ca, { commonName: 'alice', organizations: ['dev', name], usage: 'client' }),
    ).rejects.toThrow(/organization 2/);
  });
});

describe('certificate signing requests', () => {
  it('signs the key of a valid CSR with the subject the signer chooses', async () => {
    const ca = await newCA('tunnel-ca');
    const { csrPem } = await newCSR('what-the-agent-claims');
    const cert = await issueCert(ca, {
      commonName: 'the-registered-name',
      usage: 'client',
      publicKey: await publicKeyFromCSR(csrPem),
    });
    expect(cert.cert.subject).toBe('CN=the-registered-name');
    expect(spkiPin(ca.certPem)).toMatch(/^sha256:[0-9a-f]{64}$/);
  });

  it('rejects a CSR whose signature does not match', async () => {
    const { csrPem } = await newCSR('x');
    const other = await newCSR('y');
    // Same structure, another request's signature: swap the base64 bodies' last lines.
    const tampered = csrPem.replace(/\n([^\n]+)\n-----END/, `\n${other.csrPem.split('\n').at(-3)}\n-----END`);
    await expect(publicKeyFromCSR(tampered)).rejects.toThrow();
    await expect(publicKeyFromCSR('not a csr')).rejects.toThrow(/not a PEM certificate request/);
  });

  it('refuses a CSR for any key but ECDSA P-256 before checking its signature', async () => {
    const rsa = await crypto.subtle.generateKey(
      {
        name: 'RSASSA-PKCS1-v1_5',
        modulusLength: 2048,
        publicExponent: new Uint8Array([1, 0, 1]),
        hash: 'SHA-256',
      },
      true,
      ['sign', 'verify'],
    );
    const p384 = await crypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-384' }, true, [
      'sign',
      'verify',
    ]);
    for (const [keys, signingAlgorithm] of [
      [rsa, { name: 'RSASSA-PKCS1-v1_5', hash: 'SHA-256' }],
      [p384, { name: 'ECDSA', hash: 'SHA-384' }],
    ] as const) {
      const csr = await x509.Pkcs10CertificateRequestGenerator.create({
        name: 'CN=x',
        keys,
        signingAlgorithm,
      });
      await expect(publicKeyFromCSR(csr.toString('pem'))).rejects.toThrow(
        'the CSR is not for an ECDSA P-256 key',
      );
    }
  });

  it('puts URI SANs beside the host SANs and reads them back from the parsed extension', async () => {
    const ca = await newCA('test-ca');
    const issued = await issueCert(ca, {
      commonName: 'agent',
      hosts: ['127.0.0.1'],
      uris: ['urn:example:one', 'spiffe://example.org/two'],
      usage: 'client',
    });
    const cert = new X509Certificate(issued.certPem);
    expect(cert.checkIP('127.0.0.1')).toBe('127.0.0.1');
    expect(certificateURIs(cert.raw)).toEqual(['urn:example:one', 'spiffe://example.org/two']);
    const plain = await issueCert(ca, { commonName: 'plain', usage: 'client' });
    expect(certificateURIs(new X509Certificate(plain.certPem).raw)).toEqual([]);
  });
});
