// Tokens stay out of the process list: the kubeconfig `sealion get kubeconfig` writes names where the token is,
// never the token, and the plugin reads it from there. Which way in it writes (the cluster's API server or the
// impersonation proxy), what it refuses, and that the plugin it names does what that way in needs.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { chmodSync, existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse, stringify } from 'yaml';
import type { ConciergeStrategy } from '../apis/authentication.ts';
import type { KubeClients } from '../lib/kube/kube.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { getKubeconfig, runGetKubeconfig, type GetKubeconfigFlags } from './get-kubeconfig.ts';
import { readTokenFile, staticLogin, type StaticLoginFlags } from './exec-credential.ts';
import { loginCommand } from './login.ts';

const TOKEN = 'the-secret-token';
let dir: string;
let tokenFile: string;

/** An admin's view of one webhook authenticator whose proxy is published. */
const clients = {
  customObjects: {
    listClusterCustomObject: ({ plural }: { plural: string }) =>
      Promise.resolve({
        items:
          plural === 'webhookauthenticators'
            ? [
                {
                  metadata: { name: 'hooks' },
                  status: {
                    conciergeStrategies: [
                      {
                        type: 'ImpersonationProxy',
                        status: 'Success',
                        reason: 'Listening',
                        message: 'ok',
                        impersonationProxyConfig: {
                          endpoint: 'https://proxy.example.com',
                          certificateAuthorityData: 'Q0E=',
                        },
                      },
                    ],
                  },
                },
              ]
            : [],
      }),
  },
} as unknown as KubeClients;

const flags = (over: Partial<GetKubeconfigFlags>): GetKubeconfigFlags => ({
  kubeconfig: '',
  groupSuffix: 'sealion.dev',
  authenticatorType: '',
  authenticatorName: '',
  staticToken: '',
  staticTokenEnv: '',
  staticTokenFile: '',
  oidcIssuer: '',
  oidcClientId: 'sealion-cli',
  oidcScopes: 'openid',
  oidcCaBundleData: '',
  oidcSkipBrowser: false,
  exchangeCredential: true,
  timeout: '0',
  output: '',
  cluster: '',
  allClusters: false,
  oidcDevice: false,
  ...over,
});

/** The exec plugin's arguments in a kubeconfig. */
const argsOf = (yaml: string): string[] =>
  (parse(yaml) as { users: { user: { exec: { args: string[] } } }[] }).users[0]!.user.exec.args;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-token-'));
  tokenFile = join(dir, 'token');
  writeFileSync(tokenFile, `${TOKEN}\n`, { mode: 0o600 });
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe('sealion get kubeconfig keeps static tokens out of the exec arguments', () => {
  it('refuses --static-token, before asking the cluster anything', async () => {
    const asked = { customObjects: { listClusterCustomObject: () => Promise.reject(new Error('asked')) } };
    await expect(
      getKubeconfig(flags({ staticToken: TOKEN }), () => {}, asked as unknown as KubeClients),
    ).rejects.toThrow(/--static-token would put the token in the arguments of every kubectl run/);
  });

  it('names the environment variable, or the token file by its absolute path', async () => {
    const byEnv = await getKubeconfig(flags({ staticTokenEnv: 'MY_TOKEN' }), () => {}, clients);
    expect(argsOf(byEnv)).toEqual(expect.arrayContaining(['static', '--token-env', 'MY_TOKEN']));
    const byFile = await getKubeconfig(flags({ staticTokenFile: tokenFile }), () => {}, clients);
    expect(argsOf(byFile)).toEqual(expect.arrayContaining(['static', '--token-file', tokenFile]));
    for (const yaml of [byEnv, byFile]) {
      expect(yaml).not.toContain(TOKEN);
      expect(argsOf(yaml)).not.toContain('--token');
    }
  });

  it('refuses a token file other users may read, and one that is not there', async () => {
    const open = join(dir, 'open-token');
    writeFileSync(open, TOKEN);
    chmodSync(open, 0o644);
    await expect(getKubeconfig(flags({ staticTokenFile: open }), () => {}, clients)).rejects.toThrow(
      /is open to other users \(mode 0644\): run chmod 600 on it/,
    );
    await expect(
      getKubeconfig(flags({ staticTokenFile: join(dir, 'missing') }), () => {}, clients),
    ).rejects.toThrow(
      /^cannot read token file \S+missing: no such file; check the path, or write the token there$/,
    );
  });
});

