// `npm start` as a person uses it: it comes up, the commands it prints work as printed, Ctrl-C removes everything.
import { afterEach, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { get } from 'node:http';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parse } from 'yaml';
import { approveDevice, runWithLogin, type LoginRun } from '../dev/browser.ts';
import { REPO_ROOT, ensureBinaries } from '../dev/build.ts';
import { runKubectl } from '../dev/cluster.ts';
import { eventually } from '../dev/eventually.ts';
import { runOpenSSH } from '../dev/openssh.ts';
import { dieWithParent, processesUsing, stopChild, waitForOutput } from '../dev/processes.ts';
import { runInTerminal } from './harness/pod-commands.ts';

/**
 * An exec into edge's demo pod (a real container, through edge's agent) under the printed access request's grant ends
 * when the request is withdrawn, with the message that says so, as kubectl prints it.
 */
async function sessionEndsWithGrant(
  kubectl: string,
  sealion: string,
  env: Record<string, string>,
  printed: { kubeconfig: string; args: string[] }[],
): Promise<void> {
  const create = printed.find((c) => c.args[0] === 'request' && c.args[1] === 'create')!;
  const name = create.args[create.args.indexOf('--name') + 1]!;
  const userKubeconfig = create.args[create.args.indexOf('--kubeconfig') + 1]!;
  // The command printed after the approval, which the grant allows on edge.
  const onEdge = printed.filter((c) => c.kubeconfig && c.args.includes('configmap')).at(-1)!;
  const namespace = onEdge.args[onEdge.args.indexOf('-n') + 1]!;
  const [command, args] = dieWithParent(kubectl, [
    `--kubeconfig=${onEdge.kubeconfig}`,
    '-n',
    namespace,
    'exec',
    'demo',
    '--',
    'sh',
    '-c',
    'echo started; sleep 600',
  ]);
  const session = spawn(command, args, {
    cwd: REPO_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, ...env },
  });
  const exited = new Promise<number | null>((done) => session.once('exit', done));
  try {
    let stderr = '';
    session.stderr.on('data', (chunk: Buffer | string) => (stderr += String(chunk)));
    await waitForOutput(session, /started/);
    const withdrawn = await sealionWithBrowser(
      sealion,
      ['request', 'withdraw', name, '--kubeconfig', userKubeconfig],
      env,
    );
    expect(withdrawn).toMatchObject({ code: 0 });
    expect(await exited).not.toBe(0);
    expect(stderr).toContain(
      `sealion: access request ${name} was withdrawn; your access through it has ended`,
    );
  } finally {
    await stopChild(session);
  }
}

