// Users' SSH public keys and OpenSSH user certificates, as pure functions: a key's fingerprint, whether a publickey
// request's signature was made by the key it names (a plain key, or the key inside a certificate), the admin's trusted
// user-CA keys read from authorized_keys lines, and whether a certificate lets its holder in as a login name, with
// the groups and permissions it carries.
//
// The formats are SSH's wire encoding (RFC 4251 section 5: uint32, uint64, string, mpint) and OpenSSH's certificate
// layout (PROTOCOL.certkeys); the rules are those sshd applies to a certificate from a TrustedUserCAKeys CA, stricter
// where Sealion cannot honour what a certificate asks (force-command, verify-required) or where sshd's default would
// be wider than a gateway wants (an empty principal list). Signatures are checked with node:crypto.
//
// Everything here reads bytes a stranger sent before any authentication, so every length is checked against what is
// left, whole blobs are bounded before they are read, and nothing throws: malformed input is a refusal.
import { createHash, createPublicKey, verify, type KeyObject } from 'node:crypto';
import ipaddr from 'ipaddr.js';

/**
 * The largest certificate (or public key blob) read at all: 16 KiB. An RSA certificate with 16384-bit keys on both
 * sides takes some 6 KiB, leaving about 10 KiB for principals, options and groups, more than any CA writes by hand;
 * anything larger is refused before a byte of it is parsed.
 */
export const MAX_KEY_BLOB_BYTES = 16 * 1024;

/** The most groups a certificate's groups extension may list: 100, far above what a person is given by hand. */
export const MAX_GROUPS = 100;

/** The longest group name (UTF-16 code units) the groups extension may hold: 256. */
export const MAX_GROUP_LENGTH = 256;

/** The most principals a certificate may list: 256, sshd's own limit. */
const MAX_PRINCIPALS = 256;

/** RSA keys below 2048 bits are refused wherever they appear (user key, certificate key, CA key). */
const MIN_RSA_BITS = 2048;
/**
 * RSA moduli above 8192 bits are refused. A stranger chooses the key whose signature the door checks, and that check's
 * cost grows with the square of the modulus and with the exponent's length: a 16384-bit key with a 64-bit exponent took
 * 11 ms a check here, an 8192-bit one with a 32-bit exponent 1.7 ms, a 2048-bit one 0.14 ms. OpenSSH takes up to
 * 16384 bits, but ssh-keygen makes 3072 by default and nobody needs more than 8192.
 */
const MAX_RSA_BITS = 8192;
/** RSA public exponents must be odd and fit in 32 bits (every key generator uses 65537). */
const MAX_RSA_EXPONENT_BYTES = 4;

/** uint64's largest value: the valid-before ssh-keygen writes for a certificate that never expires. */
const FOREVER = 0xffff_ffff_ffff_ffffn;
/** Seconds since the epoch beyond which a JavaScript Date cannot go (year 275760): as good as forever. */
const LAST_DATE_SECONDS = 8_640_000_000_000n;

const SSH_CERT_TYPE_USER = 1;

/** The plain key types Sealion takes, as SSH names them in a key blob. */
export type KeyType =
  'ssh-ed25519' | 'ecdsa-sha2-nistp256' | 'ecdsa-sha2-nistp384' | 'ecdsa-sha2-nistp521' | 'ssh-rsa';

/** Each ECDSA key type: its curve's SSH and JWK names, the hash its signatures use (RFC 5656), its field's bytes. */
const ECDSA: Record<string, { curve: string; jwk: string; hash: string; bytes: number }> = {
  'ecdsa-sha2-nistp256': { curve: 'nistp256', jwk: 'P-256', hash: 'sha256', bytes: 32 },
  'ecdsa-sha2-nistp384': { curve: 'nistp384', jwk: 'P-384', hash: 'sha384', bytes: 48 },
  'ecdsa-sha2-nistp521': { curve: 'nistp521', jwk: 'P-521', hash: 'sha512', bytes: 66 },
};

const KEY_TYPES: readonly string[] = ['ssh-ed25519', ...Object.keys(ECDSA), 'ssh-rsa'];
const isKeyType = (type: string): type is KeyType => KEY_TYPES.includes(type);

