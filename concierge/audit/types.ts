// The audit.k8s.io/v1 shapes Sealion writes, as the Kubernetes API server writes them (k8s.io/apiserver's
// pkg/apis/audit/v1): a sink that reads the API server's audit events reads Sealion's.

export const AUDIT_API_VERSION = 'audit.k8s.io/v1';

/** How much of a request an event keeps. */
export type Level = 'None' | 'Metadata' | 'Request' | 'RequestResponse';

/** When in a request's life an event is written. */
export type Stage = 'RequestReceived' | 'ResponseStarted' | 'ResponseComplete' | 'Panic';

export interface UserInfo {
  username?: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

export interface ObjectReference {
  resource?: string;
  namespace?: string;
  name?: string;
  uid?: string;
  apiGroup?: string;
  apiVersion?: string;
  resourceVersion?: string;
  subresource?: string;
}

/** A metav1.Status, as the audit event's responseStatus holds it. */
export interface ResponseStatus {
  metadata: Record<string, never>;
  status?: 'Success' | 'Failure';
  message?: string;
  reason?: string;
  details?: unknown;
  code: number;
}

export interface AuditEvent {
  kind: 'Event';
  apiVersion: typeof AUDIT_API_VERSION;
  level: Exclude<Level, 'None'>;
  auditID: string;
  stage: Stage;
  requestURI: string;
  verb: string;
  user: UserInfo;
  impersonatedUser?: UserInfo;
  sourceIPs?: string[];
  userAgent?: string;
  objectRef?: ObjectReference;
  responseStatus?: ResponseStatus;
  requestObject?: unknown;
  responseObject?: unknown;
  /** RFC 3339 with microseconds, as metav1.MicroTime. */
  requestReceivedTimestamp: string;
  stageTimestamp: string;
  annotations?: Record<string, string>;
}

export interface EventList {
  kind: 'EventList';
  apiVersion: typeof AUDIT_API_VERSION;
  metadata: Record<string, never>;
  items: AuditEvent[];
}

/**
 * A request's or answer's body as an event keeps it: its JSON text, which is what stays in memory while the event
 * waits for its sinks; it becomes an object only as the event is written (JSON.stringify calls toJSON), one event at
 * a time. Parsed objects would hold many times their text's size (`[{},{},…]` about twenty times), and a body the
 * policy keeps waits in a queue of thousands.
 */
export class JSONBody {
  readonly text: string;
  readonly #shape: (object: unknown) => unknown;
  constructor(text: string, shape: (object: unknown) => unknown = (o) => o) {
    this.text = text;
    this.#shape = shape;
  }

  toJSON(): unknown {
    try {
      return this.#shape(JSON.parse(this.text));
    } catch {
      // Not JSON after all (a client that said it was): the event says so instead of failing its batch.
      return '[the body is not JSON]';
    }
  }
}

/** About how much memory an event holds while it waits: its fields, and the text of the bodies it keeps. */
export function eventBytes(event: AuditEvent): number {
  let bytes = 2048;
  if (event.requestObject instanceof JSONBody) bytes += event.requestObject.text.length * 2;
  if (event.responseObject instanceof JSONBody) bytes += event.responseObject.text.length * 2;
  return bytes;
}