describe('npm start', () => {
  /** Stops what the test started, however the test ended (a failed expectation, or jest's timeout). */
  let stop = (): Promise<void> => Promise.resolve();
  afterEach(() => stop());

  it('prints kubectl commands that work as printed, and leaves nothing behind after Ctrl-C', async () => {
    const { kubectl } = await ensureBinaries();
    // If this process dies, dev up is told to stop as by Ctrl-C, and takes its clusters down.
    const [command, args] = dieWithParent(process.execPath, [join(REPO_ROOT, 'dev/up.ts')], 'SIGTERM');
    const child = spawn(command, args, {
      cwd: REPO_ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
      // Its own process group, so that Ctrl-C can be sent as a terminal sends it: to the whole group.
      detached: true,
    });
    const exited = new Promise<number | null>((done) => child.once('exit', done));
    // Ctrl-C, then a kill of the whole group if it lingers; nothing if it has exited.
    stop = () => stopChild(child, { signal: 'SIGINT', group: true, graceMs: 15_000 });
    const interrupt = (): void => {
      // As a terminal sends Ctrl-C: to the whole process group.
      process.kill(-child.pid!, 'SIGINT');
    };
    const { output } = await waitForOutput(child, /Press Ctrl-C/);
    const clusterDir = /--kubeconfig (\/\S+)\/admin\.kubeconfig/.exec(output)![1]!;
    // Every printed demo command, run as printed and in order (with the harness's kubectl), from the repository
    // root, with a credential cache of its own.
    const home = mkdtempSync(join(tmpdir(), 'sealion-dev-up-'));
    const env = { XDG_CONFIG_HOME: home };
    // The CLI as printed: the shim in the folder the printed PATH line names.
    const sealion = join(/^ {2}export PATH=(\S+):"\$PATH"$/m.exec(output)![1]!, 'sealion');
    const printed = [
      ...output.matchAll(/^ {2}(?:kubectl --kubeconfig (\S+)|sealion) (.+?)(?:\s+# (.+))?$/gm),
    ].map((m) => ({
      kubeconfig: m[1] ? resolve(REPO_ROOT, m[1]) : '',
      args: m[2]!.trim().split(/\s+/),
      expect: m[3] ?? '',
    }));
    expect(printed.filter((c) => c.kubeconfig).length).toBeGreaterThanOrEqual(3);
    // The controller on the hub is among them: its kubeconfig, its Deployment, and kubectl run inside it.
    expect(printed.map((c) => c.args.slice(0, 2).join(' '))).toContain('cluster kubeconfig');
    expect(
      printed.filter((c) => c.args.includes('exec') && c.args.includes('deployment/deployer')),
    ).toHaveLength(2);
    // `sealion request create … --wait` waits for the reviewer's approval, printed after it: it runs meanwhile.
    let waiting: Promise<LoginRun> | undefined;
    for (const c of printed) {
      if (c.args[0] === 'request' && c.args.includes('--wait')) {
        waiting = sealionWithBrowser(sealion, c.args, env);
        continue;
      }
      if (c.args[0] === 'request' && c.args[1] === 'approve') {
        // The request exists once the waiting command has created it.
        await eventually(
          async () => expect(await sealionWithBrowser(sealion, c.args, env)).toMatchObject({ code: 0 }),
          60_000,
          1_000,
        );
        expect(await waiting).toMatchObject({ code: 0 });
        waiting = undefined;
        continue;
      }
      if (c.args[0] === 'port-forward') {
        // Runs until stopped: the port it prints answers with the Service's HTTP server on that cluster.
        const [pfCommand, pfArgs] = dieWithParent(sealion, c.args);
        const forward = spawn(pfCommand, pfArgs, {
          cwd: REPO_ROOT,
          stdio: ['ignore', 'pipe', 'pipe'],
          env: { ...process.env, ...env },
        });
        try {
          const { match } = await waitForOutput(forward, /Forwarding from 127\.0\.0\.1:(\d+)/);
          const where = c.args.some((a) => a.includes('edge')) ? 'edge' : 'hub';
          expect(await httpGet(Number(match[1]))).toBe(`hello from ${where}\n`);
        } finally {
          await stopChild(forward);
        }
        continue;
      }
      if (!c.kubeconfig && c.args.includes('>')) {
        // The CLI's output into a file, as the shell would put it there.
        const to = c.args.indexOf('>');
        const result = await sealionWithBrowser(sealion, c.args.slice(0, to), env);
        expect(result).toMatchObject({ code: 0 });
        writeFileSync(resolve(REPO_ROOT, c.args[to + 1]!), result.stdout);
        continue;
      }
      if (!c.kubeconfig) {
        // The CLI; its OIDC login prints a URL, which this test opens as the person would.
        const result = await sealionWithBrowser(sealion, c.args, env);
        if (c.args[0] === 'auth') {
          // A "no" from any cluster is exit 1, as kubectl auth can-i's; each row is that cluster's answer.
          expect(result).toMatchObject({ code: 1 });
          expect(result.stdout).toMatch(/^\S+\/hub\s+yes\s+yes\s*$/m);
          expect(result.stdout).toMatch(/^\S+\/edge\s+no\s+no\s*$/m);
          continue;
        }
        expect(result).toMatchObject({ code: 0 });
        if (c.args[0] === 'get' && c.args[1] === 'pods')
          expect(result.stdout).toMatch(/^\S+\/edge\s+.*\bRunning\b/m);
        if (c.args[0] === 'clusters')
          expect(result.stdout).toMatch(/^[ *]*\S+\/edge\s+Ready\s+demo@sealion\.dev/m);
        continue;
      }
      if (c.args.includes('-it')) {
        // A shell in a terminal: typed into, as a person does (script(1) gives kubectl the terminal).
        const typed = await runInTerminal(
          [kubectl, `--kubeconfig=${c.kubeconfig}`, ...c.args],
          'echo $((6*7)); exit\n',
        );
        expect(typed).toContain('42');
        continue;
      }
      if (c.args.includes('-f')) {
        // Follows until stopped: what it printed meanwhile is what counts.
        const followed = await runKubectl(kubectl, c.kubeconfig, c.args, { env, timeoutMs: 12_000 });
        expect(followed.stdout).toMatch(/tick \d+/);
        continue;
      }
      const result = await runKubectl(kubectl, c.kubeconfig, c.args, { env });
      if (c.expect.startsWith('Forbidden')) {
        expect(result.code).not.toBe(0);
        // The demo user, or the hub's controller under the name edge gives it.
        expect(result.stderr).toMatch(
          /is forbidden: User "(demo@sealion\.dev|hub:system:serviceaccount:gitops:deployer)"/,
        );
      } else {
        expect(result).toMatchObject({ code: 0, stderr: '' });
      }
    }
    // The access request was printed with its reviewer's approval: nothing waits on.
    expect(waiting).toBeUndefined();
    expect(printed.map((c) => c.args.slice(0, 2).join(' '))).toEqual(
      expect.arrayContaining(['request create', 'request approve']),
    );
    await sessionEndsWithGrant(kubectl, sealion, env, printed);
    await sshAsPrinted(output, home);
    // Sealion runs as pods of its image on both clusters' nodes.
    const edgeDir = /--kubeconfig (\/\S+sealion-edge\S*)\/admin\.kubeconfig/.exec(output)![1]!;
    const hubPods = await runKubectl(
      kubectl,
      join(clusterDir, 'admin.kubeconfig'),
      podsOf('sealion-concierge'),
    );
    expect(hubPods.stdout).toMatch(/^sealion-concierge-\S+ Running$/m);
    const edgePods = await runKubectl(kubectl, join(edgeDir, 'admin.kubeconfig'), podsOf('sealion-agent'));
    expect(edgePods.stdout).toMatch(/^sealion-agent-\S+ Running$/m);
    expect(processesUsing(clusterDir).length).toBeGreaterThan(0);
    interrupt();
    expect(await exited).toBe(0);
    expect(processesUsing(clusterDir)).toEqual([]);
    expect(processesUsing(edgeDir)).toEqual([]);
    rmSync(home, { recursive: true, force: true });
  }, 360_000);
});

/**
 * Runs the sealion CLI as printed (`sealion` is the shim), from the repository root. When a login it starts prints
 * its URL, the scripted browser signs in there, trusting the issuer CA the kubeconfig names.
 */
function sealionWithBrowser(sealion: string, args: string[], env: NodeJS.ProcessEnv): Promise<LoginRun> {
  const caPem = (): string => readIssuerCA(resolve(REPO_ROOT, args[args.indexOf('--kubeconfig') + 1]!));
  return runWithLogin(sealion, args, {
    caPem,
    env,
    cwd: REPO_ROOT,
  });
}

/**
 * The printed ssh command (`sealion ssh config` wrote its configuration above), with a key of its own and no agent:
 * in BatchMode the key nobody bound is refused at once with how to bind it; one device login (the scripted browser
 * approves the code) binds it, and ssh says until when; then BatchMode works with the key alone.
 */
async function sshAsPrinted(output: string, home: string): Promise<void> {
  const printed = /^ {2}ssh (.+ -- uname -a)\s/m.exec(output)?.[1];
  expect(printed).toBeDefined();
  const words = printed!.trim().split(/\s+/);
  const key = join(home, 'id_ed25519');
  const made = await runOpenSSH('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key]);
  expect(made.code).toBe(0);
  const fingerprint = (await runOpenSSH('ssh-keygen', ['-l', '-f', `${key}.pub`])).stdout.split(' ')[1]!;
  const ssh = (batch: boolean, onStderr?: (stderr: string) => void) =>
    runOpenSSH(
      'ssh',
      [
        '-i',
        key,
        '-o',
        'IdentitiesOnly=yes',
        '-o',
        'IdentityAgent=none',
        '-o',
        `BatchMode=${batch ? 'yes' : 'no'}`,
        ...words,
      ],
      '',
      { timeoutMs: 90_000, ...(onStderr ? { onStderr } : {}) },
    );
  const unbound = await ssh(true);
  expect(unbound.code).toBe(255);
  expect(unbound.stderr).toContain(
    `Sealion: the key ${fingerprint} is not bound to a login yet; a device login binds it, which needs ssh without BatchMode (once: ssh -t <host>).`,
  );
  const caPem = readIssuerCA(resolve(REPO_ROOT, '.sealion/oidc.kubeconfig'));
  let approving: Promise<void> | undefined;
  const login = await ssh(false, (stderr) => {
    const url = /or open (https:\/\/\S+)/.exec(stderr)?.[1];
    if (url && !approving) approving = approveDevice(url, { caPem });
  });
  await approving;
  expect(login).toMatchObject({ code: 0, stdout: expect.stringMatching(/^Linux /) });
  expect(login.stderr).toMatch(
    new RegExp(
      `Sealion: the key ${fingerprint.replace(/[+/]/g, '\\$&')} is bound to demo@sealion\\.dev until \\d{4}-\\d\\d-\\d\\d \\d\\d:\\d\\d UTC\\.`,
    ),
  );
  expect(await ssh(true)).toMatchObject({ code: 0, stdout: expect.stringMatching(/^Linux /) });
}

/** The OIDC issuer's CA that a kubeconfig's login plugin trusts. */
function readIssuerCA(kubeconfig: string): string {
  const exec = (
    parse(readFileSync(kubeconfig, 'utf8')) as { users: { user: { exec: { args: string[] } } }[] }
  ).users[0]!.user.exec;
  return Buffer.from(exec.args[exec.args.indexOf('--ca-bundle-data') + 1]!, 'base64').toString();
}

/** The body of GET / on a local port. */
function httpGet(port: number): Promise<string> {
  return new Promise((done, fail) => {
    get({ host: '127.0.0.1', port, path: '/' }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () => done(body));
    }).on('error', fail);
  });
}

function podsOf(namespace: string): string[] {
  return [
    'get',
    'pods',
    '-n',
    namespace,
    '-o',
    'jsonpath={range .items[*]}{.metadata.name} {.status.phase}{"\\n"}{end}',
  ];
}
