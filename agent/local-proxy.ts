// The agent's local reverse proxy: it serves the tunnel's streams (it listens on no port) and forwards them to this
// cluster's API server as the agent. A plain request arrives as an HTTP/2 request and goes on as one, over HTTP/2
// connections to the API server (lib/http2/pool.ts, lib/http2/forward.ts). An upgrade (exec, port-forward) arrives
// as HTTP/1.1 on a CONNECT stream and is spliced through by lib/http2/upgrade.ts. Either way the proxy overwrites
// Authorization with the agent's own credential (whatever the other end sent), keeps Impersonate-* (the hub's
// impersonation is the point), strips X-Forwarded-*, and streams answers as they come (watches).
import { createServer, type IncomingMessage, type OutgoingHttpHeaders, type Server } from 'node:http';
import type { IncomingHttpHeaders, ServerHttp2Stream } from 'node:http2';
import { Agent, request } from 'node:https';
import type { Duplex } from 'node:stream';
import { createSecureContext } from 'node:tls';
import { callOverHttp2, forwardOverHttp2 } from '../lib/http2/forward.ts';
import { hopByHop } from '../lib/http2/hop-by-hop.ts';
import { FORWARDED_HTTP1_LIMITS, HeadersTooLarge } from '../lib/http2/header-block.ts';
import { newH2Pool } from '../lib/http2/pool.ts';
import {
  AGENT_UNREAD_BYTES,
  newMemoryBudget,
  USER_UNREAD_BYTES,
  type MemoryBudget,
} from '../lib/http2/memory-budget.ts';
import { fieldsOf, serveStream, type Request, type Response } from '../lib/http2/request.ts';
import { refuseConnection, writeStatus } from '../lib/kube/status.ts';
import { clientCertChain } from '../lib/pki/pem.ts';
import { forwardUpgrade, originForm } from '../lib/http2/upgrade.ts';
import type { Logger } from '../lib/log.ts';
import { newReacher, reachRequestOf, SELF_REVIEW_PATH, type ReachReads } from '../lib/reach/dialer.ts';
import { isReachPath } from '../lib/reach/target.ts';

export interface LocalUpstream {
  url: URL;
  caPem?: string;
  /** A client certificate, when the agent's identity is one (out of a cluster). */
  certPem?: string;
  keyPem?: string;
  /** The agent's bearer token, read per request (projected service-account tokens rotate). */
  token?: () => string | undefined;
  /** This cluster's objects, read as the agent, for the reach connections it dials. Default: it dials none. */
  reach?: { reads: ReachReads; log: Logger };
}

export interface LocalProxy {
  /** Serves HTTP/1.1 on one tunnel stream (a CONNECT stream). */
  accept(stream: Duplex): void;
  /** Serves one plain request that came as an HTTP/2 request. */
  serve(stream: ServerHttp2Stream, headers: IncomingHttpHeaders, rawHeaders: string[]): void;
  close(): void;
}

/** Never sent on, beside what belongs to one hop (lib/http2/hop-by-hop.ts): the other end's credential and forwarding fields. */
const callerOnly = (name: string): boolean =>
  name === 'authorization' || name === 'forwarded' || name.startsWith('x-forwarded-');

/** The headers to send upstream, from a request's raw fields: repeated fields stay apart (Impersonate-Group: a, b). */
function upstreamHeaders(req: Request | IncomingMessage, token: string | undefined): OutgoingHttpHeaders {
  const headers: OutgoingHttpHeaders = fieldsOf(req.rawHeaders, hopByHop(req.headers, callerOnly));
  if (token) headers['authorization'] = `Bearer ${token}`;
  return headers;
}

/**
 * The requests the agent sends as itself, without impersonating anyone: reviews, by which the hub asks this cluster
 * whether a user may do something (SubjectAccessReview) and whether this cluster lets the agent act for users at all
 * (SelfSubjectAccessReview); the hub decides nothing about this cluster itself. Anything else must name whom it acts
 * as, so the hub can never use the agent's own rights beyond reviews, whatever they are.
 */
const REVIEW_PATHS = new Set([
  '/apis/authorization.k8s.io/v1/subjectaccessreviews',
  '/apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
]);
const ONLY_IMPERSONATED = 'the agent forwards only requests that impersonate a user, and access reviews';

/** The user a request impersonates: the first Impersonate-User, the one the API server reads; '' when none. */
function impersonated(rawHeaders: string[]): string {
  for (let i = 0; i + 1 < rawHeaders.length; i += 2)
    if (rawHeaders[i]!.toLowerCase() === 'impersonate-user') return rawHeaders[i + 1]!;
  return '';
}

function mayForward(method: string | undefined, url: string | undefined, rawHeaders: string[]): boolean {
  // An empty Impersonate-User impersonates nobody, whatever follows it.
  return impersonated(rawHeaders) !== '' || (method === 'POST' && REVIEW_PATHS.has(url ?? ''));
}

