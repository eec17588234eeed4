// Audit events for the requests Sealion serves, in the API server's own format and by its own policy rules: one
// audit ID per request (the request context's id, which Sealion also sets as the Audit-ID of what it forwards, so
// the target API server's events carry the same ID), the authenticated caller as `user`, whom it acts as as
// `impersonatedUser`, and Sealion's own facts (cluster, authenticator, replica, route, decision) as annotations.
import type { UserInfo as Identity } from '../../lib/authn/types.ts';
import { reasonOf } from '../../lib/kube/status.ts';
import { authenticatedGroups } from '../../lib/kube/authenticated.ts';
import type { RequestAttributes } from '../../lib/kube/request-info.ts';
import type { AuditBackend } from './backend.ts';
import type { ObjectMetaNames } from './protobuf-meta.ts';
import type { AuditPolicy, RequestAuditConfig } from './policy.ts';
import type { AuditEvent, Level, ObjectReference, ResponseStatus, UserInfo } from './types.ts';
import { AUDIT_API_VERSION, JSONBody } from './types.ts';

/** The API server cuts a longer User-Agent and says so (k8s.io/apiserver/pkg/audit/request.go): so does Sealion. */
const MAX_USER_AGENT = 1024;
const USER_AGENT_TRUNCATED = '...TRUNCATED';

/** Annotation keys: Sealion's facts about a request, which no API server event has. */
export const ANNOTATIONS = {
  cluster: 'sealion.dev/cluster',
  authenticator: 'sealion.dev/authenticator',
  replica: 'sealion.dev/replica',
  route: 'sealion.dev/route',
  decision: 'sealion.dev/decision',
  reason: 'sealion.dev/reason',
  recording: 'sealion.dev/recording',
  objects: 'sealion.dev/objects',
  /** A reach connection's bytes: sent to the target, received from it. */
  bytes: 'sealion.dev/bytes',
  /** The address a reach connection dialed, where the concierge dialed it. */
  endpoint: 'sealion.dev/endpoint',
} as const;

/** What is known of a request when it arrives. */
export interface RequestFacts {
  auditID: string;
  /** The URI the client sent (with `/clusters/<name>` for a cluster's). */
  requestURI: string;
  attributes: RequestAttributes;
  sourceIP?: string;
  userAgent?: string;
  /** When it arrived, in milliseconds since the epoch (fractions kept: events carry microseconds). */
  receivedMs: number;
}

/** The audit of one request, started once it is known who sent it. */
export interface RequestAudit {
  readonly level: Exclude<Level, 'None'>;
  /** Whether the policy keeps request bodies (Request and RequestResponse) or answers too (RequestResponse). */
  readonly keepsRequest: boolean;
  readonly keepsResponse: boolean;
  /** Whether the request's body names its object (a create or an update), as the API server's events say. */
  readonly namesObject: boolean;
  annotate(key: string, value: string): void;
  /** The identity the request is forwarded as, when the caller impersonates someone. */
  impersonating(user: Identity): void;
  /** The request's body, JSON text (kept at Request and RequestResponse). */
  requestBody(text: string): void;
  /** The names a body the event cannot keep (protobuf) gives its object, as the API server's events name it. */
  requestNames(names: ObjectMetaNames): void;
  /**
   * The answer's body, JSON text: its Status, if it is one, goes into responseStatus; the text is kept at
   * RequestResponse.
   */
  answered(text: string): void;
  /**
   * The RequestReceived event (unless the policy leaves it out). In blocking mode it settles once written, and
   * rejects when it could not be: the request must then be refused. In batch mode it resolves at once.
   */
  received(): Promise<void>;
  /** The ResponseStarted event of a long-running request (a watch, an upgrade), once its answer's head went out. */
  responseStarted(code: number): void;
  /** The ResponseComplete event; `message` is that of the Status Sealion answered with, if it answered itself. */
  complete(code: number, message?: string): void;
}

export interface Auditor {
  /**
   * The audit of a request by `user` (undefined: nobody was authenticated), or undefined when the policy does not
   * audit it. `annotations` are Sealion's facts known so far.
   */
  begin(
    facts: RequestFacts,
    user: Identity | undefined,
    annotations?: Record<string, string>,
  ): RequestAudit | undefined;
  /** The backend, in blocking mode or not. */
  readonly backend: AuditBackend;
}

export interface AuditorOptions {
  policy: AuditPolicy;
  backend: AuditBackend;
  /** This replica's name: each event says which replica wrote it. */
  replica: string;
  /** The time now, in milliseconds since the epoch, with fractions. Default: performance's clock. */
  now?: () => number;
}

