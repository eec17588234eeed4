// The impersonation proxy end to end: real kube-apiserver, real kubectl, a JWT user, a service account,
// TokenCredentialRequest certificates, nested impersonation, a WebSocket upgrade, and malformed input.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { connect as http2Connect } from 'node:http2';
import { request } from 'node:https';
import { connect as netConnect } from 'node:net';
import { connect as tlsConnect } from 'node:tls';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import WebSocket from 'ws';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { applyJWTAuthenticator, startLocalConcierge, type LocalConcierge } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startNetnsBackend, type NetnsBackend } from './harness/netns.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const GROUP = 'authentication.concierge.sealion.dev';
const USER = 'pat@example.com';

interface Answer {
  status: number;
  body: string;
  headers: Record<string, string | string[] | undefined>;
}

describe('the impersonation proxy against a real API server', () => {
  let cluster: Cluster;
  let issuer: TestIssuer;
  let proxy: LocalConcierge;
  let dir: string;
  let userToken: string;
  let userKubeconfig: string;

  /** One HTTPS request to the proxy. */
  const call = (
    path: string,
    opts: {
      method?: string;
      headers?: Record<string, string>;
      body?: string;
      cert?: { certPem: string; keyPem: string };
    } = {},
  ): Promise<Answer> =>
    new Promise((done, fail) => {
      const url = new URL(path, proxy.url);
      const req = request(
        url,
        {
          method: opts.method ?? 'GET',
          ca: proxy.servingCA.certPem,
          headers: opts.headers ?? {},
          ...(opts.cert ? { cert: opts.cert.certPem, key: opts.cert.keyPem } : {}),
        },
        (res) => {
          let body = '';
          res.setEncoding('utf8');
          res.on('data', (c: string) => (body += c));
          res.on('end', () => done({ status: res.statusCode ?? 0, body, headers: res.headers }));
        },
      );
      req.on('error', fail);
      req.end(opts.body);
    });

  const writeKubeconfig = (name: string, text: string): string => {
    const path = join(dir, `${name}.kubeconfig`);
    writeFileSync(path, text, { mode: 0o600 });
    return path;
  };
  const asUser = (args: string[], kubeconfig = userKubeconfig, input?: string) =>
    cluster.kubectl(args, { kubeconfig, ...(input === undefined ? {} : { input }) });

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-proxy-test-'));
    // kube-controller-manager fills the aggregated roles (edit, view) the test binds.
    cluster = await startCluster({ name: 'proxy' });
    issuer = await startOIDCIssuer({ audience: 'sealion-demo' });
    proxy = await startLocalConcierge(cluster);
    await applyJWTAuthenticator(cluster, 'demo', issuer, 'sealion-demo');
    await eventually(async () => {
      const phase = await cluster.kubectl([
        'get',
        `jwtauthenticator.${GROUP}`,
        'demo',
        '-o',
        'jsonpath={.status.phase}',
      ]);
      expect(phase.stdout).toBe('Ready');
    }, 30_000);
    // The user's rights come from their group, through the cluster's own RBAC.
    for (const args of [
      ['create', 'namespace', 'team'],
      ['create', 'clusterrole', 'ns-reader', '--verb=get,list,watch', '--resource=namespaces'],
      ['create', 'clusterrolebinding', 'devs-ns-reader', '--clusterrole=ns-reader', '--group=devs'],
      ['create', 'rolebinding', 'devs-edit', '-n', 'team', '--clusterrole=edit', '--group=devs'],
    ]) {
      const r = await cluster.kubectl(args);
      expect(r.stderr).toBe('');
    }
    // The aggregated roles (edit, view) get their rules from kube-controller-manager shortly after start.
    await eventually(async () => {
      const r = await cluster.kubectl([
        'auth',
        'can-i',
        'create',
        'configmaps',
        '-n',
        'team',
        `--as=${USER}`,
        '--as-group=devs',
      ]);
      expect(r.stdout.trim()).toBe('yes');
    }, 60_000);
    userToken = await issuer.mint({ username: USER, groups: ['devs'] }, { expiresIn: 3600 });
    userKubeconfig = writeKubeconfig('user', proxy.kubeconfig({ token: userToken }));
  });

  afterAll(async () => {
    await proxy?.stop();
    await issuer?.stop();
    await cluster?.stop();
    rmSync(dir, { recursive: true, force: true });
  });

  it('lets a JWT user get, list, create, apply, delete and ask can-i, with the server’s RBAC deciding', async () => {
    expect((await asUser(['get', 'ns', 'team', '-o', 'name'])).stdout.trim()).toBe('namespace/team');
    const created = await asUser(['create', 'configmap', 'one', '-n', 'team', '--from-literal=a=b']);
    expect(created).toMatchObject({ code: 0, stdout: 'configmap/one created\n' });
    const applied = await asUser(
      ['apply', '--server-side', '-n', 'team', '-f', '-'],
      userKubeconfig,
      JSON.stringify({ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: 'two' }, data: { x: 'y' } }),
    );
    expect(applied.stdout).toContain('configmap/two serverside-applied');
    const listed = await asUser(['get', 'configmaps', '-n', 'team', '-o', 'name']);
    expect(listed.stdout.split('\n')).toEqual(expect.arrayContaining(['configmap/one', 'configmap/two']));
    // The object records who really made it: the impersonated user, as the API server saw them.
    const manager = await cluster.kubectl([
      'get',
      'configmap',
      'two',
      '-n',
      'team',
      '-o',
      'jsonpath={.metadata.managedFields[0].manager}',
    ]);
    expect(manager.stdout).toBe('kubectl');
    expect((await asUser(['delete', 'configmap', 'one', '-n', 'team'])).stdout).toContain('deleted');
    expect((await asUser(['auth', 'can-i', 'create', 'deployments', '-n', 'team'])).stdout.trim()).toBe(
      'yes',
    );
    expect((await asUser(['auth', 'can-i', 'create', 'namespaces'])).stdout.trim()).toBe('no');

    const denied = await asUser(['create', 'namespace', 'nope']);
    expect(denied.code).not.toBe(0);
    expect(denied.stderr).toContain(
      `namespaces is forbidden: User "${USER}" cannot create resource "namespaces" in API group "" at the cluster scope`,
    );

    const whoami = JSON.parse((await asUser(['auth', 'whoami', '-o', 'json'])).stdout) as {
      status: { userInfo: { username: string; groups: string[] } };
    };
    expect(whoami.status.userInfo.username).toBe(USER);
    expect(whoami.status.userInfo.groups).toEqual(['devs', 'system:authenticated']);
  });

  it('streams a watch event by event', async () => {
    const watch = spawn(cluster.binaries.kubectl, [
      '--kubeconfig',
      userKubeconfig,
      'get',
      'configmaps',
      '-n',
      'team',
      '-w',
      '--output-watch-events',
    ]);
    let output = '';
    watch.stdout.setEncoding('utf8');
    watch.stdout.on('data', (c: string) => (output += c));
    try {
      // The initial list comes first; then every change arrives as its own event.
      await eventually(() => expect(output).toContain('kube-root-ca.crt'), 20_000);
      await asUser(['create', 'configmap', 'watched', '-n', 'team']);
      await eventually(() => expect(output).toMatch(/ADDED\s+watched/), 20_000);
      await asUser(['delete', 'configmap', 'watched', '-n', 'team']);
      await eventually(() => expect(output).toMatch(/DELETED\s+watched/), 20_000);
    } finally {
      watch.kill();
    }
  });

  it('answers every failed authentication with the same 401', async () => {
    const expired = await issuer.mint({ username: USER }, { expiresIn: -3600 });
    const answers = await Promise.all([
      call('/api/v1/namespaces'),
      call('/api/v1/namespaces', { headers: { authorization: 'Bearer garbage' } }),
      call('/api/v1/namespaces', { headers: { authorization: `Bearer ${expired}` } }),
      call('/api/v1/namespaces', { headers: { authorization: 'Basic dXNlcjpwYXNz' } }),
      call('/api/v1/namespaces', {
        headers: { authorization: `Bearer ${await issuer.mint({ username: USER }, { audience: 'other' })}` },
      }),
    ]);
    for (const a of answers) {
      expect(a.status).toBe(401);
      expect(a.body).toBe(answers[0].body);
    }
    expect(JSON.parse(answers[0].body)).toMatchObject({
      kind: 'Status',
      status: 'Failure',
      reason: 'Unauthorized',
      code: 401,
    });
    const kubectl = await asUser(['get', 'ns'], writeKubeconfig('bad', proxy.kubeconfig({ token: 'wrong' })));
    expect(kubectl.stderr).toContain('error: You must be logged in to the server (Unauthorized)');
  });

  it('honours Impersonate-User only when RBAC lets the caller impersonate, and records the caller', async () => {
    const denied = await asUser(['get', 'ns', '--as=bob']);
    expect(denied.code).not.toBe(0);
    // The API server's own words for it: user-info, the first mode that applies, refuses on the request first.
    expect(denied.stderr).toContain(
      `namespaces is forbidden: User "${USER}" cannot impersonate-on:user-info:list resource "namespaces" in API group "" at the cluster scope`,
    );

    await cluster.kubectl([
      'create',
      'clusterrole',
      'impersonate-bob',
      '--verb=impersonate',
      '--resource=users',
      '--resource-name=bob',
    ]);
    await cluster.kubectl([
      'create',
      'clusterrolebinding',
      'pat-impersonates-bob',
      '--clusterrole=impersonate-bob',
      `--user=${USER}`,
    ]);
    const whoami = await eventually(async () => {
      const r = await asUser(['auth', 'whoami', '--as=bob', '-o', 'json']);
      expect(r.code).toBe(0);
      return JSON.parse(r.stdout) as {
        status: { userInfo: { username: string; groups: string[]; extra: Record<string, string[]> } };
      };
    });
    expect(whoami.status.userInfo.username).toBe('bob');
    expect(whoami.status.userInfo.groups).toEqual(['system:authenticated']);
    const original =
      whoami.status.userInfo.extra['impersonation-proxy.concierge.sealion.dev/original-user-info'];
    expect(JSON.parse(original![0]!)).toEqual({ username: USER, groups: ['devs'], extra: {} });
    // Groups need their own permission.
    const group = await asUser(['get', 'ns', '--as=bob', '--as-group=system:masters']);
    expect(group.code).not.toBe(0);
    expect(group.stderr).toContain('is forbidden');
  });

  it('passes a service-account token through as that service account', async () => {
    await cluster.kubectl(['create', 'serviceaccount', 'robot', '-n', 'team']);
    await cluster.kubectl([
      'create',
      'rolebinding',
      'robot-view',
      '-n',
      'team',
      '--clusterrole=view',
      '--serviceaccount=team:robot',
    ]);
    const token = (await cluster.kubectl(['create', 'token', 'robot', '-n', 'team'])).stdout.trim();
    const robot = writeKubeconfig('robot', proxy.kubeconfig({ token }));
    const whoami = JSON.parse((await asUser(['auth', 'whoami', '-o', 'json'], robot)).stdout) as {
      status: { userInfo: { username: string } };
    };
    expect(whoami.status.userInfo.username).toBe('system:serviceaccount:team:robot');
    expect((await asUser(['get', 'configmaps', '-n', 'team', '-o', 'name'], robot)).code).toBe(0);
    expect((await asUser(['create', 'configmap', 'x', '-n', 'team'], robot)).stderr).toContain(
      'User "system:serviceaccount:team:robot" cannot create',
    );
  });

  /** A TokenCredentialRequest for `token` to JWTAuthenticator `name`, with more of the spec when given. */
  const tokenCredentialRequest = (token: string, name = 'demo', spec: object = {}) =>
    call('/apis/login.concierge.sealion.dev/v1alpha1/tokencredentialrequests', {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        apiVersion: 'login.concierge.sealion.dev/v1alpha1',
        kind: 'TokenCredentialRequest',
        spec: { token, authenticator: { apiGroup: GROUP, kind: 'JWTAuthenticator', name }, ...spec },
      }),
    });

  it('issues a client certificate through TokenCredentialRequest that kubectl then uses', async () => {
    const tcr = (token: string, name = 'demo') => tokenCredentialRequest(token, name);
    const good = await tcr(userToken);
    expect(good.status).toBe(201);
    const credential = (
      JSON.parse(good.body) as {
        status: {
          credential: { clientCertificateData: string; clientKeyData: string; expirationTimestamp: string };
        };
      }
    ).status.credential;
    const lifetime = Date.parse(credential.expirationTimestamp) - Date.now();
    expect(lifetime).toBeGreaterThan(4 * 60_000);
    expect(lifetime).toBeLessThanOrEqual(5 * 60_000);
    expect(good.body).not.toContain(userToken);

    const certConfig = writeKubeconfig(
      'cert',
      proxy.kubeconfig({ certPem: credential.clientCertificateData, keyPem: credential.clientKeyData }),
    );
    const whoami = JSON.parse((await asUser(['auth', 'whoami', '-o', 'json'], certConfig)).stdout) as {
      status: { userInfo: { username: string; groups: string[] } };
    };
    expect(whoami.status.userInfo).toMatchObject({
      username: USER,
      groups: ['devs', 'system:authenticated'],
    });

    for (const bad of [await tcr('not-a-token'), await tcr(userToken, 'no-such-authenticator')]) {
      expect(bad.status).toBe(201);
      expect(JSON.parse(bad.body)).toMatchObject({ status: { message: 'authentication failed' } });
    }
    const missing = await tcr('');
    expect(missing.status).toBe(422);
  });

  it('certifies the key of a CSR for the authenticator’s lifetime, and never sends a private key back', async () => {
    const { newCSR } = await import('../lib/pki/pki.ts');
    const { X509Certificate } = await import('node:crypto');
    const tcr = (spec: object) => tokenCredentialRequest(userToken, 'demo', spec);
    type Answer = {
      status: {
        credential?: { clientCertificateData: string; clientKeyData?: string; expirationTimestamp: string };
      };
    };
    // No more than a day: a certificate cannot be revoked.
    const tooLong = await cluster.kubectl([
      'patch',
      'jwtauthenticator',
      'demo',
      '--type=merge',
      '-p',
      '{"spec":{"credentialLifetimeSeconds":604800}}',
    ]);
    expect(tooLong.stderr).toContain('less than or equal to 86400');
    // An hour instead of the 5-minute default, for this authenticator's users.
    const patched = await cluster.kubectl([
      'patch',
      'jwtauthenticator',
      'demo',
      '--type=merge',
      '-p',
      '{"spec":{"credentialLifetimeSeconds":3600}}',
    ]);
    expect(patched.code).toBe(0);
    const own = await newCSR('whoever-the-client-says');
    const credential = await eventually(async () => {
      const got = await tcr({ certificateSigningRequest: own.csrPem });
      expect(got.status).toBe(201);
      const answer = (JSON.parse(got.body) as Answer).status.credential!;
      expect(Date.parse(answer.expirationTimestamp) - Date.now()).toBeGreaterThan(55 * 60_000);
      return { answer, body: got.body };
    });
    expect(credential.body).not.toMatch(/PRIVATE KEY/);
    expect(credential.answer.clientKeyData).toBeUndefined();
    const cert = new X509Certificate(credential.answer.clientCertificateData);
    // The key is the CSR's; the subject is the token's, whatever the CSR named.
    expect(cert.checkPrivateKey((await import('node:crypto')).createPrivateKey(own.keyPem))).toBe(true);
    expect(cert.subject).toContain(`CN=${USER}`);
    expect(cert.subject).not.toContain('whoever');
    const certConfig = writeKubeconfig(
      'pop',
      proxy.kubeconfig({ certPem: credential.answer.clientCertificateData, keyPem: own.keyPem }),
    );
    const whoami = JSON.parse((await asUser(['auth', 'whoami', '-o', 'json'], certConfig)).stdout) as {
      status: { userInfo: { username: string } };
    };
    expect(whoami.status.userInfo.username).toBe(USER);

    // A CSR whose signature does not match its key proves nothing: refused, with the reason.
    // (The signature is the last element of the DER: its last byte changed, the key and subject stay.)
    const der = Buffer.from(own.csrPem.replace(/-----[A-Z ]+-----|\s/g, ''), 'base64');
    der[der.length - 1]! ^= 0xff;
    const forged = `-----BEGIN CERTIFICATE REQUEST-----\n${der.toString('base64')}\n-----END CERTIFICATE REQUEST-----\n`;
    for (const bad of [forged, 'not a CSR', 42]) {
      const refused = await tcr({ certificateSigningRequest: bad });
      expect(refused.status).toBe(422);
      expect(JSON.parse(refused.body)).toMatchObject({ kind: 'Status', code: 422 });
    }
    // Pinniped's request, without a CSR, still gets a key made for it.
    const plain = (JSON.parse((await tcr({})).body) as Answer).status.credential!;
    expect(plain.clientKeyData).toMatch(/PRIVATE KEY/);
    await cluster.kubectl([
      'patch',
      'jwtauthenticator',
      'demo',
      '--type=json',
      '-p',
      '[{"op":"remove","path":"/spec/credentialLifetimeSeconds"}]',
    ]);
  });

  it('stops honouring a certificate the moment the authenticator it was issued through is deleted', async () => {
    await applyJWTAuthenticator(cluster, 'soon-gone', issuer, 'sealion-demo');
    const answer = await eventually(async () => {
      const got = JSON.parse((await tokenCredentialRequest(userToken, 'soon-gone')).body) as {
        status: { credential?: { clientCertificateData: string; clientKeyData: string } };
      };
      expect(got.status.credential).toBeDefined();
      return got.status.credential!;
    });
    const config = writeKubeconfig(
      'soon-gone',
      proxy.kubeconfig({ certPem: answer.clientCertificateData, keyPem: answer.clientKeyData }),
    );
    expect((await asUser(['auth', 'whoami', '-o', 'name'], config)).code).toBe(0);
    // A certificate issued through `demo` is bound to `demo`, and keeps working.
    const other = JSON.parse((await tokenCredentialRequest(userToken, 'demo')).body) as {
      status: { credential: { clientCertificateData: string; clientKeyData: string } };
    };
    const otherConfig = writeKubeconfig(
      'still-here',
      proxy.kubeconfig({
        certPem: other.status.credential.clientCertificateData,
        keyPem: other.status.credential.clientKeyData,
      }),
    );

    expect((await cluster.kubectl(['delete', 'jwtauthenticator', 'soon-gone'])).code).toBe(0);
    await eventually(async () => {
      const refused = await asUser(['auth', 'whoami', '-o', 'name'], config);
      expect(refused.stderr).toContain('Unauthorized');
    });
    expect((await asUser(['auth', 'whoami', '-o', 'name'], otherConfig)).code).toBe(0);
  });

  it('answers WhoAmIRequest with the user the proxy sees', async () => {
    const answer = await call('/apis/identity.concierge.sealion.dev/v1alpha1/whoamirequests', {
      method: 'POST',
      headers: { authorization: `Bearer ${userToken}`, 'content-type': 'application/json' },
      body: JSON.stringify({ apiVersion: 'identity.concierge.sealion.dev/v1alpha1', kind: 'WhoAmIRequest' }),
    });
    expect(answer.status).toBe(201);
    expect(JSON.parse(answer.body)).toMatchObject({
      status: { kubernetesUserInfo: { user: { username: USER, groups: ['devs', 'system:authenticated'] } } },
    });
  });

  it('serves HTTP/2 clients', async () => {
    const session = http2Connect(proxy.url, { ca: proxy.servingCA.certPem });
    try {
      const answer = await new Promise<{ status: number; body: string }>((done, fail) => {
        const stream = session.request({
          ':path': '/api/v1/namespaces/team',
          authorization: `Bearer ${userToken}`,
        });
        let body = '';
        let status = 0;
        stream.on('response', (h) => (status = Number(h[':status'])));
        stream.setEncoding('utf8');
        stream.on('data', (c: string) => (body += c));
        stream.on('end', () => done({ status, body }));
        stream.on('error', fail);
      });
      expect(answer.status).toBe(200);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Namespace', metadata: { name: 'team' } });
    } finally {
      session.close();
    }
  });

  describe('upgrades', () => {
    let backend: NetnsBackend;
    beforeAll(async () => {
      backend = await startNetnsBackend();
      // A Pod object whose status says it runs at the backend's address (no kubelet here: the status is written
      // directly). The API server's pod proxy then connects to the backend in its own network namespace.
      await cluster.kubectl(['apply', '-n', 'team', '-f', '-'], {
        input: JSON.stringify({
          apiVersion: 'v1',
          kind: 'Pod',
          metadata: { name: 'echo' },
          spec: { containers: [{ name: 'echo', image: 'echo:none' }], automountServiceAccountToken: false },
        }),
      });
      const status = { status: { phase: 'Running', podIP: backend.ip, podIPs: [{ ip: backend.ip }] } };
      const patched = await cluster.kubectl([
        'patch',
        'pod',
        'echo',
        '-n',
        'team',
        '--subresource=status',
        '--type=merge',
        '-p',
        JSON.stringify(status),
      ]);
      expect(patched.stderr).toBe('');
      await cluster.kubectl([
        'create',
        'role',
        'proxy-echo',
        '-n',
        'team',
        '--verb=get,create',
        '--resource=pods/proxy',
      ]);
      await cluster.kubectl([
        'create',
        'rolebinding',
        'devs-proxy-echo',
        '-n',
        'team',
        '--role=proxy-echo',
        '--group=devs',
      ]);
    });
    afterAll(async () => {
      await backend?.stop();
    });

    it('proxies a plain request through the API server’s pod proxy', async () => {
      const answer = await eventually(async () => {
        const a = await call(`/api/v1/namespaces/team/pods/echo:${backend.port}/proxy/hello`, {
          headers: { authorization: `Bearer ${userToken}` },
        });
        expect(a.status).toBe(200);
        return a;
      });
      expect(answer.body).toBe(`hello from ${backend.ip}`);
    });

    it('carries a WebSocket upgrade end to end', async () => {
      const ws = new WebSocket(
        `${proxy.url.replace('https', 'wss')}/api/v1/namespaces/team/pods/echo:${backend.port}/proxy/echo`,
        {
          ca: proxy.servingCA.certPem,
          headers: { authorization: `Bearer ${userToken}` },
        },
      );
      const echoed = await new Promise<string>((done, fail) => {
        ws.once('open', () => ws.send('through sealion'));
        ws.once('message', (data: Buffer) => done(data.toString()));
        ws.once('error', fail);
        ws.once('unexpected-response', (_req, res) => fail(new Error(`upgrade refused: ${res.statusCode}`)));
      });
      ws.close();
      expect(echoed).toBe('through sealion');
    });

    it('refuses an upgrade without credentials with a 401', async () => {
      const ws = new WebSocket(
        `${proxy.url.replace('https', 'wss')}/api/v1/namespaces/team/pods/echo:${backend.port}/proxy/echo`,
        { ca: proxy.servingCA.certPem },
      );
      const status = await new Promise<number>((done) => {
        ws.once('unexpected-response', (_req, res) => done(res.statusCode ?? 0));
        ws.once('open', () => done(101));
        ws.once('error', () => done(-1));
      });
      expect(status).toBe(401);
    });
  });

  describe('malformed input', () => {
    it.each([
      ['a path that escapes upward', '/api/v1/../../../etc/passwd'],
      ['percent garbage', '/api/v1/namespaces/%zz'],
      ['an unknown API', '/apis/nope.example.com/v1/things'],
    ])('gets a clean Status for %s', async (_name, path) => {
      const answer = await call(path, { headers: { authorization: `Bearer ${userToken}` } });
      expect(answer.status).toBeGreaterThanOrEqual(400);
      expect(JSON.parse(answer.body)).toMatchObject({ kind: 'Status' });
    });

    it('refuses huge headers and stays up', async () => {
      const answer = await call('/api/v1/namespaces', {
        headers: { authorization: `Bearer ${userToken}`, 'x-huge': 'a'.repeat(64 * 1024) },
      });
      expect(answer.status).toBe(431);
      expect((await call('/healthz')).status).toBe(200);
    });

    it('survives garbage instead of TLS, plain HTTP, and a TLS client that says nothing', async () => {
      const port = Number(new URL(proxy.url).port);
      await new Promise<void>((done) => {
        const socket = netConnect(port, '127.0.0.1', () => socket.write(Buffer.alloc(4096, 0x5a)));
        socket.on('error', () => done());
        socket.on('close', () => done());
      });
      await new Promise<void>((done) => {
        const socket = netConnect(port, '127.0.0.1', () => socket.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
        socket.on('error', () => done());
        socket.on('close', () => done());
      });
      const silent = tlsConnect({ port, host: '127.0.0.1', ca: proxy.servingCA.certPem });
      await new Promise((done) => silent.once('secureConnect', done));
      let answer = '';
      silent.setEncoding('utf8');
      silent.on('data', (chunk: string) => (answer += chunk));
      silent.write('NOT HTTP AT ALL\r\n\r\n');
      await new Promise((done) => silent.once('close', done));
      expect(answer).toMatch(/^HTTP\/1\.1 400 Bad Request\r\n/);
      expect(answer).toContain('"kind":"Status"');
      expect((await call('/healthz')).body).toBe('ok');
      expect((await asUser(['get', 'ns', 'team', '-o', 'name'])).stdout.trim()).toBe('namespace/team');
    });
  });
});
