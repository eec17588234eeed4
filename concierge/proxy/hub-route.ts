// The route to the hub's own API server. Plain requests go over HTTP/2 connections that open another only when the
// API server's stream limit is reached (lib/http2/pool.ts), so a thousand watches share a handful of connections.
// Upgrades (exec, attach, port-forward; SPDY or WebSocket) need HTTP/1.1, over keep-alive connections of their own.
// Every request goes as the forwarding identity (a client certificate, or a token read per request), except a
// service account's, which carries its own token (the plan's passthrough). A reach connection for the hub's own
// cluster (`sealion port-forward` without `--cluster`) is dialed here, by this process, as an agent dials one for its
// cluster.
import type { MemoryBudget } from '../../lib/http2/memory-budget.ts';
import { Agent, request } from 'node:https';
import { newH2Pool, type H2Pool } from '../../lib/http2/pool.ts';
import { UpstreamTimeout } from '../../lib/http2/forward.ts';
import { createSecureContext, type SecureContext } from 'node:tls';
import { clientCertChain } from '../../lib/pki/pem.ts';
import { systemClock } from '../../lib/clock.ts';
import { asUpgrade, refuse, type Refusal, type UpgradeExchange } from './exchange.ts';
import type { Reacher } from '../../lib/reach/dialer.ts';
import { REACH_UPGRADE } from '../../lib/reach/target.ts';
import { OWN_CALL_MAX_BYTES, OWN_CALL_TIMEOUT_MS, type Route } from './route.ts';
import { callOver, SHORT_REQUEST_TIMEOUT_MS, transport, type ForwardPlan, type Hop } from './transport.ts';
import { endAndClose } from '../../lib/http2/upgrade.ts';

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

function failure(err: Error & { code?: string }): Refusal {
  if (err instanceof UpstreamTimeout || err.code === 'ETIMEDOUT' || err.code === 'ESOCKETTIMEDOUT') {
    return { status: 504, message: 'the Kubernetes API server did not answer in time' };
  }
  return {
    status: 502,
    message: `the Kubernetes API server could not be reached: ${err.code ?? err.message}`,
  };
}

/** The route to the hub's API server, with the connections it keeps open. */
export interface HubRoute extends Route {
  close(): void;
}

/**
 * Dials a reach connection to an object of the hub's own cluster, with the impersonation decided for it: the
 * cluster's API server checks the user may reach it (lib/reach/dialer.ts).
 */
function dialReach(exchange: UpgradeExchange, plan: ForwardPlan, reacher: Reacher | undefined): void {
  const { req, context } = exchange;
  if (!reacher)
    return refuse(exchange, { status: 503, message: 'this concierge does not dial reach connections' });
  if (plan.passthrough)
    return refuse(exchange, {
      status: 403,
      message:
        'reach connections are for the users Sealion authenticates; a service account of this cluster can use kubectl port-forward',
    });
  const rawImpersonation = Object.entries(plan.headers).flatMap(([name, value]) =>
    !name.startsWith('impersonate-') || value === undefined
      ? []
      : (Array.isArray(value) ? value : [String(value)]).flatMap((v) => [name, v]),
  );
  const { audit, reach } = context;
  if (audit) reach!.connected = () => audit.responseStarted(101);
  // A grant's end or the drain ends the connection. Its bytes are the target's, so no message can go in them: the
  // client sees its connection end, as when the target closes it.
  context.end = () => endAndClose(exchange.socket, Buffer.alloc(0));
  reacher.serve(
    { url: req.url ?? '/', upgrade: REACH_UPGRADE, rawImpersonation, holder: plan.user },
    exchange.socket,
    exchange.head,
    reach,
  );
}

/**
 * `reacher`: what dials the hub's own reach connections (it asks its reviews through this route, so it is made after
 * it). Default: none (they are refused).
 */
export function newHubRoute(
  upstream: Upstream,
  budget?: MemoryBudget,
  reacher?: () => Reacher | undefined,
): HubRoute {
  // One secure context per identity, built once: otherwise every new upstream connection parses the CA and key again.
  const ca = upstream.credentials.caPem ? { ca: upstream.credentials.caPem } : {};
  const identity = upstream.credentials.certPem
    ? { cert: clientCertChain(upstream.credentials.certPem), key: upstream.credentials.keyPem }
    : {};
  const hop = (secureContext: SecureContext, withIdentity: boolean): Hop & { close(): void } => {
    const pool: H2Pool = newH2Pool(upstream.url.origin, { secureContext });
    // Upgrades only: HTTP/1.1 connections with the same identity.
    const agent = new Agent({
      keepAlive: true,
      maxFreeSockets: MAX_FREE_SOCKETS,
      ...ca,
      ...(withIdentity ? identity : {}),
      secureContext,
    });
    return {
      headers(plan) {
        // Nobody reads the plan's headers after this hop. Host and Expect are gone already: cleanHeaders, which
        // builds every plan's headers, leaves them out.
        const token = withIdentity ? upstream.credentials.token?.() : undefined;
        if (token) plan.headers['authorization'] = `Bearer ${token}`;
        return plan.headers;
      },
      pathPrefix: '',
      open: (headers, endStream) => pool.request(headers, endStream),
      send(method, path, headers) {
        const sent = request(upstream.url.origin, { method, path, headers, agent });
        sent.setNoDelay(true);
        return sent;
      },
      statusPrefix: '',
      failure,
      shortTimeoutMs: upstream.shortRequestTimeoutMs ?? SHORT_REQUEST_TIMEOUT_MS,
      clock: systemClock,
      ...(budget ? { budget } : {}),
      close() {
        pool.close();
        agent.destroy();
      },
    };
  };
  const withIdentity = hop(createSecureContext({ ...ca, ...identity }), true);
  const anonymous = hop(createSecureContext(ca), false);

  return {
    kind: 'local',
    // Nothing is taken to admit a request to the hub's own API server (it has its own priority and fairness).
    forward(exchange, plan: ForwardPlan) {
      const upgrade = exchange.context.reach ? asUpgrade(exchange) : undefined;
      if (upgrade) dialReach(upgrade, plan, reacher?.());
      else transport(exchange, plan.passthrough ? anonymous : withIdentity, plan);
      return Promise.resolve();
    },
    call: (own) =>
      callOver(withIdentity, own, { timeoutMs: OWN_CALL_TIMEOUT_MS, maxBytes: OWN_CALL_MAX_BYTES }),
    close() {
      withIdentity.close();
      anonymous.close();
    },
  };
}
