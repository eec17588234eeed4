// The CLI's one error style: one line, `sealion: <what failed>[ on <file or host>]: <why>; <what to do>`, and exit
// status 1. A command throws a UserError whose message is that line after `sealion: `; what Node or a library throws
// (a system error on a file, a connection that failed, a kubeconfig that does not parse) becomes such a line here, so
// that no `ENOENT`, `fetch failed` or YAML error text with its line breaks reaches the user as it is.
//
// main.ts loads this module on every run, kubectl's plugin runs included: it imports nothing.

/** A failure the user can act on: main.ts prints its message as it is after `sealion: ` and exits 1. */
export class UserError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'UserError';
  }
}

/** Node's system error codes (and undici's for a connection), as the reason after the colon. */
const SYSTEM_REASONS: Record<string, string> = {
  ENOENT: 'no such file',
  EISDIR: 'it is a directory',
  ENOTDIR: 'a part of the path is not a directory',
  EACCES: 'permission denied',
  EPERM: 'operation not permitted',
  ELOOP: 'too many symbolic links',
  ENAMETOOLONG: 'the path is too long',
  EMFILE: 'too many open files',
  ECONNREFUSED: 'connection refused',
  ECONNRESET: 'the connection was reset',
  ENOTFOUND: 'no such host',
  EAI_AGAIN: 'the host name cannot be looked up now',
  ETIMEDOUT: 'the connection timed out',
  EHOSTUNREACH: 'no route to the host',
  ENETUNREACH: 'the network is unreachable',
  EPIPE: 'the connection was closed',
  UND_ERR_CONNECT_TIMEOUT: 'the connection timed out',
  UND_ERR_SOCKET: 'the connection was closed',
};

/** TLS verification codes: the server answered, but with a certificate the kubeconfig does not let us trust. */
const CERTIFICATE_REASONS: Record<string, string> = {
  SELF_SIGNED_CERT_IN_CHAIN: 'its certificate is signed by an authority that is not trusted',
  DEPTH_ZERO_SELF_SIGNED_CERT: 'its certificate is self-signed and not trusted',
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: 'its certificate is signed by an authority that is not trusted',
  UNABLE_TO_GET_ISSUER_CERT_LOCALLY: 'its certificate is signed by an authority that is not trusted',
  CERT_HAS_EXPIRED: 'its certificate has expired',
  CERT_NOT_YET_VALID: 'its certificate is not valid yet',
  ERR_TLS_CERT_ALTNAME_INVALID: 'its certificate is for another name',
};

/** An error and its causes, outermost first, an AggregateError's errors included (a few deep: a cycle must end). */
function* chain(err: unknown, depth = 0): Generator<object> {
  if (!err || typeof err !== 'object' || depth > 6) return;
  yield err;
  if (err instanceof AggregateError) for (const inner of err.errors) yield* chain(inner, depth + 1);
  yield* chain((err as { cause?: unknown }).cause, depth + 1);
}

/** The string codes along an error's cause chain, outermost first. */
export function codesOf(err: unknown): string[] {
  return [...chain(err)].flatMap((e) => {
    const code = (e as { code?: unknown }).code;
    return typeof code === 'string' ? [code] : [];
  });
}

/** Why a connection or a file failed, in words, from the first code along the chain that has some; else undefined. */
export function systemReason(err: unknown): string | undefined {
  for (const code of codesOf(err)) {
    const reason = CERTIFICATE_REASONS[code] ?? SYSTEM_REASONS[code];
    if (reason) return reason;
  }
  return undefined;
}

/** Whether the chain holds a TLS verification failure: the fix is a CA, not the network. */
export const untrusted = (err: unknown): boolean => codesOf(err).some((c) => c in CERTIFICATE_REASONS);

/**
 * A failure to read a file, as one line: `cannot read <what> <file>: <why>; <fix>`. An error that is no system
 * error keeps its own message (on one line).
 */
export function fileError(err: unknown, what: string, file: string, fix: string): UserError {
  return new UserError(`cannot read ${what} ${file}: ${systemReason(err) ?? oneLine(err)}; ${fix}`, {
    cause: err,
  });
}

/** The scheme, host and port of a URL, which is what a user checks (the path adds nothing to "cannot reach"). */
export function originOf(url: string): string {
  try {
    return new URL(url).origin;
  } catch {
    return url;
  }
}

/**
 * A request to `url` that got no answer, as one line: `cannot reach <origin>: <why>; <fix>`, where a certificate
 * that is not trusted says to check the CA rather than `fix`. Undefined for an error that is not about reaching it
 * (an answer that refused, a body too large).
 */
export function unreachableError(err: unknown, url: string, fix: string): UserError | undefined {
  const name = (err as { name?: unknown } | null)?.name;
  const code = (err as { code?: unknown } | null)?.code;
  const origin = originOf(url);
  if (name === 'HttpsError' && code === 'Timeout')
    return new UserError(`no answer from ${origin} in time; ${fix}`, { cause: err });
  const reason = systemReason(err);
  if (reason === undefined && !(name === 'HttpsError' && code === 'Network')) return undefined;
  const then = untrusted(err)
    ? 'check the certificate authority the kubeconfig names for it (certificate-authority-data)'
    : fix;
  return new UserError(`cannot reach ${origin}: ${reason ?? oneLine(err)}; ${then}`, { cause: err });
}

/** An error's message on one line: libraries put line breaks (YAML's snippets, stack-like details) in theirs. */
export function oneLine(err: unknown): string {
  const message = err instanceof Error ? err.message : String(err);
  return message
    .split(/\s*[\r\n]+\s*/)
    .filter(Boolean)
    .join(' ');
}

/**
 * The line main.ts prints after `sealion: ` for anything a command threw: a UserError's message as it is; a system
 * error that no command explained, from its code, path or address; anything else on one line.
 */
export function errorLine(err: unknown): string {
  if (err instanceof UserError) return err.message;
  const e = err as { code?: unknown; path?: unknown; syscall?: unknown; address?: unknown; port?: unknown };
  const reason = systemReason(err);
  if (reason && typeof e.path === 'string') return `cannot read ${e.path}: ${reason}`;
  if (reason && typeof e.address === 'string')
    return `cannot reach ${e.address}${typeof e.port === 'number' ? `:${e.port}` : ''}: ${reason}`;
  return oneLine(err);
}

/**
 * A failure already said on standard error, in this style, by a process this one ran (a login plugin): main.ts
 * prints nothing more and exits 1. The message is for code that reads it, never shown.
 */
export class AlreadySaid extends UserError {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'AlreadySaid';
  }
}
