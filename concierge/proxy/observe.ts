// The pipeline's first stage: every request counted in flight from its arrival, and once it is over (its answer
// ended, or its connection closed), one log line, its metrics and its audit event's last stage. Never a token.
import type { Logger } from '../../lib/log.ts';
import { flatLineLogger } from '../../lib/log.ts';
import { ANNOTATIONS } from '../audit/audit.ts';
import { answerStatus, onClose, type Exchange, type RequestContext } from './exchange.ts';
import type { ProxyMetrics } from './metrics.ts';

/** Starts observing an exchange: `verb` and `path` label its log line, `longRunning` ones get no duration. */
export type Observe = (exchange: Exchange, verb: string, longRunning: boolean, path: string) => void;

/** `logUsernames`: whether the log line names the user (and whom they impersonate); audit events always do. */
export function newObserver(metrics: ProxyMetrics, log: Logger, logUsernames: boolean): Observe {
  const requestLog = flatLineLogger(log);
  return (exchange, verb, longRunning, path) => {
    const { context } = exchange;
    metrics.inflight.inc();
    let done = false;
    onClose(exchange, () => {
      if (done) return;
      done = true;
      metrics.inflight.dec();
      const code = answerStatus(exchange);
      if (context.reach) reachDone(context);
      const seconds = Number(process.hrtime.bigint() - context.started) / 1e9;
      metrics.requests.inc({ verb, code: String(code) });
      if (!longRunning) metrics.duration.observe({ verb }, seconds);
      if (code === 502 || code === 504) metrics.upstreamErrors.inc({ code: String(code) });
      context.audit?.complete(code, context.message);
      requestLog.info(
        {
          id: context.id,
          ...(logUsernames
            ? {
                user: context.user || 'anonymous',
                ...(context.impersonated === undefined ? {} : { as: context.impersonated.username }),
              }
            : {}),
          ...(context.decision ? { decision: context.decision } : {}),
          verb,
          ...(context.cluster ? { cluster: context.cluster } : {}),
          ...(context.route ? { route: context.route } : {}),
          path,
          code,
          bytes: context.bytes,
          ms: Math.round(seconds * 1e4) / 10,
        },
        'request',
      );
    });
  };
}

/** What a reach connection tells its log line and audit event once it is over: its bytes and where it went. */
function reachDone(context: RequestContext): void {
  const reach = context.reach!;
  context.bytes = reach.received;
  context.message ??= reach.message;
  context.audit?.annotate(ANNOTATIONS.bytes, `${reach.sent} sent, ${reach.received} received`);
  if (reach.endpoint) context.audit?.annotate(ANNOTATIONS.endpoint, reach.endpoint);
}
