// Starts real Kubernetes control planes (etcd + kube-apiserver + kube-controller-manager) on free loopback
// ports, each in its own temporary folder with its own PKI, and always takes them down again.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { stringify } from 'yaml';
import { kubeconfigYaml } from './kubeconfig.ts';
export { kubeconfigYaml, type KubeconfigUser } from './kubeconfig.ts';
import {
  issueCert,
  newCA,
  publicKeyToPem,
  newKeyPair,
  privateKeyToPem,
  type CertificateAuthority,
} from '../lib/pki/pki.ts';
import { ensureBinaries, ensureNodeBinaries, type Binaries } from './build.ts';
import { CLUSTER_DNS_IP, clusterDNSManifests, ensureCoreDNSImage } from './cluster-dns.ts';
import {
  claimNodeNetwork,
  releaseNodeNetwork,
  startNode,
  sweepStaleNodes,
  type KubeNode,
  type NodeNetwork,
} from './node.ts';
import { dieWithParent, isAlive, logOutput, stopChild } from './processes.ts';

export interface ClusterOptions {
  /** Used in folder names and the kubeconfig's context name. Default: `sealion`. */
  name?: string;
  /** Run kube-controller-manager (namespace deletion, garbage collection, service-account tokens). Default: true. */
  controllerManager?: boolean;
  /** Extra kube-apiserver flags, e.g. `--authentication-token-webhook-config-file=…`. Default: none. */
  apiserverArgs?: string[];
  /** Progress lines (builds, start-up). Default: silent. */
  log?: (line: string) => void;
  /** How long to wait for /readyz. Default: 90 s (the first start after a build is the slowest). */
  readyTimeoutMs?: number;
  /** Give the cluster a real node (kubelet, containerd, kube-proxy) that runs pods. Default: none. */
  node?: ClusterNodeOptions;
}

export interface ClusterNodeOptions {
  /** Node name. Default: `<cluster name>-node`. */
  name?: string;
  /** Labels the kubelet registers the node with. */
  labels?: Record<string, string>;
  /** The kubelet's providerID. */
  providerID?: string;
  /** OCI image archives to load into the node's container runtime. */
  images?: string[];
}

export interface KubectlResult {
  code: number;
  stdout: string;
  stderr: string;
}

export interface Cluster {
  name: string;
  /** `https://127.0.0.1:<port>` */
  url: string;
  /** Admin (system:masters) kubeconfig. */
  kubeconfigPath: string;
  /** The cluster CA, which signs serving and client certificates. */
  ca: CertificateAuthority;
  dir: string;
  binaries: Binaries;
  /** The cluster's node, when it was started with one. */
  node?: KubeNode;
  /** The API server's audit log (JSON lines, audit.k8s.io/v1 Events; policy: DEV_AUDIT_POLICY). */
  auditLogPath: string;
  /** A kubeconfig for a user with a client certificate from the cluster CA (no rights until RBAC grants some). */
  userKubeconfig(user: string, groups?: string[]): Promise<string>;
  /** Runs the real kubectl against this cluster (admin unless `kubeconfig` is given). Never throws on exit codes. */
  kubectl(args: string[], opts?: { kubeconfig?: string; input?: string }): Promise<KubectlResult>;
  stop(): Promise<void>;
}

const SERVICE_CIDR = '10.0.0.0/24';

/**
 * The development clusters' audit policy: what people and Sealion do, at Metadata, once per request (ResponseComplete,
 * and ResponseStarted for watches and upgrades); the control plane's own chatter left out.
 */
export const DEV_AUDIT_POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: None
    userGroups: [system:nodes]
  - level: None
    users: [system:kube-controller-manager, system:kube-scheduler, system:kube-proxy, system:apiserver]
  - level: None
    resources: [{group: coordination.k8s.io, resources: [leases]}, {group: '', resources: [events]}]
  - level: None
    nonResourceURLs: [/healthz*, /livez*, /readyz*]
  - level: Metadata
