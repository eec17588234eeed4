// The SSH family's cases as data (what fast-check generates, shrinks and prints), and the verdicts the oracle holds
// them to: which credentials must sign in, which must never. A case names its keys and certificates by recipe, never
// by their bytes, so a printed counterexample carries no working credential and stays short; the bytes are made when
// the case is sent (ssh.ts).
import fc from 'fast-check';
import { FUZZ_USER } from './target.ts';

/** Where a case connects from: the address the positive controls use, or a loopback address of its own. */
export type From = 'shared' | 'own';

/** What a case aims at: counted as reached when it got there, so a door that drops everyone fails the family. */
export type Aim =
  | 'transport'
  | 'sign-in'
  | 'device prompt'
  | 'channel'
  | 'exec'
  | 'sftp'
  | 'malformed'
  | 'pipeline'
  | 'crowd';

/** Bytes as a latin1 string, so that a printed case shows them and every byte value survives. */
export type Bytes = string;
const bytes = (maxLength: number): fc.Arbitrary<Bytes> =>
  fc.uint8Array({ maxLength }).map((b) => Buffer.from(b).toString('latin1'));
const utf8 = (maxLength: number): fc.Arbitrary<Bytes> =>
  fc.string({ unit: 'grapheme', maxLength }).map((s) => Buffer.from(s, 'utf8').toString('latin1'));

/** Where a case stops before the key exchange ends, if it does. */
export type PreStop =
  | 'silent'
  | 'partial ident'
  | 'bad ident'
  | 'ident then garbage'
  | 'server kexinit'
  | 'kex reply'
  | 'kex done';

/** A key the fuzzer holds and may sign with, or one nobody holds. */
export type KeyChoice =
  | 'ed25519'
  | 'ecdsa'
  | 'rsa'
  /** The lane's own key, which a device login in the lane may have bound: it may sign in. */
  | 'bindable'
  | OddKey;
export type OddKey =
  | {
      odd: 'rsa';
      bits: number;
      exponent: 'three' | 'f4' | '64 bits' | '72 bits' | '1024 bits' | 'zero' | 'even';
    }
  | { odd: 'ed25519'; length: number }
  | { odd: 'ecdsa'; how: 'off the curve' | 'compressed' | 'another curve' | 'infinity' }
  | { odd: 'type'; name: string }
  | { odd: 'blob'; bytes: Bytes; pad: number };

/** How a request is signed: not (a query), by the key it names, or wrongly. */
export type Signing = 'query' | 'good' | 'garbage' | 'another key' | 'sha1' | 'empty';

/** An OpenSSH certificate by recipe: a valid one for the fuzz user, and every way of getting it wrong. */
export interface CertRecipe {
  ca: 'ed25519' | 'rsa' | 'stranger' | 'itself';
  key: 'ed25519' | 'ecdsa' | 'rsa';
  kind: number;
  /** `user, 300 times`: more principals than the door reads (256). */
  principals: 'user' | 'user and others' | 'others' | 'none' | 'user with NUL' | 'user, 300 times';
  validity: 'now' | 'forever' | 'expired' | 'not yet' | 'inverted' | 'just started';
  critical: Array<
    | 'source-address here'
    | 'source-address elsewhere'
    | 'source-address junk'
    | 'force-command'
    | 'verify-required'
    | 'unknown'
  >;
  extensions: Array<
    'permit-pty' | 'permit-port-forwarding' | 'groups' | 'bad groups' | 'flag with data' | 'unknown' | 'twice'
  >;
  keyId: Bytes;
  serial: bigint;
  mangle: { how: 'none' } | { how: 'flip' | 'truncate'; at: number } | { how: 'append'; bytes: Bytes };
}

export type AuthMethod =
  | { m: 'none' }
  | { m: 'password'; password: Bytes }
  | { m: 'hostbased'; body: Bytes }
  | { m: 'key'; key: KeyChoice; signing: Signing }
  | { m: 'cert'; cert: CertRecipe; signing: Signing }
  | { m: 'unknown'; method: Bytes; body: Bytes };

