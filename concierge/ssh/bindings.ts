// SSH keys bound to the identity their holder signed in as. After a device login, the key the client proved it holds
// is bound to that identity, so the next `ssh` with the key needs no login: until the ID token expires, and, where the
// login gave a refresh token, for as long as the door can renew the login with it (renewal.ts), up to the session's
// hard end (the login's time plus ssh.maxBindingLifetime), as Pinniped's supervisor keeps an upstream session.
// A binding is a Secret in the concierge's namespace: every replica reads it (one informer), it survives restarts,
// and an admin revokes it with `kubectl delete secret` (all of a user's: by the label, see README). The refresh
// token in it is as secret as a password while the session lasts: only the concierge may read Secrets there, and it
// is never logged.
import { createHash } from 'node:crypto';
import type { Informer, KubeObject } from '../../lib/kube/informer.ts';
import type { ObjectWriter } from '../../lib/kube/kube.ts';
import type { AuthenticatorBinding } from '../../lib/authn/cache.ts';
import type { UserInfo } from '../../lib/authn/types.ts';
import type { SignedIn } from './in-process.ts';

/** The label every binding Secret carries; the informer selects by it. */
export const BINDING_LABEL = 'sealion.dev/ssh-key-binding';
export const BINDING_SELECTORS = { labelSelector: `${BINDING_LABEL}=true` };
const KEY = 'binding.json';
/** Kept for people and `kubectl get -L`: whose it is and until when. */
const USER_ANNOTATION = 'sealion.dev/ssh-user';
const EXPIRES_ANNOTATION = 'sealion.dev/expires';
const FINGERPRINT_ANNOTATION = 'sealion.dev/ssh-key-fingerprint';
/** No binding outlives this, whatever its token or the config said (the config's own upper bound). */
export const MAX_BINDING_MS = 168 * 3600_000;

export interface BindingSecret extends KubeObject {
  data?: Record<string, string>;
}

interface Stored {
  /** The key's SHA-256 fingerprint, checked again on every read: a Secret renamed onto another key binds nothing. */
  fingerprint: string;
  user: UserInfo;
  via: string;
  /** When the ID token of the last login or renewal expires, at most `ends`; milliseconds since the epoch. */
  expires: number;
  /** When the device login was, and its hard end: no renewal goes past it. */
  since?: number;
  ends?: number;
  /** The issuer's refresh token, when it gave one: renews the login after `expires`. */
  refreshToken?: string;
  /**
   * The JWTAuthenticator whose login made it, by uid and the digest of what its spec trusts (as a TokenCredentialRequest
   * certificate is bound): deleting it, re-creating it under its name, or changing whom it trusts ends the binding.
   */
  authenticator: AuthenticatorBinding;
}

/** A key's binding as it holds now: the identity, and the authenticator that must still be loaded as it was. */
export interface BoundKey {
  identity: SignedIn;
  authenticator: AuthenticatorBinding;
  /** When the login was (ms since the epoch; none: before bindings kept it), for a cap lowered since. */
  since?: number;
  /** Until when the ID token holds (ms since the epoch); past it, the refresh token must renew the login. */
  expires?: number;
  refreshToken?: string;
  /** The binding's Secret as it was found (its resourceVersion): renew and end change only that one. */
  version?: string;
}

/** A login to bind a key to, or to renew its binding with. */
export interface BindingLogin {
  identity: SignedIn;
  authenticator: AuthenticatorBinding;
  /** When its ID token expires. */
  expires: Date;
  refreshToken?: string;
}

export interface KeyBindings {
  /**
   * The binding of the key (its blob), when one is stored and holds: its ID token has not expired, or it has a
   * refresh token and its session has not ended. Whether its authenticator holds is the caller's question.
   */
  find(keyBlob: Buffer, fingerprint: string): BoundKey | undefined;
  /**
   * Binds the key to `identity`, made by the login of `authenticator`: until `expires`, or with a refresh token
   * until `maxLifetimeMs` from now (at most MAX_BINDING_MS either way). Gives the binding's end.
   */
  bind(keyBlob: Buffer, fingerprint: string, login: BindingLogin & { maxLifetimeMs?: number }): Promise<Date>;
  /**
   * Keeps the key's binding with a renewed login (its new ID token's expiry, a rotated refresh token), within the
   * session's end as it was bound. `version` is the binding as `find` gave it: the write is conditional on it, so it
   * rejects when the binding changed since (deleted by an admin, renewed by another replica or another sign-in
   * here), and never brings a binding back nor overwrites a newer login.
   */
  renew(
    keyBlob: Buffer,
    fingerprint: string,
    login: BindingLogin,
    version: string | undefined,
  ): Promise<void>;
  /**
   * Ends the key's binding (its Secret is deleted); with `version`, only that binding as found: it rejects when the
   * binding changed since (a renewal stored a newer login, which a stale refresh token's refusal must not end).
   */
  end(keyBlob: Buffer, version?: string): Promise<void>;
  /**
   * Deletes every binding whose session ended (its refresh token, kept in it, must not outlive it): each as it was
   * read, so a binding renewed meanwhile stays. Gives how many it deleted; a failed delete is tried next time.
   */
  sweep(): Promise<number>;
}

/** How often the leader deletes the bindings whose session ended. */
export const BINDING_SWEEP_MS = 10 * 60_000;

/** The Secret's name for a key: derived from the key, so one key has one binding. */
export const bindingName = (keyBlob: Buffer): string =>
  `sealion-ssh-key-${createHash('sha256').update(keyBlob).digest('hex').slice(0, 40)}`;

