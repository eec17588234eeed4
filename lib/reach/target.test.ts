import { describe, expect, it } from '@jest/globals';
import { isReachPath, parseReach, reachAttributes, reachPath } from './target.ts';

const base = '/apis/reach.concierge.sealion.dev/v1alpha1/namespaces';

describe('reach paths', () => {
  it('reads back what reachPath writes, for Services and pods, by number and by name', () => {
    for (const target of [
      { namespace: 'demo', kind: 'services' as const, name: 'web', port: 80 },
      { namespace: 'demo', kind: 'services' as const, name: 'web', port: 'http' },
      { namespace: 'kube-system', kind: 'pods' as const, name: 'coredns-7f9c.x-1', port: 53 },
    ]) {
      const path = reachPath('sealion.dev', target);
      expect(isReachPath(path)).toBe(true);
      expect(parseReach(path)).toEqual(target);
    }
    // Another group suffix reads the same.
    expect(
      parseReach('/apis/reach.concierge.pinniped.dev/v1alpha1/namespaces/a/pods/b/connect?port=1'),
    ).toEqual({
      namespace: 'a',
      kind: 'pods',
      name: 'b',
      port: 1,
    });
  });

  it.each([
    ['no port', `${base}/demo/services/web/connect`, /exactly one port/],
    ['two ports', `${base}/demo/services/web/connect?port=1&port=2`, /exactly one port/],
    ['port 0', `${base}/demo/services/web/connect?port=0`, /between 1 and 65535/],
    ['port 65536', `${base}/demo/services/web/connect?port=65536`, /between 1 and 65535/],
    ['a port name with capitals', `${base}/demo/services/web/connect?port=HTTP`, /neither/],
    ['a port name of digits and hyphens', `${base}/demo/services/web/connect?port=1-2`, /neither/],
    ['an address for a port', `${base}/demo/services/web/connect?port=10.0.0.1:80`, /neither/],
    ['a Service name with a dot', `${base}/demo/services/a.b/connect?port=80`, /not a valid Service name/],
    ['an escaped slash in a name', `${base}/demo/pods/a%2Fb/connect?port=80`, /not a valid pod name/],
    ['a namespace with capitals', `${base}/Demo/pods/a/connect?port=80`, /not a valid namespace/],
    ['another kind', `${base}/demo/nodes/n1/connect?port=10250`, /a reach path is/],
    ['a longer path', `${base}/demo/pods/a/connect/x?port=80`, /a reach path is/],
    [
      'another version',
      '/apis/reach.concierge.sealion.dev/v1/namespaces/demo/pods/a/connect?port=80',
      /a reach path is/,
    ],
  ])('refuses %s', (_what, url, problem) => {
    expect(isReachPath(url)).toBe(true);
    const parsed = parseReach(url);
    expect('problem' in parsed && parsed.problem).toMatch(problem);
  });

  it('authorizes a Service as services/proxy and a pod as pods/portforward, both create', () => {
    expect(reachAttributes({ namespace: 'n', kind: 'services', name: 's', port: 80 })).toMatchObject({
      verb: 'create',
      group: '',
      resource: 'services',
      subresource: 'proxy',
      namespace: 'n',
      // As the API server's proxy to that port names it.
      name: 's:80',
    });
    expect(reachAttributes({ namespace: 'n', kind: 'pods', name: 'p', port: 80 })).toMatchObject({
      verb: 'create',
      resource: 'pods',
      subresource: 'portforward',
    });
  });
});
