import { describe, expect, it } from '@jest/globals';
import { X509Certificate, createPrivateKey, createPublicKey } from 'node:crypto';
import {
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

  it('escapes special characters in names instead of letting them forge extra attributes', async () => {
    const ca = await newCA('test-ca');
    const client = await issueCert(ca, { commonName: 'mallory, O=system:masters', usage: 'client' });
    const subject = new X509Certificate(client.certPem).subject;
    expect(subject).not.toMatch(/^O=system:masters$/m);
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
