import { describe, expect, it } from '@jest/globals';
import { CONFIG_KEY } from '../apis/install.ts';
import type { AccessRequestsSpec } from '../apis/config.ts';
import { systemClock } from '../lib/clock.ts';
import { MemoryInformer, type Informer, type KubeObject } from '../lib/kube/informer.ts';
import type { KubeClients, KubeInformers } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { loadConfig } from './config.ts';
import { conciergeControllers, configFromIssuerSpec, issuerSpec, newAuthenticators } from './controllers.ts';

describe('the settings kept on the CredentialIssuer', () => {
  it('give back the configuration they were written from', () => {
    const config = loadConfig(`
impersonationProxy:
  mode: enabled
  endpoint: proxy.example.com:8443
  service: {type: ClusterIP, annotations: {a.example.com/b: c}}
  tls: {secretName: my-tls}
kubeCertAgent: {mode: disabled}
`);
    expect(configFromIssuerSpec(issuerSpec(config))).toEqual(config);
    expect(configFromIssuerSpec(issuerSpec(loadConfig('')))).toEqual(loadConfig(''));
  });

  it('are checked as an edit of the ConfigMap would be', () => {
    expect(configFromIssuerSpec(undefined)).toBeUndefined();
    expect(configFromIssuerSpec({})).toBeUndefined();
    const spec = issuerSpec(loadConfig('impersonationProxy: {mode: enabled}'));
    expect(
      configFromIssuerSpec({
        ...spec,
        impersonationProxy: { ...spec.impersonationProxy!, mode: 'sometimes' as never },
      }),
    ).toBeUndefined();
    expect(
      configFromIssuerSpec({
        ...spec,
        impersonationProxy: { ...spec.impersonationProxy!, externalEndpoint: 'http://plain.example.com' },
      }),
    ).toBeUndefined();
  });

  it('written by a concierge that kept fewer of them, leave the rest at their defaults', () => {
    expect(configFromIssuerSpec({ impersonationProxy: { mode: 'disabled' } })).toEqual(
      loadConfig('impersonationProxy: {mode: disabled}'),
    );
  });
});

describe('the proxy’s controllers', () => {
  it('publish the access settings of the config in effect before any controller runs, so before the proxy serves', async () => {
    const informers = new Map<string, MemoryInformer<KubeObject>>();
    const informer = (key: string) => {
      let made = informers.get(key);
      if (!made) informers.set(key, (made = new MemoryInformer<KubeObject>()));
      return made;
    };
    informer('configmaps/sealion').put({
      metadata: { name: 'sealion-concierge-config', namespace: 'sealion' },
      data: { [CONFIG_KEY]: 'accessRequests: {hubName: main, hub: {groups: [oncall], requireReason: true}}' },
    } as KubeObject);
    const published: AccessRequestsSpec[] = [];
    const hubNames: string[] = [];
    const kubeInformers: KubeInformers = {
      core: <T extends KubeObject>(collection: string, namespace: string) =>
        informer(`${collection}/${namespace}`) as unknown as Informer<T>,
      customResource: <T extends KubeObject>(r: { plural: string }) =>
        informer(r.plural) as unknown as Informer<T>,
      leases: () => informer('leases'),
      stop: () => Promise.resolve(),
    };
    await conciergeControllers({
      manager: { leaderOnly: (w) => w, enqueue: () => {}, resync: () => {} },
      clients: {} as KubeClients,
      informers: kubeInformers,
      groupSuffix: 'sealion.dev',
      authenticators: newAuthenticators(kubeInformers, 'sealion.dev'),
      proxy: {
        namespace: 'sealion',
        configMap: 'sealion-concierge-config',
        serve: () => {},
        hubName: (name) => hubNames.push(name),
        accessRequests: (settings) => published.push(settings),
      },
      clock: systemClock,
      log: silentLogger(),
    });
    // No controller has run (the manager was never started): what is published came with the controllers' making.
    expect(published).toEqual([
      { hubName: 'main', hub: expect.objectContaining({ groups: ['oncall'], requireReason: true }) },
    ]);
    expect(hubNames).toHaveLength(1);
  });
});
