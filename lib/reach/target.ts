// What a reach connection is for: one TCP port of one Service or pod, named by the object, never by an address.
// `sealion port-forward` asks for it with an HTTP/1.1 upgrade (`Upgrade: tcp`), or an HTTP/2 extended CONNECT
// (`:protocol tcp`) read as that upgrade, to
//   [/clusters/<cluster>]/apis/reach.concierge.<suffix>/v1alpha1/namespaces/<ns>/<services|pods>/<name>/connect?port=<port>
// and whoever dials (the concierge for the hub, the cluster's agent for any other) answers 101 once its connection to
// the target is open, and a Status otherwise. The path is read the same way at every hop, so what the hub decided
// about is what the agent dials.
import { apiGroups, VERSION } from '../../apis/groups.ts';
import { isDNSLabel, isDNSSubdomain, isPortName } from '../../apis/names.ts';
import type { RequestAttributes } from '../kube/access-review.ts';

/** The upgrade token of a reach connection: after the 101, the bytes are the TCP connection's, both ways. */
export const REACH_UPGRADE = 'tcp';

export type ReachKind = 'services' | 'pods';

export interface ReachTarget {
  namespace: string;
  kind: ReachKind;
  name: string;
  /** A port number, or a port's name (a Service's port, or a pod's container port). */
  port: number | string;
}

/** `/apis/reach.concierge.<suffix>/v1alpha1/namespaces/<ns>/<kind>/<name>/connect`, the suffix any DNS name. */
const REACH_PATH =
  /^\/apis\/reach\.concierge\.[a-z0-9]([a-z0-9.-]{0,200}[a-z0-9])?\/v1alpha1\/namespaces\/([^/]+)\/(services|pods)\/([^/]+)\/connect$/;
/** The start of every reach path: a path that has it and is not one is refused, never forwarded. */
const REACH_PREFIX = /^\/apis\/reach\.concierge\./;

/** The path (and query) that asks for `target`. */
export function reachPath(suffix: string, target: ReachTarget): string {
  const e = encodeURIComponent;
  return (
    `/apis/${apiGroups(suffix).reach}/${VERSION}/namespaces/${e(target.namespace)}/${target.kind}/` +
    `${e(target.name)}/connect?port=${e(String(target.port))}`
  );
}

/** Whether `url` is a reach path at all (well formed or not). */
export const isReachPath = (url: string): boolean => REACH_PREFIX.test(url);

/** Why `port` is no port: undefined when it is a number 1–65535 or a port's name. */
export function portProblem(port: string): string | undefined {
  if (/^[0-9]+$/.test(port)) {
    const n = Number(port);
    return n >= 1 && n <= 65535 ? undefined : `port ${port} is not between 1 and 65535`;
  }
  return isPortName(port) ? undefined : `"${port.slice(0, 64)}" is neither a port number nor a port's name`;
}

/** Why `name` is no name of this kind: undefined when it is one. */
export function nameProblem(kind: ReachKind, name: string): string | undefined {
  // Service names are DNS labels; pod names DNS subdomains.
  const ok = kind === 'services' ? isDNSLabel(name) : isDNSSubdomain(name);
  return ok
    ? undefined
    : `"${name.slice(0, 64)}" is not a valid ${kind === 'services' ? 'Service' : 'pod'} name`;
}

/**
 * The target a reach request's URL (path and query) names, or why it names none. Every part is checked as the API
 * server checks names, so nothing but a name reaches a path of the API server's or a dial.
 */
export function parseReach(url: string): ReachTarget | { problem: string } {
  const q = url.indexOf('?');
  const path = q === -1 ? url : url.slice(0, q);
  const match = REACH_PATH.exec(path);
  if (!match)
    return {
      problem:
        'a reach path is /apis/reach.concierge.<suffix>/v1alpha1/namespaces/<namespace>/services|pods/<name>/connect',
    };
  const [, , namespace, kind, name] = match as unknown as [string, string, string, ReachKind, string];
  if (!isDNSLabel(namespace)) return { problem: `"${namespace.slice(0, 64)}" is not a valid namespace name` };
  const problem = nameProblem(kind, name);
  if (problem) return { problem };
  const ports = new URLSearchParams(q === -1 ? '' : url.slice(q + 1)).getAll('port');
  if (ports.length !== 1) return { problem: 'give exactly one port (?port=<number or name>)' };
  const port = ports[0]!;
  const bad = portProblem(port);
  if (bad) return { problem: bad };
  return { namespace, kind, name, port: /^[0-9]+$/.test(port) ? Number(port) : port };
}

/**
 * What reaching `target` is authorized as, on the cluster it is in: for a Service, `create services/proxy` named
 * `<service>:<port>`, as the API server's own proxy to that port of the Service is (whoever may send it requests
 * through the API server may open connections to it, and RBAC that names `web:http` allows that port alone); for a
 * pod, `create pods/portforward` (what `kubectl port-forward` to that pod asks).
 */
export function reachAttributes(target: ReachTarget): RequestAttributes & { resourceRequest: true } {
  return {
    resourceRequest: true,
    verb: 'create',
    group: '',
    version: 'v1',
    resource: target.kind,
    subresource: target.kind === 'services' ? 'proxy' : 'portforward',
    namespace: target.namespace,
    name: target.kind === 'services' ? `${target.name}:${target.port}` : target.name,
  };
}

/** The target in words: `service ns/name port 80`. */
export const describeTarget = (target: ReachTarget): string =>
  `${target.kind === 'services' ? 'service' : 'pod'} ${target.namespace}/${target.name} port ${target.port}`;
