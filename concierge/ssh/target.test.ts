import { describe, expect, it } from '@jest/globals';
import { parseContainer, parseExecCommand, parseForward } from './target.ts';
import { exitCodeOf, Refused } from './cluster-access.ts';
import { noticeOf, refusalOf } from './channels.ts';

describe('parseExecCommand', () => {
  it('reads the target, then the command by the shell quoting rules, without a shell', () => {
    expect(parseExecCommand(`edge/demo/web-1/app -- ls -l '/tmp/a b' "$HOME"`)).toEqual({
      target: { cluster: 'edge', namespace: 'demo', pod: 'web-1', container: 'app' },
      argv: ['ls', '-l', '/tmp/a b', '$HOME'],
    });
    expect(parseExecCommand('hub/demo/web-1')).toEqual({
      target: { cluster: 'hub', namespace: 'demo', pod: 'web-1', container: '' },
      argv: [],
    });
    expect(parseExecCommand('hub/demo/web-1 date')).toMatchObject({ argv: ['date'] });
  });

  it.each([
    ['hub/demo/web | cat', '"|" needs a shell'],
    ['hub/demo/web -- ls *.c', '"*.c" needs a shell'],
    ['hub/demo/web -- echo x > /etc/passwd', '">" needs a shell'],
    ["hub/demo/web -- echo 'open", 'never closed'],
    ['hub/demo/web -- echo "a\\"', 'never closed'],
    ['hub/demo', 'is not <cluster>/<namespace>/<pod>[/<container>]'],
    ['hub/demo/web/app/extra', 'is not <cluster>'],
    ['Hub/demo/web', 'not a cluster name'],
    ['hub/../web', 'not a namespace name'],
    ['hub/demo/web%2Fx', 'not a pod name'],
    ['hub/demo/web/App', 'not a container name'],
    ['', 'is not <cluster>'],
  ])('refuses %j', (command, problem) => {
    const parsed = parseExecCommand(command);
    expect(parsed).toHaveProperty('problem');
    expect((parsed as { problem: string }).problem).toContain(problem);
  });

  it('answers shell syntax with how to ask the shell, quoted once more as ssh needs, and no usage', () => {
    expect(parseExecCommand('hub/demo/web -- ls | wc -l')).toEqual({
      problem:
        '"|" needs a shell, and none runs here; ask the container\'s, quoting the command once more for ssh: ' +
        `ssh <host> hub/demo/web -- "sh -c 'ls | wc -l'"`,
    });
    // A command single quotes cannot hold as it is, or one the person's shell would read inside double quotes.
    expect(parseExecCommand('hub/demo/web -- echo $HOME > x')).toEqual({
      problem:
        '">" needs a shell, and none runs here; ask the container\'s, quoting the command once more for ssh: ' +
        `ssh <host> hub/demo/web -- "sh -c '<command>'"`,
    });
    expect(parseExecCommand('hub/demo')).toEqual({
      problem: '"hub/demo" is not <cluster>/<namespace>/<pod>[/<container>]',
      usage: true,
    });
  });

  it('refuses a command line longer than any URL would carry', () => {
    expect(parseExecCommand(`hub/demo/web -- echo ${'x'.repeat(20_000)}`)).toEqual({
      problem: 'the command is too long',
    });
  });
});

describe('parseContainer', () => {
  it('names a pod by a DNS subdomain and the rest by DNS labels', () => {
    expect(parseContainer('edge/kube-system/coredns-5d78c9869d-abcde.x')).toMatchObject({
      pod: 'coredns-5d78c9869d-abcde.x',
    });
  });
});

