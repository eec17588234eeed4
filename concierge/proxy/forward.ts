// Forwarding to the API server. Requests go over HTTP/2 connections that open another only when the API server's
// stream limit is reached (lib/http2/pool.ts), so a thousand watches share a handful of connections, and are relayed
// by lib/http2/forward.ts. Bodies stream both ways (watch events reach the client as the API server writes them);
// short requests are bounded by a deadline and long-running ones are not. Upgrades (exec, attach, port-forward; SPDY
// or WebSocket) need HTTP/1.1 and are spliced through by lib/http2/upgrade.ts.
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import { Agent, request } from 'node:https';
import { newH2Pool } from '../../lib/http2/pool.ts';
import {
  callOverHttp2,
  forwardOverHttp2,
  UpstreamTimeout,
  type CallAnswer,
} from '../../lib/http2/forward.ts';
import { createSecureContext } from 'node:tls';
import type { IncomingMessage, OutgoingHttpHeaders } from 'node:http';
import type { Socket } from 'node:net';
import type { Request, Response } from '../../lib/http2/request.ts';
import { rawStatusResponse, writeStatus } from '../../lib/kube/status.ts';
import { clientCertChain } from '../../lib/pki/pem.ts';
import { forwardUpgrade, originForm } from '../../lib/http2/upgrade.ts';

/**
 * The API server ends its own short requests after 60 s; the proxy waits a little longer so the API server's
 * timeout, with its own Status, is what clients normally see.
 */
export const SHORT_REQUEST_TIMEOUT_MS = 65_000;
/** Idle pooled HTTP/1.1 connections (upgrades) to the API server. */
const MAX_FREE_SOCKETS = 16;

export interface UpstreamCredentials {
  /** PEM CA bundle for the API server. */
  caPem?: string;
  /** Client certificate and key, when the forwarding identity is a certificate (out of cluster). */
  certPem?: string;
  keyPem?: string;
  /** Bearer token of the forwarding identity, read per request so a refreshed token is used at once. */
  token?: () => string | undefined;
}

export interface Upstream {
  url: URL;
  credentials: UpstreamCredentials;
  /** Deadline for short (not long-running) requests. Default: SHORT_REQUEST_TIMEOUT_MS. */
  shortRequestTimeoutMs?: number;
}

/** Per-request forwarding decisions made by the handler before the request is handed over. */
export interface ForwardPlan {
  headers: OutgoingHttpHeaders;
  longRunning: boolean;
  /**
   * The request carries the caller's own token for the API server (a service account): it goes over connections
   * without the proxy's client certificate, which the API server would otherwise prefer over the token.
   */
  passthrough: boolean;
  /**
   * The authenticated user's name, before any nested impersonation: whose request this is, for limits kept per
   * user (a tunnel's fair share). Impersonating others does not give a caller more shares.
   */
  user: string;
}

function errorStatus(err: Error & { code?: string }): { code: number; message: string } {
  if (err instanceof UpstreamTimeout || err.code === 'ETIMEDOUT' || err.code === 'ESOCKETTIMEDOUT') {
    return { code: 504, message: 'the Kubernetes API server did not answer in time' };
  }
  return { code: 502, message: `the Kubernetes API server could not be reached: ${err.code ?? err.message}` };
}

export interface Forwarder {
  web(req: Request, res: Response, plan: ForwardPlan): Promise<void>;
  upgrade(req: IncomingMessage, socket: Socket, head: Buffer, plan: ForwardPlan): void;
  /**
   * Sends one small request of the concierge's own to the cluster, as the forwarding identity itself (no
   * impersonation): the questions about that cluster that only it may answer.
   */
  call(request: OwnCall): Promise<CallAnswer>;
  close(): void;
}

/** One small request the concierge itself sends to a cluster: no impersonation, the forwarder's identity. */
export interface OwnCall {
  method: string;
  path: string;
  body: Buffer;
  /** Whose request it serves: it counts against that user's share of a tunnel, as their requests do. */
  user: string;
}

