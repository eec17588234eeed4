// `sealion cluster kubeconfig NAME --service-account NS/SA`, run as a command against an API server stand-in that
// answers the few reads it makes: every name is checked before anything is printed, each miss is one line that says
// what to do, and the kubeconfig names the proxy's in-cluster Service, its published CA and the pod's token file.
// And `cluster add --workload-prefix`, which opts a cluster in when it is added.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parse, stringify } from 'yaml';
import { REPO_ROOT } from '../dev/build.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { parseServiceAccount } from './cluster-kubeconfig.ts';

const run = promisify(execFile);
// Each case runs the CLI as a process, a second or more on two shared cores.
jest.setTimeout(30_000);
const PROXY_HOST = 'sealion-impersonation-proxy.sealion-concierge.svc';
const CA_DATA = Buffer.from('-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n').toString(
  'base64',
);

/** What the stand-in serves: each path's JSON answer (anything else: 404). */
function answers(proxyPort: number, strategyStatus = 'Success'): Record<string, object> {
  return {
    '/apis/tunnel.concierge.sealion.dev/v1alpha1/clusters': {
      items: [
        { metadata: { name: 'edge' }, spec: { workloads: { usernamePrefix: 'hub:' } } },
        { metadata: { name: 'plain' }, spec: {} },
      ],
    },
    '/api/v1/namespaces/gitops/serviceaccounts/deployer': { metadata: { name: 'deployer' } },
    '/api/v1/namespaces/sealion-concierge/services/sealion-impersonation-proxy': {
      metadata: { name: 'sealion-impersonation-proxy' },
      spec: { ports: [{ name: 'https', port: proxyPort }] },
    },
    '/apis/config.concierge.sealion.dev/v1alpha1/credentialissuers': {
      items: [
        {
          metadata: { name: 'sealion-concierge-config' },
          status: {
            strategies: [
              {
                type: 'ImpersonationProxy',
                status: strategyStatus,
                reason: strategyStatus === 'Success' ? 'Listening' : 'Pending',
                message: 'the proxy',
                frontend: {
                  type: 'ImpersonationProxy',
                  impersonationProxyInfo: {
                    endpoint: 'https://203.0.113.7',
                    certificateAuthorityData: CA_DATA,
                  },
                },
              },
            ],
          },
        },
      ],
    },
  };
}

function standIn(): { server: Server; serve: Record<string, object>; asked: string[] } {
  const state = { serve: {} as Record<string, object>, asked: [] as string[] };
  const server = createServer((req, res) => {
    state.asked.push(`${req.method} ${req.url}`);
    const path = (req.url ?? '').split('?')[0]!;
    const body = req.method === 'GET' ? state.serve[path] : undefined;
    res.writeHead(body ? 200 : 404, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify(
        body ?? { kind: 'Status', apiVersion: 'v1', status: 'Failure', code: 404, reason: 'NotFound' },
      ),
    );
  });
  return Object.assign(state, { server });
}

