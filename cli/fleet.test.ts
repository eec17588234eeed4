import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Command } from 'commander';
import { parse, stringify } from 'yaml';
import { HttpsError } from '../lib/https-client.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import {
  authCommand,
  canITable,
  canIVerdict,
  questionOf,
  questionsOf,
  reviewSpec,
  type CanIAnswer,
} from './can-i.ts';
import { fromAggregated, parseResourceArg, resolveResource, type ApiResource } from './discovery.ts';
import { clustersCommand } from './clusters.ts';
import { askFleet, fanOut, failureState, UnknownResource, type FleetMember } from './fleet.ts';
import { getCommand } from './get-kubeconfig.ts';
import {
  CONTEXT_ANNOTATION,
  cellText,
  fleetTables,
  getOutput,
  mergedList,
  shortAge,
  tableOfItems,
  type ClusterResult,
} from './get.ts';

/** A cluster's aggregated discovery: the core group, apps, and with `widgets` a CRD of example.com. */
function discovery(widgets: boolean): { core: object; groups: object } {
  const resource = (
    resource: string,
    kind: string,
    scope: string,
    extra: { singularResource?: string; shortNames?: string[] } = {},
  ) => ({
    resource,
    responseKind: { kind },
    scope,
    verbs: ['get', 'list', 'watch', 'create', 'delete'],
    singularResource: extra.singularResource ?? kind.toLowerCase(),
    ...(extra.shortNames ? { shortNames: extra.shortNames } : {}),
  });
  const group = (name: string, ...versions: { version: string; resources: object[] }[]) => ({
    metadata: { name },
    versions,
  });
  return {
    core: {
      kind: 'APIGroupDiscoveryList',
      items: [
        group('', {
          version: 'v1',
          resources: [
            resource('pods', 'Pod', 'Namespaced', { shortNames: ['po'] }),
            resource('nodes', 'Node', 'Cluster', { shortNames: ['no'] }),
            resource('events', 'Event', 'Namespaced', { shortNames: ['ev'] }),
          ],
        }),
      ],
    },
    groups: {
      kind: 'APIGroupDiscoveryList',
      items: [
        group('apps', {
          version: 'v1',
          resources: [resource('deployments', 'Deployment', 'Namespaced', { shortNames: ['deploy'] })],
        }),
        group('events.k8s.io', { version: 'v1', resources: [resource('events', 'Event', 'Namespaced')] }),
        ...(widgets
          ? [
              group(
                'example.com',
                {
                  version: 'v2',
                  resources: [resource('widgets', 'Widget', 'Namespaced', { shortNames: ['wd'] })],
                },
                {
                  version: 'v1',
                  resources: [resource('widgets', 'Widget', 'Namespaced', { shortNames: ['wd'] })],
                },
              ),
            ]
          : []),
      ],
    },
  };
}

describe('resolving a resource type in one cluster’s discovery, as kubectl does', () => {
  const all = (widgets: boolean): ApiResource[] => {
    const { core, groups } = discovery(widgets);
    return [...fromAggregated(core), ...fromAggregated(groups)];
  };
  const resolved = (arg: string, widgets = true): string | undefined => {
    const r = resolveResource(arg, all(widgets));
    return r && `${r.resource}.${r.version}.${r.group}`;
  };

  it.each([
    ['pods', 'pods.v1.'],
    ['pod', 'pods.v1.'],
    ['po', 'pods.v1.'],
    ['Pod', 'pods.v1.'],
    ['PODS', 'pods.v1.'],
    ['deploy', 'deployments.v1.apps'],
    ['deployments.apps', 'deployments.v1.apps'],
    ['deployment.apps', 'deployments.v1.apps'],
    ['deployments.v1.apps', 'deployments.v1.apps'],
    // Two groups have events: the core group's comes first, unless the group is named.
    ['events', 'events.v1.'],
    ['events.events.k8s.io', 'events.v1.events.k8s.io'],
    // A CRD's preferred version (the first the server lists) unless one is named.
    ['widgets', 'widgets.v2.example.com'],
    ['wd', 'widgets.v2.example.com'],
    ['widgets.v1.example.com', 'widgets.v1.example.com'],
    ['widgets.example.com', 'widgets.v2.example.com'],
  ])('%s is %s', (arg, want) => {
    expect(resolved(arg)).toBe(want);
  });

  it('finds nothing for a type this cluster does not serve, or in another group', () => {
    expect(resolved('widgets', false)).toBeUndefined();
    expect(resolved('pods.apps')).toBeUndefined();
    expect(resolved('gadgets')).toBeUndefined();
  });

  it('reads a middle part as a version only when it looks like one', () => {
    expect(parseResourceArg('deployments.v1beta1.apps')).toEqual([
      { name: 'deployments', version: 'v1beta1', group: 'apps' },
      { name: 'deployments', group: 'v1beta1.apps' },
    ]);
    expect(parseResourceArg('widgets.example.com')).toEqual([{ name: 'widgets', group: 'example.com' }]);
  });
});

