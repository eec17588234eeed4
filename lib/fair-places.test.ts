import { describe, expect, it } from '@jest/globals';
import fc from 'fast-check';
import { newFairPlaces, type Place } from './fair-places.ts';

interface Member {
  holder: string;
  rank: number | undefined;
  place?: Place | undefined;
  evicted: boolean;
}

function pool(capacity: number, perHolder: number) {
  const evicted: Member[] = [];
  const places = newFairPlaces<Member>({
    capacity,
    perHolder,
    rank: (m) => m.rank,
    evict: (m) => {
      m.evicted = true;
      evicted.push(m);
      m.place?.release();
    },
  });
  let next = 0;
  /** A member of `holder` with `rank`; `kept`: never taken back. */
  const take = (holder: string, rank: number | 'kept' = next++): Member => {
    const m: Member = { holder, rank: rank === 'kept' ? undefined : rank, evicted: false };
    m.place = places.take(holder, m);
    return m;
  };
  return { places, take, evicted };
}

describe('fair places', () => {
  it('gives a holder at its own bound room by taking back its own most expendable member', () => {
    const { take, evicted, places } = pool(10, 2);
    const a = take('a', 5);
    const b = take('a', 1);
    const c = take('a', 9);
    expect(c.place).toBeDefined();
    expect(evicted).toEqual([b]);
    expect(places.held('a')).toBe(2);
    expect(a.evicted).toBe(false);
  });

  it('takes from the holder with the most when everything is taken, and at parity from the newcomer itself', () => {
    const { take, evicted, places } = pool(3, 3);
    const [a1, a2] = [take('a'), take('a')];
    const b1 = take('b');
    take('b');
    // a held 2 of 3, b 1: a gave.
    expect(evicted).toEqual([a1]);
    take('b');
    // a and b held 1 and 2 when b asked: b gave its own.
    expect(evicted).toEqual([a1, b1]);
    expect(places.held('a')).toBe(1);
    expect(a2.evicted).toBe(false);
  });

  it('refuses when only members that may not be taken back could make room', () => {
    const { take, places } = pool(2, 2);
    take('a', 'kept');
    take('a', 'kept');
    expect(take('b').place).toBeUndefined();
    expect(take('a').place).toBeUndefined();
    expect(places.held()).toBe(2);
  });

  it('releases once, however often a place is given back', () => {
    const { take, places } = pool(2, 2);
    const a = take('a');
    a.place!.release();
    a.place!.release();
    expect(places.held()).toBe(0);
    take('a');
    take('a');
    expect(places.held('a')).toBe(2);
  });

  it('never exceeds its bounds, and always leaves a newcomer at least an even share', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 12 }),
        fc.integer({ min: 1, max: 6 }),
        fc.array(fc.tuple(fc.constantFrom('a', 'b', 'c', 'd'), fc.boolean()), { maxLength: 80 }),
        (capacity, perHolder, steps) => {
          const { take, places } = pool(capacity, perHolder);
          const held: Member[] = [];
          for (const [holder, leave] of steps) {
            if (leave && held.length > 0) {
              held.shift()!.place?.release();
              continue;
            }
            const before = places.held(holder);
            const total = places.held();
            const othersMost = Math.max(
              ...['a', 'b', 'c', 'd'].filter((h) => h !== holder).map((h) => places.held(h)),
            );
            const m = take(holder);
            if (m.place) held.push(m);
            // Every member is expendable here, so a newcomer is never refused.
            expect(m.place).toBeDefined();
            // It gains a place unless it is at its own bound, or the pool is full and nobody holds more than it.
            const gains = before < perHolder && (total < capacity || othersMost > before);
            expect(places.held(holder)).toBe(gains ? before + 1 : before);
            for (const h of ['a', 'b', 'c', 'd']) expect(places.held(h)).toBeLessThanOrEqual(perHolder);
            expect(places.held()).toBeLessThanOrEqual(capacity);
            for (let i = held.length - 1; i >= 0; i--) if (held[i]!.evicted) held.splice(i, 1);
          }
        },
      ),
    );
  });
});
