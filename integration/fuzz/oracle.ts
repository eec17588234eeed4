// What every fuzz answer must satisfy, whatever the input.
//
// Who made a 5xx: the API server stamps every response it writes with an Audit-Id header (its audit filter runs
// for every request, whether or not an audit policy is configured), and the proxy relays the API server's headers.
// The proxy's own answers (lib/status-body.ts) carry only content-type, content-length and sometimes
// connection or retry-after. So a 5xx without Audit-Id was made by the proxy (or the tunnel listener); the body
// cannot tell them apart, since both write the same Kubernetes Status shape.
//
// A proxy-made 5xx is a finding, except the answers the design gives on purpose when an upstream is genuinely not
// there: 503 for a `/clusters/<name>/` whose agent holds no tunnel, and, only for cases that play a broken agent,
// 502/503/504 naming that agent's cluster.
import { statusBody } from '../../lib/kube-status.ts';
import type { Answer } from './wire.ts';

/** The one body every failed authentication gets (the proxy's, and the tunnel listener's refusals). */
export const UNAUTHORIZED_BODY = statusBody(401, 'Unauthorized');
/**
 * The tunnel listener answers each of its endpoints' failed authentications with one body, but not the same across
 * endpoints: /connect with the Status above, /register and /renew with these.
 */
export const TUNNEL_401_BODIES = [
  UNAUTHORIZED_BODY,
  JSON.stringify({ message: 'registration rejected' }),
  JSON.stringify({ message: 'renewal rejected' }),
];

const NOT_CONNECTED = /^cluster .* is not connected: its agent holds no tunnel to any concierge replica$/s;

export type FindingKind = 'proxy-5xx' | 'other-401' | 'hang' | 'crash' | 'accepted-forgery' | 'other';

export interface Finding {
  kind: FindingKind;
  message: string;
}

export class FindingError extends Error {
  readonly finding: Finding;
  constructor(finding: Finding) {
    super(`${finding.kind}: ${finding.message}`);
    this.finding = finding;
  }
}

export function madeByApiServer(headers: Record<string, string>): boolean {
  return 'audit-id' in headers;
}

function statusMessage(body: string): string | undefined {
  try {
    const parsed = JSON.parse(body) as { message?: unknown };
    return typeof parsed.message === 'string' ? parsed.message : undefined;
  } catch {
    return undefined;
  }
}

export interface JudgeOptions {
  /** The agent cluster this case plays, whose tunnel failures the proxy reports as 502/503/504. */
  brokenAgent?: string;
  /** Extra 401 bodies that are canonical where this case sends (the tunnel listener's registration). */
  other401Bodies?: string[];
  /** A HEAD request: its answers have no body to compare. */
  head?: boolean;
  /** The status a fake upstream answered with: the proxy relaying it (a 5xx, a 401) did not make it. */
  upstreamStatus?: number;
}

/** The finding in one answer, if any. Proxy liveness is checked by the runner, across all cases. */
export function judge(answer: Answer, opts: JudgeOptions = {}): Finding | undefined {
  if (answer.kind === 'hang') return { kind: 'hang', message: answer.detail };
  if (answer.kind !== 'response') return undefined;
  const { status, headers, body } = answer;
  // A 401 that a fake upstream sent is its own, relayed; only the proxy's refusals must be the one body.
  const relayed401 = status === 401 && opts.upstreamStatus === 401;
  if (
    status === 401 &&
    !opts.head &&
    !relayed401 &&
    body !== UNAUTHORIZED_BODY &&
    !opts.other401Bodies?.includes(body)
  )
    return { kind: 'other-401', message: `a 401 with another body: ${body.slice(0, 300)}` };
  if (status >= 500 && !madeByApiServer(headers)) {
    const message = statusMessage(body) ?? '';
    if (status === 503 && NOT_CONNECTED.test(message)) return undefined;
    // A HEAD answer has no body to read the message from; 503 is what a cluster not connected gets.
    if (status === 503 && opts.head && body === '') return undefined;
    if (status === opts.upstreamStatus && !message.startsWith('internal error')) return undefined;
    if (
      opts.brokenAgent &&
      [502, 503, 504].includes(status) &&
      message.startsWith(`cluster ${opts.brokenAgent}: `)
    )
      return undefined;
    return { kind: 'proxy-5xx', message: `${status} made by the proxy: ${body.slice(0, 300)}` };
  }
  return undefined;
}

/** Throws the finding, for use inside a property. */
export function expectClean(answer: Answer, opts?: JudgeOptions): void {
  const finding = judge(answer, opts);
  if (finding) throw new FindingError(finding);
}
