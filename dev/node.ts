// A real Kubernetes node for a development cluster: the pinned kubelet and kube-proxy, Debian's containerd and
// runc, the CNI bridge plugin, and a pause image compiled here. Each node lives in a network namespace of its
// own, joined to the machine by a veth pair on a /30 of 10.201.0.0/16, with its pods on 10.244.<i>.0/24 behind a
// bridge; the machine routes that subnet to the node. So two clusters' nodes (and their kube-proxies' iptables)
// never meet, pods reach their API server at the machine's end of the veth, and the API server reaches the
// kubelet and the pods. The kubelet and containerd join only the network namespace (nsenter --net), so that
// the volumes the kubelet mounts are the ones containerd gives to containers. Needs root, iproute2, iptables,
// containerd and runc.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';
import { stringify } from 'yaml';
import { issueCert, type CertificateAuthority } from '../lib/pki/pki.ts';
import { kubeconfigYaml } from './kubeconfig.ts';
import { ensureNodeBinaries, CACHE_DIR, REPO_ROOT, pinnedVersions, type NodeBinaries } from './build.ts';
import { privatePath, sharedBuild } from './cache.ts';
import { file, writeImage } from './image.ts';
import { dieWithParent, isAlive, logOutput, stopChild } from './processes.ts';

const exec = promisify(execFile);

/** The name containerd runs pod sandboxes with, and the pause image this module builds under it. */
export const PAUSE_IMAGE = 'registry.k8s.io/pause:3.10';
const NETNS_PREFIX = 'sln-';
const CGROUP_PREFIX = 'sealion-node-';
const NODE_SUBNETS = 250;
let claims = 0;
const STOP_GRACE_MS = 5_000;
const READY_TIMEOUT_MS = 120_000;

/** Where a node sits on the network. */
export interface NodeNetwork {
  index: number;
  netns: string;
  hostInterface: string;
  /** The machine's end of the veth pair: the address the node (and its pods) reach the API server at. */
  hostIp: string;
  /** The node's address (its InternalIP). */
  nodeIp: string;
  /** The node's pods' subnet. */
  podCidr: string;
  /** Every node's pods: kube-proxy's cluster CIDR. */
  clusterCidr: string;
}

export interface NodeOptions {
  name: string;
  network: NodeNetwork;
  /** The API server as the node reaches it: https://<hostIp>:<port>. */
  apiserverUrl: string;
  ca: CertificateAuthority;
  /** A folder of the cluster's, which the node's own folder goes in. */
  dir: string;
  /** Labels the kubelet registers the node with (only those it may set itself). */
  labels?: Record<string, string>;
  /** The kubelet's providerID, as a managed provider's kubelet sets it. */
  providerID?: string;
  /** OCI image archives to load into the node's containerd (there is no registry to pull from). */
  images?: string[];
  /** The cluster DNS Service's address, which the kubelet gives pods. */
  clusterDNS?: string;
  log?: (line: string) => void;
}

export interface KubeNode {
  name: string;
  network: NodeNetwork;
  dir: string;
  /** Why the node cannot work (a daemon exited, with its log's tail), or undefined while it runs. */
  failure(): string | undefined;
  /** Loads an OCI image archive into the node's containerd. */
  loadImage(archive: string): Promise<void>;
  /**
   * Sends SIGKILL to a container's main process through containerd (`ctr tasks kill`), by the ID a pod's
   * containerStatuses name (`containerd://<id>`, with or without the prefix): the end of a crash or the kernel's
   * OOM killer, which no drain sees coming. The kubelet restarts it as the pod's restartPolicy says.
   */
  killContainer(containerId: string): Promise<void>;
  stop(): Promise<void>;
}

async function run(command: string, args: string[]): Promise<string> {
  try {
    return (await exec(command, args, { maxBuffer: 16 * 1024 * 1024 })).stdout;
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr?.trim() || (err as Error).message;
    throw new Error(`${command} ${args.join(' ')} failed: ${stderr}`, { cause: err });
  }
}