/** How long a cluster has to answer one of the concierge's own calls (a SubjectAccessReview takes milliseconds). */
export const OWN_CALL_TIMEOUT_MS = 10_000;
/** The largest answer to one of the concierge's own calls: a SubjectAccessReview's is well under a kilobyte. */
export const OWN_CALL_MAX_BYTES = 64 * 1024;

export function newForwarder(upstream: Upstream, budget?: MemoryBudget): Forwarder {
  // One secure context per identity, built once: otherwise every new upstream connection parses the CA and key again.
  const ca = upstream.credentials.caPem ? { ca: upstream.credentials.caPem } : {};
  const identity = upstream.credentials.certPem
    ? { cert: clientCertChain(upstream.credentials.certPem), key: upstream.credentials.keyPem }
    : {};
  const contexts = {
    withIdentity: createSecureContext({ ...ca, ...identity }),
    anonymous: createSecureContext(ca),
  };
  const shortTimeout = upstream.shortRequestTimeoutMs ?? SHORT_REQUEST_TIMEOUT_MS;

  const pools = {
    withIdentity: newH2Pool(upstream.url.origin, { secureContext: contexts.withIdentity }),
    anonymous: newH2Pool(upstream.url.origin, { secureContext: contexts.anonymous }),
  };

  // Upgrades only: HTTP/1.1 connections with the same identities.
  const newAgent = (secureContext: ReturnType<typeof createSecureContext>, withCert: boolean): Agent =>
    new Agent({
      keepAlive: true,
      maxFreeSockets: MAX_FREE_SOCKETS,
      ...ca,
      ...(withCert ? identity : {}),
      secureContext,
    });
  const agents = {
    withIdentity: newAgent(contexts.withIdentity, true),
    anonymous: newAgent(contexts.anonymous, false),
  };

  const upstreamHeaders = (plan: ForwardPlan): Record<string, string | string[]> => {
    const headers = plan.headers as Record<string, string | string[]>;
    // Host and Expect are already gone: cleanHeaders, which builds every plan's headers, leaves them out.
    const token = plan.passthrough ? undefined : upstream.credentials.token?.();
    if (token) headers['authorization'] = `Bearer ${token}`;
    return headers;
  };

  return {
    web(req, res, plan) {
      const headers: OutgoingHttpHeaders = upstreamHeaders(plan);
      headers[':method'] = req.method ?? 'GET';
      headers[':path'] = req.url ?? '/';
      const pool = plan.passthrough ? pools.anonymous : pools.withIdentity;
      forwardOverHttp2(req, res, headers, {
        open: (h, endStream) => pool.request(h, endStream),
        fail(err) {
          if (res.headersSent) return void (res.destroyed || res.destroy());
          const { code, message } = errorStatus(err);
          writeStatus(res, code, message);
        },
        ...(plan.longRunning ? { flushHeaders: true } : { idleTimeoutMs: shortTimeout }),
        ...(budget ? { relay: { account: { budget, user: plan.user } } } : {}),
      });
      return new Promise<void>((done) => res.on('close', done));
    },
    upgrade(req, socket, head, plan) {
      const headers = upstreamHeaders(plan);
      forwardUpgrade(socket, head, {
        send: () => {
          const sent = request(upstream.url.origin, {
            method: req.method ?? 'GET',
            path: originForm(req.url),
            headers,
            agent: plan.passthrough ? agents.anonymous : agents.withIdentity,
          });
          sent.setNoDelay(true);
          return sent;
        },
        fail(err) {
          const { code, message } = errorStatus(err);
          socket.end(rawStatusResponse(code, message));
        },
      });
    },
    call(own) {
      const token = upstream.credentials.token?.();
      return callOverHttp2(
        (h, endStream) => pools.withIdentity.request(h, endStream),
        {
          ':method': own.method,
          ':path': own.path,
          'content-type': 'application/json',
          accept: 'application/json',
          ...(token ? { authorization: `Bearer ${token}` } : {}),
        },
        own.body,
        { timeoutMs: OWN_CALL_TIMEOUT_MS, maxBytes: OWN_CALL_MAX_BYTES },
      );
    },
    close() {
      pools.withIdentity.close();
      pools.anonymous.close();
      agents.withIdentity.destroy();
      agents.anonymous.destroy();
    },
  };
}
