import { describe, expect, it } from '@jest/globals';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import { fakeObjectWriter } from '../../test-support/fake-object-writer.ts';
import { bindingName, MAX_BINDING_MS, newKeyBindings, type BindingSecret } from './bindings.ts';
import type { SignedIn } from './in-process.ts';

const NS = 'sealion';
const alice: SignedIn = {
  kind: 'user',
  user: { username: 'alice@example.com', groups: ['dev'], extra: {} },
  via: 'ssh/JWTAuthenticator/my-oidc',
};
const authenticator = { uid: 'uid-1', trust: 'x'.repeat(43) };
const login = (expires: Date, more: { refreshToken?: string; maxLifetimeMs?: number } = {}) => ({
  identity: alice,
  authenticator,
  expires,
  ...more,
});
const HOUR = 3600_000;

function setup(now = 1_000_000) {
  const secrets = new MemoryInformer<BindingSecret>();
  const clock = { now };
  const bindings = newKeyBindings({
    namespace: NS,
    secrets,
    writes: fakeObjectWriter(secrets),
    now: () => clock.now,
  });
  return { secrets, bindings, clock };
}

describe('key bindings', () => {
  const key = Buffer.from('a key blob');
  const print = 'SHA256:abc';

  it('finds what was bound until it expires, never past the cap', async () => {
    const { bindings, clock } = setup();
    const since = clock.now;
    const until = await bindings.bind(
      key,
      print,
      login(new Date(since + 3 * 24 * HOUR), { maxLifetimeMs: 12 * HOUR }),
    );
    expect(until).toEqual(new Date(since + 12 * HOUR));
    const held = {
      identity: alice,
      authenticator,
      since,
      expires: since + 12 * HOUR,
      version: expect.any(String),
    };
    expect(bindings.find(key, print)).toEqual(held);
    clock.now += 12 * HOUR - 1;
    expect(bindings.find(key, print)).toEqual(held);
    clock.now += 1;
    expect(bindings.find(key, print)).toBeUndefined();
    // And never past MAX_BINDING_MS, whatever the caller asks.
    await bindings.bind(
      key,
      print,
      login(new Date(clock.now + 30 * 24 * HOUR), { maxLifetimeMs: 30 * 24 * HOUR }),
    );
    clock.now += MAX_BINDING_MS;
    expect(bindings.find(key, print)).toBeUndefined();
  });

  it('without a refresh token, ends with the ID token', async () => {
    const { bindings, clock } = setup();
    const until = await bindings.bind(
      key,
      print,
      login(new Date(clock.now + 5 * 60_000), { maxLifetimeMs: 12 * HOUR }),
    );
    expect(until).toEqual(new Date(clock.now + 5 * 60_000));
    clock.now += 5 * 60_000 - 1;
    expect(bindings.find(key, print)).toBeDefined();
    clock.now += 1;
    expect(bindings.find(key, print)).toBeUndefined();
  });

  it('with a refresh token, holds past the ID token until the session ends, renewed within that end', async () => {
    const { bindings, secrets, clock } = setup();
    const since = clock.now;
    const until = await bindings.bind(
      key,
      print,
      login(new Date(since + 5 * 60_000), { refreshToken: 'rt-1', maxLifetimeMs: 12 * HOUR }),
    );
    // The session's hard end, not the ID token's: what the banner says.
    expect(until).toEqual(new Date(since + 12 * HOUR));
    const stored = secrets.get(bindingName(key), NS) as { metadata: { annotations: Record<string, string> } };
    expect(stored.metadata.annotations['sealion.dev/expires']).toBe(
      new Date(since + 12 * HOUR).toISOString(),
    );
    clock.now += HOUR;
    // The ID token expired: found with what renews it.
    expect(bindings.find(key, print)).toEqual({
      identity: alice,
      authenticator,
      since,
      expires: since + 5 * 60_000,
      refreshToken: 'rt-1',
      version: expect.any(String),
    });
    // A renewal past the session's end is cut to it, and a rotated refresh token replaces the old.
    const { version } = bindings.find(key, print)!;
    await bindings.renew(key, print, login(new Date(since + 13 * HOUR), { refreshToken: 'rt-2' }), version);
    expect(bindings.find(key, print)).toEqual({
      identity: alice,
      authenticator,
      since,
      expires: since + 12 * HOUR,
      refreshToken: 'rt-2',
      version: expect.any(String),
    });
    clock.now = since + 12 * HOUR;
    expect(bindings.find(key, print)).toBeUndefined();
  });

  it('ends a binding by deleting its Secret, and renews none that is gone', async () => {
    const { bindings, secrets, clock } = setup();
    await bindings.bind(key, print, login(new Date(clock.now + 60_000), { refreshToken: 'rt' }));
    await bindings.end(key);
    expect(secrets.get(bindingName(key), NS)).toBeUndefined();
    expect(bindings.find(key, print)).toBeUndefined();
    await expect(bindings.renew(key, print, login(new Date(clock.now + HOUR)), '1')).rejects.toThrow(
      'the binding is gone',
    );
  });

  it('changes only the binding as it was found: never brings one back, nor overwrites or ends a newer login', async () => {
    const { bindings, secrets, clock } = setup();
    const name = bindingName(key);
    const renewal = (refreshToken: string) => login(new Date(clock.now + HOUR), { refreshToken });
    await bindings.bind(key, print, login(new Date(clock.now + 60_000), { refreshToken: 'rt-1' }));
    // An admin deletes the binding while a renewal is on its way: the write names the version found, and fails.
    const found = bindings.find(key, print)!;
    await bindings.end(key);
    await expect(bindings.renew(key, print, renewal('rt-2'), found.version)).rejects.toThrow();
    expect(secrets.get(name, NS)).toBeUndefined();
    // Another replica (or sign-in) renewed after this one found the binding: this renewal does not overwrite it, and
    // the refusal of the older refresh token this one held does not end it.
    await bindings.bind(key, print, login(new Date(clock.now + 60_000), { refreshToken: 'rt-1' }));
    const stale = bindings.find(key, print)!;
    await bindings.renew(key, print, renewal('theirs'), stale.version);
    await expect(bindings.renew(key, print, renewal('late'), stale.version)).rejects.toThrow('Conflict');
    await expect(bindings.end(key, stale.version)).rejects.toThrow('Conflict');
    expect(bindings.find(key, print)).toMatchObject({ refreshToken: 'theirs' });
    // The binding as found now ends.
    await bindings.end(key, bindings.find(key, print)!.version);
    expect(secrets.get(name, NS)).toBeUndefined();
  });

  it('sweeps the bindings whose session ended, refresh tokens with them, and keeps the rest', async () => {
    const { bindings, secrets, clock } = setup();
    const other = Buffer.from('another key blob');
    // One session of 12 hours, renewed past its ID token; another without a refresh token, ending with its token.
    await bindings.bind(
      key,
      print,
      login(new Date(clock.now + 60_000), { refreshToken: 'rt', maxLifetimeMs: 12 * HOUR }),
    );
    await bindings.bind(other, 'SHA256:other', login(new Date(clock.now + HOUR)));
    secrets.put({ metadata: { name: 'sealion-ssh-key-not-ours', namespace: NS }, data: { binding: 'x' } });
    expect(await bindings.sweep()).toBe(0);
    clock.now += HOUR;
    expect(await bindings.sweep()).toBe(1);
    expect(secrets.get(bindingName(other), NS)).toBeUndefined();
    expect(secrets.get(bindingName(key), NS)).toBeDefined();
    clock.now += 11 * HOUR;
    expect(await bindings.sweep()).toBe(1);
    expect(secrets.get(bindingName(key), NS)).toBeUndefined();
    // What is no binding this code wrote stays for the admin.
    expect(secrets.get('sealion-ssh-key-not-ours', NS)).toBeDefined();
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
