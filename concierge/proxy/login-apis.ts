// TokenCredentialRequest (login.concierge.<suffix>) and WhoAmIRequest (identity.concierge.<suffix>), served by
// the proxy itself in Pinniped's wire format: a create answered 201 either way; a failed login says only
// "authentication failed" (the reason goes to the log).
import type { ApiGroups } from '../../apis/groups.ts';
import { VERSION } from '../../apis/groups.ts';
import {
  AUTHENTICATION_FAILED,
  CREDENTIAL_LIFETIME_BOUNDS,
  DEFAULT_CREDENTIAL_LIFETIME_SECONDS,
  MAX_CSR_BYTES,
} from '../../apis/login.ts';
import { reasonProblem } from '../../apis/access.ts';
import { publicKeyFromCSR } from '../../lib/pki/pki.ts';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { webcrypto } from 'node:crypto';
import type { Readable } from 'node:stream';
import { identityProblem } from '../../lib/authn/identity.ts';
import { CREDENTIAL_ID_EXTRA } from '../../lib/authn/jwt.ts';
import { MAX_TOKEN_BYTES, type UserInfo } from '../../lib/authn/types.ts';
import type { Logger } from '../../lib/log.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import type { ClientCertSigner } from './credentials.ts';
import { send, writeStatus } from '../../lib/kube/status.ts';
import { systemClock, type Clock } from '../../lib/clock.ts';

/**
 * A TokenCredentialRequest is a token (at most MAX_TOKEN_BYTES), an authenticator's name and perhaps a CSR; a
 * WhoAmIRequest is nearly empty. Anything larger is not one of them, and both APIs take a body from callers who may
 * be nobody.
 */
const MAX_BODY_BYTES = MAX_TOKEN_BYTES + MAX_CSR_BYTES + 4 * 1024;
/** The whole body must arrive within this; a real client sends these few KiB at once. */
const BODY_TIMEOUT_MS = 10_000;

export class BodyError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

/** Reads a small JSON body within MAX_BODY_BYTES and BODY_TIMEOUT_MS, or throws a BodyError to answer with. */
export function readJSON(req: Request, clock: Clock, timeoutMs = BODY_TIMEOUT_MS): Promise<unknown> {
  const declared = Number(req.headers['content-length']);
  if (declared > MAX_BODY_BYTES)
    return Promise.reject(new BodyError(413, `request body over ${MAX_BODY_BYTES} bytes`));
  const body: Readable = 'stream' in req ? req.stream : req;
  return new Promise((done, fail) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const stop = (err: BodyError): void => {
      clock.clearTimeout(timer);
      body.off('data', onData);
      body.off('end', onEnd);
      // Paused: the answer to this error ends the request (status.ts send), and nothing reads the rest.
      body.pause();
      fail(err);
    };
    const timer = clock.setTimeout(
      () => stop(new BodyError(408, `request body not received within ${timeoutMs / 1000} s`)),
      timeoutMs,
    );
    const onData = (chunk: Buffer): void => {
      size += chunk.length;
      if (size > MAX_BODY_BYTES) return stop(new BodyError(413, `request body over ${MAX_BODY_BYTES} bytes`));
      chunks.push(chunk);
    };
    const onEnd = (): void => {
      clock.clearTimeout(timer);
      try {
        done(JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown);
      } catch {
        fail(new BodyError(400, 'request body is not valid JSON'));
      }
    };
    // A client gone mid-body (closed, reset, errored) ends the read too: the request settles, and whatever it held
    // (its timer, a place among the requests in flight) is let go. After 'end' the promise has settled already.
    const gone = (): void => stop(new BodyError(400, 'the client went away before its request body ended'));
    body.on('data', onData);
    body.once('end', onEnd);
    body.once('close', gone);
    body.once('error', gone);
  });
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

/** The fields each kind knows, for field validation; metadata is taken as it is (nothing in it is kept). */
const KNOWN_FIELDS: Record<string, string[]> = {
  '': ['apiVersion', 'kind', 'metadata', 'spec', 'status'],
  TokenCredentialRequest: ['token', 'authenticator', 'certificateSigningRequest', 'reason'],
  WhoAmIRequest: [],
};

/**
 * Field validation as the API server does it for a create (the fieldValidation parameter): Strict refuses unknown fields with 400, Warn names them in Warning headers, Ignore
 * (or none) lets them be. Answers and returns undefined when the request was refused, else the headers to answer with.
 */
