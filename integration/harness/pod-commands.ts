// The commands people run against pods after `get`, as jest cases for one way in (the proxy, or a cluster's
// tunnel): exec with and without a terminal, attach, logs -f, port-forward, cp both ways and debug, each over
// WebSocket and over SPDY (kubectl's KUBECTL_REMOTE_COMMAND_WEBSOCKETS and KUBECTL_PORT_FORWARD_WEBSOCKETS), and a
// user the cluster's RBAC refuses pods/exec, who gets the API server's 403.
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { newTerminalFilter } from '../../concierge/recording/terminal-filter.ts';
import { runKubectl, type KubectlResult } from '../../dev/cluster.ts';
import { eventually } from '../../dev/eventually.ts';
import { DEMO_IMAGE } from '../../dev/image.ts';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_POD,
  DEMO_USER,
  type InstalledSealion,
} from '../../dev/installed.ts';
import { dieWithParent, runSealion, stopChild, waitForOutput } from '../../dev/processes.ts';

export interface PodTarget {
  kubectl: string;
  /** The demo user's kubeconfig for this way in. */
  kubeconfig: string;
  /** The demo user's kubeconfig for the hub, where the recordings are read (dev/installed.ts lets the demo user). */
  hubKubeconfig: string;
  /** A user whose RBAC has no pods/exec in the demo namespace, same way in. */
  refusedKubeconfig: string;
}

const PROTOCOLS = [
  {
    name: 'WebSocket',
    env: { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'true', KUBECTL_PORT_FORWARD_WEBSOCKETS: 'true' },
  },
  {
    name: 'SPDY',
    env: { KUBECTL_REMOTE_COMMAND_WEBSOCKETS: 'false', KUBECTL_PORT_FORWARD_WEBSOCKETS: 'false' },
  },
];
/** The port the demo pod's busybox httpd serves on, for port-forward. */
const HTTP_PORT = 8080;

