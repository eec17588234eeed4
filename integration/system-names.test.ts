// Identities from an OIDC issuer may not speak as `system:` names through the real proxy: a validly signed JWT
// whose username is system:admin or whose groups include system:masters gets the same 401 as garbage (and no
// TokenCredentialRequest certificate), the reason only in the log; with the JWTAuthenticator's prefixes set, the
// same token is accepted and the API server sees the prefixed names; with spec.allowSystemNames, it sees them as
// they came.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import { newLogger } from '../lib/log.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const GROUP = 'authentication.concierge.sealion.dev';
const AUDIENCE = 'sealion-demo';

interface WhoAmI {
  status: { userInfo: { username: string; groups: string[] } };
}

describe('system names from an OIDC issuer, through the real proxy', () => {
  let cluster: Cluster;
  let issuer: TestIssuer;
  let proxy: LocalConcierge;
  let dir: string;
  let logText = '';
  let adminToken: string;
  let mastersToken: string;

  /** One HTTPS request to the proxy: status and body. */
  const call = (
    path: string,
    opts: { method?: string; token?: string; body?: string } = {},
  ): Promise<{ status: number; body: string }> =>
    new Promise((done, fail) => {
      const req = request(
        new URL(path, proxy.url),
        {
          method: opts.method ?? 'GET',
          ca: proxy.servingCA.certPem,
          headers: {
            ...(opts.token ? { authorization: `Bearer ${opts.token}` } : {}),
            ...(opts.body ? { 'content-type': 'application/json' } : {}),
          },
        },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (body += c));
          res.on('end', () => done({ status: res.statusCode ?? 0, body }));
        },
      );
      req.on('error', fail);
      req.end(opts.body);
    });

  const kubeconfigFor = (name: string, token: string): string => {
    const path = join(dir, `${name}.kubeconfig`);
    writeFileSync(path, proxy.kubeconfig({ token }), { mode: 0o600 });
    return path;
  };
  const whoami = async (token: string): Promise<WhoAmI['status']['userInfo']> => {
    const r = await cluster.kubectl(['auth', 'whoami', '-o', 'json'], {
      kubeconfig: kubeconfigFor('who', token),
    });
    expect(r.stderr).toBe('');
    return (JSON.parse(r.stdout) as WhoAmI).status.userInfo;
  };
  const applyAuthenticator = async (spec: object): Promise<void> => {
    const applied = await cluster.kubectl(['apply', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: `${GROUP}/v1alpha1`,
        kind: 'JWTAuthenticator',
        metadata: { name: 'corp' },
        spec: {
          issuer: issuer.url,
          audience: AUDIENCE,
          tls: { certificateAuthorityData: issuer.caData },
          ...spec,
        },
      }),
    });
    expect(applied.stderr).toBe('');
  };
  const tokenCredentialRequest = (token: string) =>
    call('/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests', {
      method: 'POST',
      body: JSON.stringify({
        apiVersion: 'login.concierge.sealion.dev/v1alpha1',
        kind: 'TokenCredentialRequest',
        spec: { token, authenticator: { apiGroup: GROUP, kind: 'JWTAuthenticator', name: 'corp' } },
      }),
    });

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-system-names-'));
    cluster = await startCluster({ name: 'sysnames', controllerManager: false });
    issuer = await startOIDCIssuer({ audience: AUDIENCE });
    const log = newLogger({
      destination: new Writable({
        write(chunk: Buffer, _enc, next) {
          logText += chunk.toString();
          next();
        },
      }),
    });
    proxy = await startLocalConcierge(cluster, { log });
    await applyAuthenticator({});
    await eventually(async () => {
      const phase = await cluster.kubectl([
        'get',
        `jwtauthenticator.${GROUP}`,
        'corp',
        '-o',
        'jsonpath={.status.phase}',
      ]);
      expect(phase.stdout).toBe('Ready');
    }, 30_000);
    adminToken = await issuer.mint({ username: 'system:admin' }, { expiresIn: 3600 });
    mastersToken = await issuer.mint(
      { username: 'mallory', groups: ['system:masters'] },
      { expiresIn: 3600 },
    );
  });

  afterAll(async () => {
    await proxy?.stop();
    await issuer?.stop();
    await cluster?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  it('refuses system:admin and system:masters with the 401 any bad token gets, and issues them no certificate', async () => {
    const garbage = await call('/api/v1/namespaces', { token: 'garbage' });
    expect(garbage.status).toBe(401);
    for (const token of [adminToken, mastersToken]) {
      const answer = await call('/api/v1/namespaces', { token });
      expect(answer).toEqual(garbage);
      const kubectl = await cluster.kubectl(['get', 'ns'], { kubeconfig: kubeconfigFor('refused', token) });
      expect(kubectl.stderr).toContain('error: You must be logged in to the server');
      const tcr = await tokenCredentialRequest(token);
      expect(tcr.body).not.toContain('clientCertificateData');
      expect(JSON.parse(tcr.body)).toMatchObject({ status: { message: 'authentication failed' } });
    }
    // A user with an ordinary name from the same issuer still gets in.
    const pat = await issuer.mint({ username: 'pat', groups: ['dev', 'system:authenticated'] });
    expect(await whoami(pat)).toEqual({ username: 'pat', groups: ['dev', 'system:authenticated'] });
    // Why is in the log, and no token is.
    expect(logText).toContain('username \\"system:admin\\" is a system name');
    expect(logText).toContain('group \\"system:masters\\" is a system name');
    for (const token of [adminToken, mastersToken, pat]) expect(logText).not.toContain(token.split('.')[2]);
  });

  it('accepts them with prefixes, and the API server sees the prefixed names, not cluster-admin', async () => {
    await applyAuthenticator({ claims: { usernamePrefix: 'oidc:', groupsPrefix: 'oidc:' } });
    await eventually(
      async () =>
        expect(await whoami(adminToken)).toEqual({
          username: 'oidc:system:admin',
          groups: ['system:authenticated'],
        }),
      30_000,
    );
    expect(await whoami(mastersToken)).toEqual({
      username: 'oidc:mallory',
      groups: ['oidc:system:masters', 'system:authenticated'],
    });
    const list = await cluster.kubectl(['get', 'ns'], {
      kubeconfig: kubeconfigFor('prefixed', mastersToken),
    });
    expect(list.stderr).toContain('User "oidc:mallory" cannot list resource "namespaces"');
  });

  it('passes system names on as they came when the authenticator opts out, but never system:masters', async () => {
    await applyAuthenticator({ allowSystemNames: true });
    await eventually(
      async () =>
        expect(await whoami(adminToken)).toEqual({
          username: 'system:admin',
          groups: ['system:authenticated'],
        }),
      30_000,
    );
    // The forwarding identity holds constrained impersonation, which no cluster lets act as system:masters: only
    // the legacy verb could, and the forwarding policy does not grant it.
    const masters = await cluster.kubectl(['auth', 'whoami'], {
      kubeconfig: kubeconfigFor('who', mastersToken),
    });
    expect(masters.code).not.toBe(0);
    const raw = await cluster.kubectl(['get', '--raw', '/api/v1/namespaces'], {
      kubeconfig: kubeconfigFor('who', mastersToken),
    });
    expect(raw.stderr).toContain('only the legacy impersonate verb can carry it');
    const status = await cluster.kubectl(['get', `jwtauthenticator.${GROUP}`, 'corp', '-o', 'json']);
    const conditions = (
      JSON.parse(status.stdout) as { status: { conditions: { type: string; message: string }[] } }
    ).status.conditions;
    expect(conditions.find((c) => c.type === 'AuthenticatorValid')?.message).toContain(
      'spec.allowSystemNames',
    );
    expect(logText).toMatch(/"name":"corp".*spec\.allowSystemNames|spec\.allowSystemNames.*"name":"corp"/);
  });
});
