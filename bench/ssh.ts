// `npm run bench -- ssh`: the SSH door beside kubectl, in one run on the installed Sealion (its image on real nodes,
// two concierge replicas). Each round measures every way in, in another order each round:
//   - a command: `true` in the demo pod, from the client's start to its exit, BENCH_SSH_COMMANDS (10) times one after
//     another (what a person or a script waits for: the client's start, sign-in, the exec, the exit);
//   - a file: BENCH_SSH_MIB (64) MiB copied into the pod and back out.
// The ways in: `ssh` and `sftp` through the door (an SSH certificate), and `kubectl exec` and `kubectl cp` through the
// impersonation proxy and straight to the API server (an admin impersonating the same user).
// Targets: a command through the door at most 1.5× kubectl exec's through the proxy; a file at least 0.5× kubectl
// cp's throughput through the proxy.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  DEMO_GROUP,
  DEMO_NAMESPACE,
  DEMO_POD,
  DEMO_USER,
  enableSsh,
  startInstalledSealion,
  stopInstalled,
  type Running,
} from '../dev/installed.ts';
import { opensshOptions, runOpenSSH } from '../dev/openssh.ts';
import { formatNumber, printColumns, saveResults } from './measure.ts';

const COMMANDS = Number(process.env['BENCH_SSH_COMMANDS'] ?? 10);
const MIB = Number(process.env['BENCH_SSH_MIB'] ?? 64);
const ROUNDS = Number(process.env['BENCH_ROUNDS'] ?? 3);
const COMMAND_TARGET = 1.5;
const FILE_TARGET = 0.5;

const median = (values: number[]): number => {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)] ?? NaN;
};

async function timed(run: () => Promise<void>): Promise<number> {
  const started = process.hrtime.bigint();
  await run();
  return Number(process.hrtime.bigint() - started) / 1e6;
}

/** One way in: how it runs a command, and how it copies a file in and out. */
interface Way {
  name: string;
  command: () => Promise<void>;
  copy: (local: string, back: string) => Promise<void>;
}

