// Builds Sealion's container image without a container engine, as an OCI image-layout archive: Debian's
// runtime libraries for Node, Node 24 itself (the `node` devDependency, stripped), the production dependencies
// from package-lock.json and the shipped sources. Every entry has a fixed owner, mode and time and the entries
// are sorted, so the same inputs give the same digest. `--rootfs DIR` writes the same files to a folder instead
// (what the Dockerfile copies into its image).
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  rmSync,
  symlinkSync,
  writeFileSync,
  chmodSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, posix } from 'node:path';
import { gzipSync } from 'node:zlib';
import { pack } from 'tar-stream';
import { CURRENT_PROTOCOL } from '../lib/tunnel/protocol.ts';
import { DEFAULT_IMAGE } from '../manifests/install.ts';
import { ensureStaticKubectl, pinnedVersions, REPO_ROOT } from './build.ts';
import { privatePath, sharedBuild } from './cache.ts';

/** The image's user and group: not root, and numeric so that the kubelet can check `runAsNonRoot`. */
export const IMAGE_UID = 65532;
const NODE_PATH = '/usr/local/bin/node';
const APP_DIR = '/app';
const IMAGE_CACHE = join(process.env['SEALION_CACHE_DIR'] ?? join(REPO_ROOT, '.cache/kube'), '..', 'image');
export const IMAGE_ARCHIVE = join(REPO_ROOT, 'dist/sealion-image.oci.tar');

/**
 * What a build may change of the tree it packs: one tree then gives two releases, an old and a new, for the upgrade
 * test (integration/upgrade.test.ts). Build options, not settings of the image: a running process reads no switch
 * that could make it claim another version or protocol.
 */
export interface ReleaseOptions {
  /** The product version the image reports (package.json's `version` inside it). Default: the tree's. */
  version?: string;
  /** The tunnel protocol's minor it speaks (CURRENT_PROTOCOL in lib/tunnel/protocol.ts). Default: the tree's. */
  protocolMinor?: number;
}

/** The tree's version, from package.json. */
const treeVersion = (): string =>
  (JSON.parse(readFileSync(join(REPO_ROOT, 'package.json'), 'utf8')) as { version: string }).version;

/**
 * The release after this tree's, as the upgrade test installs it: the next patch version marked `-next`, and the
 * protocol one minor up, the most the skew policy lets either end be ahead.
 */
export function nextRelease(): Required<ReleaseOptions> {
  const [major, minor, patch] = treeVersion().split(/[.-]/).map(Number) as [number, number, number];
  return { version: `${major}.${minor}.${patch + 1}-next`, protocolMinor: CURRENT_PROTOCOL.minor + 1 };
}
/** Where `ensureNextImage` writes the next release's image. */
export const NEXT_IMAGE_ARCHIVE = join(REPO_ROOT, 'dist/sealion-image-next.oci.tar');
/** The next release's image name: the default image's, tagged with the next version. */
export const nextImageName = (): string =>
  `${DEFAULT_IMAGE.slice(0, DEFAULT_IMAGE.lastIndexOf(':'))}:v${nextRelease().version}`;

/**
 * What the image holds of each Debian package: the shared libraries `ldd node` names, and the copyright notices
 * (libstdc++6's and libgcc-s1's are gcc-12-base's).
 */
const DEBIAN_FILES: Record<string, string[]> = {
  libc6: [
    'usr/share/doc/libc6/copyright',
    'lib64/ld-linux-x86-64.so.2',
    'lib/x86_64-linux-gnu/ld-linux-x86-64.so.2',
    'lib/x86_64-linux-gnu/libc.so.6',
    'lib/x86_64-linux-gnu/libm.so.6',
    'lib/x86_64-linux-gnu/libdl.so.2',
    'lib/x86_64-linux-gnu/libpthread.so.0',
  ],
  'libstdc++6': ['usr/lib/x86_64-linux-gnu/libstdc++.so.6'],
  'libgcc-s1': ['lib/x86_64-linux-gnu/libgcc_s.so.1'],
  'gcc-12-base': ['usr/share/doc/gcc-12-base/copyright'],
};
/** The shipped sources; tests (`*.test.ts`) stay out. */
const APP_PATHS = [
  'package.json',
  'bin',
  'apis',
  'agent',
  'cli',
  'concierge',
  'controllers',
  'lib',
  'manifests',
  'config/schemas.generated.json',
];

