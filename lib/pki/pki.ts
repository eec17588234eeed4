// Keys and certificates with native crypto. @peculiar/x509 builds the ASN.1 and Node's WebCrypto signs,
// so ECDSA keys and signatures cost microseconds, not the tens of milliseconds of a JavaScript RSA.
// @peculiar/x509 resolves its internals through tsyringe, which needs the Reflect metadata polyfill.
import 'reflect-metadata';
import { createHash, webcrypto, randomBytes, X509Certificate as NodeX509 } from 'node:crypto';

type CryptoKey = webcrypto.CryptoKey;
type CryptoKeyPair = webcrypto.CryptoKeyPair;
import { isIP } from 'node:net';
import * as x509 from '@peculiar/x509';
// The ASN.1 engine under @peculiar/x509, for the one value it has no class for: a bare UTF8String as an extension's
// value (a text of our own in a certificate, encoded and read back as DER, never as a formatted string).
import * as asn1js from 'asn1js';

const crypto = webcrypto;
x509.cryptoProvider.set(crypto);

/** ECDSA P-256: small, fast, accepted by Go's crypto/tls, Node and kubectl. */
const KEY_ALGORITHM: webcrypto.EcKeyGenParams & webcrypto.EcdsaParams = {
  name: 'ECDSA',
  namedCurve: 'P-256',
  hash: 'SHA-256',
};

/** A certificate with its private key, both as PEM, plus the parsed certificate. */
export interface KeyPairPem {
  certPem: string;
  keyPem: string;
}

export interface CertificateAuthority extends KeyPairPem {
  /** The CA's keys, kept so it can sign without re-importing the PEM. */
  keys: CryptoKeyPair;
  cert: x509.X509Certificate;
}

export type CertUsage = 'server' | 'client' | 'server+client';

export interface CertRequest {
  commonName: string;
  /** Subject O= entries; Kubernetes reads them as groups. Default: none. */
  organizations?: readonly string[];
  /** SANs; each entry is an IP address or a DNS name. Default: none. */
  hosts?: readonly string[];
  /** URI SANs, for identities that are structured data rather than a name. Default: none. */
  uris?: readonly string[];
  usage: CertUsage;
  /** Lifetime in milliseconds. Default: one year. */
  validityMs?: number;
  /** Sign this public key instead of generating a new key pair (the private key then stays with the caller). */
  publicKey?: CryptoKey;
  /**
   * Non-critical extensions of our own, by OID, each value a DER UTF8String: data a verifier of ours reads and any
   * other ignores. Default: none.
   */
  texts?: Readonly<Record<string, string>>;
}

const ONE_YEAR_MS = 365 * 24 * 3600 * 1000;
/** Certificates start a little in the past so that clocks a few minutes behind still accept them. */
const BACKDATE_MS = 5 * 60 * 1000;

export async function newKeyPair(): Promise<CryptoKeyPair> {
  return crypto.subtle.generateKey(KEY_ALGORITHM, true, ['sign', 'verify']);
}

export async function privateKeyToPem(key: CryptoKey): Promise<string> {
  const der = await crypto.subtle.exportKey('pkcs8', key);
  return x509.PemConverter.encode(der, 'PRIVATE KEY');
}

export async function publicKeyToPem(key: CryptoKey): Promise<string> {
  const der = await crypto.subtle.exportKey('spki', key);
  return x509.PemConverter.encode(der, 'PUBLIC KEY');
}

export async function importPrivateKeyPem(pem: string): Promise<CryptoKey> {
  const der = x509.PemConverter.decodeFirst(pem);
  return crypto.subtle.importKey('pkcs8', der, KEY_ALGORITHM, true, ['sign']);
}

function serial(): string {
  // 16 random bytes with the top bit cleared keeps the DER integer positive.
  const bytes = randomBytes(16);
  bytes[0] = bytes[0]! & 0x7f;
  return bytes.toString('hex');
}

function validity(validityMs: number): { notBefore: Date; notAfter: Date } {
  const now = Date.now();
  return { notBefore: new Date(now - BACKDATE_MS), notAfter: new Date(now + validityMs) };
}

/**
 * Characters no certificate name of ours may hold: C0 controls and DEL. They cannot travel in the HTTP headers that
 * carry an identity on (Impersonate-User, Impersonate-Group), and a reader that prints names would be fooled by them.
 */
// eslint-disable-next-line no-control-regex -- finding control characters is this expression's purpose
const CONTROL_CHARACTERS = /[\u0000-\u001f\u007f]/;

/** Thrown for a name that cannot go into a certificate as it is. */
export class CertificateNameError extends Error {
  readonly code = 'SEALION_CERTIFICATE_NAME';
}

