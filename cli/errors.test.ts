// The one error style, as a user meets it: the real CLI run as a process (no kubeconfig, a missing, a directory, a
// malformed one, a server nobody listens for, a refusal, a login plugin without a terminal), each with its exact
// line on standard error and exit status 1; and the helpers that word Node's and the libraries' errors.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:https';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parse as parseYaml } from 'yaml';
import { HttpsError } from '../lib/https-client.ts';
import { issueCert, newCA } from '../lib/pki/pki.ts';
import { progressLine } from './fleet.ts';
import { errorLine, fileError, systemReason, unreachableError, UserError } from './errors.ts';
import { loadKubeconfig } from './whoami.ts';

const MAIN = join(import.meta.dirname, 'main.ts');
let dir: string;
/** Shared by every run: Node's compile cache makes the second run of the CLI fast. */
let cache: string;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the CLI with only the environment given (and PATH), standard input not a terminal. */
function sealion(args: string[], env: NodeJS.ProcessEnv = {}): Promise<Run> {
  return run(process.execPath, [MAIN, ...args], env);
}

/**
 * The CLI run `times` times in a row by one process named kubectl, as kubectl runs a login plugin again for each
 * request (here a shell started under that name, which runs each as its child and waits for it): each run's exit
 * status and standard error.
 */
async function sealionUnderKubectl(args: string[], env: NodeJS.ProcessEnv, times: number): Promise<Run[]> {
  const kubectl = join(dir, 'kubectl');
  if (!existsSync(kubectl)) symlinkSync('/bin/sh', kubectl);
  const script = `i=0; while [ $i -lt ${times} ]; do "$@"; echo "status $?" >&2; i=$((i + 1)); done`;
  const all = await run(kubectl, ['-c', script, 'kubectl', process.execPath, MAIN, ...args], env);
  const runs: Run[] = [];
  const ended = /status (\d+)\n/g;
  let from = 0;
  for (let m = ended.exec(all.stderr); m; m = ended.exec(all.stderr)) {
    runs.push({ code: Number(m[1]), stdout: '', stderr: all.stderr.slice(from, m.index) });
    from = m.index + m[0].length;
  }
  expect(all.stdout).toBe('');
  return runs;
}

function run(command: string, argv: string[], env: NodeJS.ProcessEnv): Promise<Run> {
  return new Promise((done) => {
    const child = execFile(
      command,
      argv,
      {
        env: { PATH: process.env['PATH'], HOME: dir, XDG_CACHE_HOME: cache, XDG_CONFIG_HOME: dir, ...env },
        timeout: 60_000,
      },
      (err, stdout, stderr) =>
        done({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin?.end();
  });
}

/** A port nobody listens on: one that was free a moment ago. */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
  const { port } = server.address() as AddressInfo;
  await new Promise((done) => server.close(done));
  return port;
}

/** A kubeconfig with one context `c` for `server`, its user a bearer token or an exec plugin. */
function kubeconfig(
  name: string,
  server: string,
  user: object = { token: 'kubeconfig-token' },
  ca = '',
): string {
  const path = join(dir, name);
  writeFileSync(
    path,
    JSON.stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'c', cluster: { server, ...(ca ? { 'certificate-authority-data': ca } : {}) } }],
      users: [{ name: 'u', user }],
      contexts: [{ name: 'c', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'c',
    }),
  );
  return path;
}

let refusing: Server;
let refusingUrl: string;
let caData: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'sealion-errors-'));
  cache = mkdtempSync(join(tmpdir(), 'sealion-errors-cache-'));
  const ca = await newCA('errors-ca');
  const cert = await issueCert(ca, { commonName: 'server', hosts: ['127.0.0.1'], usage: 'server' });
  caData = Buffer.from(ca.certPem).toString('base64');
  // Refuses everyone, as the proxy refuses a token it does not take: one 401 Status for every failure.
  refusing = createServer({ cert: cert.certPem, key: cert.keyPem }, (req, res) => {
    req.resume();
    res.writeHead(401, { 'content-type': 'application/json' }).end(
      JSON.stringify({
        kind: 'Status',
        apiVersion: 'v1',
        status: 'Failure',
        message: 'Unauthorized',
        code: 401,
      }),
    );
  });
  await new Promise<void>((done) => refusing.listen(0, '127.0.0.1', done));
  refusingUrl = `https://127.0.0.1:${(refusing.address() as AddressInfo).port}`;
});

