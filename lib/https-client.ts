// HTTPS calls to identity providers and webhooks: an admin-supplied CA bundle, a deadline that covers the whole
// exchange, a cap on the response size, and one keep-alive connection pool per CA bundle. undici does the HTTP.
import { createHash } from 'node:crypto';
import { Agent, request, errors as undiciErrors, type Dispatcher } from 'undici';
import { SealionError } from './errors.ts';

export interface HttpsRequest {
  method?: 'GET' | 'POST';
  /** PEM bundle to trust instead of the system roots. Default: the system roots. */
  caBundlePem?: string;
  /** A client certificate to present (mutual TLS). Default: none. */
  clientCert?: { certPem: string; keyPem: string };
  /** Extra request headers (for example a bearer token). Default: none. */
  headers?: Record<string, string>;
  /** Whole-exchange deadline. Default: 10 s. */
  timeoutMs?: number;
  /** Largest response body accepted. Default: 1 MiB. */
  maxBytes?: number;
  body?: unknown;
  /** Abort early, e.g. when the caller went away. */
  signal?: AbortSignal;
}

export const DEFAULT_TIMEOUT_MS = 10_000;
export const DEFAULT_MAX_BYTES = 1024 * 1024;

/** Error codes: Timeout, TooLarge, BadStatus, BadJSON, Network. */
export class HttpsError extends SealionError {
  readonly status: number | undefined;
  /** A BadStatus answer's body (within the size limit), for callers that read a Kubernetes Status from it. */
  body?: string;
  constructor(code: string, message: string, status?: number, cause?: unknown) {
    super(code, message, { cause });
    this.name = 'HttpsError';
    this.status = status;
  }
}

/** Pools are keyed by CA bundle and client certificate; a handful of authenticators share a handful of pools. */
const pools = new Map<string, Dispatcher>();

function poolFor(caBundlePem: string | undefined, clientCert: HttpsRequest['clientCert']): Dispatcher {
  const key = createHash('sha256')
    .update(caBundlePem ?? 'system')
    .update('\0')
    .update(clientCert?.certPem ?? '')
    .digest('hex');
  let pool = pools.get(key);
  if (!pool) {
    pool = new Agent({
      connect: {
        ...(caBundlePem ? { ca: caBundlePem } : {}),
        ...(clientCert ? { cert: clientCert.certPem, key: clientCert.keyPem } : {}),
        minVersion: 'TLSv1.2',
      },
      keepAliveTimeout: 30_000,
    });
    pools.set(key, pool);
  }
  return pool;
}

/** Performs the request and parses a JSON response. Throws HttpsError on anything else. */
export async function httpsJSON(
  url: string,
  req: HttpsRequest = {},
): Promise<{ status: number; json: unknown }> {
  const { status, text } = await httpsText(url, req, 'application/json');
  try {
    return { status, json: JSON.parse(text) as unknown };
  } catch (err) {
    throw new HttpsError('BadJSON', 'response is not valid JSON', status, err);
  }
}

/** Performs the request and returns a successful response's body as text. Throws HttpsError on anything else. */
export async function httpsText(
  url: string,
  req: HttpsRequest = {},
  accept = '*/*',
): Promise<{ status: number; text: string }> {
  if (!url.startsWith('https://')) throw new HttpsError('Network', `refusing non-https URL ${url}`);
  const timeoutMs = req.timeoutMs ?? DEFAULT_TIMEOUT_MS;
  const maxBytes = req.maxBytes ?? DEFAULT_MAX_BYTES;
  const deadline = AbortSignal.timeout(timeoutMs);
  const signal = req.signal ? AbortSignal.any([deadline, req.signal]) : deadline;
  try {
    const res = await request(url, {
      method: req.method ?? 'GET',
      dispatcher: poolFor(req.caBundlePem, req.clientCert),
      signal,
      headers: {
        ...req.headers,
        accept,
        ...(req.body === undefined ? {} : { 'content-type': 'application/json' }),
      },
      ...(req.body === undefined ? {} : { body: JSON.stringify(req.body) }),
    });
    const declared = Number(res.headers['content-length'] ?? 0);
    if (declared > maxBytes) {
      res.body.destroy();
      throw new HttpsError(
        'TooLarge',
        `response of ${declared} bytes is over the limit of ${maxBytes}`,
        res.statusCode,
      );
    }
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of res.body as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > maxBytes) {
        res.body.destroy();
        throw new HttpsError('TooLarge', `response is over the limit of ${maxBytes} bytes`, res.statusCode);
      }
      chunks.push(chunk);
    }
    const text = Buffer.concat(chunks).toString('utf8');
    if (res.statusCode < 200 || res.statusCode > 299) {
      const failed = new HttpsError('BadStatus', `HTTP ${res.statusCode}`, res.statusCode);
      failed.body = text;
      throw failed;
    }
    return { status: res.statusCode, text };
  } catch (err) {
    if (err instanceof HttpsError) throw err;
    if (deadline.aborted)
      throw new HttpsError('Timeout', `no complete answer within ${timeoutMs} ms`, undefined, err);
    const reason =
      err instanceof undiciErrors.UndiciError || err instanceof Error
        ? err.cause instanceof Error
          ? err.cause.message
          : err.message
        : String(err);
    throw new HttpsError('Network', reason, undefined, err);
  }
}

/** Closes the keep-alive pools, so that a one-shot process (a CLI command) exits at once instead of idling. */
export async function closeHttpsPools(): Promise<void> {
  const all = [...pools.values()];
  pools.clear();
  await Promise.all(all.map((pool) => pool.close()));
}

/**
 * Closes the pools at once, ending what is under way: a connection still in its TLS handshake with a server that
 * never answers would hold closeHttpsPools (and the process) until the connect timeout.
 */
export async function destroyHttpsPools(): Promise<void> {
  const all = [...pools.values()];
  pools.clear();
  await Promise.all(all.map((pool) => pool.destroy()));
}
