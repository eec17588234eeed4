// One-time bootstrap tokens for agent registration, kept as Secrets in the concierge's namespace so that the API
// server's RBAC guards them and every replica can redeem them. A token is `<id>.<secret>`: the id names the
// Secret, which holds only a hash of the secret, the cluster it is bound to and its expiry. Redeeming deletes the
// Secret with its uid and resourceVersion as preconditions, so of two concurrent redeemers exactly one wins.
import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
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

/** Redeems a token for `cluster`, or throws RedeemError. A wrong cluster name burns the token. */
export async function redeemBootstrapToken(
  clients: KubeClients,
  namespace: string,
  token: string,
  cluster: string,
  now = new Date(),
): Promise<void> {
  const [id, secret, extra] = token.split('.');
  if (!id || !secret || extra !== undefined || !ID.test(id))
    throw new RedeemError('Malformed', 'the token is not <id>.<secret>');
  const name = `${SECRET_PREFIX}${id}`;
  let stored: Awaited<ReturnType<KubeClients['core']['readNamespacedSecret']>>;
  try {
    stored = await clients.core.readNamespacedSecret({ name, namespace });
  } catch (err) {
    if (apiStatusCode(err) === 404) throw new RedeemError('Unknown', `no bootstrap token ${id}`);
    throw err;
  }
  if (stored.type !== BOOTSTRAP_SECRET_TYPE)
    throw new RedeemError('Unknown', `Secret ${name} is no bootstrap token`);
  const field = (key: string): string => Buffer.from(stored.data?.[key] ?? '', 'base64').toString('utf8');
  const want = Buffer.from(field('secret-sha256'), 'hex');
  const got = hash(secret);
  if (want.length !== got.length || !timingSafeEqual(want, got))
    throw new RedeemError('WrongSecret', `wrong secret for bootstrap token ${id}`);

  const burn = async (): Promise<boolean> => {
    try {
      await clients.core.deleteNamespacedSecret({
        name,
        namespace,
        body: {
          preconditions: { uid: stored.metadata!.uid!, resourceVersion: stored.metadata!.resourceVersion! },
        },
      });
      return true;
    } catch (err) {
      const code = apiStatusCode(err);
      if (code === 404 || code === 409) return false;
      throw err;
    }
  };
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
