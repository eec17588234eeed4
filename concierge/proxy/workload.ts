// Hub workloads on other clusters: a hub service account authenticated with a token for Sealion's audience acts on a
// cluster that takes workloads (its Cluster's spec.workloads) under a name mapped from its own, every name behind the
// Cluster's usernamePrefix, so that none can equal one of that cluster's own identities or a system: name. What the
// mapped name may do is that cluster's RBAC's to say, and whether the hub may assert it at all its grant to the agent.
import { usernamePrefixProblem, type ClusterSpec } from '../../apis/tunnel.ts';
import { AUTHENTICATED_GROUP } from '../../lib/kube/authenticated.ts';
import { serviceAccountOf } from '../../lib/kube/impersonation.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Refusal } from './exchange.ts';

/** The hub service account as the extra that records who really asked (the key nested impersonation uses too). */
export function originalUserInfo(user: UserInfo): string {
  return JSON.stringify({
    username: user.username,
    ...(user.uid ? { uid: user.uid } : {}),
    groups: user.groups,
    extra: user.extra,
  });
}

/**
 * The identity a hub service account has on a cluster with `prefix`: its username and its groups (but
 * system:authenticated, which the cluster adds itself) behind the prefix, and its own user info (with the pod it runs
 * in) in `originalUserKey`, for the cluster's audit log. No uid, and none of its own extras: those are the hub's
 * facts, which would mean something else on the cluster (a pod's name, a node's).
 */
export function mappedWorkload(hubUser: UserInfo, prefix: string, originalUserKey: string): UserInfo {
  return {
    username: `${prefix}${hubUser.username}`,
    groups: hubUser.groups.filter((g) => g !== AUTHENTICATED_GROUP).map((g) => `${prefix}${g}`),
    extra: { [originalUserKey]: [originalUserInfo(hubUser)] },
  };
}

/**
 * Why `user` may not appear on a cluster whose workloads' names are behind `prefix`, or undefined: its name or one of
 * its groups is behind the prefix, where only hub workloads are, so that nobody but a hub workload gets what that
 * cluster grants a mapped name or group. `impersonating`: the user is one a caller asks to act as.
 */
export function reservedNameRefusal(
  cluster: string,
  prefix: string,
  user: UserInfo,
  impersonating: boolean,
): Refusal | undefined {
  const found = user.username.startsWith(prefix)
    ? `the username ${JSON.stringify(user.username)}`
    : user.groups.filter((g) => g.startsWith(prefix)).map((g) => `the group ${JSON.stringify(g)}`)[0];
  if (!found) return undefined;
  const reserved = `the prefix ${JSON.stringify(prefix)} is reserved for hub workloads on that cluster (its Cluster's spec.workloads.usernamePrefix)`;
  return {
    status: 403,
    message: impersonating
      ? `cluster ${cluster}: cannot impersonate ${found}: ${reserved}; a hub workload reaches it with its own token for Sealion's workload audience`
      : `cluster ${cluster}: ${found} cannot be sent: ${reserved}; the hub's admin gives the user names outside it, or the Cluster another prefix`,
  };
}

/** The refusal of a workload's token on the hub's own API. */
export const WORKLOAD_ON_HUB =
  "a token for Sealion's workload audience reaches other clusters only, at /clusters/<name>/…; on the hub's own API use the service account's own token (for the API server's audience)";

/** The Cluster's usernamePrefix, or the refusal that says why the cluster takes no workloads. */
export function workloadPrefix(cluster: string, spec: ClusterSpec | undefined): string | Refusal {
  const workloads = spec?.workloads;
  if (workloads === undefined || workloads === null)
    return {
      status: 403,
      message: `cluster ${cluster} takes no workloads from the hub: its Cluster has no spec.workloads.usernamePrefix; the hub's admin sets one (e.g. "hub:") to let hub service accounts in under that prefix`,
    };
  const problem = usernamePrefixProblem((workloads as { usernamePrefix?: unknown }).usernamePrefix);
  if (problem)
    return {
      status: 403,
      message: `cluster ${cluster} takes no workloads from the hub: its Cluster's spec.workloads.usernamePrefix is invalid (${problem}); the hub's admin corrects it`,
    };
  return workloads.usernamePrefix;
}

/**
 * The refusal of a hub service account's own token (the API server's audience) on `/clusters/<cluster>/…`: it
 * names the audience to ask for, and the command that writes a kubeconfig with such a token.
 */
export function serviceAccountTokenRefusal(cluster: string, username: string, audience: string): Refusal {
  const account = serviceAccountOf(username);
  const name = account ? `${account.namespace}/${account.name}` : 'NAMESPACE/NAME';
  return {
    status: 403,
    message: `a token of the hub's API server cannot be used for cluster ${cluster}; use a projected service-account token with audience ${audience} (sealion cluster kubeconfig ${cluster} --service-account ${name})`,
  };
}
