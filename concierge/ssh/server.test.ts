// The SSH server with the real OpenSSH client, against a stand-in for the pipeline: the in-process door's requests are
// answered here by a WebSocket server that speaks the exec channel protocol and runs the command on this machine. The
// real pipeline, clusters and pods are integration/ssh.test.ts's; this file holds the door's own rules: what a
// stranger may hold, what a signed-in connection ends when it goes, and exec's streams and exit statuses.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFileSync, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { WebSocketServer } from 'ws';
import { silentLogger } from '../../lib/log.ts';
import { fakeClock } from '../../test-support/fake-clock.ts';
import { startOIDCIssuer, type TestIssuer } from '../../dev/oidc-issuer.ts';
import type { AuthenticatorBinding } from '../../lib/authn/cache.ts';
import { decodeJwt } from 'jose';
import { approveDevice } from '../../dev/browser.ts';
import { MemoryInformer } from '../../lib/kube/informer.ts';
import { fakeObjectWriter } from '../../test-support/fake-object-writer.ts';
import { bindingName, newKeyBindings, type BindingSecret, type KeyBindings } from './bindings.ts';
import { RENEWAL_MAX_MS } from './renewal.ts';
import { utcMinute, type SshSettings } from './sign-in.ts';
import { opensshOptions, runOpenSSH, type OpenSSHResult } from '../../dev/openssh.ts';
import { eventually } from '../../dev/eventually.ts';
import { newInProcessDoor, type InProcessDoor } from './in-process.ts';
import { parseTrustedCAKeys } from '../../lib/ssh/keys.ts';
import { addressKey, newSshServer, type SshServer, type SshServerOptions } from './server.ts';
import { closingBytes } from '../proxy/session-close.ts';
import { SHUTDOWN_MESSAGE } from '../drain.ts';

let dir: string;
let door: InProcessDoor;
let server: SshServer;
let port: number;
/** The pipeline's halves of the door's connections, and how many have closed. */
const inside = { opened: 0, closed: 0 };

/** ssh as alice with `key` (default: the one certified). */
const ssh = (args: string[], input = '', key = 'user'): Promise<OpenSSHResult> =>
  runOpenSSH(
    'ssh',
    [...opensshOptions(join(dir, key)), '-p', String(port), '-l', 'alice', '127.0.0.1', ...args],
    input,
  );

/** Answers the door's exec upgrades: runs the command here, with the v5 channel protocol's framing. */
function serveExecs(): void {
  const wss = new WebSocketServer({ noServer: true, handleProtocols: (p) => [...p][0] ?? false });
  door.serve(
    (_req, res) => void res.writeHead(404).end(),
    (req, socket, head) => {
      inside.opened++;
      socket.once('close', () => inside.closed++);
      // A reach connection (-L) is refused as a cluster's RBAC refuses it.
      if (req.headers.upgrade === 'tcp') return void socket.end(FORBIDDEN_REACH);
      wss.handleUpgrade(req, socket, head, (ws) => {
        const argv = new URL(req.url ?? '/', 'http://x').searchParams.getAll('command');
        // A draining replica's proxy closing the exec: its last bytes, written on the connection as the proxy writes
        // them (concierge/proxy/session-close.ts).
        if (argv[0] === 'drained-here')
          return void socket.end(closingBytes('websocket', ws.protocol, SHUTDOWN_MESSAGE));
        const child = spawn(argv[0]!, argv.slice(1));
        let failed = false;
        // A program that is not there: the kubelet's Status, as containerd and runc word it.
        child.on('error', () => {
          failed = true;
          const status = {
            status: 'Failure',
            code: 500,
            reason: 'InternalError',
            message: noProgram(argv[0]!),
          };
          ws.send(Buffer.concat([Buffer.of(3), Buffer.from(JSON.stringify(status))]), () => ws.close());
        });
        child.stdout.on('data', (c: Buffer) => ws.send(Buffer.concat([Buffer.of(1), c])));
        child.stderr.on('data', (c: Buffer) => ws.send(Buffer.concat([Buffer.of(2), c])));
        child.stdin.on('error', () => {});
        ws.on('message', (data: Buffer) => {
          if (data[0] === 0) child.stdin.write(data.subarray(1));
          else if (data[0] === 255 && data[1] === 0) child.stdin.end();
        });
        ws.on('close', () => child.kill('SIGKILL'));
        child.once('close', (code) => {
          if (failed) return;
          const status =
            code === 0
              ? { status: 'Success' }
              : {
                  status: 'Failure',
                  reason: 'NonZeroExitCode',
                  details: { causes: [{ reason: 'ExitCode', message: String(code) }] },
                };
          ws.send(Buffer.concat([Buffer.of(3), Buffer.from(JSON.stringify(status))]), () => ws.close());
        });
      });
    },
  );
}

