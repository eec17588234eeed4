// The APIs Sealion answers itself, whichever door a request came in by: one table of entries, each a set of paths,
// who may call it and its handler. The proxy (handler.ts) looks a request's path up once and serves the anonymous
// entries before authentication and the authenticated ones right after it; the aggregated listener
// (concierge/direct/handler.ts) serves the front proxy's; the peer port (concierge/peering/holder.ts) a replica's.
// Which entries each door mounts is listed where the door is built (hub-apis.ts, direct/handler.ts, holder.ts).
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import { send, writeStatus } from '../../lib/kube/status.ts';

/**
 * Who may call an entry: anyone, before authentication (health, the TokenCredentialRequest API); a user the proxy
 * authenticated; the cluster's API server's front proxy, for the user it names (the aggregated APIs); a peer replica,
 * which the peer port's TLS checked (its recordings).
 */
export type Caller = 'anonymous' | 'authenticated' | 'front-proxy' | 'replica';

/**
 * Answers one request. `path`: its path without the query (for a cluster's URL, the path on that cluster); `user`:
 * the caller as the API server would see them, undefined for an anonymous caller or a replica.
 */
export type LocalHandler = (
  req: Request,
  res: Response,
  path: string,
  user: UserInfo | undefined,
) => Promise<void> | void;

export interface LocalAPI {
  /** The paths it answers: each exactly, and one ending in `/*` every path below it. */
  paths: readonly string[];
  who: Caller;
  /** Only at the hub's own URLs: a path for a cluster (/clusters/<name>/…) is that cluster's to answer. */
  hubOnly?: boolean;
  /**
   * A health check. It is answered whatever the audit's state and whether the proxy is switched on, since a blocked
   * audit or a proxy switched off must not restart the pod; and as the kubelet asks every few seconds, one answered
   * 200 is counted but logs no line.
   */
  probe?: boolean;
  /**
   * The methods it answers (upper case); a request with another goes on down the pipeline as if no entry matched (so
   * a GET of a collection Sealion only creates in goes to the API server). Default: every method.
   */
  methods?: readonly string[];
  serve: LocalHandler;
}

/** The table a door looks a path up in: once per request, exact paths first (a Map), then the few `/*` ones. */
export interface LocalAPIs {
  /** The entry that answers `method` on `path`, if any. */
  find(path: string, method: string): LocalAPI | undefined;
}

export function localAPIs(entries: readonly LocalAPI[]): LocalAPIs {
  const exact = new Map<string, LocalAPI>();
  const below: { prefix: string; api: LocalAPI }[] = [];
  for (const api of entries)
    for (const path of api.paths) {
      if (path.endsWith('/*')) below.push({ prefix: path.slice(0, -1), api });
      else if (exact.has(path)) throw new Error(`two local APIs answer ${path}`);
      else exact.set(path, api);
    }
  return {
    find(path, method) {
      const answers = (api: LocalAPI): boolean => !api.methods || api.methods.includes(method);
      const found = exact.get(path);
      if (found && answers(found)) return found;
      for (const { prefix, api } of below) if (path.startsWith(prefix) && answers(api)) return api;
      return undefined;
    },
  };
}

/** The health checks: /healthz and /livez always ok, /readyz as `ready` says. */
export function healthAPIs(ready: () => boolean): LocalAPI[] {
  return [
    {
      paths: ['/healthz', '/livez'],
      who: 'anonymous',
      probe: true,
      serve: (_req, res) => send(res, 200, 'text/plain', 'ok'),
    },
    {
      paths: ['/readyz'],
      who: 'anonymous',
      probe: true,
      serve(_req, res) {
        const ok = ready();
        send(res, ok ? 200 : 503, 'text/plain', ok ? 'ok' : 'not ready');
      },
    },
  ];
}

/**
 * Admission: at most `max` of something in flight at once. `admit()` gives the place's release (idempotent), or
 * undefined when all are taken.
 */
export function inFlightLimit(max: number): () => (() => void) | undefined {
  let inFlight = 0;
  return () => {
    if (inFlight >= max) return undefined;
    inFlight++;
    let released = false;
    return () => {
      if (!released) inFlight--;
      released = true;
    };
  };
}

/** The answer when a limit's places are all taken: client-go waits Retry-After out and retries. */
export function tooManyLogins(res: Response): void {
  writeStatus(res, 429, 'too many TokenCredentialRequests at once; retry shortly', { retryAfterSeconds: 1 });
}

export const NOT_FOUND = 'the server could not find the requested resource';
