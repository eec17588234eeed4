// The parts of Kubernetes' own object metadata that Sealion's types refer to.

/** Standard object metadata. */
export interface ObjectMeta {
  name?: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  /** @asType integer */
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: OwnerReference[];
}

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export type ConditionStatus = 'True' | 'False' | 'Unknown';

/** One aspect of an object's current state, in the shape of Kubernetes' metav1.Condition. */
export interface Condition {
  /**
   * The aspect this condition describes, in PascalCase (for example Ready).
   * @pattern ^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$
   * @maxLength 316
   */
  type: string;
  /** Whether the condition holds: True, False or Unknown. */
  status: ConditionStatus;
  /**
   * The metadata.generation that the condition was computed from; older than the object's generation means stale.
   * @asType integer
   * @minimum 0
   */
  observedGeneration?: number;
  /**
   * When status last changed (RFC 3339).
   * @format date-time
   */
  lastTransitionTime: string;
  /**
   * A PascalCase, machine-readable reason for the last transition.
   * @pattern ^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$
   * @minLength 1
   * @maxLength 1024
   */
  reason: string;
  /**
   * A human-readable explanation, with what to do about it when something is wrong.
   * @maxLength 32768
   */
  message: string;
}

/** A reference to an object of a kind in an API group, like Kubernetes' TypedLocalObjectReference. */
export interface TypedLocalObjectReference {
  /** The API group of the referenced kind, for example authentication.concierge.sealion.dev. */
  apiGroup?: string;
  /** The kind, for example JWTAuthenticator. */
  kind: string;
  /** The object's name. */
  name: string;
}