async function quietly(command: string, args: string[]): Promise<void> {
  try {
    await exec(command, args);
  } catch {
    // Already gone.
  }
}

/** The cgroup hierarchies the kubelet makes its tree in (cgroup v1: one per controller). */
function cgroupHierarchies(): string[] {
  const root = '/sys/fs/cgroup';
  if (existsSync(join(root, 'cgroup.controllers'))) return [root];
  return readdirSync(root)
    .map((name) => join(root, name))
    .filter((path) => !path.endsWith('/unified') && existsSync(join(path, 'cgroup.procs')));
}

function cgroupProcesses(dir: string): number[] {
  const pids: number[] = [];
  const walk = (path: string): void => {
    try {
      for (const line of readFileSync(join(path, 'cgroup.procs'), 'utf8').split('\n')) {
        if (line) pids.push(Number(line));
      }
      for (const entry of readdirSync(path, { withFileTypes: true })) {
        if (entry.isDirectory()) walk(join(path, entry.name));
      }
    } catch {
      // Removed meanwhile.
    }
  };
  walk(dir);
  return pids;
}

function removeCgroupTree(dir: string): void {
  try {
    for (const entry of readdirSync(dir, { withFileTypes: true })) {
      if (entry.isDirectory()) removeCgroupTree(join(dir, entry.name));
    }
    rmdirSync(dir);
  } catch {
    // Gone, or still busy: the next sweep takes it.
  }
}

/** Makes the node's cgroup in every hierarchy, as the kubelet expects to find it; cpuset needs its parent's sets. */
function makeCgroupRoot(name: string): void {
  for (const hierarchy of cgroupHierarchies()) {
    const dir = join(hierarchy, name);
    mkdirSync(dir, { recursive: true });
    for (const setting of ['cpuset.cpus', 'cpuset.mems']) {
      if (existsSync(join(hierarchy, setting)) && !readFileSync(join(dir, setting), 'utf8').trim()) {
        writeFileSync(join(dir, setting), readFileSync(join(hierarchy, setting)));
      }
    }
  }
}

/** Kills every process in a node's cgroup tree (its pods' containers) and removes the tree. */
async function killCgroupTree(name: string): Promise<void> {
  const trees = cgroupHierarchies().map((h) => join(h, name));
  for (let round = 0; round < 20; round++) {
    const pids = new Set(trees.flatMap(cgroupProcesses));
    if (pids.size === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // Exited.
      }
    }
    await sleep(100);
  }
  for (const tree of trees) removeCgroupTree(tree);
}

/** Unmounts everything mounted under `dir`, deepest first (volumes, overlay roots, pods' namespaces). */
async function unmountUnder(dir: string): Promise<void> {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((line) => line.split(' ')[4] ?? '')
    .map((path) => path.replace(/\\040/g, ' '))
    .filter((path) => path === dir || path.startsWith(`${dir}/`))
    .sort((a, b) => b.length - a.length);
  for (const path of mounts) await quietly('umount', ['-l', path]);
}

function ownerOf(name: string, prefix: string): number | undefined {
  const pid = new RegExp(`^${prefix}(\\d+)-`).exec(name)?.[1];
  return pid ? Number(pid) : undefined;
}

/**
 * Takes down what nodes of processes that died without stopping them left: their containers, the containerd shims
 * serving from `staleDirs` (the dead clusters' folders), what is mounted there, and their namespaces, veths and
 * routes.
 */
