// Tokens stay out of the process list: the kubeconfig `sealion get kubeconfig` writes names where the token is,
// never the token, and the plugin reads it from there.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { chmodSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse } from 'yaml';
import type { KubeClients } from '../lib/kube/kube.ts';
import { getKubeconfig, type GetKubeconfigFlags } from './get-kubeconfig.ts';
import { readTokenFile, staticLogin, type StaticLoginFlags } from './login.ts';

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
    ).rejects.toThrow(/ENOENT/);
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
