import { describe, expect, it } from '@jest/globals';
import { checkedTargetObject, type CheckedTarget } from './port-forward-check.ts';

const pod: CheckedTarget = {
  cluster: 'edge',
  namespace: 'team',
  resource: 'pods',
  name: 'db-0',
  label: 'edge',
};
const service: CheckedTarget = { cluster: '', namespace: 'team', resource: 'services', name: 'web' };
const CHECK = "check that the kubeconfig's server is a Kubernetes API server";

describe('checkedTargetObject', () => {
  it('takes a pod or service as the API server gives it', () => {
    const running = {
      spec: { containers: [{ ports: [{ name: 'pg', containerPort: 5432, protocol: 'TCP' }] }, {}] },
      status: { phase: 'Running' },
    };
    expect(checkedTargetObject(running, pod)).toBe(running);
    const web = { spec: { type: 'ClusterIP', ports: [{ name: 'http', port: 80 }] } };
    expect(checkedTargetObject(web, service)).toBe(web);
  });

  it.each([
    [pod, null, 'not an object'],
    [pod, { status: { phase: 3 } }, 'its status.phase is not a string'],
    [pod, { status: 'Running' }, 'its status is not an object'],
    [
      pod,
      { spec: { containers: [null] } },
      'its spec.containers is not a list of containers with lists of ports',
    ],
    [
      pod,
      { spec: { containers: [{ ports: {} }] } },
      'its spec.containers is not a list of containers with lists of ports',
    ],
    [service, { spec: { ports: { http: 80 } } }, 'its spec.ports is not a list of ports'],
    [service, { spec: { ports: [null] } }, 'its spec.ports is not a list of ports'],
    [service, { spec: { ports: [{ port: '80' }] } }, 'its spec.ports is not a list of ports'],
    [service, { spec: [] }, 'its spec is not an object'],
  ])('refuses a malformed answer for %j: %j', (target, answer, what) => {
    const where = target === pod ? 'pod team/db-0 on cluster edge' : 'service team/web';
    const kind = target === pod ? 'pod' : 'service';
    expect(() => checkedTargetObject(answer, target)).toThrow(
      `cannot read ${where}: the server's answer is not a ${kind} (${what}); ${CHECK}`,
    );
  });
});