describe('the fan-out', () => {
  it('asks at most the bound at once and keeps the answers in order', async () => {
    let running = 0;
    let most = 0;
    const answers = await fanOut([...Array(20).keys()], 8, async (n) => {
      most = Math.max(most, ++running);
      await new Promise((done) => setImmediate(done));
      running--;
      return n * 2;
    });
    expect(most).toBe(8);
    expect(answers).toEqual([...Array(20).keys()].map((n) => n * 2));
  });

  it('asks 8 clusters at a time, each within its own deadline', async () => {
    let running = 0;
    let most = 0;
    const members = [...Array(20).keys()].map((n) => ({ context: `c${n}` }) as FleetMember);
    const answers = await askFleet(members, 50, async (member, signal) => {
      most = Math.max(most, ++running);
      try {
        if (member.context === 'c3')
          await new Promise((_, fail) => signal.addEventListener('abort', () => fail(new Error('aborted'))));
        await new Promise((done) => setImmediate(done));
        return member.context;
      } finally {
        running--;
      }
    });
    expect(most).toBe(8);
    expect(answers[3]).toMatchObject({
      ok: false,
      failure: { state: 'Unreachable', detail: 'no answer in time' },
    });
    expect(answers.filter((a) => a.ok)).toHaveLength(19);
  });

  it('gives each cluster 20 s unless --cluster-timeout says otherwise', () => {
    const timeout = (command: Command) =>
      command.options.find((o) => o.long === '--cluster-timeout')?.defaultValue as unknown;
    expect(timeout(getCommand())).toBe('20');
    expect(timeout(authCommand().commands[0]!)).toBe('20');
  });

  it('puts each failure in a state and a line', () => {
    const status = (code: number, message: string) =>
      Object.assign(new HttpsError('BadStatus', `HTTP ${code}`, code), {
        body: JSON.stringify({ kind: 'Status', message, code }),
      });
    expect(failureState(status(503, 'cluster edge is not connected'))).toEqual({
      state: 'NotConnected',
      detail: 'cluster edge is not connected',
    });
    expect(failureState(status(403, 'pods is forbidden')).state).toBe('Forbidden');
    expect(failureState(status(401, 'Unauthorized')).state).toBe('Unauthorized');
    expect(failureState(new UnknownResource('widgets'))).toEqual({
      state: 'UnknownResource',
      detail: 'the server doesn\'t have a resource type "widgets"',
    });
    const aborted = AbortSignal.abort();
    expect(failureState(new HttpsError('Network', 'This operation was aborted'), aborted)).toEqual({
      state: 'Unreachable',
      detail: 'no answer in time',
    });
  });
});

const NOW = Date.parse('2026-11-28T12:00:00Z');
const pods: ApiResource = {
  group: '',
  version: 'v1',
  resource: 'pods',
  singular: 'pod',
  shortNames: ['po'],
  kind: 'Pod',
  namespaced: true,
  verbs: ['list'],
};
const widgets: ApiResource = {
  ...pods,
  group: 'example.com',
  version: 'v2',
  resource: 'widgets',
  kind: 'Widget',
};

