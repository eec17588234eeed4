import { ensureBinaries } from '../../dev/build.ts';
import { sweepStaleClusters } from '../../dev/cluster.ts';

export default async function globalSetup(): Promise<void> {
  sweepStaleClusters();
  await ensureBinaries((line) => process.stderr.write(`[harness] ${line}\n`));
}
