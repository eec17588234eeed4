import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile, execFileSync } from 'node:child_process';
import { copyFileSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import fc from 'fast-check';
import ssh2 from 'ssh2';
import {
  checkUserCertificate,
  fingerprint,
  isCertificateAlgorithm,
  MAX_KEY_BLOB_BYTES,
  parsePublicKeyLine,
  parseTrustedCAKeys,
  verifyKeySignature,
  type AuthorizedKey,
  type CertificateCheckOptions,
  type PublicKeyAuth,
} from './keys.ts';
import { opensshOptions } from '../../dev/openssh.ts';

// Every key and certificate here is made by the real ssh-keygen, and every signature in the last part by the real
// ssh client, so that the tests check the formats OpenSSH writes rather than our own reading of them.

let dir: string;
const path = (name: string): string => join(dir, name);
const keygen = (...args: string[]): string =>
  execFileSync('ssh-keygen', args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });

/** The blob of an OpenSSH public key or certificate file (`<type> <base64> [comment]`). */
const blobOf = (file: string): Buffer =>
  Buffer.from(readFileSync(path(file), 'utf8').split(' ')[1]!, 'base64');

/** The user keys and CA keys the tests use, by file name. */
const KEYS: Record<string, string[]> = {
  ed25519: ['-t', 'ed25519'],
  ecdsa256: ['-t', 'ecdsa', '-b', '256'],
  ecdsa384: ['-t', 'ecdsa', '-b', '384'],
  ecdsa521: ['-t', 'ecdsa', '-b', '521'],
  rsa: ['-t', 'rsa', '-b', '2048'],
  rsa1024: ['-t', 'rsa', '-b', '1024'],
  ca: ['-t', 'ed25519'],
  ca_ecdsa: ['-t', 'ecdsa', '-b', '384'],
  ca_rsa: ['-t', 'rsa', '-b', '3072'],
  ca_untrusted: ['-t', 'ed25519'],
  host: ['-t', 'ed25519'],
};

let certificates = 0;
/** Has `ca` sign a copy of `key`'s public key with ssh-keygen's `options`; returns the certificate's file name. */
function certifyFile(key: string, options: string[], ca = 'ca'): string {
  const name = `cert${++certificates}`;
  copyFileSync(path(`${key}.pub`), path(`${name}.pub`));
  keygen('-q', '-s', path(ca), '-I', `id-${name}`, ...options, path(`${name}.pub`));
  return `${name}-cert.pub`;
}
const certify = (key: string, options: string[], ca = 'ca'): Buffer => blobOf(certifyFile(key, options, ca));

/** A time inside VALID. */
const NOW = new Date('2030-06-01T00:00:00Z');
const VALID = ['-V', '20300101Z:20310101Z'];
const GROUPS = 'groups@sealion.dev';

let cas: AuthorizedKey[];
const check = (blob: Buffer, over: Partial<CertificateCheckOptions> = {}) =>
  checkUserCertificate(blob, {
    cas,
    loginName: 'alice',
    now: NOW,
    sourceIP: '127.0.0.1',
    groupsExtension: GROUPS,
    ...over,
  });

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-ssh-keys-'));
  for (const [name, args] of Object.entries(KEYS))
    keygen('-q', ...args, '-N', '', '-C', name, '-f', path(name));
  const parsed = parseTrustedCAKeys(
    ['ca', 'ca_ecdsa', 'ca_rsa'].map((ca) => readFileSync(path(`${ca}.pub`), 'utf8')),
  );
  expect(parsed.problems).toEqual([]);
  cas = parsed.keys;
});

afterAll(() => rmSync(dir, { recursive: true, force: true }));

// ---- SSH wire encoding, to build certificates ssh-keygen will not write (duplicates, trailing bytes, SHA-1). ----
const u32 = (n: number): Buffer => {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(n);
  return b;
};
const u64 = (n: bigint): Buffer => {
  const b = Buffer.alloc(8);
  b.writeBigUInt64BE(n);
  return b;
};
const str = (s: Buffer | string): Buffer => {
  const b = Buffer.from(s);
  return Buffer.concat([u32(b.length), b]);
};
const options = (list: [string, Buffer][]): Buffer =>
  Buffer.concat(list.map(([name, data]) => Buffer.concat([str(name), str(data)])));
