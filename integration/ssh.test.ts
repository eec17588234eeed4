// The SSH door with the real OpenSSH client against Sealion installed on real nodes (a hub and an edge reached through
// its agent's tunnel): turned on by the ConfigMap, its host key pinned from the CredentialIssuer's status; sign-in by
// an SSH certificate and by the device login at the development OpenID Provider (the scripted browser approves the
// code), after which the key needs no login until its binding expires; shells through a PTY, commands and their exit
// statuses, the menu, sftp and scp with checksums, `-L` to a Service, and what the clusters refuse.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import ssh2 from 'ssh2';
import type { AuditEvent } from '../concierge/audit/types.ts';
import { DEFAULT_INSTALL } from '../manifests/install.ts';
import { approveDevice } from '../dev/browser.ts';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_POD,
  DEMO_USER,
  EDGE,
  enableSsh,
  startInstalledSealion,
  stopInstalled,
  type InstalledSealion,
  type Running,
} from '../dev/installed.ts';
import { eventually } from '../dev/eventually.ts';
import { deployReachWorkload, ECHO_PORT, REACH_WORKLOAD } from '../dev/reach-workload.ts';
import { dieWithParent, stopChild } from '../dev/processes.ts';
import { opensshOptions, runOpenSSH, typing, type Conversation } from '../dev/openssh.ts';

const running: Running = {};
let dir: string;
let installed: InstalledSealion;
let host: string;
let port: number;
const children: ChildProcess[] = [];
const VIEWER = 'viewer@sealion.dev';
/** Each ssh run is ended after this: a red test must not hang. */
const SSH_TIMEOUT_MS = 90_000;

/** The options every run shares: the pinned host key, the key given, all of ssh's own messages. */
const options = (key: string, batch = true): string[] => [
  ...opensshOptions(join(dir, key), { knownHosts: join(dir, 'known_hosts'), batch, quiet: false }),
  '-o',
  'ConnectTimeout=20',
];

/** Runs an OpenSSH program, bounded by SSH_TIMEOUT_MS. */
const run = (
  program: Parameters<typeof runOpenSSH>[0],
  args: string[],
  input?: string | Conversation,
  onStderr?: (stderr: string) => void,
) => runOpenSSH(program, args, input, { timeoutMs: SSH_TIMEOUT_MS, ...(onStderr ? { onStderr } : {}) });

/** `ssh` as `user` with the key `key` (and its certificate, if made), batch mode unless told otherwise. */
function ssh(
  key: string,
  user: string,
  args: string[],
  opts: { input?: string | Conversation; batch?: boolean } = {},
) {
  return run(
    'ssh',
    [...options(key, opts.batch !== false), '-p', String(port), '-l', user, host, ...args],
    opts.input,
  );
}

/** What a key binding's Secret holds, as far as these tests read it. */
interface StoredBinding {
  user: { username: string };
  expires: number;
  refreshToken?: string;
}

/** A new ed25519 key in the test's directory. */
async function keygen(name: string): Promise<void> {
  const made = await run('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', name, '-f', join(dir, name)]);
  if (made.code !== 0) throw new Error(`ssh-keygen: ${made.stderr}`);
}

/** Signs `key`'s public key with the test CA: `principal`, the groups extension, valid for `validity`. */
async function certify(key: string, principal: string, groups: string, validity = '+1h'): Promise<void> {
  const signed = await run('ssh-keygen', [
    '-q',
    '-s',
    join(dir, 'ca'),
    '-I',
    `${key}-id`,
    '-n',
    principal,
    '-V',
    validity,
    '-O',
    `extension:groups@sealion.dev=${groups}`,
    join(dir, `${key}.pub`),
  ]);
  if (signed.code !== 0) throw new Error(`ssh-keygen -s: ${signed.stderr}`);
}

/** The SHA256 fingerprint of a key in the test's directory, as ssh-keygen -l prints it. */
async function fingerprintOf(key: string): Promise<string> {
  const listed = await run('ssh-keygen', ['-l', '-f', join(dir, `${key}.pub`)]);
  return listed.stdout.split(' ')[1]!;
}

const sha256 = (data: Buffer): string => createHash('sha256').update(data).digest('hex');

/**
 * Opens a shell with a 24x80 terminal as the holder of `key`, asks its size, changes it to 33x99 and asks again until
 * the answer changes (the new size reaches the container's terminal through the door, the API server and the kubelet
 * after the request that carries it); resolves with the first answer and the first that differs.
 */