describe('sealion login static reads the token from where the kubeconfig says', () => {
  const login = (over: Partial<StaticLoginFlags>): StaticLoginFlags => ({
    token: '',
    tokenEnv: '',
    tokenFile: '',
    exchange: false,
    authenticatorType: 'webhook',
    authenticatorName: '',
    groupSuffix: 'sealion.dev',
    conciergeEndpoint: '',
    conciergeCaBundleData: '',
    ...over,
  });

  it('a private token file, trimmed of its line break', async () => {
    expect(readTokenFile(tokenFile)).toBe(TOKEN);
    expect((await staticLogin(login({ tokenFile }), {})).status.token).toBe(TOKEN);
    await expect(staticLogin(login({ tokenFile, tokenEnv: 'T' }), { T: 'x' })).rejects.toThrow(
      'not --token-env and --token-file',
    );
  });

  it('warns on every kubectl run of a kubeconfig that still passes --token, and only there', async () => {
    const said: string[] = [];
    const exec = { KUBERNETES_EXEC_INFO: '{"kind":"ExecCredential"}' };
    expect((await staticLogin(login({ token: TOKEN }), exec, (l) => said.push(l))).status.token).toBe(TOKEN);
    expect(said).toEqual([expect.stringMatching(/^warning: this kubeconfig passes the token with --token/)]);
    said.length = 0;
    await staticLogin(login({ token: TOKEN }), {}, (l) => said.push(l));
    expect(said).toEqual([]);
  });
});

const PROXY = { endpoint: 'https://proxy.example.com', certificateAuthorityData: 'UFJPWFkgQ0E=' };
const API_SERVER = { endpoint: 'https://api.example.com:6443', certificateAuthorityData: 'QVBJIENB' };
const T = '2026-01-01T00:00:00.000Z';
const proxyOk: ConciergeStrategy = {
  type: 'ImpersonationProxy',
  status: 'Success',
  reason: 'Listening',
  message: 'serving',
  lastUpdateTime: T,
  impersonationProxyConfig: PROXY,
};
const proxyOff: ConciergeStrategy = {
  type: 'ImpersonationProxy',
  status: 'NotAvailable',
  reason: 'Disabled',
  message: 'automatically disabled: node cp-1 is a control-plane node',
  lastUpdateTime: T,
};
const directOk = (at = API_SERVER): ConciergeStrategy => ({
  type: 'TokenCredentialRequestAPI',
  status: 'Success',
  reason: 'ClusterSigns',
  message: 'the cluster signs',
  lastUpdateTime: T,
  tokenCredentialRequestConfig: at,
});
const directOff: ConciergeStrategy = {
  type: 'TokenCredentialRequestAPI',
  status: 'NotAvailable',
  reason: 'Disabled',
  message: 'automatically disabled: EKS',
  lastUpdateTime: T,
};
const directBroken: ConciergeStrategy = {
  type: 'TokenCredentialRequestAPI',
  status: 'Error',
  reason: 'ClusterDoesNotSign',
  message: 'a probe request failed',
  lastUpdateTime: T,
};

