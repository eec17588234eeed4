// The SSH door's controllers: the server, on every replica, hands the door its host key, settings and what signed-in
// users read of it (its address, once the proxy's Service has one, and its public key) when the config turns it on
// (and nothing when off); the writer, on the leader, makes the host key once and keeps it in a Secret (so
// every replica, and every restart, shows clients the same key), and publishes how to reach the door and the key's
// fingerprint in the CredentialIssuer's status, where clients pin it.
import ssh2 from 'ssh2';
import type { SSHHostKey, SSHStatus } from '../apis/config.ts';
import { fingerprint } from '../lib/ssh/keys.ts';
import type { Informer, KubeObject } from '../lib/kube/informer.ts';
import type { ObjectWriter } from '../lib/kube/kube.ts';
import type { Logger } from '../lib/log.ts';
import type { Controller, Watch } from '../lib/controller/controller.ts';
import type { SyncResult } from '../lib/controller/queue.ts';

export const SSH_HOST_KEY_SECRET = 'sealion-ssh-host-key';
/** The private key in OpenSSH's format, and the public key as `<algorithm> <base64>`. */
const PRIVATE_KEY = 'ssh_host_ed25519_key';
const PUBLIC_KEY = 'ssh_host_ed25519_key.pub';
export const SSH_KEY = 'ssh-door';

interface SecretLike extends KubeObject {
  data?: Record<string, string>;
}

/** What the door serves with, and what it tells signed-in users of itself (where to connect, which key to pin). */
export interface SshMaterial {
  hostKeys: string[];
  /** host:port clients connect to, once the proxy's Service has an address; and the public host keys. */
  published: { endpoint?: string; hostKeys: SSHHostKey[] };
}

export interface SshDoorDeps<S> {
  namespace: string;
  /** Whether the config turns the door on, its settings, the port clients use, and a rejected edit's problem. */
  settings: () => { enabled: boolean; port: number; settings: S; problem?: string };
  /** The host clients reach the proxy's Service at, once it has one; undefined while the proxy does not run. */
  host: () => string | undefined;
  secrets: Informer<SecretLike>;
  /** The writer's writes (leader-only). */
  writes: ObjectWriter;
  /** Called on every sync with what the door should serve (undefined: stop listening). */
  serve: (material: (SshMaterial & { settings: S }) | undefined) => void;
  /** Writes status.ssh of the CredentialIssuer (null removes it). Leader-only. */
  publish: (status: SSHStatus | null) => Promise<void>;
  log: Logger;
}

/** The public key (`<algorithm> <base64>`) of an OpenSSH private key the door can serve with; undefined if none. */
export function publicKeyOf(privateKey: string): string | undefined {
  const parsed = privateKey ? ssh2.utils.parseKey(privateKey) : undefined;
  if (!parsed || parsed instanceof Error || Array.isArray(parsed) || !parsed.isPrivateKey()) return undefined;
  return `${parsed.type} ${parsed.getPublicSSH().toString('base64')}`;
}

/**
 * A new ed25519 host key. ssh2's generator now and then makes a key its own parser refuses (about one in two
 * hundred), and a stored key is never replaced: only one that reads back is kept.
 */
function newHostKey(): { private: string; public: string } {
  for (let i = 0; i < 20; i++) {
    const made = ssh2.utils.generateKeyPairSync('ed25519');
    const publicKey = publicKeyOf(made.private);
    if (publicKey) return { private: made.private, public: publicKey };
  }
  throw new Error('no usable ed25519 host key could be made');
}

export function newSshDoorControllers<S>(deps: SshDoorDeps<S>): { server: Controller; writer: Controller } {
  const watches = [
    {
      informer: deps.secrets,
      filter: (s: SecretLike) => s.metadata?.name === SSH_HOST_KEY_SECRET,
      key: () => SSH_KEY,
    },
  ];
  const server: Controller = {
    name: 'ssh-door-server',
    watches,
    initialKeys: [SSH_KEY],
    sync(): Promise<SyncResult> {
      const { enabled, settings, port } = deps.settings();
      const found = enabled ? storedHostKey(deps) : undefined;
      const key = found && 'privateKey' in found ? found : undefined;
      const host = deps.host();
      deps.serve(
        key
          ? {
              hostKeys: [key.privateKey],
              published: { ...(host ? { endpoint: `${host}:${port}` } : {}), hostKeys: [publicHostKey(key)] },
              settings,
            }
          : undefined,
      );
      // The leader makes the key; it arrives through the informer.
      return Promise.resolve(enabled && !key ? { requeueAfterMs: 5_000 } : undefined);
    },
  };
  return { server, writer: sshDoorWriter(deps, watches) };
}

