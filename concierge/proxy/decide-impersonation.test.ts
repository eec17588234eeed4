import { describe, expect, it } from '@jest/globals';
import type { AccessQuestion } from '../../lib/kube/access-review.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Ask, RequestedImpersonation } from '../../lib/kube/impersonation.ts';
import { decideImpersonation } from './decide-impersonation.ts';
import { impersonationHeaders } from './impersonate.ts';
import { requestAttributes } from '../../lib/kube/request-info.ts';

/** A rule as RBAC matches one: verbs, group, resources (all, exact, or a subresource of any), names, namespace. */
interface Rule {
  verbs: string[];
  group?: string;
  resources?: string[];
  names?: string[];
  namespace?: string;
  paths?: string[];
}

/** An authorizer that matches rules the way RBAC does, enough for these cases; it records what was asked. */
function rbac(rules: Rule[]): Ask & { asked: AccessQuestion[] } {
  const asked: AccessQuestion[] = [];
  const matches = (r: Rule, q: AccessQuestion): boolean => {
    if (!r.verbs.includes(q.verb) && !r.verbs.includes('*')) return false;
    if (q.path !== undefined) return (r.paths ?? []).some((p) => p === '*' || p === q.path);
    if (r.paths) return false;
    if (r.group !== undefined && r.group !== '*' && r.group !== (q.group ?? '')) return false;
    const combined = q.subresource ? `${q.resource}/${q.subresource}` : q.resource;
    const resourceOk = (r.resources ?? ['*']).some(
      (x) => x === '*' || x === combined || (q.subresource !== undefined && x === `*/${q.subresource}`),
    );
    if (!resourceOk) return false;
    if (r.names && !r.names.includes(q.name ?? '')) return false;
    if (r.namespace !== undefined && r.namespace !== q.namespace) return false;
    return true;
  };
  const ask = ((q: AccessQuestion) => {
    asked.push(q);
    return Promise.resolve(rules.some((r) => matches(r, q)));
  }) as Ask & { asked: AccessQuestion[] };
  ask.asked = asked;
  return ask;
}

const caller: UserInfo = { username: 'pat', groups: ['devs'], extra: {} };
const listConfigMaps = requestAttributes('GET', '/api/v1/namespaces/team/configmaps');
const want = (user: string, more: Partial<RequestedImpersonation> = {}): RequestedImpersonation => ({
  user,
  groups: [],
  extra: {},
  ...more,
});
const AUTHN = 'authentication.k8s.io';