/** An admin's view of one webhook authenticator `hooks` with these strategies, and two agent-backed clusters. */
function clientsWith(
  strategies: ConciergeStrategy[],
  hub: { hubName?: string; clusters?: { name: string; connected: boolean }[] } = {},
): KubeClients & { asked: string[] } {
  const asked: string[] = [];
  const clusters = hub.clusters ?? [
    { name: 'edge-1', connected: true },
    { name: 'edge-2', connected: true },
  ];
  return {
    asked,
    customObjects: {
      listClusterCustomObject: ({ plural }: { plural: string }) => {
        asked.push(plural);
        if (plural === 'clusters')
          return Promise.resolve({
            items: clusters.map((c) => ({ metadata: { name: c.name }, status: { connected: c.connected } })),
          });
        if (plural === 'credentialissuers')
          return hub.hubName === undefined
            ? Promise.reject(new Error('forbidden'))
            : Promise.resolve({
                items: [{ metadata: { name: 'x' }, spec: { ssh: { hubName: hub.hubName } } }],
              });
        return Promise.resolve({
          items:
            plural === 'webhookauthenticators'
              ? [{ metadata: { name: 'hooks' }, status: { conciergeStrategies: strategies } }]
              : [],
        });
      },
    },
  } as unknown as KubeClients & { asked: string[] };
}

interface Written {
  servers: string[];
  cas: string[];
  contexts: string[];
  args: string[];
}
function written(yaml: string): Written {
  const config = parse(yaml) as {
    clusters: { cluster: { server: string; 'certificate-authority-data': string } }[];
    contexts: { name: string }[];
    users: { user: { exec: { args: string[] } } }[];
  };
  return {
    servers: config.clusters.map((c) => c.cluster.server),
    cas: config.clusters.map((c) => c.cluster['certificate-authority-data']),
    contexts: config.contexts.map((c) => c.name),
    args: config.users[0]!.user.exec.args,
  };
}
/** The value after `flag` in the plugin's arguments. */
const after = (args: string[], flag: string): string | undefined => args[args.indexOf(flag) + 1];

describe('sealion get kubeconfig chooses the way in', () => {
  it.each([
    ['direct where it works', [directOk(), proxyOk], {}, 'direct'],
    ['direct where only it works', [directOk(), proxyOff], {}, 'direct'],
    ['the proxy when asked, even where direct works', [directOk(), proxyOk], { mode: 'proxy' }, 'proxy'],
    ['the proxy for an agent-backed cluster', [directOk(), proxyOk], { cluster: 'edge-1' }, 'proxy'],
    ['the proxy for every cluster', [directOk(), proxyOk], { allClusters: true }, 'proxy'],
    ['the proxy where direct is off', [directOff, proxyOk], {}, 'proxy'],
    ['the proxy where direct is broken', [directBroken, proxyOk], {}, 'proxy'],
    ['the proxy from a concierge that knows no direct path', [proxyOk], {}, 'proxy'],
    ['direct when asked', [directOk(), proxyOk], { mode: 'direct' }, 'direct'],
  ] as const)('%s', async (_, strategies, over, wanted) => {
    const yaml = await getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN', exchangeCredential: false, ...over }),
      () => {},
      clientsWith([...strategies]),
    );
    const { servers, args } = written(yaml);
    const at = wanted === 'direct' ? API_SERVER.endpoint : PROXY.endpoint;
    expect(servers[0]!.startsWith(at)).toBe(true);
    // The direct path always exchanges; the proxy only when asked to (here not).
    expect(args.includes('--exchange')).toBe(wanted === 'direct');
    // What an exchange needs is written either way: the plugin exchanges too while a reason is set.
    expect(args.slice(args.indexOf('--authenticator-type'))).toEqual([
      '--authenticator-type',
      'webhook',
      '--authenticator-name',
      'hooks',
      '--concierge-endpoint',
      wanted === 'direct' ? API_SERVER.endpoint : PROXY.endpoint,
      '--concierge-ca-bundle-data',
      wanted === 'direct' ? API_SERVER.certificateAuthorityData : PROXY.certificateAuthorityData,
    ]);
  });

  it('waits for a Pending proxy when direct does not work, and takes direct once it does', async () => {
    let strategies: ConciergeStrategy[] = [
      directBroken,
      { ...proxyOff, status: 'Error', reason: 'Pending', message: 'waiting for a load balancer' },
    ];
    const clients = {
      customObjects: {
        listClusterCustomObject: ({ plural }: { plural: string }) =>
          Promise.resolve({
            items:
              plural === 'webhookauthenticators'
                ? [{ metadata: { name: 'hooks' }, status: { conciergeStrategies: strategies } }]
                : [],
          }),
      },
    } as unknown as KubeClients;
    const said: string[] = [];
    const waiting = getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN', timeout: '60' }),
      (line) => {
        said.push(line);
        // Seen waiting: the next poll finds the direct path working.
        strategies = [directOk(), strategies[1]!];
      },
      clients,
    );
    expect(written(await waiting).servers).toEqual([API_SERVER.endpoint]);
    expect(said).toEqual(['waiting: waiting for a load balancer']);
  }, 10_000);
});