/** What a device login does once its prompt is shown. */
export type DeviceThen = 'walk away' | 'answer' | 'answer wrongly' | 'abort' | 'approve' | 'wait';

export type SftpOp =
  | { op: 'init'; version: number }
  | { op: 'realpath' | 'stat' | 'lstat' | 'opendir' | 'readdir' | 'open' | 'remove' | 'mkdir'; path: Bytes }
  | { op: 'read'; length: number }
  | { op: 'write'; data: Bytes }
  | { op: 'packet'; type: number; body: Bytes }
  | { op: 'lying length'; claimed: number; body: Bytes };

export type Step =
  | { t: 'service'; name: string }
  | { t: 'auth'; user: Bytes; how: AuthMethod; wait: boolean }
  | { t: 'device'; then: DeviceThen }
  /** `n` signed publickey requests sent at once, none waiting for the answer to the one before. */
  | { t: 'burst'; n: number; key: OddKey; signing: Signing }
  | { t: 'raw'; type: number; body: Bytes }
  | { t: 'oversized'; type: number; size: number }
  | { t: 'garbage'; bytes: Bytes }
  | { t: 'ignore'; size: number }
  | { t: 'rekey' }
  | { t: 'open'; kind: string; window: number; maxPacket: number; reads: boolean; dest: Bytes; port: number }
  | { t: 'channels'; n: number }
  | { t: 'exec'; command: Bytes }
  | { t: 'pty'; term: Bytes; cols: number; rows: number; modes: Bytes }
  | { t: 'shell' }
  | { t: 'subsystem'; name: string }
  | { t: 'sftp'; ops: SftpOp[] }
  | { t: 'request'; name: string; wantReply: boolean; body: Bytes }
  | { t: 'data'; bytes: Bytes }
  | { t: 'window'; n: number }
  | { t: 'eof' }
  | { t: 'close channel' }
  | { t: 'global'; name: string; wantReply: boolean; body: Bytes }
  | { t: 'pause'; ms: number };

export interface Offer {
  kex: string;
  cipher: string;
  mac: string;
  compress: 'none' | 'zlib' | 'zlib@openssh.com';
}

export interface SessionCase {
  aim: Exclude<Aim, 'crowd'>;
  from: From;
  /** The software version the client names (`SSH-2.0-<this>`), or ssh2's own. */
  ident: Bytes | null;
  offer: Offer | null;
  stop: PreStop;
  /** What goes on the wire for the raw stops (a bad ident, garbage after a good one). */
  preBytes: Bytes;
  steps: Step[];
  end: 'close' | 'reset' | 'hold';
  holdMs: number;
}

/** Connections held at a stage from one address while a well-behaved user from there signs in. */
export interface CrowdCase {
  aim: 'crowd';
  from: From;
  count: number;
  stage: 'connected' | 'ident' | 'kex done' | 'failed sign-in';
}

export type SshCase = SessionCase | CrowdCase;

// ---------- what must and must not sign in ----------

/** Whether a credential lets its holder in: `must` (valid, correctly signed), `may` (a key a login may have bound), `never`. */
export type Grant = 'must' | 'may' | 'never';

/** The principals each recipe names. */
export const PRINCIPALS: Record<CertRecipe['principals'], string[]> = {
  user: [FUZZ_USER],
  'user and others': ['root', FUZZ_USER, 'x'],
  others: ['root', 'fuzzer'],
  none: [],
  'user with NUL': [`${FUZZ_USER}\0`],
  'user, 300 times': Array.from({ length: 300 }, () => FUZZ_USER),
};

/**
 * What a certificate recipe grants its holder signing with `signing` as `user`: in as that user when the name is one of
 * its principals (of at most 256, none with a NUL), it is a user certificate from a trusted CA, valid now, with no
 * critical option but a source address that admits loopback, sshd's flags without data, and well-formed groups.
 */
