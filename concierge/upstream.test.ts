import { afterEach, describe, expect, it } from '@jest/globals';
import { newControllerManager, type ControllerManager } from '../lib/controller/manager.ts';
import { loadKubeConfig, type KubeClients } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { fakeClock, type FakeClock } from '../test-support/fake-clock.ts';
import { forwardingUpstream } from './upstream.ts';

const KUBECONFIG = `apiVersion: v1
kind: Config
clusters: [{ name: c, cluster: { server: 'https://127.0.0.1:6443' } }]
users: [{ name: u, user: {} }]
contexts: [{ name: x, context: { cluster: c, user: u } }]
current-context: x
`;

/** Clients whose TokenRequests answer token-1, token-2, … (an hour each), or fail while `failing` is set. */
function tokenClients(clock: FakeClock): {
  clients: KubeClients;
  requests: () => number;
  fail(on: boolean): void;
} {
  let requests = 0;
  let failing = false;
  const core = {
    createNamespacedServiceAccountToken: () => {
      requests++;
      if (failing) return Promise.reject(new Error('the API server is away'));
      return Promise.resolve({
        status: { token: `token-${requests}`, expirationTimestamp: new Date(clock.now() + 3_600_000) },
      });
    },
  };
  return {
    clients: { config: loadKubeConfig({ yaml: KUBECONFIG }), core } as unknown as KubeClients,
    requests: () => requests,
    fail: (on) => void (failing = on),
  };
}

describe('the forwarding token', () => {
  let manager: ControllerManager | undefined;
  afterEach(async () => {
    await manager?.stop();
  });

  it('is in hand before the start goes on, then renewed by the manager at 80% of its life, and kept when renewal fails', async () => {
    const clock = fakeClock();
    const { clients, requests, fail } = tokenClients(clock);
    const forwarding = await forwardingUpstream(
      clients,
      { serviceAccount: 'impersonator' },
      'sealion',
      clock,
      silentLogger(),
    );
    const token = (): string | undefined => forwarding.upstream.credentials.token?.();
    expect(token()).toBe('token-1');
    // No resync within the test: the fake clock fires every timer due in one advance at its end, so that the manager's
    // resyncs would all land at the renewal's own time.
    manager = newControllerManager({ log: silentLogger(), clock, resyncMs: 24 * 3_600_000 });
    manager.run(forwarding.renewal!);
    await manager.start();
    const renewal = forwarding.renewal!.name;
    await manager.idle(renewal);
    // The first turn finds the token fresh: no second request.
    expect(requests()).toBe(1);

    clock.advance(2_880_000);
    await manager.idle(renewal);
    expect(token()).toBe('token-2');

    fail(true);
    clock.advance(2_880_000);
    await manager.idle(renewal);
    expect(requests()).toBe(3);
    expect(token()).toBe('token-2');
    fail(false);
    clock.advance(10_000);
    await manager.idle(renewal);
    expect(token()).toBe('token-4');
  });

  it('fails the start when the first token cannot be had', async () => {
    const clock = fakeClock();
    const { clients, fail } = tokenClients(clock);
    fail(true);
    await expect(
      forwardingUpstream(clients, { serviceAccount: 'impersonator' }, 'sealion', clock, silentLogger()),
    ).rejects.toThrow('the API server is away');
  });
});