type HostKey = { privateKey: string; publicKey: string };

/** The stored key, when it is one the door can serve with; its public half is derived from it, never read. */
function storedHostKey<S>(deps: SshDoorDeps<S>): HostKey | { problem: string } | undefined {
  const ns = deps.namespace;
  const data = deps.secrets.get(SSH_HOST_KEY_SECRET, ns)?.data;
  if (!data) return undefined;
  const privateKey = Buffer.from(data[PRIVATE_KEY] ?? '', 'base64').toString('utf8');
  const publicKey = publicKeyOf(privateKey);
  return publicKey
    ? { privateKey, publicKey }
    : {
        problem: `Secret ${ns}/${SSH_HOST_KEY_SECRET} holds no usable ${PRIVATE_KEY}; delete it to have a new one made`,
      };
}

/**
 * A new host key in its Secret. Created, never replaced: a key clients have pinned must not change under them.
 * Another leader's key, not in the cache yet, makes this create fail and the sync retry.
 */
async function createHostKey<S>(deps: SshDoorDeps<S>): Promise<HostKey> {
  const made = newHostKey();
  await deps.writes.create({
    apiVersion: 'v1',
    kind: 'Secret',
    metadata: {
      name: SSH_HOST_KEY_SECRET,
      namespace: deps.namespace,
      labels: { 'app.kubernetes.io/part-of': 'sealion' },
    },
    type: 'Opaque',
    data: {
      [PRIVATE_KEY]: Buffer.from(made.private).toString('base64'),
      [PUBLIC_KEY]: Buffer.from(made.public).toString('base64'),
    },
  } as never);
  deps.log.info('ssh host key made');
  return { privateKey: made.private, publicKey: made.public.trim() };
}

/** A host key as clients pin it. */
function publicHostKey(key: HostKey): SSHHostKey {
  const [algorithm = '', base64 = ''] = key.publicKey.split(' ');
  return {
    algorithm,
    publicKey: `${algorithm} ${base64}`,
    fingerprint: fingerprint(Buffer.from(base64, 'base64')),
  };
}

/** status.ssh of an enabled door: where to reach it (once the proxy's Service has an address) and its host key. */
function enabledStatus(key: HostKey, port: number, host: string | undefined, note: string): SSHStatus {
  return {
    status: host ? 'Success' : 'Error',
    message: host
      ? `the SSH door is enabled by configuration; ssh -p ${port} <user>@${host}${note}`
      : `the SSH door is enabled by configuration and waits for the impersonation proxy's Service to get an address${note}`,
    ...(host ? { endpoint: `${host}:${port}` } : {}),
    hostKeys: [publicHostKey(key)],
  };
}

/** The leader: makes the host key once and publishes status.ssh when it changes. */
function sshDoorWriter<S>(deps: SshDoorDeps<S>, watches: Watch[]): Controller {
  let published = '';
  const publish = async (status: SSHStatus | null): Promise<void> => {
    const text = JSON.stringify(status);
    if (text !== published) await deps.publish(status);
    published = text;
  };
  return {
    name: 'ssh-door-writer',
    watches,
    initialKeys: [SSH_KEY],
    async sync(): Promise<SyncResult> {
      const { enabled, port, problem } = deps.settings();
      const note = problem ? `; the latest config edit was rejected: ${problem}` : '';
      if (!enabled) return publish(null);
      const key = storedHostKey(deps) ?? (await createHostKey(deps));
      if ('problem' in key) {
        await publish({ status: 'Error', message: key.problem });
        return { requeueAfterMs: 30_000 };
      }
      const host = deps.host();
      await publish(enabledStatus(key, port, host, note));
      return host ? undefined : { requeueAfterMs: 10_000 };
    },
  };
}
