// The audit a concierge runs, from its options: the policy, the sinks (a JSON-lines log, a webhook), the mode.
import type { Registry } from 'prom-client';
import { systemClock, type Clock } from '../../lib/clock.ts';
import type { Logger } from '../../lib/log.ts';
import { newAuditor, type Auditor } from './audit.ts';
import { newAuditBackend, type AuditMode, type AuditSink } from './backend.ts';
import type { AuditPolicy } from './policy.ts';
import { newLogSink, newWebhookSink } from './sinks.ts';

export interface AuditOptions {
  policy: AuditPolicy;
  /** JSON lines, one event each, to a file ('-': standard output), rotated by size. */
  log?: { path: string; maxSizeMiB?: number; maxBackups?: number; maxAgeDays?: number };
  /** EventList batches POSTed to the server a kubeconfig-format file names, as kube-apiserver's webhook backend. */
  webhook?: { kubeconfigPath: string };
  /** batch (default): a slow sink never slows a request; blocking: a request whose event cannot be written is refused. */
  mode?: AuditMode;
}

export interface RunningAudit {
  auditor: Auditor;
  /** Writes what is queued, then closes the sinks. */
  close(): Promise<void>;
}

/**
 * The auditor for `opts`, or undefined when nothing would ever be written (no sink, or a policy of None only).
 * `clock` times the batches and the webhook's retries (default: systemClock).
 */
export async function startAudit(
  opts: AuditOptions,
  replica: string,
  registry: Registry,
  log: Logger,
  clock: Clock = systemClock,
): Promise<RunningAudit | undefined> {
  const sinks: AuditSink[] = [];
  if (opts.log) sinks.push(newLogSink(opts.log));
  if (opts.webhook) sinks.push(await newWebhookSink({ ...opts.webhook, clock }));
  if (sinks.length === 0 || !opts.policy.auditsAnything) {
    await Promise.all(sinks.map((s) => s.close()));
    log.warn(
      sinks.length === 0
        ? 'an audit policy but no audit sink: audit is off'
        : 'the audit policy audits nothing',
    );
    return undefined;
  }
  const backend = newAuditBackend({ sinks, mode: opts.mode ?? 'batch', registry, log, clock });
  log.info({ sinks: sinks.map((s) => s.name), mode: backend.mode }, 'audit on');
  return { auditor: newAuditor({ policy: opts.policy, backend, replica }), close: () => backend.close() };
}