describe('parseForward', () => {
  it.each([
    [
      'edge/db/svc/postgres',
      5432,
      { cluster: 'edge', target: { namespace: 'db', kind: 'services', name: 'postgres', port: 5432 } },
    ],
    [
      'hub/demo/pod/web-1.x',
      80,
      { cluster: 'hub', target: { namespace: 'demo', kind: 'pods', name: 'web-1.x', port: 80 } },
    ],
    [
      'hub/demo/service/web',
      1,
      { cluster: 'hub', target: { namespace: 'demo', kind: 'services', name: 'web', port: 1 } },
    ],
  ])('reads %s port %d', (host, port, expected) => {
    expect(parseForward(host, port)).toEqual(expected);
  });

  it.each([
    ['localhost', 80],
    ['10.0.0.1', 80],
    ['hub/demo/deploy/web', 80],
    ['hub/demo/svc/web.x', 80],
    ['hub/demo/svc/web', 0],
    ['hub/demo/svc/web', 70000],
    ['hub/demo/svc/web/extra', 80],
  ])('refuses %s port %d', (host, port) => {
    expect(parseForward(host, port)).toHaveProperty('problem');
  });
});

describe('exitCodeOf', () => {
  it('reads the exec protocol’s closing Status', () => {
    expect(exitCodeOf('{"metadata":{},"status":"Success"}')).toBe(0);
    expect(
      exitCodeOf(
        '{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"7"}]}}',
      ),
    ).toBe(7);
    const refused = exitCodeOf('{"status":"Failure","code":500,"message":"container not found (\\"x\\")"}');
    expect(refused).toBeInstanceOf(Refused);
    expect((refused as Refused).message).toContain('container not found');
    expect(exitCodeOf('not json')).toBeInstanceOf(Refused);
    expect(
      exitCodeOf(
        '{"status":"Failure","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"-1; rm"}]}}',
      ),
    ).toBeInstanceOf(Refused);
  });
});

describe('refusalOf', () => {
  const target = { cluster: 'edge', namespace: 'demo', pod: 'web-1', container: 'app' };
  const runtime = (program: string, why: string): Refused =>
    new Refused(
      500,
      'Internal error occurred: Internal error occurred: error executing command in container: failed to exec in ' +
        'container: failed to start exec "4f2a": OCI runtime exec failed: exec failed: unable to start container ' +
        `process: exec: "${program}": ${why}: unknown`,
    );

  it('says in one line that a pod has no shell, and how to run a program it has', () => {
    expect(refusalOf(runtime('/bin/sh', 'stat /bin/sh: no such file or directory'), target, [])).toEqual({
      line:
        'edge/demo/web-1/app has no shell (/bin/sh in its image); pick another container, or run a program it has: ' +
        'ssh <host> edge/demo/web-1/app -- <command>',
      code: 127,
    });
  });

  it('says in one line that a program is not in the image', () => {
    expect(
      refusalOf(runtime('psql', 'executable file not found in $PATH'), { ...target, container: '' }, [
        'psql',
        '-l',
      ]),
    ).toEqual({ line: 'psql: no such program in edge/demo/web-1', code: 127 });
  });

  it("passes any other refusal on as the cluster's message", () => {
    const forbidden = new Refused(
      403,
      'pods "web-1" is forbidden: User "alice" cannot create resource "pods/exec"',
    );
    expect(refusalOf(forbidden, target, ['ls'])).toEqual({ line: forbidden.message, code: 1 });
  });

  it("makes the cluster's message one line of at most 512 characters: a PTY runs no sequence it holds", () => {
    const hostile = new Refused(
      403,
      `forbidden\x1b]0;owned\x07\x1b[2J\r\nsealion: fake prompt\u202e ${'x'.repeat(600)}`,
    );
    const { line, code } = refusalOf(hostile, target, ['ls']);
    expect(code).toBe(1);
    expect(line).toBe(`forbidden ]0;owned [2J sealion: fake prompt  ${'x'.repeat(600)}`.slice(0, 512));
  });
});

describe('noticeOf', () => {
  it("says a refused forward in one line of at most 512 characters, whatever the cluster's message holds", () => {
    expect(noticeOf('-L web:80: no\x1b]8;;http://evil\x07link\r\nsealion: fake')).toBe(
      'sealion: -L web:80: no ]8;;http://evil link sealion: fake\r\n',
    );
    expect(noticeOf('y'.repeat(600))).toBe(`sealion: ${'y'.repeat(512)}\r\n`);
  });
});
