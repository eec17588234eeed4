// `npm run cluster` as a person uses it: start, use with kubectl, Ctrl-C, nothing left behind.
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { REPO_ROOT, ensureBinaries } from './harness/build.ts';
import { processesUsing, waitForOutput } from './harness/processes.ts';
import { execFileSync } from 'node:child_process';

describe('npm run cluster', () => {
  it('prints a working kubeconfig path and leaves no process behind after Ctrl-C', async () => {
    const { kubectl } = await ensureBinaries();
    const child = spawn(process.execPath, [join(REPO_ROOT, 'integration/harness/run-cluster.ts')], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    const { match } = await waitForOutput(child, /^export KUBECONFIG=(\S+)$/m);
    const kubeconfig = match[1]!;

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
