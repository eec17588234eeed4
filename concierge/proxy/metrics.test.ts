import { expect, it } from '@jest/globals';
import { spawnSync } from 'node:child_process';

it("counts the process's promise rejections that nothing handled (lib/process-errors.ts)", () => {
  // In a Node process of its own: in a Jest worker, Jest's handlers would take the rejections and fail the test.
  const script = `
    import { handleProcessErrors } from ${JSON.stringify(new URL('../../lib/process-errors.ts', import.meta.url).href)};
    import { silentLogger } from ${JSON.stringify(new URL('../../lib/log.ts', import.meta.url).href)};
    import { newProxyMetrics } from ${JSON.stringify(new URL('./metrics.ts', import.meta.url).href)};
    handleProcessErrors({ log: silentLogger() });
    const { registry } = newProxyMetrics();
    const count = async () =>
      (await registry.metrics()).split('\\n').find((line) => line.startsWith('sealion_unhandled_rejections_total '));
    console.log(await count());
    Promise.reject(new Error('one'));
    Promise.reject(new Error('two'));
    setImmediate(async () => console.log(await count()));
  `;
  const child = spawnSync(process.execPath, ['--input-type=module', '-e', script], {
    encoding: 'utf8',
    timeout: 30_000,
  });
  expect({ status: child.status, stdout: child.stdout.trim().split('\n') }).toEqual({
    status: 0,
    stdout: ['sealion_unhandled_rejections_total 0', 'sealion_unhandled_rejections_total 2'],
  });
});
