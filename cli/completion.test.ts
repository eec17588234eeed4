// Shell completion: what the CLI answers for a partial line (read off commander's tree, names from a lookup), and
// the scripts in real shells: bash always, zsh and fish where the machine has them.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile, execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { Argument, Command, Option } from 'commander';
import { stringify } from 'yaml';
import { clusterCommand } from './cluster.ts';
import {
  complete,
  completionScript,
  Directive,
  formatAnswer,
  lookupNames,
  npxHint,
  takesNames,
  type GivenValues,
  type NameKind,
} from './completion.ts';
import { getCommand } from './get-kubeconfig.ts';
import { portForwardCommand } from './port-forward.ts';
import { recordingsCommand } from './recordings.ts';
import { requestCommand } from './request.ts';
import { whoamiCommand } from './whoami.ts';

const run = promisify(execFile);

/** A lookup that answers each kind with fixed names and remembers what the line gave it. */
function fakeLookup(): {
  lookup: (kind: NameKind, given: GivenValues) => Promise<{ value: string }[]>;
  asked: { kind: NameKind; given: Record<string, string> }[];
} {
  const asked: { kind: NameKind; given: Record<string, string> }[] = [];
  const names: Record<NameKind, string[]> = {
    cluster: ['edge-1', 'edge-2', 'lab'],
    authenticator: ['corp', 'hooks'],
    context: ['admin', 'sealion-corp'],
    recording: ['0b8f0c1e'],
    request: ['alice-x7k2p'],
  };
  return {
    asked,
    lookup: (kind, given) => {
      asked.push({ kind, given: Object.fromEntries(given) });
      return Promise.resolve(names[kind].map((value) => ({ value })));
    },
  };
}

/** A small program with every shape the CLI has. */
function toyProgram(): Command {
  const program = new Command('toy');
  const get = program.command('get').description('read things');
  get
    .command('thing')
    .description('one thing')
    .option('--kubeconfig <path>', 'a kubeconfig', '')
    .option('--group-suffix <suffix>', 'API group suffix', 'sealion.dev')
    .addOption(new Option('--mode <mode>', 'how').choices(['direct', 'proxy']))
    .addOption(takesNames('cluster', new Option('--cluster <name>', 'a cluster')))
    .option('--output-dir <dir>', 'where')
    .option('-o, --output <format>', 'text or json')
    .option('--all', 'every one');
  program
    .command('remove')
    .addArgument(takesNames('cluster', new Argument('<name>', 'the cluster')))
    .option('--kubeconfig <path>', 'a kubeconfig', '');
  program.command('hidden-one', { hidden: true });
  return program;
}

const values = (answer: { candidates: { value: string }[] }): string[] =>
  answer.candidates.map((c) => c.value);

