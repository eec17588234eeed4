// Prometheus metrics of the proxy, on their own registry so tests and several proxies in one process do not clash.
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { unhandledRejectionsSeen } from '../../lib/process-errors.ts';

export interface ProxyMetrics {
  registry: Registry;
  requests: Counter<'verb' | 'code'>;
  duration: Histogram<'verb'>;
  inflight: Gauge;
  upstreamErrors: Counter<'code'>;
  /**
   * Answers and upgraded connections cut because what their user left unread was over their share
   * (lib/http2/memory-budget.ts).
   */
  unreadCuts: Counter;
  /** Promise rejections nothing handled in this process, read from lib/process-errors.ts when scraped. */
  unhandledRejections: Counter;
}

export function newProxyMetrics(): ProxyMetrics {
  const registry = new Registry();
  return {
    registry,
    requests: new Counter({
      name: 'sealion_proxy_requests_total',
      help: 'Requests answered, by verb and HTTP status code.',
      labelNames: ['verb', 'code'],
      registers: [registry],
    }),
    duration: new Histogram({
      name: 'sealion_proxy_request_duration_seconds',
      help: 'Time to the end of the response for short (not long-running) requests.',
      labelNames: ['verb'],
      buckets: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [registry],
    }),
    inflight: new Gauge({
      name: 'sealion_proxy_inflight_requests',
      help: 'Requests being served, long-running ones included.',
      registers: [registry],
    }),
    upstreamErrors: new Counter({
      name: 'sealion_proxy_upstream_errors_total',
      help: 'Requests the API server could not answer (502) or not in time (504).',
      labelNames: ['code'],
      registers: [registry],
    }),
    unreadCuts: new Counter({
      name: 'sealion_unread_answers_cut_total',
      help: "Answers and upgraded connections cut because the bytes their user left unread were over the user's share, or everyone's over the replica's.",
      registers: [registry],
    }),
    unhandledRejections: new Counter({
      name: 'sealion_unhandled_rejections_total',
      help: 'Promise rejections nothing handled in this process (each a bug, logged with its stack; the process serves on).',
      registers: [registry],
      collect() {
        // The process's count (lib/process-errors.ts), whichever concierge of the process is asked.
        this.reset();
        const seen = unhandledRejectionsSeen();
        if (seen > 0) this.inc(seen);
      },
    }),
  };
}

/** The bytes `budget` holds charged for answers and upgraded connections left unread, as a gauge of `registry`. */
export function unreadBytesGauge(registry: Registry, held: () => number): Gauge {
  return new Gauge({
    name: 'sealion_unread_answer_bytes',
    help: 'Bytes of answers and upgraded connections that clients leave unread, held by this replica (at most what its stream windows allow).',
    registers: [registry],
    collect() {
      this.set(held());
    },
  });
}
