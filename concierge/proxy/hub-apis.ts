// The local APIs the impersonation proxy mounts (local-apis.ts): health, the TokenCredentialRequest API (anonymous
// by design: it is how a user without credentials gets some), WhoAmIRequest, and the SessionRecording API at the
// hub's own URLs, for those the hub's RBAC lets read recordings, and the AccessRequest APIs (concierge/access/api.ts)
// there too.
import type { ApiGroups } from '../../apis/groups.ts';
import { groupSuffixOf, Resource, VERSION } from '../../apis/groups.ts';
import type { SSHDoor } from '../../apis/identity.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import { authenticatedGroups } from '../../lib/kube/authenticated.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { relay } from '../../lib/http2/memory-budget.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import { send, writeStatus } from '../../lib/kube/status.ts';
import type { RecordingStore } from '../recording/session.ts';
import { parseFilterQuery, type RecordingFilter } from '../recording/listing.ts';
import { discoveryDocuments } from './discovery.ts';
import { healthAPIs, inFlightLimit, tooManyLogins, type LocalAPI } from './local-apis.ts';
import {
  handleTokenCredentialRequest,
  handleWhoAmI,
  serveResourceList,
  type LoginDeps,
} from './login-apis.ts';

/**
 * TokenCredentialRequests in flight at once. It is the one API anybody may call, and each holds a body of up to
 * MAX_BODY_BYTES and an authenticator's time: 64 of them pin about 4 MiB of bodies. A real login is answered in
 * milliseconds (a webhook's in at most its timeout), so even a burst of logins stays far below; more get 429 with
 * Retry-After, which client-go waits out and retries.
 */
export const MAX_ANONYMOUS_IN_FLIGHT = 64;

export interface HubAPIDeps {
  groups: ApiGroups;
  login: LoginDeps;
  /** Whether the proxy reports ready (/readyz). */
  ready: () => boolean;
  reviewer: Reviewer;
  /** Every replica's recordings; undefined: the SessionRecording API answers 404. */
  recordingStore: RecordingStore | undefined;
  /** How to reach the SSH door now (its status); undefined while it is off. Default: always off. */
  sshDoor?: () => SSHDoor['status'] | undefined;
  /** The AccessRequest APIs (concierge/access/api.ts); each is hubOnly. Default: none. */
  accessAPIs?: readonly LocalAPI[];
}

/** The SSH door's path in the identity group. */
export const SSH_DOOR_RESOURCE = 'sshdoor';
/** The door's answer when it is off: what the person reading it can do about it. */
export const SSH_DOOR_OFF =
  'the SSH door is not enabled here; an admin turns it on with ssh.mode: enabled in the concierge config';

export function hubAPIs(deps: HubAPIDeps): LocalAPI[] {
  const { groups } = deps;
  const loginPrefix = `/apis/${groups.login}/${VERSION}`;
  const identityPrefix = `/apis/${groups.identity}/${VERSION}`;
  const recordingsPrefix = `/apis/${groups.recordings}/${VERSION}`;
  // TokenCredentialRequest's and WhoAmIRequest's resource lists, as the aggregated APIs serve them too.
  const lists = discoveryDocuments(groupSuffixOf(groups)).resourceList;
  const admit = inFlightLimit(MAX_ANONYMOUS_IN_FLIGHT);
  return [
    ...healthAPIs(deps.ready),
    {
      paths: [loginPrefix, `${loginPrefix}/`],
      who: 'anonymous',
      serve: (_req, res) => send(res, 200, 'application/json', lists.get(groups.login)!),
    },
    {
      paths: [`${loginPrefix}/*`],
      who: 'anonymous',
      async serve(req, res, path) {
        const release = admit();
        if (!release) return tooManyLogins(res);
        try {
          await handleTokenCredentialRequest(req, res, path.slice(loginPrefix.length), deps.login);
        } finally {
          release();
        }
      },
    },
    {
      paths: [identityPrefix, `${identityPrefix}/`],
      who: 'authenticated',
      serve: (_req, res) => send(res, 200, 'application/json', lists.get(groups.identity)!),
    },
    {
      // Anyone signed in may read how to reach the door: the same at every cluster's URL, since there is one door.
      paths: [`${identityPrefix}/${SSH_DOOR_RESOURCE}`],
      who: 'authenticated',
      serve: (req, res) => serveSshDoor(groups, deps.sshDoor?.(), req, res),
    },
    {
      paths: [`${identityPrefix}/*`],
      who: 'authenticated',
      serve: (req, res, path, user) =>
        handleWhoAmI(req, res, path.slice(identityPrefix.length), groups, user!),
    },
    {
      paths: [recordingsPrefix, `${recordingsPrefix}/`],
      who: 'authenticated',
      hubOnly: true,
      serve: (_req, res) =>
        serveResourceList(res, groups.recordings, Resource.SessionRecording, 'SessionRecording', [
          'get',
          'list',
        ]),
    },
    {
      paths: [
        `${recordingsPrefix}/${Resource.SessionRecording}`,
        `${recordingsPrefix}/${Resource.SessionRecording}/*`,
      ],
      who: 'authenticated',
      hubOnly: true,
      serve: (req, res, path, user) => serveRecordings(deps, req, res, path, user!),
    },
    ...(deps.accessAPIs ?? []),
  ];
}

