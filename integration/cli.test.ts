// The user's path with the real CLI and real kubectl: `sealion get kubeconfig` from the admin's kubeconfig, then
// kubectl through the proxy with the `sealion login static` exec plugin.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { REPO_ROOT } from './harness/build.ts';
import { runKubectl, startCluster, type Cluster } from './harness/cluster.ts';
import {
  applyJWTAuthenticator,
  startControlledConcierge,
  type ControlledConcierge,
} from './harness/concierge.ts';
import { eventually } from './harness/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from './harness/oidc-issuer.ts';

const NS = 'sealion-concierge';
const USER = 'carol@example.com';
const GROUP = 'cli-readers';

let cluster: Cluster;
let issuer: TestIssuer;
let concierge: ControlledConcierge;
let dir: string;
let token: string;

/** Runs the sealion CLI with the Node running the tests (Node 24), as kubectl runs the exec plugin. */
function sealion(
  args: string[],
  env: NodeJS.ProcessEnv = {},
): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((done) => {
    execFile(
      process.execPath,
      [join(REPO_ROOT, 'cli/main.ts'), ...args],
      { env: { ...process.env, ...env } },
      (err, stdout, stderr) =>
        done({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
  });
}

beforeAll(async () => {
  cluster = await startCluster({ name: 'cli', controllerManager: false });
  issuer = await startOIDCIssuer({ audience: 'sealion-cli' });
  dir = mkdtempSync(join(tmpdir(), 'sealion-cli-'));
  for (const args of [
    ['create', 'namespace', NS],
    ['create', 'clusterrole', 'ns-reader', '--verb=get,list', '--resource=namespaces'],
    ['create', 'clusterrolebinding', 'cli-readers', '--clusterrole=ns-reader', `--group=${GROUP}`],
  ]) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  concierge = await startControlledConcierge(cluster, {
    namespace: NS,
    configMap: 'config',
    identity: 'cli',
  });
  // No load balancer here: the proxy is published at its own address.
  await cluster.kubectl([
    'create',
    'configmap',
    'config',
    '-n',
    NS,
    `--from-literal=config.yaml=impersonationProxy: {mode: enabled, endpoint: "127.0.0.1:${concierge.port}", service: {type: None}}`,
  ]);
  await applyJWTAuthenticator(cluster, 'corp', issuer, 'sealion-cli');
  token = await issuer.mint({ username: USER, groups: [GROUP] });
});

afterAll(async () => {
  await concierge?.stop();
  await issuer?.stop();
  await cluster?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('sealion get kubeconfig and sealion login static with real kubectl', () => {
  let kubeconfig: string;

  it('writes a kubeconfig from the authenticator’s status that kubectl uses as the user', async () => {
    const written = await sealion([
      'get',
      'kubeconfig',
      '--kubeconfig',
      cluster.kubeconfigPath,
      '--static-token-env',
      'SEALION_TEST_TOKEN',
      '--exchange-credential',
      '-o',
      join(dir, 'user.kubeconfig'),
    ]);
    expect(written).toMatchObject({ code: 0 });
    kubeconfig = join(dir, 'user.kubeconfig');
    const env = { SEALION_TEST_TOKEN: token, XDG_CONFIG_HOME: dir };
    const list = await runKubectl(cluster.binaries.kubectl, kubeconfig, ['get', 'namespaces', '-o', 'name'], {
      env,
    });
    expect(list).toMatchObject({ code: 0, stderr: '' });
    expect(list.stdout).toContain(`namespace/${NS}`);

    const denied = await runKubectl(cluster.binaries.kubectl, kubeconfig, ['create', 'namespace', 'nope'], {
      env,
    });
    expect(denied.code).not.toBe(0);
    expect(denied.stderr).toContain(`is forbidden: User "${USER}" cannot create resource "namespaces"`);

    const whoami = await runKubectl(cluster.binaries.kubectl, kubeconfig, ['auth', 'whoami', '-o', 'json'], {
      env,
    });
    const info = (
      JSON.parse(whoami.stdout) as { status: { userInfo: { username: string; groups: string[] } } }
    ).status.userInfo;
    expect(info.username).toBe(USER);
    expect(info.groups).toEqual(expect.arrayContaining([GROUP, 'system:authenticated']));
    const mine = await sealion(['whoami', '--kubeconfig', kubeconfig], env);
    expect(mine).toMatchObject({ code: 0, stderr: '' });
    expect(mine.stdout).toContain(`Username: ${USER}`);
    expect(mine.stdout).toMatch(new RegExp(`Groups: .*${GROUP}.*system:authenticated`));
    // The exchanged certificate is cached for the next kubectl.
    expect(readdirSync(join(dir, 'sealion', 'credentials')).some((f) => f.endsWith('.json'))).toBe(true);
  });

  it('gives kubectl a clean Unauthorized for a wrong token, with or without the exchange', async () => {
    const env = { SEALION_TEST_TOKEN: 'not-a-token', XDG_CONFIG_HOME: dir };
    const exchanged = await runKubectl(cluster.binaries.kubectl, kubeconfig, ['get', 'namespaces'], { env });
    expect(exchanged.code).not.toBe(0);
    expect(exchanged.stderr).toContain('exchange token: authentication failed');

    const bearerConfig = join(dir, 'bearer.kubeconfig');
    const written = await sealion([
      'get',
      'kubeconfig',
      '--kubeconfig',
      cluster.kubeconfigPath,
      '--static-token-env',
      'SEALION_TEST_TOKEN',
      '-o',
      bearerConfig,
    ]);
    expect(written.code).toBe(0);
    const bearer = await runKubectl(cluster.binaries.kubectl, bearerConfig, ['get', 'namespaces'], { env });
    expect(bearer.code).not.toBe(0);
    expect(bearer.stderr).toContain('You must be logged in to the server (Unauthorized)');
    for (const result of [exchanged, bearer]) expect(result.stderr).not.toContain('not-a-token');
  });

  it('serves two kubectl processes at once from one exchange', async () => {
    const fresh = mkdtempSync(join(tmpdir(), 'sealion-cli-cache-'));
    const env = { SEALION_TEST_TOKEN: token, XDG_CONFIG_HOME: fresh };
    const both = await Promise.all(
      [1, 2].map(() =>
        runKubectl(cluster.binaries.kubectl, kubeconfig, ['get', 'namespaces', '-o', 'name'], { env }),
      ),
    );
    for (const result of both) expect(result).toMatchObject({ code: 0, stderr: '' });
    expect(
      readdirSync(join(fresh, 'sealion', 'credentials')).filter((f) => f.endsWith('.json')),
    ).toHaveLength(1);
    rmSync(fresh, { recursive: true, force: true });
  });

  it('explains why there is no kubeconfig to write while the proxy is disabled', async () => {
    const patched = await cluster.kubectl([
      'patch',
      'configmap',
      'config',
      '-n',
      NS,
      '--type=merge',
      '-p',
      JSON.stringify({ data: { 'config.yaml': 'impersonationProxy: {mode: disabled}' } }),
    ]);
    expect(patched.code).toBe(0);
    await eventually(async () => {
      const answer = await sealion([
        'get',
        'kubeconfig',
        '--kubeconfig',
        cluster.kubeconfigPath,
        '--static-token',
        'x',
      ]);
      expect(answer.code).not.toBe(0);
      expect(answer.stderr).toMatch(
        /the impersonation proxy is NotAvailable \(Disabled\): .*disabled by configuration/,
      );
    }, 30_000);
  });
});
