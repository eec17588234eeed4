// What is relayed under an access request's grant, by the request's name, so that when the grant ends (expiry,
// denial, withdrawal, deletion: AccessGrants.onEnded) every open exec, attach, port-forward, reach and SSH session and
// every watch that used it ends too, with a message, on the replica that relays it. The replica a request lands on
// decides it (decide.ts) and relays it, through its own tunnel or a peer's hop alike, so it is the one that holds the
// request here and ends it: the drain's means (context.end, session-close.ts), a message on the session, a watch at an
// event's boundary. A plain request that is not long-running is not held: it ends by itself.
import type { AccessGrants } from '../access/grants.ts';

/** Ends one relayed exchange with a message. */
export type EndExchange = (message: string) => void;

/** What a user reads on a session that ended with its grant. */
export function grantEndedMessage(name: string, why: string): string {
  return `sealion: access request ${name} ${why}; your access through it has ended`;
}

export interface GrantSessions {
  /**
   * Holds `end` under each of `grants` (names) until the returned function is called (idempotent); the first of them
   * to end calls it with the message.
   */
  add(grants: readonly string[], end: EndExchange): () => void;
  /** How many exchanges are held, all grants together (for tests and the log). */
  size(): number;
  /** Stops listening for grants' ends; what is held is let go. */
  close(): void;
}

export function newGrantSessions(grants: AccessGrants): GrantSessions {
  /** Each grant's name → the exchanges relayed under it; a name is here only while it holds one. */
  const byGrant = new Map<string, Set<EndExchange>>();
  let held = 0;
  const stop = grants.onEnded((name, why) => {
    const ending = byGrant.get(name);
    if (!ending) return;
    byGrant.delete(name);
    const message = grantEndedMessage(name, why);
    for (const end of ending) end(message);
  });
  return {
    add(names, end) {
      // An exchange's own function, so that one added twice is held (and let go) twice.
      const own: EndExchange = (message) => end(message);
      for (const name of names) {
        let set = byGrant.get(name);
        if (!set) byGrant.set(name, (set = new Set()));
        set.add(own);
      }
      held++;
      let done = false;
      return () => {
        if (done) return;
        done = true;
        held--;
        for (const name of names) {
          const set = byGrant.get(name);
          if (!set) continue;
          set.delete(own);
          if (set.size === 0) byGrant.delete(name);
        }
      };
    },
    size: () => held,
    close() {
      stop();
      byGrant.clear();
    },
  };
}