/** Defines the cases; `target()` is called once the environment is up (in the cases, not at definition). */
export function podCommandCases(way: string, target: () => PodTarget): void {
  const kubectl = (
    args: string[],
    env: NodeJS.ProcessEnv,
    opts: { input?: string; timeoutMs?: number } = {},
  ) => {
    const t = target();
    return runKubectl(t.kubectl, t.kubeconfig, ['-n', DEMO_NAMESPACE, ...args], { ...opts, env });
  };
  const ok = (result: KubectlResult): KubectlResult => {
    if (result.code !== 0) throw new Error(`kubectl exited ${result.code}: ${result.stderr}`);
    return result;
  };

  describe.each(PROTOCOLS)(`pods through ${way}, over $name`, ({ name, env }) => {
    it('exec: output, errors and the exit code come back', async () => {
      const result = await kubectl(
        ['exec', DEMO_POD, '--', 'sh', '-c', 'echo out; echo err >&2; exit 3'],
        env,
      );
      expect(result.code).toBe(3);
      expect(result.stdout).toBe('out\n');
      expect(result.stderr).toContain('err\n');
    });

    it('exec: 1 MiB of input arrives whole', async () => {
      const input = randomBytes(512 * 1024).toString('hex');
      const result = ok(await kubectl(['exec', '-i', DEMO_POD, '--', 'sh', '-c', 'wc -c'], env, { input }));
      expect(result.stdout.trim()).toBe(String(input.length));
    });

    it('exec with a terminal: an interactive shell answers', async () => {
      // script(1) gives kubectl a real terminal, as a person's has.
      const t = target();
      const command = [
        t.kubectl,
        `--kubeconfig=${t.kubeconfig}`,
        '-n',
        DEMO_NAMESPACE,
        'exec',
        '-it',
        DEMO_POD,
        '--',
        'sh',
      ];
      const marker = `recorded-${randomBytes(4).toString('hex')}`;
      const result = await runInTerminal(command, `echo ${marker} $((6*7)); exit\n`, env);
      expect(result).toContain(`${marker} 42`);
      // The session was recorded where it landed, and its replay, through any replica, shows what the terminal
      // showed, byte for byte, less what playback keeps from the viewer's terminal: the shell asks the terminal
      // where its cursor is (`ESC [6n`) after each prompt, and a replay must not make the viewer's terminal answer.
      const replay = await recordedSession(t, marker);
      expect(replay).toContain(`${marker} 42`);
      expect(replay).not.toContain('\x1b[6n');
      expect(shownOnReplay(result)).toContain(replay);
    });

    it('attach and logs -f follow the pod as it writes', async () => {
      for (const args of [
        ['attach', DEMO_POD],
        ['logs', '-f', DEMO_POD],
      ]) {
        // Both run until stopped: what they printed within the time is what counts.
        const result = await kubectl(args, env, { timeoutMs: 12_000 });
        expect(result.stdout).toMatch(/tick \d+/);
      }
    });

    it('port-forward reaches a server in the pod', async () => {
      const t = target();
      const [command, args] = dieWithParent(t.kubectl, [
        `--kubeconfig=${t.kubeconfig}`,
        '-n',
        DEMO_NAMESPACE,
        'port-forward',
        `pod/${DEMO_POD}`,
        `:${HTTP_PORT}`,
      ]);
      const child = spawn(command, args, {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { ...process.env, ...env },
      });
      try {
        const { output } = await waitForOutput(child, /Forwarding from 127\.0\.0\.1:(\d+)/);
        const port = Number(/127\.0\.0\.1:(\d+)/.exec(output)![1]);
        for (let i = 0; i < 3; i++)
          expect(await httpGet(port, '/index.html')).toBe(`hello from ${DEMO_POD}\n`);
      } finally {
        await stopChild(child);
      }
    });

    it('cp copies a file into the pod and back', async () => {
      const dir = mkdtempSync(join(tmpdir(), 'sealion-cp-'));
      try {
        const payload = randomBytes(300 * 1024);
        writeFileSync(join(dir, 'up.bin'), payload);
        const remote = `/tmp/copied-${name}.bin`;
        ok(await kubectl(['cp', join(dir, 'up.bin'), `${DEMO_POD}:${remote}`], env));
        ok(await kubectl(['cp', `${DEMO_POD}:${remote}`, join(dir, 'down.bin')], env));
        expect(readFileSync(join(dir, 'down.bin')).equals(payload)).toBe(true);
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    });

    it('debug: an ephemeral container joins the pod, and its output comes back', async () => {
      const container = `debug-${name.toLowerCase()}-${Date.now()}`;
      // Not attached: a container this short can finish before an attach is up (attach has its own case).
      const args = ['debug', DEMO_POD, `--image=${DEMO_IMAGE}`, '-c', container, '--attach=false'];
      ok(await kubectl([...args, '--', 'sh', '-c', 'echo debug-ok; sleep 60'], env));
      await eventually(async () => {
        const logs = await kubectl(['logs', DEMO_POD, '-c', container], env);
        if (!logs.stdout.includes('debug-ok')) throw new Error(`its log: ${logs.stdout}${logs.stderr}`);
      }, 60_000);
    });

    it("a user without pods/exec gets the API server's 403", async () => {
      const t = target();
      const result = await runKubectl(
        t.kubectl,
        t.refusedKubeconfig,
        ['-n', DEMO_NAMESPACE, 'exec', DEMO_POD, '--', 'true'],
        { env },
      );
      expect(result.code).not.toBe(0);
      expect(result.stderr).toMatch(
        /forbidden: User "viewer@sealion.dev" cannot (create|get) resource "pods\/exec"/,
      );
    });
  });
}

/**
 * The way in to the demo pod on the hub (through the proxy) or on `cluster` (through its tunnel): kubeconfigs in
 * `dir` for the demo user and for a viewer whom that cluster's RBAC refuses pods/exec, with the demo pod serving
 * HTTP for port-forward.
 */
export async function demoTarget(
  installed: InstalledSealion,
  dir: string,
  cluster?: string,
): Promise<PodTarget> {
  const where = cluster ? installed.edge : installed.hub;
  const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
  const viewer = await installed.issuer.mint({ username: 'viewer@sealion.dev', groups: ['demo-viewers'] });
  const bound = await where.kubectl([
    'create',
    'rolebinding',
    'viewers',
    '-n',
    DEMO_NAMESPACE,
    '--clusterrole=view',
    '--group=demo-viewers',
  ]);
  if (bound.code !== 0) throw new Error(bound.stderr);
  writeFileSync(join(dir, 'demo.kubeconfig'), await installed.kubeconfig(token, cluster));
  writeFileSync(join(dir, 'hub.kubeconfig'), await installed.kubeconfig(token));
  writeFileSync(join(dir, 'viewer.kubeconfig'), await installed.kubeconfig(viewer, cluster));
  const target = {
    kubectl: where.binaries.kubectl,
    kubeconfig: join(dir, 'demo.kubeconfig'),
    hubKubeconfig: join(dir, 'hub.kubeconfig'),
    refusedKubeconfig: join(dir, 'viewer.kubeconfig'),
  };
  await serveHttpInDemoPod(target);
  return target;
}

/** Starts the demo pod's HTTP server for port-forward (busybox httpd, which goes on in the background). */
async function serveHttpInDemoPod(t: PodTarget): Promise<void> {
  const script = `mkdir -p /tmp/www && echo "hello from $(hostname)" > /tmp/www/index.html && httpd -p ${HTTP_PORT} -h /tmp/www`;
  const result = await runKubectl(t.kubectl, t.kubeconfig, [
    '-n',
    DEMO_NAMESPACE,
    'exec',
    DEMO_POD,
    '--',
    'sh',
    '-c',
    script,
  ]);
  if (result.code !== 0) throw new Error(`starting httpd in the demo pod: ${result.stderr}`);
}

function httpGet(port: number, path: string): Promise<string> {
  return new Promise((done, fail) => {
    const req = get({ host: '127.0.0.1', port, path, timeout: 10_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => done(body));
    });
    req.on('timeout', () => req.destroy(new Error('no answer through port-forward')));
    req.on('error', fail);
  });
}

