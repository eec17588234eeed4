// The aggregated APIs' listener, reached through the cluster's API server's front proxy: its pipeline is the
// proxy's stages that apply here. Health (anonymous) → authenticate (front-proxy.ts: whatever fails is the same
// 401) → audit start (proxy/audit-start.ts) → the local APIs (aggregated-apis.ts: discovery, TokenCredentialRequest,
// WhoAmIRequest, each as the user the front proxy names).
import type { Logger } from '../../lib/log.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import { UNAUTHORIZED, writeStatus } from '../../lib/kube/status.ts';
import { parseRequest } from '../../lib/kube/request-info.ts';
import type { RequestHeaderConfig } from '../../lib/kube/request-header.ts';
import { ANNOTATIONS, type Auditor } from '../audit/audit.ts';
import { requestFacts, startAudit } from '../proxy/audit-start.ts';
import { newRequestContext, onClose, refuse, type PlainExchange } from '../proxy/exchange.ts';
import { localAPIs, NOT_FOUND } from '../proxy/local-apis.ts';
import { aggregatedAPIs, type AggregatedAPIDeps } from './aggregated-apis.ts';
import { frontProxyUser } from './front-proxy.ts';

export { MAX_LOGINS_IN_FLIGHT } from './aggregated-apis.ts';

export interface DirectAPIDeps extends AggregatedAPIDeps {
  /** The API server's request-header settings now; undefined: none readable (every request is refused). */
  requestHeader: () => RequestHeaderConfig | undefined;
  /** Fingerprints of the CAs the listener trusts now (the request-header CA). */
  trusted: () => ReadonlySet<string>;
  /** Audit events for every request but health checks, joined to the API server's by its Audit-ID. Default: none. */
  auditor?: Auditor;
  log: Logger;
}

/** The route annotation of what the API server proxies here. */
export const AGGREGATED_ROUTE = 'aggregated';
/** An Audit-ID the front proxy sends is kept (it is the API server's own event's); anything odd is replaced. */
const AUDIT_ID = /^[A-Za-z0-9-]{1,64}$/;
const NOT_AUDITED = 'the request could not be audited; retry shortly';

export function newDirectAPIHandler(deps: DirectAPIDeps): (req: Request, res: Response) => void {
  const { auditor, log } = deps;
  const apis = localAPIs(aggregatedAPIs(deps));

  async function serve(req: Request, res: Response): Promise<void> {
    const url = req.url ?? '/';
    const parsed = parseRequest(req.method ?? 'GET', url, false);
    const api = apis.find(parsed.path, req.method ?? 'GET');
    if (api?.who === 'anonymous') return api.serve(req, res, parsed.path, undefined);
    const config = deps.requestHeader();
    const user = config
      ? frontProxyUser(req, config, deps.trusted())
      : { refused: 'no request-header settings' };
    const known = 'refused' in user ? undefined : user;
    // Only the front proxy's Audit-ID is its API server's: anyone else's is replaced.
    const sent = req.headers['audit-id'];
    const id = known && typeof sent === 'string' && AUDIT_ID.test(sent) ? sent : undefined;
    const exchange: PlainExchange = { kind: 'plain', req, res, context: newRequestContext(id) };
    if (auditor) {
      onClose(exchange, () => exchange.context.audit?.complete(res.statusCode));
      const facts = requestFacts(req, exchange.context.id, url, parsed.attributes);
      const notes = {
        [ANNOTATIONS.route]: AGGREGATED_ROUTE,
        ...(known ? { [ANNOTATIONS.authenticator]: 'front-proxy' } : {}),
      };
      if (!(await startAudit(exchange, auditor, facts, known, notes, NOT_AUDITED))) return;
    }
    if ('refused' in user) {
      log.info({ reason: user.refused, path: parsed.path }, 'aggregated API request refused');
      return refuse(exchange, { status: 401, message: UNAUTHORIZED });
    }
    if (api?.who !== 'front-proxy') return writeStatus(res, 404, NOT_FOUND);
    return api.serve(req, res, parsed.path, user);
  }

  return (req, res) => {
    serve(req, res).catch((err: unknown) => {
      log.error({ err: (err as Error).message }, 'aggregated API request failed');
      writeStatus(res, 500, 'internal error');
    });
  };
}
