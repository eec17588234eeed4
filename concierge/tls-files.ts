// Fixed serving material from files, for a concierge whose certificates someone else manages (a mounted Secret,
// cert-manager): read at start, and read again when the files change, without a restart (a periodic controller).
import { readFile } from 'node:fs/promises';
import type { Controller } from '../lib/controller/controller.ts';
import { periodic } from '../lib/controller/periodic.ts';
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

/** The name of the poll's controller. */
export const TLS_FILES_POLL = 'tls-files';

/**
 * Reads the files now (a failure here fails the start: there is nothing else to serve) and returns what they hold,
 * with the poll that reads them again every POLL_MS, a periodic controller for the process's manager to run; `apply`
 * gets each new set that parses. Bytes are compared first: parsing certificates and importing the signer's key every
 * poll is wasted work.
 */
export async function loadTLSFiles(
  files: TLSFiles,
  apply: (next: TLSMaterial) => void,
  log: Logger,
): Promise<{ initial: TLSMaterial; poll: Controller }> {
  let last = await snapshot(files);
  const initial = await material(last);
  const poll = async (): Promise<void> => {
    try {
      const current = await snapshot(files);
      if (current.join('\0') === last.join('\0')) return;
      apply(await material(current));
      last = current;
      log.info('TLS files reloaded');
    } catch (err) {
      log.error({ err: (err as Error).message }, 'reloading TLS files failed; keeping the current ones');
    }
  };
  return { initial, poll: periodic(TLS_FILES_POLL, POLL_MS, poll) };
}
