// The tree an SFTP session shows, read and changed: `/` and the clusters, namespaces, pods and containers below it
// come from the `Containers` lists and are read-only directories; a path in a container is a file there, whose
// attributes and listings come from `stat` run in that container.
import type { Attributes, FileEntry } from 'ssh2';
import type { Containers } from './containers.ts';
import {
  LIST_SCRIPT,
  SETSTAT_SCRIPT,
  SMALL_OUTPUT,
  STATUS,
  SftpFailure,
  failureFromError,
  script,
  succeeded,
  type SessionCommands,
} from './sftp-commands.ts';
import { locate, type Location } from './sftp-paths.ts';
import { STAT_FORMAT, longname, parseListing, parseStat, type FileInfo } from './sftp-stat.ts';

/** The cluster tree's directories: read-only for everyone, as nothing there can be changed through SFTP. */
const TREE_DIR_MODE = 0o40555;

/** A path in a container. */
export type FileAt = Extract<Location, { level: 'file' }>;

/** Where `path` points; a path no command could be given (it holds NUL) names nothing. */
export function where(path: string): Location {
  if (path.includes('\0'))
    throw new SftpFailure(STATUS.NO_SUCH_FILE, 'no such file: the path holds a NUL byte');
  return locate(path);
}

/** A location in a container, as `what` needs; the tree above the containers cannot be changed or read as a file. */
export function fileAt(loc: Location, what: 'read' | 'write' | 'change'): FileAt {
  if (loc.level === 'file' && loc.path !== '/') return loc;
  if (loc.level === 'file' && what === 'read') return loc;
  if (loc.level === 'file') {
    throw new SftpFailure(
      STATUS.PERMISSION_DENIED,
      "a container's root cannot be made, removed or changed here",
    );
  }
  const name = loc.level === 'root' ? '/' : `a ${loc.level}`;
  if (what === 'read') throw new SftpFailure(STATUS.FAILURE, `${name} is a directory`);
  throw new SftpFailure(
    STATUS.PERMISSION_DENIED,
    `${name} is a directory of the cluster tree, which is read-only`,
  );
}

/** The tree: its listing levels from the `Containers` lists, the files in them by commands. */
export interface Tree {
  /** `follow`: a symbolic link's target (STAT) rather than the link (LSTAT). */
  stat(loc: Location, follow: boolean): Promise<FileInfo>;
  list(loc: Location): Promise<FileEntry[]>;
  setAttrs(at: FileAt, attrs: Partial<Attributes>): Promise<void>;
}

/** `maxListingBytes`: the most output a directory's listing may have (`SftpLimits.maxListingBytes`). */
export function newTree(containers: Containers, commands: SessionCommands, maxListingBytes: number): Tree {
  return new ClusterTree(containers, commands, maxListingBytes);
}

const nowSeconds = (): number => Math.floor(Date.now() / 1000);

class ClusterTree implements Tree {
  /** The tree's directories carry the session's start as their times: they have none of their own. */
  private readonly dirInfo: FileInfo;
  private readonly containers: Containers;
  private readonly commands: SessionCommands;
  private readonly maxListingBytes: number;

  constructor(containers: Containers, commands: SessionCommands, maxListingBytes: number) {
    this.containers = containers;
    this.commands = commands;
    this.maxListingBytes = maxListingBytes;
    const started = nowSeconds();
    this.dirInfo = {
      attrs: { mode: TREE_DIR_MODE, size: 0, uid: 0, gid: 0, atime: started, mtime: started },
      links: 2,
      user: 'root',
      group: 'root',
    };
  }

  async stat(loc: Location, follow: boolean): Promise<FileInfo> {
    if (loc.level !== 'file') {
      await this.mustExist(loc);
      return this.dirInfo;
    }
    if (loc.path === '/') await this.mustExist(loc);
    const argv = ['stat', ...(follow ? ['-L'] : []), '-c', STAT_FORMAT, '--', loc.path];
    const out = succeeded(await this.commands.run(loc.ref, argv, SMALL_OUTPUT), 'stat');
    const info = parseStat(out.stdout.toString('utf8'));
    if (!info) throw new SftpFailure(STATUS.FAILURE, 'stat: output not understood');
    return info;
  }

