// `npm run cluster` as a person uses it: start, use with kubectl (its node is Ready), Ctrl-C, nothing left behind.
import { afterEach, describe, expect, it } from '@jest/globals';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { REPO_ROOT, ensureBinaries } from '../dev/build.ts';
import { dieWithParent, processesUsing, stopChild, waitForOutput } from '../dev/processes.ts';

describe('npm run cluster', () => {
  let child: ChildProcess | undefined;
  // A failed expectation must not leave the cluster running: Ctrl-C, then a kill.
  afterEach(() => child && stopChild(child, { signal: 'SIGINT' }));

  it('prints a working kubeconfig path and leaves no process behind after Ctrl-C', async () => {
    const { kubectl } = await ensureBinaries();
    const [command, args] = dieWithParent(
      process.execPath,
      [join(REPO_ROOT, 'dev/run-cluster.ts')],
      'SIGTERM',
    );
    const started = spawn(command, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    child = started;
    const { match } = await waitForOutput(started, /^export KUBECONFIG=(\S+)$/m);
    const kubeconfig = match[1]!;

    const namespaces = execFileSync(kubectl, ['--kubeconfig', kubeconfig, 'get', 'ns', '-o', 'name'], {
      encoding: 'utf8',
    });
    expect(namespaces.split('\n')).toContain('namespace/kube-system');
    // Its node, registered by a real kubelet, is Ready.
    const ready = execFileSync(
      kubectl,
      [
        '--kubeconfig',
        kubeconfig,
        'get',
        'nodes',
        '-o',
        'jsonpath={.items[*].status.conditions[?(@.type=="Ready")].status}',
      ],
      { encoding: 'utf8' },
    );
    expect(ready).toBe('True');

    const dir = dirname(kubeconfig);
    expect(processesUsing(dir).length).toBeGreaterThanOrEqual(3);
    const exited = new Promise<number | null>((done) => started.once('exit', done));
    started.kill('SIGINT');
    expect(await exited).toBe(0);
    expect(processesUsing(dir)).toEqual([]);
    expect(existsSync(dir)).toBe(false);
  }, 180_000);
});
