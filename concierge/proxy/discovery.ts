// What the aggregated APIs tell the cluster's API server about themselves: discovery (the aggregated v2 document the
// API server asks for first, and the per-version resource lists it falls back to) and OpenAPI v3, so that
// `kubectl api-resources` lists TokenCredentialRequest and WhoAmIRequest and `kubectl explain` describes them.
import { createHash } from 'node:crypto';
import { apiGroups, Kind, Resource, VERSION } from '../../apis/groups.ts';
import type { Request, Response } from '../../lib/http2/request.ts';
import { send, writeStatus } from '../../lib/kube/status.ts';
import { NOT_FOUND, type Caller, type LocalAPI } from './local-apis.ts';

/** The content type of aggregated discovery, which the API server asks /apis for before it falls back. */
export const DISCOVERY_V2 = 'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList';

interface Served {
  group: string;
  kind: string;
  plural: string;
  verbs: string[];
  description: string;
  spec: Record<string, unknown>;
  status: Record<string, unknown>;
}

/** Every document, made once per group suffix; JSON text, with the version hashes OpenAPI v3 clients cache by. */
export interface DiscoveryDocuments {
  groups: string[];
  /** /apis with aggregated discovery v2. */
  aggregated: string;
  /** /apis as an APIGroupList. */
  groupList: string;
  /** /apis/<group> as an APIGroup, by group. */
  group: Map<string, string>;
  /** /apis/<group>/<version> as an APIResourceList, by group. */
  resourceList: Map<string, string>;
  /** /openapi/v3. */
  openAPIRoot: string;
  /** /openapi/v3/apis/<group>/<version>, by group. */
  openAPI: Map<string, string>;
}

const str = (description: string): Record<string, unknown> => ({ type: 'string', description });

function served(suffix: string): Served[] {
  const groups = apiGroups(suffix);
  return [
    {
      group: groups.login,
      kind: Kind.TokenCredentialRequest,
      plural: Resource.TokenCredentialRequest,
      verbs: ['create', 'list'],
      description:
        'TokenCredentialRequest trades a token, checked by a JWTAuthenticator or WebhookAuthenticator, for a short-lived client certificate the cluster signs. Anyone may create one; a token that is not accepted gets the status message "authentication failed".',
      spec: {
        type: 'object',
        properties: {
          token: str('The token to check: an OIDC ID token or a token a webhook checks.'),
          authenticator: {
            type: 'object',
            description: 'The authenticator that checks the token.',
            properties: {
              apiGroup: str(`The authenticator's API group, ${groups.authentication}.`),
              kind: str('JWTAuthenticator or WebhookAuthenticator.'),
              name: str("The authenticator's name."),
            },
            required: ['kind', 'name'],
          },
        },
      },
      status: {
        type: 'object',
        properties: {
          credential: {
            type: 'object',
            description: 'The issued credential, when the token was accepted.',
            properties: {
              expirationTimestamp: { type: 'string', format: 'date-time', description: 'When it expires.' },
              clientCertificateData: str('PEM client certificate: CN the username, O the groups.'),
              clientKeyData: str('PEM private key of the certificate.'),
            },
          },
          message: str('Set instead of credential when the token was not accepted.'),
        },
      },
    },
    {
      group: groups.identity,
      kind: Kind.WhoAmIRequest,
      plural: Resource.WhoAmIRequest,
      verbs: ['create'],
      description: 'WhoAmIRequest answers with the user the request was made as.',
      spec: { type: 'object' },
      status: {
        type: 'object',
        properties: {
          kubernetesUserInfo: {
            type: 'object',
            properties: {
              user: {
                type: 'object',
                properties: {
                  username: str('The username.'),
                  uid: str('The uid, if any.'),
                  groups: { type: 'array', items: { type: 'string' }, description: 'The groups.' },
                  extra: {
                    type: 'object',
                    additionalProperties: { type: 'array', items: { type: 'string' } },
                    description: 'Extra attributes.',
                  },
                },
              },
            },
          },
        },
      },
    },
  ];
}

function openAPIDocument(s: Served): Record<string, unknown> {
  const name = `${s.group.split('.').reverse().join('.')}.${VERSION}.${s.kind}`;
  const ref = { $ref: `#/components/schemas/${name}` };
  const json = { 'application/json': { schema: ref } };
  return {
    openapi: '3.0.0',
    info: { title: 'Sealion concierge', version: VERSION },
    paths: {
      [`/apis/${s.group}/${VERSION}/${s.plural}`]: {
        post: {
          description: `create a ${s.kind}`,
          operationId: `create${s.kind}`,
          // Field validation as the API server's own creates take it (concierge/proxy/login-apis.ts).
          parameters: [
            {
              name: 'fieldValidation',
              in: 'query',
              description: 'Ignore, Warn or Strict: what to do with fields the kind does not have.',
              schema: { type: 'string', uniqueItems: true },
            },
          ],
          requestBody: { content: json, required: true },
          responses: { '201': { description: 'Created', content: json } },
          'x-kubernetes-action': 'post',
          'x-kubernetes-group-version-kind': { group: s.group, version: VERSION, kind: s.kind },
        },
      },
    },
    components: {
      schemas: {
        [name]: {
          type: 'object',
          description: s.description,
          properties: {
            apiVersion: str(`${s.group}/${VERSION}`),
            kind: str(s.kind),
            metadata: { type: 'object', description: 'Standard object metadata; nothing in it is kept.' },
            spec: s.spec,
            status: s.status,
          },
          'x-kubernetes-group-version-kind': [{ group: s.group, version: VERSION, kind: s.kind }],
        },
      },
    },
  };
}

