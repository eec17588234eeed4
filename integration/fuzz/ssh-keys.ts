// SSH's wire types and the key material the SSH family signs in with or forges: public key blobs (real ones, and odd
// ones no key stands behind: RSA moduli and exponents of any size, points off their curve, unknown types), the
// signatures a publickey request carries, and OpenSSH user certificates (PROTOCOL.certkeys) built field by field, so
// that a case can get any one of them wrong and still have a CA sign it.
import { generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto';

export const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n >>> 0);
  return b;
};
export const u64 = (n: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(BigInt.asUintN(64, n));
  return b;
};
export const bool = (b: boolean): Buffer => Buffer.of(b ? 1 : 0);
/** An SSH string: its length, then its bytes (text as UTF-8). */
export const str = (v: Buffer | string): Buffer => {
  const bytes = typeof v === 'string' ? Buffer.from(v, 'utf8') : v;
  return Buffer.concat([u32(bytes.length), bytes]);
};
/** A non-negative mpint from its big-endian magnitude: minimal, with a zero byte where the top bit is set. */
export const mpint = (magnitude: Buffer): Buffer => {
  let start = 0;
  while (start < magnitude.length && magnitude[start] === 0) start++;
  const m = magnitude.subarray(start);
  return str(m.length && m[0]! & 0x80 ? Buffer.concat([Buffer.of(0), m]) : m);
};

/** A key the fuzzer holds: its public blob, the algorithm a request names, and how it signs (an SSH signature blob). */
export interface HeldKey {
  /** The key type in the blob, e.g. ssh-ed25519. */
  type: 'ssh-ed25519' | 'ecdsa-sha2-nistp256' | 'ssh-rsa';
  blob: Buffer;
  /** The publickey algorithm a request names for it (RSA: rsa-sha2-256, since ssh-rsa signs with SHA-1). */
  algo: string;
  sign(data: Buffer): Buffer;
}

const jwkOf = (key: KeyObject): Record<string, string> =>
  key.export({ format: 'jwk' }) as Record<string, string>;
const b64u = (text: string | undefined): Buffer => Buffer.from(text ?? '', 'base64url');

export function ed25519Key(): HeldKey {
  const { publicKey, privateKey } = generateKeyPairSync('ed25519');
  return {
    type: 'ssh-ed25519',
    blob: Buffer.concat([str('ssh-ed25519'), str(b64u(jwkOf(publicKey)['x']))]),
    algo: 'ssh-ed25519',
    sign: (data) => Buffer.concat([str('ssh-ed25519'), str(sign(null, data, privateKey))]),
  };
}

export function ecdsaKey(): HeldKey {
  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
  const jwk = jwkOf(publicKey);
  const point = Buffer.concat([Buffer.of(4), b64u(jwk['x']), b64u(jwk['y'])]);
  return {
    type: 'ecdsa-sha2-nistp256',
    blob: Buffer.concat([str('ecdsa-sha2-nistp256'), str('nistp256'), str(point)]),
    algo: 'ecdsa-sha2-nistp256',
    sign: (data) => {
      const rs = sign('sha256', data, { key: privateKey, dsaEncoding: 'ieee-p1363' });
      const inner = Buffer.concat([mpint(rs.subarray(0, 32)), mpint(rs.subarray(32))]);
      return Buffer.concat([str('ecdsa-sha2-nistp256'), str(inner)]);
    },
  };
}

export function rsaKey(bits: number): HeldKey {
  const { publicKey, privateKey } = generateKeyPairSync('rsa', { modulusLength: bits });
  const jwk = jwkOf(publicKey);
  return {
    type: 'ssh-rsa',
    blob: rsaBlob(b64u(jwk['e']), b64u(jwk['n'])),
    algo: 'rsa-sha2-256',
    sign: (data) => Buffer.concat([str('rsa-sha2-256'), str(sign('sha256', data, privateKey))]),
  };
}

export const rsaBlob = (e: Buffer, n: Buffer): Buffer => Buffer.concat([str('ssh-rsa'), mpint(e), mpint(n)]);

/** A random RSA modulus of exactly `bits` bits (odd, top bit set): no key stands behind it, but it costs as one. */
export function oddModulus(bits: number): Buffer {
  const n = randomBytes(Math.ceil(bits / 8));
  const top = bits % 8 || 8;
  n[0] = (n[0]! & ((1 << top) - 1)) | (1 << (top - 1));
  n[n.length - 1]! |= 1;
  return n;
}

/** The bytes after a key blob's type name: what a certificate carries after its nonce. */
function keyFields(blob: Buffer): Buffer {
  return blob.subarray(4 + blob.readUInt32BE(0));
}

/** An OpenSSH certificate's fields, each as it goes on the wire (text as bytes, so a case can put anything there). */
export interface CertificateFields {
  nonce: Buffer;
  serial: bigint;
  /** 1: user, 2: host. */
  kind: number;
  keyId: Buffer;
  principals: Buffer[];
  validAfter: bigint;
  validBefore: bigint;
  critical: Array<[string, Buffer]>;
  extensions: Array<[string, Buffer]>;
  reserved: Buffer;
}

const options = (list: Array<[string, Buffer]>): Buffer =>
  str(Buffer.concat(list.map(([name, data]) => Buffer.concat([str(name), str(data)]))));

/** The certificate of `key` by `ca` with `fields`: the blob a publickey request carries, and the algorithm it names. */
export function certificate(
  key: HeldKey,
  ca: HeldKey,
  fields: CertificateFields,
): { blob: Buffer; algo: string } {
  const body = Buffer.concat([
    str(`${key.type}-cert-v01@openssh.com`),
    str(fields.nonce),
    keyFields(key.blob),
    u64(fields.serial),
    u32(fields.kind),
    str(fields.keyId),
    str(Buffer.concat(fields.principals.map((p) => str(p)))),
    u64(fields.validAfter),
    u64(fields.validBefore),
    options(fields.critical),
    options(fields.extensions),
    str(fields.reserved),
    str(ca.blob),
  ]);
  const algo =
    key.type === 'ssh-rsa' ? 'rsa-sha2-256-cert-v01@openssh.com' : `${key.type}-cert-v01@openssh.com`;
  return { blob: Buffer.concat([body, str(ca.sign(body))]), algo };
}

/** The public key line of `key`, as authorized_keys (and the config's certificateAuthorities) write it. */
export const keyLine = (key: HeldKey, comment: string): string =>
  `${key.type} ${key.blob.toString('base64')} ${comment}`;
