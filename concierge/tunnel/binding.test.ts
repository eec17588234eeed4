import { describe, expect, it } from '@jest/globals';
import type { Cluster } from '../../apis/tunnel.ts';
import { bindingURI, parseBindingURI } from '../../apis/agent-binding.ts';
import { bindingProblem, currentBinding } from './binding.ts';

const UID = '0b6f9d3e-8a51-4c2e-9f0d-6a7b1c2d3e4f';
const cluster = (uid: string, agentGeneration?: number): Cluster => ({
  apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
  kind: 'Cluster',
  metadata: { name: 'edge-1', uid },
  spec: agentGeneration === undefined ? {} : { agentGeneration },
});

describe('agent bindings', () => {
  it('round-trips through the URI, generation 0 when the Cluster names none', () => {
    const binding = currentBinding(cluster(UID));
    expect(binding).toEqual({ cluster: 'edge-1', uid: UID, generation: 0 });
    expect(bindingURI(binding)).toBe(`urn:sealion:cluster:edge-1:${UID}:0`);
    expect(parseBindingURI(bindingURI({ ...binding, generation: 7 }))).toEqual({ ...binding, generation: 7 });
  });

  it.each([
    ['another scheme', `urn:other:cluster:edge-1:${UID}:0`],
    ['a part too many', `urn:sealion:cluster:edge-1:${UID}:0:1`],
    ['a part missing', `urn:sealion:cluster:edge-1:${UID}`],
    ['a name that is no DNS label', `urn:sealion:cluster:Edge_1:${UID}:0`],
    ['an empty name', `urn:sealion:cluster::${UID}:0`],
    ['a uid that is no UUID', 'urn:sealion:cluster:edge-1:not-a-uid:0'],
    ['a leading zero', `urn:sealion:cluster:edge-1:${UID}:01`],
    ['a negative generation', `urn:sealion:cluster:edge-1:${UID}:-1`],
    ['a generation past the CRD maximum', `urn:sealion:cluster:edge-1:${UID}:2147483648`],
  ])('rejects a URI with %s', (_why, uri) => {
    expect(parseBindingURI(uri)).toBeUndefined();
  });

  it('refuses to build a URI from parts that would not split back', () => {
    expect(() => bindingURI({ cluster: 'a:b', uid: UID, generation: 0 })).toThrow();
    expect(() => currentBinding(cluster('x:y'))).toThrow();
  });

  it('holds only against the same Cluster object at the same generation', () => {
    const binding = { cluster: 'edge-1', uid: UID, generation: 1 };
    expect(bindingProblem(binding, cluster(UID, 1))).toBeUndefined();
    expect(bindingProblem(binding, cluster(UID, 2))).toContain('revoked');
    expect(bindingProblem(binding, cluster('1b6f9d3e-8a51-4c2e-9f0d-6a7b1c2d3e4f', 1))).toContain('earlier');
    expect(bindingProblem(binding, undefined)).toContain('not in the registry');
  });
});
