// The AccessRequest write path against a real hub API server, with the concierge holding only the install's RBAC:
// kubectl create -f through the proxy makes a request as the caller (whatever requester it wrote), the hub's RBAC
// decides who may approve (the shipped reviewer ClusterRole, bound here), a requester never approves their own, and
// everything but Sealion's own verbs goes to the API server as the user.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { accessReviewerRole, DEFAULT_NAMESPACE } from '../apis/install.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { issueCert } from '../lib/pki/pki.ts';

const ACCESS = 'access.concierge.sealion.dev';
const PREFIX = `/apis/${ACCESS}/v1alpha1`;

describe('access requests written by Sealion on a real hub', () => {
  let hub: Cluster;
  let proxy: LocalConcierge;
  let dir: string;
  const certs = new Map<string, { certPem: string; keyPem: string }>();

  const user = async (name: string): Promise<{ certPem: string; keyPem: string }> => {
    let cert = certs.get(name);
    if (!cert) {
      cert = await issueCert(proxy.signerCA, { commonName: name, organizations: ['staff'], usage: 'client' });
      certs.set(name, cert);
    }
    return cert;
  };

  /** One HTTPS request to the proxy as `name`: status and parsed body. */
  const call = async (
    name: string,
    method: string,
    path: string,
    body?: unknown,
  ): Promise<{ status: number; body: Record<string, unknown> }> => {
    const cert = await user(name);
    return new Promise((done, fail) => {
      const req = request(
        new URL(path, proxy.url),
        {
          method,
          ca: proxy.servingCA.certPem,
          cert: cert.certPem,
          key: cert.keyPem,
          headers: body === undefined ? {} : { 'content-type': 'application/json' },
        },
        (res) => {
          let text = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (text += c));
          res.on('end', () =>
            done({ status: res.statusCode ?? 0, body: JSON.parse(text) as Record<string, unknown> }),
          );
        },
      );
      req.on('error', fail);
      req.end(body === undefined ? undefined : JSON.stringify(body));
    });
  };

  const kubeconfigOf = async (name: string): Promise<string> => {
    const path = join(dir, `${name}.kubeconfig`);
    writeFileSync(path, proxy.kubeconfig(await user(name)), { mode: 0o600 });
    return path;
  };

  const decide = (name: string, request: string, decision: string) =>
    call(name, 'POST', `${PREFIX}/accessrequests/${request}/approval`, {
      apiVersion: `${ACCESS}/v1alpha1`,
      kind: 'AccessRequestDecision',
      decision,
      reason: 'looked at the incident',
    });

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-access-requests-'));
    hub = await startCluster({ name: 'access-hub', controllerManager: false });
    // The tunnel parts keep the Clusters' informer, whose policies the requests are checked against.
    proxy = await startLocalConcierge(hub, { tunnel: { port: 0, namespace: DEFAULT_NAMESPACE } });
    const applied = await hub.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'v1',
        kind: 'List',
        items: [
          {
            apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
            kind: 'Cluster',
            metadata: { name: 'edge' },
            spec: { access: { groups: ['edge-admins'], maxDurationSeconds: 1800, requireReason: true } },
          },
          // Bob and Alice may review; the install ships the role unbound.
          {
            apiVersion: 'rbac.authorization.k8s.io/v1',
            kind: 'ClusterRoleBinding',
            metadata: { name: 'access-reviewers' },
            roleRef: {
              apiGroup: 'rbac.authorization.k8s.io',
              kind: 'ClusterRole',
              name: accessReviewerRole(DEFAULT_NAMESPACE),
            },
            subjects: ['bob', 'alice'].map((name) => ({
              apiGroup: 'rbac.authorization.k8s.io',
              kind: 'User',
              name,
            })),
          },
        ],
      }),
    });
    expect(applied.stderr).toBe('');
    // The shipped role exists (prepareConcierge applied the install's RBAC).
    const role = await hub.kubectl([
      'get',
      'clusterrole',
      accessReviewerRole(DEFAULT_NAMESPACE),
      '-o',
      'name',
    ]);
    expect(role.stdout.trim()).toBe(
      `clusterrole.rbac.authorization.k8s.io/${accessReviewerRole(DEFAULT_NAMESPACE)}`,
    );
  }, 300_000);

  afterAll(async () => {
    await proxy?.stop();
    await hub?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('creates with kubectl create -f as the caller, not the requester the file names, and lists it as theirs', async () => {
    const file = join(dir, 'request.json');
    writeFileSync(
      file,
      JSON.stringify({
        apiVersion: `${ACCESS}/v1alpha1`,
        kind: 'AccessRequest',
        metadata: { name: 'carol-edge' },
        spec: {
          clusters: ['edge'],
          groups: ['edge-admins'],
          durationSeconds: 900,
          reason: 'INC-42',
          requester: { username: 'mallory' },
        },
      }),
    );
    // The edge policy is read from the informer: wait for the Cluster to reach it.
    await eventually(async () => {
      const created = await hub.kubectl(['create', '-f', file], { kubeconfig: await kubeconfigOf('carol') });
      expect(created.stderr).toBe('');
      expect(created.stdout.trim()).toBe(`accessrequest.${ACCESS}/carol-edge created`);
    }, 30_000);
    const stored = await hub.kubectl(['get', `accessrequests.${ACCESS}`, 'carol-edge', '-o', 'json']);
    const object = JSON.parse(stored.stdout) as {
      spec: { requester: { username: string } };
      status: { phase: string; requester: string };
    };
    expect(object.spec.requester.username).toBe('carol');
    expect([object.status.phase, object.status.requester]).toEqual(['Pending', 'carol']);
    await eventually(async () => {
      const own = await call('carol', 'GET', `${PREFIX}/selfaccessrequests`);
      expect((own.body['items'] as { metadata: { name: string } }[]).map((r) => r.metadata.name)).toEqual([
        'carol-edge',
      ]);
    });
    // Reading them is the hub's RBAC's: carol holds none.
    const list = await call('carol', 'GET', `${PREFIX}/accessrequests`);
    expect(list.status).toBe(403);
  });

  it('refuses what the policy does not allow before anything is written', async () => {
    const ask = (spec: object) =>
      call('carol', 'POST', `${PREFIX}/accessrequests`, {
        spec: {
          clusters: ['edge'],
          groups: ['edge-admins'],
          durationSeconds: 600,
          reason: 'INC-42',
          ...spec,
        },
      });
    expect((await ask({ groups: ['system:masters'] })).status).toBe(403);
    expect((await ask({ durationSeconds: 3600 })).status).toBe(403);
    expect((await ask({ reason: 'INC-42\u001b[2J' })).status).toBe(422);
    expect((await ask({ reason: undefined })).status).toBe(422);
    const all = await hub.kubectl(['get', `accessrequests.${ACCESS}`, '-o', 'name']);
    expect(all.stdout.trim().split('\n')).toEqual([`accessrequest.${ACCESS}/carol-edge`]);
  });

  it('lets a reviewer the hub allows approve, never the requester, and not someone without the role', async () => {
    await eventually(async () => {
      const made = await call('alice', 'POST', `${PREFIX}/accessrequests`, {
        metadata: { name: 'alice-edge' },
        spec: { clusters: ['edge'], groups: ['edge-admins'], durationSeconds: 600, reason: 'INC-43' },
      });
      expect(made.status).toBe(201);
    });
    const own = await decide('alice', 'alice-edge', 'Approved');
    expect([own.status, own.body['message']]).toEqual([403, 'you cannot approve your own request']);
    const stranger = await decide('dave', 'alice-edge', 'Approved');
    expect(stranger.status).toBe(403);
    expect(stranger.body['message']).toContain('cannot approve');
    const approved = await decide('bob', 'alice-edge', 'Approved');
    expect(approved.status).toBe(200);
    const status = (approved.body['status'] ?? {}) as {
      phase?: string;
      reviews?: { user: string }[];
      clusterUIDs?: Record<string, string>;
    };
    expect([status.phase, status.reviews?.map((r) => r.user)]).toEqual(['Approved', ['bob']]);
    // The Cluster approved, by uid: the grant applies to no other made under its name.
    expect(Object.keys(status.clusterUIDs ?? {})).toEqual(['edge']);
    expect(status.clusterUIDs?.['edge']).toMatch(/^[0-9a-f-]{36}$/);
    // Approved: no more approvals (a denial now would revoke it).
    expect((await decide('bob', 'alice-edge', 'Approved')).status).toBe(409);
    // The requester withdraws it.
    const withdrawn = await call('alice', 'POST', `${PREFIX}/accessrequests/alice-edge/withdrawal`, {
      decision: 'Withdrawn',
    });
    expect(withdrawn.status).toBe(200);
    const phase = await hub.kubectl([
      'get',
      `accessrequests.${ACCESS}`,
      'alice-edge',
      '-o',
      'jsonpath={.status.phase}',
    ]);
    expect(phase.stdout).toBe('Withdrawn');
  });

  it('leaves status writes to Sealion: a user with the reviewer role cannot write a phase', async () => {
    const patched = await hub.kubectl(
      [
        'patch',
        `accessrequests.${ACCESS}`,
        'carol-edge',
        '--subresource=status',
        '--type=merge',
        '-p',
        '{"status":{"phase":"Approved"}}',
      ],
      { kubeconfig: await kubeconfigOf('bob') },
    );
    expect(patched.stderr).toContain('Forbidden');
  });
});
