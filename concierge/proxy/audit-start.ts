// The audit stage every door shares: a request's facts as it arrived, and its audit begun once it is known who sent
// it. In blocking mode a request whose first event cannot be written is refused (503), not served unaudited.
import type { RequestAttributes } from '../../lib/kube/request-info.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Request } from '../../lib/http2/request.ts';
import { preciseNow, type Auditor, type RequestFacts } from '../audit/audit.ts';
import { refuse, type Exchange } from './exchange.ts';

/** What an audit event records of a request as it arrived. */
export function requestFacts(
  req: Request,
  auditID: string,
  requestURI: string,
  attributes: RequestAttributes,
): RequestFacts {
  const address = req.socket?.remoteAddress;
  const agent = req.headers['user-agent'];
  return {
    auditID,
    requestURI,
    attributes,
    ...(address ? { sourceIP: address.replace(/^::ffff:/, '') } : {}),
    ...(typeof agent === 'string' ? { userAgent: agent } : {}),
    receivedMs: preciseNow(),
  };
}

/**
 * Begins the exchange's audit for `user` (undefined: nobody was authenticated), when the policy audits it. With a
 * `refusal` message, waits for its first event and resolves false when it could not be written: the request has
 * been refused then. Without one (health checks, answered whatever the audit's state), waits for nothing.
 */
export async function startAudit(
  exchange: Exchange,
  auditor: Auditor,
  facts: RequestFacts,
  user: UserInfo | undefined,
  annotations: Record<string, string>,
  refusal: string | undefined,
): Promise<boolean> {
  const audit = auditor.begin(facts, user, annotations);
  if (!audit) return true;
  exchange.context.audit = audit;
  if (refusal === undefined) {
    void audit.received().catch(() => {});
    return true;
  }
  try {
    await audit.received();
    return true;
  } catch {
    refuse(exchange, { status: 503, message: refusal, retryAfterSeconds: 1 });
    return false;
  }
}