describe('sealion get kubeconfig refuses what cannot work', () => {
  const nothingAsked = (): KubeClients =>
    ({
      customObjects: { listClusterCustomObject: () => Promise.reject(new Error('asked')) },
    }) as unknown as KubeClients;

  it.each([
    [{ mode: 'direct', cluster: 'edge-1' }, /^--cluster needs the impersonation proxy.*--mode direct/],
    [{ mode: 'direct', allClusters: true }, /^--all-clusters needs the impersonation proxy.*--mode direct/],
    [{ mode: 'both' }, /^--mode must be direct or proxy, not "both"/],
  ] as const)('%j, before asking the cluster anything', async (over, message) => {
    await expect(
      getKubeconfig(
        flags({ staticTokenEnv: 'MY_TOKEN', ...(over as Partial<GetKubeconfigFlags>) }),
        () => {},
        nothingAsked(),
      ),
    ).rejects.toThrow(message);
  });

  it('--mode direct where the direct path does not work, saying what its strategy says', async () => {
    await expect(
      getKubeconfig(
        flags({ staticTokenEnv: 'MY_TOKEN', mode: 'direct' }),
        () => {},
        clientsWith([directBroken, proxyOk]),
      ),
    ).rejects.toThrow('the TokenCredentialRequest API is Error (ClusterDoesNotSign): a probe request failed');
    await expect(
      getKubeconfig(flags({ staticTokenEnv: 'MY_TOKEN', mode: 'direct' }), () => {}, clientsWith([proxyOk])),
    ).rejects.toThrow(/^the concierge publishes no TokenCredentialRequestAPI strategy for webhook\/hooks/);
  });

  it('no --mode where neither works: both strategies in the message', async () => {
    await expect(
      getKubeconfig(flags({ staticTokenEnv: 'MY_TOKEN' }), () => {}, clientsWith([directBroken, proxyOff])),
    ).rejects.toThrow(
      'the impersonation proxy is NotAvailable (Disabled): automatically disabled: node cp-1 is a control-plane node; the TokenCredentialRequest API is Error (ClusterDoesNotSign): a probe request failed',
    );
  });

  it('warns of a rejected edit on the proxy, not on the direct path', async () => {
    const rejected = {
      ...proxyOk,
      message:
        'serving; the latest configuration edit was rejected, and the last good configuration stays in effect: x',
    };
    const said: string[] = [];
    await getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN' }),
      (l) => said.push(l),
      clientsWith([directOk(), rejected]),
    );
    expect(said).toEqual([]);
    await getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN', mode: 'proxy' }),
      (l) => said.push(l),
      clientsWith([directOk(), rejected]),
    );
    expect(said).toEqual([
      expect.stringMatching(/^warning: the impersonation proxy serves, but serving; the latest/),
    ]);
  });
});