export async function benchSsh(): Promise<void> {
  const log = (line: string): void => console.error(`[bench] ${line}`);
  const running: Running = {};
  const dir = mkdtempSync(join(tmpdir(), 'sealion-bench-ssh-'));
  try {
    const installed = await startInstalledSealion(running, log);
    const { hub } = installed;
    for (const name of ['ca', 'user'])
      execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(dir, name)]);
    execFileSync('ssh-keygen', [
      '-q',
      ...['-s', join(dir, 'ca'), '-I', 'bench', '-n', DEMO_USER, '-V', '+2h'],
      ...['-O', `extension:groups@sealion.dev=${DEMO_GROUP}`, join(dir, 'user.pub')],
    ]);
    const door = await enableSsh(hub, {
      certificateAuthorities: [readFileSync(join(dir, 'ca.pub'), 'utf8').trim()],
    });
    writeFileSync(join(dir, 'known_hosts'), door.knownHosts);
    const token = await installed.issuer.mint({ username: DEMO_USER, groups: [DEMO_GROUP] });
    const proxyKubeconfig = join(dir, 'demo.kubeconfig');
    writeFileSync(proxyKubeconfig, await installed.kubeconfig(token));
    const options = opensshOptions(join(dir, 'user'), { knownHosts: join(dir, 'known_hosts') });
    const ok = (what: string, r: { code: number | null; stderr: string }): void => {
      if (r.code !== 0) throw new Error(`${what} failed (${r.code}): ${r.stderr.trim()}`);
    };
    const kubectl = async (args: string[], kubeconfig?: string): Promise<void> => {
      const r = await hub.kubectl(args, kubeconfig ? { kubeconfig } : {});
      ok(`kubectl ${args[0]}`, r);
    };
    const asDemo = [`--as=${DEMO_USER}`, `--as-group=${DEMO_GROUP}`];
    const inPod = `/tmp/bench-${MIB}`;
    const remote = `/hub/${DEMO_NAMESPACE}/${DEMO_POD}/${DEMO_POD}${inPod}`;
    const ways: Way[] = [
      {
        name: 'ssh / sftp, the door',
        command: async () =>
          ok(
            'ssh',
            await runOpenSSH('ssh', [
              ...options,
              ...['-p', String(door.port), '-l', DEMO_USER, door.host],
              ...[`hub/${DEMO_NAMESPACE}/${DEMO_POD}`, '--', 'true'],
            ]),
          ),
        copy: async (local, back) => {
          writeFileSync(join(dir, 'batch'), `put ${local} ${remote}\nget ${remote} ${back}\n`);
          ok(
            'sftp',
            await runOpenSSH(
              'sftp',
              [...options, '-P', String(door.port), '-b', join(dir, 'batch'), `${DEMO_USER}@${door.host}`],
              '',
              { timeoutMs: 600_000 },
            ),
          );
        },
      },
      {
        name: 'kubectl, through the proxy',
        command: () => kubectl(['exec', '-n', DEMO_NAMESPACE, DEMO_POD, '--', 'true'], proxyKubeconfig),
        copy: async (local, back) => {
          await kubectl(['cp', local, `${DEMO_NAMESPACE}/${DEMO_POD}:${inPod}`], proxyKubeconfig);
          await kubectl(['cp', `${DEMO_NAMESPACE}/${DEMO_POD}:${inPod}`, back], proxyKubeconfig);
        },
      },
      {
        name: 'kubectl, API server (direct)',
        command: () => kubectl(['exec', '-n', DEMO_NAMESPACE, DEMO_POD, ...asDemo, '--', 'true']),
        copy: async (local, back) => {
          await kubectl(['cp', ...asDemo, local, `${DEMO_NAMESPACE}/${DEMO_POD}:${inPod}`]);
          await kubectl(['cp', ...asDemo, `${DEMO_NAMESPACE}/${DEMO_POD}:${inPod}`, back]);
        },
      },
    ];
    const local = join(dir, 'file');
    writeFileSync(local, randomBytes(MIB << 20));
    const figures = new Map(ways.map((w) => [w.name, { commandMs: [] as number[], mibps: [] as number[] }]));
    // One command each first: logins, caches and connections warm.
    for (const way of ways) await way.command();
    for (let round = 0; round < ROUNDS; round++) {
      const order = ways.map((_, i) => ways[(i + round) % ways.length]!);
      for (const way of order) {
        const f = figures.get(way.name)!;
        const times: number[] = [];
        for (let i = 0; i < COMMANDS; i++) times.push(await timed(way.command));
        f.commandMs.push(median(times));
        const back = join(dir, 'back');
        rmSync(back, { force: true });
        const ms = await timed(() => way.copy(local, back));
        if (statSync(back).size !== MIB << 20) throw new Error(`${way.name}: the copy came back short`);
        f.mibps.push((2 * MIB * 1000) / ms);
        log(
          `round ${round + 1}: ${way.name}: command ${f.commandMs.at(-1)!.toFixed(0)} ms, file ${f.mibps.at(-1)!.toFixed(1)} MiB/s`,
        );
      }
    }
    const proxy = figures.get('kubectl, through the proxy')!;
    const table = [['way in', 'command ms', '× kubectl (proxy)', 'file MiB/s', '× kubectl (proxy)']];
    for (const [name, f] of figures) {
      table.push([
        name,
        formatNumber(median(f.commandMs)),
        formatNumber(median(f.commandMs) / median(proxy.commandMs), 2),
        formatNumber(median(f.mibps), 1),
        formatNumber(median(f.mibps) / median(proxy.mibps), 2),
      ]);
    }
    console.log(
      `\nssh: a command (median of ${COMMANDS}, each from the client's start to its exit) and ${MIB} MiB in and out; median of ${ROUNDS} rounds`,
    );
    printColumns(table, 1);
    const sshFigures = figures.get(ways[0]!.name)!;
    const commandRatio = median(sshFigures.commandMs) / median(proxy.commandMs);
    const fileRatio = median(sshFigures.mibps) / median(proxy.mibps);
    console.log(
      `targets: a command through the door ≤ ${COMMAND_TARGET}× kubectl exec through the proxy: ` +
        `${commandRatio.toFixed(2)}× ${commandRatio <= COMMAND_TARGET ? 'met' : 'MISSED'}; ` +
        `a file ≥ ${FILE_TARGET}× kubectl cp: ${fileRatio.toFixed(2)}× ${fileRatio >= FILE_TARGET ? 'met' : 'MISSED'}`,
    );
    saveResults('ssh', Object.fromEntries(figures));
  } finally {
    await stopInstalled(running);
    rmSync(dir, { recursive: true, force: true });
  }
}
