// What `sealion port-forward` checks before it listens, as `kubectl port-forward` reads the pod before it does: that
// the cluster answers, that the pod or service exists, that each remote port is one of its ports (a name resolved as
// the dialer resolves it), and that the user may open the connection. The last is a SelfSubjectAccessReview sent
// through the same server and `/clusters/<name>` prefix as the connections, so the cluster they go to answers it, for
// the user Sealion forwards as; it asks what the dialer asks (lib/reach/target.ts reachAttributes). Without these, a
// wrong name printed `Forwarding from …` and failed only on the first connection.
import { HttpsError, httpsText } from '../lib/https-client.ts';
import { selfSubjectAccessReview, reviewAllowed } from '../lib/kube/access-review.ts';
import { statusMessageOf } from '../lib/kube/status.ts';
import { reachAttributes } from '../lib/reach/target.ts';
import { printable } from './printable.ts';
import type { KubeconfigAccess } from './whoami.ts';

/** What a forward leads to, as its checks need it. */
export interface CheckedTarget {
  /** A cluster reached through its agent; empty: the server's own. */
  cluster: string;
  namespace: string;
  resource: 'pods' | 'services';
  name: string;
  /** The cluster's name in messages: `cluster`, or the one the kubeconfig's server names (`…/clusters/<name>`). */
  label?: string;
}

/** Each check's whole exchange: a forward that cannot check in this long would not connect either. */
const CHECK_TIMEOUT_MS = 15_000;
/** Names listed after a miss: enough to spot a typo, not a namespace's whole inventory. */
const LISTED_NAMES = 10;

interface Port {
  name?: string;
  port?: number;
  containerPort?: number;
  protocol?: string;
}
interface TargetObject {
  spec?: { ports?: Port[]; containers?: { ports?: Port[] }[]; type?: string; hostNetwork?: boolean };
  status?: { phase?: string };
}

/** An answer of the cluster's: its status and body, whatever the status. */
type Call = (path: string, body?: unknown) => Promise<{ status: number; text: string }>;

/** What a system error code means, for the ones a server that cannot be reached gives. */
const NETWORK_REASONS: Record<string, string> = {
  ECONNREFUSED: 'nothing listens there (connection refused)',
  ECONNRESET: 'the connection was reset',
  ENOTFOUND: 'no such host',
  EAI_AGAIN: 'its name cannot be looked up now',
  EHOSTUNREACH: 'the host is unreachable',
  ENETUNREACH: 'the network is unreachable',
  DEPTH_ZERO_SELF_SIGNED_CERT: "its certificate is not signed by the kubeconfig's CA",
  SELF_SIGNED_CERT_IN_CHAIN: "its certificate is not signed by the kubeconfig's CA",
  UNABLE_TO_VERIFY_LEAF_SIGNATURE: "its certificate is not signed by the kubeconfig's CA",
  ERR_TLS_CERT_ALTNAME_INVALID: 'its certificate is for another name',
  CERT_HAS_EXPIRED: 'its certificate has expired',
};

/** Why a request got no answer, in words: the first system error code in its causes, else its message. */
function networkReason(err: unknown): string {
  for (let e = err as { code?: unknown; cause?: unknown } | undefined; e; e = e.cause as typeof e) {
    const reason = typeof e.code === 'string' ? NETWORK_REASONS[e.code] : undefined;
    if (reason) return reason;
  }
  return printable((err as Error).message);
}

/** Sends requests as `access` to its server, under the cluster's prefix; a network failure throws a sentence. */
function caller(access: KubeconfigAccess, target: CheckedTarget): Call {
  const prefix = target.cluster ? `clusters/${encodeURIComponent(target.cluster)}/` : '';
  return async (path, body) => {
    const url = new URL(prefix + path, access.base);
    try {
      return await httpsText(
        url.toString(),
        {
          method: body === undefined ? 'GET' : 'POST',
          ...(body === undefined ? {} : { body }),
          timeoutMs: CHECK_TIMEOUT_MS,
          ...(access.caPem ? { caBundlePem: access.caPem } : {}),
          ...(access.clientCert ? { clientCert: access.clientCert } : {}),
          headers: access.headers,
        },
        'application/json',
      );
    } catch (err) {
      if (err instanceof HttpsError && err.code === 'BadStatus')
        return { status: err.status ?? 0, text: err.body ?? '' };
      if (err instanceof HttpsError && err.code === 'Timeout')
        throw new Error(
          `cannot reach ${printable(url.host)}: no answer within ${CHECK_TIMEOUT_MS / 1000} s; check the server in your kubeconfig and retry`,
          { cause: err },
        );
      throw new Error(
        `cannot reach ${printable(url.host)}: ${networkReason(err)}; check the server in your kubeconfig`,
        { cause: err },
      );
    }
  };
}

/** ` on cluster edge` for an agent-backed cluster, else nothing. */
const onCluster = (target: CheckedTarget): string =>
  target.label ? ` on cluster ${printable(target.label)}` : '';