/** What the API server answers a reach upgrade its RBAC refuses. */
const FORBIDDEN_MESSAGE =
  'services "db" is forbidden: User "alice" cannot create resource "services/proxy" in API group "" in the namespace "demo"';
const FORBIDDEN_REACH = (() => {
  const body = JSON.stringify({ kind: 'Status', status: 'Failure', message: FORBIDDEN_MESSAGE, code: 403 });
  return `HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`;
})();

/** The message of the Status a kubelet sends when the program to exec is not in the image (containerd, runc). */
export const noProgram = (program: string): string =>
  'Internal error occurred: Internal error occurred: error executing command in container: failed to exec in ' +
  'container: failed to start exec "0123abcd": OCI runtime exec failed: exec failed: unable to start container ' +
  `process: exec: "${program}": executable file not found in $PATH: unknown`;

/** A door with the test CA trusted; `over` changes its settings, limits, clock, bindings or authenticators. */
function startServer(
  over: {
    limits?: SshServerOptions['limits'];
    settings?: Partial<SshSettings>;
    clock?: SshServerOptions['clock'];
    bindings?: KeyBindings;
    cache?: SshServerOptions['cache'];
  } = {},
): SshServer {
  return newSshServer({
    hostKeys: [readFileSync(join(dir, 'host'), 'utf8')],
    settings: () => ({
      hubName: 'hub',
      certificateAuthorities: parseTrustedCAKeys([readFileSync(join(dir, 'ca.pub'), 'utf8')]).keys,
      groupsExtension: 'groups@sealion.dev',
      ...over.settings,
    }),
    door,
    cache: over.cache ?? { providerOf: () => undefined, authenticateWith: () => never(), holds: () => false },
    bindings: over.bindings ?? noBindings(),
    groupSuffix: 'sealion.dev',
    clusterNames: () => [],
    log: silentLogger(),
    ...(over.limits ? { limits: over.limits } : {}),
    ...(over.clock ? { clock: over.clock } : {}),
  });
}

/** Bindings that hold nothing: what a test's own stand-in does not define. */
const noBindings = (): KeyBindings => ({
  find: () => undefined,
  bind: () => Promise.resolve(new Date(0)),
  renew: () => Promise.resolve(),
  end: () => Promise.resolve(),
  sweep: () => Promise.resolve(0),
});

const never = (): never => {
  throw new Error('not asked in this test');
};

/** A door of its own on a free port, closed after the test. */
async function withServer(
  over: Parameters<typeof startServer>[0],
  test: (at: number) => Promise<void>,
): Promise<void> {
  const own = startServer(over);
  const at = await own.listen(0, '127.0.0.1');
  try {
    await test(at);
  } finally {
    await own.close();
  }
}

/** A TCP connection that says nothing, from `from` (a loopback address); `closed` settles when the door ends it. */
function idle(at: number, from = '127.0.0.1'): Promise<{ socket: Socket; closed: Promise<void> }> {
  return new Promise((done, fail) => {
    const socket = connect({ port: at, host: '127.0.0.1', localAddress: from }, () =>
      done({ socket, closed: new Promise((c) => socket.once('close', () => c())) }),
    );
    socket.once('error', fail);
    socket.resume();
  });
}

/**
 * Whether `socket` is still open after the door had a moment to act on what came before: a check that something did
 * not happen, which a slow machine can only make pass wrongly, never fail wrongly.
 */
async function stillOpen(socket: Socket): Promise<boolean> {
  await new Promise((r) => setImmediate(r));
  await new Promise((r) => setTimeout(r, 50));
  return !socket.destroyed && !socket.readableEnded;
}