function validateFields(
  req: Request,
  res: Response,
  body: unknown,
  kind: string,
): Record<string, string> | undefined {
  const mode = new URLSearchParams((req.url ?? '').split('?')[1] ?? '').get('fieldValidation') ?? 'Ignore';
  if (mode === 'Ignore' || !isRecord(body)) return {};
  const unknown = [
    ...Object.keys(body).filter((k) => !KNOWN_FIELDS['']!.includes(k)),
    ...(isRecord(body['spec'])
      ? Object.keys(body['spec'])
          .filter((k) => !(KNOWN_FIELDS[kind] ?? []).includes(k))
          .map((k) => `spec.${k}`)
      : []),
  ];
  if (mode !== 'Strict' && mode !== 'Warn') {
    writeStatus(res, 400, `fieldValidation must be Ignore, Warn or Strict, not ${JSON.stringify(mode)}`);
    return undefined;
  }
  if (unknown.length === 0) return {};
  const words = unknown.map((f) => `unknown field ${JSON.stringify(f)}`);
  if (mode === 'Strict') {
    writeStatus(res, 400, `strict decoding error: ${words.join(', ')}`);
    return undefined;
  }
  return { warning: words.map((w) => `299 - ${JSON.stringify(w)}`).join(', ') };
}

export function serveResourceList(
  res: Response,
  group: string,
  plural: string,
  kind: string,
  verbs: string[],
): void {
  send(
    res,
    200,
    'application/json',
    JSON.stringify({
      kind: 'APIResourceList',
      apiVersion: 'v1',
      groupVersion: `${group}/${VERSION}`,
      resources: [{ name: plural, singularName: kind.toLowerCase(), namespaced: false, kind, verbs }],
    }),
  );
}

export interface LoginDeps {
  groups: ApiGroups;
  cache: AuthenticatorCache;
  signer: ClientCertSigner;
  log: Logger;
  /** Default: BODY_TIMEOUT_MS. */
  bodyTimeoutMs?: number;
  /** The body's deadline. Default: the system's. */
  clock?: Clock;
  /**
   * A place for the costly part (the token's check and the certificate), taken once the whole body is in: its release,
   * or undefined when there is none now (answered 429). Default: no bound here.
   */
  admit?: () => (() => void) | undefined;
}

/**
 * The authenticator's certificate lifetime, kept within bounds even if its CRD's validation was loosened: a
 * certificate cannot be revoked, so no edit may make one live for a week.
 */
function credentialLifetimeSeconds(configured: number | undefined): number {
  if (configured === undefined || !Number.isFinite(configured)) return DEFAULT_CREDENTIAL_LIFETIME_SECONDS;
  return Math.min(
    CREDENTIAL_LIFETIME_BOUNDS.max,
    Math.max(CREDENTIAL_LIFETIME_BOUNDS.min, Math.floor(configured)),
  );
}

/** A TokenCredentialRequest's spec, checked: what a credential is issued for. */
interface LoginRequest {
  token: string;
  /** spec.authenticator as sent (echoed in the answer). */
  ref: unknown;
  /** The key of the CSR the caller sent, to certify instead of making one. */
  publicKey: webcrypto.CryptoKey | undefined;
  /** spec.reason, checked: what the certificate carries on. */
  reason: string | undefined;
  /** Headers the answer carries (field validation's warnings). */
  warnings: Record<string, string>;
}

export async function handleTokenCredentialRequest(
  req: Request,
  res: Response,
  rest: string,
  deps: LoginDeps,
): Promise<void> {
  const apiVersion = `${deps.groups.login}/${VERSION}`;
  if (rest.startsWith('/namespaces/'))
    return writeStatus(res, 400, 'TokenCredentialRequest is cluster-scoped; leave out the namespace');
  if (rest !== '/tokencredentialrequests')
    return writeStatus(res, 404, `the server could not find the requested resource`);
  if (req.method === 'GET') {
    return send(
      res,
      200,
      'application/json',
      JSON.stringify({ kind: 'TokenCredentialRequestList', apiVersion, metadata: {}, items: [] }),
    );
  }
  if (req.method !== 'POST')
    return writeStatus(res, 405, `${req.method} is not supported on tokencredentialrequests`);
  const login = await readLoginRequest(req, res, deps);
  if (!login) return;
  const { ref } = login;
  const kind = isRecord(ref) ? ref['kind'] : undefined;
  const name = isRecord(ref) ? ref['name'] : undefined;
  if (
    !isRecord(ref) ||
    ref['apiGroup'] !== deps.groups.authentication ||
    (kind !== 'JWTAuthenticator' && kind !== 'WebhookAuthenticator') ||
    typeof name !== 'string'
  ) {
    return loginFailed(
      res,
      deps,
      login,
      `spec.authenticator does not name a JWTAuthenticator or WebhookAuthenticator of ${deps.groups.authentication}`,
    );
  }
  const release = deps.admit ? deps.admit() : () => {};
  if (!release)
    return writeStatus(res, 429, 'too many TokenCredentialRequests at once; retry shortly', {
      retryAfterSeconds: 1,
    });
  try {
    await issueFor(res, deps, login, kind, name);
  } finally {
    release();
  }
}

