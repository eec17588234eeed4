// SubjectAccessReviews as plain data: the question, the object that asks it, and how to read the answer. Kept apart
// from the client-node adapters (kube.ts) because a review is also sent as raw JSON through an agent's tunnel, to
// the cluster the question is about.

/**
 * What the API server authorizes a request as (its RequestInfo, k8s.io/apiserver/pkg/endpoints/request): a resource
 * request names its verb, group, version, resource, subresource, namespace and name; anything else is a
 * non-resource request, decided by path and the lower-cased method.
 */
export type RequestAttributes =
  | {
      resourceRequest: true;
      verb: string;
      group: string;
      version: string;
      resource: string;
      subresource: string;
      namespace: string;
      name: string;
    }
  | { resourceRequest: false; verb: string; path: string };

/**
 * Who may do what (SubjectAccessReview): the subject, and one resource action or, with `path`, one non-resource
 * request.
 */
export interface AccessQuestion {
  user: string;
  groups: string[];
  extra: Record<string, string[]>;
  uid?: string;
  verb: string;
  /** A non-resource request's path; the resource fields are unused then. */
  path?: string;
  group?: string;
  version?: string;
  resource?: string;
  subresource?: string;
  name?: string;
  namespace?: string;
}

/** A SubjectAccessReview object, as sent. */
export interface SubjectAccessReview {
  apiVersion: 'authorization.k8s.io/v1';
  kind: 'SubjectAccessReview';
  spec: Record<string, unknown>;
}

/** A SubjectAccessReview asking `q`, built field by field (the same object whichever way it is sent). */
export function subjectAccessReview(q: AccessQuestion): SubjectAccessReview {
  const optional = (key: string, value: string | undefined): Record<string, string> =>
    value ? { [key]: value } : {};
  return {
    apiVersion: 'authorization.k8s.io/v1',
    kind: 'SubjectAccessReview',
    spec: {
      user: q.user,
      groups: q.groups,
      extra: q.extra,
      ...optional('uid', q.uid),
      ...(q.path !== undefined
        ? { nonResourceAttributes: { path: q.path, verb: q.verb } }
        : {
            resourceAttributes: {
              verb: q.verb,
              group: q.group ?? '',
              resource: q.resource ?? '',
              ...optional('version', q.version),
              ...optional('subresource', q.subresource),
              ...optional('name', q.name),
              ...optional('namespace', q.namespace),
            },
          }),
    },
  };
}

/** Whether a SubjectAccessReview's answer (parsed JSON) allows; anything malformed is no. */
export function reviewAllowed(answer: unknown): boolean {
  const status = (answer as { status?: { allowed?: unknown } } | null)?.status;
  return status?.allowed === true;
}

/** A SelfSubjectAccessReview object, as sent: may the sender itself do what `q` asks (its subject is ignored)? */
export interface SelfSubjectAccessReview {
  apiVersion: 'authorization.k8s.io/v1';
  kind: 'SelfSubjectAccessReview';
  spec: Record<string, unknown>;
}

export function selfSubjectAccessReview(q: AccessQuestion): SelfSubjectAccessReview {
  const { spec } = subjectAccessReview(q);
  return {
    apiVersion: 'authorization.k8s.io/v1',
    kind: 'SelfSubjectAccessReview',
    spec: {
      ...(spec['resourceAttributes'] ? { resourceAttributes: spec['resourceAttributes'] } : {}),
      ...(spec['nonResourceAttributes'] ? { nonResourceAttributes: spec['nonResourceAttributes'] } : {}),
    },
  };
}
