// `sealion cluster add|revoke|remove --context`: the hub is the API server of the context named, as kubectl's
// --context means; a context the kubeconfig lacks stops the command before any request.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { stringify } from 'yaml';
import { REPO_ROOT } from '../dev/build.ts';

const run = promisify(execFile);

/** An API server stand-in that remembers what it was asked and answers each request 404. */
function recorder(): { server: Server; asked: string[] } {
  const asked: string[] = [];
  const server = createServer((req, res) => {
    asked.push(`${req.method} ${req.url}`);
    res.writeHead(404, { 'content-type': 'application/json' });
    res.end(
      JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', code: 404, reason: 'NotFound' }),
    );
  });
  return { server, asked };
}

describe('sealion cluster --context', () => {
  const first = recorder();
  const second = recorder();
  let dir: string;
  let kubeconfig: string;

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'sealion-cluster-context-'));
    const url = async ({ server }: { server: Server }): Promise<string> => {
      await new Promise<void>((done) => server.listen(0, '127.0.0.1', done));
      return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    };
    const servers = [await url(first), await url(second)];
    kubeconfig = join(dir, 'kubeconfig');
    writeFileSync(
      kubeconfig,
      stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: servers.map((server, i) => ({
          name: `c${i}`,
          cluster: { server, 'insecure-skip-tls-verify': true },
        })),
        users: [{ name: 'admin', user: { token: 'not-a-secret' } }],
        contexts: [0, 1].map((i) => ({ name: `hub${i}`, context: { cluster: `c${i}`, user: 'admin' } })),
        'current-context': 'hub0',
      }),
    );
  });
  afterAll(() => {
    first.server.close();
    second.server.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const sealion = (args: string[]): Promise<{ code: number; stderr: string }> =>
    run(process.execPath, [join(REPO_ROOT, 'bin/sealion.js'), ...args], { timeout: 30_000 }).then(
      () => ({ code: 0, stderr: '' }),
      (err: { code: number; stderr: string }) => ({ code: err.code, stderr: err.stderr }),
    );

  it('asks the API server of the context named', async () => {
    const result = await sealion([
      'cluster',
      'remove',
      'edge-1',
      '--kubeconfig',
      kubeconfig,
      '--context',
      'hub1',
    ]);
    expect(result.code).toBe(1);
    expect(first.asked).toEqual([]);
    expect(second.asked).toEqual(['DELETE /apis/tunnel.concierge.sealion.dev/v1alpha1/clusters/edge-1']);
  });

  it('stops at a context the kubeconfig lacks, asking nothing', async () => {
    second.asked.length = 0;
    const result = await sealion([
      'cluster',
      'revoke',
      'edge-1',
      '--kubeconfig',
      kubeconfig,
      '--context',
      'nope',
    ]);
    expect(result).toEqual({ code: 1, stderr: expect.stringContaining('nope') });
    expect([...first.asked, ...second.asked]).toEqual([]);
  });

  it.each([
    ['hub', "it must end with ':'"],
    ['system:hub:', "it must not start with 'system:'"],
  ])('add --workload-prefix %j: refused before anything is asked or created', async (prefix, why) => {
    second.asked.length = 0;
    const result = await sealion([
      'cluster',
      'add',
      'edge-1',
      '--workload-prefix',
      prefix,
      '--kubeconfig',
      kubeconfig,
    ]);
    expect(result).toEqual({
      code: 1,
      stderr: `sealion: --workload-prefix ${JSON.stringify(prefix)}: ${why}; give one such as hub:\n`,
    });
    expect([...first.asked, ...second.asked]).toEqual([]);
  });
});