/** `pod demo/db-0` or `service demo/web`, with ` on cluster edge` for an agent-backed one. */
function described(target: CheckedTarget): string {
  const kind = target.resource === 'pods' ? 'pod' : 'service';
  return `${kind} ${target.namespace}/${target.name}${onCluster(target)}`;
}

/** The Status's message of an answer, or its HTTP status. */
const said = (answer: { status: number; text: string }): string =>
  printable(statusMessageOf(answer.text) ?? `HTTP ${answer.status}`);

/** A refusal every check shares: the credentials (401), or a cluster the hub cannot reach (503 under a prefix). */
function commonRefusal(target: CheckedTarget, answer: { status: number; text: string }): Error | undefined {
  if (answer.status === 401)
    return new Error(
      `the server refused the credentials (401 Unauthorized): ${said(answer)}; log in again (sealion logout, then retry)`,
    );
  if (answer.status === 503 && target.label)
    return new Error(
      `cannot forward to cluster ${printable(target.label)}: ${said(answer)}; sealion clusters shows which clusters answer you`,
    );
  return undefined;
}

/** A few names of the namespace's pods or services, for a miss; none when they cannot be listed. */
async function someNames(call: Call, target: CheckedTarget): Promise<string> {
  const answer = await call(
    `api/v1/namespaces/${encodeURIComponent(target.namespace)}/${target.resource}?limit=${LISTED_NAMES + 1}`,
  ).catch(() => undefined);
  if (answer?.status !== 200) return '';
  let names: string[];
  try {
    const list = JSON.parse(answer.text) as { items?: { metadata?: { name?: string } }[] };
    names = (list.items ?? []).flatMap((i) => (i.metadata?.name ? [printable(i.metadata.name)] : []));
  } catch {
    return '';
  }
  if (names.length === 0) return `; the namespace has no ${target.resource}`;
  const more = names.length > LISTED_NAMES ? ', …' : '';
  return `; known: ${names.slice(0, LISTED_NAMES).sort().join(', ')}${more}`;
}

/**
 * The pod or service, or undefined when the user may not read it (RBAC may allow the connection and not the read:
 * a Service's port named in a services/proxy rule); throws when it does not exist or the cluster cannot be asked.
 */
async function readTarget(call: Call, target: CheckedTarget): Promise<TargetObject | undefined> {
  const e = encodeURIComponent;
  const answer = await call(`api/v1/namespaces/${e(target.namespace)}/${target.resource}/${e(target.name)}`);
  const common = commonRefusal(target, answer);
  if (common) throw common;
  if (answer.status === 403) return undefined;
  if (answer.status === 404) {
    const kind = target.resource === 'pods' ? 'pod' : 'service';
    throw new Error(
      `no ${kind} ${target.name} in namespace ${target.namespace}${onCluster(target)}${await someNames(call, target)}`,
    );
  }
  if (answer.status !== 200) throw new Error(`cannot read ${described(target)}: ${said(answer)}`);
  let object: unknown;
  try {
    object = JSON.parse(answer.text);
  } catch {
    throw new Error(`cannot read ${described(target)}: the answer is not JSON`);
  }
  return checkedTargetObject(object, target);
}

const isRecord = (value: unknown): value is Record<string, unknown> =>
  typeof value === 'object' && value !== null && !Array.isArray(value);
/** Whether each of `fields` is absent or of its type. */
const fieldsAre = (
  value: Record<string, unknown>,
  fields: Record<string, 'string' | 'number' | 'boolean'>,
): boolean =>
  Object.entries(fields).every(([field, type]) => value[field] === undefined || typeof value[field] === type);
/** Whether `value` is absent or a list of objects each passing `each`. */
const listOf = (value: unknown, each: (item: Record<string, unknown>) => boolean): boolean =>
  value === undefined || (Array.isArray(value) && value.every((item) => isRecord(item) && each(item)));
const portShape = (p: Record<string, unknown>): boolean =>
  fieldsAre(p, { name: 'string', port: 'number', containerPort: 'number', protocol: 'string' });

/**
 * The pod or service the server answered, each field the checks read of the type they read it as: a server that is
 * no Kubernetes API server (or a hostile one) gets one line, not a TypeError from deep in a check.
 */
export function checkedTargetObject(object: unknown, target: CheckedTarget): TargetObject {
  const kind = target.resource === 'pods' ? 'pod' : 'service';
  const notA = (what: string): Error =>
    new Error(
      `cannot read ${described(target)}: the server's answer is not a ${kind} (${what}); check that the kubeconfig's server is a Kubernetes API server`,
    );
  if (!isRecord(object)) throw notA('not an object');
  const { spec, status } = object;
  if (spec !== undefined && !isRecord(spec)) throw notA('its spec is not an object');
  if (status !== undefined && !isRecord(status)) throw notA('its status is not an object');
  if (spec && !fieldsAre(spec, { type: 'string', hostNetwork: 'boolean' }))
    throw notA('its spec.type or spec.hostNetwork is of another type');
  if (status && !fieldsAre(status, { phase: 'string' })) throw notA('its status.phase is not a string');
  if (spec && !listOf(spec['ports'], portShape)) throw notA('its spec.ports is not a list of ports');
  if (spec && !listOf(spec['containers'], (c) => listOf(c['ports'], portShape)))
    throw notA('its spec.containers is not a list of containers with lists of ports');
  return object;
}

