import { describe, expect, it } from '@jest/globals';
import {
  parseRequest,
  requestAttributes,
  requestInfo,
  type RequestAttributes,
  type RequestInfo,
} from './request-info.ts';

describe('parseRequest: the URL read once', () => {
  // Each reading the log's verb, the timeouts and the authorization attributes disagree on is here (an escape, an
  // empty segment, a query only one of them reads), with what the two parses this one replaced answered.
  const cases: [string, string, boolean, RequestInfo, RequestAttributes][] = [
    [
      'GET',
      '/api/v1/namespaces/a/pods',
      false,
      { verb: 'get', longRunning: false },
      {
        resourceRequest: true,
        verb: 'list',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: 'a',
        name: '',
      },
    ],
    [
      'GET',
      '/api/v1/namespaces/a/pods?watch=1',
      false,
      { verb: 'watch', longRunning: true },
      {
        resourceRequest: true,
        verb: 'watch',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: 'a',
        name: '',
      },
    ],
    [
      'GET',
      '/api/v1/namespaces/a/pods?watch=yes',
      false,
      { verb: 'get', longRunning: false },
      {
        resourceRequest: true,
        verb: 'watch',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: 'a',
        name: '',
      },
    ],
    [
      'GET',
      '/api/v1/watch/namespaces/a/pods',
      false,
      { verb: 'watch', longRunning: true },
      {
        resourceRequest: true,
        verb: 'watch',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: 'a',
        name: '',
      },
    ],
    [
      'GET',
      '/api/v1/namespaces/a/pods?fieldSelector=metadata.name%3Dx',
      false,
      { verb: 'get', longRunning: false },
      {
        resourceRequest: true,
        verb: 'list',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: 'a',
        name: 'x',
      },
    ],
    [
      'POST',
      '/api/v1/namespaces/a/pods/x/exec?command=sh',
      true,
      { verb: 'create', longRunning: true },
      {
        resourceRequest: true,
        verb: 'create',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: 'exec',
        namespace: 'a',
        name: 'x',
      },
    ],
    [
      'GET',
      '/api/v1/namespaces/a/pods/x/%65xec',
      false,
      { verb: 'get', longRunning: false },
      {
        resourceRequest: true,
        verb: 'get',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: 'exec',
        namespace: 'a',
        name: 'x',
      },
    ],
    [
      'GET',
      '/api/v1/namespaces/a/pods//exec',
      false,
      { verb: 'get', longRunning: true },
      {
        resourceRequest: true,
        verb: 'list',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: 'exec',
        namespace: 'a',
        name: '',
      },
    ],
    [
      'GET',
      '/apis/apps/v1/namespaces/a/deployments/d/status',
      false,
      { verb: 'get', longRunning: false },
      {
        resourceRequest: true,
        verb: 'get',
        group: 'apps',
        version: 'v1',
        resource: 'deployments',
        subresource: 'status',
        namespace: 'a',
        name: 'd',
      },
    ],
    [
      'DELETE',
      '/api/v1/namespaces/a/pods',
      false,
      { verb: 'delete', longRunning: false },
      {
        resourceRequest: true,
        verb: 'deletecollection',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: 'a',
        name: '',
      },
    ],
    [
      'GET',
      '/api/v1/nodes/n/proxy/metrics',
      false,
      { verb: 'get', longRunning: true },
      {
        resourceRequest: true,
        verb: 'get',
        group: '',
        version: 'v1',
        resource: 'nodes',
        subresource: 'proxy',
        namespace: '',
        name: 'n',
      },
    ],
    [
      'GET',
      '/healthz',
      false,
      { verb: 'get', longRunning: false },
      { resourceRequest: false, verb: 'get', path: '/healthz' },
    ],
    [
      'BREW',
      '/api/v1/pods',
      false,
      { verb: 'unknown', longRunning: false },
      {
        resourceRequest: true,
        verb: '',
        group: '',
        version: 'v1',
        resource: 'pods',
        subresource: '',
        namespace: '',
        name: '',
      },
    ],
    [
      'GET',
      '/apis/g',
      false,
      { verb: 'get', longRunning: false },
      { resourceRequest: false, verb: 'get', path: '/apis/g' },
    ],
    [
      'GET',
      '',
      false,
      { verb: 'get', longRunning: false },
      { resourceRequest: false, verb: 'get', path: '' },
    ],
    [
      'GET',
      '/api/v1/watch',
      false,
      { verb: 'watch', longRunning: true },
      { resourceRequest: false, verb: 'get', path: '/api/v1/watch' },
    ],
    [
      'PUT',
      '/api/v1/namespaces/a/finalize',
      false,
      { verb: 'update', longRunning: false },
      {
        resourceRequest: true,
        verb: 'update',
        group: '',
        version: 'v1',
        resource: 'namespaces',
        subresource: 'finalize',
        namespace: 'a',
        name: 'a',
      },
    ],
  ];
  it.each(cases)('%s %s', (method, url, upgrade, info, attributes) => {
    const parsed = parseRequest(method, url, upgrade);
    expect({ verb: parsed.verb, longRunning: parsed.longRunning }).toEqual(info);
    expect(parsed.attributes).toEqual(attributes);
    expect(requestInfo(method, url, upgrade)).toEqual(info);
    expect(requestAttributes(method, url)).toEqual(attributes);
    const q = url.indexOf('?');
    expect(parsed.path).toBe(q === -1 ? url : url.slice(0, q));
    expect(parsed.query).toBe(q === -1 ? undefined : url.slice(q + 1));
  });

  it('reads the log verb and the timeouts from the path as sent, the attributes from the path decoded', () => {
    const escaped = parseRequest('GET', '/api/v1/namespaces/a/pods/x/%65xec', false);
    expect(escaped.longRunning).toBe(false);
    expect(escaped.attributes).toMatchObject({ resource: 'pods', name: 'x', subresource: 'exec' });
    const watch = parseRequest('GET', '/api/v1/pods?watch=yes', false);
    expect(watch.verb).toBe('get');
    expect(watch.attributes.verb).toBe('watch');
  });
});
