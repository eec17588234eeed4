// The service-account passthrough's guard against junk: tokens that cannot be service-account tokens never
// become a TokenReview, and distinct junk tokens reach the API server at most
// SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT at a time.
import { describe, expect, it } from '@jest/globals';
import { AuthenticatorCache } from '../../lib/authn/cache.ts';
import type { Reviewer, TokenReviewAnswer } from '../../lib/kube/kube.ts';
import {
  newRequestAuthenticator,
  notAServiceAccountToken,
  SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT,
  SERVICE_ACCOUNT_REVIEWS_WAITING,
  tokenExpiry,
  type Identity,
} from './authenticate.ts';
import type { Request } from '../../lib/http2/request.ts';

const part = (o: unknown): string => Buffer.from(JSON.stringify(o)).toString('base64url');
/** A JWT-shaped token with this payload; the signature is junk, as an attacker's would be. */
const jwtWith = (payload: unknown): string => `${part({ alg: 'RS256' })}.${part(payload)}.c2lnbmF0dXJl`;

/** A request with a bearer token and no client certificate. */
const requestWith = (token: string): Request =>
  ({ headers: { authorization: `Bearer ${token}` }, socket: {} }) as unknown as Request;

/** An API server whose TokenReviews answer nothing until released; counts how many it ever had at once. */
function slowReviewer() {
  const state = { running: 0, max: 0, calls: 0, released: false };
  const held: (() => void)[] = [];
  let onCall: () => void = () => {};
  const answer = (): TokenReviewAnswer => ({ authenticated: false, error: 'invalid bearer token' });
  const reviewer: Reviewer = {
    tokenReview: () => {
      state.calls++;
      state.max = Math.max(state.max, ++state.running);
      onCall();
      return new Promise<TokenReviewAnswer>((done) => {
        const finish = (): void => {
          state.running--;
          done(answer());
        };
        if (state.released) finish();
        else held.push(finish);
      });
    },
    allowed: () => Promise.resolve(false),
  };
  return {
    state,
    reviewer,
    called: (n: number) =>
      new Promise<void>((done) => {
        onCall = () => state.calls >= n && done();
        if (state.calls >= n) done();
      }),
    releaseAll() {
      state.released = true;
      held.splice(0).forEach((f) => f());
    },
  };
}

const reasonOf = (identity: Identity): string => (identity.kind === 'anonymous' ? identity.reason : '');

describe('service-account passthrough', () => {
  it('asks the API server about distinct junk tokens at most SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT at a time', async () => {
    const api = slowReviewer();
    const cache = new AuthenticatorCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set());
    const tokens = Array.from({ length: 1000 }, (_, i) =>
      jwtWith({ iss: 'https://kubernetes.default.svc', sub: `junk-${i}` }),
    );
    const answers = tokens.map((t) => authn.authenticate(requestWith(t)));
    await api.called(SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT);
    const all = SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT + SERVICE_ACCOUNT_REVIEWS_WAITING;
    const refused = await Promise.all(answers.slice(all));
    expect(refused.every((i) => i.kind === 'anonymous' && /not asked/.test(i.reason))).toBe(true);
    api.releaseAll();
    const asked = await Promise.all(answers.slice(0, all));
    expect(asked.every((i) => i.kind === 'anonymous')).toBe(true);
    expect(api.state.max).toBe(SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT);
    expect(api.state.calls).toBe(all);
    // No reason (they go to the log) holds a token.
    [...refused, ...asked].forEach((identity, i) =>
      expect(reasonOf(identity)).not.toContain(tokens[i < refused.length ? i + all : i - refused.length]),
    );
    cache.close();
  });

  it.each([
    ['a payload that is not base64url JSON', 'eyJhbGciOiJSUzI1NiJ9.bm90IGpzb24.c2ln'],
    ['a payload that is a JSON list', jwtWith([1, 2])],
    ['no iss', jwtWith({ sub: 'system:serviceaccount:default:x' })],
    ['an empty iss', jwtWith({ iss: '' })],
    ['an iss that is not a string', jwtWith({ iss: 42 })],
  ])('never asks the API server about a token with %s', async (_name, token) => {
    const api = slowReviewer();
    api.releaseAll();
    const authn = newRequestAuthenticator(new AuthenticatorCache(), api.reviewer, () => new Set());
    const identity = await authn.authenticate(requestWith(token));
    expect(identity.kind).toBe('anonymous');
    expect(notAServiceAccountToken(token)).toBeDefined();
    expect(api.state.calls).toBe(0);
  });

  it('asks about a token that may be a service account’s, bound or legacy', async () => {
    for (const payload of [
      { iss: 'https://kubernetes.default.svc.cluster.local', sub: 'system:serviceaccount:default:x' },
      { iss: 'kubernetes/serviceaccount', sub: 'system:serviceaccount:default:x' },
    ]) {
      expect(notAServiceAccountToken(jwtWith(payload))).toBeUndefined();
    }
    const api = slowReviewer();
    api.releaseAll();
    const authn = newRequestAuthenticator(new AuthenticatorCache(), api.reviewer, () => new Set());
    await authn.authenticate(requestWith(jwtWith({ iss: 'kubernetes/serviceaccount' })));
    expect(api.state.calls).toBe(1);
  });
});

