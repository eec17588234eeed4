// The size of a request's header block as Node's HTTP/2 (nghttp2) reckons it before sending, and the bound every
// client session Sealion opens sends within.
//
// nghttp2 refuses to send a HEADERS frame whose block it estimates over the session's maxSendHeaderBlockLength, and
// Node answers that refusal by closing the whole session a turn later (GOAWAY): a pooled connection to the API
// server, a tunnel to an agent, a peer link, each shared by every user. The block comes largely from the user: the
// request's own fields (up to the proxy's 32 KiB list) and the identity's Impersonate-* fields, one per group and
// extra value (up to 32 KiB of names, lib/authn/identity.ts, a field each). So a signed-in user with a few thousand
// one-letter groups, or one request with thousands of short fields, would close a cluster's tunnel for everyone.
// Such a request is refused with 431 before any stream opens: the API server's pool and the tunnels (a peer link is
// one) check every block before they send it (headersTooLarge), so no session ever meets the limit. An answer relayed
// back (forward.ts) is checked the same way, and a forwarded upgrade's HTTP/1.1 head against what the agent's and the
// peer port's servers read (upgradeHeadTooLarge).
import type { OutgoingHttpHeaders } from 'node:http2';

/**
 * The most one request's header block may come to, by blockBound: nghttp2's default send limit, which every client
 * session here keeps (the API server's pool, the tunnels, the peer links). A request from kubectl is a few hundred
 * bytes; a user in a thousand groups of 40 characters comes near it.
 */
export const MAX_SEND_HEADER_BLOCK_BYTES = 64 * 1024;

/**
 * What nghttp2 adds to the block's bound for each field (the worst case of a literal field's two length prefixes).
 * Measured: with Node 24, the block of 2,180 one-byte Impersonate-Group fields (beside the pseudo-headers) was sent
 * and that of 2,181 refused; with 40-byte values, 948 and 949.
 */
const PER_FIELD_BYTES = 12;
/** Once per block: nghttp2's own few bytes, and the :scheme and :authority fields Node adds to a request itself. */
const PER_BLOCK_BYTES = 512;

/**
 * What an HTTP/2 server that is sent forwarded requests (the agent's end of a tunnel, a replica's end of a peer link)
 * takes in one header block: all that a sender here may send. Node's defaults refuse a request of more than 128
 * fields (ENHANCE_YOUR_CALM), so a user in more than about 120 groups was served on the hub and refused through
 * every tunnel; the list size counts 32 bytes a field where the block's bound counts 12.
 */
export const FORWARDED_HEADER_LIMITS = {
  maxHeaderListPairs: Math.ceil(MAX_SEND_HEADER_BLOCK_BYTES / PER_FIELD_BYTES),
  maxHeaderListSize: 4 * MAX_SEND_HEADER_BLOCK_BYTES,
} as const;

/**
 * The same for an HTTP/1.1 server that is sent forwarded upgrades (exec, attach, port-forward: the agent's local
 * proxy, a replica's peer port): a client's 32 KiB of fields and the identity's. Node's defaults (16 KiB, and 2,000
 * fields, past which it drops the rest unread) refused the exec of a user in a few hundred groups through a tunnel,
 * which the hub's API server served.
 */
export const FORWARDED_HTTP1_LIMITS = {
  maxHeaderSize: FORWARDED_HEADER_LIMITS.maxHeaderListSize,
  /** No count: the size bounds it, and a count drops fields rather than refusing the request. */
  maxHeadersCount: 0,
} as const;

/**
 * What `headers`' fields come to with `perField` bytes each besides name and value, values counted as UTF-8 when
 * `exact`, else as three bytes a UTF-16 unit (never less than UTF-8; no Buffer call per field on the request path).
 */
function fieldBytes(headers: OutgoingHttpHeaders, perField: number, exact: boolean): number {
  let bytes = 0;
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined) continue;
    if (!Array.isArray(value)) {
      const v = String(value);
      bytes += name.length + perField + (exact ? Buffer.byteLength(v) : 3 * v.length);
      continue;
    }
    for (const item of value)
      bytes += name.length + perField + (exact ? Buffer.byteLength(item) : 3 * item.length);
  }
  return bytes;
}

/**
 * Whether `fixed` bytes and `headers`' fields at `perField` each come to more than `limit`: at once when even the
 * over-count fits (every request kubectl sends), else counted exactly.
 */
function over(
  headers: OutgoingHttpHeaders,
  fixed: number,
  perField: number,
  limit: number,
): number | undefined {
  if (fixed + fieldBytes(headers, perField, false) <= limit) return undefined;
  const bytes = fixed + fieldBytes(headers, perField, true);
  return bytes > limit ? bytes : undefined;
}

/** The bound nghttp2 puts on `headers`' encoded block, over-estimated slightly (values counted as UTF-8). */
export function blockBound(headers: OutgoingHttpHeaders): number {
  return PER_BLOCK_BYTES + fieldBytes(headers, PER_FIELD_BYTES, true);
}

/** An answer's head that the proxy could not send on (an upstream that is no API server): cut with 502. */
export const answerHeadTooLarge = (headers: OutgoingHttpHeaders): boolean =>
  over(headers, PER_BLOCK_BYTES, PER_FIELD_BYTES, MAX_SEND_HEADER_BLOCK_BYTES) !== undefined;

/** A request whose header block would be over MAX_SEND_HEADER_BLOCK_BYTES: answered 431, never sent. */
export class HeadersTooLarge extends Error {
  readonly code = 'SEALION_HEADERS_TOO_LARGE';
  readonly status = 431;
}

/** The refusal of `headers` when their block would be too large to send, or undefined. */
export function headersTooLarge(headers: OutgoingHttpHeaders): HeadersTooLarge | undefined {
  const bytes = over(headers, PER_BLOCK_BYTES, PER_FIELD_BYTES, MAX_SEND_HEADER_BLOCK_BYTES);
  if (bytes === undefined) return undefined;
  return new HeadersTooLarge(
    `the request's header fields, with the user's identity as Impersonate-* fields (one per group and extra value), ` +
      `come to ${bytes} bytes as HTTP/2 sends them, over ${MAX_SEND_HEADER_BLOCK_BYTES}: send fewer fields`,
  );
}

/**
 * The refusal of a forwarded upgrade whose HTTP/1.1 head (`method`, `path`, `headers`) would be over what the agent's
 * and the peer port's servers read (FORWARDED_HTTP1_LIMITS), or undefined. Counted as written: each field's name, its
 * value, ": " and CRLF; the request line; and room for what Node adds (Host, and the framing fields).
 */
export function upgradeHeadTooLarge(
  method: string,
  path: string,
  headers: OutgoingHttpHeaders,
): HeadersTooLarge | undefined {
  // Each field as written: its name, ": ", its value and CRLF.
  const fixed = Buffer.byteLength(method) + Buffer.byteLength(path) + PER_BLOCK_BYTES;
  const bytes = over(headers, fixed, 4, FORWARDED_HTTP1_LIMITS.maxHeaderSize);
  if (bytes === undefined) return undefined;
  return new HeadersTooLarge(
    `the upgrade's head, with the user's identity as Impersonate-* fields (one per group and extra value), comes ` +
      `to ${bytes} bytes, over ${FORWARDED_HTTP1_LIMITS.maxHeaderSize}: send fewer fields`,
  );
}