/** A Table with NAME, READY and AGE (priority 0) and IP (priority 1). */
const podTable = (...rows: [string, string, string, string][]) => ({
  kind: 'Table',
  columnDefinitions: [
    { name: 'Name', type: 'string', priority: 0 },
    { name: 'Ready', type: 'string', priority: 0 },
    { name: 'Age', type: 'date', priority: 0 },
    { name: 'IP', type: 'string', priority: 1 },
  ],
  rows: rows.map(([name, ns, ready, ip]) => ({
    cells: [name, ready, '2026-11-28T11:55:00Z', ip],
    object: { metadata: { name, namespace: ns } },
  })),
});

describe('the table over every cluster', () => {
  const results: ClusterResult[] = [
    {
      context: 'p/hub',
      ok: true,
      answer: { resource: pods, table: podTable(['web', 'shop', '1/1', '10.0.0.5']) },
    },
    {
      context: 'p/edge',
      ok: true,
      answer: {
        resource: pods,
        table: podTable(['db', 'data', '0/1', '10.1.0.7'], ['web', 'shop', '1/1', '10.1.0.8']),
      },
    },
    {
      context: 'p/gone',
      ok: false,
      failure: { state: 'NotConnected', detail: 'cluster gone is not connected' },
    },
  ];

  it('has CLUSTER first, the priority-0 columns, dates as ages', () => {
    expect(fleetTables(results, { wide: false, allNamespaces: false }, NOW)).toBe(
      [
        'CLUSTER   NAME   READY   AGE',
        'p/hub     web    1/1     5m',
        'p/edge    db     0/1     5m',
        'p/edge    web    1/1     5m',
        '',
      ].join('\n'),
    );
  });

  it('adds NAMESPACE with -A and every column with -o wide', () => {
    expect(fleetTables(results, { wide: true, allNamespaces: true }, NOW)).toBe(
      [
        'CLUSTER   NAMESPACE   NAME   READY   AGE   IP',
        'p/hub     shop        web    1/1     5m    10.0.0.5',
        'p/edge    data        db     0/1     5m    10.1.0.7',
        'p/edge    shop        web    1/1     5m    10.1.0.8',
        '',
      ].join('\n'),
    );
  });

  it('gives clusters whose columns differ a table of their own', () => {
    const other: ClusterResult = {
      context: 'p/old',
      ok: true,
      answer: {
        resource: widgets,
        table: {
          columnDefinitions: [{ name: 'Name', type: 'string' }, { name: 'Size' }],
          rows: [{ cells: ['w1', null], object: { metadata: { name: 'w1' } } }],
        },
      },
    };
    expect(fleetTables([results[0]!, other], { wide: false, allNamespaces: false }, NOW)).toBe(
      [
        'CLUSTER   NAME   READY   AGE',
        'p/hub     web    1/1     5m',
        '',
        'CLUSTER   NAME   SIZE',
        'p/old     w1     <none>',
        '',
      ].join('\n'),
    );
  });

  it('prints NAME and AGE for a type whose server has no Table for it, as kubectl', () => {
    const table = tableOfItems([
      { metadata: { name: 'm1', namespace: 'shop', creationTimestamp: '2026-11-28T10:00:00Z' } },
    ]);
    expect(
      fleetTables(
        [{ context: 'p/hub', ok: true, answer: { resource: pods, table } }],
        { wide: false, allNamespaces: true },
        NOW,
      ),
    ).toBe(['CLUSTER   NAMESPACE   NAME   AGE', 'p/hub     shop        m1     120m', ''].join('\n'));
  });

  it('shows server text as text, never as terminal control', () => {
    expect(cellText('a\u001b[2Jb', 'string', NOW)).toBe('a\\u001b[2Jb');
    expect(cellText(3, 'integer', NOW)).toBe('3');
    expect(cellText(true, 'boolean', NOW)).toBe('true');
  });

  it('prints ages as kubectl does', () => {
    expect(
      [5, 150, 600, 3 * 3600 + 60, 20 * 3600, 3 * 86400 + 3600, 40 * 86400].map((s) => shortAge(s * 1000)),
    ).toEqual(['5s', '2m30s', '10m', '3h1m', '20h', '3d1h', '40d']);
  });

  it('lists the clusters that did not answer after the table, and fails naming them', async () => {
    const out = await getOutput(results, { output: 'table', allNamespaces: false }, 'pods', [], NOW);
    expect(out.stdout.split('\n').slice(-3)).toEqual([
      'CLUSTER   STATE          REASON',
      'p/gone    NotConnected   cluster gone is not connected',
      '',
    ]);
    expect(out.failure).toBe(
      'get pods: 1 of 3 clusters did not answer (p/gone: NotConnected); see each reason above; sealion clusters shows which clusters answer you now',
    );
  });

  it('fails for a name no cluster has, and passes when every cluster answered', async () => {
    const answered = results.slice(0, 2);
    expect(
      (await getOutput(answered, { output: 'table', allNamespaces: false }, 'pods', [], NOW)).failure,
    ).toBeUndefined();
    expect(
      (await getOutput(answered, { output: 'table', allNamespaces: false }, 'pods db', ['db'], NOW)).failure,
    ).toBeUndefined();
    expect(
      (await getOutput(answered, { output: 'table', allNamespaces: false }, 'pods x', ['x'], NOW)).failure,
    ).toBe('get pods x: not found on any cluster that answered: x; check the names');
  });
});