`;
const SERVICE_ACCOUNT_ISSUER = 'https://kubernetes.default.svc.cluster.local';
const DIR_PREFIX = 'sealion-cluster-';
const STOP_GRACE_MS = 3_000;

/** Processes and folders of every cluster this process started, for the last-resort cleanup at exit. */
const live = new Map<string, ChildProcess[]>();
let exitHookInstalled = false;

function installExitHook(): void {
  if (exitHookInstalled) return;
  exitHookInstalled = true;
  process.once('exit', () => {
    for (const [dir, children] of live) {
      for (const child of children) if (child.exitCode === null) child.kill('SIGKILL');
      try {
        rmSync(dir, { recursive: true, force: true });
      } catch {
        // A node's containers and mounts outlive an exit that did not stop them (a second Ctrl-C): the next
        // cluster started on this machine sweeps them (sweepStaleClusters).
        console.error(`left ${dir} behind (its node's containers were running); the next start removes it`);
      }
    }
  });
}

/**
 * Removes what clusters whose owning process died without cleaning up (e.g. killed with SIGKILL) left: their nodes'
 * containers, mounts and networks, then their folders.
 */
export async function sweepStaleClusters(): Promise<void> {
  const stale: string[] = [];
  for (const entry of readdirSync(tmpdir())) {
    if (!entry.startsWith(DIR_PREFIX)) continue;
    const dir = join(tmpdir(), entry);
    // Only a folder that names its owner is a cluster's: one without (another program's, a unit test's temporary
    // folder of the same prefix, or a cluster's in the moment before it writes the file) is not this sweep's to
    // remove. `npm test` runs the unit tests beside the integration tests, and this removed their folders.
    const owner = join(dir, 'owner.pid');
    if (!existsSync(owner)) continue;
    const pid = Number(readFileSync(owner, 'utf8'));
    if (!Number.isInteger(pid) || !isAlive(pid)) stale.push(dir);
  }
  await sweepStaleNodes(stale);
  for (const dir of stale) rmSync(dir, { recursive: true, force: true });
}

export async function freePort(): Promise<number> {
  return new Promise((done, fail) => {
    const server = createServer();
    server.once('error', fail);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() =>
        typeof address === 'object' && address ? done(address.port) : fail(new Error('no port')),
      );
    });
  });
}

