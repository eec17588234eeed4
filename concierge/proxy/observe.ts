// The pipeline's first stage: every request counted in flight from its arrival, and once it is over (its answer
// ended, or its connection closed), one log line (none for a health check answered 200), its metrics and its audit
// event's last stage. Never a token.
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
  const count = labelledOnce(metrics);
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
      count(verb, code, longRunning ? undefined : seconds);
      context.audit?.complete(code, context.message);
      if (!(context.probe && code === 200))
        requestLog.info(logLine(context, logUsernames, verb, path, code, seconds), 'request');
    });
  };
}

/**
 * Counts a request's end. prom-client hashes a call's labels each time; the children of each verb and code are
 * looked up once and kept (a few dozen at most: the verbs are Kubernetes' and the codes HTTP's).
 */
function labelledOnce(metrics: ProxyMetrics): (verb: string, code: number, seconds?: number) => void {
  const requests = new Map<string, { inc(): void }>();
  const durations = new Map<string, { observe(value: number): void }>();
  return (verb, code, seconds) => {
    const key = `${verb} ${code}`;
    let counter = requests.get(key);
    if (!counter) requests.set(key, (counter = metrics.requests.labels(verb, String(code))));
    counter.inc();
    if (seconds !== undefined) {
      let histogram = durations.get(verb);
      if (!histogram) durations.set(verb, (histogram = metrics.duration.labels(verb)));
      histogram.observe(seconds);
    }
    if (code === 502 || code === 504) metrics.upstreamErrors.inc({ code: String(code) });
  };
}

/** The request's one log line: what it was, who sent it (unless usernames are kept out of logs), how it ended. */
function logLine(
  context: RequestContext,
  logUsernames: boolean,
  verb: string,
  path: string,
  code: number,
  seconds: number,
): Record<string, unknown> {
  const line: Record<string, unknown> = { id: context.id };
  if (logUsernames) {
    line.user = context.user || 'anonymous';
    if (context.impersonated !== undefined) line.as = context.impersonated.username;
  }
  if (context.decision) line.decision = context.decision;
  line.verb = verb;
  if (context.cluster) line.cluster = context.cluster;
  if (context.route) line.route = context.route;
  line.path = path;
  line.code = code;
  line.bytes = context.bytes;
  line.ms = Math.round(seconds * 1e4) / 10;
  return line;
}

/** What a reach connection tells its log line and audit event once it is over: its bytes and where it went. */
function reachDone(context: RequestContext): void {
  const reach = context.reach!;
  context.bytes = reach.received;
  context.message ??= reach.message;
  context.audit?.annotate(ANNOTATIONS.bytes, `${reach.sent} sent, ${reach.received} received`);
  if (reach.endpoint) context.audit?.annotate(ANNOTATIONS.endpoint, reach.endpoint);
}
