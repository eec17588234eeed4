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

/**
 * A request's URL read once, for every stage that asks about it: the log's verb and path, whether it may stay open,
 * and what it does as the API server authorizes it.
 */
export interface ParsedRequest extends RequestInfo {
  /** The path as sent, escapes kept, without the query. */
  path: string;
  /** What follows the `?`, or undefined when there is none. */
  query: string | undefined;
  attributes: RequestAttributes;
}

/** Reads the method and URL once (most requests have no escape and no query, and skip that work). */
export function parseRequest(method: string, url: string, upgrade: boolean): ParsedRequest {
  const q = url.indexOf('?');
  const rawPath = q === -1 ? url : url.slice(0, q);
  const query = q === -1 ? undefined : url.slice(q + 1);
  let path = rawPath;
  if (rawPath.includes('%'))
    try {
      path = decodeURIComponent(rawPath);
    } catch {
      // The handler refuses such paths before anything is decided; keep the raw form.
    }
  // splitPath: leading and trailing slashes trimmed, then split; an empty path has no parts.
  const trimmed = path.replace(/^\/+|\/+$/g, '');
  const parts = trimmed === '' ? [] : trimmed.split('/');
  // The log's verb and the timeouts read the path as sent, its empty segments left out: the same parts, unless it
  // has an escape or an empty segment.
  const sent = rawPath === path && !rawPath.includes('//') ? parts : rawPath.split('/').filter(Boolean);
  const watch = watchParam(query) || sent.includes('watch');
  return {
    path: rawPath,
    query,
    verb: logVerb(method, watch),
    longRunning: upgrade || watch || isLongRunning(sent),
    attributes: attributesOf(method, path, parts, query),
  };
}

/** The verb and whether the request may stay open: for logs, metrics and timeouts. */
export function requestInfo(method: string, url: string, upgrade: boolean): RequestInfo {
  const { verb, longRunning } = parseRequest(method, url, upgrade);
  return { verb, longRunning };
}

/** What the request does, as the API server authorizes it. */
export function requestAttributes(method: string, url: string): RequestAttributes {
  return parseRequest(method, url, false).attributes;
}

/** `watch=true` or `watch=1` in the query (as the log's verb reads it). */
function watchParam(query: string | undefined): boolean {
  if (query === undefined) return false;
  const value = new URLSearchParams(query).get('watch');
  return value === 'true' || value === '1';
}

/** Proxying, or a long-running subresource after a named object (/api/v1/namespaces/ns/pods/name/exec). */
function isLongRunning(parts: readonly string[]): boolean {
  const isResourcePath = parts[0] === 'api' || parts[0] === 'apis';
  const last = parts.at(-1) ?? '';
  return (
    parts.includes('proxy') || (isResourcePath && parts.length >= 5 && LONG_RUNNING_SUBRESOURCES.has(last))
  );
}

/** The verb that labels the request's log line and metrics. */
function logVerb(method: string, watch: boolean): string {
  switch (method) {
    case 'GET':
    case 'HEAD':
      return watch ? 'watch' : 'get';
    case 'POST':
      return 'create';
    case 'PUT':
      return 'update';
    case 'PATCH':
      return 'patch';
    case 'DELETE':
      return 'delete';
    case 'OPTIONS':
    case 'CONNECT':
    case 'TRACE':
      return method.toLowerCase();
    default:
      // Any token is a method to HTTP/2, and the verb labels metrics: a stranger's invented methods must not each
      // add a series for good.
      return 'unknown';
  }
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

/** The attributes of a request whose path (decoded) splits into `parts`. */
function attributesOf(
  method: string,
  path: string,
  parts: readonly string[],
  query: string | undefined,
): RequestAttributes {
  const nonResource = (): RequestAttributes => ({ resourceRequest: false, verb: method.toLowerCase(), path });
  if (parts.length < 3 || (parts[0] !== 'api' && parts[0] !== 'apis')) return nonResource();
  // i: the first part not read yet.
  let i = 1;
  let group = '';
  if (parts[0] === 'apis') {
    if (parts.length - i < 3) return nonResource();
    group = parts[i++]!;
  }
  const version = parts[i++]!;
  let verb: string;
  if (SPECIAL_VERBS.has(parts[i]!)) {
    // `/api/v1/watch` alone: the API server cannot tell what is watched and fails the request anyway.
    if (parts.length - i < 2) return nonResource();
    verb = parts[i++]!;
  } else {
    verb = Object.hasOwn(METHOD_VERBS, method) ? METHOD_VERBS[method]! : '';
  }
  let namespace = '';
  if (parts[i] === 'namespaces' && parts.length - i > 1) {
    namespace = parts[i + 1]!;
    if (parts.length - i > 2 && !NAMESPACE_SUBRESOURCES.has(parts[i + 2]!)) i += 2;
  }
  const rest = parts.length - i;
  const resource = rest >= 1 ? parts[i]! : '';
  let name = rest >= 2 ? parts[i + 1]! : '';
  const subresource = rest >= 3 && verb !== 'proxy' ? parts[i + 2]! : '';
  if (name === '' && verb === 'get') {
    const values = query === undefined ? NO_QUERY : goQuery(query);
    const watch = values.get('watch') ?? [];
    verb = watch.length > 0 && !isFalse(watch[0]!) ? 'watch' : 'list';
    const selector = values.get('fieldSelector')?.[0];
    if (selector !== undefined) name = selectedName(selector) ?? '';
  }
  if (name === '' && verb === 'delete') verb = 'deletecollection';
  return { resourceRequest: true, verb, group, version, resource, subresource, namespace, name };
}
