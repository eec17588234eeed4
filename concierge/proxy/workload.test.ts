// Hub workloads on other clusters: the mapping of a hub service account to its prefixed identity, and the decider's
// refusals and plan for it, against a cluster whose reviews are answered in memory.
import { describe, expect, it } from '@jest/globals';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { eventually } from '../../dev/eventually.ts';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import { newAuditor } from '../audit/audit.ts';
import type { AuditBackend } from '../audit/backend.ts';
import { loadPolicy } from '../audit/policy.ts';
import type { AuditEvent } from '../audit/types.ts';
import { newClientCertSigner } from './credentials.ts';
import { newProxyHandler } from './handler.ts';
import { newProxyMetrics } from './metrics.ts';
import type { ForwardPlan } from './transport.ts';
import { apiGroups } from '../../apis/groups.ts';
import { usernamePrefixProblem, workloadAudience, type ClusterSpec } from '../../apis/tunnel.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { Request } from '../../lib/http2/request.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { newLogger } from '../../lib/log.ts';
import type { Identity } from './authenticate.ts';
import { newDecider, type Target } from './decide.ts';
import { asPlain, newRequestContext, type Refusal } from './exchange.ts';
import type { OwnCall, Route } from './route.ts';
import { mappedWorkload, WORKLOAD_ON_HUB } from './workload.ts';

const MAPPED = 'hub:system:serviceaccount:argocd:argocd-application-controller';

const ORIGINAL = 'impersonation-proxy.concierge.sealion.dev/original-user-info';

/** A hub service account as the API server's TokenReview describes it, pod-bound token and all. */
const HUB_SA: UserInfo = {
  username: 'system:serviceaccount:argocd:argocd-application-controller',
  uid: '7d2c3f1e-0000-4000-8000-000000000001',
  groups: ['system:serviceaccounts', 'system:serviceaccounts:argocd', 'system:authenticated'],
  extra: {
    'authentication.kubernetes.io/pod-name': ['argocd-application-controller-0'],
    'authentication.kubernetes.io/pod-uid': ['9b1f0000-0000-4000-8000-000000000002'],
  },
};
const workload: Identity = { kind: 'workload', user: HUB_SA };

/** A cluster reached through a route whose reviews are answered here: `allowed(question)` for both kinds. */
function clusterRoute(allowed: (review: { kind: string; spec: Record<string, unknown> }) => boolean) {
  const calls: OwnCall[] = [];
  const route: Route = {
    kind: 'tunnel',
    forward: () => Promise.resolve(),
    call(request) {
      calls.push(request);
      const review = JSON.parse(request.body.toString('utf8')) as {
        kind: string;
        spec: Record<string, unknown>;
      };
      return Promise.resolve({
        status: 201,
        body: Buffer.from(JSON.stringify({ ...review, status: { allowed: allowed(review) } })),
      });
    },
  };
  return { route, calls };
}

const reviewer: Reviewer = {
  tokenReview: () => Promise.resolve({ authenticated: false }),
  allowed: () => Promise.resolve(false),
};

function decider(specs: Record<string, ClusterSpec>, route: Route) {
  return newDecider({
    groups: apiGroups(),
    reviewer,
    router: { route: (name) => (name === '' || name in specs ? route : undefined) },
    clusterSpec: (name) => specs[name],
    log: newLogger({ level: 'silent' }),
  });
}

const request = (headers: Record<string, string> = {}): Request => {
  const rawHeaders = Object.entries(headers).flat();
  return { method: 'GET', url: '/api/v1/namespaces', headers, rawHeaders } as unknown as Request;
};

describe('the mapped identity', () => {
  it('puts the prefix before the username and each group, drops system:authenticated, and keeps the account in the extra', () => {
    const mapped = mappedWorkload(HUB_SA, 'hub:', ORIGINAL);
    expect(mapped).toEqual({
      username: 'hub:system:serviceaccount:argocd:argocd-application-controller',
      groups: ['hub:system:serviceaccounts', 'hub:system:serviceaccounts:argocd'],
      extra: { [ORIGINAL]: [expect.any(String)] },
    });
    // The account and the pod it runs in, for the cluster's audit log; none of the hub's extras as the cluster's.
    expect(JSON.parse(mapped.extra[ORIGINAL]![0]!)).toEqual(HUB_SA);
    expect(mapped.uid).toBeUndefined();
  });

  it.each([
    ['hub:', undefined],
    ['fleet.example.com:', undefined],
    ['', 'must be 1 to 64 characters'],
    [`${'x'.repeat(64)}:`, 'must be 1 to 64 characters'],
    ['hub', "must end with ':'"],
    ['system:', "must not start with 'system:'"],
    ['system:hub:', "must not start with 'system:'"],
    // Counted in characters, as the CRD's maxLength is: 64 of them, though 127 UTF-16 units.
    [`${'\u{1D525}'.repeat(63)}:`, undefined],
    [`${'\u{1D525}'.repeat(64)}:`, 'must be 1 to 64 characters'],
    [42, 'must be a string'],
  ])('a usernamePrefix %j: %s', (prefix, problem) => {
    expect(usernamePrefixProblem(prefix)).toBe(problem);
  });

  it('names the audience after the group suffix', () => {
    expect(workloadAudience('sealion.dev')).toBe('workloads.concierge.sealion.dev');
    expect(workloadAudience('pinniped.dev')).toBe('workloads.concierge.pinniped.dev');
  });
});