describe('the direct kubeconfig', () => {
  it('points at the API server with its CA, one context, and a plugin that exchanges there and sends no CSR', async () => {
    const yaml = await getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN', exchangeCredential: false }),
      () => {},
      clientsWith([directOk(), proxyOk]),
    );
    const { servers, cas, contexts, args } = written(yaml);
    expect(servers).toEqual([API_SERVER.endpoint]);
    expect(cas).toEqual([API_SERVER.certificateAuthorityData]);
    expect(contexts).toEqual(['api.example.com:6443/hub']);
    expect(args.slice(args.indexOf('login'))).toEqual([
      'login',
      'static',
      '--token-env',
      'MY_TOKEN',
      '--exchange',
      '--no-proof-of-possession',
      '--authenticator-type',
      'webhook',
      '--authenticator-name',
      'hooks',
      '--concierge-endpoint',
      API_SERVER.endpoint,
      '--concierge-ca-bundle-data',
      API_SERVER.certificateAuthorityData,
    ]);
    expect((parse(yaml) as { 'current-context': string })['current-context']).toBe(
      'api.example.com:6443/hub',
    );
  });

  it('keeps the OIDC login and the group suffix', async () => {
    const clients = {
      customObjects: {
        listClusterCustomObject: ({ plural }: { plural: string }) =>
          Promise.resolve({
            items:
              plural === 'jwtauthenticators'
                ? [
                    {
                      metadata: { name: 'corp' },
                      spec: { issuer: 'https://issuer.example.com' },
                      status: { conciergeStrategies: [directOk(), proxyOff] },
                    },
                  ]
                : [],
          }),
      },
    } as unknown as KubeClients;
    const { args } = written(await getKubeconfig(flags({ groupSuffix: 'example.org' }), () => {}, clients));
    expect(args.slice(args.indexOf('login'), args.indexOf('login') + 3)).toEqual([
      'login',
      'oidc',
      '--issuer',
    ]);
    expect(args).toEqual(expect.arrayContaining(['--exchange', '--no-proof-of-possession']));
    expect(after(args, '--authenticator-type')).toBe('jwt');
    expect(after(args, '--concierge-endpoint')).toBe(API_SERVER.endpoint);
    expect(after(args, '--group-suffix')).toBe('example.org');
  });

  it("the proxy's kubeconfig still sends a CSR for the plugin's own key", async () => {
    const { args } = written(
      await getKubeconfig(
        flags({ staticTokenEnv: 'MY_TOKEN', mode: 'proxy' }),
        () => {},
        clientsWith([directOk(), proxyOk]),
      ),
    );
    expect(args).toContain('--exchange');
    expect(args).not.toContain('--no-proof-of-possession');
    expect(after(args, '--concierge-endpoint')).toBe(PROXY.endpoint);
  });
});