/** A port in words: `80 (http)`. */
const portWords = (number: number | undefined, name: string | undefined): string =>
  `${number ?? '?'}${name ? ` (${printable(name)})` : ''}`;

/**
 * Why `remote` is no port of the object, as the dialer resolves it: a Service's TCP port by number or name; a pod's
 * TCP container port by name (a number is any port of the pod's, as kubectl has it). Undefined when it is one.
 */
function portProblem(target: CheckedTarget, object: TargetObject, remote: string): string | undefined {
  const tcp = (p: Port): boolean => (p.protocol ?? 'TCP') === 'TCP';
  const byNumber = /^[0-9]+$/.test(remote);
  if (target.resource === 'services') {
    const ports = (object.spec?.ports ?? []).filter(tcp);
    if (ports.some((p) => (byNumber ? p.port === Number(remote) : p.name === remote))) return undefined;
    const known = ports.map((p) => portWords(p.port, p.name)).join(', ') || 'none';
    return `${described(target)} has no TCP port ${remote}; its ports: ${known}`;
  }
  if (byNumber) return undefined;
  const ports = (object.spec?.containers ?? []).flatMap((c) => c.ports ?? []).filter(tcp);
  if (ports.some((p) => p.name === remote)) return undefined;
  const known = ports.filter((p) => p.name).map((p) => portWords(p.containerPort, p.name));
  return `${described(target)} has no TCP container port named ${remote}; its named ports: ${known.join(', ') || 'none'}`;
}

/** Whether the cluster lets the user open a connection to `port` of the target; throws the refusal if not. */
async function checkAllowed(call: Call, target: CheckedTarget, port: string): Promise<void> {
  const attributes = reachAttributes({
    namespace: target.namespace,
    kind: target.resource,
    name: target.name,
    port: /^[0-9]+$/.test(port) ? Number(port) : port,
  });
  const answer = await call(
    'apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
    selfSubjectAccessReview({ user: '', groups: [], extra: {}, ...attributes }),
  );
  const common = commonRefusal(target, answer);
  if (common) throw common;
  const what = `create ${attributes.resource}/${attributes.subresource} "${printable(attributes.name)}" in namespace ${target.namespace}${onCluster(target)}`;
  if (answer.status !== 200 && answer.status !== 201)
    throw new Error(`cannot check whether you may ${what}: ${said(answer)}`);
  let review: unknown;
  try {
    review = JSON.parse(answer.text);
  } catch {
    throw new Error(`cannot check whether you may ${what}: the answer is not JSON`);
  }
  if (!reviewAllowed(review)) {
    const reason = (review as { status?: { reason?: unknown } }).status?.reason;
    const why = typeof reason === 'string' && reason ? ` (${printable(reason)})` : '';
    throw new Error(
      `forbidden: you may not ${what}${why}; port-forward needs it, ask the cluster's admin to grant it`,
    );
  }
}

/** The cluster a kubeconfig's server names (`https://proxy/clusters/edge`, as get kubeconfig writes), or ''. */
function clusterOfServer(base: string): string {
  const name = /\/clusters\/([^/]+)\/$/.exec(new URL(base).pathname)?.[1] ?? '';
  try {
    return decodeURIComponent(name);
  } catch {
    return name;
  }
}

/**
 * Checks a forward's target and ports with the cluster before anything listens; throws the first problem, one line
 * that says what to do.
 */
export async function checkForward(
  access: KubeconfigAccess,
  asked: CheckedTarget,
  remotes: string[],
): Promise<void> {
  const target = { ...asked, label: asked.cluster || clusterOfServer(access.base) };
  const call = caller(access, target);
  const object = await readTarget(call, target);
  if (object) {
    if (target.resource === 'pods' && object.status?.phase !== 'Running')
      throw new Error(
        `${described(target)} is ${printable(object.status?.phase ?? 'not running')}, not Running; wait until it runs (kubectl get pod shows why not)`,
      );
    // What the dialer never dials (lib/reach/dialer.ts), said before listening rather than on each connection.
    if (target.resource === 'pods' && object.spec?.hostNetwork)
      throw new Error(
        `${described(target)} uses its node's network, and a node's addresses are never dialed; forward to a pod on the pod network`,
      );
    if (target.resource === 'services' && object.spec?.type === 'ExternalName')
      throw new Error(
        `${described(target)} is an ExternalName, a host outside the cluster, which port-forward never reaches`,
      );
    for (const remote of remotes) {
      const problem = portProblem(target, object, remote);
      if (problem) throw new Error(problem);
    }
  }
  // A pod's connections are one question (pods/portforward on the pod); a Service's, one per port it names.
  for (const remote of target.resource === 'pods' ? remotes.slice(0, 1) : [...new Set(remotes)])
    await checkAllowed(call, target, remote);
}