describe('-o json|yaml|name over every cluster', () => {
  const results: ClusterResult[] = [
    {
      context: 'p/hub',
      ok: true,
      answer: { resource: pods, items: [{ metadata: { name: 'web', annotations: { a: 'b' } }, spec: {} }] },
    },
    {
      context: 'p/edge',
      ok: true,
      answer: {
        resource: widgets,
        items: [{ apiVersion: 'example.com/v2', kind: 'Widget', metadata: { name: 'w1' } }],
      },
    },
    { context: 'p/gone', ok: false, failure: { state: 'Forbidden', detail: 'widgets is forbidden' } },
  ];

  it('is one v1 List, each item with its apiVersion, kind and the annotation naming its context', () => {
    expect(mergedList(results)).toEqual({
      apiVersion: 'v1',
      kind: 'List',
      metadata: { resourceVersion: '' },
      items: [
        {
          apiVersion: 'v1',
          kind: 'Pod',
          metadata: { name: 'web', annotations: { a: 'b', [CONTEXT_ANNOTATION]: 'p/hub' } },
          spec: {},
        },
        {
          apiVersion: 'example.com/v2',
          kind: 'Widget',
          metadata: { name: 'w1', annotations: { [CONTEXT_ANNOTATION]: 'p/edge' } },
        },
      ],
    });
  });

  it('says each cluster that did not answer on a line of standard error, the data alone on standard output', async () => {
    const json = await getOutput(results, { output: 'json', allNamespaces: false }, 'pods', [], NOW);
    expect((JSON.parse(json.stdout) as { items: unknown[] }).items).toHaveLength(2);
    expect(json.stderr).toBe('p/gone: Forbidden: widgets is forbidden\n');
    expect(json.failure).toContain('1 of 3 clusters did not answer (p/gone: Forbidden)');
    const yaml = await getOutput(results, { output: 'yaml', allNamespaces: false }, 'pods', [], NOW);
    expect(parse(yaml.stdout)).toEqual(mergedList(results));
    const names = await getOutput(results, { output: 'name', allNamespaces: false }, 'pods', [], NOW);
    expect(names.stdout).toBe('p/hub pod/web\np/edge widget.example.com/w1\n');
  });
});

