// Certificate signing requests for the fuzzer: recipes that fast-check generates and shrinks, built into PEM (or
// anything else) only when a case is sent, since signing is asynchronous and a key pair has no place in a printed
// counterexample. A recipe knows whether a certificate may be issued for it, and the certificates that come back are
// checked against what the signer must decide itself: the key is the request's (whose holder signed it), the names,
// usages and constraints are never the request's.
import 'reflect-metadata';
import { webcrypto } from 'node:crypto';
import * as x509 from '@peculiar/x509';
import fc from 'fast-check';
import { BINDING_URI_PREFIX, parseBindingURI } from '../../apis/agent-binding.ts';
import type { Finding } from './oracle.ts';

const crypto = webcrypto;
type CryptoKeyPair = webcrypto.CryptoKeyPair;

/** The one key and signature the signers take: ECDSA P-256 with SHA-256. */
const P256 = { name: 'ECDSA', namedCurve: 'P-256', hash: 'SHA-256' };
/** Other keys, each self-signed correctly: only the key type is wrong. */
const OTHER_KEYS = {
  'P-384': { name: 'ECDSA', namedCurve: 'P-384', hash: 'SHA-384' },
  'P-521': { name: 'ECDSA', namedCurve: 'P-521', hash: 'SHA-512' },
  'RSA 1024': {
    name: 'RSASSA-PKCS1-v1_5',
    modulusLength: 1024,
    publicExponent: new Uint8Array([1, 0, 1]),
    hash: 'SHA-256',
  },
  'RSA-PSS 2048': {
    name: 'RSA-PSS',
    modulusLength: 2048,
    publicExponent: new Uint8Array([1, 0, 1]),
    hash: 'SHA-256',
    saltLength: 32,
  },
  Ed25519: { name: 'Ed25519' },
} as const;
type OtherKey = keyof typeof OTHER_KEYS;

/** Subject attributes a request may carry; none of them may reach a certificate. */
const SUBJECT_TYPES = ['CN', 'O', 'OU', 'C', 'L', 'E', 'DC'] as const;
const hostileName = fc.oneof(
  fc.constantFrom(
    'system:masters',
    'system:admin',
    'fuzz-agent-0',
    'a,O=system:masters',
    'CN=system:admin',
    '\u0000',
    'a\u0000b',
    '\u202e',
    '',
    ' ',
    'x'.repeat(1000),
  ),
  fc.string({ unit: 'grapheme', maxLength: 20 }),
);

/** Extensions a request may ask for; the signer decides its own. */
const EXTENSIONS = [
  'a binding of another cluster',
  'a replica name',
  'a server name',
  'a CA',
  'server usage',
  'certificate signing',
] as const;
type ExtensionAsk = (typeof EXTENSIONS)[number];

function extension(ask: ExtensionAsk): x509.Extension {
  switch (ask) {
    case 'a binding of another cluster':
      return new x509.SubjectAlternativeNameExtension([
        { type: 'url', value: `${BINDING_URI_PREFIX}fuzz-agent-0:00000000-0000-0000-0000-000000000000:0` },
      ]);
    case 'a replica name':
      return new x509.SubjectAlternativeNameExtension([{ type: 'url', value: 'urn:sealion:peer:local' }]);
    case 'a server name':
      return new x509.SubjectAlternativeNameExtension([
        { type: 'dns', value: 'localhost' },
        { type: 'ip', value: '127.0.0.1' },
      ]);
    case 'a CA':
      return new x509.BasicConstraintsExtension(true, undefined, true);
    case 'server usage':
      return new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]);
    case 'certificate signing':
      return new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true);
  }
}

/** Ways to reshape a valid request's PEM; a lenient reader takes some of them, so they may be issued. */
const PEM_SHAPES = [
  'no armour',
  'certificate label',
  'old label',
  'lowercase label',
  'crlf',
  'one line',
  'spaces in base64',
  'bad base64',
  'leading garbage',
  'trailing garbage',
  'two requests',
  'empty armour',
  'unterminated',
] as const;
type PemShape = (typeof PEM_SHAPES)[number];