/** Signs with an OpenSSH private key file (ssh2 reads the format), returning an SSH signature blob. */
function sshSign(keyFile: string, data: Buffer, algo: string, hash?: string): Buffer {
  const key = ssh2.utils.parseKey(readFileSync(path(keyFile)));
  if (key instanceof Error) throw key;
  return Buffer.concat([str(algo), str(key.sign(data, hash))]);
}

interface CertFields {
  certType: string;
  principals: string[];
  kind: number;
  validAfter: bigint;
  validBefore: bigint;
  critical: [string, Buffer][];
  extensions: [string, Buffer][];
  caBlob: Buffer;
  sign: (signed: Buffer) => Buffer;
  after: Buffer;
}

/** An ed25519 user certificate for `ed25519`, signed by `ca` unless `over` says otherwise. */
function build(over: Partial<CertFields> = {}): Buffer {
  const f: CertFields = {
    certType: 'ssh-ed25519-cert-v01@openssh.com',
    principals: ['alice'],
    kind: 1,
    validAfter: 0n,
    validBefore: 0xffff_ffff_ffff_ffffn,
    critical: [],
    extensions: [['permit-pty', Buffer.alloc(0)]],
    caBlob: blobOf('ca.pub'),
    sign: (signed) => sshSign('ca', signed, 'ssh-ed25519'),
    after: Buffer.alloc(0),
    ...over,
  };
  const userKey = blobOf('ed25519.pub').subarray(4 + 'ssh-ed25519'.length);
  const signed = Buffer.concat([
    str(f.certType),
    str(Buffer.alloc(32, 7)),
    userKey,
    u64(9n),
    u32(f.kind),
    str('built'),
    str(Buffer.concat(f.principals.map(str))),
    u64(f.validAfter),
    u64(f.validBefore),
    str(options(f.critical)),
    str(options(f.extensions)),
    str(''),
    str(f.caBlob),
  ]);
  return Buffer.concat([signed, str(f.sign(signed)), f.after]);
}

describe('fingerprint', () => {
  it.each(['ed25519', 'ecdsa256', 'ecdsa384', 'ecdsa521', 'rsa'])(
    'is what ssh-keygen -l says of a %s key',
    (key) => {
      const listed = keygen('-l', '-E', 'sha256', '-f', path(`${key}.pub`)).split(' ')[1];
      expect(fingerprint(blobOf(`${key}.pub`))).toBe(listed);
    },
  );
});

describe('parseTrustedCAKeys', () => {
  it('reads every supported type, skipping blank lines and comments, and keeps the comment', () => {
    const lines = [
      '# our CAs',
      '',
      ...['ca', 'ca_ecdsa', 'ca_rsa'].map((ca) => readFileSync(path(`${ca}.pub`), 'utf8')),
    ];
    const { keys, problems } = parseTrustedCAKeys(lines);
    expect(problems).toEqual([]);
    expect(keys.map((k) => [k.type, k.comment])).toEqual([
      ['ssh-ed25519', 'ca'],
      ['ecdsa-sha2-nistp384', 'ca_ecdsa'],
      ['ssh-rsa', 'ca_rsa'],
    ]);
    expect(keys[2]!.fingerprint).toBe(keygen('-l', '-f', path('ca_rsa.pub')).split(' ')[1]);
  });

  const line = (file: string): string => readFileSync(path(file), 'utf8').trim();
  /** An authorized_keys line for an RSA key with a modulus of `bits` bits (not a real key: only its shape matters). */
  const rsaLine = (bits: number, e: Buffer): string => {
    const n = Buffer.alloc(bits / 8 + 1, 0x5a);
    n[0] = 0;
    n[1] = 0xc5;
    return `ssh-rsa ${Buffer.concat([str('ssh-rsa'), str(e), str(n)]).toString('base64')}`;
  };
  it.each<[string, () => string, RegExp]>([
    ['an unsupported type', () => 'ssh-dss AAAAB3NzaC1kc3M= old', /unsupported key type ssh-dss/],
    ['a certificate', () => line(certifyFile('ed25519', VALID)), /a certificate/],
    ['a line that is no key', () => 'hello', /want "<key type> <base64 key> \[comment\]"/],
    [
      'authorized_keys options',
      () => `cert-authority ${line('ca.pub')}`,
      /unsupported key type cert-authority/,
    ],
    ['bad base64', () => 'ssh-ed25519 AAAA!!!!', /not valid base64/],
    [
      'a type that is not the key’s',
      () => line('ca.pub').replace('ssh-ed25519', 'ssh-rsa'),
      /says ssh-rsa but/,
    ],
    ['a short RSA key', () => line('rsa1024.pub'), /rsa key of 1024 bits; at least 2048/],
    // Keys whose every check would cost a stranger's worth of time.
    [
      'a 16384-bit RSA key',
      () => rsaLine(16384, Buffer.from([1, 0, 1])),
      /rsa key of 16384 bits; at most 8192/,
    ],
    [
      'an RSA exponent over 32 bits',
      () => rsaLine(2048, Buffer.from('0100000001', 'hex')),
      /exponent: over 32 bits/,
    ],
    ['an even RSA exponent', () => rsaLine(2048, Buffer.from([1, 0, 0])), /exponent: not an odd number/],
    ['an RSA exponent of 1', () => rsaLine(2048, Buffer.from([1])), /exponent: not an odd number/],
    [
      'a truncated key',
      () => `ssh-ed25519 ${blobOf('ca.pub').subarray(0, 40).toString('base64')}`,
      /truncated|beyond/,
    ],
  ])('reports %s, with its line', (_, text, problem) => {
    const { keys, problems } = parseTrustedCAKeys([line('ca.pub'), text()]);
    expect(keys).toHaveLength(1);
    expect(problems).toEqual([{ line: 2, problem: expect.stringMatching(problem) }]);
  });

  it('reports a key listed twice, naming the first line', () => {
    expect(parseTrustedCAKeys([line('ca.pub'), line('ca.pub')]).problems).toEqual([
      { line: 2, problem: 'the same key as line 1' },
    ]);
  });

  it('reads users’ own keys the same way', () => {
    const parsed = parsePublicKeyLine(line('ecdsa521.pub'));
    expect(parsed).toMatchObject({ ok: true, key: { type: 'ecdsa-sha2-nistp521', comment: 'ecdsa521' } });
  });
});