afterAll(async () => {
  refusing.closeAllConnections();
  await new Promise((done) => refusing.close(done));
  rmSync(dir, { recursive: true, force: true });
  rmSync(cache, { recursive: true, force: true });
});

describe('a kubeconfig that cannot be read says which file and what to do', () => {
  it('no kubeconfig at all', async () => {
    const home = join(dir, 'empty-home');
    mkdirSync(home, { recursive: true });
    expect(await sealion(['whoami'], { HOME: home })).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: no kubeconfig: KUBECONFIG is not set and ${home}/.kube/config does not exist; pass --kubeconfig, set KUBECONFIG, or write one with sealion get kubeconfig (it needs an admin kubeconfig)\n`,
    });
  });

  it('a --kubeconfig that does not exist, and KUBECONFIG naming only such files', async () => {
    const missing = join(dir, 'missing.kubeconfig');
    expect(await sealion(['whoami', '--kubeconfig', missing])).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: cannot read kubeconfig ${missing}: no such file; check the path given to --kubeconfig\n`,
    });
    expect(await sealion(['clusters'], { KUBECONFIG: missing })).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: no kubeconfig: KUBECONFIG names ${missing}, and it does not exist; pass --kubeconfig, set KUBECONFIG, or write one with sealion get kubeconfig (it needs an admin kubeconfig)\n`,
    });
  });

  it('KUBECONFIG naming files that share a user name: the first file wins, as in kubectl', async () => {
    const one = join(dir, 'one.kubeconfig');
    const two = join(dir, 'two.kubeconfig');
    const file = (context: string, token: string) => ({
      apiVersion: 'v1',
      kind: 'Config',
      'current-context': context,
      clusters: [{ name: context, cluster: { server: `https://${context}.invalid` } }],
      users: [{ name: 'shared', user: { token } }],
      contexts: [{ name: context, context: { cluster: context, user: 'shared' } }],
    });
    writeFileSync(one, JSON.stringify(file('one', 'first')));
    writeFileSync(two, JSON.stringify(file('two', 'second')));
    const config = await loadKubeconfig(
      { kubeconfig: '' },
      { KUBECONFIG: `${one}:${two}` },
      { current: false },
    );
    expect(config.getContexts().map((c) => c.name)).toEqual(['one', 'two']);
    expect(config.getUsers()).toEqual([expect.objectContaining({ name: 'shared', token: 'first' })]);
    expect(config.getCurrentContext()).toBe('one');
  });

  it('a directory', async () => {
    expect(await sealion(['version'], { KUBECONFIG: dir })).toMatchObject({
      code: 1,
      stderr: `sealion: cannot read kubeconfig ${dir}: it is a directory; set KUBECONFIG or pass --kubeconfig\n`,
    });
  });

  it('malformed YAML, with the line and the reason on one line', async () => {
    const bad = join(dir, 'bad.kubeconfig');
    writeFileSync(bad, 'apiVersion: v1\nclusters:\n- name: c\n  cluster: {server: "https://a\n');
    expect(await sealion(['whoami', '--kubeconfig', bad])).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: cannot read kubeconfig ${bad}: line 5, column 1: deficient indentation; fix the file, or check the path given to --kubeconfig\n`,
    });
    const empty = join(dir, 'empty.kubeconfig');
    writeFileSync(empty, '');
    const list = join(dir, 'list.kubeconfig');
    writeFileSync(list, '- a\n- b\n');
    expect((await sealion(['whoami', '--kubeconfig', list])).stderr).toBe(
      `sealion: cannot read kubeconfig ${list}: it is not a kubeconfig (no clusters, contexts or users); fix the file, or check the path given to --kubeconfig\n`,
    );
    expect((await sealion(['logout', '--kubeconfig', empty])).stderr).toBe(
      `sealion: cannot read kubeconfig ${empty}: it is empty; fix the file, or check the path given to --kubeconfig\n`,
    );
  });

  it('a context that is not there, with the known ones', async () => {
    const path = kubeconfig('one-context.kubeconfig', refusingUrl);
    expect(await sealion(['whoami', '--kubeconfig', path, '--context', 'nope'])).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: no context nope in kubeconfig ${path}; known: c\n`,
    });
  });
});