describe('complete', () => {
  it.each([
    { line: [''], want: ['get', 'remove', 'help'], directive: Directive.NoFileComp },
    { line: ['g'], want: ['get'], directive: Directive.NoFileComp },
    { line: ['get', ''], want: ['thing', 'help'], directive: Directive.NoFileComp },
    {
      line: ['get', 'thing', '--'],
      want: [
        '--kubeconfig',
        '--group-suffix',
        '--mode',
        '--cluster',
        '--output-dir',
        '--output',
        '--all',
        '--help',
      ],
      directive: Directive.NoFileComp,
    },
    // An option on the line already is not offered again.
    { line: ['get', 'thing', '--all', '--a'], want: [], directive: Directive.NoFileComp },
    { line: ['get', 'thing', '--mode', ''], want: ['direct', 'proxy'], directive: Directive.NoFileComp },
    { line: ['get', 'thing', '--mode=p'], want: ['proxy'], directive: Directive.NoFileComp },
    { line: ['get', 'thing', '--kubeconfig', 'x'], want: [], directive: Directive.Default },
    { line: ['get', 'thing', '--output-dir', ''], want: [], directive: Directive.FilterDirs },
    {
      line: ['get', 'thing', '--cluster', 'edge'],
      want: ['edge-1', 'edge-2'],
      directive: Directive.NoFileComp,
    },
    { line: ['get', 'thing', '--cluster=l'], want: ['lab'], directive: Directive.NoFileComp },
    // A value that looks like a subcommand is the option's, not a command.
    { line: ['get', 'thing', '-o', 'get', '--m'], want: ['--mode'], directive: Directive.NoFileComp },
    { line: ['remove', ''], want: ['edge-1', 'edge-2', 'lab'], directive: Directive.NoFileComp },
    // After the argument there is nothing more to say; after `--` no option either.
    { line: ['remove', 'lab', ''], want: [], directive: Directive.NoFileComp },
    { line: ['remove', '--', '--k'], want: [], directive: Directive.NoFileComp },
    { line: ['nothing', ''], want: [], directive: Directive.NoFileComp },
  ])('$line', async ({ line, want, directive }) => {
    const answer = await complete(toyProgram(), line, fakeLookup().lookup);
    expect(values(answer)).toEqual(want);
    expect(answer.directive).toBe(directive);
  });

  it('hands the lookup what the line gave: the kubeconfig, the group suffix, in any spelling', async () => {
    const { lookup, asked } = fakeLookup();
    await complete(
      toyProgram(),
      ['get', 'thing', '--kubeconfig=/tmp/k', '--group-suffix', 'pinniped.dev', '--all', '--cluster', ''],
      lookup,
    );
    expect(asked).toEqual([
      { kind: 'cluster', given: { kubeconfig: '/tmp/k', groupSuffix: 'pinniped.dev', all: '' } },
    ]);
  });

  it('offers no names when the lookup fails, and no file names instead', async () => {
    const answer = await complete(toyProgram(), ['remove', ''], () =>
      Promise.reject(new Error('no cluster')),
    );
    expect(answer).toEqual({ candidates: [], directive: Directive.NoFileComp });
  });

  it('finds the names the real commands take, from their own definitions', async () => {
    const program = new Command('sealion');
    for (const command of [
      getCommand(),
      clusterCommand(),
      portForwardCommand(),
      recordingsCommand(),
      requestCommand(),
      whoamiCommand(),
    ])
      program.addCommand(command);
    const cases: [string[], NameKind | string[]][] = [
      [['get', 'kubeconfig', '--cluster', ''], 'cluster'],
      [['get', 'kubeconfig', '--authenticator-type', 'jwt', '--authenticator-name', ''], 'authenticator'],
      [
        ['get', 'kubeconfig', '--mode', ''],
        ['direct', 'proxy'],
      ],
      [['get', 'kubeconfig', '--authenticator-type=w'], ['webhook']],
      [['cluster', 'remove', ''], 'cluster'],
      [['cluster', 'revoke', '--kubeconfig', 'admin', ''], 'cluster'],
      [['port-forward', '--cluster', ''], 'cluster'],
      [['port-forward', '--context', ''], 'context'],
      [['recordings', 'play', ''], 'recording'],
      [['request', 'approve', ''], 'request'],
      [['request', 'deny', '--reason', 'no', ''], 'request'],
      [['request', 'withdraw', ''], 'request'],
      [['request', 'wait', '--timeout', '1m', ''], 'request'],
      [['request', 'create', '--cluster', ''], 'cluster'],
      [
        ['request', 'list', '-o', ''],
        ['table', 'json', 'yaml'],
      ],
      [
        ['whoami', '-o', ''],
        ['table', 'json', 'yaml'],
      ],
    ];
    for (const [line, want] of cases) {
      const { lookup, asked } = fakeLookup();
      const answer = await complete(program, line, lookup);
      if (Array.isArray(want)) expect({ line, values: values(answer) }).toEqual({ line, values: want });
      else expect({ line, asked: asked.map((a) => a.kind) }).toEqual({ line, asked: [want] });
    }
    const { lookup, asked } = fakeLookup();
    await complete(
      program,
      ['get', 'kubeconfig', '--authenticator-type', 'jwt', '--authenticator-name', ''],
      lookup,
    );
    expect(asked[0]!.given).toEqual({ authenticatorType: 'jwt' });
  });
});

describe('npxHint', () => {
  it('says, run through npx, that the script completes the command itself, and how to get it', () => {
    const npx = { npm_command: 'exec' };
    expect(npxHint('sealion', npx, true)).toBe(
      'sealion: completion does not complete npx sealion: the script completes the command sealion; npm run shim in ' +
        'the checkout writes a sealion command and prints how to put it on PATH',
    );
    expect(npxHint('sealion', npx, false)).toBe(
      'sealion: completion does not complete npx sealion: the script completes the command sealion; install the CLI ' +
        'so that sealion is on PATH',
    );
    expect(npxHint('sealion', {}, true)).toBeUndefined();
    expect(npxHint('sealion', { npm_command: 'run-script' }, true)).toBeUndefined();
  });
});

describe('formatAnswer', () => {
  it("writes cobra's lines, and leaves out a value that would break a line or a shell word", () => {
    expect(
      formatAnswer({
        candidates: [
          { value: 'edge-1', description: 'connected' },
          { value: 'lab' },
          { value: 'two words' },
          { value: 'new\nline' },
          { value: 'x', description: 'tab\there' },
        ],
        directive: Directive.NoFileComp,
      }),
    ).toBe('edge-1\tconnected\nlab\nx\ttab here\n:4\n');
  });
});

