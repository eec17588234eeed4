// Controllers on the hub reach the fleet, on real nodes: Sealion installed as the README says (two concierge replicas
// on the hub, the agent as a pod on edge), then the README's section on controllers run word for word: edge's Cluster
// takes hub workloads under `hub:`, edge's RBAC grants the mapped group, `sealion cluster kubeconfig` writes the
// kubeconfig, and the README's Deployment runs kubectl on the hub as the service account gitops/deployer with a
// projected token for Sealion's audience. kubectl in that pod (through `kubectl exec`) lists and writes on edge as
// edge's RBAC allows and is refused where it or edge's grant to its agent says no; the pod's ordinary token is
// refused; edge's own audit log names the mapped user and the hub service account and pod it came from; and the same
// holds through each replica, the one holding edge's tunnel and the one that sends over the peer hop.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { parse } from 'yaml';
import type { Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { ensureKubectlImage, kubectlImageName } from '../dev/image.ts';
import {
  EDGE,
  startInstalledSealion,
  stopInstalled,
  workloadsSection,
  WORKLOAD_ACCOUNT,
  WORKLOAD_NAMESPACE,
  WORKLOAD_PREFIX,
  type Running,
} from '../dev/installed.ts';
import { dieWithParent } from '../dev/processes.ts';
import { writeShim } from '../dev/shim.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { CONCIERGE_NAME, PROXY_PORT } from '../apis/install.ts';

const running: Running = {};
let dir: string;
let hub: Cluster;
let edge: Cluster;
/** The README Deployment's pod. */
let pod: string;

const SA_USER = `system:serviceaccount:${WORKLOAD_NAMESPACE}:${WORKLOAD_ACCOUNT}`;
const MAPPED = `${WORKLOAD_PREFIX}${SA_USER}`;
const PROXY_SERVICE_NAME = `sealion-impersonation-proxy.${DEFAULT_INSTALL.namespace}.svc`;
const ORIGINAL_USER_KEY = 'impersonation-proxy.concierge.sealion.dev/original-user-info';
/** A namespace on edge where the test's own binding lets the mapped user write ConfigMaps (edge's RBAC, not Sealion). */
const WRITABLE = 'deployed';

/** Runs the README section's sh block with bash, in `cwd`, as the Install section is run. */
function runSection(script: string, cwd: string, env: Record<string, string>): Promise<void> {
  return new Promise((done, fail) => {
    const [command, args] = dieWithParent('bash', ['-euo', 'pipefail', '-c', script]);
    const child = spawn(command, args, {
      cwd,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    const keep = (chunk: Buffer): void => void (output = (output + chunk.toString('utf8')).slice(-8000));
    child.stdout.on('data', keep);
    child.stderr.on('data', keep);
    child.on('error', fail);
    child.on('exit', (code, signal) =>
      code === 0
        ? done()
        : fail(new Error(`the README's section on controllers failed (${code ?? signal}):\n${output}`)),
    );
  });
}

async function kubectlOk(cluster: Cluster, args: string[]): Promise<string> {
  const result = await cluster.kubectl(args);
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr.trim()}`);
  return result.stdout;
}

/** kubectl run inside the README Deployment's pod (its own kubectl, its mounted kubeconfig and projected token). */
const inPod = (args: string[]) =>
  hub.kubectl(['-n', WORKLOAD_NAMESPACE, 'exec', pod, '-c', 'kubectl', '--', 'kubectl', ...args]);

interface AuditEvent {
  auditID: string;
  stage: string;
  verb: string;
  objectRef?: { resource?: string; namespace?: string; name?: string };
  impersonatedUser?: { username?: string; groups?: string[]; extra?: Record<string, string[]> };
  annotations?: Record<string, string>;
  responseStatus?: { code?: number };
}

const eventsIn = (text: string): AuditEvent[] =>
  text
    .split('\n')
    .filter((line) => line.includes('"kind":"Event"'))
    .map((line) => JSON.parse(line) as AuditEvent);

/** Edge's own audit event for the create of ConfigMap `name`. */
const edgeCreateOf = (name: string): AuditEvent | undefined =>
  eventsIn(readFileSync(edge.auditLogPath, 'utf8')).find(
    (e) =>
      e.stage === 'ResponseComplete' &&
      e.verb === 'create' &&
      e.objectRef?.resource === 'configmaps' &&
      e.objectRef.name === name,
  );

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-workloads-'));
  const kubectlImage = await ensureKubectlImage();
  const installed = await startInstalledSealion(running, () => {}, { hubImages: [kubectlImage] });
  ({ hub, edge } = installed);
  const { script, deployment } = workloadsSection();
  // The README's image is the Kubernetes project's kubectl at the pinned release: the one loaded into the hub's node.
  expect(
    (parse(deployment) as { spec: { template: { spec: { containers: { image: string }[] } } } }).spec.template
      .spec.containers[0]!.image,
  ).toBe(kubectlImageName());
  writeFileSync(join(dir, 'deployer.yaml'), deployment);
  const shim = dirname(writeShim(join(dir, 'bin')));
  await runSection(script, dir, {
    KUBECONFIG: hub.kubeconfigPath,
    EDGE_KUBECONFIG: edge.kubeconfigPath,
    PATH: [dirname(hub.binaries.kubectl), shim, process.env['PATH']].join(':'),
  });
  pod = (
    await kubectlOk(hub, [
      '-n',
      WORKLOAD_NAMESPACE,
      'get',
      'pods',
      '-l',
      'app=deployer',
      '--field-selector=status.phase=Running',
      '-o',
      'jsonpath={.items[0].metadata.name}',
    ])
  ).trim();
  // Edge's admin lets the mapped service account write ConfigMaps in one namespace of its own choosing.
  for (const args of [
    ['create', 'namespace', WRITABLE],
    ['-n', WRITABLE, 'create', 'role', 'configmap-writer', '--verb=create,get,list', '--resource=configmaps'],
    ['-n', WRITABLE, 'create', 'rolebinding', 'hub-deployer', '--role=configmap-writer', `--user=${MAPPED}`],
  ])
    await kubectlOk(edge, args);
}, 900_000);

afterAll(async () => {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

describe('a controller on the hub, through the proxy in-cluster', () => {
  it("lists edge's objects as edge's RBAC for the mapped group allows (the Deployment's own watch among them)", async () => {
    await kubectlOk(edge, ['-n', 'demo', 'create', 'configmap', 'seen-by-the-hub', '--from-literal=a=b']);
    const listed = await inPod(['-n', 'demo', 'get', 'configmaps', '-o', 'name']);
    expect(listed).toMatchObject({ code: 0 });
    expect(listed.stdout).toContain('configmap/seen-by-the-hub');
    // The Deployment's container is a watch through the same path: what edge has, it printed.
    await eventually(async () => {
      const logs = await kubectlOk(hub, ['-n', WORKLOAD_NAMESPACE, 'logs', pod]);
      if (!logs.includes('seen-by-the-hub')) throw new Error(`the watch printed: ${logs}`);
    }, 60_000);
    expect((await inPod(['auth', 'whoami', '-o', 'jsonpath={.status.userInfo.username}'])).stdout).toBe(
      MAPPED,
    );
  }, 120_000);

  it("creates where edge's RBAC lets the mapped user, and is refused (403) where it does not", async () => {
    const made = await inPod([
      '-n',
      WRITABLE,
      'create',
      'configmap',
      'made-by-the-hub',
      '--from-literal=a=b',
    ]);
    expect(made).toMatchObject({ code: 0 });
    await kubectlOk(edge, ['-n', WRITABLE, 'get', 'configmap', 'made-by-the-hub']);
    const refused = await inPod(['-n', 'demo', 'create', 'configmap', 'not-allowed', '--from-literal=a=b']);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain(
      `configmaps is forbidden: User "${MAPPED}" cannot create resource "configmaps" in API group "" in the namespace "demo"`,
    );
    // view reads no Secrets: edge's 403, as kubectl says it.
    const secrets = await inPod(['-n', 'demo', 'get', 'secrets']);
    expect(secrets.code).not.toBe(0);
    expect(secrets.stderr).toContain(
      `Error from server (Forbidden): secrets is forbidden: User "${MAPPED}" cannot list resource "secrets" in API group "" in the namespace "demo"`,
    );
  }, 120_000);

  it("is refused with the pod's ordinary token (the API server's audience), told which audience to use", async () => {
    // The pod's own token as the API server's TokenRequest makes it for the pod: bound to it, the API server's audience.
    const ordinary = (
      await kubectlOk(hub, [
        '-n',
        WORKLOAD_NAMESPACE,
        'create',
        'token',
        WORKLOAD_ACCOUNT,
        '--bound-object-kind=Pod',
        `--bound-object-name=${pod}`,
      ])
    ).trim();
    // A kubeconfig's token file wins over --token, so this request names the proxy by flags alone; the proxy's
    // answer is what is checked, not its certificate.
    const refused = await inPod([
      '--kubeconfig=/dev/null',
      `--server=https://${PROXY_SERVICE_NAME}/clusters/${EDGE}`,
      '--insecure-skip-tls-verify',
      `--token=${ordinary}`,
      'get',
      '--raw',
      '/api/v1/namespaces/demo/configmaps',
    ]);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toContain('Error from server (Forbidden)');
    expect(refused.stderr).toContain(
      `use a projected service-account token with audience workloads.concierge.sealion.dev (sealion cluster kubeconfig ${EDGE} --service-account ${WORKLOAD_NAMESPACE}/${WORKLOAD_ACCOUNT})`,
    );
  }, 60_000);

  it("shows in edge's own audit log as the mapped user, with the hub service account and its pod", async () => {
    const event = await eventually(() => {
      const found = edgeCreateOf('made-by-the-hub');
      if (!found) throw new Error("no audit event on edge for the hub's create yet");
      return Promise.resolve(found);
    }, 30_000);
    expect(event.impersonatedUser).toMatchObject({
      username: MAPPED,
      groups: expect.arrayContaining([
        `${WORKLOAD_PREFIX}system:serviceaccounts`,
        `${WORKLOAD_PREFIX}system:serviceaccounts:${WORKLOAD_NAMESPACE}`,
      ]),
    });
    const original = JSON.parse(event.impersonatedUser!.extra![ORIGINAL_USER_KEY]![0]!) as {
      username: string;
      extra?: Record<string, string[]>;
    };
    expect(original.username).toBe(SA_USER);
    expect(original.extra?.['authentication.kubernetes.io/pod-name']).toEqual([pod]);
  }, 60_000);
});

