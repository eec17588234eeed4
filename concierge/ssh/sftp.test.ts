// The SFTP subsystem against the real OpenSSH clients (sftp, and scp, which OpenSSH 9 runs over SFTP), through an
// in-process ssh2 server on a port 0 socket, plus pure tests of path resolution and of reading stat's output.
//
// The test's containers are this machine. `run` spawns the argv it is given as it is (no shell, no rewriting), so
// the commands sftp.ts builds are exactly the ones a container would get; the price is that every container's file
// system is the host's, and the tests work in a temporary directory: /hub/default/web-0/app/tmp/sealion-sftp-XXXX/
// is the host's /tmp/sealion-sftp-XXXX/. Rewriting container paths into per-container directories would mean
// guessing which argv elements are paths (or chroot, which needs root and binaries inside), and would test the
// rewriting more than sftp.ts. Containers differ in who they are: `locked` refuses every exec the way the API
// server refuses one (its exit rejects with a forbidden Status message); `slow-0` hands its output on slowly, so
// a download can be cut off halfway; and `tools-0/busybox` runs its commands with a PATH of busybox applets only
// (its sh is busybox's ash): Debian's static busybox, the one the demo image carries, which the image builder fetches
// (dev/image.ts). A machine where it cannot be had fails the file, saying so: the block never skips.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import {
  chmodSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough, Transform } from 'node:stream';
import ssh2, { type SFTPWrapper } from 'ssh2';
import { eventually } from '../../dev/eventually.ts';
import { silentLogger } from '../../lib/log.ts';
import type { ContainerRef, Containers, Running } from './containers.ts';
import { serveSftp, type SftpLimits } from './sftp.ts';
import { locate, resolvePath } from './sftp-paths.ts';
import { longname, modeString, parseListing, parseStat } from './sftp-stat.ts';
import { opensshOptions } from '../../dev/openssh.ts';
import { writeDebianBusybox } from '../../dev/image.ts';

/** Every client command gets this long; a red test ends instead of hanging. */
const TOOL_TIMEOUT_MS = 60_000;
const FORBIDDEN =
  'pods "locked" is forbidden: User "alice" cannot create resource "pods/exec" in API group "" in the namespace "default"';
/** The limits a session signed in as `tight` gets, to reach them cheaply. */
const TIGHT: Partial<SftpLimits> = { maxHandles: 4, writeBufferBytes: 256 * 1024 };

describe('sftp paths', () => {
  it.each([
    ['', '/'],
    ['.', '/'],
    ['/', '/'],
    ['hub', '/hub'],
    ['//hub///default/', '/hub/default'],
    ['/hub/./default/../team-a', '/hub/team-a'],
    ['../../..', '/'],
    ['/hub/default/web-0/app/../../../x', '/hub/x'],
  ])('resolves %j to %j', (path, want) => {
    expect(resolvePath(path)).toBe(want);
  });

  it.each([
    ['/', { level: 'root' }],
    ['/hub', { level: 'cluster', cluster: 'hub' }],
    ['/hub/default', { level: 'namespace', cluster: 'hub', namespace: 'default' }],
    ['hub/default/web-0', { level: 'pod', cluster: 'hub', namespace: 'default', pod: 'web-0' }],
    ['/hub/default/web-0/app', { level: 'file', ref: ref('web-0', 'app'), path: '/' }],
    ['/hub/default/web-0/app/etc//passwd', { level: 'file', ref: ref('web-0', 'app'), path: '/etc/passwd' }],
    // Resolved first, then split: `..` past a container's root leaves that container for the one the path names.
    ['/hub/default/web-0/app/../../web-1/app/x', { level: 'file', ref: ref('web-1', 'app'), path: '/x' }],
    ['/hub/default/web-0/app/../../../../../etc', { level: 'cluster', cluster: 'etc' }],
  ])('locates %j', (path, want) => {
    expect(locate(path)).toEqual(want);
  });
});

