// Sealion as users run it: its image on real nodes, installed from config/concierge (two replicas), the kubelet's
// streaming commands through the impersonation proxy, and concierge pods deleted mid-watch and mid-exec.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { runKubectl } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import {
  DEMO_GROUP,
  DEMO_USER,
  DEMO_NAMESPACE,
  DEMO_POD,
  EDGE,
  startInstalledSealion,
  stopInstalled,
  type InstalledSealion,
  type Running,
} from '../dev/installed.ts';
import { parse } from 'yaml';
import { dieWithParent, runSealion, stopChild } from '../dev/processes.ts';
import { LEADER_LEASE } from '../concierge/concierge.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { CONCIERGE_NAME } from '../apis/install.ts';
import { demoTarget, podCommandCases, type PodTarget } from './harness/pod-commands.ts';

const running: Running = {};
let installed: InstalledSealion;
let dir: string;
let target: PodTarget;
const namespace = DEFAULT_INSTALL.namespace;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-pods-'));
  installed = await startInstalledSealion(running, () => {});
  target = await demoTarget(installed, dir);
}, 300_000);

afterAll(async () => {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

describe('the installed concierge', () => {
  it('runs two pods of the image, as the manifests say, and one of them leads', async () => {
    const pods = await installed.hub.kubectl([
      'get',
      'pods',
      '-n',
      namespace,
      '-l',
      `app=${CONCIERGE_NAME}`,
      '-o',
      'jsonpath={range .items[*]}{.metadata.name} {.status.phase} {.spec.containers[0].image}{"\\n"}{end}',
    ]);
    const lines = pods.stdout.trim().split('\n');
    expect(lines).toHaveLength(2);
    for (const line of lines)
      expect(line).toMatch(new RegExp(`Running ${installed.image.name.replace(/[.]/g, '\\.')}$`));
    const holder = await leader();
    expect(lines.map((l) => l.split(' ')[0])).toContain(holder);
  });
});

podCommandCases('the impersonation proxy', () => target);

describe('one kubeconfig for every cluster', () => {
  it('has a context for the hub and one for edge, sharing one user, and sealion clusters finds both Ready', async () => {
    const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
    const path = join(dir, 'all.kubeconfig');
    writeFileSync(path, await installed.kubeconfig(token, '', true), { mode: 0o600 });
    const config = parse(readFileSync(path, 'utf8')) as {
      clusters: { cluster: { server: string } }[];
      contexts: { name: string; context: { user: string } }[];
      users: unknown[];
    };
    // Named by the proxy's address, then the cluster's name as over SSH: the hub's is its ssh.hubName.
    const proxy = new URL(config.clusters[0]!.cluster.server).host;
    const [hubContext, edgeContext] = [`${proxy}/hub`, `${proxy}/${EDGE}`];
    expect(config.contexts.map((c) => c.name)).toEqual([hubContext, edgeContext]);
    expect(config.users).toHaveLength(1);
    const home = mkdtempSync(join(tmpdir(), 'sealion-all-'));
    const listed = await runSealion(['clusters', '--kubeconfig', path, '-o', 'json'], {
      XDG_CONFIG_HOME: home,
    });
    expect(listed).toMatchObject({ code: 0, stderr: '' });
    expect(JSON.parse(listed.stdout)).toEqual([
      expect.objectContaining({ context: hubContext, state: 'Ready', detail: DEMO_USER }),
      expect.objectContaining({ context: edgeContext, state: 'Ready', detail: DEMO_USER }),
    ]);
    // One login for both: the certificate the plugin got for the hub's proxy serves edge too.
    expect(readdirSync(join(home, 'sealion', 'credentials')).filter((f) => f.endsWith('.json'))).toHaveLength(
      1,
    );
    // kubectl reaches edge's demo pod through the same kubeconfig, by context.
    const edgePods = await runKubectl(
      installed.hub.binaries.kubectl,
      path,
      ['--context', edgeContext, 'get', 'pods', '-n', DEMO_NAMESPACE, '-o', 'name'],
      { env: { XDG_CONFIG_HOME: home } },
    );
    expect(edgePods).toMatchObject({ code: 0, stdout: `pod/${DEMO_POD}\n` });
    rmSync(home, { recursive: true, force: true });
  });
});

describe("the node's pod network", () => {
  it('resolves kubernetes.default, and a pod reaches another through its Service by name', async () => {
    const { hub } = installed;
    const exposed = await hub.kubectl([
      'expose',
      'pod',
      DEMO_POD,
      '-n',
      DEMO_NAMESPACE,
      '--name=web',
      '--port=80',
      '--target-port=8080',
    ]);
    expect(exposed.code).toBe(0);
    const inPod = (script: string) =>
      hub.kubectl(['exec', DEMO_POD, '-n', DEMO_NAMESPACE, '--', 'sh', '-c', script]);
    // CoreDNS may still be starting: lookups are retried as a pod's would be. (busybox's nslookup takes names as
    // given, without the search path.)
    let webIp = '';
    await eventually(async () => {
      const lookup = await inPod(
        'nslookup kubernetes.default.svc.cluster.local; nslookup web.demo.svc.cluster.local',
      );
      const addresses = [...lookup.stdout.matchAll(/^Address:\s*(10\.0\.0\.\d+)$/gm)].map((m) => m[1]);
      if (addresses[0] !== '10.0.0.1' || !addresses[1])
        throw new Error(`nslookup: ${lookup.stdout}${lookup.stderr}`);
      webIp = addresses[1];
    }, 60_000);
    // kube-proxy programs the Service's address a moment after the Service exists (later on a busy machine): until
    // then a connection to it goes nowhere, so each try has a deadline and is made again, as a client would.
    await eventually(async () => {
      // busybox's own timeout, as this build's wget -T crashes.
      const fetched = await inPod(`timeout 5 wget -qO- http://${webIp}/index.html`);
      expect(fetched.stdout).toBe(`hello from ${DEMO_POD}\n`);
    }, 60_000);
    // Sealion's image resolves short names through the search path, as its pods do.
    const resolved = await hub.kubectl([
      'exec',
      `deployment/${CONCIERGE_NAME}`,
      '-n',
      namespace,
      '--',
      '/usr/local/bin/node',
      '-e',
      "require('node:dns').lookup('kubernetes.default', (err, address) => console.log(err ? err.code : address))",
    ]);
    expect(resolved.stdout.trim()).toBe('10.0.0.1');
  });
});

/** The pod holding the controllers' Lease. */
async function leader(): Promise<string> {
  const lease = await installed.hub.kubectl([
    'get',
    'lease',
    LEADER_LEASE,
    '-n',
    namespace,
    '-o',
    'jsonpath={.spec.holderIdentity}',
  ]);
  return lease.stdout.trim();
}

describe('concierge pods deleted under load', () => {
  it('a watch and an exec through the proxy end cleanly, and a new pod takes over the Lease', async () => {
    const before = await leader();
    const start = (args: string[]) => {
      const [command, argv] = dieWithParent(target.kubectl, [
        `--kubeconfig=${target.kubeconfig}`,
        '-n',
        DEMO_NAMESPACE,
        ...args,
      ]);
      const child = spawn(command, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
      let stderr = '';
      let stdout = '';
      child.stderr.on('data', (chunk: Buffer) => (stderr += chunk.toString('utf8')));
      child.stdout.on('data', (chunk: Buffer) => (stdout += chunk.toString('utf8')));
      const exited = new Promise<{ code: number | null; stderr: string }>((done) =>
        child.once('exit', (code) => done({ code, stderr })),
      );
      return { child, exited, stdout: () => stdout };
    };
    const watch = start(['get', 'configmaps', '--watch']);
    const exec = start(['exec', DEMO_POD, '--', 'sh', '-c', 'echo running; exec sleep 600']);
    try {
      // Both are established before the pods go: the watch has printed what it lists first, and the command runs.
      await eventually(() => expect(watch.stdout()).toMatch(/\S/), 30_000);
      await eventually(() => expect(exec.stdout()).toContain('running'), 30_000);
      const deleted = await installed.hub.kubectl([
        'delete',
        'pods',
        '-n',
        namespace,
        '-l',
        `app=${CONCIERGE_NAME}`,
        '--wait=false',
      ]);
      expect(deleted.code).toBe(0);
      // Neither hangs: each ends (the exec long before its sleep would), with an error the user can read.
      const execEnd = await exec.exited;
      expect(execEnd.code).not.toBe(0);
      expect(execEnd.stderr.trim()).not.toBe('');
      const watchEnd = await watch.exited;
      expect(watchEnd.code === 0 || watchEnd.stderr.trim() !== '').toBe(true);
      // The Deployment's new pods take over: a new leader, and the proxy answers again.
      await eventually(async () => {
        const now = await leader();
        if (!now || now === before) throw new Error(`the Lease is still ${now || 'unheld'}`);
        const pods = await installed.hub.kubectl([
          'get',
          'pod',
          now,
          '-n',
          namespace,
          '-o',
          'jsonpath={.status.phase}',
        ]);
        if (pods.stdout !== 'Running') throw new Error(`the new leader ${now} is ${pods.stdout}`);
      }, 120_000);
      await eventually(async () => {
        const { code, stderr } = await new Promise<{ code: number | null; stderr: string }>((done) => {
          const again = start(['get', 'pods']);
          void again.exited.then(done);
        });
        if (code !== 0) throw new Error(`the proxy does not answer yet: ${stderr}`);
      }, 120_000);
    } finally {
      await Promise.all([stopChild(watch.child), stopChild(exec.child)]);
    }
  }, 300_000);
});

describe('mode: auto (the default), judged from the real node', () => {
  const node = 'sealion-dev-node';
  /** The impersonation proxy strategy's message on the CredentialIssuer. */
  const strategy = async (): Promise<string> => {
    const result = await installed.hub.kubectl([
      'get',
      'credentialissuers',
      '-o',
      'jsonpath={.items[0].status.strategies[?(@.type=="ImpersonationProxy")].message}',
    ]);
    return result.stdout;
  };
  const proxyService = async (): Promise<boolean> =>
    (await installed.hub.kubectl(['get', 'service', 'sealion-impersonation-proxy', '-n', namespace])).code ===
    0;

  it('keeps the proxy off on a self-hosted-looking node, with its evidence, and on with the managed marks', async () => {
    expect(await strategy()).toContain('automatically enabled: node sealion-dev-node has the EKS label');
    // What a kubeadm control-plane node looks like: its role label, and no provider's marks.
    const relabel = async (labels: string[]): Promise<void> => {
      const result = await installed.hub.kubectl(['label', 'node', node, '--overwrite', ...labels]);
      if (result.code !== 0) throw new Error(result.stderr);
    };
    await relabel([
      'eks.amazonaws.com/nodegroup-',
      'eks.amazonaws.com/capacityType-',
      'node-role.kubernetes.io/control-plane=',
    ]);
    await eventually(async () => {
      const message = await strategy();
      if (!message.includes(`automatically disabled: node ${node} is a control-plane node`))
        throw new Error(`strategy: ${message}`);
      if (await proxyService()) throw new Error('the proxy Service is still there');
    }, 60_000);
    await relabel(['eks.amazonaws.com/nodegroup=sealion-dev', 'node-role.kubernetes.io/control-plane-']);
    await eventually(async () => {
      const message = await strategy();
      if (!message.includes(`automatically enabled: node ${node} has the EKS label`))
        throw new Error(`strategy: ${message}`);
      if (!(await proxyService())) throw new Error('no proxy Service yet');
    }, 60_000);
  });
});

describe('a drain of the hub node', () => {
  const node = 'sealion-dev-node';
  const budget = async (): Promise<string> =>
    (
      await installed.hub.kubectl([
        'get',
        'poddisruptionbudget',
        CONCIERGE_NAME,
        '-n',
        namespace,
        '-o',
        'jsonpath={.status.currentHealthy} {.status.disruptionsAllowed}',
      ])
    ).stdout;
  /** Asks the API server to evict a pod, as `kubectl drain` does. */
  const evict = async (pod: string) => {
    const file = join(dir, `eviction-${pod}.json`);
    writeFileSync(
      file,
      JSON.stringify({ apiVersion: 'policy/v1', kind: 'Eviction', metadata: { name: pod, namespace } }),
    );
    return installed.hub.kubectl([
      'create',
      '--raw',
      `/api/v1/namespaces/${namespace}/pods/${pod}/eviction`,
      '-f',
      file,
    ]);
  };

  it('evicts one concierge replica, and the budget refuses the other while the first has no replacement', async () => {
    // Both replicas ready, as the budget counts them.
    await eventually(async () => expect(await budget()).toBe('2 1'), 120_000);
    const listed = await installed.hub.kubectl([
      'get',
      'pods',
      '-n',
      namespace,
      '-l',
      `app=${CONCIERGE_NAME}`,
      '-o',
      'jsonpath={.items[*].metadata.name}',
    ]);
    const [first, second] = listed.stdout.trim().split(' ');
    // Cordoned, as a drain begins: the first replica's replacement cannot be scheduled until the node is back.
    expect((await installed.hub.kubectl(['cordon', node])).code).toBe(0);
    try {
      expect(await evict(first!)).toMatchObject({ code: 0 });
      const refused = await evict(second!);
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toMatch(/disruption budget/);
    } finally {
      await installed.hub.kubectl(['uncordon', node]);
    }
    // The replacement is scheduled once the node is back, and the budget allows one eviction again.
    await eventually(async () => expect(await budget()).toBe('2 1'), 180_000);
  }, 300_000);
});
