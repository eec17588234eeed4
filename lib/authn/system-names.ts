// Kubernetes reserves names that start with `system:` for its own components and built-in groups, and its RBAC
// trusts them: `system:masters` is cluster-admin without any binding, `system:kube-controller-manager` and
// `system:node:<name>` have wide built-in rights. An identity provider outside the cluster (an OIDC issuer, a
// token webhook) has no business minting such names, and one that is misconfigured or compromised must not turn
// into cluster-admin through the proxy or a TokenCredentialRequest certificate. So identities from external
// authenticators are refused when their username or any group is a system name, unless the authenticator opts out.
import type { UserInfo } from './types.ts';

export const SYSTEM_PREFIX = 'system:';

/**
 * The one system group an external identity may carry: every authenticated user is in it anyway (the proxy adds
 * it to every impersonated request, as the API server does), so it grants nothing, and webhooks that answer like
 * the API server's own TokenReview API list it.
 */
export const ALLOWED_SYSTEM_GROUP = 'system:authenticated';

/** What an authenticator's AuthenticatorValid condition adds when it opts out of the check. */
export const SYSTEM_NAMES_ALLOWED_NOTE = `it accepts usernames and groups that start with ${SYSTEM_PREFIX} (spec.allowSystemNames)`;

/** Why a user may not come from an external authenticator, or undefined when it may. */
export function systemNameProblem(user: Pick<UserInfo, 'username' | 'groups'>): string | undefined {
  if (user.username.startsWith(SYSTEM_PREFIX))
    return `username ${JSON.stringify(user.username)} is a system name`;
  const group = user.groups.find((g) => g.startsWith(SYSTEM_PREFIX) && g !== ALLOWED_SYSTEM_GROUP);
  if (group !== undefined) return `group ${JSON.stringify(group)} is a system name`;
  return undefined;
}
