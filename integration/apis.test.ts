// The CRDs and install manifests on a real API server, driven with the real kubectl.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { REPO_ROOT } from '../dev/build.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';

const run = promisify(execFile);
const GROUP = 'authentication.concierge.sealion.dev';

function jwtAuthenticator(name: string, spec: Record<string, unknown>): string {
  return JSON.stringify({
    apiVersion: `${GROUP}/v1alpha1`,
    kind: 'JWTAuthenticator',
    metadata: { name },
    spec,
  });
}

describe('CRDs and install manifests on a real API server', () => {
  let cluster: Cluster;
  let scratch: string;

  beforeAll(async () => {
    cluster = await startCluster({ name: 'apis', controllerManager: false });
    scratch = mkdtempSync(join(tmpdir(), 'sealion-manifests-'));
  });

  afterAll(async () => {
    await cluster?.stop();
    rmSync(scratch, { recursive: true, force: true });
  });

  const kubectl = (args: string[], input?: string) =>
    cluster.kubectl(args, input === undefined ? {} : { input });

  it('applies the default install (kubectl apply -k config/concierge and config/agent)', async () => {
    for (const dir of ['config/concierge', 'config/agent']) {
      const applied = await kubectl(['apply', '-k', join(REPO_ROOT, dir)]);
      expect(applied.stderr).toBe('');
      expect(applied.code).toBe(0);
    }
    const established = await kubectl([
      'wait',
      '--for=condition=Established',
      '--timeout=60s',
      'crd',
      '-l',
      'app.kubernetes.io/part-of=sealion',
    ]);
    expect(established.code).toBe(0);
    const deployment = await kubectl([
      'get',
      'deployment',
      '-n',
      'sealion-concierge',
      'sealion-concierge',
      '-o',
      'jsonpath={.spec.replicas}',
    ]);
    expect(deployment.stdout).toBe('2');
  });

  it('accepts valid objects of every kind', async () => {
    const objects = [
      jwtAuthenticator('good-jwt', {
        issuer: 'https://issuer.example.com',
        audience: 'sealion',
        claims: { username: 'email' },
      }),
      JSON.stringify({
        apiVersion: `${GROUP}/v1alpha1`,
        kind: 'WebhookAuthenticator',
        metadata: { name: 'good-webhook' },
        spec: {
          endpoint: 'https://webhook.example.com/authenticate',
          tls: { certificateAuthorityData: Buffer.from('pem').toString('base64') },
        },
      }),
      JSON.stringify({
        apiVersion: 'tunnel.concierge.sealion.dev/v1alpha1',
        kind: 'Cluster',
        metadata: { name: 'edge-1' },
        spec: { description: 'the edge', maxConcurrentStreams: 500 },
      }),
    ];
    for (const object of objects) {
      const result = await kubectl(['apply', '-f', '-'], object);
      expect(result.stderr).toBe('');
      expect(result.stdout).toMatch(/created|configured/);
    }
  });

  it.each([
    [
      'an http:// issuer',
      jwtAuthenticator('bad-issuer', { issuer: 'http://issuer.example.com', audience: 'a' }),
      /spec\.issuer: Invalid value: "http:\/\/issuer\.example\.com": spec\.issuer in body should match '\^https:/,
    ],
    [
      'a missing audience',
      jwtAuthenticator('no-audience', { issuer: 'https://issuer.example.com' }),
      /spec: Invalid value: give either jwt or issuer and audience/,
    ],
    [
      // Each thing said one way: the structured form, or the older fields, never both.
      'jwt beside issuer',
      jwtAuthenticator('jwt-and-issuer', {
        issuer: 'https://issuer.example.com',
        audience: 'a',
        jwt: {
          issuer: { url: 'https://issuer.example.com', audiences: ['a'] },
          claimMappings: { username: { claim: 'sub', prefix: '' } },
        },
      }),
      /spec: Invalid value: give either jwt or issuer and audience/,
    ],
    [
      'a bad mode enum',
      JSON.stringify({
        apiVersion: 'config.concierge.sealion.dev/v1alpha1',
        kind: 'CredentialIssuer',
        metadata: { name: 'bad-mode' },
        spec: { impersonationProxy: { mode: 'sometimes' } },
      }),
      /spec\.impersonationProxy\.mode: Unsupported value: "sometimes": supported values: "auto", "enabled", "disabled"/,
    ],
    [
      'a webhook endpoint over http',
      JSON.stringify({
        apiVersion: `${GROUP}/v1alpha1`,
        kind: 'WebhookAuthenticator',
        metadata: { name: 'bad-wh' },
        spec: { endpoint: 'http://x.example.com' },
      }),
      /spec\.endpoint: Invalid value/,
    ],
    [
      'CA data that is not base64',
      jwtAuthenticator('bad-ca', {
        issuer: 'https://i.example.com',
        audience: 'a',
        tls: { certificateAuthorityData: 'not base64!' },
      }),
      /spec\.tls\.certificateAuthorityData: Invalid value/,
    ],
  ])('rejects %s, naming the field', async (_name, object, message) => {
    const result = await kubectl(['apply', '-f', '-'], object);
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(message);
  });

  it('shows the proxy endpoint written to status in `kubectl get jwtauthenticators`', async () => {
    const endpoint = 'https://proxy.example.com:8443';
    const status = {
      status: {
        phase: 'Ready',
        conciergeStrategies: [
          {
            type: 'ImpersonationProxy',
            status: 'Success',
            reason: 'Listening',
            message: 'impersonation proxy is ready to accept client connections',
            lastUpdateTime: new Date().toISOString(),
            impersonationProxyConfig: {
              endpoint,
              certificateAuthorityData: Buffer.from('ca').toString('base64'),
            },
          },
        ],
      },
    };
    const patched = await kubectl([
      'patch',
      'jwtauthenticator',
      'good-jwt',
      '--subresource=status',
      '--type=merge',
      '-p',
      JSON.stringify(status),
    ]);
    expect(patched.stderr).toBe('');
    const table = await eventually(async () => {
      const result = await kubectl(['get', 'jwtauthenticators']);
      expect(result.stdout).toContain(endpoint);
      return result.stdout;
    });
    const [header, row] = table.split('\n');
    expect(header?.split(/\s{2,}/)).toEqual([
      'NAME',
      'ISSUER',
      'AUDIENCE',
      'STATUS',
      'PROXY ENDPOINT',
      'AGE',
    ]);
    expect(row).toMatch(
      /^good-jwt\s+https:\/\/issuer\.example\.com\s+sealion\s+Ready\s+https:\/\/proxy\.example\.com:8443\s+\S+$/,
    );

    const webhooks = await kubectl(['get', 'webhookauthenticators']);
    expect(webhooks.stdout.split('\n')[0]?.split(/\s{2,}/)).toEqual([
      'NAME',
      'ENDPOINT',
      'STATUS',
      'PROXY ENDPOINT',
      'AGE',
    ]);
    // The categories group the kinds for discovery.
    const authenticators = await kubectl(['get', 'authenticators', '-o', 'name']);
    expect(authenticators.stdout.split('\n').sort()).toEqual(
      expect.arrayContaining([
        `jwtauthenticator.${GROUP}/good-jwt`,
        `webhookauthenticator.${GROUP}/good-webhook`,
      ]),
    );
  });

  it('documents every field for `kubectl explain`', async () => {
    const issuer = await kubectl(['explain', 'jwtauthenticator.spec.issuer']);
    expect(issuer.code).toBe(0);
    expect(issuer.stdout).toContain('The issuer URL. It must use https');
    const strategies = await kubectl([
      'explain',
      'jwtauthenticator.status.conciergeStrategies.impersonationProxyConfig.endpoint',
    ]);
    expect(strategies.stdout).toContain('The https URL to point kubectl at');
  });

  it('installs a second copy under the pinniped.dev suffix side by side', async () => {
    const out = join(scratch, 'pinniped');
    await run(process.execPath, [
      join(REPO_ROOT, 'bin/sealion.js'),
      'manifests',
      '--group-suffix=pinniped.dev',
      '--namespace=pinniped-concierge',
      '--agent-namespace=pinniped-agent',
      `--output-dir=${out}`,
    ]);
    for (const dir of ['concierge', 'agent']) {
      const applied = await kubectl(['apply', '-k', join(out, dir)]);
      expect(applied.stderr).toBe('');
      expect(applied.code).toBe(0);
    }
    await kubectl([
      'wait',
      '--for=condition=Established',
      '--timeout=60s',
      'crd',
      '-l',
      'app.kubernetes.io/part-of=sealion',
    ]);
    const pinnipedGroup = 'authentication.concierge.pinniped.dev';
    const created = await kubectl(
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: `${pinnipedGroup}/v1alpha1`,
        kind: 'JWTAuthenticator',
        metadata: { name: 'pinniped-jwt' },
        spec: { issuer: 'https://issuer.example.com', audience: 'pinniped' },
      }),
    );
    expect(created.stderr).toBe('');
    // Both groups serve, each with its own objects.
    const ours = await kubectl(['get', `jwtauthenticators.${GROUP}`, '-o', 'name']);
    const theirs = await kubectl(['get', `jwtauthenticators.${pinnipedGroup}`, '-o', 'name']);
    expect(ours.stdout.trim()).toBe(`jwtauthenticator.${GROUP}/good-jwt`);
    expect(theirs.stdout.trim()).toBe(`jwtauthenticator.${pinnipedGroup}/pinniped-jwt`);
    // And the first installation is untouched: re-applying it changes nothing. Judged by each object's
    // resourceVersion, as kubectl's own words are not: its client-side apply says "configured" of a
    // PodDisruptionBudget every time, as its selector's patch strategy is to replace, even when the server finds
    // nothing to change.
    const versions = async (): Promise<string> =>
      (
        await kubectl([
          'get',
          '-k',
          join(REPO_ROOT, 'config/concierge'),
          '-o',
          'jsonpath={range .items[*]}{.kind}/{.metadata.name} {.metadata.resourceVersion}{"\\n"}{end}',
        ])
      ).stdout;
    const before = await versions();
    const again = await kubectl(['apply', '-k', join(REPO_ROOT, 'config/concierge')]);
    expect(again.code).toBe(0);
    expect(await versions()).toBe(before);
  });
});
