// Header hygiene and impersonation. The caller's Authorization, Impersonate-*, X-Remote-* and X-Forwarded-*
// headers never reach the API server as sent: they are removed, and the proxy sets the impersonation itself.
// A caller may ask to impersonate someone else only when the cluster the request is for says it may
// (decide-impersonation.ts); then the original user travels along as an extra, so audit logs show who really asked.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { UserInfo } from '../../lib/authn/types.ts';
import { endToEnd } from '../../lib/http2/hop-by-hop.ts';
import { headerValue } from '../../lib/kube/impersonation.ts';
import { authenticatedGroups } from '../../lib/kube/authenticated.ts';

/** Headers the caller may not pass through (matched on lower-case names). */
const STRIPPED_PREFIXES = ['impersonate-', 'x-remote-', 'x-forwarded-'];
/** A caller's Audit-ID is replaced by the request's own, so one ID joins Sealion's audit events to the cluster's. */
const STRIPPED_NAMES = new Set([
  'authorization',
  'proxy-authorization',
  'forwarded',
  'x-real-ip',
  'audit-id',
]);

export function isCallerOnlyHeader(name: string): boolean {
  if (STRIPPED_NAMES.has(name)) return true;
  for (const prefix of STRIPPED_PREFIXES) if (name.startsWith(prefix)) return true;
  return false;
}

/**
 * Percent-encodes an extra key into legal header-name characters, which Kubernetes decodes again after it lower-cases
 * the header's name: so upper-case letters are escaped too, or `example.com/A` would arrive as `example.com/a`.
 */
function encodeExtraKey(key: string): string {
  // An escape encodeURIComponent made stays as it is; a letter or a character it leaves is escaped.
  return encodeURIComponent(key).replace(/%[0-9A-F]{2}|[!'()*A-Z]/g, (c) =>
    c.length === 3 ? c : `%${c.charCodeAt(0).toString(16).toUpperCase()}`,
  );
}

/** The caller's headers minus everything it may not send, minus per-hop headers (lib/http2/hop-by-hop.ts). */
export function cleanHeaders(headers: IncomingHttpHeaders, keepImpersonation = false): OutgoingHttpHeaders {
  return endToEnd(headers, keepImpersonation ? callerOnlyButImpersonation : isCallerOnlyHeader);
}

const callerOnlyButImpersonation = (name: string): boolean =>
  isCallerOnlyHeader(name) && !name.startsWith('impersonate-');

/**
 * Built headers by user object. The authenticators hand out the same user object for every request with the
 * same credential (cached token answers, a connection's certificate), so the headers are built once per user
 * rather than once per request; they are frozen because they are shared.
 */
const builtHeaders = new WeakMap<UserInfo, Readonly<OutgoingHttpHeaders>>();

/**
 * Impersonate-User alone, for a service account or a node whose groups the API server derives from its name (the
 * only form its constrained service-account and node modes accept).
 */
export function usernameOnlyHeaders(username: string): Readonly<OutgoingHttpHeaders> {
  return { 'impersonate-user': headerValue(username) };
}

/**
 * Impersonate-* headers for a user, with system:authenticated among the groups unless it is the anonymous user or in
 * system:unauthenticated. Frozen: copy before changing.
 */
export function impersonationHeaders(user: UserInfo): Readonly<OutgoingHttpHeaders> {
  const known = builtHeaders.get(user);
  if (known) return known;
  const groups = authenticatedGroups(user);
  const headers: OutgoingHttpHeaders = {
    'impersonate-user': headerValue(user.username),
    'impersonate-group': Object.freeze(groups.map(headerValue)) as string[],
  };
  if (user.uid) headers['impersonate-uid'] = headerValue(user.uid);
  for (const [key, values] of Object.entries(user.extra)) {
    if (values.length > 0)
      headers[`impersonate-extra-${encodeExtraKey(key)}`] = Object.freeze(
        values.map(headerValue),
      ) as string[];
  }
  Object.freeze(headers);
  builtHeaders.set(user, headers);
  return headers;
}
