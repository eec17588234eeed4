// A certificate authority kept in a kubernetes.io/tls Secret, as the concierge keeps three (the impersonation
// proxy's CA, its client-certificate signer and the tunnel CA): `tls.crt` and `tls.key`, and `previous.crt` for the
// one it replaced, which stays trusted until it expires. Created once, by whichever replica comes first.
import { newObjectWriter, readSecret, type KubeClients } from '../kube/kube.ts';
import { loadCA, newCA, type CertificateAuthority } from './pki.ts';

export interface StoredCA {
  certPem: string;
  keyPem: string;
  /** The CA this one replaced, still trusted. */
  previousPem?: string;
}

/** The CA in a Secret's data (base64, as the API server returns it); undefined when it holds none. */
export function storedCA(data: Readonly<Record<string, string>> | undefined): StoredCA | undefined {
  const text = (key: string): string | undefined =>
    data?.[key] ? Buffer.from(data[key], 'base64').toString('utf8') : undefined;
  const certPem = text('tls.crt');
  const keyPem = text('tls.key');
  if (!certPem || !keyPem) return undefined;
  const previousPem = text('previous.crt');
  return { certPem, keyPem, ...(previousPem ? { previousPem } : {}) };
}

export interface TLSSecretObject {
  apiVersion: 'v1';
  kind: 'Secret';
  metadata: { name: string; namespace: string; labels: Record<string, string>; ownerReferences?: object[] };
  type: 'kubernetes.io/tls';
  data: Record<string, string>;
}

/**
 * A kubernetes.io/tls Secret labelled as Sealion's, holding a CA (with the one it replaced) or a certificate (with
 * the CA that issued it, `ca.crt`); `owner` is a controller reference, if any.
 */
export function tlsSecret(
  namespace: string,
  name: string,
  pair: StoredCA & { caPem?: string },
  owner?: { apiVersion: string; kind: string; name: string; uid: string },
): TLSSecretObject {
  const b64 = (text: string): string => Buffer.from(text).toString('base64');
  return {
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name,
      namespace,
      labels: { 'app.kubernetes.io/part-of': 'sealion' },
      ...(owner ? { ownerReferences: [{ ...owner, controller: true }] } : {}),
    },
    type: 'kubernetes.io/tls',
    data: {
      'tls.crt': b64(pair.certPem),
      'tls.key': b64(pair.keyPem),
      ...(pair.caPem ? { 'ca.crt': b64(pair.caPem) } : {}),
      ...(pair.previousPem ? { 'previous.crt': b64(pair.previousPem) } : {}),
    },
  };
}

/**
 * The CA `read` finds, or a new one (`commonName`, living `validityMs`) that `create` stores. `create` answers
 * false when the Secret already existed (another replica won the race): its CA is read then.
 */
export async function ensureStoredCA(
  read: () => Promise<StoredCA | undefined>,
  create: (ca: StoredCA) => Promise<boolean>,
  commonName: string,
  validityMs?: number,
): Promise<StoredCA> {
  const existing = await read();
  if (existing) return existing;
  const ca = await newCA(commonName, validityMs);
  const made = { certPem: ca.certPem, keyPem: ca.keyPem };
  if (await create(made)) return made;
  const theirs = await read();
  if (!theirs) throw new Error(`the Secret for ${commonName} exists but holds no CA`);
  return theirs;
}

/** The CA kept in the Secret `name` (read from the API server, or created there by the first replica), loaded. */
export async function ensureSecretCA(
  clients: KubeClients,
  namespace: string,
  name: string,
  commonName: string,
): Promise<CertificateAuthority> {
  const ca = await ensureStoredCA(
    async () => storedCA(await readSecret(clients, namespace, name)),
    (made) => newObjectWriter(clients).create(tlsSecret(namespace, name, made)),
    commonName,
  );
  return loadCA(ca.certPem, ca.keyPem);
}
