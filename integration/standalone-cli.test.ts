// The CLI without a checkout, as a user gets it (dev/build-cli.ts): the standalone executable for this machine, and
// the npm package installed from its tarball. Each runs from a folder outside the checkout, with HOME elsewhere and
// a PATH that holds no Node (the executable's) or only Node itself (the package's), so nothing of the checkout can
// stand in for what the artifact lacks. A build is reused while it is newer than its sources.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { stringify } from 'yaml';
import { REPO_ROOT } from '../dev/build.ts';
import { ensureCli, type BuiltCli, type Target } from '../dev/build-cli.ts';
import { describeCheckout, SEALION_VERSION } from '../lib/version.ts';
import { CURRENT_PROTOCOL, formatProtocol, supportedRange } from '../lib/tunnel/protocol.ts';

const run = promisify(execFile);
const host = `${process.platform}-${process.arch}` as Target;

let built: BuiltCli;
let dir: string;

beforeAll(async () => {
  built = await ensureCli([host]);
  dir = mkdtempSync(join(tmpdir(), 'sealion-standalone-'));
  mkdirSync(join(dir, 'home'));
  mkdirSync(join(dir, 'work'));
}, 300_000);

afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** Runs `command` in a folder outside the checkout, with HOME there too and nothing but `path` on PATH. */
function runOutside(
  command: string,
  args: string[],
  path: string,
): Promise<{ stdout: string; stderr: string }> {
  return run(command, args, {
    cwd: join(dir, 'work'),
    env: { HOME: join(dir, 'home'), PATH: path },
    timeout: 60_000,
  });
}

function expectExecCredential(stdout: string, token: string): void {
  expect(JSON.parse(stdout)).toEqual({
    apiVersion: 'client.authentication.k8s.io/v1',
    kind: 'ExecCredential',
    status: { token },
  });
}

describe(`the standalone executable (sealion-${host})`, () => {
  let sealion: string;

  beforeAll(() => {
    // A copy on its own, as downloaded: nothing beside it.
    const bin = join(dir, 'bin');
    mkdirSync(bin, { recursive: true });
    sealion = join(bin, 'sealion');
    copyFileSync(built.executables[host]!, sealion);
  });

  it('answers --help with every subcommand', async () => {
    const { stdout } = await runOutside(sealion, ['--help'], join(dir, 'bin'));
    expect(stdout).toContain('Usage: sealion');
    for (const command of [
      'login',
      'get',
      'whoami',
      'clusters',
      'manifests',
      'cluster',
      'concierge',
      'agent',
      'version',
      'completion',
    ])
      expect(stdout).toContain(command);
  });

  it('prints an ExecCredential for a static token, and nothing else', async () => {
    const { stdout, stderr } = await runOutside(
      sealion,
      ['login', 'static', '--token', 't0k3n'],
      join(dir, 'bin'),
    );
    expectExecCredential(stdout, 't0k3n');
    // No warning (Node's experimental-feature one, say) on the stream kubectl shows the user.
    expect(stderr).toBe('');
  });

  it("prints none of Node's warnings, and its own errors as before", async () => {
    // Commands that load a Node module by import() (the values file's reader; the kubeconfig's exec plugin runner),
    // which the executable's main script answers through an experimental vm option: Node warned of it on each.
    const values = join(dir, 'values.yaml');
    writeFileSync(values, '{}\n');
    const rendered = await runOutside(sealion, ['manifests', '--values', values], join(dir, 'bin'));
    expect(rendered.stdout).toContain('kind: Deployment');
    expect(rendered.stderr).toBe('');
    const kubeconfig = join(dir, 'exec-plugin.kubeconfig');
    writeFileSync(
      kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:1' } }],
        users: [
          { name: 'u', user: { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: 'true' } } },
        ],
        contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'c',
      }),
    );
    const failed = await runOutside(sealion, ['whoami', '--kubeconfig', kubeconfig], '/usr/bin:/bin').then(
      () => ({ code: 0, stderr: '' }),
      (err: { code: number; stderr: string }) => ({ code: err.code, stderr: err.stderr }),
    );
    // One line: the command's error, nothing of Node's before it.
    expect(failed).toEqual({ code: 1, stderr: expect.stringMatching(/^sealion: [^\n]+\n$/) });
  });

  it('knows its version and the commit it was built from, with no git to ask', async () => {
    const { stdout } = await runOutside(sealion, ['version', '--client', '-o', 'json'], join(dir, 'bin'));
    const checkout = await describeCheckout(REPO_ROOT);
    expect(JSON.parse(stdout)).toEqual({
      clientVersion: {
        version: SEALION_VERSION,
        ...(checkout ? { gitCommit: checkout.commit } : {}),
        gitTreeState: checkout?.treeState ?? 'unknown',
        nodeVersion: `v${process.versions.node}`,
        platform: `${process.platform}/${process.arch}`,
        standalone: true,
        tunnelProtocol: `${formatProtocol(CURRENT_PROTOCOL)} (${supportedRange(CURRENT_PROTOCOL)})`,
      },
    });
    expect((await runOutside(sealion, ['--version'], join(dir, 'bin'))).stdout).toBe(`${SEALION_VERSION}\n`);
  });

  it('carries the CRD schemas it renders manifests from', async () => {
    const { stdout } = await runOutside(sealion, ['manifests', 'crds'], join(dir, 'bin'));
    expect(stdout).toContain('name: jwtauthenticators.authentication.concierge.sealion.dev');
    expect(stdout).toContain('openAPIV3Schema:');
  });
});

describe('the npm package, installed from its tarball', () => {
  let prefix: string;

  beforeAll(async () => {
    // A global install into a prefix of its own: the package has no dependencies, so npm needs no registry.
    prefix = join(dir, 'npm-prefix');
    await run(
      'npm',
      ['install', '--global', '--prefix', prefix, '--offline', '--no-audit', '--no-fund', built.tarball],
      { env: { ...process.env, npm_config_cache: join(dir, 'npm-cache') }, timeout: 120_000 },
    );
  }, 180_000);

  it('runs as `sealion` from PATH with the Node beside it', async () => {
    const path = [join(prefix, 'bin'), dirname(process.execPath)].join(':');
    const { stdout } = await runOutside('sealion', ['login', 'static', '--token', 'from-npm'], path);
    expectExecCredential(stdout, 'from-npm');
  });
});