describe('checkUserCertificate', () => {
  it.each([
    ['ed25519', 'ca'],
    ['ecdsa256', 'ca_rsa'],
    ['ecdsa384', 'ca_ecdsa'],
    ['ecdsa521', 'ca'],
    ['rsa', 'ca_ecdsa'],
    ['rsa', 'ca_rsa'],
  ])('takes a %s key certified by %s', (key, ca) => {
    expect(check(certify(key, [...VALID, '-n', 'alice'], ca))).toMatchObject({
      ok: true,
      principal: 'alice',
    });
  });

  it('says who, which groups, which CA, until when, and what is permitted', () => {
    const blob = certify('ed25519', [
      ...['-V', '20300101Z:20310101Z', '-n', 'alice,bob', '-z', '42'],
      ...['-O', `extension:${GROUPS}=dev,ops`, '-O', 'source-address=127.0.0.1/32,10.0.0.0/8'],
    ]);
    expect(check(blob, { loginName: 'bob' })).toEqual({
      ok: true,
      principal: 'bob',
      groups: ['dev', 'ops'],
      keyId: expect.stringMatching(/^id-cert\d+$/),
      serial: '42',
      validBefore: new Date('2031-01-01T00:00:00Z'),
      // ssh-keygen's default extensions permit both.
      permits: { pty: true, portForwarding: true },
      caFingerprint: cas[0]!.fingerprint,
    });
  });

  it('reads the permissions from the extensions', () => {
    const permits = (options: string[]) => {
      const result = check(certify('ed25519', [...VALID, '-n', 'alice', '-O', 'clear', ...options]));
      return result.ok ? result.permits : result.reason;
    };
    expect(permits([])).toEqual({ pty: false, portForwarding: false });
    expect(permits(['-O', 'permit-pty'])).toEqual({ pty: true, portForwarding: false });
    expect(permits(['-O', 'permit-port-forwarding'])).toEqual({ pty: false, portForwarding: true });
  });

  it('gives no end to a certificate valid forever', () => {
    expect(check(certify('ed25519', ['-n', 'alice']))).toMatchObject({ ok: true, validBefore: undefined });
  });

  it('is valid from valid-after, up to but not at valid-before', () => {
    const blob = certify('ed25519', ['-V', '0x70000000:0x70000100', '-n', 'alice']);
    const at = (seconds: number) => check(blob, { now: new Date(seconds * 1000) }).ok;
    expect([at(0x70000000 - 1), at(0x70000000), at(0x70000100 - 1), at(0x70000100)]).toEqual([
      false,
      true,
      true,
      false,
    ]);
  });

  it.each<[string, () => Buffer, Partial<CertificateCheckOptions>, RegExp]>([
    [
      'a host certificate',
      () => certify('ed25519', [...VALID, '-h', '-n', 'alice']),
      {},
      /not a user certificate/,
    ],
    [
      'an expired one',
      () => certify('ed25519', ['-V', '20200101Z:20200102Z', '-n', 'alice']),
      {},
      /expired at 2020/,
    ],
    [
      'one not yet valid',
      () => certify('ed25519', ['-V', '20400101Z:20400102Z', '-n', 'alice']),
      {},
      /not valid before/,
    ],
    [
      'another login name',
      () => certify('ed25519', [...VALID, '-n', 'alice,bob']),
      { loginName: 'carol' },
      /not among/,
    ],
    [
      'a prefix of a principal',
      () => certify('ed25519', [...VALID, '-n', 'alice']),
      { loginName: 'alic' },
      /not among/,
    ],
    [
      'an empty login name',
      () => certify('ed25519', [...VALID, '-n', 'alice']),
      { loginName: '' },
      /not among/,
    ],
    ['no principals, which sshd takes as anyone', () => certify('ed25519', VALID), {}, /no principals/],
    [
      'an untrusted CA',
      () => certify('ed25519', [...VALID, '-n', 'alice'], 'ca_untrusted'),
      {},
      /untrusted CA SHA256:/,
    ],
    [
      'no trusted CA at all',
      () => certify('ed25519', [...VALID, '-n', 'alice']),
      { cas: [] },
      /untrusted CA/,
    ],
    ['a 1024-bit RSA key', () => certify('rsa1024', [...VALID, '-n', 'alice']), {}, /rsa key of 1024 bits/],
    [
      'a source address not listed',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', 'source-address=10.0.0.0/8,::1']),
      {},
      /source address 127.0.0.1 not in 10.0.0.0\/8,::1/,
    ],
    [
      'force-command',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', 'force-command=/bin/true']),
      {},
      /force-command is not supported/,
    ],
    [
      'verify-required',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', 'verify-required']),
      {},
      /verify-required is not supported/,
    ],
    [
      'an unknown critical option',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', 'critical:only-on-tuesdays@example.com=yes']),
      {},
      /unknown critical option only-on-tuesdays@example.com/,
    ],
    [
      'a groups extension without data',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}`]),
      {},
      /extension groups@sealion.dev: truncated/,
    ],
    [
      'an empty group',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}=dev,,ops`]),
      {},
      /an empty group/,
    ],
    [
      'a group with spaces around it',
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}=dev, ops`]),
      {},
      /surrounding spaces/,
    ],
    [
      `more than 100 groups`,
      () => certify('ed25519', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}=${'g,'.repeat(100)}g`]),
      {},
      /more than 100 groups/,
    ],
  ])('refuses %s', (_, blob, over, reason) => {
    expect(check(blob(), over)).toEqual({ ok: false, reason: expect.stringMatching(reason) });
  });

  it('enforces source-address against the client’s address, IPv4-mapped or not', () => {
    const blob = certify('ed25519', [
      ...VALID,
      '-n',
      'alice',
      '-O',
      'source-address=192.0.2.0/24,2001:db8::/32',
    ]);
    const from = (sourceIP: string) => check(blob, { sourceIP }).ok;
    expect(
      ['192.0.2.9', '::ffff:192.0.2.9', '2001:db8::1', '192.0.3.1', '2001:db9::1', 'nonsense'].map(from),
    ).toEqual([true, true, true, false, false, false]);
  });

  it('reads groups only from the extension it is told to, and drops repeats', () => {
    const blob = certify('ed25519', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}=dev,ops,dev`]);
    expect(check(blob)).toMatchObject({ ok: true, groups: ['dev', 'ops'] });
    expect(check(blob, { groupsExtension: undefined })).toMatchObject({ ok: true, groups: [] });
    expect(check(blob, { groupsExtension: 'teams@example.com' })).toMatchObject({ ok: true, groups: [] });
  });

  it('refuses a certificate whose signed bytes were changed', () => {
    const blob = certify('ed25519', [...VALID, '-n', 'alice']);
    const tampered = Buffer.from(blob);
    tampered[tampered.indexOf('alice')] = 'm'.charCodeAt(0);
    expect(check(tampered, { loginName: 'mlice' })).toEqual({
      ok: false,
      reason: 'the CA signature does not verify',
    });
    const badSignature = Buffer.from(blob);
    badSignature[badSignature.length - 1]! ^= 1;
    expect(check(badSignature)).toEqual({ ok: false, reason: 'the CA signature does not verify' });
  });

  describe('built by hand, for what ssh-keygen will not write', () => {
    it('takes the baseline', () => {
      expect(check(build())).toMatchObject({ ok: true, permits: { pty: true, portForwarding: false } });
    });

    it.each<[string, () => Partial<CertFields>, RegExp]>([
      [
        'an extension twice',
        () => ({
          extensions: [
            [GROUPS, str('dev')],
            [GROUPS, str('admins')],
          ] as [string, Buffer][],
        }),
        /extension groups@sealion.dev: appears twice/,
      ],
      [
        'a critical option twice',
        () => ({
          critical: [
            ['source-address', str('127.0.0.1')],
            ['source-address', str('0.0.0.0/0')],
          ] as [string, Buffer][],
        }),
        /appears twice/,
      ],
      [
        'a flag with data',
        () => ({ extensions: [['permit-pty', str('yes')]] as [string, Buffer][] }),
        /data where a flag/,
      ],
      [
        'groups with data after the list',
        () => ({ extensions: [[GROUPS, Buffer.concat([str('dev'), str('x')])]] as [string, Buffer][] }),
        /bytes after its end/,
      ],
      [
        'a group with a control character',
        () => ({ extensions: [[GROUPS, str('dev\nops')]] as [string, Buffer][] }),
        /control characters/,
      ],
      [
        'groups that are not UTF-8',
        () => ({ extensions: [[GROUPS, str(Buffer.from([0x64, 0xff]))]] as [string, Buffer][] }),
        /not UTF-8/,
      ],
      [
        'a source-address with host bits set',
        () => ({ critical: [['source-address', str('127.0.0.1/8')]] as [string, Buffer][] }),
        /host bits set/,
      ],
      [
        'a source-address wildcard',
        () => ({ critical: [['source-address', str('*')]] as [string, Buffer][] }),
        /invalid entry/,
      ],
      [
        'a source-address with spaces',
        () => ({ critical: [['source-address', str('10.0.0.0/8, 127.0.0.1')]] as [string, Buffer][] }),
        /invalid entry/,
      ],
      ['bytes after the signature', () => ({ after: Buffer.from([0]) }), /1 bytes after its end/],
      ['a principal with NUL', () => ({ principals: ['alice\0admin'] }), /principal: contains NUL/],
      [
        'more than 256 principals',
        () => ({ principals: Array.from({ length: 257 }, (_, i) => `u${i}`) }),
        /more than 256/,
      ],
      ['a host type', () => ({ kind: 2 }), /not a user certificate \(type 2\)/],
      ['an unknown type', () => ({ kind: 3 }), /not a user certificate \(type 3\)/],
      [
        'a CA signature over other bytes',
        () => ({
          sign: (signed: Buffer) => sshSign('ca', Buffer.concat([signed, Buffer.from([1])]), 'ssh-ed25519'),
        }),
        /does not verify/,
      ],
      [
        'an RSA CA signing with SHA-1 (ssh-rsa)',
        () => ({
          caBlob: blobOf('ca_rsa.pub'),
          sign: (signed: Buffer) => sshSign('ca_rsa', signed, 'ssh-rsa', 'sha1'),
        }),
        /does not verify/,
      ],
      [
        'an ed25519 signature named as another algorithm',
        () => ({ sign: (signed: Buffer) => sshSign('ca', signed, 'ssh-ed448') }),
        /does not verify/,
      ],
      [
        'a certificate as the CA key',
        () => ({ caBlob: certify('ed25519', VALID) }),
        /signed by a certificate/,
      ],
      [
        'a DSA certificate type',
        () => ({ certType: 'ssh-dss-cert-v01@openssh.com' }),
        /unsupported certificate type/,
      ],
    ])('refuses %s', (_, over, reason) => {
      expect(check(build(over()))).toEqual({ ok: false, reason: expect.stringMatching(reason) });
    });

    it('takes an RSA CA signing with SHA-256 as well as SHA-512', () => {
      const caBlob = blobOf('ca_rsa.pub');
      const sign = (signed: Buffer) => sshSign('ca_rsa', signed, 'rsa-sha2-256', 'sha256');
      expect(check(build({ caBlob, sign }))).toMatchObject({ ok: true });
    });
  });

  describe('never throws, and refuses what is broken', () => {
    it('refuses anything larger than MAX_KEY_BLOB_BYTES before reading it', () => {
      const big = Buffer.concat([build(), Buffer.alloc(MAX_KEY_BLOB_BYTES)]);
      expect(check(big)).toEqual({
        ok: false,
        reason: expect.stringMatching(/^malformed certificate: certificate of/),
      });
    });

    it('refuses every truncation of a good certificate', () => {
      const blob = certify('rsa', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}=dev`], 'ca_ecdsa');
      for (let length = 0; length < blob.length; length++)
        expect(check(blob.subarray(0, length)).ok).toBe(false);
    });

    it('refuses a good certificate with any one byte changed', () => {
      const blob = certify('ecdsa256', [...VALID, '-n', 'alice', '-O', `extension:${GROUPS}=dev`], 'ca_rsa');
      expect(check(blob).ok).toBe(true);
      fc.assert(
        fc.property(fc.nat(blob.length - 1), fc.integer({ min: 1, max: 255 }), (at, xor) => {
          const changed = Buffer.from(blob);
          changed[at]! ^= xor;
          expect(check(changed).ok).toBe(false);
        }),
        { numRuns: 300 },
      );
    });

    it('returns a refusal for random bytes, and for random bytes after a certificate type', () => {
      fc.assert(
        fc.property(fc.uint8Array({ maxLength: 2048 }), fc.boolean(), (bytes, typed) => {
          const blob = typed
            ? Buffer.concat([str('ecdsa-sha2-nistp256-cert-v01@openssh.com'), Buffer.from(bytes)])
            : Buffer.from(bytes);
          expect(check(blob).ok).toBe(false);
        }),
      );
    });

    it('verifyKeySignature returns false for random input', () => {
      const algos = [
        'ssh-ed25519',
        'ssh-rsa',
        'ecdsa-sha2-nistp256',
        'rsa-sha2-512-cert-v01@openssh.com',
        'x',
      ];
      fc.assert(
        fc.property(
          fc.constantFrom(...algos),
          fc.uint8Array({ maxLength: 600 }),
          fc.uint8Array({ maxLength: 200 }),
          fc.constantFrom(undefined, 'sha256', 'sha512', 'md5'),
          (algo, data, signature, hashAlgo) => {
            const auth = {
              key: { algo, data: Buffer.from(data) },
              signature: Buffer.from(signature),
              blob: Buffer.from('x'),
              hashAlgo,
            };
            expect(verifyKeySignature(auth)).toBe(false);
          },
        ),
      );
    });

    it('parseTrustedCAKeys reports, never throws, for random text', () => {
      fc.assert(
        fc.property(fc.array(fc.string({ maxLength: 200 }), { maxLength: 5 }), (lines) => {
          const { keys, problems } = parseTrustedCAKeys(lines);
          expect(keys.length + problems.length).toBeLessThanOrEqual(lines.length);
        }),
      );
      fc.assert(
        fc.property(fc.uint8Array({ maxLength: 300 }), (bytes) => {
          expect(parsePublicKeyLine(`ssh-ed25519 ${Buffer.from(bytes).toString('base64')}`).ok).toBe(false);
        }),
      );
    });
  });
});