/** metav1.MicroTime as JSON: RFC 3339 in UTC with six fractional digits. */
export function microTime(ms: number): string {
  const whole = Math.floor(ms);
  const micros = Math.floor((ms - whole) * 1000);
  const second = Math.floor(whole / 1000);
  // Three times a request: the date and time up to the second are formatted once a second, not each time.
  if (second !== formatted.second)
    formatted = { second, prefix: new Date(second * 1000).toISOString().slice(0, 20) }; // ...:SS.
  const fraction = (whole - second * 1000) * 1000 + micros;
  return `${formatted.prefix}${String(fraction).padStart(6, '0')}Z`;
}
let formatted = { second: Number.NaN, prefix: '' };

export const preciseNow = (): number => performance.timeOrigin + performance.now();

/**
 * An identity as the API server's events show it: an authenticated user is in system:authenticated, as the API
 * server puts everyone but the anonymous.
 */
function userOf(identity: Identity): UserInfo {
  return {
    username: identity.username,
    ...(identity.uid ? { uid: identity.uid } : {}),
    groups: authenticatedGroups(identity),
    ...(Object.keys(identity.extra).length > 0 ? { extra: identity.extra } : {}),
  };
}

/** Kinds whose bodies carry a credential in the clear: the credential is left out of every event. */
const CREDENTIAL_KINDS = new Set(['TokenReview', 'TokenRequest', 'TokenCredentialRequest']);

/**
 * An object as an event may keep it: a token or key a credential API carries is replaced, whatever the policy's
 * level (an API server's own policies usually keep these at Metadata; a policy that forgets must still leak nothing).
 */
export function withoutCredentials(object: unknown, credentialAPI = false): unknown {
  if (typeof object !== 'object' || object === null) return object;
  const kind = (object as { kind?: unknown }).kind;
  // The API server takes a body without its kind, from its URL: what the URL names counts as much as the kind.
  if (!credentialAPI && (typeof kind !== 'string' || !CREDENTIAL_KINDS.has(kind))) return object;
  const copy = structuredClone(object) as {
    spec?: Record<string, unknown>;
    status?: Record<string, unknown>;
  };
  if (copy.spec && 'token' in copy.spec) copy.spec['token'] = REDACTED;
  if (copy.status && 'token' in copy.status) copy.status['token'] = REDACTED;
  const credential = copy.status?.['credential'] as Record<string, unknown> | undefined;
  if (credential && typeof credential === 'object')
    for (const key of ['token', 'clientKeyData']) if (key in credential) credential[key] = REDACTED;
  return copy;
}

const REDACTED = '[redacted]';

/** The APIs whose bodies carry credentials: token reviews, token requests, TokenCredentialRequests. */
function credentialResource(attributes: RequestAttributes): boolean {
  if (!attributes.resourceRequest) return false;
  return (
    attributes.resource === 'tokenreviews' ||
    attributes.resource === 'tokencredentialrequests' ||
    attributes.subresource === 'token'
  );
}

/** An object (or a list's items) without metadata.managedFields, as the policy's omitManagedFields asks. */
function withoutManagedFields(object: unknown, omit: boolean): unknown {
  if (!omit || typeof object !== 'object' || object === null) return object;
  const strip = (o: unknown): void => {
    const metadata = (o as { metadata?: Record<string, unknown> } | null)?.metadata;
    if (metadata && typeof metadata === 'object') delete metadata['managedFields'];
  };
  strip(object);
  const items = (object as { items?: unknown }).items;
  if (Array.isArray(items)) items.forEach(strip);
  return object;
}

/** An answer longer than this is no Status (whose message the API server caps far below). */
const MAX_STATUS_TEXT = 64 * 1024;

/** A copy of `event` with `changes`, and neither body (a stage before they are known). */
function withoutBodies(event: AuditEvent, changes: Partial<AuditEvent>): AuditEvent {
  const copy = { ...event, ...changes };
  delete copy.requestObject;
  delete copy.responseObject;
  return copy;
}

/**
 * The object a create's or an update's body names, into the event's objectRef where the URL left a field empty, as
 * the API server fills it from the object it decoded (k8s.io/apiserver/pkg/audit/request.go LogRequestObject).
 */