interface Entry {
  /** Absolute path inside the image. */
  path: string;
  type: 'file' | 'directory' | 'symlink';
  mode: number;
  data?: Buffer;
  linkname?: string;
}

export interface Layer {
  comment: string;
  entries: Entry[];
}

export function file(path: string, data: Buffer | string, mode = 0o644): Entry {
  return { path, type: 'file', mode, data: Buffer.from(data) };
}

/** Adds what lies at `source` (a file, a symlink or a folder, recursively) to `into` at image path `path`. */
function addTree(
  into: Entry[],
  source: string,
  path: string,
  skip: (name: string, dir: boolean) => boolean,
): void {
  const stat = lstatSync(source);
  if (stat.isSymbolicLink()) {
    into.push({ path, type: 'symlink', mode: 0o777, linkname: readlinkSync(source) });
  } else if (stat.isDirectory()) {
    into.push({ path, type: 'directory', mode: 0o755 });
    for (const name of readdirSync(source)) {
      const child = join(source, name);
      if (!skip(name, lstatSync(child).isDirectory())) addTree(into, child, posix.join(path, name), skip);
    }
  } else if (stat.isFile()) {
    // Owner's execute bit decides: files are world-readable, never writable by the image's user.
    into.push(file(path, readFileSync(source), stat.mode & 0o100 ? 0o755 : 0o644));
  }
}

