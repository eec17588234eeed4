// `sealion login --reason` with real kubectl: a kubeconfig from `sealion get kubeconfig` (no --exchange-credential),
// the reason set, and kubectl through the proxy. The plugin trades the token for a certificate the real concierge
// issues with the reason in its extension; the proxy reads it from there, and the hub's own API server's audit log
// shows it on the request as the impersonated extra sealion.dev/reason. A bad reason is refused by the CLI, and by
// the concierge when sent past it.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { X509Certificate } from 'node:crypto';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent, fetch } from 'undici';
import { parse } from 'yaml';
import { REASON_EXTRA } from '../apis/access.ts';
import { apiGroups } from '../apis/groups.ts';
import { REASON_EXTENSION_OID } from '../apis/login.ts';
import { runKubectl, startCluster, type Cluster } from '../dev/cluster.ts';
import {
  applyJWTAuthenticator,
  startControlledConcierge,
  type ControlledConcierge,
} from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';
import { runSealion } from '../dev/processes.ts';
import { certificateText } from '../lib/pki/pki.ts';

const NS = 'sealion-concierge';
const USER = 'rita@example.com';
const GROUP = 'reason-readers';
/** Spaces, quotes and text beyond ASCII: a reason is one line of the user's own words. */
const REASON = 'INC-4242: orders "queue" stuck — Störung';

let cluster: Cluster;
let issuer: TestIssuer;
let concierge: ControlledConcierge;
let dir: string;
let kubeconfig: string;

beforeAll(async () => {
  cluster = await startCluster({ name: 'reason', controllerManager: false });
  issuer = await startOIDCIssuer({ audience: 'sealion-cli', login: { username: USER, groups: [GROUP] } });
  dir = mkdtempSync(join(tmpdir(), 'sealion-reason-'));
  for (const args of [
    ['create', 'namespace', NS],
    ['create', 'clusterrole', 'ns-reader', '--verb=get,list', '--resource=namespaces'],
    ['create', 'clusterrolebinding', 'reason-readers', '--clusterrole=ns-reader', `--group=${GROUP}`],
  ]) {
    const result = await cluster.kubectl(args);
    if (result.code !== 0) throw new Error(`kubectl ${args.join(' ')}: ${result.stderr}`);
  }
  concierge = await startControlledConcierge(cluster, {
    namespace: NS,
    configMap: 'config',
    identity: 'reason',
  });
  await cluster.kubectl([
    'create',
    'configmap',
    'config',
    '-n',
    NS,
    `--from-literal=config.yaml=impersonationProxy: {mode: enabled, endpoint: "127.0.0.1:${concierge.port}", service: {type: None}}`,
  ]);
  await applyJWTAuthenticator(cluster, 'corp', issuer, 'sealion-cli');
  kubeconfig = join(dir, 'user.kubeconfig');
  // Without --exchange-credential: the plugin exchanges only because a reason is set.
  const args = ['get', 'kubeconfig', '--kubeconfig', cluster.kubeconfigPath];
  await eventually(async () => {
    expect(
      await runSealion([...args, '--static-token-env', 'SEALION_TEST_TOKEN', '--output-file', kubeconfig]),
    ).toMatchObject({ code: 0 });
  }, 30_000);
}, 180_000);

afterAll(async () => {
  await concierge?.stop();
  await issuer?.stop();
  await cluster?.stop();
  rmSync(dir, { recursive: true, force: true });
});

/** A user's own config folder and the environment kubectl and the CLI run with. */
async function userEnv(): Promise<{ home: string; env: NodeJS.ProcessEnv }> {
  const home = mkdtempSync(join(dir, 'home-'));
  return {
    home,
    env: {
      XDG_CONFIG_HOME: home,
      SEALION_TEST_TOKEN: await issuer.mint({ username: USER, groups: [GROUP] }),
    },
  };
}

/** The reasons the certificates cached in a user's config folder carry (undefined: one without). */
function cachedReasons(home: string): (string | undefined)[] {
  const folder = join(home, 'sealion', 'credentials');
  if (!existsSync(folder)) return [];
  return readdirSync(folder)
    .filter((f) => f.endsWith('.json'))
    .map((f) => {
      const cached = JSON.parse(readFileSync(join(folder, f), 'utf8')) as {
        status: { clientCertificateData?: string };
      };
      const pem = cached.status.clientCertificateData;
      return pem ? certificateText(new X509Certificate(pem).raw, REASON_EXTENSION_OID) : undefined;
    });
}

interface AuditEvent {
  kind: string;
  requestURI: string;
  impersonatedUser?: { username: string; extra?: Record<string, string[]> };
}

/** The hub's own API server's audit events for requests made as USER on `uri`. */
function hubEvents(uri: string): AuditEvent[] {
  return readFileSync(cluster.auditLogPath, 'utf8')
    .split('\n')
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as AuditEvent)
    .filter((e) => e.kind === 'Event' && e.requestURI === uri && e.impersonatedUser?.username === USER);
}