/** A review takes milliseconds, and its answer is well under a kilobyte. */
const REVIEW_LIMITS = { timeoutMs: 10_000, maxBytes: 64 * 1024 };

const bearer = (token: string | undefined): Record<string, string> =>
  token ? { authorization: `Bearer ${token}` } : {};

const unreachable = (err: Error & { code?: string }): string =>
  `this cluster's API server could not be reached through the agent: ${err.code ?? err.message}`;

/**
 * The agent's proxy for `upstream`. Answers and upgraded connections left unread are charged to `budget` per
 * impersonated user (the agent's own reviews to the empty name): one hub user's cannot take the agent's memory from
 * the others.
 */
export function newLocalProxy(
  upstream: LocalUpstream,
  budget: MemoryBudget = newMemoryBudget({ perUserBytes: USER_UNREAD_BYTES, totalBytes: AGENT_UNREAD_BYTES }),
): LocalProxy {
  const ca = upstream.caPem ? { ca: upstream.caPem } : {};
  const identity = upstream.certPem ? { cert: clientCertChain(upstream.certPem), key: upstream.keyPem } : {};
  const pool = newH2Pool(upstream.url.origin, { secureContext: createSecureContext({ ...ca, ...identity }) });

  /** Relays a plain request, however it came. The hub bounds its time; the agent follows the hub's cancel. */
  const forward = (req: Request, res: Response): void => {
    if (!mayForward(req.method, req.url, req.rawHeaders)) return writeStatus(res, 403, ONLY_IMPERSONATED);
    const headers = upstreamHeaders(req, upstream.token?.());
    headers[':method'] = req.method ?? 'GET';
    headers[':path'] = req.url ?? '/';
    forwardOverHttp2(req, res, headers, {
      open: (h, endStream) => pool.request(h, endStream),
      fail: (err) =>
        err instanceof HeadersTooLarge
          ? writeStatus(res, err.status, err.message)
          : writeStatus(res, 502, unreachable(err)),
      // A watch with no events yet has nothing to write: its head goes at once, so the client sees it established.
      flushHeaders: true,
      relay: { account: { budget, user: impersonated(req.rawHeaders) } },
    });
  };

  // Upgrades only (and the plain requests of a hub that sends them on CONNECT streams): HTTP/1.1 with the same
  // identity. Keep-alive, with Node's default of 256 idle connections.
  const agent = new Agent({ keepAlive: true, ...ca, ...identity });
  const server: Server = createServer({ maxHeaderSize: FORWARDED_HTTP1_LIMITS.maxHeaderSize }, forward);
  server.maxHeadersCount = FORWARDED_HTTP1_LIMITS.maxHeadersCount;
  // Reach connections (`sealion port-forward --cluster`), dialed here after this cluster's API server allowed them.
  const reacher = upstream.reach
    ? newReacher({
        reads: upstream.reach.reads,
        review: (body, impersonation) =>
          callOverHttp2(
            (h, endStream) => pool.request(h, endStream),
            {
              ...impersonation,
              ':method': 'POST',
              ':path': SELF_REVIEW_PATH,
              'content-type': 'application/json',
              accept: 'application/json',
              ...bearer(upstream.token?.()),
            },
            body,
            REVIEW_LIMITS,
          ),
        checkPolicy: true,
        log: upstream.reach.log,
        // This cluster's own record of who reached what (the hub's audit has the connection too).
        ended: (facts) => upstream.reach?.log.info(facts, 'reach connection'),
        budget,
      })
    : undefined;
  server.on('upgrade', (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    if (isReachPath(req.url ?? '/')) {
      if (!reacher)
        return refuseConnection(socket, { status: 503, message: 'this agent dials no reach connections' });
      return reacher.serve(reachRequestOf(req), socket, head);
    }
    if (!mayForward(req.method, req.url, req.rawHeaders))
      return refuseConnection(socket, { status: 403, message: ONLY_IMPERSONATED });
    const headers = upstreamHeaders(req, upstream.token?.());
    headers['connection'] = 'Upgrade';
    headers['upgrade'] = req.headers['upgrade'];
    forwardUpgrade(socket, head, {
      send() {
        const sent = request(upstream.url.origin, {
          method: req.method ?? 'GET',
          path: originForm(req.url),
          headers,
          agent,
        });
        sent.setNoDelay(true);
        return sent;
      },
      fail(err) {
        refuseConnection(socket, { status: 502, message: unreachable(err) });
      },
      // What the hub sends and the API server leaves unread holds a stream window here, as an unread answer does.
      account: { budget, user: impersonated(req.rawHeaders) },
    });
  });
  server.on('clientError', (_err, socket: Duplex) => socket.destroy());
  return {
    accept: (stream) => void server.emit('connection', stream),
    serve: (stream, headers, rawHeaders) => serveStream(stream, headers, rawHeaders, forward),
    close() {
      reacher?.close();
      server.closeAllConnections();
      agent.destroy();
      pool.close();
    },
  };
}
