// Request-header authentication, as an aggregated API server must do it. The cluster's API server authenticates the
// user, then proxies the request here with the user in X-Remote-* headers, over a connection that carries its
// front-proxy client certificate. Those headers are believed only from that certificate: one that verifies against
// the request-header CA the API server publishes in kube-system/extension-apiserver-authentication and, when that
// ConfigMap names any, whose common name is one of the allowed names. From anyone else (no certificate, another
// CA's, another name) the request is refused, whatever headers it carries.
import type { Request } from '../../lib/http2/request.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { certificateUser } from '../proxy/authenticate.ts';
import { nameFromHeader } from '../../lib/kube/impersonation.ts';
import type { RequestHeaderConfig } from '../../lib/kube/request-header.ts';

/** Why a request is refused; the client is told only 401. */
export type FrontProxyRefusal =
  | 'no front-proxy certificate'
  | 'front-proxy certificate not allowed'
  | 'no user header'
  | 'header not UTF-8';

/**
 * The user the front proxy vouches for, or why the request is refused. `trusted`: fingerprints of the CAs the
 * listener trusts now (the request-header CA), checked per request as certificates are elsewhere.
 */
export function frontProxyUser(
  req: Request,
  config: RequestHeaderConfig,
  trusted: ReadonlySet<string>,
): UserInfo | { refused: FrontProxyRefusal } {
  const proxy = certificateUser(req, trusted);
  if (!proxy || 'refused' in proxy) return { refused: 'no front-proxy certificate' };
  if (config.allowedNames.length > 0 && !config.allowedNames.includes(proxy.user.username))
    return { refused: 'front-proxy certificate not allowed' };
  let username: string | undefined;
  let uid: string | undefined;
  const groups: string[] = [];
  const extra: Record<string, string[]> = {};
  // As the API server's own reader: for the username and uid, the first header in the configured order that has a
  // value; every value of every group header; extra keys lower-cased, then unescaped.
  const byName = new Map<string, string[]>();
  const raw = req.rawHeaders;
  for (let i = 0; i + 1 < raw.length; i += 2) {
    const name = raw[i]!.toLowerCase();
    const value = nameFromHeader(raw[i + 1]!);
    if (value === undefined) {
      if (isIdentityHeader(config, name)) return { refused: 'header not UTF-8' };
      continue;
    }
    let list = byName.get(name);
    if (!list) byName.set(name, (list = []));
    list.push(value);
  }
  for (const header of config.usernameHeaders) {
    const value = byName.get(header)?.[0];
    if (value) {
      username = value;
      break;
    }
  }
  if (!username) return { refused: 'no user header' };
  for (const header of config.uidHeaders) {
    const value = byName.get(header)?.[0];
    if (value) {
      uid = value;
      break;
    }
  }
  // Empty values are no groups, as the API server's reader has it.
  for (const header of config.groupHeaders)
    groups.push(...(byName.get(header) ?? []).filter((g) => g !== ''));
  for (const [name, values] of byName) {
    const prefix = config.extraHeaderPrefixes.find((p) => name.startsWith(p));
    if (!prefix) continue;
    let key = name.slice(prefix.length);
    try {
      key = decodeURIComponent(key);
    } catch {
      // Kept as sent, as the API server keeps a key it cannot unescape.
    }
    (extra[key] ??= []).push(...values);
  }
  return { username, ...(uid ? { uid } : {}), groups, extra };
}

function isIdentityHeader(config: RequestHeaderConfig, name: string): boolean {
  return (
    config.usernameHeaders.includes(name) ||
    config.uidHeaders.includes(name) ||
    config.groupHeaders.includes(name) ||
    config.extraHeaderPrefixes.some((p) => name.startsWith(p))
  );
}