describe('stat output', () => {
  it('reads a stat line, GNU and busybox alike', () => {
    expect(parseStat('81a4 1234 1000 100 1700000000 1700000001 1 alice users\n')).toEqual({
      attrs: { mode: 0o100644, size: 1234, uid: 1000, gid: 100, atime: 1700000000, mtime: 1700000001 },
      links: 1,
      user: 'alice',
      group: 'users',
    });
    // Times before 1970 (GNU prints them negative) are 0 in SFTP's unsigned fields.
    expect(parseStat('41ed 4096 0 0 -5 0 2 root root')?.attrs.atime).toBe(0);
    expect(parseStat('stat: cannot statx')).toBeUndefined();
    expect(parseStat('81a4 1 0 0 0 0 1 root root extra')).toBeUndefined();
  });

  it('matches each listed name to its own line, whatever the name holds', () => {
    const line = (mode: string, size: number, name: string): string =>
      `${mode} ${size} 0 0 5 6 1 root root ${name}\n`;
    // A name holding a newline and text shaped like a stat line of its own, after the name it starts with.
    const spoof = 'b\n81a4 9 0 0 5 6 1 root root c';
    const names = ['.', '..', '.[!.]*', 'a b', 'b', spoof, 'new\nline', '*'];
    const output =
      names.join('\0') +
      '\0\0' +
      line('41ed', 4096, '.') +
      line('41ed', 4096, '..') +
      // `.[!.]*` and `*` matched nothing and stayed as they were: stat printed no line for them.
      line('81a4', 3, 'a b') +
      line('81a4', 1, 'b') +
      line('81a4', 2, spoof) +
      line('81a4', 7, 'new\nline');
    expect(parseListing(output)?.map((f) => [f.name, f.info.attrs.size])).toEqual([
      ['.', 4096],
      ['..', 4096],
      ['a b', 3],
      ['b', 1],
      [spoof, 2],
      ['new\nline', 7],
    ]);
    expect(parseListing('no names section')).toBeUndefined();
  });

  it('writes ls -l lines', () => {
    expect(modeString(0o100644)).toBe('-rw-r--r--');
    expect(modeString(0o40755)).toBe('drwxr-xr-x');
    expect(modeString(0o104755)).toBe('-rwsr-xr-x');
    expect(modeString(0o41777)).toBe('drwxrwxrwt');
    expect(modeString(0o120777)).toBe('lrwxrwxrwx');
    expect(modeString(0o102644)).toBe('-rw-r-Sr--');
    const info = {
      attrs: { mode: 0o100600, size: 42, uid: 0, gid: 0, atime: 0, mtime: 1_700_000_000 },
      links: 1,
      user: 'root',
      group: 'root',
    };
    expect(longname('f', info, 1_700_000_100)).toBe(
      '-rw-------   1 root     root           42 Nov 14 22:13 f',
    );
    expect(longname('f', info, 1_800_000_000)).toBe(
      '-rw-------   1 root     root           42 Nov 14  2023 f',
    );
  });
});

function ref(pod: string, container: string): ContainerRef {
  return { cluster: 'hub', namespace: 'default', pod, container };
}

interface Spawned {
  ref: ContainerRef;
  argv: readonly string[];
  child: ChildProcess;
  /** Set when the process has ended: its exit code, or the signal that ended it. */
  ended?: number | NodeJS.Signals;
  killed: boolean;
  /** The bytes its stdout has handed on: what the reader took, and no more than its pipes hold. */
  read: number;
  /** The stdout the reader was given, which counts `read`. */
  stdout?: Transform;
}

/** A Running whose exec the cluster refused. */
function refused(message: string): Running {
  const ended = (): PassThrough => new PassThrough().end();
  return {
    stdin: new PassThrough(),
    stdout: ended(),
    stderr: ended(),
    exit: Promise.reject(new Error(message)),
    resize: () => {},
    kill: () => {},
  };
}

/** Passes `chunk` on in 16 KiB pieces, 20 ms apart: about 800 KB/s. */
function slowly(): Transform {
  return new Transform({
    transform(chunk: Buffer, _encoding, done) {
      const pieces: Buffer[] = [];
      for (let i = 0; i < chunk.length; i += 16 * 1024) pieces.push(chunk.subarray(i, i + 16 * 1024));
      const next = (): void => {
        const piece = pieces.shift();
        if (!piece) return done();
        this.push(piece);
        setTimeout(next, 20);
      };
      next();
    },
  });
}

