import { ensureBinaries, ensureNodeBinaries } from '../../dev/build.ts';
import { sweepStaleClusters } from '../../dev/cluster.ts';

export default async function globalSetup(): Promise<void> {
  await sweepStaleClusters();
  const log = (line: string): boolean => process.stderr.write(`[harness] ${line}\n`);
  await ensureBinaries(log);
  await ensureNodeBinaries(log);
}
