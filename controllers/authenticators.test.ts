import { afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer as createTLSServer } from 'node:tls';
import type { AddressInfo } from 'node:net';
import { Writable } from 'node:stream';
import { exportJWK, generateKeyPair, SignJWT, type CryptoKey, type JWK } from 'jose';
import type { AuthenticatorStatus, JWTAuthenticator, WebhookAuthenticator } from '../apis/authentication.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import { JWKS_REFRESH_INTERVAL_MS } from '../lib/authn/jwt.ts';
import { jwtTrustDigest, webhookTrustDigest } from '../lib/authn/trust.ts';
import { MemoryInformer } from '../lib/kube/informer.ts';
import { newLogger, silentLogger, type Logger } from '../lib/log.ts';
import { RecordingStatusWriter } from '../lib/kube/status-writer.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import {
  newJWTAuthenticatorControllers,
  newWebhookAuthenticatorControllers,
  type AuthenticatorControllers,
} from './authenticators.ts';
import type { SyncResult } from '../lib/controller/queue.ts';

/** A signal that never aborts, for syncs called directly. */
const never = new AbortController().signal;

const ISSUER = 'https://issuer.example.com';
const NOW = new Date('2026-01-02T03:04:05Z');
let jwk: JWK;
let signingKey: CryptoKey;
let caData: string;

beforeAll(async () => {
  const { publicKey, privateKey } = await generateKeyPair('ES256');
  jwk = { ...(await exportJWK(publicKey)), kid: 'k1' };
  signingKey = privateKey;
  caData = Buffer.from((await newCA('ca')).certPem).toString('base64');
});

function jwtObject(
  spec: Partial<JWTAuthenticator['spec']> = {},
  status?: AuthenticatorStatus,
): JWTAuthenticator {
  return {
    apiVersion: 'authentication.concierge.sealion.dev/v1alpha1',
    kind: 'JWTAuthenticator',
    metadata: { name: 'corp', generation: 3 },
    spec: { issuer: ISSUER, audience: 'aud', ...spec },
    ...(status ? { status } : {}),
  };
}

type Documents = Record<string, unknown>;
const goodDocuments = (): Documents => ({
  [`${ISSUER}/.well-known/openid-configuration`]: { issuer: ISSUER, jwks_uri: `${ISSUER}/keys` },
  [`${ISSUER}/keys`]: { keys: [jwk] },
});

const caches: AuthenticatorCache[] = [];
afterEach(() => caches.splice(0).forEach((c) => c.close()));

/** A token from ISSUER for audience `aud`, signed with the published key. */
const tokenWith = (claims: Record<string, unknown>): Promise<string> =>
  new SignJWT(claims)
    .setProtectedHeader({ alg: 'ES256', kid: 'k1' })
    .setIssuer(ISSUER)
    .setAudience('aud')
    .setExpirationTime('5m')
    .sign(signingKey);

/** A logger whose lines the test can read. */
function recordingLogger(): { log: Logger; lines: () => { level: number; msg: string; name?: string }[] } {
  let text = '';
  const log = newLogger({
    destination: new Writable({
      write(chunk: Buffer, _enc, next) {
        text += chunk.toString();
        next();
      },
    }),
  });
  return {
    log,
    lines: () =>
      text
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as { level: number; msg: string; name?: string }),
  };
}

/**
 * One replica's sync of an authenticator: the validator runs everywhere, the status writer where `leading` holds
 * (the controller manager runs it on the leader only).
 */
function replica(controllers: AuthenticatorControllers, leading: () => boolean = () => true) {
  return {
    async sync(name: string): Promise<SyncResult> {
      const result = await controllers.validator.sync(name, never);
      if (leading()) await controllers.status.sync(name, never);
      return result;
    },
  };
}

async function runJWT(obj: JWTAuthenticator | undefined, documents: Documents, log: Logger = silentLogger()) {
  const informer = new MemoryInformer<JWTAuthenticator>(obj ? [obj] : []);
  const cache = new AuthenticatorCache();
  caches.push(cache);
  const status = new RecordingStatusWriter<AuthenticatorStatus>();
  const fetchJSON = (url: string): Promise<unknown> =>
    url in documents ? Promise.resolve(documents[url]) : Promise.reject(new Error(`HTTP 404 for ${url}`));
  const controller = replica(
    newJWTAuthenticatorControllers({ informer, cache, status, log, now: () => NOW }, { fetchJSON }),
  );
  const result = await controller.sync('corp');
  return { cache, status, result, informer, controller };
}

