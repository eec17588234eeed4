import { describe, expect, it } from '@jest/globals';
import { requestAttributes } from '../../lib/kube/request-info.ts';
import { loadPolicy, PolicyError } from './policy.ts';

const POLICY = `
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    users: [system:kube-proxy]
  - level: RequestResponse
    userGroups: [auditors]
    verbs: [create]
  - level: None
    nonResourceURLs: [/healthz*, /version]
  - level: Metadata
    resources: [{group: '', resources: [secrets, configmaps]}]
    omitStages: [ResponseStarted]
  - level: Request
    resources: [{group: '', resources: ['*/exec']}, {group: apps, resources: ['deployments/*']}]
  - level: Request
    namespaces: [kube-system]
  - level: Metadata
    resources: [{group: '*', resources: [leases], resourceNames: [mine]}]
  - level: None
    resources: [{group: coordination.k8s.io}]
  - level: Metadata
`;

const alice = { username: 'alice', groups: ['devs'] };

describe('an audit policy, evaluated as the API server does', () => {
  const policy = loadPolicy(POLICY);
  it.each([
    ['users', 'GET', '/api/v1/pods', { username: 'system:kube-proxy', groups: [] }, 'None'],
    [
      'userGroups and verbs',
      'POST',
      '/api/v1/namespaces/a/pods',
      { username: 'bob', groups: ['auditors'] },
      'RequestResponse',
    ],
    [
      'the same group, another verb',
      'GET',
      '/api/v1/namespaces/a/pods',
      { username: 'bob', groups: ['auditors'] },
      'Metadata',
    ],
    ['a non-resource URL with a trailing *', 'GET', '/healthz/etcd', alice, 'None'],
    ['an exact non-resource URL', 'GET', '/version', alice, 'None'],
    ['a resource, by group', 'GET', '/api/v1/namespaces/a/secrets/s', alice, 'Metadata'],
    ['*/subresource', 'POST', '/api/v1/namespaces/a/pods/p/exec', alice, 'Request'],
    ['resource/*', 'PUT', '/apis/apps/v1/namespaces/a/deployments/d/scale', alice, 'Request'],
    [
      'resource/* matches the resource itself too (the API server compares the name before /* only)',
      'GET',
      '/apis/apps/v1/namespaces/a/deployments/d',
      alice,
      'Request',
    ],
    ['namespaces', 'GET', '/api/v1/namespaces/kube-system/pods', alice, 'Request'],
    [
      'group * with resourceNames',
      'GET',
      '/apis/coordination.k8s.io/v1/namespaces/a/leases/mine',
      alice,
      'Metadata',
    ],
    [
      'a group with no resources',
      'GET',
      '/apis/coordination.k8s.io/v1/namespaces/a/leases/other',
      alice,
      'None',
    ],
    [
      'nobody authenticated: user rules do not match',
      'POST',
      '/api/v1/namespaces/a/pods',
      undefined,
      'Metadata',
    ],
  ])('%s', (_what, method, url, user, level) => {
    expect(policy.evaluate(requestAttributes(method, url), user).level).toBe(level);
  });

  it("unions the policy's omitted stages with the rule's", () => {
    const config = policy.evaluate(requestAttributes('GET', '/api/v1/namespaces/a/secrets'), alice);
    expect([...config.omitStages].sort()).toEqual(['RequestReceived', 'ResponseStarted']);
  });

  it('audits nothing when no rule matches', () => {
    const none = loadPolicy('apiVersion: audit.k8s.io/v1\nkind: Policy\nrules: [{level: None}]\n');
    expect(none.auditsAnything).toBe(false);
    expect(none.evaluate(requestAttributes('GET', '/api'), alice).level).toBe('None');
  });

  it.each([
    ['an unknown field', 'rules: [{level: Metadata, user: [a]}]'],
    ['an unknown level', 'rules: [{level: Everything}]'],
    [
      'resources and non-resource URLs in one rule',
      'rules: [{level: Metadata, resources: [{group: ""}], nonResourceURLs: [/x]}]',
    ],
    ['a * before the end of a URL', 'rules: [{level: Metadata, nonResourceURLs: ["/a*/b"]}]'],
    ['a URL without its slash', 'rules: [{level: Metadata, nonResourceURLs: [healthz]}]'],
    ['not YAML', 'rules: [level: ['],
  ])('refuses %s, naming it', (_what, rules) => {
    expect(() => loadPolicy(`apiVersion: audit.k8s.io/v1\nkind: Policy\n${rules}\n`)).toThrow(PolicyError);
  });
});
