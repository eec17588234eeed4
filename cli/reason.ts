// The reason a user works under now (`sealion login --reason "INC-123"`), kept beside the cached credentials as
// reason.json {"reason", "expiresAt"} (0600) until it expires, is cleared (`sealion login --clear-reason`) or the user
// logs out. While one is set, the login plugins exchange their token for a certificate that carries it
// (exec-credential.ts), so every request made with that certificate carries it on to the cluster's audit log.
import { parseDuration } from '../lib/duration.ts';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { MAX_REASON_LENGTH, reasonProblem } from '../apis/access.ts';
import { UserError } from './errors.ts';
import { configDir, readCache, writeCache } from './exec-credential.ts';

/** How long a reason lasts unless --reason-for says: a working day, so yesterday's incident is not today's. */
export const DEFAULT_REASON_MS = 12 * 3600_000;
/** The longest --reason-for: a reason is about now, and a week-old one says little. */
export const MAX_REASON_MS = 7 * 24 * 3600_000;
const MIN_REASON_MS = 60_000;

export interface StoredReason {
  reason: string;
  /** RFC 3339. */
  expiresAt: string;
}

export const reasonFile = (env: NodeJS.ProcessEnv): string => join(configDir(env), 'reason.json');

/**
 * The reason set now, or undefined when none is, it expired, or the file is not one we wrote (edited by hand into
 * something reasonProblem refuses, or unreadable): such a file is as good as none, and the next --reason replaces it.
 */
export function currentReason(env: NodeJS.ProcessEnv, now = Date.now()): StoredReason | undefined {
  const stored = readCache<Partial<StoredReason>>(reasonFile(env));
  if (!stored || typeof stored !== 'object' || typeof stored.expiresAt !== 'string') return undefined;
  if (reasonProblem(stored.reason) !== undefined) return undefined;
  const expires = Date.parse(stored.expiresAt);
  if (!(expires > now)) return undefined;
  return { reason: stored.reason!, expiresAt: stored.expiresAt };
}

/**
 * A duration as --reason-for takes it: hours, minutes and seconds, as `4h`, `90m`, `1h30m`, `45s`; between a minute
 * and a week.
 */
export function parseReasonDuration(text: string): number {
  const ms = parseDuration(text.trim()) ?? NaN;
  if (!(ms >= MIN_REASON_MS && ms <= MAX_REASON_MS))
    throw new UserError(
      `--reason-for takes a duration between 1m and ${MAX_REASON_MS / 3600_000}h, as 4h, 90m or 1h30m, not ${JSON.stringify(text)}`,
    );
  return ms;
}

/** Sets the reason for `forMs`, replacing any other; checked as the concierge checks it. */
export function setReason(
  env: NodeJS.ProcessEnv,
  reason: string,
  forMs = DEFAULT_REASON_MS,
  now = Date.now(),
): StoredReason {
  const problem = reasonProblem(reason);
  if (problem)
    throw new UserError(
      `--reason ${problem}: give one line of at most ${MAX_REASON_LENGTH} characters, such as a ticket or incident number`,
    );
  const stored = { reason, expiresAt: new Date(now + forMs).toISOString() };
  mkdirSync(configDir(env), { recursive: true, mode: 0o700 });
  writeCache(reasonFile(env), stored);
  return stored;
}

/** Clears the reason; answers whether one was set (expired or not). */
export function clearReason(env: NodeJS.ProcessEnv): boolean {
  const file = reasonFile(env);
  const there = readCache<unknown>(file) !== undefined;
  rmSync(file, { force: true });
  return there;
}

/** What `sealion login` itself takes: the reason's flags. */
export interface LoginReasonFlags {
  reason?: string;
  reasonFor?: string;
  clearReason?: boolean;
}

/** `sealion login [--reason WHY [--reason-for 4h] | --clear-reason]`: what it did, or the reason set now, in lines. */
export function loginReason(flags: LoginReasonFlags, env: NodeJS.ProcessEnv, now = Date.now()): string[] {
  if (flags.clearReason && flags.reason !== undefined)
    throw new UserError('give --reason or --clear-reason, not both');
  if (flags.reasonFor && flags.reason === undefined)
    throw new UserError('--reason-for says how long a reason lasts: give the reason with --reason');
  if (flags.clearReason)
    return [
      clearReason(env)
        ? 'Cleared the reason: the next kubectl run gets a credential without one.'
        : 'No reason was set.',
    ];
  if (flags.reason === undefined) {
    const current = currentReason(env, now);
    return current
      ? [`Reason: ${current.reason}`, `Until: ${current.expiresAt}`]
      : ['No reason set. Set one with: sealion login --reason "INC-123" [--reason-for 4h]'];
  }
  const stored = setReason(
    env,
    flags.reason,
    flags.reasonFor ? parseReasonDuration(flags.reasonFor) : DEFAULT_REASON_MS,
    now,
  );
  return [
    `Reason set until ${stored.expiresAt}: from the next kubectl run, kubeconfigs written by sealion get kubeconfig get a certificate that carries it to each cluster's audit log.`,
  ];
}
