// The aggregated APIs' request handler: TokenCredentialRequest (login.concierge.<suffix>) and WhoAmIRequest
// (identity.concierge.<suffix>) as the cluster's own API server serves them through its APIServices, with their
// discovery and OpenAPI. Every request but a health check must come from the API server's front proxy, and is made
// as the user the front proxy names; whatever fails there is the same 401.
import type { ApiGroups } from '../../apis/groups.ts';
import { VERSION } from '../../apis/groups.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import type { Logger } from '../../lib/log.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import { send, UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { handleTokenCredentialRequest, handleWhoAmI, type LoginDeps } from '../proxy/login-apis.ts';
import { randomUUID } from 'node:crypto';
import { ANNOTATIONS, preciseNow, type Auditor, type RequestAudit } from '../audit/audit.ts';
import { requestAttributes } from '../../lib/kube/request-info.ts';
import { DISCOVERY_V2, discoveryDocuments } from '../proxy/discovery.ts';
import { frontProxyUser } from './front-proxy.ts';
import type { RequestHeaderConfig } from '../../lib/kube/request-header.ts';

/**
 * TokenCredentialRequests being checked and signed at once (their bodies in). Each costs the cluster a
 * CertificateSigningRequest's create, approval, signing and delete; more get 429 with Retry-After, which client-go waits
 * out. They all come through the API server's front proxy, whose own limits on requests in flight bound how many
 * bodies are being read.
 */
export const MAX_LOGINS_IN_FLIGHT = 32;

export interface DirectAPIDeps {
  groups: ApiGroups;
  groupSuffix: string;
  /** The API server's request-header settings now; undefined: none readable (every request is refused). */
  requestHeader: () => RequestHeaderConfig | undefined;
  /** Fingerprints of the CAs the listener trusts now (the request-header CA). */
  trusted: () => ReadonlySet<string>;
  login: LoginDeps;
  /** Asks the cluster whether the front proxy's user may do what it asks (delegated authorization). */
  reviewer: Reviewer;
  /** Audit events for every request but health checks, joined to the API server's by its Audit-ID. Default: none. */
  auditor?: Auditor;
  log: Logger;
}

/** The route annotation of what the API server proxies here. */
export const AGGREGATED_ROUTE = 'aggregated';
/** An Audit-ID the front proxy sends is kept (it is the API server's own event's); anything odd is replaced. */
const AUDIT_ID = /^[A-Za-z0-9-]{1,64}$/;

const JSON_TYPE = 'application/json';

/** Whether an Accept header asks for aggregated discovery v2 (in any of the forms clients write it). */
function wantsAggregated(accept: string | undefined): boolean {
  if (!accept) return false;
  return accept.split(',').some((part) => {
    const params = part.split(';').map((p) => p.trim().replace(/\s+/g, ''));
    return (
      params[0] === 'application/json' &&
      params.includes('g=apidiscovery.k8s.io') &&
      params.includes('v=v2') &&
      params.includes('as=APIGroupDiscoveryList')
    );
  });
}

export function newDirectAPIHandler(deps: DirectAPIDeps): (req: Request, res: Response) => void {
  const docs = discoveryDocuments(deps.groupSuffix);
  const loginPrefix = `/apis/${deps.groups.login}/${VERSION}`;
  const identityPrefix = `/apis/${deps.groups.identity}/${VERSION}`;
  let loginsInFlight = 0;
  const admit = (): (() => void) | undefined => {
    if (loginsInFlight >= MAX_LOGINS_IN_FLIGHT) return undefined;
    loginsInFlight++;
    let released = false;
    return () => {
      if (!released) loginsInFlight--;
      released = true;
    };
  };

  /** Delegated authorization: the cluster's own answer for this user creating `resource` in `group`. */
  async function allowed(user: UserInfo, group: string, resource: string): Promise<boolean> {
    return deps.reviewer.allowed({
      user: user.username,
      groups: user.groups,
      extra: user.extra,
      ...(user.uid ? { uid: user.uid } : {}),
      verb: 'create',
      group,
      version: VERSION,
      resource,
    });
  }

  async function serve(req: Request, res: Response): Promise<void> {
    const url = req.url ?? '/';
    const query = url.indexOf('?');
    const path = query < 0 ? url : url.slice(0, query);
    if (path === '/healthz' || path === '/livez' || path === '/readyz')
      return send(res, 200, 'text/plain', 'ok');
    const config = deps.requestHeader();
    const user = config
      ? frontProxyUser(req, config, deps.trusted())
      : { refused: 'no request-header settings' };
    const refused = 'refused' in user;
    // Only the front proxy's Audit-ID is its API server's: anyone else's is replaced.
    const sent = req.headers['audit-id'];
    const audit = deps.auditor?.begin(
      {
        auditID: !refused && typeof sent === 'string' && AUDIT_ID.test(sent) ? sent : randomUUID(),
        requestURI: url,
        attributes: requestAttributes(req.method ?? 'GET', url),
        ...(req.socket?.remoteAddress ? { sourceIP: req.socket.remoteAddress.replace(/^::ffff:/, '') } : {}),
        ...(typeof req.headers['user-agent'] === 'string' ? { userAgent: req.headers['user-agent'] } : {}),
        receivedMs: preciseNow(),
      },
      refused ? undefined : user,
      {
        [ANNOTATIONS.route]: AGGREGATED_ROUTE,
        ...(refused ? {} : { [ANNOTATIONS.authenticator]: 'front-proxy' }),
      },
    );
    if (audit && !(await auditStarted(audit, res))) return;
    if ('refused' in user) {
      deps.log.info({ reason: user.refused, path }, 'aggregated API request refused');
      return writeStatus(res, 401, UNAUTHORIZED);
    }
    const method = req.method ?? 'GET';
    const read = method === 'GET' || method === 'HEAD';
    if (path === '/apis' && read) {
      const aggregated = wantsAggregated(req.headers['accept']);
      return send(
        res,
        200,
        aggregated ? DISCOVERY_V2 : JSON_TYPE,
        aggregated ? docs.aggregated : docs.groupList,
      );
    }
    if (path === '/openapi/v3' && read) return send(res, 200, JSON_TYPE, docs.openAPIRoot);
    for (const group of docs.groups) {
      if (!read) break;
      if (path === `/apis/${group}`) return send(res, 200, JSON_TYPE, docs.group.get(group)!);
      if (path === `/apis/${group}/${VERSION}`)
        return send(res, 200, JSON_TYPE, docs.resourceList.get(group)!);
      if (path === `/openapi/v3/apis/${group}/${VERSION}`)
        return send(res, 200, JSON_TYPE, docs.openAPI.get(group)!, { 'cache-control': 'public, immutable' });
    }
    if (path.startsWith(`${loginPrefix}/`)) {
      const rest = path.slice(loginPrefix.length);
      if (method === 'POST' && !(await allowed(user, deps.groups.login, 'tokencredentialrequests')))
        return writeStatus(res, 403, `${user.username} may not create tokencredentialrequests`);
      // Counted from the moment the body is in: a caller that sends its body slowly holds only its connection (the
      // body must come within its deadline), never a place a login needs.
      return handleTokenCredentialRequest(req, res, rest, { ...deps.login, admit });
    }
    if (path.startsWith(`${identityPrefix}/`)) {
      if (method === 'POST' && !(await allowed(user, deps.groups.identity, 'whoamirequests')))
        return writeStatus(res, 403, `${user.username} may not create whoamirequests`);
      return handleWhoAmI(req, res, path.slice(identityPrefix.length), deps.groups, user);
    }
    return writeStatus(res, 404, 'the server could not find the requested resource');
  }

  /** The request's first event is written (or, in batch mode, queued); its last follows the answer. */
  async function auditStarted(audit: RequestAudit, res: Response): Promise<boolean> {
    res.on('close', () => audit.complete(res.statusCode));
    try {
      await audit.received();
      return true;
    } catch {
      writeStatus(res, 503, 'the request could not be audited; retry shortly', { retryAfterSeconds: 1 });
      return false;
    }
  }

  return (req, res) => {
    serve(req, res).catch((err: unknown) => {
      deps.log.error({ err: (err as Error).message }, 'aggregated API request failed');
      writeStatus(res, 500, 'internal error');
    });
  };
}
