// The aggregated APIs' listener on a real TLS server: what it believes of the front proxy, what it serves to it, and
// the one 401 everyone else gets.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { request } from 'node:https';
import { apiGroups } from '../../apis/groups.ts';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { AccessQuestion } from '../../lib/kube/kube.ts';
import { requestHeaderConfig } from '../../lib/kube/request-header.ts';
import { newLogger } from '../../lib/log.ts';
import { issueCert, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { newProxyServer, type ProxyServer } from '../proxy/server.ts';
import { DISCOVERY_V2 } from '../proxy/discovery.ts';
import { newDirectAPIHandler } from './handler.ts';

const groups = apiGroups('sealion.dev');
const log = newLogger({ level: 'silent' });
const asked: AccessQuestion[] = [];
/** What the fake auditor was told: each request's ID, user, route and final code. */
const audited: { id: string; user?: string; route?: string; code?: number }[] = [];
const auditor = {
  backend: {} as never,
  begin(
    facts: { auditID: string },
    user: { username: string } | undefined,
    annotations?: Record<string, string>,
  ) {
    const entry: (typeof audited)[number] = {
      id: facts.auditID,
      ...(user ? { user: user.username } : {}),
      ...(annotations?.['sealion.dev/route'] ? { route: annotations['sealion.dev/route'] } : {}),
    };
    audited.push(entry);
    return {
      received: () => Promise.resolve(),
      complete: (code: number) => void (entry.code = code),
    } as never;
  },
};
let server: ProxyServer;
let port = 0;
let servingCA: CertificateAuthority;
let frontProxyCA: CertificateAuthority;
let frontProxy: { cert: string; key: string };

const CONFIG_DATA = (caPem: string): Record<string, string> => ({
  'requestheader-client-ca-file': caPem,
  'requestheader-allowed-names': '["front-proxy-client"]',
  'requestheader-username-headers': '["X-Remote-User"]',
  'requestheader-group-headers': '["X-Remote-Group"]',
  'requestheader-extra-headers-prefix': '["X-Remote-Extra-"]',
  'requestheader-uid-headers': '["X-Remote-Uid"]',
});

beforeAll(async () => {
  servingCA = await newCA('serving');
  frontProxyCA = await newCA('front-proxy');
  const serving = await issueCert(servingCA, { commonName: 'api', hosts: ['127.0.0.1'], usage: 'server' });
  const client = await issueCert(frontProxyCA, { commonName: 'front-proxy-client', usage: 'client' });
  frontProxy = { cert: client.certPem, key: client.keyPem };
  const config = requestHeaderConfig(CONFIG_DATA(frontProxyCA.certPem))!;
  const handler = newDirectAPIHandler({
    groups,
    groupSuffix: 'sealion.dev',
    requestHeader: () => config,
    trusted: () => server.trustedClientCAs(),
    login: {
      groups,
      cache: new AuthenticatorCache(),
      signer: { issue: () => Promise.resolve(undefined) },
      log,
    },
    reviewer: {
      tokenReview: () => Promise.resolve({ authenticated: false }),
      allowed: (q) => {
        asked.push(q);
        return Promise.resolve(q.user !== 'denied');
      },
    },
    auditor,
    log,
  });
  server = newProxyServer(
    { certPem: serving.certPem, keyPem: serving.keyPem, clientCAPems: [frontProxyCA.certPem] },
    handler,
    (_req, socket) => socket.destroy(),
  );
  port = await server.listen(0, '127.0.0.1');
});

afterAll(() => server.close());

interface Answer {
  status: number;
  type: string;
  body: string;
}

/** `headers` as raw pairs, so that a header may repeat. */
function call(
  path: string,
  opts: {
    method?: string;
    body?: string;
    client?: { cert: string; key: string };
    headers?: [string, string][];
  } = {},
): Promise<Answer> {
  return new Promise((done, fail) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path,
        method: opts.method ?? 'GET',
        ca: servingCA.certPem,
        agent: false,
        ...(opts.client ?? {}),
        // Raw pairs: Node adds no Host header to those.
        headers: [['Host', `127.0.0.1:${port}`], ...(opts.headers ?? [])].flat(),
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          done({
            status: res.statusCode ?? 0,
            type: String(res.headers['content-type']),
            body: Buffer.concat(chunks).toString(),
          }),
        );
      },
    );
    req.on('error', fail);
    req.end(opts.body);
  });
}

const asUser: [string, string][] = [['X-Remote-User', 'alice']];

