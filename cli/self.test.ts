import { describe, expect, it } from '@jest/globals';
import { fileURLToPath } from 'node:url';
import { installHint, selfCommand, selfKind } from './self.ts';

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
  });
});