function fillFromBody(ref: ObjectReference, metadata: Record<string, unknown> | undefined): ObjectReference {
  if (!metadata || typeof metadata !== 'object') return ref;
  const take = (field: 'namespace' | 'name' | 'uid' | 'resourceVersion'): void => {
    const value = metadata[field];
    if (!ref[field] && typeof value === 'string' && value !== '') ref[field] = value;
  };
  take('namespace');
  take('name');
  take('uid');
  take('resourceVersion');
  return ref;
}

/** A JSON body's metadata, or undefined. */
function metadataOf(text: string): Record<string, unknown> | undefined {
  try {
    return (JSON.parse(text) as { metadata?: Record<string, unknown> } | null)?.metadata;
  } catch {
    return undefined;
  }
}

function objectRefOf(attributes: RequestAttributes): ObjectReference | undefined {
  if (!attributes.resourceRequest) return undefined;
  const { resource, namespace, name, group, version, subresource } = attributes;
  return {
    resource,
    ...(namespace ? { namespace } : {}),
    ...(name ? { name } : {}),
    ...(group ? { apiGroup: group } : {}),
    apiVersion: version,
    ...(subresource ? { subresource } : {}),
  };
}

interface StatusObject {
  kind: 'Status';
  status?: string;
  message?: string;
  reason?: string;
  details?: unknown;
  code?: number;
}

const isStatus = (object: unknown): object is StatusObject =>
  typeof object === 'object' && object !== null && (object as { kind?: unknown }).kind === 'Status';

/** The failure fields of a Status, as the API server copies them into its event's responseStatus. */
function statusFrom(status: StatusObject, code: number): ResponseStatus {
  return {
    metadata: {},
    ...(status.status === 'Success' || status.status === 'Failure' ? { status: status.status } : {}),
    ...(typeof status.message === 'string' ? { message: status.message } : {}),
    ...(typeof status.reason === 'string' ? { reason: status.reason } : {}),
    ...(status.details !== undefined ? { details: status.details } : {}),
    code,
  };
}

function responseStatusOf(code: number, message?: string): ResponseStatus {
  if (code < 400 && message === undefined) return { metadata: {}, code };
  return {
    metadata: {},
    status: code < 400 ? 'Success' : 'Failure',
    ...(message === undefined ? {} : { message, reason: reasonOf(code) }),
    code,
  };
}

export function newAuditor(opts: AuditorOptions): Auditor {
  const now = opts.now ?? preciseNow;
  return {
    backend: opts.backend,
    begin: (facts, identity, annotations = {}) => beginAudit(opts, now, facts, identity, annotations),
  };
}

/** The audit of one request as the policy wants it, or undefined at level None. */
function beginAudit(
  opts: AuditorOptions,
  now: () => number,
  facts: RequestFacts,
  identity: Identity | undefined,
  annotations: Record<string, string>,
): RequestAudit | undefined {
  // As the API server evaluates its policy: after authentication, which puts everyone in system:authenticated.
  const user = identity ? userOf(identity) : undefined;
  const config = opts.policy.evaluate(
    facts.attributes,
    user && { username: user.username ?? '', groups: user.groups ?? [] },
  );
  if (config.level === 'None') return undefined;
  const base = firstEvent(facts, config.level, user, { [ANNOTATIONS.replica]: opts.replica, ...annotations });
  return new RequestEvents(base, { ...config, level: config.level }, facts.attributes, opts.backend, now);
}

/** The RequestReceived event as the request arrived; the later stages are copies of it with what they add. */
function firstEvent(
  facts: RequestFacts,
  level: Exclude<Level, 'None'>,
  user: UserInfo | undefined,
  annotations: Record<string, string>,
): AuditEvent {
  const userAgent =
    facts.userAgent && facts.userAgent.length > MAX_USER_AGENT
      ? facts.userAgent.slice(0, MAX_USER_AGENT) + USER_AGENT_TRUNCATED
      : facts.userAgent;
  const objectRef = objectRefOf(facts.attributes);
  return {
    kind: 'Event',
    apiVersion: AUDIT_API_VERSION,
    level,
    auditID: facts.auditID,
    stage: 'RequestReceived',
    requestURI: facts.requestURI,
    verb: facts.attributes.verb,
    user: user ?? {},
    ...(facts.sourceIP ? { sourceIPs: [facts.sourceIP] } : {}),
    ...(userAgent ? { userAgent } : {}),
    ...(objectRef ? { objectRef } : {}),
    requestReceivedTimestamp: microTime(facts.receivedMs),
    stageTimestamp: '',
    annotations,
  };
}