export async function sweepStaleNodes(staleDirs: string[] = []): Promise<void> {
  for (const hierarchy of cgroupHierarchies()) {
    for (const name of readdirSync(hierarchy)) {
      const owner = ownerOf(name, CGROUP_PREFIX);
      if (owner !== undefined && !isAlive(owner)) await killCgroupTree(name);
    }
  }
  for (const dir of staleDirs) {
    for (const pid of shimsOf(`${dir}/`)) killQuietly(pid);
    await unmountUnder(dir);
  }
  const namespaces = (await run('ip', ['netns', 'list'])).split('\n').map((l) => l.split(' ')[0] ?? '');
  for (const netns of namespaces) {
    const owner = ownerOf(netns, NETNS_PREFIX);
    if (owner === undefined || isAlive(owner)) continue;
    const index = /-(\d+)$/.exec(netns)?.[1];
    if (index) {
      await quietly('ip', ['route', 'del', `10.244.${index}.0/24`]);
      await quietly('ip', ['link', 'del', `snh-${index}`]);
    }
    await quietly('ip', ['netns', 'del', netns]);
  }
}

/**
 * Claims a free node subnet and sets up its namespace and veth pair. Creating the host end, snh-<i>, is the
 * lock: the kernel refuses a second interface of that name.
 */
