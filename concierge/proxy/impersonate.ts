// Header hygiene and impersonation. The caller's Authorization, Impersonate-*, X-Remote-* and X-Forwarded-*
// headers never reach the API server as sent: they are removed, and the proxy sets the impersonation itself.
// A caller may ask to impersonate someone else only when the cluster the request is for says it may
// (decide-impersonation.ts); then the original user travels along as an extra, so audit logs show who really asked.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { UserInfo } from '../../lib/authn/types.ts';
import { endToEnd } from '../../lib/http2/hop-by-hop.ts';

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
export const AUTHENTICATED_GROUP = 'system:authenticated';

export function isCallerOnlyHeader(name: string): boolean {
  if (STRIPPED_NAMES.has(name)) return true;
  for (const prefix of STRIPPED_PREFIXES) if (name.startsWith(prefix)) return true;
  return false;
}

/** What the caller asked to impersonate, read from the raw headers so repeated headers stay separate values. */
export interface RequestedImpersonation {
  user?: string;
  uid?: string;
  groups: string[];
  extra: Record<string, string[]>;
}

/**
 * Node hands header values over as Latin-1: one character per byte. Clients (client-go, kubectl) send names as
 * UTF-8 bytes, and the API server reads them so, so a name is UTF-8 bytes on the wire in both directions. Writing a
 * JavaScript string as a header instead would keep only the low byte of each character: `ų` (U+0173) would reach
 * the API server as `s`, and an identity provider's group `ųystem:masters` as `system:masters`.
 */
const isASCII = (text: string): boolean => Buffer.byteLength(text, 'utf8') === text.length;

/** A name as header bytes: its UTF-8 encoding, one Latin-1 character per byte. */
export function headerValue(name: string): string {
  return isASCII(name) ? name : Buffer.from(name, 'utf8').toString('latin1');
}

/** A name from header bytes (UTF-8), or undefined when the bytes are not UTF-8. */
export function nameFromHeader(value: string): string | undefined {
  if (isASCII(value)) return value;
  const bytes = Buffer.from(value, 'latin1');
  const name = bytes.toString('utf8');
  return Buffer.from(name, 'utf8').equals(bytes) ? name : undefined;
}

/** A caller's impersonation headers that cannot be read; answered 400. */
export class MalformedImpersonationError extends Error {
  readonly code = 'SEALION_MALFORMED_IMPERSONATION';
}

/**
 * Reads the caller's Impersonate-* headers as the API server does: the first Impersonate-User and Impersonate-Uid,
 * every Impersonate-Group, and every Impersonate-Extra-<key> (the key lower-cased, then percent-decoded where that
 * works). Undefined when the caller impersonates nobody (no user, nor anything else); a user left out while
 * anything else is asked for is the decision's to refuse. Throws MalformedImpersonationError for values that are
 * not UTF-8.
 */
export function requestedImpersonation(rawHeaders: readonly string[]): RequestedImpersonation | undefined {
  let found = false;
  const requested: RequestedImpersonation = { groups: [], extra: {} };
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (!name.startsWith('impersonate-')) continue;
    const value = nameFromHeader(rawHeaders[i + 1]!);
    if (value === undefined) throw new MalformedImpersonationError(`${name} is not UTF-8`);
    if (name === 'impersonate-user') {
      requested.user ??= value;
      found ||= value !== '';
    } else if (name === 'impersonate-uid') {
      requested.uid ??= value;
      found ||= value !== '';
    } else if (name === 'impersonate-group') {
      requested.groups.push(value);
      found = true;
    } else if (name.startsWith('impersonate-extra-')) {
      const encoded = name.slice('impersonate-extra-'.length);
      let key = encoded;
      try {
        key = decodeURIComponent(encoded);
      } catch {
        // Kept as sent, as the API server keeps a key it cannot decode.
      }
      (requested.extra[key] ??= []).push(value);
      found = true;
    }
  }
  if (requested.user === '') delete requested.user;
  if (requested.uid === '') delete requested.uid;
  return found ? requested : undefined;
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
 * A user's groups as the API server completes an authenticated identity: everybody is in system:authenticated but
 * the anonymous user and those in system:unauthenticated. A new array.
 */
export function authenticatedGroups(user: { username: string; groups: readonly string[] }): string[] {
  const unauthenticated =
    user.username === 'system:anonymous' || user.groups.includes('system:unauthenticated');
  return user.groups.includes(AUTHENTICATED_GROUP) || unauthenticated
    ? [...user.groups]
    : [...user.groups, AUTHENTICATED_GROUP];
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