describe('lookupNames', () => {
  let dir: string;
  let silent: Server;
  const sockets = new Set<Socket>();

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-completion-'));
    // Accepts connections and never answers: a cluster that hangs.
    silent = createServer((socket) => {
      sockets.add(socket);
      socket.on('close', () => sockets.delete(socket));
    });
    await new Promise<void>((done) => silent.listen(0, '127.0.0.1', done));
  });

  afterAll(async () => {
    for (const socket of sockets) socket.destroy();
    await new Promise((done) => silent.close(done));
    rmSync(dir, { recursive: true, force: true });
  });

  /** A kubeconfig with a context per server; its user runs `exec` when given, else has a token. */
  function kubeconfig(name: string, servers: Record<string, string>, exec?: string): string {
    const path = join(dir, name);
    writeFileSync(
      path,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: Object.entries(servers).map(([n, server]) => ({ name: n, cluster: { server } })),
        users: [
          {
            name: 'me',
            user: exec
              ? { exec: { apiVersion: 'client.authentication.k8s.io/v1', command: exec } }
              : { token: 'abc' },
          },
        ],
        contexts: Object.keys(servers).map((n) => ({ name: n, context: { cluster: n, user: 'me' } })),
        'current-context': Object.keys(servers)[0],
      }),
    );
    return path;
  }

  it("offers the contexts, and the agent-backed clusters the servers' paths name, without starting a login", async () => {
    const marker = join(dir, 'login-ran');
    const plugin = join(dir, 'plugin.sh');
    writeFileSync(plugin, `#!/bin/sh\ntouch ${marker}\n`);
    chmodSync(plugin, 0o755);
    const path = kubeconfig(
      'user',
      {
        'sealion-corp': 'https://127.0.0.1:1',
        'sealion-edge-1': 'https://127.0.0.1:1/clusters/edge-1',
      },
      plugin,
    );
    const given = new Map([['kubeconfig', path]]);
    expect(await lookupNames('context', given)).toEqual([
      { value: 'sealion-corp', description: 'sealion-corp' },
      { value: 'sealion-edge-1', description: 'sealion-edge-1' },
    ]);
    expect(await lookupNames('cluster', given)).toEqual([
      { value: 'edge-1', description: 'in the kubeconfig' },
    ]);
    expect(await lookupNames('authenticator', given)).toEqual([]);
    expect(existsSync(marker)).toBe(false);
  });

  it('gives up on a cluster that does not answer, with the names it knows without it', async () => {
    const server = `https://127.0.0.1:${(silent.address() as AddressInfo).port}`;
    const path = kubeconfig('hanging', { hub: server, 'sealion-lab': `${server}/clusters/lab` });
    expect(await lookupNames('cluster', new Map([['kubeconfig', path]]))).toEqual([
      { value: 'lab', description: 'in the kubeconfig' },
    ]);
    expect(await lookupNames('authenticator', new Map([['kubeconfig', path]]))).toEqual([]);
  });
});

