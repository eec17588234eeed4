import { compileUserRules } from './jwt-mapping.ts';
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createServer, type Server } from 'node:https';
import { createServer as createNetServer, type AddressInfo } from 'node:net';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { issueCert, newCA } from '../pki/pki.ts';
import { AuthenticatorCache } from './cache.ts';
import { REVIEWS_IN_FLIGHT, REVIEWS_WAITING, WebhookAuthenticator } from './webhook.ts';
import { startOIDCIssuer, type TestIssuer } from '../../dev/oidc-issuer.ts';
import { validateJWT } from './jwt.ts';

/** A real HTTPS TokenReview webhook whose answer depends on the token. */
let server: Server;
let url: string;
let caPem: string;
const calls = new Map<string, number>();
/** Requests for `hold-…` tokens wait here until released; how many ever waited at once. */
const held = { waiting: [] as (() => void)[], now: 0, max: 0, arrived: 0, released: false };
let onArrival: (() => void) | undefined;

const review = (status: object): string =>
  JSON.stringify({ apiVersion: 'authentication.k8s.io/v1', kind: 'TokenReview', status });

beforeAll(async () => {
  const ca = await newCA('webhook-ca');
  const cert = await issueCert(ca, { commonName: 'webhook', hosts: ['127.0.0.1'], usage: 'server' });
  caPem = ca.certPem;
  server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString()));
    req.on('end', () => {
      const token = (JSON.parse(body) as { spec: { token: string } }).spec.token;
      calls.set(token, (calls.get(token) ?? 0) + 1);
      const send = (code: number, text: string): void =>
        void res.writeHead(code, { 'content-type': 'application/json' }).end(text);
      if (token === 'slow') return; // never answers
      if (token.startsWith('hold-')) {
        const answer = (): void => {
          held.now--;
          send(200, review({ authenticated: false, error: 'unknown token' }));
        };
        held.now++;
        held.arrived++;
        held.max = Math.max(held.max, held.now);
        onArrival?.();
        if (held.released) answer();
        else held.waiting.push(answer);
        return;
      }
      const systemUsers: Record<string, object> = {
        'sys-user': { username: 'system:admin', groups: [] },
        'sys-group': { username: 'mallory', groups: ['team', 'system:masters'] },
        'sys-authenticated': { username: 'pat', groups: ['system:authenticated', 'team'] },
      };
      if (systemUsers[token]) return send(200, review({ authenticated: true, user: systemUsers[token] }));
      if (token.startsWith('good')) {
        send(
          200,
          review({
            authenticated: true,
            user: { username: `user-${token}`, uid: '42', groups: ['team'], extra: { scopes: ['a', 'b'] } },
          }),
        );
      } else if (token === 'invalid-json') send(200, '{"kind": "TokenReview", ');
      else if (token === 'server-error') send(500, '{}');
      else if (token === 'no-username') send(200, review({ authenticated: true, user: { groups: [] } }));
      else if (token === 'bad-groups')
        send(200, review({ authenticated: true, user: { username: 'x', groups: 'admins' } }));
      else if (token === 'wrong-kind')
        send(200, JSON.stringify({ kind: 'Status', status: { authenticated: true } }));
      else send(200, review({ authenticated: false, error: 'unknown token' }));
    });
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  url = `https://127.0.0.1:${(server.address() as AddressInfo).port}/authenticate`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((done) => server.close(done));
});

