// The kubelet's streaming commands on a cluster reached only through its agent's tunnel: the agent runs as a pod
// there and dials the hub's concierge pods through a load balancer. Two concierge replicas, as installed: each
// kubectl lands on either, so the commands also cross the peer hop from the replica without the tunnel to the one
// that holds it.
//
// This suite installs with Helm, the README's second Install block (the other suites run the kustomize one), so the
// charts pass every check the kustomize install does; then `helm upgrade` changes a value, and `helm uninstall`
// leaves what the README says it keeps.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ensureHelm, REPO_ROOT } from '../dev/build.ts';
import type { Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { EDGE, startInstalledSealion, stopInstalled, type Running } from '../dev/installed.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { demoTarget, podCommandCases, type PodTarget } from './harness/pod-commands.ts';

const run = promisify(execFile);
const running: Running = {};
let dir: string;
let target: PodTarget;
let hub: Cluster;
let edge: Cluster;
let helmPath: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-pods-tunnel-'));
  helmPath = await ensureHelm();
  const installed = await startInstalledSealion(running, () => {}, { using: 'helm' });
  ({ hub, edge } = installed);
  target = await demoTarget(installed, dir, EDGE);
}, 600_000);

afterAll(async () => {
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

podCommandCases(`${EDGE}'s tunnel`, () => target);

async function helm(cluster: Cluster, args: string[]): Promise<string> {
  const { stdout } = await run(helmPath, ['--kubeconfig', cluster.kubeconfigPath, ...args], {
    cwd: REPO_ROOT,
    maxBuffer: 16 << 20,
  });
  return stdout;
}

async function kubectlJSON<T>(cluster: Cluster, args: string[]): Promise<T> {
  const result = await cluster.kubectl([...args, '-o', 'json']);
  if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  return JSON.parse(result.stdout) as T;
}

type Listed = { items: { kind?: string; metadata: { name: string; deletionTimestamp?: string } }[] };
const names = (list: Listed): string[] =>
  list.items.filter((i) => !i.metadata.deletionTimestamp).map((i) => `${i.kind ?? ''}/${i.metadata.name}`);

describe('the Helm install', () => {
  const ns = DEFAULT_INSTALL.namespace;

  it('helm upgrade: a changed value takes effect (a third replica)', async () => {
    await helm(hub, [
      'upgrade',
      'sealion-concierge',
      'config/charts/sealion-concierge',
      '--namespace',
      ns,
      '--reuse-values',
      '--set',
      'replicas=3',
      '--wait',
      '--timeout',
      '180s',
    ]);
    const deployment = await kubectlJSON<{ status: { readyReplicas?: number } }>(hub, [
      'get',
      'deployment',
      'sealion-concierge',
      '-n',
      ns,
    ]);
    expect(deployment.status.readyReplicas).toBe(3);
    // The upgrade kept the rest: the edge cluster still answers through its tunnel.
    await eventually(async () => {
      const pods = await hub.kubectl(['get', 'pods', '-n', 'demo', '-o', 'name'], {
        kubeconfig: target.kubeconfig,
      });
      if (pods.code !== 0) throw new Error(pods.stderr);
    }, 60_000);
  }, 240_000);

  it('helm uninstall: nothing is left but what the README says is kept', async () => {
    await helm(edge, ['uninstall', 'sealion-agent', '--namespace', 'sealion-agent', '--wait']);
    await helm(hub, ['uninstall', 'sealion-concierge', '--namespace', ns, '--wait']);
    const listNamespaced =
      'deployments,pods,services,serviceaccounts,roles,rolebindings,configmaps,networkpolicies';
    await eventually(async () => {
      const left = names(await kubectlJSON<Listed>(hub, ['get', listNamespaced, '-n', ns]));
      if (
        left.some(
          (n) => !n.startsWith('ConfigMap/kube-root-ca.crt') && !n.startsWith('ServiceAccount/default'),
        )
      )
        throw new Error(`left in ${ns}: ${left.join(', ')}`);
    }, 120_000);
    const sealionLabelled = (cluster: Cluster, kinds: string): Promise<Listed> =>
      kubectlJSON<Listed>(cluster, ['get', kinds, '-A', '-l', 'app.kubernetes.io/part-of=sealion']);
    expect(names(await sealionLabelled(hub, 'clusterroles,clusterrolebindings,roles,rolebindings'))).toEqual(
      [],
    );
    // Kept: the CRDs, and with them the authenticators, the Cluster, the CredentialIssuer and the access requests.
    expect(names(await sealionLabelled(hub, 'customresourcedefinitions')).sort()).toEqual(
      [
        'CustomResourceDefinition/accessrequests.access.concierge.sealion.dev',
        'CustomResourceDefinition/clusters.tunnel.concierge.sealion.dev',
        'CustomResourceDefinition/credentialissuers.config.concierge.sealion.dev',
        'CustomResourceDefinition/jwtauthenticators.authentication.concierge.sealion.dev',
        'CustomResourceDefinition/webhookauthenticators.authentication.concierge.sealion.dev',
      ].sort(),
    );
    expect(
      names(await kubectlJSON<Listed>(hub, ['get', 'jwtauthenticators,clusters,credentialissuers'])),
    ).toEqual(['JWTAuthenticator/my-oidc', 'Cluster/edge', 'CredentialIssuer/sealion-concierge-config']);
    // Kept in the namespace: the Secrets the concierge made (its CAs and what they issued), so that a reinstall
    // serves the CAs that kubeconfigs and agents trust.
    const secrets = names(await kubectlJSON<Listed>(hub, ['get', 'secrets', '-n', ns]));
    expect(secrets).toEqual(
      expect.arrayContaining(['Secret/sealion-tunnel-ca', 'Secret/sealion-impersonation-proxy-ca']),
    );
    for (const secret of secrets) expect(secret).toMatch(/^Secret\/sealion-/);
    // On edge: the agent's key and certificate, so that a reinstall connects again without a new token.
    const edgeLeft = await sealionLabelled(
      edge,
      'clusterroles,clusterrolebindings,deployments,configmaps,secrets',
    );
    expect(names(edgeLeft)).toEqual(['Secret/sealion-agent-credentials']);
  }, 240_000);
});
