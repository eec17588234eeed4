// `npm run bench -- auth`: how fast the authenticators answer once warm. JWT validations per second with cached
// keys (every token distinct, so nothing is cached but the keys) and repeat tokens served from the verified-token
// cache, each beside the same with CEL claim mappings, in BENCH_ROUNDS interleaved rounds and judged against the
// target (CEL costs at most 10% more time per token, round by round); webhook lookups per second served from the
// answer cache, next to the uncached round trip to a local TokenReview webhook they save.
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { validateJWT } from '../lib/authn/jwt.ts';
import { compileJWTConfiguration } from '../lib/authn/jwt-mapping.ts';
import { WebhookAuthenticator } from '../lib/authn/webhook.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import type { TokenAuthenticator } from '../lib/authn/types.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { startOIDCIssuer } from '../dev/oidc-issuer.ts';
import { measure, measureRounds, printTable, saveResults, type Measurement } from './measure.ts';
import { AUTH_PAIRS, authVerdicts, printVerdicts, type Verdict } from './targets.ts';

/** Each measurement's length (BENCH_SECONDS): the authenticators run in this process, so 2 s is plenty. */
const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 2);

/** One side of a pair: an authenticator and the name of its row. */
interface Named {
  name: string;
  authenticator: TokenAuthenticator;
}

export async function benchAuth(): Promise<Verdict> {
  const issuer = await startOIDCIssuer();
  const { authenticator } = await validateJWT(
    { issuer: issuer.url, audience: 'sealion', caBundlePem: issuer.caPem },
    undefined,
  );
  if (!authenticator) throw new Error('issuer did not validate');
  const tokens = await Promise.all(
    Array.from({ length: 2000 }, (_, i) => issuer.mint({ username: `user-${i}`, groups: ['a', 'b'] })),
  );
  const cache = new AuthenticatorCache();
  cache.set('JWTAuthenticator', 'bench', authenticator, { issuer: issuer.url });
  // The same issuer in Kubernetes' structured form, with CEL doing what the claims and prefixes do above and more: a
  // claim rule, username and groups by expression, a user rule.
  const mapping = compileJWTConfiguration({
    issuer: { url: issuer.url, audiences: ['sealion'], certificateAuthority: issuer.caPem },
    claimValidationRules: [{ expression: 'has(claims.username)' }],
    claimMappings: {
      username: { expression: "'cel:' + claims.username" },
      groups: { expression: "claims.groups.map(g, 'cel:' + g)" },
    },
    userValidationRules: [{ expression: "!user.username.startsWith('system:')" }],
  });
  if ('problems' in mapping) throw new Error(mapping.problems.join('; '));
  const { authenticator: withCEL } = await validateJWT(
    { issuer: issuer.url, audience: 'sealion', caBundlePem: issuer.caPem, mapping },
    undefined,
  );
  if (!withCEL) throw new Error('issuer did not validate with CEL mappings');
  const celCache = new AuthenticatorCache();
  celCache.set('JWTAuthenticator', 'bench', withCEL, { issuer: issuer.url });

  const ca = await newCA('bench-webhook');
  const cert = await issueCert(ca, { commonName: 'webhook', hosts: ['127.0.0.1'], usage: 'server' });
  const server = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    req.resume();
    req.on('end', () =>
      res.writeHead(200, { 'content-type': 'application/json' }).end(
        JSON.stringify({
          kind: 'TokenReview',
          status: { authenticated: true, user: { username: 'u', groups: ['g'] } },
        }),
      ),
    );
  });
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const endpoint = `https://127.0.0.1:${(server.address() as AddressInfo).port}/`;
  const webhook = new WebhookAuthenticator({ endpoint, caBundlePem: ca.certPem });
  const uncached = new WebhookAuthenticator({ endpoint, caBundlePem: ca.certPem, successTTLms: 0.001 });

  const rows: Measurement[] = [];
  // Distinct tokens, each seen once: a signature check every time, with the keys cached.
  const fresh = await Promise.all(
    Array.from({ length: 30_000 }, (_, i) => issuer.mint({ username: `fresh-${i}`, groups: ['a'] })),
  );
  // Each pair as the request suites measure their targets: in BENCH_ROUNDS rounds, the two in another order each
  // round, so the machine's drift falls on both, and the verdict compares them round by round.
  const pair = ([plain, cel]: readonly [Named, Named], tokensOf: string[]): Promise<Measurement[]> =>
    measureRounds([plain, cel], (t, warmupSeconds) =>
      measure(
        t.name,
        async (i) => {
          // A refusal is quicker than an answer: a run that measured refusals would judge nothing.
          const result = await t.authenticator.authenticate(tokensOf[i % tokensOf.length]!);
          if (!result.ok) throw new Error(`${t.name}: token refused: ${result.reason}`);
        },
        { seconds: SECONDS, warmupSeconds },
      ),
    );
  const [first, remembered] = AUTH_PAIRS;
  rows.push(
    ...(await pair(
      [
        { name: first.plain, authenticator },
        { name: first.cel, authenticator: withCEL },
      ],
      fresh,
    )),
    // The same few tokens again and again, as kubectl sends them: answered from the verified-token cache.
    ...(await pair(
      [
        { name: remembered.plain, authenticator: cache },
        { name: remembered.cel, authenticator: celCache },
      ],
      tokens,
    )),
  );
  await webhook.authenticate('warm');
  rows.push(await measure('webhook (cached answer)', () => webhook.authenticate('warm')));
  rows.push(await measure('webhook round trip', (i) => uncached.authenticate(`t-${i}`), { seconds: 1 }));
  rows.push(
    await measure('webhook round trip ×16', (i) => uncached.authenticate(`c-${i}`), {
      seconds: 1,
      concurrency: 16,
    }),
  );
  printTable(
    'Authentication (one core, warm)',
    rows,
    rows.find((r) => r.name === 'webhook round trip'),
  );
  console.log(`saved ${saveResults('auth', rows)}`);
  const verdict = printVerdicts(
    'Targets (each round with CEL against without, the median of the rounds)',
    authVerdicts(rows),
  );

  cache.close();
  celCache.close();
  server.closeAllConnections();
  server.close();
  await issuer.stop();
  return verdict;
}