describe('webhook authentication', () => {
  it('maps the TokenReview user', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    expect(await webhook.authenticate('good-1')).toEqual({
      ok: true,
      authenticator: url,
      user: { username: 'user-good-1', uid: '42', groups: ['team'], extra: { scopes: ['a', 'b'] } },
    });
  });

  it.each([
    ['a refusal', 'nope', /not authenticated: unknown token/],
    ['invalid JSON', 'invalid-json', /BadJSON/],
    ['a 500', 'server-error', /BadStatus: HTTP 500/],
    ['no username', 'no-username', /no username/],
    ['groups that are not a list', 'bad-groups', /groups/],
    ['an answer that is not a TokenReview', 'wrong-kind', /not a TokenReview/],
    ['a token of 1 MiB', 'x'.repeat(1024 * 1024), /over the limit/],
  ])('fails closed on %s', async (_name, token, reason) => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    const result = await webhook.authenticate(token);
    expect(result.ok).toBe(false);
    expect(result.ok ? '' : result.reason).toMatch(reason);
  });

  it('fails closed at its deadline when the webhook hangs, without holding up other tokens', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem, timeoutMs: 1_000 });
    const slow = webhook.authenticate('slow');
    // Another token through the same authenticator answers while the slow one waits.
    const fast = await webhook.authenticate('good-fast');
    expect(fast.ok).toBe(true);
    const result = await slow;
    expect(result).toMatchObject({ ok: false, reason: expect.stringMatching(/Timeout/) as unknown });
  });

  it('refuses a webhook whose certificate it cannot verify', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url });
    expect(await webhook.authenticate('good-2')).toMatchObject({
      ok: false,
      reason: expect.stringMatching(/Network/) as unknown,
    });
    await expect(webhook.probe()).rejects.toThrow(/certificate/);
    await expect(
      new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem }).probe(),
    ).resolves.toBeUndefined();
  });

  it('gives up the probe when no handshake comes by its deadline, timed by the injected clock', async () => {
    // A server that takes the connection and never answers the TLS client hello.
    const silent = createNetServer(() => {});
    await new Promise<void>((listening) => silent.listen(0, '127.0.0.1', listening));
    const clock = fakeClock();
    try {
      const { port } = silent.address() as AddressInfo;
      const webhook = new WebhookAuthenticator({
        endpoint: `https://127.0.0.1:${port}/`,
        caBundlePem: caPem,
        clock,
      });
      const probe = webhook.probe(5_000);
      expect(clock.pending()).toContain(5_000);
      clock.advance(5_000);
      await expect(probe).rejects.toThrow('no TLS handshake within 5000 ms');
    } finally {
      await new Promise((closed) => silent.close(closed));
    }
  });

  it('caches answers (yes and no) and shares one call between concurrent lookups', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    await Promise.all(Array.from({ length: 10 }, () => webhook.authenticate('good-cached')));
    await webhook.authenticate('good-cached');
    expect(calls.get('good-cached')).toBe(1);
    await webhook.authenticate('denied-cached');
    await webhook.authenticate('denied-cached');
    expect(calls.get('denied-cached')).toBe(1);
  });

  it('expires cached answers after their lifetime', async () => {
    const webhook = new WebhookAuthenticator({
      endpoint: url,
      caBundlePem: caPem,
      successTTLms: 1,
      failureTTLms: 1,
    });
    await webhook.authenticate('good-ttl');
    await new Promise((r) => setTimeout(r, 20));
    await webhook.authenticate('good-ttl');
    expect(calls.get('good-ttl')).toBe(2);
  });

  it('does not cache a transport failure, but does cache a refusal', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    const before = calls.get('server-error') ?? 0;
    await webhook.authenticate('server-error');
    await webhook.authenticate('server-error');
    expect((calls.get('server-error') ?? 0) - before).toBe(2);
    const refusals = calls.get('refused-once') ?? 0;
    await webhook.authenticate('refused-once');
    await webhook.authenticate('refused-once');
    expect((calls.get('refused-once') ?? 0) - refusals).toBe(1);
  });
});

describe('webhook identities with system names', () => {
  it.each([
    ['the username system:admin', 'sys-user', /username "system:admin" is a system name/],
    ['the group system:masters', 'sys-group', /group "system:masters" is a system name/],
  ])('refuses an answer with %s, and remembers the refusal', async (_name, token, reason) => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    const before = calls.get(token) ?? 0;
    expect(await webhook.authenticate(token)).toEqual({
      ok: false,
      reason: expect.stringMatching(reason) as unknown,
    });
    await webhook.authenticate(token);
    expect((calls.get(token) ?? 0) - before).toBe(1);
  });

  it('accepts system:authenticated, which every authenticated user has anyway', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    expect(await webhook.authenticate('sys-authenticated')).toMatchObject({
      ok: true,
      user: { username: 'pat', groups: ['system:authenticated', 'team'] },
    });
  });

  it('accepts system names from a webhook that opts out', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem, allowSystemNames: true });
    expect(await webhook.authenticate('sys-user')).toMatchObject({
      ok: true,
      user: { username: 'system:admin' },
    });
    expect(await webhook.authenticate('sys-group')).toMatchObject({
      ok: true,
      user: { groups: ['team', 'system:masters'] },
    });
  });

  it('refuses a user that fails a userValidationRule, saying which', async () => {
    const problems: string[] = [];
    const userRules = compileUserRules(
      [{ expression: "!('system:masters' in user.groups)", message: 'no cluster admins by webhook' }],
      'spec.userValidationRules',
      problems,
    );
    expect(problems).toEqual([]);
    const webhook = new WebhookAuthenticator({
      endpoint: url,
      caBundlePem: caPem,
      allowSystemNames: true,
      userRules,
    });
    expect(await webhook.authenticate('sys-group')).toEqual(
      expect.objectContaining({
        ok: false,
        reason: 'user validation rule failed: no cluster admins by webhook',
      }),
    );
    expect(await webhook.authenticate('sys-user')).toMatchObject({ ok: true });
    compileUserRules([{ expression: 'user.groups' }], 'spec.userValidationRules', problems);
    expect(problems).toEqual([
      expect.stringMatching(/^spec\.userValidationRules\[0\]\.expression: must evaluate to bool/),
    ]);
  });
});