describe("the direct kubeconfig's plugin, run as kubectl would run it", () => {
  let server: Server;
  let at: { endpoint: string; certificateAuthorityData: string };
  const bodies: { url: string; body: { spec?: Record<string, unknown> } }[] = [];
  let credential: { clientCertificateData: string; clientKeyData: string };

  beforeAll(async () => {
    const ca = await newCA('stand-in-api-server-ca');
    const serving = await issueCert(ca, { commonName: 'api', hosts: ['127.0.0.1'], usage: 'server' });
    // The concierge makes the key and returns it with the certificate, as on the direct path.
    const client = await issueCert(ca, { commonName: 'dana', organizations: ['demo'], usage: 'client' });
    credential = { clientCertificateData: client.certPem, clientKeyData: client.keyPem };
    server = createServer({ cert: serving.certPem, key: serving.keyPem }, (req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        bodies.push({ url: req.url ?? '', body: JSON.parse(Buffer.concat(chunks).toString()) as never });
        res.writeHead(201, { 'content-type': 'application/json' }).end(
          JSON.stringify({
            kind: 'TokenCredentialRequest',
            apiVersion: 'login.concierge.sealion.dev/v1alpha1',
            status: {
              credential: {
                expirationTimestamp: new Date(Date.now() + 600_000).toISOString(),
                ...credential,
              },
            },
          }),
        );
      });
    });
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    at = {
      endpoint: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
      certificateAuthorityData: Buffer.from(ca.certPem).toString('base64'),
    };
  });
  afterAll(async () => {
    server.closeAllConnections();
    await new Promise((done) => server.close(done));
    const { closeHttpsPools } = await import('../lib/https-client.ts');
    await closeHttpsPools();
  });

  it('sends no CSR, takes the key it is given, and warns of nothing', async () => {
    const { args } = written(
      await getKubeconfig(
        flags({ staticTokenEnv: 'MY_TOKEN' }),
        () => {},
        clientsWith([directOk(at), proxyOff]),
      ),
    );
    // The plugin's own option parsing, on the kubeconfig's arguments.
    let parsed: StaticLoginFlags | undefined;
    const login = loginCommand().exitOverride();
    login.commands
      .find((c) => c.name() === 'static')!
      .exitOverride()
      .action((f: StaticLoginFlags) => void (parsed = f));
    await login.parseAsync(args.slice(args.indexOf('login') + 1), { from: 'user' });
    expect(parsed).toMatchObject({
      exchange: true,
      proofOfPossession: false,
      conciergeEndpoint: at.endpoint,
    });

    const stderr = jest.spyOn(process.stderr, 'write').mockImplementation(() => true);
    try {
      const home = mkdtempSync(join(dir, 'home-'));
      const answer = await staticLogin(parsed!, { MY_TOKEN: TOKEN, XDG_CONFIG_HOME: home });
      expect(answer.status).toMatchObject(credential);
      expect(stderr).not.toHaveBeenCalled();
    } finally {
      stderr.mockRestore();
    }
    expect(bodies).toHaveLength(1);
    expect(bodies[0]!.url).toBe('/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests');
    expect(bodies[0]!.body.spec).toEqual({
      token: TOKEN,
      authenticator: {
        apiGroup: 'authentication.concierge.sealion.dev',
        kind: 'WebhookAuthenticator',
        name: 'hooks',
      },
    });
  });
});

describe('sealion get kubeconfig checks every name before anything starts', () => {
  const proxyOnly = (hub: Parameters<typeof clientsWith>[1] = {}): KubeClients => clientsWith([proxyOk], hub);

  it.each([
    ['a cluster that does not exist', { cluster: 'nope' }, {}, 'no cluster nope; known: edge-1, edge-2, hub'],
    [
      'a cluster, the hub named prod',
      { cluster: 'hub' },
      { hubName: 'prod' },
      'no cluster hub; known: edge-1, edge-2, prod',
    ],
    [
      'an authenticator that does not exist',
      { authenticatorName: 'nope' },
      {},
      'no authenticator nope; known: webhook/hooks',
    ],
    [
      'an authenticator of another type',
      { authenticatorType: 'jwt' },
      {},
      'no jwt authenticator; known: webhook/hooks',
    ],
  ] as const)('%s: one line, and no file written', async (_, over, hub, message) => {
    const file = join(dir, `never-${Math.random()}.kubeconfig`);
    await expect(
      runGetKubeconfig(
        flags({ staticTokenEnv: 'MY_TOKEN', outputFile: file, ...(over as Partial<GetKubeconfigFlags>) }),
        () => {},
        proxyOnly(hub),
      ),
    ).rejects.toThrow(new Error(message));
    expect(existsSync(file)).toBe(false);
  });

  it('no authenticator at all says what to do', async () => {
    const none = { customObjects: { listClusterCustomObject: () => Promise.resolve({ items: [] }) } };
    await expect(
      getKubeconfig(flags({ staticTokenEnv: 'MY_TOKEN' }), () => {}, none as unknown as KubeClients),
    ).rejects.toThrow(
      'no JWTAuthenticator or WebhookAuthenticator on the cluster: create one first (see the README), or check --kubeconfig, --context and --group-suffix',
    );
  });

  it('a context the admin kubeconfig does not have, with the ones it has', async () => {
    const admin = join(dir, 'admin.kubeconfig');
    writeFileSync(
      admin,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }],
        users: [{ name: 'u', user: { token: 't' } }],
        contexts: [
          { name: 'prod-admin', context: { cluster: 'c', user: 'u' } },
          { name: 'dev-admin', context: { cluster: 'c', user: 'u' } },
        ],
        'current-context': 'prod-admin',
      }),
    );
    await expect(
      getKubeconfig(flags({ staticTokenEnv: 'MY_TOKEN', kubeconfig: admin, context: 'nope' }), () => {}),
    ).rejects.toThrow(
      new Error('--context: the kubeconfig has no context "nope"; known: "prod-admin", "dev-admin"'),
    );
  });

  it('says when the cluster exists but its agent is not connected, and writes it', async () => {
    const said: string[] = [];
    const yaml = await getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN', cluster: 'edge-2' }),
      (l) => said.push(l),
      proxyOnly({ clusters: [{ name: 'edge-2', connected: false }] }),
    );
    expect(said).toEqual([
      'note: cluster edge-2 is not connected now; the kubeconfig works once its agent is',
    ]);
    expect(written(yaml).servers).toEqual([`${PROXY.endpoint}/clusters/edge-2`]);
  });
});

