// Token authentication through a TokenReview webhook (authentication.k8s.io/v1), its answers kept briefly in an
// AnswerCache. A slow or broken webhook fails closed at its deadline and holds up nothing else, and a flood of
// distinct tokens reaches it at most REVIEWS_IN_FLIGHT at a time.
import { connect } from 'node:tls';
import { systemClock, type Clock } from '../clock.ts';
import { httpsJSON } from '../https-client.ts';
import { AnswerCache, transientFailure } from './answer-cache.ts';
import { systemNameProblem } from './system-names.ts';
import { userRulesProblem, type UserRules } from './jwt-mapping.ts';
import { fail, type AuthResult, type TokenAuthenticator, type UserInfo } from './types.ts';

/** A webhook that has not answered by then counts as a "no"; kubectl's own default request timeout is longer. */
export const DEFAULT_WEBHOOK_TIMEOUT_MS = 10_000;
/** Kubernetes caches webhook approvals for 2 minutes; revocation shows within that. */
export const DEFAULT_SUCCESS_TTL_MS = 2 * 60_000;
/** Refusals are cached shorter, so a user who just got access does not wait long. */
export const DEFAULT_FAILURE_TTL_MS = 10_000;
/** Bounds memory whatever tokens callers send. */
export const DEFAULT_CACHE_ENTRIES = 10_000;
/**
 * Reviews sent to one webhook at once. kubectl repeats one token per user, and repeats are answered from the cache
 * or share a review under way, so honest traffic needs about one review per user every DEFAULT_SUCCESS_TTL_MS;
 * sixteen at once, from a webhook that answers in tens of milliseconds, come to hundreds of new tokens a second. Every
 * distinct junk token, though, is a review, and costs its sender nothing: without a bound, anyone who can reach
 * the proxy could make it flood the webhook (and hold a socket and a request's memory here for each).
 */
export const REVIEWS_IN_FLIGHT = 16;
/**
 * Reviews that wait for one of those to end; more are refused at once, not remembered, so a retry asks again.
 * Small on purpose: with a webhook that hangs, the last waiter is answered within about
 * (1 + REVIEWS_WAITING / REVIEWS_IN_FLIGHT) deadlines, which is already longer than a person should wait.
 */
export const REVIEWS_WAITING = 32;

export interface WebhookSettings {
  endpoint: string;
  /** PEM CA bundle for the webhook. Default: system roots. */
  caBundlePem?: string;
  /** Default: DEFAULT_WEBHOOK_TIMEOUT_MS. */
  timeoutMs?: number;
  /** Default: DEFAULT_SUCCESS_TTL_MS. */
  successTTLms?: number;
  /** Default: DEFAULT_FAILURE_TTL_MS. */
  failureTTLms?: number;
  /** Default: DEFAULT_CACHE_ENTRIES. */
  cacheEntries?: number;
  /** Accept usernames and groups that start with `system:` (see system-names.ts). Default: false. */
  allowSystemNames?: boolean;
  /** The spec's userValidationRules, compiled: each must hold for the answer's user. Default: none. */
  userRules?: UserRules;
  /** Times the probe's deadline. Default: systemClock. */
  clock?: Clock;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

const isStringArray = (v: unknown): v is string[] =>
  Array.isArray(v) && v.every((s) => typeof s === 'string');

/** Reads a TokenReview answer strictly: anything malformed is a "no". */
export function parseTokenReview(json: unknown): { user: UserInfo } | { reason: string } {
  if (!isRecord(json) || json['kind'] !== 'TokenReview') return { reason: 'the answer is not a TokenReview' };
  const status = json['status'];
  if (!isRecord(status)) return { reason: 'the TokenReview has no status' };
  if (status['authenticated'] !== true) {
    return {
      reason: `webhook said not authenticated${typeof status['error'] === 'string' ? `: ${status['error']}` : ''}`,
    };
  }
  const user = status['user'];
  if (!isRecord(user) || typeof user['username'] !== 'string' || user['username'] === '') {
    return { reason: 'the TokenReview has no username' };
  }
  const groups = user['groups'] ?? [];
  if (!isStringArray(groups)) return { reason: 'the TokenReview groups are not a list of strings' };
  const extra = user['extra'] ?? {};
  if (!isRecord(extra) || !Object.values(extra).every(isStringArray)) {
    return { reason: 'the TokenReview extra is not a map of string lists' };
  }
  const uid = typeof user['uid'] === 'string' && user['uid'] !== '' ? user['uid'] : undefined;
  return {
    user: {
      username: user['username'],
      ...(uid ? { uid } : {}),
      groups,
      extra: extra as Record<string, string[]>,
    },
  };
}

export class WebhookAuthenticator implements TokenAuthenticator {
  private readonly answers: AnswerCache;
  private readonly timeoutMs: number;
  readonly settings: WebhookSettings;

