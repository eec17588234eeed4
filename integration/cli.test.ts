// The user's path with the real CLI and real kubectl: `sealion get kubeconfig` from the admin's kubeconfig, then
// kubectl through the proxy with the `sealion login static` exec plugin. Then the same as a kubectl plugin: the
// standalone executable (dev/build-cli.ts, reused while it is newer than its sources) run as `kubectl sealion`, its
// completion asked through kubectl, and installed with krew from the manifest and archive the build writes.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile, type ChildProcess } from 'node:child_process';
import {
  copyFileSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { parse } from 'yaml';
import { completionScript } from '../cli/completion.ts';
import { ensureKrew, REPO_ROOT } from '../dev/build.ts';
import { ensureCli, writeArchive, type BuiltCli, type Target } from '../dev/build-cli.ts';
import { runWithLogin, type LoginRun } from '../dev/browser.ts';
import { runKubectl, startCluster, type Cluster } from '../dev/cluster.ts';
import {
  applyJWTAuthenticator,
  startControlledConcierge,
  type ControlledConcierge,
} from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { runSealion, stopChild } from '../dev/processes.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const NS = 'sealion-concierge';
const USER = 'carol@example.com';
const GROUP = 'cli-readers';

let cluster: Cluster;
let issuer: TestIssuer;
let concierge: ControlledConcierge;
let dir: string;
/** kubectl processes still running: one waiting for a login that never comes is stopped after the tests. */
const kubectls = new Set<ChildProcess>();

/**
 * Runs kubectl as a person does, on a terminal (kubectl tells its login plugin that someone can answer) and, when the
 * plugin prints a login URL, logs in there with the scripted browser.
 */
function kubectlWithBrowser(kubeconfig: string, args: string[], env: NodeJS.ProcessEnv): Promise<LoginRun> {
  return runWithLogin(cluster.binaries.kubectl, [`--kubeconfig=${kubeconfig}`, ...args], {
    caPem: issuer.caPem,
    env,
    terminal: true,
    track: (child) => {
      kubectls.add(child);
      child.once('exit', () => kubectls.delete(child));
    },
  });
}

/** The proxy's configuration: enabled. No load balancer here: the proxy is published at its own address. */
const enabledConfig = (): string =>
  `impersonationProxy: {mode: enabled, endpoint: "127.0.0.1:${concierge.port}", service: {type: None}}`;

/** Replaces the proxy's configuration in its ConfigMap. */
const setProxyConfig = (yaml: string): ReturnType<Cluster['kubectl']> =>
  cluster.kubectl([
    'patch',
    'configmap',
    'config',
    '-n',
    NS,
    '--type=merge',
    '-p',
    JSON.stringify({ data: { 'config.yaml': yaml } }),
  ]);

beforeAll(async () => {
  cluster = await startCluster({ name: 'cli', controllerManager: false });
  // The audience is the CLI's client ID: the ID tokens the CLI logs in for are what the authenticator checks.
  issuer = await startOIDCIssuer({ audience: 'sealion-cli', login: { username: USER, groups: [GROUP] } });
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
  await cluster.kubectl([
    'create',
    'configmap',
    'config',
    '-n',
    NS,
    `--from-literal=config.yaml=${enabledConfig()}`,
  ]);
  await applyJWTAuthenticator(cluster, 'corp', issuer, 'sealion-cli');
  // Every test starts once the authenticator's status says where the proxy is.
  await eventually(async () => {
    expect(await writeStaticKubeconfig(join(dir, 'ready.kubeconfig'), false)).toMatchObject({ code: 0 });
  }, 30_000);
});

afterAll(async () => {
  await Promise.all([...kubectls].map((child) => stopChild(child, { group: true })));
  await concierge?.stop();
  await issuer?.stop();
  await cluster?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/**
 * A token for the user, minted for the test that uses it. No token is shared between tests: one test rotates the
 * issuer's signing key and stops publishing the old one, after which a token signed before it passed at the proxy only
 * while the proxy still kept its answer for it (lib/authn/jwt.ts VERIFIED_TOKEN_TTL_MS, a minute from when it was
 * checked), so a later test that used it passed or got 401 by how long the tests and builds between them took. A
 * token minted in the test is also nowhere near its 5-minute lifetime.
 */
const userToken = (): Promise<string> => issuer.mint({ username: USER, groups: [GROUP] });

/**
 * Writes a kubeconfig whose plugin reads the user's token from SEALION_TEST_TOKEN (`sealion login static`) and, with
 * `exchange`, trades it for a certificate, to `path` (or standard output); the result of `sealion get kubeconfig`.
 */
function writeStaticKubeconfig(path: string | undefined, exchange: boolean): ReturnType<typeof runSealion> {
  return runSealion([
    'get',
    'kubeconfig',
    '--kubeconfig',
    cluster.kubeconfigPath,
    '--static-token-env',
    'SEALION_TEST_TOKEN',
    ...(exchange ? ['--exchange-credential'] : []),
    ...(path === undefined ? [] : ['--output-file', path]),
  ]);
}

/** A kubeconfig written for this test, with the token exchange: its path. */
async function exchangingKubeconfig(name: string): Promise<string> {
  const path = join(dir, `${name}.kubeconfig`);
  expect(await writeStaticKubeconfig(path, true)).toMatchObject({ code: 0 });
  return path;
}

// Each test writes the kubeconfigs and credential caches it uses; the cluster, the issuer and the concierge are shared.
describe('sealion get kubeconfig and sealion login static with real kubectl', () => {
  it('writes a kubeconfig from the authenticator’s status that kubectl uses as the user', async () => {
    const kubeconfig = join(dir, 'user.kubeconfig');
    const written = await writeStaticKubeconfig(kubeconfig, true);
    expect(written).toMatchObject({ code: 0 });
    // The admin sees the same endpoint the kubeconfig points at.
    const server = /server: (\S+)/.exec(readFileSync(kubeconfig, 'utf8'))?.[1];
    expect(server).toBe(`https://127.0.0.1:${concierge.port}`);
    expect((await cluster.kubectl(['get', 'jwtauthenticators'])).stdout).toContain(server);
    const home = mkdtempSync(join(tmpdir(), 'sealion-cli-user-'));
    const env = { SEALION_TEST_TOKEN: await userToken(), XDG_CONFIG_HOME: home };
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
    const mine = await runSealion(['whoami', '--kubeconfig', kubeconfig], env);
    expect(mine).toMatchObject({ code: 0, stderr: '' });
    expect(mine.stdout).toMatch(new RegExp(`^ATTRIBUTE +VALUE\nContext +127\\.0\\.0\\.1:\\d+/hub\n`));
    expect(mine.stdout).toMatch(new RegExp(`\nUsername +${USER}\n`));
    expect(mine.stdout).toMatch(new RegExp(`\nGroups +.*${GROUP}.*system:authenticated`));
    // The exchanged certificate's expiry.
    expect(mine.stdout).toMatch(/\nExpires +\d{4}-\d\d-\d\dT\S+Z \(in \d+[sm]\)\n$/);
    // The exchanged certificate is cached for the next kubectl.
    expect(readdirSync(join(home, 'sealion', 'credentials')).some((f) => f.endsWith('.json'))).toBe(true);
    rmSync(home, { recursive: true, force: true });
  });

  it('gives kubectl a clean Unauthorized for a wrong token, with or without the exchange', async () => {
    const kubeconfig = await exchangingKubeconfig('wrong-token');
    const env = { SEALION_TEST_TOKEN: 'not-a-token', XDG_CONFIG_HOME: dir };
    const exchanged = await runKubectl(cluster.binaries.kubectl, kubeconfig, ['get', 'namespaces'], { env });
    expect(exchanged.code).not.toBe(0);
    // The plugin names the token and the authenticator that refused it, once however often kubectl runs it.
    const refused = `sealion: JWTAuthenticator corp refused the token in environment variable SEALION_TEST_TOKEN on https://127.0.0.1:${concierge.port}: authentication failed; check that it is current and meant for this cluster\n`;
    expect(exchanged.stderr.startsWith(refused)).toBe(true);
    expect(exchanged.stderr.split('sealion:')).toHaveLength(2);

    const bearerConfig = join(dir, 'bearer.kubeconfig');
    const written = await writeStaticKubeconfig(bearerConfig, false);
    expect(written.code).toBe(0);
    // kubectl shows the Status of a refused request only once it knows the server's API groups (a refused discovery
    // gets a message of its own): they are learnt first, with the right token, into a cache of this test's.
    const cache = ['--cache-dir', join(dir, 'wrong-token-cache')];
    const known = await runKubectl(cluster.binaries.kubectl, bearerConfig, [...cache, 'get', 'namespaces'], {
      env: { ...env, SEALION_TEST_TOKEN: await userToken() },
    });
    expect(known).toMatchObject({ code: 0 });
    const bearer = await runKubectl(cluster.binaries.kubectl, bearerConfig, [...cache, 'get', 'namespaces'], {
      env,
    });
    expect(bearer.code).not.toBe(0);
    expect(bearer.stderr).toContain('You must be logged in to the server (Unauthorized)');
    for (const result of [exchanged, bearer]) expect(result.stderr).not.toContain('not-a-token');
  });

  it('serves two kubectl processes at once from one exchange', async () => {
    const kubeconfig = await exchangingKubeconfig('two-at-once');
    const fresh = mkdtempSync(join(tmpdir(), 'sealion-cli-cache-'));
    const env = { SEALION_TEST_TOKEN: await userToken(), XDG_CONFIG_HOME: fresh };
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

  /** A kubeconfig whose plugin logs in with OIDC (extra flags for get kubeconfig), and a fresh credential cache. */
  async function oidcUser(name: string, extra: string[] = []): Promise<{ path: string; home: string }> {
    const path = join(dir, `${name}.kubeconfig`);
    const written = await runSealion([
      'get',
      'kubeconfig',
      '--kubeconfig',
      cluster.kubeconfigPath,
      '--oidc-skip-browser',
      ...extra,
      '--output-file',
      path,
    ]);
    expect(written).toMatchObject({ code: 0 });
    return { path, home: mkdtempSync(join(tmpdir(), `sealion-cli-${name}-`)) };
  }
  /** The one cached OIDC session of a credential cache, and a way to make it look about to expire. */
  function cachedSession(home: string): { idToken: string; refreshToken?: string; expire(): void } {
    const sessions = join(home, 'sealion', 'sessions');
    const file = join(
      sessions,
      readdirSync(sessions).find((f) => f.endsWith('.json'))!,
    );
    const session = JSON.parse(readFileSync(file, 'utf8')) as { idToken: string; refreshToken?: string };
    return {
      ...session,
      expire: () => writeFileSync(file, JSON.stringify({ ...session, idTokenExpiry: Date.now() })),
    };
  }
  const kidOf = (jwt: string): string =>
    (JSON.parse(Buffer.from(jwt.split('.')[0]!, 'base64url').toString()) as { kid: string }).kid;

  it('logs in with OIDC in the browser once, then reuses and refreshes the session without it', async () => {
    const { path, home } = await oidcUser('oidc');
    const env = { XDG_CONFIG_HOME: home };
    const before = issuer.grants();

    // The plugin prints the login URL; this test is the browser that follows it.
    const first = await kubectlWithBrowser(path, ['get', 'namespaces', '-o', 'name'], env);
    expect(first.browserError).toBeUndefined();
    expect(first.code).toBe(0);
    // Nothing but the login prompt: no errors, no retries.
    // The link is the CLI's own, local one: the authorization URL and its state are in no process's arguments.
    expect(first.stderr).toMatch(
      /^Log in to https:\/\/127\.0\.0\.1:\d+ in a browser:\n {2}http:\/\/127\.0\.0\.1:\d+\/login\/[\w-]+\n$/,
    );
    expect(first.browsed).toBe(true);
    expect(first.stdout).toContain(`namespace/${NS}`);
    expect(issuer.grants()).toEqual({ ...before, authorization_code: before.authorization_code + 1 });

    const second = await runKubectl(cluster.binaries.kubectl, path, ['auth', 'whoami', '-o', 'json'], {
      env,
    });
    expect(second).toMatchObject({ code: 0, stderr: '' });
    expect(second.stdout).toContain(USER);

    // An ID token about to expire is refreshed with the refresh token, without a browser.
    cachedSession(home).expire();
    const third = await runKubectl(cluster.binaries.kubectl, path, ['get', 'namespaces', '-o', 'name'], {
      env,
    });
    expect(third).toMatchObject({ code: 0, stderr: '' });
    expect(issuer.grants()).toEqual({
      ...before,
      authorization_code: before.authorization_code + 1,
      refresh_token: before.refresh_token + 1,
    });
    rmSync(home, { recursive: true, force: true });
  });

  it('logs in with the device grant on a machine without a browser', async () => {
    const { path, home } = await oidcUser('device', ['--oidc-device']);
    const before = issuer.grants().device_code;
    const got = await kubectlWithBrowser(path, ['get', 'namespaces', '-o', 'name'], {
      XDG_CONFIG_HOME: home,
    });
    expect(got.browserError).toBeUndefined();
    expect(got).toMatchObject({ code: 0, browsed: true });
    expect(got.stderr).toMatch(
      /^To log in to https:\S+, open https:\S+ on any device and enter the code \S+\n/,
    );
    expect(got.stdout).toContain(`namespace/${NS}`);
    expect(issuer.grants().device_code).toBe(before + 1);
    rmSync(home, { recursive: true, force: true });
  });

  it('fails at once without a terminal, saying what to run, and works once that ran', async () => {
    const { path, home } = await oidcUser('no-terminal');
    const env = { XDG_CONFIG_HOME: home };
    const before = issuer.grants();
    // kubectl's standard input is no terminal: it tells the plugin nobody can answer, and the plugin says so at once.
    const refused = await runKubectl(cluster.binaries.kubectl, path, ['get', 'namespaces', '-o', 'name'], {
      env,
    });
    expect(refused.code).not.toBe(0);
    const said =
      /^sealion: no session for context 127\.0\.0\.1:\d+\/hub and no terminal to log in; run: sealion (login oidc --issuer https:\/\/127\.0\.0\.1:\d+ --ca-bundle-data [\w+/=]+ --skip-browser)\n/.exec(
        refused.stderr,
      );
    expect(said).not.toBeNull();
    expect(refused.stderr.split('sealion:')).toHaveLength(2);
    expect(issuer.grants()).toEqual(before);

    // The command it printed logs in (a person at the browser), and kubectl then needs nobody.
    const login = await runWithLogin(
      process.execPath,
      [join(REPO_ROOT, 'cli/main.ts'), ...said![1]!.split(' ')],
      {
        caPem: issuer.caPem,
        env,
      },
    );
    expect(login.browserError).toBeUndefined();
    expect(login).toMatchObject({ code: 0, browsed: true });
    const after = await runKubectl(cluster.binaries.kubectl, path, ['get', 'namespaces', '-o', 'name'], {
      env,
    });
    expect(after).toMatchObject({ code: 0, stderr: '' });
    expect(after.stdout).toContain(`namespace/${NS}`);
    rmSync(home, { recursive: true, force: true });
  });

  it('follows a rotated signing key, and sends the user to the browser again only when the refresh token is revoked', async () => {
    const { path, home } = await oidcUser('rotation');
    const env = { XDG_CONFIG_HOME: home };
    expect(await kubectlWithBrowser(path, ['get', 'namespaces', '-o', 'name'], env)).toMatchObject({
      code: 0,
    });

    // The issuer signs with a new key and no longer publishes the old one: the refreshed token carries the new
    // kid, and the proxy fetches the new key set to check it.
    const key = await issuer.newKey();
    issuer.rotate(key, { dropOld: true });
    cachedSession(home).expire();
    const refreshed = await runKubectl(cluster.binaries.kubectl, path, ['get', 'namespaces', '-o', 'name'], {
      env,
    });
    expect(refreshed).toMatchObject({ code: 0, stderr: '' });
    expect(kidOf(cachedSession(home).idToken)).toBe(key.kid);

    // A revoked refresh token cannot renew the session: the plugin says so and logs in again in the browser.
    const session = cachedSession(home);
    await issuer.revoke(session.refreshToken!);
    session.expire();
    const again = await kubectlWithBrowser(path, ['get', 'namespaces', '-o', 'name'], env);
    expect(again.browserError).toBeUndefined();
    expect(again).toMatchObject({ code: 0, browsed: true });
    expect(again.stderr).toMatch(
      /^the session could not be refreshed \(.*invalid_grant.*\); logging in again\n/,
    );
    rmSync(home, { recursive: true, force: true });
  });

  it('says the login was refused when the user denies consent', async () => {
    const { path, home } = await oidcUser('denied');
    issuer.setConsent('deny');
    try {
      const got = await kubectlWithBrowser(path, ['get', 'namespaces'], { XDG_CONFIG_HOME: home });
      expect(got.code).not.toBe(0);
      expect(got.stderr).toContain('login: the login was refused at https://127.0.0.1:');
      expect(got.stderr).toContain('consent denied');
      expect(readdirSync(join(home, 'sealion', 'sessions')).filter((f) => f.endsWith('.json'))).toEqual([]);
    } finally {
      issuer.setConsent('grant');
      rmSync(home, { recursive: true, force: true });
    }
  });

  it('explains why there is no kubeconfig to write while the proxy is disabled', async () => {
    const patched = await setProxyConfig('impersonationProxy: {mode: disabled}');
    expect(patched.code).toBe(0);
    try {
      await eventually(async () => {
        const answer = await writeStaticKubeconfig(undefined, false);
        expect(answer.code).not.toBe(0);
        expect(answer.stderr).toMatch(
          /the impersonation proxy is NotAvailable \(Disabled\): .*disabled by configuration/,
        );
      }, 30_000);
    } finally {
      // Enabled again for the tests that may run after this one.
      await setProxyConfig(enabledConfig());
      await eventually(async () => {
        expect(await writeStaticKubeconfig(join(dir, 'enabled-again.kubeconfig'), false)).toMatchObject({
          code: 0,
        });
      }, 30_000);
    }
  });
});

describe('the standalone executable as a kubectl plugin', () => {
  const host = `${process.platform}-${process.arch}` as Target;
  const run = promisify(execFile);
  let built: BuiltCli;
  let krew: string;
  let home: string;
  /** kubectl, and the executable as kubectl-sealion (and kubectl_complete-sealion, for kubectl's completion). */
  let plugins: string;

  beforeAll(async () => {
    built = await ensureCli([host]);
    krew = await ensureKrew();
    home = mkdtempSync(join(tmpdir(), 'sealion-plugin-'));
    plugins = join(home, 'plugins');
    mkdirSync(plugins);
    copyFileSync(built.executables[host]!, join(plugins, 'kubectl-sealion'));
    symlinkSync(join(plugins, 'kubectl-sealion'), join(plugins, 'kubectl_complete-sealion'));
    symlinkSync(cluster.binaries.kubectl, join(plugins, 'kubectl'));
  }, 300_000);

  afterAll(() => rmSync(home, { recursive: true, force: true }));

  /** Runs kubectl with nothing on PATH but `path` (and /bin, for krew's own needs), HOME in the test's folder. */
  const kubectl = (
    args: string[],
    path: string[],
    env: NodeJS.ProcessEnv = {},
  ): Promise<{ stdout: string }> =>
    run('kubectl', args, {
      env: { HOME: home, PATH: [...path, '/usr/bin', '/bin'].join(':'), ...env },
      timeout: 60_000,
    });

  /** `kubectl sealion get kubeconfig` for the static token, with kubectl finding the plugin on `path`. */
  const pluginKubeconfig = async (name: string, path: string[]): Promise<string> => {
    const kubeconfig = join(home, name);
    const args = ['get', 'kubeconfig', '--kubeconfig', cluster.kubeconfigPath, '--static-token-env'];
    await kubectl(['sealion', ...args, 'SEALION_TEST_TOKEN', '--output-file', kubeconfig], path);
    return kubeconfig;
  };

  it('runs as `kubectl sealion`: its help says so, and the kubeconfig it writes runs kubectl-sealion', async () => {
    const { stdout: help } = await kubectl(['sealion', '--help'], [plugins]);
    expect(help).toContain('Usage: kubectl sealion [options] [command]');
    const kubeconfig = await pluginKubeconfig('plugin-user.kubeconfig', [plugins]);
    // The plugin's name, found through PATH as kubectl finds it: krew's link keeps that name across upgrades.
    const written = parse(readFileSync(kubeconfig, 'utf8')) as {
      users: { user: { exec: { command: string; args: string[] } } }[];
    };
    expect(written.users[0]!.user.exec.command).toBe('kubectl-sealion');
    expect(written.users[0]!.user.exec.args.slice(0, 2)).toEqual(['login', 'static']);
    const env = { SEALION_TEST_TOKEN: await userToken(), XDG_CONFIG_HOME: home };
    const { stdout } = await kubectl(['sealion', 'whoami', '--kubeconfig', kubeconfig], [plugins], env);
    expect(stdout).toMatch(new RegExp(`\nUsername +${USER}\n`));
    const { stdout: namespaces } = await kubectl(
      [`--kubeconfig=${kubeconfig}`, 'get', 'namespaces', '-o', 'name'],
      [plugins],
      env,
    );
    expect(namespaces).toContain(`namespace/${NS}`);
  });

  it("completes names from the API server, through kubectl's plugin completion and in bash", async () => {
    const made = await cluster.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name: 'edge-completed' },
        spec: {},
      }),
    });
    expect(made.code).toBe(0);
    const admin = ['--kubeconfig', cluster.kubeconfigPath];
    const ask = async (words: string[]): Promise<string[]> =>
      (await kubectl(['__complete', 'sealion', ...words], [plugins])).stdout.split('\n');
    expect(await ask(['get', 'kubeconfig', ...admin, '--authenticator-name', ''])).toContain(
      'corp\tJWTAuthenticator',
    );
    expect(await ask(['cluster', 'remove', ...admin, 'edge-'])).toContain('edge-completed\tnot connected');

    // The bash script, with kubectl-sealion as the command on the line.
    const script = join(home, 'kubectl-sealion.bash');
    writeFileSync(script, completionScript('bash', 'kubectl-sealion'));
    const words = ['kubectl-sealion', 'cluster', 'revoke', ...admin, 'edge-c'];
    const { stdout } = await run(
      'bash',
      [
        '--norc',
        '--noprofile',
        '-c',
        `source ${script}; COMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length - 1}; ` +
          '_kubectl_sealion_complete; printf "%s\\n" "${COMPREPLY[@]}"',
      ],
      { env: { HOME: home, PATH: `${plugins}:/usr/bin:/bin` }, timeout: 30_000 },
    );
    expect(stdout.trim()).toBe('edge-completed');
  });

  it('installs with krew from the manifest and archive the build wrote', async () => {
    // The archive is the same bytes when made again from the same executable.
    const again = join(home, 'again.tar.gz');
    await writeArchive(built.executables[host]!, again);
    expect(readFileSync(again).equals(readFileSync(built.archives[host]!))).toBe(true);

    const krewBin = join(home, 'krew-bin');
    mkdirSync(krewBin);
    symlinkSync(krew, join(krewBin, 'kubectl-krew'));
    symlinkSync(cluster.binaries.kubectl, join(krewBin, 'kubectl'));
    const root = join(home, 'krew-root');
    const { stdout, stderr } = await run(
      'kubectl',
      ['krew', 'install', `--manifest=${built.krewManifest}`, `--archive=${built.archives[host]!}`],
      {
        env: { HOME: home, KREW_ROOT: root, PATH: `${krewBin}:/usr/bin:/bin` },
        timeout: 120_000,
      },
    );
    expect(`${stdout}${stderr}`).toContain('Installed plugin: sealion');
    // What krew put on its PATH is a plugin kubectl runs.
    const path = [join(root, 'bin'), krewBin];
    const { stdout: list } = await kubectl(['plugin', 'list'], path);
    expect(list).toContain(join(root, 'bin', 'kubectl-sealion'));
    const kubeconfig = await pluginKubeconfig('krew-user.kubeconfig', path);
    const { stdout: me } = await kubectl(['sealion', 'whoami', '--kubeconfig', kubeconfig], path, {
      SEALION_TEST_TOKEN: await userToken(),
      XDG_CONFIG_HOME: home,
    });
    expect(me).toMatch(new RegExp(`\nUsername +${USER}\n`));
  }, 180_000);
});
