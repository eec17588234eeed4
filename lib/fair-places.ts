// Places that strangers hold without waiting (connections that have not signed in yet, logins under way), shared so
// that no one holder (a source address) can take them all. There is a bound for all holders together and one per
// holder, and a newcomer is not refused because the places are taken: a place is taken back instead, from the
// holder with the most (the newcomer itself when nobody holds more), and within that holder from its most expendable
// member, which the caller ranks (a connection that has said nothing before one that is signing in). So a holder
// keeps at least an even share of the bound however many places others ask for, and a flood from one address
// pushes out that address's own idle places first.
//
// Compare a fixed bound per holder, which a holder fills and then keeps everyone else at its address out for as long
// as its members live, and a bound for everyone, which one holder fills for all.

export interface FairPlacesOptions<T> {
  /** Places held at once by all holders together. */
  capacity: number;
  /** Places one holder may hold at once. */
  perHolder: number;
  /**
   * How expendable a member is: the lowest rank is taken back first; undefined: never taken back (the newcomer is
   * refused when only such members could make room).
   */
  rank(member: T): number | undefined;
  /** Takes a member's place back: the member must end, and release its place (`Place.release`). */
  evict(member: T): void;
}

export interface Place {
  /** Gives the place back; idempotent. */
  release(): void;
}

export interface FairPlaces<T> {
  /** A place for `member` of `holder`, making room if need be; undefined when no room can be made. */
  take(holder: string, member: T): Place | undefined;
  /** Places held now, by everyone or by one holder. */
  held(holder?: string): number;
}

export function newFairPlaces<T>(opts: FairPlacesOptions<T>): FairPlaces<T> {
  const holders = new Map<string, Set<T>>();
  let total = 0;

  const give = (holder: string, member: T): void => {
    const members = holders.get(holder);
    if (!members?.delete(member)) return;
    total--;
    if (members.size === 0) holders.delete(holder);
  };

  /** The member of `holder` to take back first, if any may be. */
  const victimOf = (holder: string): T | undefined => {
    let victim: T | undefined;
    let lowest = Infinity;
    for (const member of holders.get(holder) ?? []) {
      const rank = opts.rank(member);
      if (rank !== undefined && rank < lowest) [victim, lowest] = [member, rank];
    }
    return victim;
  };

  /** Who gives a place to a newcomer of `holder`: itself, another holder, or nobody (there is room). */
  const giver = (holder: string): string | undefined => {
    const own = holders.get(holder)?.size ?? 0;
    if (own >= opts.perHolder) return holder;
    if (total < opts.capacity) return undefined;
    // The holder with the most places, if it holds more than the newcomer's does; at parity the newcomer's own
    // holder gives, so that taking a place never makes the sharing less even. Scanned only when the pool is full.
    let most = holder;
    let size = own;
    for (const [other, members] of holders) if (members.size > size) [most, size] = [other, members.size];
    return most;
  };

  return {
    take(holder, member) {
      if (opts.capacity <= 0 || opts.perHolder <= 0) return undefined;
      const from = giver(holder);
      if (from !== undefined) {
        const victim = victimOf(from);
        if (victim === undefined) return undefined;
        opts.evict(victim);
        // An evict that did not give the place back would leave the pool over its bounds.
        give(from, victim);
      }
      let members = holders.get(holder);
      if (!members) holders.set(holder, (members = new Set()));
      members.add(member);
      total++;
      return { release: () => give(holder, member) };
    },
    held(holder) {
      return holder === undefined ? total : (holders.get(holder)?.size ?? 0);
    },
  };
}
