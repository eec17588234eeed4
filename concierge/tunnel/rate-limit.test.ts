import { describe, expect, it } from '@jest/globals';
import { addressKey, newRateLimiter, type RateLimitOptions } from './rate-limit.ts';

const LIMITS: RateLimitOptions = {
  perAddressBurst: 3,
  perAddressPerSecond: 1,
  overallBurst: 5,
  overallPerSecond: 2,
  addresses: 100,
};

/** A limiter on a clock the test moves. */
function limiter(opts: RateLimitOptions = LIMITS) {
  let t = 1_000_000;
  const limit = newRateLimiter(opts, () => t);
  return { take: (address: string) => limit.take(address), advance: (ms: number) => void (t += ms) };
}

describe('the registration rate limit', () => {
  it('grants an address its burst, then refuses it with the seconds until its next turn', () => {
    const { take, advance } = limiter();
    expect([take('10.0.0.1'), take('10.0.0.1'), take('10.0.0.1')]).toEqual([undefined, undefined, undefined]);
    expect(take('10.0.0.1')).toBe(1);
    advance(1000);
    expect(take('10.0.0.1')).toBeUndefined();
    expect(take('10.0.0.1')).toBe(1);
  });

  it('bounds all addresses together, and an address refused for its own excess takes nothing from the others', () => {
    const { take, advance } = limiter();
    for (let i = 0; i < 3; i++) expect(take('10.0.0.1')).toBeUndefined();
    // Over its own limit: refused without using the shared bucket.
    for (let i = 0; i < 10; i++) expect(take('10.0.0.1')).toBe(1);
    expect([take('10.0.0.2'), take('10.0.0.3')]).toEqual([undefined, undefined]);
    // The shared bucket (5) is empty: a fresh address waits for it.
    expect(take('10.0.0.4')).toBe(1);
    advance(500);
    expect(take('10.0.0.4')).toBeUndefined();
  });

  it('says how long the shared bucket needs when it is the one that is empty', () => {
    const { take } = limiter({ ...LIMITS, overallBurst: 1, overallPerSecond: 0.25 });
    expect(take('10.0.0.1')).toBeUndefined();
    expect(take('10.0.0.2')).toBe(4);
  });

  it('remembers a bounded number of addresses', () => {
    const { take } = limiter({ ...LIMITS, overallBurst: 1_000, addresses: 2 });
    for (let i = 0; i < 3; i++) take('10.0.0.1');
    expect(take('10.0.0.1')).toBe(1);
    take('10.0.0.2');
    take('10.0.0.3');
    // Forgotten, so its bucket is full again; the shared bucket still bounds what that buys.
    expect(take('10.0.0.1')).toBeUndefined();
  });

  it.each([
    ['an IPv4 address', '192.0.2.7', '192.0.2.7'],
    ['an IPv4-mapped IPv6 address, as its IPv4 address', '::ffff:192.0.2.7', '192.0.2.7'],
    ['an IPv6 address, by its /64', '2001:db8:1:2:aaaa:bbbb:cccc:dddd', '2001:db8:1:2::/64'],
    ['another address of that /64, alike', '2001:db8:1:2::1', '2001:db8:1:2::/64'],
    ['a spelling with leading zeros and upper case, alike', '2001:0DB8:0001:0002::ffff', '2001:db8:1:2::/64'],
    ['a /64 written short', '2001:db8::1', '2001:db8:0:0::/64'],
    ['loopback', '::1', '0:0:0:0::/64'],
    ['with a zone', 'fe80::1%eth0', 'fe80:0:0:0::/64'],
    ['with an IPv4 tail', '64:ff9b::192.0.2.7', '64:ff9b:0:0::/64'],
  ])('keys %s', (_what, address, key) => {
    expect(addressKey(address)).toBe(key);
  });

  it('counts every address of one IPv6 /64 as one', () => {
    const { take } = limiter();
    for (let i = 0; i < 3; i++) expect(take(`2001:db8:1:2::${i + 1}`)).toBeUndefined();
    expect(take('2001:db8:1:2:ffff::9')).toBe(1);
    expect(take('2001:db8:1:3::1')).toBeUndefined();
  });
});
