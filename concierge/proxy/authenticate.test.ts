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
