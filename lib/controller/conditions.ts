// Conditions as Kubernetes keeps them: lastTransitionTime moves only when a condition's status changes, and a
// status write is skipped when nothing but timestamps would differ.
import type { Condition } from '../../apis/meta.ts';
import { isDeepStrictEqual } from 'node:util';

export interface ConditionInput {
  type: string;
  status: Condition['status'];
  reason: string;
  message: string;
}

/** The new condition list; entries whose status did not change keep their lastTransitionTime. */
export function mergeConditions(
  previous: readonly Condition[] | undefined,
  next: readonly ConditionInput[],
  now: Date,
  observedGeneration?: number,
): Condition[] {
  return next.map((c) => {
    const old = previous?.find((p) => p.type === c.type);
    const lastTransitionTime = old && old.status === c.status ? old.lastTransitionTime : now.toISOString();
    return { ...c, lastTransitionTime, ...(observedGeneration === undefined ? {} : { observedGeneration }) };
  });
}

/** A Ready condition summarizing the others: True only when all are. */
export function readyCondition(others: readonly ConditionInput[], kind: string): ConditionInput {
  const ok = others.every((c) => c.status === 'True');
  return ok
    ? { type: 'Ready', status: 'True', reason: 'Success', message: `the ${kind} is ready` }
    : {
        type: 'Ready',
        status: 'False',
        reason: 'NotReady',
        message: `the ${kind} is not ready: see other conditions for details`,
      };
}

/** Whether two statuses are equal once timestamps are set aside. */
export function sameIgnoringTimes(a: unknown, b: unknown): boolean {
  const strip = (v: unknown): unknown =>
    JSON.parse(
      JSON.stringify(v ?? {}, (key, value: unknown) =>
        key === 'lastTransitionTime' || key === 'lastUpdateTime' ? undefined : value,
      ),
    );
  return isDeepStrictEqual(strip(a), strip(b));
}