const conditionSummary = (s: AuthenticatorStatus | undefined): string[] =>
  (s?.conditions ?? []).map((c) => `${c.type}=${c.status}/${c.reason}`);

describe('JWTAuthenticator controller', () => {
  it.each<[string, Partial<JWTAuthenticator['spec']>, (d: Documents) => Documents, string, string[]]>([
    ['a working issuer', {}, (d) => d, 'Ready', ['JWKSFetchValid=True/Success', 'Ready=True/Success']],
    [
      'a CA bundle that is not PEM',
      { tls: { certificateAuthorityData: Buffer.from('nope').toString('base64') } },
      (d) => d,
      'Error',
      [
        'TLSConfigurationValid=False/InvalidTLSConfiguration',
        'IssuerURLValid=Unknown/UnableToValidate',
        'Ready=False/NotReady',
      ],
    ],
    [
      'discovery naming another issuer',
      {},
      (d) => ({
        ...d,
        [`${ISSUER}/.well-known/openid-configuration`]: {
          issuer: 'https://evil.example.com',
          jwks_uri: `${ISSUER}/keys`,
        },
      }),
      'Error',
      ['DiscoveryURLValid=False/InvalidDiscoveryProbe', 'JWKSURLValid=Unknown/UnableToValidate'],
    ],
    [
      'a jwks_uri over http',
      {},
      (d) => ({
        ...d,
        [`${ISSUER}/.well-known/openid-configuration`]: {
          issuer: ISSUER,
          jwks_uri: 'http://issuer.example.com/keys',
        },
      }),
      'Error',
      ['JWKSURLValid=False/InvalidProviderJWKSURL'],
    ],
    [
      'an empty key set',
      {},
      (d) => ({ ...d, [`${ISSUER}/keys`]: { keys: [] } }),
      'Error',
      ['JWKSFetchValid=False/InvalidCouldNotFetchJWKS'],
    ],
    [
      'an unreachable issuer',
      {},
      () => ({}),
      'Error',
      ['DiscoveryURLValid=False/InvalidDiscoveryProbe', 'AuthenticatorValid=Unknown/UnableToValidate'],
    ],
  ])('with %s: writes phase %s and the conditions', async (_name, spec, documents, phase, wanted) => {
    const { cache, status, result } = await runJWT(jwtObject(spec), documents(goodDocuments()));
    expect(status.writes).toHaveLength(1);
    const written = status.writes[0]!.status;
    expect(written.phase).toBe(phase);
    expect(conditionSummary(written)).toEqual(expect.arrayContaining(wanted));
    expect(written.conditions).toHaveLength(7);
    expect(
      written.conditions?.every(
        (c) => c.lastTransitionTime === NOW.toISOString() && c.observedGeneration === 3,
      ),
    ).toBe(true);
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(phase === 'Ready');
    // What the issuer did is retried with backoff; a mistake in the spec waits for its edit; success comes back
    // when the issuer's keys are due for a refresh.
    const specMistake = wanted.some((c) => /^(TLSConfigurationValid|IssuerURLValid)=False/.test(c));
    expect(result).toEqual(
      phase === 'Ready' ? { requeueAfterMs: expect.any(Number) } : specMistake ? undefined : { retry: true },
    );
  });

  it("refreshes the issuer's keys when due, has a failing refresh retried, and stops with the authenticator", async () => {
    let clock = NOW.getTime();
    let down = false;
    const documents = goodDocuments();
    let keyFetches = 0;
    const fetchJSON = (url: string): Promise<unknown> => {
      if (url === `${ISSUER}/keys`) keyFetches++;
      return down ? Promise.reject(new Error('HTTP 503')) : Promise.resolve(documents[url]);
    };
    const informer = new MemoryInformer<JWTAuthenticator>([jwtObject()]);
    const cache = new AuthenticatorCache();
    caches.push(cache);
    const status = new RecordingStatusWriter<AuthenticatorStatus>();
    const { validator } = newJWTAuthenticatorControllers(
      { informer, cache, status, log: silentLogger(), now: () => NOW },
      { fetchJSON, now: () => clock },
    );
    const comesBackIn = async (): Promise<number> => {
      const result = await validator.sync('corp', never);
      return (result as { requeueAfterMs: number }).requeueAfterMs;
    };
    // The first fetch is the validation's; the controller comes back when the keys are due (jittered).
    const first = await comesBackIn();
    expect(keyFetches).toBe(1);
    expect(first).toBeGreaterThanOrEqual(0.9 * JWKS_REFRESH_INTERVAL_MS);
    expect(first).toBeLessThanOrEqual(1.1 * JWKS_REFRESH_INTERVAL_MS);
    // Woken early (an event, a resync): nothing fetched, the same time left.
    clock += 1_000;
    expect(await comesBackIn()).toBe(first - 1_000);
    expect(keyFetches).toBe(1);
    // Due: fetched again, and due again an interval later.
    clock += first;
    expect(await comesBackIn()).toBeGreaterThanOrEqual(0.9 * JWKS_REFRESH_INTERVAL_MS);
    expect(keyFetches).toBe(2);
    // The issuer down when due: the sync fails, so the queue retries it with backoff; the last good keys still serve.
    clock += 1.1 * JWKS_REFRESH_INTERVAL_MS;
    down = true;
    await expect(validator.sync('corp', never)).rejects.toThrow('jwks refresh');
    await expect(validator.sync('corp', never)).rejects.toThrow('jwks refresh');
    expect(keyFetches).toBe(4);
    expect((await cache.authenticate(await tokenWith({ username: 'alice' }))).ok).toBe(true);
    down = false;
    expect(await comesBackIn()).toBeGreaterThanOrEqual(0.9 * JWKS_REFRESH_INTERVAL_MS);
    expect(keyFetches).toBe(5);
    // Removed: out of the cache, and nothing to come back for.
    informer.remove('corp');
    clock += 2 * JWKS_REFRESH_INTERVAL_MS;
    expect(await validator.sync('corp', never)).toBeUndefined();
    expect(keyFetches).toBe(5);
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(false);
  });

  it('takes a jwt entry of AuthenticationConfiguration, and says where one is wrong', async () => {
    const jwt = {
      issuer: { url: ISSUER, audiences: ['other', 'aud'], audienceMatchPolicy: 'MatchAny' as const },
      claimMappings: {
        username: { expression: "'u:' + claims.sub" },
        groups: { claim: 'groups', prefix: 'g:' },
      },
    };
    const ok = await runJWT({ ...jwtObject(), spec: { jwt } }, goodDocuments());
    expect(ok.status.writes[0]!.status.phase).toBe('Ready');
    expect(await ok.cache.authenticate(await tokenWith({ sub: 's1', groups: ['dev'] }))).toMatchObject({
      ok: true,
      user: { username: 'u:s1', groups: ['g:dev'] },
    });
    const broken = await runJWT(
      {
        ...jwtObject(),
        spec: { jwt: { ...jwt, claimMappings: { username: { expression: 'claims.sub +' } } } },
      },
      goodDocuments(),
    );
    const condition = broken.status.writes[0]!.status.conditions?.find(
      (c) => c.type === 'AuthenticatorValid',
    );
    expect(condition).toMatchObject({ status: 'False' });
    expect(condition?.message).toMatch(/^spec\.jwt\.claimMappings\.username\.expression: 1:\d+: /);
  });

  it('reads its CA from a ConfigMap, and validates again when it is rotated', async () => {
    const ca = await newCA('issuer-ca');
    const configMaps = new MemoryInformer<{
      metadata: { name: string; namespace: string };
      data?: Record<string, string>;
    }>([{ metadata: { name: 'issuer-ca', namespace: 'sealion' }, data: { 'ca.crt': ca.certPem } }]);
    const informer = new MemoryInformer<JWTAuthenticator>([
      jwtObject({
        tls: { certificateAuthorityDataSource: { kind: 'ConfigMap', name: 'issuer-ca', key: 'ca.crt' } },
      }),
    ]);
    const cache = new AuthenticatorCache();
    caches.push(cache);
    const status = new RecordingStatusWriter<AuthenticatorStatus>();
    const seen: (string | undefined)[] = [];
    const documents = goodDocuments();
    const controllers = newJWTAuthenticatorControllers(
      {
        informer,
        cache,
        status,
        log: silentLogger(),
        now: () => NOW,
        caSources: { namespace: 'sealion', secrets: new MemoryInformer(), configMaps },
      },
      {
        fetchJSON: (url, caBundlePem) => {
          seen.push(caBundlePem);
          return Promise.resolve(documents[url]);
        },
      },
    );
    await controllers.validator.sync('corp', never);
    expect(seen.at(-1)).toContain(ca.certPem.trim().split('\n')[1]);
    // Rotated: the ConfigMap's watch names the authenticator, which is validated again with the new bundle.
    const next = await newCA('issuer-ca-2');
    const rotated = {
      metadata: { name: 'issuer-ca', namespace: 'sealion' },
      data: { 'ca.crt': next.certPem },
    };
    configMaps.put(rotated);
    const watch = controllers.validator.watches.find((w) => w.informer === configMaps)!;
    expect(watch.key!(rotated as never)).toEqual(['corp']);
    await controllers.validator.sync('corp', never);
    expect(seen.at(-1)).toContain(next.certPem.trim().split('\n')[1]);
    // Gone: the TLS check says where it looked.
    configMaps.remove('issuer-ca', 'sealion');
    await controllers.validator.sync('corp', never);
    await controllers.status.sync('corp', never);
    expect(
      status.writes.at(-1)!.status.conditions?.find((c) => c.type === 'TLSConfigurationValid')?.message,
    ).toBe('spec.tls.certificateAuthorityDataSource: ConfigMap sealion/issuer-ca does not exist');
  });

  it('skips the write when the status is already what it would write', async () => {
    const first = await runJWT(jwtObject(), goodDocuments());
    const second = await runJWT(jwtObject({}, first.status.writes[0]!.status), goodDocuments());
    expect(second.status.writes).toEqual([]);
    expect(second.cache.has('JWTAuthenticator', 'corp')).toBe(true);
  });

  it('keeps lastTransitionTime of conditions whose status did not change', async () => {
    const earlier = '2025-12-31T00:00:00.000Z';
    const first = await runJWT(jwtObject(), goodDocuments());
    const old = first.status.writes[0]!.status;
    const aged = { ...old, conditions: old.conditions!.map((c) => ({ ...c, lastTransitionTime: earlier })) };
    const broken = await runJWT(jwtObject({ audience: 'changed' }, aged), {
      ...goodDocuments(),
      [`${ISSUER}/keys`]: { keys: [] },
    });
    const byType = Object.fromEntries(
      broken.status.writes[0]!.status.conditions!.map((c) => [c.type, c.lastTransitionTime]),
    );
    expect(byType['IssuerURLValid']).toBe(earlier);
    expect(byType['JWKSFetchValid']).toBe(NOW.toISOString());
  });

  it('validates again only when the spec changes, and drops the authenticator when it breaks', async () => {
    const { cache, status, informer, controller } = await runJWT(jwtObject(), goodDocuments());
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(true);
    // The watch brings the written status back.
    informer.put(jwtObject({}, status.writes[0]!.status));
    await controller.sync('corp');
    expect(status.writes).toHaveLength(1);
    informer.put(jwtObject({ tls: { certificateAuthorityData: 'bm90IGEgY2VydA==' } }));
    await controller.sync('corp');
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(false);
    expect(status.writes.at(-1)?.status.phase).toBe('Error');
  });

  it('fills the cache on a follower without writing status, and writes once it leads', async () => {
    const informer = new MemoryInformer<JWTAuthenticator>([jwtObject()]);
    const status = new RecordingStatusWriter<AuthenticatorStatus>();
    const cache = new AuthenticatorCache();
    caches.push(cache);
    const docs = goodDocuments();
    let leading = false;
    const controller = replica(
      newJWTAuthenticatorControllers(
        { informer, cache, status, log: silentLogger(), now: () => NOW },
        { fetchJSON: (url) => Promise.resolve(docs[url]) },
      ),
      () => leading,
    );
    await controller.sync('corp');
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(true);
    expect(status.writes).toHaveLength(0);
    leading = true;
    await controller.sync('corp');
    expect(status.writes.map((w) => w.status.phase)).toEqual(['Ready']);
  });

  it('gives up a discovery when its signal aborts (the manager stopped), leaving the cache as it was', async () => {
    const informer = new MemoryInformer<JWTAuthenticator>([jwtObject()]);
    const status = new RecordingStatusWriter<AuthenticatorStatus>();
    const cache = new AuthenticatorCache();
    caches.push(cache);
    let asked: AbortSignal | undefined;
    const { validator } = newJWTAuthenticatorControllers(
      { informer, cache, status, log: silentLogger(), now: () => NOW },
      {
        fetchJSON: (_url, _ca, signal) =>
          new Promise((_done, fail) => {
            asked = signal;
            signal?.addEventListener('abort', () => fail(new Error('aborted')));
          }),
      },
    );
    const stopping = new AbortController();
    const sync = validator.sync('corp', stopping.signal);
    await new Promise((done) => setImmediate(done));
    expect(asked).toBe(stopping.signal);
    stopping.abort(new Error('stopped'));
    await expect(sync).rejects.toThrow('stopped');
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(false);
    expect(status.writes).toHaveLength(0);
  });

  it('removes a deleted authenticator from the cache without writing', async () => {
    const { cache, status, informer, controller } = await runJWT(jwtObject(), goodDocuments());
    informer.remove('corp');
    await controller.sync('corp');
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(false);
    expect(status.writes).toHaveLength(1);
  });

  const claimingSystemNames = { username: 'system:admin', groups: ['system:masters', 'dev'] };

  it.each<[string, Partial<JWTAuthenticator['spec']>, object]>([
    ['no prefixes', {}, { ok: false }],
    [
      'claims.usernamePrefix and claims.groupsPrefix',
      { claims: { usernamePrefix: 'oidc:', groupsPrefix: 'oidc:' } },
      { ok: true, user: { username: 'oidc:system:admin', groups: ['oidc:system:masters', 'oidc:dev'] } },
    ],
    [
      'custom claim names and prefixes',
      { claims: { username: 'email', groups: 'roles', usernamePrefix: 'corp:', groupsPrefix: 'corp:' } },
      { ok: true, user: { username: 'corp:system:admin@example.com', groups: ['corp:system:masters'] } },
    ],
    [
      'allowSystemNames',
      { allowSystemNames: true },
      { ok: true, user: { username: 'system:admin', groups: ['system:masters', 'dev'] } },
    ],
  ])('with %s: authenticates a token claiming system names as the spec says', async (_name, spec, want) => {
    const { cache } = await runJWT(jwtObject(spec), goodDocuments());
    const token = await tokenWith({
      ...claimingSystemNames,
      email: 'system:admin@example.com',
      roles: ['system:masters'],
    });
    expect(await cache.authenticate(token)).toMatchObject(want);
  });

  it('warns in the log and says so in AuthenticatorValid when allowSystemNames is set, once per spec', async () => {
    const recorded = recordingLogger();
    const { status, informer, controller } = await runJWT(
      jwtObject({ allowSystemNames: true }),
      goodDocuments(),
      recorded.log,
    );
    const warnings = () => recorded.lines().filter((l) => l.level === 40 && /allowSystemNames/.test(l.msg));
    expect(warnings()).toEqual([expect.objectContaining({ name: 'corp' })]);
    const valid = status.writes[0]!.status.conditions!.find((c) => c.type === 'AuthenticatorValid');
    expect(valid).toMatchObject({
      status: 'True',
      message: expect.stringContaining('spec.allowSystemNames'),
    });
    // The same spec again is not loaded again, so not warned about again.
    informer.put(jwtObject({ allowSystemNames: true }, status.writes[0]!.status));
    await controller.sync('corp');
    expect(warnings()).toHaveLength(1);
    const plain = recordingLogger();
    await runJWT(jwtObject(), goodDocuments(), plain.log);
    expect(plain.lines().filter((l) => l.level >= 40)).toEqual([]);
  });

  it('turns Error when a prefix would make every name a system name', async () => {
    const { status, cache } = await runJWT(
      jwtObject({ claims: { groupsPrefix: 'system:' } }),
      goodDocuments(),
    );
    expect(status.writes[0]!.status.phase).toBe('Error');
    expect(conditionSummary(status.writes[0]!.status)).toEqual(
      expect.arrayContaining(['AuthenticatorValid=False/InvalidAuthenticator', 'Ready=False/NotReady']),
    );
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(false);
  });

  it('lets a failed status write throw, so the queue retries it', async () => {
    const informer = new MemoryInformer<JWTAuthenticator>([jwtObject()]);
    const status = new RecordingStatusWriter<AuthenticatorStatus>();
    status.failNext = new Error('conflict');
    const cache = new AuthenticatorCache();
    caches.push(cache);
    const docs = goodDocuments();
    const controller = replica(
      newJWTAuthenticatorControllers(
        { informer, cache, status, log: silentLogger(), now: () => NOW },
        { fetchJSON: (url) => Promise.resolve(docs[url]) },
      ),
    );
    await expect(controller.sync('corp')).rejects.toThrow('conflict');
  });
});