describe('auth can-i: the question as kubectl builds it', () => {
  const resolve = (what: string) =>
    what === 'deploy' ? { group: 'apps', resource: 'deployments' } : undefined;

  it('resolves the type in the cluster, and asks as given (with a warning) where it has none', () => {
    expect(reviewSpec(questionOf('list', 'deploy/web', ''), 'shop', resolve)).toEqual({
      spec: {
        resourceAttributes: {
          namespace: 'shop',
          verb: 'list',
          group: 'apps',
          resource: 'deployments',
          subresource: '',
          name: 'web',
        },
      },
    });
    expect(reviewSpec(questionOf('get', 'gadgets', 'status'), '', resolve)).toEqual({
      spec: {
        resourceAttributes: {
          namespace: '',
          verb: 'get',
          group: '',
          resource: 'gadgets',
          subresource: 'status',
          name: '',
        },
      },
      warning: 'the server doesn\'t have a resource type "gadgets"',
    });
    expect(reviewSpec(questionOf('*', '*', ''), 'x', resolve).spec.resourceAttributes?.resource).toBe('*');
    expect(reviewSpec(questionOf('get', '/healthz', ''), 'x', resolve)).toEqual({
      spec: { nonResourceAttributes: { path: '/healthz', verb: 'get' } },
    });
    expect(() => questionOf('get', '/healthz', 'log')).toThrow('--subresource does not go with a URL');
  });

  const answer = (
    context: string,
    allowed: boolean,
    state = 'Answered',
    reason = '',
    verb = 'get',
  ): CanIAnswer => ({
    context,
    verb,
    state,
    allowed,
    reason,
  });

  it('exits 0 when every cluster said yes, 1 on any no, 1 with a line when one did not answer', () => {
    expect(canIVerdict([answer('a', true), answer('b', true)])).toEqual({});
    expect(canIVerdict([answer('a', true), answer('b', false)])).toEqual({ no: true });
    expect(canIVerdict([answer('a', true), answer('b', false, 'NotConnected', 'no tunnel')])).toEqual({
      failure:
        'auth can-i: 1 of 2 clusters did not answer (b: NotConnected); see each reason above; sealion clusters shows which clusters answer you now',
    });
  });

  it('makes a matrix of several verbs, a column each, and counts a cluster once', () => {
    const answers = [
      answer('p/hub', true, 'Answered', 'r', 'get'),
      answer('p/hub', false, 'Answered', '', 'delete'),
      answer('p/edge', true, 'Answered', 'r', 'get'),
      answer('p/edge', true, 'Answered', 'r', 'delete'),
      answer('p/gone', false, 'NotConnected', 'cluster gone is not connected', 'get'),
      answer('p/gone', false, 'NotConnected', 'cluster gone is not connected', 'delete'),
    ];
    expect(canITable(answers)).toBe(
      [
        'CLUSTER   GET            DELETE         REASON',
        'p/hub     yes            no',
        'p/edge    yes            yes',
        'p/gone    NotConnected   NotConnected   cluster gone is not connected',
        '',
      ].join('\n'),
    );
    expect(canIVerdict(answers).failure).toContain('1 of 3 clusters did not answer (p/gone: NotConnected)');
    expect(canIVerdict(answers.slice(0, 4))).toEqual({ no: true });
    expect(questionsOf('get, list,get', 'pods', '').map((q) => q.verb)).toEqual(['get', 'list']);
    expect(() => questionsOf('get,,list', 'pods', '')).toThrow('names an empty verb');
  });

  it('prints a row per cluster with its answer and reason', () => {
    expect(
      canITable([
        answer('p/hub', true, 'Answered', 'RBAC: allowed by RoleBinding "r/shop"'),
        answer('p/edge', false),
        answer('p/gone', false, 'NotConnected', 'cluster gone is not connected'),
        { ...answer('p/old', false), warning: 'the server doesn\'t have a resource type "gadgets"' },
      ]),
    ).toBe(
      [
        'CLUSTER   ANSWER         REASON',
        'p/hub     yes            RBAC: allowed by RoleBinding "r/shop"',
        'p/edge    no',
        'p/gone    NotConnected   cluster gone is not connected',
        'p/old     no             warning: the server doesn\'t have a resource type "gadgets"',
        '',
      ].join('\n'),
    );
  });
});

