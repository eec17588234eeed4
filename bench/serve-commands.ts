// What a benchmark's server process answers on its standard input, one JSON line each: "mem", process.memoryUsage()
// after a GC (the process runs with --expose-gc), and "profile <file>" ... "profile-end", a CPU profile of what
// happened in between, written to <file>. Also a clean exit on SIGTERM, so --cpu-prof gets to write its profile.
import { writeFileSync } from 'node:fs';
import { Session } from 'node:inspector/promises';
import { createInterface } from 'node:readline';

export function answerBenchCommands(): void {
  const inspector = new Session();
  let profileFile: string | undefined;
  const answer = async (line: string): Promise<void> => {
    if (line === 'mem') {
      globalThis.gc?.();
      console.log(JSON.stringify(process.memoryUsage()));
    } else if (line.startsWith('profile ')) {
      profileFile = line.slice('profile '.length);
      inspector.connect();
      await inspector.post('Profiler.enable');
      await inspector.post('Profiler.start');
      console.log('{}');
    } else if (line === 'profile-end' && profileFile) {
      const { profile } = await inspector.post('Profiler.stop');
      writeFileSync(profileFile, JSON.stringify(profile));
      inspector.disconnect();
      console.log('{}');
    }
  };
  createInterface({ input: process.stdin }).on('line', (line) => {
    answer(line).catch((err: Error) => console.error(`bench command ${line}: ${err.message}`));
  });
  process.once('SIGTERM', () => process.exit(0));
}