/**
 * The SessionRecording API: the recorded sessions of every replica, listed and read by those the hub's RBAC lets
 * (verbs list and get on sessionrecordings in Sealion's recordings group).
 */
async function serveRecordings(
  deps: HubAPIDeps,
  req: Request,
  res: Response,
  path: string,
  user: UserInfo,
): Promise<void> {
  const { groups } = deps;
  const collection = `/apis/${groups.recordings}/${VERSION}/${Resource.SessionRecording}`;
  if (req.method !== 'GET') return writeStatus(res, 405, 'session recordings are only read');
  const store = deps.recordingStore;
  if (!store) return writeStatus(res, 404, 'this concierge records no sessions');
  let name: string;
  try {
    name = decodeURIComponent(path.slice(collection.length + 1));
  } catch {
    return writeStatus(res, 400, 'malformed recording name');
  }
  const allowed = await mayRead(deps, user, name);
  if (allowed === undefined)
    return writeStatus(res, 503, 'the API server could not be asked whether you may read recordings; retry', {
      retryAfterSeconds: 1,
    });
  if (!allowed)
    return writeStatus(
      res,
      403,
      `${Resource.SessionRecording}.${groups.recordings}${name ? ` "${name}"` : ''} is forbidden: User "${user.username}" cannot ${name ? 'get' : 'list'} it`,
    );
  if (!name) {
    const at = (req.url ?? '').indexOf('?');
    const filter = parseFilterQuery(new URLSearchParams(at < 0 ? '' : req.url!.slice(at + 1)));
    if ('problem' in filter) return writeStatus(res, 400, filter.problem);
    return listRecordings(groups, store, filter, res);
  }
  const content = await store.read(name);
  if (!content)
    return writeStatus(res, 404, `${Resource.SessionRecording}.${groups.recordings} "${name}" not found`);
  res.writeHead(200, { 'content-type': 'application/x-asciicast' });
  content.on('error', () => res.destroy());
  res.on('close', () => content.destroy());
  relay(content, res);
}

/** Whether the hub's RBAC lets `user` get the recording `name` (list them all, when ''); undefined: not asked. */
function mayRead(deps: HubAPIDeps, user: UserInfo, name: string): Promise<boolean | undefined> {
  return deps.reviewer
    .allowed({
      user: user.username,
      // As the API server would see the user: authenticated.
      groups: authenticatedGroups(user),
      extra: user.extra,
      ...(user.uid ? { uid: user.uid } : {}),
      verb: name ? 'get' : 'list',
      group: deps.groups.recordings,
      version: VERSION,
      resource: Resource.SessionRecording,
      ...(name ? { name } : {}),
    })
    .catch(() => undefined);
}

/**
 * The list, filtered and cut where the recordings are (query: `user`, `cluster`, `since` as RFC 3339, `limit`);
 * `metadata.remainingItemCount` says how many more matched, as a Kubernetes list cut by its limit does.
 */
async function listRecordings(
  groups: ApiGroups,
  store: RecordingStore,
  filter: RecordingFilter,
  res: Response,
): Promise<void> {
  const { found, remaining, unreachable } = await store.list(filter);
  send(
    res,
    200,
    'application/json',
    JSON.stringify({
      apiVersion: `${groups.recordings}/${VERSION}`,
      kind: 'SessionRecordingList',
      metadata: {
        ...(remaining > 0 ? { remainingItemCount: remaining } : {}),
        ...(unreachable.length > 0 ? { unreachableReplicas: unreachable } : {}),
      },
      items: found.map(({ id, replica, bytes, modified, started, ...facts }) => ({
        apiVersion: `${groups.recordings}/${VERSION}`,
        kind: 'SessionRecording',
        // Created when its session started; a recording whose header cannot be read, by its file's last write.
        metadata: { name: id, creationTimestamp: started ?? modified },
        status: {
          ...facts,
          replica,
          bytes,
          ...(started ? { startTime: started } : {}),
          lastWriteTime: modified,
        },
      })),
    }),
  );
}

/** The SSH door as a signed-in user reads it (apis/identity.ts SSHDoor), or 404 with what to do while it is off. */
function serveSshDoor(
  groups: ApiGroups,
  status: SSHDoor['status'] | undefined,
  req: Request,
  res: Response,
): void {
  if (req.method !== 'GET') return writeStatus(res, 405, 'the SSH door is only read');
  if (!status) return writeStatus(res, 404, SSH_DOOR_OFF);
  const door: SSHDoor = {
    apiVersion: `${groups.identity}/${VERSION}`,
    kind: 'SSHDoor',
    metadata: { name: SSH_DOOR_RESOURCE },
    status,
  };
  send(res, 200, 'application/json', JSON.stringify(door));
}