describe('certificates bound to what a JWTAuthenticator trusts', () => {
  const withUid = (
    obj: JWTAuthenticator,
    metadata: Partial<JWTAuthenticator['metadata']> = {},
  ): JWTAuthenticator => ({
    ...obj,
    metadata: { ...obj.metadata, uid: 'uid-corp', ...metadata },
  });

  it.each<[string, boolean, (obj: JWTAuthenticator) => JWTAuthenticator]>([
    ['another audience', false, (o) => ({ ...o, spec: { ...o.spec, audience: 'someone-else' } })],
    ['another username claim', false, (o) => ({ ...o, spec: { ...o.spec, claims: { username: 'sub' } } })],
    ['another groups claim', false, (o) => ({ ...o, spec: { ...o.spec, claims: { groups: 'teams' } } })],
    ['a username prefix', false, (o) => ({ ...o, spec: { ...o.spec, claims: { usernamePrefix: 'oidc:' } } })],
    ['a groups prefix', false, (o) => ({ ...o, spec: { ...o.spec, claims: { groupsPrefix: 'oidc:' } } })],
    ['system names allowed', false, (o) => ({ ...o, spec: { ...o.spec, allowSystemNames: true } })],
    [
      'a label and an annotation',
      true,
      (o) => withUid(o, { labels: { team: 'a' }, annotations: { note: 'b' } }),
    ],
    [
      'another certificate lifetime',
      true,
      (o) => ({ ...o, spec: { ...o.spec, credentialLifetimeSeconds: 3600 } }),
    ],
    ['a status written', true, (o) => ({ ...o, status: { phase: 'Ready' } })],
  ])('after an edit of %s, certificates from before still hold: %s', async (_edit, holds, edit) => {
    const original = withUid(jwtObject());
    const { cache, informer, controller } = await runJWT(original, goodDocuments());
    const answer = await cache.authenticateWith(
      'JWTAuthenticator',
      'corp',
      await tokenWith({ username: 'alice' }),
    );
    expect(answer.ok).toBe(true);
    const binding = answer.binding!;
    expect(binding.uid).toBe('uid-corp');
    expect(cache.holds(binding)).toBe(true);

    informer.put(edit(original));
    await controller.sync('corp');
    // Still loaded either way: only what its certificates are bound to differs.
    expect(cache.has('JWTAuthenticator', 'corp')).toBe(true);
    expect(cache.holds(binding)).toBe(holds);
    // Certificates issued after the edit are bound to the spec as it is now.
    expect(cache.holds({ uid: 'uid-corp', trust: jwtTrustDigest(edit(original).spec) })).toBe(true);
  });
});

