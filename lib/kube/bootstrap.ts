// One-time bootstrap tokens for agent registration, kept as Secrets in the concierge's namespace so that the API
// server's RBAC guards them and every replica can redeem them. A token is `<id>.<secret>`: the id names the
// Secret, which holds only a hash of the secret, the cluster it is bound to and its expiry. The listener reads them
// from a cache (a watch of those Secrets alone), never one API call per attempt; redeeming deletes the Secret with
// its uid and resourceVersion as preconditions, so of two concurrent redeemers exactly one wins, however old the
// cache.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import type { Informer, KubeObject } from './informer.ts';
import { apiStatusCode, type KubeClients } from './kube.ts';

/** Long enough to install an agent; short enough that a leaked token is soon worthless. */
export const BOOTSTRAP_TOKEN_TTL_MS = 15 * 60 * 1000;
export const BOOTSTRAP_SECRET_TYPE = 'sealion.dev/bootstrap-token';
const SECRET_PREFIX = 'sealion-bootstrap-';
const CLUSTER_LABEL = 'sealion.dev/cluster';
const ID = /^[a-z0-9]{8}$/;

const hash = (secret: string): Buffer => createHash('sha256').update(secret).digest();

/** Why a redemption failed: for the log only; the caller always answers the same 401. */
export class RedeemError extends Error {
  readonly reason: 'Malformed' | 'Unknown' | 'WrongSecret' | 'Expired' | 'WrongCluster' | 'AlreadyUsed';
  constructor(reason: RedeemError['reason'], message: string) {
    super(message);
    this.reason = reason;
  }
}

/** Creates a token bound to `cluster`; returns it (shown once) and when it expires. */
export async function createBootstrapToken(
  clients: KubeClients,
  namespace: string,
  cluster: string,
  now = new Date(),
): Promise<{ token: string; expires: Date }> {
  const id = randomBytes(8)
    .toString('base64url')
    .toLowerCase()
    .replace(/[^a-z0-9]/g, '0')
    .slice(0, 8);
  const secret = randomBytes(32).toString('base64url');
  const expires = new Date(now.getTime() + BOOTSTRAP_TOKEN_TTL_MS);
  await clients.core.createNamespacedSecret({
    namespace,
    body: {
      metadata: {
        name: `${SECRET_PREFIX}${id}`,
        namespace,
        labels: { 'app.kubernetes.io/part-of': 'sealion', [CLUSTER_LABEL]: cluster },
      },
      type: BOOTSTRAP_SECRET_TYPE,
      stringData: { cluster, 'secret-sha256': hash(secret).toString('hex'), expires: expires.toISOString() },
    },
  });
  return { token: `${id}.${secret}`, expires };
}

/**
 * Deletes every unredeemed token for `cluster`: when its agent certificates are revoked, a token minted before
 * (perhaps lying in a shell history) must not let anyone register again.
 */
export async function deleteBootstrapTokens(
  clients: KubeClients,
  namespace: string,
  cluster: string,
): Promise<number> {
  // The name goes into a label selector, where a comma would add terms.
  if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(cluster))
    throw new Error(`${JSON.stringify(cluster)} is not a valid cluster name`);
  const { items } = await clients.core.listNamespacedSecret({
    namespace,
    labelSelector: `${CLUSTER_LABEL}=${cluster}`,
    fieldSelector: `type=${BOOTSTRAP_SECRET_TYPE}`,
  });
  let deleted = 0;
  for (const secret of items) {
    try {
      await clients.core.deleteNamespacedSecret({ name: secret.metadata!.name!, namespace });
      deleted++;
    } catch (err) {
      // Redeemed (or deleted by someone else) meanwhile.
      if (apiStatusCode(err) !== 404) throw err;
    }
  }
  return deleted;
}

/** A bootstrap-token Secret as a watch delivers it (data base64-encoded). */
export interface BootstrapSecret extends KubeObject {
  type?: string;
  data?: Record<string, string>;
}

/**
 * Selects the Secrets that hold bootstrap tokens and no others, so that the listener's cache of them stays as small
 * as the tokens not yet redeemed (the API server filters both by type and by the label every token carries).
 */
export const BOOTSTRAP_SECRET_SELECTORS = {
  fieldSelector: `type=${BOOTSTRAP_SECRET_TYPE}`,
  labelSelector: CLUSTER_LABEL,
};