  async list(loc: Location): Promise<FileEntry[]> {
    if (loc.level !== 'file') {
      await this.mustExist(loc);
      const t = nowSeconds();
      return (await this.children(loc)).map((name) => ({
        filename: name,
        longname: longname(name, this.dirInfo, t),
        attrs: this.dirInfo.attrs,
      }));
    }
    if (loc.path === '/') await this.mustExist(loc);
    return this.listFiles(loc);
  }

  async setAttrs(at: FileAt, attrs: Partial<Attributes>): Promise<void> {
    const args = setstatArgs(attrs);
    if (args.every((a) => a === '')) return;
    succeeded(
      await this.commands.run(at.ref, script(SETSTAT_SCRIPT, at.path, ...args), SMALL_OUTPUT),
      'setstat',
    );
  }

  /** A directory in a container, listed by `stat` of each of its files. */
  private async listFiles(loc: FileAt): Promise<FileEntry[]> {
    const out = succeeded(
      await this.commands.run(loc.ref, script(LIST_SCRIPT, loc.path), this.maxListingBytes),
      'list',
    );
    const files = parseListing(out.stdout.toString('utf8'));
    // `.` is always there to stat; without its line, this container's stat or `xargs -0` is not one we know.
    if (!files || files[0]?.name !== '.') {
      throw new SftpFailure(
        STATUS.FAILURE,
        'list: output not understood (does the container have stat and xargs -0?)',
      );
    }
    const t = nowSeconds();
    return files.map(({ name, info }) => ({
      filename: name,
      longname: longname(name, info, t),
      attrs: info.attrs,
    }));
  }

  /** The names one level below `loc` in the cluster tree (none below a container's root: those are files). */
  private async children(loc: Location): Promise<string[]> {
    const containers = this.containers;
    try {
      switch (loc.level) {
        case 'root':
          return await containers.clusters();
        case 'cluster':
          return await containers.namespaces(loc.cluster);
        case 'namespace':
          return await containers.pods(loc.cluster, loc.namespace);
        case 'pod':
          return await containers.containers(loc.cluster, loc.namespace, loc.pod);
        case 'file':
          return [];
      }
    } catch (err) {
      throw failureFromError(err);
    }
  }

  /** Refuses with NO_SUCH_FILE unless the list one level up names `loc` (a container: its root, `path` '/'). */
  private async mustExist(loc: Location): Promise<void> {
    const above = parentOf(loc);
    if (!above) return;
    const [parent, name] = above;
    if (!(await this.children(parent)).includes(name)) {
      throw new SftpFailure(
        STATUS.NO_SUCH_FILE,
        `no such ${loc.level === 'file' ? 'container' : loc.level}: ${name}`,
      );
    }
  }
}

/** The cluster tree's level above `loc` and the name `loc` has there; undefined for `/`. */
function parentOf(loc: Location): [Location, string] | undefined {
  switch (loc.level) {
    case 'root':
      return undefined;
    case 'cluster':
      return [{ level: 'root' }, loc.cluster];
    case 'namespace':
      return [{ level: 'cluster', cluster: loc.cluster }, loc.namespace];
    case 'pod':
      return [{ level: 'namespace', cluster: loc.cluster, namespace: loc.namespace }, loc.pod];
    case 'file':
      return [
        { level: 'pod', cluster: loc.ref.cluster, namespace: loc.ref.namespace, pod: loc.ref.pod },
        loc.ref.container,
      ];
  }
}

/** SETSTAT_SCRIPT's arguments after the path: size, mode, times and owner, each empty when not asked to change. */
function setstatArgs(attrs: Partial<Attributes>): string[] {
  const num = (v: number | undefined): string => (typeof v === 'number' ? String(v) : '');
  const times = typeof attrs.atime === 'number' && typeof attrs.mtime === 'number';
  const owner = typeof attrs.uid === 'number' && typeof attrs.gid === 'number';
  return [
    num(attrs.size),
    typeof attrs.mode === 'number' ? (attrs.mode & 0o7777).toString(8) : '',
    times ? num(attrs.atime) : '',
    times ? num(attrs.mtime) : '',
    owner ? num(attrs.uid) : '',
    owner ? num(attrs.gid) : '',
  ];
}