describe('workload tokens (Sealion’s audience)', () => {
  const AUDIENCE = 'workloads.concierge.sealion.dev';
  const SA = 'system:serviceaccount:argocd:controller';
  const hubIssuer = 'https://kubernetes.default.svc.cluster.local';

  /**
   * An API server that knows tokens by their real audiences (what a signature would prove): good for a review that
   * names one of them, or, without audiences, for its own ('api').
   */
  function apiServer(known: Record<string, { audiences: string[]; username: string }>) {
    const asked: { token: string; audiences?: string[] }[] = [];
    const reviewer: Reviewer = {
      tokenReview(token, audiences) {
        asked.push({ token, ...(audiences ? { audiences } : {}) });
        const entry = known[token];
        const wanted = audiences ?? ['api'];
        const good = entry ? wanted.filter((a) => entry.audiences.includes(a)) : [];
        return Promise.resolve(
          entry && good.length > 0
            ? {
                authenticated: true,
                user: {
                  username: entry.username,
                  groups: ['system:serviceaccounts', 'system:authenticated'],
                },
                audiences: good,
              }
            : { authenticated: false, error: 'invalid bearer token' },
        );
      },
      allowed: () => Promise.resolve(false),
    };
    return { reviewer, asked };
  }

  /** An authenticator cache that records what reaches its authenticators (the JWTAuthenticators, the webhooks). */
  function recordingCache() {
    const cache = new AuthenticatorCache();
    const seen: string[] = [];
    const authenticate = cache.authenticate.bind(cache);
    cache.authenticate = (token, signal) => {
      seen.push(token);
      return authenticate(token, signal);
    };
    return { cache, seen };
  }

  const workloadToken = jwtWith({ iss: hubIssuer, aud: [AUDIENCE], sub: SA });

  it('reviews a token naming the audience for that audience alone, and takes the service account the API server confirms', async () => {
    const api = apiServer({ [workloadToken]: { audiences: [AUDIENCE], username: SA } });
    const { cache, seen } = recordingCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set(), {
      workloadAudience: AUDIENCE,
    });
    const identity = await authn.authenticate(requestWith(workloadToken));
    expect(identity).toEqual({
      kind: 'workload',
      user: { username: SA, groups: ['system:serviceaccounts', 'system:authenticated'], extra: {} },
    });
    expect(api.asked).toEqual([{ token: workloadToken, audiences: [AUDIENCE] }]);
    expect(seen).toEqual([]);
    cache.close();
  });

  it.each<[string, string, Record<string, { audiences: string[]; username: string }>]>([
    [
      'the API server does not accept it for the audience (its aud claim is a lie)',
      jwtWith({ iss: hubIssuer, aud: [AUDIENCE, 'api'], sub: SA, n: 1 }),
      {},
    ],
    [
      'it belongs to a user, not a service account',
      jwtWith({ iss: hubIssuer, aud: AUDIENCE, sub: 'alice' }),
      {},
    ],
    ['the API server does not confirm the audience', jwtWith({ iss: hubIssuer, aud: AUDIENCE, n: 3 }), {}],
  ])('refuses it when %s, and no other authenticator sees it', async (name, token) => {
    const known: Record<string, { audiences: string[]; username: string }> = {};
    // The first: good only for the API server itself, whatever its claim says.
    if (name.startsWith('the API server does not accept'))
      known[token] = { audiences: ['api'], username: SA };
    if (name.startsWith('it belongs')) known[token] = { audiences: [AUDIENCE], username: 'alice' };
    const api = apiServer(known);
    if (name.startsWith('the API server does not confirm')) {
      api.reviewer.tokenReview = (t, audiences) => {
        api.asked.push({ token: t, ...(audiences ? { audiences } : {}) });
        return Promise.resolve({ authenticated: true, user: { username: SA, groups: [] } });
      };
    }
    const { cache, seen } = recordingCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set(), {
      workloadAudience: AUDIENCE,
    });
    const identity = await authn.authenticate(requestWith(token));
    expect(identity.kind).toBe('anonymous');
    expect(reasonOf(identity)).not.toContain(token);
    // Asked once, for the audience; never as a token of the API server's own, never of a webhook.
    expect(api.asked).toEqual([{ token, audiences: [AUDIENCE] }]);
    expect(seen).toEqual([]);
    cache.close();
  });

  it('keeps its answers apart from the service-account answers: the same token is asked again for the audience', async () => {
    // A token good for both: as a plain service-account token it passes through; with the option, it is a workload.
    const token = jwtWith({ iss: hubIssuer, aud: [AUDIENCE, 'api'], sub: SA });
    const api = apiServer({ [token]: { audiences: ['api', AUDIENCE], username: SA } });
    const cache = new AuthenticatorCache();
    const plain = newRequestAuthenticator(cache, api.reviewer, () => new Set());
    const withWorkloads = newRequestAuthenticator(cache, api.reviewer, () => new Set(), {
      workloadAudience: AUDIENCE,
    });
    expect((await plain.authenticate(requestWith(token))).kind).toBe('serviceaccount');
    expect((await withWorkloads.authenticate(requestWith(token))).kind).toBe('workload');
    // Answered from its cache the second time.
    expect((await withWorkloads.authenticate(requestWith(token))).kind).toBe('workload');
    expect(api.asked).toEqual([{ token }, { token, audiences: [AUDIENCE] }]);
    cache.close();
  });

  it('asks as usual about a service-account token that does not name the audience', async () => {
    const token = jwtWith({ iss: hubIssuer, aud: ['api'], sub: SA });
    const api = apiServer({ [token]: { audiences: ['api'], username: SA } });
    const cache = new AuthenticatorCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set(), {
      workloadAudience: AUDIENCE,
    });
    expect((await authn.authenticate(requestWith(token))).kind).toBe('serviceaccount');
    expect(api.asked).toEqual([{ token }]);
    cache.close();
  });

  it('shares one bound with the service-account reviews: both kinds together are at most SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT', async () => {
    const api = slowReviewer();
    const cache = new AuthenticatorCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set(), {
      workloadAudience: AUDIENCE,
    });
    const all = SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT + SERVICE_ACCOUNT_REVIEWS_WAITING;
    // Alternately a workload's and a plain service account's: 2 × all, of which only `all` are asked.
    const answers = Array.from({ length: 2 * all }, (_, i) =>
      authn.authenticate(
        requestWith(jwtWith({ iss: hubIssuer, ...(i % 2 ? { aud: AUDIENCE } : {}), sub: `junk-${i}` })),
      ),
    );
    await api.called(SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT);
    api.releaseAll();
    const reasons = (await Promise.all(answers)).map(reasonOf);
    expect(reasons.filter((r) => /not asked/.test(r))).toHaveLength(all);
    expect(api.state.max).toBe(SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT);
    expect(api.state.calls).toBe(all);
    cache.close();
  });

  it.each([
    ['a workload’s', [AUDIENCE], { workloadAudience: AUDIENCE }, 'workload'],
    ['a service account’s own (passthrough)', ['api'], {}, 'serviceaccount'],
  ] as const)('remembers %s token no longer than its exp', async (_name, audiences, opts, kind) => {
    const now = Math.floor(Date.now() / 1000);
    // The API server's answer decides whether a token is good; its exp bounds how long that answer is reused.
    const expired = jwtWith({ iss: hubIssuer, aud: [...audiences], sub: SA, exp: now - 1 });
    const live = jwtWith({ iss: hubIssuer, aud: [...audiences], sub: SA, exp: now + 3600 });
    const api = apiServer({
      [expired]: { audiences: [...audiences], username: SA },
      [live]: { audiences: [...audiences], username: SA },
    });
    const cache = new AuthenticatorCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set(), opts);
    for (let i = 0; i < 2; i++) {
      expect((await authn.authenticate(requestWith(expired))).kind).toBe(kind);
      expect((await authn.authenticate(requestWith(live))).kind).toBe(kind);
    }
    expect(api.asked.map((a) => a.token)).toEqual([expired, live, expired]);
    expect(tokenExpiry(live)).toBe((now + 3600) * 1000);
    expect(tokenExpiry(jwtWith({ iss: hubIssuer }))).toBeUndefined();
    cache.close();
  });

  it('bounds the reviews of distinct junk tokens naming the audience as it bounds the others', async () => {
    const api = slowReviewer();
    const cache = new AuthenticatorCache();
    const authn = newRequestAuthenticator(cache, api.reviewer, () => new Set(), {
      workloadAudience: AUDIENCE,
    });
    const all = SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT + SERVICE_ACCOUNT_REVIEWS_WAITING;
    const answers = Array.from({ length: all + 10 }, (_, i) =>
      authn.authenticate(requestWith(jwtWith({ iss: hubIssuer, aud: AUDIENCE, sub: `junk-${i}` }))),
    );
    await api.called(SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT);
    const refused = await Promise.all(answers.slice(all));
    expect(refused.every((i) => /not asked/.test(reasonOf(i)))).toBe(true);
    api.releaseAll();
    await Promise.all(answers);
    expect(api.state.max).toBe(SERVICE_ACCOUNT_REVIEWS_IN_FLIGHT);
    cache.close();
  });
});
