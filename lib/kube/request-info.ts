// Enough of Kubernetes' request-info parsing for logs, metrics and timeouts: the verb, and whether the request
// may legitimately stay open (watches, exec/attach/port-forward, logs, proxy), which gets no timeout.
import type { RequestAttributes } from './access-review.ts';

export type { RequestAttributes };

/**
 * The API server's own list (kube-apiserver's LongRunningFunc): a pod's log is long-running whether or not it
 * follows, so its audit events have a ResponseStarted stage and no request timeout applies.
 */
const LONG_RUNNING_SUBRESOURCES = new Set(['exec', 'attach', 'portforward', 'proxy', 'log']);

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
  return { verb, longRunning: upgrade || watch || proxying || subresource !== undefined };
}

/** Path segments the API server reads as verbs (`/api/v1/watch/…`), and the one of them that takes no subresource. */
const SPECIAL_VERBS = new Set(['proxy', 'watch']);
const NAMESPACE_SUBRESOURCES = new Set(['status', 'finalize']);

/**
 * Query values the API server reads as false (`0`, or `false` in any case, as Go's EqualFold folds it: ſ is an s);
 * any other value, the empty one too, is true.
 */
const isFalse = (value: string): boolean =>
  value === '0' || value.toLowerCase().replace(/\u017f/g, 's') === 'false';

/**
 * A query as Go's url.ParseQuery reads it, which the API server's request parsing uses: pairs split on `&`, a pair
 * holding `;` or a malformed escape left out, `+` a space. URLSearchParams keeps what Go drops, so `?watch=;` would
 * be a watch here and a list there.
 */
function goQuery(raw: string): Map<string, string[]> {
  const query = new Map<string, string[]>();
  for (const pair of raw.split('&')) {
    if (pair === '' || pair.includes(';')) continue;
    const eq = pair.indexOf('=');
    // Go's QueryUnescape: a malformed escape fails the pair; bytes that are not UTF-8 do not.
    const unescape = (text: string): string | undefined => {
      if (/%(?![0-9a-fA-F]{2})/.test(text)) return undefined;
      const bytes = Buffer.from(text.replace(/\+/g, ' '), 'latin1');
      const out: number[] = [];
      for (let i = 0; i < bytes.length; i++) {
        if (bytes[i] === 0x25) {
          out.push(parseInt(bytes.subarray(i + 1, i + 3).toString('latin1'), 16));
          i += 2;
        } else out.push(bytes[i]!);
      }
      return Buffer.from(out).toString('utf8');
    };
    const key = unescape(eq === -1 ? pair : pair.slice(0, eq));
    const value = unescape(eq === -1 ? '' : pair.slice(eq + 1));
    if (key === undefined || value === undefined) continue;
    query.set(key, [...(query.get(key) ?? []), value]);
  }
  return query;
}

const NO_QUERY: ReadonlyMap<string, string[]> = new Map();

/**
 * The name a field selector pins exactly (`metadata.name=x` or `==`, among other terms), as the API server narrows a
 * list or watch to one object for authorization. Undefined when the selector names none, or one that cannot be a
 * path segment.
 */
function selectedName(selector: string): string | undefined {
  // Terms are separated by unescaped commas; a backslash escapes the next character.
  const terms: string[] = [];
  let term = '';
  for (let i = 0; i < selector.length; i++) {
    const c = selector[i]!;
    if (c === '\\' && i + 1 < selector.length) term += c + selector[++i];
    else if (c === ',') {
      terms.push(term);
      term = '';
    } else term += c;
  }
  terms.push(term);
  for (const t of terms) {
    const match = /^\s*metadata\.name\s*==?(.*)$/.exec(t);
    if (!match || match[1]!.startsWith('=')) continue;
    const name = match[1]!.replace(/\\(.)/g, '$1');
    if (name === '' || name === '.' || name === '..' || /[/%]/.test(name)) return undefined;
    return name;
  }
  return undefined;
}

/** The verb of a resource request by its method, unless its path names one. */
const METHOD_VERBS: Readonly<Record<string, string>> = {
  POST: 'create',
  GET: 'get',
  HEAD: 'get',
  PUT: 'update',
  PATCH: 'patch',
  DELETE: 'delete',
};

/** Every request is decided by these: most have no escape in their path and no query, and skip that work. */
export function requestAttributes(method: string, url: string): RequestAttributes {
  const q = url.indexOf('?');
  const rawPath = q === -1 ? url : url.slice(0, q);
  let path = rawPath;
  if (rawPath.includes('%'))
    try {
      path = decodeURIComponent(rawPath);
    } catch {
      // The handler refuses such paths before anything is decided; keep the raw form.
    }
  const nonResource: RequestAttributes = { resourceRequest: false, verb: method.toLowerCase(), path };
  // splitPath: leading and trailing slashes trimmed, then split; an empty path has no parts.
  const trimmed = path.replace(/^\/+|\/+$/g, '');
  let parts = trimmed === '' ? [] : trimmed.split('/');
  if (parts.length < 3 || (parts[0] !== 'api' && parts[0] !== 'apis')) return nonResource;
  const prefix = parts[0];
  parts = parts.slice(1);
  let group = '';
  if (prefix === 'apis') {
    if (parts.length < 3) return nonResource;
    group = parts[0]!;
    parts = parts.slice(1);
  }
  const version = parts[0]!;
  parts = parts.slice(1);
  let verb: string;
  if (SPECIAL_VERBS.has(parts[0]!)) {
    // `/api/v1/watch` alone: the API server cannot tell what is watched and fails the request anyway.
    if (parts.length < 2) return { ...nonResource };
    verb = parts[0]!;
    parts = parts.slice(1);
  } else {
    verb = Object.hasOwn(METHOD_VERBS, method) ? METHOD_VERBS[method]! : '';
  }
  let namespace = '';
  if (parts[0] === 'namespaces') {
    if (parts.length > 1) {
      namespace = parts[1]!;
      if (parts.length > 2 && !NAMESPACE_SUBRESOURCES.has(parts[2]!)) parts = parts.slice(2);
    }
  }
  let resource = '';
  let name = '';
  let subresource = '';
  if (parts.length >= 3 && verb !== 'proxy') subresource = parts[2]!;
  if (parts.length >= 2) name = parts[1]!;
  if (parts.length >= 1) resource = parts[0]!;
  if (name === '' && verb === 'get') {
    const query = q === -1 ? NO_QUERY : goQuery(url.slice(q + 1));
    const watch = query.get('watch') ?? [];
    verb = watch.length > 0 && !isFalse(watch[0]!) ? 'watch' : 'list';
    const selector = query.get('fieldSelector')?.[0];
    if (selector !== undefined) name = selectedName(selector) ?? '';
  }
  if (name === '' && verb === 'delete') verb = 'deletecollection';
  return { resourceRequest: true, verb, group, version, resource, subresource, namespace, name };
}
