// The request-header settings of a cluster's API server, as it publishes them for aggregated API servers in
// kube-system/extension-apiserver-authentication: the CA of its front proxy's client certificate, the names that
// certificate may have, and the headers the front proxy writes the user into.

/** Where the API server publishes its front proxy's CA and the headers it writes. */
export const EXTENSION_AUTH_CONFIGMAP = {
  namespace: 'kube-system',
  name: 'extension-apiserver-authentication',
};

/** The request-header settings of the cluster's API server, read from its ConfigMap. */
export interface RequestHeaderConfig {
  /** PEM certificates of the CA the front proxy's client certificate must verify against. */
  caPem: string;
  /** Common names the front proxy's certificate may have; empty: any the CA signed. */
  allowedNames: string[];
  usernameHeaders: string[];
  uidHeaders: string[];
  groupHeaders: string[];
  extraHeaderPrefixes: string[];
}

/** A JSON array of strings from the ConfigMap, or a problem. */
function stringList(data: Record<string, string>, key: string): string[] {
  const text = data[key];
  if (text === undefined || text === '') return [];
  const parsed: unknown = JSON.parse(text);
  if (!Array.isArray(parsed) || !parsed.every((v) => typeof v === 'string'))
    throw new Error(`${key} is not a JSON array of strings`);
  return parsed.map((v) => v.trim());
}

/** Header names (trimmed and lower-cased, as the API server compares them); an empty one is refused, as there. */
function headerNames(data: Record<string, string>, key: string): string[] {
  const names = stringList(data, key).map((h) => h.toLowerCase());
  if (names.includes('')) throw new Error(`${key} names an empty header`);
  return names;
}

/**
 * The request-header settings the ConfigMap's data holds, or undefined when it configures no front proxy (the API
 * server runs without --requestheader-client-ca-file). Throws for data that cannot be read.
 */
export function requestHeaderConfig(
  data: Record<string, string> | undefined,
): RequestHeaderConfig | undefined {
  const caPem = data?.['requestheader-client-ca-file'];
  if (!data || !caPem?.includes('-----BEGIN CERTIFICATE-----')) return undefined;
  const config: RequestHeaderConfig = {
    caPem,
    allowedNames: stringList(data, 'requestheader-allowed-names'),
    usernameHeaders: headerNames(data, 'requestheader-username-headers'),
    uidHeaders: headerNames(data, 'requestheader-uid-headers'),
    groupHeaders: headerNames(data, 'requestheader-group-headers'),
    extraHeaderPrefixes: headerNames(data, 'requestheader-extra-headers-prefix'),
  };
  if (config.usernameHeaders.length === 0) throw new Error('requestheader-username-headers names no header');
  return config;
}