describe("contexts: the server's address, then the cluster's name as everywhere else", () => {
  it.each([
    ['the hub, by its default name', {}, {}, ['proxy.example.com/hub'], [PROXY.endpoint]],
    [
      'the hub, by the name its concierge gives it',
      {},
      { hubName: 'prod' },
      ['proxy.example.com/prod'],
      [PROXY.endpoint],
    ],
    [
      "--cluster with the hub's name is the hub",
      { cluster: 'prod' },
      { hubName: 'prod' },
      ['proxy.example.com/prod'],
      [PROXY.endpoint],
    ],
    [
      'an agent-backed cluster',
      { cluster: 'edge-1' },
      {},
      ['proxy.example.com/edge-1'],
      [`${PROXY.endpoint}/clusters/edge-1`],
    ],
    [
      'every cluster: the hub first and current, a Cluster named as the hub left out',
      { allClusters: true },
      {
        hubName: 'prod',
        clusters: [
          { name: 'prod', connected: true },
          { name: 'edge-1', connected: true },
          { name: 'edge-2', connected: false },
        ],
      },
      ['proxy.example.com/prod', 'proxy.example.com/edge-1'],
      [PROXY.endpoint, `${PROXY.endpoint}/clusters/edge-1`],
    ],
  ] as const)('%s', async (_, over, hub, contexts, servers) => {
    const said: string[] = [];
    const yaml = await getKubeconfig(
      flags({ staticTokenEnv: 'MY_TOKEN', ...(over as Partial<GetKubeconfigFlags>) }),
      (l) => said.push(l),
      clientsWith([proxyOk], hub as Parameters<typeof clientsWith>[1]),
    );
    const config = parse(yaml) as {
      'current-context': string;
      users: { name: string }[];
      contexts: { context: { user: string } }[];
    };
    expect(written(yaml).contexts).toEqual(contexts);
    expect(written(yaml).servers).toEqual(servers);
    expect(config['current-context']).toBe(contexts[0]);
    expect(config.users.map((u) => u.name)).toEqual(['proxy.example.com/webhook/hooks']);
    expect(new Set(config.contexts.map((c) => c.context.user))).toEqual(
      new Set(['proxy.example.com/webhook/hooks']),
    );
    if ('allClusters' in over)
      expect(said).toEqual([
        "left out: cluster prod, which has the hub's own name",
        'left out, not connected now: edge-2',
      ]);
  });

  it("two hubs' kubeconfigs merged keep every context apart", async () => {
    const other = {
      ...proxyOk,
      impersonationProxyConfig: { ...PROXY, endpoint: 'https://proxy.other.example:8443' },
    };
    const names = [
      ...written(
        await getKubeconfig(
          flags({ staticTokenEnv: 'T', allClusters: true }),
          () => {},
          clientsWith([proxyOk]),
        ),
      ).contexts,
      ...written(
        await getKubeconfig(
          flags({ staticTokenEnv: 'T', allClusters: true }),
          () => {},
          clientsWith([other]),
        ),
      ).contexts,
    ];
    expect(names).toEqual([
      'proxy.example.com/hub',
      'proxy.example.com/edge-1',
      'proxy.example.com/edge-2',
      'proxy.other.example:8443/hub',
      'proxy.other.example:8443/edge-1',
      'proxy.other.example:8443/edge-2',
    ]);
  });
});

