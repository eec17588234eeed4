// Builds the real kube-apiserver, kube-controller-manager, kubectl and etcd from the Go modules pinned in
// integration/kube/*/go.mod, into .cache/kube/<name>-<version>/. A later run finds them there; Go's own
// build cache makes a rebuild after a cache wipe cost minutes less than the first one.
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { privatePath, sharedBuild } from './cache.ts';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const KUBE_MODULES = join(REPO_ROOT, 'integration/kube');
/** Overridable so several clones on one machine can share one cache. */
export const CACHE_DIR = process.env['SEALION_CACHE_DIR'] ?? join(REPO_ROOT, '.cache/kube');
/** How often a running build reports progress. */
const PROGRESS_INTERVAL_MS = 15_000;

export interface Binaries {
  kubeApiserver: string;
  kubeControllerManager: string;
  kubectl: string;
  etcd: string;
}

export interface PinnedVersions {
  kubernetes: string;
  etcd: string;
  cniPlugins: string;
  coredns: string;
}

/** What a node adds: the kubelet, kube-proxy, the scheduler, and the CNI plugins pods' networks are made with. */
export interface NodeBinaries {
  kubelet: string;
  kubeProxy: string;
  kubeScheduler: string;
  /** Folder holding the CNI plugins (bridge, host-local, loopback, portmap). */
  cniBinDir: string;
  /** The cluster DNS server, a static binary for its image. */
  coredns: string;
}

function requiredVersion(goMod: string, module: string): string {
  const text = readFileSync(join(KUBE_MODULES, goMod), 'utf8');
  const match = new RegExp(`^\\s*(?:require\\s+)?${module.replace(/[./]/g, '\\$&')}\\s+(v\\S+)`, 'm').exec(
    text,
  );
  if (!match?.[1]) throw new Error(`integration/kube/${goMod} does not require ${module}`);
  return match[1];
}

/** The releases pinned in the go.mod files: the single source of truth for what the harness runs. */
export function pinnedVersions(): PinnedVersions {
  return {
    kubernetes: requiredVersion('kubernetes/go.mod', 'k8s.io/kubernetes'),
    etcd: requiredVersion('etcd/go.mod', 'go.etcd.io/etcd/server/v3'),
    cniPlugins: requiredVersion('cni/go.mod', 'github.com/containernetworking/plugins'),
    coredns: requiredVersion('coredns/go.mod', 'github.com/coredns/coredns'),
  };
}

interface BuildSpec {
  module: string;
  outDir: string;
  packages: Record<string, string>;
  ldflags: string;
  label: string;
  /** Extra environment for `go build`. */
  env?: Record<string, string>;
}

function kubernetesSpec(version: string): BuildSpec {
  const minor = /^v1\.(\d+)\./.exec(version)?.[1] ?? '';
  const v = 'k8s.io/component-base/version';
  return {
    module: join(KUBE_MODULES, 'kubernetes'),
    outDir: join(CACHE_DIR, `kubernetes-${version}`),
    packages: {
      'kube-apiserver': 'k8s.io/kubernetes/cmd/kube-apiserver',
      'kube-controller-manager': 'k8s.io/kubernetes/cmd/kube-controller-manager',
      kubectl: 'k8s.io/kubernetes/cmd/kubectl',
    },
    // Without these the binaries call themselves v0.0.0-master, which kubectl and version skew checks dislike.
    ldflags: `-X ${v}.gitVersion=${version} -X ${v}.gitMajor=1 -X ${v}.gitMinor=${minor} -X ${v}.gitTreeState=clean`,
    label: `kubernetes ${version}`,
  };
}

/** The node's commands: apart from the control plane's, so that only what runs pods builds them. */
function nodeSpec(version: string): BuildSpec {
  const control = kubernetesSpec(version);
  return {
    ...control,
    outDir: join(CACHE_DIR, `kube-node-${version}`),
    packages: {
      kubelet: 'k8s.io/kubernetes/cmd/kubelet',
      'kube-proxy': 'k8s.io/kubernetes/cmd/kube-proxy',
      'kube-scheduler': 'k8s.io/kubernetes/cmd/kube-scheduler',
    },
    label: `kubelet, kube-proxy and kube-scheduler ${version}`,
  };
}

function cniSpec(version: string): BuildSpec {
  const plugins = 'github.com/containernetworking/plugins/plugins';
  return {
    module: join(KUBE_MODULES, 'cni'),
    outDir: join(CACHE_DIR, `cni-plugins-${version}`),
    packages: {
      bridge: `${plugins}/main/bridge`,
      'host-local': `${plugins}/ipam/host-local`,
      loopback: `${plugins}/main/loopback`,
      portmap: `${plugins}/meta/portmap`,
    },
    ldflags: '',
    label: `CNI plugins ${version}`,
  };
}

