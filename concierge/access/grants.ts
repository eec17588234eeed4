// What the pipeline asks of the access requests (concierge/access): the grants a user holds on a cluster now, whether
// that cluster requires a reason, and word of a grant's end, so the sessions that used it end with it.

/** One approved, unexpired AccessRequest, as it applies to one cluster. */
export interface Grant {
  /** The AccessRequest's name: the value of the `sealion.dev/access-request` extra. */
  name: string;
  /** The groups it adds to the requester's requests to that cluster. */
  groups: readonly string[];
  /** Its reason, if it has one. */
  reason?: string;
  /** When it ends, in ms since the epoch. */
  expiresAt: number;
}

export interface AccessGrants {
  /**
   * The grants `username` holds on `cluster` ('' for the hub) now, the newest (last approved) first: the first with a
   * reason gives a request without one of its own its reason. Empty for most users.
   */
  active(username: string, cluster: string): readonly Grant[];
  /** Whether every request to `cluster` ('' for the hub) must carry a reason (its access policy's requireReason). */
  reasonRequired(cluster: string): boolean;
  /**
   * Calls `ended` once for each grant that ends (expiry, denial, withdrawal, deletion), within a second of it;
   * `why` is one line a user reads. The returned function stops the calls.
   */
  onEnded(ended: (name: string, why: string) => void): () => void;
}

/** No access requests: nobody holds a grant, no cluster requires a reason. */
export const NO_GRANTS: AccessGrants = {
  active: () => [],
  reasonRequired: () => false,
  onEnded: () => () => {},
};
