// The `sealion` command: one binary, one subcommand per job.
import { Command } from 'commander';
import { devUp } from './dev-up.ts';
import { conciergeCommand } from './concierge.ts';
import { manifestsCommand } from './manifests/command.ts';

const program = new Command('sealion')
  .description('Sealion: kubectl access to many clusters through an authenticating, impersonating proxy')
  .showHelpAfterError();

const dev = program.command('dev').description('a local development setup on real API servers');
dev
  .command('up')
  .description('start a local cluster and print how to use it; Ctrl-C tears everything down')
  .addHelpText('after', '\nExample:\n  npm start            # same as: sealion dev up\n')
  .action(devUp);

program.addCommand(manifestsCommand());
program.addCommand(conciergeCommand());

try {
  await program.parseAsync(process.argv);
} catch (err) {
  // Expected failures (bad flags, unreachable clusters) print one line, not a stack trace.
  console.error(`sealion: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