export function certGrant(cert: CertRecipe, signing: Signing, user: Bytes): Grant {
  const valid =
    (cert.ca === 'ed25519' || cert.ca === 'rsa') &&
    cert.kind === 1 &&
    ['user', 'user and others', 'others'].includes(cert.principals) &&
    PRINCIPALS[cert.principals].includes(user) &&
    ['now', 'forever', 'just started'].includes(cert.validity) &&
    cert.critical.every((c) => c === 'source-address here') &&
    cert.extensions.every((e) => ['permit-pty', 'permit-port-forwarding', 'groups', 'unknown'].includes(e)) &&
    // Nothing appended is no mangling.
    (cert.mangle.how === 'none' || (cert.mangle.how === 'append' && cert.mangle.bytes === '')) &&
    !cert.keyId.includes('\0');
  return valid && signing === 'good' ? 'must' : 'never';
}

/**
 * What an authentication method grants `user`. A plain key signs in only once a device login bound it, which binds the
 * first key its connection proved: the lane's own key, or any the fuzzer holds that `bound` says a login may have
 * bound (the run records a key there before its login is approved).
 */
export function methodGrant(how: AuthMethod, user: Bytes, bound: (key: KeyChoice) => boolean): Grant {
  if (how.m === 'cert') return certGrant(how.cert, how.signing, user);
  if (how.m === 'key' && how.signing === 'good' && (how.key === 'bindable' || bound(how.key))) return 'may';
  return 'never';
}

/** A valid certificate for the fuzz user, as the positive control and the crowd's user present it. */
export const VALID_CERT: CertRecipe = {
  ca: 'ed25519',
  key: 'ed25519',
  kind: 1,
  principals: 'user',
  validity: 'now',
  critical: [],
  extensions: ['permit-pty', 'permit-port-forwarding', 'groups'],
  keyId: 'fuzz',
  serial: 1n,
  mangle: { how: 'none' },
};

// ---------- arbitraries ----------

const user = fc.oneof(
  { weight: 8, arbitrary: fc.constant(FUZZ_USER) },
  { weight: 1, arbitrary: fc.constantFrom('', 'root', 'fuzzer', `${FUZZ_USER}\0`, 'x'.repeat(300)) },
  { weight: 1, arbitrary: utf8(20) },
);

const certRecipe: fc.Arbitrary<CertRecipe> = fc.record({
  ca: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom('ed25519' as const, 'rsa' as const) },
    { weight: 1, arbitrary: fc.constantFrom('stranger' as const, 'itself' as const) },
  ),
  key: fc.constantFrom('ed25519' as const, 'ecdsa' as const, 'rsa' as const),
  kind: fc.oneof(
    { weight: 8, arbitrary: fc.constant(1) },
    { weight: 1, arbitrary: fc.constantFrom(0, 2, 3, 0xffffffff) },
  ),
  principals: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom('user' as const, 'user and others' as const) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        'others' as const,
        'none' as const,
        'user with NUL' as const,
        'user, 300 times' as const,
      ),
    },
  ),
  validity: fc.oneof(
    { weight: 6, arbitrary: fc.constantFrom('now' as const, 'forever' as const) },
    {
      weight: 1,
      arbitrary: fc.constantFrom(
        'expired' as const,
        'not yet' as const,
        'inverted' as const,
        'just started' as const,
      ),
    },
  ),
  critical: fc.oneof(
    { weight: 6, arbitrary: fc.constant<CertRecipe['critical']>([]) },
    {
      weight: 2,
      arbitrary: fc.array(
        fc.constantFrom(
          'source-address here' as const,
          'source-address elsewhere' as const,
          'source-address junk' as const,
          'force-command' as const,
          'verify-required' as const,
          'unknown' as const,
        ),
        { maxLength: 3 },
      ),
    },
  ),
  extensions: fc.array(
    fc.oneof(
      {
        weight: 6,
        arbitrary: fc.constantFrom(
          'permit-pty' as const,
          'permit-port-forwarding' as const,
          'groups' as const,
          'unknown' as const,
        ),
      },
      {
        weight: 1,
        arbitrary: fc.constantFrom('bad groups' as const, 'flag with data' as const, 'twice' as const),
      },
    ),
    { maxLength: 4 },
  ),
  keyId: fc.oneof(
    { weight: 4, arbitrary: fc.constant('fuzz') },
    { weight: 1, arbitrary: utf8(40) },
    { weight: 1, arbitrary: bytes(20) },
  ),
  serial: fc.oneof(fc.constant(1n), fc.bigInt({ min: 0n, max: 2n ** 64n - 1n })),
  mangle: fc.oneof(
    { weight: 8, arbitrary: fc.constant({ how: 'none' as const }) },
    {
      weight: 2,
      arbitrary: fc.record({ how: fc.constantFrom('flip' as const, 'truncate' as const), at: fc.nat() }),
    },
    { weight: 1, arbitrary: fc.record({ how: fc.constant('append' as const), bytes: bytes(40) }) },
  ),
});