export type CSRRecipe =
  /** Signed with a P-256 key and SHA-256: valid, whatever it asks for. */
  | { kind: 'valid'; subject: Array<[(typeof SUBJECT_TYPES)[number], string]>; asks: ExtensionAsk[] }
  | { kind: 'other key'; key: OtherKey }
  /** A P-256 key signed with another hash. */
  | { kind: 'other hash'; hash: 'SHA-1' | 'SHA-384' | 'SHA-512' }
  /** A valid request's DER with bytes changed, or cut short. */
  | { kind: 'mutated'; edits: Array<[number, number]>; cut: number | null }
  | { kind: 'pem'; shape: PemShape }
  /** Bytes in PEM armour. */
  | { kind: 'der'; bytes: string }
  | { kind: 'asn1'; shape: 'deep' | 'long length' | 'indefinite' | 'big tag'; n: number }
  /** PEM armour around this many characters of base64. */
  | { kind: 'huge'; size: number }
  | { kind: 'text'; text: string }
  /** Not a string at all (JSON's other types). */
  | { kind: 'odd'; value: unknown };

export const csrRecipe: fc.Arbitrary<CSRRecipe> = fc.oneof(
  {
    weight: 4,
    arbitrary: fc.record({
      kind: fc.constant('valid' as const),
      subject: fc.array(fc.tuple(fc.constantFrom(...SUBJECT_TYPES), hostileName), { maxLength: 4 }),
      asks: fc.uniqueArray(fc.constantFrom(...EXTENSIONS), { maxLength: 3 }),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('other key' as const),
      key: fc.constantFrom(...(Object.keys(OTHER_KEYS) as OtherKey[])),
    }),
  },
  fc.record({
    kind: fc.constant('other hash' as const),
    hash: fc.constantFrom('SHA-1', 'SHA-384', 'SHA-512'),
  }),
  {
    weight: 2,
    arbitrary: fc.record({
      kind: fc.constant('mutated' as const),
      edits: fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 255 })), { maxLength: 3 }),
      cut: fc.option(fc.nat()),
    }),
  },
  {
    weight: 2,
    arbitrary: fc.record({ kind: fc.constant('pem' as const), shape: fc.constantFrom(...PEM_SHAPES) }),
  },
  fc.record({
    kind: fc.constant('der' as const),
    bytes: fc.uint8Array({ maxLength: 300 }).map((b) => Buffer.from(b).toString('latin1')),
  }),
  fc.record({
    kind: fc.constant('asn1' as const),
    shape: fc.constantFrom('deep', 'long length', 'indefinite', 'big tag'),
    n: fc.integer({ min: 1, max: 5000 }),
  }),
  fc.record({ kind: fc.constant('huge' as const), size: fc.integer({ min: 1_000, max: 80_000 }) }),
  fc.record({
    kind: fc.constant('text' as const),
    text: fc.oneof(
      fc.constantFrom('', ' ', '-----BEGIN CERTIFICATE REQUEST-----'),
      fc.string({ maxLength: 100 }),
    ),
  }),
  fc.record({
    kind: fc.constant('odd' as const),
    value: fc.oneof(
      fc.constantFrom(null, true, 0, 1e308),
      fc.array(fc.string(), { maxLength: 2 }),
      fc.object(),
    ),
  }),
);

/** A request built from a recipe: what to send, and what may come of it. */
export interface BuiltCSR {
  /** The body's csr field (a string, or the odd value). */
  csr: unknown;
  /** The SubjectPublicKeyInfo of the key that signed it, when the fuzzer made one. */
  spki?: Buffer;
  /**
   * `must`: valid, so a signer with a valid credential issues; `may`: reshaped in ways a lenient reader may still
   * take (then only for the key that signed it); `never`.
   */
  issue: 'must' | 'may' | 'never';
}

/** Key pairs a lane reuses: generating an RSA key per case would cost more than the case. */
export type KeyCache = Map<string, Promise<CryptoKeyPair>>;

function keyPair(cache: KeyCache, name: string, params: object): Promise<CryptoKeyPair> {
  let keys = cache.get(name);
  if (!keys) {
    keys = crypto.subtle.generateKey(params as webcrypto.EcKeyGenParams, true, ['sign', 'verify']);
    cache.set(name, keys);
  }
  return keys;
}