/**
 * Reads and checks a TokenCredentialRequest's body: its kind, its token, its CSR (checked before the token: a
 * malformed one is the caller's mistake, said plainly, and costs no authenticator a call; what it proves, possession
 * of the key, says nothing about who the caller is). Undefined when it was refused (answered already).
 */
async function readLoginRequest(
  req: Request,
  res: Response,
  deps: LoginDeps,
): Promise<LoginRequest | undefined> {
  const apiVersion = `${deps.groups.login}/${VERSION}`;
  let body: unknown;
  try {
    body = await readJSON(req, deps.clock ?? systemClock, deps.bodyTimeoutMs);
  } catch (err) {
    writeStatus(res, err instanceof BodyError ? err.status : 400, (err as Error).message);
    return undefined;
  }
  const warnings = validateFields(req, res, body, 'TokenCredentialRequest');
  if (!warnings) return undefined;
  const spec = isRecord(body) ? body['spec'] : undefined;
  const token = isRecord(spec) ? spec['token'] : undefined;
  if (!isRecord(body) || body['kind'] !== 'TokenCredentialRequest' || body['apiVersion'] !== apiVersion) {
    writeStatus(res, 400, `expected a TokenCredentialRequest of ${apiVersion}`);
    return undefined;
  }
  if (typeof token !== 'string' || token === '') {
    writeStatus(
      res,
      422,
      'TokenCredentialRequest.login.concierge "" is invalid: spec.token.value: Required value: token must be supplied',
      {
        kind: 'TokenCredentialRequest',
        causes: [
          {
            reason: 'FieldValueRequired',
            message: 'Required value: token must be supplied',
            field: 'spec.token.value',
          },
        ],
      },
    );
    return undefined;
  }
  if (isRecord(body['metadata']) && body['metadata']['namespace']) {
    writeStatus(res, 400, 'TokenCredentialRequest is cluster-scoped; leave out metadata.namespace');
    return undefined;
  }
  // Checked before the token, as the CSR is: a bad reason is the caller's mistake, said plainly (never echoed: it
  // goes back to whoever sent it, but a log or a terminal between may print it).
  const reason = isRecord(spec) ? spec['reason'] : undefined;
  const problem = reason === undefined ? undefined : reasonProblem(reason);
  if (problem) {
    writeStatus(res, 400, `spec.reason ${problem}`, {
      kind: 'TokenCredentialRequest',
      causes: [{ reason: 'FieldValueInvalid', message: problem, field: 'spec.reason' }],
    });
    return undefined;
  }
  const csr = isRecord(spec) ? spec['certificateSigningRequest'] : undefined;
  const publicKey = await csrKey(res, csr);
  if (publicKey === null) return undefined;
  return {
    token,
    ref: isRecord(spec) ? spec['authenticator'] : undefined,
    publicKey,
    reason: reason as string | undefined,
    warnings,
  };
}

/** The key of the CSR sent, undefined when none was; null when it is malformed (answered 422). */
async function csrKey(res: Response, csr: unknown): Promise<webcrypto.CryptoKey | undefined | null> {
  if (csr === undefined || csr === '') return undefined;
  if (typeof csr !== 'string' || csr.length > MAX_CSR_BYTES) {
    writeStatus(
      res,
      422,
      `spec.certificateSigningRequest must be a PEM certificate request of at most ${MAX_CSR_BYTES} bytes`,
    );
    return null;
  }
  try {
    return await publicKeyFromCSR(csr);
  } catch (err) {
    writeStatus(
      res,
      422,
      `spec.certificateSigningRequest: ${(err as Error).message} (an ECDSA P-256 key is required)`,
    );
    return null;
  }
}

