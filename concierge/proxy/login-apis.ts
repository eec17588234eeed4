// TokenCredentialRequest (login.concierge.<suffix>) and WhoAmIRequest (identity.concierge.<suffix>), served by
// the proxy itself in Pinniped's wire format: a create answered 201 either way; a failed login says only
// "authentication failed" (the reason goes to the log).
import type { ApiGroups } from '../../apis/groups.ts';
import { VERSION } from '../../apis/groups.ts';
import { AUTHENTICATION_FAILED, CREDENTIAL_LIFETIME_MS } from '../../apis/login.ts';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Logger } from '../../lib/log.ts';
import type { Request, Response } from './exchange.ts';
import type { ClientCertSigner } from './credentials.ts';
import { send, writeStatus } from './status.ts';

/** A TokenCredentialRequest is a token and a name; anything near this size is not one. */
const MAX_BODY_BYTES = 128 * 1024;

class BodyError extends Error {
  readonly status: number;
  constructor(status: number, message: string) {
    super(message);
    this.status = status;
  }
}

async function readJSON(req: Request): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY_BYTES) throw new BodyError(413, `request body over ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8')) as unknown;
  } catch {
    throw new BodyError(400, 'request body is not valid JSON');
  }
}

const isRecord = (v: unknown): v is Record<string, unknown> =>
  v !== null && typeof v === 'object' && !Array.isArray(v);

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
  let body: unknown;
  try {
    body = await readJSON(req);
  } catch (err) {
    return writeStatus(res, err instanceof BodyError ? err.status : 400, (err as Error).message);
  }
  const spec = isRecord(body) ? body['spec'] : undefined;
  const token = isRecord(spec) ? spec['token'] : undefined;
  const ref = isRecord(spec) ? spec['authenticator'] : undefined;
  if (!isRecord(body) || body['kind'] !== 'TokenCredentialRequest' || body['apiVersion'] !== apiVersion) {
    return writeStatus(res, 400, `expected a TokenCredentialRequest of ${apiVersion}`);
  }
  if (typeof token !== 'string' || token === '') {
    return writeStatus(
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
  }
  if (isRecord(body['metadata']) && body['metadata']['namespace'])
    return writeStatus(res, 400, 'TokenCredentialRequest is cluster-scoped; leave out metadata.namespace');

  const answer = (status: object): void =>
    send(
      res,
      201,
      'application/json',
      JSON.stringify({
        kind: 'TokenCredentialRequest',
        apiVersion,
        metadata: { creationTimestamp: null },
        spec: { authenticator: ref ?? {} },
        status,
      }),
    );
  const failed = (reason: string): void => {
    deps.log.info({ reason }, 'token credential request failed');
    answer({ message: AUTHENTICATION_FAILED });
  };

  const kind = isRecord(ref) ? ref['kind'] : undefined;
  const name = isRecord(ref) ? ref['name'] : undefined;
  if (
    !isRecord(ref) ||
    ref['apiGroup'] !== deps.groups.authentication ||
    (kind !== 'JWTAuthenticator' && kind !== 'WebhookAuthenticator') ||
    typeof name !== 'string'
  ) {
    return failed(
      `spec.authenticator does not name a JWTAuthenticator or WebhookAuthenticator of ${deps.groups.authentication}`,
    );
  }
  const result = await deps.cache.authenticateWith(kind, name, token);
  if (!result.ok) return failed(result.reason);
  if (result.user.uid) return failed('users with a uid cannot be expressed in a client certificate');
  const issued = await deps.signer.issue(result.user, CREDENTIAL_LIFETIME_MS);
  if (!issued) return failed('no signer CA is loaded');
  deps.log.info(
    {
      user: result.user.username,
      authenticator: result.authenticator,
      expires: issued.notAfter.toISOString(),
    },
    'issued client certificate',
  );
  answer({
    credential: {
      expirationTimestamp: issued.notAfter.toISOString(),
      clientCertificateData: issued.certPem,
      clientKeyData: issued.keyPem,
    },
  });
}

export async function handleWhoAmI(
  req: Request,
  res: Response,
  rest: string,
  groups: ApiGroups,
  user: UserInfo,
): Promise<void> {
  if (rest !== '/whoamirequests')
    return writeStatus(res, 404, 'the server could not find the requested resource');
  if (req.method !== 'POST') return writeStatus(res, 405, `${req.method} is not supported on whoamirequests`);
  try {
    await readJSON(req);
  } catch (err) {
    return writeStatus(res, err instanceof BodyError ? err.status : 400, (err as Error).message);
  }
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
  );
}
