// Fixed serving material from files, for a concierge whose certificates someone else manages (a mounted Secret,
// cert-manager): read at start, and read again when the files change, without a restart.
import { readFile } from 'node:fs/promises';
import type { Clock } from '../lib/clock.ts';
import type { Logger } from '../lib/log.ts';
import { loadCA, type CertificateAuthority } from '../lib/pki/pki.ts';
import type { ProxyTLS } from './proxy/server.ts';

export interface TLSFiles {
  certFile: string;
  keyFile: string;
  /** The CA that signs TokenCredentialRequest certificates; it is trusted for client certificates too. */
  signerCertFile: string;
  signerKeyFile: string;
  /** More CAs trusted for client certificates. */
  clientCAFiles: string[];
}

export interface TLSMaterial {
  tls: ProxyTLS;
  signer: CertificateAuthority;
}

/** How often the files are compared with what is served (certificates rotate on the scale of hours). */
const POLL_MS = 10_000;

async function snapshot(files: TLSFiles): Promise<string[]> {
  const paths = [
    files.certFile,
    files.keyFile,
    files.signerCertFile,
    files.signerKeyFile,
    ...files.clientCAFiles,
  ];
  return Promise.all(paths.map((p) => readFile(p, 'utf8')));
}

async function material(texts: string[]): Promise<TLSMaterial> {
  const [certPem, keyPem, signerCertPem, signerKeyPem, ...clientCAPems] = texts as [
    string,
    string,
    string,
    string,
  ];
  const signer = await loadCA(signerCertPem, signerKeyPem);
  // The extra CAs are someone else's: the keys of the certificates they sign may be RSA.
  const anyClientKey = clientCAPems.length > 0;
  return { signer, tls: { certPem, keyPem, clientCAPems: [signer.certPem, ...clientCAPems], anyClientKey } };
}

/**
 * Reads the files now (a failure here fails the start) and then every POLL_MS; `apply` gets each new set that
 * parses. Bytes are compared first: parsing certificates and importing the signer's key every poll is wasted work.
 */
export async function watchTLSFiles(
  files: TLSFiles,
  apply: (next: TLSMaterial) => void,
  clock: Clock,
  log: Logger,
): Promise<{ initial: TLSMaterial; stop(): void }> {
  let last = await snapshot(files);
  const initial = await material(last);
  let timer: unknown;
  let stopped = false;
  const poll = async (): Promise<void> => {
    try {
      const current = await snapshot(files);
      if (current.join('\0') !== last.join('\0')) {
        apply(await material(current));
        last = current;
        log.info('TLS files reloaded');
      }
    } catch (err) {
      log.error({ err: (err as Error).message }, 'reloading TLS files failed; keeping the current ones');
    }
    if (!stopped) timer = clock.setTimeout(() => void poll(), POLL_MS);
  };
  timer = clock.setTimeout(() => void poll(), POLL_MS);
  return {
    initial,
    stop() {
      stopped = true;
      clock.clearTimeout(timer);
    },
  };
}