/** RSA sizes: the door's bounds (2048 to 16384 bits) and both sides of each, and far past them. */
const rsaBits = fc.oneof(
  fc.constantFrom(1024, 2047, 2048, 4096, 8192, 16383, 16384, 16385, 32768, 100_000, 130_000, 270_000),
  fc.integer({ min: 512, max: 20_000 }),
);
const oddKey: fc.Arbitrary<OddKey> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      odd: fc.constant('rsa' as const),
      bits: rsaBits,
      exponent: fc.constantFrom(
        'three' as const,
        'f4' as const,
        '64 bits' as const,
        '72 bits' as const,
        '1024 bits' as const,
        'zero' as const,
        'even' as const,
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      odd: fc.constant('ed25519' as const),
      length: fc.constantFrom(0, 31, 33, 64, 10_000),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      odd: fc.constant('ecdsa' as const),
      how: fc.constantFrom(
        'off the curve' as const,
        'compressed' as const,
        'another curve' as const,
        'infinity' as const,
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      odd: fc.constant('type' as const),
      name: fc.constantFrom(
        'ssh-dss',
        'sk-ssh-ed25519@openssh.com',
        'ssh-ed25519-cert-v01@openssh.com',
        'ssh-rsa-cert-v01@openssh.com',
        'x',
        '',
      ),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      odd: fc.constant('blob' as const),
      bytes: bytes(64),
      pad: fc.constantFrom(0, 0, 20_000, 33_000, 40_000),
    }),
  },
);
const keyChoice: fc.Arbitrary<KeyChoice> = fc.oneof(
  { weight: 3, arbitrary: fc.constantFrom<KeyChoice>('ed25519', 'ecdsa', 'rsa', 'bindable') },
  { weight: 3, arbitrary: oddKey },
);
const signing = fc.constantFrom<Signing>('query', 'good', 'good', 'garbage', 'another key', 'sha1', 'empty');

const authMethod: fc.Arbitrary<AuthMethod> = fc.oneof(
  { weight: 1, arbitrary: fc.constant({ m: 'none' as const }) },
  { weight: 1, arbitrary: fc.record({ m: fc.constant('password' as const), password: utf8(20) }) },
  { weight: 1, arbitrary: fc.record({ m: fc.constant('hostbased' as const), body: bytes(60) }) },
  { weight: 5, arbitrary: fc.record({ m: fc.constant('key' as const), key: keyChoice, signing }) },
  { weight: 6, arbitrary: fc.record({ m: fc.constant('cert' as const), cert: certRecipe, signing }) },
  {
    weight: 1,
    arbitrary: fc.record({
      m: fc.constant('unknown' as const),
      method: fc.oneof(fc.constantFrom('gssapi-with-mic', 'publickey', 'keyboard-interactive', ''), utf8(12)),
      body: bytes(40),
    }),
  },
);
const authStep = (wait: fc.Arbitrary<boolean>): fc.Arbitrary<Step> =>
  fc.record({ t: fc.constant('auth' as const), user, how: authMethod, wait });

/** The valid certificate for the fuzz user, waited for: what a case that aims past sign-in starts with. */
export const SIGN_IN: Step = {
  t: 'auth',
  user: FUZZ_USER,
  how: { m: 'cert', cert: VALID_CERT, signing: 'good' },
  wait: true,
};
const SERVICE: Step = { t: 'service', name: 'ssh-userauth' };

