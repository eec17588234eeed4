import { X509Certificate } from 'node:crypto';
import type { DetailedPeerCertificate, PeerCertificate } from 'node:tls';

const PEM_BLOCK = /-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g;

/**
 * Decodes a base64 PEM bundle (the `certificateAuthorityData` fields) and checks every certificate in it parses.
 * Returns the PEM text, or throws with a message fit for a status condition.
 */
export function decodeCABundle(base64: string): string {
  const pem = Buffer.from(base64, 'base64').toString('utf8');
  const blocks = pem.match(PEM_BLOCK) ?? [];
  if (blocks.length === 0) throw new Error('no PEM certificate found in the base64-decoded data');
  blocks.forEach((block, i) => {
    try {
      new X509Certificate(block);
    } catch (err) {
      throw new Error(`certificate ${i + 1} does not parse: ${(err as Error).message}`, { cause: err });
    }
  });
  return blocks.join('\n') + '\n';
}

/**
 * The `cert` option for a Node TLS client that sends exactly the certificates in `certPem`, as Go clients such as
 * kubectl do. Given one certificate, OpenSSL completes the chain from the trust store (the `ca` option), so when
 * one CA issued both the API server's serving certificate and our client certificate, the CA goes along on every
 * connection. The API server checks the client certificate on every request, and a CA sent as an intermediate
 * costs it two more signature checks each time (one against the front-proxy CA, one for the longer path): about
 * 120 µs of its CPU per request on the benchmark machine. Node has no switch for OpenSSL's auto-chaining, but any
 * explicit chain turns it off; repeating the leaf is the one chain that gives a verifier no certificate to try.
 */
export function clientCertChain(certPem: string): string {
  const blocks = certPem.match(PEM_BLOCK) ?? [];
  return blocks.length === 1 ? `${blocks[0]}\n${blocks[0]}\n` : certPem;
}

/** The SHA-256 fingerprints (colon-separated hex, as Node's TLS reports them) of every certificate in `pems`. */
export function certificateFingerprints(pems: string[]): Set<string> {
  return new Set(
    pems.flatMap((pem) => (pem.match(PEM_BLOCK) ?? []).map((b) => new X509Certificate(b).fingerprint256)),
  );
}

/**
 * A TLS peer's certificate chain as Node reports it (`getPeerCertificate(true)`): the leaf, then each issuer, each
 * once (a self-signed certificate is its own issuer). Empty when the peer sent no certificate.
 */
export function peerChain(leaf: PeerCertificate | undefined): DetailedPeerCertificate[] {
  const chain: DetailedPeerCertificate[] = [];
  const seen = new Set<string>();
  for (
    let c = leaf as DetailedPeerCertificate | undefined;
    c?.raw && !seen.has(c.fingerprint256);
    c = c.issuerCertificate
  ) {
    seen.add(c.fingerprint256);
    chain.push(c);
  }
  return chain;
}

/**
 * Whether `certPem` was signed by one of the CAs in the PEM bundle `bundlePem` (named as its issuer, and its signature
 * checks with that CA's key). Certificates in the bundle that do not parse are passed over.
 */
export function signedByAny(certPem: string, bundlePem: string): boolean {
  const cert = new X509Certificate(certPem);
  return (bundlePem.match(PEM_BLOCK) ?? []).some((block) => {
    try {
      const ca = new X509Certificate(block);
      return cert.checkIssued(ca) && cert.verify(ca.publicKey);
    } catch {
      return false;
    }
  });
}
