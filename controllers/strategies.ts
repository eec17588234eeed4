// Publishes how clients reach the concierge. The strategies (ImpersonationProxy from the proxy controller,
// TokenCredentialRequestAPI from the direct-login controller) are written onto every JWTAuthenticator and
// WebhookAuthenticator, including ones created later, and mirrored onto the CredentialIssuer in Pinniped's
// shape. Only the leader writes. An entry keeps its lastUpdateTime while nothing else in it changes, so
// repeated syncs, and a new leader, write nothing when nothing changed.
import { isDeepStrictEqual } from 'node:util';
import type {
  AuthenticatorStatus,
  ConciergeStrategy,
  JWTAuthenticator,
  WebhookAuthenticator,
} from '../apis/authentication.ts';
import type {
  CredentialIssuer,
  CredentialIssuerSpec,
  CredentialIssuerStatus,
  CredentialIssuerStrategy,
} from '../apis/config.ts';
import type { Informer } from '../lib/kube/informer.ts';
import type { Logger } from '../lib/log.ts';
import type { StatusWriter } from '../lib/kube/status-writer.ts';
import { sameIgnoringTimes } from '../lib/controller/conditions.ts';
import type { Controller } from '../lib/controller/controller.ts';
import type { SyncResult } from '../lib/controller/queue.ts';

/**
 * A maker of one type's strategy entries, stamped with the time now: what the proxy and direct-login controllers
 * publish.
 */
export function strategyOf(
  type: ConciergeStrategy['type'],
  now: () => Date,
): (
  status: ConciergeStrategy['status'],
  reason: ConciergeStrategy['reason'],
  message: string,
  extra?: Partial<ConciergeStrategy>,
) => ConciergeStrategy {
  return (status, reason, message, extra = {}) => ({
    type,
    status,
    reason,
    message,
    lastUpdateTime: now().toISOString(),
    ...extra,
  });
}

/** The current strategies, one per type; set() notifies only when something but the time changed. */
export interface StrategyBoard {
  set(strategy: ConciergeStrategy): void;
  /** Sorted by type, so that every writer produces the same list. */
  list(): ConciergeStrategy[];
  onChange(handler: () => void): void;
}

export function newStrategyBoard(): StrategyBoard {
  const byType = new Map<string, ConciergeStrategy>();
  const handlers: (() => void)[] = [];
  return {
    set(strategy) {
      const old = byType.get(strategy.type);
      if (old && sameIgnoringTimes(old, strategy)) return;
      byType.set(strategy.type, strategy);
      for (const h of handlers) h();
    },
    list: () => [...byType.values()].sort((a, b) => a.type.localeCompare(b.type)),
    onChange: (handler) => void handlers.push(handler),
  };
}

/** The next list, reusing each previous entry (and so its lastUpdateTime) that is otherwise unchanged. */
function keepTimes<T extends { type: string }>(previous: readonly T[] | undefined, next: readonly T[]): T[] {
  return next.map((entry) => {
    const old = previous?.find((p) => p.type === entry.type);
    return old && sameIgnoringTimes(old, entry) ? old : entry;
  });
}

/** A strategy in the CredentialIssuer's shape, as Pinniped's CLI reads it. */
export function issuerStrategy(strategy: ConciergeStrategy): CredentialIssuerStrategy {
  const base = {
    status: strategy.status,
    reason: strategy.reason,
    message: strategy.message,
    lastUpdateTime: strategy.lastUpdateTime,
  };
  if (strategy.type === 'ImpersonationProxy') {
    return {
      type: 'ImpersonationProxy',
      ...base,
      ...(strategy.impersonationProxyConfig
        ? {
            frontend: {
              type: 'ImpersonationProxy',
              impersonationProxyInfo: { ...strategy.impersonationProxyConfig },
            },
          }
        : {}),
    };
  }
  return {
    type: 'CertificateSigningRequest',
    ...base,
    ...(strategy.tokenCredentialRequestConfig
      ? {
          frontend: {
            type: 'TokenCredentialRequestAPI',
            tokenCredentialRequestInfo: {
              server: strategy.tokenCredentialRequestConfig.endpoint,
              certificateAuthorityData: strategy.tokenCredentialRequestConfig.certificateAuthorityData,
            },
          },
        }
      : {}),
  };
}