function run(command: string, args: string[], cwd?: string): string {
  try {
    return execFileSync(command, args, { cwd, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr ?? '';
    throw new Error(`${command} ${args.join(' ')} failed: ${stderr.trim() || (err as Error).message}`, {
      cause: err,
    });
  }
}

/**
 * The files at `paths` of a Debian package (and what their symlinks point to); returns the package's version. The
 * .deb is fetched once with `apt-get download` and kept in the cache.
 */
function debianFiles(pkg: string, paths: string[], into: Entry[], log: (line: string) => void): string {
  const debs = join(IMAGE_CACHE, 'debs');
  mkdirSync(debs, { recursive: true });
  let deb = readdirSync(debs).find((name) => name.startsWith(`${pkg}_`) && name.endsWith('.deb'));
  if (!deb) {
    log(`fetching Debian's ${pkg} (apt-get download)`);
    // Fetched into a private folder and renamed into the cache, so a builder in parallel never reads half a file.
    const partial = privatePath(join(debs, pkg));
    mkdirSync(partial);
    try {
      run('apt-get', ['download', pkg], partial);
      deb = readdirSync(partial).find((name) => name.startsWith(`${pkg}_`) && name.endsWith('.deb'));
      if (!deb) throw new Error(`apt-get download ${pkg} left no .deb`);
      renameSync(join(partial, deb), join(debs, deb));
    } catch (err) {
      throw new Error(
        `${(err as Error).message}\n(if apt knows no package lists yet, run apt-get update first)`,
        { cause: err },
      );
    } finally {
      rmSync(partial, { recursive: true, force: true });
    }
  }
  const version = run('dpkg-deb', ['--field', join(debs, deb), 'Version']).trim();
  const tree = mkdtempSync(join(tmpdir(), 'sealion-deb-'));
  try {
    run('dpkg-deb', ['-x', join(debs, deb), tree]);
    for (const path of paths) {
      let source = join(tree, path);
      if (!existsSync(source)) throw new Error(`${deb} holds no ${path}`);
      addTree(into, source, `/${path}`, () => false);
      // A library's soname is a symlink to the versioned file, which the image needs too.
      while (lstatSync(source).isSymbolicLink()) {
        const target = readlinkSync(source);
        const imagePath = posix.resolve(posix.dirname(`/${path}`), target);
        source = join(tree, imagePath);
        if (!existsSync(source)) throw new Error(`${deb}: ${path} points outside the package, to ${target}`);
        addTree(into, source, imagePath, () => false);
      }
    }
  } finally {
    rmSync(tree, { recursive: true, force: true });
  }
  return version;
}

function debianLayer(log: (line: string) => void): { layer: Layer; packages: string[] } {
  const entries: Entry[] = [];
  const packages = Object.entries(DEBIAN_FILES).map(
    ([pkg, paths]) => `${pkg}=${debianFiles(pkg, paths, entries, log)}`,
  );
  const base: Entry[] = [
    { path: '/tmp', type: 'directory', mode: 0o1777 },
    file(
      '/etc/passwd',
      `root:x:0:0:root:/root:/sbin/nologin\nsealion:x:${IMAGE_UID}:${IMAGE_UID}::/app:/sbin/nologin\n`,
    ),
    file('/etc/group', `root:x:0:\nsealion:x:${IMAGE_UID}:\n`),
    file('/etc/nsswitch.conf', 'hosts: files dns\n'),
  ];
  return {
    layer: { comment: `Debian runtime libraries: ${packages.join(' ')}`, entries: [...base, ...entries] },
    packages,
  };
}

/** Node itself, without its debugging symbols (126 MB → 108 MB); the binary is otherwise the npm package's. */
function nodeLayer(): { layer: Layer; version: string } {
  const source = join(REPO_ROOT, 'node_modules/node/bin/node');
  const version = run(source, ['--version']).trim();
  const scratch = mkdtempSync(join(tmpdir(), 'sealion-node-'));
  try {
    const stripped = join(scratch, 'node');
    run('strip', ['--strip-all', '-o', stripped, source]);
    return {
      layer: { comment: `Node ${version}`, entries: [file(NODE_PATH, readFileSync(stripped), 0o755)] },
      version,
    };
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/**
 * Files no process reads at run time: TypeScript (declarations, and sources Node never runs inside node_modules),
 * source maps, documentation. Licences stay.
 */
function droppedFromPackages(name: string, dir: boolean): boolean {
  if (dir) return name === 'node_modules';
  if (/^(licen[cs]e|notice|copying)/i.test(name)) return false;
  return /\.([cm]?ts|map|md|markdown)$/i.test(name);
}

/** The production dependencies exactly as package-lock.json resolves them (what `npm ci --omit=dev` installs). */
function dependenciesLayer(): Layer {
  const lock = JSON.parse(readFileSync(join(REPO_ROOT, 'package-lock.json'), 'utf8')) as {
    packages: Record<string, { dev?: boolean; devOptional?: boolean; optional?: boolean }>;
  };
  const entries: Entry[] = [];
  for (const [path, meta] of Object.entries(lock.packages)) {
    if (!path.startsWith('node_modules/') || meta.dev || meta.devOptional) continue;
    const source = join(REPO_ROOT, path);
    if (!existsSync(source)) {
      if (meta.optional) continue; // another platform's build
      throw new Error(`${path} is missing: run npm ci`);
    }
    // Nested node_modules folders are packages of their own in the lock file, judged on their own.
    addTree(entries, source, posix.join(APP_DIR, path), droppedFromPackages);
  }
  return { comment: 'production dependencies (package-lock.json)', entries };
}

function appLayer(release: ReleaseOptions): Layer {
  const entries: Entry[] = [];
  for (const path of APP_PATHS) {
    addTree(entries, join(REPO_ROOT, path), posix.join(APP_DIR, path), (name, dir) =>
      dir ? name === 'node_modules' : name.endsWith('.test.ts') || name === 'README.md',
    );
  }
  return { comment: 'Sealion', entries: entries.map((entry) => asReleased(entry, release)) };
}

const PROTOCOL_SOURCE = `${APP_DIR}/lib/tunnel/protocol.ts`;
/** The one line that states the tree's protocol; a build that changes the minor rewrites it. */
const PROTOCOL_LINE =
  /^(export const CURRENT_PROTOCOL: ProtocolVersion = \{ major: \d+, minor: )\d+( \};)$/gm;

/**
 * An entry of the app layer as `release` has it: package.json with its version, protocol.ts with its minor. A
 * protocol.ts whose line no longer reads as PROTOCOL_LINE fails the build, rather than giving an image that claims
 * a protocol it does not speak.
 */
function asReleased(entry: Entry, release: ReleaseOptions): Entry {
  if (entry.path === `${APP_DIR}/package.json` && release.version !== undefined) {
    const json = JSON.parse(entry.data!.toString('utf8')) as Record<string, unknown>;
    return file(
      entry.path,
      `${JSON.stringify({ ...json, version: release.version }, null, 2)}\n`,
      entry.mode,
    );
  }
  if (entry.path === PROTOCOL_SOURCE && release.protocolMinor !== undefined) {
    const text = entry.data!.toString('utf8');
    const lines = text.match(PROTOCOL_LINE) ?? [];
    if (lines.length !== 1)
      throw new Error(
        `lib/tunnel/protocol.ts states CURRENT_PROTOCOL on ${lines.length} lines of ${PROTOCOL_LINE}`,
      );
    return file(entry.path, text.replace(PROTOCOL_LINE, `$1${release.protocolMinor}$2`), entry.mode);
  }
  return entry;
}

/** Adds the folders above each entry and sorts, so that an archive's order never depends on a folder listing. */
function normalized(entries: Entry[]): Entry[] {
  const byPath = new Map<string, Entry>();
  for (const entry of entries) {
    for (let dir = posix.dirname(entry.path); dir !== '/'; dir = posix.dirname(dir)) {
      if (!byPath.has(dir)) byPath.set(dir, { path: dir, type: 'directory', mode: 0o755 });
    }
    byPath.set(entry.path, entry);
  }
  return [...byPath.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

/** A tar of entries with every field that could differ between machines fixed. */
async function tarOf(entries: { name: string; entry: Entry }[]): Promise<Buffer> {
  const archive = pack();
  const chunks: Buffer[] = [];
  archive.on('data', (chunk: unknown) => chunks.push(chunk as Buffer));
  const ended = new Promise<void>((done, fail) => {
    archive.on('end', done);
    archive.on('error', fail);
  });
  for (const { name, entry } of entries) {
    const header = {
      name,
      type: entry.type,
      mode: entry.mode,
      mtime: new Date(0),
      uid: 0,
      gid: 0,
      uname: '',
      gname: '',
      ...(entry.type === 'symlink' ? { linkname: entry.linkname } : {}),
    };
    await new Promise<void>((done, fail) => {
      const callback = (err?: Error | null): void => (err ? fail(err) : done());
      if (entry.type === 'file') archive.entry(header, entry.data ?? Buffer.alloc(0), callback);
      else archive.entry(header, callback);
    });
  }
  archive.finalize();
  await ended;
  return Buffer.concat(chunks);
}

function sha256(data: Buffer | string): string {
  return `sha256:${createHash('sha256').update(data).digest('hex')}`;
}

interface Blob {
  digest: string;
  data: Buffer;
}

export interface BuiltImage {
  archive: string;
  /** The manifest's digest: what a registry and the container runtime call the image. */
  digest: string;
  /** Compressed size of the layers, what a node pulls. */
  compressedBytes: number;
  /** Size of the unpacked root filesystem. */
  unpackedBytes: number;
  name: string;
}

interface Contents {
  layers: Layer[];
  labels: Record<string, string>;
}

function contents(log: (line: string) => void, release: ReleaseOptions = {}): Contents {
  const debian = debianLayer(log);
  const node = nodeLayer();
  const version = release.version ?? treeVersion();
  return {
    layers: [debian.layer, node.layer, dependenciesLayer(), appLayer(release)],
    labels: {
      'org.opencontainers.image.title': 'sealion',
      'org.opencontainers.image.version': version,
      'org.opencontainers.image.licenses': 'Apache-2.0',
      'dev.sealion.node': node.version,
      'dev.sealion.debian-packages': debian.packages.join(' '),
    },
  };
}

/** An image to write: its layers (first at the bottom) and the runtime settings of its config. */
export interface ImageSpec {
  name: string;
  layers: Layer[];
  config: {
    User?: string;
    Entrypoint: string[];
    Env?: string[];
    WorkingDir?: string;
    Labels?: Record<string, string>;
  };
}

/**
 * Debian's static busybox, the demo image's, written to `path` (executable): the SFTP tests run it as a container's
 * tools. The package is fetched once with `apt-get download`, as for the image; throws when it cannot be had.
 */
export function writeDebianBusybox(path: string, log: (line: string) => void = () => {}): string {
  const entries: Entry[] = [];
  const version = debianFiles('busybox-static', ['bin/busybox'], entries, log);
  writeFileSync(path, entries.find((e) => e.path === '/bin/busybox')!.data!, { mode: 0o755 });
  return version;
}

/** The demo workload's image: Debian's static busybox, with a link for each command it has (tar among them). */
export const DEMO_IMAGE = 'sealion.dev/demo-busybox:1';

export async function ensureDemoImage(log: (line: string) => void = () => {}): Promise<string> {
  const archive = join(IMAGE_CACHE, 'demo-busybox.oci.tar');
  if (existsSync(archive)) return archive;
  return sharedBuild(archive, () => buildDemoImage(archive, log));
}

async function buildDemoImage(archive: string, log: (line: string) => void): Promise<string> {
  const entries: Entry[] = [];
  const version = debianFiles(
    'busybox-static',
    ['bin/busybox', 'usr/share/doc/busybox-static/copyright'],
    entries,
    log,
  );
  const binary = entries.find((e) => e.path === '/bin/busybox')!.data!;
  const scratch = mkdtempSync(join(tmpdir(), 'sealion-busybox-'));
  try {
    writeFileSync(join(scratch, 'busybox'), binary, { mode: 0o755 });
    for (const applet of run(join(scratch, 'busybox'), ['--list']).split('\n').filter(Boolean)) {
      if (applet !== 'busybox')
        entries.push({ path: `/bin/${applet}`, type: 'symlink', mode: 0o777, linkname: 'busybox' });
    }
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
  entries.push({ path: '/tmp', type: 'directory', mode: 0o1777 });
  await writeImage(
    {
      name: DEMO_IMAGE,
      layers: [{ comment: `Debian's busybox-static ${version}`, entries }],
      config: { Entrypoint: ['/bin/sh'], Env: ['PATH=/bin'], User: '1000:1000', WorkingDir: '/tmp' },
    },
    archive,
  );
  return archive;
}

/**
 * The name of the Kubernetes project's own kubectl image at the pinned release. The nodes pull nothing, so a manifest
 * that names it runs the image ensureKubectlImage makes under that name.
 */
export const kubectlImageName = (): string => `registry.k8s.io/kubectl:${pinnedVersions().kubernetes}`;

/**
 * An image holding kubectl alone (built static from the pinned release, so it needs no libc), at /bin/kubectl: what a
 * pod on a node runs as a stand-in for a controller. Made once; returns the archive.
 */
export async function ensureKubectlImage(log: (line: string) => void = () => {}): Promise<string> {
  const binary = await ensureStaticKubectl(log);
  const version = pinnedVersions().kubernetes;
  const archive = join(IMAGE_CACHE, `kubectl-${version}.oci.tar`);
  if (existsSync(archive)) return archive;
  return sharedBuild(archive, async () => {
    await writeImage(
      {
        name: kubectlImageName(),
        layers: [
          {
            comment: `kubectl ${version}, static`,
            entries: [
              { path: '/bin', type: 'directory', mode: 0o755 },
              file('/bin/kubectl', readFileSync(binary), 0o755),
              { path: '/tmp', type: 'directory', mode: 0o1777 },
            ],
          },
        ],
        config: {
          User: `${IMAGE_UID}:${IMAGE_UID}`,
          Entrypoint: ['/bin/kubectl'],
          Env: ['PATH=/bin'],
          WorkingDir: '/tmp',
        },
      },
      archive,
    );
    return archive;
  });
}

/**
 * Builds Sealion's image as an OCI archive at `archive` and returns its digest and sizes; `release` changes the
 * version and protocol it states (ReleaseOptions). Layers are cached by content, so a second release of one tree
 * costs only its app layer.
 */
export async function buildImage(
  log: (line: string) => void = () => {},
  archive = IMAGE_ARCHIVE,
  name = DEFAULT_IMAGE,
  release: ReleaseOptions = {},
): Promise<BuiltImage> {
  const { layers, labels } = contents(log, release);
  return writeImage(
    {
      name,
      layers,
      config: {
        User: `${IMAGE_UID}:${IMAGE_UID}`,
        Entrypoint: [NODE_PATH, `${APP_DIR}/bin/sealion.js`],
        Env: ['PATH=/usr/local/bin:/usr/bin:/bin', 'NODE_ENV=production'],
        WorkingDir: APP_DIR,
        Labels: labels,
      },
    },
    archive,
  );
}

/** The next release's image (nextRelease) of this tree, as the upgrade test upgrades to. */
export function buildNextImage(log: (line: string) => void = () => {}): Promise<BuiltImage> {
  return buildImage(log, NEXT_IMAGE_ARCHIVE, nextImageName(), nextRelease());
}

/** Writes an OCI image-layout archive (which `ctr images import`, `podman load` and `docker load` read). */
export async function writeImage(spec: ImageSpec, archive: string): Promise<BuiltImage> {
  const { name, layers } = spec;
  const blobs: Blob[] = [];
  const layerDescriptors = [];
  const diffIds: string[] = [];
  let unpackedBytes = 0;
  for (const layer of layers) {
    const entries = normalized(layer.entries);
    unpackedBytes += entries.reduce((sum, e) => sum + (e.data?.length ?? 0), 0);
    const tar = await tarOf(entries.map((entry) => ({ name: entry.path.slice(1), entry })));
    const diffId = sha256(tar);
    diffIds.push(diffId);
    // Node's gzip header carries no time or name, so equal tars compress to equal bytes: a layer compressed
    // before is taken from the cache (Node's is the slow one).
    const cached = join(IMAGE_CACHE, 'layers', `${diffId.slice('sha256:'.length)}.tar.gz`);
    let gz: Buffer;
    if (existsSync(cached)) {
      gz = readFileSync(cached);
    } else {
      gz = gzipSync(tar, { level: 9 });
      mkdirSync(dirname(cached), { recursive: true });
      const partial = privatePath(cached);
      writeFileSync(partial, gz);
      renameSync(partial, cached);
    }
    const blob = { digest: sha256(gz), data: gz };
    blobs.push(blob);
    layerDescriptors.push({
      mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip',
      digest: blob.digest,
      size: gz.length,
    });
  }
  const config = Buffer.from(
    JSON.stringify({
      created: '1970-01-01T00:00:00Z',
      architecture: 'amd64',
      os: 'linux',
      config: spec.config,
      rootfs: { type: 'layers', diff_ids: diffIds },
      history: layers.map((layer) => ({ created: '1970-01-01T00:00:00Z', created_by: layer.comment })),
    }),
  );
  const configBlob = { digest: sha256(config), data: config };
  const manifest = Buffer.from(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: 'application/vnd.oci.image.manifest.v1+json',
      config: {
        mediaType: 'application/vnd.oci.image.config.v1+json',
        digest: configBlob.digest,
        size: config.length,
      },
      layers: layerDescriptors,
    }),
  );
  const manifestBlob = { digest: sha256(manifest), data: manifest };
  const tag = name.slice(name.lastIndexOf(':') + 1);
  const index = {
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.index.v1+json',
    manifests: [
      {
        mediaType: 'application/vnd.oci.image.manifest.v1+json',
        digest: manifestBlob.digest,
        size: manifest.length,
        // containerd's `ctr images import` names the image from the first, other tools from the second.
        annotations: { 'io.containerd.image.name': name, 'org.opencontainers.image.ref.name': tag },
      },
    ],
  };
  const blobPath = (digest: string): string => `blobs/sha256/${digest.slice('sha256:'.length)}`;
  // Docker's `docker load` reads this list; OCI tools read index.json.
  const dockerManifest = [
    { Config: blobPath(configBlob.digest), RepoTags: [name], Layers: blobs.map((b) => blobPath(b.digest)) },
  ];
  const files: { name: string; entry: Entry }[] = [
    { name: 'oci-layout', entry: file('/', JSON.stringify({ imageLayoutVersion: '1.0.0' })) },
    { name: 'index.json', entry: file('/', JSON.stringify(index)) },
    { name: 'manifest.json', entry: file('/', JSON.stringify(dockerManifest)) },
    { name: 'blobs/', entry: { path: '/', type: 'directory', mode: 0o755 } },
    { name: 'blobs/sha256/', entry: { path: '/', type: 'directory', mode: 0o755 } },
    ...[configBlob, manifestBlob, ...blobs].map((blob) => ({
      name: blobPath(blob.digest),
      entry: file('/', blob.data),
    })),
  ];
  mkdirSync(dirname(archive), { recursive: true });
  const partial = privatePath(archive);
  writeFileSync(partial, await tarOf(files));
  renameSync(partial, archive);
  return {
    archive,
    digest: manifestBlob.digest,
    compressedBytes: blobs.reduce((sum, b) => sum + b.data.length, 0),
    unpackedBytes,
    name,
  };
}

/** Writes the image's files into `dir` (which must not exist yet), with the image's modes. */
export function writeRootfs(dir: string, log: (line: string) => void = () => {}): void {
  if (existsSync(dir)) throw new Error(`${dir} exists; give a new folder`);
  for (const layer of contents(log).layers) {
    for (const entry of normalized(layer.entries)) {
      const target = join(dir, entry.path);
      if (entry.type === 'directory') mkdirSync(target, { recursive: true });
      else if (entry.type === 'symlink') symlinkSync(entry.linkname!, target);
      else writeFileSync(target, entry.data!);
      if (entry.type !== 'symlink') chmodSync(target, entry.mode);
    }
  }
}
