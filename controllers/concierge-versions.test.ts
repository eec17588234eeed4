import { describe, expect, it } from '@jest/globals';
import { CONCIERGE_VERSIONS_CONFIG_MAP } from '../apis/install.ts';
import { fakeClock } from '../test-support/fake-clock.ts';
import { MemoryInformer } from '../lib/kube/informer.ts';
import { silentLogger } from '../lib/log.ts';
import {
  CHECK_MS,
  CONCIERGE_VERSIONS,
  newConciergeVersionsPublisher,
  REFRESH_MS,
  summarizeVersions,
} from './concierge-versions.ts';
import type { ConfigMapLike } from './direct-login.ts';

const NS = 'sealion-concierge';
/** A time on the fake clock, as the ConfigMap says it. */
const AT = (ms: number): string => new Date(ms).toISOString();

const published = (data: Record<string, string>): ConfigMapLike => ({
  metadata: { name: CONCIERGE_VERSIONS_CONFIG_MAP, namespace: NS },
  data,
});

describe('summarizeVersions', () => {
  it.each([
    { replicas: [], want: [] },
    { replicas: ['0.1.0', '0.1.0'], want: [{ version: '0.1.0', replicas: 2 }] },
    {
      // A rolling upgrade: both show, the one most replicas run first.
      replicas: ['0.1.0', '0.2.0', '0.2.0'],
      want: [
        { version: '0.2.0', replicas: 2 },
        { version: '0.1.0', replicas: 1 },
      ],
    },
    {
      // A replica older than the annotation says nothing, and counts as such.
      replicas: ['', '0.2.0'],
      want: [
        { version: '', replicas: 1 },
        { version: '0.2.0', replicas: 1 },
      ],
    },
  ])('$replicas', ({ replicas, want }) => {
    expect(summarizeVersions(replicas.map((version) => ({ version })))).toEqual(want);
  });

  it('counts a version apart for each tunnel protocol its replicas say they serve', () => {
    expect(
      summarizeVersions([
        { version: '0.2.0', tunnelProtocol: '2.2' },
        { version: '0.1.0', tunnelProtocol: '2.1' },
        { version: '0.2.0', tunnelProtocol: '2.2' },
        { version: '0.1.0' },
      ]),
    ).toEqual([
      { version: '0.2.0', replicas: 2, tunnelProtocol: '2.2' },
      { version: '0.1.0', replicas: 1 },
      { version: '0.1.0', replicas: 1, tunnelProtocol: '2.1' },
    ]);
  });
});

describe('the concierge versions publisher', () => {
  const ONE = JSON.stringify([{ version: '0.1.0', replicas: 1 }]);
  it.each([
    {
      name: 'publishes when nothing is published',
      current: undefined,
      now: 5_000,
      live: ['0.1.0'],
      want: { versions: ONE, observedAt: AT(5_000) },
    },
    {
      name: 'writes nothing while the list is the same and was confirmed lately',
      current: { versions: ONE, observedAt: AT(0) },
      now: REFRESH_MS - 1,
      live: ['0.1.0'],
      want: undefined,
    },
    {
      name: 'confirms an unchanged list once it is REFRESH_MS old',
      current: { versions: ONE, observedAt: AT(0) },
      now: REFRESH_MS,
      live: ['0.1.0'],
      want: { versions: ONE, observedAt: AT(REFRESH_MS) },
    },
    {
      name: 'writes a new list at once',
      current: { versions: ONE, observedAt: AT(0) },
      now: 1_000,
      live: ['0.1.0', '0.2.0'],
      want: {
        versions: JSON.stringify([
          { version: '0.1.0', replicas: 1 },
          { version: '0.2.0', replicas: 1 },
        ]),
        observedAt: AT(1_000),
      },
    },
    {
      name: 'rewrites a time it cannot read',
      current: { versions: ONE, observedAt: 'yesterday' },
      now: 1_000,
      live: ['0.1.0'],
      want: { versions: ONE, observedAt: AT(1_000) },
    },
    {
      name: 'leaves the list alone when it knows no live replica (it is stopping)',
      current: { versions: ONE, observedAt: AT(0) },
      now: 2 * REFRESH_MS,
      live: [],
      want: undefined,
    },
  ])('$name', async ({ current, now, live, want }) => {
    const clock = fakeClock();
    clock.advance(now);
    const writes: Record<string, string>[] = [];
    const controller = newConciergeVersionsPublisher({
      replicas: () => live.map((version, i) => ({ replica: `r${i}`, version })),
      configMaps: new MemoryInformer<ConfigMapLike>(current ? [published(current)] : []),
      namespace: NS,
      publish: (data) => (writes.push(data), Promise.resolve()),
      clock,
      log: silentLogger(),
    });
    // Looked at again within seconds: a Lease that lapses makes no event.
    expect(await controller.sync(CONCIERGE_VERSIONS, new AbortController().signal)).toEqual({
      requeueAfterMs: CHECK_MS,
    });
    expect(writes).toEqual(want ? [want] : []);
  });

  it('is woken by its own ConfigMap only', () => {
    const controller = newConciergeVersionsPublisher({
      replicas: () => [],
      configMaps: new MemoryInformer<ConfigMapLike>(),
      namespace: NS,
      publish: () => Promise.resolve(),
      clock: fakeClock(),
      log: silentLogger(),
    });
    const [watch] = controller.watches;
    expect(watch!.filter!(published({}))).toBe(true);
    expect(watch!.filter!({ metadata: { name: 'sealion-concierge-config', namespace: NS } })).toBe(false);
  });
});