describe('through each replica: the one holding the tunnel and the one that sends over the peer hop', () => {
  /** Each live replica's name and pod address. */
  let replicas: { name: string; ip: string }[];
  let holder: string;

  beforeAll(async () => {
    // One tunnel, so that one replica holds it and the other has only the peer hop: edge's admin tells its agent so.
    await kubectlOk(edge, [
      '-n',
      'sealion-agent',
      'patch',
      'deployment',
      'sealion-agent',
      '--type=json',
      '-p',
      JSON.stringify([{ op: 'add', path: '/spec/template/spec/containers/0/args/-', value: '--tunnels=1' }]),
    ]);
    ({ replicas, holder } = await eventually(async () => {
      const pods = JSON.parse(
        await kubectlOk(hub, [
          'get',
          'pods',
          '-n',
          DEFAULT_INSTALL.namespace,
          '-l',
          `app=${CONCIERGE_NAME}`,
          '-o',
          'json',
        ]),
      ) as {
        items: {
          metadata: { name: string; deletionTimestamp?: string };
          status: { phase?: string; podIP?: string };
        }[];
      };
      const live = pods.items
        .filter((p) => !p.metadata.deletionTimestamp && p.status.phase === 'Running' && p.status.podIP)
        .map((p) => ({ name: p.metadata.name, ip: p.status.podIP! }));
      const holders = (
        await kubectlOk(hub, ['get', 'clusters', EDGE, '-o', 'jsonpath={.status.tunnels[*].replica}'])
      )
        .split(/\s+/)
        .filter(Boolean);
      const agents = await kubectlOk(edge, ['-n', 'sealion-agent', 'get', 'pods', '-o', 'name']);
      if (live.length !== 2 || holders.length !== 1 || !live.some((r) => r.name === holders[0]))
        throw new Error(`replicas ${JSON.stringify(live)}, holders [${holders.join(', ')}]`);
      if (agents.trim().split('\n').length !== 1) throw new Error(`agents: ${agents}`);
      return { replicas: live, holder: holders[0]! };
    }, 180_000));
  }, 240_000);

  it('lists and writes through each, as the same mapped user, and each replica audits its route', async () => {
    for (const replica of replicas) {
      // The replica's own address, checked against the name the proxy's certificate carries.
      const via = [
        `--server=https://${replica.ip}:${PROXY_PORT}/clusters/${EDGE}`,
        `--tls-server-name=${PROXY_SERVICE_NAME}`,
      ];
      const name = `made-through-${replica.name}`;
      await eventually(async () => {
        const listed = await inPod([...via, '-n', 'demo', 'get', 'configmaps', '-o', 'name']);
        if (listed.code !== 0) throw new Error(listed.stderr);
      }, 60_000);
      const made = await inPod([...via, '-n', WRITABLE, 'create', 'configmap', name, '--from-literal=a=b']);
      expect(made).toMatchObject({ code: 0 });
      const refused = await inPod([...via, '-n', 'demo', 'create', 'configmap', name, '--from-literal=a=b']);
      expect(refused.stderr).toContain(`User "${MAPPED}" cannot create resource "configmaps"`);
      // Edge's event for it names the mapped user; the replica's own event says how it went there.
      const event = await eventually(() => {
        const found = edgeCreateOf(name);
        if (!found) throw new Error(`no audit event on edge for ${name} yet`);
        return Promise.resolve(found);
      }, 30_000);
      expect(event.impersonatedUser?.username).toBe(MAPPED);
      const route = await eventually(async () => {
        const logs = await kubectlOk(hub, ['-n', DEFAULT_INSTALL.namespace, 'logs', replica.name]);
        const ours = eventsIn(logs).find((e) => e.auditID === event.auditID);
        if (!ours) throw new Error(`no audit event on ${replica.name} for ${name} yet`);
        return ours.annotations?.['sealion.dev/route'];
      }, 30_000);
      expect(route).toBe(replica.name === holder ? 'tunnel' : 'peer');
    }
  }, 240_000);

  it("is refused where edge's grant to its agent says no, with a message that says so", async () => {
    // Edge's admin takes create out of what the agent may do for users: edge's RBAC still lets the mapped user.
    const role = JSON.parse(
      await kubectlOk(edge, ['get', 'clusterrole', 'sealion-agent-forwarding', '-o', 'json']),
    ) as {
      rules: { verbs: string[] }[];
    };
    const rules = role.rules.map((r) => ({
      ...r,
      verbs: r.verbs.filter((v) => v !== 'impersonate-on:user-info:create'),
    }));
    await kubectlOk(edge, [
      'patch',
      'clusterrole',
      'sealion-agent-forwarding',
      '--type=merge',
      '-p',
      JSON.stringify({ rules }),
    ]);
    for (const replica of replicas) {
      const via = [
        `--server=https://${replica.ip}:${PROXY_PORT}/clusters/${EDGE}`,
        `--tls-server-name=${PROXY_SERVICE_NAME}`,
      ];
      // Sealion keeps an allowed answer for a few seconds; the API server enforces the grant meanwhile.
      const refused = await eventually(async () => {
        const result = await inPod([
          ...via,
          '-n',
          WRITABLE,
          'create',
          'configmap',
          `refused-through-${replica.name}`,
          '--from-literal=a=b',
        ]);
        if (!result.stderr.includes('policy for Sealion refuses'))
          throw new Error(result.stderr || result.stdout);
        return result;
      }, 60_000);
      expect(refused.code).not.toBe(0);
      expect(refused.stderr).toContain(
        `cluster ${EDGE}'s policy for Sealion refuses this request: Sealion may not create configmaps there`,
      );
      // Reads are still granted.
      expect(await inPod([...via, '-n', WRITABLE, 'get', 'configmaps', '-o', 'name'])).toMatchObject({
        code: 0,
      });
    }
  }, 240_000);

  it("is refused on the hub's own API, and everywhere once edge's Cluster no longer takes workloads", async () => {
    // The same kubeconfig and token, at the proxy's own cluster (no /clusters/ prefix).
    const onHub = await inPod([
      `--server=https://${PROXY_SERVICE_NAME}`,
      'get',
      '--raw',
      '/api/v1/namespaces',
    ]);
    expect(onHub.code).not.toBe(0);
    expect(onHub.stderr).toContain(
      "Error from server (Forbidden): a token for Sealion's workload audience reaches other clusters only",
    );
    await kubectlOk(hub, [
      'patch',
      'cluster',
      EDGE,
      '--type=json',
      '-p',
      JSON.stringify([{ op: 'remove', path: '/spec/workloads' }]),
    ]);
    const closed = await eventually(async () => {
      const result = await inPod(['get', '--raw', '/api/v1/namespaces/demo/configmaps']);
      if (!result.stderr.includes('takes no workloads')) throw new Error(result.stderr || result.stdout);
      return result;
    }, 60_000);
    expect(closed.stderr).toContain(
      `Error from server (Forbidden): cluster ${EDGE} takes no workloads from the hub: its Cluster has no spec.workloads.usernamePrefix`,
    );
  }, 120_000);
});
