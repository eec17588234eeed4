import { describe, expect, it } from '@jest/globals';
import { newControllerManager } from '../lib/controller/manager.ts';
import { fakeClock } from '../test-support/fake-clock.ts';
import { MemoryInformer } from '../lib/kube/informer.ts';
import { silentLogger } from '../lib/log.ts';
import type { ServiceLike } from './impersonation-proxy.ts';
import { newTunnelHostsController, TUNNEL_HOSTS_KEY } from './tunnel-hosts.ts';

const never = new AbortController().signal;

const service = (name: string, ingress?: { ip?: string; hostname?: string }[]): ServiceLike => ({
  metadata: { name, namespace: 'ns' },
  ...(ingress ? { status: { loadBalancer: { ingress } } } : {}),
});

function world(services: ServiceLike[], fail = 0) {
  const informer = new MemoryInformer<ServiceLike>(services);
  const issued: string[][] = [];
  let failures = fail;
  const controller = newTunnelHostsController({
    services: informer,
    namespace: 'ns',
    service: 'tunnel',
    configured: ['tunnel.example.com'],
    listener: () => ({
      setHosts: (hosts: string[]) => {
        if (failures-- > 0) return Promise.reject(new Error('cannot issue'));
        issued.push(hosts);
        return Promise.resolve();
      },
    }),
  });
  return { informer, issued, controller };
}

const settle = async (): Promise<void> => {
  for (let i = 0; i < 10; i++) await new Promise((done) => setImmediate(done));
};

describe('the tunnel host follower', () => {
  it.each([
    ['no Service yet', [], []],
    ['a Service with no address yet', [service('tunnel')], []],
    ['another Service’s address', [service('other', [{ ip: '10.0.0.8' }])], []],
    [
      'the addresses a load balancer gave',
      [service('tunnel', [{ ip: '10.0.0.9' }, { hostname: 'lb.example.com' }])],
      [['tunnel.example.com', '10.0.0.9', 'lb.example.com']],
    ],
  ])('with %s, reissues for %j', async (_case, services, wanted) => {
    const w = world(services);
    expect(await w.controller.sync(TUNNEL_HOSTS_KEY, never)).toBeUndefined();
    expect(w.issued).toEqual(wanted);
    // Level-triggered: the same state again issues nothing.
    await w.controller.sync(TUNNEL_HOSTS_KEY, never);
    expect(w.issued).toEqual(wanted);
  });

  it('follows the Service’s addresses as they change, retrying a certificate that could not be issued', async () => {
    const clock = fakeClock();
    const w = world([service('tunnel')], 1);
    const manager = newControllerManager({ log: silentLogger(), clock });
    manager.add({ controller: w.controller, runs: 'every-replica' });
    await manager.start();
    await settle();
    expect(w.issued).toEqual([]);

    w.informer.put(service('tunnel', [{ ip: '10.0.0.9' }]));
    await settle();
    // The first try failed: the retry issues it.
    expect(w.issued).toEqual([]);
    clock.advance(1000);
    await settle();
    expect(w.issued).toEqual([['tunnel.example.com', '10.0.0.9']]);

    w.informer.put(service('tunnel', []));
    await settle();
    expect(w.issued.at(-1)).toEqual(['tunnel.example.com']);
    await manager.stop();
  });
});
