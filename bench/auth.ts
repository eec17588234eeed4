// `npm run bench -- auth`: how fast the authenticators answer once warm. JWT validations per second with cached
// keys (every token distinct, so nothing is cached but the keys), repeat tokens from the verified-token cache,, repeat tokens served from the verified-token cache,, and webhook lookups per second served from
// the answer cache, next to the uncached round trip to a local TokenReview webhook they save.
import { createServer } from 'node:https';
import type { AddressInfo } from 'node:net';
import { validateJWT } from '../lib/authn/jwt.ts';
import { compileJWTConfiguration } from '../lib/authn/jwt-mapping.ts';
import { WebhookAuthenticator } from '../lib/authn/webhook.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { startOIDCIssuer } from '../dev/oidc-issuer.ts';
import { measure, printTable, saveResults, type Measurement } from './measure.ts';

export async function benchAuth(): Promise<void> {
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
  // Plain and CEL rows interleaved, twice, so the machine's drift falls on both.
  const verify: Measurement[] = [];
  const remembered: Measurement[] = [];
  for (let round = 0; round < 2; round++) {
    verify.push(
      await measure('jwt verify (cached keys)', (i) => authenticator.authenticate(fresh[i % fresh.length]!), {
        seconds: 1.5,
      }),
      await measure('jwt verify + CEL', (i) => withCEL.authenticate(fresh[i % fresh.length]!), {
        seconds: 1.5,
      }),
    );
    // The same few tokens again and again, as kubectl sends them: answered from the verified-token cache.
    remembered.push(
      await measure('jwt (verified token)', (i) => cache.authenticate(tokens[i % tokens.length]!)),
      await measure('jwt (verified token) + CEL', (i) => celCache.authenticate(tokens[i % tokens.length]!)),
    );
  }
  const best = (rowsOf: Measurement[], name: string): Measurement =>
    rowsOf.filter((r) => r.name === name).sort((a, b) => b.perSecond - a.perSecond)[0]!;
  const pairs = [
    [best(verify, 'jwt verify (cached keys)'), best(verify, 'jwt verify + CEL')],
    [best(remembered, 'jwt (verified token)'), best(remembered, 'jwt (verified token) + CEL')],
  ] as const;
  rows.push(...pairs.flat());
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
  // Target: CEL mappings cost at most 10% on first verification and on remembered tokens (same run).
  for (const [plain, cel] of pairs)
    console.log(
      `${cel.name}: ${((plain.perSecond / cel.perSecond - 1) * 100).toFixed(1)}% more time per token than ${plain.name} (target: at most 10%)`,
    );

  cache.close();
  celCache.close();
  server.closeAllConnections();
  server.close();
  await issuer.stop();
}
