// What every fuzz answer must satisfy, whatever the input.
//
// Who made a 5xx: the API server stamps every response it writes with an Audit-Id header (its audit filter runs
// for every request, whether or not an audit policy is configured), and the proxy relays the API server's headers.
// The proxy's own answers (lib/status-body.ts) carry only content-type, content-length and sometimes
// connection or retry-after. So a 5xx without Audit-Id was made by the proxy (or the tunnel listener); the body
// cannot tell them apart, since both write the same Kubernetes Status shape.
//
// A proxy-made 5xx is a finding, except the answers the design gives on purpose when an upstream is genuinely not
// there: 503 for a `/clusters/<name>/` whose agent holds no tunnel (and, on the peer link, for one whose tunnel is not
// on this replica), and, only for cases that play a broken agent, 502/503/504 naming that agent's cluster.
//
// The tunnel listener's registration has no API server behind it, so every answer there is the listener's own: a
// refusal with one of a few 4xx codes as a Status (or its one 401 body), a certificate only for a valid bootstrap
// token, and never a 5xx.
import { statusBody } from '../../lib/kube/status.ts';
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
/** What a replica answers a peer that sent a request for a tunnel it does not hold (a stale route). */
const NOT_HELD = /^cluster .* is not connected: its agent's tunnel is no longer on replica .*; retry$/s;

export type FindingKind =
  | 'proxy-5xx'
  | 'other-401'
  | 'hang'
  | 'crash'
  | 'accepted-forgery'
  /** A positive control (a well-formed, authenticated request) did not get its success. */
  | 'control-failed'
  /** A request that is owed an answer got its connection closed instead. */
  | 'unanswered'
  /** A refusal in a shape or with a code the design does not give. */
  | 'bad-refusal'
  /** A request the design accepts was refused, or answered otherwise than it says. */
  | 'wrong-answer'
  /** Something the proxy must drop reached an agent. */
  | 'leak'
  /** A well-behaved user was not served while hostile clients held what they may hold. */
  | 'unserved'
  /**
   * A request that asked to act as someone else reached the API server, though the API server, asked the same by the
   * same caller directly, refuses that impersonation: the proxy forwarded it without what it asked for.
   */
  | 'impersonation-ignored'
  | 'other';

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

/**
 * How an answer is counted in its family's tally: its status class, or what came instead of a response. A family
 * whose answers are all `closed` or `unsendable` reached nothing, whatever the oracle said of each.
 */
export function answerKind(answer: Answer): string {
  if (answer.kind !== 'response') return answer.kind;
  return answer.status >= 100 && answer.status < 600 ? `${Math.floor(answer.status / 100)}xx` : 'not HTTP';
}