/** ssh to the door at `at` with the certified key, from `from`: a command through the door, or why not. */
const sshAt = (
  at: number,
  args: string[] = ['hub/demo/web', '--', 'echo', 'in'],
  key = 'user',
  from?: string,
) =>
  runOpenSSH('ssh', [
    ...opensshOptions(join(dir, key)),
    ...(from ? ['-b', from] : []),
    '-p',
    String(at),
    '-l',
    'alice',
    '127.0.0.1',
    ...args,
  ]);

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-ssh-server-'));
  for (const name of ['host', 'ca', 'user', 'stranger'])
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, name)]);
  execFileSync('ssh-keygen', [
    '-q',
    '-s',
    join(dir, 'ca'),
    '-I',
    'alice',
    '-n',
    'alice',
    '-V',
    '+1h',
    join(dir, 'user.pub'),
  ]);
  door = newInProcessDoor();
  serveExecs();
  server = startServer();
  port = await server.listen(0, '127.0.0.1');
});

afterAll(async () => {
  await server.close();
  door.close();
  rmSync(dir, { recursive: true, force: true });
});

describe('commands', () => {
  it('passes stdin to its end, stdout and stderr apart, and the exit status', async () => {
    const r = await ssh(['hub/demo/web', '--', 'sh', '-c', "'cat; echo err >&2; exit 5'"], 'piped');
    expect(r).toMatchObject({ code: 5, stdout: 'piped', stderr: 'err\n' });
  });

  it('ends a command a draining replica closes with its message on stderr, once, and a failed exit status', async () => {
    const r = await ssh(['hub/demo/web', '--', 'drained-here']);
    expect(r).toEqual({ code: 1, stdout: '', stderr: `${SHUTDOWN_MESSAGE}\r\n` });
  });

  it('ends the exec, and its pipeline request, when the client goes away mid-command', async () => {
    const before = { ...inside };
    const child = spawn('ssh', [
      ...opensshOptions(join(dir, 'user')),
      '-p',
      String(port),
      '-l',
      'alice',
      '127.0.0.1',
      'hub/demo/web',
      '--',
      'sleep',
      '60',
    ]);
    // The exec reached the pipeline (and is running there) before the client goes.
    await eventually(() => expect(inside.opened).toBe(before.opened + 1), 20_000, 20);
    child.kill('SIGKILL');
    await eventually(() => expect(inside.closed).toBe(before.closed + 1), 20_000, 20);
  });
});

describe('what the door says when something is refused', () => {
  it('says in one line that the program is not in the image, with the status a shell gives (127)', async () => {
    const r = await ssh(['hub/demo/web', '--', 'no-such-program-here', '-x']);
    expect(r).toEqual({
      code: 127,
      stdout: '',
      stderr: 'sealion: no-such-program-here: no such program in hub/demo/web\r\n',
    });
  });

  it('answers shell syntax with a hint that works as typed, and no usage block', async () => {
    // As a person types ssh <host> hub/demo/web -- 'ls | wc -l': their shell takes the quotes off.
    const r = await ssh(['hub/demo/web', '--', 'ls | wc -l']);
    expect(r).toMatchObject({
      code: 2,
      stderr:
        'sealion: "|" needs a shell, and none runs here; ask the container\'s, quoting the command once more for ' +
        `ssh: ssh <host> hub/demo/web -- "sh -c 'ls | wc -l'"\r\n`,
    });
    // The hint, as typed (its words after the host): the shell runs the pipe.
    const hinted = await ssh(['hub/demo/web', '--', "sh -c 'echo a b | wc -w'"]);
    expect(hinted).toMatchObject({ code: 0, stdout: expect.stringMatching(/^\s*2\n$/) });
  });

  it("gives a refused forward's reason in the channel-open failure (RFC 4254), as OpenSSH prints it", async () => {
    // OpenSSH prints the failure at its default log level.
    const forward = (to: string) =>
      runOpenSSH('ssh', [
        ...opensshOptions(join(dir, 'user'), { quiet: false }),
        '-p',
        String(port),
        '-l',
        'alice',
        '-W',
        to,
        '127.0.0.1',
      ]);
    const r = await forward('hub/demo/svc/db:5432');
    expect(r.code).toBe(255);
    expect(r.stderr).toContain(`open failed: administratively prohibited: ${FORBIDDEN_MESSAGE}`);
    const malformed = await forward('hub/demo/deploy/db:5432');
    expect(malformed.stderr).toContain(
      'open failed: connect failed: "hub/demo/deploy/db" is not <cluster>/<namespace>/svc/<name> or <cluster>/<namespace>/pod/<name>',
    );
  });
});