/**
 * The RSA signature algorithms taken, with their hashes. `ssh-rsa` (SHA-1) is not among them: OpenSSH refuses it by
 * default for user keys since 8.8 and for CA signatures since 8.2, and so does Sealion.
 */
const RSA_SIGNATURES: Record<string, string> = { 'rsa-sha2-256': 'sha256', 'rsa-sha2-512': 'sha512' };

/**
 * Each certificate algorithm a publickey request may name: the type written inside the certificate, and the one
 * signature algorithm the request's signature must use. The rsa-sha2 names exist only on the wire (PROTOCOL.certkeys)
 * to say which hash signs; `ssh-rsa-cert-v01@openssh.com` would sign with SHA-1 and is left out.
 */
const CERT_ALGORITHMS: Record<string, { certType: string; signature: string }> = {
  'ssh-ed25519-cert-v01@openssh.com': {
    certType: 'ssh-ed25519-cert-v01@openssh.com',
    signature: 'ssh-ed25519',
  },
  ...Object.fromEntries(
    Object.keys(ECDSA).map((type) => [
      `${type}-cert-v01@openssh.com`,
      { certType: `${type}-cert-v01@openssh.com`, signature: type },
    ]),
  ),
  'rsa-sha2-256-cert-v01@openssh.com': {
    certType: 'ssh-rsa-cert-v01@openssh.com',
    signature: 'rsa-sha2-256',
  },
  'rsa-sha2-512-cert-v01@openssh.com': {
    certType: 'ssh-rsa-cert-v01@openssh.com',
    signature: 'rsa-sha2-512',
  },
};

/** The certificate types that may be written inside a certificate, each with the plain type of the key it holds. */
const CERT_TYPES: Record<string, KeyType> = Object.fromEntries(
  KEY_TYPES.map((type) => [`${type}-cert-v01@openssh.com`, type as KeyType]),
);

/** Whether a publickey request's algorithm names a certificate (any OpenSSH certificate type, taken or not). */
export function isCertificateAlgorithm(algo: string): boolean {
  return algo.endsWith('-cert-v01@openssh.com');
}

/** OpenSSH's fingerprint of a public key (or certificate) blob: `SHA256:` and the digest in unpadded base64. */
export function fingerprint(blob: Buffer): string {
  return `SHA256:${createHash('sha256').update(blob).digest('base64').replace(/=+$/, '')}`;
}

/** What is wrong with bytes being read; caught at each exported function, never thrown out of this file. */
class Malformed extends Error {}

/** Reads SSH's wire types from a buffer, each length checked against what is left. */
class Reader {
  readonly #buf: Buffer;
  #pos = 0;

  constructor(buf: Buffer) {
    this.#buf = buf;
  }

  /** How many bytes have been read: where the next field starts. */
  get pos(): number {
    return this.#pos;
  }

