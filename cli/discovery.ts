// A resource type as a person names it (`po`, `pod`, `pods`, `deployments.apps`, `widgets.v1.example.com`), found in
// one cluster's own discovery, as kubectl finds it: each cluster answers for itself, since a custom resource may
// exist on one cluster only, or in another version there.
import type { KubeConfig } from '../lib/kube/kube.ts';
import { requestAsKubeconfig } from './whoami.ts';

/** One resource type a cluster serves. */
export interface ApiResource {
  /** '' for the core group. */
  group: string;
  version: string;
  /** The plural, as in the URL: `pods`. */
  resource: string;
  singular: string;
  shortNames: string[];
  kind: string;
  namespaced: boolean;
  verbs: string[];
}

/** Aggregated discovery (one request each for /api and /apis), with the classic documents as the type to fall to. */
const AGGREGATED =
  'application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json';

/** Discovery documents are larger than most answers: a cluster with many CRDs serves a few MiB. */
const DISCOVERY_MAX_BYTES = 16 * 1024 * 1024;

interface AggregatedList {
  kind?: string;
  items?: {
    metadata?: { name?: string };
    versions?: {
      version?: string;
      resources?: {
        resource?: string;
        singularResource?: string;
        shortNames?: string[];
        scope?: string;
        verbs?: string[];
        responseKind?: { kind?: string };
      }[];
    }[];
  }[];
}

interface ResourceList {
  groupVersion?: string;
  resources?: {
    name?: string;
    singularName?: string;
    shortNames?: string[];
    namespaced?: boolean;
    kind?: string;
    verbs?: string[];
  }[];
}

const strings = (v: unknown): string[] =>
  Array.isArray(v) ? v.filter((s): s is string => typeof s === 'string') : [];

/** The resources of an aggregated discovery list, each group's versions in the server's order of preference. */
export function fromAggregated(list: AggregatedList): ApiResource[] {
  const out: ApiResource[] = [];
  for (const group of list.items ?? [])
    for (const version of group.versions ?? [])
      for (const r of version.resources ?? []) {
        if (typeof r.resource !== 'string' || typeof version.version !== 'string') continue;
        out.push({
          group: group.metadata?.name ?? '',
          version: version.version,
          resource: r.resource,
          singular: r.singularResource ?? '',
          shortNames: strings(r.shortNames),
          kind: r.responseKind?.kind ?? '',
          namespaced: r.scope === 'Namespaced',
          verbs: strings(r.verbs),
        });
      }
  return out;
}

/** The resources of one classic APIResourceList (subresources, named `pods/log`, left out). */
export function fromResourceList(list: ResourceList): ApiResource[] {
  const gv = list.groupVersion ?? '';
  const [group, version] = gv.includes('/') ? gv.split('/', 2) : ['', gv];
  return (list.resources ?? [])
    .filter((r) => typeof r.name === 'string' && !r.name.includes('/'))
    .map((r) => ({
      group: group!,
      version: version!,
      resource: r.name!,
      singular: r.singularName ?? '',
      shortNames: strings(r.shortNames),
      kind: r.kind ?? '',
      namespaced: r.namespaced === true,
      verbs: strings(r.verbs),
    }));
}

/** Every resource type the current cluster of `config` serves, core first, then the groups in the server's order. */
export async function discover(config: KubeConfig, signal: AbortSignal): Promise<ApiResource[]> {
  const get = async (path: string, accept = 'application/json'): Promise<unknown> =>
    JSON.parse(await requestAsKubeconfig(config, path, { accept, signal, maxBytes: DISCOVERY_MAX_BYTES }));
  const [core, groups] = (await Promise.all([get('api', AGGREGATED), get('apis', AGGREGATED)])) as [
    AggregatedList,
    AggregatedList & { groups?: { preferredVersion?: { groupVersion?: string } }[] },
  ];
  if (core.kind === 'APIGroupDiscoveryList' && groups.kind === 'APIGroupDiscoveryList')
    return [...fromAggregated(core), ...fromAggregated(groups)];
  // A server before aggregated discovery: the core group's v1 and each group's preferred version, at once.
  const versions = [
    'api/v1',
    ...(groups.groups ?? []).flatMap((g) => {
      const gv = g.preferredVersion?.groupVersion;
      return typeof gv === 'string' ? [`apis/${gv}`] : [];
    }),
  ];
  const lists = await Promise.all(versions.map((path) => get(path) as Promise<ResourceList>));
  return lists.flatMap(fromResourceList);
}

/** `resource.version.group` or `resource.group` split as kubectl reads it; a bare name has no group. */
export function parseResourceArg(arg: string): { name: string; group?: string; version?: string }[] {
  const lower = arg.toLowerCase();
  const dot = lower.indexOf('.');
  if (dot < 0) return [{ name: lower }];
  const name = lower.slice(0, dot);
  const rest = lower.slice(dot + 1);
  const readings: { name: string; group?: string; version?: string }[] = [];
  const second = rest.indexOf('.');
  const version = second < 0 ? rest : rest.slice(0, second);
  // `deployments.v1.apps`: the middle part is a version only when it looks like one.
  if (second > 0 && /^v\d+((alpha|beta)\d+)?$/.test(version))
    readings.push({ name, version, group: rest.slice(second + 1) });
  readings.push({ name, group: rest });
  return readings;
}

/**
 * The resource type `arg` names among `resources` (one cluster's discovery), or undefined. As kubectl: the plural,
 * the singular or the kind first, then a short name; where two groups have the name, the first in discovery order
 * (the core group first); in a group, its preferred version unless one is named.
 */
export function resolveResource(arg: string, resources: ApiResource[]): ApiResource | undefined {
  for (const { name, group, version } of parseResourceArg(arg)) {
    const inScope = resources.filter(
      (r) => (group === undefined || r.group === group) && (version === undefined || r.version === version),
    );
    const byName = inScope.find(
      (r) => r.resource === name || r.singular === name || r.kind.toLowerCase() === name,
    );
    if (byName) return byName;
    const byShortName = inScope.find((r) => r.shortNames.includes(name));
    if (byShortName) return byShortName;
  }
  return undefined;
}

/** The URL path of a resource's collection, in `namespace` when it is namespaced and one is given. */
export function collectionPath(r: ApiResource, namespace: string): string {
  const base = r.group === '' ? `api/${r.version}` : `apis/${r.group}/${r.version}`;
  const ns = r.namespaced && namespace ? `namespaces/${encodeURIComponent(namespace)}/` : '';
  return `${base}/${ns}${r.resource}`;
}