describe('the decider, for a workload', () => {
  const everything = clusterRoute(() => true);

  it.each<[string, string, Record<string, ClusterSpec>, Identity, string]>([
    [
      'on the hub’s own API',
      '',
      { edge: { workloads: { usernamePrefix: 'hub:' } } },
      workload,
      WORKLOAD_ON_HUB,
    ],
    [
      'on a cluster without spec.workloads',
      'edge',
      { edge: {} },
      workload,
      'cluster edge takes no workloads from the hub: its Cluster has no spec.workloads.usernamePrefix',
    ],
    [
      'on a cluster no Cluster names',
      'elsewhere',
      { edge: {} },
      workload,
      'cluster elsewhere takes no workloads from the hub',
    ],
    [
      'on a cluster whose prefix got past the CRD (system:)',
      'edge',
      { edge: { workloads: { usernamePrefix: 'system:' } } },
      workload,
      "its Cluster's spec.workloads.usernamePrefix is invalid (must not start with 'system:')",
    ],
    [
      'on a cluster whose prefix got past the CRD (no colon)',
      'edge',
      { edge: { workloads: { usernamePrefix: 'hub' } } },
      workload,
      "is invalid (must end with ':')",
    ],
    [
      'a hub API server token (not a workload’s) on a cluster',
      'edge',
      { edge: { workloads: { usernamePrefix: 'hub:' } } },
      { kind: 'serviceaccount', user: HUB_SA, token: 'x' },
      "a token of the hub's API server cannot be used for cluster edge; use a projected service-account token with audience workloads.concierge.sealion.dev (sealion cluster kubeconfig edge --service-account argocd/argocd-application-controller)",
    ],
  ])('refuses it %s with 403', (_name, cluster, specs, identity, says) => {
    const target = decider(specs, everything.route).target(cluster, identity as never);
    expect(target).toMatchObject({ status: 403 });
    expect((target as Refusal).message).toContain(says);
  });

  it('forwards it as the mapped user, decided by the cluster’s policy for users, its fair share the hub account’s', async () => {
    const edge = clusterRoute(() => true);
    const d = decider({ edge: { workloads: { usernamePrefix: 'hub:' } } }, edge.route);
    const target = d.target('edge', workload) as Target;
    expect(target.actingAs?.username).toBe('hub:system:serviceaccount:argocd:argocd-application-controller');
    const context = newRequestContext();
    const plan = await d.plan(request({ authorization: 'Bearer secret' }), workload, false, target, context);
    if ('status' in plan) throw new Error(plan.message);
    expect(plan.user).toBe(HUB_SA.username);
    expect(plan.passthrough).toBe(false);
    expect(plan.headers['authorization']).toBeUndefined();
    expect(plan.headers['impersonate-user']).toBe(
      'hub:system:serviceaccount:argocd:argocd-application-controller',
    );
    // As for every user, system:authenticated is the cluster's own group (not hub:system:authenticated).
    expect(plan.headers['impersonate-group']).toEqual([
      'hub:system:serviceaccounts',
      'hub:system:serviceaccounts:argocd',
      'system:authenticated',
    ]);
    expect(plan.headers['impersonate-uid']).toBeUndefined();
    const extras = Object.keys(plan.headers).filter((h) => h.startsWith('impersonate-extra-'));
    expect(extras).toHaveLength(1);
    expect(JSON.parse(String(plan.headers[extras[0]!]))).toEqual(HUB_SA);
    expect(context.decision).toBe('user-info');
    expect(context.impersonated?.username).toBe(
      'hub:system:serviceaccount:argocd:argocd-application-controller',
    );
    // The cluster was asked about impersonating users (user-info), in the hub account's share.
    const asked = edge.calls.map(
      (c) => JSON.parse(c.body.toString('utf8')) as { spec: { resourceAttributes?: { verb: string } } },
    );
    expect(asked[0]!.spec.resourceAttributes?.verb).toBe('impersonate-on:user-info:list');
    expect(edge.calls.every((c) => c.user === HUB_SA.username)).toBe(true);
  });

  it('refuses it where the cluster’s policy does not let Sealion act for users', async () => {
    const edge = clusterRoute(() => false);
    const d = decider({ edge: { workloads: { usernamePrefix: 'hub:' } } }, edge.route);
    const target = d.target('edge', workload) as Target;
    const plan = await d.plan(request(), workload, false, target, newRequestContext());
    expect(plan).toMatchObject({ status: 403 });
    expect((plan as Refusal).message).toContain("cluster edge's policy for Sealion refuses this request");
  });

  it('asks the cluster about the mapped user when it impersonates someone, and records it as the original user', async () => {
    const asked: Record<string, unknown>[] = [];
    const edge = clusterRoute((review) => {
      if (review.kind === 'SubjectAccessReview') asked.push(review.spec);
      return true;
    });
    const d = decider({ edge: { workloads: { usernamePrefix: 'hub:' } } }, edge.route);
    const target = d.target('edge', workload) as Target;
    const plan = await d.plan(
      request({ 'impersonate-user': 'someone' }),
      workload,
      false,
      target,
      newRequestContext(),
    );
    if ('status' in plan) throw new Error(plan.message);
    expect(plan.headers['impersonate-user']).toBe('someone');
    // The one who really asked is the hub account (and its pod), as the hub authenticated it, not its mapping.
    const extras = Object.keys(plan.headers).filter((h) => h.startsWith('impersonate-extra-'));
    expect(extras).toHaveLength(1);
    expect(JSON.parse(String(plan.headers[extras[0]!]))).toEqual(HUB_SA);
    // Asked without that extra, which names the token's pod and credential: one question per mapped identity.
    expect(asked.every((spec) => Object.keys(spec['extra'] ?? {}).length === 0)).toBe(true);
    expect(asked.length).toBeGreaterThan(0);
    expect(
      asked.every(
        (spec) => spec['user'] === 'hub:system:serviceaccount:argocd:argocd-application-controller',
      ),
    ).toBe(true);
    expect(
      asked.every(
        (spec) =>
          !(spec['groups'] as string[]).some((g) => !g.startsWith('hub:') && g !== 'system:authenticated'),
      ),
    ).toBe(true);
  });
});

