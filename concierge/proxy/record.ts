// The record stage: an exec or attach session's recording opened before the session is forwarded, and its audit
// event told whether it is recorded. Where sessions must be recorded, one that cannot be (no recording can be
// opened now, or an upgrade through a node's proxy to the kubelet's own API) is refused.
import type { Logger } from '../../lib/log.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';
import { ANNOTATIONS } from '../audit/audit.ts';
import type { Recordings } from '../recording/session.ts';
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

export function newRecorder(recordings: Recordings | undefined, log: Logger): RecordStage {
  return (exchange, attributes, query) => {
    const upgrade = recordings && asUpgrade(exchange);
    if (!upgrade) return undefined;
    if (recordings.required && reachesKubelet(attributes)) return KUBELET_UNRECORDED;
    return isSession(attributes) ? record(recordings, log, upgrade, attributes, query) : undefined;
  };
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
    if (!recordings.required) return undefined;
    return {
      status: 503,
      message: 'this session cannot be recorded now, and sessions must be recorded here; retry later',
      retryAfterSeconds: 1,
    };
  }
}
