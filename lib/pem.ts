import { X509Certificate } from 'node:crypto';

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