describe('sftp', () => {
  it('puts and gets a file through exec, byte for byte', async () => {
    const data = randomBytes(300_000);
    writeFileSync(join(dir, 'up'), data);
    const remote = `/hub/demo/web/app${dir}`;
    writeFileSync(
      join(dir, 'batch'),
      `put ${join(dir, 'up')} ${remote}/put\nget ${remote}/put ${join(dir, 'down')}\n`,
    );
    const r = await runOpenSSH('sftp', [
      ...opensshOptions(join(dir, 'user')),
      '-P',
      String(port),
      '-b',
      join(dir, 'batch'),
      'alice@127.0.0.1',
    ]);
    expect(r).toMatchObject({ code: 0, stderr: '' });
    expect(readFileSync(join(dir, 'put')).equals(data)).toBe(true);
    expect(readFileSync(join(dir, 'down')).equals(data)).toBe(true);
  });
});

describe('what a stranger may hold', () => {
  it('drops a connection that has not finished its key exchange at the handshake deadline, by the injected clock', async () => {
    const clock = fakeClock();
    clock.advance(Date.now());
    await withServer({ clock, limits: { handshakeMs: 10_000 } }, async (at) => {
      const silent = await idle(at);
      clock.advance(9_999);
      expect(await stillOpen(silent.socket)).toBe(true);
      clock.advance(1);
      await silent.closed;
    });
  });

  it('gives the oldest idle connection of an address up for a newcomer, so idle connections lock nobody out', async () => {
    await withServer({ limits: { unauthenticatedPerAddress: 3 } }, async (at) => {
      const idlers = [await idle(at), await idle(at), await idle(at)];
      // The address's bound is reached: a real client still signs in, and the oldest idler made room.
      const r = await sshAt(at);
      expect(r).toMatchObject({ code: 0, stdout: 'in\n' });
      await idlers[0]!.closed;
      expect(await stillOpen(idlers[2]!.socket)).toBe(true);
      for (const i of idlers) i.socket.destroy();
    });
  });

  it('takes a place back from the address with the most when all are taken, never from one with fewer', async () => {
    await withServer({ limits: { unauthenticated: 4, unauthenticatedPerAddress: 4 } }, async (at) => {
      const flood = [];
      for (let i = 0; i < 4; i++) flood.push(await idle(at, '127.0.0.2'));
      const other = await idle(at, '127.0.0.3');
      // 127.0.0.2 held every place: its oldest made room.
      await flood[0]!.closed;
      // Parity (3 and 1 now, then 2 and 2): the newcomer from 127.0.0.3 comes at the expense of 127.0.0.2 again.
      const second = await idle(at, '127.0.0.3');
      await flood[1]!.closed;
      // Now 127.0.0.3 holds as many as 127.0.0.2: its own oldest makes room for its next.
      const third = await idle(at, '127.0.0.3');
      await other.closed;
      expect(await stillOpen(flood[2]!.socket)).toBe(true);
      expect(await stillOpen(second.socket)).toBe(true);
      for (const c of [...flood, other, second, third]) c.socket.destroy();
    });
  });

  it('counts IPv6 addresses by their /64', () => {
    expect(addressKey('2001:db8:1:2:aaaa::1')).toBe(addressKey('2001:db8:1:2:bbbb::2'));
    expect(addressKey('2001:db8:1:3::1')).not.toBe(addressKey('2001:db8:1:2::1'));
    expect(addressKey('::ffff:10.1.2.3')).toBe('10.1.2.3');
  });
});

describe('the transport', () => {
  it("offers OpenSSH no chacha20-poly1305 (ssh2's WebAssembly MAC fails for good after one large packet), and its default takes AES", async () => {
    /** `ssh` with its diagnostics on, and `options` before the destination. */
    const sshTelling = (options: string[]) =>
      runOpenSSH('ssh', [
        ...opensshOptions(join(dir, 'user'), { quiet: false }),
        ...options,
        '-p',
        String(port),
        '-l',
        'alice',
        '127.0.0.1',
        'hub/demo/web',
        '--',
        'echo',
        'in',
      ]);
    const chacha = await sshTelling(['-c', 'chacha20-poly1305@openssh.com']);
    expect({ code: chacha.code, stderr: chacha.stderr }).toEqual({
      code: 255,
      stderr: expect.stringMatching(/no matching cipher found/),
    });
    const plain = await sshTelling(['-v']);
    expect(plain.stdout).toBe('in\n');
    expect(plain.stderr).toMatch(/kex: server->client cipher: aes/);
  });
});

