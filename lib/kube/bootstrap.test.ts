// Redeeming bootstrap tokens against a cache of their Secrets: what each token gets, and that no token is checked
// with less work than another until its secret is proven.
import { describe, expect, it } from '@jest/globals';
import { redeemBootstrapToken, RedeemError } from './bootstrap.ts';
import { fakeBootstrapToken, memoryTokenStore } from '../../test-support/fake-bootstrap-tokens.ts';

const NOW = new Date('2030-01-01T00:00:00Z');
const bootstrapToken = (cluster: string, created = NOW) => fakeBootstrapToken(cluster, created);

const reasonOf = (promise: Promise<void>): Promise<string | undefined> =>
  promise.then(
    () => undefined,
    (err: unknown) => (err instanceof RedeemError ? err.reason : `not a RedeemError: ${String(err)}`),
  );

describe('redeeming a bootstrap token', () => {
  it.each<[string, (token: string) => string, string]>([
    ['an unknown id', () => 'abcdefgh.whatever', 'Unknown'],
    ['a malformed token', () => 'not a token', 'Malformed'],
    ['a token with a third part', (token) => `${token}.more`, 'Malformed'],
    ['a wrong secret for a real id', (token) => `${token.split('.')[0]!}.wrong`, 'WrongSecret'],
    ['no secret for a real id', (token) => `${token.split('.')[0]!}.`, 'Malformed'],
  ])(
    'refuses %s after one look in the cache, burning nothing and asking the API server nothing',
    async (_what, presented, reason) => {
      const { token, secret } = await bootstrapToken('edge');
      const store = memoryTokenStore([secret]);
      expect(await reasonOf(redeemBootstrapToken(store, presented(token), 'edge', NOW))).toBe(reason);
      expect({ gets: store.gets, burns: store.burns }).toEqual({ gets: 1, burns: [] });
    },
  );

  it('refuses a Secret of another type under a token’s name, as if there were none', async () => {
    const { token, secret } = await bootstrapToken('edge');
    const store = memoryTokenStore([{ ...secret, type: 'Opaque' }]);
    expect(await reasonOf(redeemBootstrapToken(store, token, 'edge', NOW))).toBe('Unknown');
    expect(store.burns).toEqual([]);
  });

  it('refuses a stored hash of the wrong length without skipping the comparison', async () => {
    const { token, secret } = await bootstrapToken('edge');
    const short = {
      ...secret,
      data: { ...secret.data, 'secret-sha256': Buffer.from('abcd').toString('base64') },
    };
    expect(await reasonOf(redeemBootstrapToken(memoryTokenStore([short]), token, 'edge', NOW))).toBe(
      'WrongSecret',
    );
  });

  it('redeems a good token once, burning it; a second redemption is refused', async () => {
    const { token, secret } = await bootstrapToken('edge');
    const store = memoryTokenStore([secret]);
    await redeemBootstrapToken(store, token, 'edge', NOW);
    expect(store.burns).toEqual([secret.metadata!.name]);
    expect(await reasonOf(redeemBootstrapToken(store, token, 'edge', NOW))).toBe('Unknown');
  });

  it('refuses a token whose Secret changed or went since the cache saw it (another replica redeemed it)', async () => {
    const { token, secret } = await bootstrapToken('edge');
    const store = memoryTokenStore([secret]);
    store.burn = () => Promise.resolve(false);
    expect(await reasonOf(redeemBootstrapToken(store, token, 'edge', NOW))).toBe('AlreadyUsed');
  });

  it('burns a token used for another cluster, or after it expired', async () => {
    const misnamed = await bootstrapToken('edge');
    const expired = await bootstrapToken('edge', new Date(NOW.getTime() - 24 * 3600_000));
    const store = memoryTokenStore([misnamed.secret, expired.secret]);
    expect(await reasonOf(redeemBootstrapToken(store, misnamed.token, 'other', NOW))).toBe('WrongCluster');
    expect(await reasonOf(redeemBootstrapToken(store, misnamed.token, 'edge', NOW))).toBe('Unknown');
    expect(await reasonOf(redeemBootstrapToken(store, expired.token, 'edge', NOW))).toBe('Expired');
    expect(store.burns).toEqual([misnamed.secret.metadata!.name, expired.secret.metadata!.name]);
  });
});
