// What an authenticator says about a token.

/** The user a token belongs to, as Kubernetes sees users. */
export interface UserInfo {
  username: string;
  uid?: string;
  groups: string[];
  extra: Record<string, string[]>;
}

/**
 * The outcome of authenticating a token. A failure carries the reason for the log only: callers answer every
 * failure the same way, so a caller cannot learn which check failed.
 */
export type AuthResult =
  | {
      ok: true;
      user: UserInfo;
      authenticator: string;
      /**
       * Milliseconds since the epoch until which this answer may be given again for the same token without asking
       * the authenticator (a JWT's exp, capped by the authenticator's own cache lifetime). Absent: ask every time.
       */
      reusableUntil?: number;
    }
  | { ok: false; reason: string };

export interface TokenAuthenticator {
  authenticate(token: string, signal?: AbortSignal): Promise<AuthResult>;
}

export function fail(reason: string): AuthResult {
  return { ok: false, reason };
}

/**
 * Tokens arrive in a header, so they are bounded by header limits anyway; this bound stops a 1 MiB token before
 * any base64 or JSON work. 64 KiB still fits an ID token with hundreds of groups.
 */
export const MAX_TOKEN_BYTES = 64 * 1024;

/** The refusal of a token over MAX_TOKEN_BYTES; undefined for one within it. */
export function oversized(token: string): AuthResult | undefined {
  return token.length > MAX_TOKEN_BYTES
    ? fail(`token of ${token.length} bytes is over the limit`)
    : undefined;
}

/**
 * A compact JWS: three base64url parts. The signature may be empty (an unsigned token still names its issuer, which
 * routes it to the authenticator that refuses it).
 */
export const JWT_SHAPE = /^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*$/;