/** Message numbers: unknown ones, ones only a server sends, and the transport's own, out of place. */
const messageType = fc.oneof(
  fc.constantFrom(
    1,
    2,
    3,
    4,
    5,
    6,
    7,
    20,
    21,
    30,
    31,
    50,
    51,
    52,
    60,
    61,
    80,
    81,
    82,
    90,
    91,
    92,
    93,
    94,
    95,
    96,
    97,
    98,
    99,
    100,
  ),
  fc.integer({ min: 0, max: 255 }),
);
const malformedStep: fc.Arbitrary<Step> = fc.oneof(
  { weight: 4, arbitrary: fc.record({ t: fc.constant('raw' as const), type: messageType, body: bytes(80) }) },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('oversized' as const),
      type: messageType,
      size: fc.constantFrom(34_000, 34_990, 35_001, 40_000, 70_000),
    }),
  },
  { weight: 1, arbitrary: fc.record({ t: fc.constant('garbage' as const), bytes: bytes(100) }) },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('ignore' as const),
      size: fc.constantFrom(0, 1_000, 34_000, 1 << 20, 8 << 20),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ t: 'rekey' as const }) },
);

const clusterWord = fc.oneof(
  { weight: 6, arbitrary: fc.constantFrom('hub', 'fuzz-agent-0', 'fuzz-agent-g0', 'edge', 'hub') },
  { weight: 1, arbitrary: utf8(10) },
);
const target = fc
  .tuple(
    clusterWord,
    fc.constantFrom('sealion-fuzz', 'default', 'kube-system', 'x', 'UPPER', ''),
    fc.constantFrom('pod', 'fuzz-control', 'a.b', '-x', ''),
    fc.option(fc.constantFrom('c', 'main', 'UP'), { nil: undefined }),
  )
  .map(([c, ns, pod, container]) => [c, ns, pod, ...(container === undefined ? [] : [container])].join('/'));