describe('sealion get kubeconfig -o FORMAT and --output-file', () => {
  const clients = (): KubeClients => clientsWith([proxyOk]);
  /** What runGetKubeconfig wrote to standard output, and said. */
  async function run(over: Partial<GetKubeconfigFlags>): Promise<{ stdout: string; said: string[] }> {
    const said: string[] = [];
    let stdout = '';
    const write = jest.spyOn(process.stdout, 'write').mockImplementation((chunk) => {
      stdout += String(chunk);
      return true;
    });
    try {
      await runGetKubeconfig(flags({ staticTokenEnv: 'MY_TOKEN', ...over }), (l) => said.push(l), clients());
    } finally {
      write.mockRestore();
    }
    return { stdout, said };
  }

  it('yaml by default and on request, json on request, the same kubeconfig', async () => {
    const yaml = await run({});
    expect(yaml.stdout.startsWith('apiVersion: v1\n')).toBe(true);
    expect((await run({ output: 'yaml' })).stdout).toBe(yaml.stdout);
    const json = await run({ output: 'json' });
    expect(JSON.parse(json.stdout)).toEqual(parse(yaml.stdout));
    expect(json.said).toEqual([]);
  });

  it('--output-file writes the file (0600), in either format, and nothing to standard output', async () => {
    const file = join(dir, 'out.kubeconfig');
    const { stdout } = await run({ output: 'json', outputFile: file });
    expect(stdout).toBe('');
    expect((JSON.parse(readFileSync(file, 'utf8')) as { kind: string }).kind).toBe('Config');
    expect(statSync(file).mode & 0o777).toBe(0o600);
  });

  it('-o FILE, the older spelling, still writes the file, with a one-line deprecation', async () => {
    const file = join(dir, 'legacy.kubeconfig');
    const { stdout, said } = await run({ output: file });
    expect(stdout).toBe('');
    expect(parse(readFileSync(file, 'utf8'))).toMatchObject({ kind: 'Config' });
    expect(said).toEqual([
      `warning: -o FILE is deprecated and goes in the next release: write --output-file ${file} (-o takes json or yaml)`,
    ]);
  });

  it('refuses -o FILE with --output-file, and says why a file cannot be written', async () => {
    await expect(run({ output: 'x.yaml', outputFile: 'y.yaml' })).rejects.toThrow(
      new Error('-o takes json or yaml, not "x.yaml"; give the file with --output-file'),
    );
    const nowhere = join(dir, 'no-such-folder', 'me.kubeconfig');
    // The exact message (the Node error stays its cause).
    await expect(run({ outputFile: nowhere })).rejects.toMatchObject({
      message: `cannot write the kubeconfig to ${nowhere}: its folder does not exist; give another --output-file`,
    });
    await expect(run({ outputFile: dir })).rejects.toMatchObject({
      message: `cannot write the kubeconfig to ${dir}: it is a folder; give another --output-file`,
    });
  });
});