describe('verifyKeySignature, with the real ssh client against an ssh2 server', () => {
  /** What the server's publickey handler saw when a request came signed. */
  interface Attempt {
    auth: PublicKeyAuth;
    verified: boolean;
  }
  let attempts: Attempt[] = [];
  /** The plain keys (by fingerprint) the server takes; certificates are taken by checkUserCertificate. */
  let plainKeys = new Set<string>();
  let server: ssh2.Server;
  const connections = new Set<ssh2.Connection>();

  beforeAll(async () => {
    server = new ssh2.Server({ hostKeys: [readFileSync(path('host'))] }, (client, info) => {
      connections.add(client);
      client.on('close', () => connections.delete(client));
      client.on('error', () => {});
      client.on('authentication', (ctx) => {
        if (ctx.method !== 'publickey') return ctx.reject(['publickey']);
        const known = isCertificateAlgorithm(ctx.key.algo)
          ? checkUserCertificate(ctx.key.data, {
              cas,
              loginName: ctx.username,
              now: new Date(),
              sourceIP: info.ip,
              groupsExtension: GROUPS,
            }).ok
          : plainKeys.has(fingerprint(ctx.key.data));
        if (!known) return ctx.reject(['publickey']);
        // Asked only whether the key would do: yes, and the client signs next.
        if (!ctx.signature) return ctx.accept();
        const verified = verifyKeySignature(ctx);
        const { key, signature, blob, hashAlgo } = ctx;
        attempts.push({ auth: { key, signature, blob, hashAlgo }, verified });
        return verified ? ctx.accept() : ctx.reject(['publickey']);
      });
      client.on('ready', () =>
        client.on('session', (accept) =>
          accept().on('exec', (acceptExec) => {
            const stream = acceptExec();
            stream.exit(0);
            stream.end();
          }),
        ),
      );
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  });

  afterAll(async () => {
    for (const connection of connections) connection.end();
    await new Promise((resolve) => server.close(resolve));
  });

  /** Runs `ssh <user>@127.0.0.1 true` with one identity (and a certificate); resolves to its exit status. */
  function ssh(key: string, cert?: string, user = 'alice', extra: string[] = []): Promise<number> {
    const { port } = server.address() as AddressInfo;
    const args = [
      ...opensshOptions(path(key)),
      ...['-o', 'PreferredAuthentications=publickey', '-o', 'ConnectTimeout=10', '-p', String(port)],
      ...(cert ? ['-o', `CertificateFile=${path(cert)}`] : []),
      ...extra,
      `${user}@127.0.0.1`,
      'true',
    ];
    return new Promise((resolve) =>
      execFile('ssh', args, { timeout: 20_000 }, (err) =>
        resolve(err ? (typeof err.code === 'number' ? err.code : -1) : 0),
      ),
    );
  }

  /** Signs in with `key` (and `cert`); returns the exit status and the signed requests the server saw. */
  async function signIn(key: string, cert?: string, user?: string, extra?: string[]) {
    attempts = [];
    const status = await ssh(key, cert, user, extra);
    return { status, attempts: attempts.map((a) => [a.auth.key.algo, a.verified]), last: attempts.at(-1) };
  }

  const LIVE = ['-V', '-5m:+1h', '-n', 'alice', '-O', `extension:${GROUPS}=dev`];

  it.each([
    ['ed25519', 'ssh-ed25519'],
    ['ecdsa256', 'ecdsa-sha2-nistp256'],
    ['ecdsa521', 'ecdsa-sha2-nistp521'],
    // ssh2 1.17.0 lists no rsa-sha2-512 in server-sig-algs (a comma is missing), so OpenSSH signs with SHA-256.
    ['rsa', 'ssh-rsa'],
  ])(
    'takes a plain %s key',
    async (key, algo) => {
      plainKeys = new Set([fingerprint(blobOf(`${key}.pub`))]);
      expect(await signIn(key)).toMatchObject({ status: 0, attempts: [[algo, true]] });
    },
    30_000,
  );

  it('takes a plain RSA key’s signature only with the SHA-2 hash ssh2 says it was made with', async () => {
    plainKeys = new Set([fingerprint(blobOf('rsa.pub'))]);
    const { last } = await signIn('rsa');
    const auth = last!.auth;
    expect(auth).toMatchObject({ key: { algo: 'ssh-rsa' }, hashAlgo: 'sha256' });
    expect(verifyKeySignature(auth)).toBe(true);
    expect(verifyKeySignature({ ...auth, hashAlgo: 'sha512' })).toBe(false);
    // An ssh-rsa request: ssh2 sets no hashAlgo, and the signature is SHA-1's.
    const key = ssh2.utils.parseKey(readFileSync(path('rsa')));
    if (key instanceof Error) throw key;
    expect(
      verifyKeySignature({ ...auth, hashAlgo: undefined, signature: key.sign(auth.blob!, 'sha1') }),
    ).toBe(false);
  }, 30_000);

  it.each([
    ['ed25519', 'ca', 'ssh-ed25519-cert-v01@openssh.com'],
    ['ecdsa256', 'ca_rsa', 'ecdsa-sha2-nistp256-cert-v01@openssh.com'],
    ['ecdsa384', 'ca', 'ecdsa-sha2-nistp384-cert-v01@openssh.com'],
    ['ecdsa521', 'ca_ecdsa', 'ecdsa-sha2-nistp521-cert-v01@openssh.com'],
    ['rsa', 'ca', 'rsa-sha2-256-cert-v01@openssh.com'],
  ])(
    'takes a %s key’s certificate from %s',
    async (key, ca, algo) => {
      plainKeys = new Set();
      expect(await signIn(key, certifyFile(key, LIVE, ca))).toMatchObject({
        status: 0,
        attempts: [[algo, true]],
      });
    },
    30_000,
  );

  it('takes an RSA certificate’s rsa-sha2-512 signature, and refuses its ssh-rsa (SHA-1) one', async () => {
    plainKeys = new Set();
    const { last } = await signIn('rsa', certifyFile('rsa', LIVE, 'ca_rsa'));
    // The request OpenSSH sends when the server lists rsa-sha2-512 (ssh2 1.17.0 does not): the same bytes but for the
    // algorithm's name, signed with SHA-512 by the same key.
    const asked = Buffer.from(last!.auth.blob!);
    asked.write('rsa-sha2-512-cert-v01@openssh.com', asked.indexOf('rsa-sha2-256-cert-v01@openssh.com'));
    const sha512 = {
      key: { algo: 'rsa-sha2-512-cert-v01@openssh.com', data: last!.auth.key.data },
      blob: asked,
      signature: sshSign('rsa', asked, 'rsa-sha2-512', 'sha512'),
    };
    expect(verifyKeySignature(sha512)).toBe(true);
    // The signature's algorithm must be the one the request names.
    expect(
      verifyKeySignature({ ...sha512, signature: sshSign('rsa', asked, 'rsa-sha2-256', 'sha256') }),
    ).toBe(false);
    const sha1 = { ...sha512, key: { ...sha512.key, algo: 'ssh-rsa-cert-v01@openssh.com' } };
    expect(verifyKeySignature({ ...sha1, signature: sshSign('rsa', asked, 'ssh-rsa', 'sha1') })).toBe(false);
  }, 30_000);

  it('refuses a signature over other data, by another key, or under another algorithm', async () => {
    plainKeys = new Set([fingerprint(blobOf('ed25519.pub'))]);
    const { last: plain } = await signIn('ed25519');
    const { last: cert } = await signIn('ecdsa384', certifyFile('ecdsa384', LIVE));
    for (const { auth } of [plain!, cert!]) {
      expect(verifyKeySignature(auth)).toBe(true);
      const otherData = Buffer.from(auth.blob!);
      otherData[otherData.length - 1]! ^= 1;
      expect(verifyKeySignature({ ...auth, blob: otherData })).toBe(false);
      expect(verifyKeySignature({ ...auth, signature: undefined })).toBe(false);
    }
    // The key is an ed25519 key, whatever the request says.
    expect(
      verifyKeySignature({ ...plain!.auth, key: { ...plain!.auth.key, algo: 'ecdsa-sha2-nistp256' } }),
    ).toBe(false);
    // A certificate's signature checked against another certificate's key.
    const other = certify('ecdsa384', LIVE);
    expect(verifyKeySignature({ ...cert!.auth, key: { ...cert!.auth.key, data: other } })).toBe(true);
    const otherKey = certify('ecdsa256', LIVE);
    expect(
      verifyKeySignature({
        ...cert!.auth,
        key: { algo: 'ecdsa-sha2-nistp256-cert-v01@openssh.com', data: otherKey },
      }),
    ).toBe(false);
    // An ecdsa-sha2-nistp384 certificate presented as nistp256.
    expect(
      verifyKeySignature({
        ...cert!.auth,
        key: { ...cert!.auth.key, algo: 'ecdsa-sha2-nistp256-cert-v01@openssh.com' },
      }),
    ).toBe(false);
  }, 30_000);

  it('turns away a certificate for another user, and one from an untrusted CA', async () => {
    plainKeys = new Set();
    expect(await signIn('ed25519', certifyFile('ed25519', LIVE), 'bob')).toMatchObject({
      status: 255,
      attempts: [],
    });
    expect(await signIn('ed25519', certifyFile('ed25519', LIVE, 'ca_untrusted'))).toMatchObject({
      status: 255,
      attempts: [],
    });
  }, 30_000);
});
