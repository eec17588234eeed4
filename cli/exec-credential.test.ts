import { afterEach, beforeEach, describe, expect, it } from '@jest/globals';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { isKubectl, onceForCaller, type Caller } from './exec-credential.ts';

/** A parent process as /proc shows it: its comm and its argv (NUL-separated in cmdline). */
const parent = (comm: string, argv: string[]): Caller => ({
  pid: 4242,
  readProc: (path) => {
    if (path === '/proc/4242/comm') return `${comm}\n`;
    if (path === '/proc/4242/cmdline') return `${argv.join('\0')}\0`;
    if (path === '/proc/4242/stat')
      return `4242 (${comm}) S 1 ${Array.from({ length: 19 }, (_, i) => i).join(' ')}`;
    throw new Error(`ENOENT: ${path}`);
  },
});
const noProc: Caller = {
  pid: 4242,
  readProc: () => {
    throw new Error('ENOENT');
  },
};

describe('isKubectl', () => {
  it.each([
    ['kubectl', ['kubectl', 'get', 'pods'], true],
    ['kubectl1.30', ['/usr/local/bin/kubectl1.30', 'get', 'pods'], true],
    ['k9s', ['k9s'], false],
    ['node', ['node', 'controller.js'], false],
    ['sh', ['/bin/sh', '-c', 'kubectl get pods'], false],
  ])('takes comm %s, argv %j for kubectl: %s', (comm, argv, want) => {
    expect(isKubectl(parent(comm, argv))).toBe(want);
  });

  it('takes nothing for kubectl where /proc cannot be read', () => {
    expect(isKubectl(noProc)).toBe(false);
  });
});

describe('onceForCaller', () => {
  let home: string;
  let env: NodeJS.ProcessEnv;
  let runs = 0;
  const failing = (): Promise<never> => {
    runs++;
    return Promise.reject(new Error('the issuer did not answer'));
  };
  beforeEach(() => {
    home = mkdtempSync(join(tmpdir(), 'sealion-once-'));
    env = { XDG_CONFIG_HOME: home, KUBERNETES_EXEC_INFO: '{"kind":"ExecCredential"}' };
    runs = 0;
  });
  afterEach(() => rmSync(home, { recursive: true, force: true }));

  it('says a failure once to kubectl: its next run fails at once, saying nothing, asking no server', async () => {
    const kubectl = parent('kubectl', ['kubectl', 'get', 'pods']);
    await expect(onceForCaller(env, failing, kubectl)).rejects.toThrow('the issuer did not answer');
    await expect(onceForCaller(env, failing, kubectl)).rejects.toMatchObject({ name: 'AlreadySaid' });
    expect(runs).toBe(1);
  });

  it.each([
    ['a long-lived client-go host', parent('k9s', ['k9s'])],
    ['a process whose /proc cannot be read', noProc],
  ])('remembers no failure for %s: each run tries afresh', async (_what, caller) => {
    await expect(onceForCaller(env, failing, caller)).rejects.toThrow('the issuer did not answer');
    await expect(onceForCaller(env, failing, caller)).rejects.toThrow('the issuer did not answer');
    await expect(onceForCaller(env, () => Promise.resolve('credential'), caller)).resolves.toBe('credential');
    expect(runs).toBe(2);
  });
});