describe('decideImpersonation', () => {
  it('allows user-info for the one verb granted with impersonate-on, and says so', async () => {
    const ask = rbac([
      { verbs: ['impersonate:user-info'], group: AUTHN, resources: ['users'], names: ['bob'] },
      { verbs: ['impersonate-on:user-info:list'], group: '', resources: ['configmaps'] },
    ]);
    const allowed = await decideImpersonation(caller, want('bob'), listConfigMaps, ask);
    expect(allowed).toEqual({
      allowed: true,
      identity: {
        user: { username: 'bob', groups: ['system:authenticated'], extra: {} },
        mode: 'user-info',
        usernameOnly: false,
      },
    });
    const create = requestAttributes('POST', '/api/v1/namespaces/team/configmaps');
    const refused = await decideImpersonation(caller, want('bob'), create, ask);
    expect(refused).toEqual({
      allowed: false,
      status: 403,
      message:
        'configmaps is forbidden: User "pat" cannot impersonate-on:user-info:create resource "configmaps" in API group "" in the namespace "team"',
    });
  });

  it('asks the subject as the API server sees it, with system:authenticated', async () => {
    const ask = rbac([]);
    await decideImpersonation(caller, want('bob'), listConfigMaps, ask);
    expect(ask.asked.every((q) => q.user === 'pat' && q.groups.includes('system:authenticated'))).toBe(true);
  });

  it('never lets user-info impersonate system:masters, though legacy can', async () => {
    const everything = [{ verbs: ['*'], group: '*', resources: ['*'] }];
    const masters = want('bob', { groups: ['system:masters'] });
    const constrainedOnly = rbac([
      { verbs: ['impersonate:user-info', 'impersonate-on:user-info:list'], group: '*', resources: ['*'] },
    ]);
    const refused = await decideImpersonation(caller, masters, listConfigMaps, constrainedOnly);
    expect(refused).toMatchObject({ allowed: false, status: 403 });
    expect(!refused.allowed && refused.message).toContain(
      'impersonating the system:masters group is not allowed',
    );
    const legacy = await decideImpersonation(caller, masters, listConfigMaps, rbac(everything));
    expect(legacy).toMatchObject({ allowed: true, identity: { mode: 'legacy' } });
  });

  it('impersonates service accounts and nodes by username alone, with the groups their names give', async () => {
    const ask = rbac([
      {
        verbs: ['impersonate:serviceaccount'],
        group: AUTHN,
        resources: ['serviceaccounts'],
        namespace: 'team',
      },
      { verbs: ['impersonate:arbitrary-node'], group: AUTHN, resources: ['nodes'] },
      {
        verbs: ['impersonate-on:serviceaccount:list', 'impersonate-on:arbitrary-node:list'],
        resources: ['*'],
      },
    ]);
    const sa = await decideImpersonation(
      caller,
      want('system:serviceaccount:team:robot'),
      listConfigMaps,
      ask,
    );
    expect(sa).toEqual({
      allowed: true,
      identity: {
        user: {
          username: 'system:serviceaccount:team:robot',
          groups: ['system:serviceaccounts', 'system:serviceaccounts:team', 'system:authenticated'],
          extra: {},
        },
        mode: 'serviceaccount',
        usernameOnly: true,
      },
    });
    const node = await decideImpersonation(caller, want('system:node:n1'), listConfigMaps, ask);
    expect(node).toMatchObject({
      allowed: true,
      identity: { user: { groups: ['system:nodes', 'system:authenticated'] }, mode: 'arbitrary-node' },
    });
    // A service account of another namespace, or one with a group: neither mode applies.
    const other = await decideImpersonation(
      caller,
      want('system:serviceaccount:ops:robot'),
      listConfigMaps,
      ask,
    );
    expect(other).toMatchObject({ allowed: false, status: 403 });
    const withGroup = want('system:serviceaccount:team:robot', { groups: ['x'] });
    expect(await decideImpersonation(caller, withGroup, listConfigMaps, ask)).toMatchObject({
      allowed: false,
    });
  });

  it('refuses user-info for service accounts and nodes even with every user-info grant', async () => {
    const ask = rbac([
      { verbs: ['impersonate:user-info', 'impersonate-on:user-info:list'], group: '*', resources: ['*'] },
    ]);
    for (const name of ['system:serviceaccount:team:robot', 'system:node:n1']) {
      expect(await decideImpersonation(caller, want(name), listConfigMaps, ask)).toMatchObject({
        allowed: false,
        status: 403,
      });
    }
  });

  it('checks legacy grants on users, groups, uids and extra, in the core group and authentication.k8s.io', async () => {
    const ask = rbac([
      { verbs: ['impersonate'], group: '', resources: ['users', 'groups'] },
      { verbs: ['impersonate'], group: AUTHN, resources: ['uids', 'userextras/scopes'] },
    ]);
    const wanted = want('bob', { uid: '42', groups: ['ops'], extra: { scopes: ['read'] } });
    expect(await decideImpersonation(caller, wanted, listConfigMaps, ask)).toEqual({
      allowed: true,
      identity: {
        user: {
          username: 'bob',
          uid: '42',
          groups: ['ops', 'system:authenticated'],
          extra: { scopes: ['read'] },
        },
        mode: 'legacy',
        usernameOnly: false,
      },
    });
    const other = want('bob', { extra: { team: ['x'] } });
    const refused = await decideImpersonation(caller, other, listConfigMaps, ask);
    // The first refusal in the API server's order is user-info's, which applies and was not granted.
    expect(!refused.allowed && refused.message).toContain('cannot impersonate-on:user-info:list');
    expect(ask.asked).toContainEqual(
      expect.objectContaining({
        verb: 'impersonate',
        resource: 'userextras',
        subresource: 'team',
        name: 'x',
      }),
    );
  });

  it('refuses malformed extra keys in constrained modes only', async () => {
    const ask = rbac([
      { verbs: ['impersonate:user-info', 'impersonate-on:user-info:list'], group: '*', resources: ['*'] },
    ]);
    const upper = want('bob', { extra: { 'example.com/Team': ['x'] } });
    const refused = await decideImpersonation(caller, upper, listConfigMaps, ask);
    expect(!refused.allowed && refused.message).toContain('non-lowercase key');
    const valid = want('bob', { extra: { 'example.com/team': ['x'] } });
    expect(await decideImpersonation(caller, valid, listConfigMaps, ask)).toMatchObject({ allowed: true });
  });

  it('needs a user name for anything else', async () => {
    const noUser: RequestedImpersonation = { groups: ['ops'], extra: {} };
    expect(await decideImpersonation(caller, noUser, listConfigMaps, rbac([]))).toMatchObject({
      status: 400,
    });
  });

  it('asks every question at once, whatever the order it reports refusals in', async () => {
    let waiting = 0;
    let most = 0;
    const ask: Ask = async () => {
      most = Math.max(most, ++waiting);
      await new Promise((done) => setImmediate(done));
      waiting--;
      return false;
    };
    await decideImpersonation(caller, want('bob', { groups: ['a', 'b'] }), listConfigMaps, ask);
    expect(most).toBeGreaterThan(3);
  });

  it('asks in order, a few at a time, when a caller names hundreds of groups', async () => {
    const groups = Array.from({ length: 1500 }, (_, i) => `g${i}`);
    const nothing = rbac([]);
    expect(await decideImpersonation(caller, want('bob', { groups }), listConfigMaps, nothing)).toMatchObject(
      {
        allowed: false,
      },
    );
    // user-info stops at the request, legacy at the user: two questions, not three thousand.
    expect(nothing.asked).toHaveLength(2);
    const legacy = rbac([{ verbs: ['impersonate'], group: '', resources: ['users', 'groups'] }]);
    expect(await decideImpersonation(caller, want('bob', { groups }), listConfigMaps, legacy)).toMatchObject({
      allowed: true,
      identity: { mode: 'legacy' },
    });
  });

  it('fails, never refuses, when a question cannot be answered', async () => {
    const ask: Ask = () => Promise.reject(new Error('unreachable'));
    await expect(decideImpersonation(caller, want('bob'), listConfigMaps, ask)).rejects.toThrow(
      'unreachable',
    );
  });
});