const cache = new Map<string, DiscoveryDocuments>();

export function discoveryDocuments(suffix: string): DiscoveryDocuments {
  const known = cache.get(suffix);
  if (known) return known;
  const all = served(suffix);
  const version = (s: Served): Record<string, unknown> => ({
    groupVersion: `${s.group}/${VERSION}`,
    version: VERSION,
  });
  const openAPI = new Map(all.map((s) => [s.group, JSON.stringify(openAPIDocument(s))]));
  const docs: DiscoveryDocuments = {
    groups: all.map((s) => s.group),
    aggregated: JSON.stringify({
      kind: 'APIGroupDiscoveryList',
      apiVersion: 'apidiscovery.k8s.io/v2',
      metadata: {},
      items: all.map((s) => ({
        metadata: { name: s.group },
        versions: [
          {
            version: VERSION,
            resources: [
              {
                resource: s.plural,
                responseKind: { group: s.group, version: VERSION, kind: s.kind },
                scope: 'Cluster',
                singularResource: s.kind.toLowerCase(),
                verbs: s.verbs,
              },
            ],
            freshness: 'Current',
          },
        ],
      })),
    }),
    groupList: JSON.stringify({
      kind: 'APIGroupList',
      apiVersion: 'v1',
      groups: all.map((s) => ({ name: s.group, versions: [version(s)], preferredVersion: version(s) })),
    }),
    group: new Map(
      all.map((s) => [
        s.group,
        JSON.stringify({
          kind: 'APIGroup',
          apiVersion: 'v1',
          name: s.group,
          versions: [version(s)],
          preferredVersion: version(s),
        }),
      ]),
    ),
    resourceList: new Map(
      all.map((s) => [
        s.group,
        JSON.stringify({
          kind: 'APIResourceList',
          apiVersion: 'v1',
          groupVersion: `${s.group}/${VERSION}`,
          resources: [
            {
              name: s.plural,
              singularName: s.kind.toLowerCase(),
              namespaced: false,
              kind: s.kind,
              verbs: s.verbs,
            },
          ],
        }),
      ]),
    ),
    openAPIRoot: JSON.stringify({
      paths: Object.fromEntries(
        all.map((s) => {
          const hash = createHash('sha512').update(openAPI.get(s.group)!).digest('hex').toUpperCase();
          return [
            `apis/${s.group}/${VERSION}`,
            { serverRelativeURL: `/openapi/v3/apis/${s.group}/${VERSION}?hash=${hash}` },
          ];
        }),
      ),
    }),
    openAPI,
  };
  cache.set(suffix, docs);
  return docs;
}

const JSON_TYPE = 'application/json';

/** Whether an Accept header asks for aggregated discovery v2 (in any of the forms clients write it). */
function wantsAggregated(accept: string | undefined): boolean {
  if (!accept) return false;
  return accept.split(',').some((part) => {
    const params = part.split(';').map((p) => p.trim().replace(/\s+/g, ''));
    return (
      params[0] === 'application/json' &&
      params.includes('g=apidiscovery.k8s.io') &&
      params.includes('v=v2') &&
      params.includes('as=APIGroupDiscoveryList')
    );
  });
}

/** A document only read (GET or HEAD): anything else is not found, as the API server answers it. */
const readOnly =
  (answer: (req: Request, res: Response) => void) =>
  (req: Request, res: Response): void => {
    if (req.method === 'GET' || req.method === 'HEAD') return answer(req, res);
    writeStatus(res, 404, NOT_FOUND);
  };

/** Discovery and OpenAPI as local APIs (the aggregated APIs' listener mounts them for `who`, the front proxy). */
export function discoveryAPIs(docs: DiscoveryDocuments, who: Caller): LocalAPI[] {
  const document = (path: string, body: string, headers?: Record<string, string>): LocalAPI => ({
    paths: [path],
    who,
    serve: readOnly((_req, res) => send(res, 200, JSON_TYPE, body, headers)),
  });
  return [
    {
      paths: ['/apis'],
      who,
      serve: readOnly((req, res) => {
        const aggregated = wantsAggregated(req.headers['accept']);
        send(res, 200, aggregated ? DISCOVERY_V2 : JSON_TYPE, aggregated ? docs.aggregated : docs.groupList);
      }),
    },
    document('/openapi/v3', docs.openAPIRoot),
    ...docs.groups.flatMap((group) => [
      document(`/apis/${group}`, docs.group.get(group)!),
      document(`/apis/${group}/${VERSION}`, docs.resourceList.get(group)!),
      document(`/openapi/v3/apis/${group}/${VERSION}`, docs.openAPI.get(group)!, {
        'cache-control': 'public, immutable',
      }),
    ]),
  ];
}
