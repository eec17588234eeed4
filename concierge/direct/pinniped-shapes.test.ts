// The direct path as Pinniped's CLI uses it, without the CLI (CI cannot fetch it): the TokenCredentialRequest its
// `pinniped login static|oidc --enable-concierge` sends, reaching the aggregated APIs' handler as the cluster's API
// server passes it on, answered with what that CLI reads; and the CredentialIssuer status the strategy publisher
// writes, read by the rule `pinniped get kubeconfig` chooses a frontend by.
//
// What Pinniped's CLI does, read from vmware-tanzu/pinniped at 4c134a4 (July 2025, client-go v0.33.2):
// - pkg/conciergeclient/conciergeclient.go: ExchangeToken creates a TokenCredentialRequest through the generated
//   clientset, on a client built from only --concierge-endpoint and --concierge-ca-bundle-data, with no credential
//   at all: the request is anonymous. spec.token is the token; spec.authenticator is {apiGroup:
//   authentication.concierge.pinniped.dev, kind: WebhookAuthenticator|JWTAuthenticator, name}. The answer is a
//   failure when the HTTP status is not 2xx ("could not login: …"), and also when status.credential is absent or
//   status.message is present, even next to a credential ("login failed: <message>", or "unknown cause"). Otherwise
//   the ExecCredential gets status.credential's expirationTimestamp, clientCertificateData, clientKeyData and token.
// - generated/latest/apis/concierge/login/v1alpha1: TokenCredentialRequest is cluster-scoped
//   (+genclient:nonNamespaced, create only), so the request is POST /apis/login.concierge.<suffix>/v1alpha1/
//   tokencredentialrequests without a namespace; empty CreateOptions add no query.
// - internal/kubeclient/kubeclient.go: that clientset speaks JSON both ways (Content-Type and Accept
//   application/json). Its own test (conciergeclient_test.go) pins the body: kind, apiVersion,
//   metadata {"creationTimestamp": null}, spec {token, authenticator}, status {}.
// - internal/groupsuffix/groupsuffix.go: with --concierge-api-group-suffix other than pinniped.dev, a middleware
//   rewrites the path's group and the body's apiVersion to <prefix>.<suffix>, and spec.authenticator.apiGroup the
//   same way; the answer's apiVersion is turned back only when it is the rewritten group (internal/kubeclient/gvk.go),
//   so it must name login.concierge.<suffix>/v1alpha1, or the typed decoder does not know the kind.
// - metav1.Time reads expirationTimestamp as RFC 3339 (fractional seconds accepted).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { X509Certificate, createPrivateKey } from 'node:crypto';
import { createServer, request, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import type {
  AuthenticatorStatus,
  ConciergeStrategy,
  JWTAuthenticator,
  WebhookAuthenticator,
} from '../../apis/authentication.ts';
import type { CredentialIssuer, CredentialIssuerStatus } from '../../apis/config.ts';
import { apiGroups } from '../../apis/groups.ts';
import {
  CREDENTIAL_ISSUER_KEY,
  newStrategyBoard,
  newStrategyPublisher,
} from '../../controllers/strategies.ts';
import type { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { AuthResult } from '../../lib/authn/types.ts';
import type { AccessQuestion } from '../../lib/kube/access-review.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import type { Reviewer } from '../../lib/kube/kube.ts';
import { RecordingStatusWriter } from '../../lib/kube/status-writer.ts';
import { silentLogger } from '../../lib/log.ts';
import { fingerprint, issueCert, newCA, type CertificateAuthority } from '../../lib/pki/pki.ts';
import { newDirectAPIHandler } from './handler.ts';
import { newClusterCertSigner } from './signer.ts';

const TOKEN = 'a-webhook-token';
/** What the authenticator says of TOKEN. */
const DANA: AuthResult = {
  ok: true,
  authenticator: 'WebhookAuthenticator/corp',
  user: { username: 'dana@example.com', groups: ['demo'], extra: {} },
};
/** client-go's default User-Agent for a binary named pinniped built without version stamps. */
const PINNIPED_USER_AGENT = 'pinniped/v0.0.0 (linux/amd64) kubernetes/$Format';

/** The body Pinniped's CLI sends, byte for byte as Go's encoder orders it, for an API group suffix. */
function pinnipedBody(suffix: string, token = TOKEN): string {
  return JSON.stringify({
    kind: 'TokenCredentialRequest',
    apiVersion: `login.concierge.${suffix}/v1alpha1`,
    metadata: { creationTimestamp: null },
    spec: {
      token,
      authenticator: {
        apiGroup: `authentication.concierge.${suffix}`,
        kind: 'WebhookAuthenticator',
        name: 'corp',
      },
    },
    status: {},
  });
}

type PinnipedReading =
  | { ok: true; expirationTimestamp: string; clientCertificateData: string; clientKeyData: string }
  | { ok: false; failure: 'HTTP status' | 'content type' | 'unknown kind' | 'timestamp' }
  /** A 2xx answer without a credential, or with a message: the CLI reports the message (if any) as a failed login. */
  | { ok: false; failure: 'login failed'; message: string | undefined };

const RFC3339 = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$/;

/** What Pinniped's CLI makes of an answer, by the rules in the header (modelled here, not its code). */
function asPinnipedReadsIt(
  suffix: string,
  answer: { status: number; contentType: string; body: string },
): PinnipedReading {
  if (answer.status < 200 || answer.status > 206) return { ok: false, failure: 'HTTP status' };
  if (!answer.contentType.startsWith('application/json')) return { ok: false, failure: 'content type' };
  const body = JSON.parse(answer.body) as {
    kind?: string;
    apiVersion?: string;
    status?: {
      message?: string;
      credential?: { expirationTimestamp?: string; clientCertificateData?: string; clientKeyData?: string };
    };
  };
  if (body.kind !== 'TokenCredentialRequest' || body.apiVersion !== `login.concierge.${suffix}/v1alpha1`)
    return { ok: false, failure: 'unknown kind' };
  const { credential, message } = body.status ?? {};
  if (!credential || message !== undefined) return { ok: false, failure: 'login failed', message };
  if (!RFC3339.test(credential.expirationTimestamp ?? '')) return { ok: false, failure: 'timestamp' };
  return {
    ok: true,
    expirationTimestamp: credential.expirationTimestamp!,
    clientCertificateData: credential.clientCertificateData ?? '',
    clientKeyData: credential.clientKeyData ?? '',
  };
}

describe("a TokenCredentialRequest exactly as Pinniped's CLI sends it, through the API server's front proxy", () => {
  let frontProxyCA: CertificateAuthority;
  let clusterCA: CertificateAuthority;
  let frontProxy: { certPem: string; keyPem: string };
  let listenerCA: CertificateAuthority;
  const servers: Server[] = [];
  const asked: AccessQuestion[] = [];

  /** The handler for one suffix, behind a TLS listener that asks for the front proxy's certificate. */
  async function serve(suffix: string): Promise<string> {
    const groups = apiGroups(suffix);
    const cache = {
      authenticateWith: (kind: string, name: string, token: string) =>
        Promise.resolve(
          kind === 'WebhookAuthenticator' && name === 'corp' && token === TOKEN
            ? DANA
            : { ok: false, reason: 'no such token' },
        ),
    } as unknown as AuthenticatorCache;
    // As the install's RBAC (and Pinniped's) has it: everybody, signed in or not, may create TokenCredentialRequests.
    const reviewer = {
      allowed: (q: AccessQuestion) => {
        asked.push(q);
        return Promise.resolve(
          q.verb === 'create' &&
            q.group === groups.login &&
            q.resource === 'tokencredentialrequests' &&
            q.groups.some((g) => g === 'system:unauthenticated' || g === 'system:authenticated'),
        );
      },
    } as unknown as Reviewer;
    // The cluster's CSR API, as it answers: a certificate from the cluster's CA for a key made for it.
    const settings = {
      caPem: frontProxyCA.certPem,
      allowedNames: ['front-proxy-client'],
      usernameHeaders: ['x-remote-user'],
      uidHeaders: ['x-remote-uid'],
      groupHeaders: ['x-remote-group'],
      extraHeaderPrefixes: ['x-remote-extra-'],
    };
    const signer = newClusterCertSigner(
      () => ({
        issue: async (identity, seconds) => {
          const issued = await issueCert(clusterCA, {
            commonName: identity.username,
            organizations: identity.groups,
            usage: 'client',
            validityMs: seconds * 1000,
          });
          return { certPem: issued.certPem, keyPem: issued.keyPem, notAfter: issued.cert.notAfter };
        },
        approveOwn: () => Promise.resolve(),
      }),
      () => settings,
    );
    const handler = newDirectAPIHandler({
      groups,
      groupSuffix: suffix,
      requestHeader: () => settings,
      trusted: () => new Set([fingerprint(frontProxyCA.certPem)]),
      login: { groups, cache, signer, log: silentLogger() },
      reviewer,
      log: silentLogger(),
    });
    const serving = await issueCert(listenerCA, { commonName: 'api', hosts: ['127.0.0.1'], usage: 'server' });
    const server = createServer(
      {
        cert: serving.certPem,
        key: serving.keyPem,
        ca: frontProxyCA.certPem,
        requestCert: true,
        rejectUnauthorized: false,
      },
      handler,
    );
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    const url = `https://127.0.0.1:${(server.address() as AddressInfo).port}`;
    servers.push(server);
    return url;
  }

  beforeAll(async () => {
    [frontProxyCA, clusterCA, listenerCA] = await Promise.all([
      newCA('front-proxy-ca'),
      newCA('cluster-ca'),
      newCA('aggregated-api-ca'),
    ]);
    frontProxy = await issueCert(frontProxyCA, { commonName: 'front-proxy-client', usage: 'client' });
  });

  afterAll(async () => {
    for (const server of servers) {
      server.closeAllConnections();
      await new Promise((done) => server.close(done));
    }
  });

  /**
   * Pinniped's request after the API server authenticated it: anonymous, so the front proxy names system:anonymous
   * in system:unauthenticated; the client's own headers pass through.
   */
  function send(
    url: string,
    suffix: string,
    body: string,
  ): Promise<{ status: number; contentType: string; body: string }> {
    return new Promise((done, fail) => {
      const req = request(
        `${url}/apis/login.concierge.${suffix}/v1alpha1/tokencredentialrequests`,
        {
          method: 'POST',
          ca: listenerCA.certPem,
          cert: frontProxy.certPem,
          key: frontProxy.keyPem,
          headers: {
            'content-type': 'application/json',
            accept: 'application/json',
            'user-agent': PINNIPED_USER_AGENT,
            'x-remote-user': 'system:anonymous',
            'x-remote-group': 'system:unauthenticated',
          },
        },
        (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () =>
            done({
              status: res.statusCode ?? 0,
              contentType: String(res.headers['content-type'] ?? ''),
              body: Buffer.concat(chunks).toString(),
            }),
          );
        },
      );
      req.on('error', fail);
      req.end(body);
    });
  }

  // pinniped.dev: the CLI's default, no group rewriting; sealion.dev: the CLI with --concierge-api-group-suffix.
  it.each(['sealion.dev', 'pinniped.dev'])(
    'answers with a credential Pinniped reads, for a key the concierge made (suffix %s)',
    async (suffix) => {
      const url = await serve(suffix);
      asked.length = 0;
      const before = Date.now();
      const answer = await send(url, suffix, pinnipedBody(suffix));
      expect(answer.status).toBe(201);
      const read = asPinnipedReadsIt(suffix, answer);
      if (!read.ok) throw new Error(`Pinniped would fail: ${JSON.stringify(read)}`);
      // What kubectl then presents to the API server: the cluster's certificate, for the key that came with it,
      // naming the user and groups the authenticator said.
      const cert = new X509Certificate(read.clientCertificateData);
      expect(cert.verify(new X509Certificate(clusterCA.certPem).publicKey)).toBe(true);
      expect(cert.checkPrivateKey(createPrivateKey(read.clientKeyData))).toBe(true);
      expect(cert.subject).toBe('O=demo\nCN=dana@example.com');
      expect(Date.parse(read.expirationTimestamp)).toBeGreaterThan(before);
      // The cluster decided whether an anonymous caller may ask, as it would for Pinniped's own APIs.
      expect(asked).toEqual([
        expect.objectContaining({
          user: 'system:anonymous',
          groups: ['system:unauthenticated'],
          verb: 'create',
          group: `login.concierge.${suffix}`,
          resource: 'tokencredentialrequests',
        }),
      ]);
    },
  );

  it('answers a token it does not accept so that Pinniped says login failed, not a transport error', async () => {
    const suffix = 'sealion.dev';
    const url = await serve(suffix);
    const answer = await send(url, suffix, pinnipedBody(suffix, 'not-a-token'));
    expect(answer.status).toBe(201);
    expect(asPinnipedReadsIt(suffix, answer)).toEqual({
      ok: false,
      failure: 'login failed',
      message: 'authentication failed',
    });
  });
});

// What `pinniped get kubeconfig` does with the CredentialIssuer (cmd/pinniped/cmd/kubeconfig.go and flag_types.go
// at the same commit): it lists CredentialIssuers of config.concierge.<--concierge-api-group-suffix> and needs exactly
// one (or --concierge-credential-issuer); unless --concierge-skip-wait, it polls every 2 s while any strategy's reason
// is Pending. Then it walks status.strategies in order and takes the frontend of the first strategy whose status is
// Success, that has a frontend, whose frontend.type is TokenCredentialRequestAPI or ImpersonationProxy, and that
// matches --concierge-mode (unset: any; TokenCredentialRequestAPI or ImpersonationProxy: that frontend type only).
// The strategy's own type is never looked at. For a TokenCredentialRequestAPI frontend it keeps the admin
// kubeconfig's cluster (server and CA) and uses it as the concierge endpoint, not tokenCredentialRequestInfo; for
// ImpersonationProxy it uses impersonationProxyInfo.endpoint and the base64-decoded certificateAuthorityData.
type PinnipedMode = '' | 'TokenCredentialRequestAPI' | 'ImpersonationProxy';
interface PinnipedChoice {
  mode: 'TokenCredentialRequestAPI' | 'ImpersonationProxy';
  endpoint: string;
}

/** The rule above, over a CredentialIssuer status as JSON (as the CLI gets it); `admin`: the admin's server. */
function pinnipedChooses(
  status: unknown,
  mode: PinnipedMode,
  admin: string,
): PinnipedChoice | { waits: true } | { error: string } {
  const strategies = (status as { strategies?: Record<string, unknown>[] } | undefined)?.strategies ?? [];
  if (strategies.some((s) => s['reason'] === 'Pending')) return { waits: true };
  for (const s of strategies) {
    const frontend = s['frontend'] as Record<string, Record<string, string> | string> | undefined;
    if (s['status'] !== 'Success' || !frontend) continue;
    const type = frontend['type'];
    if (type !== 'TokenCredentialRequestAPI' && type !== 'ImpersonationProxy') continue;
    if (mode && mode !== type) continue;
    if (type === 'TokenCredentialRequestAPI') return { mode: type, endpoint: admin };
    const info = frontend['impersonationProxyInfo'] as Record<string, string>;
    return { mode: type, endpoint: info['endpoint']! };
  }
  return { error: `no usable frontend${mode ? ` of type ${mode}` : ''}` };
}

const T = '2026-01-01T00:00:00.000Z';
const API_SERVER = 'https://10.0.0.1:6443';
const PROXY = 'https://proxy.example.com';
const direct = (status: 'Success' | 'Error' | 'NotAvailable'): ConciergeStrategy => ({
  type: 'TokenCredentialRequestAPI',
  status,
  reason: status === 'Success' ? 'ClusterSigns' : status === 'Error' ? 'ClusterDoesNotSign' : 'Disabled',
  message: 'why',
  lastUpdateTime: T,
  ...(status === 'Success'
    ? { tokenCredentialRequestConfig: { endpoint: API_SERVER, certificateAuthorityData: 'QVBJIENB' } }
    : {}),
});
const proxy = (status: 'Success' | 'Error' | 'NotAvailable', reason = ''): ConciergeStrategy => ({
  type: 'ImpersonationProxy',
  status,
  reason: (reason || (status === 'Success' ? 'Listening' : 'Disabled')) as ConciergeStrategy['reason'],
  message: 'why',
  lastUpdateTime: T,
  ...(status === 'Success'
    ? { impersonationProxyConfig: { endpoint: PROXY, certificateAuthorityData: 'UFJPWFkgQ0E=' } }
    : {}),
});

/** The CredentialIssuer status the strategy publisher writes for these strategies, as JSON on the wire. */
async function publishedStatus(strategies: ConciergeStrategy[]): Promise<unknown> {
  const board = newStrategyBoard();
  for (const s of strategies) board.set(s);
  const issuerStatus = new RecordingStatusWriter<CredentialIssuerStatus>();
  const publisher = newStrategyPublisher({
    strategies: () => board.list(),
    jwtAuthenticators: new MemoryInformer<JWTAuthenticator>(),
    webhookAuthenticators: new MemoryInformer<WebhookAuthenticator>(),
    jwtStatus: new RecordingStatusWriter<AuthenticatorStatus>(),
    webhookStatus: new RecordingStatusWriter<AuthenticatorStatus>(),
    credentialIssuer: {
      name: 'sealion-concierge-config',
      informer: new MemoryInformer<CredentialIssuer>(),
      spec: () => ({ impersonationProxy: { mode: 'auto' } }),
      applySpec: () => Promise.resolve(),
      status: issuerStatus,
    },
    log: silentLogger(),
  });
  await publisher.sync(CREDENTIAL_ISSUER_KEY, new AbortController().signal);
  return JSON.parse(JSON.stringify(issuerStatus.writes.at(-1)?.status)) as unknown;
}

describe("the CredentialIssuer the strategy publisher writes, as Pinniped's get kubeconfig reads it", () => {
  const ADMIN = 'https://admin.example.com:6443';

  it.each([
    [
      'a self-hosted cluster: direct only',
      [direct('Success'), proxy('NotAvailable')],
      '',
      'TokenCredentialRequestAPI',
    ],
    [
      'both working: direct, listed first',
      [proxy('Success'), direct('Success')],
      '',
      'TokenCredentialRequestAPI',
    ],
    [
      'both working, the proxy asked for',
      [direct('Success'), proxy('Success')],
      'ImpersonationProxy',
      'ImpersonationProxy',
    ],
    ['direct broken: the proxy', [direct('Error'), proxy('Success')], '', 'ImpersonationProxy'],
    ['a managed cluster: the proxy', [direct('NotAvailable'), proxy('Success')], '', 'ImpersonationProxy'],
  ] as const)('%s', async (_, strategies, mode, wanted) => {
    const status = await publishedStatus([...strategies]);
    const chosen = pinnipedChooses(status, mode, ADMIN);
    expect(chosen).toEqual({
      mode: wanted,
      endpoint: wanted === 'TokenCredentialRequestAPI' ? ADMIN : PROXY,
    });
  });

  it('names the fields Pinniped decodes, and the direct frontend says where the API server is', async () => {
    const status = (await publishedStatus([direct('Success'), proxy('Success')])) as {
      strategies: Record<string, unknown>[];
    };
    for (const s of status.strategies) {
      expect(Object.keys(s).sort()).toEqual([
        'frontend',
        'lastUpdateTime',
        'message',
        'reason',
        'status',
        'type',
      ]);
      expect(s['lastUpdateTime']).toMatch(RFC3339);
    }
    expect(status.strategies[0]!['frontend']).toEqual({
      type: 'TokenCredentialRequestAPI',
      tokenCredentialRequestInfo: { server: API_SERVER, certificateAuthorityData: 'QVBJIENB' },
    });
    expect(status.strategies[1]!['frontend']).toEqual({
      type: 'ImpersonationProxy',
      impersonationProxyInfo: { endpoint: PROXY, certificateAuthorityData: 'UFJPWFkgQ0E=' },
    });
  });

  it('--concierge-mode TokenCredentialRequestAPI where the direct path is off finds nothing, as it should', async () => {
    const status = await publishedStatus([direct('NotAvailable'), proxy('Success')]);
    expect(pinnipedChooses(status, 'TokenCredentialRequestAPI', ADMIN)).toEqual({
      error: 'no usable frontend of type TokenCredentialRequestAPI',
    });
  });

  it('a Pending proxy makes Pinniped wait even where the direct path works (its rule, not ours)', async () => {
    const status = await publishedStatus([direct('Success'), proxy('Error', 'Pending')]);
    expect(pinnipedChooses(status, '', ADMIN)).toEqual({ waits: true });
  });
});