describe('completion scripts in real shells', () => {
  let dir: string;
  let bin: string;
  /** A kubeconfig that names agent-backed clusters in its servers' paths: names known without a cluster. */
  let userKubeconfig: string;
  let env: NodeJS.ProcessEnv;

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-shells-'));
    bin = join(dir, 'bin');
    mkdirSync(bin);
    // `sealion` on PATH is this checkout, as the scripts run it by the name on the line.
    writeFileSync(
      join(bin, 'sealion'),
      `#!/bin/sh\nexec "${process.execPath}" "${new URL('../bin/sealion.js', import.meta.url).pathname}" "$@"\n`,
    );
    chmodSync(join(bin, 'sealion'), 0o755);
    userKubeconfig = join(dir, 'me.kubeconfig');
    writeFileSync(
      userKubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: ['edge-1', 'edge-2'].map((name) => ({
          name,
          cluster: { server: `https://127.0.0.1:1/clusters/${name}` },
        })),
        users: [{ name: 'me', user: { token: 'x' } }],
        contexts: ['edge-1', 'edge-2'].map((name) => ({ name, context: { cluster: name, user: 'me' } })),
        'current-context': 'edge-1',
      }),
    );
    for (const shell of ['bash', 'zsh', 'fish'] as const)
      writeFileSync(join(dir, `sealion.${shell}`), completionScript(shell, 'sealion'));
    env = { ...process.env, PATH: `${bin}:${process.env['PATH']}`, KUBECONFIG: join(dir, 'none'), HOME: dir };
  });

  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  const has = (shell: string): boolean => {
    try {
      execFileSync('sh', ['-c', `command -v ${shell}`], { stdio: 'ignore' });
      return true;
    } catch {
      return false;
    }
  };

  /**
   * What bash's completion function puts in COMPREPLY for `line` (cursor at its end), with COMP_WORDS split as
   * readline splits them: at spaces, and around '=' (COMP_WORDBREAKS).
   */
  async function bashComplete(line: string): Promise<string[]> {
    const words = line
      .split(' ')
      .flatMap((w) => w.split(/(=)/).filter((p, i, all) => p !== '' || i === all.length - 1));
    const script = `
      source ${join(dir, 'sealion.bash')}
      COMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')})
      COMP_CWORD=${words.length - 1}
      COMP_LINE='${line}'
      COMP_POINT=${line.length}
      _sealion_complete
      printf '%s\\n' "\${COMPREPLY[@]}"`;
    const { stdout } = await run('bash', ['--norc', '--noprofile', '-c', script], { env, timeout: 20_000 });
    return stdout.split('\n').filter(Boolean);
  }

  it('bash: the script registers for sealion and completes commands, options, choices and names', async () => {
    const { stdout } = await run(
      'bash',
      ['--norc', '--noprofile', '-c', `source ${join(dir, 'sealion.bash')}; complete -p sealion`],
      { env },
    );
    expect(stdout.trim()).toBe('complete -o default -F _sealion_complete sealion');
    expect(await bashComplete('sealion get kube')).toEqual(['kubeconfig']);
    expect(await bashComplete('sealion get kubeconfig --mo')).toEqual(['--mode']);
    expect(await bashComplete('sealion get kubeconfig --mode=')).toEqual(['direct', 'proxy']);
    expect(await bashComplete('sealion whoami -o j')).toEqual(['json']);
    expect(await bashComplete(`sealion port-forward --kubeconfig=${userKubeconfig} --cluster edge`)).toEqual([
      'edge-1',
      'edge-2',
    ]);
  }, 60_000);

  // fish has a non-interactive way to ask its completion engine: complete -C.
  (has('fish') ? it : it.skip)(
    'fish: completes through complete -C',
    async () => {
      const ask = async (line: string): Promise<string[]> =>
        (
          await run(
            'fish',
            ['--no-config', '-c', `source ${join(dir, 'sealion.fish')}; complete -C '${line}'`],
            {
              env,
              timeout: 20_000,
            },
          )
        ).stdout
          .split('\n')
          .filter(Boolean)
          .map((l) => l.split('\t')[0]!);
      expect(await ask('sealion get kube')).toEqual(['kubeconfig']);
      expect(await ask('sealion get kubeconfig --mode=')).toEqual(['--mode=direct', '--mode=proxy']);
      expect(await ask(`sealion cluster remove --kubeconfig ${userKubeconfig} `)).toEqual([
        'edge-1',
        'edge-2',
      ]);
      expect(await ask(`sealion port-forward --kubeconfig ${userKubeconfig} --cluster edge`)).toEqual([
        'edge-1',
        'edge-2',
      ]);
    },
    60_000,
  );

  const missing = ['fish', 'zsh', 'tmux'].filter((c) => !has(c));
  if (missing.length > 0)
    console.warn(
      `not installed: ${missing.join(', ')}; the fish and zsh scripts are tried only where they are`,
    );

  // zsh completes only in its line editor: a real interactive zsh in tmux, typing a line and a TAB.
  (has('zsh') && has('tmux') ? it : it.skip)(
    'zsh: completes in the line editor',
    async () => {
      const session = `sealion-zsh-${process.pid}`;
      const tmux = (...args: string[]): Promise<{ stdout: string }> =>
        run('tmux', args, { env, timeout: 10_000 });
      const screen = async (): Promise<string> => (await tmux('capture-pane', '-p', '-t', session)).stdout;
      const until = async (want: RegExp): Promise<string> => {
        for (let i = 0; i < 100; i++) {
          const text = await screen();
          if (want.test(text)) return text;
          await new Promise((r) => setTimeout(r, 100));
        }
        throw new Error(`the screen never showed ${want}:\n${await screen()}`);
      };
      await tmux('new-session', '-d', '-s', session, '-x', '160', '-y', '40', 'zsh -f');
      try {
        await tmux(
          'send-keys',
          '-t',
          session,
          `autoload -Uz compinit && compinit -u && source ${join(dir, 'sealion.zsh')} && echo READY`,
          'Enter',
        );
        await until(/^READY$/m);
        await tmux('send-keys', '-t', session, 'sealion get kube', 'Tab');
        await until(/sealion get kubeconfig\s*$/m);
        await tmux('send-keys', '-t', session, '-l', '--', '--mode=');
        await tmux('send-keys', '-t', session, 'Tab', 'Tab');
        await until(/direct\s+proxy/);
        await tmux('send-keys', '-t', session, 'C-u');
        await tmux(
          'send-keys',
          '-t',
          session,
          '-l',
          `sealion port-forward --kubeconfig ${userKubeconfig} --cluster edge-`,
        );
        await tmux('send-keys', '-t', session, 'Tab', 'Tab');
        await until(/^edge-\d\s+edge-\d/m);
      } finally {
        await tmux('kill-session', '-t', session).catch(() => {});
      }
    },
    60_000,
  );
});
