// The header fields that belong to one connection and never cross a hop, in both directions, at every hop Sealion
// relays: the concierge to its API server, into a tunnel and to a peer replica; the agent to its API server; and
// every answer on its way back. One list, so that no hop lets through what another drops.
import type { IncomingHttpHeaders, OutgoingHttpHeaders } from 'node:http';

/**
 * The connection's own fields (RFC 9110 section 7.6.1, and Proxy-Connection, which clients still send), the
 * credential a client gives the proxy it talks to (Proxy-Authorization, RFC 9110 section 11.7.2), the fields
 * HTTP/2 forbids (RFC 9113 section 8.2.2: HTTP2-Settings too), and those each hop sets for itself: Host (the
 * authority of the next connection) and Expect (answered by the hop's own server). Trailer announces trailers,
 * which no hop relays. An upgrade adds Connection and Upgrade back for the next hop itself.
 */
const HOP_BY_HOP: ReadonlySet<string> = new Set([
  'connection',
  'proxy-connection',
  'proxy-authorization',
  'keep-alive',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'http2-settings',
  'host',
  'expect',
]);

/**
 * The options of every HTTP/2 session of a hop: header fields read as the API server (Go) reads them, a value with
 * leading or trailing whitespace kept as sent. Node's default, RFC 9113's strict check, drops such a field without a
 * word: an `Impersonate-Uid: x ` would vanish at the proxy and the request be served as its caller where the API
 * server answers 400, and a field the hub decided on would vanish inside a tunnel.
 */
export const FIELDS_AS_SENT = { strictFieldWhitespaceValidation: false } as const;

/** The field names a Connection field lists (lower-cased): per hop as well (RFC 9110 section 7.6.1). */
function connectionOptions(value: string | string[] | number | undefined): ReadonlySet<string> | undefined {
  if (value === undefined) return undefined;
  const names = new Set<string>();
  for (const part of Array.isArray(value) ? value : [String(value)])
    for (const token of part.split(',')) {
      const name = token.trim().toLowerCase();
      if (name) names.add(name);
    }
  return names.size > 0 ? names : undefined;
}

/**
 * A test for the names that do not cross a hop: pseudo-headers, HOP_BY_HOP, the fields `headers`' Connection field
 * names, and those `also` says. Names must be lower-case, as Node gives them.
 */
export function hopByHop(
  headers: IncomingHttpHeaders | OutgoingHttpHeaders,
  also?: (name: string) => boolean,
): (name: string) => boolean {
  const named = connectionOptions(headers['connection']);
  return (name) => dropped(name, named, also);
}

const dropped = (
  name: string,
  named: ReadonlySet<string> | undefined,
  also: ((name: string) => boolean) | undefined,
): boolean =>
  name.charCodeAt(0) === 58 /* ':' */ ||
  HOP_BY_HOP.has(name) ||
  (named?.has(name) ?? false) ||
  (also?.(name) ?? false);

/** `headers` without what does not cross a hop (see hopByHop). Every request runs it: no closure per call. */
export function endToEnd(
  headers: IncomingHttpHeaders | OutgoingHttpHeaders,
  also?: (name: string) => boolean,
): OutgoingHttpHeaders {
  const named = connectionOptions(headers['connection']);
  // No prototype: a field named __proto__ is kept as one, not made the object's prototype.
  const out = Object.create(null) as OutgoingHttpHeaders;
  // Object.keys rather than Object.entries (an array per header) or for-in (which walks Node's prototype-less header
  // objects slower: about 0.8 µs a call, against 0.6).
  const names = Object.keys(headers);
  for (let i = 0; i < names.length; i++) {
    const name = names[i]!;
    const value = headers[name];
    if (value !== undefined && !dropped(name, named, also)) out[name] = value;
  }
  return out;
}
