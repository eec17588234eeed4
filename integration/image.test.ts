// `npm run image`: the same inputs give the same digest, and the image holds what runs Sealion and nothing else.
// That it runs is proven by the tests that install it on real nodes (pods.test.ts).
import { afterAll, expect, it } from '@jest/globals';
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildImage, IMAGE_UID } from '../dev/image.ts';

const dir = mkdtempSync(join(tmpdir(), 'sealion-image-test-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

interface Descriptor {
  digest: string;
}

it('is reproducible, runs as a non-root user, and carries no shell, package manager or compiler', async () => {
  const first = await buildImage(() => {}, join(dir, 'first.tar'));
  const second = await buildImage(() => {}, join(dir, 'second.tar'));
  expect(second.digest).toBe(first.digest);
  expect(readFileSync(join(dir, 'second.tar')).equals(readFileSync(join(dir, 'first.tar')))).toBe(true);

  const layout = join(dir, 'layout');
  mkdirSync(layout);
  execFileSync('tar', ['-xf', join(dir, 'first.tar'), '-C', layout]);
  const blob = (digest: string): string => join(layout, 'blobs/sha256', digest.slice('sha256:'.length));
  const index = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8')) as {
    manifests: (Descriptor & { annotations: Record<string, string> })[];
  };
  expect(index.manifests[0]!.digest).toBe(first.digest);
  expect(index.manifests[0]!.annotations['io.containerd.image.name']).toBe(first.name);
  const manifest = JSON.parse(readFileSync(blob(first.digest), 'utf8')) as {
    config: Descriptor;
    layers: Descriptor[];
  };
  const config = JSON.parse(readFileSync(blob(manifest.config.digest), 'utf8')) as {
    config: { User: string; Entrypoint: string[] };
  };
  expect(config.config.User).toBe(`${IMAGE_UID}:${IMAGE_UID}`);
  expect(config.config.Entrypoint).toEqual(['/usr/local/bin/node', '/app/bin/sealion.js']);

  const paths = manifest.layers.flatMap((layer) =>
    execFileSync('tar', ['-tzf', blob(layer.digest)], { encoding: 'utf8', maxBuffer: 64 * 1024 * 1024 })
      .split('\n')
      .filter(Boolean),
  );
  expect(paths).toContain('usr/local/bin/node');
  expect(paths).toContain('app/bin/sealion.js');
  const forbidden = paths.filter((p) =>
    /(^|\/)(sh|bash|dash|busybox|npm|npx|corepack|gcc|cc|ld|apt|dpkg)$/.test(p),
  );
  expect(forbidden).toEqual([]);
  expect(paths.filter((p) => p.endsWith('.test.ts'))).toEqual([]);
  expect(paths.filter((p) => p.startsWith('app/node_modules/') && p.endsWith('.ts'))).toEqual([]);
}, 180_000);
