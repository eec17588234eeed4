// Turns the SSH family's recipes (ssh-cases.ts) into bytes when a case is sent: certificates, key blobs and their
// signatures, authentication requests, and SFTP packets.
import { randomBytes } from 'node:crypto';
import {
  PRINCIPALS,
  type AuthMethod,
  type CertRecipe,
  type KeyChoice,
  type OddKey,
  type SftpOp,
  type Signing,
} from './ssh-cases.ts';
import {
  bool,
  certificate,
  mpint,
  oddModulus,
  rsaBlob,
  str,
  u32,
  u64,
  type CertificateFields,
  type HeldKey,
} from './ssh-keys.ts';
import { authHead, publickeyRequest, type SshWire } from './ssh-wire.ts';
import { FUZZ_GROUP, SSH_EXEC_GROUP, SSH_GROUPS_EXTENSION, type SshMaterial } from './target.ts';

/** The keys a lane holds beyond the target's: the one its device logins may bind, and others to sign wrongly with. */
export interface LaneKeys {
  bindable: HeldKey;
  /** Another key of each type, for signatures made by the wrong key. */
  others: Record<HeldKey['type'], HeldKey>;
}

const latin1 = (text: string): Buffer => Buffer.from(text, 'latin1');
const nowSeconds = (): bigint => BigInt(Math.floor(Date.now() / 1000));
const MAX_U64 = 2n ** 64n - 1n;

function validity(v: CertRecipe['validity']): [bigint, bigint] {
  const now = nowSeconds();
  switch (v) {
    case 'now':
      return [now - 300n, now + 3600n];
    case 'forever':
      return [0n, MAX_U64];
    case 'expired':
      return [now - 7200n, now - 3600n];
    case 'not yet':
      return [now + 3600n, now + 7200n];
    case 'inverted':
      return [now + 3600n, now - 3600n];
    case 'just started':
      return [now - 1n, now + 60n];
  }
}

const CRITICAL: Record<CertRecipe['critical'][number], [string, Buffer]> = {
  'source-address here': ['source-address', str('127.0.0.0/8')],
  'source-address elsewhere': ['source-address', str('10.0.0.0/8')],
  // Host bits past the prefix: sshd refuses the certificate.
  'source-address junk': ['source-address', str('127.0.0.1/8')],
  'force-command': ['force-command', str('true')],
  'verify-required': ['verify-required', Buffer.alloc(0)],
  unknown: ['x-unknown@example.com', Buffer.alloc(0)],
};

const EXTENSIONS: Record<CertRecipe['extensions'][number], Array<[string, Buffer]>> = {
  'permit-pty': [['permit-pty', Buffer.alloc(0)]],
  'permit-port-forwarding': [['permit-port-forwarding', Buffer.alloc(0)]],
  groups: [[SSH_GROUPS_EXTENSION, str(`${FUZZ_GROUP},${SSH_EXEC_GROUP}`)]],
  'bad groups': [[SSH_GROUPS_EXTENSION, str('a,,b\u0007')]],
  'flag with data': [['permit-X11-forwarding', str('x')]],
  unknown: [['x-unknown@example.com', str('hi')]],
  twice: [
    ['permit-agent-forwarding', Buffer.alloc(0)],
    ['permit-agent-forwarding', Buffer.alloc(0)],
  ],
};

/** Each recipe entry once, sorted by name as ssh-keygen writes them (a name twice only where the recipe says so). */
function options(entries: Array<[string, Buffer]>): Array<[string, Buffer]> {
  return entries.sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
}

/** The certificate a recipe describes, with the key it certifies. */
export function buildCertificate(
  recipe: CertRecipe,
  ssh: SshMaterial,
): { blob: Buffer; algo: string; key: HeldKey } {
  const key = ssh.keys[recipe.key];
  const ca = recipe.ca === 'itself' ? key : ssh.cas[recipe.ca];
  const [validAfter, validBefore] = validity(recipe.validity);
  const fields: CertificateFields = {
    nonce: randomBytes(32),
    serial: recipe.serial,
    kind: recipe.kind,
    keyId: latin1(recipe.keyId),
    principals: PRINCIPALS[recipe.principals].map((p) => Buffer.from(p, 'utf8')),
    validAfter,
    validBefore,
    critical: options([...new Set(recipe.critical)].map((c) => CRITICAL[c])),
    extensions: options([...new Set(recipe.extensions)].flatMap((e) => EXTENSIONS[e])),
    reserved: Buffer.alloc(0),
  };
  const made = certificate(key, ca, fields);
  const mangle = recipe.mangle;
  let blob = made.blob;
  if (mangle.how === 'flip') {
    blob = Buffer.from(blob);
    blob[mangle.at % blob.length]! ^= 0x01;
  } else if (mangle.how === 'truncate') blob = blob.subarray(0, mangle.at % blob.length);
  else if (mangle.how === 'append') blob = Buffer.concat([blob, latin1(mangle.bytes)]);
  return { blob, algo: made.algo, key };
}