describe('signing in', () => {
  it('refuses a key no certificate or binding vouches for, as SSH refuses any', async () => {
    const r = await ssh(['true'], '', 'stranger');
    expect(r.code).toBe(255);
  });

  it('tells a client in BatchMode at once why its key is refused and how to have it bound', async () => {
    const settings = { login: { authenticator: 'my-oidc', clientId: '', scopes: ['openid'] } };
    const print = execFileSync('ssh-keygen', ['-l', '-f', join(dir, 'stranger.pub')], {
      encoding: 'utf8',
    }).split(' ')[1]!;
    await withServer({ settings }, async (at) => {
      const r = await runOpenSSH('ssh', [
        ...opensshOptions(join(dir, 'stranger'), { quiet: false }),
        '-p',
        String(at),
        '-l',
        'alice',
        '127.0.0.1',
        'true',
      ]);
      expect(r.code).toBe(255);
      expect(r.stderr).toContain(
        `Sealion: the key ${print} is not bound to a login yet; a device login binds it, which needs ssh without BatchMode (once: ssh -t <host>).`,
      );
      expect(r.stderr).toContain('Permission denied (publickey,keyboard-interactive)');
    });
  });

  it('disconnects a client after six refusals, as sshd does, and checks no signature of a key nobody bound', async () => {
    const keys = Array.from({ length: 8 }, (_, i) => `many-${i}`);
    for (const key of keys)
      execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, key)]);
    const asked: string[] = [];
    const bindings: KeyBindings = { ...noBindings(), find: (_blob, print) => void asked.push(print) };
    await withServer({ bindings }, async (at) => {
      const r = await runOpenSSH('ssh', [
        ...opensshOptions(join(dir, keys[0]!), { quiet: false }),
        ...keys.slice(1).flatMap((k) => ['-i', join(dir, k)]),
        '-p',
        String(at),
        '-l',
        'alice',
        '127.0.0.1',
        'true',
      ]);
      expect(r.code).toBe(255);
      // Six keys asked about, each refused at the question; the seventh never.
      expect(asked).toHaveLength(6);
      expect(r.stderr).toMatch(/disconnect|closed/i);
    });
  });

  it('refuses certificates that name system: users or groups, unless the config allows them', async () => {
    const certify = (key: string, principal: string, groups?: string): void => {
      execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, key)]);
      execFileSync('ssh-keygen', [
        '-q',
        '-s',
        join(dir, 'ca'),
        '-I',
        key,
        '-n',
        principal,
        '-V',
        '+1h',
        ...(groups ? ['-O', `extension:groups@sealion.dev=${groups}`] : []),
        join(dir, `${key}.pub`),
      ]);
    };
    certify('sys-user', 'alice,system:kube-controller-manager');
    certify('sys-group', 'alice', 'dev,system:masters');
    certify('authenticated', 'alice', 'dev,system:authenticated');
    const as = (at: number, key: string, user: string) =>
      runOpenSSH('ssh', [
        ...opensshOptions(join(dir, key)),
        '-p',
        String(at),
        '-l',
        user,
        '127.0.0.1',
        'hub/demo/web',
        '--',
        'echo',
        'in',
      ]);
    await withServer({}, async (at) => {
      expect((await as(at, 'sys-user', 'system:kube-controller-manager')).code).toBe(255);
      expect((await as(at, 'sys-group', 'alice')).code).toBe(255);
      // The one system group every authenticated user is in anyway.
      expect(await as(at, 'authenticated', 'alice')).toMatchObject({ code: 0, stdout: 'in\n' });
      // The principal alice of the same certificate is not a system name.
      expect(await as(at, 'sys-user', 'alice')).toMatchObject({ code: 0, stdout: 'in\n' });
    });
    await withServer({ settings: { allowSystemNames: true } }, async (at) => {
      expect(await as(at, 'sys-group', 'alice')).toMatchObject({ code: 0, stdout: 'in\n' });
    });
  });

  it('honours a bound key only while the authenticator that bound it is loaded as it was then', async () => {
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'bound')]);
    const authenticator: AuthenticatorBinding = { uid: 'uid-1', trust: 'a'.repeat(43) };
    let loaded = true;
    const bindings: KeyBindings = {
      ...noBindings(),
      find: () => ({
        identity: {
          kind: 'user',
          user: { username: 'alice', groups: [], extra: {} },
          via: 'ssh/JWTAuthenticator/my-oidc',
        },
        authenticator,
        expires: Date.now() + 3600_000,
      }),
    };
    const cache = {
      providerOf: () => undefined,
      authenticateWith: never,
      holds: (b: AuthenticatorBinding) =>
        loaded && b.uid === authenticator.uid && b.trust === authenticator.trust,
    };
    const settings = { login: { authenticator: 'my-oidc', clientId: '', scopes: ['openid'] } };
    await withServer({ bindings, cache, settings }, async (at) => {
      expect(await sshAt(at, undefined, 'bound')).toMatchObject({ code: 0, stdout: 'in\n' });
      // Deleted, re-created under its name (another uid) or trusting something else: holds no longer.
      loaded = false;
      expect((await sshAt(at, undefined, 'bound')).code).toBe(255);
    });
  });
});

