// Jest's global teardown: the last word on a run that will not end. Jest waits for every open handle before it
// exits (only warning after a second), so a server, socket or timer a failed test never closed would hold a CI job
// until its time limit. If the process is still alive EXIT_GRACE_MS after the run, this names what holds it,
// stops any process still running under it, and exits with status 1: a leak is reported, never hidden.
import { descendants, stopLeftovers } from '../../dev/processes.ts';

/** Long enough for sockets and processes being closed to finish closing; a real leak never does. */
const EXIT_GRACE_MS = 15_000;

export default function exitGuard(globalConfig: { watch?: boolean; watchAll?: boolean }): void {
  // Watch mode stays alive on purpose.
  if (globalConfig.watch || globalConfig.watchAll) return;
  setTimeout(() => {
    const counts = new Map<string, number>();
    for (const kind of process.getActiveResourcesInfo()) counts.set(kind, (counts.get(kind) ?? 0) + 1);
    const left = descendants();
    process.stderr.write(
      `\n[harness] Jest has not exited ${EXIT_GRACE_MS / 1000} s after the run: a test left open ` +
        `${[...counts].map(([kind, n]) => `${n} ${kind}`).join(', ')}` +
        `${left.length > 0 ? ` and ${left.length} process(es): ${left.map((p) => p.command.slice(0, 100)).join('; ')}` : ''}. ` +
        'Exiting with status 1; `--detectOpenHandles` shows where they were opened.\n',
    );
    void stopLeftovers(left, 1_000).finally(() => process.exit(1));
  }, EXIT_GRACE_MS).unref();
}