describe('the handler, for a workload', () => {
  const POLICY = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
  - level: Metadata
`;

  /** The proxy's pipeline on a plain HTTP listener, every caller the hub workload, `edge` a cluster answering 200. */
  async function pipeline() {
    const events: AuditEvent[] = [];
    const backend: AuditBackend = {
      mode: 'batch',
      emit(event) {
        events.push(event);
        return Promise.resolve();
      },
      close: () => Promise.resolve(),
    };
    const forwarded: ForwardPlan[] = [];
    const edge = clusterRoute(() => true);
    edge.route.forward = (exchange, plan) => {
      forwarded.push(plan);
      const plain = asPlain(exchange)!;
      plain.res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
      return Promise.resolve();
    };
    const cache = new AuthenticatorCache();
    const handler = newProxyHandler({
      groups: apiGroups(),
      authenticator: { authenticate: () => Promise.resolve(workload) },
      cache,
      reviewer,
      router: { route: (name) => (name === 'edge' ? edge.route : undefined) },
      clusterSpec: (name) => (name === 'edge' ? { workloads: { usernamePrefix: 'hub:' } } : undefined),
      signer: newClientCertSigner(() => undefined),
      metrics: newProxyMetrics(),
      log: newLogger({ level: 'silent' }),
      ready: () => true,
      serving: () => true,
      auditor: newAuditor({ policy: loadPolicy(POLICY), backend, replica: 'r1' }),
    });
    const server = createServer(handler.request);
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    const port = (server.address() as AddressInfo).port;
    const send = (path: string, body?: string) =>
      new Promise<{ status: number; body: string }>((done, fail) => {
        const req = httpRequest(
          {
            host: '127.0.0.1',
            port,
            path,
            method: body === undefined ? 'GET' : 'POST',
            agent: false,
            headers: body === undefined ? {} : { 'content-type': 'application/json' },
          },
          (res) => {
            let text = '';
            res.on('data', (c: Buffer) => (text += c.toString()));
            res.on('end', () => done({ status: res.statusCode ?? 0, body: text }));
          },
        );
        req.on('error', fail);
        req.end(body);
      });
    const close = async () => {
      cache.close();
      await new Promise((done) => server.close(done));
    };
    return { events, forwarded, send, close };
  }

  it('audits the hub account as the user, the mapped identity as the impersonated user, and says it was a workload', async () => {
    const proxy = await pipeline();
    try {
      expect((await proxy.send('/clusters/edge/api/v1/namespaces')).status).toBe(200);
      await eventually(() => expect(proxy.events.length).toBeGreaterThan(0));
      const event = proxy.events.at(-1)!;
      expect(event.user.username).toBe(HUB_SA.username);
      expect(event.impersonatedUser?.username).toBe(
        'hub:system:serviceaccount:argocd:argocd-application-controller',
      );
      expect(event.annotations?.['sealion.dev/authenticator']).toBe('workload');
      expect(event.annotations?.['sealion.dev/cluster']).toBe('edge');
      expect(proxy.forwarded[0]!.user).toBe(HUB_SA.username);
    } finally {
      await proxy.close();
    }
  });

  it('answers WhoAmI on a cluster with the mapped identity, and refuses it on the hub', async () => {
    const proxy = await pipeline();
    try {
      const whoami = '/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests';
      const body = JSON.stringify({
        apiVersion: 'identity.concierge.sealion.dev/v1alpha1',
        kind: 'WhoAmIRequest',
      });
      const onEdge = await proxy.send(`/clusters/edge${whoami}`, body);
      const onHub = await proxy.send(whoami, body);
      expect(onHub.status).toBe(403);
      expect(onHub.body).toContain("a token for Sealion's workload audience reaches other clusters only");
      expect(onEdge.status).toBe(201);
      const { status } = JSON.parse(onEdge.body) as {
        status: { kubernetesUserInfo: { user: { username: string; groups: string[] } } };
      };
      expect(status.kubernetesUserInfo.user).toMatchObject({
        username: 'hub:system:serviceaccount:argocd:argocd-application-controller',
        groups: ['hub:system:serviceaccounts', 'hub:system:serviceaccounts:argocd', 'system:authenticated'],
      });
      expect(proxy.forwarded).toHaveLength(0);
    } finally {
      await proxy.close();
    }
  });
});

describe('the reserved prefix', () => {
  const OPTED_IN = { edge: { workloads: { usernamePrefix: 'hub:' } }, other: {} };
  const user = (username: string, groups: string[] = []): Identity => ({
    kind: 'user',
    user: { username, groups, extra: {} },
    via: 'jwt',
  });

  it.each([
    [
      'a user named under it',
      user('hub:system:serviceaccount:gitops:deployer'),
      'cluster edge: the username "hub:system:serviceaccount:gitops:deployer" cannot be sent: the prefix "hub:" is reserved for hub workloads on that cluster',
    ],
    [
      'a user in a group under it',
      user('mallory', ['devs', 'hub:system:serviceaccounts:gitops']),
      'cluster edge: the group "hub:system:serviceaccounts:gitops" cannot be sent: the prefix "hub:" is reserved for hub workloads on that cluster',
    ],
  ])('refuses %s with 403 on a cluster with that prefix', (_name, identity, says) => {
    const target = decider(OPTED_IN, clusterRoute(() => true).route).target('edge', identity as never);
    expect(target).toMatchObject({ status: 403 });
    expect((target as Refusal).message).toBe(
      `${says} (its Cluster's spec.workloads.usernamePrefix); the hub's admin gives the user names outside it, or the Cluster another prefix`,
    );
  });

  it('lets such a user reach the hub and a cluster that takes no workloads, and others reach the cluster', () => {
    const d = decider(OPTED_IN, clusterRoute(() => true).route);
    const named = user('hub:alice', ['hub:team']);
    expect(d.target('', named as never)).not.toHaveProperty('status');
    expect(d.target('other', named as never)).not.toHaveProperty('status');
    expect(d.target('edge', user('alice', ['team']) as never)).toMatchObject({ reservedPrefix: 'hub:' });
  });

  it.each<[string, Identity, Record<string, string>, string]>([
    [
      'a user impersonating a workload’s mapped name',
      user('alice'),
      { 'impersonate-user': MAPPED },
      `cluster edge: cannot impersonate the username "${MAPPED}"`,
    ],
    [
      'a user impersonating a mapped group',
      user('alice'),
      { 'impersonate-user': 'bob', 'impersonate-group': 'hub:system:serviceaccounts:argocd' },
      'cluster edge: cannot impersonate the group "hub:system:serviceaccounts:argocd"',
    ],
    [
      'a workload impersonating another workload’s mapped name',
      workload,
      { 'impersonate-user': 'hub:system:serviceaccount:kube-system:other' },
      'cluster edge: cannot impersonate the username "hub:system:serviceaccount:kube-system:other"',
    ],
  ])('refuses %s with 403, however the cluster answers', async (_name, identity, headers, says) => {
    const edge = clusterRoute(() => true);
    const d = decider(OPTED_IN, edge.route);
    const target = d.target('edge', identity as never) as Target;
    const plan = await d.plan(request(headers), identity as never, false, target, newRequestContext());
    expect(plan).toMatchObject({ status: 403 });
    expect((plan as Refusal).message).toBe(
      `${says}: the prefix "hub:" is reserved for hub workloads on that cluster (its Cluster's spec.workloads.usernamePrefix); a hub workload reaches it with its own token for Sealion's workload audience`,
    );
  });
});