const command: fc.Arbitrary<Bytes> = fc.oneof(
  {
    weight: 6,
    arbitrary: fc
      .tuple(
        target,
        fc.constantFrom('', ' -- true', ' -- sh -c "exit 3"', ' -- ls /', " -- 'a", ' -- a | b', ' -- $(x)'),
      )
      .map(([t, c]) => `${t}${c}`),
  },
  {
    weight: 1,
    arbitrary: fc.constantFrom('', 'scp -f /x', 'scp -t /', 'internal-sftp', '\0', 'x'.repeat(20_000)),
  },
  { weight: 1, arbitrary: utf8(60) },
  { weight: 1, arbitrary: bytes(60) },
);
const forwardDest = fc.oneof(
  {
    weight: 4,
    arbitrary: fc
      .tuple(
        clusterWord,
        fc.constantFrom('sealion-fuzz', 'default', 'x'),
        fc.constantFrom('svc', 'pod', 'node', ''),
        fc.constantFrom('kubernetes', 'x', ''),
      )
      .map((p) => p.join('/')),
  },
  { weight: 1, arbitrary: fc.constantFrom('127.0.0.1', 'localhost', '', '::1') },
  { weight: 1, arbitrary: utf8(30) },
);
const sftpPath = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.constantFrom(
      '/',
      '.',
      '/hub',
      '/hub/sealion-fuzz',
      '/hub/sealion-fuzz/pod/c/etc/hosts',
      '/hub/../..',
      '/fuzz-agent-0/default',
    ),
  },
  { weight: 1, arbitrary: utf8(40) },
  { weight: 1, arbitrary: bytes(40) },
);
const sftpOp: fc.Arbitrary<SftpOp> = fc.oneof(
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('init' as const),
      version: fc.constantFrom(3, 3, 0, 6, 0xffffffff),
    }),
  },
  {
    weight: 6,
    arbitrary: fc.record({
      op: fc.constantFrom(
        'realpath' as const,
        'stat' as const,
        'lstat' as const,
        'opendir' as const,
        'readdir' as const,
        'open' as const,
        'remove' as const,
        'mkdir' as const,
      ),
      path: sftpPath,
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('read' as const),
      length: fc.constantFrom(0, 1, 32_768, 1 << 20, 0xffffffff),
    }),
  },
  { weight: 1, arbitrary: fc.record({ op: fc.constant('write' as const), data: bytes(100) }) },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('packet' as const),
      type: fc.integer({ min: 0, max: 255 }),
      body: bytes(40),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      op: fc.constant('lying length' as const),
      claimed: fc.constantFrom(0, 1, 5, 100_000, 0xffffffff),
      body: bytes(30),
    }),
  },
);
const channelStep: fc.Arbitrary<Step> = fc.oneof(
  { weight: 3, arbitrary: fc.record({ t: fc.constant('exec' as const), command }) },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('pty' as const),
      term: fc.oneof(fc.constant('xterm'), bytes(20)),
      cols: fc.oneof(fc.constant(80), fc.nat()),
      rows: fc.oneof(fc.constant(24), fc.nat()),
      modes: bytes(20),
    }),
  },
  { weight: 1, arbitrary: fc.constant({ t: 'shell' as const }) },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('subsystem' as const),
      name: fc.constantFrom('sftp', 'sftp', 'netconf', '', 'sftp\0'),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant('request' as const),
      name: fc.constantFrom(
        'env',
        'window-change',
        'signal',
        'break',
        'xon-xoff',
        'exit-status',
        'auth-agent-req@openssh.com',
        'x11-req',
        'eow@openssh.com',
        'exec',
        'x',
      ),
      wantReply: fc.boolean(),
      body: bytes(40),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      t: fc.constant('data' as const),
      bytes: fc.oneof(bytes(100), fc.constantFrom('1\r', '\x03', '\x04', '\x1b[A', 'q\r')),
    }),
  },
  {
    weight: 1,
    arbitrary: fc.record({
      t: fc.constant('window' as const),
      n: fc.constantFrom(0, 1, 0x7fffffff, 0xffffffff),
    }),
  },
  { weight: 1, arbitrary: fc.constantFrom({ t: 'eof' as const }, { t: 'close channel' as const }) },
  {
    weight: 1,
    arbitrary: fc.record({ t: fc.constant('pause' as const), ms: fc.integer({ min: 0, max: 300 }) }),
  },
);
const openStep: fc.Arbitrary<Step> = fc.record({
  t: fc.constant('open' as const),
  kind: fc.oneof(
    { weight: 6, arbitrary: fc.constant('session') },
    { weight: 2, arbitrary: fc.constant('direct-tcpip') },
    { weight: 1, arbitrary: fc.constantFrom('x11', 'forwarded-tcpip', 'direct-streamlocal@openssh.com', '') },
  ),
  window: fc.oneof(fc.constant(2 << 20), fc.constantFrom(0, 1, 0xffffffff)),
  maxPacket: fc.oneof(fc.constant(32_768), fc.constantFrom(0, 1, 0xffffffff)),
  reads: fc.oneof({ weight: 3, arbitrary: fc.constant(true) }, { weight: 1, arbitrary: fc.constant(false) }),
  dest: forwardDest,
  port: fc.oneof(fc.constant(443), fc.constantFrom(0, 65536, 0xffffffff)),
});
const globalStep: fc.Arbitrary<Step> = fc.record({
  t: fc.constant('global' as const),
  name: fc.constantFrom(
    'tcpip-forward',
    'cancel-tcpip-forward',
    'no-more-sessions@openssh.com',
    'keepalive@openssh.com',
    'streamlocal-forward@openssh.com',
    'hostkeys-prove-00@openssh.com',
    'x',
  ),
  wantReply: fc.boolean(),
  body: bytes(40),
});