describe('sealion cluster kubeconfig', () => {
  const api = standIn();
  let dir: string;
  let kubeconfig: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-cluster-kubeconfig-'));
    await new Promise<void>((done) => api.server.listen(0, '127.0.0.1', done));
    const server = `http://127.0.0.1:${(api.server.address() as AddressInfo).port}`;
    kubeconfig = join(dir, 'admin.kubeconfig');
    writeFileSync(
      kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'hub', cluster: { server, 'insecure-skip-tls-verify': true } }],
        users: [{ name: 'admin', user: { token: 'not-a-secret' } }],
        contexts: [{ name: 'hub', context: { cluster: 'hub', user: 'admin' } }],
        'current-context': 'hub',
      }),
    );
  });
  afterAll(() => {
    api.server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const sealion = async (
    args: string[],
    serve = answers(443),
  ): Promise<{ code: number; stdout: string; stderr: string }> => {
    api.serve = serve;
    api.asked.length = 0;
    return run(
      process.execPath,
      [join(REPO_ROOT, 'bin/sealion.js'), 'cluster', 'kubeconfig', ...args, '--kubeconfig', kubeconfig],
      { timeout: 30_000 },
    ).then(
      ({ stdout, stderr }) => ({ code: 0, stdout, stderr }),
      (err: { code: number; stdout: string; stderr: string }) => ({
        code: err.code,
        stdout: err.stdout,
        stderr: err.stderr,
      }),
    );
  };

  /** The exit code, and what the command said on standard error when it failed (shown in a failed assertion). */
  const exit = (r: { code: number; stderr: string }): { code: number; stderr?: string } =>
    r.code === 0 ? { code: 0 } : { code: r.code, stderr: r.stderr };

  it("prints a kubeconfig for the proxy's in-cluster Service, its CA and the pod's projected token", async () => {
    const result = await sealion(['edge', '--service-account', 'gitops/deployer']);
    expect(result.code).toBe(0);
    const context = 'sealion-impersonation-proxy.sealion-concierge.svc/edge';
    expect(parse(result.stdout)).toEqual({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [
        {
          name: context,
          cluster: {
            server: 'https://sealion-impersonation-proxy.sealion-concierge.svc/clusters/edge',
            'certificate-authority-data': CA_DATA,
          },
        },
      ],
      users: [{ name: `${context}/gitops/deployer`, user: { tokenFile: '/var/run/secrets/sealion/token' } }],
      contexts: [{ name: context, context: { cluster: context, user: `${context}/gitops/deployer` } }],
      'current-context': context,
    });
    // What the pod needs, on standard error: the audience, where to mount it, and whom edge will see.
    expect(result.stderr).toContain('audience: workloads.concierge.sealion.dev');
    expect(result.stderr).toContain('mountPath: /var/run/secrets/sealion');
    expect(result.stderr).toContain('serviceAccountName: deployer');
    expect(result.stderr).toContain('it acts as hub:system:serviceaccount:gitops:deployer');
  });

  it("keeps the Service's port, and takes -o json and --output-file (0600)", async () => {
    const file = join(dir, 'out.json');
    const result = await sealion(
      ['edge', '--service-account', 'gitops/deployer', '-o', 'json', '--output-file', file],
      answers(8443),
    );
    expect(result).toMatchObject({ code: 0, stdout: '' });
    const written = JSON.parse(readFileSync(file, 'utf8')) as { clusters: { cluster: { server: string } }[] };
    expect(written.clusters[0]!.cluster.server).toBe(
      'https://sealion-impersonation-proxy.sealion-concierge.svc:8443/clusters/edge',
    );
    expect(statSync(file).mode & 0o777).toBe(0o600);
  });

  it('takes the address pods reach the proxy at with --server, asking for no Service', async () => {
    const result = await sealion([
      'edge',
      '--service-account',
      'gitops/deployer',
      '--server',
      'https://proxy.example.com:8443/',
    ]);
    expect(result.code).toBe(0);
    expect(parse(result.stdout)).toMatchObject({
      clusters: [{ cluster: { server: 'https://proxy.example.com:8443/clusters/edge' } }],
      'current-context': 'proxy.example.com:8443/edge',
    });
    expect(api.asked.some((a) => a.includes('/services/'))).toBe(false);
  });

  it.each([
    [
      'a cluster the hub does not have, listing those it has',
      ['nope', '--service-account', 'gitops/deployer'],
      'sealion: no cluster nope; known: edge, plain\n',
    ],
    [
      'a service account the hub does not have',
      ['edge', '--service-account', 'gitops/nobody'],
      'sealion: no service account gitops/nobody on the hub; create it first: kubectl -n gitops create serviceaccount nobody\n',
    ],
    [
      'a cluster that takes no workloads, with how to let it',
      ['plain', '--service-account', 'gitops/deployer'],
      `sealion: cluster plain takes no workloads from the hub: its spec.workloads.usernamePrefix is not set; set it (the names its RBAC will see start with it): kubectl patch cluster plain --type merge -p '{"spec":{"workloads":{"usernamePrefix":"hub:"}}}'\n`,
    ],
    [
      'a service account not written NS/NAME',
      ['edge', '--service-account', 'deployer'],
      'sealion: --service-account "deployer": not NAMESPACE/NAME; give the hub service account as, for example, argocd/argocd-application-controller\n',
    ],
    [
      'a server that is not https',
      ['edge', '--service-account', 'gitops/deployer', '--server', 'http://proxy'],
      `sealion: --server "http://proxy": not an https:// address; give the proxy's address, such as https://proxy.example.com:8443\n`,
    ],
  ])('refuses %s, in one line, printing nothing', async (_name, args, line) => {
    const result = await sealion(args);
    expect(result).toEqual({ code: 1, stdout: '', stderr: line });
  });

  it('refuses while the proxy does not serve, saying its status', async () => {
    const result = await sealion(['edge', '--service-account', 'gitops/deployer'], answers(443, 'Error'));
    expect(result.code).toBe(1);
    expect(result.stdout).toBe('');
    expect(result.stderr).toMatch(/^sealion: the impersonation proxy is Error \(Pending\): the proxy; /);
  });

  it("refuses when the proxy's serving certificate does not name the host the kubeconfig sends to", async () => {
    const ca = await newCA('test proxy CA', 3600_000);
    const secretOf = async (hosts: string[]): Promise<object> => {
      const cert = await issueCert(ca, { commonName: 'proxy', hosts, usage: 'server', validityMs: 3600_000 });
      return { data: { 'tls.crt': Buffer.from(cert.certPem).toString('base64') } };
    };
    const generated = '/api/v1/namespaces/sealion-concierge/secrets/sealion-impersonation-proxy-tls';
    const named = { ...answers(443), [generated]: await secretOf(['203.0.113.7', PROXY_HOST]) };
    expect(exit(await sealion(['edge', '--service-account', 'gitops/deployer'], named))).toEqual({ code: 0 });
    const unnamed = { ...answers(443), [generated]: await secretOf(['203.0.113.7']) };
    expect(await sealion(['edge', '--service-account', 'gitops/deployer'], unnamed)).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: the proxy's serving certificate (Secret sealion-concierge/sealion-impersonation-proxy-tls) does not name ${PROXY_HOST}, so the controller's kubectl would refuse it; a concierge of this release issues one that does, or give with --server an address the certificate names\n`,
    });
    // --server names another host, which the certificate does name.
    expect(
      exit(
        await sealion(
          ['edge', '--service-account', 'gitops/deployer', '--server', 'https://203.0.113.7'],
          unnamed,
        ),
      ),
    ).toEqual({ code: 0 });
    // The admin's own certificate, named in the settings in effect, is the one read.
    const issuers = answers(443)['/apis/config.concierge.sealion.dev/v1alpha1/credentialissuers'] as {
      items: object[];
    };
    const own = {
      ...answers(443),
      '/apis/config.concierge.sealion.dev/v1alpha1/credentialissuers': {
        items: [
          {
            ...issuers.items[0],
            spec: { impersonationProxy: { mode: 'auto', tls: { secretName: 'mine' } } },
          },
        ],
      },
      [generated]: await secretOf([PROXY_HOST]),
      '/api/v1/namespaces/sealion-concierge/secrets/mine': await secretOf(['proxy.example.com']),
    };
    expect((await sealion(['edge', '--service-account', 'gitops/deployer'], own)).stderr).toContain(
      `(Secret sealion-concierge/mine) does not name ${PROXY_HOST}, so the controller's kubectl would refuse it; add that name to the certificate`,
    );
  }, 60_000);

  it('checks names before it asks the API server anything', async () => {
    await sealion(['Not_A_Name', '--service-account', 'gitops/deployer']);
    expect(api.asked).toEqual([]);
  });
});