describe('requestAttributes', () => {
  it.each([
    ['GET', '/api/v1/namespaces/team/pods', { verb: 'list', resource: 'pods', namespace: 'team' }],
    ['GET', '/api/v1/namespaces/team/pods?watch=1', { verb: 'watch', resource: 'pods' }],
    ['GET', '/api/v1/namespaces/team/pods?watch=false', { verb: 'list' }],
    ['GET', '/api/v1/namespaces/team/pods?watch=', { verb: 'watch' }],
    ['GET', '/api/v1/watch/namespaces/team/pods', { verb: 'watch', resource: 'pods', namespace: 'team' }],
    ['GET', '/api/v1/namespaces/team/pods?fieldSelector=metadata.name%3Dx', { verb: 'list', name: 'x' }],
    ['GET', '/api/v1/namespaces/team/pods/p/log', { verb: 'get', name: 'p', subresource: 'log' }],
    ['POST', '/api/v1/namespaces/team/pods/p/exec', { verb: 'create', subresource: 'exec' }],
    ['DELETE', '/api/v1/namespaces/team/configmaps', { verb: 'deletecollection' }],
    [
      'GET',
      '/api/v1/namespaces/team',
      { verb: 'get', resource: 'namespaces', name: 'team', namespace: 'team' },
    ],
    [
      'PUT',
      '/api/v1/namespaces/team/finalize',
      { verb: 'update', resource: 'namespaces', subresource: 'finalize' },
    ],
    [
      'GET',
      '/apis/apps/v1/deployments',
      { verb: 'list', group: 'apps', version: 'v1', resource: 'deployments' },
    ],
    ['PATCH', '/apis/apps/v1/namespaces/t/deployments/d/scale', { verb: 'patch', subresource: 'scale' }],
    // The query as Go reads it: pairs with `;` or a malformed escape dropped, false folded as EqualFold folds it.
    ['GET', '/api/v1/pods?watch=;', { verb: 'list' }],
    ['GET', '/api/v1/pods?watch=%zz&watch=false', { verb: 'list' }],
    ['GET', '/api/v1/pods?watch=fal%C5%BFe', { verb: 'list' }],
    ['GET', '/api/v1/pods?watch=%ff', { verb: 'watch' }],
    ['GET', '/api/v1/pods?watch=FALSE', { verb: 'list' }],
  ])('%s %s', (method, url, wanted) => {
    expect(requestAttributes(method, url)).toMatchObject({ resourceRequest: true, ...wanted });
  });

  it.each([
    ['GET', '/version', { verb: 'get', path: '/version' }],
    ['GET', '/apis/apps', { verb: 'get', path: '/apis/apps' }],
    ['POST', '/api/v1', { verb: 'post', path: '/api/v1' }],
  ])('%s %s is a non-resource request', (method, url, wanted) => {
    expect(requestAttributes(method, url)).toEqual({ resourceRequest: false, ...wanted });
  });
});

describe('impersonationHeaders', () => {
  it('escapes upper-case letters of extra keys, which the API server would fold with the header name', () => {
    const headers = impersonationHeaders({
      username: 'bob',
      groups: [],
      extra: { 'example.com/Team': ['x'] },
    });
    expect(Object.keys(headers)).toContain('impersonate-extra-example.com%2F%54eam');
    expect(decodeURIComponent('example.com%2F%54eam'.toLowerCase())).toBe('example.com/Team');
  });

  it('adds system:authenticated as the API server does: never to the anonymous or the unauthenticated', () => {
    expect(
      impersonationHeaders({ username: 'bob', groups: ['ops'], extra: {} })['impersonate-group'],
    ).toEqual(['ops', 'system:authenticated']);
    const anonymous = { username: 'system:anonymous', groups: ['system:unauthenticated'], extra: {} };
    expect(impersonationHeaders(anonymous)['impersonate-group']).toEqual(['system:unauthenticated']);
  });
});