describe('the device login', () => {
  let issuer: TestIssuer;
  beforeAll(async () => {
    issuer = await startOIDCIssuer();
  });
  afterAll(() => issuer.stop());

  /** OpenSSH as a stranger at the device login; resolves with what it showed once the instructions came, then leaves. */
  const walkAway = (at: number): Promise<string> =>
    new Promise((done, fail) => {
      const child = spawn('ssh', [
        ...opensshOptions(join(dir, 'stranger'), { batch: false, quiet: false }),
        '-o',
        'PreferredAuthentications=keyboard-interactive',
        '-p',
        String(at),
        '-l',
        'anyone',
        '127.0.0.1',
        'true',
      ]);
      let shown = '';
      child.stderr.on('data', (c: Buffer) => {
        shown += String(c);
        // Gone at the prompt, without a word.
        if (shown.includes('To sign in')) child.kill('SIGKILL');
      });
      child.once('error', fail);
      child.once('close', () => done(shown));
    });

  it('survives clients that walk away at the prompt, and gives their places back every time', async () => {
    const rejections: unknown[] = [];
    const record = (reason: unknown): void => void rejections.push(reason);
    process.on('unhandledRejection', record);
    const cache = {
      providerOf: () => ({ issuer: issuer.url, audience: issuer.clientId, caBundlePem: issuer.caPem }),
      authenticateWith: never,
      holds: () => false,
    };
    const settings = { login: { authenticator: 'my-oidc', clientId: '', scopes: ['openid'] } };
    try {
      await withServer(
        { cache, settings, limits: { deviceLogins: 8, deviceLoginsPerAddress: 2 } },
        async (at) => {
          // More walk-aways than there are places for device logins, from one address, one after another.
          for (let i = 0; i < 12; i++) expect(await walkAway(at)).toMatch(/To sign in, open https:/);
        },
      );
      expect(rejections).toEqual([]);
    } finally {
      process.off('unhandledRejection', record);
    }
  }, 60_000);
});