/** The containers of the test's tree, which run their commands on this machine (see the top of this file). */
function localContainers(busyboxPath: string): Containers & { spawned: Spawned[] } {
  const spawned: Spawned[] = [];
  const tree: Record<string, Record<string, Record<string, string[]>>> = {
    hub: {
      default: {
        'web-0': ['app', 'sidecar'],
        'web-1': ['app'],
        'tools-0': ['busybox'],
        locked: ['app'],
        'slow-0': ['app'],
      },
      'team-a': { 'api-0': ['api'] },
    },
    edge: { default: {} },
  };
  const notFound = (what: string): Error => new Error(`${what} not found`);
  return {
    spawned,
    run(ref, argv) {
      if (ref.pod === 'locked') return refused(FORBIDDEN);
      const env =
        ref.container === 'busybox' ? { PATH: busyboxPath, LC_ALL: 'C' } : { ...process.env, LC_ALL: 'C' };
      const child = spawn(argv[0]!, argv.slice(1), { stdio: 'pipe', env });
      const entry: Spawned = { ref, argv, child, killed: false, read: 0 };
      spawned.push(entry);
      const exit = new Promise<number>((resolve, reject) => {
        child.once('error', reject);
        child.once('exit', (code, signal) => (entry.ended = code ?? signal ?? -1));
        child.once('close', (code) => resolve(code ?? 128 + 9));
      });
      const counted = new Transform({
        transform(chunk: Buffer, _encoding, done) {
          entry.read += chunk.length;
          done(null, chunk);
        },
      });
      const stdout = (ref.pod === 'slow-0' ? child.stdout.pipe(slowly()) : child.stdout).pipe(counted);
      entry.stdout = counted;
      return {
        stdin: child.stdin,
        stdout,
        stderr: child.stderr,
        exit,
        resize: () => {},
        kill: () => {
          entry.killed = true;
          child.kill('SIGKILL');
        },
      };
    },
    clusters: () => Promise.resolve(Object.keys(tree)),
    namespaces: async (c) => {
      const namespaces = tree[c];
      if (!namespaces) throw notFound(`clusters.sealion.dev "${c}"`);
      return Object.keys(namespaces);
    },
    pods: async (c, ns) => {
      const pods = tree[c]?.[ns];
      if (!pods) throw notFound(`namespaces "${ns}"`);
      return Object.keys(pods);
    },
    containers: async (c, ns, pod) => {
      const containers = tree[c]?.[ns]?.[pod];
      if (!containers) throw notFound(`pods "${pod}"`);
      return containers;
    },
  };
}

interface ToolResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs a client tool to its end, or kills it after TOOL_TIMEOUT_MS. */
function tool(command: string, args: string[]): Promise<ToolResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (c: Buffer) => (stdout += c.toString()));
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const timer = setTimeout(() => child.kill('SIGKILL'), TOOL_TIMEOUT_MS);
    child.once('error', reject);
    child.once('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
  });
}

function sha256(path: string): string {
  return createHash('sha256').update(readFileSync(path)).digest('hex');
}

