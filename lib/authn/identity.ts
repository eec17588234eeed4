// Which identities the proxy can hand on exactly as an authenticator gave them. An identity travels to the API
// server in Impersonate-* headers (and, after a TokenCredentialRequest, in a certificate subject first), and some
// strings cannot make that trip unchanged: HTTP drops whitespace at either end of a header value, so " admin" would
// arrive as "admin"; control characters split or end a header; broken Unicode comes out as another string. An
// identity holding any of these is refused outright, never repaired: a repaired name is someone else's name.
import type { UserInfo } from './types.ts';

/**
 * The most bytes (UTF-8) an identity's names may add up to. Far above real users (a name, a few hundred groups)
 * and far below what would hurt: the identity is copied into every forwarded request's headers, and into a client
 * certificate that must fit a TLS handshake.
 */
export const MAX_IDENTITY_BYTES = 32 * 1024;

// eslint-disable-next-line no-control-regex -- finding control characters is this expression's purpose
const CONTROL_CHARACTERS = /[\u0000-\u001f\u007f]/;
const EDGE_WHITESPACE = /^[ \t]|[ \t]$/;

function nameProblem(what: string, value: string): string | undefined {
  if (value === '') return `${what} is empty`;
  if (CONTROL_CHARACTERS.test(value)) return `${what} holds a control character`;
  if (EDGE_WHITESPACE.test(value)) return `${what} starts or ends with whitespace`;
  if (!value.isWellFormed()) return `${what} is not well-formed Unicode`;
  return undefined;
}

function findProblem(user: UserInfo): string | undefined {
  let bytes = 0;
  const check = (what: string, value: string): string | undefined => {
    bytes += Buffer.byteLength(value);
    return nameProblem(what, value);
  };
  const problem =
    check('the username', user.username) ??
    (user.uid === undefined ? undefined : check('the uid', user.uid)) ??
    user.groups.reduce<string | undefined>((found, g, i) => found ?? check(`group ${i + 1}`, g), undefined) ??
    Object.entries(user.extra).reduce<string | undefined>(
      (found, [key, values]) =>
        found ??
        check(`an extra key`, key) ??
        values.reduce<string | undefined>((f, v) => f ?? check(`a value of extra ${key}`, v), undefined),
      undefined,
    );
  if (problem) return problem;
  if (bytes > MAX_IDENTITY_BYTES)
    return `the identity's names add up to ${bytes} bytes, over ${MAX_IDENTITY_BYTES}`;
  return undefined;
}

/** Verdicts by user object: authenticators hand out one object per credential, so most lookups are hits. */
const verdicts = new WeakMap<UserInfo, string | null>();

/** Why `user` cannot be passed on unchanged, or undefined when it can. */
export function identityProblem(user: UserInfo): string | undefined {
  let verdict = verdicts.get(user);
  if (verdict === undefined) {
    verdict = findProblem(user) ?? null;
    verdicts.set(user, verdict);
  }
  return verdict ?? undefined;
}
