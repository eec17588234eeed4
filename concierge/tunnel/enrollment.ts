// The tunnel listener's two plain requests: POST /register trades a bootstrap token and a CSR for a client
// certificate (anyone may ask, so at a bounded rate, with 429 beyond, and one 401 whatever failed), and POST /renew
// (mutual TLS) issues the certificate again before it expires, bound to the Cluster as the API server has it now.
import type { IncomingMessage, ServerResponse } from 'node:http';
import { bindingURI } from '../../apis/agent-binding.ts';
import { isDNSLabel } from '../../apis/names.ts';
import type { Cluster } from '../../apis/tunnel.ts';
import { redeemBootstrapToken, RedeemError, type BootstrapTokenStore } from '../../lib/kube/bootstrap.ts';
import type { Informer } from '../../lib/kube/informer.ts';
import { UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';
import type { Logger } from '../../lib/log.ts';
import { issueCert, publicKeyFromCSR, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { ANNOTATIONS, type RequestAudit } from '../audit/audit.ts';
import { bindingProblem, currentBinding, type VerifiedPeer } from './binding.ts';
import type { RateLimiter } from './rate-limit.ts';

/** Agent certificates live 90 days and are renewed over the tunnel at two thirds of that. */
export const AGENT_CERT_VALIDITY_MS = 90 * 24 * 3600 * 1000;
/** Registration and renewal bodies are a CSR and a token: a few KiB. */
const MAX_BODY_BYTES = 64 * 1024;
/** What the log says of every failed registration; the caller gets the listener's one 401, whatever failed. */
const REJECTED = 'registration rejected';

export interface Enrollment {
  ca: CertificateAuthority;
  clusters: Informer<Cluster>;
  bootstrapTokens: BootstrapTokenStore;
  registrations: RateLimiter;
  /** The Cluster as the API server has it now, undefined when there is none. */
  readCluster(name: string): Promise<Cluster | undefined>;
  log: Logger;
}

/** A renewal refused for a reason the agent is not told. */
class Refused extends Error {}

function readBody(req: IncomingMessage): Promise<unknown> {
  return new Promise((done, fail) => {
    let size = 0;
    const chunks: Buffer[] = [];
    req.on('data', (chunk: Buffer) => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) return void req.destroy(new Error('body too large'));
      chunks.push(chunk);
    });
    req.on('end', () => {
      try {
        done(JSON.parse(Buffer.concat(chunks).toString('utf8')));
      } catch {
        fail(new Error('the body is not JSON'));
      }
    });
    req.on('error', fail);
  });
}

export const json = (res: ServerResponse, code: number, body: object): void =>
  void res.writeHead(code, { 'content-type': 'application/json' }).end(JSON.stringify(body));

/** A certificate for the agent of `cluster` (read from the API server just before), bound to it as it is. */
async function issueAgentCertificate(
  ca: CertificateAuthority,
  cluster: Cluster,
  csrPem: unknown,
): Promise<object> {
  if (typeof csrPem !== 'string') throw new Error('the body has no csr');
  const binding = currentBinding(cluster);
  const cert = await issueCert(ca, {
    // For people reading the certificate; the binding below is what the listener checks.
    commonName: binding.cluster,
    uris: [bindingURI(binding)],
    usage: 'client',
    validityMs: AGENT_CERT_VALIDITY_MS,
    publicKey: await publicKeyFromCSR(csrPem),
  });
  return { certificate: cert.certPem, caBundle: ca.certPem, expires: cert.cert.notAfter.toISOString() };
}

/** POST /register. */
export function serveRegister(
  at: Enrollment,
  req: IncomingMessage,
  res: ServerResponse,
  audit: RequestAudit | undefined,
): void {
  // Counted before the body is read, so that a refused request costs no more than its headers. Not logged: a
  // flood would otherwise become a flood of log lines.
  const wait = at.registrations.take(req.socket.remoteAddress ?? '');
  if (wait !== undefined)
    return writeStatus(res, 429, 'too many registrations; try again later', { retryAfterSeconds: wait });
  void register(at, req, res, audit);
}

async function register(
  at: Enrollment,
  req: IncomingMessage,
  res: ServerResponse,
  audit: RequestAudit | undefined,
): Promise<void> {
  let cluster = '';
  try {
    const body = (await readBody(req)) as { cluster?: unknown; token?: unknown; csr?: unknown };
    if (typeof body.cluster !== 'string' || !isDNSLabel(body.cluster))
      throw new RedeemError('Malformed', 'the body names no valid cluster');
    cluster = body.cluster;
    audit?.annotate(ANNOTATIONS.cluster, cluster);
    // Whether the cluster exists is not asked first: an unknown cluster's answer would then come sooner than
    // a known one's. The token decides (it names its cluster), and the Cluster is read once it is redeemed.
    await redeemBootstrapToken(at.bootstrapTokens, typeof body.token === 'string' ? body.token : '', cluster);
    const current = await at.readCluster(cluster);
    if (!current) throw new RedeemError('Unknown', `Cluster ${cluster} was removed`);
    json(res, 200, await issueAgentCertificate(at.ca, current, body.csr));
    at.log.info({ cluster }, 'agent registered');
  } catch (err) {
    at.log.warn({ cluster, reason: (err as RedeemError).reason, err: (err as Error).message }, REJECTED);
    writeStatus(res, 401, UNAUTHORIZED);
  }
}

/** POST /renew, by the agent whose certificate `verified` is. */
export function serveRenew(
  at: Enrollment,
  req: IncomingMessage,
  res: ServerResponse,
  verified: VerifiedPeer,
): void {
  const refuse = (problem: string, cluster?: string): void => {
    at.log.warn({ cluster, problem }, 'renewal refused');
    json(res, 401, { message: 'renewal rejected' });
  };
  if (!('binding' in verified)) return refuse(verified.problem);
  const { binding } = verified;
  // The cache turns away most stale certificates without a call to the API server.
  const cached = bindingProblem(binding, at.clusters.get(binding.cluster));
  if (cached) return refuse(cached, binding.cluster);
  readBody(req)
    .then(async (body) => {
      const current = await at.readCluster(binding.cluster);
      const problem = bindingProblem(binding, current);
      if (problem) throw new Refused(problem);
      return issueAgentCertificate(at.ca, current!, (body as { csr?: unknown }).csr);
    })
    .then(
      (answer) => {
        json(res, 200, answer);
        at.log.info({ cluster: binding.cluster }, 'agent certificate renewed');
      },
      (err: unknown) => {
        if (err instanceof Refused) return refuse(err.message, binding.cluster);
        at.log.warn({ cluster: binding.cluster, err: (err as Error).message }, 'renewal refused');
        json(res, 400, { message: (err as Error).message });
      },
    );
}