  constructor(settings: WebhookSettings) {
    this.settings = settings;
    this.timeoutMs = settings.timeoutMs ?? DEFAULT_WEBHOOK_TIMEOUT_MS;
    this.answers = new AnswerCache((token) => this.review(token), {
      successTTLms: settings.successTTLms ?? DEFAULT_SUCCESS_TTL_MS,
      failureTTLms: settings.failureTTLms ?? DEFAULT_FAILURE_TTL_MS,
      entries: settings.cacheEntries ?? DEFAULT_CACHE_ENTRIES,
      limit: { inFlight: REVIEWS_IN_FLIGHT, waiting: REVIEWS_WAITING },
    });
  }

  authenticate(token: string): Promise<AuthResult> {
    return this.answers.authenticate(token);
  }

  private async review(token: string): Promise<AuthResult> {
    let json: unknown;
    try {
      ({ json } = await httpsJSON(this.settings.endpoint, {
        method: 'POST',
        timeoutMs: this.timeoutMs,
        maxBytes: 256 * 1024,
        ...(this.settings.caBundlePem ? { caBundlePem: this.settings.caBundlePem } : {}),
        body: { apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', spec: { token } },
      }));
    } catch (err) {
      // Not the webhook's answer, so not remembered: the next request asks again.
      return transientFailure(
        `webhook unreachable or failed: ${(err as { code?: string }).code ?? 'Error'}: ${(err as Error).message}`,
      );
    }
    const parsed = parseTokenReview(json);
    if ('reason' in parsed) return fail(parsed.reason);
    if (!this.settings.allowSystemNames) {
      const problem = systemNameProblem(parsed.user);
      if (problem) return fail(`${problem}; refused unless spec.allowSystemNames is true`);
    }
    const refused = userRulesProblem(this.settings.userRules ?? [], parsed.user);
    if (refused) return fail(refused);
    return { ok: true, user: parsed.user, authenticator: this.settings.endpoint };
  }

  /** Opens a TLS connection to the endpoint and verifies its certificate, without sending a token. */
  probe(timeoutMs = this.timeoutMs): Promise<void> {
    const url = new URL(this.settings.endpoint);
    const host = url.hostname.replace(/^\[|\]$/g, '');
    return new Promise((done, failed) => {
      const socket = connect({
        host,
        port: Number(url.port || 443),
        ...(/^[\d.]+$|:/.test(host) ? {} : { servername: host }),
        ...(this.settings.caBundlePem ? { ca: this.settings.caBundlePem } : {}),
        ALPNProtocols: ['http/1.1'],
        minVersion: 'TLSv1.2',
      });
      const clock = this.settings.clock ?? systemClock;
      const timer = clock.setTimeout(
        () => socket.destroy(new Error(`no TLS handshake within ${timeoutMs} ms`)),
        timeoutMs,
      );
      socket.once('secureConnect', () => {
        clock.clearTimeout(timer);
        socket.end();
        done();
      });
      socket.once('error', (err: Error) => {
        clock.clearTimeout(timer);
        failed(err);
      });
    });
  }
}
