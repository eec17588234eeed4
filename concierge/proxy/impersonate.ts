// Header hygiene and impersonation. The caller's Authorization, Impersonate-*, X-Remote-* and X-Forwarded-*
// headers never reach the API server as sent: they are removed, and the proxy sets the impersonation itself.
// A caller may ask to impersonate someone else only when a SubjectAccessReview says it may; then the original
// user travels along as an extra, so audit logs show who really asked.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { AccessQuestion, Reviewer } from '../../lib/kube.ts';

/** Headers the caller may not pass through (matched on lower-case names). */
const STRIPPED_PREFIXES = ['impersonate-', 'x-remote-', 'x-forwarded-'];
const STRIPPED_NAMES = new Set(['authorization', 'proxy-authorization', 'forwarded', 'x-real-ip']);
/**
 * HTTP/1 connection headers and HTTP/2 pseudo-headers are per hop; the upstream connection sets its own. So is
 * the authority (Host), and Expect is answered by the proxy's own server.
 */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  // Added back, with Connection, for the upgrades it asks for; on any other request it means nothing upstream.
  'upgrade',
  'http2-settings',
  'host',
  'expect',
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
function nameFromHeader(value: string): string | undefined {
  if (isASCII(value)) return value;
  const bytes = Buffer.from(value, 'latin1');
  const name = bytes.toString('utf8');
  return Buffer.from(name, 'utf8').equals(bytes) ? name : undefined;
}

/** A caller's impersonation headers that cannot be read; answered 400. */
export class MalformedImpersonationError extends Error {
  readonly code = 'SEALION_MALFORMED_IMPERSONATION';
}

/** Reads the caller's Impersonate-* headers; throws MalformedImpersonationError for ones that cannot be read. */
export function requestedImpersonation(rawHeaders: readonly string[]): RequestedImpersonation | undefined {
  let found = false;
  const requested: RequestedImpersonation = { groups: [], extra: {} };
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (!name.startsWith('impersonate-')) continue;
    found = true;
    const value = nameFromHeader(rawHeaders[i + 1]!);
    if (value === undefined) throw new MalformedImpersonationError(`${name} is not UTF-8`);
    if (name === 'impersonate-user') requested.user = value;
    else if (name === 'impersonate-uid') requested.uid = value;
    else if (name === 'impersonate-group') requested.groups.push(value);
    else if (name.startsWith('impersonate-extra-')) {
      let key: string;
      try {
        key = decodeURIComponent(name.slice('impersonate-extra-'.length));
      } catch {
        throw new MalformedImpersonationError(`${name}: the extra key is not valid percent-encoding`);
      }
      if (key === '') throw new MalformedImpersonationError('Impersonate-Extra- names no key');
      (requested.extra[key] ??= []).push(value);
    }
  }
  return found ? requested : undefined;
}

/** Percent-encodes an extra key into legal header-name characters (Kubernetes decodes it again). */
function encodeExtraKey(key: string): string {
  return encodeURIComponent(key).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/** The caller's headers minus everything it may not send, minus per-hop headers. */
export function cleanHeaders(headers: IncomingHttpHeaders, keepImpersonation = false): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  // for-in rather than Object.entries: no array per header on every request.
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined || name.charCodeAt(0) === 58 /* ':' */ || HOP_BY_HOP.has(name)) continue;
    if (isCallerOnlyHeader(name) && !(keepImpersonation && name.startsWith('impersonate-'))) continue;
    out[name] = value;
  }
  return out;
}

/**
 * Built headers by user object. The authenticators hand out the same user object for every request with the
 * same credential (cached token answers, a connection's certificate), so the headers are built once per user
 * rather than once per request; they are frozen because they are shared.
 */
const builtHeaders = new WeakMap<UserInfo, Readonly<OutgoingHttpHeaders>>();

/** Impersonate-* headers for a user, with system:authenticated among the groups. Frozen: copy before changing. */
export function impersonationHeaders(user: UserInfo): Readonly<OutgoingHttpHeaders> {
  const known = builtHeaders.get(user);
  if (known) return known;
  const groups = user.groups.includes(AUTHENTICATED_GROUP)
    ? [...user.groups]
    : [...user.groups, AUTHENTICATED_GROUP];
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

export type ImpersonationDecision =
  { allowed: true; user: UserInfo } | { allowed: false; status: number; message: string };

function questionFor(
  caller: UserInfo,
  verb: string,
  group: string,
  resource: string,
  name: string,
  namespace?: string,
): AccessQuestion {
  return {
    user: caller.username,
    groups: caller.groups.includes(AUTHENTICATED_GROUP)
      ? caller.groups
      : [...caller.groups, AUTHENTICATED_GROUP],
    extra: caller.extra,
    ...(caller.uid ? { uid: caller.uid } : {}),
    verb,
    group,
    resource,
    name,
    ...(namespace ? { namespace } : {}),
  };
}

/**
 * Decides a caller's own impersonation request as the API server would: every user, group, extra and uid it
 * names must be allowed by RBAC for the caller. Allowed: the impersonated user, with the caller recorded in the
 * extra `originalUserExtraKey`.
 */
export async function decideImpersonation(
  caller: UserInfo,
  requested: RequestedImpersonation,
  reviewer: Reviewer,
  originalUserExtraKey: string,
): Promise<ImpersonationDecision> {
  if (!requested.user) {
    return {
      allowed: false,
      status: 400,
      message: 'Impersonate-User is required when impersonating groups, extras or a uid',
    };
  }
  const sa = /^system:serviceaccount:([^:]+):([^:]+)$/.exec(requested.user);
  const checks: [AccessQuestion, string][] = [
    [
      sa
        ? questionFor(caller, 'impersonate', '', 'serviceaccounts', sa[2]!, sa[1])
        : questionFor(caller, 'impersonate', '', 'users', requested.user),
      sa ? `serviceaccounts "${sa[2]}"` : `users "${requested.user}"`,
    ],
    ...requested.groups.map((g): [AccessQuestion, string] => [
      questionFor(caller, 'impersonate', '', 'groups', g),
      `groups "${g}"`,
    ]),
    ...Object.entries(requested.extra).flatMap(([key, values]) =>
      values.map((v): [AccessQuestion, string] => [
        questionFor(caller, 'impersonate', 'authentication.k8s.io', `userextras/${key}`, v),
        `userextras/${key} "${v}"`,
      ]),
    ),
    ...(requested.uid
      ? [
          [
            questionFor(caller, 'impersonate', 'authentication.k8s.io', 'uids', requested.uid),
            `uids "${requested.uid}"`,
          ] as [AccessQuestion, string],
        ]
      : []),
  ];
  const answers = await Promise.all(checks.map(([q]) => reviewer.allowed(q)));
  const denied = answers.findIndex((a) => !a);
  if (denied !== -1) {
    const [q, what] = checks[denied]!;
    return {
      allowed: false,
      status: 403,
      message: `${what} is forbidden: User "${caller.username}" cannot impersonate resource "${q.resource}" in API group "${q.group}"${q.namespace ? ` in the namespace "${q.namespace}"` : ' at the cluster scope'}`,
    };
  }
  const original = JSON.stringify({
    username: caller.username,
    ...(caller.uid ? { uid: caller.uid } : {}),
    groups: caller.groups,
    extra: caller.extra,
  });
  return {
    allowed: true,
    user: {
      username: requested.user,
      ...(requested.uid ? { uid: requested.uid } : {}),
      groups: requested.groups,
      extra: { ...requested.extra, [originalUserExtraKey]: [original] },
    },
  };
}