function resized(target: string, key: string): Promise<string[]> {
  const client = new ssh2.Client();
  const timers: NodeJS.Timeout[] = [];
  return new Promise<string[]>((done, fail) => {
    let out = '';
    const sizes = (): string[] => [...out.matchAll(/^SIZE ([0-9]+ [0-9]+)\r?$/gm)].map((m) => m[1]!);
    timers.push(
      setTimeout(
        () => fail(new Error(`the size never changed; the shell answered ${JSON.stringify(sizes())}`)),
        SSH_TIMEOUT_MS,
      ),
    );
    client.once('error', fail);
    client.once('ready', () => {
      client.exec(target, { pty: { rows: 24, cols: 80, term: 'xterm' } }, (err, stream) => {
        if (err) return fail(err);
        let asked = 0;
        let answered = 0;
        let scheduled = false;
        let finished = false;
        const ask = (): void => {
          scheduled = false;
          asked++;
          stream.write('echo SIZE $(stty size)\n');
        };
        stream.on('data', (c: Buffer) => {
          out += c.toString('utf8');
          // busybox's shell asks where the cursor is at each prompt: answered as a terminal does.
          for (const queries = out.split('\x1b[6n').length - 1; answered < queries; answered++)
            stream.write('\x1b[1;1R');
          const seen = sizes();
          if (finished) return;
          if (seen.length > 1 && seen.at(-1) !== seen[0]) {
            finished = true;
            stream.end('exit\n');
            return done([seen[0]!, seen.at(-1)!]);
          }
          // One question at a time, each once the shell has answered the last and shows its prompt again.
          const prompts = out.split(/\$ /).length - 1;
          if (scheduled || prompts <= asked || seen.length < asked) return;
          if (asked === 0) return ask();
          if (asked === 1) stream.setWindow(33, 99, 0, 0);
          // Asked at once after the change, then every 200 ms while the answer is still the old size.
          scheduled = true;
          timers.push(setTimeout(ask, asked === 1 ? 0 : 200));
        });
      });
    });
    client.connect({
      host,
      port,
      username: 'anyone',
      privateKey: readFileSync(join(dir, key), 'utf8'),
      hostVerifier: (key: Buffer) =>
        readFileSync(join(dir, 'known_hosts'), 'utf8').includes(key.toString('base64')),
      readyTimeout: 20_000,
    });
  }).finally(() => {
    timers.forEach(clearTimeout);
    client.end();
  });
}

