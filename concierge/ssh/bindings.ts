// SSH keys bound to the identity their holder signed in as. After a device login, the key the client proved it holds
// is bound to that identity until the ID token would have expired, so the next `ssh` with the key needs no login.
// A binding is a Secret in the concierge's namespace: every replica reads it (one informer), it survives restarts,
// and an admin revokes it with `kubectl delete secret` (all of a user's: by the label, see README).
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
/** No binding outlives this, whatever its token said. */
export const MAX_BINDING_MS = 24 * 3600_000;

export interface BindingSecret extends KubeObject {
  data?: Record<string, string>;
}

interface Stored {
  /** The key's SHA-256 fingerprint, checked again on every read: a Secret renamed onto another key binds nothing. */
  fingerprint: string;
  user: UserInfo;
  via: string;
  /** Milliseconds since the epoch. */
  expires: number;
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
}

export interface KeyBindings {
  /** The binding of the key (its blob), when one is stored and has not expired; whether its authenticator holds is the caller's question. */
  find(keyBlob: Buffer, fingerprint: string): BoundKey | undefined;
  /**
   * Binds the key to `identity`, made by the login of `authenticator`, until `expires` (at most MAX_BINDING_MS from
   * now); gives the binding's end.
   */
  bind(
    keyBlob: Buffer,
    fingerprint: string,
    login: { identity: SignedIn; authenticator: AuthenticatorBinding; expires: Date },
  ): Promise<Date>;
}

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
  return {
    find(keyBlob, fingerprint) {
      const stored = parse(deps.secrets.get(bindingName(keyBlob), deps.namespace));
      if (!stored || stored.fingerprint !== fingerprint || stored.expires <= now()) return undefined;
      return {
        identity: { kind: 'user', user: stored.user, via: stored.via },
        authenticator: { uid: stored.authenticator.uid, trust: stored.authenticator.trust },
      };
    },
    async bind(keyBlob, fingerprint, { identity, authenticator, expires }) {
      const until = Math.min(expires.getTime(), now() + MAX_BINDING_MS);
      const stored: Stored = {
        fingerprint,
        user: identity.user,
        via: identity.via,
        expires: until,
        authenticator: { uid: authenticator.uid, trust: authenticator.trust },
      };
      await deps.writes.apply({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: {
          name: bindingName(keyBlob),
          namespace: deps.namespace,
          labels: { [BINDING_LABEL]: 'true', 'app.kubernetes.io/part-of': 'sealion' },
          annotations: {
            [USER_ANNOTATION]: identity.user.username,
            [EXPIRES_ANNOTATION]: new Date(until).toISOString(),
            [FINGERPRINT_ANNOTATION]: fingerprint,
          },
        },
        type: 'Opaque',
        data: { [KEY]: Buffer.from(JSON.stringify(stored)).toString('base64') },
      } as never);
      return new Date(until);
    },
  };
}
