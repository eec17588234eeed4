// Where an SFTP path points in the tree the SSH door shows: `/` lists clusters, `/<cluster>` namespaces,
// `/<cluster>/<namespace>` pods, `/<cluster>/<namespace>/<pod>` containers, and below a container its own file
// system. A path is resolved as a whole (relative to `/`, `.` and `..` and repeated slashes gone) before it is split,
// so the container a request addresses is always the one its resolved path names, whatever `..` it held.
import type { ContainerRef } from './containers.ts';

/** What a resolved path names: one of the tree's four listing levels, or a path in a container. */
export type Location =
  | { level: 'root' }
  | { level: 'cluster'; cluster: string }
  | { level: 'namespace'; cluster: string; namespace: string }
  | { level: 'pod'; cluster: string; namespace: string; pod: string }
  /** `path` is absolute inside the container, `/` for its root. */
  | { level: 'file'; ref: ContainerRef; path: string };

/**
 * `path` as absolute segments: relative paths are taken from `/` (a session's only working directory), and `..`
 * above `/` stays at `/`, as it does on a POSIX file system.
 */
export function pathSegments(path: string): string[] {
  const segments: string[] = [];
  for (const part of path.split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') segments.pop();
    else segments.push(part);
  }
  return segments;
}

/** `path` resolved: absolute, without `.`, `..` or repeated slashes. */
export function resolvePath(path: string): string {
  return '/' + pathSegments(path).join('/');
}

export function locate(path: string): Location {
  const [cluster, namespace, pod, container, ...inside] = pathSegments(path);
  if (cluster === undefined) return { level: 'root' };
  if (namespace === undefined) return { level: 'cluster', cluster };
  if (pod === undefined) return { level: 'namespace', cluster, namespace };
  if (container === undefined) return { level: 'pod', cluster, namespace, pod };
  return { level: 'file', ref: { cluster, namespace, pod, container }, path: '/' + inside.join('/') };
}

/** The tree's path of `path` inside the container `ref`: the way back from a container's path to the user's. */
export function treePath(ref: ContainerRef, path: string): string {
  const root = `/${ref.cluster}/${ref.namespace}/${ref.pod}/${ref.container}`;
  const inside = resolvePath(path);
  return inside === '/' ? root : root + inside;
}

export function sameContainer(a: ContainerRef, b: ContainerRef): boolean {
  return (
    a.cluster === b.cluster && a.namespace === b.namespace && a.pod === b.pod && a.container === b.container
  );
}
