// What every fuzz family is, and what one lane of cases hands it: the contract between run.ts and the families.
import type fc from 'fast-check';
import type { FuzzTarget } from './target.ts';
import type { H2Client } from './wire.ts';

/** What one lane of one family holds while it runs its cases one after another. */
export interface LaneContext {
  target: FuzzTarget;
  lane: number;
  deadlineMs: number;
  /** HTTP/2 sessions: without a client certificate, and with the fuzz user's. */
  h2: H2Client;
  h2Cert: H2Client;
  /** State a family keeps per lane (the tunnel family's fake agent). */
  state: Record<string, unknown>;
  /** Counts one of the lane's answers by kind (answerKind), or something else the family tallies. */
  count(what: string): void;
}

export interface Family<T> {
  name: string;
  /** Share of the cases. */
  weight: number;
  arbitrary: fc.Arbitrary<T>;
  run(input: T, ctx: LaneContext): Promise<void>;
  /**
   * The positive control: a well-formed, authenticated request that must succeed. Throws a FindingError (kind
   * control-failed) when it does not; `undecided` when the target declined it with an answer the design gives to
   * any request (a rate limit).
   */
  control(ctx: LaneContext): Promise<void | 'undecided'>;
  /**
   * What its cases must reach, as a key of its answer tally (the tunnel family's: answers relayed from its fake
   * agent). Default: any HTTP answer.
   */
  reach?: string;
  /** Further keys of its tally its cases must reach at least once each (the SSH family's stages). Default: none. */
  alsoReach?: readonly string[];
  /** Whether its cases get HTTP answers, at least one of which a run must see. Default: true. */
  answersHttp?: boolean;
  /** Releases what a lane kept (sessions, tunnels). */
  closeLane?(ctx: LaneContext): Promise<void>;
}