describe('SFTP through OpenSSH', () => {
  let work: string;
  let key: string;
  let port: number;
  let server: ssh2.Server;
  let containers: ReturnType<typeof localContainers>;
  let batches = 0;
  const clients = new Set<ssh2.Connection>();

  beforeAll(async () => {
    work = mkdtempSync(join(tmpdir(), 'sealion-sftp-'));
    key = join(work, 'id_ed25519');
    const keygen = spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key]);
    if (keygen.status !== 0) throw new Error(`ssh-keygen: ${keygen.stderr.toString()}`);
    containers = localContainers(busyboxApplets(join(work, 'busybox-bin')));
    const allowed = ssh2.utils.parseKey(readFileSync(`${key}.pub`));
    if (allowed instanceof Error) throw allowed;
    server = new ssh2.Server({ hostKeys: [hostKey()] }, (client) => {
      let user = '';
      client.on('error', () => {});
      clients.add(client);
      client.once('close', () => clients.delete(client));
      // The SSH server's job: without it, each small answer waits for the client's delayed ACK (40 ms). The
      // server-side connection has the method, though its types do not say so.
      (client as unknown as { setNoDelay(on: boolean): void }).setNoDelay(true);
      client.on('authentication', (ctx) => {
        if (ctx.method !== 'publickey') return ctx.reject(['publickey']);
        const offered = ssh2.utils.parseKey(ctx.key.data);
        if (offered instanceof Error || !ctx.key.data.equals(allowed.getPublicSSH())) return ctx.reject();
        // Without a signature the client only asks whether this key would do.
        if (!ctx.signature || !ctx.blob) return ctx.accept();
        if (offered.verify(ctx.blob, ctx.signature, ctx.hashAlgo) !== true) return ctx.reject();
        user = ctx.username;
        ctx.accept();
      });
      client.on('ready', () =>
        client.on('session', (accept) =>
          accept().on('sftp', (acceptSftp) =>
            serveSftp(acceptSftp(), containers, {
              log: silentLogger(),
              limits: user === 'tight' ? TIGHT : undefined,
            }),
          ),
        ),
      );
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    port = (server.address() as AddressInfo).port;
  });

  afterAll(async () => {
    for (const s of containers?.spawned ?? []) if (s.ended === undefined) s.child.kill('SIGKILL');
    for (const client of clients) client.end();
    await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
    if (work) rmSync(work, { recursive: true, force: true });
  });

  const options = (): string[] => [...opensshOptions(key), '-P', String(port)];

  /** Runs sftp in batch mode: each line a command; one that fails ends the batch (unless it starts with `-`). */
  const sftp = (...commands: string[]): Promise<ToolResult> => {
    const batch = join(work, `batch-${batches++}`);
    writeFileSync(batch, commands.join('\n') + '\n');
    return tool('sftp', [...options(), '-b', batch, 'alice@127.0.0.1']);
  };
  const scp = (...args: string[]): Promise<ToolResult> => tool('scp', [...options(), ...args]);

  /** The tree's path of a host path, through container `container` of pod `pod`. */
  const inside = (path: string, pod = 'web-0', container = 'app'): string =>
    `/hub/default/${pod}/${container}${path}`;
  /** A fresh directory on the host for one test. */
  const dir = (name: string): string => {
    const d = join(work, name);
    mkdirSync(d);
    return d;
  };
  /** The names `ls -1` printed, without sftp's echo of its commands. */
  const listed = (out: string): string[] =>
    out
      .split('\n')
      .filter((l) => l !== '' && !l.startsWith('sftp>'))
      .map((l) => l.trim());

  it('lists the clusters, a cluster, a namespace, a pod and a directory in a container', async () => {
    const d = dir('listing');
    writeFileSync(join(d, 'a file.txt'), 'hello\n');
    mkdirSync(join(d, 'sub'));
    // Whatever the machine's umask.
    chmodSync(join(d, 'a file.txt'), 0o644);
    chmodSync(join(d, 'sub'), 0o755);
    // `ls` of a path prints the path with each name; `ls` of the working directory the names alone.
    const root = await sftp('ls -1');
    expect(root.code).toBe(0);
    expect(listed(root.stdout)).toEqual(['edge', 'hub']);
    expect(listed((await sftp('cd hub', 'ls -1')).stdout)).toEqual(['default', 'team-a']);
    expect(listed((await sftp('cd /hub/default', 'ls -1')).stdout)).toEqual([
      'locked',
      'slow-0',
      'tools-0',
      'web-0',
      'web-1',
    ]);
    expect(listed((await sftp('cd /hub/default/web-0', 'ls -1')).stdout)).toEqual(['app', 'sidecar']);
    const long = await sftp(`cd ${inside(d)}`, 'ls -l');
    expect(long.code).toBe(0);
    const lines = listed(long.stdout);
    expect(lines).toHaveLength(2);
    expect(lines[0]).toMatch(/^-rw-r--r-- +1 +\S+ +\S+ +6 .* a file\.txt$/);
    expect(lines[1]).toMatch(/^drwxr-xr-x .* sub$/);
    const tree = await sftp('cd /hub', 'ls -l');
    expect(listed(tree.stdout)[0]).toMatch(/^dr-xr-xr-x .* default$/);
  }, 60_000);

  it('puts and gets a 5 MiB file, the same bytes both ways', async () => {
    const d = dir('bulk');
    const local = join(work, 'bulk-local.bin');
    writeFileSync(local, randomBytes(5 * 1024 * 1024));
    const put = await sftp(`put ${local} ${inside(d)}/up.bin`);
    expect(put.stderr).toBe('');
    expect(sha256(join(d, 'up.bin'))).toBe(sha256(local));
    const back = join(work, 'bulk-back.bin');
    const get = await sftp(`get ${inside(d)}/up.bin ${back}`);
    expect(get.stderr).toBe('');
    expect(sha256(back)).toBe(sha256(local));
  }, 60_000);

  it('copies with scp both ways, and scp -p keeps the times and mode', async () => {
    const d = dir('scp');
    const local = join(work, 'scp-local.bin');
    writeFileSync(local, randomBytes(300 * 1024));
    chmodSync(local, 0o640);
    utimesSync(local, 1_600_000_000, 1_600_000_000);
    const up = await scp('-p', local, `alice@127.0.0.1:${inside(d)}/up.bin`);
    expect(up.stderr).toBe('');
    expect(up.code).toBe(0);
    expect(sha256(join(d, 'up.bin'))).toBe(sha256(local));
    expect(statSync(join(d, 'up.bin')).mtimeMs).toBe(1_600_000_000_000);
    expect(statSync(join(d, 'up.bin')).mode & 0o777).toBe(0o640);
    const down = join(work, 'scp-down.bin');
    const get = await scp(`alice@127.0.0.1:${inside(d)}/up.bin`, down);
    expect(get.code).toBe(0);
    expect(sha256(down)).toBe(sha256(local));
  }, 60_000);

  it('makes, renames and removes files and directories, names with spaces too', async () => {
    const d = dir('changes');
    const local = join(work, 'changes-local.txt');
    writeFileSync(local, 'some text\n');
    const at = inside(d);
    const result = await sftp(
      `mkdir "${at}/new dir"`,
      `put ${local} "${at}/new dir/with space.txt"`,
      `rename "${at}/new dir/with space.txt" "${at}/new dir/renamed file.txt"`,
      `cd "${at}/new dir"`,
      'ls -1',
      `mkdir ${at}/gone`,
      `rmdir ${at}/gone`,
      `put ${local} ${at}/doomed`,
      `rm ${at}/doomed`,
      `ln -s ${at}/doomed-no-more ${at}/link`,
    );
    expect(result.stderr).toBe('');
    expect(listed(result.stdout)).toEqual(['renamed file.txt']);
    expect(readFileSync(join(d, 'new dir', 'renamed file.txt'), 'utf8')).toBe('some text\n');
    expect(existsSync(join(d, 'gone'))).toBe(false);
    expect(existsSync(join(d, 'doomed'))).toBe(false);
    // A link's absolute target is the container's path, and shows as the tree's.
    expect(readlinkSync(join(d, 'link'))).toBe(join(d, 'doomed-no-more'));
    await withClient('alice', async (client) => {
      expect(await call<string>((done) => client.readlink(`${at}/link`, done))).toBe(`${at}/doomed-no-more`);
    });
    // SFTP 3's rename does not replace: the target exists.
    writeFileSync(join(d, 'other'), 'x');
    const clash = await sftp(`rename "${at}/new dir/renamed file.txt" ${at}/other`);
    expect(clash.code).not.toBe(0);
    expect(readFileSync(join(d, 'other'), 'utf8')).toBe('x');
  }, 60_000);

  it('changes a mode with chmod', async () => {
    const d = dir('chmod');
    writeFileSync(join(d, 'f'), 'x');
    const result = await sftp(`chmod 600 ${inside(d)}/f`);
    expect(result.stderr).toBe('');
    expect(statSync(join(d, 'f')).mode & 0o777).toBe(0o600);
  }, 30_000);

  it('says a missing file is not found', async () => {
    const d = dir('missing');
    const get = await sftp(`get ${inside(d)}/nothing ${join(work, 'nothing')}`);
    expect(get.code).not.toBe(0);
    expect(get.stderr).toMatch(/not found/);
    // OpenSSH's client prints its own words for a status; the server's message reaches clients that show it.
    await withClient('alice', async (client) => {
      const err = await failureOf((done) => client.stat(`${inside(d)}/nothing`, done));
      expect(err.code).toBe(ssh2.utils.sftp.STATUS_CODE.NO_SUCH_FILE);
      expect(err.message).toMatch(/No such file or directory/);
    });
  }, 30_000);

  it('answers CLOSE with how the write ended', async () => {
    await withClient('alice', async (client) => {
      const missing = await failureOf((done) => client.open(inside('/no-such-dir/f'), 'w', done));
      expect(missing.code).toBe(ssh2.utils.sftp.STATUS_CODE.NO_SUCH_FILE);
      // /dev/full takes the open and the data, and cat's write fails: the CLOSE says so.
      const full = await call<Buffer>((done) => client.open(inside('/dev/full'), 'w', done));
      await call((done) => client.write(full, Buffer.from('data'), 0, 4, 0, done));
      const err = await failureOf((done) => client.close(full, done));
      expect(err.code).toBe(ssh2.utils.sftp.STATUS_CODE.FAILURE);
      expect(err.message).toMatch(/No space left on device/);
    });
  }, 30_000);

  it('refuses the tree itself: it is read-only', async () => {
    const result = await sftp('mkdir /hub/new-namespace');
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(/Permission denied/);
  }, 30_000);

  it('passes a refused exec’s message on to the user', async () => {
    // OpenSSH's sftp prints its own words for a status (and for some, such as ls's, not even those).
    const result = await sftp('mkdir /hub/default/locked/app/tmp/x');
    expect(result.code).not.toBe(0);
    expect(result.stderr).toMatch(/Permission denied/);
    await withClient('alice', async (client) => {
      const err = await failureOf((done) => client.stat('/hub/default/locked/app/etc', done));
      expect(err.code).toBe(ssh2.utils.sftp.STATUS_CODE.PERMISSION_DENIED);
      expect(err.message).toBe(FORBIDDEN);
    });
  }, 30_000);

  it('lists a name with a newline whole', async () => {
    const d = dir('newline');
    writeFileSync(join(d, 'two\nlines'), 'x');
    writeFileSync(join(d, '-starts with a dash'), 'y');
    await withClient('alice', async (client) => {
      const names = await new Promise<string[]>((resolve, reject) =>
        client.readdir(inside(d), (err, list) =>
          err ? reject(err) : resolve(list.map((e) => e.filename).sort()),
        ),
      );
      // (ssh2's readdir leaves out `.` and `..`.)
      expect(names).toEqual(['-starts with a dash', 'two\nlines']);
    });
  }, 30_000);

  it('writes out of order within its bound, and refuses beyond it', async () => {
    const d = dir('out-of-order');
    await withClient('tight', async (client) => {
      const handle = await call<Buffer>((done) => client.open(`${inside(d)}/f`, 'w', done));
      await Promise.all([
        call((done) => client.write(handle, Buffer.from('world'), 0, 5, 6, done)),
        call((done) => client.write(handle, Buffer.from('hello '), 0, 6, 0, done)),
      ]);
      await call((done) => client.close(handle, done));
      expect(readFileSync(join(d, 'f'), 'utf8')).toBe('hello world');

      // 16 KiB writes from 16 KiB on, with byte 0 never written: 16 fit in the 256 KiB bound, the 17th does not.
      // (ssh2's client sends a write of more than 31,952 bytes as two, the second once the first is answered.)
      const second = await call<Buffer>((done) => client.open(`${inside(d)}/g`, 'w', done));
      const far = Buffer.alloc(16 * 1024, 1);
      const writes: Promise<unknown>[] = [];
      for (let i = 1; i <= 17; i++) {
        const write = call((done) => client.write(second, far, 0, far.length, i * far.length, done));
        writes.push(
          write.then(
            () => 'ok',
            (err: Error) => err.message,
          ),
        );
      }
      expect(await writes[16]).toMatch(/bytes of writes waiting/);
      // Closing writes what is held, leaving the bytes never sent as a hole.
      await call((done) => client.close(second, done));
      expect(await Promise.all(writes.slice(0, 16))).toEqual(Array(16).fill('ok'));
      const g = readFileSync(join(d, 'g'));
      expect(g.length).toBe(17 * far.length);
      expect(g.subarray(0, far.length).every((b) => b === 0)).toBe(true);
      expect(g.subarray(far.length).every((b) => b === 1)).toBe(true);
    });
  }, 30_000);

  it('holds a bounded number of handles, opened one by one or all at once', async () => {
    const d = dir('handles');
    writeFileSync(join(d, 'f'), 'x');
    await withClient('tight', async (client) => {
      const opens = Array.from({ length: 6 }, () =>
        call<Buffer>((done) => client.open(`${inside(d)}/f`, 'r', done)).then(
          () => 'ok',
          (err: Error) => err.message,
        ),
      );
      const results = await Promise.all(opens);
      expect(results.filter((r) => r === 'ok')).toHaveLength(4);
      expect(results.filter((r) => /at most 4 files/.test(r))).toHaveLength(2);
    });
  }, 30_000);

  it('reads no further ahead than its bound while the client does not ask', async () => {
    await withClient('alice', async (client) => {
      const handle = await call<Buffer>((done) => client.open(inside('/dev/zero'), 'r', done));
      const zero = containers.spawned.findLast((s) => s.argv.includes('/dev/zero'))!;
      const got = await call<number>((done) => client.read(handle, Buffer.alloc(32768), 0, 32768, 0, done));
      expect(got).toBe(32768);
      // The reader refills its read-ahead, pauses, and the pause stops the pipe: once the stream the reader holds is
      // paused with its buffer full, nothing more passes the count, however long one waits.
      const stdout = zero.stdout!;
      await eventually(() => {
        expect(stdout.isPaused()).toBe(true);
        expect(stdout.readableLength).toBeGreaterThanOrEqual(stdout.readableHighWaterMark);
      });
      // 1 MiB of read-ahead, and what the streams between hold; unpaused, cat would have sent gigabytes.
      expect(zero.read).toBeGreaterThanOrEqual(1024 * 1024);
      expect(zero.read).toBeLessThan(2 * 1024 * 1024);
      await call((done) => client.close(handle, done));
      await eventually(() => expect(zero.ended).toBeDefined());
    });
  }, 30_000);

  it('ends every command of a session when its client goes away mid-transfer', async () => {
    const d = dir('cut');
    writeFileSync(join(d, 'big.bin'), randomBytes(5 * 1024 * 1024));
    const before = containers.spawned.length;
    const local = join(work, 'cut.bin');
    const batch = join(work, 'cut-batch');
    writeFileSync(batch, `get ${inside(d, 'slow-0')}/big.bin ${local}\n`);
    const client = spawn('sftp', [...options(), '-b', batch, 'alice@127.0.0.1'], { stdio: 'ignore' });
    const reader = await eventually(() => {
      const found = containers.spawned
        .slice(before)
        .find((s) => s.ref.pod === 'slow-0' && s.argv[0] === 'sh');
      if (!found || !existsSync(local) || statSync(local).size === 0) throw new Error('no transfer yet');
      return found;
    }, 20_000);
    client.kill('SIGKILL');
    await eventually(() =>
      expect(containers.spawned.slice(before).filter((s) => s.ended === undefined)).toEqual([]),
    );
    expect(reader.killed).toBe(true);
    expect(statSync(local).size).toBeLessThan(5 * 1024 * 1024);

    // A file open for writing and one open for reading, and the connection dropped: both commands end.
    const mark = containers.spawned.length;
    await withClient('alice', async (sftpClient, conn) => {
      const w = await call<Buffer>((done) => sftpClient.open(`${inside(d)}/partial`, 'w', done));
      await call((done) => sftpClient.write(w, Buffer.from('start'), 0, 5, 0, done));
      await call<Buffer>((done) => sftpClient.open(`${inside(d)}/big.bin`, 'r', done));
      conn.destroy();
    });
    const mine = containers.spawned.slice(mark);
    expect(mine.filter((s) => s.argv[0] === 'sh')).toHaveLength(2);
    await eventually(() => expect(mine.filter((s) => s.ended === undefined)).toEqual([]));
    expect(mine.filter((s) => s.killed)).toHaveLength(2);
  }, 60_000);

  describe('in a busybox container', () => {
    it('lists, puts, gets, renames, changes modes and times', async () => {
      const d = dir('busybox');
      writeFileSync(join(d, 'a file'), 'hello\n');
      writeFileSync(join(d, 'new\nline'), 'x');
      const local = join(work, 'busybox-local.bin');
      writeFileSync(local, randomBytes(1024 * 1024 + 17));
      utimesSync(local, 1_500_000_000, 1_500_000_000);
      const at = inside(d, 'tools-0', 'busybox');
      const back = join(work, 'busybox-back.bin');
      const result = await sftp(
        `cd "${at}"`,
        'ls -1',
        `put -p ${local} "${at}/up file"`,
        `get "${at}/up file" ${back}`,
        `rename "${at}/up file" ${at}/moved`,
        `chmod 604 ${at}/moved`,
        `mkdir ${at}/sub`,
        `rmdir ${at}/sub`,
        `rm "${at}/a file"`,
      );
      expect(result.stderr).toBe('');
      // OpenSSH's ls prints a name as it is, newline and all.
      expect(result.stdout).toContain('\na file\nnew\nline\n');
      expect(sha256(back)).toBe(sha256(local));
      expect(sha256(join(d, 'moved'))).toBe(sha256(local));
      expect(statSync(join(d, 'moved')).mode & 0o777).toBe(0o604);
      expect(statSync(join(d, 'moved')).mtimeMs).toBe(1_500_000_000_000);
      expect(existsSync(join(d, 'a file'))).toBe(false);
      expect(containers.spawned.some((s) => s.ref.container === 'busybox')).toBe(true);
    }, 60_000);
  });

  /** Runs `body` with an ssh2 SFTP client signed in as `user`. */
  async function withClient(
    user: string,
    body: (client: SFTPWrapper, conn: ssh2.Client) => Promise<void>,
  ): Promise<void> {
    const conn = new ssh2.Client();
    try {
      await new Promise<void>((resolve, reject) => {
        conn.once('ready', resolve).once('error', reject);
        conn.connect({ host: '127.0.0.1', port, username: user, privateKey: readFileSync(key) });
      });
      const client = await call<SFTPWrapper>((done) => conn.sftp(done));
      await body(client, conn);
    } finally {
      conn.end();
    }
  }
});