const pem = (der: Buffer, label = 'CERTIFICATE REQUEST'): string => {
  const lines = der.toString('base64').match(/.{1,64}/g) ?? [];
  return `-----BEGIN ${label}-----\n${lines.join('\n')}\n-----END ${label}-----\n`;
};

async function request(
  keys: CryptoKeyPair,
  signingAlgorithm: object,
  subject: Array<[string, string]> = [['CN', 'fuzz']],
  asks: ExtensionAsk[] = [],
): Promise<{ der: Buffer; spki: Buffer }> {
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    // A value that starts with '#' is read as hex-encoded DER in the string form (RFC 4514), so it goes as a UTF8String.
    name: new x509.Name(
      subject.map(([type, value]) => ({ [type]: [value.startsWith('#') ? { utf8String: value } : value] })),
    ),
    keys,
    signingAlgorithm: signingAlgorithm as webcrypto.EcdsaParams,
    extensions: asks.map(extension),
  });
  return {
    der: Buffer.from(csr.rawData),
    spki: Buffer.from(await crypto.subtle.exportKey('spki', keys.publicKey)),
  };
}

function reshape(valid: string, shape: PemShape): string {
  const body = valid.replace(/-----[^-]+-----/g, '').trim();
  switch (shape) {
    case 'no armour':
      return body;
    case 'certificate label':
      return valid.replace(/CERTIFICATE REQUEST/g, 'CERTIFICATE');
    case 'old label':
      return valid.replace(/CERTIFICATE REQUEST/g, 'NEW CERTIFICATE REQUEST');
    case 'lowercase label':
      return valid.replace(/CERTIFICATE REQUEST/g, 'certificate request');
    case 'crlf':
      return valid.replace(/\n/g, '\r\n');
    case 'one line':
      return valid.replace(/\n/g, '');
    case 'spaces in base64':
      return valid.replace(/(.{10})/g, '$1 ');
    case 'bad base64':
      return valid.replace(/\n(.{5})/, '\n$1!*');
    case 'leading garbage':
      return `garbage\n${valid}`;
    case 'trailing garbage':
      return `${valid}garbage\n`;
    case 'two requests':
      return valid + valid;
    case 'empty armour':
      return '-----BEGIN CERTIFICATE REQUEST-----\n-----END CERTIFICATE REQUEST-----\n';
    case 'unterminated':
      return valid.slice(0, valid.indexOf('-----END'));
  }
}

function asn1(shape: 'deep' | 'long length' | 'indefinite' | 'big tag', n: number): Buffer {
  switch (shape) {
    // SEQUENCEs nested n deep, each of indefinite length.
    case 'deep':
      return Buffer.concat([Buffer.alloc(n * 2, Buffer.from([0x30, 0x80])), Buffer.alloc(n * 2)]);
    // A SEQUENCE that says it holds 4 GiB.
    case 'long length':
      return Buffer.from([0x30, 0x84, 0xff, 0xff, 0xff, 0xff, ...Buffer.alloc(n % 64)]);
    case 'indefinite':
      return Buffer.from([0x30, 0x80, 0x02, 0x01, 0x00, ...Buffer.alloc(n % 64, 0x30)]);
    // A tag number in n base-128 bytes.
    case 'big tag':
      return Buffer.from([0x1f, ...Buffer.alloc(Math.min(n, 4000), 0xff), 0x01, 0x00]);
  }
}

