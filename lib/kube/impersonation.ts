// Impersonation as the API server reads it, for every process that forwards as someone (the concierge, the agent):
// the Impersonate-* headers read as it reads them, the constrained mode (KEP-5284) that carries an identity, and
// whether a cluster's forwarding policy lets the forwarding identity act in that mode on a request. Every question is
// asked of the cluster in question (`Ask`); this module only knows the rules.
import { isDNSLabel, isDNSSubdomain } from '../../apis/names.ts';
import type { UserInfo } from '../authn/types.ts';
import type { AccessQuestion, RequestAttributes } from './access-review.ts';
import type { Refusal } from './status.ts';

export const MASTERS = 'system:masters';
const NODE_PREFIX = 'system:node:';
const SERVICE_ACCOUNT_PREFIX = 'system:serviceaccount:';

/** Asks one SubjectAccessReview; rejects when no answer can be had (never read as a refusal). */
export type Ask = (question: AccessQuestion) => Promise<boolean>;

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

/** The node a username names (`system:node:<a DNS subdomain>`), or undefined. */
export function nodeOf(username: string): string | undefined {
  if (!username.startsWith(NODE_PREFIX)) return undefined;
  const name = username.slice(NODE_PREFIX.length);
  return isDNSSubdomain(name) ? name : undefined;
}

/** The namespace and name a service-account username names, or undefined. */
export function serviceAccountOf(username: string): { namespace: string; name: string } | undefined {
  if (!username.startsWith(SERVICE_ACCOUNT_PREFIX)) return undefined;
  const parts = username.slice(SERVICE_ACCOUNT_PREFIX.length).split(':');
  if (parts.length !== 2) return undefined;
  const [namespace, name] = parts as [string, string];
  return isDNSLabel(namespace) && isDNSSubdomain(name) ? { namespace, name } : undefined;
}

/** Why an extra may not be impersonated in a constrained mode, or undefined (validateExtra). */
export function extraProblem(extra: Record<string, string[]>): string | undefined {
  for (const [key, values] of Object.entries(extra)) {
    if (key === '') return 'impersonating the empty string key in extra is not allowed';
    const slash = key.indexOf('/');
    const host = slash === -1 ? '' : key.slice(0, slash);
    const path = slash === -1 ? '' : key.slice(slash + 1);
    if (!host || !path || !isDNSSubdomain(host) || !/^[A-Za-z0-9/\-._~%!$&'()*+,;=:]+$/.test(path))
      return `impersonating an invalid key in extra is not allowed: extra.key: Invalid value: ${JSON.stringify(key)}: must be a domain-prefixed path (such as "acme.io/foo")`;
    if (key !== key.toLowerCase())
      return `impersonating a non-lowercase key in extra is not allowed: ${JSON.stringify(key)}`;
    if (values.length === 0) return 'impersonating empty values in extra is not allowed';
    if (values.includes('')) return 'impersonating the empty string value in extra is not allowed';
  }
  return undefined;
}

/**
 * How an identity can be forwarded, which decides what the forwarding identity needs on the cluster: `user` in the
 * user-info mode, `serviceaccount` or `node` by username alone in their modes, or `legacy` for an identity no
 * constrained mode can express (system:masters or an empty group, an extra key that is not a lower-case,
 * domain-prefixed path, a service account with groups of its own, a node without its group), which only the legacy
 * `impersonate` verb can carry. Forwarding identities hold the constrained modes, so such an identity is refused
 * unless its cluster's admin granted the legacy verb.
 */
export type ForwardedAs = 'user' | 'serviceaccount' | 'node' | 'legacy';

export function forwardedAs(user: UserInfo, usernameOnly: boolean): ForwardedAs {
  if (nodeOf(user.username) !== undefined) return usernameOnly ? 'node' : 'legacy';
  if (serviceAccountOf(user.username)) return usernameOnly ? 'serviceaccount' : 'legacy';
  if (user.groups.includes(MASTERS) || user.groups.includes('')) return 'legacy';
  const extra = Object.keys(user.extra).length > 0 ? extraProblem(user.extra) : undefined;
  return extra === undefined ? 'user' : 'legacy';
}

/** The constrained mode an identity is forwarded in, and what the forwarding policy calls such identities. */
export const FORWARDED_AS: Record<ForwardedAs, { mode?: string; legacy: string; kind: string }> = {
  user: { mode: 'user-info', legacy: 'users', kind: 'users' },
  serviceaccount: { mode: 'serviceaccount', legacy: 'serviceaccounts', kind: 'service accounts' },
  node: { mode: 'arbitrary-node', legacy: 'users', kind: 'nodes' },
  legacy: {
    legacy: 'users',
    kind: 'this identity (only the legacy impersonate verb can carry it: system:masters or an empty group, an extra key that is not a lower-case domain-prefixed path, a service account with groups, or a node without its group)',
  },
};

/** A question about the forwarding identity alone (the subject of a self review is the sender). */
export const NOBODY = { user: '', groups: [], extra: {} };

/** What a request does, in words: `create pods/exec` or `get /version`. */
function doing(attributes: RequestAttributes): string {
  if (!attributes.resourceRequest) return `${attributes.verb} ${attributes.path}`;
  const { verb, group, resource, subresource } = attributes;
  return `${verb} ${resource}${subresource ? `/${subresource}` : ''}${group ? ` in API group ${group}` : ''}`;
}

/**
 * Whether the cluster lets the forwarding identity act for this kind of identity on this request: its forwarding
 * policy (the RBAC its admin gave the agent, or the hub's impersonator) is enforced by its API server anyway, and
 * asking first turns that refusal into one that says so, instead of naming the forwarding identity. Asked broadly
 * first (any namespace, any name), which a built-in policy always answers, so one answer serves many requests;
 * then for this object; then for the legacy verb, which clusters before Kubernetes 1.36 know only.
 */
export async function forwardingRefusal(
  target: { cluster: string; askSelf: Ask },
  attributes: RequestAttributes,
  as: ForwardedAs,
): Promise<Refusal | undefined> {
  const { mode, legacy, kind } = FORWARDED_AS[as];
  const verb = `impersonate-on:${mode ?? 'legacy'}:${attributes.verb}`;
  // Broad first (any namespace, any name), then this object.
  const broad: AccessQuestion = attributes.resourceRequest
    ? {
        ...NOBODY,
        verb,
        group: attributes.group,
        version: attributes.version,
        resource: attributes.resource,
        ...(attributes.subresource ? { subresource: attributes.subresource } : {}),
      }
    : { ...NOBODY, verb, path: attributes.path };
  const exact: AccessQuestion = attributes.resourceRequest
    ? {
        ...broad,
        ...(attributes.namespace ? { namespace: attributes.namespace } : {}),
        ...(attributes.name ? { name: attributes.name } : {}),
      }
    : broad;
  if (mode !== undefined) {
    if (await target.askSelf(broad)) return undefined;
    if ((exact.namespace !== undefined || exact.name !== undefined) && (await target.askSelf(exact)))
      return undefined;
  }
  if (await target.askSelf({ ...NOBODY, verb: 'impersonate', group: '', resource: legacy })) return undefined;
  const where = target.cluster ? `cluster ${target.cluster}'s` : "this cluster's";
  return {
    status: 403,
    message: `${where} policy for Sealion refuses this request: Sealion may not ${doing(attributes)} there for ${kind}; the cluster's admin chose what Sealion may do there`,
  };
}
