// Both authenticator kinds on a real API server: statuses that follow reality, and tokens from real issuers.
// The webhook is the real kube-apiserver's own TokenReview API; the JWT issuer is the local HTTPS issuer.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { conciergeControllers, newAuthenticators, type Authenticators } from '../concierge/controllers.ts';
import { systemClock } from '../lib/clock.ts';
import { newControllerManager, type ControllerManager } from '../lib/controller/manager.ts';
import { newKubeClients, newKubeInformers, type KubeInformers } from '../lib/kube/kube.ts';
import { silentLogger } from '../lib/log.ts';
import { newCA } from '../lib/pki/pki.ts';
import { startCluster, type Cluster } from '../dev/cluster.ts';
import { installCRDs } from '../dev/concierge.ts';
import { eventually } from '../dev/eventually.ts';
import { startOIDCIssuer, type TestIssuer } from '../dev/oidc-issuer.ts';

const GROUP = 'authentication.concierge.sealion.dev';

interface Status {
  phase?: string;
  conditions?: { type: string; status: string; reason: string; message: string }[];
}

describe('authenticators on a real API server', () => {
  let cluster: Cluster;
  let issuer: TestIssuer;
  let manager: ControllerManager;
  let informers: KubeInformers;
  let authenticators: Authenticators;
  let otherCA: string;

  const apply = async (object: object): Promise<void> => {
    const result = await cluster.kubectl(['apply', '-f', '-'], { input: JSON.stringify(object) });
    expect(result.stderr).toBe('');
  };
  const statusOf = async (kind: string, name: string): Promise<Status> => {
    const result = await cluster.kubectl(['get', `${kind}.${GROUP}`, name, '-o', 'jsonpath={.status}']);
    return JSON.parse(result.stdout || '{}') as Status;
  };
  const waitForPhase = (kind: string, name: string, phase: string): Promise<Status> =>
    eventually(async () => {
      const status = await statusOf(kind, name);
      expect(status.phase).toBe(phase);
      return status;
    }, 30_000);
  const jwt = (name: string, spec: object): object => ({
    apiVersion: `${GROUP}/v1alpha1`,
    kind: 'JWTAuthenticator',
    metadata: { name },
    spec,
  });
  const webhook = (name: string, spec: object): object => ({
    apiVersion: `${GROUP}/v1alpha1`,
    kind: 'WebhookAuthenticator',
    metadata: { name },
    spec,
  });

  beforeAll(async () => {
    cluster = await startCluster({ name: 'authn', controllerManager: false });
    await installCRDs(cluster);
    issuer = await startOIDCIssuer({ audience: 'sealion-demo' });
    otherCA = Buffer.from((await newCA('unrelated')).certPem).toString('base64');
    // A manager with no election: this process writes status, as a single replica does.
    manager = newControllerManager({ log: silentLogger() });
    const clients = newKubeClients({ path: cluster.kubeconfigPath });
    informers = newKubeInformers(clients, silentLogger());
    authenticators = newAuthenticators(informers, 'sealion.dev');
    // The concierge's list with no proxy and no tunnel: the authenticators' controllers alone.
    manager.add(
      ...(await conciergeControllers({
        manager,
        clients,
        informers,
        groupSuffix: 'sealion.dev',
        authenticators,
        clock: systemClock,
        log: silentLogger(),
      })),
    );
    await manager.start();
  });

  afterAll(async () => {
    await manager?.stop();
    await informers?.stop();
    authenticators?.cache.close();
    await issuer?.stop();
    await cluster?.stop();
  });

  it('makes a JWTAuthenticator Ready and authenticates its tokens to the right user and groups', async () => {
    await apply(
      jwt('corp', {
        issuer: issuer.url,
        audience: 'sealion-demo',
        tls: { certificateAuthorityData: issuer.caData },
      }),
    );
    const status = await waitForPhase('jwtauthenticator', 'corp', 'Ready');
    expect(status.conditions?.map((c) => `${c.type}=${c.status}`).sort()).toEqual([
      'AuthenticatorValid=True',
      'DiscoveryURLValid=True',
      'IssuerURLValid=True',
      'JWKSFetchValid=True',
      'JWKSURLValid=True',
      'Ready=True',
      'TLSConfigurationValid=True',
    ]);
    const token = await issuer.mint({ username: 'pat@example.com', groups: ['platform', 'oncall'] });
    expect(await authenticators.cache.authenticate(token)).toEqual({
      ok: true,
      authenticator: 'JWTAuthenticator/corp',
      user: { username: 'pat@example.com', groups: ['platform', 'oncall'], extra: {} },
      // A verified JWT's answer may be given again until the token expires (at most a minute).
      reusableUntil: expect.any(Number),
    });
  });

  it('turns Error with the reason when the CA is wrong, stops authenticating, and recovers when fixed', async () => {
    const token = await issuer.mint({ username: 'pat@example.com' });
    await apply(
      jwt('corp', {
        issuer: issuer.url,
        audience: 'sealion-demo',
        tls: { certificateAuthorityData: otherCA },
      }),
    );
    const broken = await waitForPhase('jwtauthenticator', 'corp', 'Error');
    const discovery = broken.conditions?.find((c) => c.type === 'DiscoveryURLValid');
    expect(discovery).toMatchObject({ status: 'False', reason: 'InvalidDiscoveryProbe' });
    expect(discovery?.message).toMatch(/could not fetch .*certificate/);
    expect(broken.conditions?.find((c) => c.type === 'Ready')).toMatchObject({
      status: 'False',
      reason: 'NotReady',
    });
    // It left the cache before its status said Error.
    expect(await authenticators.cache.authenticate(token)).toMatchObject({ ok: false });

    await apply(
      jwt('corp', {
        issuer: issuer.url,
        audience: 'sealion-demo',
        tls: { certificateAuthorityData: issuer.caData },
      }),
    );
    await waitForPhase('jwtauthenticator', 'corp', 'Ready');
    expect(await authenticators.cache.authenticate(token)).toMatchObject({ ok: true });
  });

  it('turns Error when the issuer URL serves no discovery', async () => {
    await apply(
      jwt('wrong-path', {
        issuer: `${issuer.url}/nowhere`,
        audience: 'x',
        tls: { certificateAuthorityData: issuer.caData },
      }),
    );
    const status = await waitForPhase('jwtauthenticator', 'wrong-path', 'Error');
    expect(status.conditions?.find((c) => c.type === 'DiscoveryURLValid')).toMatchObject({
      status: 'False',
      reason: 'InvalidDiscoveryProbe',
      message: expect.stringContaining('HTTP 404') as unknown,
    });
    expect(status.conditions?.find((c) => c.type === 'JWKSFetchValid')).toMatchObject({
      status: 'Unknown',
      reason: 'UnableToValidate',
    });
  });

  it("uses the real API server's TokenReview API as a webhook, and follows a broken and fixed CA", async () => {
    // The API server answers TokenReviews from anyone allowed to create them; here, anonymous callers.
    await cluster.kubectl([
      'create',
      'clusterrole',
      'anonymous-tokenreview',
      '--verb=create',
      '--resource=tokenreviews.authentication.k8s.io',
    ]);
    await cluster.kubectl([
      'create',
      'clusterrolebinding',
      'anonymous-tokenreview',
      '--clusterrole=anonymous-tokenreview',
      '--user=system:anonymous',
    ]);
    await cluster.kubectl(['create', 'namespace', 'tenants']);
    await cluster.kubectl(['create', 'serviceaccount', 'robot', '-n', 'tenants']);
    const token = (await cluster.kubectl(['create', 'token', 'robot', '-n', 'tenants'])).stdout.trim();
    expect(token.split('.')).toHaveLength(3);

    const endpoint = `${cluster.url}/apis/authentication.k8s.io/v1/tokenreviews`;
    const clusterCA = Buffer.from(cluster.ca.certPem).toString('base64');
    // Service-account users are system:serviceaccount:…, system names that a webhook may only pass on when its
    // authenticator opts out.
    await apply(webhook('kube', { endpoint, tls: { certificateAuthorityData: clusterCA } }));
    await waitForPhase('webhookauthenticator', 'kube', 'Ready');
    expect(await authenticators.cache.authenticate(token)).toMatchObject({
      ok: false,
      reason: expect.stringMatching(
        /username "system:serviceaccount:tenants:robot" is a system name/,
      ) as unknown,
    });
    await apply(
      webhook('kube', { endpoint, tls: { certificateAuthorityData: clusterCA }, allowSystemNames: true }),
    );
    const trusting = await eventually(async () => {
      const status = await statusOf('webhookauthenticator', 'kube');
      const valid = status.conditions?.find((c) => c.type === 'AuthenticatorValid');
      expect(valid?.message).toContain('spec.allowSystemNames');
      return status;
    }, 30_000);
    expect(trusting.phase).toBe('Ready');
    const result = await eventually(async () => {
      const answer = await authenticators.cache.authenticate(token);
      expect(answer.ok).toBe(true);
      return answer;
    });
    expect(result).toMatchObject({
      ok: true,
      authenticator: 'WebhookAuthenticator/kube',
      user: { username: 'system:serviceaccount:tenants:robot' },
    });
    expect(result.ok && result.user.groups).toEqual(
      expect.arrayContaining(['system:serviceaccounts', 'system:serviceaccounts:tenants']),
    );
    expect(await authenticators.cache.authenticate('not-a-real-token')).toMatchObject({ ok: false });

    await apply(
      webhook('kube', { endpoint, tls: { certificateAuthorityData: otherCA }, allowSystemNames: true }),
    );
    const broken = await waitForPhase('webhookauthenticator', 'kube', 'Error');
    expect(broken.conditions?.find((c) => c.type === 'WebhookConnectionValid')).toMatchObject({
      status: 'False',
      reason: 'UnableToDialServer',
    });
    await apply(
      webhook('kube', { endpoint, tls: { certificateAuthorityData: clusterCA }, allowSystemNames: true }),
    );
    await waitForPhase('webhookauthenticator', 'kube', 'Ready');
  });

  it('forgets a deleted authenticator', async () => {
    const token = await issuer.mint({ username: 'pat@example.com' });
    expect(await authenticators.cache.authenticate(token)).toMatchObject({ ok: true });
    await cluster.kubectl(['delete', `jwtauthenticator.${GROUP}`, 'corp']);
    await eventually(async () =>
      expect(await authenticators.cache.authenticate(token)).toMatchObject({ ok: false }),
    );
  });
});
