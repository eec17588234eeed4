// Token buckets for what anyone may ask of the tunnel listener before they hold a certificate (registration): one
// bucket per source address, so that one stranger cannot take every turn, and one for all addresses, so that many
// strangers together cannot either. A request takes a token from both or from neither, so an address refused for its
// own excess leaves the shared bucket untouched for everyone else.
import ipaddr from 'ipaddr.js';
import { LRUCache } from 'lru-cache';
import { TokenBucket } from '../../lib/token-bucket.ts';

export interface RateLimitOptions {
  /** Requests one address may make at once after a quiet spell (its bucket's size). */
  perAddressBurst: number;
  /** Requests per second one address is given back, up to its burst. */
  perAddressPerSecond: number;
  /** Requests all addresses together may make at once after a quiet spell. */
  overallBurst: number;
  /** Requests per second all addresses together are given back. */
  overallPerSecond: number;
  /**
   * Addresses whose buckets are remembered; the least recently seen are forgotten beyond this, so memory stays
   * bounded whatever addresses strangers come from. A forgotten address starts with a full bucket again, which the
   * shared bucket still bounds.
   */
  addresses: number;
}

/**
 * Registration is rare: each agent registers once, and again only when an admin hands it a new token. An address
 * gets ten at once and one a second after (a script onboarding clusters through one NAT address is served at that
 * pace, its agents retrying on their backoff); all addresses together, two hundred at once and fifty a second, far
 * above what onboarding needs and far below what the listener can answer.
 */
export const DEFAULT_REGISTRATION_LIMITS: RateLimitOptions = {
  perAddressBurst: 10,
  perAddressPerSecond: 1,
  overallBurst: 200,
  overallPerSecond: 50,
  addresses: 10_000,
};

export interface RateLimiter {
  /** Takes a turn for `address`: undefined when granted, else how many whole seconds to wait before asking again. */
  take(address: string): number | undefined;
}

/**
 * The bucket key of an address: an IPv4 address as it is (also when it arrives IPv4-mapped, ::ffff:a.b.c.d), an IPv6
 * address by its /64, the smallest block a site is given, since one host can use any address in it. ipaddr.js reads
 * every spelling of an address (zeros left out, upper case, an IPv4 tail) as one; a zone (%eth0) names the interface,
 * not the address.
 */
export function addressKey(address: string): string {
  let parsed: ipaddr.IPv4 | ipaddr.IPv6;
  try {
    parsed = ipaddr.process(address.split('%')[0]!);
  } catch {
    return address;
  }
  if (parsed.kind() === 'ipv4') return parsed.toString();
  const groups = (parsed as ipaddr.IPv6).parts.slice(0, 4).map((part) => part.toString(16));
  return `${groups.join(':')}::/64`;
}

export function newRateLimiter(opts: RateLimitOptions, now: () => number = Date.now): RateLimiter {
  const perAddress = new LRUCache<string, TokenBucket>({ max: opts.addresses });
  const overall = new TokenBucket(opts.overallBurst, opts.overallPerSecond, now);
  /** Whole seconds until `bucket` holds a token, at least 1: what Retry-After says. */
  const wait = (bucket: TokenBucket): number => Math.max(1, Math.ceil(bucket.waitMs() / 1000));
  return {
    take(address) {
      const key = addressKey(address);
      const own = perAddress.get(key) ?? new TokenBucket(opts.perAddressBurst, opts.perAddressPerSecond, now);
      perAddress.set(key, own);
      if (own.available() < 1) return wait(own);
      if (overall.available() < 1) return wait(overall);
      own.take();
      overall.take();
      return undefined;
    },
  };
}
