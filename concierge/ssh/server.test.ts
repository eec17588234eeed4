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
import { opensshOptions, runOpenSSH, type OpenSSHResult } from '../../dev/openssh.ts';
import { newInProcessDoor, type InProcessDoor } from './in-process.ts';
import { parseTrustedCAKeys } from '../../lib/ssh/keys.ts';
import { addressKey, newSshServer, type SshServer } from './server.ts';

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
      wss.handleUpgrade(req, socket, head, (ws) => {
        const argv = new URL(req.url ?? '/', 'http://x').searchParams.getAll('command');
        const child = spawn(argv[0]!, argv.slice(1));
        child.on('error', () => ws.terminate());
        child.stdout.on('data', (c: Buffer) => ws.send(Buffer.concat([Buffer.of(1), c])));
        child.stderr.on('data', (c: Buffer) => ws.send(Buffer.concat([Buffer.of(2), c])));
        child.stdin.on('error', () => {});
        ws.on('message', (data: Buffer) => {
          if (data[0] === 0) child.stdin.write(data.subarray(1));
          else if (data[0] === 255 && data[1] === 0) child.stdin.end();
        });
        ws.on('close', () => child.kill('SIGKILL'));
        child.once('close', (code) => {
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

function startServer(limits: Parameters<typeof newSshServer>[0]['limits'] = {}): Promise<SshServer> {
  const made = newSshServer({
    hostKeys: [readFileSync(join(dir, 'host'), 'utf8')],
    settings: () => ({
      hubName: 'hub',
      certificateAuthorities: parseTrustedCAKeys([readFileSync(join(dir, 'ca.pub'), 'utf8')]).keys,
      groupsExtension: 'groups@sealion.dev',
    }),
    door,
    cache: { providerOf: () => undefined } as never,
    bindings: { find: () => undefined, bind: () => Promise.resolve() },
    groupSuffix: 'sealion.dev',
    clusterNames: () => [],
    log: silentLogger(),
    limits,
  });
  return Promise.resolve(made);
}

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-ssh-server-'));
  for (const name of ['host', 'ca', 'user'])
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
  server = await startServer();
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
    await new Promise((r) => setTimeout(r, 1500));
    expect(inside.opened).toBe(before.opened + 1);
    child.kill('SIGKILL');
    const deadline = Date.now() + 10_000;
    while (inside.closed < before.closed + 1 && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 50));
    expect(inside.closed).toBe(before.closed + 1);
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
  it('drops a connection that never speaks at its grace time, and destroys those over the bound at once', async () => {
    const strict = await startServer({ loginGraceMs: 300, unauthenticatedPerAddress: 2 });
    const at = await strict.listen(0, '127.0.0.1');
    const open = (): Promise<{ socket: Socket; closed: Promise<number> }> =>
      new Promise((done) => {
        const started = Date.now();
        const socket = connect({ port: at, host: '127.0.0.1' }, () =>
          done({ socket, closed: new Promise((c) => socket.once('close', () => c(Date.now() - started))) }),
        );
        socket.on('error', () => {});
        socket.resume();
      });
    const [a, b, c] = [await open(), await open(), await open()];
    // The third is over the bound: destroyed without waiting.
    expect(await c.closed).toBeLessThan(300);
    // The first two said nothing: gone at their grace time, without the peer closing its side.
    expect(await a.closed).toBeGreaterThanOrEqual(250);
    await b.closed;
    await strict.close();
  });

  it('counts IPv6 addresses by their /64', () => {
    expect(addressKey('2001:db8:1:2:aaaa::1')).toBe(addressKey('2001:db8:1:2:bbbb::2'));
    expect(addressKey('2001:db8:1:3::1')).not.toBe(addressKey('2001:db8:1:2::1'));
    expect(addressKey('::ffff:10.1.2.3')).toBe('10.1.2.3');
  });
});

describe('signing in', () => {
  it('refuses a key no certificate or binding vouches for, as SSH refuses any', async () => {
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, 'stranger')]);
    const r = await ssh(['true'], '', 'stranger');
    expect(r.code).toBe(255);
  });
});