describe('a server that cannot be reached or refuses', () => {
  it('whoami, version and clusters each say it once, and fail', async () => {
    const port = await closedPort();
    const path = kubeconfig('unreachable.kubeconfig', `https://127.0.0.1:${port}`, undefined, caData);
    const line = `sealion: cannot reach https://127.0.0.1:${port}: connection refused; is the server running, and is the kubeconfig's server right?\n`;
    expect(await sealion(['whoami', '--kubeconfig', path])).toEqual({ code: 1, stdout: '', stderr: line });

    const version = await sealion(['version', '--kubeconfig', path]);
    // Once, not once for each part (server, concierge, agents); the client's part is printed.
    expect(version).toMatchObject({ code: 1, stderr: line });
    expect(version.stdout).toMatch(
      /^Client Version: .*\nClient Build: .*\nNode Version: .*\nPlatform: .*\nTunnel Protocol: .*\n$/,
    );

    const clusters = await sealion(['clusters', '--kubeconfig', path]);
    expect(clusters).toEqual({
      code: 1,
      stdout: `CURRENT   CONTEXT   STATE         USER/DETAIL          SERVER\n*         c         Unreachable   connection refused   https://127.0.0.1:${port}\n`,
      stderr: 'sealion: cluster c did not answer: Unreachable\n',
    });
    const yaml = await sealion(['clusters', '--kubeconfig', path, '-o', 'yaml']);
    expect(yaml.code).toBe(1);
    expect(parseYaml(yaml.stdout)).toEqual([
      {
        context: 'c',
        current: true,
        server: `https://127.0.0.1:${port}`,
        state: 'Unreachable',
        detail: 'connection refused',
      },
    ]);
  });

  it('a refusal names the credential that was refused', async () => {
    const path = kubeconfig('refused.kubeconfig', refusingUrl, undefined, caData);
    expect(await sealion(['whoami', '--kubeconfig', path])).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: cannot ask who you are on ${refusingUrl}: the server refused the token of the kubeconfig (401 Unauthorized); check the credentials of context c\n`,
    });
  });

  it('a server that is not https', async () => {
    const path = kubeconfig('plain.kubeconfig', 'http://127.0.0.1:8080');
    expect((await sealion(['whoami', '--kubeconfig', path])).stderr).toBe(
      "sealion: the server of context c is http://127.0.0.1:8080: sealion talks to servers over https only; fix the kubeconfig's server\n",
    );
  });
});

describe('the login plugin as kubectl runs it', () => {
  const info = (interactive: boolean, server = 'https://proxy.example.com/clusters/edge'): string =>
    JSON.stringify({
      apiVersion: 'client.authentication.k8s.io/v1',
      kind: 'ExecCredential',
      spec: { interactive, cluster: { server } },
    });

  it('fails at once without a terminal and no session, with the command to run', async () => {
    const issuer = `https://127.0.0.1:${await closedPort()}`;
    const home = mkdtempSync(join(dir, 'no-session-'));
    const run = await sealion(
      ['login', 'oidc', '--issuer', issuer, '--exchange', '--authenticator-name', 'corp'],
      {
        KUBERNETES_EXEC_INFO: info(false),
        XDG_CONFIG_HOME: home,
      },
    );
    expect(run).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: no session for cluster edge and no terminal to log in; run: sealion login oidc --issuer ${issuer}\n`,
    });
  });

  it('names the context kubectl passes in the cluster’s exec extension', async () => {
    const issuer = 'https://issuer.example.com';
    const run = await sealion(['login', 'oidc', '--issuer', issuer, '--skip-browser'], {
      KUBERNETES_EXEC_INFO: JSON.stringify({
        kind: 'ExecCredential',
        spec: {
          interactive: false,
          cluster: { server: 'https://proxy.example.com', config: { context: 'edge' } },
        },
      }),
      XDG_CONFIG_HOME: mkdtempSync(join(dir, 'context-')),
    });
    expect(run.stderr).toBe(
      `sealion: no session for context edge and no terminal to log in; run: sealion login oidc --issuer ${issuer} --skip-browser\n`,
    );
  });

  it('says an expired static token is expired, before any server is asked', async () => {
    const jwt = (claims: object): string =>
      ['{"alg":"RS256"}', JSON.stringify(claims), 'sig']
        .map((p) => Buffer.from(p).toString('base64url'))
        .join('.');
    const run = await sealion(['login', 'static', '--token-env', 'T'], { T: jwt({ exp: 1_700_000_000 }) });
    expect(run).toEqual({
      code: 1,
      stdout: '',
      stderr:
        'sealion: the token in environment variable T expired at 2023-11-14T22:13:20.000Z; put a current token there\n',
    });
  });

  it('says a failure once to the kubectl process that runs it again and again', async () => {
    const issuer = `https://127.0.0.1:${await closedPort()}`;
    const home = mkdtempSync(join(dir, 'once-'));
    const env = { KUBERNETES_EXEC_INFO: info(false, 'https://proxy.example.com'), XDG_CONFIG_HOME: home };
    const args = ['login', 'oidc', '--issuer', issuer];
    // One kubectl process: every run is its child. Two runs: the second must start within the 10 s the failure is
    // remembered, which each further start of the CLI on two busy cores would make less certain.
    const [first, ...again] = await sealionUnderKubectl(args, env, 2);
    expect(first).toEqual({
      code: 1,
      stdout: '',
      stderr: `sealion: no session for https://proxy.example.com and no terminal to log in; run: sealion login oidc --issuer ${issuer}\n`,
    });
    expect(again).toEqual([{ code: 1, stdout: '', stderr: '' }]);
  });
});