export async function buildCSR(r: CSRRecipe, keys: KeyCache): Promise<BuiltCSR> {
  const valid = async (): Promise<{ der: Buffer; spki: Buffer }> =>
    request(await keyPair(keys, 'P-256', P256), P256);
  switch (r.kind) {
    case 'valid': {
      const built = await request(await keyPair(keys, 'P-256', P256), P256, r.subject, r.asks);
      return { csr: pem(built.der), spki: built.spki, issue: 'must' };
    }
    case 'other key': {
      const params = OTHER_KEYS[r.key];
      const built = await request(await keyPair(keys, r.key, params), params);
      return { csr: pem(built.der), spki: built.spki, issue: 'never' };
    }
    case 'other hash': {
      const built = await request(await keyPair(keys, 'P-256', P256), { name: 'ECDSA', hash: r.hash });
      return { csr: pem(built.der), spki: built.spki, issue: 'never' };
    }
    case 'mutated': {
      const built = await valid();
      const der = Buffer.from(built.der);
      for (const [at, byte] of r.edits) der[at % der.length] = byte;
      const cut = r.cut === null ? der : der.subarray(0, r.cut % der.length);
      return { csr: pem(cut), spki: built.spki, issue: 'may' };
    }
    case 'pem': {
      const built = await valid();
      return { csr: reshape(pem(built.der), r.shape), spki: built.spki, issue: 'may' };
    }
    case 'der':
      return { csr: pem(Buffer.from(r.bytes, 'latin1')), issue: 'never' };
    case 'asn1':
      return { csr: pem(asn1(r.shape, r.n)), issue: 'never' };
    case 'huge':
      return {
        csr: `-----BEGIN CERTIFICATE REQUEST-----\n${'A'.repeat(r.size)}\n-----END CERTIFICATE REQUEST-----\n`,
        issue: 'never',
      };
    case 'text':
      return { csr: r.text, issue: 'never' };
    case 'odd':
      return { csr: r.value, issue: 'never' };
  }
}

/** What an issued certificate must say: whose key, which name and groups, and which one URI. */
export interface IssuedWanted {
  spki?: Buffer;
  commonName: string;
  /** The groups it may carry (the user's); an agent's carries none. */
  organizations: string[];
  /** Its one URI SAN starts so: an agent's binding, or a user's authenticator. */
  uriPrefix: string;
  /** The cluster an agent certificate's binding names. */
  binding?: string;
  /** The CA that must have signed it (PEM). */
  ca: string;
}

/** What is wrong with an issued certificate (PEM), if anything. */
export async function issuedProblem(certPem: string, want: IssuedWanted): Promise<Finding | undefined> {
  let cert: x509.X509Certificate;
  try {
    cert = new x509.X509Certificate(certPem);
  } catch (err) {
    return {
      kind: 'wrong-answer',
      message: `the issued certificate does not parse: ${(err as Error).message}`,
    };
  }
  const forged = (message: string): Finding => ({ kind: 'accepted-forgery', message });
  if (want.spki && !Buffer.from(cert.publicKey.rawData).equals(want.spki))
    return forged('a certificate for a key other than the one that signed the request');
  const ca = new x509.X509Certificate(want.ca);
  if (!(await cert.verify({ publicKey: ca.publicKey, signatureOnly: true })))
    return { kind: 'wrong-answer', message: 'the issued certificate is not signed by its CA' };
  const cn = cert.subjectName.getField('CN');
  const o = cert.subjectName.getField('O');
  if (cn.length !== 1 || cn[0] !== want.commonName || o.some((group) => !want.organizations.includes(group)))
    return forged(`a certificate whose subject is not the signer's to decide: ${cert.subject}`);
  const uris = (cert.getExtension(x509.SubjectAlternativeNameExtension)?.names.items ?? []).filter(
    (name) => name.type === 'url',
  );
  const others = (cert.getExtension(x509.SubjectAlternativeNameExtension)?.names.items ?? []).filter(
    (name) => name.type !== 'url',
  );
  if (others.length > 0) return forged(`a client certificate with names: ${JSON.stringify(others)}`);
  const uri = uris.length === 1 ? uris[0]!.value : '';
  if (
    !uri.startsWith(want.uriPrefix) ||
    (want.binding !== undefined && parseBindingURI(uri)?.cluster !== want.binding)
  )
    return forged(`a certificate whose URIs are not the one binding it needs: ${JSON.stringify(uris)}`);
  if (cert.getExtension(x509.BasicConstraintsExtension)?.ca) return forged('a CA certificate');
  const usages = cert.getExtension(x509.ExtendedKeyUsageExtension)?.usages ?? [];
  if (usages.length !== 1 || usages[0] !== x509.ExtendedKeyUsage.clientAuth)
    return forged(`a certificate with usages other than client authentication: ${usages.join(', ')}`);
  const keyUsage = cert.getExtension(x509.KeyUsagesExtension)?.usages ?? 0;
  if (keyUsage & (x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign))
    return forged('a certificate that may sign certificates');
  return undefined;
}
