import { describe, expect, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { displayName, installHint, invokedName, selfCommand, selfKind } from './self.ts';

describe('selfCommand', () => {
  it('runs the checkout with this Node and bin/sealion.js, whatever PATH holds', () => {
    expect(selfKind()).toBe('checkout');
    expect(selfCommand({ PATH: '/usr/bin:/bin' })).toEqual({
      command: process.execPath,
      args: [fileURLToPath(new URL('../bin/sealion.js', import.meta.url))],
    });
  });
});

describe('installHint', () => {
  it('names the command on PATH, or the paths the kubeconfig runs', () => {
    expect(installHint({ command: 'sealion', args: [] })).toContain('the sealion command');
    expect(installHint({ command: '/opt/node', args: ['/opt/sealion.mjs'] })).toContain(
      '/opt/node /opt/sealion.mjs',
    );
    expect(installHint({ command: 'kubectl-sealion', args: [] })).toContain('kubectl krew install');
  });
});

describe('the name it runs as', () => {
  it.each([
    [['/usr/bin/node', '/repo/bin/sealion.js'], {}, 'sealion', 'sealion'],
    [['/usr/bin/node', '/usr/local/bin/sealion'], {}, 'sealion', 'sealion'],
    // A standalone executable has its own path in argv[1]; krew links it as kubectl-sealion.
    [
      ['/home/me/.krew/bin/kubectl-sealion', '/home/me/.krew/bin/kubectl-sealion'],
      {},
      'kubectl-sealion',
      'kubectl sealion',
    ],
    [['/usr/bin/node', '/opt/kubectl-sealion.mjs'], {}, 'kubectl-sealion', 'kubectl sealion'],
    [
      ['/bin/kubectl_complete-sealion', '/bin/kubectl_complete-sealion'],
      {},
      'kubectl_complete-sealion',
      'kubectl sealion',
    ],
    [
      ['/usr/bin/node', '/repo/bin/sealion.js'],
      { KUBECTL_PLUGINS_CALLER: '/usr/bin/kubectl' },
      'sealion',
      'kubectl sealion',
    ],
  ])('%j %j', (argv, env, invoked, display) => {
    expect(invokedName(argv)).toBe(invoked);
    expect(displayName(argv, env)).toBe(display);
  });

  it('says `kubectl sealion` in help when started through a link named kubectl-sealion', () => {
    const dir = mkdtempSync(join(tmpdir(), 'sealion-plugin-'));
    try {
      const plugin = join(dir, 'kubectl-sealion');
      symlinkSync(fileURLToPath(new URL('../bin/sealion.js', import.meta.url)), plugin);
      const help = execFileSync(process.execPath, [plugin, 'get', 'kubeconfig', '--help'], {
        encoding: 'utf8',
      });
      expect(help).toContain('Usage: kubectl sealion get kubeconfig [options]');
      // The examples name it so too, and nothing says it twice.
      expect(help).toContain('  kubectl sealion get kubeconfig --mode direct > me.kubeconfig');
      expect(help).not.toMatch(/kubectl kubectl|(?<!kubectl )sealion get/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
