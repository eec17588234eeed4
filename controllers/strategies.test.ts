import { describe, expect, it } from '@jest/globals';
import type {
  AuthenticatorStatus,
  ConciergeStrategy,
  JWTAuthenticator,
  WebhookAuthenticator,
} from '../apis/authentication.ts';
import type { CredentialIssuer, CredentialIssuerSpec, CredentialIssuerStatus } from '../apis/config.ts';
import { MemoryInformer } from '../lib/kube/informer.ts';
import { silentLogger } from '../lib/log.ts';
import { RecordingStatusWriter } from '../lib/kube/status-writer.ts';
import { CREDENTIAL_ISSUER_KEY, newStrategyBoard, newStrategyPublisher } from './strategies.ts';

/** A signal that never aborts, for syncs called directly. */
const never = new AbortController().signal;

const T1 = '2026-01-01T00:00:00.000Z';
const T2 = '2026-01-01T00:05:00.000Z';
const listening = (time: string, endpoint = 'https://10.0.0.1'): ConciergeStrategy => ({
  type: 'ImpersonationProxy',
  status: 'Success',
  reason: 'Listening',
  message: `serving at ${endpoint}`,
  lastUpdateTime: time,
  impersonationProxyConfig: { endpoint, certificateAuthorityData: 'Q0E=' },
});

function jwt(name: string, status?: AuthenticatorStatus): JWTAuthenticator {
  return {
    apiVersion: 'authentication.concierge.sealion.dev/v1alpha1',
    kind: 'JWTAuthenticator',
    metadata: { name },
    spec: { issuer: 'https://issuer.example.com', audience: 'a' },
    ...(status ? { status } : {}),
  };
}

function world(opts: { authenticators?: JWTAuthenticator[] } = {}) {
  const board = newStrategyBoard();
  const jwtInformer = new MemoryInformer<JWTAuthenticator>(opts.authenticators ?? []);
  const issuers = new MemoryInformer<CredentialIssuer>();
  const jwtStatus = new RecordingStatusWriter<AuthenticatorStatus>();
  const issuerStatus = new RecordingStatusWriter<CredentialIssuerStatus>();
  const specs: CredentialIssuerSpec[] = [];
  const spec: CredentialIssuerSpec = { impersonationProxy: { mode: 'auto' } };
  const controller = newStrategyPublisher({
    strategies: () => board.list(),
    jwtAuthenticators: jwtInformer,
    webhookAuthenticators: new MemoryInformer<WebhookAuthenticator>(),
    jwtStatus,
    webhookStatus: new RecordingStatusWriter<AuthenticatorStatus>(),
    credentialIssuer: {
      name: 'sealion-concierge-config',
      informer: issuers,
      spec: () => spec,
      applySpec: (s) => {
        specs.push(s);
        return Promise.resolve();
      },
      status: issuerStatus,
    },
    log: silentLogger(),
  });
  return { board, jwtInformer, issuers, jwtStatus, issuerStatus, specs, controller };
}

describe('strategy publisher', () => {
  it('writes the strategies onto an authenticator, then nothing while only the time changes', async () => {
    const w = world({ authenticators: [jwt('corp')] });
    w.board.set(listening(T1));
    await w.controller.sync('JWTAuthenticator/corp', never);
    expect(w.jwtStatus.writes).toEqual([{ name: 'corp', status: { conciergeStrategies: [listening(T1)] } }]);

    w.jwtInformer.put(jwt('corp', { conciergeStrategies: [listening(T1)] }));
    w.board.set(listening(T2));
    await w.controller.sync('JWTAuthenticator/corp', never);
    expect(w.jwtStatus.writes).toHaveLength(1);

    w.board.set(listening(T2, 'https://10.0.0.2'));
    await w.controller.sync('JWTAuthenticator/corp', never);
    expect(w.jwtStatus.writes.at(-1)?.status.conciergeStrategies).toEqual([
      listening(T2, 'https://10.0.0.2'),
    ]);
  });

  it('creates the CredentialIssuer and mirrors the strategies in Pinniped’s shape, the direct path first', async () => {
    const w = world();
    w.board.set(listening(T1));
    w.board.set({
      type: 'TokenCredentialRequestAPI',
      status: 'Success',
      reason: 'ClusterSigns',
      message: 'signs',
      lastUpdateTime: T1,
      tokenCredentialRequestConfig: {
        endpoint: 'https://api.example.com:6443',
        certificateAuthorityData: 'S0E=',
      },
    });
    await w.controller.sync(CREDENTIAL_ISSUER_KEY, never);
    expect(w.specs).toEqual([{ impersonationProxy: { mode: 'auto' } }]);
    expect(w.issuerStatus.writes[0]?.status.strategies).toEqual([
      {
        type: 'CertificateSigningRequest',
        status: 'Success',
        reason: 'ClusterSigns',
        message: 'signs',
        lastUpdateTime: T1,
        frontend: {
          type: 'TokenCredentialRequestAPI',
          tokenCredentialRequestInfo: {
            server: 'https://api.example.com:6443',
            certificateAuthorityData: 'S0E=',
          },
        },
      },
      {
        type: 'ImpersonationProxy',
        status: 'Success',
        reason: 'Listening',
        message: 'serving at https://10.0.0.1',
        lastUpdateTime: T1,
        frontend: {
          type: 'ImpersonationProxy',
          impersonationProxyInfo: { endpoint: 'https://10.0.0.1', certificateAuthorityData: 'Q0E=' },
        },
      },
    ]);
  });
});
