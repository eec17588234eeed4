// `npm run bench -- auth`: how fast the authenticators answer once warm. JWT validations per second with cached
// keys (every token distinct, so nothing is cached but the keys) and repeat tokens served from the verified-token
// cache, each beside the same with CEL claim mappings, in BENCH_ROUNDS interleaved rounds and judged against the
// target (CEL costs at most 10% more time per token, round by round); first verifications of RS256 tokens beside
// the bare signature checks of RS256 and ES256 (node:crypto's floor); webhook lookups per second served from the
// answer cache, next to the uncached round trip to a local TokenReview webhook they save. BENCH_PROFILE_DIR=dir
// writes a CPU profile of each group (auth-<group>.cpuprofile).
import { createPublicKey, verify, type KeyObject } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { createServer } from 'node:https';
import { Session } from 'node:inspector/promises';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { exportJWK, generateKeyPair, SignJWT, type JWK } from 'jose';
import { validateJWT, type JWTAuthenticator } from '../lib/authn/jwt.ts';
import { compileJWTConfiguration } from '../lib/authn/jwt-mapping.ts';
import { WebhookAuthenticator } from '../lib/authn/webhook.ts';
import { AuthenticatorCache } from '../lib/authn/cache.ts';
import type { TokenAuthenticator } from '../lib/authn/types.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { startOIDCIssuer } from '../dev/oidc-issuer.ts';
import { measure, measureRounds, printTable, saveResults, type Measurement } from './measure.ts';
import { AUTH_FLOORS, AUTH_PAIRS, AUTH_RS256, authVerdicts, printVerdicts, type Verdict } from './targets.ts';

/** Each measurement's length (BENCH_SECONDS): the authenticators run in this process, so 2 s is plenty. */
const SECONDS = Number(process.env['BENCH_SECONDS'] ?? 2);

/** One side of a pair: an authenticator and the name of its row. */
interface Named {
  name: string;
  authenticator: TokenAuthenticator;
}

/**
 * Remembered tokens are timed this many calls at a time, each call still awaited in turn: timed one by one, the
 * measuring loop's clock reads and its record of every latency cost about 0.7 µs of CPU per call (measured with an
 * empty operation), as much as the lookup itself, and capped the rate at about 300,000/s on a busy machine.
 */
const REMEMBERED_BATCH = 100;

/** BENCH_PROFILE_DIR: where each group's CPU profile goes. */
const PROFILE_DIR = process.env['BENCH_PROFILE_DIR'];

/** Runs `group`, with a CPU profile of this process written to PROFILE_DIR/auth-<label>.cpuprofile when it is set. */
async function profiled<T>(label: string, group: () => Promise<T>): Promise<T> {
  if (PROFILE_DIR === undefined) return group();
  const session = new Session();
  session.connect();
  try {
    await session.post('Profiler.enable');
    await session.post('Profiler.start');
    const result = await group();
    const { profile } = await session.post('Profiler.stop');
    writeFileSync(join(PROFILE_DIR, `auth-${label}.cpuprofile`), JSON.stringify(profile));
    return result;
  } finally {
    session.disconnect();
  }
}

/** `measure` with this process's CPU time per operation beside it (`cpuUsPerOp`): on a busy machine the rate is
 * what the process got of a core, the CPU time what each operation cost. */
async function measureWithCPU(
  name: string,
  op: (i: number) => Promise<unknown>,
  warmupSeconds: number,
  batch = 1,
): Promise<Measurement> {
  let cpu: NodeJS.CpuUsage | undefined;
  const batched = async (i: number): Promise<void> => {
    for (let j = 0; j < batch; j++) await op(i * batch + j);
  };
  const m = await measure(name, batch === 1 ? op : batched, {
    seconds: SECONDS,
    warmupSeconds,
    onStart: () => (cpu = process.cpuUsage()),
  });
  const used = process.cpuUsage(cpu);
  // Each figure per call: a batch's latency over its calls is the mean call's within it.
  return {
    ...m,
    ops: m.ops * batch,
    perSecond: m.perSecond * batch,
    p50us: m.p50us / batch,
    p99us: m.p99us / batch,
    cpuUsPerOp: (used.user + used.system) / Math.max(1, m.ops * batch),
    ...(batch === 1 ? {} : { batch }),
  };
}

/**
 * An issuer that signs with RS256, as most issuers do (RS256 is the algorithm every OpenID provider must support, and
 * the default of the large hosted ones, Keycloak, Dex and the Kubernetes service-account issuer), where the
 * development issuer signs with ES256, whose verification costs OpenSSL several times as much. Its discovery
 * document and keys are handed to validateJWT from memory: the signature check is what is measured, not a server.
 */