/** Everything the hub's concierge replicas logged: their log lines and audit events. */
async function conciergeLogs(): Promise<string> {
  const logs = await installed.hub.kubectl([
    'logs',
    '-n',
    DEFAULT_INSTALL.namespace,
    '-l',
    'app=sealion-concierge',
    '--tail=-1',
    '--max-log-requests=10',
  ]);
  return logs.stdout;
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-ssh-'));
  installed = await startInstalledSealion(running, () => {});
  await deployReachWorkload(installed.edge, installed.image.name, EDGE);
  await run('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'test-ca', '-f', join(dir, 'ca')]);
  await Promise.all(['demo', 'viewer', 'device', 'stranger', 'late', 'rebound'].map(keygen));
  await certify('demo', DEMO_USER, DEMO_GROUP);
  await certify('viewer', VIEWER, 'demo-viewers');
  await certify('late', DEMO_USER, DEMO_GROUP, '20200101:20200102');
  await keygen('controller');
  await certify('controller', 'system:kube-controller-manager', 'system:masters,system:nodes');
  const door = await enableSsh(installed.hub, {
    login: { authenticator: 'my-oidc' },
    certificateAuthorities: [readFileSync(join(dir, 'ca.pub'), 'utf8').trim()],
  });
  host = door.host;
  port = door.port;
  writeFileSync(join(dir, 'known_hosts'), door.knownHosts);
  // Both replicas listen once they have the key; a command through each is what the tests below need.
  await eventually(
    async () => {
      const r = await ssh('demo', DEMO_USER, [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
      if (r.code !== 0) throw new Error(`ssh: ${r.code} ${r.stderr}`);
    },
    120_000,
    1000,
  ).catch(async (err: unknown) => {
    // What the door said about it, for whoever reads the failure.
    const logs = await conciergeLogs();
    const verbose = await ssh('demo', DEMO_USER, ['-v', `hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
    const said = logs.split('\n').filter((line) => line.includes('"component":"ssh"'));
    throw new Error(
      `${(err as Error).message}\nthe door's log:\n${said.slice(-20).join('\n')}\nssh -v:\n${verbose.stderr}`,
    );
  });
}, 600_000);

afterAll(async () => {
  await Promise.all(children.map((c) => stopChild(c)));
  await stopInstalled(running);
  rmSync(dir, { recursive: true, force: true });
}, 120_000);

describe.each([
  ['the hub', 'hub'],
  [`${EDGE}, through its agent's tunnel`, EDGE],
])('ssh into pods of %s', (_title, cluster) => {
  const target = `${cluster}/${DEMO_NAMESPACE}/${DEMO_POD}`;

  it('runs a command and returns its exit status and its stdout and stderr apart', async () => {
    const r = await ssh('demo', DEMO_USER, [target, '--', 'sh', '-c', "'echo out; echo err >&2; exit 7'"]);
    expect(r.stdout.toString()).toBe('out\n');
    expect(r.stderr).toContain('err');
    expect(r.code).toBe(7);
  });

  it('opens a shell with a terminal: what is typed runs, and its exit status comes back', async () => {
    const r = await ssh('demo', DEMO_USER, ['-tt', target], {
      input: typing(/\$ /, ['echo $((6*7)); tty', 'exit 3']),
    });
    const out = r.stdout.toString();
    expect(out).toContain('42');
    expect(out).toMatch(/\/dev\/pts\/[0-9]+/);
    expect(r.code).toBe(3);
  });

  it('puts and gets a file with sftp, and copies with scp, byte for byte', async () => {
    const data = randomBytes(3 << 20);
    writeFileSync(join(dir, `up-${cluster}`), data);
    const remote = `/${cluster}/${DEMO_NAMESPACE}/${DEMO_POD}/${DEMO_POD}/tmp/up-${cluster}`;
    const batch = [
      `put ${join(dir, `up-${cluster}`)} ${remote}`,
      `get ${remote} ${join(dir, `down-${cluster}`)}`,
    ];
    writeFileSync(join(dir, `batch-${cluster}`), batch.join('\n') + '\n');
    const sftp = await run('sftp', [
      ...options('demo'),
      '-P',
      String(port),
      '-b',
      join(dir, `batch-${cluster}`),
      `${DEMO_USER}@${host}`,
    ]);
    expect(sftp.stderr).not.toMatch(/denied|failure|error/i);
    expect(sftp.code).toBe(0);
    expect(sha256(readFileSync(join(dir, `down-${cluster}`)))).toBe(sha256(data));
    const inPod = await ssh('demo', DEMO_USER, [target, '--', 'sha256sum', `/tmp/up-${cluster}`]);
    expect(inPod.stdout.toString()).toContain(sha256(data));

    const scp = await run('scp', [
      ...options('demo'),
      '-P',
      String(port),
      `${DEMO_USER}@${host}:${remote}`,
      join(dir, `scp-${cluster}`),
    ]);
    expect(scp.code).toBe(0);
    expect(sha256(readFileSync(join(dir, `scp-${cluster}`)))).toBe(sha256(data));
  });

  it("refuses what the cluster's RBAC refuses, with its message", async () => {
    const r = await ssh('viewer', VIEWER, [target, '--', 'true']);
    expect(r.code).not.toBe(0);
    expect(r.stderr).toMatch(/forbidden/);
    expect(r.stderr).toContain(VIEWER);
  });
});

describe('the API server is the oracle', () => {
  // Each row: who, which cluster and where. Straight to that cluster's API server, an admin's kubectl exec as the
  // user (--as, --as-group); through the door, ssh as the user's certificate. Both must agree: allowed or forbidden.
  const rows: [string, string, string, string, string][] = [
    ['demo', DEMO_USER, DEMO_GROUP, 'hub', DEMO_NAMESPACE],
    ['viewer', VIEWER, 'demo-viewers', 'hub', DEMO_NAMESPACE],
    ['demo', DEMO_USER, DEMO_GROUP, 'hub', 'kube-system'],
    ['demo', DEMO_USER, DEMO_GROUP, EDGE, DEMO_NAMESPACE],
    ['viewer', VIEWER, 'demo-viewers', EDGE, DEMO_NAMESPACE],
    ['demo', DEMO_USER, DEMO_GROUP, EDGE, 'kube-system'],
  ];
  it.each(rows)(
    '%s (%s, %s) on %s in %s: the door answers as the API server does',
    async (key, user, group, cluster, ns) => {
      const direct = await (cluster === 'hub' ? installed.hub : installed.edge).kubectl([
        'exec',
        '-n',
        ns,
        DEMO_POD,
        `--as=${user}`,
        `--as-group=${group}`,
        '--',
        'true',
      ]);
      const door = await ssh(key, user, [`${cluster}/${ns}/${DEMO_POD}`, '--', 'true']);
      expect({ allowed: door.code === 0, forbidden: /forbidden/.test(door.stderr) }).toEqual({
        allowed: direct.code === 0,
        forbidden: /forbidden/.test(direct.stderr),
      });
    },
  );
});

describe('ssh -L', () => {
  it("forwards a local port to a Service on the edge, through the cluster's decision and its agent", async () => {
    const local = 20_000 + Math.floor(Math.random() * 20_000);
    const [command, argv] = dieWithParent('ssh', [
      ...options('demo'),
      '-o',
      'ExitOnForwardFailure=yes',
      '-p',
      String(port),
      '-l',
      DEMO_USER,
      '-N',
      '-L',
      `127.0.0.1:${local}:${EDGE}/${DEMO_NAMESPACE}/svc/${REACH_WORKLOAD}:${ECHO_PORT}`,
      host,
    ]);
    const child = spawn(command, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
    children.push(child);
    const payload = randomBytes(64 * 1024);
    const echoed = await eventually(
      () =>
        new Promise<Buffer>((done, fail) => {
          const socket = connect({ port: local, host: '127.0.0.1', allowHalfOpen: true });
          const chunks: Buffer[] = [];
          socket.on('data', (c: Buffer) => chunks.push(c));
          socket.once('end', () => {
            socket.end();
            const all = Buffer.concat(chunks);
            if (all.length === 0) fail(new Error('nothing came back'));
            else done(all);
          });
          socket.once('error', fail);
          socket.end(payload);
        }),
      30_000,
      500,
    );
    expect(echoed.equals(payload)).toBe(true);
    await stopChild(child);
  });
});

/** The hub's concierge pods' restarts, all replicas together. */
async function conciergeRestarts(): Promise<number> {
  const got = await installed.hub.kubectl([
    'get',
    'pods',
    '-n',
    DEFAULT_INSTALL.namespace,
    '-l',
    'app=sealion-concierge',
    '-o',
    'jsonpath={.items[*].status.containerStatuses[*].restartCount}',
  ]);
  return got.stdout
    .split(/\s+/)
    .filter(Boolean)
    .reduce((sum, n) => sum + Number(n), 0);
}

/** A device login as a stranger with `key`: resolves with what ssh showed once the instructions came, then leaves. */
function walkAway(key: string): Promise<string> {
  return new Promise((done, fail) => {
    const [command, argv] = dieWithParent('ssh', [
      ...options(key, false),
      '-o',
      'PreferredAuthentications=keyboard-interactive',
      '-p',
      String(port),
      '-l',
      'anyone',
      host,
      'true',
    ]);
    const child = spawn(command, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
    let shown = '';
    const timer = setTimeout(() => child.kill('SIGKILL'), SSH_TIMEOUT_MS);
    child.stderr.on('data', (c: Buffer) => {
      shown += String(c);
      // Gone at the prompt, without answering.
      if (shown.includes('To sign in')) child.kill('SIGKILL');
    });
    child.once('error', fail);
    child.once('close', () => {
      clearTimeout(timer);
      done(shown);
    });
  });
}

describe('what a stranger cannot do', () => {
  it('walks away at the device prompt, again and again: no replica stops, and the next login still starts', async () => {
    const restarts = await conciergeRestarts();
    // More than every device-login place of both replicas (64 each, 4 per address), all from this one address.
    for (let i = 0; i < 70; i++) expect(await walkAway('stranger')).toContain('To sign in, open https://');
    expect(await walkAway('stranger')).toContain('To sign in, open https://');
    expect(await conciergeRestarts()).toBe(restarts);
  }, 300_000);

  it('holds idle connections from one address without locking that address out', async () => {
    // Behind the local load balancer every client shares its address, as behind a cloud's SNAT.
    const idlers = await Promise.all(
      Array.from(
        { length: 48 },
        () =>
          new Promise<Socket>((done, fail) => {
            const socket = connect({ port, host }, () => done(socket));
            socket.once('error', fail);
            socket.resume();
          }),
      ),
    );
    try {
      for (let i = 0; i < 4; i++) {
        const r = await ssh('demo', DEMO_USER, [
          `hub/${DEMO_NAMESPACE}/${DEMO_POD}`,
          '--',
          'echo',
          `in-${i}`,
        ]);
        expect({ code: r.code, stdout: r.stdout.toString() }).toEqual({ code: 0, stdout: `in-${i}\n` });
      }
    } finally {
      for (const socket of idlers) socket.destroy();
    }
  });

  it("refuses a certificate that names Kubernetes' own identities, which the API server would trust", async () => {
    // Straight to the API server, that identity reads every Secret: the door must not make it.
    const direct = await installed.hub.kubectl([
      'get',
      'secrets',
      '-A',
      '--as=system:kube-controller-manager',
      '--as-group=system:masters',
    ]);
    expect(direct.code).toBe(0);
    const r = await ssh('controller', 'system:kube-controller-manager', [
      `hub/${DEMO_NAMESPACE}/${DEMO_POD}`,
      '--',
      'true',
    ]);
    expect(r.code).toBe(255);
    expect(r.stderr).toContain('Permission denied');
  });
});

describe('signing in', () => {
  it('refuses a key nobody bound and an expired certificate as SSH refuses any', async () => {
    for (const key of ['stranger', 'late']) {
      const r = await ssh(key, DEMO_USER, [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
      expect(r.code).toBe(255);
      expect(r.stderr).toContain('Permission denied');
    }
  });

  it('tells a script in BatchMode at once why its key is refused and how to have it bound, never waiting', async () => {
    const r = await ssh('stranger', DEMO_USER, [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
    expect(r.code).toBe(255);
    expect(r.stderr).toContain(
      `Sealion: the key ${await fingerprintOf('stranger')} is not bound to a login yet; a device login binds it, which needs ssh without BatchMode (once: ssh -t <host>).`,
    );
  });

  it('refuses a certificate for another login name than its principals', async () => {
    const r = await ssh('demo', VIEWER, [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
    expect(r.code).toBe(255);
  });

  it('logs in with the device code at the OpenID Provider, then the key needs no login while the issuer renews the login', async () => {
    let approving: Promise<void> | undefined;
    const r = await run(
      'ssh',
      [
        ...options('device', false),
        '-o',
        'PreferredAuthentications=publickey,keyboard-interactive',
        '-p',
        String(port),
        '-l',
        'anyone',
        host,
        `${EDGE}/${DEMO_NAMESPACE}/${DEMO_POD}`,
        '--',
        'echo',
        'signed-in',
      ],
      '',
      (stderr) => {
        const url = /or open (https:\/\/\S+)/.exec(stderr)?.[1];
        if (url && !approving) approving = approveDevice(url, { caPem: installed.issuer.caPem });
      },
    );
    await approving;
    expect(r.stdout.toString()).toBe('signed-in\n');
    expect(r.code).toBe(0);
    const fingerprint = await fingerprintOf('device');
    const print = fingerprint.replace(/[+/]/g, '\\$&');
    // The issuer gives a refresh token: bound for the session, which the issuer may end sooner.
    expect(r.stderr).toMatch(
      new RegExp(
        `Sealion: the key ${print} is bound to demo@sealion\\.dev until \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d UTC\\. ` +
          'It stays bound while the issuer renews the login; signing out there ends it sooner\\.',
      ),
    );

    // Bound: batch mode (no login possible) works with the key alone, as the demo user.
    const again = await ssh('device', 'anyone', [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'echo', 'again']);
    expect(again.stdout.toString()).toBe('again\n');

    // A terminal that changes size: OpenSSH sends a new size only from a real terminal, so the ssh2 client does.
    expect(await resized(`${EDGE}/${DEMO_NAMESPACE}/${DEMO_POD}`, 'device')).toEqual(['24 80', '33 99']);

    // Past the ID token's expiry, as the Secret says it: the door renews the login with the refresh token at the
    // issuer, the JWTAuthenticator takes the new ID token, and the key still signs in.
    const ns = DEFAULT_INSTALL.namespace;
    const binding = async (): Promise<{ name: string; stored: StoredBinding } | undefined> => {
      const secrets = await installed.hub.kubectl([
        'get',
        'secrets',
        '-n',
        ns,
        '-l',
        'sealion.dev/ssh-key-binding=true',
        '-o',
        'json',
      ]);
      const items = (
        JSON.parse(secrets.stdout) as {
          items: { metadata: { name: string }; data: Record<string, string> }[];
        }
      ).items;
      expect(items.length).toBeLessThanOrEqual(1);
      const item = items[0];
      if (!item) return undefined;
      const text = Buffer.from(item.data['binding.json']!, 'base64').toString('utf8');
      return { name: item.metadata.name, stored: JSON.parse(text) as StoredBinding };
    };
    const expire = async (): Promise<StoredBinding> => {
      const { name, stored } = (await binding())!;
      const expired = Buffer.from(JSON.stringify({ ...stored, expires: Date.now() - 1000 })).toString(
        'base64',
      );
      await installed.hub.kubectl([
        'patch',
        'secret',
        name,
        '-n',
        ns,
        '--type=merge',
        '-p',
        JSON.stringify({ data: { 'binding.json': expired } }),
      ]);
      return stored;
    };
    const first = await expire();
    expect(first.user.username).toBe(DEMO_USER);
    expect(typeof first.refreshToken).toBe('string');
    await eventually(
      async () => {
        // The informer sees the patch: then the renewal stores a new expiry and the rotated refresh token.
        const renewed = await ssh('device', 'anyone', [
          `hub/${DEMO_NAMESPACE}/${DEMO_POD}`,
          '--',
          'echo',
          'renewed',
        ]);
        expect(renewed.stdout.toString()).toBe('renewed\n');
        const now = (await binding())!.stored;
        expect(now.expires).toBeGreaterThan(Date.now());
        expect(now.refreshToken).not.toBe(first.refreshToken);
      },
      30_000,
      1000,
    );

    // Signed out at the issuer (the refresh token revoked, as `sealion logout` does): past the ID token, the door's
    // renewal is refused, the binding ends, and the key is a stranger's again.
    const second = (await binding())!.stored;
    await installed.issuer.revoke(second.refreshToken!);
    await expire();
    await eventually(
      async () => {
        const late = await ssh('device', 'anyone', [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
        expect(late.code).toBe(255);
        expect(late.stderr).toContain(
          `Sealion: the login that bound the key ${fingerprint} has ended at its issuer (signed out, disabled or expired).`,
        );
      },
      30_000,
      1000,
    );
    await eventually(async () => expect(await binding()).toBeUndefined(), 30_000, 1000);
  }, 180_000);
});

describe('a key bound by a device login', () => {
  it("is a stranger's again once the JWTAuthenticator that bound it is re-created", async () => {
    let approving: Promise<void> | undefined;
    const login = await run(
      'ssh',
      [
        ...options('rebound', false),
        '-o',
        'PreferredAuthentications=publickey,keyboard-interactive',
        '-p',
        String(port),
        '-l',
        'anyone',
        host,
        `hub/${DEMO_NAMESPACE}/${DEMO_POD}`,
        '--',
        'true',
      ],
      '',
      (stderr) => {
        const url = /or open (https:\/\/\S+)/.exec(stderr)?.[1];
        if (url && !approving) approving = approveDevice(url, { caPem: installed.issuer.caPem });
      },
    );
    await approving;
    expect(login.code).toBe(0);
    const bound = await ssh('rebound', 'anyone', [
      `hub/${DEMO_NAMESPACE}/${DEMO_POD}`,
      '--',
      'echo',
      'bound',
    ]);
    expect(bound.stdout.toString()).toBe('bound\n');

    // Deleted and made again under its name, with the very same spec: another object, whose word the key never had.
    const got = await installed.hub.kubectl(['get', 'jwtauthenticator', 'my-oidc', '-o', 'json']);
    const old = JSON.parse(got.stdout) as { apiVersion: string; kind: string; spec: unknown };
    await installed.hub.kubectl(['delete', 'jwtauthenticator', 'my-oidc', '--wait=true']);
    const made = await installed.hub.kubectl(['create', '-f', '-'], {
      input: JSON.stringify({
        apiVersion: old.apiVersion,
        kind: old.kind,
        metadata: { name: 'my-oidc' },
        spec: old.spec,
      }),
    });
    expect(made.code).toBe(0);
    await eventually(
      async () => {
        const phase = await installed.hub.kubectl([
          'get',
          'jwtauthenticator',
          'my-oidc',
          '-o',
          'jsonpath={.status.phase}',
        ]);
        expect(phase.stdout).toBe('Ready');
      },
      120_000,
      500,
    );
    await eventually(
      async () => {
        const late = await ssh('rebound', 'anyone', [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true']);
        expect(late.code).toBe(255);
      },
      30_000,
      1000,
    );
  }, 240_000);
});

describe('what the door says when something cannot be done', () => {
  // The reach workload's pod (on the edge) runs Sealion's own image, which has no shell.
  const shellless = `${EDGE}/${DEMO_NAMESPACE}/reach-echo`;
  const noShellIn = (where: string): string =>
    `sealion: ${where} has no shell (/bin/sh in its image); pick another container, or run a program it has: ` +
    `ssh <host> ${where} -- <command>`;
  const noShell = noShellIn(shellless);

  it('says in one line that a pod has no shell, or has not the program asked for', async () => {
    const r = await ssh('demo', DEMO_USER, ['-tt', shellless]);
    expect(r.code).toBe(127);
    expect(r.stderr).toContain(noShell);
    expect(r.stderr).not.toContain('Internal error occurred');
    const missing = await ssh('demo', DEMO_USER, [shellless, '--', 'no-such-program']);
    expect(missing.code).toBe(127);
    expect(missing.stderr).toContain(`sealion: no-such-program: no such program in ${shellless}\r\n`);
  });

  it('goes back to the menu from a pod without a shell', async () => {
    const r = await ssh('demo', DEMO_USER, ['-tt'], {
      input: typing(/Choose by number or name[^\n]*: /, [EDGE, DEMO_NAMESPACE, 'reach-echo', '\x04']),
    });
    const out = r.stdout.toString();
    // The menu picked the pod's one container.
    const said = noShellIn(`${shellless}/server`);
    expect(out).toContain(said);
    // The menu again after the line, and a clean quit from it.
    expect(out.slice(out.indexOf(said))).toContain('Clusters:');
    expect(r.code).toBe(0);
  });

  it("gives a refused forward's reason in the channel-open failure, as OpenSSH prints it", async () => {
    const r = await ssh('demo', DEMO_USER, ['-W', 'hub/kube-system/svc/nothing:80']);
    expect(r.code).toBe(255);
    expect(r.stderr).toMatch(
      /open failed: administratively prohibited: services "nothing[^"]*" is forbidden: User "demo@sealion\.dev" cannot create resource "services\/proxy"/,
    );
  });
});

describe('the menu', () => {
  it('lists what the user may exec into and opens a shell in the one picked', async () => {
    const picked = await ssh('demo', DEMO_USER, ['-tt'], {
      input: typing(/Choose by number or name[^\n]*: |\$ /, [
        EDGE,
        DEMO_NAMESPACE,
        DEMO_POD,
        'echo picked-$((1+1))',
        'exit 4',
      ]),
    });
    const out = picked.stdout.toString();
    expect(out).toContain('Clusters:');
    expect(out).toContain(EDGE);
    expect(out).toContain(`Namespaces of ${EDGE}`);
    expect(out).toContain('picked-2');
    expect(picked.code).toBe(4);
  });
});

describe('accountability', () => {
  it('audits an SSH command as an exec by the certificate user, through the pipeline', async () => {
    const marker = `marker-${randomBytes(6).toString('hex')}`;
    const r = await ssh('demo', DEMO_USER, [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'echo', marker]);
    expect(r.code).toBe(0);
    const event = await eventually(async () => {
      const found = (await conciergeLogs())
        .split('\n')
        .filter((line) => line.startsWith('{"kind":"Event"'))
        .map((line) => JSON.parse(line) as AuditEvent)
        .find((e) => e.requestURI.includes(marker) && e.stage === 'ResponseComplete');
      expect(found).toBeDefined();
      return found!;
    });
    expect(event).toMatchObject({
      user: { username: DEMO_USER },
      objectRef: { resource: 'pods', subresource: 'exec', namespace: DEMO_NAMESPACE, name: DEMO_POD },
      annotations: { 'sealion.dev/authenticator': 'ssh/certificate' },
    });
    expect(event.userAgent).toMatch(/^sealion-ssh \(OpenSSH/);
  });

  it('records a shell like kubectl exec -it, readable through the SessionRecording API', async () => {
    const marker = `recorded-${randomBytes(6).toString('hex')}`;
    const r = await ssh('demo', DEMO_USER, ['-tt', `${EDGE}/${DEMO_NAMESPACE}/${DEMO_POD}`], {
      input: typing(/\$ /, [`echo ${marker}`, 'exit']),
    });
    expect(r.stdout.toString()).toContain(marker);
    const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
    writeFileSync(join(dir, 'auditor.kubeconfig'), await installed.kubeconfig(token));
    const recorded = await eventually(async () => {
      const list = await installed.hub.kubectl(
        ['get', '--raw', '/apis/recordings.concierge.sealion.dev/v1alpha1/sessionrecordings'],
        { kubeconfig: join(dir, 'auditor.kubeconfig') },
      );
      const names = (JSON.parse(list.stdout) as { items: { metadata: { name: string } }[] }).items.map(
        (i) => i.metadata.name,
      );
      for (const name of names) {
        const one = await installed.hub.kubectl(
          ['get', '--raw', `/apis/recordings.concierge.sealion.dev/v1alpha1/sessionrecordings/${name}`],
          { kubeconfig: join(dir, 'auditor.kubeconfig') },
        );
        if (one.stdout.includes(marker)) return one.stdout;
      }
      throw new Error(`no recording of ${names.length} holds the marker`);
    }, 30_000);
    // asciicast v2: a header line, then events; the typed line is in the output the terminal echoed.
    expect(JSON.parse(recorded.split('\n')[0]!)).toMatchObject({ version: 2 });
  });

  it("records an sftp session as one recording of its operations, and names the hub's sessions hub", async () => {
    // Headers keep whole seconds, so the test starts on the next whole second: every session of this test is
    // listed, and none before it (the hub exec two tests back may have started in the same second as this one).
    const start = Math.ceil(Date.now() / 1000) * 1000;
    await sleep(start - Date.now() + 1);
    const since = new Date(start).toISOString();
    const name = `audited-${randomBytes(6).toString('hex')}`;
    const remote = `/hub/${DEMO_NAMESPACE}/${DEMO_POD}/${DEMO_POD}/tmp/${name}`;
    writeFileSync(join(dir, name), 'for the auditor\n');
    writeFileSync(
      join(dir, `batch-${name}`),
      [`put ${join(dir, name)} ${remote}`, `get ${remote} ${join(dir, `${name}.back`)}`, `rm ${remote}`].join(
        '\n',
      ) + '\n',
    );
    const sftp = await run('sftp', [
      ...options('demo'),
      '-P',
      String(port),
      '-b',
      join(dir, `batch-${name}`),
      `${DEMO_USER}@${host}`,
    ]);
    expect(sftp.code).toBe(0);
    const r = await ssh('demo', DEMO_USER, [`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'echo', name]);
    expect(r.code).toBe(0);

    const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
    writeFileSync(join(dir, 'auditor.kubeconfig'), await installed.kubeconfig(token));
    const collection = '/apis/recordings.concierge.sealion.dev/v1alpha1/sessionrecordings';
    const asAuditor = async (path: string): Promise<string> =>
      (await installed.hub.kubectl(['get', '--raw', path], { kubeconfig: join(dir, 'auditor.kubeconfig') }))
        .stdout;
    type Item = { metadata: { name: string }; status: Record<string, unknown> };
    const query = new URLSearchParams({ user: DEMO_USER, cluster: 'hub', since }).toString();
    // Both sessions, once the command's has closed: the sftp one whole, and no recording of its commands apart.
    const items = await eventually(async () => {
      const listed = (JSON.parse(await asAuditor(`${collection}?${query}`)) as { items: Item[] }).items;
      expect(listed.map((i) => i.status.kind)).toEqual(['exec', 'sftp']);
      return listed;
    }, 30_000);
    expect(items[0]!.status).toMatchObject({
      cluster: 'hub',
      namespace: DEMO_NAMESPACE,
      pod: DEMO_POD,
      command: ['echo', name],
    });
    expect(items[1]!.status).toMatchObject({
      user: DEMO_USER,
      cluster: 'hub',
      namespace: DEMO_NAMESPACE,
      pod: DEMO_POD,
    });
    // What an auditor reads: the operations, by the tree's paths (each line written as its command starts).
    await eventually(async () => {
      const operations = (await asAuditor(`${collection}/${items[1]!.metadata.name}`))
        .split('\n')
        .slice(1)
        .filter(Boolean)
        .map((line) => (JSON.parse(line) as [number, string, string])[2].trimEnd());
      expect(operations).toEqual(
        expect.arrayContaining([
          expect.stringMatching(new RegExp(`^write ${remote} flags=`)),
          `read ${remote}`,
          `rm ${remote}`,
        ]),
      );
    }, 30_000);
  });
});
