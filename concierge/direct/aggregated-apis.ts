// The local APIs the aggregated APIs' listener mounts (proxy/local-apis.ts), all for the user the front proxy names
// but health: discovery and OpenAPI, TokenCredentialRequest and WhoAmIRequest. A create is the cluster's to allow
// (delegated authorization, a SubjectAccessReview), as for any aggregated API server.
import type { ApiGroups } from '../../apis/groups.ts';
import { VERSION } from '../../apis/groups.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { writeStatus } from '../../lib/kube/status.ts';
import { discoveryAPIs, discoveryDocuments } from '../proxy/discovery.ts';
import { healthAPIs, inFlightLimit, type LocalAPI, type LocalHandler } from '../proxy/local-apis.ts';
import { handleTokenCredentialRequest, handleWhoAmI, type LoginDeps } from '../proxy/login-apis.ts';

/**
 * TokenCredentialRequests being checked and signed at once (their bodies in). Each costs the cluster a
 * CertificateSigningRequest's create, approval, signing and delete; more get 429 with Retry-After, which client-go waits
 * out. They all come through the API server's front proxy, whose own limits on requests in flight bound how many
 * bodies are being read.
 */
export const MAX_LOGINS_IN_FLIGHT = 32;

export interface AggregatedAPIDeps {
  groups: ApiGroups;
  groupSuffix: string;
  login: LoginDeps;
  /** Asks the cluster whether the front proxy's user may do what it asks (delegated authorization). */
  reviewer: Reviewer;
}

export function aggregatedAPIs(deps: AggregatedAPIDeps): LocalAPI[] {
  const { groups } = deps;
  const loginPrefix = `/apis/${groups.login}/${VERSION}`;
  const identityPrefix = `/apis/${groups.identity}/${VERSION}`;
  // Counted from the moment the body is in: a caller that sends its body slowly holds only its connection (the body
  // must come within its deadline), never a place a login needs.
  const login = { ...deps.login, admit: inFlightLimit(MAX_LOGINS_IN_FLIGHT) };
  return [
    // The API server's probes of an aggregated API server come without its front proxy's certificate.
    ...healthAPIs(() => true),
    ...discoveryAPIs(discoveryDocuments(deps.groupSuffix), 'front-proxy'),
    {
      paths: [`${loginPrefix}/*`],
      who: 'front-proxy',
      serve: creating(deps.reviewer, groups.login, 'tokencredentialrequests', (req, res, path) =>
        handleTokenCredentialRequest(req, res, path.slice(loginPrefix.length), login),
      ),
    },
    {
      paths: [`${identityPrefix}/*`],
      who: 'front-proxy',
      serve: creating(deps.reviewer, groups.identity, 'whoamirequests', (req, res, path, user) =>
        handleWhoAmI(req, res, path.slice(identityPrefix.length), groups, user!, deps.login.clock),
      ),
    },
  ];
}

/** `serve`, once the cluster allows the user a create (a POST) of `resource` in `group`; else 403. */
function creating(reviewer: Reviewer, group: string, resource: string, serve: LocalHandler): LocalHandler {
  return async (req, res, path, user) => {
    if (req.method === 'POST' && !(await allowed(reviewer, user!, group, resource)))
      return writeStatus(res, 403, `${user!.username} may not create ${resource}`);
    return serve(req, res, path, user);
  };
}

/** Delegated authorization: the cluster's own answer for this user creating `resource` in `group`. */
function allowed(reviewer: Reviewer, user: UserInfo, group: string, resource: string): Promise<boolean> {
  return reviewer.allowed({
    user: user.username,
    groups: user.groups,
    extra: user.extra,
    ...(user.uid ? { uid: user.uid } : {}),
    verb: 'create',
    group,
    version: VERSION,
    resource,
  });
}
