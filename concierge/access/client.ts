// The writes of AccessRequests, made with the concierge's own credentials on the hub (users hold no create, update or
// patch on them): a thin interface, so that the rules (api.ts, expiry.ts) are tested against an in-memory one.
import type { AccessRequest, AccessRequestStatus } from '../../apis/access.ts';
import { Resource, VERSION, type ApiGroups } from '../../apis/groups.ts';
import { apiStatusCode, type KubeClients } from '../../lib/kube/kube.ts';

/** A write the API server refused: its HTTP status (404 gone, 409 conflict or taken, 422 invalid). */
export class AccessWriteError extends Error {
  readonly code: number | undefined;
  constructor(code: number | undefined, message: string) {
    super(message);
    this.name = 'AccessWriteError';
    this.code = code;
  }
}

export interface AccessRequestClient {
  /** The request as the API server has it now (not a cache); undefined when there is none. */
  get(name: string): Promise<AccessRequest | undefined>;
  /** Creates it (its status is not written: the status subresource is); the object as created. */
  create(request: AccessRequest): Promise<AccessRequest>;
  /**
   * Replaces the status of `request` at its metadata.resourceVersion: AccessWriteError 409 when it changed since.
   * The object as written.
   */
  replaceStatus(request: AccessRequest, status: AccessRequestStatus): Promise<AccessRequest>;
  /** Deletes it; one already gone is no error. */
  delete(name: string): Promise<void>;
}

const rethrown = (err: unknown): never => {
  const code = apiStatusCode(err);
  const body = (err as { body?: unknown }).body;
  let message = (err as Error).message;
  if (typeof body === 'string')
    try {
      message = (JSON.parse(body) as { message?: string }).message ?? message;
    } catch {
      // not a Status: the exception's own message stands
    }
  throw new AccessWriteError(code, message);
};

export function newAccessRequestClient(clients: KubeClients, groups: ApiGroups): AccessRequestClient {
  const resource = { group: groups.access, version: VERSION, plural: Resource.AccessRequest };
  return {
    async get(name) {
      try {
        return (await clients.customObjects.getClusterCustomObject({ ...resource, name })) as AccessRequest;
      } catch (err) {
        if (apiStatusCode(err) === 404) return undefined;
        return rethrown(err);
      }
    },
    async create(request) {
      // The status subresource's: the API server drops it from a create.
      const body = { ...request, status: undefined };
      try {
        return (await clients.customObjects.createClusterCustomObject({
          ...resource,
          body,
        })) as AccessRequest;
      } catch (err) {
        return rethrown(err);
      }
    },
    async delete(name) {
      try {
        await clients.customObjects.deleteClusterCustomObject({ ...resource, name });
      } catch (err) {
        if (apiStatusCode(err) === 404) return;
        rethrown(err);
      }
    },
    async replaceStatus(request, status) {
      try {
        return (await clients.customObjects.replaceClusterCustomObjectStatus({
          ...resource,
          name: request.metadata.name!,
          body: { ...request, status },
        })) as AccessRequest;
      } catch (err) {
        return rethrown(err);
      }
    },
  };
}