function parse(secret: BindingSecret | undefined): Stored | undefined {
  const raw = secret?.data?.[KEY];
  if (!raw) return undefined;
  try {
    const stored = JSON.parse(Buffer.from(raw, 'base64').toString('utf8')) as Partial<Stored>;
    const user = stored.user;
    if (
      typeof stored.fingerprint !== 'string' ||
      typeof stored.via !== 'string' ||
      typeof stored.expires !== 'number' ||
      (stored.since !== undefined && typeof stored.since !== 'number') ||
      (stored.ends !== undefined && typeof stored.ends !== 'number') ||
      (stored.refreshToken !== undefined && typeof stored.refreshToken !== 'string') ||
      !user ||
      typeof user.username !== 'string' ||
      !Array.isArray(user.groups) ||
      !user.groups.every((g) => typeof g === 'string') ||
      typeof user.extra !== 'object' ||
      user.extra === null ||
      // Bindings from before they named their authenticator's uid bind nothing.
      typeof stored.authenticator?.uid !== 'string' ||
      typeof stored.authenticator.trust !== 'string'
    )
      return undefined;
    return stored as Stored;
  } catch {
    return undefined;
  }
}

export function newKeyBindings(deps: {
  namespace: string;
  secrets: Informer<BindingSecret>;
  writes: ObjectWriter;
  now?: () => number;
}): KeyBindings {
  const now = deps.now ?? Date.now;
  const read = (keyBlob: Buffer, fingerprint: string): Stored | undefined => {
    const stored = parse(deps.secrets.get(bindingName(keyBlob), deps.namespace));
    return stored?.fingerprint === fingerprint ? stored : undefined;
  };
  // `resourceVersion`, when given, makes the write conditional on the Secret as it was read: server-side apply then
  // refuses (a conflict) when the Secret changed or is gone meanwhile, so a renewal never brings back a binding an
  // admin deleted, nor overwrites another replica's renewal.
  const store = async (keyBlob: Buffer, stored: Stored, resourceVersion?: string): Promise<void> => {
    await deps.writes.apply({
      apiVersion: 'v1',
      kind: 'Secret',
      metadata: {
        name: bindingName(keyBlob),
        namespace: deps.namespace,
        ...(resourceVersion ? { resourceVersion } : {}),
        labels: { [BINDING_LABEL]: 'true', 'app.kubernetes.io/part-of': 'sealion' },
        annotations: {
          [USER_ANNOTATION]: stored.user.username,
          [EXPIRES_ANNOTATION]: new Date(stored.ends ?? stored.expires).toISOString(),
          [FINGERPRINT_ANNOTATION]: stored.fingerprint,
        },
      },
      type: 'Opaque',
      data: { [KEY]: Buffer.from(JSON.stringify(stored)).toString('base64') },
    } as never);
  };
  return {
    find(keyBlob, fingerprint) {
      const version = deps.secrets.get(bindingName(keyBlob), deps.namespace)?.metadata?.resourceVersion;
      const stored = read(keyBlob, fingerprint);
      const at = now();
      if (!stored) return undefined;
      const renewable = stored.refreshToken !== undefined && stored.ends !== undefined && at < stored.ends;
      if (stored.expires <= at && !renewable) return undefined;
      return {
        identity: { kind: 'user', user: stored.user, via: stored.via },
        authenticator: { uid: stored.authenticator.uid, trust: stored.authenticator.trust },
        expires: stored.expires,
        ...(stored.since !== undefined ? { since: stored.since } : {}),
        ...(renewable ? { refreshToken: stored.refreshToken } : {}),
        ...(version ? { version } : {}),
      };
    },
    async bind(keyBlob, fingerprint, login) {
      const since = now();
      const cap = Math.min(login.maxLifetimeMs ?? MAX_BINDING_MS, MAX_BINDING_MS);
      const ends = login.refreshToken ? since + cap : Math.min(login.expires.getTime(), since + cap);
      await store(keyBlob, { ...storedOf(fingerprint, login, ends), since, ends });
      return new Date(ends);
    },
    async renew(keyBlob, fingerprint, login, version) {
      const stored = read(keyBlob, fingerprint);
      if (!stored?.ends || stored.since === undefined || !version) throw new Error('the binding is gone');
      await store(
        keyBlob,
        { ...storedOf(fingerprint, login, stored.ends), since: stored.since, ends: stored.ends },
        version,
      );
    },
    async end(keyBlob, version) {
      await deps.writes.delete('Secret', deps.namespace, bindingName(keyBlob), version);
    },
    async sweep() {
      const at = now();
      let deleted = 0;
      for (const secret of deps.secrets.list()) {
        const stored = parse(secret);
        const name = secret.metadata?.name;
        // What is not a binding (no content this code wrote) is the admin's to remove.
        if (!stored || !name || (stored.ends ?? stored.expires) > at) continue;
        const removed = await deps.writes
          .delete('Secret', deps.namespace, name, secret.metadata?.resourceVersion)
          .then(
            () => true,
            () => false,
          );
        if (removed) deleted++;
      }
      return deleted;
    },
  };
}

/** What a Secret keeps of a login: the ID token's expiry within the session's end. */
function storedOf(fingerprint: string, login: BindingLogin, ends: number): Stored {
  return {
    fingerprint,
    user: login.identity.user,
    via: login.identity.via,
    expires: Math.min(login.expires.getTime(), ends),
    authenticator: { uid: login.authenticator.uid, trust: login.authenticator.trust },
    ...(login.refreshToken ? { refreshToken: login.refreshToken } : {}),
  };
}
