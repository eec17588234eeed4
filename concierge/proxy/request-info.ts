// Enough of Kubernetes' request-info parsing for logs, metrics and timeouts: the verb, and whether the request
// may legitimately stay open (watches, exec/attach/port-forward, log follow, proxy), which gets no timeout.

const LONG_RUNNING_SUBRESOURCES = new Set(['exec', 'attach', 'portforward', 'proxy']);

export interface RequestInfo {
  verb: string;
  longRunning: boolean;
}

export function requestInfo(method: string, url: string, upgrade: boolean): RequestInfo {
  const q = url.indexOf('?');
  const path = q === -1 ? url : url.slice(0, q);
  // Most requests have no query: no parameter parsing for them.
  const params = q === -1 ? undefined : new URLSearchParams(url.slice(q + 1));
  const parts = path.split('/').filter(Boolean);
  const isResourcePath = parts[0] === 'api' || parts[0] === 'apis';
  const watchParam = params?.get('watch');
  const watch = watchParam === 'true' || watchParam === '1' || parts.includes('watch');
  // /api/v1/namespaces/ns/pods/name/exec → the last segment after a named object is a subresource.
  const last = parts.at(-1) ?? '';
  const subresource =
    isResourcePath && parts.length >= 5 && LONG_RUNNING_SUBRESOURCES.has(last) ? last : undefined;
  const follow = last === 'log' && params?.get('follow') === 'true';
  const proxying = parts.includes('proxy');
  let verb: string;
  switch (method) {
    case 'GET':
    case 'HEAD':
      verb = watch ? 'watch' : 'get';
      break;
    case 'POST':
      verb = 'create';
      break;
    case 'PUT':
      verb = 'update';
      break;
    case 'PATCH':
      verb = 'patch';
      break;
    case 'DELETE':
      verb = 'delete';
      break;
    case 'OPTIONS':
    case 'CONNECT':
    case 'TRACE':
      verb = method.toLowerCase();
      break;
    default:
      // Any token is a method to HTTP/2, and the verb labels metrics: a stranger's invented methods must not each
      // add a series for good.
      verb = 'unknown';
  }
  return { verb, longRunning: upgrade || watch || follow || proxying || subresource !== undefined };
}