describe('WebhookAuthenticator controller', () => {
  function webhookObject(spec: Partial<WebhookAuthenticator['spec']>): WebhookAuthenticator {
    return {
      apiVersion: 'authentication.concierge.sealion.dev/v1alpha1',
      kind: 'WebhookAuthenticator',
      metadata: { name: 'hook' },
      spec: { endpoint: 'https://127.0.0.1:1/authenticate', ...spec },
    };
  }

  it.each<[string, Partial<WebhookAuthenticator['spec']>, string[]]>([
    [
      'a CA that is not PEM',
      { tls: { certificateAuthorityData: 'bm8=' } },
      ['TLSConfigurationValid=False/InvalidTLSConfiguration', 'EndpointURLValid=Unknown/UnableToValidate'],
    ],
    [
      'an http endpoint',
      { endpoint: 'http://hook.example.com' },
      ['EndpointURLValid=False/InvalidEndpointURL'],
    ],
    [
      'an endpoint nobody listens on',
      {},
      ['WebhookConnectionValid=False/UnableToDialServer', 'AuthenticatorValid=Unknown/UnableToValidate'],
    ],
  ])('with %s: Error with the conditions', async (_name, spec, wanted) => {
    const informer = new MemoryInformer<WebhookAuthenticator>([
      webhookObject({ tls: { certificateAuthorityData: caData }, ...spec }),
    ]);
    const cache = new AuthenticatorCache();
    const status = new RecordingStatusWriter<AuthenticatorStatus>();
    const controller = replica(
      newWebhookAuthenticatorControllers({
        informer,
        cache,
        status,
        log: silentLogger(),
        now: () => NOW,
      }),
    );
    // An endpoint that does not answer is retried with backoff; a mistake in the spec waits for its edit.
    const specMistake = wanted.some((c) => /^(TLSConfigurationValid|EndpointURLValid)=False/.test(c));
    expect(await controller.sync('hook')).toEqual(specMistake ? undefined : { retry: true });
    expect(status.writes[0]?.status.phase).toBe('Error');
    expect(conditionSummary(status.writes[0]?.status)).toEqual(
      expect.arrayContaining([...wanted, 'Ready=False/NotReady']),
    );
    expect(cache.has('WebhookAuthenticator', 'hook')).toBe(false);
  });

  it('loads a webhook with allowSystemNames, warning in the log and in AuthenticatorValid', async () => {
    const ca = await newCA('webhook-ca');
    const cert = await issueCert(ca, { commonName: 'hook', hosts: ['127.0.0.1'], usage: 'server' });
    const server = createTLSServer({ cert: cert.certPem, key: cert.keyPem }, (socket) => socket.end());
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    try {
      const endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}/authenticate`;
      const tls = { certificateAuthorityData: Buffer.from(ca.certPem).toString('base64') };
      for (const allowSystemNames of [false, true]) {
        const informer = new MemoryInformer<WebhookAuthenticator>([
          webhookObject({ endpoint, tls, ...(allowSystemNames ? { allowSystemNames } : {}) }),
        ]);
        const cache = new AuthenticatorCache();
        caches.push(cache);
        const status = new RecordingStatusWriter<AuthenticatorStatus>();
        const recorded = recordingLogger();
        const controller = replica(
          newWebhookAuthenticatorControllers({ informer, cache, status, log: recorded.log }),
        );
        expect(await controller.sync('hook')).toBeUndefined();
        expect(status.writes[0]?.status.phase).toBe('Ready');
        const valid = status.writes[0]!.status.conditions!.find((c) => c.type === 'AuthenticatorValid');
        const warned = recorded.lines().filter((l) => l.level === 40 && /allowSystemNames/.test(l.msg));
        if (allowSystemNames) {
          expect(valid?.message).toContain('spec.allowSystemNames');
          expect(warned).toHaveLength(1);
        } else {
          expect(valid?.message).toBe('authenticator initialized');
          expect(warned).toEqual([]);
        }
      }
    } finally {
      server.close();
    }
  });

  it('ends the certificates of a webhook whose endpoint or system-name setting is edited, not of one whose lifetime is', async () => {
    const ca = await newCA('webhook-ca');
    const cert = await issueCert(ca, { commonName: 'hook', hosts: ['127.0.0.1'], usage: 'server' });
    const server = createTLSServer({ cert: cert.certPem, key: cert.keyPem }, (socket) => socket.end());
    await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
    try {
      const endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}/authenticate`;
      const tls = { certificateAuthorityData: Buffer.from(ca.certPem).toString('base64') };
      const original: WebhookAuthenticator = {
        ...webhookObject({ endpoint, tls }),
        metadata: { name: 'hook', uid: 'uid-hook' },
      };
      const informer = new MemoryInformer<WebhookAuthenticator>([original]);
      const cache = new AuthenticatorCache();
      caches.push(cache);
      const controller = replica(
        newWebhookAuthenticatorControllers({
          informer,
          cache,
          status: new RecordingStatusWriter<AuthenticatorStatus>(),
          log: silentLogger(),
        }),
      );
      const edits: [string, WebhookAuthenticator['spec'], boolean][] = [
        ['another certificate lifetime', { endpoint, tls, credentialLifetimeSeconds: 3600 }, true],
        ['another endpoint', { endpoint: endpoint.replace('/authenticate', '/other'), tls }, false],
        ['system names allowed', { endpoint, tls, allowSystemNames: true }, false],
      ];
      for (const [edit, spec, holds] of edits) {
        informer.put(original);
        await controller.sync('hook');
        const before = { uid: 'uid-hook', trust: webhookTrustDigest(original.spec) };
        expect(cache.holds(before)).toBe(true);
        informer.put({ ...original, spec });
        await controller.sync('hook');
        expect(cache.has('WebhookAuthenticator', 'hook')).toBe(true);
        expect({ edit, holds: cache.holds(before) }).toEqual({ edit, holds });
        expect(cache.holds({ uid: 'uid-hook', trust: webhookTrustDigest(spec) })).toBe(true);
      }
    } finally {
      server.close();
    }
  });
});