const EXPONENTS: Record<Extract<OddKey, { odd: 'rsa' }>['exponent'], () => Buffer> = {
  three: () => Buffer.of(3),
  f4: () => Buffer.of(1, 0, 1),
  '64 bits': () => Buffer.alloc(8, 0xff),
  '72 bits': () => Buffer.alloc(9, 0xff),
  '1024 bits': () => oddModulus(1024),
  zero: () => Buffer.alloc(0),
  even: () => Buffer.of(1, 0, 0),
};

/** A key nobody holds: its blob, the algorithm a request names, and a signature that costs the server a check. */
export function oddKey(key: OddKey): { blob: Buffer; algo: string; signature: Buffer } {
  switch (key.odd) {
    case 'rsa': {
      const n = oddModulus(key.bits);
      // Below the modulus (a leading zero byte), so that the server does the whole modular exponentiation.
      const sig = Buffer.concat([Buffer.of(0), randomBytes(n.length - 1)]);
      return {
        blob: rsaBlob(EXPONENTS[key.exponent](), n),
        algo: 'rsa-sha2-512',
        signature: Buffer.concat([str('rsa-sha2-512'), str(sig)]),
      };
    }
    case 'ed25519':
      return {
        blob: Buffer.concat([str('ssh-ed25519'), str(randomBytes(key.length))]),
        algo: 'ssh-ed25519',
        signature: Buffer.concat([str('ssh-ed25519'), str(randomBytes(64))]),
      };
    case 'ecdsa': {
      const point = {
        'off the curve': Buffer.concat([Buffer.of(4), randomBytes(64)]),
        compressed: Buffer.concat([Buffer.of(2), randomBytes(32)]),
        'another curve': Buffer.concat([Buffer.of(4), randomBytes(96)]),
        infinity: Buffer.of(0),
      }[key.how];
      const curve = key.how === 'another curve' ? 'nistp384' : 'nistp256';
      const inner = Buffer.concat([mpint(randomBytes(32)), mpint(randomBytes(32))]);
      return {
        blob: Buffer.concat([str('ecdsa-sha2-nistp256'), str(curve), str(point)]),
        algo: 'ecdsa-sha2-nistp256',
        signature: Buffer.concat([str('ecdsa-sha2-nistp256'), str(inner)]),
      };
    }
    case 'type':
      return {
        blob: Buffer.concat([str(key.name), str(randomBytes(32))]),
        algo: key.name,
        signature: Buffer.concat([str(key.name), str(randomBytes(64))]),
      };
    case 'blob':
      return {
        blob: Buffer.concat([latin1(key.bytes), Buffer.alloc(key.pad)]),
        algo: 'ssh-rsa',
        signature: str(randomBytes(64)),
      };
  }
}

/** The signature field of a publickey request made `signing` ways, for a key of `type` held as `key`. */
function signer(
  signing: Signing,
  key: HeldKey | undefined,
  lane: LaneKeys,
  garbage: Buffer,
): ((data: Buffer) => Buffer) | Buffer | undefined {
  switch (signing) {
    case 'query':
      return undefined;
    case 'good':
      return key ? (data) => key.sign(data) : garbage;
    case 'garbage':
      return garbage;
    case 'another key':
      return key ? (data) => lane.others[key.type].sign(data) : garbage;
    case 'sha1':
      return Buffer.concat([str('ssh-rsa'), str(randomBytes(256))]);
    case 'empty':
      return Buffer.alloc(0);
  }
}

const heldKey = (choice: KeyChoice, ssh: SshMaterial, lane: LaneKeys): HeldKey | undefined =>
  choice === 'bindable' ? lane.bindable : typeof choice === 'string' ? ssh.keys[choice] : undefined;

