import { describe, expect, it } from '@jest/globals';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import { bindingName, MAX_BINDING_MS, newKeyBindings, type BindingSecret } from './bindings.ts';
import type { SignedIn } from './in-process.ts';

const NS = 'sealion';
const alice: SignedIn = {
  kind: 'user',
  user: { username: 'alice@example.com', groups: ['dev'], extra: {} },
  via: 'ssh/JWTAuthenticator/my-oidc',
};
const authenticator = { uid: 'uid-1', trust: 'x'.repeat(43) };
const login = (expires: Date) => ({ identity: alice, authenticator, expires });

function setup(now = 1_000_000) {
  const secrets = new MemoryInformer<BindingSecret>();
  const clock = { now };
  const bindings = newKeyBindings({
    namespace: NS,
    secrets,
    writes: {
      apply: (obj) => Promise.resolve(void secrets.put(obj as BindingSecret)),
      create: () => Promise.resolve(true),
      delete: () => Promise.resolve(),
    },
    now: () => clock.now,
  });
  return { secrets, bindings, clock };
}

describe('key bindings', () => {
  const key = Buffer.from('a key blob');
  const print = 'SHA256:abc';

  it('finds what was bound until it expires, never past a day', async () => {
    const { bindings, clock } = setup();
    await bindings.bind(key, print, login(new Date(clock.now + 3 * 24 * 3600_000)));
    expect(bindings.find(key, print)).toEqual({ identity: alice, authenticator });
    clock.now += MAX_BINDING_MS - 1;
    expect(bindings.find(key, print)).toEqual({ identity: alice, authenticator });
    clock.now += 1;
    expect(bindings.find(key, print)).toBeUndefined();
  });

  it('binds nothing to another key, nor to a Secret renamed onto another key', async () => {
    const { bindings, secrets, clock } = setup();
    await bindings.bind(key, print, login(new Date(clock.now + 3600_000)));
    expect(bindings.find(Buffer.from('another key'), 'SHA256:other')).toBeUndefined();
    const stored = secrets.get(bindingName(key), NS)!;
    const other = Buffer.from('another key');
    secrets.put({ ...stored, metadata: { ...stored.metadata, name: bindingName(other) } });
    expect(bindings.find(other, 'SHA256:other')).toBeUndefined();
  });

  it('ignores a Secret whose content is not a binding', () => {
    const { bindings, secrets } = setup();
    for (const data of [
      'not json',
      '{"fingerprint":"SHA256:abc","expires":9e15,"via":"x","user":{"username":1}}',
      // From before bindings named their authenticator: bound to nothing that can hold.
      '{"fingerprint":"SHA256:abc","expires":9e15,"via":"x","user":{"username":"a","groups":[],"extra":{}}}',
    ]) {
      secrets.put({
        metadata: { name: bindingName(key), namespace: NS },
        data: { 'binding.json': Buffer.from(data).toString('base64') },
      });
      expect(bindings.find(key, print)).toBeUndefined();
    }
  });
});