  uint32(what: string): number {
    if (this.#buf.length - this.#pos < 4) throw new Malformed(`${what}: truncated`);
    const value = this.#buf.readUInt32BE(this.#pos);
    this.#pos += 4;
    return value;
  }

  uint64(what: string): bigint {
    if (this.#buf.length - this.#pos < 8) throw new Malformed(`${what}: truncated`);
    const value = this.#buf.readBigUInt64BE(this.#pos);
    this.#pos += 8;
    return value;
  }

  /** A string's bytes: a view into the buffer, never a copy. */
  string(what: string): Buffer {
    const length = this.uint32(what);
    if (length > this.#buf.length - this.#pos)
      throw new Malformed(`${what}: length ${length} beyond the data`);
    const value = this.#buf.subarray(this.#pos, this.#pos + length);
    this.#pos += length;
    return value;
  }

  /** A string that must be text: UTF-8, with no NUL (sshd reads these as C strings and refuses a NUL). */
  text(what: string): string {
    const bytes = this.string(what);
    if (bytes.includes(0)) throw new Malformed(`${what}: contains NUL`);
    try {
      return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
    } catch {
      throw new Malformed(`${what}: not UTF-8`);
    }
  }

  /**
   * A positive mpint's magnitude, as OpenSSH reads one: no sign bit set, no leading zero byte beyond the one a set
   * top bit needs, not zero.
   */
  positiveMpint(what: string): Buffer {
    const bytes = this.string(what);
    if (bytes.length === 0) throw new Malformed(`${what}: zero`);
    if (bytes[0]! & 0x80) throw new Malformed(`${what}: negative`);
    if (bytes[0] === 0 && (bytes.length === 1 || !(bytes[1]! & 0x80)))
      throw new Malformed(`${what}: not minimally encoded`);
    return bytes[0] === 0 ? bytes.subarray(1) : bytes;
  }

  atEnd(): boolean {
    return this.#pos === this.#buf.length;
  }

  end(what: string): void {
    if (!this.atEnd()) throw new Malformed(`${what}: ${this.#buf.length - this.#pos} bytes after its end`);
  }
}

/** A public key Sealion can check signatures with. */
interface PublicKey {
  type: KeyType;
  key: KeyObject;
}

const jwkKey = (jwk: Record<string, string>): KeyObject => {
  try {
    return createPublicKey({ key: jwk, format: 'jwk' });
  } catch {
    // For an EC key, most often a point that is not on the curve.
    throw new Malformed('not a valid public key');
  }
};

/** Reads a key's fields (what follows the type name in a key blob, or the nonce in a certificate). */
function readKeyFields(reader: Reader, type: KeyType): PublicKey {
  if (type === 'ssh-ed25519') {
    const pk = reader.string('ed25519 key');
    if (pk.length !== 32) throw new Malformed(`ed25519 key: ${pk.length} bytes, not 32`);
    return { type, key: jwkKey({ kty: 'OKP', crv: 'Ed25519', x: pk.toString('base64url') }) };
  }
  if (type === 'ssh-rsa') {
    const e = reader.positiveMpint('rsa exponent');
    const n = reader.positiveMpint('rsa modulus');
    const bits = n.length * 8 - Math.clz32(n[0]!) + 24;
    if (bits < MIN_RSA_BITS)
      throw new Malformed(`rsa key of ${bits} bits; at least ${MIN_RSA_BITS} are required`);
    if (bits > MAX_RSA_BITS)
      throw new Malformed(`rsa key of ${bits} bits; at most ${MAX_RSA_BITS} are taken`);
    if (e.length > MAX_RSA_EXPONENT_BYTES)
      throw new Malformed(`rsa exponent: over ${MAX_RSA_EXPONENT_BYTES * 8} bits`);
    if ((e[e.length - 1]! & 1) === 0 || (e.length === 1 && e[0]! < 3))
      throw new Malformed('rsa exponent: not an odd number of at least 3');
    return { type, key: jwkKey({ kty: 'RSA', n: n.toString('base64url'), e: e.toString('base64url') }) };
  }
  const ec = ECDSA[type]!;
  const curve = reader.string('ecdsa curve');
  if (curve.toString('latin1') !== ec.curve) throw new Malformed(`ecdsa curve: not ${ec.curve}`);
  const q = reader.string('ecdsa point');
  // Only the uncompressed form (0x04, X, Y), which is what OpenSSH writes and reads.
  if (q.length !== 1 + 2 * ec.bytes || q[0] !== 4)
    throw new Malformed('ecdsa point: not an uncompressed point');
  const x = q.subarray(1, 1 + ec.bytes).toString('base64url');
  const y = q.subarray(1 + ec.bytes).toString('base64url');
  return { type, key: jwkKey({ kty: 'EC', crv: ec.jwk, x, y }) };
}

/** A plain public key blob (string type, the key's fields, nothing after). */
function readPublicKeyBlob(blob: Buffer): PublicKey {
  if (blob.length > MAX_KEY_BLOB_BYTES) throw new Malformed(`key of ${blob.length} bytes`);
  const reader = new Reader(blob);
  const type = reader.text('key type');
  if (!isKeyType(type)) {
    if (isCertificateAlgorithm(type)) throw new Malformed('a certificate, not a plain key');
    throw new Malformed(`unsupported key type ${type} (want ${KEY_TYPES.join(', ')})`);
  }
  const key = readKeyFields(reader, type);
  reader.end('key');
  return key;
}

/** Left-pads a big-endian unsigned number to `bytes` bytes; undefined when it does not fit. */
function padTo(value: Buffer, bytes: number): Buffer | undefined {
  if (value.length > bytes) return undefined;
  return Buffer.concat([Buffer.alloc(bytes - value.length), value]);
}

/** The bytes an RSA key's signatures take: its modulus's size. */
const rsaBytes = (key: KeyObject): number => Math.ceil((key.asymmetricKeyDetails?.modulusLength ?? 0) / 8);

/**
 * Checks an SSH signature blob (string algorithm, string signature: RFC 4253 6.6, RFC 5656 3.1.2, RFC 8332, RFC 8709)
 * over `data` by `key`. `wanted` is the one signature algorithm the caller takes (a certificate algorithm fixes it);
 * without it, any that fits the key's type.
 */
function verifySSHSignature(key: PublicKey, signatureBlob: Buffer, data: Buffer, wanted?: string): boolean {
  const reader = new Reader(signatureBlob);
  const algo = reader.text('signature algorithm');
  const sig = reader.string('signature');
  reader.end('signature blob');
  if (wanted !== undefined && algo !== wanted) return false;
  if (key.type === 'ssh-ed25519') return algo === 'ssh-ed25519' && verify(null, data, key.key, sig);
  if (key.type === 'ssh-rsa') {
    const hash = RSA_SIGNATURES[algo];
    // OpenSSH may send a signature shorter than the modulus (leading zeros left out) and pads it before checking.
    const padded = padTo(sig, rsaBytes(key.key));
    return hash !== undefined && padded !== undefined && verify(hash, data, key.key, padded);
  }
  const ec = ECDSA[key.type]!;
  if (algo !== key.type) return false;
  // The signature is string(mpint r, mpint s); node:crypto takes r and s as two fixed-width halves (IEEE P1363).
  const rs = new Reader(sig);
  const r = padTo(rs.positiveMpint('ecdsa r'), ec.bytes);
  const s = padTo(rs.positiveMpint('ecdsa s'), ec.bytes);
  rs.end('ecdsa signature');
  if (r === undefined || s === undefined) return false;
  return verify(ec.hash, data, { key: key.key, dsaEncoding: 'ieee-p1363' }, Buffer.concat([r, s]));
}

/** A critical option or extension: its name and its data, unread. */
interface CertOption {
  name: string;
  data: Buffer;
}

/** An OpenSSH certificate, as read; nothing in it is checked but its encoding. */
interface Certificate {
  /** The key it certifies. */
  key: PublicKey;
  serial: bigint;
  /** 1: user, 2: host. */
  kind: number;
  keyId: string;
  /** Raw bytes: compared byte for byte with the login name, never decoded loosely. */
  principals: Buffer[];
  validAfter: bigint;
  validBefore: bigint;
  critical: CertOption[];
  extensions: CertOption[];
  /** The CA's public key blob. */
  caBlob: Buffer;
  signature: Buffer;
  /** What the CA signed: everything from the start through the CA's key. */
  signed: Buffer;
}

/** A critical options or extensions section: (string name, string data) pairs, each name once. */
function readOptions(section: Buffer, what: string): CertOption[] {
  const reader = new Reader(section);
  const options: CertOption[] = [];
  while (!reader.atEnd()) {
    const name = reader.text(`${what} name`);
    const data = reader.string(`${what} ${name}`);
    // PROTOCOL.certkeys: "Each named option may only appear once". Which copy would win is what an attacker would
    // want to choose, so a second copy is a refusal.
    if (options.some((option) => option.name === name)) throw new Malformed(`${what} ${name}: appears twice`);
    options.push({ name, data });
  }
  return options;
}

/** Reads a certificate blob (PROTOCOL.certkeys), bounded, with nothing after its signature. */
function readCertificate(blob: Buffer): Certificate {
  if (blob.length > MAX_KEY_BLOB_BYTES) throw new Malformed(`certificate of ${blob.length} bytes`);
  const reader = new Reader(blob);
  const certType = reader.text('certificate type');
  const keyType = CERT_TYPES[certType];
  if (keyType === undefined) throw new Malformed(`unsupported certificate type ${certType}`);
  reader.string('nonce');
  const key = readKeyFields(reader, keyType);
  const serial = reader.uint64('serial');
  const kind = reader.uint32('type');
  const keyId = reader.string('key id');
  if (keyId.includes(0)) throw new Malformed('key id: contains NUL');
  const principalsReader = new Reader(reader.string('principals'));
  const principals: Buffer[] = [];
  while (!principalsReader.atEnd()) {
    if (principals.length === MAX_PRINCIPALS) throw new Malformed(`more than ${MAX_PRINCIPALS} principals`);
    const principal = principalsReader.string('principal');
    if (principal.includes(0)) throw new Malformed('principal: contains NUL');
    principals.push(principal);
  }
  const validAfter = reader.uint64('valid after');
  const validBefore = reader.uint64('valid before');
  const critical = readOptions(reader.string('critical options'), 'critical option');
  const extensions = readOptions(reader.string('extensions'), 'extension');
  reader.string('reserved');
  const caBlob = reader.string('signature key');
  const signedEnd = reader.pos;
  const signature = reader.string('signature');
  reader.end('certificate');
  return {
    key,
    serial,
    kind,
    // For logs only: shown as best it can be, never compared.
    keyId: keyId.toString('utf8'),
    principals,
    validAfter,
    validBefore,
    critical,
    extensions,
    caBlob,
    signature,
    signed: blob.subarray(0, signedEnd),
  };
}

/** What the server's publickey handler is given (ssh2's PublicKeyAuthContext fits it). */
export interface PublicKeyAuth {
  /** The algorithm the request names (ssh2 turns rsa-sha2-256/512 into ssh-rsa and says the hash in hashAlgo). */
  key: { algo: string; data: Buffer };
  /** Absent when the client only asks whether the key would do. */
  signature?: Buffer | undefined;
  /** The data the client signed (session id, then the request up to the signature). */
  blob?: Buffer | undefined;
  hashAlgo?: string | undefined;
}

/**
 * Whether a publickey request's signature was made with the key it names: a plain key, or the key a certificate
 * certifies. Only that: whether the key is one the user holds, or the certificate is any good, is for the caller
 * (`checkUserCertificate`) to ask; a server asks both before it lets anyone in.
 *
 * For a plain key ssh2 has already taken the signature out of its SSH wrapper (and for ECDSA turned r and s into
 * DER). For a certificate it cannot, since the wrapper names the key's algorithm, not the certificate's: the whole
 * SSH signature blob arrives, and is read here. The key's type must agree with the algorithm the request names, and
 * RSA signatures must use SHA-2.
 */
export function verifyKeySignature(auth: PublicKeyAuth): boolean {
  const { key, signature, blob, hashAlgo } = auth;
  if (signature === undefined || blob === undefined) return false;
  try {
    if (isCertificateAlgorithm(key.algo)) {
      const algorithm = CERT_ALGORITHMS[key.algo];
      if (algorithm === undefined) return false;
      const cert = readCertificate(key.data);
      if (`${cert.key.type}-cert-v01@openssh.com` !== algorithm.certType) return false;
      return verifySSHSignature(cert.key, signature, blob, algorithm.signature);
    }
    const publicKey = readPublicKeyBlob(key.data);
    if (publicKey.type !== key.algo) return false;
    if (publicKey.type === 'ssh-ed25519') return verify(null, blob, publicKey.key, signature);
    if (publicKey.type === 'ssh-rsa') {
      // ssh2 sets hashAlgo for rsa-sha2-256/512 only; without it the request was ssh-rsa, which signs with SHA-1.
      const padded = padTo(signature, rsaBytes(publicKey.key));
      const hash = hashAlgo === 'sha256' || hashAlgo === 'sha512' ? hashAlgo : undefined;
      return hash !== undefined && padded !== undefined && verify(hash, blob, publicKey.key, padded);
    }
    return verify(ECDSA[publicKey.type]!.hash, blob, publicKey.key, signature);
  } catch {
    return false;
  }
}

/** A public key as an authorized_keys line gives it. */
export interface AuthorizedKey {
  type: KeyType;
  /** The key's blob, as SSH sends it. */
  blob: Buffer;
  /** `fingerprint(blob)`, for logs and messages. */
  fingerprint: string;
  /** What followed the key on its line; empty when nothing did. */
  comment: string;
}

/**
 * Reads one authorized_keys line holding a plain public key: `<type> <base64 blob> [comment]`. Options before the
 * type (`cert-authority`, `from=`...) are not taken: where a key sits in Sealion's config says what it is for.
 */
export function parsePublicKeyLine(
  line: string,
): { ok: true; key: AuthorizedKey } | { ok: false; problem: string } {
  const [type = '', data = '', ...comment] = line.trim().split(/\s+/);
  if (!isKeyType(type)) {
    if (isCertificateAlgorithm(type))
      return { ok: false, problem: `a certificate (${type}), not a public key` };
    if (data === '') return { ok: false, problem: 'want "<key type> <base64 key> [comment]"' };
    return { ok: false, problem: `unsupported key type ${type} (want ${KEY_TYPES.join(', ')})` };
  }
  if (data.length > (MAX_KEY_BLOB_BYTES / 3) * 4 + 4) return { ok: false, problem: 'key too long' };
  const blob = Buffer.from(data, 'base64');
  // Buffer.from skips what is not base64; the text must be exactly the blob's encoding.
  if (data.length % 4 !== 0 || blob.toString('base64') !== data)
    return { ok: false, problem: 'the key is not valid base64' };
  try {
    const key = readPublicKeyBlob(blob);
    if (key.type !== type) return { ok: false, problem: `the line says ${type} but the key is ${key.type}` };
  } catch (err) {
    return { ok: false, problem: err instanceof Malformed ? err.message : 'not a valid public key' };
  }
  return { ok: true, key: { type, blob, fingerprint: fingerprint(blob), comment: comment.join(' ') } };
}

/** A problem with one line of a key list; `line` counts from 1. */
export interface KeyLineProblem {
  line: number;
  problem: string;
}

/**
 * Reads the trusted user-CA keys an admin lists, one authorized_keys line each (`ssh-ed25519 AAAA... comment`);
 * empty lines and `#` comments are skipped. Every bad line is reported, so that config validation can say all of
 * them at once. A certificate is never a CA key (PROTOCOL.certkeys: chained certificates are not supported), and a
 * key listed twice is reported rather than silently kept once.
 */
export function parseTrustedCAKeys(lines: readonly string[]): {
  keys: AuthorizedKey[];
  problems: KeyLineProblem[];
} {
  const keys: AuthorizedKey[] = [];
  const problems: KeyLineProblem[] = [];
  const seen = new Map<string, number>();
  for (const [index, text] of lines.entries()) {
    const line = index + 1;
    if (text.trim() === '' || text.trim().startsWith('#')) continue;
    const parsed = parsePublicKeyLine(text);
    const earlier = parsed.ok ? seen.get(parsed.key.fingerprint) : undefined;
    if (!parsed.ok) problems.push({ line, problem: parsed.problem });
    else if (earlier !== undefined) problems.push({ line, problem: `the same key as line ${earlier}` });
    else {
      seen.set(parsed.key.fingerprint, line);
      keys.push(parsed.key);
    }
  }
  return { keys, problems };
}

/** What a user certificate permits beyond signing in (its extensions); each absent flag is a refusal. */
export interface CertificatePermits {
  /** `permit-pty`: a terminal may be allocated. */
  pty: boolean;
  /** `permit-port-forwarding`: ports may be forwarded. */
  portForwarding: boolean;
}

export type CertificateCheck =
  | {
      ok: true;
      /** The principal the user signs in as: the login name, found among the certificate's principals. */
      principal: string;
      /** The groups the groups extension lists, duplicates dropped, in its order; empty when it is absent. */
      groups: string[];
      /** The CA's name for the certificate, for logs. */
      keyId: string;
      /** The CA's serial number, in decimal (a uint64, and a string so that logs carry it exactly). */
      serial: string;
      /** When it stops being valid; undefined when never. */
      validBefore: Date | undefined;
      permits: CertificatePermits;
      /** The fingerprint of the CA key that signed it, for logs. */
      caFingerprint: string;
    }
  | {
      ok: false;
      /** Why, for logs only: the user is told no more than SSH's usual failure. */
      reason: string;
    };

export interface CertificateCheckOptions {
  /** The trusted user-CA keys (`parseTrustedCAKeys`). */
  cas: readonly AuthorizedKey[];
  /** The name the user signs in as (the SSH user name); it must be one of the certificate's principals. */
  loginName: string;
  now: Date;
  /** The client's address, for a source-address critical option (an IPv4-mapped IPv6 address counts as IPv4). */
  sourceIP: string;
  /**
   * The extension whose data lists the user's groups, e.g. `groups@sealion.dev` (written by
   * `ssh-keygen -O extension:groups@sealion.dev=dev,ops`). Default: none; groups are always empty.
   */
  groupsExtension?: string | undefined;
}

/** The extensions sshd knows, each a flag whose data must be empty; Sealion reads two of them. */
const FLAG_EXTENSIONS = new Set([
  'no-touch-required',
  'permit-X11-forwarding',
  'permit-agent-forwarding',
  'permit-port-forwarding',
  'permit-pty',
  'permit-user-rc',
]);

/** Characters a source-address entry may hold (sshd's list: no spaces, no wildcards, no negation). */
const CIDR_CHARACTERS = /^[0-9a-fA-F.:/]+$/;

/** An option's data that is one SSH string and nothing more (source-address, the groups extension). */
function optionText(option: CertOption, what: string): string {
  const reader = new Reader(option.data);
  const text = reader.text(what);
  reader.end(what);
  return text;
}

/**
 * One source-address entry as sshd reads it: an address, or an address/prefix length whose bits past the prefix are
 * zero (ssh-keygen refuses 127.0.0.1/8 as "inconsistent mask length", and sshd the certificate).
 */
function parseCIDR(entry: string): [ipaddr.IPv4 | ipaddr.IPv6, number] {
  if (!CIDR_CHARACTERS.test(entry)) throw new Malformed(`source-address: invalid entry "${entry}"`);
  let range: [ipaddr.IPv4 | ipaddr.IPv6, number];
  try {
    if (entry.includes('/')) range = ipaddr.parseCIDR(entry);
    else {
      const address = ipaddr.parse(entry);
      range = [address, address.kind() === 'ipv4' ? 32 : 128];
    }
  } catch {
    throw new Malformed(`source-address: invalid entry "${entry}"`);
  }
  const [address, prefix] = range;
  const bytes = address.toByteArray();
  for (let bit = prefix; bit < bytes.length * 8; bit++)
    if (bytes[bit >> 3]! & (0x80 >> (bit & 7)))
      throw new Malformed(`source-address: "${entry}" has host bits set`);
  return range;
}

/** Whether `sourceIP` is in the comma-separated CIDR list; every entry must be valid, matching or not. */
function sourceAllowed(list: string, sourceIP: string): boolean {
  const ranges = list.split(',').map(parseCIDR);
  let source: ipaddr.IPv4 | ipaddr.IPv6;
  try {
    source = ipaddr.process(sourceIP);
  } catch {
    return false;
  }
  return ranges.some(
    ([address, prefix]) => address.kind() === source.kind() && source.match(address, prefix),
  );
}

/** Reads the groups extension: one SSH string, a comma-separated list of names. */
function readGroups(option: CertOption): string[] {
  const groups = optionText(option, `extension ${option.name}`).split(',');
  if (groups.length > MAX_GROUPS)
    throw new Malformed(`extension ${option.name}: more than ${MAX_GROUPS} groups`);
  for (const group of groups) {
    if (group === '') throw new Malformed(`extension ${option.name}: an empty group`);
    if (group.length > MAX_GROUP_LENGTH)
      throw new Malformed(`extension ${option.name}: a group longer than ${MAX_GROUP_LENGTH}`);
    // Group names end up in impersonation headers and in logs: no control characters, no spaces around a name (a
    // CA that wrote "dev, ops" meant "ops").
    if (/\p{Cc}/u.test(group) || group.trim() !== group)
      throw new Malformed(`extension ${option.name}: a group with control characters or surrounding spaces`);
  }
  return [...new Set(groups)];
}

/**
 * Whether an OpenSSH certificate (the blob a publickey request carries) lets its holder in as `loginName`, as sshd
 * decides for a certificate from one of its TrustedUserCAKeys, and what it grants. The signature the client made with
 * the certificate's key is `verifyKeySignature`'s question, not this one's.
 *
 * In order: at most MAX_KEY_BLOB_BYTES, well formed (every length checked, nothing after the signature, each option
 * once); a user certificate; its key a supported type (RSA at least 2048 bits); signed by one of `cas` (byte for byte
 * the CA's key, never itself a certificate) with a valid signature (RSA: SHA-2); valid_after ≤ now < valid_before;
 * `loginName` among its principals, where sshd would take an empty list as anyone and Sealion refuses it; critical
 * options: `source-address` enforced against `sourceIP`, `force-command` refused (Sealion would not run it),
 * `verify-required` refused (Sealion does not take FIDO keys), anything else refused; extensions: sshd's flags must
 * carry no data, the groups extension must hold one well-formed list, others are ignored.
 */
export function checkUserCertificate(blob: Buffer, opts: CertificateCheckOptions): CertificateCheck {
  const refuse = (reason: string): CertificateCheck => ({ ok: false, reason });
  try {
    const cert = readCertificate(blob);
    if (cert.kind !== SSH_CERT_TYPE_USER) return refuse(`not a user certificate (type ${cert.kind})`);

    // Trust before anything else is worth the work: the CA key must be one the admin listed, byte for byte.
    const ca = opts.cas.find((candidate) => candidate.blob.equals(cert.caBlob));
    if (ca === undefined) {
      if (isCertificateAlgorithm(new Reader(cert.caBlob).text('signature key type')))
        return refuse('signed by a certificate, not a CA key');
      return refuse(`signed by an untrusted CA ${fingerprint(cert.caBlob)}`);
    }
    const caKey = readPublicKeyBlob(ca.blob);
    if (!verifySSHSignature(caKey, cert.signature, cert.signed))
      return refuse('the CA signature does not verify');

    if (!(opts.now instanceof Date) || Number.isNaN(opts.now.getTime()))
      return refuse('no valid current time');
    const now = BigInt(Math.floor(opts.now.getTime() / 1000));
    if (now < cert.validAfter) return refuse(`not valid before ${formatSeconds(cert.validAfter)}`);
    if (now >= cert.validBefore) return refuse(`expired at ${formatSeconds(cert.validBefore)}`);

    if (cert.principals.length === 0)
      return refuse('no principals (sshd would take any user; Sealion does not)');
    const login = Buffer.from(opts.loginName, 'utf8');
    if (login.length === 0 || !cert.principals.some((principal) => principal.equals(login)))
      return refuse(`${JSON.stringify(opts.loginName)} is not among its principals`);

    for (const option of cert.critical) {
      if (option.name === 'source-address') {
        const list = optionText(option, 'critical option source-address');
        if (!sourceAllowed(list, opts.sourceIP))
          return refuse(`source address ${opts.sourceIP} not in ${list}`);
      } else if (option.name === 'force-command')
        return refuse('critical option force-command is not supported');
      else if (option.name === 'verify-required')
        return refuse('critical option verify-required is not supported');
      else return refuse(`unknown critical option ${option.name}`);
    }

    let groups: string[] = [];
    for (const option of cert.extensions) {
      if (FLAG_EXTENSIONS.has(option.name)) {
        if (option.data.length !== 0) return refuse(`extension ${option.name}: data where a flag has none`);
      } else if (option.name === opts.groupsExtension) groups = readGroups(option);
    }
    const has = (name: string): boolean => cert.extensions.some((option) => option.name === name);

    return {
      ok: true,
      principal: opts.loginName,
      groups,
      keyId: cert.keyId,
      serial: cert.serial.toString(),
      validBefore:
        cert.validBefore === FOREVER || cert.validBefore >= LAST_DATE_SECONDS
          ? undefined
          : new Date(Number(cert.validBefore) * 1000),
      permits: { pty: has('permit-pty'), portForwarding: has('permit-port-forwarding') },
      caFingerprint: ca.fingerprint,
    };
  } catch (err) {
    // Malformed option data, or anything node:crypto throws: still a refusal, never an exception.
    return refuse(
      err instanceof Malformed ? `malformed certificate: ${err.message}` : 'certificate unreadable',
    );
  }
}

/** A certificate time for a log line: ISO 8601, or the raw number when no Date can hold it. */
function formatSeconds(seconds: bigint): string {
  if (seconds === FOREVER) return 'forever';
  return seconds < LAST_DATE_SECONDS ? new Date(Number(seconds) * 1000).toISOString() : `${seconds}s`;
}