/**
 * kubectl without cgo, for an image that holds nothing else: the tests' pods that act as a controller on the hub run
 * it. Apart from the control plane's kubectl, which links libc.
 */
function staticKubectlSpec(version: string): BuildSpec {
  const control = kubernetesSpec(version);
  return {
    ...control,
    outDir: join(CACHE_DIR, `kubectl-static-${version}`),
    packages: { kubectl: control.packages['kubectl']! },
    ldflags: `-s -w ${control.ldflags}`,
    label: `static kubectl ${version}`,
    env: { CGO_ENABLED: '0' },
  };
}

/** CoreDNS, static (no cgo), since it runs from an image that holds nothing else. */
function corednsSpec(version: string): BuildSpec {
  return {
    module: join(KUBE_MODULES, 'coredns'),
    outDir: join(CACHE_DIR, `coredns-${version}`),
    packages: { coredns: 'github.com/coredns/coredns' },
    ldflags: '-s -w',
    label: `CoreDNS ${version}`,
    env: { CGO_ENABLED: '0' },
  };
}

function etcdSpec(version: string): BuildSpec {
  return {
    module: join(KUBE_MODULES, 'etcd'),
    outDir: join(CACHE_DIR, `etcd-${version}`),
    packages: { etcd: 'go.etcd.io/etcd/server/v3' },
    ldflags: '',
    label: `etcd ${version}`,
  };
}

/**
 * The benchmarks' load generator (kubernetes/loadgen): client-go's transport at the pinned release. Its folder
 * names its source's hash, so an edit builds it afresh.
 */
function loadGeneratorSpec(version: string): BuildSpec {
  const module = join(KUBE_MODULES, 'kubernetes');
  const source = createHash('sha256')
    .update(readFileSync(join(module, 'loadgen/main.go')))
    .digest('hex')
    .slice(0, 12);
  return {
    module,
    outDir: join(CACHE_DIR, `loadgen-${version}-${source}`),
    packages: { loadgen: 'sealion.dev/integration/kube/kubernetes/loadgen' },
    ldflags: '',
    label: `the load generator (client-go ${version})`,
  };
}

/**
 * The Helm majors the charts are tested with: 4, the current one (and the one `npm start -- --install helm` uses),
 * and 3, which most clusters are still driven by. Each is built from its own module (integration/kube/helm for 4,
 * integration/kube/helm3 for 3): one module for both would let either one's dependencies move the other's.
 */
export const HELM_MAJORS = [4, 3] as const;
export type HelmMajor = (typeof HELM_MAJORS)[number];

/** Helm, for the charts' tests and `npm start -- --install helm`. */
function helmSpec(major: HelmMajor): BuildSpec {
  const folder = major === 4 ? 'helm' : `helm${major}`;
  const module = `helm.sh/helm/v${major}`;
  const version = requiredVersion(`${folder}/go.mod`, module);
  return {
    module: join(KUBE_MODULES, folder),
    outDir: join(CACHE_DIR, `helm-${version}`),
    packages: { helm: `${module}/cmd/helm` },
    // Without it Helm calls itself v4.x-dev (v3.x) and its `kubeVersion` checks still pass; the version is for people.
    ldflags: `-s -w -X ${module}/internal/version.version=${version}`,
    label: `Helm ${version}`,
    env: { CGO_ENABLED: '0' },
  };
}

/** krew, the kubectl plugin manager, whose install of the CLI's krew manifest and archive the tests try. */
function krewSpec(version: string): BuildSpec {
  return {
    module: join(KUBE_MODULES, 'krew'),
    outDir: join(CACHE_DIR, `krew-${version}`),
    packages: { krew: 'sigs.k8s.io/krew/cmd/krew' },
    ldflags: `-X sigs.k8s.io/krew/internal/version.gitTag=${version}`,
    label: `krew ${version}`,
  };
}

function isBuilt(spec: BuildSpec): boolean {
  return Object.keys(spec.packages).every((name) => existsSync(join(spec.outDir, name)));
}

async function build(spec: BuildSpec, log: (line: string) => void): Promise<void> {
  if (isBuilt(spec)) return;
  await sharedBuild(spec.outDir, () => compile(spec, log));
}