describe('the helpers', () => {
  const system = (code: string, more: object = {}): Error =>
    Object.assign(new Error(`${code} raw text`), { code, ...more });

  it('word system errors on files', () => {
    expect(
      fileError(system('ENOENT'), 'kubeconfig', '/x', 'set KUBECONFIG or pass --kubeconfig').message,
    ).toBe('cannot read kubeconfig /x: no such file; set KUBECONFIG or pass --kubeconfig');
    expect(fileError(system('EACCES'), 'token file', '/t', 'fix it').message).toBe(
      'cannot read token file /t: permission denied; fix it',
    );
    expect(errorLine(system('EISDIR', { path: '/d', syscall: 'read' }))).toBe(
      'cannot read /d: it is a directory',
    );
  });

  it('word a connection that failed, from the cause undici wraps', () => {
    const network = new HttpsError('Network', 'fetch failed', undefined, {
      cause: system('ENOTFOUND', { hostname: 'nope.example' }),
    });
    // HttpsError keeps the cause it is given as its cause.
    expect(systemReason(network)).toBe('no such host');
    expect(unreachableError(network, 'https://nope.example:6443/apis/x', 'is it running?')?.message).toBe(
      'cannot reach https://nope.example:6443: no such host; is it running?',
    );
    const untrusted = new HttpsError('Network', 'x', undefined, system('SELF_SIGNED_CERT_IN_CHAIN'));
    expect(unreachableError(untrusted, 'https://h', 'is it running?')?.message).toBe(
      'cannot reach https://h: its certificate is signed by an authority that is not trusted; check the certificate authority the kubeconfig names for it (certificate-authority-data)',
    );
    expect(unreachableError(new HttpsError('Timeout', 'x'), 'https://h:1/p', 'is it up?')?.message).toBe(
      'no answer from https://h:1 in time; is it up?',
    );
    expect(unreachableError(new HttpsError('BadStatus', 'HTTP 401', 401), 'https://h', 'x')).toBeUndefined();
  });

  it('keep a UserError as it is, and any other message on one line', () => {
    expect(errorLine(new UserError('as said'))).toBe('as said');
    expect(errorLine(new Error('bad indentation\n\n 1 | a:\n---^\n'))).toBe('bad indentation 1 | a: ---^');
  });

  it('show the progress of clusters on a terminal only, and clear it', () => {
    const written: string[] = [];
    const stream = (isTTY: boolean) =>
      ({ isTTY, write: (text: string) => written.push(text) }) as unknown as NodeJS.WriteStream;
    const piped = progressLine(stream(false));
    piped.show(0, 2);
    piped.clear();
    expect(written).toEqual([]);
    const terminal = progressLine(stream(true));
    terminal.show(0, 2);
    terminal.show(1, 2);
    terminal.clear();
    expect(written).toEqual([
      '\r\u001b[Kasking 2 clusters: 0 answered',
      '\r\u001b[Kasking 2 clusters: 1 answered',
      '\r\u001b[K',
    ]);
  });
});