describe('sealion get and auth can-i against stand-in clusters behind one proxy', () => {
  let server: Server;
  let dir: string;
  /** What the stand-in was asked: method, path, accept, and the review's spec. */
  const asked: { method: string; url: string; accept: string; spec?: unknown }[] = [];
  const never = new Set<() => void>();
  /**
   * --cluster-timeout where `slow` never answers: the time every other cluster has for its TLS handshake and its
   * requests. One second was too little for edge once, with the unit tests beside the integration tests on two busy
   * cores. A bound, not a measure: the tests that use it wait it out once.
   */
  const SLOW_AFTER = '10';

  beforeAll(async () => {
    const ca = await newCA('fleet-test-ca');
    const cert = await issueCert(ca, { commonName: 'proxy', hosts: ['127.0.0.1'], usage: 'server' });
    server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
      let body = '';
      req.on('data', (chunk: Buffer) => (body += chunk.toString()));
      req.on('end', () => {
        const url = new URL(req.url ?? '/', 'https://x');
        const [, cluster = 'hub', rest = url.pathname] = /^\/clusters\/([^/]+)(\/.*)$/.exec(url.pathname) ?? [
          undefined,
          'hub',
          url.pathname,
        ];
        asked.push({
          method: req.method ?? '',
          url: `${cluster} ${rest}${url.search}`,
          accept: String(req.headers.accept),
          ...(body ? { spec: (JSON.parse(body) as { spec: unknown }).spec } : {}),
        });
        const send = (status: number, value: object) =>
          res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
        if (cluster === 'slow') return void never.add(() => res.destroy());
        if (cluster === 'gone')
          return send(503, { kind: 'Status', code: 503, message: 'cluster gone is not connected' });
        const { core, groups } = discovery(cluster === 'edge');
        if (rest === '/api') return send(200, core);
        if (rest === '/apis') return send(200, groups);
        if (rest.endsWith('/selfsubjectreviews'))
          return send(201, { status: { userInfo: { username: `me-${cluster}` } } });
        if (rest.endsWith('/selfsubjectaccessreviews'))
          return send(201, {
            status: cluster === 'edge' ? { allowed: true, reason: 'edge says yes' } : { allowed: false },
          });
        if (rest === '/apis/example.com/v2/namespaces/shop/widgets')
          return send(200, {
            kind: 'Table',
            columnDefinitions: [{ name: 'Name', type: 'string', priority: 0 }],
            rows: [{ cells: ['w1'], object: { metadata: { name: 'w1', namespace: 'shop' } } }],
          });
        if (rest === '/api/v1/namespaces/shop/pods' && cluster === 'odd')
          return send(200, { kind: 'Table', columnDefinitions: 'x', rows: {} });
        if (rest === '/api/v1/namespaces/shop/pods')
          return String(req.headers.accept).startsWith('application/json;as=Table')
            ? send(200, podTable([`web-${cluster}`, 'shop', '1/1', '10.0.0.1']))
            : send(200, { kind: 'PodList', items: [{ metadata: { name: `web-${cluster}` } }] });
        send(404, { kind: 'Status', code: 404, message: 'not found' });
      });
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    const proxy = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
    dir = mkdtempSync(join(tmpdir(), 'sealion-fleet-cli-'));
    const caData = Buffer.from(ca.certPem).toString('base64');
    const names = ['hub', 'edge', 'gone', 'slow'];
    const config = (clusters: string[]) =>
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: clusters.map((name) => ({
          name,
          cluster: {
            server: name === 'hub' ? proxy : `${proxy}/clusters/${name}`,
            'certificate-authority-data': caData,
          },
        })),
        contexts: clusters.map((name) => ({
          name: `p/${name}`,
          context: { cluster: name, user: 'me', namespace: 'shop' },
        })),
        'current-context': 'p/hub',
        users: [{ name: 'me', user: { token: 'secret' } }],
      });
    writeFileSync(join(dir, 'all'), config(names));
    writeFileSync(join(dir, 'up'), config(['hub', 'edge']));
    writeFileSync(join(dir, 'down'), config(['hub', 'gone']));
    writeFileSync(join(dir, 'odd'), config(['hub', 'odd']));
  });

  afterAll(async () => {
    for (const end of never) end();
    server.closeAllConnections();
    await new Promise<void>((done) => server.close(() => done()));
    rmSync(dir, { recursive: true, force: true });
  });

  async function run(
    command: 'get' | 'auth',
    ...args: string[]
  ): Promise<{ stdout: string; stderr: string; error?: string; exitCode: number | undefined }> {
    const out: string[] = [];
    const err: string[] = [];
    const stdout = jest
      .spyOn(process.stdout, 'write')
      .mockImplementation((chunk) => (out.push(String(chunk)), true));
    const stderr = jest
      .spyOn(process.stderr, 'write')
      .mockImplementation((chunk) => (err.push(String(chunk)), true));
    const before = process.exitCode;
    try {
      await (command === 'get' ? getCommand() : authCommand())
        .exitOverride()
        .parseAsync(args, { from: 'user' });
      return {
        stdout: out.join(''),
        stderr: err.join(''),
        error: undefined,
        exitCode: process.exitCode as number | undefined,
      };
    } catch (e) {
      return { stdout: out.join(''), stderr: err.join(''), error: (e as Error).message, exitCode: undefined };
    } finally {
      process.exitCode = before;
      stdout.mockRestore();
      stderr.mockRestore();
    }
  }

  it('lists pods on every cluster with a CLUSTER column, and shows those that did not answer', async () => {
    asked.length = 0;
    const got = await run(
      'get',
      'po',
      '--all-clusters',
      '--kubeconfig',
      join(dir, 'all'),
      '--cluster-timeout',
      SLOW_AFTER,
    );
    const lines = got.stdout.split('\n');
    expect(lines[0]).toBe('CLUSTER   NAME       READY   AGE');
    expect(lines[1]).toMatch(/^p\/hub {5}web-hub {4}1\/1 {5}\S+$/);
    expect(lines[2]).toMatch(/^p\/edge {4}web-edge {3}1\/1 {5}\S+$/);
    expect(lines.slice(3)).toEqual([
      '',
      'CLUSTER   STATE          REASON',
      'p/gone    NotConnected   cluster gone is not connected',
      'p/slow    Unreachable    no answer in time',
      '',
    ]);
    expect(got.error).toBe(
      'get po: 2 of 4 clusters did not answer (p/gone: NotConnected, p/slow: Unreachable); see each reason above; sealion clusters shows which clusters answer you now',
    );
    // Server-side Tables, as kubectl asks for them, in the context's namespace, page by page.
    expect(asked).toContainEqual({
      method: 'GET',
      url: 'edge /api/v1/namespaces/shop/pods?limit=500',
      accept: 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json',
    });
  }, 60_000);

  it('shows a cluster without the resource type as such, and exits 0 when every cluster answered', async () => {
    const widgets = await run(
      'get',
      'widgets.example.com',
      '--all-clusters',
      '--kubeconfig',
      join(dir, 'up'),
    );
    expect(widgets.stdout).toBe(
      [
        'CLUSTER   NAME',
        'p/edge    w1',
        '',
        'CLUSTER   STATE             REASON',
        'p/hub     UnknownResource   the server doesn\'t have a resource type "widgets.example.com"',
        '',
      ].join('\n'),
    );
    expect(widgets.error).toContain('1 of 2 clusters did not answer (p/hub: UnknownResource)');
    const json = await run('get', 'pods', '--all-clusters', '--kubeconfig', join(dir, 'up'), '-o', 'json');
    expect(json.error).toBeUndefined();
    expect(
      (JSON.parse(json.stdout) as { items: { metadata: { name: string; annotations: object } }[] }).items.map(
        (i) => [i.metadata.name, i.metadata.annotations],
      ),
    ).toEqual([
      ['web-hub', { [CONTEXT_ANNOTATION]: 'p/hub' }],
      ['web-edge', { [CONTEXT_ANNOTATION]: 'p/edge' }],
    ]);
  });

  it('asks one context with --context, and tells to name the clusters without either', async () => {
    const one = await run(
      'get',
      'pods',
      '--context',
      'p/edge',
      '--kubeconfig',
      join(dir, 'all'),
      '-o',
      'name',
    );
    expect(one).toMatchObject({ stdout: 'p/edge pod/web-edge\n', error: undefined });
    expect((await run('get', 'pods', '--kubeconfig', join(dir, 'all'))).error).toBe(
      'get pods: no clusters named; pass --all-clusters for every context, or --context NAME for one (kubectl get does the current context alone)',
    );
  });

  it('takes one resource type at a time', async () => {
    expect((await run('get', 'deploy,pods', '--all-clusters', '--kubeconfig', join(dir, 'all'))).error).toBe(
      'get deploy,pods: one resource type at a time; run sealion get once for each of deploy, pods',
    );
  });

  it('shows a cluster whose answer is no Table as failed, alone', async () => {
    const got = await run('get', 'pods', '--all-clusters', '--kubeconfig', join(dir, 'odd'));
    expect(got.stdout.split('\n').slice(-3)).toEqual([
      expect.stringMatching(/^CLUSTER +STATE +REASON$/),
      expect.stringMatching(/^p\/odd +Error +its answer is not a Table$/),
      '',
    ]);
    expect(got.stdout).toMatch(/^p\/hub +web-hub /m);
  });

  it('takes no name that would be another term of the field selector', async () => {
    expect(
      (await run('get', 'pods', 'a,metadata.namespace=x', '--all-clusters', '--kubeconfig', join(dir, 'up')))
        .error,
    ).toBe('get pods: "a,metadata.namespace=x" is no object name; give names as kubectl get takes them');
  });

  it('still lists the clusters with sealion clusters, through the same loading and states', async () => {
    const out: string[] = [];
    const write = jest
      .spyOn(process.stdout, 'write')
      .mockImplementation((chunk) => (out.push(String(chunk)), true));
    try {
      await clustersCommand()
        .exitOverride()
        .parseAsync(['--kubeconfig', join(dir, 'down'), '-o', 'json'], { from: 'user' });
    } finally {
      write.mockRestore();
    }
    expect(JSON.parse(out.join(''))).toEqual([
      expect.objectContaining({ context: 'p/hub', current: true, state: 'Ready', detail: 'me-hub' }),
      expect.objectContaining({
        context: 'p/gone',
        current: false,
        state: 'NotConnected',
        detail: 'cluster gone is not connected',
      }),
    ]);
  });

  it('hands options given before `kubeconfig` down to get kubeconfig, as before get took a resource', async () => {
    const missing = join(dir, 'no-such-kubeconfig');
    expect((await run('get', '--kubeconfig', missing, 'kubeconfig')).error).toContain(missing);
  });

  it('asks every cluster can-i, each answering for itself, and exits 1 on a no', async () => {
    asked.length = 0;
    const got = await run(
      'auth',
      'can-i',
      'list',
      'deploy',
      '--all-clusters',
      '--kubeconfig',
      join(dir, 'up'),
    );
    expect(got).toMatchObject({
      stdout: ['CLUSTER   ANSWER   REASON', 'p/hub     no', 'p/edge    yes      edge says yes', ''].join(
        '\n',
      ),
      error: undefined,
      exitCode: 1,
    });
    expect(asked.filter((a) => a.method === 'POST').map((a) => [a.url, a.spec])).toEqual(
      expect.arrayContaining([
        [
          'edge /apis/authorization.k8s.io/v1/selfsubjectaccessreviews',
          {
            resourceAttributes: {
              namespace: 'shop',
              verb: 'list',
              group: 'apps',
              resource: 'deployments',
              subresource: '',
              name: '',
            },
          },
        ],
      ]),
    );
    const failed = await run(
      'auth',
      'can-i',
      'get',
      '/healthz',
      '--all-clusters',
      '--kubeconfig',
      join(dir, 'all'),
      '--cluster-timeout',
      SLOW_AFTER,
      '-o',
      'json',
    );
    expect(JSON.parse(failed.stdout)).toEqual([
      { context: 'p/hub', verb: 'get', state: 'Answered', allowed: false, reason: '' },
      { context: 'p/edge', verb: 'get', state: 'Answered', allowed: true, reason: 'edge says yes' },
      {
        context: 'p/gone',
        verb: 'get',
        state: 'NotConnected',
        allowed: false,
        reason: 'cluster gone is not connected',
      },
      { context: 'p/slow', verb: 'get', state: 'Unreachable', allowed: false, reason: 'no answer in time' },
    ]);
    expect(failed.error).toContain('2 of 4 clusters did not answer');
    const yaml = await run(
      'auth',
      'can-i',
      'get',
      '/healthz',
      '--all-clusters',
      '--kubeconfig',
      join(dir, 'up'),
      '-o',
      'yaml',
    );
    expect(parse(yaml.stdout)).toEqual([
      { context: 'p/hub', verb: 'get', state: 'Answered', allowed: false, reason: '' },
      { context: 'p/edge', verb: 'get', state: 'Answered', allowed: true, reason: 'edge says yes' },
    ]);
    expect(yaml.exitCode).toBe(1);
  }, 60_000);
});
