// CustomResourceDefinitions for any group suffix. The OpenAPI schemas come from the TypeScript types in apis/
// (config/generate.ts turns them into config/schemas.generated.json); everything else about a CRD is here.
import { apiGroups, Kind, Resource, VERSION, type ApiGroups } from '../apis/groups.ts';
// Imported, not read from a path beside this file, so that a bundle of the CLI carries the schemas with it.
import generatedSchemas from '../config/schemas.generated.json' with { type: 'json' };

export type JSONSchema = { [key: string]: unknown };

/** The schemas of spec and status per kind, generated from apis/. */
export type KindSchemas = Record<CrdKind, { spec: JSONSchema; status: JSONSchema; description: string }>;

export type CrdKind =
  'JWTAuthenticator' | 'WebhookAuthenticator' | 'CredentialIssuer' | 'Cluster' | 'AccessRequest';
export const CRD_KINDS: readonly CrdKind[] = [
  'JWTAuthenticator',
  'WebhookAuthenticator',
  'CredentialIssuer',
  'Cluster',
  'AccessRequest',
];

/** A copy each call: callers may change what they get. */
export function loadKindSchemas(): KindSchemas {
  return structuredClone(generatedSchemas);
}

interface PrinterColumn {
  name: string;
  type: 'string' | 'date' | 'boolean' | 'integer';
  jsonPath: string;
  description?: string;
  priority?: number;
}

interface CrdShape {
  group: keyof ApiGroups;
  singular: string;
  shortNames: string[];
  categories: string[];
  columns: PrinterColumn[];
}

const AGE: PrinterColumn = { name: 'Age', type: 'date', jsonPath: '.metadata.creationTimestamp' };
const STATUS: PrinterColumn = { name: 'Status', type: 'string', jsonPath: '.status.phase' };
/** Where to point kubectl: what `kubectl get jwtauthenticators` must show for discovery to work. */
const PROXY_ENDPOINT: PrinterColumn = {
  name: 'Proxy Endpoint',
  type: 'string',
  jsonPath: '.status.conciergeStrategies[?(@.type=="ImpersonationProxy")].impersonationProxyConfig.endpoint',
  description: 'The impersonation proxy URL to point kubectl at',
};

const SHAPES: Record<CrdKind, CrdShape> = {
  JWTAuthenticator: {
    group: 'authentication',
    singular: 'jwtauthenticator',
    shortNames: ['jwtauth'],
    categories: ['sealion', 'authenticators'],
    columns: [
      { name: 'Issuer', type: 'string', jsonPath: '.spec.issuer' },
      { name: 'Audience', type: 'string', jsonPath: '.spec.audience' },
      STATUS,
      PROXY_ENDPOINT,
      AGE,
    ],
  },
  WebhookAuthenticator: {
    group: 'authentication',
    singular: 'webhookauthenticator',
    shortNames: ['webhookauth'],
    categories: ['sealion', 'authenticators'],
    columns: [{ name: 'Endpoint', type: 'string', jsonPath: '.spec.endpoint' }, STATUS, PROXY_ENDPOINT, AGE],
  },
  CredentialIssuer: {
    group: 'config',
    singular: 'credentialissuer',
    shortNames: [],
    categories: ['sealion'],
    columns: [
      { name: 'ProxyMode', type: 'string', jsonPath: '.spec.impersonationProxy.mode' },
      {
        name: 'DefaultStrategy',
        type: 'string',
        jsonPath: '.status.strategies[?(@.status == "Success")].type',
      },
      AGE,
    ],
  },
  Cluster: {
    group: 'tunnel',
    singular: 'cluster',
    shortNames: ['slcluster'],
    categories: ['sealion'],
    columns: [
      { name: 'Connected', type: 'boolean', jsonPath: '.status.connected' },
      { name: 'Since', type: 'date', jsonPath: '.status.connectedSince' },
      { name: 'Agent', type: 'string', jsonPath: '.status.agentVersion' },
      // A date column prints an age, and an age in the future as <invalid>: the expiry is shown as written.
      { name: 'Cert Expiry', type: 'string', jsonPath: '.status.certificateExpiry', priority: 1 },
      { name: 'Replicas', type: 'string', jsonPath: '.status.replicas', priority: 1 },
      { name: 'Transport', type: 'string', jsonPath: '.status.tunnels[*].transport', priority: 1 },
      { name: 'Policy', type: 'string', jsonPath: '.status.policy', priority: 1 },
      { name: 'Impersonation', type: 'string', jsonPath: '.status.impersonation', priority: 1 },
      // The prefix hub workloads' names take there; empty: the cluster takes none.
      { name: 'Workloads', type: 'string', jsonPath: '.spec.workloads.usernamePrefix', priority: 1 },
      AGE,
    ],
  },
  // What a reviewer watching `kubectl get accessrequests -w` needs to decide: who, what, where, for how long, why.
  AccessRequest: {
    group: 'access',
    singular: 'accessrequest',
    shortNames: ['areq'],
    categories: ['sealion'],
    columns: [
      { name: 'Requester', type: 'string', jsonPath: '.spec.requester.username' },
      { name: 'Clusters', type: 'string', jsonPath: '.spec.clusters' },
      { name: 'Groups', type: 'string', jsonPath: '.spec.groups' },
      { name: 'Duration', type: 'integer', jsonPath: '.spec.durationSeconds', description: 'seconds' },
      { name: 'Phase', type: 'string', jsonPath: '.status.phase' },
      { name: 'Reason', type: 'string', jsonPath: '.spec.reason' },
      // A date column prints an age, and one in the future as <invalid>: the end is shown as written.
      { name: 'Expires', type: 'string', jsonPath: '.status.expiresAt', priority: 1 },
      {
        name: 'Approvals',
        type: 'string',
        jsonPath: '.status.reviews[?(@.decision=="Approved")].user',
        priority: 1,
      },
      AGE,
    ],
  },
};

/** The CRD for one kind under a group suffix. */
export function crdFor(kind: CrdKind, suffix: string, schemas: KindSchemas): Record<string, unknown> {
  const shape = SHAPES[kind];
  const group = apiGroups(suffix)[shape.group];
  const plural = Resource[kind];
  const { spec, status, description } = schemas[kind];
  return {
    apiVersion: 'apiextensions.k8s.io/v1',
    kind: 'CustomResourceDefinition',
    metadata: { name: `${plural}.${group}`, labels: { 'app.kubernetes.io/part-of': 'sealion' } },
    spec: {
      group,
      scope: 'Cluster',
      names: {
        kind: Kind[kind],
        listKind: `${Kind[kind]}List`,
        plural,
        singular: shape.singular,
        ...(shape.shortNames.length > 0 ? { shortNames: shape.shortNames } : {}),
        categories: shape.categories,
      },
      versions: [
        {
          name: VERSION,
          served: true,
          storage: true,
          subresources: { status: {} },
          additionalPrinterColumns: shape.columns,
          schema: {
            openAPIV3Schema: {
              type: 'object',
              description,
              required: ['spec'],
              properties: {
                apiVersion: { type: 'string', description: 'The versioned schema of this object.' },
                kind: { type: 'string', description: 'The kind of this object.' },
                metadata: { type: 'object' },
                spec,
                status,
              },
            },
          },
        },
      ],
    },
  };
}

export function crds(suffix: string, schemas: KindSchemas = loadKindSchemas()): Record<string, unknown>[] {
  return CRD_KINDS.map((kind) => crdFor(kind, suffix, schemas));
}