describe('a flood of distinct junk tokens', () => {
  it('reaches a slow webhook at most REVIEWS_IN_FLIGHT at a time; past the wait line it fails at once, unremembered', async () => {
    const webhook = new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem });
    const tokens = Array.from({ length: 1000 }, (_, i) => `hold-${i}`);
    const all = REVIEWS_IN_FLIGHT + REVIEWS_WAITING;
    const filled = new Promise<void>((done) => {
      onArrival = () => held.arrived >= REVIEWS_IN_FLIGHT && done();
    });
    const answers = tokens.map((t) => webhook.authenticate(t));
    await filled;
    const refused = await Promise.all(answers.slice(all));
    expect(refused.every((r) => !r.ok && 'transient' in r)).toBe(true);
    expect(held.arrived).toBe(REVIEWS_IN_FLIGHT);

    held.released = true;
    held.waiting.splice(0).forEach((answer) => answer());
    const asked = await Promise.all(answers.slice(0, all));
    expect(asked.every((r) => !r.ok && !('transient' in r))).toBe(true);
    expect(held.arrived).toBe(all);
    expect(held.max).toBe(REVIEWS_IN_FLIGHT);
    // A token refused for being over the bound is asked about next time.
    expect(await webhook.authenticate(tokens[999]!)).toMatchObject({ ok: false });
    expect(held.arrived).toBe(all + 1);
    onArrival = undefined;
  });
});

describe('the authenticator cache', () => {
  let issuer: TestIssuer;
  beforeAll(async () => {
    issuer = await startOIDCIssuer();
  });
  afterAll(async () => {
    await issuer.stop();
  });

  it('routes a JWT by issuer and anything else to the webhooks', async () => {
    const cache = new AuthenticatorCache();
    const jwt = (
      await validateJWT({ issuer: issuer.url, audience: 'sealion', caBundlePem: issuer.caPem }, undefined)
    ).authenticator!;
    cache.set('JWTAuthenticator', 'corp', jwt, { issuer: issuer.url });
    cache.set(
      'WebhookAuthenticator',
      'hook',
      new WebhookAuthenticator({ endpoint: url, caBundlePem: caPem }),
    );

    const token = await issuer.mint({ username: 'jwt-user' });
    expect(await cache.authenticate(token)).toMatchObject({
      ok: true,
      authenticator: 'JWTAuthenticator/corp',
      user: { username: 'jwt-user' },
    });
    expect(calls.get(token)).toBeUndefined(); // the JWT never went to the webhook

    expect(await cache.authenticate('good-routed')).toMatchObject({
      ok: true,
      authenticator: 'WebhookAuthenticator/hook',
    });
    // A JWT from an issuer nobody trusts goes to the webhooks, which refuse it.
    const foreign = await issuer.mint({ username: 'x' }, { issuer: 'https://elsewhere.example.com' });
    expect(await cache.authenticate(foreign)).toMatchObject({ ok: false });
    expect(await cache.authenticate('')).toMatchObject({ ok: false });
    expect(await cache.authenticateWith('JWTAuthenticator', 'missing', token)).toMatchObject({ ok: false });
    expect(await cache.authenticateWith('JWTAuthenticator', 'corp', token)).toMatchObject({ ok: true });

    cache.delete('JWTAuthenticator', 'corp');
    expect(await cache.authenticate(token)).toMatchObject({ ok: false });
    cache.close();
  });
});