async function compile(spec: BuildSpec, log: (line: string) => void): Promise<void> {
  // Build into a private folder and rename it into place, so concurrent builders never see half a cache.
  const tmp = privatePath(spec.outDir);
  mkdirSync(tmp, { recursive: true });
  const started = Date.now();
  log(`building ${spec.label} from Go modules (the first build takes several minutes; then it is cached)`);
  let compiled = 0;
  const timer = setInterval(() => {
    const secs = Math.round((Date.now() - started) / 1000);
    log(`building ${spec.label}: ${compiled} packages compiled, ${secs}s`);
  }, PROGRESS_INTERVAL_MS);
  try {
    // One `go build` for all of a module's commands compiles their shared packages once, in parallel.
    const names = Object.keys(spec.packages);
    const output = names.length === 1 ? join(tmp, names[0]!) : `${tmp}/`;
    const args = ['build', '-v', '-buildvcs=false', '-trimpath', '-o', output];
    if (spec.ldflags) args.push(`-ldflags=${spec.ldflags}`);
    args.push(...Object.values(spec.packages));
    await new Promise<void>((done, fail) => {
      const child = spawn('go', args, {
        cwd: spec.module,
        stdio: ['ignore', 'ignore', 'pipe'],
        env: { ...process.env, ...spec.env },
      });
      let tail = '';
      child.stderr.setEncoding('utf8');
      child.stderr.on('data', (chunk: string) => {
        compiled += chunk.split('\n').filter((l) => l && !l.startsWith('go: ')).length;
        tail = (tail + chunk).slice(-4000);
      });
      child.on('error', (err) => fail(new Error(`build ${spec.label}: cannot run go: ${err.message}`)));
      child.on('exit', (code) =>
        code === 0 ? done() : fail(new Error(`build ${spec.label}: go build exited ${code}\n${tail}`)),
      );
    });
  } catch (err) {
    rmSync(tmp, { recursive: true, force: true });
    throw err;
  } finally {
    clearInterval(timer);
  }
  try {
    renameSync(tmp, spec.outDir);
  } catch (err) {
    // Another process finished the same build first; its result is as good as ours.
    rmSync(tmp, { recursive: true, force: true });
    if (!isBuilt(spec)) throw err;
  }
  log(`built ${spec.label} in ${Math.round((Date.now() - started) / 1000)}s`);
}

/** Returns the paths of the pinned binaries, building whatever is missing. */
export async function ensureBinaries(log: (line: string) => void = () => {}): Promise<Binaries> {
  const versions = pinnedVersions();
  const kube = kubernetesSpec(versions.kubernetes);
  const etcd = etcdSpec(versions.etcd);
  mkdirSync(CACHE_DIR, { recursive: true });
  // One build at a time: two Go builds on two cores only slow each other down.
  await build(etcd, log);
  await build(kube, log);
  return {
    kubeApiserver: join(kube.outDir, 'kube-apiserver'),
    kubeControllerManager: join(kube.outDir, 'kube-controller-manager'),
    kubectl: join(kube.outDir, 'kubectl'),
    etcd: join(etcd.outDir, 'etcd'),
  };
}

/** Returns the paths of a node's binaries, building whatever is missing. */
export async function ensureNodeBinaries(log: (line: string) => void = () => {}): Promise<NodeBinaries> {
  const versions = pinnedVersions();
  const node = nodeSpec(versions.kubernetes);
  const cni = cniSpec(versions.cniPlugins);
  const coredns = corednsSpec(versions.coredns);
  mkdirSync(CACHE_DIR, { recursive: true });
  await build(cni, log);
  await build(coredns, log);
  await build(node, log);
  return {
    kubelet: join(node.outDir, 'kubelet'),
    kubeProxy: join(node.outDir, 'kube-proxy'),
    kubeScheduler: join(node.outDir, 'kube-scheduler'),
    cniBinDir: cni.outDir,
    coredns: join(coredns.outDir, 'coredns'),
  };
}

/** Returns the path of a static kubectl of the pinned release, building it if it is missing. */
export async function ensureStaticKubectl(log: (line: string) => void = () => {}): Promise<string> {
  const spec = staticKubectlSpec(pinnedVersions().kubernetes);
  mkdirSync(CACHE_DIR, { recursive: true });
  await build(spec, log);
  return join(spec.outDir, 'kubectl');
}

/** Returns the path of the helm command of `major` (default 4), building it if it is missing. */
export async function ensureHelm(
  log: (line: string) => void = () => {},
  major: HelmMajor = 4,
): Promise<string> {
  const spec = helmSpec(major);
  mkdirSync(CACHE_DIR, { recursive: true });
  await build(spec, log);
  return join(spec.outDir, 'helm');
}

/** Returns the path of the benchmarks' load generator, building it if it is missing. */
export async function ensureLoadGenerator(log: (line: string) => void = () => {}): Promise<string> {
  const spec = loadGeneratorSpec(pinnedVersions().kubernetes);
  mkdirSync(CACHE_DIR, { recursive: true });
  await build(spec, log);
  return join(spec.outDir, 'loadgen');
}

/**
 * Returns the path of krew (run as `kubectl krew` when linked onto PATH as kubectl-krew), building it if it is
 * missing: about half a minute the first time.
 */
export async function ensureKrew(log: (line: string) => void = () => {}): Promise<string> {
  const spec = krewSpec(requiredVersion('krew/go.mod', 'sigs.k8s.io/krew'));
  mkdirSync(CACHE_DIR, { recursive: true });
  await build(spec, log);
  return join(spec.outDir, 'krew');
}