describe('the aggregated APIs', () => {
  it('answer health checks from anyone', async () => {
    expect((await call('/readyz')).status).toBe(200);
  });

  it('serve aggregated discovery when asked for it, and the legacy lists otherwise', async () => {
    const v2 = await call('/apis', {
      client: frontProxy,
      headers: [...asUser, ['Accept', `${DISCOVERY_V2},application/json`]],
    });
    expect(v2.type).toBe(DISCOVERY_V2);
    const list = JSON.parse(v2.body) as { items: { metadata: { name: string } }[] };
    expect(list.items.map((i) => i.metadata.name)).toEqual([groups.login, groups.identity]);
    const legacy = await call('/apis', { client: frontProxy, headers: asUser });
    expect(JSON.parse(legacy.body)).toMatchObject({ kind: 'APIGroupList' });
    const resources = await call(`/apis/${groups.login}/v1alpha1`, { client: frontProxy, headers: asUser });
    expect(JSON.parse(resources.body)).toMatchObject({
      kind: 'APIResourceList',
      resources: [{ name: 'tokencredentialrequests', kind: 'TokenCredentialRequest', namespaced: false }],
    });
  });

  it('serve OpenAPI v3 with the kinds kubectl explain looks for', async () => {
    const root = JSON.parse((await call('/openapi/v3', { client: frontProxy, headers: asUser })).body) as {
      paths: Record<string, { serverRelativeURL: string }>;
    };
    const url = root.paths[`apis/${groups.identity}/v1alpha1`]!.serverRelativeURL;
    expect(url).toMatch(/\?hash=[0-9A-F]{128}$/);
    const doc = JSON.parse((await call(url, { client: frontProxy, headers: asUser })).body) as {
      components: { schemas: Record<string, { 'x-kubernetes-group-version-kind': unknown[] }> };
    };
    expect(Object.values(doc.components.schemas)[0]!['x-kubernetes-group-version-kind']).toEqual([
      { group: groups.identity, version: 'v1alpha1', kind: 'WhoAmIRequest' },
    ]);
  });

  it('read the user as the API server writes it: every group, extras unescaped, the uid', async () => {
    const answer = await call(`/apis/${groups.identity}/v1alpha1/whoamirequests`, {
      method: 'POST',
      body: '{}',
      client: frontProxy,
      headers: [
        ['X-Remote-User', 'alice'],
        ['X-Remote-Uid', 'u-1'],
        ['X-Remote-Group', 'devs'],
        // One group with a comma: a reader that joins repeated headers would make two of it.
        ['X-Remote-Group', 'ops, eu'],
        ['X-Remote-Extra-Example.com%2fteam', 'blue'],
        ['X-Remote-Extra-Example.com%2fteam', 'green'],
      ],
    });
    expect(answer.status).toBe(201);
    expect(JSON.parse(answer.body)).toMatchObject({
      status: {
        kubernetesUserInfo: {
          user: {
            username: 'alice',
            uid: 'u-1',
            groups: ['devs', 'ops, eu'],
            extra: { 'example.com/team': ['blue', 'green'] },
          },
        },
      },
    });
    // Delegated authorization asked the cluster about that very user.
    expect(asked.at(-1)).toMatchObject({
      user: 'alice',
      groups: ['devs', 'ops, eu'],
      verb: 'create',
      resource: 'whoamirequests',
    });
  });

  it('refuse with the cluster’s own answer when the user may not', async () => {
    const answer = await call(`/apis/${groups.identity}/v1alpha1/whoamirequests`, {
      method: 'POST',
      body: '{}',
      client: frontProxy,
      headers: [['X-Remote-User', 'denied']],
    });
    expect(answer.status).toBe(403);
  });

  it('give everyone but the front proxy, and the front proxy without a user, the same 401', async () => {
    const stranger = await newCA('stranger');
    const otherCA = await issueCert(stranger, { commonName: 'front-proxy-client', usage: 'client' });
    const otherName = await issueCert(frontProxyCA, { commonName: 'someone-else', usage: 'client' });
    const forged: [string, string][] = [
      ['X-Remote-User', 'admin'],
      ['X-Remote-Group', 'system:masters'],
    ];
    const cases: [string, Parameters<typeof call>[1]][] = [
      ['no certificate', { headers: forged }],
      ['another CA', { headers: forged, client: { cert: otherCA.certPem, key: otherCA.keyPem } }],
      ['another name', { headers: forged, client: { cert: otherName.certPem, key: otherName.keyPem } }],
      ['no user', { client: frontProxy, headers: [['X-Remote-Group', 'system:masters']] }],
      ['a user that is not UTF-8', { client: frontProxy, headers: [['X-Remote-User', '\u00ff']] }],
    ];
    for (const [what, opts] of cases) {
      const answer = await call(`/apis/${groups.identity}/v1alpha1/whoamirequests`, {
        method: 'POST',
        body: '{}',
        ...opts,
      });
      expect([what, answer.status, JSON.parse(answer.body)]).toEqual([
        what,
        401,
        expect.objectContaining({ kind: 'Status', code: 401, message: 'Unauthorized' }),
      ]);
    }
  });

  it('audit each request under the API server’s Audit-ID, and replace a stranger’s', async () => {
    audited.length = 0;
    const id = '6f1c2b1e-0c4e-4b8e-9a57-3d1d1f0e9a10';
    await call('/apis', { client: frontProxy, headers: [...asUser, ['Audit-ID', id]] });
    await call('/apis', { headers: [...asUser, ['Audit-ID', id]] });
    await call('/readyz');
    expect(audited).toEqual([
      { id, user: 'alice', route: 'aggregated', code: 200 },
      { id: expect.not.stringMatching(id) as unknown as string, route: 'aggregated', code: 401 },
    ]);
  });

  it('know nothing else', async () => {
    expect((await call('/api/v1/namespaces', { client: frontProxy, headers: asUser })).status).toBe(404);
  });
});

describe('request-header settings', () => {
  it('are read as the API server publishes them, or refused when unreadable', () => {
    expect(requestHeaderConfig(undefined)).toBeUndefined();
    expect(requestHeaderConfig({ 'requestheader-client-ca-file': '' })).toBeUndefined();
    expect(() =>
      requestHeaderConfig({
        ...CONFIG_DATA('-----BEGIN CERTIFICATE-----'),
        'requestheader-group-headers': '"X"',
      }),
    ).toThrow(/not a JSON array of strings/);
    expect(() =>
      requestHeaderConfig({
        ...CONFIG_DATA('-----BEGIN CERTIFICATE-----'),
        'requestheader-username-headers': '[]',
      }),
    ).toThrow(/names no header/);
  });
});