describe('a bound key past its ID token', () => {
  const NS = 'sealion';
  const authenticator: AuthenticatorBinding = { uid: 'uid-1', trust: 'a'.repeat(43) };
  const settings = { login: { authenticator: 'my-oidc', clientId: '', scopes: ['openid'] } };
  let issuer: TestIssuer;
  /** Whom the authenticator says a token names: the token's own `username`, unless a test renames it. */
  let rename: string | undefined;
  beforeAll(async () => {
    issuer = await startOIDCIssuer({ login: { username: 'alice@example.com', groups: ['dev'] } });
  });
  afterAll(() => issuer.stop());

  /** The issuer's tokens, taken as a JWTAuthenticator would take them (its claims, its binding). */
  const cache = {
    providerOf: () => ({ issuer: issuer.url, audience: issuer.clientId, caBundlePem: issuer.caPem }),
    authenticateWith: (_kind: string, _name: string, token: string) => {
      const claims = decodeJwt(token);
      return Promise.resolve({
        ok: true as const,
        user: { username: rename ?? String(claims.username), groups: ['dev'], extra: {} },
        authenticator: 'JWTAuthenticator/my-oidc',
        binding: authenticator,
      });
    },
    holds: (b: AuthenticatorBinding) => b.uid === authenticator.uid,
  };

  /** The door with real bindings (in memory) and a clock of the test's, starting now. */
  function setup() {
    const secrets = new MemoryInformer<BindingSecret>();
    const clock = fakeClock();
    clock.advance(Date.now());
    const bindings = newKeyBindings({
      namespace: NS,
      secrets,
      writes: fakeObjectWriter(secrets),
      now: () => clock.now(),
    });
    return { secrets, clock, bindings };
  }

  /** A device login with `key` through OpenSSH, the code approved by the scripted browser. */
  async function deviceLogin(at: number, key: string): Promise<OpenSSHResult> {
    let approving: Promise<void> | undefined;
    const r = await runOpenSSH(
      'ssh',
      [
        ...opensshOptions(join(dir, key), { batch: false, quiet: false }),
        '-o',
        'PreferredAuthentications=publickey,keyboard-interactive',
        '-p',
        String(at),
        '-l',
        'anyone',
        '127.0.0.1',
        'hub/demo/web',
        '--',
        'echo',
        'in',
      ],
      '',
      {
        onStderr: (stderr) => {
          const url = /or open (https:\/\/\S+)/.exec(stderr)?.[1];
          if (url && !approving) approving = approveDevice(url, { caPem: issuer.caPem });
        },
      },
    );
    await approving;
    return r;
  }

  const printOf = (key: string): string =>
    execFileSync('ssh-keygen', ['-l', '-f', join(dir, `${key}.pub`)], { encoding: 'utf8' }).split(' ')[1]!;
  const batch = (at: number, key: string) =>
    runOpenSSH('ssh', [
      ...opensshOptions(join(dir, key), { quiet: false }),
      '-p',
      String(at),
      '-l',
      'anyone',
      '127.0.0.1',
      'hub/demo/web',
      '--',
      'echo',
      'in',
    ]);
  const refreshTokenOf = (secrets: MemoryInformer<BindingSecret>, key: string): string => {
    const blob = Buffer.from(readFileSync(join(dir, `${key}.pub`), 'utf8').split(' ')[1]!, 'base64');
    const data = secrets.get(bindingName(blob), NS)?.data?.['binding.json'];
    return (JSON.parse(Buffer.from(data!, 'base64').toString('utf8')) as { refreshToken: string })
      .refreshToken;
  };

  it('renews the login with the refresh token until the session ends, waits out an issuer that does not answer', async () => {
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'renewed')]);
    const print = printOf('renewed');
    const { clock, bindings } = setup();
    const since = clock.now();
    const own: Partial<SshSettings> = { ...settings };
    await withServer({ cache, settings: own, bindings, clock }, async (at) => {
      const login = await deviceLogin(at, 'renewed');
      expect(login).toMatchObject({ code: 0, stdout: 'in\n' });
      // The session's hard end (12h, the default cap), and what may end it sooner.
      expect(login.stderr).toContain(
        `Sealion: the key ${print} is bound to alice@example.com until ${utcMinute(new Date(since + 12 * 3600_000))}. ` +
          'It stays bound while the issuer renews the login; signing out there ends it sooner.',
      );
      const grants = issuer.grants().refresh_token;
      // Past the ID token's 5 minutes: BatchMode signs in, the login renewed at the issuer.
      clock.advance(10 * 60_000);
      expect(await batch(at, 'renewed')).toMatchObject({ code: 0, stdout: 'in\n' });
      expect(issuer.grants().refresh_token).toBe(grants + 1);
      // A stranger's key costs the issuer nothing.
      expect((await batch(at, 'stranger')).code).toBe(255);
      expect(issuer.grants().refresh_token).toBe(grants + 1);
      // Several at once with the key: the issuer rotates refresh tokens, so two renewals with one token would end
      // the session; one at a time, every connection signs in.
      clock.advance(10 * 60_000);
      const together = await Promise.all([1, 2, 3, 4].map(() => batch(at, 'renewed')));
      expect(together.map((r) => r.code)).toEqual([0, 0, 0, 0]);
      // An issuer that does not answer: this sign-in is refused, the binding stays.
      clock.advance(10 * 60_000);
      issuer.setMode('discovery', 'down');
      try {
        const down = await batch(at, 'renewed');
        expect(down.code).toBe(255);
        expect(down.stderr).toContain(
          `Sealion: the login that bound the key ${print} could not be renewed: the issuer did not answer; try again later.`,
        );
      } finally {
        issuer.setMode('discovery', 'ok');
      }
      expect(await batch(at, 'renewed')).toMatchObject({ code: 0, stdout: 'in\n' });
      // An admin who lowers ssh.maxBindingLifetime shortens the sessions under way.
      own.maxBindingMs = 20 * 60_000;
      expect((await batch(at, 'renewed')).code).toBe(255);
      delete own.maxBindingMs;
      expect(await batch(at, 'renewed')).toMatchObject({ code: 0, stdout: 'in\n' });
      // The session's hard end: the key is unbound, whatever the issuer would say.
      clock.advance(12 * 3600_000);
      const grantsThen = issuer.grants().refresh_token;
      const late = await batch(at, 'renewed');
      expect(late.code).toBe(255);
      expect(late.stderr).toContain(`Sealion: the key ${print} is not bound to a login yet;`);
      expect(issuer.grants().refresh_token).toBe(grantsThen);
    });
  }, 120_000);

  it('refuses a sign-in whose renewal outlasts its deadline by the clock, and lets the renewal finish for the next', async () => {
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'slow')]);
    const print = printOf('slow');
    const { clock, bindings } = setup();
    await withServer({ cache, settings, bindings, clock }, async (at) => {
      expect(await deviceLogin(at, 'slow')).toMatchObject({ code: 0, stdout: 'in\n' });
      clock.advance(10 * 60_000);
      issuer.setMode('discovery', 'hang');
      let slow: Promise<OpenSSHResult>;
      try {
        slow = batch(at, 'slow');
        // The renewal under way: its deadline and the sign-in's are armed on the door's clock.
        await eventually(() => expect(clock.pending()).toContain(RENEWAL_MAX_MS), 20_000);
        clock.advance(RENEWAL_MAX_MS);
        const refused = await slow;
        expect(refused.code).toBe(255);
        expect(refused.stderr).toContain(
          `Sealion: the login that bound the key ${print} could not be renewed: the issuer did not answer; try again later.`,
        );
      } finally {
        issuer.setMode('discovery', 'ok');
      }
      // The hung request ends at the issuer client's own timeout; the binding stayed, and renews.
      await eventually(
        async () => expect(await batch(at, 'slow')).toMatchObject({ code: 0, stdout: 'in\n' }),
        40_000,
        1000,
      );
    });
  }, 120_000);

  it('ends the binding when the issuer refuses the refresh token, or names someone else, and says so', async () => {
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'revoked')]);
    const print = printOf('revoked');
    const { clock, bindings, secrets } = setup();
    const ended = `Sealion: the login that bound the key ${print} has ended at its issuer (signed out, disabled or expired).`;
    await withServer({ cache, settings, bindings, clock }, async (at) => {
      expect(await deviceLogin(at, 'revoked')).toMatchObject({ code: 0, stdout: 'in\n' });
      // Signed out at the issuer (the CLI's logout revokes so).
      await issuer.revoke(refreshTokenOf(secrets, 'revoked'));
      clock.advance(10 * 60_000);
      const refused = await batch(at, 'revoked');
      expect(refused.code).toBe(255);
      expect(refused.stderr).toContain(ended);
      expect(refused.stderr).toContain(`Sealion: the key ${print} is not bound to a login yet;`);
      expect(secrets.list()).toEqual([]);

      // Bound again; then the issuer's answer names another user.
      expect(await deviceLogin(at, 'revoked')).toMatchObject({ code: 0, stdout: 'in\n' });
      rename = 'mallory@example.com';
      clock.advance(10 * 60_000);
      const renamed = await batch(at, 'revoked');
      expect(renamed.code).toBe(255);
      expect(renamed.stderr).toContain(ended);
      expect(secrets.list()).toEqual([]);
    });
  }, 120_000);
});
