import { describe, expect, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';

describe('runtime', () => {
  it('runs on Node 24, which npm takes from the registry (the node devDependency)', () => {
    expect(process.versions.node.split('.')[0]).toBe('24');
    const pkg = JSON.parse(readFileSync(new URL('../package.json', import.meta.url), 'utf8')) as {
      devDependencies: Record<string, string>;
    };
    expect(pkg.devDependencies['node']).toMatch(/^\^?24\./);
  });

  it('answers --help for the sealion command', () => {
    const help = execFileSync(
      process.execPath,
      [new URL('../bin/sealion.js', import.meta.url).pathname, '--help'],
      { encoding: 'utf8' },
    );
    expect(help).toContain('Usage: sealion');
    for (const command of ['login', 'manifests', 'concierge', 'cluster', 'agent'])
      expect(help).toContain(command);
  });
});