export async function claimNodeNetwork(): Promise<NodeNetwork> {
  const start = (process.pid * 7 + claims++ * 31) % NODE_SUBNETS;
  for (let attempt = 0; attempt < NODE_SUBNETS; attempt++) {
    const index = ((start + attempt) % NODE_SUBNETS) + 1;
    const hostInterface = `snh-${index}`;
    const netns = `${NETNS_PREFIX}${process.pid}-${index}`;
    try {
      await run('ip', ['netns', 'add', netns]);
    } catch (err) {
      // This process claims the same subnet for another node right now.
      if ((err as Error).message.includes('File exists')) continue;
      throw err;
    }
    try {
      await run('ip', ['link', 'add', hostInterface, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', netns]);
    } catch (err) {
      await quietly('ip', ['netns', 'del', netns]);
      if ((err as Error).message.includes('File exists')) continue;
      throw err;
    }
    const network: NodeNetwork = {
      index,
      netns,
      hostInterface,
      hostIp: `10.201.${index}.1`,
      nodeIp: `10.201.${index}.2`,
      podCidr: `10.244.${index}.0/24`,
      clusterCidr: '10.244.0.0/16',
    };
    try {
      const inNode = (args: string[]): Promise<string> => run('ip', ['-n', netns, ...args]);
      await run('ip', ['addr', 'add', `${network.hostIp}/30`, 'dev', hostInterface]);
      await run('ip', ['link', 'set', hostInterface, 'up']);
      await inNode(['addr', 'add', `${network.nodeIp}/30`, 'dev', 'eth0']);
      await inNode(['link', 'set', 'lo', 'up']);
      await inNode(['link', 'set', 'eth0', 'up']);
      await inNode(['route', 'add', 'default', 'via', network.hostIp]);
      await run('ip', ['route', 'replace', network.podCidr, 'via', network.nodeIp, 'dev', hostInterface]);
      // The node forwards between its pods' bridge and the veth, and bridged traffic passes its iptables.
      for (const setting of ['net.ipv4.ip_forward=1', 'net.bridge.bridge-nf-call-iptables=1']) {
        await run('ip', ['netns', 'exec', netns, 'sysctl', '-qw', setting]);
      }
      return network;
    } catch (err) {
      await releaseNodeNetwork(network);
      throw err;
    }
  }
  throw new Error(`no free node subnet in 10.201.0.0/16 (${NODE_SUBNETS} tried)`);
}

export async function releaseNodeNetwork(network: NodeNetwork): Promise<void> {
  await quietly('ip', ['route', 'del', network.podCidr]);
  await quietly('ip', ['link', 'del', network.hostInterface]);
  await quietly('ip', ['netns', 'del', network.netns]);
}

/** The pause image, compiled statically from the pinned Kubernetes module's source, as an OCI archive. */
export async function ensurePauseImage(): Promise<string> {
  const version = pinnedVersions().kubernetes;
  const archive = join(CACHE_DIR, '..', 'image', `pause-${version}.oci.tar`);
  if (existsSync(archive)) return archive;
  return sharedBuild(archive, () => buildPauseImage(version, archive));
}

async function buildPauseImage(version: string, archive: string): Promise<string> {
  const module = join(REPO_ROOT, 'integration/kube/kubernetes');
  const source = (
    await exec('go', ['list', '-m', '-f', '{{.Dir}}', 'k8s.io/kubernetes'], { cwd: module })
  ).stdout.trim();
  const out = privatePath(archive);
  mkdirSync(join(CACHE_DIR, '..', 'image'), { recursive: true });
  let binary: Buffer;
  try {
    await run('gcc', [
      '-Os',
      '-static',
      '-Wall',
      `-DVERSION=${version}`,
      '-o',
      out,
      join(source, 'build/pause/linux/pause.c'),
    ]);
    await run('strip', [out]);
    binary = readFileSync(out);
  } finally {
    rmSync(out, { force: true });
  }
  await writeImage(
    {
      name: PAUSE_IMAGE,
      layers: [{ comment: `pause.c of Kubernetes ${version}`, entries: [file('/pause', binary, 0o755)] }],
      config: { User: '65535:65535', Entrypoint: ['/pause'] },
    },
    archive,
  );
  return archive;
}

function inNetns(netns: string, binary: string, args: string[]): [string, string[]] {
  const [cmd, argv] = dieWithParent(binary, args);
  return ['nsenter', [`--net=/run/netns/${netns}`, '--', cmd, ...argv]];
}

function startDaemon(dir: string, name: string, netns: string, binary: string, args: string[]): ChildProcess {
  const [cmd, argv] = inNetns(netns, binary, args);
  const child = spawn(cmd, argv, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  logOutput(child, join(dir, `${name}.log`));
  return child;
}

function logTail(path: string, lines = 30): string {
  try {
    return readFileSync(path, 'utf8').trimEnd().split('\n').slice(-lines).join('\n');
  } catch {
    return '(no log)';
  }
}

function containerdConfig(dir: string, cni: { binDir: string; confDir: string }): string {
  // containerd 1.6's configuration (version 2). Sandboxes run the pause image built here; containerd may not
  // lower a process's OOM score on this kind of VM, so it never asks to.
  return `version = 2
root = "${dir}/root"
state = "${dir}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "${dir}/containerd.sock"
[ttrpc]
  address = "${dir}/containerd.sock.ttrpc"
[debug]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "${dir}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${cni.binDir}"
    conf_dir = "${cni.confDir}"
    max_conf_num = 1
`;
}

async function waitFor(
  what: string,
  check: () => Promise<boolean> | boolean,
  child: ChildProcess,
  log: string,
  timeoutMs = READY_TIMEOUT_MS,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(
        `${what}: the process exited (${child.exitCode ?? child.signalCode}):\n${logTail(log)}`,
      );
    }
    if (await check()) return;
    if (Date.now() > deadline) throw new Error(`${what}: not after ${timeoutMs} ms:\n${logTail(log)}`);
    await sleep(200);
  }
}

/** Starts a node and waits until its kubelet has registered it and its network is ready. */
export async function startNode(opts: NodeOptions): Promise<KubeNode> {
  const log = opts.log ?? (() => {});
  const binaries: NodeBinaries = await ensureNodeBinaries(log);
  const pause = await ensurePauseImage();
  const { network, name } = opts;
  const dir = join(opts.dir, `node-${name}`);
  const cgroupRoot = `${CGROUP_PREFIX}${process.pid}-${network.index}`;
  mkdirSync(dir, { recursive: true });
  const children: ChildProcess[] = [];
  const socket = join(dir, 'containerd', 'containerd.sock');

  let stopped = false;
  const stop = async (): Promise<void> => {
    if (stopped) return;
    stopped = true;
    // kubelet and kube-proxy first, so nothing restarts what goes next; then every container; then containerd.
    const [containerd, ...rest] = children;
    await Promise.all(rest.map((child) => stopChild(child, { graceMs: STOP_GRACE_MS })));
    await killCgroupTree(cgroupRoot);
    if (containerd) await stopChild(containerd, { graceMs: STOP_GRACE_MS });
    // containerd's shims outlive it; they have nothing left to run.
    for (const pid of shimsOf(socket)) killQuietly(pid);
    await unmountUnder(dir);
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    // containerd and its CNI configuration.
    const cniConfDir = join(dir, 'cni', 'net.d');
    mkdirSync(cniConfDir, { recursive: true });
    writeFileSync(
      join(cniConfDir, '10-sealion.conflist'),
      JSON.stringify({
        cniVersion: '1.0.0',
        name: 'sealion',
        plugins: [
          {
            type: 'bridge',
            bridge: 'cni0',
            isGateway: true,
            ipMasq: true,
            hairpinMode: true,
            ipam: {
              type: 'host-local',
              ranges: [[{ subnet: network.podCidr }]],
              routes: [{ dst: '0.0.0.0/0' }],
              dataDir: join(dir, 'cni', 'ipam'),
            },
          },
          { type: 'portmap', capabilities: { portMappings: true } },
        ],
      }),
    );
    const containerdDir = join(dir, 'containerd');
    mkdirSync(containerdDir, { recursive: true });
    const containerdConf = join(containerdDir, 'config.toml');
    writeFileSync(
      containerdConf,
      containerdConfig(containerdDir, { binDir: binaries.cniBinDir, confDir: cniConfDir }),
    );
    const containerd = startDaemon(dir, 'containerd', network.netns, 'containerd', [
      '--config',
      containerdConf,
    ]);
    children.push(containerd);
    await waitFor('containerd', () => existsSync(socket), containerd, join(dir, 'containerd.log'));
    const loadImage = async (archive: string): Promise<void> => {
      await run('ctr', [
        '--address',
        socket,
        '--namespace',
        'k8s.io',
        'images',
        'import',
        '--no-unpack',
        archive,
      ]);
    };
    for (const archive of [pause, ...(opts.images ?? [])]) await loadImage(archive);

    // The kubelet: its own client certificate (system:node:<name>), a root folder and cgroup tree of its own.
    const kubeletCert = await issueCert(opts.ca, {
      commonName: `system:node:${name}`,
      organizations: ['system:nodes'],
      usage: 'client',
    });
    const kubeletDir = join(dir, 'kubelet');
    mkdirSync(kubeletDir, { recursive: true });
    writeFileSync(join(dir, 'ca.crt'), opts.ca.certPem);
    writeFileSync(
      join(dir, 'kubelet.kubeconfig'),
      kubeconfigYaml(name, opts.apiserverUrl, opts.ca.certPem, {
        name: `system:node:${name}`,
        ...kubeletCert,
      }),
      { mode: 0o600 },
    );
    writeFileSync(
      join(dir, 'kubelet.yaml'),
      stringify({
        apiVersion: 'kubelet.config.k8s.io/v1beta1',
        kind: 'KubeletConfiguration',
        // This VM has cgroup v1 only, which Kubernetes 1.36 refuses unless told otherwise.
        failCgroupV1: false,
        failSwapOn: false,
        cgroupDriver: 'cgroupfs',
        cgroupRoot: `/${cgroupRoot}`,
        address: network.nodeIp,
        readOnlyPort: 0,
        healthzBindAddress: '127.0.0.1',
        authentication: {
          anonymous: { enabled: false },
          webhook: { enabled: true },
          x509: { clientCAFile: join(dir, 'ca.crt') },
        },
        authorization: { mode: 'Webhook' },
        containerRuntimeEndpoint: `unix://${socket}`,
        podLogsDir: join(dir, 'pod-logs'),
        volumePluginDir: join(dir, 'volume-plugins'),
        clusterDomain: 'cluster.local',
        ...(opts.clusterDNS ? { clusterDNS: [opts.clusterDNS] } : {}),
        resolvConf: '/etc/resolv.conf',
        // Images cannot be pulled again here: never collect them. Evict only when the machine is truly full.
        imageGCHighThresholdPercent: 100,
        imageGCLowThresholdPercent: 99,
        evictionHard: { 'memory.available': '100Mi', 'nodefs.available': '1%', 'imagefs.available': '1%' },
        serializeImagePulls: false,
        ...(opts.providerID ? { providerID: opts.providerID } : {}),
      }),
    );
    makeCgroupRoot(cgroupRoot);
    const labels = Object.entries(opts.labels ?? {}).map(([k, v]) => `${k}=${v}`);
    const kubelet = startDaemon(dir, 'kubelet', network.netns, binaries.kubelet, [
      `--config=${join(dir, 'kubelet.yaml')}`,
      `--kubeconfig=${join(dir, 'kubelet.kubeconfig')}`,
      `--root-dir=${kubeletDir}`,
      `--hostname-override=${name}`,
      `--node-ip=${network.nodeIp}`,
      ...(labels.length ? [`--node-labels=${labels.join(',')}`] : []),
      '--v=1',
    ]);
    children.push(kubelet);

    // kube-proxy, as system:kube-proxy (which the API server's default RBAC binds to system:node-proxier).
    const proxyCert = await issueCert(opts.ca, { commonName: 'system:kube-proxy', usage: 'client' });
    writeFileSync(
      join(dir, 'kube-proxy.kubeconfig'),
      kubeconfigYaml(name, opts.apiserverUrl, opts.ca.certPem, { name: 'kube-proxy', ...proxyCert }),
      { mode: 0o600 },
    );
    writeFileSync(
      join(dir, 'kube-proxy.yaml'),
      stringify({
        apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
        kind: 'KubeProxyConfiguration',
        clientConnection: { kubeconfig: join(dir, 'kube-proxy.kubeconfig') },
        mode: 'iptables',
        hostnameOverride: name,
        bindAddress: network.nodeIp,
        clusterCIDR: network.clusterCidr,
        // Pods on one bridge reach each other's Services: without masquerading, a reply would skip the NAT.
        iptables: { masqueradeAll: true },
        // The conntrack table is the machine's to size, not a test node's.
        conntrack: { maxPerCore: 0, min: 0 },
        metricsBindAddress: '127.0.0.1:10249',
        healthzBindAddress: '127.0.0.1:10256',
      }),
    );
    const proxy = startDaemon(dir, 'kube-proxy', network.netns, binaries.kubeProxy, [
      `--config=${join(dir, 'kube-proxy.yaml')}`,
    ]);
    children.push(proxy);
    log(`node ${name} started (${network.nodeIp}, pods ${network.podCidr})`);
    const names = ['containerd', 'kubelet', 'kube-proxy'];
    const failure = (): string | undefined => {
      const index = children.findIndex((c) => c.exitCode !== null || c.signalCode !== null);
      if (index < 0 || stopped) return undefined;
      const child = children[index]!;
      const daemon = names[index] ?? 'daemon';
      return `${daemon} exited (${child.exitCode ?? child.signalCode}):\n${logTail(join(dir, `${daemon}.log`))}`;
    };
    const killContainer = async (containerId: string): Promise<void> => {
      const id = containerId.replace(/^containerd:\/\//, '');
      if (!/^[0-9a-f]{64}$/.test(id)) throw new Error(`${containerId} is no containerd container ID`);
      await run('ctr', [
        '--address',
        socket,
        '--namespace',
        'k8s.io',
        'tasks',
        'kill',
        '--signal',
        'SIGKILL',
        id,
      ]);
    };
    return { name, network, dir, failure, loadImage, killContainer, stop };
  } catch (err) {
    await stop();
    throw err;
  }
}

function killQuietly(pid: number): void {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    // Exited.
  }
}

/** The containerd shims serving a containerd whose socket path contains `socket`. */
function shimsOf(socket: string): number[] {
  const pids: number[] = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const cmdline = readFileSync(`/proc/${entry}/cmdline`, 'utf8');
      if (cmdline.includes('containerd-shim') && cmdline.includes(socket)) pids.push(Number(entry));
    } catch {
      // Exited.
    }
  }
  return pids;
}
