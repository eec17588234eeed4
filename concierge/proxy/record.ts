// The record stage: an exec or attach session's recording opened before the session is forwarded, and its audit
// event told whether it is recorded. Where sessions must be recorded, one that cannot be (no recording can be
// opened now, or an upgrade through a node's proxy to the kubelet's own API) is refused.
// An exec that is part of a session recorded as a whole (an sftp session's commands: the session records its own
// operations) gets no recording of its own; its audit event names the session's.
import type { Logger } from '../../lib/log.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';
import { ANNOTATIONS } from '../audit/audit.ts';
import type { OperationsRecording, Recordings } from '../recording/session.ts';
import { asUpgrade, type Exchange, type Refusal, type UpgradeExchange } from './exchange.ts';

/** An exec or attach: a terminal session, which can be recorded. */
const isSession = (
  attributes: RequestAttributes,
): attributes is RequestAttributes & { resourceRequest: true } =>
  attributes.resourceRequest &&
  attributes.resource === 'pods' &&
  (attributes.subresource === 'exec' || attributes.subresource === 'attach');

/** A request through a node's proxy: to the kubelet's own API, where exec and attach are reached another way. */
const reachesKubelet = (attributes: RequestAttributes): boolean =>
  attributes.resourceRequest &&
  attributes.resource === 'nodes' &&
  (attributes.subresource === 'proxy' || attributes.verb === 'proxy');

const KUBELET_UNRECORDED: Refusal = {
  status: 403,
  message:
    "sessions must be recorded here, and an upgrade through a node's proxy (the kubelet's own API) cannot be: use kubectl exec or attach",
};

/**
 * Opens the exchange's recording when it is a session to record. Undefined when there is nothing to record (most
 * requests: nothing is awaited for them); else resolves with the refusal when the session may not go on.
 */
export type RecordStage = (
  exchange: Exchange,
  attributes: RequestAttributes,
  query: string | undefined,
) => Promise<Refusal | undefined> | Refusal | undefined;

/**
 * `partOf`: the session recorded as a whole that a request belongs to, when it does (only this process can say so:
 * the SSH door's in-process connections carry it, never a request). Default: none does.
 */
export function newRecorder(
  recordings: Recordings | undefined,
  log: Logger,
  partOf: (exchange: Exchange) => Pick<OperationsRecording, 'opened'> | undefined = () => undefined,
): RecordStage {
  return (exchange, attributes, query) => {
    const upgrade = recordings && asUpgrade(exchange);
    if (!upgrade) return undefined;
    if (recordings.required && reachesKubelet(attributes)) return KUBELET_UNRECORDED;
    if (!isSession(attributes)) return undefined;
    const whole = partOf(exchange);
    return whole
      ? joinWhole(recordings, upgrade, whole)
      : record(recordings, log, upgrade, attributes, query);
  };
}

const CANNOT_RECORD: Refusal = {
  status: 503,
  message: 'this session cannot be recorded now, and sessions must be recorded here; retry later',
  retryAfterSeconds: 1,
};

/**
 * An exec that is part of a session recorded as a whole: its audit event names the session's recording, and where
 * sessions must be recorded it is refused when that recording could not be opened.
 */
async function joinWhole(
  recordings: Recordings,
  exchange: UpgradeExchange,
  whole: Pick<OperationsRecording, 'opened'>,
): Promise<Refusal | undefined> {
  const { context } = exchange;
  try {
    const id = await whole.opened();
    if (id === undefined) throw new Error('the session recorded nothing before this command');
    context.audit?.annotate(ANNOTATIONS.recording, id);
    return undefined;
  } catch (err) {
    context.audit?.annotate(ANNOTATIONS.recording, `not recorded: ${(err as Error).message}`);
    return recordings.required ? CANNOT_RECORD : undefined;
  }
}

/**
 * Opens the recording of an exec or attach. Returns the refusal when it cannot be opened and sessions must be
 * recorded; otherwise the session goes on, and its audit event says whether it is recorded.
 */
async function record(
  recordings: Recordings,
  log: Logger,
  exchange: UpgradeExchange,
  attributes: RequestAttributes & { resourceRequest: true },
  query: string | undefined,
): Promise<Refusal | undefined> {
  const { context } = exchange;
  try {
    const recording = await recordings.open({
      auditID: context.id,
      user: context.user,
      cluster: context.cluster,
      namespace: attributes.namespace,
      pod: attributes.name,
      subresource: attributes.subresource,
      query: new URLSearchParams(query ?? ''),
    });
    context.recording = recording;
    context.audit?.annotate(ANNOTATIONS.recording, recording.id);
    exchange.socket.once('close', () => void recording.close());
    return undefined;
  } catch (err) {
    log.warn({ id: context.id, err: (err as Error).message }, 'a session could not be recorded');
    context.audit?.annotate(ANNOTATIONS.recording, `not recorded: ${(err as Error).message}`);
    return recordings.required ? CANNOT_RECORD : undefined;
  }
}
