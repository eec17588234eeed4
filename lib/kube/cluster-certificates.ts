// Client certificates a cluster's API server trusts, issued by the cluster itself: a CertificateSigningRequest for the
// signer kubernetes.io/kube-apiserver-client, which kube-controller-manager signs with the cluster's CA once it is
// approved. No signing key ever leaves the control plane (Pinniped's kube cert agent copies it out of the
// controller-manager's pod).
//
// Approving for this signer lets the approver mint any identity, system:masters included, and RBAC cannot narrow
// that by subject. So the issuer approves nothing but the requests it created itself in this process, for identities
// that passed its checks, and checks both again on the object the API server holds before it approves: who created
// it (the API server records that), the signer, and the request's bytes.
import { randomBytes } from 'node:crypto';
import { KUBE_APISERVER_CLIENT_SIGNER } from '../../apis/install.ts';
import { createPublicKey, X509Certificate, type KeyObject } from 'node:crypto';
import { systemClock, type Clock } from '../clock.ts';
import { SealionError } from '../errors.ts';
import { newCSR } from '../pki/pki.ts';
import { apiStatusCode, type KubeClients } from './kube.ts';

/** The shortest certificate kube-controller-manager signs (its CSR validation refuses less than 10 minutes). */
export const MIN_EXPIRATION_SECONDS = 600;
/** How long the controller-manager has to sign an approved request (it signs in well under a second). */
export const SIGN_TIMEOUT_MS = 30_000;
const POLL_MS = 200;
/** Clocks differ: a certificate may end this much later than asked (the controller-manager's clock, not ours). */
const EXPIRY_SLACK_SECONDS = 60;
/** The group that is every permission on a cluster: never in a certificate this issuer asks for. */
const MASTERS = 'system:masters';

export type IssueRefusalCode = 'ForbiddenIdentity' | 'NotOwnRequest' | 'NotSigned' | 'Denied';

export class IssueRefused extends SealionError {
  constructor(code: IssueRefusalCode, message: string) {
    super(code, message);
    this.name = 'IssueRefused';
  }
}

/** Who the certificate names: its common name and organizations (the user's groups). */
export interface CertificateIdentity {
  username: string;
  groups: string[];
}

export interface ClusterCertificateIssuerOptions {
  /** The issuer's own user on the cluster, as the API server records it on what the issuer creates. */
  self: { username: string; uid?: string };
  /**
   * Names that start with `system:` may go into certificates (an authenticator that opts in). system:masters never
   * does. Default: false.
   */
  allowSystemNames?: boolean;
  clock?: Clock;
}

export interface IssuedCertificate {
  certPem: string;
  keyPem: string;
  /** When the cluster's certificate expires. */
  notAfter: Date;
}

export interface ClusterCertificateIssuer {
  /**
   * A certificate for `identity`, valid for `expirationSeconds` (at least MIN_EXPIRATION_SECONDS): requested,
   * approved and collected, and the request deleted. Rejects with IssueRefused for a forbidden identity (nothing is
   * created then) or a request the cluster did not sign.
   */
  issue(
    identity: CertificateIdentity,
    expirationSeconds: number,
    opts?: { allowSystemNames?: boolean },
  ): Promise<IssuedCertificate>;
  /**
   * Approves the request `name` if, and only if, it is one this issuer created in this process and is still as it
   * created it. Exported so tests can show what it refuses.
   */
  approveOwn(name: string): Promise<void>;
}

/** Why an identity may not go into a certificate, or undefined. */
export function identityRefusal(
  identity: CertificateIdentity,
  allowSystemNames: boolean,
): string | undefined {
  if (identity.username === '') return 'a certificate must name a user';
  if (identity.groups.includes(MASTERS)) return `${MASTERS} is never put into a certificate`;
  if (!allowSystemNames) {
    if (identity.username.startsWith('system:')) return 'a system: username is reserved for the cluster';
    const group = identity.groups.find((g) => g.startsWith('system:'));
    if (group) return `the group ${group} is reserved for the cluster`;
  }
  return undefined;
}

const b64 = (text: string): string => Buffer.from(text, 'utf8').toString('base64');

export function newClusterCertificateIssuer(
  clients: KubeClients,
  opts: ClusterCertificateIssuerOptions,
): ClusterCertificateIssuer {
  const issuer: Issuer = { clients, opts, clock: opts.clock ?? systemClock, pending: new Map() };
  const allowSystemNames = opts.allowSystemNames ?? false;
  return {
    approveOwn: (name) => approveOwn(issuer, name),
    async issue(identity, expirationSeconds, issueOpts = {}) {
      const systemNames = issueOpts.allowSystemNames ?? allowSystemNames;
      const problem = identityRefusal(identity, systemNames);
      if (problem) throw new IssueRefused('ForbiddenIdentity', problem);
      const { csrPem, keyPem } = await newCSR(identity.username, identity.groups);
      const seconds = Math.max(MIN_EXPIRATION_SECONDS, Math.ceil(expirationSeconds));
      const name = `sealion-${randomBytes(8).toString('hex')}`;
      const request = b64(csrPem);
      issuer.pending.set(name, { request, identity, allowSystemNames: systemNames });
      try {
        await createRequest(clients, name, request, seconds);
        const asked = issuer.clock.now();
        await approveOwn(issuer, name);
        const certPem = await signed(issuer, name);
        return { certPem, keyPem, notAfter: checkIssued(certPem, keyPem, asked, seconds) };
      } finally {
        issuer.pending.delete(name);
        // Nothing is left behind: the certificate is the caller's now, and a request nobody signed is worth nothing.
        await clients.certificates.deleteCertificateSigningRequest({ name }).catch((err: unknown) => {
          if (apiStatusCode(err) !== 404) throw err;
        });
      }
    },
  };
}