export const CREDENTIAL_ISSUER_KEY = 'CredentialIssuer';

export interface StrategyPublisherDeps {
  strategies: () => readonly ConciergeStrategy[];
  jwtAuthenticators: Informer<JWTAuthenticator>;
  webhookAuthenticators: Informer<WebhookAuthenticator>;
  jwtStatus: StatusWriter<AuthenticatorStatus>;
  webhookStatus: StatusWriter<AuthenticatorStatus>;
  credentialIssuer: {
    name: string;
    informer: Informer<CredentialIssuer>;
    /** The settings in effect, mirrored into the spec. */
    spec: () => CredentialIssuerSpec;
    /** Creates the CredentialIssuer or sets its spec (a server-side apply). */
    applySpec: (spec: CredentialIssuerSpec) => Promise<void>;
    status: StatusWriter<CredentialIssuerStatus>;
  };
  log: Logger;
}

/** Writes only: the controller manager runs it on the leader, with leader-only writers. */
export function newStrategyPublisher(deps: StrategyPublisherDeps): Controller {
  const issuer = deps.credentialIssuer;
  const kinds = {
    JWTAuthenticator: { informer: deps.jwtAuthenticators, status: deps.jwtStatus },
    WebhookAuthenticator: { informer: deps.webhookAuthenticators, status: deps.webhookStatus },
  };
  return {
    name: 'strategy-publisher',
    initialKeys: [CREDENTIAL_ISSUER_KEY],
    watches: [
      { informer: deps.jwtAuthenticators, key: (o) => `JWTAuthenticator/${o.metadata?.name ?? ''}` },
      { informer: deps.webhookAuthenticators, key: (o) => `WebhookAuthenticator/${o.metadata?.name ?? ''}` },
      {
        informer: issuer.informer,
        filter: (o) => o.metadata?.name === issuer.name,
        key: () => CREDENTIAL_ISSUER_KEY,
      },
    ],
    // Nothing here is a user error: failed writes throw and retry with backoff.
    async sync(key: string): Promise<SyncResult> {
      const strategies = deps.strategies();
      if (key === CREDENTIAL_ISSUER_KEY) {
        const current = issuer.informer.get(issuer.name);
        const spec = issuer.spec();
        if (!current || !isDeepStrictEqual(current.spec, spec)) await issuer.applySpec(spec);
        if (strategies.length === 0) return;
        // The direct path first, as Pinniped lists its strategies: its CLI takes the first that works.
        const ordered = [...strategies].sort(
          (a, b) => Number(a.type === 'ImpersonationProxy') - Number(b.type === 'ImpersonationProxy'),
        );
        const wanted = keepTimes(current?.status?.strategies, ordered.map(issuerStrategy));
        if (!isDeepStrictEqual(current?.status?.strategies, wanted)) {
          await issuer.status.patchStatus(issuer.name, { strategies: wanted });
          deps.log.info({ name: issuer.name }, 'CredentialIssuer status written');
        }
        return;
      }
      const slash = key.indexOf('/');
      const kind = kinds[key.slice(0, slash) as keyof typeof kinds];
      const name = key.slice(slash + 1);
      const obj = kind.informer.get(name);
      // Deleted, or not yet strategies to tell (the proxy controller has not decided).
      if (!obj || strategies.length === 0) return;
      const wanted = keepTimes(obj.status?.conciergeStrategies, strategies);
      if (isDeepStrictEqual(obj.status?.conciergeStrategies, wanted)) return;
      await kind.status.patchStatus(name, { conciergeStrategies: wanted });
      deps.log.debug({ key }, 'strategies written');
    },
  };
}