const KEX = [
  'curve25519-sha256',
  'curve25519-sha256@libssh.org',
  'ecdh-sha2-nistp256',
  'ecdh-sha2-nistp384',
  'ecdh-sha2-nistp521',
  'diffie-hellman-group-exchange-sha256',
  'diffie-hellman-group14-sha256',
  'diffie-hellman-group16-sha512',
  'diffie-hellman-group18-sha512',
  'diffie-hellman-group1-sha1',
  'none-such',
];
const offer: fc.Arbitrary<Offer | null> = fc.oneof(
  { weight: 3, arbitrary: fc.constant(null) },
  {
    weight: 2,
    arbitrary: fc.record({
      kex: fc.constantFrom(...KEX),
      cipher: fc.constantFrom(
        'aes128-gcm@openssh.com',
        'aes256-ctr',
        'chacha20-poly1305@openssh.com',
        'aes128-cbc',
        '3des-cbc',
      ),
      mac: fc.constantFrom('hmac-sha2-256-etm@openssh.com', 'hmac-sha2-512', 'hmac-sha1', 'hmac-md5'),
      compress: fc.constantFrom('none' as const, 'zlib' as const, 'zlib@openssh.com' as const),
    }),
  },
);
const ident = fc.oneof(
  { weight: 4, arbitrary: fc.constant(null) },
  {
    weight: 1,
    arbitrary: fc.constantFrom(
      'OpenSSH_9.2p1 Debian-2',
      'PuTTY_Release_0.80',
      'x'.repeat(250),
      'a b c',
      'ssh2js',
    ),
  },
  { weight: 1, arbitrary: utf8(30).map((s) => s.replace(/[\r\n]/g, '')) },
);

const base = {
  from: fc.constantFrom<From>('own', 'own', 'shared'),
  ident,
  offer,
  preBytes: fc.constant(''),
  end: fc.constantFrom<'close' | 'reset' | 'hold'>('close', 'reset', 'hold'),
  holdMs: fc.integer({ min: 0, max: 1_500 }),
};

/** Cases that end before or during the key exchange, or send what is no version exchange. */
const transportCase: fc.Arbitrary<SessionCase> = fc.record({
  ...base,
  aim: fc.constant('transport' as const),
  stop: fc.constantFrom<PreStop>(
    'silent',
    'partial ident',
    'bad ident',
    'ident then garbage',
    'server kexinit',
    'kex reply',
    'kex done',
  ),
  preBytes: fc.oneof(
    bytes(120),
    fc.constantFrom(
      'SSH-1.5-old\r\n',
      'GET / HTTP/1.1\r\n\r\n',
      '\r\n\r\nSSH-2.0-x\r\n',
      `SSH-2.0-${'x'.repeat(9000)}\r\n`,
      'SSH-2.0-a\0b\r\n',
      '\xff\xff\xff\xff\x00',
    ),
  ),
  steps: fc.constant([]),
});

const signInCase: fc.Arbitrary<SessionCase> = fc.record({
  ...base,
  aim: fc.constant('sign-in' as const),
  stop: fc.constant('kex done' as const),
  steps: fc
    .tuple(
      fc.oneof(
        { weight: 8, arbitrary: fc.constant([SERVICE]) },
        { weight: 1, arbitrary: fc.constant([]) },
        {
          weight: 1,
          arbitrary: fc.constantFrom<Step[]>(
            [{ t: 'service', name: 'ssh-connection' }],
            [{ t: 'service', name: 'x' }],
          ),
        },
      ),
      fc.array(authStep(fc.constantFrom(true, true, false)), { minLength: 1, maxLength: 5 }),
      fc.array(fc.oneof(channelStep, openStep), { maxLength: 2 }),
    )
    .map(([s, a, c]) => [...s, ...a, ...c]),
});

const deviceCase: fc.Arbitrary<SessionCase> = fc.record({
  ...base,
  aim: fc.constant('device prompt' as const),
  stop: fc.constant('kex done' as const),
  steps: fc
    .tuple(
      fc.array(authStep(fc.constant(true)), { maxLength: 2 }),
      fc.constantFrom<DeviceThen>(
        'walk away',
        'walk away',
        'answer',
        'answer wrongly',
        'abort',
        'approve',
        'wait',
      ),
      fc.array(fc.oneof(authStep(fc.boolean()), channelStep), { maxLength: 2 }),
    )
    .map(([before, then, after]) => [SERVICE, ...before, { t: 'device' as const, then }, ...after]),
});

