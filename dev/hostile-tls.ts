// TLS clients Sealion never makes, for the tests of what its listeners check before anyone is authenticated: a
// client certificate with an RSA key, and a client that signs with that key whatever the server asked for.
import { webcrypto } from 'node:crypto';
import { connect as netConnect, createServer, type AddressInfo, type Socket } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import {
  issueCert,
  privateKeyToPem,
  type CertificateAuthority,
  type CertUsage,
  type KeyPairPem,
} from '../lib/pki/pki.ts';

/** A certificate from `ca` for a new 2048-bit RSA key (Sealion itself issues P-256 keys only). */
export async function rsaCertificate(
  ca: CertificateAuthority,
  commonName: string,
  usage: CertUsage,
  hosts: string[] = [],
): Promise<KeyPairPem> {
  const keys = await webcrypto.subtle.generateKey(
    {
      name: 'RSASSA-PKCS1-v1_5',
      modulusLength: 2048,
      publicExponent: new Uint8Array([1, 0, 1]),
      hash: 'SHA-256',
    },
    true,
    ['sign', 'verify'],
  );
  const cert = await issueCert(ca, { commonName, usage, hosts, publicKey: keys.publicKey });
  return { certPem: cert.certPem, keyPem: await privateKeyToPem(keys.privateKey) };
}

const HANDSHAKE_RECORD = 22;
const CHANGE_CIPHER_SPEC_RECORD = 20;
const CERTIFICATE_REQUEST = 13;
const RSA_SIGN = 1;
const RSA_PSS_RSAE_SHA256 = 0x0804;

/** The length of the whole records at the start of `data` (a record: type, version, 2-byte length, body). */
function wholeRecords(data: Buffer): number {
  let at = 0;
  while (at + 5 <= data.length && at + 5 + data.readUInt16BE(at + 3) <= data.length)
    at += 5 + data.readUInt16BE(at + 3);
  return at;
}

/**
 * Rewrites, in place, each TLS 1.2 CertificateRequest in these whole records so that it asks for RSA: every
 * certificate type becomes rsa_sign, every signature algorithm rsa_pss_rsae_sha256. Lengths stay the same. A
 * handshake message split across records is left alone (a server sends its first flight in one record).
 */
function askForRSA(records: Buffer): void {
  for (let at = 0; at < records.length; at += 5 + records.readUInt16BE(at + 3)) {
    if (records[at] !== HANDSHAKE_RECORD) continue;
    const end = at + 5 + records.readUInt16BE(at + 3);
    for (let msg = at + 5; msg + 4 <= end; msg += 4 + records.readUIntBE(msg + 1, 3)) {
      if (records[msg] !== CERTIFICATE_REQUEST) continue;
      const types = msg + 4;
      records.fill(RSA_SIGN, types + 1, types + 1 + records[types]!);
      const algorithms = types + 1 + records[types]!;
      for (let i = 0; i < records.readUInt16BE(algorithms); i += 2)
        records.writeUInt16BE(RSA_PSS_RSAE_SHA256, algorithms + 2 + i);
    }
  }
}

/**
 * Relays one connection to the server at `port`, rewriting the server's plaintext handshake records (TLS 1.2 sends
 * its whole first flight in the clear) with askForRSA, and everything after its ChangeCipherSpec as it is.
 */
function relayAskingForRSA(client: Socket, port: number): void {
  const server = netConnect(port, '127.0.0.1');
  const end = (): void => {
    client.destroy();
    server.destroy();
  };
  for (const socket of [client, server]) socket.on('error', end).on('close', end);
  client.pipe(server);
  let pending = Buffer.alloc(0);
  let plain = true;
  server.on('data', (data: Buffer) => {
    if (!plain) return void client.write(data);
    pending = Buffer.concat([pending, data]);
    const records = Buffer.from(pending.subarray(0, wholeRecords(pending)));
    pending = pending.subarray(records.length);
    askForRSA(records);
    for (let at = 0; at < records.length; at += 5 + records.readUInt16BE(at + 3))
      if (records[at] === CHANGE_CIPHER_SPEC_RECORD) plain = false;
    client.write(records);
  });
}

/**
 * Handshakes with the TLS server at `port` (TLS 1.2; TLS 1.3 hides the server's CertificateRequest) as a client that
 * signs its CertificateVerify with the RSA key of `credential` whatever kinds of signature the server listed: a
 * relay in between makes the request ask for RSA. The handshake's transcripts then differ, so the signature can never
 * verify; what tells is how the server refuses it. Resolves with the code of the client's error: a server that checked
 * the signature sends decrypt_error (`ERR_SSL_TLSV1_ALERT_DECRYPT_ERROR`); one that refused its kind first,
 * handshake_failure.
 */
export async function signWithRSAAnyway(port: number, credential: KeyPairPem): Promise<string> {
  const relay = createServer((client) => relayAskingForRSA(client, port));
  await new Promise<void>((done) => relay.listen(0, '127.0.0.1', done));
  try {
    return await new Promise<string>((done) => {
      const socket = tlsConnect({
        host: '127.0.0.1',
        port: (relay.address() as AddressInfo).port,
        maxVersion: 'TLSv1.2',
        rejectUnauthorized: false,
        cert: credential.certPem,
        key: credential.keyPem,
      });
      socket.once('secureConnect', () => {
        socket.destroy();
        done('connected');
      });
      socket.once('error', (err: Error & { code?: string }) => done(err.code ?? err.message));
    });
  } finally {
    await new Promise((done) => relay.close(done));
  }
}