function checkedName(what: string, value: string): string {
  if (CONTROL_CHARACTERS.test(value)) throw new CertificateNameError(`${what} holds a control character`);
  if (!value.isWellFormed()) throw new CertificateNameError(`${what} is not well-formed Unicode`);
  return value;
}

/**
 * A subject built from its attributes, each value a UTF8String taken as it is. Never an RFC 4514 string: a parser
 * reads `#…` as hex-encoded DER and gives `\`, `,`, `+`, quotes and spaces meanings of their own, so a name that
 * went through one could come out as another name or as extra attributes (a user called `#0c10…` would become
 * anyone, `system:masters` included). One attribute per RDN, groups first, as Kubernetes and OpenSSL order them.
 */
function subjectName(commonName: string, organizations: readonly string[] = []): x509.Name {
  return new x509.Name([
    ...organizations.map((o, i) => ({ O: [{ utf8String: checkedName(`organization ${i + 1}`, o) }] })),
    { CN: [{ utf8String: checkedName('common name', commonName) }] },
  ]);
}

export async function newCA(
  commonName: string,
  validityMs = 10 * ONE_YEAR_MS,
): Promise<CertificateAuthority> {
  const keys = await newKeyPair();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: subjectName(commonName),
    ...validity(validityMs),
    keys,
    signingAlgorithm: KEY_ALGORITHM,
    extensions: [
      new x509.BasicConstraintsExtension(true, undefined, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(keys.publicKey),
    ],
  });
  return { keys, cert, certPem: cert.toString('pem') + '\n', keyPem: await privateKeyToPem(keys.privateKey) };
}

/** Loads a CA from PEM (for example from a Secret) so it can sign again. */
export async function loadCA(certPem: string, keyPem: string): Promise<CertificateAuthority> {
  const cert = new x509.X509Certificate(certPem);
  const privateKey = await importPrivateKeyPem(keyPem);
  const publicKey = await crypto.subtle.importKey('spki', cert.publicKey.rawData, KEY_ALGORITHM, true, [
    'verify',
  ]);
  return { cert, keys: { privateKey, publicKey }, certPem, keyPem };
}

function sanExtension(
  hosts: readonly string[],
  uris: readonly string[],
): x509.SubjectAlternativeNameExtension {
  return new x509.SubjectAlternativeNameExtension([
    ...hosts.map((h) => (isIP(h) ? { type: 'ip' as const, value: h } : { type: 'dns' as const, value: h })),
    ...uris.map((u) => ({ type: 'url' as const, value: u })),
  ]);
}

const USAGES: Record<CertUsage, string[]> = {
  server: [x509.ExtendedKeyUsage.serverAuth],
  client: [x509.ExtendedKeyUsage.clientAuth],
  'server+client': [x509.ExtendedKeyUsage.serverAuth, x509.ExtendedKeyUsage.clientAuth],
};

/** Issues a leaf certificate signed by `ca`. Returns the key PEM only when this call generated the key. */
export async function issueCert(
  ca: CertificateAuthority,
  req: CertRequest,
): Promise<KeyPairPem & { cert: x509.X509Certificate }> {
  const generated = req.publicKey ? undefined : await newKeyPair();
  const publicKey = req.publicKey ?? generated!.publicKey;
  const extensions: x509.Extension[] = [
    new x509.BasicConstraintsExtension(false, undefined, true),
    new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
    new x509.ExtendedKeyUsageExtension(USAGES[req.usage]),
    await x509.AuthorityKeyIdentifierExtension.create(ca.keys.publicKey),
  ];
  const hosts = req.hosts ?? [];
  const uris = req.uris ?? [];
  if (hosts.length + uris.length > 0) extensions.push(sanExtension(hosts, uris));
  for (const [oid, text] of Object.entries(req.texts ?? {})) extensions.push(textExtension(oid, text));
  const cert = await x509.X509CertificateGenerator.create({
    serialNumber: serial(),
    subject: subjectName(req.commonName, req.organizations),
    // The CA's own encoded name, not its string form parsed again.
    issuer: ca.cert.subjectName,
    ...validity(req.validityMs ?? ONE_YEAR_MS),
    publicKey,
    signingKey: ca.keys.privateKey,
    signingAlgorithm: KEY_ALGORITHM,
    extensions,
  });
  return {
    cert,
    certPem: cert.toString('pem') + '\n',
    keyPem: generated ? await privateKeyToPem(generated.privateKey) : '',
  };
}

/**
 * The URI SANs of a DER certificate, read from the parsed extension (not from a formatted text, where a crafted
 * value could pass for another entry). Empty when it has none.
 */