describe('--service-account', () => {
  it.each(['a/b/c', '/b', 'a/', 'A/b', 'a/b c'])('refuses %j', (value) => {
    expect(() => parseServiceAccount(value)).toThrow('not NAMESPACE/NAME');
  });
});

describe('sealion cluster add --workload-prefix', () => {
  it("creates the Cluster with spec.workloads.usernamePrefix, so that it takes the hub's workloads", async () => {
    const tunnelCA = await newCA('test tunnel CA', 3600_000);
    const created: { path: string; body: unknown }[] = [];
    const server = createServer((req, res) => {
      let body = '';
      req.setEncoding('utf8');
      req.on('data', (c: string) => (body += c));
      req.on('end', () => {
        const path = (req.url ?? '').split('?')[0]!;
        const answer = (code: number, json: object): void => {
          res.writeHead(code, { 'content-type': 'application/json' });
          res.end(JSON.stringify(json));
        };
        if (req.method === 'GET' && path.endsWith('/secrets/sealion-tunnel-ca'))
          return answer(200, { data: { 'tls.crt': Buffer.from(tunnelCA.certPem).toString('base64') } });
        if (req.method === 'GET' && path.endsWith('/secrets')) return answer(200, { items: [] });
        if (req.method === 'POST') {
          created.push({ path, body: JSON.parse(body) as unknown });
          return answer(201, JSON.parse(body) as object);
        }
        answer(404, { kind: 'Status', apiVersion: 'v1', status: 'Failure', code: 404, reason: 'NotFound' });
      });
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    const dir = mkdtempSync(join(tmpdir(), 'sealion-cluster-add-'));
    try {
      const kubeconfig = join(dir, 'admin.kubeconfig');
      writeFileSync(
        kubeconfig,
        stringify({
          apiVersion: 'v1',
          kind: 'Config',
          clusters: [
            {
              name: 'hub',
              cluster: {
                server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
                'insecure-skip-tls-verify': true,
              },
            },
          ],
          users: [{ name: 'admin', user: { token: 'not-a-secret' } }],
          contexts: [{ name: 'hub', context: { cluster: 'hub', user: 'admin' } }],
          'current-context': 'hub',
        }),
      );
      const result = await run(process.execPath, [
        join(REPO_ROOT, 'bin/sealion.js'),
        'cluster',
        'add',
        'edge-2',
        '--workload-prefix',
        'fleet:',
        '--kubeconfig',
        kubeconfig,
      ]);
      expect(result.stdout).toContain('Cluster edge-2 is registered.');
      expect(created.find((c) => c.path.endsWith('/clusters'))?.body).toMatchObject({
        kind: 'Cluster',
        metadata: { name: 'edge-2' },
        spec: { workloads: { usernamePrefix: 'fleet:' } },
      });
    } finally {
      server.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