/**
 * Runs a command in a pseudo-terminal (script from util-linux), typing `input` once it shows its first output (a
 * prompt); returns what the terminal showed. The words of `command` must need no shell quoting.
 */
/** Terminal output as `sealion recordings play` shows it: through the same filter, from the first byte. */
function shownOnReplay(output: string): string {
  const filter = newTerminalFilter();
  return filter.write(output) + filter.end();
}

/**
 * What the recording of the session that printed `marker` shows when played back (`sealion recordings play`), found
 * with `sealion recordings list` as the demo user: the newest recording whose file holds the marker.
 */
async function recordedSession(t: PodTarget, marker: string): Promise<string> {
  const sealion = async (...args: string[]): Promise<string> => {
    const result = await runSealion([...args, '--kubeconfig', t.hubKubeconfig]);
    if (result.code !== 0) throw new Error(`sealion ${args.join(' ')}: ${result.stderr}`);
    return result.stdout;
  };
  return eventually(async () => {
    const ids = (await sealion('recordings', 'list'))
      .split('\n')
      .slice(1)
      .map((line) => line.split(/\s+/)[0]!)
      .filter((id) => /^[0-9a-f-]{36}$/.test(id));
    for (const id of ids) {
      const raw = await sealion('recordings', 'play', id, '--raw');
      if (!raw.includes(marker)) continue;
      // Played back as fast as it goes: the bytes the terminal was sent, in order.
      return sealion('recordings', 'play', id, '--speed', '1000');
    }
    throw new Error(`no recording holds ${marker} among ${ids.length}`);
  }, 20_000);
}

export function runInTerminal(
  command: string[],
  input: string,
  env: NodeJS.ProcessEnv = {},
): Promise<string> {
  return new Promise((done, fail) => {
    const child = spawn('script', ['-qec', command.join(' '), '/dev/null'], {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, ...env },
    });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString('utf8')));
    const timer = setTimeout(() => child.kill('SIGKILL'), 60_000);
    child.on('error', fail);
    child.on('exit', () => {
      clearTimeout(timer);
      done(output);
    });
    // The shell's prompt first, then the input, as a person types.
    child.stdout.once('data', () => child.stdin.end(input));
  });
}
