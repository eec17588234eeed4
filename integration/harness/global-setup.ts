import { ensureBinaries } from './build.ts';
import { sweepStaleClusters } from './cluster.ts';

export default async function globalSetup(): Promise<void> {
  sweepStaleClusters();
  await ensureBinaries((line) => process.stderr.write(`[harness] ${line}\n`));
}
