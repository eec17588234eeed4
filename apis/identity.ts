// identity.concierge.<suffix>/v1alpha1: WhoAmIRequest echoes the user the impersonation proxy sees.
import type { ObjectMeta } from './meta.ts';

export interface KubernetesUserInfo {
  user: {
    username: string;
    uid?: string;
    groups?: string[];
    extra?: Record<string, string[]>;
  };
  audiences?: string[];
}

export interface WhoAmIRequest {
  apiVersion: string;
  kind: 'WhoAmIRequest';
  metadata?: ObjectMeta;
  spec?: Record<string, never>;
  status?: { kubernetesUserInfo: KubernetesUserInfo };
}

/**
 * How to reach the SSH door, for anyone signed in (`GET /apis/identity.concierge.<suffix>/v1alpha1/sshdoor` at the
 * impersonation proxy, whichever cluster's URL): what `ssh` needs to connect and pin the host key, nothing about
 * users. The host key and address are no secret (every client is shown them); bindings and users are not here.
 */
export interface SSHDoor {
  apiVersion: string;
  kind: 'SSHDoor';
  metadata: ObjectMeta;
  status: {
    /** host:port clients connect to; absent while the proxy's Service has no address. */
    endpoint?: string;
    /** The host keys, as a known_hosts line has them after its host patterns. */
    hostKeys: { algorithm: string; publicKey: string; fingerprint: string }[];
    /** What targets call the hub's own cluster (`ssh <host> <hubName>/<namespace>/<pod>`). */
    hubName: string;
    /** Whether a key may be bound by a device login (else only bound keys and SSH certificates sign in). */
    deviceLogin: boolean;
  };
}
