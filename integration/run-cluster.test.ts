// `npm run cluster` as a person uses it: start, use with kubectl, Ctrl-C, nothing left behind.
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { REPO_ROOT, ensureBinaries } from './harness/build.ts';
import { processesUsing } from './harness/processes.ts';
import { execFileSync } from 'node:child_process';

describe('npm run cluster', () => {
  it('prints a working kubeconfig path and leaves no process behind after Ctrl-C', async () => {
    const { kubectl } = await ensureBinaries();
    const child = spawn(process.execPath, [join(REPO_ROOT, 'integration/harness/run-cluster.ts')], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    let errors = '';
    child.stdout.setEncoding('utf8');
    child.stderr.setEncoding('utf8');
    // Read (and keep the tail of) stderr so the child never blocks on a full pipe and a failure says why.
    child.stderr.on('data', (chunk: string) => (errors = (errors + chunk).slice(-4000)));
    const kubeconfig = await new Promise<string>((done, fail) => {
      child.stdout.on('data', (chunk: string) => {
        output += chunk;
        const match = /^export KUBECONFIG=(\S+)$/m.exec(output);
        if (match?.[1]) done(match[1]);
      });
      child.once('exit', (code) =>
        fail(new Error(`run-cluster exited ${code} before printing a kubeconfig:\n${output}\n${errors}`)),
      );
    });

    const namespaces = execFileSync(kubectl, ['--kubeconfig', kubeconfig, 'get', 'ns', '-o', 'name'], {
      encoding: 'utf8',
    });
    expect(namespaces.split('\n')).toContain('namespace/kube-system');

    const dir = dirname(kubeconfig);
    expect(processesUsing(dir).length).toBeGreaterThanOrEqual(3);
    const exited = new Promise<number | null>((done) => child.once('exit', done));
    child.kill('SIGINT');
    expect(await exited).toBe(0);
    expect(processesUsing(dir)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
  }, 180_000);
});