/** One request's events: what is learnt of it gathered into `base`, and each stage emitted as the policy says. */
class RequestEvents implements RequestAudit {
  readonly level: Exclude<Level, 'None'>;
  readonly keepsRequest: boolean;
  readonly keepsResponse: boolean;
  readonly namesObject: boolean;
  private readonly base: AuditEvent;
  private readonly config: RequestAuditConfig & { level: Exclude<Level, 'None'> };
  private readonly attributes: RequestAttributes;
  private readonly backend: AuditBackend;
  private readonly now: () => number;
  private completed = false;
  private started = false;
  /**
   * The objectRef as the body names it, for a ResponseComplete that reached the API server's handler: one refused
   * by authentication or authorization was never decoded there, and its event names no more than the URL.
   */
  private named: ObjectReference | undefined;
  /** The Status the answer carried, if it was one. */
  private answerStatus: StatusObject | undefined;

  constructor(
    base: AuditEvent,
    config: RequestAuditConfig & { level: Exclude<Level, 'None'> },
    attributes: RequestAttributes,
    backend: AuditBackend,
    now: () => number,
  ) {
    this.base = base;
    this.config = config;
    this.attributes = attributes;
    this.backend = backend;
    this.now = now;
    this.level = config.level;
    this.keepsRequest = this.level === 'Request' || this.level === 'RequestResponse';
    this.keepsResponse = this.level === 'RequestResponse';
    this.namesObject =
      attributes.resourceRequest && (attributes.verb === 'create' || attributes.verb === 'update');
  }

  annotate(key: string, value: string): void {
    this.base.annotations![key] = value;
  }

  impersonating(user: Identity): void {
    this.base.impersonatedUser = userOf(user);
  }

  requestBody(text: string): void {
    const base = this.base;
    if (this.keepsRequest) base.requestObject = new JSONBody(text, (object) => this.shape(object));
    if (this.namesObject && base.objectRef)
      this.named = fillFromBody({ ...base.objectRef }, metadataOf(text));
  }

  requestNames(names: ObjectMetaNames): void {
    const base = this.base;
    if (this.namesObject && base.objectRef) this.named = fillFromBody({ ...base.objectRef }, { ...names });
  }

  answered(text: string): void {
    // A Status is small; only an answer that may be one is parsed here.
    if (text.length <= MAX_STATUS_TEXT && text.includes('"Status"')) {
      try {
        const object: unknown = JSON.parse(text);
        if (isStatus(object)) this.answerStatus = object;
      } catch {
        // Not JSON: no Status to tell.
      }
    }
    if (this.keepsResponse) this.base.responseObject = new JSONBody(text, (object) => this.shape(object));
  }

  received(): Promise<void> {
    if (this.config.omitStages.has('RequestReceived')) return Promise.resolve();
    const base = this.base;
    // The request's body is not read yet at this stage, as with the API server.
    return this.backend.emit(
      withoutBodies(base, { annotations: { ...base.annotations }, stageTimestamp: microTime(this.now()) }),
    );
  }

  responseStarted(code: number): void {
    if (this.started || this.completed) return;
    this.started = true;
    if (this.config.omitStages.has('ResponseStarted')) return;
    const base = this.base;
    // An answer's body is not known when it starts.
    const startedEvent = withoutBodies(base, {
      annotations: { ...base.annotations },
      stage: 'ResponseStarted',
      responseStatus: responseStatusOf(code),
      stageTimestamp: microTime(this.now()),
    });
    if (base.requestObject !== undefined) startedEvent.requestObject = base.requestObject;
    void this.backend.emit(startedEvent).catch(() => {});
  }

  complete(code: number, message?: string): void {
    if (this.completed) return;
    this.completed = true;
    if (this.config.omitStages.has('ResponseComplete')) return;
    const responseStatus =
      this.answerStatus && message === undefined
        ? statusFrom(this.answerStatus, code)
        : responseStatusOf(code, message);
    const objectRef = this.named && code !== 401 && code !== 403 ? { objectRef: this.named } : {};
    const base = this.base;
    const event: AuditEvent = {
      ...base,
      annotations: { ...base.annotations },
      responseStatus,
      ...objectRef,
      stage: 'ResponseComplete',
      stageTimestamp: microTime(this.now()),
    };
    void this.backend.emit(event).catch(() => {});
  }

  /** How a kept body is written: no credential in it, and no managed fields if the policy says so. */
  private shape(object: unknown): unknown {
    return withoutManagedFields(
      withoutCredentials(object, credentialResource(this.attributes)),
      this.config.omitManagedFields,
    );
  }
}