function startProcess(dir: string, name: string, binary: string, args: string[]): ChildProcess {
  // The kernel kills the server when the process that started it dies, even by SIGKILL, so an interrupted test
  // run cannot leave etcd or an API server behind.
  const [cmd, argv] = dieWithParent(binary, args);
  // A process group of its own: Ctrl-C in a terminal signals the whole foreground group, and etcd must not die
  // before the processes that still talk to the API server while they shut down (a concierge releasing its
  // Lease). Our process stops the servers in order; if it dies instead, setpriv's death signal takes them.
  const child = spawn(cmd, argv, { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
  logOutput(child, join(dir, `${name}.log`));
  return child;
}

function logTail(dir: string, name: string, lines = 25): string {
  try {
    return readFileSync(join(dir, `${name}.log`), 'utf8')
      .trimEnd()
      .split('\n')
      .slice(-lines)
      .join('\n');
  } catch {
    return '(no log)';
  }
}

interface ClientCredentials {
  ca: string;
  cert: string;
  key: string;
}

function get(url: string, creds: ClientCredentials): Promise<number> {
  return new Promise((done) => {
    const req = request(url, { ca: creds.ca, cert: creds.cert, key: creds.key, timeout: 2_000 }, (res) => {
      res.resume();
      done(res.statusCode ?? 0);
    });
    req.on('error', () => done(0));
    req.on('timeout', () => req.destroy());
    req.end();
  });
}

async function waitReady(
  url: string,
  creds: ClientCredentials,
  children: Record<string, ChildProcess>,
  dir: string,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    for (const [name, child] of Object.entries(children)) {
      if (child.exitCode !== null || child.signalCode !== null) {
        throw new Error(
          `${name} exited (${child.exitCode ?? child.signalCode}) during start-up:\n${logTail(dir, name)}`,
        );
      }
    }
    if ((await get(`${url}/readyz`, creds)) === 200) return;
    if (Date.now() > deadline) {
      throw new Error(`kube-apiserver not ready after ${timeoutMs} ms:\n${logTail(dir, 'kube-apiserver')}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** Waits until the node's kubelet has registered it and reports it Ready (its network is up). */
async function waitNodeReady(
  kubectl: string,
  kubeconfig: string,
  node: KubeNode,
  timeoutMs: number,
): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const result = await runKubectl(kubectl, kubeconfig, [
      'get',
      'node',
      node.name,
      '-o',
      'jsonpath={.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].message}',
    ]);
    const last = (result.stdout || result.stderr).trim();
    const failure = node.failure();
    if (failure) throw new Error(`node ${node.name}: ${failure}`);
    if (result.code === 0 && last.startsWith('True')) return;
    if (Date.now() > deadline) {
      throw new Error(
        `node ${node.name} not Ready after ${timeoutMs} ms (${last}):\n${logTail(node.dir, 'kubelet')}`,
      );
    }
    await new Promise((r) => setTimeout(r, 500));
  }
}

/** How long one kubectl or sealion command may run before it is killed: a hung command must not hang a test. */
export const COMMAND_TIMEOUT_MS = 120_000;

/** Runs the real kubectl with a kubeconfig (and extra environment). Never throws on exit codes. */
export function runKubectl(
  kubectl: string,
  kubeconfig: string,
  args: string[],
  opts: { input?: string; env?: NodeJS.ProcessEnv; timeoutMs?: number } = {},
): Promise<KubectlResult> {
  const input = opts.input;
  const timeout = opts.timeoutMs ?? COMMAND_TIMEOUT_MS;
  return new Promise((done) => {
    const child = execFile(
      kubectl,
      [`--kubeconfig=${kubeconfig}`, ...args],
      {
        maxBuffer: 64 * 1024 * 1024,
        timeout,
        killSignal: 'SIGKILL',
        ...(opts.env ? { env: { ...process.env, ...opts.env } } : {}),
      },
      (err, stdout, stderr) => {
        const code = err ? (typeof err.code === 'number' ? err.code : 1) : 0;
        const killed = err?.killed ? `\nkubectl ${args.join(' ')}: killed after ${timeout} ms` : '';
        done({ code, stdout, stderr: stderr + killed });
      },
    );
    if (input !== undefined) child.stdin?.end(input);
  });
}

/**
 * kube-public/cluster-info as kubeadm writes it: a kubeconfig naming the API server users reach and its CA, which
 * anyone may read (kubeadm's Role and RoleBinding for system:anonymous).
 */
export function clusterInfoManifests(url: string, caPem: string): object {
  const kubeconfig = stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: '',
        cluster: { server: url, 'certificate-authority-data': Buffer.from(caPem).toString('base64') },
      },
    ],
    contexts: [],
    users: [],
    preferences: {},
  });
  return {
    apiVersion: 'v1',
    kind: 'List',
    items: [
      // The API server makes kube-public soon after it is ready, maybe not before this.
      { apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'kube-public' } },
      {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'cluster-info', namespace: 'kube-public' },
        data: { kubeconfig },
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'Role',
        metadata: { name: 'kubeadm:bootstrap-signer-clusterinfo', namespace: 'kube-public' },
        rules: [
          { apiGroups: [''], resources: ['configmaps'], resourceNames: ['cluster-info'], verbs: ['get'] },
        ],
      },
      {
        apiVersion: 'rbac.authorization.k8s.io/v1',
        kind: 'RoleBinding',
        metadata: { name: 'kubeadm:bootstrap-signer-clusterinfo', namespace: 'kube-public' },
        roleRef: {
          apiGroup: 'rbac.authorization.k8s.io',
          kind: 'Role',
          name: 'kubeadm:bootstrap-signer-clusterinfo',
        },
        subjects: [{ apiGroup: 'rbac.authorization.k8s.io', kind: 'User', name: 'system:anonymous' }],
      },
    ],
  };
}

/** Starts one independent cluster. Call `stop()` when done; process exit also cleans up. */
/** Start-up attempts: a free port found by listening on 0 can be taken by another process before etcd binds it. */
const START_ATTEMPTS = 3;

export async function startCluster(opts: ClusterOptions = {}): Promise<Cluster> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await startClusterOnce(opts);
    } catch (err) {
      const portRace = /address already in use|bind: /i.test((err as Error).message);
      if (!portRace || attempt >= START_ATTEMPTS) throw err;
      opts.log?.(`cluster start-up lost a port race; retrying (${attempt}/${START_ATTEMPTS - 1})`);
    }
  }
}

async function startClusterOnce(opts: ClusterOptions): Promise<Cluster> {
  const name = opts.name ?? 'sealion';
  const log = opts.log ?? (() => {});
  const binaries = await ensureBinaries(log);
  await sweepStaleClusters();
  installExitHook();

  const dir = mkdtempSync(join(tmpdir(), `${DIR_PREFIX}${name}-`));
  writeFileSync(join(dir, 'owner.pid'), String(process.pid));
  const children: ChildProcess[] = [];
  live.set(dir, children);
  let network: NodeNetwork | undefined;
  let node: KubeNode | undefined;
  const stop = async (): Promise<void> => {
    // The node first (it would restart pods as the control plane goes), then the controller manager, and etcd
    // last, so nobody logs errors about a vanished dependency.
    await node?.stop();
    await Promise.all([...children].reverse().map((child) => stopChild(child, { graceMs: STOP_GRACE_MS })));
    if (network) await releaseNodeNetwork(network);
    live.delete(dir);
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    const write = (file: string, text: string): string => {
      const path = join(dir, file);
      writeFileSync(path, text, { mode: 0o600 });
      return path;
    };
    // A node reaches the API server at the machine's end of its veth pair, which the API server advertises.
    if (opts.node) network = await claimNodeNetwork();
    const ca = await newCA(`${name}-ca`);
    const frontProxyCA = await newCA(`${name}-front-proxy-ca`);
    const [port, etcdPort, etcdPeerPort] = [await freePort(), await freePort(), await freePort()];
    const url = `https://127.0.0.1:${port}`;
    const serving = await issueCert(ca, {
      commonName: 'kube-apiserver',
      hosts: [
        '127.0.0.1',
        'localhost',
        '10.0.0.1',
        'kubernetes',
        'kubernetes.default',
        'kubernetes.default.svc',
        'kubernetes.default.svc.cluster.local',
        ...(network ? [network.hostIp] : []),
      ],
      usage: 'server',
    });
    const admin = await issueCert(ca, {
      commonName: 'sealion-admin',
      organizations: ['system:masters'],
      usage: 'client',
    });
    const frontProxyClient = await issueCert(frontProxyCA, {
      commonName: 'front-proxy-client',
      usage: 'client',
    });
    const saKeys = await newKeyPair();

    const caFile = write('ca.crt', ca.certPem);
    write('ca.key', ca.keyPem);
    // For tests that play a front proxy of their own (the real one's certificate is front-proxy-client.crt).
    write('front-proxy-ca.key', frontProxyCA.keyPem);
    const saKey = write('sa.key', await privateKeyToPem(saKeys.privateKey));
    const saPub = write('sa.pub', await publicKeyToPem(saKeys.publicKey));
    const kubeconfigPath = write(
      'admin.kubeconfig',
      kubeconfigYaml(name, url, ca.certPem, { name: 'admin', certPem: admin.certPem, keyPem: admin.keyPem }),
    );

    const etcdUrl = `http://127.0.0.1:${etcdPort}`;
    const etcdPeer = `http://127.0.0.1:${etcdPeerPort}`;
    const etcd = startProcess(dir, 'etcd', binaries.etcd, [
      '--name=default',
      `--data-dir=${join(dir, 'etcd-data')}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=${etcdPeer}`,
      `--initial-advertise-peer-urls=${etcdPeer}`,
      `--initial-cluster=default=${etcdPeer}`,
      // A throwaway test store: durability is not worth an fsync per write.
      '--unsafe-no-fsync',
      '--log-level=warn',
    ]);
    children.push(etcd);

    const apiserver = startProcess(dir, 'kube-apiserver', binaries.kubeApiserver, [
      `--etcd-servers=${etcdUrl}`,
      `--secure-port=${port}`,
      ...(network
        ? [
            // The node and its pods come from the node's namespace. The API server still binds every address
            // (it takes one only), and its client-certificate authentication guards the port.
            '--bind-address=0.0.0.0',
            `--advertise-address=${network.hostIp}`,
            '--authorization-mode=Node,RBAC',
            '--enable-admission-plugins=NodeRestriction',
            // Node names resolve nowhere; node addresses do.
            '--kubelet-preferred-address-types=InternalIP',
            `--kubelet-client-certificate=${write('apiserver-kubelet-client.crt', admin.certPem)}`,
            `--kubelet-client-key=${write('apiserver-kubelet-client.key', admin.keyPem)}`,
          ]
        : [
            '--bind-address=127.0.0.1',
            '--advertise-address=127.0.0.1',
            '--authorization-mode=RBAC',
            // The endpoints reconciler would publish 127.0.0.1, which endpoint validation rejects.
            '--endpoint-reconciler-type=none',
          ]),
      `--tls-cert-file=${write('apiserver.crt', serving.certPem)}`,
      `--tls-private-key-file=${write('apiserver.key', serving.keyPem)}`,
      `--client-ca-file=${caFile}`,
      `--service-cluster-ip-range=${SERVICE_CIDR}`,
      `--service-account-issuer=${SERVICE_ACCOUNT_ISSUER}`,
      `--service-account-key-file=${saPub}`,
      `--service-account-signing-key-file=${saKey}`,
      `--requestheader-client-ca-file=${write('front-proxy-ca.crt', frontProxyCA.certPem)}`,
      '--requestheader-allowed-names=front-proxy-client',
      '--requestheader-username-headers=X-Remote-User',
      '--requestheader-group-headers=X-Remote-Group',
      '--requestheader-extra-headers-prefix=X-Remote-Extra-',
      '--requestheader-uid-headers=X-Remote-Uid',
      // Aggregated API servers are reached at their endpoints' addresses: this API server runs on the machine, where
      // pods' addresses route (through the nodes' veth pairs) and Services' cluster IPs do not.
      '--enable-aggregator-routing=true',
      `--proxy-client-cert-file=${write('front-proxy-client.crt', frontProxyClient.certPem)}`,
      `--proxy-client-key-file=${write('front-proxy-client.key', frontProxyClient.keyPem)}`,
      '--allow-privileged=true',
      '--profiling=false',
      `--audit-policy-file=${write('audit-policy.yaml', DEV_AUDIT_POLICY)}`,
      `--audit-log-path=${join(dir, 'audit.log')}`,
      // Each event written before the request is answered: a test that reads the log after an answer finds it.
      '--audit-log-mode=blocking',
      ...(opts.apiserverArgs ?? []),
    ]);
    children.push(apiserver);

    const creds = { ca: ca.certPem, cert: admin.certPem, key: admin.keyPem };
    log(`starting cluster ${name} at ${url}`);
    await waitReady(url, creds, { etcd, 'kube-apiserver': apiserver }, dir, opts.readyTimeoutMs ?? 90_000);
    // Where users reach this API server, published as kubeadm publishes it (and lets anyone read it).
    const info = await runKubectl(binaries.kubectl, kubeconfigPath, ['apply', '-f', '-'], {
      input: JSON.stringify(clusterInfoManifests(url, ca.certPem)),
    });
    if (info.code !== 0) throw new Error(`publishing kube-public/cluster-info: ${info.stderr}`);

    if (opts.controllerManager ?? true) {
      children.push(
        startProcess(dir, 'kube-controller-manager', binaries.kubeControllerManager, [
          `--kubeconfig=${kubeconfigPath}`,
          `--authentication-kubeconfig=${kubeconfigPath}`,
          `--authorization-kubeconfig=${kubeconfigPath}`,
          '--bind-address=127.0.0.1',
          `--secure-port=${await freePort()}`,
          '--leader-elect=false',
          `--service-account-private-key-file=${saKey}`,
          `--root-ca-file=${caFile}`,
          `--service-cluster-ip-range=${SERVICE_CIDR}`,
          `--cluster-signing-cert-file=${caFile}`,
          `--cluster-signing-key-file=${join(dir, 'ca.key')}`,
          '--use-service-account-credentials=true',
          // No cloud here, so its controllers would only log about that; the node lifecycle controller (which
          // lifts a new node's not-ready taint) only where there is a node.
          `--controllers=*,-nodeipam,${network ? '' : '-nodelifecycle,'}-cloud-node-lifecycle,-route,-service,-persistentvolume-binder,-attachdetach`,
        ]),
      );
    }

    if (opts.node && network) {
      const nodeBinaries = await ensureNodeBinaries(log);
      children.push(
        startProcess(dir, 'kube-scheduler', nodeBinaries.kubeScheduler, [
          `--kubeconfig=${kubeconfigPath}`,
          `--authentication-kubeconfig=${kubeconfigPath}`,
          `--authorization-kubeconfig=${kubeconfigPath}`,
          '--bind-address=127.0.0.1',
          `--secure-port=${await freePort()}`,
          '--leader-elect=false',
        ]),
      );
      node = await startNode({
        name: opts.node.name ?? `${name}-node`,
        network,
        apiserverUrl: `https://${network.hostIp}:${port}`,
        ca,
        dir,
        ...(opts.node.labels ? { labels: opts.node.labels } : {}),
        ...(opts.node.providerID ? { providerID: opts.node.providerID } : {}),
        images: [await ensureCoreDNSImage(nodeBinaries.coredns), ...(opts.node.images ?? [])],
        clusterDNS: CLUSTER_DNS_IP,
        log,
      });
      await waitNodeReady(binaries.kubectl, kubeconfigPath, node, opts.readyTimeoutMs ?? 90_000);
      // Cluster DNS; pods that start before it is ready retry their lookups, so start-up does not wait for it.
      const dns = await runKubectl(binaries.kubectl, kubeconfigPath, ['apply', '-f', '-'], {
        input: JSON.stringify({ apiVersion: 'v1', kind: 'List', items: clusterDNSManifests() }),
      });
      if (dns.code !== 0) throw new Error(`applying cluster DNS: ${dns.stderr}`);
    }

    const cluster: Cluster = {
      name,
      url,
      kubeconfigPath,
      ca,
      dir,
      binaries,
      ...(node ? { node } : {}),
      auditLogPath: join(dir, 'audit.log'),
      async userKubeconfig(user, groups = []) {
        const cert = await issueCert(ca, { commonName: user, organizations: groups, usage: 'client' });
        const file = `user-${user.replace(/[^a-zA-Z0-9_.-]/g, '_')}.kubeconfig`;
        return write(
          file,
          kubeconfigYaml(name, url, ca.certPem, { name: user, certPem: cert.certPem, keyPem: cert.keyPem }),
        );
      },
      kubectl: (args, kubectlOpts = {}) =>
        runKubectl(binaries.kubectl, kubectlOpts.kubeconfig ?? kubeconfigPath, args, kubectlOpts),
      stop,
    };
    return cluster;
  } catch (err) {
    await stop();
    throw err;
  }
}