describe('sealion login --reason with real kubectl', () => {
  it('writes the exchange arguments into every kubeconfig, exchanging only when told', () => {
    const config = parse(readFileSync(kubeconfig, 'utf8')) as {
      users: { user: { exec: { args: string[] } } }[];
    };
    const args = config.users[0]!.user.exec.args;
    expect(args).toEqual(expect.arrayContaining(['--authenticator-name', 'corp', '--concierge-endpoint']));
    expect(args).not.toContain('--exchange');
  });

  it('uses the token as it is without a reason, and a certificate that carries the reason once one is set', async () => {
    const { home, env } = await userEnv();
    const plain = await runKubectl(
      cluster.binaries.kubectl,
      kubeconfig,
      ['get', 'namespaces', '-o', 'name'],
      {
        env,
      },
    );
    expect(plain).toMatchObject({ code: 0, stderr: '' });
    expect(cachedReasons(home)).toEqual([]);

    const set = await runSealion(['login', '--reason', REASON, '--reason-for', '2h'], env);
    expect(set).toMatchObject({ code: 0, stderr: '' });
    expect(set.stdout).toMatch(/^Reason set until \S+Z: /);
    const listed = await runKubectl(
      cluster.binaries.kubectl,
      kubeconfig,
      ['get', 'namespaces', '-o', 'name'],
      {
        env,
      },
    );
    expect(listed).toMatchObject({ code: 0, stderr: '' });
    expect(listed.stdout).toContain(`namespace/${NS}`);
    expect(cachedReasons(home)).toEqual([REASON]);
    // The proxy took the certificate as the user it names, with the groups the token had.
    const whoami = await runKubectl(cluster.binaries.kubectl, kubeconfig, ['auth', 'whoami', '-o', 'json'], {
      env,
    });
    const info = (
      JSON.parse(whoami.stdout) as { status: { userInfo: { username: string; groups: string[] } } }
    ).status.userInfo;
    expect(info).toMatchObject({ username: USER, groups: expect.arrayContaining([GROUP]) as unknown });

    // Cleared by logout: the next run has no reason and goes back to the token.
    const out = await runSealion(['logout', '--kubeconfig', kubeconfig], env);
    expect(out.stdout).toContain('Cleared the reason.');
    expect(cachedReasons(home)).toEqual([]);
  });

  it('refuses a reason with a control character, in the CLI and at the concierge', async () => {
    const { env } = await userEnv();
    const refused = await runSealion(['login', '--reason', 'INC-1\nsystem:masters'], env);
    expect(refused.code).not.toBe(0);
    expect(refused.stderr).toMatch(/^sealion: --reason must not contain control characters/);
    // Past the CLI, straight to the proxy: a 400 naming the field, not a certificate.
    const groups = apiGroups();
    const caPem = Buffer.from(
      (parse(readFileSync(kubeconfig, 'utf8')) as { clusters: { cluster: Record<string, string> }[] })
        .clusters[0]!.cluster['certificate-authority-data']!,
      'base64',
    ).toString();
    const dispatcher = new Agent({ connect: { ca: caPem } });
    try {
      const answer = await fetch(
        `https://127.0.0.1:${concierge.port}/apis/${groups.login}/v1alpha1/tokencredentialrequests`,
        {
          method: 'POST',
          dispatcher,
          headers: { 'content-type': 'application/json' },
          body: JSON.stringify({
            apiVersion: `${groups.login}/v1alpha1`,
            kind: 'TokenCredentialRequest',
            spec: {
              token: env['SEALION_TEST_TOKEN'],
              authenticator: { apiGroup: groups.authentication, kind: 'JWTAuthenticator', name: 'corp' },
              reason: 'INC-1\u001b[2J',
            },
          }),
        },
      );
      expect(answer.status).toBe(400);
      expect(await answer.json()).toMatchObject({
        kind: 'Status',
        code: 400,
        message: expect.stringMatching(/^spec\.reason /) as unknown,
      });
    } finally {
      await dispatcher.close();
    }
  });

  // Needs the decide stage to forward identity.reason as the extra (built on its own branch): until it is merged,
  // the hub's audit log shows the user without it, and this is expected to fail.
  it.failing("shows the reason in the hub's own audit log, as the impersonated extra", async () => {
    const { env } = await userEnv();
    expect(await runSealion(['login', '--reason', REASON], env)).toMatchObject({ code: 0 });
    const listed = await runKubectl(
      cluster.binaries.kubectl,
      kubeconfig,
      ['get', 'namespace', NS, '-o', 'name'],
      {
        env,
      },
    );
    expect(listed).toMatchObject({ code: 0 });
    await eventually(() => {
      const events = hubEvents(`/api/v1/namespaces/${NS}`);
      expect(events.length).toBeGreaterThan(0);
      for (const e of events) expect(e.impersonatedUser?.extra?.[REASON_EXTRA]).toEqual([REASON]);
    }, 10_000);
  });
});