/** One issuer's clients, settings, clock, and the requests it has under way. */
interface Issuer {
  clients: KubeClients;
  opts: ClusterCertificateIssuerOptions;
  clock: Clock;
  /** The requests this process created and has not finished with: name → the request's bytes and identity. */
  pending: Map<string, { request: string; identity: CertificateIdentity; allowSystemNames: boolean }>;
}

/** The CertificateSigningRequest `name` for the cluster's client signer, living `seconds`. */
async function createRequest(
  clients: KubeClients,
  name: string,
  request: string,
  seconds: number,
): Promise<void> {
  await clients.certificates.createCertificateSigningRequest({
    body: {
      apiVersion: 'certificates.k8s.io/v1',
      kind: 'CertificateSigningRequest',
      metadata: { name, labels: { 'app.kubernetes.io/part-of': 'sealion' } },
      spec: {
        request,
        signerName: KUBE_APISERVER_CLIENT_SIGNER,
        expirationSeconds: seconds,
        usages: ['client auth'],
      },
    },
  });
}

/** Approves `name` if this issuer created it in this process, it is still as created, and its identity may pass. */
async function approveOwn({ clients, opts, clock, pending }: Issuer, name: string): Promise<void> {
  const mine = pending.get(name);
  if (!mine)
    throw new IssueRefused(
      'NotOwnRequest',
      `CertificateSigningRequest ${name} was not created by this issuer`,
    );
  const csr = await clients.certificates.readCertificateSigningRequest({ name });
  const spec = csr.spec;
  // What the API server holds must be what this issuer sent, from this issuer's own identity: a request someone
  // replaced under the same name (deleted and created again) is not approved.
  if (
    spec.username !== opts.self.username ||
    (opts.self.uid !== undefined && spec.uid !== opts.self.uid) ||
    spec.signerName !== KUBE_APISERVER_CLIENT_SIGNER ||
    spec.request !== mine.request
  )
    throw new IssueRefused(
      'NotOwnRequest',
      `CertificateSigningRequest ${name} is not as this issuer created it`,
    );
  const problem = identityRefusal(mine.identity, mine.allowSystemNames);
  if (problem) throw new IssueRefused('ForbiddenIdentity', problem);
  await clients.certificates.replaceCertificateSigningRequestApproval({
    name,
    body: {
      ...csr,
      status: {
        ...csr.status,
        conditions: [
          ...(csr.status?.conditions ?? []),
          {
            type: 'Approved',
            status: 'True',
            reason: 'SealionIssued',
            message: 'requested and approved by the Sealion concierge for a user it authenticated',
            lastUpdateTime: new Date(clock.now()),
          },
        ],
      },
    },
  });
}

/** The signed certificate of `name`, once the controller-manager has signed it (polled on the issuer's clock). */
async function signed({ clients, clock }: Issuer, name: string): Promise<string> {
  const deadline = clock.now() + SIGN_TIMEOUT_MS;
  for (;;) {
    const csr = await clients.certificates.readCertificateSigningRequest({ name });
    const conditions = csr.status?.conditions ?? [];
    const failed = conditions.find(
      (c) => (c.type === 'Denied' || c.type === 'Failed') && c.status === 'True',
    );
    if (failed)
      throw new IssueRefused(
        'Denied',
        `the cluster did not sign the certificate: ${failed.type}: ${failed.message ?? ''}`,
      );
    const certificate = csr.status?.certificate;
    // The API field is bytes: base64 in JSON, which the client hands over as it came.
    if (certificate) return Buffer.from(String(certificate), 'base64').toString('utf8');
    if (clock.now() > deadline)
      throw new IssueRefused(
        'NotSigned',
        `the cluster did not sign ${KUBE_APISERVER_CLIENT_SIGNER} certificates within ${SIGN_TIMEOUT_MS / 1000} s: does its controller-manager sign for this signer (--cluster-signing-cert-file)?`,
      );
    await new Promise<void>((done) => clock.setTimeout(() => done(), POLL_MS));
  }
}

/**
 * What comes back must be for this key and live no longer than asked (`asked`: when, in ms): a certificate cannot be
 * revoked. Returns its end.
 */
function checkIssued(certPem: string, keyPem: string, asked: number, seconds: number): Date {
  const cert = new X509Certificate(certPem);
  const spki = (key: KeyObject): Buffer => key.export({ type: 'spki', format: 'der' });
  if (!spki(cert.publicKey).equals(spki(createPublicKey(keyPem))))
    throw new IssueRefused('NotSigned', 'the cluster returned a certificate for another key');
  const notAfter = new Date(cert.validTo);
  if (notAfter.getTime() > asked + (seconds + EXPIRY_SLACK_SECONDS) * 1000)
    throw new IssueRefused(
      'NotSigned',
      `the cluster signed a certificate valid until ${notAfter.toISOString()}, longer than the ${seconds} s asked`,
    );
  return notAfter;
}