/** A one-line account of an answer, for a finding's message. */
export function describeAnswer(answer: Answer): string {
  if (answer.kind !== 'response') return `${answer.kind} (${answer.detail})`;
  return `${answer.status} ${answer.body.slice(0, 300)}`;
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
  /** Sent over a peer link: a replica that does not hold the cluster's tunnel says so with a 503. */
  peer?: boolean;
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
    if (status === 503 && opts.peer && NOT_HELD.test(message)) return undefined;
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

/**
 * Whether the API server's own answer to a request refuses the impersonation it asked for: a Forbidden from its
 * impersonation filter (`cannot impersonate…`, in every mode) or the BadRequest for groups, a uid or extra without a
 * user (`without impersonating a user name`).
 */
export function refusesImpersonation(direct: Answer): boolean {
  if (direct.kind !== 'response' || !madeByApiServer(direct.headers)) return false;
  if (direct.status !== 400 && direct.status !== 403) return false;
  return /cannot impersonate|without impersonating a user/.test(statusMessage(direct.body) ?? '');
}

/**
 * The finding in the proxy's answer to a request that asked to impersonate, given what the API server answered the
 * same request from the same caller sent to it directly (`direct`). The proxy decides impersonation as the API server
 * does and refuses it itself, so when the API server refuses the impersonation, no answer of the API server's may
 * come back through the proxy: one that does means the request was sent on as its caller, without what it asked.
 */
export function judgeImpersonation(viaProxy: Answer, direct: Answer): Finding | undefined {
  if (viaProxy.kind !== 'response' || !madeByApiServer(viaProxy.headers) || !refusesImpersonation(direct))
    return undefined;
  return {
    kind: 'impersonation-ignored',
    message:
      `the API server refuses this impersonation (${describeAnswer(direct)}), yet the request reached it through ` +
      `the proxy and was answered ${describeAnswer(viaProxy)}`,
  };
}

/** Throws the finding, for use inside a property. */
export function expectClean(answer: Answer, opts?: JudgeOptions): void {
  const finding = judge(answer, opts);
  if (finding) throw new FindingError(finding);
}

/** The codes a registration may be refused with: malformed, unauthenticated, forbidden, unknown, too large, too many. */
export const REGISTRATION_REFUSALS = [400, 401, 403, 404, 413, 429];

function statusCode(body: string): number | undefined {
  try {
    const parsed = JSON.parse(body) as { kind?: unknown; code?: unknown };
    return parsed.kind === 'Status' && typeof parsed.code === 'number' ? parsed.code : undefined;
  } catch {
    return undefined;
  }
}

export interface RegistrationJudgement {
  /**
   * Whether the request may get a certificate: `must` (a fresh bootstrap token for the cluster it names and a valid
   * CSR), `may` (the CSR was mangled in ways a lenient parser may still read; the family checks the key), `never`.
   */
  issue: 'must' | 'may' | 'never';
  /** Whether the request is owed an answer: a body within the listener's limit, framed as it says. */
  owed: boolean;
}

/**
 * The finding in an answer to POST /register, if any. The certificate of a 200 is the family's to check (its key,
 * its name); here only whether one may be given at all.
 */
export function judgeRegistration(answer: Answer, opts: RegistrationJudgement): Finding | undefined {
  if (answer.kind === 'hang') return { kind: 'hang', message: answer.detail };
  if (answer.kind !== 'response')
    return opts.owed
      ? { kind: 'unanswered', message: `a registration within the limits got no answer: ${answer.detail}` }
      : undefined;
  const { status, headers, body } = answer;
  if (status >= 500)
    return {
      kind: 'proxy-5xx',
      message: `the tunnel listener answered a registration with ${status}: ${body}`,
    };
  if (status === 200) {
    if (opts.issue === 'never')
      return {
        kind: 'accepted-forgery',
        message: `a registration that must be refused got 200: ${body.slice(0, 300)}`,
      };
    return undefined;
  }
  if (!REGISTRATION_REFUSALS.includes(status))
    return { kind: 'bad-refusal', message: `a registration answered ${status}: ${body.slice(0, 300)}` };
  const canonical = statusCode(body) === status || (status === 401 && TUNNEL_401_BODIES.includes(body));
  if (!canonical)
    return {
      kind: 'bad-refusal',
      message: `a ${status} to a registration that is no Status of its code: ${body.slice(0, 300)}`,
    };
  if (status === 429 && !/^\d+$/.test(headers['retry-after'] ?? ''))
    return { kind: 'bad-refusal', message: 'a 429 to a registration without a Retry-After in seconds' };
  // A limit on registrations is a legitimate answer to any of them; anything else refuses what must be accepted.
  if (opts.issue === 'must' && status !== 429)
    return {
      kind: 'wrong-answer',
      message: `a valid registration was refused: ${status} ${body.slice(0, 300)}`,
    };
  return undefined;
}

/** Throws the finding in a registration's answer, for use inside a property. */
export function expectRegistration(answer: Answer, opts: RegistrationJudgement): void {
  const finding = judgeRegistration(answer, opts);
  if (finding) throw new FindingError(finding);
}