/** The USERAUTH_REQUEST an authentication step sends, and the method ssh2 reads its answer as. */
export function authPayload(
  wire: SshWire,
  user: string,
  how: AuthMethod,
  ssh: SshMaterial,
  lane: LaneKeys,
): { method: string; payload: Buffer } {
  const name = latin1(user);
  switch (how.m) {
    case 'none':
      return { method: 'none', payload: authHead(name, 'none') };
    case 'password':
      return {
        method: 'password',
        payload: Buffer.concat([authHead(name, 'password'), bool(false), str(latin1(how.password))]),
      };
    case 'hostbased':
      return { method: 'hostbased', payload: Buffer.concat([authHead(name, 'hostbased'), latin1(how.body)]) };
    case 'unknown':
      return {
        method: how.method,
        payload: Buffer.concat([
          Buffer.of(50),
          str(name),
          str('ssh-connection'),
          str(latin1(how.method)),
          latin1(how.body),
        ]),
      };
    case 'key': {
      const held = heldKey(how.key, ssh, lane);
      const odd = typeof how.key === 'string' ? undefined : oddKey(how.key);
      const blob = held?.blob ?? odd!.blob;
      const algo = how.signing === 'sha1' && held?.type === 'ssh-rsa' ? 'ssh-rsa' : (held?.algo ?? odd!.algo);
      const garbage = odd?.signature ?? Buffer.concat([str(algo), str(randomBytes(64))]);
      return {
        method: 'publickey',
        payload: publickeyRequest(wire, name, algo, blob, signer(how.signing, held, lane, garbage)),
      };
    }
    case 'cert': {
      const made = buildCertificate(how.cert, ssh);
      const garbage = Buffer.concat([str(made.key.algo), str(randomBytes(64))]);
      return {
        method: 'publickey',
        payload: publickeyRequest(
          wire,
          name,
          made.algo,
          made.blob,
          signer(how.signing, made.key, lane, garbage),
        ),
      };
    }
  }
}

/** The keyboard-interactive request that starts a device login. */
export const deviceRequest = (user: string): Buffer =>
  Buffer.concat([authHead(latin1(user), 'keyboard-interactive'), str(''), str('')]);

/** An answer to the device login's prompt: no responses (there are no questions), or some anyway. */
export const infoResponse = (responses: string[]): Buffer =>
  Buffer.concat([Buffer.of(61), u32(responses.length), ...responses.map((r) => str(r))]);

// ---------- SFTP (draft-ietf-secsh-filexfer-02, version 3) ----------

const SFTP = {
  INIT: 1,
  OPEN: 3,
  READ: 5,
  WRITE: 6,
  LSTAT: 7,
  OPENDIR: 11,
  READDIR: 12,
  REMOVE: 13,
  MKDIR: 14,
  REALPATH: 16,
  STAT: 17,
  VERSION: 2,
  HANDLE: 102,
} as const;

const sftpPacket = (type: number, body: Buffer): Buffer =>
  Buffer.concat([u32(1 + body.length), Buffer.of(type), body]);

/** The bytes of one SFTP operation; `handle` is the last handle the server gave (or a made-up one). */
export function sftpBytes(op: SftpOp, id: number, handle: Buffer): Buffer {
  const rid = u32(id);
  const noAttrs = u32(0);
  switch (op.op) {
    case 'init':
      return sftpPacket(SFTP.INIT, u32(op.version));
    case 'realpath':
    case 'stat':
    case 'lstat':
    case 'opendir':
    case 'remove': {
      const type = {
        realpath: SFTP.REALPATH,
        stat: SFTP.STAT,
        lstat: SFTP.LSTAT,
        opendir: SFTP.OPENDIR,
        remove: SFTP.REMOVE,
      }[op.op];
      return sftpPacket(type, Buffer.concat([rid, str(latin1(op.path))]));
    }
    case 'readdir':
      return sftpPacket(SFTP.READDIR, Buffer.concat([rid, str(handle)]));
    case 'open':
      return sftpPacket(SFTP.OPEN, Buffer.concat([rid, str(latin1(op.path)), u32(1), noAttrs]));
    case 'mkdir':
      return sftpPacket(SFTP.MKDIR, Buffer.concat([rid, str(latin1(op.path)), noAttrs]));
    case 'read':
      return sftpPacket(SFTP.READ, Buffer.concat([rid, str(handle), u64(0n), u32(op.length)]));
    case 'write':
      return sftpPacket(SFTP.WRITE, Buffer.concat([rid, str(handle), u64(0n), str(latin1(op.data))]));
    case 'packet':
      return sftpPacket(op.type, latin1(op.body));
    case 'lying length':
      return Buffer.concat([u32(op.claimed), latin1(op.body)]);
  }
}

/** The SFTP packets in what the server sent on a channel: each one's type, and the last handle given. */
export function sftpAnswers(data: Buffer): { types: number[]; handle: Buffer | undefined } {
  const types: number[] = [];
  let handle: Buffer | undefined;
  let at = 0;
  while (data.length - at >= 5) {
    const length = data.readUInt32BE(at);
    if (length < 1 || data.length - at - 4 < length) break;
    const type = data[at + 4]!;
    types.push(type);
    if (type === SFTP.HANDLE && length >= 9) {
      const size = data.readUInt32BE(at + 9);
      if (13 + size <= 4 + length) handle = data.subarray(at + 13, at + 13 + size);
    }
    at += 4 + length;
  }
  return { types, handle };
}

export const SFTP_VERSION = SFTP.VERSION;