/** What redeeming needs: the tokens as a cache has them, and a delete that only the first redeemer wins. */
export interface BootstrapTokenStore {
  /** The Secret of this name in the cache, undefined when there is none. */
  get(name: string): BootstrapSecret | undefined;
  /** Deletes the Secret if it is still this object at this version; false when it is gone or has changed. */
  burn(name: string, uid: string, resourceVersion: string): Promise<boolean>;
}

/**
 * The bootstrap tokens of `namespace` as `cache` (an informer over BOOTSTRAP_SECRET_SELECTORS in that namespace)
 * has them; burning goes to the API server, which alone decides which of two redeemers was first.
 */
export function newBootstrapTokenStore(
  clients: KubeClients,
  namespace: string,
  cache: Pick<Informer<BootstrapSecret>, 'get'>,
): BootstrapTokenStore {
  return {
    get: (name) => cache.get(name, namespace),
    async burn(name, uid, resourceVersion) {
      try {
        await clients.core.deleteNamespacedSecret({
          name,
          namespace,
          body: { preconditions: { uid, resourceVersion } },
        });
        return true;
      } catch (err) {
        const code = apiStatusCode(err);
        if (code === 404 || code === 409) return false;
        throw err;
      }
    },
  };
}

const b64 = (text: string): string => Buffer.from(text, 'utf8').toString('base64');
/**
 * What a token that names no Secret is checked against: a bootstrap-token Secret whose secret nobody knows (the
 * hash of 32 random bytes never shown). Every token, found or not, so goes through the same steps (decode the
 * stored hash, hash the presented secret, compare them in constant time) and fails at the same place; how long an
 * answer takes tells nothing about which ids or clusters exist.
 */
const NOBODY_HASH = hash(randomBytes(32).toString('base64url'));
const NOBODY: BootstrapSecret = {
  metadata: { name: `${SECRET_PREFIX}nobody`, uid: '', resourceVersion: '' },
  type: BOOTSTRAP_SECRET_TYPE,
  data: {
    cluster: b64(''),
    'secret-sha256': b64(NOBODY_HASH.toString('hex')),
    expires: b64(new Date(0).toISOString()),
  },
};

/**
 * Redeems a token for `cluster`, or throws RedeemError. A wrong cluster name burns the token.
 *
 * Nothing here asks the API server before the secret is proven: the token is looked up in the cache (every replica
 * watches the tokens), so a stranger's guesses cost no API call, and unknown ids, Secrets of another type and wrong
 * secrets are told apart only after the one constant-time comparison every token gets, and only in the log. What
 * follows a match (expiry, cluster name, the burn) is for holders of a real secret alone.
 */
export async function redeemBootstrapToken(
  tokens: BootstrapTokenStore,
  token: string,
  cluster: string,
  now = new Date(),
): Promise<void> {
  const [id = '', secret = '', extra] = token.split('.');
  const wellFormed = ID.test(id) && secret !== '' && extra === undefined;
  const name = `${SECRET_PREFIX}${id}`;
  const found = tokens.get(name);
  const usable = wellFormed && found?.type === BOOTSTRAP_SECRET_TYPE;
  const stored = usable ? found : NOBODY;
  const field = (key: string): string => Buffer.from(stored.data?.[key] ?? '', 'base64').toString('utf8');
  let want: Buffer = Buffer.from(field('secret-sha256'), 'hex');
  const got = hash(secret);
  // A stored hash of the wrong length (a Secret edited by hand) is compared as NOBODY's, so as not to skip the work.
  if (want.length !== got.length) want = NOBODY_HASH;
  const matches = timingSafeEqual(want, got);
  if (!wellFormed) throw new RedeemError('Malformed', 'the token is not <id>.<secret>');
  if (!found) throw new RedeemError('Unknown', `no bootstrap token ${id}`);
  if (!usable) throw new RedeemError('Unknown', `Secret ${name} is no bootstrap token`);
  if (!matches) throw new RedeemError('WrongSecret', `wrong secret for bootstrap token ${id}`);

  const burn = (): Promise<boolean> =>
    tokens.burn(name, stored.metadata?.uid ?? '', stored.metadata?.resourceVersion ?? '');
  if (Date.parse(field('expires')) <= now.getTime()) {
    await burn();
    throw new RedeemError('Expired', `bootstrap token ${id} expired at ${field('expires')}`);
  }
  if (field('cluster') !== cluster) {
    await burn();
    throw new RedeemError(
      'WrongCluster',
      `bootstrap token ${id} is for cluster ${field('cluster')}, not ${cluster}; the token is burned`,
    );
  }
  if (!(await burn())) throw new RedeemError('AlreadyUsed', `bootstrap token ${id} was redeemed already`);
}