/**
 * A folder `dir` of links to Debian's busybox, one per applet: a PATH with busybox's commands and no others. Throws,
 * saying what to do, when the package cannot be fetched.
 */
function busyboxApplets(dir: string): string {
  mkdirSync(dir);
  const busybox = join(dir, 'busybox');
  try {
    writeDebianBusybox(busybox);
  } catch (err) {
    throw new Error(
      `busybox-static: ${(err as Error).message}\nThe busybox container runs Debian's busybox-static, the demo ` +
        `image's, and it is fetched the same way: this needs Debian's apt.`,
      { cause: err },
    );
  }
  const applets = spawnSync(busybox, ['--list'], { encoding: 'utf8' });
  if (applets.status !== 0) throw new Error(`busybox --list: ${applets.stderr || applets.error?.message}`);
  for (const applet of applets.stdout.split('\n').filter(Boolean))
    if (applet !== 'busybox') symlinkSync(busybox, join(dir, applet));
  return dir;
}

/**
 * A throwaway ed25519 host key. ssh2 1.17's generator makes one it cannot read back about once in 500 ("Malformed
 * OpenSSH private key", seen here in a loop of 500), so a key is checked and another made if need be.
 */
function hostKey(): string {
  for (let tries = 0; ; tries++) {
    const key = ssh2.utils.generateKeyPairSync('ed25519').private;
    if (!(ssh2.utils.parseKey(key) instanceof Error) || tries === 10) return key;
  }
}

type Done<T> = (err: Error | null | undefined, value: T) => void;

/** A callback API's result as a promise. */
function call<T = void>(start: (done: Done<T>) => void): Promise<T> {
  return new Promise((resolve, reject) => start((err, value) => (err ? reject(err) : resolve(value))));
}

/** The error a callback API fails with, with SFTP's status code. */
function failureOf(start: (done: (err?: Error | null) => void) => void): Promise<Error & { code?: number }> {
  return new Promise((resolve, reject) =>
    start((err) => (err ? resolve(err) : reject(new Error('expected a failure')))),
  );
}
