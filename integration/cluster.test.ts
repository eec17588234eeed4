// The harness itself: the API servers are real (real RBAC, real kubectl), independent, and leave nothing behind.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import { apiStatusCode, newKubeClients, type KubeClients } from '../lib/kube/kube.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { pinnedVersions } from '../dev/build.ts';
import { eventually } from '../dev/eventually.ts';
import { processesUsing } from '../dev/processes.ts';

const CRD = {
  apiVersion: 'apiextensions.k8s.io/v1',
  kind: 'CustomResourceDefinition',
  metadata: { name: 'widgets.example.sealion.dev' },
  spec: {
    group: 'example.sealion.dev',
    scope: 'Namespaced',
    names: { plural: 'widgets', singular: 'widget', kind: 'Widget' },
    versions: [
      {
        name: 'v1',
        served: true,
        storage: true,
        schema: {
          openAPIV3Schema: {
            type: 'object',
            properties: { spec: { type: 'object', properties: { size: { type: 'integer' } } } },
          },
        },
      },
    ],
  },
};

describe('a real cluster', () => {
  let hub: Cluster;
  let other: Cluster;
  let admin: KubeClients;

  beforeAll(async () => {
    hub = await startCluster({ name: 'hub' });
    other = await startCluster({ name: 'other', controllerManager: false });
    admin = newKubeClients({ path: hub.kubeconfigPath });
  }, 180_000);

  afterAll(async () => {
    await Promise.all([hub?.stop(), other?.stop()]);
  });

  it('runs the pinned Kubernetes release', async () => {
    const result = await hub.kubectl(['version', '-o', 'json']);
    expect(result.code).toBe(0);
    const version = JSON.parse(result.stdout) as { serverVersion: { gitVersion: string } };
    expect(version.serverVersion.gitVersion).toBe(pinnedVersions().kubernetes);
  });

  it('creates a namespace and a CRD, and RBAC forbids a user without rights until a binding allows it', async () => {
    await admin.core.createNamespace({ body: { metadata: { name: 'rbac-check' } } });
    await admin.apiextensions.createCustomResourceDefinition({ body: CRD });
    await eventually(async () => {
      const crd = await admin.apiextensions.readCustomResourceDefinition({ name: CRD.metadata.name });
      expect(crd.status?.conditions?.find((c) => c.type === 'Established')?.status).toBe('True');
    });
    const created = await hub.kubectl(['apply', '-n', 'rbac-check', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'example.sealion.dev/v1',
        kind: 'Widget',
        metadata: { name: 'w1' },
        spec: { size: 3 },
      }),
    });
    expect(created).toMatchObject({ code: 0 });
    expect(created.stdout).toContain('widget.example.sealion.dev/w1 created');

    const aliceConfig = await hub.userKubeconfig('alice', ['developers']);
    const alice = newKubeClients({ path: aliceConfig });
    const denied = await alice.core.listNamespace().then(
      () => undefined,
      (err: unknown) => err,
    );
    expect(apiStatusCode(denied)).toBe(403);

    // The real kubectl shows the server's own Forbidden message.
    const kubectlDenied = await hub.kubectl(['get', 'widgets', '-n', 'rbac-check'], {
      kubeconfig: aliceConfig,
    });
    expect(kubectlDenied.code).not.toBe(0);
    expect(kubectlDenied.stderr).toContain(
      'User "alice" cannot list resource "widgets" in API group "example.sealion.dev"',
    );

    // A binding to alice's group (from her certificate's O=) lets her read.
    await hub.kubectl([
      'create',
      'clusterrole',
      'widget-reader',
      '--verb=get,list',
      '--resource=widgets.example.sealion.dev',
    ]);
    await hub.kubectl([
      'create',
      'rolebinding',
      'devs-read',
      '-n',
      'rbac-check',
      '--clusterrole=widget-reader',
      '--group=developers',
    ]);
    const allowed = await eventually(async () => {
      const r = await hub.kubectl(['get', 'widgets', '-n', 'rbac-check', '-o', 'name'], {
        kubeconfig: aliceConfig,
      });
      expect(r.code).toBe(0);
      return r;
    });
    expect(allowed.stdout.trim()).toBe('widget.example.sealion.dev/w1');
  });

  it('keeps two clusters apart', async () => {
    expect(other.url).not.toBe(hub.url);
    await admin.core.createNamespace({ body: { metadata: { name: 'only-on-hub' } } });
    const onOther = await other.kubectl(['get', 'namespace', 'only-on-hub']);
    expect(onOther.code).not.toBe(0);
    expect(onOther.stderr).toContain('namespaces "only-on-hub" not found');
    // Each cluster trusts only its own CA: a system:masters certificate from the hub's CA is a stranger here.
    type Kubeconfig = { clusters: [{ cluster: unknown }] };
    const read = (path: string): Kubeconfig => parse(readFileSync(path, 'utf8')) as Kubeconfig;
    const hubIssued = read(await hub.userKubeconfig('hub-admin', ['system:masters']));
    hubIssued.clusters[0].cluster = read(other.kubeconfigPath).clusters[0].cluster;
    const strangerConfig = join(hub.dir, 'stranger.kubeconfig');
    writeFileSync(strangerConfig, stringify(hubIssued));
    const stranger = await other.kubectl(['get', 'ns'], { kubeconfig: strangerConfig });
    expect(stranger.code).not.toBe(0);
    expect(stranger.stderr).toContain('Unauthorized');
  });

  it('runs kube-controller-manager, so deleted namespaces really go away', async () => {
    await admin.core.createNamespace({ body: { metadata: { name: 'short-lived' } } });
    await admin.core.deleteNamespace({ name: 'short-lived' });
    await eventually(async () => {
      const err = await admin.core.readNamespace({ name: 'short-lived' }).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(apiStatusCode(err)).toBe(404);
    }, 60_000);
  });
});

describe('stopping a cluster', () => {
  it('leaves no process and no folder behind', async () => {
    const cluster = await startCluster({ name: 'stopper', controllerManager: false });
    expect(processesUsing(cluster.dir).length).toBeGreaterThan(0);
    await cluster.stop();
    expect(processesUsing(cluster.dir)).toEqual([]);
    expect(existsSync(cluster.dir)).toBe(false);
  }, 120_000);
});
