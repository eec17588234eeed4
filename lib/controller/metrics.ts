// The work queues' metrics, one series per controller, on a registry the process passes in (the concierge's is the
// proxy's, served at /metrics). client-go's workqueue metrics, by the names Sealion's other metrics use.
import { Counter, Gauge, Histogram, type Registry } from 'prom-client';
import type { QueueMetrics } from './queue.ts';

/** Makes the metrics once per registry; returns the queue metrics of one controller. */
export function newQueueMetrics(registry: Registry): (controller: string) => QueueMetrics {
  const labelNames = ['controller'] as const;
  const depth = new Gauge({
    name: 'sealion_controller_queue_depth',
    help: 'Keys waiting in a controller work queue, by controller.',
    labelNames,
    registers: [registry],
  });
  const adds = new Counter({
    name: 'sealion_controller_queue_adds_total',
    help: 'Keys added to a controller work queue (a key already waiting is not counted again), by controller.',
    labelNames,
    registers: [registry],
  });
  const retries = new Counter({
    name: 'sealion_controller_queue_retries_total',
    help: 'Failed syncs put back with backoff, by controller.',
    labelNames,
    registers: [registry],
  });
  const drops = new Counter({
    name: 'sealion_controller_queue_dropped_total',
    help: 'Keys dropped after failing more than the retry cap in a row, by controller.',
    labelNames,
    registers: [registry],
  });
  const duration = new Histogram({
    name: 'sealion_controller_sync_duration_seconds',
    help: 'Time a sync took, successful or not, by controller.',
    labelNames,
    buckets: [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60],
    registers: [registry],
  });
  return (controller) => {
    const labels = { controller };
    const d = depth.labels(labels);
    const a = adds.labels(labels);
    const r = retries.labels(labels);
    const x = drops.labels(labels);
    const h = duration.labels(labels);
    d.set(0);
    return {
      depth: (keys) => d.set(keys),
      added: () => a.inc(),
      retried: () => r.inc(),
      dropped: () => x.inc(),
      synced: (seconds) => h.observe(seconds),
    };
  };
}