const channelCase = (aim: 'channel' | 'exec' | 'sftp'): fc.Arbitrary<SessionCase> =>
  fc.record({
    ...base,
    aim: fc.constant(aim),
    stop: fc.constant('kex done' as const),
    steps: (aim === 'sftp'
      ? fc
          .tuple(
            openStep.map((o) => ({ ...o, kind: 'session' })),
            fc.array(sftpOp, { maxLength: 6 }),
            fc.boolean(),
          )
          .map(([open, ops, init]): Step[] => [
            open,
            { t: 'subsystem', name: 'sftp' },
            { t: 'sftp', ops: init ? [{ op: 'init', version: 3 }, ...ops] : ops },
          ])
      : aim === 'exec'
        ? fc
            .tuple(
              openStep.map((o) => ({ ...o, kind: 'session' })),
              fc.array(channelStep, { maxLength: 3 }),
              command,
            )
            .map(([open, pre, cmd]): Step[] => [open, ...pre, { t: 'exec', command: cmd }])
        : fc.array(
            fc.oneof(
              { weight: 3, arbitrary: openStep },
              {
                weight: 1,
                arbitrary: fc.record({
                  t: fc.constant('channels' as const),
                  n: fc.integer({ min: 1, max: 40 }),
                }),
              },
              { weight: 3, arbitrary: channelStep },
              { weight: 1, arbitrary: globalStep },
            ),
            { minLength: 1, maxLength: 6 },
          )
    ).map((after) => [SERVICE, SIGN_IN, ...after]),
  });

const malformedCase: fc.Arbitrary<SessionCase> = fc.record({
  ...base,
  aim: fc.constant('malformed' as const),
  stop: fc.constant('kex done' as const),
  steps: fc
    .tuple(
      fc.boolean(),
      fc.array(malformedStep, { minLength: 1, maxLength: 4 }),
      fc.array(fc.oneof(channelStep, openStep, globalStep), { maxLength: 2 }),
    )
    .map(([signedIn, bad, after]) => [
      SERVICE,
      ...(signedIn
        ? [
            SIGN_IN,
            {
              t: 'open',
              kind: 'session',
              window: 2 << 20,
              maxPacket: 32_768,
              reads: true,
              dest: '',
              port: 0,
            } as Step,
          ]
        : []),
      ...bad,
      ...after,
    ]),
});

/** Many signed publickey requests sent at once, each with an RSA key as large as the door takes (or larger). */
const pipelineCase: fc.Arbitrary<SessionCase> = fc.record({
  ...base,
  aim: fc.constant('pipeline' as const),
  stop: fc.constant('kex done' as const),
  steps: fc
    .tuple(
      fc.integer({ min: 2, max: 400 }),
      fc.record({
        odd: fc.constant('rsa' as const),
        bits: fc.constantFrom(4096, 8192, 16384, 16384, 16385),
        exponent: fc.constantFrom('f4' as const, '64 bits' as const),
      }),
      fc.constantFrom<Signing>('garbage', 'garbage', 'query'),
      fc.boolean(),
    )
    .map(([n, key, how, thenCert]): Step[] => [
      SERVICE,
      { t: 'burst', n, key, signing: how },
      ...(thenCert ? [SIGN_IN] : []),
    ]),
});

const crowdCase: fc.Arbitrary<CrowdCase> = fc.record({
  aim: fc.constant('crowd' as const),
  from: fc.constantFrom<From>('own', 'shared'),
  count: fc.oneof(fc.integer({ min: 1, max: 24 }), fc.constantFrom(15, 16, 17)),
  stage: fc.constantFrom(
    'connected' as const,
    'ident' as const,
    'kex done' as const,
    'failed sign-in' as const,
  ),
});

export const sshCase: fc.Arbitrary<SshCase> = fc.oneof(
  { weight: 3, arbitrary: transportCase },
  { weight: 5, arbitrary: signInCase },
  { weight: 3, arbitrary: deviceCase },
  { weight: 2, arbitrary: channelCase('channel') },
  { weight: 2, arbitrary: channelCase('exec') },
  { weight: 2, arbitrary: channelCase('sftp') },
  { weight: 3, arbitrary: malformedCase },
  { weight: 1, arbitrary: pipelineCase },
  { weight: 1, arbitrary: crowdCase },
);
