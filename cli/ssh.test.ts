import { describe, expect, it } from '@jest/globals';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { missingKeyHint, splitEndpoint, sshConfigText, sshDoorConfig, type SshConfigFlags } from './ssh.ts';

const KEY = 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOv4p1Xv2bZ0Nq1tTtQv7dN2mC5c0a8i0cWm2b1pVgS6';
// ssh-keygen -lf prints this for KEY.
const PRINT = 'SHA256:jm3FR0Q2r06SMPlmijOAOgCl9Opa14rUOWFzk1dNQAA';
const OTHER_PRINT = 'SHA256:Yp2wS2m9JmXr4nQq7kq8m3xq3V0bC6ZbW5qK0P2uQ9E';
const BLOB = KEY.split(' ')[1]!;
const flags: SshConfigFlags = {
  kubeconfig: '',
  context: '',
  groupSuffix: 'sealion.dev',
  alias: 'sealion',
  loginName: '',
  knownHosts: false,
  knownHostsFile: '',
};
const door = (status: object): object => ({
  apiVersion: 'identity.concierge.sealion.dev/v1alpha1',
  kind: 'SSHDoor',
  metadata: { name: 'sshdoor' },
  status: {
    endpoint: '10.0.0.7:2222',
    hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: KEY, fingerprint: PRINT }],
    hubName: 'hub',
    deviceLogin: true,
    ...status,
  },
});
const FROM = 'https://127.0.0.1:31443';

describe('sshDoorConfig', () => {
  it('gives the Host block and the known_hosts lines under the alias', () => {
    const config = sshDoorConfig(door({}), flags, FROM);
    expect(config).toEqual({
      alias: 'sealion',
      hostName: '10.0.0.7',
      port: 2222,
      hostKeyAlias: 'sealion',
      knownHosts: [`sealion ${KEY}`],
      hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: KEY, fingerprint: PRINT }],
      hubName: 'hub',
      deviceLogin: true,
    });
    expect(sshConfigText(config)).toBe(
      [
        "# Sealion's SSH door: append to ~/.ssh/config (sealion ssh config >> ~/.ssh/config), and pin its host key",
        `# ${PRINT} with sealion ssh config --known-hosts >> ~/.ssh/known_hosts`,
        '# Then: ssh -t sealion hub/<namespace>/<pod>, or ssh -t sealion for a menu.',
        'Host sealion',
        '  HostName 10.0.0.7',
        '  Port 2222',
        '  HostKeyAlias sealion',
        '  # User <principal>   (only SSH certificates read it: one of their principals)',
        '',
      ].join('\n'),
    );
  });

  it('names the login and the known_hosts file when asked, and port 22 plainly', () => {
    const config = sshDoorConfig(
      door({ endpoint: 'ssh.example.com:22' }),
      { ...flags, alias: 'prod', loginName: 'alice', knownHostsFile: '.sealion/known hosts' },
      FROM,
    );
    expect(config.knownHosts).toEqual([`prod ${KEY}`]);
    expect(sshConfigText(config)).toContain(
      '  HostKeyAlias prod\n  UserKnownHostsFile ".sealion/known hosts"\n  User alice\n',
    );
  });

  it('pins the key under the alias only, never under the address the server names', () => {
    const config = sshDoorConfig(door({ endpoint: 'github.com:22' }), flags, FROM);
    expect(config.knownHosts).toEqual([`sealion ${KEY}`]);
    expect(config.hostName).toBe('github.com');
  });

  it.each([
    [{ endpoint: 'evil\n  ProxyCommand sh -c id:22' }, 'an endpoint that is no host:port'],
    [{ endpoint: 'host:0' }, 'an endpoint that is no host:port'],
    [{ hostKeys: [] }, 'no host key'],
    [
      { hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: `${KEY}\nHost *`, fingerprint: PRINT }] },
      'a host key that is no OpenSSH public key',
    ],
    [
      { hostKeys: [{ algorithm: 'ssh-rsa', publicKey: KEY, fingerprint: PRINT }] },
      'a host key that is no OpenSSH public key',
    ],
    [
      { hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: KEY, fingerprint: 'MD5:aa' }] },
      'a host key fingerprint that is no SHA256:…',
    ],
    [
      { hostKeys: [{ algorithm: 'ssh-rsa', publicKey: `ssh-rsa ${BLOB}`, fingerprint: PRINT }] },
      'a host key named ssh-rsa whose blob holds ssh-ed25519',
    ],
    [
      { hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: KEY, fingerprint: OTHER_PRINT }] },
      `a host key fingerprint that is not its key's (${PRINT})`,
    ],
    [
      { hostKeys: [{ algorithm: 'ssh-ed25519', publicKey: 'ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAAQ==' }] },
      'a host key that is no OpenSSH public key',
    ],
    [{ hubName: 'Hub Name' }, 'no hub name'],
  ])('refuses an answer with %j', (status, what) => {
    expect(() => sshDoorConfig(door(status), flags, FROM)).toThrow(
      `ssh config on ${FROM}: the SSH door's answer has ${what}; is this a Sealion proxy?`,
    );
  });

  it('says when the door has no address yet', () => {
    expect(() => sshDoorConfig(door({ endpoint: undefined }), flags, FROM)).toThrow(
      `ssh config on ${FROM}: the SSH door has no address yet (the proxy's Service waits for one); retry in a minute`,
    );
  });
});

describe('splitEndpoint', () => {
  it('reads host:port and [v6]:port', () => {
    expect(splitEndpoint('[fd00::1]:2222')).toEqual({ host: 'fd00::1', port: 2222 });
    expect(splitEndpoint('a.example:22')).toEqual({ host: 'a.example', port: 22 });
    expect(splitEndpoint('fd00::1:22')).toBeUndefined();
    expect(splitEndpoint('a b:22')).toBeUndefined();
  });
});

describe('missingKeyHint', () => {
  it('tells a user without an SSH key how to make one, and says nothing to one with a key', () => {
    const home = mkdtempSync(join(tmpdir(), 'sealion-ssh-home-'));
    try {
      expect(missingKeyHint(home)).toBe(
        `sealion: no SSH key in ${join(home, '.ssh')} (id_ed25519, id_ecdsa, id_rsa); make one with ssh-keygen -t ed25519, then ssh binds it at your first login`,
      );
      mkdirSync(join(home, '.ssh'));
      writeFileSync(join(home, '.ssh', 'id_ecdsa'), '');
      expect(missingKeyHint(home)).toBeUndefined();
    } finally {
      rmSync(home, { recursive: true, force: true });
    }
  });
});