/** A TokenCredentialRequest's answer: 201 with its status, a credential or why there is none. */
function answerLogin(res: Response, deps: LoginDeps, login: LoginRequest, status: object): void {
  send(
    res,
    201,
    'application/json',
    JSON.stringify({
      kind: 'TokenCredentialRequest',
      apiVersion: `${deps.groups.login}/${VERSION}`,
      metadata: { creationTimestamp: null },
      spec: { authenticator: login.ref ?? {} },
      status,
    }),
    login.warnings,
  );
}

/** A failed login says only AUTHENTICATION_FAILED; the reason goes to the log. */
function loginFailed(res: Response, deps: LoginDeps, login: LoginRequest, reason: string): void {
  deps.log.info({ reason }, 'token credential request failed');
  answerLogin(res, deps, login, { message: AUTHENTICATION_FAILED });
}

/** The token checked by the authenticator named, and a certificate issued for whom it says. */
async function issueFor(
  res: Response,
  deps: LoginDeps,
  login: LoginRequest,
  kind: 'JWTAuthenticator' | 'WebhookAuthenticator',
  name: string,
): Promise<void> {
  const failed = (reason: string): void => loginFailed(res, deps, login, reason);
  const result = await deps.cache.authenticateWith(kind, name, login.token);
  if (!result.ok) return failed(result.reason);
  // A certificate says a username and groups, nothing more: an identity that carries more would lose it silently.
  if (result.user.uid) return failed('users with a uid cannot be expressed in a client certificate');
  // The credential's id names the token, not the user: a certificate is another credential.
  if (Object.keys(result.user.extra).some((key) => key !== CREDENTIAL_ID_EXTRA))
    return failed('users with extra attributes cannot be expressed in a client certificate');
  const problem = identityProblem(result.user);
  if (problem) return failed(`${result.authenticator}: ${problem}`);
  let issued;
  try {
    issued = await deps.signer.issue(result.user, {
      lifetimeMs: credentialLifetimeSeconds(result.credentialLifetimeSeconds) * 1000,
      ...(login.publicKey ? { publicKey: login.publicKey } : {}),
      ...(result.binding ? { binding: result.binding } : {}),
      ...(result.allowSystemNames ? { allowSystemNames: true } : {}),
      ...(login.reason !== undefined ? { reason: login.reason } : {}),
    });
  } catch (err) {
    return failed(`${result.authenticator}: no certificate issued: ${(err as Error).message}`);
  }
  if (!issued) return failed('no signer is ready');
  // A signer that cannot certify the client's key (the cluster's, which signs only a request made with the key it
  // certifies) made one and hands it back.
  const keyFrom = issued.keyPem ? 'concierge' : 'client';
  deps.log.info(
    {
      user: result.user.username,
      authenticator: result.authenticator,
      expires: issued.notAfter.toISOString(),
      keyFrom,
      // Whether, not what: the reason is the user's text, and the audit of each request carries it.
      withReason: login.reason !== undefined,
    },
    'issued client certificate',
  );
  answerLogin(res, deps, login, {
    credential: {
      expirationTimestamp: issued.notAfter.toISOString(),
      clientCertificateData: issued.certPem,
      ...(issued.keyPem ? { clientKeyData: issued.keyPem } : {}),
    },
  });
}

export async function handleWhoAmI(
  req: Request,
  res: Response,
  rest: string,
  groups: ApiGroups,
  user: UserInfo,
  clock: Clock = systemClock,
): Promise<void> {
  if (rest !== '/whoamirequests')
    return writeStatus(res, 404, 'the server could not find the requested resource');
  if (req.method !== 'POST') return writeStatus(res, 405, `${req.method} is not supported on whoamirequests`);
  let body: unknown;
  try {
    body = await readJSON(req, clock);
  } catch (err) {
    return writeStatus(res, err instanceof BodyError ? err.status : 400, (err as Error).message);
  }
  const warnings = validateFields(req, res, body, 'WhoAmIRequest');
  if (!warnings) return;
  send(
    res,
    201,
    'application/json',
    JSON.stringify({
      kind: 'WhoAmIRequest',
      apiVersion: `${groups.identity}/${VERSION}`,
      metadata: { creationTimestamp: null },
      spec: {},
      status: {
        kubernetesUserInfo: {
          user: {
            username: user.username,
            ...(user.uid ? { uid: user.uid } : {}),
            groups: user.groups,
            extra: user.extra,
          },
        },
      },
    }),
    warnings,
  );
}