export function certificateURIs(der: Uint8Array): string[] {
  const san = new x509.X509Certificate(der).getExtension(x509.SubjectAlternativeNameExtension);
  return (san?.names.items ?? []).filter((name) => name.type === 'url').map((name) => name.value);
}

/** A non-critical extension whose value is `text` as a DER UTF8String. */
function textExtension(oid: string, text: string): x509.Extension {
  checkedName(`extension ${oid}`, text);
  return new x509.Extension(oid, false, new asn1js.Utf8String({ value: text }).toBER(false));
}

/** Thrown for a certificate whose text extension is not exactly one DER UTF8String of well-formed UTF-8. */
export class CertificateTextError extends Error {
  readonly code = 'SEALION_CERTIFICATE_TEXT';
}

/**
 * The text a DER certificate carries in its extension `oid` (textExtension's), undefined when it has none. Throws
 * CertificateTextError when the extension is there but is not one: marked critical, present twice, not a single DER
 * UTF8String (constructed, indefinite or long-form lengths, trailing bytes), or not well-formed UTF-8. The value is
 * encoded again and compared byte for byte, so only the one encoding we write is taken.
 */
export function certificateText(der: Uint8Array, oid: string): string | undefined {
  const found = new x509.X509Certificate(der).extensions.filter((e) => e.type === oid);
  if (found.length === 0) return undefined;
  if (found.length > 1) throw new CertificateTextError(`extension ${oid} appears ${found.length} times`);
  const extension = found[0]!;
  if (extension.critical) throw new CertificateTextError(`extension ${oid} is marked critical`);
  const value = new Uint8Array(extension.value);
  const parsed = asn1js.fromBER(value);
  if (parsed.offset === -1 || !(parsed.result instanceof asn1js.Utf8String))
    throw new CertificateTextError(`extension ${oid} is not a UTF8String`);
  const text = parsed.result.valueBlock.value;
  const again = new Uint8Array(new asn1js.Utf8String({ value: text }).toBER(false));
  if (Buffer.compare(Buffer.from(again), Buffer.from(value)) !== 0)
    throw new CertificateTextError(`extension ${oid} is not a DER UTF8String of well-formed UTF-8`);
  return text;
}

/** The SHA-256 fingerprint of a PEM certificate, as colon-separated hex (what openssl and Node print). */
export function fingerprint(certPem: string): string {
  return new NodeX509(certPem).fingerprint256;
}

/** A certificate signing request for a fresh key pair; the private key never leaves the caller. */
export async function newCSR(
  commonName: string,
  organizations: readonly string[] = [],
): Promise<{ csrPem: string; keyPem: string }> {
  const keys = await newKeyPair();
  const csr = await x509.Pkcs10CertificateRequestGenerator.create({
    name: subjectName(commonName, organizations),
    keys,
    signingAlgorithm: KEY_ALGORITHM,
  });
  return { csrPem: csr.toString('pem') + '\n', keyPem: await privateKeyToPem(keys.privateKey) };
}

/**
 * The public key of a CSR whose signature checks out (proof that the sender holds the private key). Only the key
 * is taken: the subject and extensions a signer puts on the certificate are its own decision, never the CSR's.
 */
export async function publicKeyFromCSR(csrPem: string): Promise<CryptoKey> {
  let csr: x509.Pkcs10CertificateRequest;
  try {
    csr = new x509.Pkcs10CertificateRequest(csrPem);
  } catch (err) {
    throw new Error('the CSR is not a PEM certificate request', { cause: err });
  }
  // The key is imported as P-256 before anything is verified: a CSR names its own algorithm, and checking an
  // RSA signature with a huge key first would let anyone spend this process's CPU before it refuses them.
  let key: CryptoKey;
  try {
    key = await crypto.subtle.importKey('spki', csr.publicKey.rawData, KEY_ALGORITHM, true, ['verify']);
  } catch (err) {
    throw new Error('the CSR is not for an ECDSA P-256 key', { cause: err });
  }
  const signature = csr.signatureAlgorithm as { name?: string; hash?: { name?: string } };
  if (signature.name !== 'ECDSA' || signature.hash?.name !== 'SHA-256')
    throw new Error('the CSR is not signed with ECDSA and SHA-256');
  if (!(await csr.verify())) throw new Error("the CSR's signature does not match its key");
  return key;
}

/** The `sha256:<hex>` pin of a certificate's SubjectPublicKeyInfo (kubeadm's CA pin format). */
export function spkiPin(certPem: string): string {
  const der = new NodeX509(certPem).publicKey.export({ type: 'spki', format: 'der' });
  return `sha256:${createHash('sha256').update(der).digest('hex')}`;
}
