// The `sealion` command: one binary, one subcommand per job. Heavy modules load inside the commands that use
// them: kubectl starts `sealion login` for every command it runs.
import { Command } from 'commander';
import { conciergeCommand } from './concierge.ts';
import { getCommand } from './get-kubeconfig.ts';
import { loginCommand } from './login.ts';
import { whoamiCommand } from './whoami.ts';
import { agentCommand } from './agent.ts';
import { clusterCommand } from './cluster.ts';
import { manifestsCommand } from './manifests/command.ts';

const program = new Command('sealion')
  .description('Sealion: kubectl access to many clusters through an authenticating, impersonating proxy')
  .showHelpAfterError();

const dev = program.command('dev').description('a local development setup on real API servers');
dev
  .command('up')
  .description('start a local cluster and print how to use it; Ctrl-C tears everything down')
  .addHelpText('after', '\nExample:\n  npm start            # same as: sealion dev up\n')
  .action(async () => (await import('./dev-up.ts')).devUp());

program.addCommand(manifestsCommand());
program.addCommand(conciergeCommand());
program.addCommand(loginCommand());
program.addCommand(getCommand());
program.addCommand(whoamiCommand());
program.addCommand(clusterCommand());
program.addCommand(agentCommand());

try {
  await program.parseAsync(process.argv);
} catch (err) {
  // Expected failures (bad flags, unreachable clusters) print one line, not a stack trace.
  console.error(`sealion: ${err instanceof Error ? err.message : String(err)}`);
  process.exitCode = 1;
}