async function rs256Issuer(): Promise<{
  authenticator: JWTAuthenticator;
  jwk: JWK;
  mint: (username: string) => Promise<string>;
}> {
  const url = 'https://rs256.issuer.invalid';
  const { privateKey, publicKey } = await generateKeyPair('RS256');
  const jwk = { ...(await exportJWK(publicKey)), kid: 'rs256', alg: 'RS256', use: 'sig' };
  const documents = new Map<string, unknown>([
    [`${url}/.well-known/openid-configuration`, { issuer: url, jwks_uri: `${url}/keys` }],
    [`${url}/keys`, { keys: [jwk] }],
  ]);
  const { authenticator } = await validateJWT({ issuer: url, audience: 'sealion' }, undefined, {
    fetchJSON: (u) => Promise.resolve(documents.get(u)),
  });
  if (!authenticator) throw new Error('the RS256 issuer did not validate');
  const mint = (username: string): Promise<string> =>
    new SignJWT({ username, groups: ['a'] })
      .setProtectedHeader({ alg: 'RS256', kid: 'rs256', typ: 'JWT' })
      .setIssuer(url)
      .setAudience('sealion')
      .setIssuedAt()
      .setExpirationTime('15m')
      .sign(privateKey);
  return { authenticator, jwk, mint };
}

/** A bare signature check of `token` with node:crypto: the floor under any JWT verification in Node. */
function signatureCheck(token: string, key: KeyObject, ecdsa: boolean): () => Promise<boolean> {
  const dot = token.lastIndexOf('.');
  const input = Buffer.from(token.slice(0, dot));
  const signature = Buffer.from(token.slice(dot + 1), 'base64url');
  const options = ecdsa ? { key, dsaEncoding: 'ieee-p1363' as const } : key;
  return () => Promise.resolve(verify('sha256', input, options, signature));
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
  const authenticating = (t: Named, tokensOf: string[]) => async (i: number) => {
    // A refusal is quicker than an answer: a run that measured refusals would judge nothing.
    const result = await t.authenticator.authenticate(tokensOf[i % tokensOf.length]!);
    if (!result.ok) throw new Error(`${t.name}: token refused: ${result.reason}`);
  };
  const pair = (label: string, [plain, cel]: readonly [Named, Named], tokensOf: string[], batch = 1) =>
    profiled(label, () =>
      measureRounds([plain, cel], (t, warmupSeconds) =>
        measureWithCPU(t.name, authenticating(t, tokensOf), warmupSeconds, batch),
      ),
    );
  const [first, remembered] = AUTH_PAIRS;
  rows.push(
    ...(await pair(
      'first',
      [
        { name: first.plain, authenticator },
        { name: first.cel, authenticator: withCEL },
      ],
      fresh,
    )),
  );
  // The same few tokens again and again, as kubectl sends them: answered from the verified-token cache, each verified
  // once first (the warm-up alone leaves some unverified when the machine is slow, and the rows would then time first
  // verifications among the remembered ones).
  for (const c of [cache, celCache]) for (const token of tokens) await c.authenticate(token);
  rows.push(
    ...(await pair(
      'remembered',
      [
        { name: remembered.plain, authenticator: cache },
        { name: remembered.cel, authenticator: celCache },
      ],
      tokens,
      REMEMBERED_BATCH,
    )),
  );
  // RS256 tokens, each seen once per pass (the authenticator keeps nothing per token, so 2,000 in turn cost as many
  // distinct ones and take less time to sign), beside node:crypto's signature check alone for RS256 and ES256.
  const rs256 = await rs256Issuer();
  const rsTokens = await Promise.all(Array.from({ length: 2000 }, (_, i) => rs256.mint(`rs-${i}`)));
  const esKey = createPublicKey({ key: issuer.currentJWK(), format: 'jwk' });
  const rsKey = createPublicKey({ key: rs256.jwk, format: 'jwk' });
  const rsNamed = { name: AUTH_RS256, authenticator: rs256.authenticator };
  const floors: [string, (i: number) => Promise<unknown>][] = [
    [AUTH_RS256, authenticating(rsNamed, rsTokens)],
    [AUTH_FLOORS.rs256, signatureCheck(rsTokens[0]!, rsKey, false)],
    [AUTH_FLOORS.es256, signatureCheck(fresh[0]!, esKey, true)],
  ];
  rows.push(
    ...(await profiled('rs256', () =>
      measureRounds(floors, ([name, op], warmupSeconds) => measureWithCPU(name, op, warmupSeconds)),
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
  // The CPU this process spent per operation, threads included: what an operation costs when the machine is shared.
  for (const r of rows)
    if (typeof r['cpuUsPerOp'] === 'number')
      console.log(`${r.name.padEnd(40)} ${r['cpuUsPerOp'].toFixed(2).padStart(9)} µs CPU per operation`);
  console.log(`saved ${saveResults('auth', rows)}`);
  const verdict = printVerdicts(
    'Targets (CEL: each round with against without, the median of the rounds; rates: the median round)',
    authVerdicts(rows),
  );

  cache.close();
  celCache.close();
  server.closeAllConnections();
  server.close();
  await issuer.stop();
  return verdict;
}
